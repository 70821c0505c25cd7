"""A bytes-level test of whether a raw /dev/kmsg record can be part of an OOM report.

About four in five records of an OOM storm are not OOM lines (stack traces, registers, meminfo, the task
table); decoding and parsing them costs most of a reader's time. `could_be_oom(raw)` is one anchored regex
match and one substring search over the bytes; only records that pass are parsed (oomwatch.parse.kmsg) and
matched (oomwatch.parse.oom). It must never reject a line `parse_oom_line` would accept:
tests/test_lost_lines.py checks that on every captured record and every line of the corpus.
"""

from __future__ import annotations

import re
from typing import Optional

# How every line parse_oom_line knows begins (it anchors them at the start of the text); the one it finds in the
# middle (`<comm> invoked oom-killer: `) is looked for with bytes.find, which is several times faster than a
# regex scanning the line. Stack frames such as ` oom_kill_process+0x…` do not pass.
_OOM_LINE_START = re.compile(rb"Memory cgroup out of memory|Out of memory|Killed process|oom-kill:|Tasks? in |"
                             rb"memory: usage |CPU: \d+ (?:UID: \d+ )?PID:|"
                             rb"(?:oom_kill_process|dump_header|out_of_memory): \d+ callbacks")
_INVOKED = b" invoked oom-killer: "


def could_be_oom(raw: bytes, _starts=_OOM_LINE_START.match) -> bool:
    """Whether the record's text (after the `;`) may be an OOM line. It may say yes to a record that is not
    one (the invoked words in a dictionary line), never no to one that is."""
    return _starts(raw, raw.find(b";") + 1) is not None or _INVOKED in raw


def record_seq(raw: bytes) -> Optional[int]:
    """The sequence number of a raw record (`PRI,SEQ,USEC,FLAGS;text`) without parsing the rest."""
    parts = raw.split(b",", 2)
    if len(parts) < 3 or not parts[1].isdigit() or len(parts[1]) > 19:
        return None
    return int(parts[1])
