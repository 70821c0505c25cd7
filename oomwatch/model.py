"""The typed values that flow through oomwatch: kernel records in, incidents out.

Everything here is immutable so sources, the correlator and sinks can share values across threads without
copying: kernel records and OOM lines are named tuples (made by the hundred thousand in a storm and sent
pickled from the reader process: a named tuple is made twice as fast as a frozen dataclass, pickled at half
the size and unpickled twice as fast), the rest frozen dataclasses. Field names follow the incident JSON of
docs/contract.md where they surface.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple, Optional, Union

from oomwatch.names import as_logged

KIB = 1024


# --- kernel log -------------------------------------------------------------------------------------


class KmsgRecord(NamedTuple):
    """One kernel log record, from /dev/kmsg or from saved text.

    `seq` and `usec` are None when the source does not carry them (plain `dmesg` text has a timestamp but
    no sequence number; `journalctl -k` may have neither). `fields` holds /dev/kmsg dictionary
    continuation lines (`SUBSYSTEM=…`)."""

    priority: int
    seq: Optional[int]
    usec: Optional[int]
    text: str
    fields: tuple[tuple[str, str], ...] = ()
    wall_time: Optional[float] = None  # absolute epoch seconds when the source gives them (journalctl)

    @property
    def level(self) -> int:
        return self.priority & 7


# Kernel OOM log lines, one class per kind of line (parse/oom.py turns a KmsgRecord into one of these).


class OomInvoked(NamedTuple):
    """`<comm> invoked oom-killer: gfp_mask=…, order=N, oom_score_adj=N`: start of a (non-ratelimited) OOM."""

    comm: str
    gfp_mask: str
    order: int
    oom_score_adj: int


class OomStackTask(NamedTuple):
    """`CPU: N PID: P Comm: comm …` from the stack dump that follows `invoked oom-killer`: the trigger's pid
    (the `oom-kill:` summary names the victim, not the task that ran out)."""

    pid: int
    comm: str


class OomMemcgUsage(NamedTuple):
    """`memory: usage NkB, limit NkB, failcnt N` (cgroup v2 memcg OOM, 5.3+)."""

    usage_bytes: int
    limit_bytes: Optional[int]  # None when the kernel printed the "unlimited" sentinel


class OomSummary(NamedTuple):
    """`oom-kill:constraint=…,oom_memcg=…|global_oom,task_memcg=…,task=…,pid=…,uid=…` (5.0+), or the 4.14
    `Task in <task_memcg> killed as a result of limit of <oom_memcg>` line (pid/comm unknown there)."""

    constraint: str  # memcg | global | cpuset | mempolicy
    oom_cgroup: str  # "/" for a global OOM
    task_cgroup: Optional[str]
    comm: Optional[str]
    pid: Optional[int]
    uid: Optional[int]
    cut: bool = False  # the line was cut short (a paste): the fields after the last whole one are None


class OomKilled(NamedTuple):
    """`<prefix>: Killed process P (comm) total-vm:…` (and the 4.14 form without prefix)."""

    pid: int
    comm: str
    oom_kind: str  # "memcg" | "global" | "unknown"
    total_vm_bytes: Optional[int] = None
    anon_rss_bytes: Optional[int] = None
    file_rss_bytes: Optional[int] = None
    shmem_rss_bytes: Optional[int] = None
    uid: Optional[int] = None
    pgtables_bytes: Optional[int] = None
    oom_score_adj: Optional[int] = None


class OomSelected(NamedTuple):
    """4.14–5.0: `<prefix>: Kill process P (comm) score N or sacrifice child` (the choice, before the kill)."""

    pid: int
    comm: str
    score: int
    oom_kind: str


class OomGroup(NamedTuple):
    """`Tasks in <cgroup> are going to be killed due to memory.oom.group set` (4.19+)."""

    cgroup: str


class OomAlreadyExiting(NamedTuple):
    """`<prefix>: OOM victim P (comm) is already exiting. Skip killing the task` (5.10+)."""

    pid: int
    comm: str
    oom_kind: str


class OomSuppressed(NamedTuple):
    """`oom_kill_process: N callbacks suppressed`: the ratelimit hid N headers/summaries."""

    function: str
    count: int


OomLine = Union[OomInvoked, OomStackTask, OomMemcgUsage, OomSummary, OomKilled, OomSelected, OomGroup, OomAlreadyExiting,
                OomSuppressed]


# --- cgroups ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PressureLine:
    """One line of a PSI file. Averages are percentages (0-100), total is microseconds; None = unknown."""

    avg10: Optional[float] = None
    avg60: Optional[float] = None
    avg300: Optional[float] = None
    total_usec: Optional[int] = None


@dataclass(frozen=True)
class Pressure:
    """memory.pressure: `some` (at least one task stalled) and `full` (all non-idle tasks stalled at once).
    A line that is missing or unreadable is None."""

    some: Optional[PressureLine] = None
    full: Optional[PressureLine] = None

    def total_seconds(self, kind: str) -> Optional[float]:
        line = self.some if kind == "some" else self.full
        return line.total_usec / 1e6 if line is not None and line.total_usec is not None else None


# cgroup v2 memory.stat keys the kernel sums into its own `kernel` key (5.18+); older kernels print only the
# parts (oomwatch.holders sums whichever of them is printed).
V2_KERNEL_PARTS = ("kernel_stack", "pagetables", "sec_pagetables", "percpu", "slab", "vmalloc")
# The memory.stat keys oomwatch.holders.breakdown reads (v2 and v1): what a kept reading needs of the file's
# ~76 keys (a source keeps only these).
STAT_KEYS_USED = frozenset(
    ("anon", "file", "shmem", "kernel", "file_dirty", "file_writeback", "sock", "unevictable", "slab_reclaimable",
     "slab_unreclaimable", *V2_KERNEL_PARTS, "rss", "cache", "dirty", "writeback"))


@dataclass(frozen=True)
class CgroupStats:
    """What one cgroup v2 directory says about memory, read at one moment. Paths are relative to the cgroup
    root and start with "/" (as the kernel prints them). Missing files are None (older kernels, or the
    memory controller not enabled there)."""

    path: str
    oom_group: Optional[int] = None
    events: Optional[dict[str, int]] = None
    events_local: Optional[dict[str, int]] = None
    limit_bytes: Optional[float] = None  # float("inf") for "max"
    usage_bytes: Optional[int] = None
    peak_bytes: Optional[int] = None
    pids: tuple[int, ...] = ()
    # memory.current less memory.stat inactive_file, floored at 0: the kubelet's working set.
    working_set_bytes: Optional[int] = None
    # memory.pressure (PSI); None where the kernel has none (psi=0, CONFIG_PSI off) or the cgroup went.
    pressure: Optional[Pressure] = None


class OomCounters:
    """memory.events.local's OOM counters of each cgroup as last read, and which moved at each new reading: the one
    delta of memory.events, kept by whoever reads the counters over time (the cgroup source, to decide what to read
    next; the pipeline's node state, to know when they moved), each its own instance on its own thread."""

    NAMES = ("max", "oom", "oom_kill", "oom_group_kill")
    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, int, int, int]] = {}

    def first(self, path: str, local: Optional[dict[str, int]]) -> None:
        """The reading when the cgroup was found: what later readings are compared with."""
        if local is not None:
            self._last[path] = self._of(local)

    def read(self, path: str, local: dict[str, int]) -> dict[str, bool]:
        """A new reading of `path`: each counter → whether it moved since the one before (a cgroup never read
        before counts from 0)."""
        before = self._last.get(path, (0, 0, 0, 0))
        now = self._last[path] = self._of(local)
        return {name: a > b for name, a, b in zip(self.NAMES, now, before)}

    def last(self, path: str, name: str) -> Optional[int]:
        counts = self._last.get(path)
        return counts[self.NAMES.index(name)] if counts is not None else None

    def forget(self, path: str) -> None:
        self._last.pop(path, None)

    @classmethod
    def _of(cls, local: dict[str, int]) -> tuple[int, int, int, int]:
        return tuple(local.get(name, 0) for name in cls.NAMES)  # type: ignore[return-value]


# --- the node ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeInfo:
    """The node as oomwatch_node_info labels it (oomwatch.node reads it, the collector exports it)."""

    kernel: str
    cgroup_version: str
    single_process_oom_kill: str  # true | false | unknown


# --- workloads --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerNames:
    """What the runtime knows about one container (or pod sandbox). None = not known."""

    container_id: Optional[str]
    container_type: Optional[str] = None  # "sandbox" | "container"
    container: Optional[str] = None
    pod: Optional[str] = None
    namespace: Optional[str] = None
    pod_uid: Optional[str] = None
    image: Optional[str] = None
    sandbox_id: Optional[str] = None
    runtime: Optional[str] = None  # containerd | cri-o
    # The container's mounts whose pages are tmpfs, charged to the cgroup that writes them and kept after a
    # restart: memory-medium emptyDirs and the pod's /dev/shm, as "emptyDir \"NAME\" at /PATH" (see
    # tmpfs_mounts); what an incident whose shmem filled the limit names
    tmpfs_mounts: tuple[str, ...] = ()

    @property
    def is_sandbox(self) -> bool:
        return self.container_type == "sandbox"


@dataclass(frozen=True)
class PodInfo:
    """What the API server says about one pod of this node (docs/contract.md `owner`: {"kind", "name",
    "apiVersion", "uid"}; `job`: {"kind", "name"}), as its watch last delivered it (oomwatch.sources.pods)."""

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


@dataclass(frozen=True)
class Workload:
    """What a cgroup belongs to (docs/contract.md `workload`). `cgroup` is the workload cgroup: the
    container's cgroup, the Slurm step's, the systemd unit's, else the process's own. None = unknown."""

    type: str  # k8s-container | k8s-pod | slurm | systemd | other
    cgroup: str
    namespace: Optional[str] = None
    pod: Optional[str] = None
    container: Optional[str] = None
    pod_uid: Optional[str] = None
    container_id: Optional[str] = None
    runtime: Optional[str] = None  # containerd | cri-o | docker
    sandbox: bool = False  # the pod's pause container
    slurm_job: Optional[str] = None
    slurm_step: Optional[str] = None
    slurm_task: Optional[str] = None
    unit: Optional[str] = None
    pod_cgroup: Optional[str] = None  # for Kubernetes containers: the pod's cgroup
    owner: Optional[dict[str, str]] = None
    job: Optional[dict[str, str]] = None

    def to_json(self) -> dict[str, Any]:
        """docs/contract.md `workload`: absent keys mean unknown."""
        out: dict[str, Any] = {"type": self.type}
        for key in ("namespace", "pod", "container", "pod_uid", "container_id", "slurm_job", "slurm_step",
                    "unit", "owner", "job"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out

    @property
    def is_kubernetes(self) -> bool:
        return self.type in ("k8s-container", "k8s-pod")

    def metric_labels(self) -> tuple[str, str, str, str]:
        """(namespace, pod, container, cgroup) identity labels per docs/contract.md: Kubernetes series carry
        names, not cgroups, so a restarted container continues the same series. The cgroup is spelt as the
        kernel log spells it (a byte that is not UTF-8 as the text `\\xNN`), so that a cgroup read from the
        tree and named by the log has one series."""
        if self.is_kubernetes and self.pod:
            return (self.namespace or "", self.pod, self.container or "", "")
        if self.cgroup.isascii() and "\\" not in self.cgroup:
            return ("", "", "", self.cgroup)
        return ("", "", "", as_logged(self.cgroup))

    def display_name(self) -> str:
        if self.is_kubernetes and self.pod:
            base = f"{self.namespace}/{self.pod}" if self.namespace else self.pod
            return f"{base} {self.container}" if self.container else base
        if self.is_kubernetes and self.pod_uid:
            # Names unknown (no runtime bundle, no API): short ids still tell pods and containers apart.
            base = f"pod {self.pod_uid[:8]}"
            return f"{base} container {self.container_id[:12]}" if self.container_id else base
        if self.type == "slurm" and self.slurm_job:
            step = f" step {self.slurm_step}" if self.slurm_step else ""
            return f"Slurm job {self.slurm_job}{step}"
        if self.type == "systemd" and self.unit:
            return self.unit
        return self.cgroup


# --- incidents --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KilledProcess:
    """A process the kernel killed, as its `Killed process` line describes it, plus the cgroup it was in."""

    pid: int
    comm: str
    cgroup: Optional[str]
    uid: Optional[int] = None
    total_vm_bytes: Optional[int] = None
    anon_rss_bytes: Optional[int] = None
    file_rss_bytes: Optional[int] = None
    shmem_rss_bytes: Optional[int] = None
    oom_score_adj: Optional[int] = None

    def to_json(self) -> dict[str, Any]:
        # By hand: dataclasses.asdict deep-copies each field, and was a third of a storm's processing.
        return {"pid": self.pid, "comm": self.comm, "cgroup": self.cgroup, "uid": self.uid,
                "total_vm_bytes": self.total_vm_bytes, "anon_rss_bytes": self.anon_rss_bytes,
                "file_rss_bytes": self.file_rss_bytes, "shmem_rss_bytes": self.shmem_rss_bytes,
                "oom_score_adj": self.oom_score_adj}


@dataclass(frozen=True)
class Incident:
    """One invocation of the OOM killer that killed at least one process (docs/contract.md, "Incident
    JSON")."""

    time: float  # epoch seconds of the kill
    boot_id: str
    kernel_seq: Optional[int]
    kind: str  # single | group
    constraint: str
    scope: str  # container | pod | node | cgroup
    oom_cgroup: Optional[str]
    group_cgroup: Optional[str]
    trigger: Optional[dict[str, Any]]
    memory: Optional[dict[str, int]]
    victim: Optional[KilledProcess]  # None only for kills counted from memory.events
    killed: tuple[KilledProcess, ...]
    workload: Workload
    explanation: str
    detected_at: float
    exiting: tuple[dict[str, Any], ...] = ()  # `OOM victim … already exiting`: died with it, not killed by it
    died_with: tuple[dict[str, Any], ...] = ()  # SIGKILLed in the group cgroup, no kernel line (proc connector)
    workloads: tuple[Workload, ...] = field(default=())  # every workload that lost a process, victim's first
    # "kmsg": described by the kernel log; "memory.events": counted by the kernel's memory.events while no log
    # record still describes it (ring wrapped, agent down): no pids, `time` is the end of the window in which
    # the counter moved and `window_start` its start.
    evidence: str = "kmsg"  # also "oom_reaper": known only from the reaper's line (its kill line is missing)
    window_start: Optional[float] = None
    time_known: bool = True  # False: the log's line carried no time (`time` is then its boot's start)
    live: bool = True  # read from the live kernel log: latency means something (not for saved logs)
    kill_lines: tuple[tuple[str, int], ...] = ()  # `Killed process` lines per cgroup (memory.events oom_kill)
    group_inferred: bool = False  # group kill told from memory.oom.group: its `Tasks in` line was lost
    partial: bool = False  # the log lost this report's first lines: the first process listed may not be the victim
    # evidence "memory.events": (cgroup, inode, counter name, counter value reached): its identity
    counted_in: Optional[tuple[str, int, str, int]] = None
    # A group kill of thousands of processes keeps the first MAX_KILLED_LISTED of `killed`; these stay exact:
    killed_count: Optional[int] = None  # processes killed (None: len(killed), the list is whole)
    killed_cgroups: tuple[tuple[str, int], ...] = ()  # processes killed per cgroup, when the list is cut
    # What held the memory (oomwatch.holders, from the report's stats block and task table; docs/contract.md):
    memory_breakdown: Optional[dict[str, Any]] = None  # None: not in the log, and no reading from before the kill
    top_holders: tuple[dict[str, Any], ...] = ()  # the largest tasks, largest first (at most 5)
    pools: tuple[dict[str, Any], ...] = ()  # same-named tasks summed, largest first (at most 3)
    verdict: str = "unknown"
    verdict_sentence: Optional[str] = None  # what held it and what to change (part of the explanation)

    @property
    def killed_truncated(self) -> bool:
        return self.killed_count is not None and self.killed_count > len(self.killed)

    def killed_per_cgroup(self) -> tuple[tuple[str, int], ...]:
        """How many processes died in each cgroup (exact, also when `killed` was cut)."""
        if self.killed_cgroups:
            return self.killed_cgroups
        counts: dict[str, int] = {}
        for p in self.killed:
            counts[p.cgroup or ""] = counts.get(p.cgroup or "", 0) + 1
        return tuple(counts.items())

    @property
    def collateral(self) -> tuple[KilledProcess, ...]:
        return self.killed[1:]

    @property
    def latency_seconds(self) -> Optional[float]:
        if not self.live:
            return None
        return max(0.0, self.detected_at - self.time)

    @property
    def key(self) -> tuple:
        """Identity across restarts: the boot, the record's sequence number (its time in a saved log without
        sequence numbers, where a pid may come back) and the victim; for a kill counted from memory.events,
        the cgroup, its inode and the counter value that counted it."""
        if self.counted_in is not None:
            cgroup, ino, counter, value = self.counted_in
            return (self.boot_id, f"{counter}@{cgroup}#{ino}", value)
        return (self.boot_id, self.kernel_seq if self.kernel_seq is not None else round(self.time, 6),
                self.victim.pid if self.victim is not None else 0)

    def to_json(self) -> dict[str, Any]:
        from oomwatch.timefmt import iso8601

        out: dict[str, Any] = {
            "time": iso8601(self.time) if self.time_known else None,
            "boot_id": self.boot_id,
            "kernel_seq": self.kernel_seq,
            "kind": self.kind,
            "constraint": self.constraint,
            "scope": self.scope,
            "oom_cgroup": self.oom_cgroup,
            "group_cgroup": self.group_cgroup,
            "trigger": self.trigger,
            "memory": self.memory,
            "victim": self.victim.to_json() if self.victim is not None else None,
            "killed": [p.to_json() for p in self.killed],
            "killed_count": len(self.killed) if self.killed_count is None else self.killed_count,
            "workload": self.workload.to_json(),
            "explanation": self.explanation,
            "detected_at": iso8601(self.detected_at),
            "latency_seconds": None if self.latency_seconds is None else round(self.latency_seconds, 6),
            "evidence": self.evidence,
            "memory_breakdown": self.memory_breakdown,
            "top_holders": list(self.top_holders),
            "pools": list(self.pools),
            "verdict": self.verdict,
        }
        if self.window_start is not None:
            out["window_start"] = iso8601(self.window_start)
        if self.partial:
            out["partial"] = True
        if self.killed_truncated:
            out["killed_truncated"] = True
        if self.counted_in is not None:
            cgroup, ino, counter, value = self.counted_in
            out["counted_in"] = {"cgroup": cgroup, "inode": ino, "counter": counter, "value": value}
        if self.exiting:
            out["exiting"] = list(self.exiting)
        if self.died_with:
            out["died_with"] = list(self.died_with)
        return out


def incident_key_of_json(data: dict[str, Any]) -> Optional[tuple]:
    """`Incident.key` of an incident as written in JSON (the events file), or None if it is not one (a death's
    line, `"record": "death"`, is not)."""
    if data.get("record") == "death":
        return None
    try:
        counted = data.get("counted_in")
        if counted is not None:
            return (data["boot_id"], f"{counted['counter']}@{counted['cgroup']}#{counted['inode']}", counted["value"])
        seq = data.get("kernel_seq")
        if seq is None:
            from oomwatch.timefmt import parse_iso8601

            seq = round(parse_iso8601(data["time"]), 6)
        victim = data.get("victim") or {}
        return (data["boot_id"], seq, victim.get("pid", 0))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def death_key_of_json(data: dict[str, Any]) -> Optional[tuple]:
    """The identity of a death as written in JSON (oomwatch.deaths.Death.to_json: `"record": "death"`), as the
    events file remembers it: ("death", boot id, workload cgroup, time, pid); None for any other line."""
    if not isinstance(data, dict) or data.get("record") != "death":
        return None
    try:
        return ("death", str(data["boot_id"]), str(data["cgroup"]), str(data["time"]), int(data["pid"]))
    except (KeyError, TypeError, ValueError):
        return None


# What a kernel-log reader yields besides records (oomwatch.sources.logitems.KmsgItem).


@dataclass(frozen=True)
class Lost:
    """Records the reader could not get. `count` is None when the size of the gap is unknown."""

    count: Optional[int]


@dataclass(frozen=True)
class Skipped:
    """`count` records that cannot be part of an OOM report were read and not parsed; `last_seq` is the
    sequence number of the last (the cursor may move past them).

    `part`, when set, says these records were the memory part of a full OOM report (its stats block or node
    counters and its task table), kept together by the live reader: the kernel's records' texts as /dev/kmsg
    escapes them, one a line (oomwatch.parse.memstat.part_report reads it). Handed on unparsed: the reader's loop
    pays a join, and only a report that becomes an incident is read, once."""

    count: int
    last_seq: Optional[int]
    part: Optional[bytes] = None


@dataclass(frozen=True)
class Garbled:
    """A record that did not parse (counted, never fatal)."""

    raw: bytes
