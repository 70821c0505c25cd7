"""The cgroup tree and the proc connector as event sources: what the watcher and the connector report is read
here, on their threads, and emitted as oomwatch.events for the pipeline. Nothing here decides anything about
incidents; it only decides what is worth reading (a pid snapshot when an OOM is near, not at every counter move).
"""

from __future__ import annotations

import math
import os
import posixpath
import time
from typing import Any, Callable, Optional

from oomwatch.events import (
    CgroupAdded,
    CgroupChanged,
    CgroupRemoved,
    MemoryStatRead,
    NamesRead,
    OomdMarksRead,
    ProcessExeced,
    ProcessExited,
    ProcessForked,
)
from oomwatch.parse.cgroup import parse_limit
from oomwatch.model import STAT_KEYS_USED, OomCounters
from oomwatch.parse.memstat import parse_memory_stat_block
from oomwatch.parse.oomd import parse_oomd_xattr
from oomwatch.sources.cgroupfs import CgroupFS, CgroupWatcher, Proc, WatchHealth, cat
from oomwatch.workloads import WorkloadResolver

# A cgroup's pid list is re-read at most this often while it sits at its limit.
PID_SNAPSHOT_INTERVAL = 0.2
# memory.stat is read at most this often per cgroup while it sits at its limit (`max` moving), and at most
# STAT_READS_PER_SECOND times a second on the node: each read costs the kernel an rstat flush and the agent a parse,
# and in the 50x4 storm reads every 0.1 s and at each OOM move raised the detection latency's median by 0.2 s
# (2026-11-26 14:23). A reading is of use only when a read of the log to its end came after it without the kill
# (docs/loop.md); one taken at an `oom` or `oom_kill` move is as good as after the kill.
STAT_READ_INTERVAL = 1.0
STAT_READS_PER_SECOND = 20

Emit = Callable[[Any], None]


class CgroupSource:
    """Watches the tree (sources.cgroupfs.CgroupWatcher) and emits CgroupAdded / CgroupChanged / CgroupRemoved.

    `resolver` reads container names from the runtime's bundles as containers appear, again when a container
    still unnamed gets its first process (the runtime may write its bundle after making its cgroup), and when a
    kill needs them (`read_names`, the pipeline's Effects.read_names); `stat_cache` (scrape-time
    reads) is told what changed; `on_kill()` is called when a cgroup's oom_kill moves (the cue a syslog(2)
    reader needs). `clock` is monotonic seconds, for the rate limits; `wall_clock` stamps memory.stat readings
    with the kernel-log reader's clock (KernelLog.drained_at is time.time())."""

    def __init__(self, fs: CgroupFS, resolver: WorkloadResolver, emit: Emit, *, stat_cache: Any = None,
                 on_kill: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.fs, self.resolver, self._emit = fs, resolver, emit
        self.stat_cache = stat_cache
        self.on_kill = on_kill
        self._clock = clock
        self._wall_clock = wall_clock
        self._counters = OomCounters()  # memory.events.local as last read here
        self._snapshot_at: dict[str, float] = {}
        self._stat_at: dict[str, float] = {}  # when memory.stat was last read (clock), per cgroup
        self._stat_window: list = [float("-inf"), 0]  # [start, reads] of the node's current second
        self.own_cgroup: Optional[str] = None  # where this process sits in the watched tree (seen in a pid list)
        self._unnamed: set[str] = set()  # container cgroups whose bundle named no pod when they appeared
        self.watcher = CgroupWatcher(fs, on_added=self._added, on_removed=self._removed, on_events=self._events,
                                     on_populated=self._populated)
        self.watcher.on_limits = self._limits
        if stat_cache is not None:
            self.watcher.on_resync = stat_cache.invalidate_all

    def start(self) -> None:
        """Watch the whole tree and emit what is there now (the pipeline's initial state)."""
        for path in self.watcher.start_watching():
            self._added(path)

    def run(self) -> None:
        self.watcher.run()

    def stop(self) -> None:
        self.watcher.stop()

    # --- reading ---------------------------------------------------------------------------------------

    def _pids(self, path: str) -> tuple[int, ...]:
        pids = self.fs.read_pids(path)
        if self.own_cgroup is None and os.getpid() in pids:
            self.own_cgroup = path
        return pids

    def _limits_of(self, path: str) -> tuple[Optional[int], bool]:
        """memory.oom.group, and whether memory.max is a limit."""
        file = f"{self.fs.abspath(path)}/memory.max"
        limit = self.fs.parsed(file, cat(file), parse_limit)
        return self.fs.read_oom_group(path), limit is not None and not math.isinf(limit)

    def _subtree_pids(self, root: str) -> dict[str, tuple[int, ...]]:
        return {p: self._pids(p) for p in self.watcher.subtree(root)}  # (the watcher's index: the subtree's size)

    def _names(self, path: str):
        names = self.resolver.container_appeared(path)
        if names is None and self.resolver.runtime_names is not None:
            workload = self.resolver.identify(path)
            if workload.type == "k8s-pod" and workload.pod_uid and workload.cgroup == path:
                names = self.resolver.runtime_names.lookup(None, workload.pod_uid)  # the pod's log directory
            elif workload.type == "k8s-container" and workload.container_id and workload.cgroup == path:
                self._unnamed.add(path)  # (read again at its first process, or when a kill needs it)
        elif names is not None and names.pod is None and not names.is_sandbox:
            self._unnamed.add(path)
        return names

    def _names_again(self, path: str):
        """A container's names read again, when the read at its appearance named no pod; None: still nothing."""
        if path not in self._unnamed:
            return None
        self._unnamed.discard(path)
        names = self._names(path)
        return names if names is not None and names.pod is not None else None

    def read_names(self, path: str) -> NamesRead:
        """A kill in the container cgroup `path` needs its names (the pipeline asked): read its bundle now, while
        it still exists; what it said (None: nothing), for the agent to step at once."""
        self._unnamed.add(path)
        return NamesRead(path, self._names_again(path))

    def read_oomd_marks(self, path: str) -> OomdMarksRead:
        """systemd-oomd's marks on the unit cgroup `path` (the pipeline asked: Effects.read_marks), read now: the
        unit's cgroup goes soon after its processes."""
        return OomdMarksRead(path, *oomd_marks(self.fs.abspath(path)))

    def health(self) -> WatchHealth:
        """What the watcher last said of itself (replaced whole by its thread: safe to read from any other)."""
        return self.watcher.health

    def unwatched_limits(self) -> set[str]:
        """Cgroups whose limits are not watched (a scrape reads them every time): membership tests only, from
        other threads (the watcher changes the set)."""
        return self.watcher.unwatched_limits

    # --- watcher callbacks (the watcher's thread) -----------------------------------------------------------

    def _added(self, path: str) -> None:
        st, local = self.fs.read_dir_and_local_events(path)
        self._counters.first(path, local)
        oom_group, limited = self._limits_of(path)
        self._emit(CgroupAdded(path, st.st_ino if st is not None else None, local, oom_group, limited,
                               self._pids(path), self._names(path), oomd_marks(self.fs.abspath(path))[0],
                               st.st_uid if st is not None else None))

    def _removed(self, path: str) -> None:
        if self.stat_cache is not None:
            self.stat_cache.forget(path)
        self._counters.forget(path)
        self._snapshot_at.pop(path, None)
        self._stat_at.pop(path, None)
        self._unnamed.discard(path)
        self._emit(CgroupRemoved(path))

    def _events(self, path: str) -> None:
        ino, local = self.fs.read_local_events(path)
        if local is None or ino is None:
            return
        if self.stat_cache is not None:
            self.stat_cache.invalidate(path)
        moved = self._counters.read(path, local)
        oom_near = moved["max"] or moved["oom"] or moved["oom_kill"]
        now = self._clock()
        pids = pids_read_at = None
        if moved["oom_group_kill"] or (
                oom_near and now - self._snapshot_at.get(path, -PID_SNAPSHOT_INTERVAL) >= PID_SNAPSHOT_INTERVAL):
            # At its limit: who is in it now is who a kill will take (the victim may be gone a moment later). After
            # a group kill was counted (before the kernel lists it), who is in it is who its listing will name.
            self._snapshot_at[path] = now
            pids = self._subtree_pids(path)
            pids_read_at = self._wall_clock()
        if (moved["max"] and not (moved["oom"] or moved["oom_kill"])
                and now - self._stat_at.get(path, -STAT_READ_INTERVAL) >= STAT_READ_INTERVAL and self._stat_budget(now)):
            self._stat_at[path] = now
            self._memory_stat(path)
        if pids is None and not (moved["oom"] or moved["oom_kill"] or moved["oom_group_kill"]):
            return  # only OOM moves matter to the pipeline
        oom_group, limited = self._limits_of(path)
        # A kill in a container no bundle has named yet: read it now, before the kill's lines are read, so that
        # its incident need not wait for the names; once only (a container killed without a bundle has none).
        reread = moved["oom_kill"] and path in self._unnamed
        names = self._names_again(path) if reread else None
        if reread:
            self._unnamed.discard(path)
        self._emit(CgroupChanged(path, ino, local, oom_group, limited, pids, names,
                                 nameless=reread and names is None, pids_read_at=pids_read_at))
        if moved["oom_kill"]:
            self.on_kill()

    def _stat_budget(self, now: float) -> bool:
        """One more memory.stat read within the node's STAT_READS_PER_SECOND (a window of one second)."""
        if now - self._stat_window[0] >= 1.0:
            self._stat_window = [now, 0]
        if self._stat_window[1] >= STAT_READS_PER_SECOND:
            return False
        self._stat_window[1] += 1
        return True

    def _memory_stat(self, path: str) -> None:
        """At its limit: what memory.stat says now, for a kill whose report loses its stats block (docs/loop.md).
        Stamped when the read has ENDED: the file was read no later than its stamp, which is what the pipeline
        needs to prove a reading came before a kill (a stamp taken before the read would let a read that
        straddles the log's drain time pass as earlier than it was)."""
        text = cat(f"{self.fs.abspath(path)}/memory.stat")
        taken = self._wall_clock()
        # (gone: no reading); only the keys a breakdown reads are kept, as the live kernel-log reader keeps them
        stat = parse_memory_stat_block(text, STAT_KEYS_USED) if text else None
        if stat is not None:
            self._emit(MemoryStatRead(path, taken, stat))

    def _limits(self, path: str) -> None:
        if self.stat_cache is not None:
            self.stat_cache.invalidate(path)
        oom_group, limited = self._limits_of(path)
        self._emit(CgroupChanged(path, None, None, oom_group, limited, None))

    def _populated(self, path: str) -> None:
        """A cgroup got its first process (a container's init, its resources now set), or lost its last: pids and
        oom.group, memory.events.local read before the pids (its counters date the pids: a group kill the reading
        counted was done before they were read, oomwatch/stages/kernellog.py), and a container's names if its
        bundle named no pod when its cgroup appeared."""
        ino, local = self.fs.read_local_events(path)
        oom_group, limited = self._limits_of(path)
        pids = self._subtree_pids(path)
        read_at = self._wall_clock()
        self._emit(CgroupChanged(path, ino if local is not None else None, local, oom_group, limited, pids,
                                 self._names_again(path), pids_read_at=read_at))


def oomd_marks(directory: str) -> tuple[Optional[int], Optional[int]]:
    """systemd-oomd's marks on a cgroup directory: `user.oomd_ooms` and `user.oomd_kill` (None where unset, or
    where the cgroup is gone or the filesystem has no user xattrs)."""
    out = []
    for name in ("user.oomd_ooms", "user.oomd_kill"):
        try:
            out.append(parse_oomd_xattr(os.getxattr(directory, name)))
        except OSError:  # ENODATA: never marked; ENOENT: gone; EOPNOTSUPP: a kernel before 5.7's cgroupfs
            out.append(None)
    return out[0], out[1]


def cgroup_namespace_prefix(proc: Proc, own_cgroup: Optional[str]) -> Optional[str]:
    """In a container with its own cgroup namespace, /proc/<pid>/cgroup is relative to the agent's own cgroup
    (`/../../kubepods/…`); where our pid sits in the host tree (`own_cgroup`) gives the prefix."""
    seen_as = proc.own_cgroup()
    if seen_as is None or own_cgroup is None or seen_as == own_cgroup:
        return None
    if seen_as == "/":
        return own_cgroup
    if own_cgroup.endswith(seen_as):
        return own_cgroup[: -len(seen_as)] or None
    return None


class ProcessSource:
    """The proc connector's callbacks as events: forks, execs (with the cgroup /proc gives, in the host's tree)
    and exits by a signal."""

    def __init__(self, proc: Proc, emit: Emit, cgns_prefix: Optional[str] = None) -> None:
        self.proc, self._emit, self.cgns_prefix = proc, emit, cgns_prefix

    def forked(self, fork) -> None:
        self._emit(ProcessForked(fork.parent, fork.parent_task, fork.child))

    def execd(self, pid: int) -> None:
        path = self.proc.cgroup_of(pid)
        if path is not None and self.cgns_prefix is not None:
            path = posixpath.normpath(self.cgns_prefix + "/" + path.lstrip("/"))
        comm, ns_pid = name_and_ns_pid(cat(f"{self.proc.root}/{pid}/status")) if path is not None else (None, None)
        # A runtime's `kill` (the stop of a container): what it kills is a death's sender (oomwatch.deaths).
        argv = command_line(f"{self.proc.root}/{pid}/cmdline") if comm in RUNTIME_COMMS else None
        self._emit(ProcessExeced(pid, path, ns_pid, comm, argv))

    def exited(self, process_exit) -> None:
        self._emit(ProcessExited(process_exit.pid, process_exit.signal, process_exit.time,
                                 getattr(process_exit, "code", None)))


RUNTIME_COMMS = frozenset({"runc", "crun", "runsc", "youki"})


def command_line(path: str) -> Optional[tuple[str, ...]]:
    """/proc/PID/cmdline split at its NULs (at most 64 arguments, 4 KiB); None when it is gone."""
    try:
        with open(path, "rb") as f:
            data = f.read(4096)
    except OSError:
        return None
    return tuple(arg.decode("utf-8", "replace") for arg in data.rstrip(b"\0").split(b"\0")[:64]) if data else None


def name_and_ns_pid(status: Optional[str]) -> tuple[Optional[str], Optional[int]]:
    """`Name:` (comm) and the last `NSpid:` (its pid in its own pid namespace: 1 for a container's init) of
    /proc/PID/status; None for what is absent (a process gone, a kernel before 4.1 without NSpid)."""
    if not status:
        return None, None
    comm: Optional[str] = None
    ns_pid: Optional[int] = None
    for line in status.split("\n", 40):
        if line.startswith("Name:\t"):
            comm = line[6:22]
        elif line.startswith("NSpid:"):
            last = line.rsplit(None, 1)[-1]
            ns_pid = int(last) if last.isdigit() else None
            break
    return comm, ns_pid
