"""Replaying recorded events through the pipeline, as the agent's loop does, without a thread or a sleep.

Events come from the real sources pointed at fixtures (a fixture cgroup tree read by sources.cgroupsource, a
kernel-log capture read by sources.kmsg) or are written out by the test in the order a real run delivered them
(the storm tier's logs show that order). Time is whatever the test says: each step takes its `now`.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from oomwatch.config import Config
from oomwatch.events import CgroupAdded, KernelLog, KernelLogEnded, PodsListed, PodUpdated, StateSaved, Tick
from oomwatch.model import Incident, KmsgRecord
from oomwatch.node import NodePosture, scraped_workloads
from oomwatch.parse.kmsg import parse_kmsg_record
from oomwatch.pipeline import Effects, Pipeline, Settings
from oomwatch.sinks.collector import AGENT_CHECKS, AgentStatus, OomwatchCollector
from oomwatch.sources.cgroupfs import CgroupFS, Proc
from oomwatch.sources.cgroupsource import CgroupSource
from oomwatch.sources.kmsg import LiveKmsg, read_saved_log
from oomwatch.sources.statcache import StatCache
from oomwatch.store import Store
from oomwatch.workloads import WorkloadResolver
from oomwatch.workloads.kubeapi import pod_info_from_object
from oomwatch.workloads.runtime import RuntimeNames

BOOT_ID = "replay-boot"
SPIN_STEP = 0.001  # seconds the clock moves between two Ticks of a spinning loop (Replay.spins)


def tree_events(cgroup_root: Path, run_root: Optional[Path] = None,
                pod_log_dir: Optional[Path] = None) -> list[CgroupAdded]:
    """What the cgroup source emits for a tree at start: one CgroupAdded per cgroup, parents first."""
    events: list[Any] = []
    names = RuntimeNames(run_root=str(run_root or "/nonexistent"), pod_log_root=str(pod_log_dir or "/nonexistent"))
    source = CgroupSource(CgroupFS(str(cgroup_root)), WorkloadResolver(names), events.append)
    source.start()
    return events


class RecordedTree:
    """The real cgroup source (sources.cgroupsource) on a fixture tree, its watcher driven by hand: where
    inotify would signal a change, the test changes the files and calls `changed`, `populated`, `limits` or
    `removed`, which run the watcher's own callbacks (`CgroupWatcher.on_events` …) on this thread. Each
    returns the events the source emitted; `kills` counts the source's `on_kill` cues (what wakes a syslog(2)
    reader)."""

    def __init__(self, cgroup_root: Path, run_root: Optional[Path] = None, pod_log_dir: Optional[Path] = None,
                 resolver: Optional[WorkloadResolver] = None) -> None:
        self._emitted: list[Any] = []
        self.kills = 0
        names = RuntimeNames(run_root=str(run_root or "/nonexistent"),
                             pod_log_root=str(pod_log_dir or "/nonexistent"))
        self.source = CgroupSource(CgroupFS(str(cgroup_root)), resolver or WorkloadResolver(names),
                                   self._emitted.append, on_kill=self._killed)
        self.watcher = self.source.watcher

    def _killed(self) -> None:
        self.kills += 1

    def _take(self) -> list[Any]:
        out = list(self._emitted)
        self._emitted.clear()
        return out

    def start(self) -> list[Any]:
        self.source.start()
        return self._take()

    def changed(self, path: str) -> list[Any]:
        self.watcher.on_events(path)
        return self._take()

    def populated(self, path: str) -> list[Any]:
        self.watcher.on_populated(path)
        return self._take()

    def limits(self, path: str) -> list[Any]:
        self.watcher.on_limits(path)
        return self._take()

    def removed(self, path: str) -> list[Any]:
        self.watcher.on_removed(path)
        return self._take()

    def read_names(self, path: str) -> list[Any]:
        """What the agent does for the pipeline's Effects.read_names: the source reads the bundle again (and the
        agent steps its answer at once)."""
        return [self.source.read_names(path)] + self._take()

    def close(self) -> None:
        self.watcher.close()


def pods_listed(*pods: dict) -> PodsListed:
    """What the pod source emits for a list of these pods (as the API server's JSON)."""
    return PodsListed(tuple(pod_info_from_object(pod) for pod in pods))


def pod_updated(pod: dict) -> PodUpdated:
    """What the pod source emits for a watch's ADDED or MODIFIED of this pod (as the API server's JSON)."""
    return PodUpdated(pod_info_from_object(pod))


def saved_log_events(path: Path) -> list[Any]:
    """A saved kernel log as the kernel-log source replays it: its items, then its end."""
    return [KernelLog(list(read_saved_log(str(path))), drained_at=0.0), KernelLogEnded(saved=True)]


def kmsg_records(raw: Iterable[bytes]) -> list[KmsgRecord]:
    """Raw /dev/kmsg records (tests/conftest.raw_records) as the live reader yields them."""
    return [parse_kmsg_record(r) for r in raw]


class LiveReader:
    """The live /dev/kmsg reader (sources.kmsg.LiveKmsg, pre-filtering as the agent has it) on recorded
    records: `read(records)` hands them to it as the kernel would print them and returns what one read gives.
    `after_seq`: the cursor a restart opens it after (records up to it are skipped, a gap after it comes out
    as Lost). The records go through a SOCK_SEQPACKET pair, one record per read() like the device, read on
    this thread."""

    def __init__(self, after_seq: Optional[int] = None) -> None:
        self._ours, self._kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._ours.setblocking(False)
        ours = self._ours

        class Recorded(LiveKmsg):
            def open(self, after_seq: Optional[int] = None) -> None:
                super().open(after_seq)  # opens the stand-in path below, replaced at once by the socket
                os.close(self.fd)
                self.fd = ours.fileno()

        self.reader = Recorded("/dev/null", prefilter=True)
        self.reader.open(after_seq)

    def read(self, records: Iterable[bytes]) -> list:
        """The kernel prints `records`; what the reader has read once it has caught up with them (the socket
        holds a few hundred records: the reader drains it every 32, as the device would be drained)."""
        records, items = list(records), []
        for n in range(0, len(records), 32):
            for record in records[n:n + 32]:
                self._kernel.send(record)
            items += self.reader.read_available()
        return items

    def close(self) -> None:
        self._ours.close()
        self._kernel.close()


def live_reads(raw: Iterable[bytes], after_seq: Optional[int] = None, per_read: int = 32) -> list[list]:
    """What the live reader returns for these raw records, `per_read` of them printed between two reads: one
    list of items per read."""
    records = list(raw)
    reader = LiveReader(after_seq)
    try:
        return [reader.read(records[n:n + per_read]) for n in range(0, len(records), per_read)]
    finally:
        reader.close()


def cursor_for_restart(state: dict, boot_id: str = BOOT_ID, kind: str = "kmsg") -> Optional[int]:
    """The sequence a restarted agent's reader opens after: the saved cursor, if it is this boot's and this
    kind of reader's (the agent's start asks the same)."""
    if state.get("boot_id") == boot_id and state.get("cursor_source") == kind:
        return state.get("cursor_seq")
    return None


def live_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = dict(boot_id=BOOT_ID, boot_time=0.0, kmsg_source="kmsg", counting=True, quiet=0.25,
                                  witness_wait=0.0, persist=True)
    values.update(overrides)
    return Settings(**values)


class Replay:
    """A pipeline and everything its steps asked for, gathered. With `sinks` and `state_sink`
    (oomwatch.sinks), the effects are applied to them in the agent's order: each incident published to every
    sink; a save written by the state sink, then every sink flushed, then the outcome stepped back in as
    StateSaved."""

    def __init__(self, settings: Optional[Settings] = None, *, now: float = 0.0, store: Optional[Store] = None,
                 resolver: Optional[WorkloadResolver] = None, accounts: Optional[dict] = None,
                 single_process_oom_kill: str = "unknown", sinks: Sequence[Any] = (),
                 state_sink: Any = None, answer_wakes: bool = True) -> None:
        self.store = store or Store()
        # A wake of the kernel log's reader is answered as the live reader answers it on a log with nothing new:
        # a read to its end now (KernelLog([], drained_at=now)). False: the test steps the reads itself.
        self.answer_wakes = answer_wakes
        self.now = now
        self.pipeline = Pipeline(settings or live_settings(), self.store,
                                 resolver or WorkloadResolver(RuntimeNames(read_files=False)), now=now,
                                 accounts=accounts, single_process_oom_kill=single_process_oom_kill)
        self.published: list[Incident] = []
        self.logs: list[tuple[int, str]] = []
        self.saves: list[dict] = []
        self.wakes = 0
        self.names_asked: list[str] = []  # container cgroups whose bundles the pipeline asked to be read again
        self.fatal: Optional[str] = None
        self.done = False
        self.sinks, self.state_sink = list(sinks), state_sink
        self.spins = 0  # Ticks at a deadline that the Tick did not move on (see tick)
        self._ticked_at: Optional[float] = None  # the time of the last step, when it was a Tick

    def step(self, event: Any, now: Optional[float] = None) -> Effects:
        if now is not None:
            self.now = now
        fx = self.pipeline.step(event, self.now)
        self._ticked_at = self.now if isinstance(event, Tick) else None
        self.published += fx.publish
        self.logs += fx.logs
        self.wakes += fx.wake_kernel_log
        self.names_asked += fx.read_names
        self.fatal = self.fatal or fx.fatal
        self.done = self.done or fx.done
        for incident in fx.publish:
            for sink in self.sinks:
                sink.publish(incident)
        if fx.save is not None:
            self.saves.append(fx.save)
            if self.state_sink is not None:
                self.state_sink.flush(fx.save)
                for sink in self.sinks:
                    sink.flush(fx.save)
                self.step(StateSaved(self.state_sink.error))
        if fx.wake_kernel_log and self.answer_wakes and self.pipeline.settings.kmsg_source == "kmsg":
            self.step(KernelLog([], drained_at=self.now))
        return fx

    @classmethod
    def restarted(cls, state: dict, settings: Optional[Settings] = None, **kwargs: Any) -> "Replay":
        """A pipeline rebuilt from a state an earlier pipeline's Effects.save gave, as the agent starts after
        a SIGKILL: the store loaded from it (when it is this boot's: another boot's counters are not
        continued), the reconciler's accounts from its "accounts"."""
        settings = settings or live_settings()
        store = Store()
        accounts = None
        if state.get("boot_id") == settings.boot_id:
            store.load_state(state)
            accounts = state.get("accounts")
        return cls(settings, store=store, accounts=accounts, **kwargs)

    def run(self, events: Iterable[Any], now: Optional[float] = None) -> "Replay":
        for event in events:
            self.step(event, now)
        return self

    def advance_to(self, when: float) -> None:
        """Let time pass to `when`, stepping a Tick at every deadline the pipeline asks for on the way."""
        while True:
            deadline = self.pipeline.next_deadline()
            if deadline is None or deadline > when:
                break
            self.tick(deadline)
        self.step(Tick(), max(when, self.now))

    def settle(self, limit: float = 7 * 86400.0) -> float:
        """Let time pass until nothing is due any more (every quiet window, witness wait, settle, save and
        expiry over), at most `limit` seconds; returns the time reached. What was not published by then never
        will be without a new event."""
        end = self.now + limit
        while True:
            deadline = self.pipeline.next_deadline()
            if deadline is None:
                return self.now
            assert deadline <= end, f"still something due at {deadline} after {limit} s"
            self.tick(deadline)

    def tick(self, deadline: float) -> None:
        """A Tick at `deadline`, as the agent's loop steps it when its wait for an event times out. A deadline
        that a Tick at that very time left due would make the loop spin (it waits 0 s, steps a Tick, again):
        such Ticks are counted in `spins`, and time moves on a millisecond each, as the agent's clock would
        while it spins."""
        at = max(deadline, self.now)
        if self._ticked_at is not None and at <= self._ticked_at:
            self.spins += 1
            at = self._ticked_at + SPIN_STEP
        self.step(Tick(), at)

    def collector(self, config: Config) -> OomwatchCollector:
        """/metrics as the agent builds it on this pipeline's snapshot, over `config`'s fixture tree."""
        view = self.pipeline.view()
        fs = CgroupFS(config.cgroup_root)
        posture = NodePosture(config, Proc(config.proc))
        healthy = AgentStatus(checks={c: True for c in AGENT_CHECKS if c != "proc_connector"})  # as a running agent
        return OomwatchCollector(view, lambda: scraped_workloads(view.workloads, StatCache(fs), fs, set()),
                                 lambda: posture.info_with(view.single_process_oom_kill),
                                 cgroup_parse_errors=lambda: fs.parse_errors, agent_status=lambda: healthy,
                                 workloads=lambda: view.workloads)

    def metrics(self, config: Config) -> bytes:
        """/metrics as the agent serves it from this pipeline's snapshot, over `config`'s fixture tree."""
        return self.collector(config).exposition()
