"""Which cgroup is which workload: the identity stage keeps the node state up to date (pids, oom.group flags,
memory.events hints, the workload registry), names each workload cgroup (`_classify`, `_set_labels`), gives it
its series unless the store is full of live ones (`_export`, the workloads over the cap), and forgets it when its
cgroup goes. It keeps its own table of this node's pods from the pod source's events (`PodTable`: the resolver
names pods from it), and names each incident before it is counted: one whose container's names were never read,
or whose pod came before the first pod list, waits a bounded time for them (`NAMES_WAIT_SECONDS`), asking the
cgroup source to read the bundle again (Effects.read_names). Others see it only through `IdentityView`."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import replace
from typing import Any, Callable, NamedTuple, Optional

from oomwatch.cowmap import CowMap
from oomwatch.events import (CgroupAdded, CgroupChanged, CgroupRemoved, NamesRead, PodDeleted, PodsListed,
                             PodUpdated, ProcessExeced, ProcessForked, Stop)
from oomwatch.model import ContainerNames, Incident, PodInfo, Workload
from oomwatch.nodestate import is_workload
from oomwatch.stages import Context, CountersMoved, Due, Effects, Named
from oomwatch.stages.kernellog import KernelLogView
from oomwatch.store import Labels

VIEWS = ("IdentityView", "NamedLogView")

# An incident whose names are not known when it is complete waits this long at most for them: the bundle's names
# the cgroup source reads again at once (Effects.read_names), or the pod source's first list (an agent that just
# started on a busy node). Then it is published with what is known.
NAMES_WAIT_SECONDS = 5.0
# Deleted pods are kept this long: an OOM is often explained after its pod is gone (a Job's pod deleted on
# failure, an evicted pod).
POD_RETENTION_SECONDS = 600.0


class PodTable:
    """This node's pods as the pod source's events told them, by UID (deleted ones kept POD_RETENTION_SECONDS,
    by the events' time). `listed`: a whole list has come (before it, a pod not in the table may still be)."""

    def __init__(self, retention: float = POD_RETENTION_SECONDS) -> None:
        self._pods: dict[str, PodInfo] = {}
        self._deleted_at: dict[str, float] = {}
        self._retention = retention
        self.listed = False

    def get(self, pod_uid: str) -> Optional[PodInfo]:
        return self._pods.get(pod_uid)

    def __len__(self) -> int:
        return len(self._pods)

    def take(self, event: Any, now: float) -> Optional[frozenset]:
        """A pod event; returns the UIDs it was about (None: every pod, a list)."""
        if isinstance(event, PodsListed):
            listed = {info.uid for info in event.pods}
            for uid in self._pods:
                if uid not in listed and uid not in self._deleted_at:
                    self._deleted_at[uid] = now
            for info in event.pods:
                self._pods[info.uid] = info
                self._deleted_at.pop(info.uid, None)
            self.listed = True
            uids = None
        else:
            self._pods[event.info.uid] = event.info
            if isinstance(event, PodDeleted):
                self._deleted_at[event.info.uid] = now
            else:
                self._deleted_at.pop(event.info.uid, None)
            uids = frozenset((event.info.uid,))
        for uid, deleted_at in list(self._deleted_at.items()):
            if now - deleted_at > self._retention:
                del self._deleted_at[uid]
                self._pods.pop(uid, None)
        return uids


class _Held(NamedTuple):
    """An incident waiting for its names until `until`: the container cgroups whose bundles it asked to be read
    (`asked`), and whether it waits for the first pod list."""

    incident: Incident
    timed: bool
    until: float
    asked: frozenset
    list_wanted: bool


class IdentityStage:
    TAKES = (CgroupAdded, CgroupChanged, CgroupRemoved, PodsListed, PodUpdated, PodDeleted, NamesRead,
             ProcessForked, ProcessExeced, Due, Stop)

    def __init__(self, context: Context, log: KernelLogView, explain: Callable[[Incident], str]) -> None:
        self._context = context
        self._log = log
        self._explain = explain
        self._pods = PodTable()
        context.resolver.pods = self._pods.get  # what names a pod: this stage's table, nothing read live
        self._held: deque[_Held] = deque()  # incidents waiting for names, in the order they came due
        self._unanswered: set[str] = set()  # container cgroups whose bundles were asked for and not answered yet
        # Container cgroups whose bundle, read for a kill, named nothing (no bundle: a runtime without one, or a
        # cgroup made by hand): their next kills do not ask again, nor wait (a storm in them would wait at each).
        self._nameless: set[str] = set()
        # An incident waited its whole time for the first pod list, which did not come (the API server refuses,
        # or is down): later ones do not wait for it until it comes.
        self._list_overdue = False
        # How far the log was drained, and its cursor, when this stage last held no incident: while it holds one,
        # what the counts stage sees (NamedLogView) stops there, as it does while the kernel-log stage holds one.
        self._drained_at = log.drained_at
        self._cursor = log.cursor()
        self._identities: dict[str, Workload] = {}
        self._rows = CowMap()  # what view() shows: cgroup → (cgroup, labels, identity) of each exported workload
        # Workload cgroups the full store could not take, in the order they came (exported when it can, first first)
        self._over_cap: dict[str, None] = {}

    def view(self) -> "IdentityView":
        return IdentityView(self._identities, self._pods)

    def exported(self) -> tuple:
        """(cgroup, series labels, identity) of each exported workload, in constant time (cowmap)."""
        return self._rows.frozen().values()

    def over_cap(self) -> int:
        """Live workloads left without series: the store is full of live ones."""
        return len(self._over_cap)

    def step(self, event: Any, now: float, fx: Effects) -> list:
        node, resolver, path = self._context.node, self._context.resolver, getattr(event, "path", None)
        if isinstance(event, Due):
            return self._due(event, now, fx)
        if isinstance(event, CgroupAdded):
            resolver.owned(path, event.owner)  # (parents come first: a delegation root before what is below it)
            node.remember_pids(path, event.pids)
            node.set_oom_group(path, event.oom_group)
            node.first_reading(path, event.local)
            self._names_read(path, event.names)
            self._classify(path, event.oom_group, event.limited, fx, names_arrived=event.names is not None)
        elif isinstance(event, CgroupChanged):
            return self._cgroup_changed(event, now, fx)
        elif isinstance(event, CgroupRemoved):
            self._cgroup_removed(path, fx)
        elif isinstance(event, (PodsListed, PodUpdated, PodDeleted)):
            self._pods_heard(self._pods.take(event, now), fx)
            return self._release(now)
        elif isinstance(event, NamesRead):
            self._unanswered.discard(path)
            if event.names is None:
                self._nameless.add(path)
            else:
                self._names_read(path, event.names)
                self._renamed(path, fx)
            return self._release(now)
        elif isinstance(event, ProcessForked):
            node.process_forked(event.parent, event.parent_task, event.child)
        elif isinstance(event, ProcessExeced):
            node.process_execd(event.pid, event.cgroup, event.ns_pid, event.comm)
        elif isinstance(event, Stop):  # nothing more will answer: every incident held is published as it is
            return self._release(now, everything=True)
        return []

    def _names_read(self, path: str, names: Optional[ContainerNames]) -> None:
        if names is not None:
            self._context.resolver.runtime_names.keep(names)

    def _renamed(self, path: str, fx: Effects) -> None:
        """A container cgroup's names came late: its series, and its pod's, named now."""
        node, resolver = self._context.node, self._context.resolver
        workload = resolver.resolve(path)
        for where, identity in ((path, workload), (workload.pod_cgroup, None)):
            if where and node.is_workload(where):
                self._set_labels(where, identity or resolver.resolve(where), fx)

    # --- incidents: named before they are counted ------------------------------------------------------------

    def _due(self, due: Due, now: float, fx: Effects) -> list:
        settings, ready = self._context.settings, []
        for incident in due.incidents:
            workloads = (incident.workload, *incident.workloads)
            unnamed = _unnamed(workloads) - self._nameless if settings.read_names else frozenset()
            list_wanted = (settings.pods_watched and not self._pods.listed and not self._list_overdue
                           and any(w.pod_uid for w in workloads))
            if not (unnamed or list_wanted or self._held):
                ready.append(incident)  # (most incidents: named already, and nothing before them waits)
                continue
            for path in unnamed - self._unanswered:
                fx.read_names.append(path)  # the cgroup source reads its bundle again (a NamesRead comes back)
            self._unanswered |= unnamed
            self._held.append(_Held(incident, due.timed, now + NAMES_WAIT_SECONDS, unnamed, list_wanted))
        return ([Named(ready, due.timed)] if ready else []) + self._release(now)

    def _release(self, now: float, everything: bool = False) -> list:
        """The incidents at the head of the queue whose names came or whose wait is over, renamed with what is
        known now (each with its own `timed`, in order)."""
        out: list[Named] = []
        while self._held:
            held = self._held[0]
            waiting = (held.asked & self._unanswered) or (held.list_wanted and not self._pods.listed)
            if waiting and held.until > now and not everything:
                break
            self._held.popleft()
            self._list_overdue = self._list_overdue or (held.list_wanted and not self._pods.listed and not everything)
            incident = self._named(held.incident, now)
            if out and out[-1].timed == held.timed:
                out[-1].incidents.append(incident)
            else:
                out.append(Named([incident], held.timed))
        if not self._held:
            self._unanswered.clear()  # (an answer that never came: asked again by the next kill that needs it)
        return out

    def _named(self, incident: Incident, now: float) -> Incident:
        """The incident with its workloads resolved again (names that came while it waited), detected now."""
        resolve = self._context.resolver.resolve
        workloads = tuple(resolve(w.cgroup) if w.is_kubernetes else w for w in incident.workloads)
        workload = resolve(incident.workload.cgroup) if incident.workload.is_kubernetes else incident.workload
        if workload == incident.workload and workloads == incident.workloads:
            return replace(incident, detected_at=now)
        named = replace(incident, workload=workload, workloads=workloads, detected_at=now)
        return replace(named, explanation=self._explain(named))

    def _cgroup_changed(self, event: CgroupChanged, now: float, fx: Effects) -> list:
        path, node = event.path, self._context.node
        node.set_oom_group(path, event.oom_group)
        if event.nameless:
            self._nameless.add(path)
        if event.names is not None:  # a container's bundle written after its cgroup appeared
            self._nameless.discard(path)
            self._names_read(path, event.names)
            self._renamed(path, fx)
        for where, pids in (event.pids or {}).items():
            node.remember_pids(where, pids)
        moved = node.counters_read(path, event.local, now) if event.local is not None else None
        if not node.is_workload(path) and (moved is None or moved["oom"] or moved["oom_kill"]):
            # A plain cgroup that just got a limit or memory.oom.group (or an OOM) becomes a workload.
            self._classify(path, node.oom_group_of(path), event.limited, fx)
        return [] if moved is None else [CountersMoved(path, event.ino, event.local, moved)]

    def _cgroup_removed(self, path: str, fx: Effects) -> None:
        self._nameless.discard(path)
        self._identities.pop(path, None)
        self._rows.pop(path, None)
        if path in self._over_cap:
            del self._over_cap[path]
            if not self._over_cap:
                fx.logs.append((logging.INFO, "every live workload is exported again"))
        labels = self._context.node.cgroup_removed(path)
        if labels is not None:
            self._context.store.gone(labels)
            fx.changed = True
        self._context.resolver.removed(path)

    def _pods_heard(self, uids: Optional[frozenset], fx: Effects) -> None:
        """Owners and jobs for the pods' workloads found before the API server named them (their cgroups existed
        before the first pod list returned: an agent restarted on a busy node); `uids`: the pods heard of (None:
        every pod, a list)."""
        for path, identity in list(self._identities.items()):
            if identity.pod_uid and (uids is None or identity.pod_uid in uids):
                workload = self._context.resolver.resolve(path)
                if workload != identity:
                    self._set_labels(path, workload, fx)
                    fx.changed = True

    def _classify(self, path: str, oom_group: Optional[int], limited: bool, fx: Effects,
                  names_arrived: bool = False) -> None:
        resolver = self._context.resolver
        workload = resolver.resolve(path)
        if is_workload(path, workload, oom_group, limited, resolver.kubepods_level):
            self._set_labels(path, workload, fx)
        pod = workload.pod_cgroup
        if names_arrived and pod and self._context.node.is_workload(pod):
            # The pod cgroup appeared before any container could name it: now one can.
            self._set_labels(pod, resolver.resolve(pod), fx)

    def _set_labels(self, path: str, workload: Workload, fx: Effects) -> None:
        labels = workload.metric_labels()
        self._identities[path] = workload
        old = self._context.node.set_workload(path, labels)
        if old == labels:
            if path in self._rows:  # the same series, a richer identity (an owner the API server named)
                self._rows[path] = (path, labels, workload)
            return
        self._export(path, labels, fx)
        if old is not None:
            self._context.store.forget_unused(old)
        fx.changed = True

    def _export(self, path: str, labels: Labels, fx: Effects) -> None:
        """Series for a live workload, unless the store is full of live ones (then it is left out, said once
        when that starts and once when every workload has its series again)."""
        store = self._context.store
        # A delegated subtree's workloads (trusted by the operator, else one) never take the room kept for the others.
        room_kept = store.max_workloads // 4 if self._context.resolver.delegated(path) else 0
        if store.seen(labels, room_kept):
            self._rows[path] = (path, labels, self._identities[path])
            if self._over_cap:
                self._over_cap.pop(path, None)
                if not self._over_cap:
                    fx.logs.append((logging.INFO, "every live workload is exported again"))
            return
        if not self._over_cap:
            fx.logs.append((logging.ERROR, f"more than {store.max_workloads} live workloads: the ones beyond "
                                           "are not exported (oomwatch_workloads_over_cap, /healthz); their kills "
                                           "are still in /incidents and the events file"))
        self._over_cap[path] = None
        self._rows.pop(path, None)

    def advance(self, now: float, fx: Effects) -> list:
        """Expire the series of workloads gone past the grace period; room made goes to those left out."""
        store = self._context.store
        next_expiry = store.next_expiry()
        if next_expiry is not None and next_expiry <= now:
            store.expire()
            for path in list(self._over_cap):
                self._export(path, self._context.node.workloads[path], fx)
            fx.changed = True
        released = self._release(now)  # (incidents whose wait for names is over)
        if not self._held:
            self._drained_at, self._cursor = self._log.drained_at, self._log.cursor()
        return released

    def next_deadline(self) -> Optional[float]:
        expiry = self._context.store.next_expiry()
        if not self._held:
            return expiry
        return self._held[0].until if expiry is None else min(expiry, self._held[0].until)


def _unnamed(workloads: tuple[Workload, ...]) -> frozenset:
    """The container cgroups among these workloads that no bundle has named yet (to be read again)."""
    return frozenset(w.cgroup for w in workloads if w.type == "k8s-container" and w.container_id and not w.sandbox
                     and None in (w.pod, w.namespace, w.container))


class NamedLogView(KernelLogView):
    """The kernel log as the counts stage sees it: read to its end with everything it described counted, so not
    past an incident that waits in the identity stage for its names (its kill lines are not accounted yet: the
    reconciler would count them again from memory.events), and a restart's cursor before it."""

    __slots__ = ("_identity",)

    def __init__(self, log: Any, identity: IdentityStage) -> None:
        super().__init__(log)
        self._identity = identity

    @property
    def drained_at(self) -> float:
        drained_at = super().drained_at
        return min(self._identity._drained_at, drained_at) if self._identity._held else drained_at

    def cursor(self) -> Optional[int]:
        cursor, held = super().cursor(), self._identity._cursor
        if not self._identity._held:
            return cursor
        if held is None:  # nothing was published before what waits: a restart reads the log from its start
            return None
        return held if cursor is None else min(held, cursor)


class IdentityView:
    """Which workload each workload cgroup is, and what the pod source said of each pod, read-only (for the
    deaths stage)."""

    __slots__ = ("_identities", "_pods")

    def __init__(self, identities: dict[str, Workload], pods: PodTable) -> None:
        self._identities = identities
        self._pods = pods

    def identity_of(self, path: Optional[str]) -> Optional[Workload]:
        return self._identities.get(path) if path is not None else None

    def pod_info(self, pod_uid: Optional[str]) -> Optional[PodInfo]:
        """The pod as the pod source's events last told it (its status included); None: not heard of."""
        return self._pods.get(pod_uid) if pod_uid else None
