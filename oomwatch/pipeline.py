"""The one loop's core: every event the sources read goes through `Pipeline.step(event, now)`, which hands it to
the stages that take it (oomwatch/stages/: posture, kernel log → incidents, deaths, identity, counts) and returns
what they decided as `Effects`. It owns the node's state on one thread, without locks; it reads no file, opens no
socket and reads no clock: `now` comes with each event, and what it knows of the node comes only from events
(oomwatch.events). The agent applies the effects (sinks publish, the state file is written, the kernel log is
woken) and hands scrapes the latest `view()`. docs/loop.md has the picture.

The Pipeline decides nothing itself: a stage tells another what it found as a typed value (oomwatch.stages: `Due`,
`Named`, `Published`, `CountersMoved`, `SigKilled`, `DeathCounted`), which the Pipeline hands at once to the stages that
take it, or through the read-only view a stage declares. Timing lives in the stages too, as deadlines rather than
threads: `next_deadline()` is the earliest of theirs. Nothing is due while nothing happens: no idle wake-ups.
"""

from __future__ import annotations

from typing import Any, Collection, Iterable, NamedTuple, Optional

from oomwatch.correlator import Correlator
from oomwatch.memreadings import MemoryReadings
from oomwatch.model import Workload
from oomwatch.nodestate import NodeState
from oomwatch.stages import Context, Effects, LogRequest, RayLogRequest, Settings, Stage
from oomwatch.stages.counts import SAVE_INTERVAL, CountsStage
from oomwatch.stages.deaths import POD_STATUS_WAIT_SECONDS, RAY_LOG_WAIT_SECONDS, DeathsStage
from oomwatch.stages.identity import IdentityStage, NamedLogView
from oomwatch.stages.kernellog import KernelLogStage
from oomwatch.stages.posture import PostureStage
from oomwatch.events import Stop, Tick
from oomwatch.store import Labels, Snapshot, Store
from oomwatch.workloads import WorkloadResolver

__all__ = ["Effects", "LogRequest", "Pipeline", "POD_STATUS_WAIT_SECONDS", "RAY_LOG_WAIT_SECONDS", "RayLogRequest",
           "SAVE_INTERVAL", "Settings", "View"]


class View(NamedTuple):
    """What a scrape and the other readers see: immutable, replaced whole by the pipeline."""

    store: Snapshot
    # (cgroup, series labels, identity), one per cgroup: sized and re-iterable, taken in constant time (cowmap)
    workloads: Collection[tuple[str, Labels, Workload]]
    single_process_oom_kill: str
    state_error: Optional[str]
    workloads_over_cap: int = 0  # live workloads left without series: the store is full of live ones
    # What the kernel log held at start is read and published (KernelLogView.live): until then /healthz says
    # "starting", and a kill made meanwhile waits behind that backlog.
    kernel_log_live: bool = True

    def snapshot(self) -> Snapshot:  # what the HTTP sink and the collector ask of a store
        return self.store


class Pipeline:
    def __init__(self, settings: Settings, store: Store, resolver: WorkloadResolver, *, now: float,
                 accounts: Optional[dict] = None, single_process_oom_kill: str = "unknown",
                 state_error: Optional[str] = None) -> None:
        self.settings = settings
        self.store = store
        self.resolver = resolver
        self._now = now
        store.use_clock(lambda: self._now)  # the store's times are the events' times
        self.node = NodeState(resolver)
        context = Context(settings, store, resolver, self.node)
        self._posture = PostureStage(single_process_oom_kill)
        self._log = KernelLogStage(context, self._posture.explain, now)
        self._identity = IdentityStage(context, self._log.view(), self._posture.explain)
        self.deaths = DeathsStage(context, self._log.view(), self._identity.view(), now)
        # (the log as counted: not drained past an incident the identity stage holds for its names)
        self._counts = CountsStage(context, NamedLogView(self._log, self._identity), self._posture.explain,
                                   now=now, accounts=accounts, state_error=state_error)
        self._log.counted_by(self._counts.counted())
        # The order the stages take an event in: the kernel log's before the deaths it may explain, what a
        # workload was (deaths) before its identity is forgotten, the counts last (they save what the others did).
        stages: tuple[Stage, ...] = (self._posture, self._log, self.deaths, self._identity, self._counts)
        self._takers: dict[type, list[Stage]] = {Tick: []}
        for stage in stages:
            for kind in stage.TAKES:
                self._takers.setdefault(kind, []).append(stage)
        # The order what is due is done in: incidents complete, then what memory.events counted beyond them, then
        # deaths (which those kills may explain), then gone workloads' series.
        self._advancing: tuple[Stage, ...] = (self._log, self._counts, self.deaths, self._identity)

    def step(self, event: Any, now: float) -> Effects:
        """Take one event at time `now` (epoch seconds); return what to do."""
        self._now = now
        fx = Effects()
        self._hand_on((event,), fx)
        if isinstance(event, Stop):
            fx.done = True
            return fx
        for stage in self._advancing:
            self._hand_on(stage.advance(now, fx), fx)
        self._counts.save_due(now, fx)
        return fx

    def _hand_on(self, events: Iterable[Any], fx: Effects) -> None:
        """Each event to the stages that take it, in order; what a stage tells the others goes on at once. An event
        no stage takes (not even none, as a Tick) is a mistake: KeyError."""
        for event in events:
            for stage in self._takers[type(event)]:
                told = stage.step(event, self._now, fx)
                if told:
                    self._hand_on(told, fx)

    def next_deadline(self) -> Optional[float]:
        """When a Tick is due (None: nothing is due until the next event). Never a time a Tick would leave due:
        what only a new event can move (a read of the kernel log) offers no deadline, or the loop would spin."""
        soonest = None
        for stage in self._advancing:  # (the posture stage has no deadline)
            due = stage.next_deadline()
            if due is not None and (soonest is None or due < soonest):
                soonest = due
        return soonest

    def view(self) -> View:
        """In constant time (cowmap): taken after every change, so churn costs what changed, not what is kept."""
        return View(self.store.snapshot(), self._identity.exported(), self._posture.single_process_oom_kill,
                    self._counts.state_error, self._identity.over_cap(), self._log.view().live)

    def deaths_waiting(self) -> dict[str, str]:
        """Deaths whose verdict waits for an answer: their key → what they wait for ("log", "ray", "status")."""
        return self.deaths.waiting()

    def state(self) -> dict[str, Any]:
        """The state file's content: the store, the cursor and the reconciler's accounts."""
        return self._counts.state()

    @property
    def correlator(self) -> Correlator:
        """The kernel-log stage's correlator (its `stats`: what the log held)."""
        return self._log.correlator

    @property
    def readings(self) -> MemoryReadings:
        """The memory.stat readings the kernel-log stage keeps for reports that lost their stats block."""
        return self._log.readings
