"""What the sources tell the pipeline: typed events, one queue, in the order they were read.

Sources read (the kernel log, the cgroup tree, the proc connector, the kubelet's config) and emit these; the
pipeline (oomwatch.pipeline) takes them one at a time in `step(event, now)` and never reads anything itself.
The requests here go the other way: what a stage asks a source to read (in Effects), answered by an event. Each
event carries everything the pipeline will need of what was read, so that a recorded sequence of events replays
to the same incidents, counts and state (tests/test_pipeline_replay.py). docs/loop.md has the picture.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from oomwatch.model import ContainerNames, PodInfo


class KernelLog(NamedTuple):
    """Kernel-log items in kernel order (KmsgRecord, Skipped, Lost, Garbled from oomwatch.sources.kmsg), as one
    read returned them. `drained_at`: epoch seconds up to which the log has now been read (the read found nothing
    more): /dev/kmsg, the time the read ended; syslog(2), when the read began. None: more is coming at once."""

    items: list
    drained_at: Optional[float] = None


class KernelLogEnded(NamedTuple):
    """The kernel-log source stopped: a saved log read to its end (`saved`), or a live reader that failed for
    good (`error`)."""

    saved: bool
    error: Optional[str] = None


class CgroupAdded(NamedTuple):
    """A cgroup appeared (or was found at start). Read when it was seen: its directory's inode,
    memory.events.local, memory.oom.group, whether memory.max is a limit, the pids of cgroup.procs, and, for a
    container cgroup, the names its runtime bundle gave (the bundle is gone soon after the container dies), and
    systemd-oomd's mark on it (`user.oomd_ooms`, None where unset)."""

    path: str
    ino: Optional[int]
    local: Optional[dict]
    oom_group: Optional[int]
    limited: bool
    pids: tuple
    names: Optional[ContainerNames] = None
    oomd_ooms: Optional[int] = None
    owner: Optional[int] = None  # the directory's owner (uid): who may create cgroups below it (None: unknown)


class CgroupChanged(NamedTuple):
    """A cgroup's files changed: memory.events.local moved (`local`, with the inode), or its limits were written,
    or it got its first process or lost its last (cgroup.events: `local` then read before the pids). `pids`:
    cgroup.procs of it and its descendants, read when an OOM was near or cgroup.events moved (path → pids), else
    None; `pids_read_at`: the wall clock once they were read (KernelLog.drained_at's clock). `oom_group`/`limited`
    as read now (None/False when not read)."""

    path: str
    ino: Optional[int]
    local: Optional[dict]
    oom_group: Optional[int]
    limited: bool
    pids: Optional[dict] = None
    # a container cgroup's names, read again when it got its first process or counted a kill because no read
    # before found its bundle (the runtime may write it after the cgroup); None: not read, or still nothing
    names: Optional[ContainerNames] = None
    nameless: bool = False  # read again at a kill, and still nothing names it (no bundle: do not wait for one)
    pids_read_at: Optional[float] = None


class CgroupRemoved(NamedTuple):
    path: str


class PodsListed(NamedTuple):
    """A fresh list of this node's pods from the API server (the first, or a relist after the watch broke): pods
    it does not hold are deleted now."""

    pods: tuple  # PodInfo, each


class PodUpdated(NamedTuple):
    """A pod of this node as the API server's watch says it now (added or modified)."""

    info: PodInfo


class PodDeleted(NamedTuple):
    """A pod of this node deleted, as last seen (kept a while: an OOM is often explained after its pod is gone)."""

    info: PodInfo


class NamesRead(NamedTuple):
    """A container's names read again from its runtime's bundle, for a kill that needed them
    (Effects.read_names); None when nothing names it (the bundle gone, or never written)."""

    path: str
    names: Optional[ContainerNames]


class MemoryStatRead(NamedTuple):
    """A cgroup's memory.stat, read when its memory.events.local said it was at its limit (`max` moved, and not
    `oom` or `oom_kill` with it: then the kill is as good as done):
    what the kernel's report would print in its stats block, for the kills whose block the ratelimit hid.
    `taken`: epoch seconds (time.time(), KernelLog.drained_at's clock) taken just AFTER the read ended (the file
    was read no later than that); the pipeline orders it against kills only through the kernel log's reads
    (docs/loop.md), never by kernel timestamps."""

    path: str
    taken: float
    stat: Any  # oomwatch.parse.memstat.MemoryStat


class ProcessForked(NamedTuple):
    parent: int
    parent_task: int
    child: int


class ProcessExeced(NamedTuple):
    """A process exec'd; `cgroup` is its cgroup as /proc said then (in the host's cgroup tree); `ns_pid` its pid
    in its own pid namespace (the last of /proc/PID/status NSpid: 1 for a container's init) and `comm` its name,
    when they could be read; `argv`, for a container runtime's own command (runc, crun, runsc, youki: short-lived,
    read at once), its command line."""

    pid: int
    cgroup: Optional[str]
    ns_pid: Optional[int] = None
    comm: Optional[str] = None
    argv: Optional[tuple] = None


class ProcessExited(NamedTuple):
    """A process ended: by `signal` (its wait status's WTERMSIG), else with exit status `code`."""

    pid: int
    signal: Optional[int]
    time: float
    code: Optional[int] = None


class LogRequest(NamedTuple):
    """A container log the pipeline wants the last lines of (Effects.read_logs): the container-log source reads it
    (sources.containerlog.ContainerLogs) and answers with a LogTailRead."""

    key: str  # the death's (its workload cgroup)
    namespace: str
    pod: str
    pod_uid: str
    container: str


class RayLogRequest(NamedTuple):
    """A Ray pod's raylet.out the pipeline wants the tail of, for a SIGKILL death in `cgroup` (its workload
    cgroup: the container's), in Effects.read_ray_logs: the raylet source (sources.raylet.RayletLogs) reads it through a
    process still alive in that cgroup (the raylet runs in the Ray container) and answers with a RayLogRead."""

    key: str  # the death's (its workload cgroup)
    cgroup: str


class OomdMarksRead(NamedTuple):
    """systemd-oomd's marks on a workload cgroup, read when the pipeline asked (Effects.read_marks: a SIGKILL in a
    systemd unit): `user.oomd_ooms` (incremented before its kills) and `user.oomd_kill`; None where unset or
    the cgroup is gone."""

    path: str
    ooms: Optional[int]
    kills: Optional[int]


class LogTailRead(NamedTuple):
    """What the agent read of a container's log for a death the pipeline asked about (Effects.read_logs):
    `finding` is oomwatch.parse.gpulog.parse_log_tail of its last lines (None: nothing about memory, or no
    log to read)."""

    key: str
    finding: Optional[Any]


class RayLogRead(NamedTuple):
    """What the agent read of a Ray pod's raylet.out for a death the pipeline asked about (Effects.read_ray_logs):
    `killed_pids`, oomwatch.parse.raylet.ray_killed_pids of its last 64 KiB (pids of the Ray container's pid
    namespace); None when no raylet.out was read (no Ray in that container, the container gone, or the read refused:
    `error` says why when it was more than a missing file)."""

    key: str
    killed_pids: Optional[frozenset]
    error: Optional[str] = None


class PostureRead(NamedTuple):
    """The node's OOM policy as the kubelet's config says it now: singleProcessOOMKill "true"/"false"/"unknown"."""

    single_process_oom_kill: str


class StateSaved(NamedTuple):
    """The outcome of the save the pipeline asked for: None, or why the disk refused."""

    error: Optional[str]


class Tick(NamedTuple):
    """A deadline the pipeline asked for has come (quiet log, witness wait, settle, save, expiry)."""


class Stop(NamedTuple):
    """The agent is stopping: publish what is finished, save, and end the loop."""
