"""cgroup v2 interface files and /proc/<pid>/cgroup, as values. Pure: text in, values out."""

from __future__ import annotations

from typing import Optional

# memory.events keys oomwatch exports (CONTRACT `event` label); `low` and `sock_throttled` are read but not
# exported as they say nothing about OOM kills.
EXPORTED_MEMORY_EVENTS = ("max", "high", "oom", "oom_kill", "oom_group_kill")


def parse_flat_keyed(text: str) -> dict[str, int]:
    """`key value` per line (memory.events, memory.events.local). Lines that are not `key int` are
    skipped: a newer kernel may add keys, and a file read mid-write may end early."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        try:
            out[key] = int(value)
        except ValueError:
            continue
    return out


def parse_limit(text: str) -> Optional[float]:
    """memory.max / memory.high: `max` → +Inf, a number → bytes, anything else → None."""
    value = text.strip()
    if value == "max":
        return float("inf")
    try:
        return float(int(value))
    except ValueError:
        return None


def parse_int(text: str) -> Optional[int]:
    """One-integer files: memory.current, memory.peak, memory.oom.group."""
    try:
        return int(text.strip())
    except ValueError:
        return None


def parse_pids(text: str) -> tuple[int, ...]:
    """cgroup.procs: one pid per line."""
    return tuple(int(tok) for tok in text.split() if tok.isdigit())


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
