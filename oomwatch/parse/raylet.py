"""Ray's raylet.out: which workers Ray's memory monitor killed (`… killed due to the node running low on
memory`, with the killed worker's `pid=`, a pid of the Ray container's pid namespace). oomwatch.sources.raylet
reads the file; oomwatch.deaths uses the pids as a SIGKILL's sender."""

from __future__ import annotations

import re

_RAY_KILL = re.compile(r"killed due to the node running low on memory")
_RAY_SELECTED = re.compile(r"Selected to kill: \(Task: [^)]{0,2000}?\bpid=(\d{1,10})\b")
_RAY_WHERE = re.compile(r"where the (?:task|lease) \([^)]{0,2000}?\bpid=(\d{1,10})\b")


def ray_killed_pids(text: str) -> frozenset:
    """The pids (in the Ray container's pid namespace) raylet.out says its memory monitor killed: each
    `Selected to kill: (Task: … pid=N …)` (Ray 2.56+: several at once), or the `where the task (… pid=N …) was
    running` of the older one-worker message. Candidates it considered and spared are not taken. raylet.out
    separates the lines of one record with `;`."""
    pids: set[int] = set()
    armed = 0  # lines still part of a kill message (the older one names its worker on the line after)
    for line in text[-(1 << 20):].split("\n"):
        if _RAY_KILL.search(line):
            armed = 3
        if "Selected to kill:" in line:
            pids.update(int(m.group(1)) for m in _RAY_SELECTED.finditer(line))
        if armed:
            pids.update(int(m.group(1)) for m in _RAY_WHERE.finditer(line))
            armed -= 1
    return frozenset(pids)
