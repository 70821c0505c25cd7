"""Which cgroup is which workload: the identity stage keeps the node state up to date (pids, oom.group flags,
memory.events hints, the workload registry), names each workload cgroup (`_classify`, `_set_labels`), gives it
its series unless the store is full of live ones (`_export`, the workloads over the cap), and forgets it when its
cgroup goes. Others see its identities only through `IdentityView`."""

from __future__ import annotations

import logging
from typing import Any, Optional

from oomwatch.cowmap import CowMap
from oomwatch.events import (CgroupAdded, CgroupChanged, CgroupRemoved, PodsListed, ProcessExeced,
                             ProcessForked)
from oomwatch.model import Workload
from oomwatch.nodestate import is_workload
from oomwatch.stages import Context, CountersMoved, Effects
from oomwatch.store import Labels

VIEWS = ("IdentityView",)


class IdentityStage:
    TAKES = (CgroupAdded, CgroupChanged, CgroupRemoved, PodsListed, ProcessForked, ProcessExeced)

    def __init__(self, context: Context) -> None:
        self._context = context
        self._identities: dict[str, Workload] = {}
        self._rows = CowMap()  # what view() shows: cgroup → (cgroup, labels, identity) of each exported workload
        # Workload cgroups the full store could not take, in the order they came (exported when it can, first first)
        self._over_cap: dict[str, None] = {}

    def view(self) -> "IdentityView":
        return IdentityView(self._identities)

    def exported(self) -> tuple:
        """(cgroup, series labels, identity) of each exported workload, in constant time (cowmap)."""
        return self._rows.frozen().values()

    def over_cap(self) -> int:
        """Live workloads left without series: the store is full of live ones."""
        return len(self._over_cap)

    def step(self, event: Any, now: float, fx: Effects) -> list:
        node, resolver, path = self._context.node, self._context.resolver, getattr(event, "path", None)
        if isinstance(event, CgroupAdded):
            resolver.owned(path, event.owner)  # (parents come first: a delegation root before what is below it)
            node.remember_pids(path, event.pids)
            node.set_oom_group(path, event.oom_group)
            node.first_reading(path, event.local)
            if event.names is not None:
                resolver.runtime_names.keep(event.names)
            self._classify(path, event.oom_group, event.limited, fx, names_arrived=event.names is not None)
        elif isinstance(event, CgroupChanged):
            return self._cgroup_changed(event, now, fx)
        elif isinstance(event, CgroupRemoved):
            self._cgroup_removed(path, fx)
        elif isinstance(event, PodsListed):
            self._pods_listed(event, fx)
        elif isinstance(event, ProcessForked):
            node.process_forked(event.parent, event.parent_task, event.child)
        elif isinstance(event, ProcessExeced):
            node.process_execd(event.pid, event.cgroup, event.ns_pid, event.comm)
        return []

    def _cgroup_changed(self, event: CgroupChanged, now: float, fx: Effects) -> list:
        path, node = event.path, self._context.node
        node.set_oom_group(path, event.oom_group)
        for where, pids in (event.pids or {}).items():
            node.remember_pids(where, pids)
        moved = node.counters_read(path, event.local, now) if event.local is not None else None
        if not node.is_workload(path) and (moved is None or moved["oom"] or moved["oom_kill"]):
            # A plain cgroup that just got a limit or memory.oom.group (or an OOM) becomes a workload.
            self._classify(path, node.oom_group_of(path), event.limited, fx)
        return [] if moved is None else [CountersMoved(path, event.ino, event.local, moved)]

    def _cgroup_removed(self, path: str, fx: Effects) -> None:
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

    def _pods_listed(self, event: PodsListed, fx: Effects) -> None:
        """Owners and jobs for the pods' workloads found before the API server named them (their cgroups existed
        before the first pod list returned: an agent restarted on a busy node)."""
        uids = event.uids
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
        return []

    def next_deadline(self) -> Optional[float]:
        return self._context.store.next_expiry()


class IdentityView:
    """Which workload each workload cgroup is, read-only (for the deaths stage)."""

    __slots__ = ("_identities",)

    def __init__(self, identities: dict[str, Workload]) -> None:
        self._identities = identities

    def identity_of(self, path: Optional[str]) -> Optional[Workload]:
        return self._identities.get(path) if path is not None else None
