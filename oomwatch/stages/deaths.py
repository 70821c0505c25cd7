"""Deaths (oomwatch.deaths): exits grouped until complete, judged with the kills they may be, what their
workload was (kept past its cgroup's removal), the runtime's kill commands and systemd-oomd's marks; a death
whose verdict needs one more answer (its container's log, its Ray pod's raylet.out, its pod's status) is parked
until it comes or its wait ends. A death due while the kernel log is still describing a kill, or before the log
has been read past its exits, is held (`KernelLogView`)."""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from typing import Any, NamedTuple, Optional

from oomwatch.deaths import (KILL_AFTER_SECONDS, KILL_BEFORE_SECONDS, STOP_BEFORE_SECONDS, DeathTracker, Evidence,
                             Exit, ExitGroup, KernelKill, OomdMark, PodStatus, classify, kernel_kill_of, needs_log,
                             runs_ray)
from oomwatch.events import (CgroupAdded, CgroupRemoved, LogTailRead, OomdMarksRead, ProcessExeced,
                             ProcessExited, RayLogRead, Stop)
from oomwatch.model import Workload
from oomwatch.parse.runtime import RuntimeKill, runtime_kill_from_argv
from oomwatch.stages import Context, DeathCounted, Effects, LogRequest, Published, RayLogRequest, SigKilled
from oomwatch.stages.identity import IdentityView
from oomwatch.stages.kernellog import KernelLogView
from oomwatch.witness import SIGKILL

VIEWS = ()

# A death due while the kernel log is still describing a kill, or before the log has been read past its exits (a
# kill's lines come before its victim's exit), waits for it, this long at most; a death waits this long for the
# container log it asked for; kills kept as evidence for deaths.
DEATH_HOLD_SECONDS = 10.0
LOG_WAIT_SECONDS = 5.0
# A SIGKILLed Kubernetes container whose sender is not known yet waits this long for its pod's status: the kubelet's
# eviction says "Evicted" only once the pod's containers are stopped (pkg/kubelet/status mergePodStatus holds a
# terminal status back while containers may run), and the pod source hears it through its watch after that.
POD_STATUS_WAIT_SECONDS = 10.0
# A SIGKILL with no sender known yet in a Ray pod waits this long for its raylet.out (read at once by the agent:
# only a raylet that cannot be read, or a busy loop, makes it wait at all).
RAY_LOG_WAIT_SECONDS = 3.0
MAX_RAY_PROCESSES = 1 << 14  # processes of Ray pods whose pid in their container is kept (from their exec)
RECENT_KILLS = 512
MAX_DEATH_CONTEXTS = 8192
# memory.events `oom_kill` moving in a workload this near its death (either side) makes a SIGKILL a kernel kill
# (the kernel log lost the record, or has not been read yet).
OOM_KILL_NEAR_SECONDS = 10.0


class DeathsStage:
    TAKES = (Published, CgroupAdded, CgroupRemoved, ProcessExeced, ProcessExited, LogTailRead, OomdMarksRead,
             RayLogRead, Stop)

    def __init__(self, context: Context, log: KernelLogView, identities: IdentityView, now: float) -> None:
        self._context = context
        self._log = log
        self._identities = identities
        self._now = now
        self.tracker = DeathTracker()
        self._recent_kills: deque[KernelKill] = deque(maxlen=RECENT_KILLS)
        self._death_context: OrderedDict[str, _DeathContext] = OrderedDict()
        self._parked: dict[str, _Parked] = {}  # deaths whose verdict waits for an answer, by their key
        # Processes of Ray pods: host pid → pid in its container (raylet.out names the latter), from the exec
        self._ray_ns_pids: OrderedDict[int, int] = OrderedDict()
        self._ray_error_said = False  # a refused read of raylet.out is logged once
        self._oomd_found: dict[str, int] = {}  # user.oomd_ooms of cgroups marked already when found
        self._runtime_kills: deque[RuntimeKill] = deque(maxlen=RECENT_KILLS)  # `runc kill …` heard lately
        self._woken_for_deaths: Optional[float] = None  # the due time a read of the kernel log was asked for
        self._told: list = []  # what this step tells the other stages (DeathCounted, SigKilled)

    def __len__(self) -> int:
        """Exits being collected into deaths not complete yet."""
        return len(self.tracker)

    def waiting(self) -> dict[str, str]:
        """Deaths whose verdict waits for an answer: their key → what they wait for ("log", "ray", "status")."""
        return {key: parked.waits_for for key, parked in self._parked.items()}

    def _told_now(self) -> list:
        told, self._told = self._told, []
        return told

    def step(self, event: Any, now: float, fx: Effects) -> list:
        self._now = now
        if isinstance(event, Published):
            self._recent_kills.extend(kernel_kill_of(incident) for incident in event.incidents)
        elif isinstance(event, CgroupAdded):
            if event.oomd_ooms:
                self._oomd_found[event.path] = event.oomd_ooms
        elif isinstance(event, CgroupRemoved):
            self._cgroup_removed(event.path)
        elif isinstance(event, ProcessExeced):
            self._execd(event)
        elif isinstance(event, ProcessExited):
            self._exited(event, fx)
        elif isinstance(event, (LogTailRead, RayLogRead)):
            self._answered(event, fx)
        elif isinstance(event, OomdMarksRead):
            context = self._death_context.get(event.path)
            if context is not None:
                context.oomd = (event.ooms, event.kills)
        elif isinstance(event, Stop):
            # Deaths being collected are judged with what is known now (their exits are not heard again; no log
            # asked for now would be read).
            parked, self._parked = self._parked, {}
            for waiting in parked.values():
                self._resume(waiting, fx, stopping=True)
            for group in self.tracker.due(now, everything=True):
                self._judge(group, fx, log_read=True, ray=frozenset(), status_waited=True)  # nothing would answer
        return self._told_now()

    def _cgroup_removed(self, path: str) -> None:
        node, context = self._context.node, self._death_context.get(path)
        if context is not None:  # a death being judged: what its cgroup said, before it is forgotten
            context.oom_kills = node.oom_kills_local(path)
            context.oom_kill_near = node.oom_kill_near(path, self._now - 60.0, self._now)
            context.identity = context.identity or self._identities.identity_of(path)
        self._oomd_found.pop(path, None)

    def _execd(self, event: ProcessExeced) -> None:
        if event.ns_pid is not None and event.ns_pid != 1 and event.cgroup is not None:
            self._keep_ray_ns_pid(event.pid, event.ns_pid, event.cgroup)
        if event.argv:
            kill = runtime_kill_from_argv(event.argv, self._now)
            if kill is not None:
                self._runtime_kills.append(kill)

    def _exited(self, event: ProcessExited, fx: Effects) -> None:
        node = self._context.node
        main = node.mains.pop(event.pid, None) if node.mains else None
        ns_pid = self._ray_ns_pids.pop(event.pid, None) if self._ray_ns_pids else None
        if event.signal != SIGKILL and main is None:
            return  # (most exits: neither a SIGKILL nor a workload's main process)
        # Its cgroup as last seen alive: the exit event comes after the process has left it.
        cgroup = node.cgroup_of_pid(event.pid) or (main[0] if main else None)
        if event.signal == SIGKILL:
            self._told.append(SigKilled(event.pid, cgroup, event.time))
        workload = node.workload_of(cgroup)
        if workload is None:
            return  # not a workload's process: no workload died
        self.tracker.add(Exit(pid=event.pid, time=event.time, workload=workload, cgroup=cgroup,
                              signal=event.signal, code=event.code, comm=main[1] if main else None,
                              main=main is not None, ns_pid=1 if main else ns_pid), self._now)
        if workload not in self._death_context:
            if len(self._death_context) >= MAX_DEATH_CONTEXTS:
                self._death_context.popitem(last=False)
            identity = self._identities.identity_of(workload)
            self._death_context[workload] = _DeathContext(identity)
            if event.signal == SIGKILL and identity is not None and identity.type == "systemd":
                fx.read_marks.append(workload)  # systemd-oomd marks the unit it kills: read it before it goes

    def _answered(self, event: Any, fx: Effects) -> None:
        """A container log's tail (LogTailRead) or a raylet.out's kills (RayLogRead) a parked death asked for."""
        waits_for = "log" if isinstance(event, LogTailRead) else "ray"
        if waits_for == "ray" and event.error is not None and not self._ray_error_said:
            self._ray_error_said = True
            fx.logs.append((logging.WARNING, f"cannot read Ray's raylet.out: {event.error}; deaths in Ray pods are "
                                             "judged without it (said once)"))
        parked = self._parked.get(event.key)
        if parked is not None and parked.waits_for == waits_for:
            answer = event.finding if waits_for == "log" else (event.killed_pids or frozenset())
            self._resume(self._parked.pop(event.key), fx, answer)

    # --- due deaths ----------------------------------------------------------------------------------------

    def _log_behind(self, due: float) -> bool:
        """The live kernel log has not been read to its end since the exits of the deaths due at `due` were
        heard (each was heard `settle` seconds or more before it): a kill's lines, printed before its victim
        exits, may still be on their way (a storm on a slow node)."""
        return (self._context.settings.kmsg_source is not None
                and self._log.read_started < due - self.tracker.settle)

    def _held(self, due: float) -> bool:
        return self._now < due + DEATH_HOLD_SECONDS and (self._log.busy() or self._log_behind(due))

    def next_deadline(self) -> Optional[float]:
        """When the deaths due need the loop: then (to judge them, or to ask for the read they wait for), else,
        while held, at the end of the hold (the kernel log's own deadlines and reads wake it before); and when a
        parked death's wait ends."""
        times = []
        due = self.tracker.next_due()
        if due is not None:
            held = self._held(due) and not (self._log_behind(due) and self._woken_for_deaths != due)
            times.append(due + DEATH_HOLD_SECONDS if held else due)
        if self._parked:
            times.append(min(parked.until for parked in self._parked.values()))
        return min(times, default=None)

    def advance(self, now: float, fx: Effects) -> list:
        self._now = now
        for key in [key for key, parked in self._parked.items() if parked.until <= now]:
            self._resume(self._parked.pop(key), fx)  # no answer came in time
        due = self.tracker.next_due()
        if due is not None and due <= now:
            if not self._held(due):
                for group in self.tracker.due(now):
                    self._judge(group, fx)
            elif self._log_behind(due) and self._woken_for_deaths != due:
                self._woken_for_deaths = due
                fx.wake_kernel_log = True  # read it now (the reader waits for a record, or syslog for a cue)
        return self._told_now()

    def _judge(self, group: ExitGroup, fx: Effects, log_read: bool = False, log: Any = None,
               ray: Optional[frozenset] = None, status_waited: bool = False) -> None:
        """A complete death: its verdict from what the pipeline knows, counted once and handed to the sinks;
        or first its container's log, when only that can tell (an exit code after a GPU ran out of memory);
        or, for a container killed by a sender not known yet, first its raylet.out in a Ray pod (once: `ray` is
        what it said, None before it was asked), then its pod's status (an eviction)."""
        settings, node, resolver = self._context.settings, self._context.node, self._context.resolver
        context = self._death_context.get(group.key) or _DeathContext(None)
        workload = context.identity or self._identities.identity_of(group.key)
        if workload is None and not group.key.startswith("pid:"):
            workload = resolver.resolve(group.key)
        if (not log_read and settings.read_logs and needs_log(group) and workload is not None
                and workload.type == "k8s-container" and workload.namespace and workload.pod
                and workload.pod_uid and workload.container):
            self._parked[group.key] = _Parked(group, "log", self._now + LOG_WAIT_SECONDS)
            fx.read_logs.append(LogRequest(group.key, workload.namespace, workload.pod, workload.pod_uid,
                                           workload.container))
            return
        start, end = group.first - KILL_BEFORE_SECONDS, group.last + KILL_AFTER_SECONDS
        live = node.oom_kills_local(group.key) is not None
        near = node.oom_kill_near(group.key, group.first - OOM_KILL_NEAR_SECONDS,
                                  group.last + OOM_KILL_NEAR_SECONDS) or (not live and context.oom_kill_near)
        in_run = node.oom_kills_local(group.key) if live else context.oom_kills
        oomd = None
        if context.oomd is not None and context.oomd[0] is not None:
            oomd = OomdMark(group.key, self._oomd_found.get(group.key), context.oomd[0], context.oomd[1])
        evidence = Evidence(
            workload=workload, boot_id=settings.boot_id,
            kernel_kills=tuple(k for k in self._recent_kills if start <= k.time <= end),
            oom_kills_in_window=1 if near else 0,
            oom_kills_in_run=in_run if workload is not None and workload.type == "k8s-container" else None,
            oomd=oomd, log=log, pod_status=self._pod_status(workload), ray_killed_pids=ray or frozenset(),
            runtime_kills=tuple(k for k in self._runtime_kills
                                if group.first - STOP_BEFORE_SECONDS - 1.0 <= k.time <= group.last + 1.0))
        death = classify(group, evidence, self._now)
        if (death is not None and death.cause == "userspace" and death.sender == "unknown" and ray is None
                and self._runs_ray(workload)):
            self._parked[group.key] = _Parked(group, "ray", self._now + RAY_LOG_WAIT_SECONDS, log)
            fx.read_ray_logs.append(RayLogRequest(group.key, group.key))
            return
        if (death is not None and death.cause == "userspace" and death.sender != "kubelet-eviction"
                and not status_waited and settings.kmsg_source is not None and evidence.pod_status is not None):
            self._parked[group.key] = _Parked(group, "status", self._now + POD_STATUS_WAIT_SECONDS, log, ray)
            return
        self._death_context.pop(group.key, None)
        if death is None:
            return
        labels = node.workloads.get(group.key) or (workload.metric_labels() if workload is not None else None)
        if self._context.store.count_death(death.key, death.cause, labels, death.to_json()):
            self._told.append(DeathCounted(death.key))
            fx.deaths.append(death)
            fx.changed = True

    def _pod_status(self, workload: Optional[Workload]) -> Optional[PodStatus]:
        """The pod's status as the pod source's events last told it (None: not a pod, or a pod not heard of: then
        no wait for it either)."""
        if workload is None or workload.type != "k8s-container":
            return None
        info = self._identities.pod_info(workload.pod_uid)
        if info is None:
            return None
        return PodStatus(info.status_reason, info.status_message, info.deleting)

    def _runs_ray(self, workload: Optional[Workload]) -> bool:
        """A Kubernetes container of a pod that runs Ray (KubeRay's kinds or label), as the pod source's events say
        by now (the identity may predate their first word on the pod)."""
        if workload is None or workload.type != "k8s-container":
            return False
        info = self._identities.pod_info(workload.pod_uid)
        kinds = [(d or {}).get("kind") for d in (workload.job, workload.owner)]
        if info is not None:
            kinds += [(d or {}).get("kind") for d in (info.job, info.owner)]
        return runs_ray(kinds, info.labels if info is not None else {})

    def _keep_ray_ns_pid(self, pid: int, ns_pid: int, cgroup: str) -> None:
        """A process exec'd in a Ray pod: keep its pid in its container, the one raylet.out would name it by."""
        workload = self._context.node.workload_of(cgroup)
        if workload is None or not self._runs_ray(self._identities.identity_of(workload)):
            return
        if len(self._ray_ns_pids) >= MAX_RAY_PROCESSES:
            self._ray_ns_pids.popitem(last=False)
        self._ray_ns_pids[pid] = ns_pid

    def _resume(self, parked: "_Parked", fx: Effects, answer: Any = None, stopping: bool = False) -> None:
        """Judge a parked death again, with the answer it waited for (None: none came); at a stop nothing more
        is asked (no raylet.out, no wait for the pod's status)."""
        log = answer if parked.waits_for == "log" else parked.log
        ray = (answer or frozenset()) if parked.waits_for == "ray" else parked.ray
        if stopping and ray is None:
            ray = frozenset()
        self._judge(parked.group, fx, log_read=True, log=log, ray=ray,
                    status_waited=stopping or parked.waits_for == "status")


class _Parked(NamedTuple):
    """A death whose verdict waits until `until` for one answer (`waits_for`): its container's log ("log"), its
    Ray pod's raylet.out ("ray") or its pod's status ("status"); with what it had already (`log`, `ray`)."""

    group: ExitGroup
    waits_for: str
    until: float
    log: Any = None
    ray: Optional[frozenset] = None


class _DeathContext:
    """What a workload being judged was, kept past its cgroup's removal (which often comes before its death is
    complete): its identity, memory.events.local `oom_kill` as last read, whether it moved near the end."""

    __slots__ = ("identity", "oom_kills", "oom_kill_near", "oomd")

    def __init__(self, identity: Optional[Workload]) -> None:
        self.identity = identity
        self.oom_kills: Optional[int] = None
        self.oom_kill_near = False
        self.oomd: Optional[tuple[Optional[int], Optional[int]]] = None  # systemd-oomd's marks, as read
