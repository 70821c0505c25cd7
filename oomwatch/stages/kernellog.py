"""Kernel log → incidents: the correlator turns records into incidents, the witness queue holds group kills for
their exits, the memory readings stand in for lost stats blocks; this stage knows how far the log has been read
(`drained_at`, `read_started`), when what is being printed is complete (a quiet log, or the counters:
`_counted_incomplete`), and where the cursor is. Others see it only through `KernelLogView`."""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Callable, NamedTuple, Optional, Protocol

from oomwatch.correlator import Correlator
from oomwatch.events import (CgroupAdded, CgroupChanged, CgroupRemoved, KernelLog, KernelLogEnded, MemoryStatRead,
                             Stop)
from oomwatch.memreadings import MemoryReadings
from oomwatch.model import Garbled, Incident, KmsgRecord, Lost, Skipped
from oomwatch.stages import Context, Due, Effects, SigKilled
from oomwatch.witness import WitnessQueue

VIEWS = ("KernelLogView",)

# A group kill complete by the counters still waits this long for the proc connector's exits of its unlogged
# members: each process reports its exit just after it leaves its cgroup (the kernel's do_exit), so the last of
# them can reach the loop just after the cgroup source saw the group empty.
EXITS_AFTER_EMPTY = 0.05
EMPTIED_KEPT = 4096  # cgroups seen empty, or their pids, remembered (a removed cgroup's lines can come after it)


class CountedKills(Protocol):
    """What memory.events counted and no published incident describes yet (the counts stage's view)."""

    def unaccounted_kills(self, cgroup: str) -> int: ...

    def accounted_group_kills(self, cgroup: str) -> Optional[int]: ...

    def counts(self, cgroup: str) -> bool: ...


class PidsReading(NamedTuple):
    """A cgroup's pids as read while it held some."""

    group_kills: int  # its oom_group_kill, read just before the pids
    pids: frozenset[int]
    at: float  # when they were read
    pids_before: frozenset[int]  # the reading before's (a process a kill took down may be gone from this one)


class KernelLogStage:
    TAKES = (KernelLog, KernelLogEnded, MemoryStatRead, CgroupAdded, CgroupChanged, CgroupRemoved, SigKilled, Stop)

    def __init__(self, context: Context, explain: Callable[[Incident], str], now: float) -> None:
        self._context = context
        settings, resolver = context.settings, context.resolver
        self._now = now
        live = settings.kmsg_source is not None
        # memory.stat readings for kills whose report lost its stats block (kept only with a live kernel log:
        # only its reads can order them before a kill)
        self.readings = MemoryReadings()
        self.correlator = Correlator(boot_id=settings.boot_id, boot_time=settings.boot_time,
                                     resolve_workload=resolver.resolve, scope_of=resolver.layout.scope_of,
                                     explain=explain, view=context.node, detected_clock=lambda: self._now,
                                     live=live, page_size=settings.page_size, memory_reading=self.readings.before,
                                     tmpfs_mounts=resolver.tmpfs_mounts)
        self.witness = WitnessQueue(explain=explain, wait=settings.witness_wait if live else 0.0)
        self._counted: Optional[CountedKills] = None
        self._skip_upto = settings.skip_upto
        self._last_record = now
        self._caught_up = False
        self._read_started = 0.0  # the last KernelLog's drained_at: the log is read to its end up to then
        self._reads = 0
        self._drained_at = 0.0  # the log was last read to its end with everything published at this time
        self._live = False  # the backlog already in the ring at start is not timed
        # Cgroups seen with no process left: path → (its oom_group_kill as read just before its pids, or None when
        # it was removed; when: once its pids were read, else the loop's time). A group kill whose group is empty
        # has printed its whole listing.
        self._emptied: OrderedDict[str, tuple[Optional[int], float]] = OrderedDict()
        # Each cgroup's pids as last read while it held some
        self._pids_seen: OrderedDict[str, PidsReading] = OrderedDict()

    def counted_by(self, counted: CountedKills) -> None:
        """The counts stage's read-only view (given after both exist: each waits on the other)."""
        self._counted = counted

    def view(self) -> "KernelLogView":
        return KernelLogView(self)

    def step(self, event: Any, now: float, fx: Effects) -> list:
        self._now = now
        if isinstance(event, KernelLog):
            self._kernel_log(event, fx)
        elif isinstance(event, KernelLogEnded):
            if event.saved:  # a saved log read to its end: everything in it is complete
                self.witness.add(self.correlator.flush(), now)
                return [Due(self.witness.due(now, everything=True), self._live)]
            if event.error:
                fx.fatal = event.error
        elif isinstance(event, MemoryStatRead):
            if self._context.settings.kmsg_source is not None:
                self.readings.add(event.path, event.taken, event.stat)
        elif isinstance(event, CgroupAdded):
            self.readings.added(event.path)
            if event.pids and event.local is not None and "oom_group_kill" in event.local:
                _remember(self._pids_seen, event.path,
                          PidsReading(event.local["oom_group_kill"], frozenset(event.pids), now, frozenset()))
        elif isinstance(event, CgroupChanged):
            self._changed(event, now, fx)
        elif isinstance(event, CgroupRemoved):
            self.readings.removed(event.path)  # (kept a while: the kill's lines can come after the removal)
            self._emptied_at(event.path, None, now, fx)
        elif isinstance(event, SigKilled):
            self.witness.exited(event.pid, event.cgroup, event.time)
        elif isinstance(event, Stop):
            # Incidents finished but held back are complete: publish them. One still being printed is left to
            # the next start, which re-reads the log from its first record (the cursor stops before it).
            self.witness.add(self.correlator.release_finished(), now)
            return [Due(self.witness.due(now, everything=True), self._live)]
        return []

    def _kernel_log(self, event: KernelLog, fx: Effects) -> None:
        store = self._context.store
        self.correlator.batch = self.readings.batch_started()  # readings the last read covers precede its kills
        items = self._after_cursor(event.items)
        for item in items:
            try:
                self._kernel_item(item, fx)
            except Exception as exc:  # one bad record must not stop the reading: count it, say it, go on
                store.count_kmsg(parse_errors=1)
                fx.logs.append((logging.ERROR, f"kernel log: cannot process record {item!r:.300}: {exc!r}; "
                                               "skipped"))
        if items:
            self._last_record = self._now
            fx.changed = True  # (the records counted)
        self._caught_up = event.drained_at is not None
        self.readings.batch_ended(event.drained_at if self._context.settings.kmsg_source is not None else None)
        if event.drained_at is not None:
            self._read_started = event.drained_at
            self._reads += 1

    def _kernel_item(self, item: Any, fx: Effects) -> None:
        store = self._context.store
        if isinstance(item, KmsgRecord):
            stats = self.correlator.stats
            errors_before, rejected_before = stats.parse_errors, stats.rejected
            out = self.correlator.feed(item)
            store.count_kmsg(records=1, parse_errors=stats.parse_errors - errors_before,
                             rejected=stats.rejected - rejected_before)
            if stats.rejected > rejected_before:
                fx.logs.append((logging.WARNING, f"kernel log: rejected an OOM line from syslog facility "
                                                 f"{item.priority >> 3}, not the kernel (written to /dev/kmsg by a "
                                                 f"process?): {item.text:.200}"))
            for incident in out:  # finished by the next report's first line: its exits, as the counters' own
                self.witness.add([incident], self._now, self._exits_wait(incident))
        elif isinstance(item, Skipped):  # with its `part`: a report's memory part, as the reader kept it
            self.correlator.skipped(item.count, item.last_seq, item.part)
            store.count_kmsg(records=item.count)
        elif isinstance(item, Lost):
            self.correlator.lost(item.count or 0)
            store.count_kmsg(lost=item.count or 0)
            fx.logs.append((logging.WARNING, f"kernel log: {item.count or 'some'} records lost before they could "
                                             "be read (the kernel's memory.events still count their kills)"))
        elif isinstance(item, Garbled):
            store.count_kmsg(parse_errors=1)

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

    def advance(self, now: float, fx: Effects) -> list:
        """Complete quiet (or fully counted) incidents, hand on what is due, say how far the log is drained."""
        self._now = now
        correlator, out = self.correlator, []
        if correlator.pending and self._caught_up:
            # Complete when every line is counted and every listing whole, or when the log has been quiet long
            # enough; either way a group kill waits for its exits only while its group's readings leave a process
            # unaccounted for (one the quiet completed waited the whole witness wait, whatever its readings said)
            why_not = self._counted_incomplete()
            if why_not is None or now >= self._last_record + self._quiet():
                if why_not is not None:  # (why it took the quiet log: `--log-level debug`)
                    fx.logs.append((logging.DEBUG, f"kernel log: complete after {self._quiet()} s of quiet log, "
                                                   f"not by the counters: {why_not}"))
                for incident in correlator.flush():
                    self.witness.add([incident], now, self._exits_wait(incident))
        if self.witness.next_due() is not None:
            out.append(Due(self.witness.due(now), self._live))
        if self._caught_up and not correlator.pending and not len(self.witness):
            # Read up to when its reader last found the log at its end (KernelLog.drained_at: the reader child's
            # own time for /dev/kmsg, which can lag behind a storm by more than a second; when its last read
            # began for syslog(2)), never up to now: a kill whose lines are still in the reader is not a kill
            # without lines (the 50x4 storm of 2026-11-26 14:32 counted one twice so).
            self._drained_at = min(now, self._read_started)
            if not self._live and self._reads > 0:  # past the backlog: /healthz may say ready (the view changed)
                self._live = fx.changed = True
        return out

    def next_deadline(self) -> Optional[float]:
        """Never a time a Tick would leave due: while still reading, the next batch moves it."""
        due = self.witness.next_due()
        if self.correlator.pending and self._caught_up:
            quiet_at = self._last_record + self._quiet()
            return quiet_at if due is None else min(due, quiet_at)
        return due

    def _quiet(self) -> float:
        """How long the log must be quiet before what is being printed is taken as complete: longer while a group
        listing is open, or while memory.events has counted kills in its cgroups whose lines have not come (the
        counters move before the kernel prints each line, and the log's reader can lag behind them)."""
        settings = self._context.settings
        if self.correlator.listing or self._lines_owed():
            return max(settings.quiet, settings.quiet_listing)
        return settings.quiet

    def _counted_incomplete(self) -> Optional[str]:
        """Issue 30: what is being printed is complete once memory.events counts no more kills in its cgroups than
        its lines (the kernel counts each kill in oom_kill before it prints its line), every line's cgroup known
        and read, and, for a group kill, once a reading of its group says the listing is whole (`_group_done`). A
        group kill's lines cannot say so alone: the kernel counts oom_group_kill and each member's oom_kill as it
        goes, so counters read mid-listing equal the lines read so far (the real-kernel tier's pool scenario had a
        listing split so). What no counter describes (a cgroup not watched, a pasted log) waits for the quiet
        window. Returns why not (None: complete)."""
        if not self._context.settings.counting or self._counted is None:
            return "no counters"
        node = self._context.node
        groups = self.correlator.unpublished_groups(lambda cgroup: node.oom_group_cgroup(cgroup, None))
        lines, counted = self.correlator.unpublished_lines(), self._counted
        if groups is None or not lines:
            return "a line's cgroup, or its group's, is not known" if lines else "no kill line in a known cgroup"
        # A line in a cgroup whose memory.events is read was counted there before it was printed: nothing is owed
        # unless the counter shows more kills than lines (a read of the counter lagging behind the log owes none;
        # the real-kernel tier's calm single kills waited 24-225 ms for it).
        for cgroup, n in lines.items():
            if not counted.counts(cgroup):
                return f"{cgroup}: memory.events not read"
            if counted.unaccounted_kills(cgroup) > n:
                return f"{cgroup}: memory.events counts {counted.unaccounted_kills(cgroup)} kills, the lines {n}"
        for group, (kills, named) in groups.items():
            if not self._group_done(group, kills, named):
                seen, emptied = self._pids_seen.get(group), self._emptied.get(group)
                pids = f"pids {sorted(seen.pids)} at oom_group_kill {seen.group_kills}" if seen else "no pids"
                empty = ("not seen empty" if emptied is None else
                         f"seen empty, the log read {'since' if self._read_started >= emptied[1] else 'before'}")
                return (f"{group}: no reading after its kill says its listing is whole (last read: {pids}; the "
                        f"lines name {sorted(named)}; {empty})")
        return None

    def _group_done(self, group: str, kills: int, named: set) -> bool:
        """The group's listing is all printed and read, by a reading of the group's pids taken after the kernel
        counted these `kills` in its oom_group_kill (read just before the pids; the kernel counts a group kill
        before it lists the group), when either
        - every process the group held then is named by the lines (killed or exiting) or died by SIGKILL: the
          kernel lists the processes the group holds, so none is left to list;
        - or it held none (or the cgroup is removed), and the log was read to its end after that reading: nothing
          is left to kill, and each member's line is printed before it can exit."""
        seen = self._pids_seen.get(group)
        if (seen is not None and self._after_the_kills(group, kills, seen.group_kills)
                and not self.witness.unaccounted(seen.pids, named, seen.at)):
            return True
        emptied = self._emptied.get(group)
        return (emptied is not None and self._after_the_kills(group, kills, emptied[0])
                and self._read_started >= emptied[1])

    def _after_the_kills(self, group: str, kills: int, group_kills: Optional[int]) -> bool:
        """Whether a reading of `group` whose oom_group_kill was `group_kills` (None: the cgroup is removed) counted
        `kills` group kills beyond those already published."""
        if group_kills is None:
            return True
        accounted = self._counted.accounted_group_kills(group) if self._counted is not None else None
        return accounted is not None and group_kills - accounted >= kills

    def _exits_wait(self, incident: Incident) -> float:
        """How long a group kill, complete by the counters or finished by the next report, waits for the proc
        connector's exits: not at all when a reading of its group counted the kill (its pids, or none left) and
        every process the group held in its last two readings (one before the kill, as a rule: a process the kill
        took down unlogged may be gone from the one after) has its kill line or its exit already; else briefly once
        its group is seen empty (their exits are all but in), and until then up to the witness wait. Asked again at
        each new reading of the group while it waits (WitnessQueue.shorten)."""
        group = incident.group_cgroup or ""
        seen, emptied = self._pids_seen.get(group), self._emptied.get(group)
        gone = emptied is not None and self._after_the_kills(group, 1, emptied[0])
        named = {p.pid for p in incident.killed} | {note["pid"] for note in incident.exiting}
        if (seen is not None and (gone or self._after_the_kills(group, 1, seen.group_kills))
                and not self.witness.unaccounted(seen.pids | seen.pids_before, named, incident.time)):
            return 0.0
        return min(self.witness.wait, EXITS_AFTER_EMPTY) if gone else self.witness.wait

    def _changed(self, event: CgroupChanged, now: float, fx: Effects) -> None:
        if event.pids is None:
            return
        # Its pids from when they were read (the loop can take the event well after), on the reader's clock
        at = now if event.pids_read_at is None else min(now, event.pids_read_at)
        group_kills = None if event.local is None else event.local.get("oom_group_kill")
        if any(event.pids.values()):
            self._emptied.pop(event.path, None)
            if group_kills is not None:  # (5.17+: an older kernel's group kills wait for the quiet log)
                pids = frozenset(pid for pids in event.pids.values() for pid in pids)
                before = self._pids_seen.get(event.path)
                _remember(self._pids_seen, event.path,
                          PidsReading(group_kills, pids, at, before.pids if before else frozenset()))
                if len(self.witness):  # a group kill waiting for its exits may wait no longer: all are named
                    self.witness.shorten(event.path, self._now, self._exits_wait)
        elif group_kills is not None:
            self._emptied_at(event.path, group_kills, at, fx)

    def _emptied_at(self, path: str, group_kills: Optional[int], at: float, fx: Effects) -> None:
        _remember(self._emptied, path, (group_kills, at))
        # Group kills complete before their group was empty (by a reading after a kill): its exits are all but in
        if len(self.witness) and self._after_the_kills(path, 1, group_kills):
            self.witness.shorten(path, self._now, self._exits_wait)
        if self.correlator.pending and self._read_started < at:
            fx.wake_kernel_log = True  # a read that ends after this settles a group kill waiting for it

    def _lines_owed(self) -> bool:
        if self._counted is None:
            return False
        unaccounted = self._counted.unaccounted_kills
        return any(unaccounted(cgroup) > lines for cgroup, lines in self.correlator.unpublished_lines().items())

    def cursor(self) -> Optional[int]:
        """The last record fully published: a restart reads from the first record of anything pending."""
        pending = [s for s in (self.correlator.pending_since_seq, self.witness.pending_since_seq())
                   if s is not None]
        cursor = min(pending) - 1 if pending else self.correlator.last_seq
        if cursor is None and self._context.store.cursor_seq is not None:
            cursor = self._context.store.cursor_seq
        return cursor


def _remember(kept: OrderedDict, path: str, value: Any) -> None:
    """Keep `value` for the cgroup, the last EMPTIED_KEPT cgroups only."""
    kept[path] = value
    kept.move_to_end(path)
    while len(kept) > EMPTIED_KEPT:
        kept.popitem(last=False)


class KernelLogView:
    """How far the kernel log has been read, read-only, for the stages that wait on it (counts, deaths)."""

    __slots__ = ("_stage",)

    def __init__(self, stage: KernelLogStage) -> None:
        self._stage = stage

    @property
    def caught_up(self) -> bool:
        """The last batch ended with the log read to its end."""
        return self._stage._caught_up

    @property
    def read_started(self) -> float:
        """The last KernelLog's drained_at: every record printed up to then has been read."""
        return self._stage._read_started

    @property
    def drained_at(self) -> float:
        """The log was last read to its end with everything it described published at this time."""
        return self._stage._drained_at

    @property
    def live(self) -> bool:
        """Past the backlog found at start: publications are timed."""
        return self._stage._live

    @property
    def pending(self) -> bool:
        """An incident is still being printed."""
        return bool(self._stage.correlator.pending)

    def busy(self) -> bool:
        """The kernel log is describing a kill (an incident open, or a group kill waiting for its exits)."""
        return bool(self._stage.correlator.pending or len(self._stage.witness))

    def cursor(self) -> Optional[int]:
        return self._stage.cursor()
