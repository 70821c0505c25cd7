"""Thin readers for the cgroup v2 tree and /proc, and an inotify watcher that reports changes.

Cgroups come and go all the time: a file or directory that vanishes mid-read is normal and yields None /
nothing, never an exception. Parsing is in oomwatch/parse/cgroup.py.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, Iterator, Optional

from oomwatch.model import CgroupStats
from oomwatch.parse.cgroup import (
    parse_flat_keyed_counted,
    parse_int,
    parse_limit,
    parse_mounts_cgroup_version,
    parse_oom_group,
    parse_pids,
    parse_proc_pid_cgroup,
    parse_proc_stat_exiting,
)
from oomwatch.parse.pressure import Pressure, parse_memory_stat_field, parse_pressure, working_set_bytes

log = logging.getLogger(__name__)


def cat(path: str) -> Optional[str]:
    """A small file's text, or None when it is gone or unreadable (the cgroup was removed). Plain os.read:
    a scrape reads thousands of these, and buffered text I/O costs twice as much per file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    except OSError:  # ENODEV and friends: the cgroup went away between open and read
        return None
    finally:
        os.close(fd)


class CgroupFS:
    """Reads one cgroup v2 hierarchy mounted at `root`. Paths are relative ("/a/b"), as the kernel prints.

    A value the kernel would never print (negative, out of u64 range, garbage: someone else's file, or a
    fixture gone wrong) is read as unknown (None) and counted in `parse_errors`
    (`oomwatch_cgroup_parse_errors_total`); it never raises."""

    def __init__(self, root: str = "/sys/fs/cgroup") -> None:
        self.root = root.rstrip("/") or "/"
        self._parse_errors = 0
        self._parse_errors_lock = threading.Lock()  # readers run on the watcher and the HTTP threads
        self._reported: set[str] = set()

    def abspath(self, path: str) -> str:
        return self.root if path in ("", "/") else self.root + path

    @property
    def parse_errors(self) -> int:
        """cgroup file values read as unknown because they were not what the kernel prints."""
        return self._parse_errors

    def count_parse_error(self, file: str, text: str, count: int = 1) -> None:
        with self._parse_errors_lock:
            self._parse_errors += count
            first = file not in self._reported and len(self._reported) < 1000
            if first:
                self._reported.add(file)
        # Once per file: a hostile file is re-read at every scrape and must not flood the log.
        (log.warning if first else log.debug)("%s: %r is not a value the kernel prints; read as unknown",
                                              file, text[:80])

    def parsed(self, file: str, text: Optional[str], parse: Callable[[str], Any]) -> Any:
        """`parse(text)` of a one-value file; None when the file is absent or its value malformed
        (counted)."""
        if text is None:
            return None
        value = parse(text)
        if value is None:
            self.count_parse_error(file, text)
        return value

    def parsed_events(self, file: str, text: Optional[str]) -> Optional[dict[str, int]]:
        """memory.events(.local) as a dict, malformed lines left out and counted; None when absent."""
        if text is None:
            return None
        values, malformed = parse_flat_keyed_counted(text)
        if malformed:
            self.count_parse_error(file, text, malformed)
        return values

    def walk(self) -> Iterator[str]:
        """Every cgroup below the root, parents before children."""
        stack = ["/"]
        while stack:
            path = stack.pop()
            yield path
            try:
                with os.scandir(self.abspath(path)) as it:
                    children = sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
            except OSError:
                continue
            prefix = "" if path == "/" else path
            stack.extend(f"{prefix}/{name}" for name in reversed(children))

    def read_events(self, path: str) -> tuple[Optional[dict[str, int]], Optional[dict[str, int]]]:
        base = self.abspath(path)
        return (self.parsed_events(f"{base}/memory.events", cat(f"{base}/memory.events")),
                self.parsed_events(f"{base}/memory.events.local", cat(f"{base}/memory.events.local")))

    def read_stats(self, path: str, with_pids: bool = False,
                   with_local: bool = True) -> Optional[CgroupStats]:
        """One cgroup's memory files; None when the cgroup is gone. A scrape reads through
        sources.statcache.StatCache instead (cached and held-open reads)."""
        base = self.abspath(path)
        events_text = cat(f"{base}/memory.events")
        limit = cat(f"{base}/memory.max")
        current = cat(f"{base}/memory.current")
        if events_text is None and limit is None and current is None and not os.path.isdir(base):
            return None
        local = cat(f"{base}/memory.events.local") if with_local else None
        pids: tuple[int, ...] = ()
        if with_pids:
            procs = cat(f"{base}/cgroup.procs")
            pids = parse_pids(procs) if procs is not None else ()
        usage, working_set, pressure = self.memory_use(base, current, cat(f"{base}/memory.stat"),
                                                       cat(f"{base}/memory.pressure"))
        return CgroupStats(
            path=path,
            oom_group=self.parsed(f"{base}/memory.oom.group", cat(f"{base}/memory.oom.group"),
                                  parse_oom_group),
            events=self.parsed_events(f"{base}/memory.events", events_text),
            events_local=self.parsed_events(f"{base}/memory.events.local", local),
            limit_bytes=self.parsed(f"{base}/memory.max", limit, parse_limit),
            usage_bytes=usage,
            peak_bytes=self.parsed(f"{base}/memory.peak", cat(f"{base}/memory.peak"), parse_int),
            pids=pids,
            working_set_bytes=working_set,
            pressure=pressure,
        )

    def memory_use(self, base: str, current: Optional[str], stat: Optional[str],
                   pressure: Optional[str]) -> tuple[Optional[int], Optional[int], Optional[Pressure]]:
        """(usage, working set, pressure) from the texts of memory.current, memory.stat and memory.pressure
        (None where a file is absent, as memory.pressure without PSI); malformed values are counted."""
        usage = self.parsed(f"{base}/memory.current", current, parse_int)
        inactive_file = self.parsed(f"{base}/memory.stat", stat,
                                    lambda text: parse_memory_stat_field(text, "inactive_file"))
        return (usage, working_set_bytes(usage, inactive_file),
                parse_pressure(pressure) if pressure is not None else None)

    def read_pids(self, path: str) -> tuple[int, ...]:
        procs = cat(f"{self.abspath(path)}/cgroup.procs")
        return parse_pids(procs) if procs is not None else ()

    def read_oom_group(self, path: str) -> Optional[int]:
        file = f"{self.abspath(path)}/memory.oom.group"
        return self.parsed(file, cat(file), parse_oom_group)

    def read_local_events(self, path: str) -> tuple[Optional[int], Optional[dict[str, int]]]:
        """(inode of the cgroup directory, memory.events.local); (None, None) when the cgroup is gone. The
        inode tells a cgroup made again under the same path (a restarted systemd unit) from the old one."""
        base = self.abspath(path)
        try:
            ino = os.stat(base).st_ino
        except OSError:
            return None, None
        file = f"{base}/memory.events.local"
        return ino, self.parsed_events(file, cat(file))

    def memory_event_fields(self) -> tuple[str, ...]:
        """Which memory.events keys this kernel has (`oom_group_kill` needs 5.17): read from the first
        child cgroup that has the file (the root has none)."""
        for path in self.walk():
            if path == "/":
                continue
            events, _ = self.read_events(path)
            if events is not None:
                return tuple(events)
        return ()


class Proc:
    """The bits of /proc oomwatch reads."""

    def __init__(self, root: str = "/proc") -> None:
        self.root = root.rstrip("/")

    def cgroup_of(self, pid: int) -> Optional[str]:
        """The cgroup of a living process; None for one that is gone or dying (its file then lies)."""
        stat = cat(f"{self.root}/{pid}/stat")
        if stat is not None and parse_proc_stat_exiting(stat):
            return None
        text = cat(f"{self.root}/{pid}/cgroup")
        return parse_proc_pid_cgroup(text) if text is not None else None

    def own_cgroup(self) -> Optional[str]:
        """This process's cgroup as its own cgroup namespace shows it ("/" inside a container)."""
        text = cat(f"{self.root}/self/cgroup")
        return parse_proc_pid_cgroup(text) if text is not None else None

    def boot_id(self) -> str:
        return (cat(f"{self.root}/sys/kernel/random/boot_id") or "unknown").strip()

    def kernel_release(self) -> str:
        text = cat(f"{self.root}/sys/kernel/osrelease")
        return text.strip() if text else os.uname().release

    def cgroup_version(self, cgroup_root: str) -> str:
        """"v2", "hybrid", "v1" or "none". The root's own `cgroup.controllers` decides first (it is what we
        will read); the mount table says whether memory sits on a v1 hierarchy instead."""
        by_mounts = parse_mounts_cgroup_version(cat(f"{self.root}/self/mounts") or "", cgroup_root)
        controllers = cat(f"{cgroup_root.rstrip('/')}/cgroup.controllers")
        if controllers is None:
            return by_mounts
        if "memory" in controllers.split():
            return "v2"
        return "hybrid" if by_mounts in ("hybrid", "v1") else "v2"


# --- watcher ----------------------------------------------------------------------------------------

CgroupCallback = Callable[[str], None]


class CgroupWatcher:
    """inotify on every cgroup directory (new and removed children), every `memory.events` and every
    `cgroup.events` (the kernel signals each change with IN_MODIFY; `cgroup.events` changes when a cgroup
    gets its first process or loses its last). Blocks in read(): no rescans, no work while nothing happens.

    Callbacks run on the watcher thread: `on_added(path)`, `on_removed(path)`, `on_events(path)`,
    `on_populated(path)`."""

    def __init__(self, fs: CgroupFS, *, on_added: CgroupCallback, on_removed: CgroupCallback,
                 on_events: CgroupCallback, on_populated: CgroupCallback = lambda path: None) -> None:
        import inotify_simple  # imported here: inspect and offline analysis never need it

        self._inotify_simple = inotify_simple
        self.fs = fs
        self.on_added, self.on_removed, self.on_events = on_added, on_removed, on_events
        # memory.max or memory.oom.group written (a runtime setting a container's limits): IN_MODIFY through the
        # VFS. Paths whose limit files could not be watched (max_user_watches) are kept in `unwatched_limits`.
        self.on_limits: CgroupCallback = lambda path: None
        self.on_resync: Callable[[], None] = lambda: None
        self._wd_limits: dict[int, str] = {}
        self._limits_wds: dict[str, list[int]] = {}
        self.unwatched_limits: set[str] = set()
        self.on_populated = on_populated
        self._wd_populated: dict[int, str] = {}
        self._populated_wd: dict[str, int] = {}
        self._inotify = inotify_simple.INotify()
        self._wd_dir: dict[int, str] = {}
        self._wd_events: dict[int, str] = {}
        self._dir_wd: dict[str, int] = {}
        self._events_wd: dict[str, int] = {}
        self._stop_r, self._stop_w = os.pipe()
        self.error: Optional[str] = None
        self.alive = False
        self.callback_errors = 0  # callbacks that raised: logged with their cgroup, the watcher goes on

    def start_watching(self) -> list[str]:
        """Watch the whole tree; returns the cgroups found (the caller's initial state)."""
        found = []
        for path in self.fs.walk():
            if self._watch(path):
                found.append(path)
        return found

    def _watch(self, path: str) -> bool:
        flags = self._inotify_simple.flags
        base = self.fs.abspath(path)
        try:
            wd = self._inotify.add_watch(base, flags.CREATE | flags.DELETE | flags.MOVED_TO | flags.MOVED_FROM
                                         | flags.ONLYDIR | flags.DELETE_SELF)
        except OSError:
            return False  # gone already
        self._wd_dir[wd] = path
        self._dir_wd[path] = wd
        if path != "/":
            try:
                ewd = self._inotify.add_watch(f"{base}/memory.events", flags.MODIFY)
                self._wd_events[ewd] = path
                self._events_wd[path] = ewd
            except OSError:
                pass  # no memory controller here
            try:
                pwd = self._inotify.add_watch(f"{base}/cgroup.events", flags.MODIFY)
                self._wd_populated[pwd] = path
                self._populated_wd[path] = pwd
            except OSError:
                pass
            for name in ("memory.max", "memory.oom.group"):
                try:
                    lwd = self._inotify.add_watch(f"{base}/{name}", flags.MODIFY)
                    self._wd_limits[lwd] = path
                    self._limits_wds.setdefault(path, []).append(lwd)
                except FileNotFoundError:
                    pass  # no memory controller here
                except OSError:
                    self.unwatched_limits.add(path)  # out of watches: its limits are read every time
        return True

    def _forget(self, path: str) -> list[str]:
        gone = [p for p in self._dir_wd if p == path or p.startswith(path.rstrip("/") + "/")]
        for p in gone:
            wd = self._dir_wd.pop(p, None)
            if wd is not None:
                self._wd_dir.pop(wd, None)
            ewd = self._events_wd.pop(p, None)
            if ewd is not None:
                self._wd_events.pop(ewd, None)
            pwd = self._populated_wd.pop(p, None)
            if pwd is not None:
                self._wd_populated.pop(pwd, None)
            for lwd in self._limits_wds.pop(p, ()):
                self._wd_limits.pop(lwd, None)
            self.unwatched_limits.discard(p)
        return gone

    def known(self) -> list[str]:
        return list(self._dir_wd)

    def stop(self) -> None:
        os.write(self._stop_w, b"x")

    def run(self) -> None:
        """The watcher loop; returns on stop()."""
        import select

        flags = self._inotify_simple.flags
        poller = select.poll()
        poller.register(self._inotify.fileno(), select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        self.alive = True
        try:
            while True:
                ready = {fd for fd, _ in poller.poll()}
                if self._stop_r in ready:
                    return
                # Coalesced per read: a cgroup whose memory.events moved five times since the last read is
                # read once (an OOM storm moves every ancestor's counters with every kill).
                events_changed: dict[str, None] = {}
                populated: dict[str, None] = {}
                limits: dict[str, None] = {}
                for event in self._inotify.read(timeout=0):
                    if event.mask & flags.Q_OVERFLOW:
                        log.warning("inotify queue overflowed; re-reading the cgroup tree")
                        self._resync()
                        continue
                    if event.wd in self._wd_events and event.mask & flags.MODIFY:
                        events_changed[self._wd_events[event.wd]] = None
                        continue
                    if event.wd in self._wd_populated and event.mask & flags.MODIFY:
                        populated[self._wd_populated[event.wd]] = None
                        continue
                    if event.wd in self._wd_limits and event.mask & flags.MODIFY:
                        limits[self._wd_limits[event.wd]] = None
                        continue
                    parent = self._wd_dir.get(event.wd)
                    if parent is None:
                        continue
                    if event.mask & flags.DELETE_SELF:
                        for p in self._forget(parent):
                            self._call(self.on_removed, p)
                        continue
                    if not event.mask & flags.ISDIR:
                        continue
                    child = ("" if parent == "/" else parent) + "/" + event.name
                    if event.mask & (flags.CREATE | flags.MOVED_TO):
                        self._add_subtree(child)
                    elif event.mask & (flags.DELETE | flags.MOVED_FROM):
                        for p in self._forget(child):
                            self._call(self.on_removed, p)
                for path in events_changed:
                    if path in self._events_wd:  # not removed in the same batch
                        self._call(self.on_events, path)
                for path in populated:
                    if path in self._populated_wd:
                        self._call(self.on_populated, path)
                for path in limits:
                    if path in self._limits_wds:
                        self._call(self.on_limits, path)
        except Exception as exc:  # the agent reports this in /healthz
            self.error = f"cgroup watcher stopped: {exc}"
            log.exception("cgroup watcher stopped")
        finally:
            self.alive = False

    def _call(self, callback: CgroupCallback, path: str) -> None:
        """One cgroup's trouble (a file no kernel writes, a bug) must not stop the watch of all the others."""
        try:
            callback(path)
        except Exception:
            self.callback_errors += 1
            log.exception("cgroup watcher: handling %s failed; going on with the other cgroups", path)

    def _add_subtree(self, path: str) -> None:
        # Children may have been created before our watch on `path` existed: walk them too.
        for sub in CgroupFS(self.fs.abspath(path)).walk():
            full = path if sub == "/" else path + sub
            if full not in self._dir_wd and self._watch(full):
                self._call(self.on_added, full)

    def _resync(self) -> None:
        self.on_resync()
        present = set(self.fs.walk())
        for path in list(self._dir_wd):
            if path not in present:
                for p in self._forget(path):
                    self._call(self.on_removed, p)
        for path in sorted(present):
            if path not in self._dir_wd and self._watch(path):
                self._call(self.on_added, path)
