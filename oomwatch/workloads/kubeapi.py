"""Optional Kubernetes API use: who owns each pod on this node, and which training job it is part of.

`PodIndex` lists and watches only this node's pods (`fieldSelector=spec.nodeName=<node>`, read-only: the
RBAC it needs is `pods: list, watch`), in a background thread, and keeps a small `PodInfo` per pod UID.
It never GETs owners: a Job's own owner (a JobSet, a training operator's job) is only known when the
pod's labels say so. Without API access (no in-cluster config, forbidden, unreachable) it logs one line
and every `info()` answers None.

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
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

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


@dataclass(frozen=True)
class PodInfo:
    """What the API server says about one pod (docs/contract.md `owner`: {"kind", "name", "apiVersion", "uid"};
    `job`: {"kind", "name"})."""

    uid: str
    namespace: str
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    owner: Optional[dict[str, str]] = None
    job: Optional[dict[str, str]] = None
    queue: Optional[str] = None  # Kueue LocalQueue
    # status.reason / status.message ("Evicted", "The node was low on resource: memory. …": the kubelet's
    # eviction) and whether metadata.deletionTimestamp is set, as last watched
    status_reason: Optional[str] = None
    status_message: Optional[str] = None
    deleting: bool = False


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


# --- the index ---------------------------------------------------------------------------------------


def _as_dict(obj: Any) -> Mapping[str, Any]:
    if isinstance(obj, dict):
        return obj
    to_dict = getattr(obj, "to_dict", None)
    return to_dict() if callable(to_dict) else {}


class PodIndex:
    """This node's pods by UID, kept current by a list+watch in a background thread.

    Deleted pods are kept `retention_seconds` (an OOM is often explained after its pod is gone: a Job
    pod deleted on failure, an evicted pod)."""

    def __init__(
        self,
        node_name: str,
        client: Any,
        *,
        retention_seconds: float = 600.0,
        retry_seconds: float = 5.0,
        max_retry_seconds: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node_name = node_name
        self._client = client
        self._retention = retention_seconds
        self._retry = retry_seconds
        self._max_retry = max_retry_seconds
        self._clock = clock
        self._pods: dict[str, PodInfo] = {}
        self._deleted_at: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._warned = False
        # Told after each change (the pods' UIDs; None: a whole list): identities resolved before lack its names.
        self.on_pods: Callable[[Optional[frozenset]], None] = lambda uids: None

    @classmethod
    def from_environment(cls, node_name: Optional[str] = None, **kwargs: Any) -> Optional["PodIndex"]:
        """A PodIndex on the in-cluster service account, or None (after one log line) when this process
        does not run in a pod with API access or does not know its node (`NODE_NAME`, downward API)."""
        client = in_cluster_client()
        node = node_name or os.environ.get("NODE_NAME")
        if client is None:
            return None
        if not node:
            log.info("Kubernetes API: NODE_NAME is not set; pod owners and jobs will not be looked up")
            return None
        return cls(node, client, **kwargs)

    # -- state --------------------------------------------------------------------------------------

    def apply(self, event_type: str, pod: Mapping[str, Any]) -> None:
        """One watch event (ADDED / MODIFIED / DELETED) on a pod given as JSON."""
        info = pod_info_from_object(pod)
        if info is None:
            return
        now = self._clock()
        with self._lock:
            self._pods[info.uid] = info
            if event_type == "DELETED":
                self._deleted_at[info.uid] = now
            else:
                self._deleted_at.pop(info.uid, None)
            self._expire(now)
        self.on_pods(frozenset((info.uid,)))

    def replace_all(self, pods: list[Mapping[str, Any]]) -> None:
        """A fresh list: pods missing from it are treated as deleted now (kept for the retention time)."""
        now = self._clock()
        infos = [info for info in (pod_info_from_object(p) for p in pods) if info is not None]
        with self._lock:
            listed = {info.uid for info in infos}
            for uid in self._pods:
                if uid not in listed and uid not in self._deleted_at:
                    self._deleted_at[uid] = now
            for info in infos:
                self._pods[info.uid] = info
                self._deleted_at.pop(info.uid, None)
            self._expire(now)
        self.on_pods(None)

    def _expire(self, now: float) -> None:
        for uid, deleted_at in list(self._deleted_at.items()):
            if now - deleted_at > self._retention:
                del self._deleted_at[uid]
                self._pods.pop(uid, None)

    def info(self, pod_uid: Optional[str]) -> Optional[PodInfo]:
        if not pod_uid:
            return None
        with self._lock:
            return self._pods.get(pod_uid)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pods)

    # -- background list + watch --------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="oomwatch-pod-index", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        close = getattr(self._client, "close", None)
        if callable(close):
            try:
                close()  # unblocks a watch waiting for the next line
            except Exception:  # noqa: BLE001 - best effort on shutdown
                pass
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_synced(self, timeout: Optional[float] = None) -> bool:
        """True once the first list has been loaded."""
        return self._synced.wait(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        from lightkube import ALL_NS
        from lightkube.resources.core_v1 import Pod

        selector = {"spec.nodeName": self.node_name}
        delay = self._retry
        while not self._stop.is_set():
            try:
                listing = self._client.list(Pod, namespace=ALL_NS, fields=selector)
                self.replace_all([_as_dict(p) for p in listing])
                self._synced.set()
                delay = self._retry
                version = listing.resourceVersion
                for event_type, pod in self._client.watch(
                    Pod, namespace=ALL_NS, fields=selector, resource_version=version
                ):
                    if self._stop.is_set():
                        return
                    self.apply(event_type, _as_dict(pod))
            except Exception as exc:  # noqa: BLE001 - any API failure degrades to "unknown", never crashes
                if self._stop.is_set():
                    return
                if not self._warned:
                    log.warning("Kubernetes API: cannot list/watch pods of node %s (%s); pod owners and "
                                "jobs unknown until it works", self.node_name, exc)
                    self._warned = True
                else:
                    log.debug("Kubernetes API: pod watch failed: %s", exc)
            self._stop.wait(delay)
            delay = min(delay * 2, self._max_retry)


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
