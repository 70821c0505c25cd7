"""A kernel log read whole through the agent's own pipeline (issue 33: one engine). `oomwatch inspect` and every
other one-shot reader of a log (a pasted one, the ring of this node's /dev/kmsg) hand its items here, so that the
same records can never give one answer live and another pasted: the correlator, the witness queue, the memory
readings, the holders and the explanation are the ones the agent runs, with the settings of a saved log (no
waits for live witnesses, nothing read from the node but what the caller hands in as events).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

from oomwatch.events import KernelLog, KernelLogEnded
from oomwatch.model import Incident
from oomwatch.pipeline import Pipeline, Settings
from oomwatch.store import Store
from oomwatch.workloads import WorkloadResolver

REPLAY_BATCH = 512  # items handed to the pipeline at a time (what the agent's saved-log source hands)


def saved_log_settings(*, boot_id: str, boot_time: float, page_size: Optional[int] = None) -> Settings:
    """A log read once to its end: no live reader (no waits for witnesses, no memory readings, no counting
    from memory.events), each incident complete once the log has ended. `page_size`: the task tables' page
    size where the log is this host's own; None: told from each report."""
    return Settings(boot_id=boot_id, boot_time=boot_time, kmsg_source=None, counting=False, saved_log=True,
                    page_size=page_size)


class LogReplay:
    """Steps a pipeline through node events (the cgroups the caller found, as `events.CgroupAdded`), then a
    log's items, then its end; every incident published goes to `on_incident` in the order the agent would
    publish it. `pipeline` stays readable afterwards (its correlator's stats: what was read and understood)."""

    def __init__(self, settings: Settings, resolver: WorkloadResolver, *, now: float,
                 on_incident: Callable[[Incident], None], single_process_oom_kill: str = "unknown") -> None:
        # max_incidents=1: what is published streams out; the store keeps keys (no kill twice) and counters
        self.pipeline = Pipeline(settings, Store(max_incidents=1, clock=lambda: now), resolver, now=now,
                                 single_process_oom_kill=single_process_oom_kill)
        self._now = now
        self._on_incident = on_incident

    def step(self, event: Any) -> None:
        for incident in self.pipeline.step(event, self._now).publish:
            self._on_incident(incident)

    def run(self, node_events: Iterable[Any], items: Iterable[Any]) -> None:
        for event in node_events:
            self.step(event)
        batch: list = []
        for item in items:
            batch.append(item)
            if len(batch) >= REPLAY_BATCH:
                self.step(KernelLog(batch))
                batch = []
        self.step(KernelLog(batch, drained_at=self._now))
        self.step(KernelLogEnded(saved=True))
