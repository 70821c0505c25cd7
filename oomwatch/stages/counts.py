"""Counts of record: the store counts each incident once as it is published; the reconciler compares
memory.events with what the log described (what no record describes becomes an incident once the log has been
read past the counters' move); the state (store, cursor, accounts) is saved at most every SAVE_INTERVAL while
busy, and when the log goes quiet, at most every SAVE_QUIET_GAP."""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from oomwatch.events import CgroupAdded, CgroupRemoved, KernelLogEnded, StateSaved, Stop
from oomwatch.model import Incident
from oomwatch.reconcile import Reconciler, counted_incident
from oomwatch.stages import Context, CountersMoved, DeathCounted, Due, Effects, Named, Published
from oomwatch.stages.kernellog import KernelLogView

VIEWS = ("CountedKillsView",)

# State is written at most this often while incidents keep coming (more often once the log goes quiet: below).
SAVE_INTERVAL = 1.0
# ... but not more often than this when it goes quiet between kills: each save writes the whole state on the
# loop (43% of a storm's CPU an incident with a save a kill, benchmarks/stage_cost.py), and a backlog read at
# a restart publishes its incidents in a burst, each followed by a quiet log.
SAVE_QUIET_GAP = 0.2


class CountsStage:
    TAKES = (Named, CgroupAdded, CountersMoved, CgroupRemoved, DeathCounted, KernelLogEnded, StateSaved, Stop)

    def __init__(self, context: Context, log: KernelLogView, explain: Callable[[Incident], str], *, now: float,
                 accounts: Optional[dict], state_error: Optional[str]) -> None:
        self._context = context
        self._log = log
        self._explain = explain
        self._now = now
        self.reconciler = Reconciler(self._counted_incident)
        self.reconciler.load_state(accounts or {})
        self.reconciler.started(now)
        self._woken_for_settle: Optional[float] = None  # the settle time the kernel log's reader was woken for
        self._dirty = False
        self._saved_at = now
        self.state_error = state_error  # why the state is not saved (None: it is)

    def counted(self) -> "CountedKillsView":
        return CountedKillsView(self.reconciler)

    def step(self, event: Any, now: float, fx: Effects) -> list:
        self._now = now
        settings, node = self._context.settings, self._context.node
        if isinstance(event, Named):
            return self._publish(event, fx)
        if isinstance(event, CgroupAdded):
            if settings.counting and event.ino is not None and event.local is not None:
                self.reconciler.observe(event.path, event.ino, event.local, now, node.is_grouped(event.path))
        elif isinstance(event, CountersMoved):
            moved = event.moved
            if settings.counting and event.ino is not None and (moved["oom_kill"] or moved["oom_group_kill"]):
                self.reconciler.observe(event.path, event.ino, event.local, now, node.is_grouped(event.path))
        elif isinstance(event, CgroupRemoved):
            self.reconciler.removed(event.path)
        elif isinstance(event, DeathCounted):
            self._dirty = settings.persist
        elif isinstance(event, KernelLogEnded):
            if event.saved:  # (its incidents were published as the kernel-log stage took it)
                fx.logs.append((logging.INFO, "replayed the saved kernel log: "
                                              f"{len(self._context.store.snapshot().incidents)} incidents"))
                self._dirty = settings.persist
                self._saved_at = now - SAVE_INTERVAL  # saved at once
        elif isinstance(event, StateSaved):
            self._state_saved(event, fx)
        elif isinstance(event, Stop) and settings.persist:
            fx.save = self.state()
            self._dirty = False
        return []

    def _publish(self, due: Named, fx: Effects) -> list:
        published = []
        for incident in due.incidents:
            if not self._context.store.publish(incident, observe_latency=due.timed):
                continue
            self.reconciler.account(incident)
            self._dirty = self._context.settings.persist
            fx.publish.append(incident)
            fx.changed = True
            published.append(incident)
        return [Published(published)] if published else []

    def _state_saved(self, event: StateSaved, fx: Effects) -> None:
        if event.error is not None:
            self._context.store.count_state_error()
            if self.state_error is None:  # one line per change, not per save
                fx.logs.append((logging.ERROR, f"cannot write state: {event.error}; counting goes on in memory"))
        elif self.state_error is not None:
            fx.logs.append((logging.INFO, "state written again"))
        fx.changed = fx.changed or event.error != self.state_error
        self.state_error = event.error

    def advance(self, now: float, fx: Effects) -> list:
        """Reconcile once the log has been read past the counters' move, or ask for that read."""
        self._now = now
        log, reconciler = self._log, self.reconciler
        if not reconciler.pending():
            return []
        settles_at = reconciler.settles_at()
        if settles_at is not None and settles_at <= log.drained_at:
            found = reconciler.reconcile(now, log.drained_at)
            if found:
                fx.logs.append((logging.WARNING, f"{len(found)} OOM kill(s) counted by memory.events that no "
                                                 "kernel log record describes"))
                return [Due(found, log.live)]
        elif (settles_at is not None and self._context.settings.kmsg_source is not None and log.caught_up
              and log.read_started < settles_at <= now and self._woken_for_settle != settles_at):
            self._woken_for_settle = settles_at
            fx.wake_kernel_log = True  # a read (or the reader child's word) after the counters moved settles them
        return []

    def save_due(self, now: float, fx: Effects) -> None:
        """Save the state, once every stage has counted what this step did, if it changed and it is time."""
        if self._dirty and self._context.settings.persist and now >= self._saved_at + self._save_gap():
            fx.save = self.state()
            self._dirty = False
            self._saved_at = now

    def next_deadline(self) -> Optional[float]:
        times = []
        if self.reconciler.pending():
            settles_at = self.reconciler.settles_at()
            if settles_at is not None and settles_at > self._now:  # (past it: waits for the log's next read)
                times.append(settles_at)
        if self._dirty:
            times.append(self._saved_at + self._save_gap())
        return min(times, default=None)

    def _save_gap(self) -> float:
        """How long after the last save the next may be: short once the log is quiet (nothing being printed)."""
        return SAVE_QUIET_GAP if self._log.caught_up and not self._log.pending else SAVE_INTERVAL

    def state(self) -> dict[str, Any]:
        """The state file's content: the store, the cursor and the reconciler's accounts."""
        settings, store = self._context.settings, self._context.store
        kind = "file" if settings.saved_log else (settings.kmsg_source or "kmsg")
        store.set_cursor(settings.boot_id, self._log.cursor(), kind)
        state = store.to_state()
        state["accounts"] = self.reconciler.to_state()
        return state

    def _counted_incident(self, **kw) -> Incident:
        resolver = self._context.resolver
        return counted_incident(boot_id=self._context.settings.boot_id, detected_at=self._now,
                                resolve=resolver.resolve, scope_of=resolver.layout.scope_of, explain=self._explain,
                                **kw)


class CountedKillsView:
    """What memory.events counted that no published incident describes yet, read-only (for the kernel-log stage:
    an incident whose lines are all counted is complete)."""

    __slots__ = ("_reconciler",)

    def __init__(self, reconciler: Reconciler) -> None:
        self._reconciler = reconciler

    def unaccounted_kills(self, cgroup: str) -> int:
        return self._reconciler.unaccounted_kills(cgroup)

    def accounted_group_kills(self, cgroup: str) -> Optional[int]:
        return self._reconciler.accounted_group_kills(cgroup)

    def counts(self, cgroup: str) -> bool:
        """Whether `cgroup`'s memory.events has been read: the kernel counts each kill there before its line."""
        return cgroup in self._reconciler.accounts
