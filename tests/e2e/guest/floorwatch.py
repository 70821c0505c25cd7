"""The floor of detection latency (issue 30), as the tiers use it: tests/e2e/guest/oomfloor.c built, run beside the
agent in the guest, and its lines read. Shared by the storm (storm.py in the guest, tests/e2e/test_storm.py on the
host) and the calm single kills (calm_floor_scenario.py, tests/e2e/test_calm_floor.py). Standard library only: it
runs with the guest's python and in pytest.
"""

from __future__ import annotations

import os
import subprocess

FLOOR_C = os.path.join(os.path.dirname(os.path.abspath(__file__)), "oomfloor.c")


def build(binary: str) -> None:
    """Compile the floor to `binary` (static: it runs in the guest whatever was built where)."""
    subprocess.run(["gcc", "-O2", "-static", "-o", str(binary), FLOOR_C], check=True)


def start(binary: str, out: str, memory_events: list[str]) -> subprocess.Popen:
    """The floor, writing its lines to `out`, watching the kernel log and these memory.events files (its line
    `events INDEX …` names a file by its place in this list)."""
    return subprocess.Popen([binary, out, *memory_events], stdin=subprocess.DEVNULL)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait()


def records_read(path) -> dict[int, float]:
    """Kernel record sequence number → when the floor first read it (CLOCK_REALTIME, seconds): its `kmsg` lines."""
    seen: dict[int, float] = {}
    with open(path) as f:
        for line in f:
            kind, key, t_ns, *_ = line.split(" ", 4)
            if kind == "kmsg":
                seen.setdefault(int(key), int(t_ns) / 1e9)
    return seen


def counter_moves(path) -> list[tuple[int, float, int, int]]:
    """(index of the memory.events file, when the floor saw it move (seconds), oom_kill, oom_group_kill), in
    order: its `events` lines."""
    moves = []
    with open(path) as f:
        for line in f:
            kind, *rest = line.split()
            if kind == "events":
                index, t_ns, kill, group = rest
                moves.append((int(index), int(t_ns) / 1e9, int(kill), int(group)))
    return moves
