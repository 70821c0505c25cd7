"""Scrape-time reads of workload cgroups that cost what changed, not what exists.

- `memory.events`, `memory.max`, `memory.oom.group` change only when the kernel signals it (memory.events:
  the kernel's own inotify IN_MODIFY, see docs/kernel-facts.md) or when someone writes them (a write through
  the VFS raises IN_MODIFY too). They are read once and kept until `invalidate(path)`: the agent's cgroup
  watcher calls it from its inotify callbacks.
- `memory.current`, `memory.peak`, `memory.stat` (for the working set) and `memory.pressure` (PSI) change all
  the time: they are read with pread(2) at offset 0 on descriptors held open (a kernfs file regenerates its
  text on a read at offset 0), so a scrape costs one system call per value instead of open + read + close.
  A kernel without PSI (booted with psi=0, or CONFIG_PSI off) has no memory.pressure: said once in the log,
  and the pressure is unknown.

A held descriptor of a removed cgroup reads ENODEV (and one of a cgroup removed and created again under the
same name keeps reading ENODEV): it is closed and the file opened again by path; ENOENT then means the
cgroup is gone, which is normal. Malformed values are unknown and counted, as CgroupFS does.

Held descriptors are bounded by `max_open` (default: what RLIMIT_NOFILE allows, raised to its hard limit,
less a reserve for sockets); beyond it, files are read by path. Each held cgroup file also keeps a kernel
seq_file buffer (one page) charged to the agent's cgroup.
"""

from __future__ import annotations

import logging
import os
import resource
import threading
import time
from typing import Callable, Optional

from oomwatch.model import CgroupStats
from oomwatch.parse.cgroup import parse_int, parse_limit, parse_oom_group
from oomwatch.sources.cgroupfs import CgroupFS, cat
from oomwatch.names import as_logged

# Descriptors left for everything else (HTTP connections, inotify, the kernel log, state files).
RESERVED_DESCRIPTORS = 1024
# A file the kernel does not have (memory.peak before 5.19) is looked for again after this long.
ABSENT_RETRY_SECONDS = 60.0
_SIGNALLED = ("memory.events", "memory.max", "memory.oom.group")
_HELD = ("memory.current", "memory.peak", "memory.stat", "memory.pressure")
# memory.stat is about forty lines (1-3 KiB); the others one or two.
_HELD_READ = (4096, 4096, 16384, 4096)

log = logging.getLogger(__name__)


def descriptor_budget(raise_limit: bool = True) -> int:
    """How many descriptors the cache may hold: the soft RLIMIT_NOFILE (first raised to the hard limit, as Go
    programs such as node_exporter do at start) less RESERVED_DESCRIPTORS."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if raise_limit and hard != soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return max(0, soft - RESERVED_DESCRIPTORS)


class _Entry:
    """What is kept per cgroup (small: a node may have tens of thousands). Slot N is the file _HELD[N]."""

    __slots__ = ("absent0", "absent1", "absent2", "absent3", "fd0", "fd1", "fd2", "fd3", "signalled")

    def __init__(self) -> None:
        # (oom_group, limit_bytes, events) as last read; None = read at the next scrape.
        self.signalled: Optional[tuple[Optional[int], Optional[float], Optional[dict[str, int]]]] = None
        self.fd0: Optional[int] = None
        self.fd1: Optional[int] = None
        self.fd2: Optional[int] = None
        self.fd3: Optional[int] = None
        self.absent0 = 0.0  # monotonic time before which a missing file is not looked for again
        self.absent1 = 0.0
        self.absent2 = 0.0
        self.absent3 = 0.0


class StatCache:
    """One per CgroupFS; thread-safe (scrapes on the HTTP thread, invalidations on the watcher thread).

    `read(path)` → CgroupStats (no pids, no memory.events.local) or None when the cgroup is gone.
    `invalidate(path)`: a signalled file of `path` changed (or may have): read it again at the next scrape.
    `invalidate_all()`: after an inotify queue overflow. `forget(path)`: the cgroup was removed: close its
    descriptors and drop what is kept. `close()`: all of them."""

    def __init__(self, fs: CgroupFS, *, max_open: Optional[int] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.fs = fs
        self.max_open = descriptor_budget() if max_open is None else max_open
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._open = 0
        self._lock = threading.Lock()  # a descriptor is never closed while another thread preads it
        self.psi_absent_logged = False

    @property
    def open_descriptors(self) -> int:
        return self._open

    def descriptors(self, path: str) -> Optional[tuple[int, ...]]:
        """The descriptors held open for a cgroup's files; None when nothing is kept for it (never read, or
        forgotten since)."""
        with self._lock:
            entry = self._entries.get(path)
            if entry is None:
                return None
            return tuple(fd for fd in (entry.fd0, entry.fd1, entry.fd2, entry.fd3) if fd is not None)

    def invalidate(self, path: str) -> None:
        with self._lock:
            entry = self._entries.get(path)
            if entry is not None:
                entry.signalled = None

    def invalidate_all(self) -> None:
        with self._lock:
            for entry in self._entries.values():
                entry.signalled = None

    def forget(self, path: str) -> None:
        with self._lock:
            entry = self._entries.pop(path, None)
            if entry is not None:
                self._close(entry)

    def close(self) -> None:
        with self._lock:
            for entry in self._entries.values():
                self._close(entry)
            self._entries.clear()

    def read(self, path: str) -> Optional[CgroupStats]:
        base = self.fs.abspath(path)
        with self._lock:
            entry = self._entries.get(path)
            if entry is None:
                entry = self._entries[path] = _Entry()
            # Held files first: a stale descriptor (the cgroup went) also voids the kept values.
            current = self._read_held(entry, 0, base)
            peak = self._read_held(entry, 1, base)
            stat = self._read_held(entry, 2, base)
            pressure = self._read_held(entry, 3, base)
            signalled = entry.signalled
            if signalled is None:
                events_text, limit_text, group_text = (cat(f"{base}/{name}") for name in _SIGNALLED)
                signalled = (
                    self.fs.parsed(f"{base}/memory.oom.group", group_text, parse_oom_group),
                    self.fs.parsed(f"{base}/memory.max", limit_text, parse_limit),
                    self.fs.parsed_events(f"{base}/memory.events", events_text),
                )
                # A file absent now (no memory controller yet) may appear: keep only what was read.
                if events_text is not None and limit_text is not None and group_text is not None:
                    entry.signalled = signalled
            if current is None and not os.path.isdir(base):  # gone: normal, cgroups come and go
                del self._entries[path]
                self._close(entry)
                return None
        oom_group, limit, events = signalled
        usage, working_set, parsed_pressure = self.fs.memory_use(base, current, stat, pressure)
        if pressure is None and current is not None and not self.psi_absent_logged:
            # Every cgroup has memory.pressure where PSI is on; one with memory.current and none is a kernel
            # without PSI.
            self.psi_absent_logged = True
            # (the path as_logged: a cgroup name can hold any byte, a terminal's escape sequences included)
            log.warning("%s/memory.pressure is absent: this kernel has no PSI (booted with psi=0, or built "
                        "without CONFIG_PSI); oomwatch_memory_pressure_seconds_total is not exported",
                        as_logged(base).encode("unicode_escape").decode("ascii"))
        return CgroupStats(
            path=path, oom_group=oom_group, events=events, limit_bytes=limit,
            usage_bytes=usage,
            peak_bytes=self.fs.parsed(f"{base}/memory.peak", peak, parse_int),
            working_set_bytes=working_set,
            pressure=parsed_pressure,
        )

    def _read_held(self, entry: _Entry, slot: int, base: str) -> Optional[str]:
        fd = getattr(entry, f"fd{slot}")
        size = _HELD_READ[slot]
        if fd is not None:
            try:
                return os.pread(fd, size, 0).decode("utf-8", "replace")
            except OSError:  # ENODEV: the cgroup was removed (and may be back under the same name)
                self._close_slot(entry, slot)
                entry.signalled = None  # a cgroup back under the same name is another one
        now = self._clock()
        if getattr(entry, f"absent{slot}") > now:
            return None
        name = _HELD[slot]
        if self._open >= self.max_open:
            text = cat(f"{base}/{name}")
            if text is None:
                self._set(entry, "absent", slot, now + ABSENT_RETRY_SECONDS)
            return text
        try:
            fd = os.open(f"{base}/{name}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # ENOENT: gone, or a kernel without the file
            self._set(entry, "absent", slot, now + ABSENT_RETRY_SECONDS)
            return None
        self._set(entry, "fd", slot, fd)
        self._open += 1
        try:
            return os.pread(fd, size, 0).decode("utf-8", "replace")
        except OSError:  # EOPNOTSUPP: memory.pressure of a kernel before 6.1 booted with psi=0
            self._close_slot(entry, slot)
            if slot >= 2:
                self._set(entry, "absent", slot, now + ABSENT_RETRY_SECONDS)
            return None

    @staticmethod
    def _set(entry: _Entry, field: str, slot: int, value) -> None:
        setattr(entry, f"{field}{slot}", value)

    def _close_slot(self, entry: _Entry, slot: int) -> None:
        fd = getattr(entry, f"fd{slot}")
        if fd is not None:
            self._set(entry, "fd", slot, None)
            self._open -= 1
            try:
                os.close(fd)
            except OSError:
                pass

    def _close(self, entry: _Entry) -> None:
        for slot in range(len(_HELD)):
            self._close_slot(entry, slot)
