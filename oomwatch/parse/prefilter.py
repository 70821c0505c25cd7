"""A bytes-level test of whether a raw /dev/kmsg record can be part of an OOM report.

About four in five records of an OOM storm are not OOM lines (stack traces, registers, meminfo, the task
table); decoding and parsing them costs most of a reader's time. `skippable_seq(raw)` is one regex match and
one substring search over the bytes; only records it does not skip are parsed (oomwatch.parse.kmsg) and
matched (oomwatch.parse.oom). It must never reject a line `parse_oom_line` would accept:
tests/test_lost_lines.py checks that on every captured record and every line of the corpus.
"""

from __future__ import annotations

import re
from typing import Optional

# How every line parse_oom_line knows begins (it anchors them at the start of the text); the one it finds in the
# middle (`<comm> invoked oom-killer: `) is looked for with a substring search, several times faster than a
# regex scanning the line. Stack frames such as ` oom_kill_process+0x…` do not pass.
_OOM_LINE_START = (rb"Memory cgroup out of memory|Out of memory|Killed process|oom-kill:|Tasks? in |"
                   rb"memory: usage |oom_reaper: reaped |CPU: \d+ (?:UID: \d+ )?PID:|"
                   rb"(?:oom_kill_process|dump_header|out_of_memory): \d+ callbacks")
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
    if m is None or m.lastindex == 2 or _INVOKED in raw:
        return None
    return int(m.group(1))


def could_be_oom(raw: bytes) -> bool:
    """Whether a raw record must be parsed: it may be an OOM line, or is not a well-formed record."""
    return skippable_seq(raw) is None
