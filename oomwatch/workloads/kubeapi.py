"""Optional Kubernetes API use: who owns each pod on this node, and which training job it is part of.

The pod source (oomwatch.sources.pods) lists and watches only this node's pods
(`fieldSelector=spec.nodeName=<node>`, read-only: the RBAC it needs is `pods: list, watch`) and turns each
into a small `PodInfo` (oomwatch.model) here. It never GETs owners: a Job's own owner (a JobSet, a training
operator's job) is only known when the pod's labels say so. Without API access (no in-cluster config, forbidden,
unreachable) it logs one line and the pipeline names pods from the node alone.

The training job comes from well-known pod labels, checked in this order (most specific first):

- `trainer.kubeflow.org/trainjob-name` → TrainJob (Trainer v2, kubeflow/trainer `LabelTrainJobName`);
- `jobset.sigs.k8s.io/jobset-name` → JobSet (kubernetes-sigs/jobset `JobSetNameKey`);
- `training.kubeflow.org/job-name` with `…/operator-name` → PyTorchJob, TFJob, MPIJob, …
  (kubeflow/common `JobNameLabel`, `OperatorNameLabel`; values "<kind>-controller", or "mpi-operator");
- `group-name: kubeflow.org` with `job-name` (`tf-job-name`, `pytorch-job-name`) → the pre-2021 operators;
- a controlling owner that is itself a training job (the v1 operators own their pods directly);
- `determined` → Determined (value: the allocation id; determined-ai kubernetesrm `determinedLabel`);
- Kueue (`kueue.x-k8s.io/queue-name` label, `kueue.x-k8s.io/workload` annotation): the pod group
  (`kueue.x-k8s.io/pod-group-name` → PodGroup) or the pod's controller (the queued Job).

Not confirmed, so not used: Determined's `determined.ai/job-name` is an annotation in its code, but on
which object (pod or batch Job) could not be confirmed; the `determined` label is.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Optional

from oomwatch.model import PodInfo

log = logging.getLogger(__name__)

# Kubeflow training-operator `training.kubeflow.org/operator-name` values → the job kind. The unified
# training-operator uses "<kind>-controller"; the standalone mpi-operator v2 uses "mpi-operator".
_OPERATOR_KINDS = {
    "tfjob-controller": "TFJob",
    "pytorchjob-controller": "PyTorchJob",
    "mpijob-controller": "MPIJob",
    "mpi-operator": "MPIJob",
    "mxjob-controller": "MXJob",
    "xgboostjob-controller": "XGBoostJob",
    "paddlejob-controller": "PaddleJob",
    "jaxjob-controller": "JAXJob",
}
# Owner kinds that are themselves training jobs (the v1 operators own their pods directly).
_TRAINING_OWNER_KINDS = frozenset(_OPERATOR_KINDS.values()) | {"JobSet", "TrainJob", "RayJob"}

LABEL_TRAINJOB = "trainer.kubeflow.org/trainjob-name"
LABEL_JOBSET = "jobset.sigs.k8s.io/jobset-name"
LABEL_KF_JOB_NAME = "training.kubeflow.org/job-name"
LABEL_KF_OPERATOR = "training.kubeflow.org/operator-name"
LABEL_KF_LEGACY_GROUP = "group-name"
LABEL_KF_LEGACY_JOB = "job-name"
_KF_LEGACY_KIND_LABELS = (
    ("tf-job-name", "TFJob"),
    ("pytorch-job-name", "PyTorchJob"),
    ("mpi-job-name", "MPIJob"),
)
LABEL_DETERMINED = "determined"
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
LABEL_KUEUE_POD_GROUP = "kueue.x-k8s.io/pod-group-name"
ANNOTATION_KUEUE_WORKLOAD = "kueue.x-k8s.io/workload"

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


# --- pure parsers ------------------------------------------------------------------------------------


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items() if isinstance(v, (str, int, float, bool))}


def controlling_owner(metadata: Mapping[str, Any]) -> Optional[dict[str, str]]:
    """The ownerReference with `controller: true` → {"kind", "name", "apiVersion", "uid"} (the last two where
    the reference has them: the pod-event sink names the owner in an Event's involvedObject); None for a bare
    pod."""
    refs = metadata.get("ownerReferences")
    if not isinstance(refs, list):
        return None
    for ref in refs:
        if isinstance(ref, dict) and ref.get("controller") is True and ref.get("kind") and ref.get("name"):
            owner = {"kind": str(ref["kind"]), "name": str(ref["name"])}
            for key in ("apiVersion", "uid"):
                if isinstance(ref.get(key), str) and ref[key]:
                    owner[key] = ref[key]
            return owner
    return None


def training_job(
    labels: Mapping[str, str], annotations: Mapping[str, str], owner: Optional[Mapping[str, str]]
) -> Optional[dict[str, str]]:
    """The training / batch job a pod belongs to, from well-known labels (see the module docstring)."""
    if labels.get(LABEL_TRAINJOB):
        return {"kind": "TrainJob", "name": labels[LABEL_TRAINJOB]}
    if labels.get(LABEL_JOBSET):
        return {"kind": "JobSet", "name": labels[LABEL_JOBSET]}
    owner_kind = owner.get("kind") if owner else None
    if labels.get(LABEL_KF_JOB_NAME):
        kind = _OPERATOR_KINDS.get(labels.get(LABEL_KF_OPERATOR, ""))
        if kind is None and owner_kind in _TRAINING_OWNER_KINDS:
            kind = owner_kind
        return {"kind": kind or "KubeflowJob", "name": labels[LABEL_KF_JOB_NAME]}
    if labels.get(LABEL_KF_LEGACY_GROUP) == "kubeflow.org":
        for key, kind in _KF_LEGACY_KIND_LABELS:
            if labels.get(key):
                return {"kind": kind, "name": labels[key]}
        if labels.get(LABEL_KF_LEGACY_JOB):
            legacy_kind = owner_kind if owner_kind in _TRAINING_OWNER_KINDS else "KubeflowJob"
            return {"kind": legacy_kind, "name": labels[LABEL_KF_LEGACY_JOB]}
    if owner is not None and owner_kind in _TRAINING_OWNER_KINDS:
        return {"kind": str(owner_kind), "name": str(owner["name"])}
    if labels.get(LABEL_DETERMINED):
        return {"kind": "Determined", "name": labels[LABEL_DETERMINED]}
    if labels.get(LABEL_KUEUE_POD_GROUP):
        return {"kind": "PodGroup", "name": labels[LABEL_KUEUE_POD_GROUP]}
    queued = labels.get(LABEL_KUEUE_QUEUE) or annotations.get(ANNOTATION_KUEUE_WORKLOAD)
    if queued and owner is not None:
        # A workload Kueue admitted as a unit: its controller (a batch Job, …) is the job.
        return {"kind": str(owner["kind"]), "name": str(owner["name"])}
    return None


def pod_info_from_object(pod: Mapping[str, Any]) -> Optional[PodInfo]:
    """A Pod as JSON (API server object) → PodInfo; None when it has no uid/namespace/name."""
    metadata = pod.get("metadata")
    if not isinstance(metadata, dict):
        return None
    uid, namespace, name = metadata.get("uid"), metadata.get("namespace"), metadata.get("name")
    if not (isinstance(uid, str) and isinstance(namespace, str) and isinstance(name, str) and uid):
        return None
    labels = _str_map(metadata.get("labels"))
    annotations = _str_map(metadata.get("annotations"))
    owner = controlling_owner(metadata)
    status = pod.get("status") if isinstance(pod.get("status"), dict) else {}
    return PodInfo(
        uid=uid,
        namespace=namespace,
        name=name,
        labels=labels,
        owner=owner,
        job=training_job(labels, annotations, owner),
        queue=labels.get(LABEL_KUEUE_QUEUE) or annotations.get(LABEL_KUEUE_QUEUE) or None,
        status_reason=_short_str(status.get("reason"), 64),
        status_message=_short_str(status.get("message"), 1024),
        deleting=bool(metadata.get("deletionTimestamp")),
    )


def _short_str(value: Any, limit: int) -> Optional[str]:
    """A status string as the API gave it, cut to `limit` (it ends up in Events and logs), or None."""
    return value[:limit] if isinstance(value, str) and value else None


def in_cluster_client(service_account_dir: str = SERVICE_ACCOUNT_DIR) -> Any:
    """A lightkube Client on the pod's service account, or None (with one log line) outside a cluster."""
    if not os.environ.get("KUBERNETES_SERVICE_HOST"):
        log.info("Kubernetes API: not running in a cluster; names come from the node only")
        return None
    try:
        from lightkube import Client, KubeConfig

        config = KubeConfig.from_service_account(service_account=service_account_dir)
        return Client(config, trust_env=False)
    except Exception as exc:  # noqa: BLE001 - missing token, unreadable CA, bad env: all mean "no API"
        log.info("Kubernetes API: in-cluster config unusable (%s); names come from the node only", exc)
        return None
