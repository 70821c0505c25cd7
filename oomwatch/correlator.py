"""Kernel OOM records (+ what we know of cgroups) → `Incident`s. A pure state machine: no I/O, no clock.

The kernel prints one OOM invocation as: header (`invoked oom-killer`, stack, meminfo, task table) →
`oom-kill:` summary → the victim's `Killed process` → for a group kill `Tasks in <cg> … memory.oom.group set`
and one `Killed process` per process of that cgroup (the victim again among them). Under load the header and
summary are ratelimited away (burst 10 per 5 s) but kill and `Tasks in` lines never are, so boundaries are
found from the kill lines themselves:
- a `Killed process` after a finished single kill starts a new incident;
- inside a group listing, a pid already listed is the victim's reprint, and a pid whose cgroup is known to lie
  outside the group cgroup starts a new incident;
- a second `Tasks in` line means the kill line just before it was the next incident's victim.

A finished incident is held back until the next invocation kills (its first `Killed process` line) or the caller
flushes (the log went quiet), because a later invocation may report `OOM victim P … is already exiting` for a
process that died with it, and prints that instead of killing. (Holding it until the next incident finished
doubled the detection latency in a storm, where invocations come a second or more apart.)

Lines can be lost (the ring buffer wraps under a storm or while the agent is down), so the kind never rests on
one line alone: a victim printed twice is a group kill (the kernel reprints it only inside a group listing),
and where the `Tasks in` line is missing, the `memory.oom.group` of the victim's cgroup and its ancestors (as
the node view last read it) names the group cgroup. What the correlator knows of the node comes from a
read-only `NodeView`; it never calls back into live state. The kernel's `memory.events` counters, not the log,
are the count of record: `oomwatch.reconcile` adds the kills no line describes.

Only the kernel may report a kill: an OOM line from another syslog facility (anyone who can write to
/dev/kmsg produces facility `user`) is counted as rejected and ignored.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Protocol, Sequence

from oomwatch.model import (
    STAT_KEYS_USED,
    Incident,
    KilledProcess,
    KmsgRecord,
    OomAlreadyExiting,
    OomGroup,
    OomInvoked,
    OomKilled,
    OomMemcgUsage,
    OomSelected,
    OomStackTask,
    OomSummary,
    OomSuppressed,
    Workload,
)
from oomwatch.holders import advice_for, held_memory
from oomwatch.parse.memstat import first_report, part_report
from oomwatch.parse.oom import OomReaped, parse_oom_line
from oomwatch.parse.prefilter import REPORT_RECORDS_MAX

# Lines that should have parsed as OOM lines: when they do not, the kernel format changed under us.
_OOM_MARKERS = ("Killed process", "oom-kill:", "invoked oom-killer", "memory.oom.group set", "OOM victim")
KERNEL_FACILITY = 0  # syslog facility of records the kernel itself printed (priority >> 3)
# Processes an incident lists at most (the victim first, in the kernel's order); how many died, and where, stays
# exact beside the list. A pod can fork thousands and memory.oom.group kills them all: an incident of 3,000
# processes was 0.8 MB of JSON, and sixty of them overflowed the state file.
MAX_KILLED_LISTED = 100
# A memory.stat reading older than this at the kill (the cgroup was at its limit then, not since: memory.stat is
# read while `max` moves) says little of what held the memory when it was killed: the breakdown is null instead.
MAX_READING_AGE = 10.0


class NodeView(Protocol):
    """What the correlator may ask about the node: read-only, answered from what the agent last saw.
    `at` is the kill's time (kernel time as epoch seconds): hints are dated by the kernel's clock, so a
    backlog does not make them stale."""

    def cgroup_of_pid(self, pid: int) -> Optional[str]: ...

    def oom_group_cgroup(self, cgroup: str, within: Optional[str]) -> Optional[str]: ...

    def oom_cgroup_hint(self, victim_cgroup: Optional[str], at: float) -> Optional[str]: ...

    def victim_cgroup_hint(self, oom_cgroup: Optional[str], at: float) -> Optional[str]: ...


class BlindView:
    """A view that knows nothing (a saved log from another node, or tests): only the kernel's lines count."""

    def cgroup_of_pid(self, pid: int) -> Optional[str]:
        return None

    def oom_group_cgroup(self, cgroup: str, within: Optional[str]) -> Optional[str]:
        return None

    def oom_cgroup_hint(self, victim_cgroup: Optional[str], at: float) -> Optional[str]:
        return None

    def victim_cgroup_hint(self, oom_cgroup: Optional[str], at: float) -> Optional[str]:
        return None


def _set(incident: Incident, name: str, value) -> None:
    """Complete a frozen Incident the correlator has just made and not yet handed out (dataclasses.replace, a
    copy, cost a fifth of a storm's processing)."""
    object.__setattr__(incident, name, value)


def oom_group_ancestor(cgroup: str, within: Optional[str], grouped: Callable[[str], bool]) -> Optional[str]:
    """The highest cgroup from `cgroup` up to `within` (or up to the root, excluded) for which `grouped` says
    memory.oom.group=1: the one the kernel kills whole (mm/memcontrol.c)."""
    found = None
    path = cgroup
    while path and path != "/":
        if grouped(path):
            found = path
        if within is not None and path == within:
            break
        path = path.rsplit("/", 1)[0] or "/"
    return found


def is_within(path: Optional[str], ancestor: str) -> bool:
    """Whether cgroup `path` is `ancestor` or below it."""
    if path is None:
        return False
    if ancestor == "/":
        return True
    return path == ancestor or path.startswith(ancestor.rstrip("/") + "/")


# A saved log's kill line repeated whole this soon after the first is the same kill (see Correlator._repeated)
REPEAT_SECONDS = 5.0

@dataclass
class _Kill:
    line: OomKilled
    seq: Optional[int]
    time: float
    cgroup: Optional[str]  # as known when the line arrived (the process may be gone a moment later)
    batch: int = 0  # the kernel-log batch its line came in (Correlator.batch): what memory.stat may precede it
    from_reaper: bool = False  # known only from an `oom_reaper:` line: its kill line is missing
    timed: bool = True  # its record carried a time (a pasted line without a timestamp does not)


@dataclass
class _Builder:
    first_seq: Optional[int]
    invoked: Optional[OomInvoked] = None
    stack_task: Optional[OomStackTask] = None
    usage: Optional[OomMemcgUsage] = None
    summary: Optional[OomSummary] = None
    summary_seq: Optional[int] = None
    selected: Optional[OomSelected] = None
    group: Optional[str] = None
    group_inferred: bool = False  # no `Tasks in` line: the group cgroup comes from memory.oom.group
    kills: list[_Kill] = field(default_factory=list)
    pid_set: set[int] = field(default_factory=set)  # kept with `kills`: a listing of n stays O(n)
    reprints: int = 0  # `Killed process` lines for a pid already listed (the kernel counts them in oom_kill)
    exiting: list[dict] = field(default_factory=list)
    last_was_new_kill: bool = False
    partial: bool = False  # began right after lost records: its first lines (the victim's) may be gone
    # The texts of a full report's records from its `invoked oom-killer` line to its summary that are no OOM
    # line: its stats block and task table among them (what held the memory). None: no such line came.
    memory_texts: Optional[list[str]] = None
    memory_part: Optional[bytes] = None  # the same as the live reader keeps them (oomwatch.model.Skipped's `part`)

    def add(self, kill: _Kill) -> None:
        self.kills.append(kill)
        self.pid_set.add(kill.line.pid)

    def pop(self) -> _Kill:
        kill = self.kills.pop()
        self.pid_set.discard(kill.line.pid)
        return kill


@dataclass
class CorrelatorStats:
    records: int = 0
    parse_errors: int = 0
    lost: int = 0
    suppressed_reports: int = 0  # headers/summaries the kernel's ratelimit hid (`N callbacks suppressed`)
    invocations_without_kill: int = 0
    rejected: int = 0  # OOM lines from a facility other than the kernel's (forged through /dev/kmsg)
    late_reprints: int = 0  # a group kill's victim reprinted after its incident was complete
    kills_from_reaper: int = 0  # kills known only from an `oom_reaper:` line (their kill line is missing)
    repeated_lines: int = 0  # a saved log's kill lines that repeat an earlier one whole (a paste quoting twice)
    first_rejected: Optional[str] = None
    first_parse_error: Optional[str] = None  # the first line with OOM words that could not be read


IncidentFactory = Callable[..., Incident]


class Correlator:
    """Feed records in kernel order; receive finished incidents.

    `view` answers what the agent knows of the node (see NodeView); `resolve_workload`, `scope_of` and
    `explain` finish the incident. Each incident's `kill_lines` counts its `Killed process` lines per cgroup,
    reprints included, as the kernel's memory.events `oom_kill` counts them."""

    def __init__(
        self,
        *,
        boot_id: str,
        boot_time: float,
        resolve_workload: Callable[[str], Workload],
        scope_of: Callable[[Optional[str], Optional[str], str], str],
        explain: Callable[[Incident], str],
        view: Optional[NodeView] = None,
        detected_clock: Callable[[], float] = lambda: 0.0,
        live: bool = True,
        page_size: Optional[int] = None,
        memory_reading: Callable[[str, int], Optional[Any]] = lambda cgroup, batch: None,
        tmpfs_mounts: Callable[[Workload], Sequence[str]] = lambda workload: (),
    ) -> None:
        self._tmpfs_mounts = tmpfs_mounts  # the victim container's tmpfs volumes, named by a shmem verdict
        self.boot_id = boot_id
        self.boot_time = boot_time
        self._resolve_workload = resolve_workload
        self._scope_of = scope_of
        self._explain = explain
        self._view: NodeView = view or BlindView()
        self._detected_clock = detected_clock
        self._live = live  # records from the live kernel log (a saved log's incidents carry no latency)
        self._page_size = page_size  # of the task table's pages: this host's; None: told from the report
        # memory.stat of a cgroup known to precede the kills of a batch (oomwatch.memreadings: .taken, .stat),
        # for reports whose stats block was ratelimited or lost; `batch` is set by the caller per log read.
        self._memory_reading = memory_reading
        self.batch = 0
        self._open: Optional[_Builder] = None
        self._held: Optional[Incident] = None
        self._held_first_seq: Optional[int] = None
        self._out: list[Incident] = []
        self.stats = CorrelatorStats()
        self.last_seq: Optional[int] = None
        self._gap = False  # records were lost since the last report began
        # A saved log's lines of a report's memory part with no report begun (a paste that starts inside a report:
        # its task table or stats block without the `invoked oom-killer` line): the next report that begins
        # without that line takes them. A live log's reports always begin with it (or lose their table with it).
        self._orphan_texts: deque[str] = deque(maxlen=REPORT_RECORDS_MAX)
        self._last_lines: dict[int, tuple[OomKilled, float]] = {}  # a saved log's last kill line of each pid
        self._last_group_victim: Optional[int] = None  # the victim of the last group kill, until it is reprinted
        # Pids of the last kill lines: an `oom_reaper:` line for one of them is no news (for another, it is a kill
        # whose line is missing).
        self._recent_order: deque[int] = deque(maxlen=4096)
        self._recent_killed: set[int] = set()
        # `oom-kill:` summaries not yet matched to their victim's kill line, by pid: two reports whose lines
        # interleave (two CPUs, or a paste that merged logs) each find their own summary.
        self._summaries: dict[int, tuple[OomSummary, Optional[int]]] = {}

    # --- input -------------------------------------------------------------------------------------

    def feed(self, record: KmsgRecord) -> list[Incident]:
        """One record; returns the incidents this record completed (usually none)."""
        self.stats.records += 1
        if record.seq is not None:
            self.last_seq = record.seq
        text = record.text
        if not text:
            return self._drain()  # the reader's pre-filter found no OOM words in it
        if text[0] == "[" and not any(marker in text for marker in _OOM_MARKERS):
            self._memory_text(record)  # a task table's row (most of a report's memory part): no OOM line
            return self._drain()
        line = parse_oom_line(text)
        if line is None:
            if any(marker in record.text for marker in _OOM_MARKERS):
                self.stats.parse_errors += 1
                if self.stats.first_parse_error is None:
                    self.stats.first_parse_error = record.text[:200]
            else:
                self._memory_text(record)
            return self._drain()
        if record.priority >> 3 != KERNEL_FACILITY:
            self.stats.rejected += 1
            if self.stats.first_rejected is None:
                self.stats.first_rejected = record.text[:200]
            return self._drain()
        b = self._open
        kind = type(line)
        if kind is OomKilled:  # the commonest line of a storm first
            self._on_killed(line, record, self._wall_time(record))
            return self._drain() if self._out else []
        if kind is OomGroup:
            self._on_group(line, record)
        elif kind is OomSuppressed:
            self.stats.suppressed_reports += line.count
            self._finish()
        elif kind is OomInvoked:
            self._finish()
            self._last_group_victim = None  # a new report: the last listing is over
            self._open = self._began(_Builder(first_seq=record.seq, invoked=line, memory_texts=[]), True)
        elif kind is OomStackTask:
            if b is not None and b.invoked is not None and b.stack_task is None and not b.kills:
                b.stack_task = line
        elif kind is OomMemcgUsage:
            if b is not None and not b.kills and b.usage is None:
                b.usage = line
        elif kind is OomSummary:
            if b is None or b.kills or b.summary is not None:
                self._finish()
                b = self._open = self._began(_Builder(first_seq=record.seq), True)
            b.summary, b.summary_seq = line, record.seq
            if line.pid is not None:
                if len(self._summaries) >= 64:
                    self._summaries.pop(next(iter(self._summaries)))
                self._summaries[line.pid] = (line, record.seq)
        elif kind is OomSelected:
            if b is None or b.kills or b.selected is not None:
                self._finish()
                b = self._open = self._began(_Builder(first_seq=record.seq), True)
            b.selected = line
        elif kind is OomAlreadyExiting:
            self._on_exiting(line, self._wall_time(record))
        elif kind is OomReaped:
            summarised = b is not None and not b.kills and b.summary is not None and b.summary.pid == line.pid
            if line.pid in self._recent_killed or not (summarised or not self._live):
                # The reaper's line (printed later, anywhere in the log) changes nothing of the report in progress.
                return self._drain() if self._out else []
            # The reaper only reaps OOM victims: this process was killed, and its kill line is missing (a paste
            # cut before it). Taken as that kill line, with what the rest of the report says. On the live log
            # only where the report it ends is still open: a restart reads from its cursor, and the reaper's line
            # can come after a kill the last run published.
            self.stats.kills_from_reaper += 1
            self._on_killed(OomKilled(pid=line.pid, comm=line.comm, oom_kind="unknown"), record,
                            self._wall_time(record))
            if self._open is not None and self._open.kills and self._open.kills[-1].line.pid == line.pid:
                self._open.kills[-1].from_reaper = True
            return self._drain() if self._out else []
        if self._open is not None:
            self._open.last_was_new_kill = False
        return self._drain() if self._out else []

    def _memory_text(self, record: KmsgRecord) -> None:
        """A line of the open report's memory part (kept until it is built), if it is one: the kernel's own
        (a process writing to /dev/kmsg must not plant task rows), after the report's first line and before
        its summary and kills."""
        b = self._open
        if record.priority >> 3 != KERNEL_FACILITY:
            return
        if b is not None and b.summary is None and not b.kills:
            if b.memory_texts is None and not self._live:
                b.memory_texts = []  # a pasted report begun past its first line: its table may still come
            if b.memory_texts is not None and len(b.memory_texts) < REPORT_RECORDS_MAX:
                b.memory_texts.append(record.text)
        elif not self._live and (b is None or b.summary is not None or b.kills):
            self._orphan_texts.append(record.text)  # before the next report's first line that survived

    def skipped(self, count: int, last_seq: Optional[int], memory: Optional[bytes] = None) -> None:
        """`count` records the reader's pre-filter found no OOM words in (read, not parsed); or, with `memory`,
        the memory part of the open report as the reader kept it (oomwatch.model.Skipped's `part`)."""
        self.stats.records += count
        if last_seq is not None:
            self.last_seq = last_seq
        b = self._open
        if memory is not None and b is not None and b.memory_texts is not None and b.summary is None and not b.kills:
            b.memory_part = memory

    def lost(self, count: int) -> None:
        """Records the reader could not get (EPIPE gap): an incident that begins next without its header or
        summary may have lost its first lines."""
        self.stats.lost += count
        if count:
            self._gap = True

    def _began(self, b: _Builder, with_report_start: bool) -> _Builder:
        """A new incident: partial when it starts mid-report right after lost records."""
        if self._gap and not with_report_start:
            b.partial = True
        self._gap = False
        if b.invoked is not None:
            self._orphan_texts.clear()  # a whole report: what came before it is not its memory part
        elif self._orphan_texts and b.memory_texts is None:
            b.memory_texts = list(self._orphan_texts)
            self._orphan_texts.clear()
        return b

    def flush(self) -> list[Incident]:
        """The log went quiet (or ended): finish everything."""
        self._finish()
        return self.release_finished()

    @property
    def pending(self) -> bool:
        return self._open is not None or self._held is not None

    @property
    def listing(self) -> bool:
        """A group kill's listing is being printed (its `Tasks in` line came, and kills after it)."""
        b = self._open
        return b is not None and b.group is not None and not b.group_inferred and len(b.kills) > 0

    def unpublished_lines(self) -> dict[str, int]:
        """`Killed process` lines per cgroup (as memory.events oom_kill counts them) of the incidents not handed
        out yet: the one being printed and the one held back. Lines of a process whose cgroup is not known are
        left out."""
        lines: dict[str, int] = {}
        b = self._open
        if b is not None:
            for kill in b.kills:
                cgroup = kill.cgroup or b.group
                if cgroup:
                    lines[cgroup] = lines.get(cgroup, 0) + 1
            victim = b.kills[0].cgroup if b.kills else None
            if victim and b.reprints:
                lines[victim] = lines.get(victim, 0) + b.reprints
        if self._held is not None:
            for cgroup, n in self._held.kill_lines:
                if cgroup:
                    lines[cgroup] = lines.get(cgroup, 0) + n
        return lines

    def unpublished_groups(self, grouped: Callable[[str], Optional[str]]) -> Optional[dict[str, tuple[int, set]]]:
        """The group cgroups of the kills not handed out yet, each with how many group kills it holds and the pids
        their lines name (killed or already exiting) ({}: single kills only); `grouped(cgroup)` is the cgroup
        memory.oom.group would kill whole (None: none), for a victim whose `Tasks in` line has not come. None when
        a line's cgroup, or a group kill's group, is not known: then no counter can say the incident is
        complete."""
        groups: dict[str, tuple[int, set]] = {}
        b = self._open
        if b is not None and b.kills:
            if any(k.cgroup is None for k in b.kills):
                return None
            group = b.group if b.group is not None else grouped(b.kills[0].cgroup or "")
            if group is None and b.group_inferred:
                return None
            if group is not None:
                groups[group] = (1, b.pid_set | {note["pid"] for note in b.exiting})
        held = self._held
        if held is not None:
            if not all(cgroup for cgroup, _ in held.kill_lines):
                return None
            if held.kind == "group":
                if not held.group_cgroup:
                    return None
                kills, pids = groups.get(held.group_cgroup, (0, set()))
                groups[held.group_cgroup] = (kills + 1, pids | {p.pid for p in held.killed}
                                             | {note["pid"] for note in held.exiting})
            elif any(grouped(cgroup) for cgroup, _ in held.kill_lines):
                return None  # taken for a single kill before memory.oom.group was read: the quiet window says
        return groups

    def release_finished(self) -> list[Incident]:
        """Shutting down: hand out the finished incidents, keep the one still being printed."""
        if self._held is not None:
            self._out.append(self._held)
            self._held = self._held_first_seq = None
        return self._drain()

    @property
    def pending_since_seq(self) -> Optional[int]:
        """Sequence number of the first record of the earliest incident not yet handed out (a restart must
        read from there again), or None when nothing is pending."""
        seqs = [s for s in (self._held_first_seq, self._open.first_seq if self._open else None) if s is not None]
        return min(seqs) if seqs else None

    # --- state machine -----------------------------------------------------------------------------

    def _repeated(self, line: OomKilled, when: float) -> bool:
        """A saved log's kill line that repeats, to the last size, one of an incident already built less than
        REPEAT_SECONDS before (a paste that quotes the same lines twice): the same kill, said again. A process is
        killed once, and another process given the same pid would not have the same sizes."""
        seen = self._last_lines.get(line.pid)
        self._last_lines[line.pid] = (line, when)
        if len(self._last_lines) > 4096:
            self._last_lines.pop(next(iter(self._last_lines)))
        if seen is None or seen[0] != line or abs(when - seen[1]) > REPEAT_SECONDS:
            return False
        self.stats.repeated_lines += 1
        return True

    def _on_killed(self, line: OomKilled, record: KmsgRecord, when: float) -> None:
        b = self._open
        if b is None and line.pid == self._last_group_victim:
            # The reprint of a group kill's victim that came after the log had gone quiet and the incident was
            # complete (an emulated or loaded node can pause the listing for longer than the quiet window). A
            # process is killed once: a second kill line of the same pid is never a new incident. (Its line is
            # left to the reconciler, which takes lines left over in a memory.oom.group=1 cgroup as its own.)
            self._last_group_victim = None
            self.stats.late_reprints += 1
            return
        self._last_group_victim = None
        if not self._live and (b is None or line.pid not in b.pid_set) and self._repeated(line, when):
            return
        if line.pid not in self._recent_killed:
            if len(self._recent_order) == self._recent_order.maxlen:
                self._recent_killed.discard(self._recent_order[0])
            self._recent_order.append(line.pid)
            self._recent_killed.add(line.pid)
        if b is not None and b.kills and line.pid in b.pid_set:
            # The victim's reprint inside its group listing: only a group kill prints a pid twice.
            b.reprints += 1
            b.last_was_new_kill = False
            if b.group is None:
                self._infer_group(b, reprinted=True)
            return
        cgroup = self._view.cgroup_of_pid(line.pid)
        if b is not None and b.kills and b.group is None:
            # A kill after a kill with no `Tasks in` line between: the next incident, unless that line was
            # lost and memory.oom.group says this process died in the same group.
            self._infer_group(b, reprinted=False)
            if b.group is not None and not (cgroup is not None and is_within(cgroup, b.group)):
                b.group, b.group_inferred = None, False  # not one of its members: keep it single
        new_incident = (
            b is None
            or (b.kills and b.group is None)  # a finished single kill: this is the next victim
            or (b.group is not None and cgroup is not None and not is_within(cgroup, b.group))
        )
        if new_incident:
            self._finish()
            b = self._open = self._began(_Builder(first_seq=record.seq), False)
        assert b is not None
        if not b.kills and line.pid in self._summaries and (b.summary is None or b.summary.pid != line.pid):
            b.summary, b.summary_seq = self._summaries[line.pid]  # its own, from an interleaved report
        if not b.kills:
            self._summaries.pop(line.pid, None)
        if not b.kills and self._held is not None:
            # The next invocation killed: it did not find the held incident's processes still exiting.
            self._out.append(self._held)
            self._held = self._held_first_seq = None
        if not b.kills and b.summary is not None and b.summary.pid in (line.pid, None):
            cgroup = b.summary.task_cgroup or cgroup  # the kernel's own word for the victim's cgroup
        b.add(_Kill(line=line, seq=record.seq, time=when, cgroup=cgroup, batch=self.batch,
                     timed=record.usec is not None or record.wall_time is not None))
        b.last_was_new_kill = True

    def _infer_group(self, b: _Builder, *, reprinted: bool) -> None:
        """No `Tasks in` line (lost): the highest cgroup with memory.oom.group=1 between the victim's cgroup
        and the cgroup that ran out is the one the kernel used. A reprinted victim is a group kill even
        when nothing is known of the cgroups (then its own cgroup is the closest guess)."""
        victim = b.kills[0]
        within = b.summary.oom_cgroup if b.summary is not None else None
        if within == "/":
            within = None
        group = self._view.oom_group_cgroup(victim.cgroup, within) if victim.cgroup else None
        if group is None and reprinted:
            group = victim.cgroup
        if group is not None or reprinted:
            b.group, b.group_inferred = group, True

    def _on_group(self, line: OomGroup, record: KmsgRecord) -> None:
        b = self._open
        if b is None:
            self._open = self._began(_Builder(first_seq=record.seq, group=line.cgroup), False)
            return
        if b.group is None:
            b.group = line.cgroup
            return
        # A second group line: the kill just before it was the next incident's victim (its header and
        # summary were ratelimited away).
        moved = b.pop() if (b.last_was_new_kill and len(b.kills) > 1) else None
        self._finish()
        nb = self._open = _Builder(first_seq=moved.seq if moved else record.seq, group=line.cgroup)
        if moved is not None:
            if moved.cgroup is None or not is_within(moved.cgroup, line.cgroup):
                moved.cgroup = self._view.cgroup_of_pid(moved.line.pid)
            nb.add(moved)

    def _on_exiting(self, line: OomAlreadyExiting, when: float) -> None:
        note = {"pid": line.pid, "comm": line.comm}
        # Printed by a later invocation that found its victim already dying: it belongs to the kill that
        # doomed the process, i.e. the incident in progress or the one just finished.
        b = self._open
        if b is not None and b.kills:
            if line.pid not in b.pid_set and note not in b.exiting:
                b.exiting.append(note)
            return
        if self._held is not None:
            if line.pid not in {p.pid for p in self._held.killed} and note not in self._held.exiting:
                self._held = replace(self._held, exiting=self._held.exiting + (note,))

    def _finish(self) -> None:
        b, self._open = self._open, None
        if b is None:
            return
        if not b.kills:
            self.stats.invocations_without_kill += 1
            if b.memory_texts and not self._live:  # a paste that repeats a report's start: the next one's part
                self._orphan_texts.extend(b.memory_texts)
            return
        incident = self._build(b)
        if incident.kind == "group" and not b.reprints and incident.victim is not None:
            self._last_group_victim = incident.victim.pid  # its reprint has not come yet
        if self._held is not None:
            self._out.append(self._held)
        self._held, self._held_first_seq = incident, b.first_seq

    def _drain(self) -> list[Incident]:
        if not self._out:
            return []
        now = self._detected_clock()
        out = self._out
        for incident in out:
            _set(incident, "detected_at", now)  # not yet handed out: nobody else holds it
        self._out = []
        return out

    # --- incident ----------------------------------------------------------------------------------

    def _wall_time(self, record: KmsgRecord) -> float:
        if record.wall_time is not None:
            return record.wall_time
        return self.boot_time + (record.usec or 0) / 1e6

    def _build(self, b: _Builder) -> Incident:
        first = b.kills[0]
        if first.cgroup is None and b.group is None:
            # Built once the log went quiet: by now inotify has reported the cgroup that counted the kill.
            first.cgroup = self._view.victim_cgroup_hint(b.summary.oom_cgroup if b.summary else None, first.time)
        if b.group is None and first.cgroup is not None:
            self._infer_group(b, reprinted=False)  # the listing's lines were lost with the `Tasks in` line
        oom_kind = first.line.oom_kind
        if oom_kind == "unknown" and b.selected is not None:
            oom_kind = b.selected.oom_kind  # before 5.1 the kill line has no prefix; `Kill process` said which
        if b.summary is not None:
            constraint = b.summary.constraint
        elif oom_kind in ("global", "memcg"):
            constraint = oom_kind
        else:
            constraint = "unknown"  # no summary, no prefix (4.14's lines, a kill known from its reaper line)
        if b.summary is not None:
            oom_cgroup: Optional[str] = b.summary.oom_cgroup
        elif constraint == "global":
            oom_cgroup = "/"
        else:
            oom_cgroup = self._view.oom_cgroup_hint(first.cgroup or b.group, first.time)
        killed = tuple(self._process(k, b.group) for k in b.kills)
        victim = killed[0]
        trigger = None
        order = b.invoked.order if b.invoked is not None else None  # -1: sysrq f, no allocation failed
        if b.stack_task is not None:
            trigger = {"pid": b.stack_task.pid, "comm": b.stack_task.comm, "order": order}
        elif b.invoked is not None:
            trigger = {"pid": None, "comm": b.invoked.comm, "order": order}
        memory = None
        if b.usage is not None:
            memory = {"usage_bytes": b.usage.usage_bytes, "limit_bytes": b.usage.limit_bytes}
        workload = self._resolve_workload(victim.cgroup) if victim.cgroup else Workload(type="other", cgroup="")
        workloads: list[Workload] = [workload]
        for proc in killed[1:]:
            if proc.cgroup:
                w = self._resolve_workload(proc.cgroup)
                if w not in workloads:
                    workloads.append(w)
        incident = Incident(
            time=first.time,
            boot_id=self.boot_id,
            kernel_seq=b.summary_seq if b.summary_seq is not None else first.seq,
            kind="group" if b.group is not None or b.group_inferred else "single",
            constraint=constraint,
            scope=self._scope_of(victim.cgroup, oom_cgroup, constraint),
            oom_cgroup=oom_cgroup,
            group_cgroup=b.group,
            trigger=trigger,
            memory=memory,
            victim=victim,
            killed=killed,
            workload=workload,
            explanation="",
            detected_at=0.0,  # set when released
            exiting=tuple(b.exiting),
            workloads=tuple(workloads),
            live=self._live,
            kill_lines=self._kill_lines(killed, b.reprints),
            partial=b.partial,
            group_inferred=b.group_inferred,
            evidence="oom_reaper" if first.from_reaper else "kmsg",
            time_known=first.timed,
        )
        report = part_report(b.memory_part, STAT_KEYS_USED) if b.memory_part is not None else (
            first_report(b.memory_texts) if b.memory_texts else None)
        reading = None
        if (report is None or report.stats is None or report.cgroup not in (None, oom_cgroup)) and oom_cgroup \
                and oom_cgroup != "/" and constraint != "global":
            # The stats block was ratelimited or lost: memory.stat of the OOM cgroup read before the kill, if any
            found = self._memory_reading(oom_cgroup, first.batch)
            if found is not None and first.time - found.taken <= MAX_READING_AGE:
                reading = (found.stat, round(max(0.0, first.time - found.taken), 3))  # (clocks drift: >= 0)
        # Every incident says what held the memory from whatever survived: the report's stats, a reading from
        # before the kill, else the kill lines (never ratelimited).
        held = held_memory(report, limit_bytes=memory["limit_bytes"] if memory else None,
                           killed_pids=[p.pid for p in killed], page_size=self._page_size,
                           victim_rss_bytes=_rss_bytes(victim),
                           oom_cgroup=b.summary.oom_cgroup if b.summary is not None else None,
                           memory_stat=reading, tmpfs_volumes=self._tmpfs_mounts(incident.workload),
                           killed=killed, advice=advice_for(constraint, oom_cgroup, incident.workload.type))
        if held["memory_breakdown"] is not None or held["top_holders"]:
            for name in ("memory_breakdown", "verdict", "verdict_sentence"):
                _set(incident, name, held[name])
            _set(incident, "top_holders", tuple(held["top_holders"]))
            _set(incident, "pools", tuple(held["pools"]))
        _set(incident, "explanation", self._explain(incident))  # just made, not shared yet (explained whole)
        if len(killed) > MAX_KILLED_LISTED:
            per_cgroup = incident.killed_per_cgroup()
            _set(incident, "killed", killed[:MAX_KILLED_LISTED])
            _set(incident, "killed_count", len(killed))
            _set(incident, "killed_cgroups", per_cgroup)
        return incident

    @staticmethod
    def _kill_lines(killed: tuple[KilledProcess, ...], reprints: int) -> tuple[tuple[str, int], ...]:
        """`Killed process` lines per cgroup as memory.events `oom_kill` counts them: the victim's reprint
        counts again in its cgroup."""
        lines: dict[str, int] = {}
        for p in killed:
            key = p.cgroup or ""
            lines[key] = lines.get(key, 0) + 1
        if reprints:
            lines[killed[0].cgroup or ""] += reprints
        return tuple(sorted(lines.items()))

    @staticmethod
    def _process(kill: _Kill, group: Optional[str]) -> KilledProcess:
        line = kill.line
        cgroup = kill.cgroup
        if cgroup is None and group is not None:
            cgroup = group  # offline, the group cgroup is the closest the kernel's lines place it
        return KilledProcess(
            pid=line.pid, comm=line.comm, cgroup=cgroup, uid=line.uid, total_vm_bytes=line.total_vm_bytes,
            anon_rss_bytes=line.anon_rss_bytes, file_rss_bytes=line.file_rss_bytes,
            shmem_rss_bytes=line.shmem_rss_bytes, oom_score_adj=line.oom_score_adj)


def _rss_bytes(p: KilledProcess) -> Optional[int]:
    """The rss its kill line printed (anon + file + shmem; before 4.9 the line has no shmem, which file-rss
    counts then), or None."""
    if p.anon_rss_bytes is None or p.file_rss_bytes is None:
        return None
    return p.anon_rss_bytes + p.file_rss_bytes + (p.shmem_rss_bytes or 0)
