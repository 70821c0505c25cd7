"""cgroup v2 interface files and /proc/<pid>/cgroup, as values. Pure: text in, values out."""

from __future__ import annotations

import sys
from typing import Optional

# memory.events keys oomwatch exports (docs/contract.md `event` label); `low` and `sock_throttled` are read but
# not exported as they say nothing about OOM kills.
EXPORTED_MEMORY_EVENTS = ("max", "high", "oom", "oom_kill", "oom_group_kill")


# The kernel prints these files as unsigned 64-bit numbers (page_counter values and event counters are
# never negative); anything else was not written by it, or not whole, and is unknown, not a number.
U64_MAX = (1 << 64) - 1


def parse_u64(text: str) -> Optional[int]:
    """One unsigned 64-bit decimal, surrounding whitespace allowed; None for anything else (negative, out of
    range such as a 400-digit number, empty, garbage). Never raises."""
    value = text.strip()
    # isascii: str.isdigit() also accepts digits like "²" that int() refuses; 20 digits hold any u64.
    if not (value.isascii() and value.isdigit()) or len(value) > 20:
        return None
    number = int(value)
    return number if number <= U64_MAX else None


def parse_flat_keyed_counted(text: str) -> tuple[dict[str, int], int]:
    """`key value` per line (memory.events, memory.events.local) → (values, malformed lines). A line whose
    value is not a u64 is left out and counted; blank lines are not counted. Unknown keys are kept: a newer
    kernel may add some."""
    out: dict[str, int] = {}
    malformed = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        key, _, value = line.partition(" ")
        number = parse_u64(value) if key else None
        if number is None:
            malformed += 1
        else:
            # Interned: thousands of cgroups' dicts, kept between scrapes, share the six key strings.
            out[sys.intern(key)] = number
    return out, malformed


def parse_flat_keyed(text: str) -> dict[str, int]:
    """`key value` per line; malformed lines are skipped (see parse_flat_keyed_counted)."""
    return parse_flat_keyed_counted(text)[0]


def parse_limit(text: str) -> Optional[float]:
    """memory.max / memory.high: `max` → +Inf, a u64 → bytes, anything else (including -1, which the kernel
    never prints) → None: unknown, never a limit."""
    value = text.strip()
    if value == "max":
        return float("inf")
    number = parse_u64(value)
    return float(number) if number is not None else None


def parse_int(text: str) -> Optional[int]:
    """One-integer files: memory.current, memory.peak (u64 bytes); None when not a u64."""
    return parse_u64(text)


def parse_oom_group(text: str) -> Optional[int]:
    """memory.oom.group: 0 or 1; None for anything else."""
    value = text.strip()
    return int(value) if value in ("0", "1") else None


def parse_pids(text: str) -> tuple[int, ...]:
    """cgroup.procs: one pid per line; anything that is not a pid (at most 10 digits) is skipped."""
    return tuple(int(tok) for tok in text.split() if tok.isascii() and tok.isdigit() and len(tok) <= 10)


def parse_proc_pid_cgroup(text: str) -> Optional[str]:
    """/proc/<pid>/cgroup → the cgroup v2 path (`0::/kubepods/…`), None on a v1-only host. A process in a
    cgroup that has been removed reads `0::/path (deleted)`."""
    for line in text.splitlines():
        if line.startswith("0::"):
            path = line[3:]
            if path.endswith(" (deleted)"):
                path = path[: -len(" (deleted)")]
            return path or "/"
    return None


def parse_mounts_cgroup_version(text: str, cgroup_root: str = "/sys/fs/cgroup") -> str:
    """/proc/self/mounts → "v2" (pure cgroup2 at the root), "hybrid" (cgroup2 beside v1 controllers),
    "v1", or "none"."""
    v1_memory = False
    v2_root = False
    v2_any = False
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        mountpoint, fstype, options = parts[1], parts[2], parts[3].split(",")
        if fstype == "cgroup2":
            v2_any = True
            if mountpoint == cgroup_root:
                v2_root = True
        elif fstype == "cgroup" and "memory" in options:
            v1_memory = True
    if v2_root and not v1_memory:
        return "v2"
    if v1_memory:
        return "hybrid" if v2_any else "v1"
    return "v2" if v2_any else "none"


PF_EXITING = 0x4  # include/linux/sched.h: getting shut down


def parse_proc_stat_exiting(text: str) -> bool:
    """/proc/<pid>/stat → whether the process is dying (PF_EXITING, or a zombie/dead state). A dying
    process's /proc/<pid>/cgroup no longer names the cgroup it was killed in (it reads "/")."""
    tail = text[text.rfind(")") + 2:].split()
    if len(tail) < 7:
        return True
    state, flags = tail[0], tail[6]
    try:
        return state in ("Z", "X", "x") or bool(int(flags) & PF_EXITING)
    except ValueError:
        return True
