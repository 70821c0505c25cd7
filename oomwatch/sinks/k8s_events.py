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

Needs RBAC `events: create` in the pods' namespaces. Without an API client the recorder is off.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from typing import Any, Optional

from oomwatch.deaths import Death
from oomwatch.model import Incident, Workload

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


def _rfc3339(epoch: float) -> str:
    return _dt.datetime.fromtimestamp(epoch, tz=_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_name(pod: str, key: tuple[Any, ...]) -> str:
    """`<pod>.<16 hex of the incident key>`: a valid DNS subdomain, stable for the same incident."""
    digest = hashlib.sha256(repr(tuple(key)).encode()).hexdigest()[:16]
    return f"{pod[: _MAX_NAME - len(digest) - 1]}.{digest}"


def event_for_incident(incident: Incident, node_name: str) -> Optional[dict[str, Any]]:
    """The core/v1 Event (as JSON) to post for an incident, or None when its victim is not in a known
    pod (a Slurm job, a systemd unit, a pod whose name could not be learned)."""
    return _event(incident.workload, incident.key, incident.time,
                  REASON_GROUP if incident.kind == "group" else REASON_SINGLE, incident.explanation, node_name)


def event_for_death(death: Death, node_name: str) -> Optional[dict[str, Any]]:
    """The Event for a death's verdict in a pod (reason by cause), or None outside a known pod."""
    if death.workload is None:
        return None
    return _event(death.workload, ("death",) + death.key, death.time, DEATH_REASONS[death.cause],
                  death.explanation, node_name)


def _event(workload: Workload, key: tuple, time: float, reason: str, message: str,
           node_name: str) -> Optional[dict[str, Any]]:
    if not workload.is_kubernetes or not workload.pod or not workload.namespace:
        return None
    timestamp = _rfc3339(time)
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
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name(workload.pod, key), "namespace": workload.namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:_MAX_MESSAGE],
        "type": "Warning",
        "source": {"component": COMPONENT, "host": node_name},
        "reportingComponent": REPORTING_CONTROLLER,
        "reportingInstance": node_name,
        "firstTimestamp": timestamp,
        "lastTimestamp": timestamp,
        "count": 1,
    }


class PodEventRecorder:
    """Posts one Event per incident on the victim's pod, at most once per incident key."""

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
        self._queue: "queue.Queue[Optional[tuple[tuple[Any, ...], dict[str, Any]]]]" = queue.Queue(queue_size)
        self._posted: OrderedDict[tuple[Any, ...], None] = OrderedDict()
        self._remembered = remembered_keys
        self._retries = retries
        self._retry_seconds = retry_seconds
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.posted_count = 0
        self.dropped_count = 0

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

    def start(self) -> None:
        if self._client is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="oomwatch-k8s-events", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Post what is queued (up to `timeout`), then stop the worker."""
        if self._thread is None:
            return
        self._stopping.set()
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)

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
        return self._queue_event((incident.workload.pod_uid or incident.workload.pod,) + tuple(incident.key), body)

    def record_death(self, death: Death) -> bool:
        """Queue an Event for a death's verdict in a pod, as `record` does for an incident."""
        if self._client is None or death.workload is None:
            return False
        body = event_for_death(death, self.node_name)
        if body is None:
            return False
        return self._queue_event((death.workload.pod_uid or death.workload.pod, "death") + death.key, body)

    def _queue_event(self, key: tuple[Any, ...], body: dict[str, Any]) -> bool:
        if self._seen(key):
            return False
        try:
            self._queue.put_nowait((key, body))
        except queue.Full:
            self._forget(key)
            self.dropped_count += 1
            log.warning("Kubernetes events: queue full, dropped the event for pod %s/%s",
                        body["metadata"]["namespace"], body["involvedObject"]["name"])
            return False
        return True

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                key, body = item
                if not self._post(body):
                    self._forget(key)
            finally:
                self._queue.task_done()

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
                    log.warning("Kubernetes events: cannot create event %s: %s",
                                body["metadata"]["name"], exc)
                    return False
            except Exception as exc:  # noqa: BLE001 - connection errors: retry, then give up quietly
                if attempt == self._retries:
                    log.warning("Kubernetes events: cannot reach the API server: %s", exc)
                    return False
            if self._stopping.wait(self._retry_seconds * attempt):
                # Shutting down: one last try was made; do not hold the agent's exit.
                return False
        return False

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """True once everything queued so far has been posted or given up on (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.01)
        return False
