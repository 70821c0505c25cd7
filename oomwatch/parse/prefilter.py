"""A bytes-level test of whether a raw /dev/kmsg record can be part of an OOM report.

About four in five records of an OOM storm are not OOM lines (stack traces, registers, meminfo, the task
table); decoding and parsing them costs most of a reader's time. `skippable_seq(raw)` is one regex match and
one substring search over the bytes; only records it does not skip are parsed (oomwatch.parse.kmsg) and
matched (oomwatch.parse.oom). It must never reject a line `parse_oom_line` would accept:
tests/test_lost_lines.py checks that on every captured record and every line of the corpus.
"""

from __future__ import annotations

import re
from typing import Callable, Optional

# How every line parse_oom_line knows begins (it anchors them at the start of the text); the one it finds in the
# middle (`<comm> invoked oom-killer: `) is looked for with a substring search, several times faster than a
# regex scanning the line. Stack frames such as ` oom_kill_process+0x…` do not pass.
_OOM_LINE_START = (rb"Memory cgroup out of memory|Out of memory|Killed process|oom-kill:|Tasks? in |"
                   rb"memory: usage |oom_reaper: reaped |CPU: \d+ (?:UID: \d+ )?PID:|"
                   rb"(?:oom_kill_process|dump_header|out_of_memory): \d+ callbacks")
OOM_LINE_START = _OOM_LINE_START  # (the text front end, oomwatch.parse.kmsg, knows OOM lines by it too)
_INVOKED = b" invoked oom-killer: "
# The reader needs, for every record of a storm, its sequence number and whether its text may be an OOM line:
# one match of `PRI,SEQ,…;` and the line starts gives both (group 2 is set when the text starts like one).
_RECORD = re.compile(rb"\d{1,20},(\d{1,19}),[^;]*;(" + _OOM_LINE_START + rb")?")


def skippable_seq(raw: bytes, _match=_RECORD.match) -> Optional[int]:
    """The sequence number of a raw record (`PRI,SEQ,USEC,FLAGS;text`) that cannot be part of an OOM report,
    to be counted and not parsed; None for one that may be, and for one whose prefix is not a kernel record's
    (the parser says what is wrong with it). It may let through a record that is not an OOM line (the invoked
    words in a dictionary line), never skip one that is."""
    m = _match(raw)
    # Not `_INVOKED in raw`: `bytes in bytes` first tries the needle as an int, and builds and clears a TypeError
    # (more than the search costs); nor find(), whose arguments are parsed from a format string. partition()
    # takes its one argument as it is: about a twentieth of the reader's instructions in a storm.
    if m is None or m.lastindex == 2 or raw.partition(_INVOKED)[1]:
        return None
    return int(m.group(1))


def could_be_oom(raw: bytes) -> bool:
    """Whether a raw record must be parsed: it may be an OOM line, or is not a well-formed record."""
    return skippable_seq(raw) is None


# A full report's memory part, which issue 21 reads (what held the memory), is made of lines with no OOM words:
# `Memory cgroup stats for` and its block (one record on 6.1, a record per line on 6.12), `Mem-Info:` and the
# node's counters, the task table (its title, or its column header alone on 3.10). The kernel prints them after
# the report's stack trace and before its `oom-kill:` summary (or its kill line, before 4.19), and only for
# reports its ratelimit lets through (at most 10 in 5 s): the stack and registers stay skipped, and what is
# passed is a handful of records per report plus the task rows.
# One match gives the sequence number, an OOM line's start (group 2) or the memory part's (group 3): used
# between a report's first line and its memory part.
_RECORD_IN_REPORT = re.compile(rb"\d{1,20},(\d{1,19}),[^;]*;(?:(" + _OOM_LINE_START +
                               rb")|(Memory cgroup stats for |Mem-Info:|Tasks state |\[  pid  \]))?")
_REPORT_END = (b"oom-kill:", b"Memory cgroup out of memory", b"Out of memory", b"Killed process")
# A report whose end never comes (a ring that wrapped) stops passing records after this many: a task table's
# rows (oomwatch.parse.memstat.MAX_TASK_ROWS) and the rest of the report.
REPORT_RECORDS_MAX = (1 << 16) + 4096
_OUTSIDE, _HEAD, _MEMORY = 0, 1, 2  # where in a report the reader is


def report_skipper() -> Callable[[bytes], Optional[int]]:
    """A `skippable_seq` with memory: the records of a report's memory part (its stats block or node counters
    and its task table, up to its summary or kill line) come back as `~seq` (negative): the reader keeps them
    together and hands them on as one. One per reader: a report can span two reads."""
    phase = _OUTSIDE
    passed = 0

    def skip(raw: bytes, _match=_RECORD.match, _match_head=_RECORD_IN_REPORT.match, _invoked=_INVOKED,
             _end=_REPORT_END) -> Optional[int]:
        nonlocal phase, passed
        m = _match_head(raw) if phase == _HEAD else _match(raw)
        if m is None:
            return None
        if raw.partition(_invoked)[1]:  # a report begins (see skippable_seq for why not `in`)
            phase = _HEAD
            return None
        kind = m.lastindex
        if kind == 2:  # an OOM line
            if phase != _OUTSIDE and m.group(2).startswith(_end):
                phase = _OUTSIDE
            return None
        if phase == _OUTSIDE:  # most records of a storm
            return int(m.group(1))
        if phase == _HEAD:
            if kind != 3:
                return int(m.group(1))
            phase, passed = _MEMORY, 0
        passed += 1
        if passed > REPORT_RECORDS_MAX:
            phase = _OUTSIDE
        return ~int(m.group(1))

    return skip
