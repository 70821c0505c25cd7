"""The one loop's core: every event the sources read goes through `Pipeline.step(event, now)`, which decides what
to do and returns it as `Effects`. It owns the node's state on one thread, without locks: node state (pid map,
oom.group flags, hints, workload registry), the correlator, the witness queue, the reconciler, the store
(counters, incidents, cursor). It reads no file, opens no socket and reads no clock: `now` comes with each event,
and what it knows of the node comes only from events (oomwatch.events). The agent applies the effects (sinks
publish, the state file is written, the kernel log is woken) and hands scrapes the latest `snapshot()`.
docs/loop.md has the picture.

Timing lives here too, as deadlines rather than threads: `next_deadline()` says when a `Tick` is due (an incident
still being printed is complete once the log has been quiet `quiet` seconds; a group kill waits for its
witnesses; a deficit in memory.events settles; the state is saved at most every SAVE_INTERVAL while busy; a gone
workload's series expire after the grace period). Nothing is due while nothing happens: no idle wake-ups.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional

from oomwatch.correlator import Correlator, is_within
from oomwatch.cowmap import CowMap
from oomwatch.events import (
    CgroupAdded,
    CgroupChanged,
    CgroupRemoved,
    KernelLog,
    KernelLogEnded,
    LogTailRead,
    MemoryStatRead,
    OomdMarksRead,
    PodsListed,
    PostureRead,
    ProcessExeced,
    ProcessExited,
    ProcessForked,
    RayLogRead,
    StateSaved,
    Stop,
    Tick,
)
from oomwatch.deaths import (
    KILL_AFTER_SECONDS,
    KILL_BEFORE_SECONDS,
    STOP_BEFORE_SECONDS,
    Death,
    DeathTracker,
    Evidence,
    Exit,
    ExitGroup,
    KernelKill,
    OomdMark,
    PodStatus,
    classify,
    kernel_kill_of,
    needs_log,
    runs_ray,
)
from oomwatch.explain import explain
from oomwatch.memreadings import MemoryReadings

from oomwatch.nodestate import NodeState, is_workload
from oomwatch.parse.runtime import RuntimeKill, runtime_kill_from_argv
from oomwatch.reconcile import Reconciler, counted_incident
from oomwatch.model import Garbled, Incident, KmsgRecord, Lost, Skipped, Workload
from oomwatch.store import Labels, Snapshot, Store
from oomwatch.witness import SIGKILL, WitnessQueue
from oomwatch.workloads import WorkloadResolver

# State is written at most this often while incidents keep coming (and at once when the log goes quiet).
SAVE_INTERVAL = 1.0
# Deaths (oomwatch.deaths): a death due while the kernel log is still describing a kill, or before the log has
# been read past its exits (a kill's lines come before its victim's exit), waits for it, this long at most; a
# death waits this long for the container log it asked for; kills kept as evidence for deaths.
DEATH_HOLD_SECONDS = 10.0
LOG_WAIT_SECONDS = 5.0
# A SIGKILLed Kubernetes container whose sender is not known yet waits this long for its pod's status: the kubelet's
# eviction says "Evicted" only once the pod's containers are stopped (pkg/kubelet/status mergePodStatus holds a
# terminal status back while containers may run), and the pod index hears it through its watch after that.
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


class LogRequest(NamedTuple):
    """A container log the pipeline wants the last lines of (the agent reads it and steps a LogTailRead)."""

    key: str  # the death's (its workload cgroup)
    namespace: str
    pod: str
    pod_uid: str
    container: str


class RayLogRequest(NamedTuple):
    """A Ray pod's raylet.out the pipeline wants the tail of, for a SIGKILL death in `cgroup` (its workload
    cgroup: the container's): the agent reads it through a process still alive in that cgroup (the raylet runs in
    the Ray container) and steps a RayLogRead."""

    key: str  # the death's (its workload cgroup)
    cgroup: str


@dataclass
class Effects:
    """What one step asks the agent to do; empty most of the time."""

    publish: list[Incident] = field(default_factory=list)  # counted once by the store: for the sinks
    save: Optional[dict[str, Any]] = None  # the state to write (then step a StateSaved with the outcome)
    logs: list[tuple[int, str]] = field(default_factory=list)  # (logging level, message)
    wake_kernel_log: bool = False  # read now (syslog(2) is read only when woken; the reader child says its time)
    changed: bool = False  # the snapshot is out of date
    fatal: Optional[str] = None  # a source failed for good: the agent exits so that it is restarted
    done: bool = False  # Stop handled: the loop ends
    deaths: list[Death] = field(default_factory=list)  # verdicts counted once by the store: for the sinks
    read_logs: list[LogRequest] = field(default_factory=list)  # container logs to read (then step LogTailRead)
    read_marks: list[str] = field(default_factory=list)  # systemd units' cgroups: read systemd-oomd's marks now
    read_ray_logs: list[RayLogRequest] = field(default_factory=list)  # raylet.out tails (then step RayLogRead)


class View(NamedTuple):
    """What a scrape and the other readers see: immutable, replaced whole by the pipeline."""

    store: Snapshot
    workloads: tuple[tuple[str, Labels, Workload], ...]  # (cgroup, series labels, identity), one per cgroup
    single_process_oom_kill: str
    state_error: Optional[str]
    workloads_over_cap: int = 0  # live workloads left without series: the store is full of live ones

    def snapshot(self) -> Snapshot:  # what the HTTP sink and the collector ask of a store
        return self.store


@dataclass(frozen=True)
class Settings:
    boot_id: str
    boot_time: float
    kmsg_source: Optional[str]  # "kmsg" | "syslog": the live reader; None: a saved log, or no kernel log
    counting: bool  # a live kernel log is read: memory.events counts the kills its records do not describe
    quiet: float = 0.25  # seconds of a quiet log after which an incident still open is complete
    # The same, while a group kill's listing is being printed: the kernel kills its members one by one (on a
    # loaded or emulated node 0.1-0.2 s apart, plus the reader's own delays), and a listing taken as complete too
    # early makes its next member look like the victim of a new kill.
    quiet_listing: float = 1.0
    witness_wait: float = 0.0  # seconds a group kill waits for the proc connector's exits (0: no connector)
    persist: bool = False  # a state directory is kept
    skip_upto: Optional[int] = None  # an early reader read the ring from its start: records up to here are done
    saved_log: bool = False  # a saved log is replayed: its cursor is its records' place in it ("file")
    page_size: Optional[int] = None  # the task table's page size (this host's); None: told from each report
    read_logs: bool = False  # the agent reads the kubelet's pod logs for deaths that need them (LogRequest)


class Pipeline:
    def __init__(self, settings: Settings, store: Store, resolver: WorkloadResolver, *, now: float,
                 accounts: Optional[dict] = None, single_process_oom_kill: str = "unknown",
                 state_error: Optional[str] = None) -> None:
        self.settings = settings
        self.store = store
        self.resolver = resolver
        self._now = now
        store._clock = lambda: self._now  # the store's times are the events' times
        self.single_process_oom_kill = single_process_oom_kill
        self.node = NodeState(resolver)
        live = settings.kmsg_source is not None
        # memory.stat readings for kills whose report lost its stats block (kept only with a live kernel log:
        # only its reads can order them before a kill)
        self.readings = MemoryReadings()
        self.correlator = Correlator(boot_id=settings.boot_id, boot_time=settings.boot_time,
                                     resolve_workload=resolver.resolve, scope_of=resolver.layout.scope_of,
                                     explain=self._explain,
                                     view=self.node, detected_clock=lambda: self._now, live=live,
                                     page_size=settings.page_size, memory_reading=self.readings.before,
                                     tmpfs_mounts=resolver.tmpfs_mounts)
        self.witness = WitnessQueue(explain=self._explain, wait=settings.witness_wait if live else 0.0)
        self.reconciler = Reconciler(self._counted_incident)
        self.reconciler.load_state(accounts or {})
        self.reconciler.started(now)
        self._skip_upto = settings.skip_upto
        self._last_record = now
        self._caught_up = False
        self._read_started = 0.0  # the last KernelLog's drained_at: the log is read to its end up to then
        self._reads = 0
        self._drained_at = 0.0  # the log was last read to its end with everything published at this time
        self._live = False  # the backlog already in the ring at start is not timed
        self._dirty = False
        self._saved_at = now
        self.state_error = state_error  # why the state is not saved (None: it is)
        self._identities: dict[str, Workload] = {}
        self._rows = CowMap()  # what view() shows: cgroup → (cgroup, labels, identity) of each exported workload
        # Workload cgroups the full store could not take, in the order they came (exported when it can, first first)
        self._over_cap: dict[str, None] = {}
        # Deaths: exits grouped until complete, the kills they may be, what a workload was as its cgroup went,
        # deaths waiting for their container's log.
        self.deaths = DeathTracker()
        self._recent_kills: deque[KernelKill] = deque(maxlen=RECENT_KILLS)
        self._death_context: OrderedDict[str, _DeathContext] = OrderedDict()
        self._parked: dict[str, _Parked] = {}  # deaths whose verdict waits for an answer, by their key
        self._woken_for_settle: Optional[float] = None  # the settle time the kernel log's reader was woken for
        # Processes of Ray pods: host pid → pid in its container (raylet.out names the latter), from the exec
        self._ray_ns_pids: OrderedDict[int, int] = OrderedDict()
        self._ray_error_said = False  # a refused read of raylet.out is logged once
        self._oomd_found: dict[str, int] = {}  # user.oomd_ooms of cgroups marked already when found
        self._runtime_kills: deque[RuntimeKill] = deque(maxlen=RECENT_KILLS)  # `runc kill …` heard lately
        self._woken_for_deaths: Optional[float] = None  # the due time a read of the kernel log was asked for
        self._handlers: dict[type, Callable[[Any, Effects], None]] = {
            KernelLog: self._kernel_log, CgroupAdded: self._cgroup_added, CgroupChanged: self._cgroup_changed,
            CgroupRemoved: self._cgroup_removed, ProcessForked: self._forked, ProcessExeced: self._execd,
            ProcessExited: self._exited, PostureRead: self._posture, StateSaved: self._state_saved,
            KernelLogEnded: self._kernel_log_ended, Stop: self._stop, Tick: lambda event, fx: None,
            LogTailRead: self._log_tail_read, OomdMarksRead: self._oomd_marks_read,
            MemoryStatRead: self._memory_stat_read, RayLogRead: self._ray_log_read, PodsListed: self._pods_listed,
        }

    # --- the step ----------------------------------------------------------------------------------

    def step(self, event: Any, now: float) -> Effects:
        """Take one event at time `now` (epoch seconds); return what to do."""
        self._now = now
        fx = Effects()
        self._handlers[type(event)](event, fx)
        if not fx.done:
            self._advance(fx)
        return fx

    def next_deadline(self) -> Optional[float]:
        """When a Tick is due (None: nothing is due until the next event). Never a time a Tick would leave due:
        what only a new event can move (a read of the kernel log) offers no deadline, or the loop would spin."""
        times = [self.witness.next_due(), self.store.next_expiry()]
        if self.correlator.pending and self._caught_up:  # (still reading: the next batch moves it)
            times.append(self._last_record + self._quiet())
        if self.reconciler.pending():
            settles_at = self.reconciler.settles_at()
            if settles_at is not None and settles_at > self._now:  # (past it: waits for the log's next read)
                times.append(settles_at)
        if self._dirty:
            times.append(self._saved_at + SAVE_INTERVAL)
        death_due = self.deaths.next_due()
        if death_due is not None:
            times.append(self._death_deadline(death_due))
        if self._parked:
            times.append(min(parked.until for parked in self._parked.values()))
        return min((t for t in times if t is not None), default=None)

    def view(self) -> View:
        """In constant time (cowmap): taken after every change, so churn costs what changed, not what is kept."""
        return View(self.store.snapshot(), self._rows.frozen().values(), self.single_process_oom_kill,
                    self.state_error, len(self._over_cap))

    def deaths_waiting(self) -> dict[str, str]:
        """Deaths whose verdict waits for an answer: their key → what they wait for ("log", "ray", "status")."""
        return {key: parked.waits_for for key, parked in self._parked.items()}

    def state(self) -> dict[str, Any]:
        """The state file's content: the store, the cursor and the reconciler's accounts."""
        kind = "file" if self.settings.saved_log else (self.settings.kmsg_source or "kmsg")
        self.store.set_cursor(self.settings.boot_id, self._cursor(), kind)
        state = self.store.to_state()
        state["accounts"] = self.reconciler.to_state()
        return state

    # --- kernel log --------------------------------------------------------------------------------

    def _kernel_log(self, event: KernelLog, fx: Effects) -> None:
        self.correlator.batch = self.readings.batch_started()  # readings the last read covers precede its kills
        items = self._after_cursor(event.items)
        for item in items:
            try:
                self._kernel_item(item, fx)
            except Exception as exc:  # one bad record must not stop the reading: count it, say it, go on
                self.store.count_kmsg(parse_errors=1)
                fx.logs.append((logging.ERROR, f"kernel log: cannot process record {item!r:.300}: {exc!r}; "
                                               "skipped"))
        if items:
            self._last_record = self._now
            fx.changed = True  # (the records counted)
        self._caught_up = event.drained_at is not None
        self.readings.batch_ended(event.drained_at if self.settings.kmsg_source is not None else None)
        if event.drained_at is not None:
            self._read_started = event.drained_at
            self._reads += 1

    def _kernel_item(self, item: Any, fx: Effects) -> None:
        if isinstance(item, KmsgRecord):
            stats = self.correlator.stats
            errors_before, rejected_before = stats.parse_errors, stats.rejected
            out = self.correlator.feed(item)
            self.store.count_kmsg(records=1, parse_errors=stats.parse_errors - errors_before,
                                  rejected=stats.rejected - rejected_before)
            if stats.rejected > rejected_before:
                fx.logs.append((logging.WARNING, f"kernel log: rejected an OOM line from syslog facility "
                                                 f"{item.priority >> 3}, not the kernel (written to /dev/kmsg by a "
                                                 f"process?): {item.text:.200}"))
            if out:
                self.witness.add(out, self._now)
        elif isinstance(item, Skipped):  # a ReportMemory too: a report's memory part, as the reader kept it
            self.correlator.skipped(item.count, item.last_seq, getattr(item, "part", None))
            self.store.count_kmsg(records=item.count)
        elif isinstance(item, Lost):
            self.correlator.lost(item.count or 0)
            self.store.count_kmsg(lost=item.count or 0)
            fx.logs.append((logging.WARNING, f"kernel log: {item.count or 'some'} records lost before they could "
                                             "be read (the kernel's memory.events still count their kills)"))
        elif isinstance(item, Garbled):
            self.store.count_kmsg(parse_errors=1)

    def _after_cursor(self, items: list) -> list:
        """An early reader read the ring from its oldest record: drop what the saved cursor says was done, and
        count a gap between the cursor and the oldest record still there as lost."""
        if self._skip_upto is None or not items:
            return items
        cursor, out = self._skip_upto, []
        for n, item in enumerate(items):
            seq = item.last_seq if isinstance(item, Skipped) else getattr(item, "seq", None)
            if seq is None or seq <= cursor:
                continue
            first = seq - item.count + 1 if isinstance(item, Skipped) else seq
            if first > cursor + 1:
                out.append(Lost(first - cursor - 1))
            out.extend(items[n:])
            self._skip_upto = None
            break
        return out

    def _kernel_log_ended(self, event: KernelLogEnded, fx: Effects) -> None:
        if event.saved:  # a saved log read to its end: everything in it is complete
            self.witness.add(self.correlator.flush(), self._now)
            self._publish(self.witness.due(self._now, everything=True), fx)
            fx.logs.append((logging.INFO, f"replayed the saved kernel log: {len(self.store.snapshot().incidents)} "
                                          "incidents"))
            self._dirty = self.settings.persist
            self._saved_at = self._now - SAVE_INTERVAL  # saved at once
        elif event.error:
            fx.fatal = event.error

    # --- cgroups and processes -----------------------------------------------------------------------

    def _cgroup_added(self, event: CgroupAdded, fx: Effects) -> None:
        path, node = event.path, self.node
        self.resolver.owned(path, event.owner)  # (parents come first: a delegation root before what is below it)
        self.readings.added(path)
        node.remember_pids(path, event.pids)
        node.set_oom_group(path, event.oom_group)
        node.first_reading(path, event.local)
        if event.oomd_ooms:
            self._oomd_found[path] = event.oomd_ooms
        if event.names is not None:
            self.resolver.runtime_names.keep(event.names)
        self._classify(path, event.oom_group, event.limited, fx, names_arrived=event.names is not None)
        if self.settings.counting and event.ino is not None and event.local is not None:
            self.reconciler.observe(path, event.ino, event.local, self._now, node.is_grouped(path))

    def _memory_stat_read(self, event: MemoryStatRead, fx: Effects) -> None:
        if self.settings.kmsg_source is not None:
            self.readings.add(event.path, event.taken, event.stat)

    def _cgroup_changed(self, event: CgroupChanged, fx: Effects) -> None:
        path, node = event.path, self.node
        node.set_oom_group(path, event.oom_group)
        for where, pids in (event.pids or {}).items():
            node.remember_pids(where, pids)
        moved = node.counters_read(path, event.local, self._now) if event.local is not None else None
        if not node.is_workload(path) and (moved is None or moved["oom"] or moved["oom_kill"]):
            # A plain cgroup that just got a limit or memory.oom.group (or an OOM) becomes a workload.
            self._classify(path, node.oom_group_of(path), event.limited, fx)
        if (self.settings.counting and moved is not None and event.ino is not None
                and (moved["oom_kill"] or moved["oom_group_kill"])):
            self.reconciler.observe(path, event.ino, event.local, self._now, node.is_grouped(path))

    def _cgroup_removed(self, event: CgroupRemoved, fx: Effects) -> None:
        context = self._death_context.get(event.path)
        if context is not None:  # a death being judged: what its cgroup said, before it is forgotten
            context.oom_kills = self.node.oom_kills_local(event.path)
            context.oom_kill_near = self.node.oom_kill_near(event.path, self._now - 60.0, self._now)
            context.identity = context.identity or self._identities.get(event.path)
        self._identities.pop(event.path, None)
        self._rows.pop(event.path, None)
        self._oomd_found.pop(event.path, None)
        if event.path in self._over_cap:
            del self._over_cap[event.path]
            if not self._over_cap:
                fx.logs.append((logging.INFO, "every live workload is exported again"))
        labels = self.node.cgroup_removed(event.path)
        if labels is not None:
            self.store.gone(labels)
            fx.changed = True
        self.reconciler.removed(event.path)
        self.resolver.removed(event.path)
        self.readings.removed(event.path)  # (kept a while: the kill's lines can come after the removal)

    def _pods_listed(self, event: PodsListed, fx: Effects) -> None:
        """Owners and jobs for the pods' workloads found before the API server named them (their cgroups existed
        before the first pod list returned: an agent restarted on a busy node)."""
        uids = event.uids
        for path, identity in list(self._identities.items()):
            if identity.pod_uid and (uids is None or identity.pod_uid in uids):
                workload = self.resolver.resolve(path)
                if workload != identity:
                    self._set_labels(path, workload, fx)
                    fx.changed = True

    def _classify(self, path: str, oom_group: Optional[int], limited: bool, fx: Effects,
                  names_arrived: bool = False) -> None:
        workload = self.resolver.resolve(path)
        if is_workload(path, workload, oom_group, limited, self.resolver.kubepods_level):
            self._set_labels(path, workload, fx)
        pod = workload.pod_cgroup
        if names_arrived and pod and self.node.is_workload(pod):
            # The pod cgroup appeared before any container could name it: now one can.
            self._set_labels(pod, self.resolver.resolve(pod), fx)

    def _set_labels(self, path: str, workload: Workload, fx: Effects) -> None:
        labels = workload.metric_labels()
        self._identities[path] = workload
        old = self.node.set_workload(path, labels)
        if old == labels:
            if path in self._rows:  # the same series, a richer identity (an owner the API server named)
                self._rows[path] = (path, labels, workload)
            return
        self._export(path, labels, fx)
        if old is not None:
            self.store.forget_unused(old)
        fx.changed = True

    def _export(self, path: str, labels: Labels, fx: Effects) -> None:
        """Series for a live workload, unless the store is full of live ones (then it is left out, said once
        when that starts and once when every workload has its series again)."""
        # A delegated subtree's workloads (trusted by the operator, else one) never take the room kept for the others.
        room_kept = self.store.max_workloads // 4 if self.resolver.delegated(path) else 0
        if self.store.seen(labels, room_kept):
            self._rows[path] = (path, labels, self._identities[path])
            if self._over_cap:
                self._over_cap.pop(path, None)
                if not self._over_cap:
                    fx.logs.append((logging.INFO, "every live workload is exported again"))
            return
        if not self._over_cap:
            fx.logs.append((logging.ERROR, f"more than {self.store.max_workloads} live workloads: the ones beyond "
                                           "are not exported (oomwatch_workloads_over_cap, /healthz); their kills "
                                           "are still in /incidents and the events file"))
        self._over_cap[path] = None
        self._rows.pop(path, None)

    def _forked(self, event: ProcessForked, fx: Effects) -> None:
        self.node.process_forked(event.parent, event.parent_task, event.child)

    def _execd(self, event: ProcessExeced, fx: Effects) -> None:
        self.node.process_execd(event.pid, event.cgroup, event.ns_pid, event.comm)
        if event.ns_pid is not None and event.ns_pid != 1 and event.cgroup is not None:
            self._keep_ray_ns_pid(event.pid, event.ns_pid, event.cgroup)
        if event.argv:
            kill = runtime_kill_from_argv(event.argv, self._now)
            if kill is not None:
                self._runtime_kills.append(kill)

    def _exited(self, event: ProcessExited, fx: Effects) -> None:
        main = self.node.mains.pop(event.pid, None) if self.node.mains else None
        ns_pid = self._ray_ns_pids.pop(event.pid, None) if self._ray_ns_pids else None
        if event.signal != SIGKILL and main is None:
            return  # (most exits: neither a SIGKILL nor a workload's main process)
        # Its cgroup as last seen alive: the exit event comes after the process has left it.
        cgroup = self.node.cgroup_of_pid(event.pid) or (main[0] if main else None)
        if event.signal == SIGKILL:
            self.witness.exited(event.pid, cgroup, event.time)
        workload = self.node.workload_of(cgroup)
        if workload is None:
            return  # not a workload's process: no workload died
        self.deaths.add(Exit(pid=event.pid, time=event.time, workload=workload, cgroup=cgroup, signal=event.signal,
                             code=event.code, comm=main[1] if main else None, main=main is not None,
                             ns_pid=1 if main else ns_pid), self._now)
        if workload not in self._death_context:
            if len(self._death_context) >= MAX_DEATH_CONTEXTS:
                self._death_context.popitem(last=False)
            identity = self._identities.get(workload)
            self._death_context[workload] = _DeathContext(identity)
            if event.signal == SIGKILL and identity is not None and identity.type == "systemd":
                fx.read_marks.append(workload)  # systemd-oomd marks the unit it kills: read it before it goes

    # --- node, state, stop -----------------------------------------------------------------------------

    def _posture(self, event: PostureRead, fx: Effects) -> None:
        fx.changed = self.single_process_oom_kill != event.single_process_oom_kill
        self.single_process_oom_kill = event.single_process_oom_kill

    def _state_saved(self, event: StateSaved, fx: Effects) -> None:
        if event.error is not None:
            self.store.count_state_error()
            if self.state_error is None:  # one line per change, not per save
                fx.logs.append((logging.ERROR, f"cannot write state: {event.error}; counting goes on in memory"))
        elif self.state_error is not None:
            fx.logs.append((logging.INFO, "state written again"))
        fx.changed = fx.changed or event.error != self.state_error
        self.state_error = event.error

    def _stop(self, event: Stop, fx: Effects) -> None:
        # Incidents finished but held back are complete: publish them. One still being printed is left to the
        # next start, which re-reads the log from its first record (the cursor stops before it).
        self.witness.add(self.correlator.release_finished(), self._now)
        self._publish(self.witness.due(self._now, everything=True), fx)
        # Deaths being collected are judged with what is known now (their exits are not heard again; no log
        # asked for now would be read).
        parked, self._parked = self._parked, {}
        for waiting in parked.values():
            self._resume(waiting, fx, stopping=True)
        for group in self.deaths.due(self._now, everything=True):
            self._judge(group, fx, log_read=True, ray=frozenset(), status_waited=True)  # nothing would answer
        if self.settings.persist:
            fx.save = self.state()
            self._dirty = False
        fx.done = True

    # --- after every event -------------------------------------------------------------------------------

    def _advance(self, fx: Effects) -> None:
        """Whatever is due now: complete quiet incidents, publish, reconcile, move the cursor, save."""
        now, correlator = self._now, self.correlator
        if correlator.pending and self._caught_up and (now >= self._last_record + self._quiet()
                                                        or self._counted_complete()):
            self.witness.add(correlator.flush(), now)  # quiet long enough, or every line counted: complete
        if self.witness.next_due() is not None:
            self._publish(self.witness.due(now), fx)
        if self._caught_up and not correlator.pending and not len(self.witness):
            # Read up to when its reader last found the log at its end (KernelLog.drained_at: the reader child's
            # own time for /dev/kmsg, which can lag behind a storm by more than a second; when its last read
            # began for syslog(2)), never up to now: a kill whose lines are still in the reader is not a kill
            # without lines (the 50x4 storm of 2026-11-26 14:32 counted one twice so).
            self._drained_at = min(now, self._read_started)
            self._live = self._live or self._reads > 0
        if self.reconciler.pending():
            settles_at = self.reconciler.settles_at()
            if settles_at is not None and settles_at <= self._drained_at:
                found = self.reconciler.reconcile(now, self._drained_at)
                if found:
                    fx.logs.append((logging.WARNING, f"{len(found)} OOM kill(s) counted by memory.events that no "
                                                     "kernel log record describes"))
                    self._publish(found, fx)
            elif (settles_at is not None and self.settings.kmsg_source is not None and self._caught_up
                  and self._read_started < settles_at <= now and self._woken_for_settle != settles_at):
                self._woken_for_settle = settles_at
                fx.wake_kernel_log = True  # a read (or the reader child's word) after the counters moved settles them
        self._advance_deaths(fx)
        next_expiry = self.store.next_expiry()
        if next_expiry is not None and next_expiry <= now:
            self.store.expire()
            for path in list(self._over_cap):  # room was made: those left out get their series
                self._export(path, self.node.workloads[path], fx)
            fx.changed = True
        if self._dirty and self.settings.persist and (
                now >= self._saved_at + SAVE_INTERVAL or (self._caught_up and not correlator.pending)):
            fx.save = self.state()
            self._dirty = False
            self._saved_at = now

    def _quiet(self) -> float:
        """How long the log must be quiet before what is being printed is taken as complete: longer while a group
        listing is open, or while memory.events has counted kills in its cgroups whose lines have not come (the
        counters move before the kernel prints each line, and the log's reader can lag behind them)."""
        settings = self.settings
        if self.correlator.listing or self._lines_owed():
            return max(settings.quiet, settings.quiet_listing)
        return settings.quiet

    def _counted_complete(self) -> bool:
        """Issue 30: what is being printed is complete once its lines are exactly what memory.events counted for
        their cgroups (the kernel counts each kill before printing its line, and a group kill once its listing is
        printed), with nothing more to come: every line's cgroup known, every group kill's oom_group_kill
        counted, and no kill in a cgroup where memory.oom.group applies without its `Tasks in` line. Otherwise
        (a cgroup not watched, a kernel without the counter, a pasted log) the quiet window decides."""
        if not self.settings.counting:
            return False
        lines = self.correlator.unpublished_lines()
        groups = self.correlator.unpublished_groups()
        if not lines or groups is None:
            return False
        unaccounted = self.reconciler.unaccounted_kills
        if any(unaccounted(cgroup) != n for cgroup, n in lines.items()):
            return False
        counted = self.reconciler.unaccounted_group_kills
        if any(counted(cgroup) != n for cgroup, n in groups.items()):
            return False
        return not any(self.node.is_grouped(c) and not any(is_within(c, g) for g in groups) for c in lines)

    def _lines_owed(self) -> bool:
        unaccounted = self.reconciler.unaccounted_kills
        return any(unaccounted(cgroup) > lines for cgroup, lines in self.correlator.unpublished_lines().items())

    def _publish(self, incidents: list[Incident], fx: Effects) -> None:
        for incident in incidents:
            if not self.store.publish(incident, observe_latency=self._live):
                continue
            self._recent_kills.append(kernel_kill_of(incident))
            self.reconciler.account(incident)
            self._dirty = self.settings.persist
            fx.publish.append(incident)
            fx.changed = True

    def _cursor(self) -> Optional[int]:
        """The last record fully published: a restart reads from the first record of anything pending."""
        pending = [s for s in (self.correlator.pending_since_seq, self.witness.pending_since_seq())
                   if s is not None]
        cursor = min(pending) - 1 if pending else self.correlator.last_seq
        if cursor is None and self.store.cursor_seq is not None:
            cursor = self.store.cursor_seq
        return cursor

    # --- deaths (oomwatch.deaths) ------------------------------------------------------------------------------

    def _kernel_busy(self) -> bool:
        """The kernel log is describing a kill (an incident open, or a group kill waiting for its exits)."""
        return bool(self.correlator.pending or len(self.witness))

    def _log_behind(self, due: float) -> bool:
        """The live kernel log has not been read to its end since the exits of the deaths due at `due` were
        heard (each was heard `settle` seconds or more before it): a kill's lines, printed before its victim
        exits, may still be on their way (a storm on a slow node)."""
        return self.settings.kmsg_source is not None and self._read_started < due - self.deaths.settle

    def _deaths_held(self, due: float) -> bool:
        return self._now < due + DEATH_HOLD_SECONDS and (self._kernel_busy() or self._log_behind(due))

    def _death_deadline(self, due: float) -> float:
        """When the deaths due at `due` need the loop: then (to judge them, or to ask for the read they wait for),
        else, while held, at the end of the hold (the kernel log's own deadlines and reads wake it before)."""
        if not self._deaths_held(due) or (self._log_behind(due) and self._woken_for_deaths != due):
            return due
        return due + DEATH_HOLD_SECONDS

    def _advance_deaths(self, fx: Effects) -> None:
        now = self._now
        for key in [key for key, parked in self._parked.items() if parked.until <= now]:
            self._resume(self._parked.pop(key), fx)  # no answer came in time
        due = self.deaths.next_due()
        if due is None or due > now:
            return
        if self._deaths_held(due):
            if self._log_behind(due) and self._woken_for_deaths != due:
                self._woken_for_deaths = due
                fx.wake_kernel_log = True  # read it now (the reader waits for a record, or syslog for a cue)
            return
        for group in self.deaths.due(now):
            self._judge(group, fx)

    def _judge(self, group: ExitGroup, fx: Effects, log_read: bool = False, log: Any = None,
               ray: Optional[frozenset] = None, status_waited: bool = False) -> None:
        """A complete death: its verdict from what the pipeline knows, counted once and handed to the sinks;
        or first its container's log, when only that can tell (an exit code after a GPU ran out of memory);
        or, for a container killed by a sender not known yet, first its raylet.out in a Ray pod (once: `ray` is
        what it said, None before it was asked), then its pod's status (an eviction)."""
        context = self._death_context.get(group.key) or _DeathContext(None)
        workload = context.identity or self._identities.get(group.key)
        if workload is None and not group.key.startswith("pid:"):
            workload = self.resolver.resolve(group.key)
        if (not log_read and self.settings.read_logs and needs_log(group) and workload is not None
                and workload.type == "k8s-container" and workload.namespace and workload.pod
                and workload.pod_uid and workload.container):
            self._parked[group.key] = _Parked(group, "log", self._now + LOG_WAIT_SECONDS)
            fx.read_logs.append(LogRequest(group.key, workload.namespace, workload.pod, workload.pod_uid,
                                           workload.container))
            return
        start, end = group.first - KILL_BEFORE_SECONDS, group.last + KILL_AFTER_SECONDS
        live = self.node.oom_kills_local(group.key) is not None
        near = self.node.oom_kill_near(group.key, group.first - OOM_KILL_NEAR_SECONDS,
                                       group.last + OOM_KILL_NEAR_SECONDS) or (not live and context.oom_kill_near)
        in_run = self.node.oom_kills_local(group.key) if live else context.oom_kills
        oomd = None
        if context.oomd is not None and context.oomd[0] is not None:
            oomd = OomdMark(group.key, self._oomd_found.get(group.key), context.oomd[0], context.oomd[1])
        evidence = Evidence(
            workload=workload, boot_id=self.settings.boot_id,
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
                and not status_waited and self.settings.kmsg_source is not None
                and self.resolver.pod_index is not None and evidence.pod_status is not None):
            self._parked[group.key] = _Parked(group, "status", self._now + POD_STATUS_WAIT_SECONDS, log, ray)
            return
        self._death_context.pop(group.key, None)
        if death is None:
            return
        labels = self.node.workloads.get(group.key) or (workload.metric_labels() if workload is not None else None)
        if self.store.count_death(death.key, death.cause, labels, death.to_json()):
            self._dirty = self.settings.persist
            fx.deaths.append(death)
            fx.changed = True

    def _pod_status(self, workload: Optional[Workload]) -> Optional[PodStatus]:
        """The pod's status as the pod index last heard it (None: no index, not a pod, or a pod it does not know:
        then no wait for it either)."""
        if workload is None or workload.type != "k8s-container":
            return None
        info = self.resolver.pod_info(workload.pod_uid)
        if info is None:
            return None
        return PodStatus(info.status_reason, info.status_message, info.deleting)

    def _runs_ray(self, workload: Optional[Workload]) -> bool:
        """A Kubernetes container of a pod that runs Ray (KubeRay's kinds or label), as the pod index says now
        (the identity may predate the index's first word on the pod)."""
        if workload is None or workload.type != "k8s-container":
            return False
        info = self.resolver.pod_info(workload.pod_uid)
        kinds = [(d or {}).get("kind") for d in (workload.job, workload.owner)]
        if info is not None:
            kinds += [(d or {}).get("kind") for d in (info.job, info.owner)]
        return runs_ray(kinds, info.labels if info is not None else {})

    def _keep_ray_ns_pid(self, pid: int, ns_pid: int, cgroup: str) -> None:
        """A process exec'd in a Ray pod: keep its pid in its container, the one raylet.out would name it by."""
        workload = self.node.workload_of(cgroup)
        if workload is None or not self._runs_ray(self._identities.get(workload)):
            return
        if len(self._ray_ns_pids) >= MAX_RAY_PROCESSES:
            self._ray_ns_pids.popitem(last=False)
        self._ray_ns_pids[pid] = ns_pid

    def _ray_log_read(self, event: RayLogRead, fx: Effects) -> None:
        if event.error is not None and not self._ray_error_said:
            self._ray_error_said = True
            fx.logs.append((logging.WARNING, f"cannot read Ray's raylet.out: {event.error}; deaths in Ray pods are "
                                             "judged without it (said once)"))
        parked = self._parked.get(event.key)
        if parked is not None and parked.waits_for == "ray":
            self._resume(self._parked.pop(event.key), fx, event.killed_pids or frozenset())

    def _oomd_marks_read(self, event: OomdMarksRead, fx: Effects) -> None:
        context = self._death_context.get(event.path)
        if context is not None:
            context.oomd = (event.ooms, event.kills)

    def _log_tail_read(self, event: LogTailRead, fx: Effects) -> None:
        parked = self._parked.get(event.key)
        if parked is not None and parked.waits_for == "log":
            self._resume(self._parked.pop(event.key), fx, event.finding)

    def _resume(self, parked: "_Parked", fx: Effects, answer: Any = None, stopping: bool = False) -> None:
        """Judge a parked death again, with the answer it waited for (None: none came); at a stop nothing more
        is asked (no raylet.out, no wait for the pod's status)."""
        log = answer if parked.waits_for == "log" else parked.log
        ray = (answer or frozenset()) if parked.waits_for == "ray" else parked.ray
        if stopping and ray is None:
            ray = frozenset()
        self._judge(parked.group, fx, log_read=True, log=log, ray=ray,
                    status_waited=stopping or parked.waits_for == "status")

    # --- incidents -----------------------------------------------------------------------------------------

    def _explain(self, incident: Incident) -> str:
        return explain(incident, self.single_process_oom_kill)

    def _counted_incident(self, **kw) -> Incident:
        return counted_incident(boot_id=self.settings.boot_id, detected_at=self._now, resolve=self.resolver.resolve,
                                scope_of=self.resolver.layout.scope_of, explain=self._explain, **kw)


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
