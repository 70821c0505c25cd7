"""Replaying recorded events through the pipeline, as the agent's loop does, without a thread or a sleep.

Events come from the real sources pointed at fixtures (a fixture cgroup tree read by sources.cgroupsource, a
kernel-log capture read by sources.kmsg) or are written out by the test in the order a real run delivered them
(the storm tier's logs show that order). Time is whatever the test says: each step takes its `now`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Optional

from oomwatch.config import Config
from oomwatch.events import CgroupAdded, KernelLog, KernelLogEnded, Tick
from oomwatch.model import Incident, KmsgRecord
from oomwatch.node import NodePosture, scraped_workloads
from oomwatch.parse.kmsg import parse_kmsg_record
from oomwatch.pipeline import Effects, Pipeline, Settings
from oomwatch.sinks.collector import OomwatchCollector
from oomwatch.sources.cgroupfs import CgroupFS, Proc
from oomwatch.sources.cgroupsource import CgroupSource
from oomwatch.sources.kmsg import read_saved_log
from oomwatch.sources.statcache import StatCache
from oomwatch.store import Store
from oomwatch.workloads import WorkloadResolver
from oomwatch.workloads.runtime import RuntimeNames

BOOT_ID = "replay-boot"


def tree_events(cgroup_root: Path, run_root: Optional[Path] = None,
                pod_log_dir: Optional[Path] = None) -> list[CgroupAdded]:
    """What the cgroup source emits for a tree at start: one CgroupAdded per cgroup, parents first."""
    events: list[Any] = []
    names = RuntimeNames(run_root=str(run_root or "/nonexistent"), pod_log_root=str(pod_log_dir or "/nonexistent"))
    source = CgroupSource(CgroupFS(str(cgroup_root)), WorkloadResolver(names), events.append)
    source.start()
    return events


def saved_log_events(path: Path) -> list[Any]:
    """A saved kernel log as the kernel-log source replays it: its items, then its end."""
    return [KernelLog(list(read_saved_log(str(path))), drained_at=0.0), KernelLogEnded(saved=True)]


def kmsg_records(raw: Iterable[bytes]) -> list[KmsgRecord]:
    """Raw /dev/kmsg records (tests/conftest.raw_records) as the live reader yields them."""
    return [parse_kmsg_record(r) for r in raw]


def live_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = dict(boot_id=BOOT_ID, boot_time=0.0, kmsg_source="kmsg", counting=True, quiet=0.25,
                                  witness_wait=0.0, persist=True)
    values.update(overrides)
    return Settings(**values)


class Replay:
    """A pipeline and everything its steps asked for, gathered."""

    def __init__(self, settings: Optional[Settings] = None, *, now: float = 0.0, store: Optional[Store] = None,
                 resolver: Optional[WorkloadResolver] = None, accounts: Optional[dict] = None,
                 single_process_oom_kill: str = "unknown") -> None:
        self.store = store or Store()
        self.now = now
        self.pipeline = Pipeline(settings or live_settings(), self.store,
                                 resolver or WorkloadResolver(RuntimeNames(read_files=False)), now=now,
                                 accounts=accounts, single_process_oom_kill=single_process_oom_kill)
        self.published: list[Incident] = []
        self.logs: list[tuple[int, str]] = []
        self.saves: list[dict] = []
        self.wakes = 0
        self.done = False

    def step(self, event: Any, now: Optional[float] = None) -> Effects:
        if now is not None:
            self.now = now
        fx = self.pipeline.step(event, self.now)
        self.published += fx.publish
        self.logs += fx.logs
        self.wakes += fx.wake_kernel_log
        self.done = self.done or fx.done
        if fx.save is not None:
            self.saves.append(fx.save)
        return fx

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
            self.step(Tick(), max(deadline, self.now))
        self.step(Tick(), when)

    def metrics(self, config: Config) -> bytes:
        """/metrics as the agent serves it from this pipeline's snapshot, over `config`'s fixture tree."""
        view = self.pipeline.view()
        fs = CgroupFS(config.cgroup_root)
        posture = NodePosture(config, Proc(config.proc))
        collector = OomwatchCollector(view, lambda: scraped_workloads(view.workloads, StatCache(fs), fs, set()),
                                      lambda: posture.info_with(view.single_process_oom_kill),
                                      cgroup_parse_errors=lambda: fs.parse_errors)
        return collector.exposition()
