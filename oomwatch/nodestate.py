"""What the agent knows of the node's cgroups and processes, behind one lock: the pid → cgroup map, the
memory.oom.group flags, the `oom`/`oom_kill` hints and the workload registry.

Written by the cgroup watcher and the proc connector threads, read by the kernel-log processor (through the
read-only `NodeView` methods the correlator uses) and by scrapes. Every method takes the lock for as long as it
touches the maps, never across a file read.
"""

from __future__ import annotations

import os
import posixpath
import threading
from typing import Callable, Iterable, Optional

from oomwatch.correlator import is_within, oom_group_ancestor
from oomwatch.model import CgroupStats
from oomwatch.node import is_workload_cgroup, with_effective_oom_group
from oomwatch.sources.cgroupfs import CgroupFS, Proc
from oomwatch.store import Labels, Store
from oomwatch.workloads import WorkloadResolver, identify

# A cgroup's pid list is re-read at most this often while it sits at its limit.
PID_SNAPSHOT_INTERVAL = 0.2
# How far apart (kernel clock) a cgroup's `oom`/`oom_kill` move and a kill may be to be taken as one.
OOM_HINT_SECONDS = 10.0
# Bound on remembered pids: a node forks far more processes than it keeps (exits are forgotten with their
# cgroup; this catches the rest).
MAX_PIDS = 1 << 20


_WATCHED = ("max", "oom", "oom_kill", "oom_group_kill")


def _moved_counters(local: dict[str, int]) -> tuple[int, int, int, int]:
    return tuple(local.get(k, 0) for k in _WATCHED)  # type: ignore[return-value]


class NodeState:
    """Implements `correlator.NodeView`. `clock` gives epoch seconds (hint times are compared with kernel
    times of kills, converted to epoch by the boot time)."""

    def __init__(self, fs: CgroupFS, proc: Proc, resolver: WorkloadResolver, store: Store,
                 clock: Callable[[], float]) -> None:
        self.fs, self.proc, self.resolver, self.store, self.clock = fs, proc, resolver, store, clock
        self._lock = threading.RLock()
        self._pids: dict[int, str] = {}
        self._pids_by_cgroup: dict[str, set[int]] = {}
        self._oom_group: dict[str, int] = {}
        self._oom_at: dict[str, float] = {}
        self._oom_kill_at: dict[str, float] = {}
        # memory.events.local as last read, as (max, oom, oom_kill, oom_group_kill): a tuple, not a dict, per cgroup
        self._last_local: dict[str, tuple[int, int, int, int]] = {}
        self._pid_snapshot_at: dict[str, float] = {}
        self._workloads: dict[str, Labels] = {}
        self.cgns_prefix: Optional[str] = None
        self.known: Callable[[], Iterable[str]] = lambda: ()  # the watcher's cgroups (set by the agent)
        self.stat_cache = None  # sources.statcache.StatCache: scrape-time reads (set by the agent)
        self.unwatched_limits: set[str] = set()  # cgroups whose limit files inotify cannot watch
        self._identity: dict[str, object] = {}  # workload cgroup → identify(path), once

    # --- NodeView ----------------------------------------------------------------------------------

    def cgroup_of_pid(self, pid: int) -> Optional[str]:
        """Live from /proc while the process exists, else what we last saw of it."""
        live = self.cgroup_of_pid_live(pid)
        if live is not None:
            return live
        with self._lock:
            return self._pids.get(pid)

    def cgroup_of_pid_live(self, pid: int) -> Optional[str]:
        path = self.proc.cgroup_of(pid)
        if path is not None and self.cgns_prefix is not None:
            path = posixpath.normpath(self.cgns_prefix + "/" + path.lstrip("/"))
        return path

    def oom_group_cgroup(self, cgroup: str, within: Optional[str]) -> Optional[str]:
        """The cgroup the kernel would kill whole, by the memory.oom.group flags as last read."""
        with self._lock:
            return oom_group_ancestor(cgroup, within, lambda path: self._oom_group.get(path) == 1)

    def oom_cgroup_hint(self, victim_cgroup: Optional[str], at: float) -> Optional[str]:
        """The deepest ancestor of the victim's cgroup whose memory.events.local `oom` moved near `at`."""
        if victim_cgroup is None:
            return None
        with self._lock:
            candidates = [p for p, t in self._oom_at.items()
                          if abs(at - t) <= OOM_HINT_SECONDS and is_within(victim_cgroup, p)]
        return max(candidates, key=len) if candidates else None

    def victim_cgroup_hint(self, oom_cgroup: Optional[str], at: float) -> Optional[str]:
        """The cgroup whose memory.events.local `oom_kill` moved nearest to `at` (within the oom cgroup)."""
        with self._lock:
            candidates = [(abs(at - t), p) for p, t in self._oom_kill_at.items()
                          if abs(at - t) <= OOM_HINT_SECONDS and (oom_cgroup is None or is_within(p, oom_cgroup))]
        return min(candidates)[1] if candidates else None

    # --- pids ----------------------------------------------------------------------------------------

    def remember_pids(self, path: str) -> None:
        pids = self.fs.read_pids(path)
        with self._lock:
            if len(self._pids) + len(pids) > MAX_PIDS:
                self._pids.clear()
                self._pids_by_cgroup.clear()
            for pid in pids:
                self._pids[pid] = path
            if pids:  # most cgroups of a tree hold no process themselves (only their leaves do)
                self._pids_by_cgroup.setdefault(path, set()).update(pids)

    def snapshot_pids(self, root: str) -> None:
        for path in [p for p in self.known() if is_within(p, root)]:
            self.remember_pids(path)

    def process_forked(self, parent: int, parent_task: int, child: int) -> None:
        """A child starts in its parent's cgroup; what a cgroup.procs snapshot saw is never overwritten."""
        with self._lock:
            cgroup = self._pids.get(parent_task) or self._pids.get(parent)
            if cgroup is not None and child not in self._pids:
                self._pids[child] = cgroup
                self._pids_by_cgroup.setdefault(cgroup, set()).add(child)

    def process_execd(self, pid: int) -> None:
        """An exec: the process is alive and settled, /proc tells its cgroup (authoritative)."""
        cgroup = self.cgroup_of_pid_live(pid)
        if cgroup is not None:
            with self._lock:
                self._pids[pid] = cgroup
                self._pids_by_cgroup.setdefault(cgroup, set()).add(pid)

    def last_cgroup_of(self, pid: int) -> Optional[str]:
        with self._lock:
            return self._pids.get(pid)

    def find_cgroup_namespace_prefix(self) -> Optional[str]:
        """In a container with its own cgroup namespace, /proc/<pid>/cgroup is relative to the agent's own
        cgroup (`/../../kubepods/…`); our pid's place in the host tree gives the prefix."""
        seen_as = self.proc.own_cgroup()
        host_path = self.last_cgroup_of(os.getpid())
        if seen_as is None or host_path is None or seen_as == host_path:
            return None
        if seen_as == "/":
            return host_path
        if host_path.endswith(seen_as):
            return host_path[: -len(seen_as)] or None
        return None

    # --- cgroups -------------------------------------------------------------------------------------

    def cgroup_added(self, path: str) -> Optional[CgroupStats]:
        """A new cgroup (or one whose limits may have changed): pids, names, oom.group, workload status."""
        self.remember_pids(path)
        names = self.resolver.container_appeared(path)
        workload = self.resolver.resolve(path)
        stats = self.fs.read_stats(path)
        with self._lock:
            if stats is not None:
                if stats.events_local is not None:
                    self._last_local[path] = _moved_counters(stats.events_local)
                if stats.oom_group is not None:
                    self._oom_group[path] = stats.oom_group
            pod_known = workload.pod_cgroup in self._workloads
        if is_workload_cgroup(path, workload, stats):
            self._set_labels(path, workload.metric_labels())
        if names is not None and pod_known and workload.pod_cgroup:
            # The pod cgroup appeared before any container could name it: now one can.
            self._set_labels(workload.pod_cgroup, self.resolver.resolve(workload.pod_cgroup).metric_labels())
        return stats

    def _set_labels(self, path: str, labels: Labels) -> None:
        with self._lock:
            old = self._workloads.get(path)
            self._workloads[path] = labels
        self.store.seen(labels)
        if old is not None and old != labels:
            self.store.forget_unused(old)

    def cgroup_removed(self, path: str) -> None:
        with self._lock:
            labels = self._workloads.pop(path, None)
            still_used = labels in self._workloads.values()
            for per_path in (self._last_local, self._pid_snapshot_at, self._oom_at, self._oom_kill_at,
                             self._oom_group, self._identity):
                per_path.pop(path, None)
            # Its processes are gone (a cgroup is removed only when empty), and their incidents were built.
            for pid in self._pids_by_cgroup.pop(path, ()):
                if self._pids.get(pid) == path:
                    del self._pids[pid]
        if labels is not None and not still_used:
            self.store.gone(labels)
        self.store.expire()

    def events_changed(self, path: str, local: dict[str, int]) -> dict[str, bool]:
        """memory.events.local of `path` now reads `local`. Returns which of max/oom/oom_kill/oom_group_kill
        moved. Only OOM moves do work: hints, and for workloads a pid snapshot and a re-read of oom.group."""
        now = self.clock()
        with self._lock:
            before = self._last_local.get(path, (0, 0, 0, 0))
            now_counts = self._last_local[path] = _moved_counters(local)
            moved = {k: a > b for k, a, b in zip(_WATCHED, now_counts, before)}
            if moved["oom"]:
                self._oom_at[path] = now
            if moved["oom_kill"]:
                self._oom_kill_at[path] = now
            is_workload = path in self._workloads
            snapshot_due = now - self._pid_snapshot_at.get(path, 0.0) >= PID_SNAPSHOT_INTERVAL
            if snapshot_due and (moved["oom"] or moved["oom_kill"] or (moved["max"] and is_workload)):
                self._pid_snapshot_at[path] = now
            else:
                snapshot_due = False
        if snapshot_due:
            # At its limit: who is in it now is who a kill will take (the victim may be gone a moment later).
            self.snapshot_pids(path)
            oom_group = self.fs.read_oom_group(path)
            if oom_group is not None:
                with self._lock:
                    self._oom_group[path] = oom_group
        if not is_workload and (moved["oom"] or moved["oom_kill"]):
            self.cgroup_added(path)  # a plain cgroup that just got a limit or oom.group becomes a workload
        return moved

    def limits_changed(self, path: str) -> None:
        """memory.max or memory.oom.group was written: its flag now, and whether it became a workload."""
        oom_group = self.fs.read_oom_group(path)
        with self._lock:
            if oom_group is not None:
                self._oom_group[path] = oom_group
            is_workload = path in self._workloads
        if not is_workload:
            self.cgroup_added(path)

    def populated(self, path: str) -> None:
        """A cgroup got its first process (a container's init, its resources now set): pids and oom.group."""
        self.snapshot_pids(path)
        oom_group = self.fs.read_oom_group(path)
        if oom_group is not None:
            with self._lock:
                self._oom_group[path] = oom_group

    # --- scrape-time reads -----------------------------------------------------------------------------

    def workload_items(self) -> list[tuple[str, Labels]]:
        with self._lock:
            return list(self._workloads.items())

    def live_workloads(self) -> Iterable[tuple[Labels, CgroupStats]]:
        self.store.expire()  # drop the series of workloads gone longer than the grace period
        seen: set[Labels] = set()
        cache = self.stat_cache
        for path, labels in self.workload_items():
            if labels in seen:
                continue
            if cache is None:
                stats = self.fs.read_stats(path, with_local=False)
            else:
                if path in self.unwatched_limits:
                    cache.invalidate(path)  # no inotify on its limits: read them every time
                stats = cache.read(path)
            if stats is not None:
                seen.add(labels)
                workload = self._identity.get(path)
                if workload is None:
                    workload = self._identity[path] = identify(path)
                yield labels, with_effective_oom_group(self.fs, workload, stats)

    def is_workload(self, path: str) -> bool:
        with self._lock:
            return path in self._workloads
