"""What the pipeline knows of the node's cgroups and processes: the pid → cgroup map, the memory.oom.group flags,
the `oom`/`oom_kill` hints and the workload registry.

Owned by the pipeline's thread and fed only by its events (oomwatch.events): no lock, no file read. The
correlator asks it through the read-only `correlator.NodeView` methods; scrapes see the registry only in the
pipeline's immutable snapshot.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from oomwatch.correlator import is_within, oom_group_ancestor
from oomwatch.model import OomCounters, Workload
from oomwatch.store import Labels
from oomwatch.workloads import WorkloadResolver
from oomwatch.workloads import kubepods_level as default_kubepods_level

# A cgroup's hints: how far apart (kernel clock) its `oom`/`oom_kill` move and a kill may be to be taken as one.
OOM_HINT_SECONDS = 10.0
# Bound on remembered pids: a node forks far more processes than it keeps (exits are forgotten with their
# cgroup; this catches the rest).
MAX_PIDS = 1 << 20
MAX_MAINS = 1 << 16  # main processes remembered (one per live container; forgotten at their exit)

Moved = dict  # counter name → whether it moved


def is_workload(path: str, workload: Workload, oom_group: Optional[int], limited: bool,
                kubepods_level: Callable[[str], Optional[str]] = default_kubepods_level) -> bool:
    """Which cgroups get their own series: Kubernetes containers and pods, Slurm steps, systemd services
    and scopes, and any other cgroup with memory.oom.group=1 or a memory limit (`limited`: someone cared).
    `kubepods_level`: the node's (WorkloadResolver.kubepods_level: the kubelet's cgroup root)."""
    if workload.cgroup != path or workload.sandbox or kubepods_level(path) == "conmon":
        return False
    if workload.type in ("k8s-container", "k8s-pod", "slurm"):
        return True
    if workload.type == "systemd":
        return bool(workload.unit and workload.unit.endswith((".service", ".scope")))
    return oom_group == 1 or limited


class NodeState:
    """Implements `correlator.NodeView`. Times are epoch seconds of the event that brought them (hints are
    compared with kernel times of kills, converted to epoch by the boot time)."""

    def __init__(self, resolver: WorkloadResolver) -> None:
        self.resolver = resolver
        self._pids: dict[int, str] = {}
        self._pids_by_cgroup: dict[str, set[int]] = {}
        self._oom_group: dict[str, int] = {}
        self._oom_at: dict[str, float] = {}
        self._oom_kill_at: dict[str, float] = {}
        self._counters = OomCounters()  # memory.events.local as the events brought it
        self.workloads: dict[str, Labels] = {}  # workload cgroup → its series' labels
        # Workloads' main processes (a container's init, seen exec'ing as pid 1 of its namespace): pid → (its
        # cgroup, comm). Their ends are deaths to judge (oomwatch.deaths), whatever ended them.
        self.mains: dict[int, tuple[str, Optional[str]]] = {}
        self._label_paths: dict[Labels, int] = {}  # how many workload cgroups share those labels

    # --- NodeView ----------------------------------------------------------------------------------

    def cgroup_of_pid(self, pid: int) -> Optional[str]:
        return self._pids.get(pid)

    def oom_group_cgroup(self, cgroup: str, within: Optional[str]) -> Optional[str]:
        """The cgroup the kernel would kill whole, by the memory.oom.group flags as last read."""
        return oom_group_ancestor(cgroup, within, lambda path: self._oom_group.get(path) == 1)

    def oom_cgroup_hint(self, victim_cgroup: Optional[str], at: float) -> Optional[str]:
        """The deepest ancestor of the victim's cgroup whose memory.events.local `oom` moved near `at`."""
        if victim_cgroup is None:
            return None
        candidates = [p for p, t in self._oom_at.items()
                      if abs(at - t) <= OOM_HINT_SECONDS and is_within(victim_cgroup, p)]
        return max(candidates, key=len) if candidates else None

    def victim_cgroup_hint(self, oom_cgroup: Optional[str], at: float) -> Optional[str]:
        """The cgroup whose memory.events.local `oom_kill` moved nearest to `at` (within the oom cgroup)."""
        candidates = [(abs(at - t), p) for p, t in self._oom_kill_at.items()
                      if abs(at - t) <= OOM_HINT_SECONDS and (oom_cgroup is None or is_within(p, oom_cgroup))]
        return min(candidates)[1] if candidates else None

    # --- processes -----------------------------------------------------------------------------------

    def remember_pids(self, path: str, pids: Iterable[int]) -> None:
        pids = tuple(pids)
        if len(self._pids) + len(pids) > MAX_PIDS:
            self._pids.clear()
            self._pids_by_cgroup.clear()
        for pid in pids:
            self._pids[pid] = path
        if pids:  # most cgroups of a tree hold no process themselves (only their leaves do)
            self._pids_by_cgroup.setdefault(path, set()).update(pids)

    def process_forked(self, parent: int, parent_task: int, child: int) -> None:
        """A child starts in its parent's cgroup; what a cgroup.procs snapshot saw is never overwritten."""
        cgroup = self._pids.get(parent_task) or self._pids.get(parent)
        if cgroup is not None and child not in self._pids:
            self.remember_pids(cgroup, (child,))

    def process_execd(self, pid: int, cgroup: Optional[str], ns_pid: Optional[int] = None,
                      comm: Optional[str] = None) -> None:
        """An exec: the process is alive and settled, /proc told its cgroup (authoritative). The init of a pid
        namespace (a container's entrypoint) is its workload's main process."""
        if cgroup is not None:
            self.remember_pids(cgroup, (pid,))
            if ns_pid == 1 and pid != 1:
                if len(self.mains) >= MAX_MAINS:
                    self.mains.clear()
                self.mains[pid] = (cgroup, comm)

    def workload_of(self, cgroup: Optional[str]) -> Optional[str]:
        """The workload cgroup `cgroup` belongs to: itself or its deepest registered ancestor."""
        path = cgroup
        while path:
            if path in self.workloads:
                return path
            if path == "/":
                return None
            path = path.rsplit("/", 1)[0] or "/"
        return None

    def oom_kill_near(self, workload: str, start: float, end: float) -> bool:
        """Whether memory.events.local `oom_kill` moved in `workload` or below between `start` and `end`."""
        return any(start <= t <= end and is_within(p, workload) for p, t in self._oom_kill_at.items())

    def oom_kills_local(self, path: str) -> Optional[int]:
        """memory.events.local `oom_kill` of `path` as last read (None: never read)."""
        return self._counters.last(path, "oom_kill")

    # --- cgroups -------------------------------------------------------------------------------------

    def oom_group_of(self, path: str) -> Optional[int]:
        return self._oom_group.get(path)

    def is_grouped(self, path: str) -> bool:
        """memory.oom.group=1 on the cgroup or an ancestor (as last read): every kill in it is a group kill."""
        return self.oom_group_cgroup(path, None) is not None

    def set_oom_group(self, path: str, oom_group: Optional[int]) -> None:
        if oom_group is not None:
            self._oom_group[path] = oom_group

    def counters_read(self, path: str, local: dict, now: float) -> Moved:
        """memory.events.local of `path` now reads `local`: which of max/oom/oom_kill/oom_group_kill moved
        (hints for the correlator: when `oom` and `oom_kill` last moved here)."""
        moved = self._counters.read(path, local)
        if moved["oom"]:
            self._oom_at[path] = now
        if moved["oom_kill"]:
            self._oom_kill_at[path] = now
        return moved

    def first_reading(self, path: str, local: Optional[dict]) -> None:
        self._counters.first(path, local)

    def set_workload(self, path: str, labels: Labels) -> Optional[Labels]:
        """Register `path` as a workload with `labels`; returns the labels it had before (None: new)."""
        old = self.workloads.get(path)
        if old == labels:
            return old
        if old is not None:
            self._unuse(old)
        self.workloads[path] = labels
        self._label_paths[labels] = self._label_paths.get(labels, 0) + 1
        return old

    def cgroup_removed(self, path: str) -> Optional[Labels]:
        """Forget a cgroup in constant time. Returns its workload labels when no other live cgroup shares them
        (their series are gone now), else None."""
        self._counters.forget(path)
        for per_path in (self._oom_at, self._oom_kill_at, self._oom_group):
            per_path.pop(path, None)
        # Its processes are gone (a cgroup is removed only when empty), and their incidents were built.
        for pid in self._pids_by_cgroup.pop(path, ()):
            if self._pids.get(pid) == path:
                del self._pids[pid]
        labels = self.workloads.pop(path, None)
        if labels is None:
            return None
        return labels if self._unuse(labels) else None

    def _unuse(self, labels: Labels) -> bool:
        """One cgroup fewer uses `labels`; True when none does now."""
        left = self._label_paths.get(labels, 0) - 1
        if left > 0:
            self._label_paths[labels] = left
            return False
        self._label_paths.pop(labels, None)
        return True

    def is_workload(self, path: str) -> bool:
        return path in self.workloads
