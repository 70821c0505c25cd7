"""The API server's pods of this node as an event source: a list, then a watch, in a background thread, each
answer emitted as typed events (PodsListed, PodUpdated, PodDeleted) for the pipeline, whose identity stage keeps
its own table of them. Nothing here is read by the pipeline: what it knows of a pod came as an event, so a replay
of the events gives the same incidents whenever the watch delivered. Without API access (no in-cluster config,
forbidden, unreachable) it logs one line and emits nothing.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, Mapping, Optional

from oomwatch.events import PodDeleted, PodsListed, PodUpdated
from oomwatch.workloads import kubeapi

log = logging.getLogger(__name__)

Emit = Callable[[Any], None]


def _as_dict(obj: Any) -> Mapping[str, Any]:
    if isinstance(obj, dict):
        return obj
    to_dict = getattr(obj, "to_dict", None)
    return to_dict() if callable(to_dict) else {}


class PodSource:
    """Lists and watches this node's pods (`fieldSelector=spec.nodeName=<node>`; RBAC `pods: list, watch`) and
    emits what it hears. `listed` and `watched` turn one answer (pods as JSON) into events; the thread calls
    them, and so can a test."""

    def __init__(self, node_name: str, client: Any, emit: Emit, *, retry_seconds: float = 5.0,
                 max_retry_seconds: float = 120.0) -> None:
        self.node_name = node_name
        self._client = client
        self._emit = emit
        self._retry = retry_seconds
        self._max_retry = max_retry_seconds
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._warned = False

    @classmethod
    def from_environment(cls, emit: Emit, node_name: Optional[str] = None, **kwargs: Any) -> Optional["PodSource"]:
        """A PodSource on the in-cluster service account, or None (after one log line) when this process
        does not run in a pod with API access or does not know its node (`NODE_NAME`, downward API)."""
        client = kubeapi.in_cluster_client()
        node = node_name or os.environ.get("NODE_NAME")
        if client is None:
            return None
        if not node:
            log.info("Kubernetes API: NODE_NAME is not set; pod owners and jobs will not be looked up")
            return None
        return cls(node, client, emit, **kwargs)

    # -- one answer → events ------------------------------------------------------------------------

    def listed(self, pods: list[Mapping[str, Any]]) -> None:
        """A fresh list (pods as JSON)."""
        infos = (kubeapi.pod_info_from_object(pod) for pod in pods)
        self._emit(PodsListed(tuple(info for info in infos if info is not None)))

    def watched(self, event_type: str, pod: Mapping[str, Any]) -> None:
        """One watch event (ADDED / MODIFIED / DELETED) on a pod given as JSON."""
        info = kubeapi.pod_info_from_object(pod)
        if info is not None:
            self._emit(PodDeleted(info) if event_type == "DELETED" else PodUpdated(info))

    # -- background list + watch --------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="oomwatch-pods", daemon=True)
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
        """True once the first list has been emitted."""
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
                self.listed([_as_dict(p) for p in listing])
                self._synced.set()
                delay = self._retry
                version = listing.resourceVersion
                for event_type, pod in self._client.watch(
                    Pod, namespace=ALL_NS, fields=selector, resource_version=version
                ):
                    if self._stop.is_set():
                        return
                    self.watched(event_type, _as_dict(pod))
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
