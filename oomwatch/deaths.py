"""A verdict for every workload death that looks like a memory death: who ended it.

A process that dies by SIGKILL reads the same whoever sent the signal, and a container whose GPU ran out of
memory exits 1 without anyone killing it. This module gives each such death one verdict, `cause`:

- `kernel-oom`: the kernel's OOM killer killed it (an incident names its pid, or memory.events counted a kill
  in its cgroup while it died);
- `userspace`: SIGKILL from a process, with the `sender` where the node can know it (`kubelet-eviction`,
  `systemd-oomd`, `ray-memory-monitor`, `runtime-stop`) or `unknown`;
- `gpu-oom`: the workload's main process exited after its GPU (or other accelerator) ran out of memory, as its
  last log lines say (oomwatch.parse.gpulog);
- `alloc-failure`: it exited after an allocation of host memory failed in the process itself (PyTorch's CPU
  allocator, Python's MemoryError, a runtime's heap limit): nothing was killed;
- `not-oom`: a Kubernetes container's main process ended otherwise (a SIGTERM, an exit code) while its run had
  an OOM kill before: its status will say OOMKilled, and that is stale.

What the node can know, and what it cannot:
- The proc connector reports each process's exit with its wait status (the signal that ended it, or its exit
  code), never who sent a signal, nor a signal that did not kill (a SIGTERM a process handled).
- The kernel log names the OOM killer's victims (`Killed process`); the others of a group kill die unlogged
  and are the witness queue's `died_with`; memory.events `oom_kill` counts the kills the log lost.
- systemd-oomd marks the cgroup it kills: the xattr `user.oomd_ooms` is incremented before its SIGKILLs and
  `user.oomd_kill` by the number of processes killed after them (systemd src/oom/oomd-util.c; `user.oomd_ooms`
  since systemd#22629, 2022, systemd 251; before it only `user.oomd_kill`, and since systemd#42373, 2026, a
  kill through `cgroup.kill` leaves `user.oomd_kill` alone: `user.oomd_ooms` is the mark). A write of an xattr
  raises IN_ATTRIB on the cgroup's directory for an inotify watch.
- The kubelet's eviction sets the pod's `status.reason: Evicted`, `status.message: The node was low on
  resource: memory. …` (kubernetes pkg/kubelet/eviction/helpers.go): the API says it, not the node.
- A runtime stops a container by running `runc [global options] kill [--all] <container id> <signal>` (go-runc
  `Runc.Kill`, used by containerd's shim; CRI-O's conmon the same): the stop signal, then SIGKILL after the
  grace period. The proc connector sees the exec; its command line can be read while runc runs (it is
  short-lived).
- Ray's memory monitor logs each kill in raylet.out (`… killed due to the node running low on memory`, with
  the killed worker's `pid=`, a pid of the Ray container's pid namespace): the agent reads its tail through a
  live process of the container (`/proc/<pid>/root/tmp/ray/session_latest/logs/raylet.out`,
  oomwatch.sources.raylet, oomwatch.parse.raylet) when a SIGKILL in a Ray pod has no other sender.
- A container's status says OOMKilled when its runtime saw an OOM kill in the container's cgroup at any time
  of the run (containerd's TaskOOM event, from memory.events `oom_kill`), however the container then ended.
  Its last exit was an OOM kill only if the kernel killed its main process.

`DeathTracker` groups exits into deaths (one per death of a workload's main process or per kill event, not one
per process): `add(exit, now)` takes each exit of a workload's process, `due(now)` returns the groups that
have been quiet `settle` seconds; `classify(group, evidence)` gives the verdict from what the node knew then
(an `Evidence`, plain data the pipeline fills from its state). Pure: no I/O, no clock; bounded.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, NamedTuple, Optional

from oomwatch.correlator import is_within
from oomwatch.explain import size
from oomwatch.model import Incident, Workload
from oomwatch.parse.gpulog import GPU, LogFinding
from oomwatch.parse.runtime import RuntimeKill

SIGABRT, SIGKILL, SIGBUS, SIGSEGV, SIGTERM = 6, 9, 7, 11, 15

CAUSES = ("kernel-oom", "userspace", "gpu-oom", "alloc-failure", "not-oom")  # the label values of `cause`
SENDERS = ("kubelet-eviction", "systemd-oomd", "ray-memory-monitor", "runtime-stop", "unknown")

# A death is complete once its workload has had no exit for this long (the SIGKILLs of a pid namespace's
# others follow its init's within milliseconds; the kernel log's lines of a kill are published within a
# second).
SETTLE_SECONDS = 2.0
MAX_WAIT_SECONDS = 15.0  # and never held longer than this from its first exit (a workload that keeps dying)
MAX_OPEN = 4096  # deaths being collected at once; beyond, the oldest is finished early
MAX_READY = 4096  # finished deaths waiting for due(); beyond, dropped (counted)
MAX_EXITS_KEPT = 64  # exits kept per death (the main process's always); `processes` stays exact
MAX_PIDS_LISTED = 20  # pids in the JSON
MAX_EVIDENCE = 8
MAX_EVIDENCE_CHARS = 400
# A kernel kill may be this long before the first exit it explains (reclaim stalls, a slow exit of a large
# process), and this long after the last (the kill's record and the exit event are timed by different clocks).
KILL_BEFORE_SECONDS = 30.0
KILL_AFTER_SECONDS = 5.0
# A runtime's `runc kill` may be this long before the exits it caused (SIGKILL: at once; SIGTERM: the grace
# period).
STOP_BEFORE_SECONDS = 5.0
# The exits of a pid namespace's others are heard after its init's (the proc connector reports init's exit
# before the kernel kills the rest); a little slack for events read out of order.
TEARDOWN_SLACK_SECONDS = 0.05


class Exit(NamedTuple):
    """One process's exit, as the proc connector told it, with what the node knew of the process."""

    pid: int
    time: float  # epoch seconds the exit was heard of
    workload: Optional[str]  # its workload cgroup (container, Slurm step, systemd unit); None: no workload's
    cgroup: Optional[str] = None  # its own cgroup, last seen alive
    signal: Optional[int] = None  # the signal that ended it (None: it exited)
    code: Optional[int] = None  # its exit status when it exited
    comm: Optional[str] = None
    main: bool = False  # the workload's main process (a container's init, a step's task, a unit's main PID)
    ns_pid: Optional[int] = None  # its pid in its own pid namespace (what a container's own logs name)

    @property
    def failed(self) -> bool:
        """Ended by a signal other than the stop signal's, or with a non-zero status."""
        if self.signal is not None:
            return self.signal != SIGTERM
        return self.code not in (None, 0)


def worth_tracking(exit: Exit) -> bool:
    """Exits that may be part of a memory death: a SIGKILL, or any end of a workload's main process."""
    return exit.signal == SIGKILL or exit.main


def needs_log(group: "ExitGroup") -> bool:
    """Whether the workload's last log lines can decide the verdict: its main process ended on its own, badly
    (an exit code, SIGABRT from an uncaught C++ exception, SIGSEGV), and nothing SIGKILLed it."""
    main = group.main
    return (main is not None and main.signal != SIGKILL and main.failed
            and (main.signal is None or main.signal in (SIGABRT, SIGSEGV, SIGBUS)))


@dataclass
class ExitGroup:
    """The exits of one workload close together in time: one death."""

    key: str  # the workload cgroup (else the process's cgroup, else `pid:N`)
    first: float
    last: float
    deadline: float
    opened: float
    exits: list[Exit] = field(default_factory=list)  # at most MAX_EXITS_KEPT, in the order heard
    count: int = 0
    main: Optional[Exit] = None

    @property
    def sigkilled(self) -> list[Exit]:
        return [e for e in self.exits if e.signal == SIGKILL]


class DeathTracker:
    """Collects exits into deaths; owned by the pipeline (one thread), times are the pipeline's `now`."""

    def __init__(self, settle: float = SETTLE_SECONDS, max_wait: float = MAX_WAIT_SECONDS,
                 max_open: int = MAX_OPEN, max_exits: int = MAX_EXITS_KEPT,
                 max_ready: int = MAX_READY) -> None:
        self.settle = settle
        self.max_wait = max_wait
        self.max_open = max_open
        self.max_exits = max_exits
        self.max_ready = max_ready
        self._open: OrderedDict[str, ExitGroup] = OrderedDict()  # in the order they opened
        self._ready: list[ExitGroup] = []  # finished early (too many open)
        self.dropped = 0  # deaths never returned: more than max_ready finished early before a due()

    def add(self, exit: Exit, now: float) -> bool:
        """Take an exit; False when it cannot be part of a memory death (not kept)."""
        if not worth_tracking(exit):
            return False
        key = exit.workload or exit.cgroup or f"pid:{exit.pid}"
        group = self._open.get(key)
        if group is None:
            if len(self._open) >= self.max_open:
                self._finish(self._open.popitem(last=False)[1])
            group = ExitGroup(key=key, first=exit.time, last=exit.time, deadline=now, opened=now)
            self._open[key] = group
        group.count += 1
        group.first, group.last = min(group.first, exit.time), max(group.last, exit.time)
        is_main = exit.main and group.main is None
        if is_main:
            group.main = exit
        if len(group.exits) < self.max_exits:
            group.exits.append(exit)
        elif is_main:
            group.exits[-1] = exit  # the main process's exit is always kept
        group.deadline = min(now + self.settle, group.opened + self.max_wait)
        return True

    def _finish(self, group: ExitGroup) -> None:
        if len(self._ready) >= self.max_ready:
            self.dropped += 1
            return
        group.deadline = group.opened  # due at once
        self._ready.append(group)

    def due(self, now: float, everything: bool = False) -> list[ExitGroup]:
        """The deaths complete at `now` (`everything`: all, at stop), first exits first."""
        out, self._ready = self._ready, []
        for key in [k for k, g in self._open.items() if everything or g.deadline <= now]:
            out.append(self._open.pop(key))
        out.sort(key=lambda g: g.first)
        return out

    def next_due(self) -> Optional[float]:
        """When the next death is complete (None: none is being collected)."""
        if self._ready:
            return min(g.deadline for g in self._ready)
        return min((g.deadline for g in self._open.values()), default=None)

    def __len__(self) -> int:
        return len(self._open) + len(self._ready)


# --- what the node knew --------------------------------------------------------------------------------


class KernelKill(NamedTuple):
    """An incident as a death's evidence: the pids the kernel killed (victim and the rest of a group kill,
    with the processes that died unlogged with it), or for a kill only memory.events counted, its cgroup."""

    time: float
    pids: frozenset
    cgroups: tuple[str, ...]
    kind: str  # single | group
    key: tuple  # Incident.key
    victim: Optional[int] = None
    counted: bool = False  # counted from memory.events: no pids


def kernel_kill_of(incident: Incident) -> KernelKill:
    pids = frozenset({p.pid for p in incident.killed} | {d["pid"] for d in incident.died_with if "pid" in d})
    cgroups = {p.cgroup for p in incident.killed if p.cgroup}
    counted_in = incident.counted_in[0] if incident.counted_in else None
    cgroups.update(c for c in (incident.group_cgroup, counted_in) if c)
    return KernelKill(time=incident.time, pids=pids, cgroups=tuple(sorted(cgroups)), kind=incident.kind,
                      key=incident.key, victim=incident.victim.pid if incident.victim is not None else None,
                      counted=incident.evidence == "memory.events")


class PodStatus(NamedTuple):
    """What the API server says of the pod now (the pod index)."""

    reason: Optional[str] = None  # status.reason: "Evicted"
    message: Optional[str] = None  # status.message
    deleting: bool = False  # metadata.deletionTimestamp is set


class OomdMark(NamedTuple):
    """systemd-oomd's marks on a cgroup (the workload's or an ancestor's) that moved near the death."""

    cgroup: str
    ooms_before: Optional[int]  # user.oomd_ooms before (None: not set)
    ooms_after: int
    kills: Optional[int] = None  # user.oomd_kill after


@dataclass(frozen=True)
class Evidence:
    """What the node knew when a death was complete. Empty fields: not known (no pod index, no log read)."""

    workload: Optional[Workload] = None
    boot_id: str = ""
    kernel_kills: tuple[KernelKill, ...] = ()  # incidents near the death (others are filtered out)
    oom_kills_in_window: Optional[int] = None  # the workload's memory.events `oom_kill` moved by this near it
    oom_kills_in_run: Optional[int] = None  # the container cgroup's `oom_kill` since it was made
    oomd: Optional[OomdMark] = None
    pod_status: Optional[PodStatus] = None
    ray_killed_pids: frozenset = frozenset()  # pids raylet.out says its memory monitor killed
    runtime_kills: tuple[RuntimeKill, ...] = ()
    log: Optional[LogFinding] = None  # the workload's last log lines (needs_log)


# KubeRay's kinds and the label it puts on every Ray pod (`ray.io/node-type`: head | worker).
RAY_KINDS = frozenset({"RayJob", "RayCluster", "RayService"})
RAY_NODE_TYPE_LABEL = "ray.io/node-type"


def runs_ray(kinds: Iterable[Optional[str]], labels: Mapping[str, str]) -> bool:
    """Whether a pod runs Ray: its job's or controlling owner's kind (`kinds`) is KubeRay's, or it carries
    KubeRay's node-type label. Only such a pod's raylet.out is read for a death in it."""
    return any(kind in RAY_KINDS for kind in kinds) or RAY_NODE_TYPE_LABEL in labels


# --- the verdict ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LastExit:
    """A Kubernetes container's last exit against what its status says (`OOMKilled`)."""

    oom_killed: bool  # the kernel's OOM killer killed its main process
    reported: Optional[bool]  # its status says OOMKilled: an OOM kill was counted in its cgroup in this run
    verdict: str  # confirmed | stale | unreported | no

    def to_json(self) -> dict[str, Any]:
        return {"oom_killed": self.oom_killed, "reported_oom_killed": self.reported, "verdict": self.verdict}


def last_exit(oom_killed: bool, reported: Optional[bool]) -> LastExit:
    if reported is None:
        verdict = "confirmed" if oom_killed else "no"
    elif oom_killed:
        verdict = "confirmed" if reported else "unreported"
    else:
        verdict = "stale" if reported else "no"
    return LastExit(oom_killed, reported, verdict)


@dataclass(frozen=True)
class Death:
    """One death's verdict (docs/contract.md, "Death JSON")."""

    time: float  # the first exit
    cause: str  # CAUSES
    sender: Optional[str]  # SENDERS, for userspace
    cgroup: str  # the workload cgroup
    workload: Optional[Workload]
    pid: int  # the main process's, else the first exit's
    comm: Optional[str]
    signal: Optional[int]
    exit_code: Optional[int]
    main: bool  # `pid` is the workload's main process
    processes: int  # exits that were part of this death
    pids: tuple[int, ...]  # at most MAX_PIDS_LISTED
    evidence: tuple[str, ...]
    explanation: str
    detected_at: float
    boot_id: str = ""
    memory: Optional[str] = None  # gpu | host | unknown: what failed (gpu-oom, alloc-failure)
    log: Optional[LogFinding] = None
    incident: Optional[tuple] = None  # the kernel incident's key (kernel-oom)
    last_exit: Optional[LastExit] = None  # Kubernetes containers whose main process ended

    @property
    def key(self) -> tuple:
        """Identity across restarts: the boot, the workload cgroup, the first exit's time and its pid."""
        return (self.boot_id, self.cgroup, round(self.time, 6), self.pid)

    def to_json(self) -> dict[str, Any]:
        from oomwatch.timefmt import iso8601

        out: dict[str, Any] = {
            "record": "death",
            "time": iso8601(self.time),
            "boot_id": self.boot_id,
            "cause": self.cause,
            "sender": self.sender,
            "cgroup": self.cgroup,
            "workload": self.workload.to_json() if self.workload is not None else None,
            "pid": self.pid,
            "comm": self.comm,
            "signal": self.signal,
            "exit_code": self.exit_code,
            "main": self.main,
            "processes": self.processes,
            "pids": list(self.pids),
            "evidence": list(self.evidence),
            "explanation": self.explanation,
            "detected_at": iso8601(self.detected_at),
        }
        if self.memory is not None:
            out["memory"] = self.memory
        if self.log is not None:
            out["log"] = self.log.to_json()
        if self.incident is not None:
            out["incident"] = list(self.incident)
        if self.last_exit is not None:
            out["last_exit"] = self.last_exit.to_json()
        return out


def death_json(death: Death) -> dict[str, Any]:
    """The JSON of a death (one line of the events file, beside incidents: `"record": "death"`)."""
    return death.to_json()


def classify(group: ExitGroup, evidence: Evidence, detected_at: float) -> Optional[Death]:
    """The verdict on one death, or None when it does not look like a memory death (a main process that ended
    well or of something else, in a run without an OOM kill)."""
    ev = evidence
    notes: list[str] = []
    kills = [k for k in ev.kernel_kills
             if group.first - KILL_BEFORE_SECONDS <= k.time <= group.last + KILL_AFTER_SECONDS]
    by_kernel: list[tuple[Exit, KernelKill]] = []
    for e in group.exits:
        for k in kills:
            if e.pid in k.pids:
                by_kernel.append((e, k))
                break
    main = group.main
    main_killed = main is not None and any(e is main for e, _ in by_kernel)
    # When a pid namespace's init ends, the kernel SIGKILLs the rest of the namespace (zap_pid_ns_processes):
    # those SIGKILLs are its death's consequence, nobody's kill. A Kubernetes container's main process is its
    # namespace's init unless the pod shares one (then its ns_pid is not 1).
    teardown: list[Exit] = []
    if main is not None and main.signal != SIGKILL and (
            main.ns_pid == 1 or (main.ns_pid is None and ev.workload is not None
                                 and ev.workload.type == "k8s-container")):
        teardown = [e for e in group.exits if e is not main and e.signal == SIGKILL
                    and e.time >= main.time - TEARDOWN_SLACK_SECONDS]
    sigkilled = [e for e in group.sigkilled if not any(e is t for t in teardown)]
    counted = [k for k in kills if k.counted and any(is_within(group.key, c) or is_within(c, group.key)
                                                     for c in k.cgroups)]
    cause: Optional[str] = None
    victim: Optional[Exit] = None
    sender: Optional[str] = None
    memory: Optional[str] = None
    incident: Optional[tuple] = None
    log: Optional[LogFinding] = None
    if by_kernel:
        cause = "kernel-oom"
        victim, kill = next(((e, k) for e, k in by_kernel if e is main), by_kernel[0])
        incident = kill.key
        others = len(by_kernel) - 1
        also = f" and {_processes(others, 'other process')} of the workload" if others else ""
        notes.append(f"the kernel's OOM killer killed {_who(victim)} ({kill.kind} kill){also}")
    elif sigkilled and (counted or (ev.oom_kills_in_window or 0) > 0):
        cause = "kernel-oom"
        if counted:
            incident = counted[0].key
        notes.append(f"memory.events counted {ev.oom_kills_in_window or len(counted)} OOM kill(s) in the "
                     f"workload while {len(sigkilled)} of its processes died by SIGKILL; the kernel log "
                     "does not name them")
        main_killed = main is not None and main.signal == SIGKILL
    elif sigkilled:
        cause = "userspace"
        sender = _sender(group, ev, notes)
        notes.append(f"{_processes(len(sigkilled), 'process')} died by SIGKILL, and no kernel OOM kill names "
                     "them (nor did memory.events count one in the workload)")
    elif main is not None and needs_log(group) and ev.log is not None:
        log = ev.log
        if log.kind == "ray-memory-monitor":
            cause, sender = "userspace", "ray-memory-monitor"
        else:
            cause = "gpu-oom" if log.memory == GPU else "alloc-failure"
            memory = log.memory
        notes.append(f"its last log lines say: {log.evidence[-1]}" if log.evidence
                     else "its last log lines say so")
        if log.lines_after:
            notes.append(f"{log.lines_after} more log line(s) came after it (a failure the program "
                         "survived?)")
    reported = None if ev.oom_kills_in_run is None else ev.oom_kills_in_run > 0
    record_last = (main is not None and ev.workload is not None and ev.workload.type == "k8s-container")
    if cause is None:
        if not (record_last and reported):
            return None
        cause = "not-oom"
        notes.append(f"its cgroup counted {ev.oom_kills_in_run} OOM kill(s) earlier in this run, so its "
                     "status will say OOMKilled; this exit was not one")
    if teardown:
        notes.append(f"{_processes(len(teardown), 'other process')} died by SIGKILL as its pid namespace "
                     "ended with it (the kernel's doing, nobody's kill)")
    if cause == "kernel-oom" and victim is not None:
        who = victim
    elif cause in ("kernel-oom", "userspace") and sigkilled:
        who = main if main is not None and main.signal == SIGKILL else sigkilled[0]
    else:
        who = main if main is not None else group.exits[0]
    death = Death(
        time=group.first, cause=cause, sender=sender, cgroup=group.key, workload=ev.workload, pid=who.pid,
        comm=who.comm, signal=who.signal, exit_code=who.code, main=who is main, processes=group.count,
        pids=tuple(e.pid for e in group.exits[:MAX_PIDS_LISTED]),
        evidence=tuple(n[:MAX_EVIDENCE_CHARS] for n in notes[:MAX_EVIDENCE]), explanation="",
        detected_at=detected_at, boot_id=ev.boot_id, memory=memory, log=log, incident=incident,
        last_exit=last_exit(main_killed, reported) if record_last else None)
    return _with_explanation(death, ev)


def _processes(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 'es'}"


def _who(e: Exit) -> str:
    return f"{e.comm} (pid {e.pid})" if e.comm else f"pid {e.pid}"


def _sender(group: ExitGroup, ev: Evidence, notes: list[str]) -> str:
    """Who sent the SIGKILL, where the node can know it; most specific first."""
    status = ev.pod_status
    if status is not None and status.reason == "Evicted":
        notes.append("the pod's status: Evicted" + (f": {status.message}" if status.message else ""))
        return "kubelet-eviction"
    if ev.oomd is not None and ev.oomd.ooms_after > (ev.oomd.ooms_before or 0):
        mark = ev.oomd
        kills = f", user.oomd_kill {mark.kills}" if mark.kills is not None else ""
        notes.append(f"systemd-oomd marked {mark.cgroup}: user.oomd_ooms {mark.ooms_before or 0} → "
                     f"{mark.ooms_after}{kills}")
        return "systemd-oomd"
    # raylet.out names pids of the Ray container's pid namespace: a process's ns_pid (heard at its exec). Its
    # host pid stands in only outside a Kubernetes container (a Ray on the host: one pid namespace).
    in_container = ev.workload is not None and ev.workload.type == "k8s-container"
    ray = [e for e in group.sigkilled
           if (e.ns_pid if e.ns_pid is not None or in_container else e.pid) in ev.ray_killed_pids]
    if ray:
        killed = ray[0]
        inside = (f" (pid {killed.ns_pid} in its container, as raylet.out names it)"
                  if killed.ns_pid is not None and killed.ns_pid != killed.pid else "")
        notes.append(f"raylet.out: Ray's memory monitor killed {_who(killed)}{inside}")
        return "ray-memory-monitor"
    container_id = ev.workload.container_id if ev.workload is not None else None
    stops = [k for k in ev.runtime_kills if container_id and k.container_id == container_id
             and group.first - STOP_BEFORE_SECONDS <= k.time <= group.last + 1.0]
    if stops:
        kill = max(stops, key=lambda k: (k.signal == SIGKILL, k.time))
        command = f"kill {'--all ' if kill.all else ''}{kill.container_id[:12]} {kill.signal}"
        notes.append(f"the runtime ran `{command}` {group.first - kill.time:.1f} s before")
        return "runtime-stop"
    if status is not None and status.deleting:
        notes.append("the pod was being deleted")
        return "runtime-stop"
    return "unknown"


_SENDER_WORDS = {
    "kubelet-eviction": "the kubelet, evicting the pod",
    "systemd-oomd": "systemd-oomd, under memory pressure",
    "ray-memory-monitor": "Ray's memory monitor",
    "runtime-stop": "its container runtime, stopping the container (pod deletion, a failed liveness probe, "
                    "or the end of a grace period)",
    "unknown": "another process (the node does not say which)",
}
_EVICTED_FOR = re.compile(r"The node was low on resource: ([\w-]{1,40})")


def _with_explanation(death: Death, ev: Evidence) -> Death:
    name = ev.workload.display_name() if ev.workload is not None else death.cgroup
    who = f"{death.comm} (pid {death.pid})" if death.comm else f"pid {death.pid}"
    ended = (f"died by signal {death.signal}" if death.signal is not None
             else f"exited with code {death.exit_code}")
    if death.cause == "kernel-oom":
        text = f"{name}: {who} was killed by the kernel's OOM killer."
    elif death.cause == "userspace" and death.log is None:
        words = _SENDER_WORDS[death.sender or "unknown"]
        if death.sender == "kubelet-eviction" and ev.pod_status is not None and ev.pod_status.message:
            m = _EVICTED_FOR.search(ev.pod_status.message)
            if m:
                words += f" (the node was low on {m.group(1)})"
        text = (f"{name}: {who} was killed with SIGKILL by {words}, not by the kernel's OOM killer: no OOM "
                "kill of it is in the kernel log or memory.events.")
    elif death.cause == "userspace":
        text = f"{name}: {who} {ended} after Ray's memory monitor killed one of its tasks (host memory low)."
    elif death.cause == "gpu-oom":
        text = f"{name}: {who} {ended} after {_gpu_words(death.log)}; no process was killed for host memory."
    elif death.cause == "alloc-failure":
        what = "host memory" if death.memory == "host" else "memory (the log does not say which device)"
        asked = f" ({size(death.log.tried_bytes)} asked)" if death.log and death.log.tried_bytes else ""
        text = (f"{name}: {who} {ended} after an allocation of {what} failed in the process{asked}; nothing "
                "killed it.")
    else:
        text = (f"{name}: {who} {ended}; the container's status may say OOMKilled because an OOM kill was "
                "counted earlier in the same run, but this exit was not an OOM kill.")
    return replace(death, explanation=text)


def _gpu_words(log: Optional[LogFinding]) -> str:
    if log is None:
        return "its GPU ran out of memory"
    gpu = f"GPU {log.device}" if log.device is not None else "its GPU"
    parts = []
    if log.tried_bytes is not None:
        parts.append(f"{size(log.tried_bytes)} asked")
    if log.free_bytes is not None:
        of = f" of {size(log.total_bytes)}" if log.total_bytes else ""
        parts.append(f"{size(log.free_bytes)} free{of}")
    return f"{gpu} ran out of memory" + (f" ({', '.join(parts)})" if parts else "")


def deaths_of(groups: Iterable[ExitGroup], evidence_of, detected_at: float) -> list[Death]:
    """Verdicts for finished groups, `evidence_of(group) -> Evidence` supplying what the node knew of each."""
    out = []
    for group in groups:
        death = classify(group, evidence_of(group), detected_at)
        if death is not None:
            out.append(death)
    return out
