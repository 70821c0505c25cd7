"""Kubernetes Events on the victim's pod: `kubectl describe pod` shows the OOM kill and why.

One core/v1 Event per incident, reason `OOMGroupKill` (kind "group") or `OOMKill`, type Warning, the
incident's one-sentence explanation as message. Posting happens on a worker thread behind a bounded
queue: the caller (the incident pipeline) never waits on the API server; when the queue is full the
event is dropped with a log line.

Deduplication survives restarts without any state file: the Event's name is derived from the incident
key (boot id, kernel sequence number, victim pid), so re-posting the same incident (an events-file
replay, a restarted agent re-reading the kernel ring buffer) is answered 409 AlreadyExists and ignored.
A bounded in-memory set of posted keys avoids even asking in the common case.

Each death's verdict (oomwatch.deaths) in a pod gets one too, reason by cause (DEATH_REASONS: `KilledBySignal`
for a SIGKILL no kernel OOM kill explains, `GPUOutOfMemory`, …), named after the death's identity; the sink
leaves out kernel-oom deaths, whose kill has its incident's Event.

When the pod belongs to a job (workload.job: a JobSet, a Kubeflow PyTorchJob/TFJob/MPIJob, a TrainJob, a RayJob,
…; else a plain batch Job that controls it), the same incident or death gets a second Event, on that job, its
message naming the pod and container first: `kubectl get events --field-selector involvedObject.kind=JobSet`
lists a job's kills. The job's apiVersion and uid come from the pod's ownerReference when the job controls the pod;
a job known only from a pod label gets its project's group/version (JOB_API_VERSIONS) and no uid, and
`kubectl describe` (which selects Events by the object's uid too) does not show it. A refused job Event (403, 404,
422) is logged once per job kind and never blocks or retries the pod's Event.

Needs RBAC `events: create` in the pods' namespaces: RBAC authorizes the Event, not the object it is about, so
the same grant covers Events on jobs. Without an API client the recorder is off.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import logging
import os
import threading
from collections import OrderedDict
from typing import Any, Optional

from oomwatch.deaths import Death
from oomwatch.model import Incident, Workload
from oomwatch.sinks.worker import QueueWorker
from oomwatch.textsafe import visible

log = logging.getLogger(__name__)

COMPONENT = "oomwatch"
REPORTING_CONTROLLER = "oomwatch.io/agent"
REASON_GROUP = "OOMGroupKill"
REASON_SINGLE = "OOMKill"
# A death's Event reason by its cause (docs/contract.md, "Death JSON").
DEATH_REASONS = {"kernel-oom": "OOMKilledDeath", "userspace": "KilledBySignal", "gpu-oom": "GPUOutOfMemory",
                 "alloc-failure": "AllocationFailed", "not-oom": "NotOOMKilled"}
_MAX_MESSAGE = 1024  # the API server's limit on an Event's message (note)
_MAX_NAME = 253
# Group/version of the job kinds a pod label can name without an ownerReference to the job (oomwatch.workloads.
# kubeapi): each as its project registers the type. The API server does not check an Event's involvedObject, and
# kubectl selects Events by name, namespace, kind and uid, not apiVersion (client-go's events GetFieldSelector),
# so the version shown is the one releases serve, not a key. MPIJob is left out: kubeflow.org/v1 in the
# training-operator, kubeflow.org/v2beta1 in mpi-operator; only its ownerReference says which.
JOB_API_VERSIONS = {
    # kubernetes-sigs/jobset api/jobset/v1alpha2/groupversion_info.go (newer sources also add jobset.x-k8s.io/v1)
    "JobSet": "jobset.x-k8s.io/v1alpha2",
    # kubeflow/trainer pkg/apis/trainer/v1alpha1/groupversion_info.go
    "TrainJob": "trainer.kubeflow.org/v1alpha1",
    # kubeflow/training-operator pkg/apis/kubeflow.org/v1/groupversion_info.go (pytorch_types.go, …)
    "PyTorchJob": "kubeflow.org/v1",
    "TFJob": "kubeflow.org/v1",
    "XGBoostJob": "kubeflow.org/v1",
    "PaddleJob": "kubeflow.org/v1",
    "JAXJob": "kubeflow.org/v1",
    "MXJob": "kubeflow.org/v1",
    # ray-project/kuberay ray-operator/apis/ray/v1 (GroupVersion ray.io/v1)
    "RayJob": "ray.io/v1",
    "Job": "batch/v1",
}


def _rfc3339(epoch: float) -> str:
    return _dt.datetime.fromtimestamp(epoch, tz=_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_name(pod: str, key: tuple[Any, ...]) -> str:
    """`<pod>.<16 hex of the incident key>`: a valid DNS subdomain, stable for the same incident."""
    digest = hashlib.sha256(repr(tuple(key)).encode()).hexdigest()[:16]
    return f"{pod[: _MAX_NAME - len(digest) - 1]}.{digest}"


def event_for_incident(incident: Incident, node_name: str, build=None) -> Optional[dict[str, Any]]:
    """The core/v1 Event (as JSON) to post for an incident, or None when its victim is not in a known
    pod (a Slurm job, a systemd unit, a pod whose name could not be learned). `build`: _event (the pod's), or
    _job_event (its job's)."""
    return (build or _event)(incident.workload, incident.key, incident.time,
                             REASON_GROUP if incident.kind == "group" else REASON_SINGLE, incident.explanation,
                             node_name)


def event_for_death(death: Death, node_name: str, build=None) -> Optional[dict[str, Any]]:
    """The Event for a death's verdict in a pod (reason by cause), or None outside a known pod."""
    if death.workload is None:
        return None
    return (build or _event)(death.workload, ("death",) + death.key, death.time, DEATH_REASONS[death.cause],
                             death.explanation, node_name)


def job_reference(workload: Workload) -> Optional[dict[str, str]]:
    """The object reference (apiVersion, kind, name, namespace, uid where known) of the job a pod belongs to:
    workload.job, else a batch Job that controls the pod; None for a bare pod, a pod of a Deployment, and jobs
    that are not API objects or whose group is not known (Determined, a Kueue pod group, "KubeflowJob")."""
    if not workload.is_kubernetes or not workload.pod or not workload.namespace:
        return None
    owner = workload.owner or {}
    job = workload.job
    if job is None:
        if owner.get("kind") != "Job" or owner.get("apiVersion", "batch/v1") != "batch/v1":
            return None
        job = owner
    kind, name = job.get("kind"), job.get("name")
    if not kind or not name:
        return None
    controls_pod = owner.get("kind") == kind and owner.get("name") == name
    api_version = owner.get("apiVersion") if controls_pod else None
    api_version = api_version or JOB_API_VERSIONS.get(kind)
    if api_version is None:
        return None
    ref = {"apiVersion": api_version, "kind": kind, "namespace": workload.namespace, "name": name}
    if controls_pod and owner.get("uid"):
        ref["uid"] = owner["uid"]
    return ref


def job_event_for_incident(incident: Incident, node_name: str) -> Optional[dict[str, Any]]:
    """The Event on the job of the incident's pod (job_reference), or None when the pod has no job."""
    return event_for_incident(incident, node_name, build=_job_event)


def job_event_for_death(death: Death, node_name: str) -> Optional[dict[str, Any]]:
    """The Event on the job of a death's pod, reason by cause; None when the pod has no job."""
    return event_for_death(death, node_name, build=_job_event)


def _job_event(workload: Workload, key: tuple, time: float, reason: str, message: str,
               node_name: str) -> Optional[dict[str, Any]]:
    ref = job_reference(workload)
    if ref is None:
        return None
    # A job has many pods: its Events name the pod and container before the explanation.
    who = f"pod {workload.pod} container {workload.container}" if workload.container else f"pod {workload.pod}"
    # ("job", kind) in the hashed key: a name distinct from the pod Event's for the same incident.
    return _body(event_name(ref["name"], ("job", ref["kind"]) + tuple(key)), ref, time, reason,
                 f"{who}: {message}", node_name)


def _event(workload: Workload, key: tuple, time: float, reason: str, message: str,
           node_name: str) -> Optional[dict[str, Any]]:
    if not workload.is_kubernetes or not workload.pod or not workload.namespace:
        return None
    involved: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": workload.namespace,
        "name": workload.pod,
    }
    if workload.pod_uid:
        involved["uid"] = workload.pod_uid
    if workload.container:
        involved["fieldPath"] = f"spec.containers{{{workload.container}}}"
    return _body(event_name(workload.pod, key), involved, time, reason, message, node_name)


def _body(name: str, involved: dict[str, Any], time: float, reason: str, message: str,
          node_name: str) -> dict[str, Any]:
    timestamp = _rfc3339(time)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": involved["namespace"]},
        "involvedObject": involved,
        "reason": reason,
        "message": visible(message)[:_MAX_MESSAGE],  # (`kubectl describe` prints it to a terminal)
        "type": "Warning",
        "source": {"component": COMPONENT, "host": node_name},
        "reportingComponent": REPORTING_CONTROLLER,
        "reportingInstance": node_name,
        "firstTimestamp": timestamp,
        "lastTimestamp": timestamp,
        "count": 1,
    }


class PodEventRecorder:
    """Posts one Event per incident on the victim's pod, and one on the pod's job, each at most once per
    incident key."""

    def __init__(
        self,
        client: Any,
        node_name: str,
        *,
        queue_size: int = 256,
        remembered_keys: int = 10000,
        retries: int = 3,
        retry_seconds: float = 1.0,
    ) -> None:
        self._client = client
        self.node_name = node_name
        self._worker: QueueWorker[tuple[tuple[Any, ...], dict[str, Any]]] = QueueWorker(
            "oomwatch-k8s-events", self._handle, queue_size)
        self._posted: OrderedDict[tuple[Any, ...], None] = OrderedDict()
        self._remembered = remembered_keys
        self._retries = retries
        self._retry_seconds = retry_seconds
        self._lock = threading.Lock()
        self.posted_count = 0
        self.refused_job_events = 0  # job Events the API server refused (403, 404, 422, …)
        self._refused_kinds_logged: set[str] = set()

    @classmethod
    def from_environment(
        cls, node_name: Optional[str] = None, client: Any = None, **kwargs: Any
    ) -> Optional["PodEventRecorder"]:
        """A recorder on the in-cluster service account (or `client`), or None (after one log line) without
        API access or without knowing the node (`NODE_NAME` from the downward API)."""
        from oomwatch.workloads.kubeapi import in_cluster_client

        node = node_name or os.environ.get("NODE_NAME")
        if not node:
            log.info("Kubernetes events: NODE_NAME is not set; no Events will be posted")
            return None
        if client is None:
            client = in_cluster_client()
        if client is None:
            return None
        return cls(client, node, **kwargs)

    @property
    def enabled(self) -> bool:
        return self._client is not None

    @property
    def dropped(self) -> int:
        """Events never posted: the queue was full when they came."""
        return self._worker.dropped

    def start(self) -> None:
        if self._client is not None:
            self._worker.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Post what is queued (up to `timeout`, one try each), then stop the worker."""
        self._worker.close(timeout)

    def _seen(self, key: tuple[Any, ...]) -> bool:
        with self._lock:
            if key in self._posted:
                return True
            self._posted[key] = None
            while len(self._posted) > self._remembered:
                self._posted.popitem(last=False)
            return False

    def _forget(self, key: tuple[Any, ...]) -> None:
        with self._lock:
            self._posted.pop(key, None)

    def record(self, incident: Incident) -> bool:
        """Queue an Event for `incident`; never blocks. True when queued, False when off, not a pod,
        already posted, or the queue is full (dropped, logged)."""
        if self._client is None:
            return False
        body = event_for_incident(incident, self.node_name)
        if body is None:
            return False
        queued = self._queue_event((incident.workload.pod_uid or incident.workload.pod,) + tuple(incident.key),
                                   body)
        # Queued after the pod's: a full queue drops the job's Event first.
        self._queue_job_event(job_event_for_incident(incident, self.node_name), tuple(incident.key))
        return queued

    def record_death(self, death: Death) -> bool:
        """Queue an Event for a death's verdict in a pod, as `record` does for an incident."""
        if self._client is None or death.workload is None:
            return False
        body = event_for_death(death, self.node_name)
        if body is None:
            return False
        queued = self._queue_event((death.workload.pod_uid or death.workload.pod, "death") + death.key, body)
        self._queue_job_event(job_event_for_death(death, self.node_name), ("death",) + death.key)
        return queued

    def _queue_job_event(self, body: Optional[dict[str, Any]], key: tuple[Any, ...]) -> None:
        if body is not None:
            job = body["involvedObject"]
            self._queue_event(("job", job["namespace"], job["kind"], job["name"]) + key, body)

    def _queue_event(self, key: tuple[Any, ...], body: dict[str, Any]) -> bool:
        if self._seen(key):
            return False
        if not self._worker.put((key, body)):
            self._forget(key)
            log.warning("Kubernetes events: queue full, dropped the event for pod %s/%s",
                        body["metadata"]["namespace"], body["involvedObject"]["name"])
            return False
        return True

    def _handle(self, item: tuple[tuple[Any, ...], dict[str, Any]]) -> None:
        key, body = item
        if not self._post(body):
            self._forget(key)  # a later publish of the same incident may try again

    def _post(self, body: dict[str, Any]) -> bool:
        """Create the Event; True when it exists afterwards (created now or before)."""
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Event

        event = Event.from_dict(body)
        for attempt in range(1, self._retries + 1):
            try:
                self._client.create(event, namespace=body["metadata"]["namespace"])
                self.posted_count += 1
                return True
            except ApiError as exc:
                code = getattr(exc.status, "code", None)
                if code == 409:
                    return True  # posted before (same incident, earlier run)
                if code not in (429, 500, 502, 503, 504) or attempt == self._retries:
                    self._log_refusal(body, exc)
                    return False
            except Exception as exc:  # noqa: BLE001 - connection errors: retry, then give up quietly
                if attempt == self._retries:
                    log.warning("Kubernetes events: cannot reach the API server: %s", exc)
                    return False
            if self._worker.closing.wait(self._retry_seconds * attempt):
                # Shutting down: one last try was made; do not hold the agent's exit.
                return False
        return False

    def _log_refusal(self, body: dict[str, Any], exc: Exception) -> None:
        kind = body["involvedObject"]["kind"]
        if kind == "Pod":
            log.warning("Kubernetes events: cannot create event %s: %s", body["metadata"]["name"], exc)
            return
        # A job Event is extra: one warning per job kind (an RBAC or admission policy refuses them all alike).
        self.refused_job_events += 1
        if kind in self._refused_kinds_logged:
            log.debug("Kubernetes events: cannot create event %s on %s: %s", body["metadata"]["name"], kind, exc)
            return
        self._refused_kinds_logged.add(kind)
        log.warning("Kubernetes events: cannot create event %s on %s %s/%s: %s (further refusals of Events on "
                    "a %s are logged at debug level; the pods' Events are not affected)", body["metadata"]["name"],
                    kind, body["involvedObject"]["namespace"], body["involvedObject"]["name"], exc, kind)

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """True once everything queued so far has been posted or given up on (tests, shutdown)."""
        return self._worker.wait_idle(timeout)
