"""Thin readers for the cgroup v2 tree and /proc, and an inotify watcher that reports changes.

Cgroups come and go all the time: a file or directory that vanishes mid-read is normal and yields None /
nothing, never an exception. Parsing is in oomwatch/parse/cgroup.py.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import threading
import time
from typing import Any, Callable, Iterator, NamedTuple, Optional

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
from oomwatch.sources.inotify import INotify, flags as inotify_flags

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

    def walk(self, on_error: Optional[Callable[[str, OSError], None]] = None) -> Iterator[str]:
        """Every cgroup below the root, parents before children. A directory that cannot be listed is yielded
        without its children; `on_error(path, error)` hears of it unless it is simply gone (ENOENT)."""
        stack = ["/"]
        while stack:
            path = stack.pop()
            yield path
            try:
                with os.scandir(self.abspath(path)) as it:
                    children = sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
            except OSError as exc:
                if on_error is not None and not isinstance(exc, (FileNotFoundError, NotADirectoryError)):
                    on_error(path, exc)
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
        st, local = self.read_dir_and_local_events(path)
        return (st.st_ino if st is not None else None), local

    def read_dir_and_local_events(self, path: str) -> tuple[Optional[os.stat_result], Optional[dict[str, int]]]:
        """The cgroup directory's stat (its inode, and its owner: who may create cgroups below it) and
        memory.events.local; (None, None) when the cgroup is gone."""
        base = self.abspath(path)
        try:
            st = os.stat(base)
        except OSError:
            return None, None
        file = f"{base}/memory.events.local"
        return st, self.parsed_events(file, cat(file))

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

# What is watched in each cgroup: its directory (children come and go) and four files.
_DIR, _EVENTS, _POPULATED, _MAX, _GROUP = range(5)
_FILES = ((_EVENTS, "memory.events"), (_POPULATED, "cgroup.events"), (_MAX, "memory.max"),
          (_GROUP, "memory.oom.group"))
_FILE_NAMES = dict(_FILES)
_SIGNALLED = (1 << _EVENTS) | (1 << _MAX) | (1 << _GROUP)  # files a scrape keeps until inotify says they moved
# add_watch errors that mean "out of inotify watches" (ENOMEM: the kernel could not allocate one) and "this agent
# may not read it" (a non-root agent, a mode-000 directory or file). Anything else but ENOENT counts as the latter.
_STARVED_ERRNOS = (errno.ENOSPC, errno.ENOMEM)
_GONE_ERRNOS = (errno.ENOENT, errno.ENOTDIR)
# While part of the tree cannot be watched, its directories are listed this often: new and removed cgroups under
# them are found late, not never.
UNWATCHED_RESCAN_SECONDS = 30.0
MAX_USER_WATCHES = "/proc/sys/fs/inotify/max_user_watches"
# Inside a user namespace (a container's, on some runtimes) the binding limit can be this one instead.
USER_NS_MAX_WATCHES = "/proc/sys/user/max_inotify_watches"


class WatchHealth(NamedTuple):
    """What the watcher says of itself to other threads (/healthz, the metrics): replaced whole by the thread
    that changes it, so that a reader never walks the watcher's live sets."""

    alive: bool = False
    error: Optional[str] = None  # why it stopped
    blind: Optional[str] = None  # why part of the tree is not watched (None: all of it is)
    unwatched: dict[str, int] = {"inotify_watches": 0, "unreadable": 0}  # cgroups not fully watched, by reason


class CgroupWatcher:
    """inotify on every cgroup directory (new and removed children), every `memory.events` and every
    `cgroup.events` (the kernel signals each change with IN_MODIFY; `cgroup.events` changes when a cgroup
    gets its first process or loses its last). Blocks in read(): no rescans, no work while nothing happens.

    Callbacks run on the watcher thread: `on_added(path)`, `on_removed(path)`, `on_events(path)`,
    `on_populated(path)`.

    A cgroup whose watches cannot all be placed is still reported (on_added) and kept in `known()`: out of
    inotify watches (`fs.inotify.max_user_watches`) or unreadable to this agent. `health` (a WatchHealth,
    replaced whole by the watcher's thread) says why for /healthz and gives the numbers for a metric; the log
    says it once when it starts and once when it ends. `unwatched_limits` holds the cgroups whose memory.events,
    memory.max or memory.oom.group is not watched (a scrape reads those every time). While directories are
    unwatched they are listed every UNWATCHED_RESCAN_SECONDS, and watches freed by removed cgroups are used
    for them again. Removal costs what is removed, not what is watched (a children index)."""

    def __init__(self, fs: CgroupFS, *, on_added: CgroupCallback, on_removed: CgroupCallback,
                 on_events: CgroupCallback, on_populated: CgroupCallback = lambda path: None,
                 inotify: Any = None, max_user_watches: str = MAX_USER_WATCHES) -> None:
        self._flags = inotify_flags
        self.fs = fs
        self.on_added, self.on_removed, self.on_events = on_added, on_removed, on_events
        # memory.max or memory.oom.group written (a runtime setting a container's limits): IN_MODIFY through the
        # VFS. Paths whose signalled files could not be watched are kept in `unwatched_limits` (same set object
        # for the life of the watcher: the scrape holds it).
        self.on_limits: CgroupCallback = lambda path: None
        self.on_resync: Callable[[], None] = lambda: None
        self.on_populated = on_populated
        self.unwatched_limits: set[str] = set()
        self._inotify = inotify if inotify is not None else INotify()
        self._max_user_watches = max_user_watches
        self._known: dict[str, None] = {}  # every cgroup reported, in the order found (parents first)
        self._children: dict[str, set[str]] = {}  # only cgroups that have children
        # wd -> cgroup, one dict per thing watched (no (what, cgroup) tuple per watch: 280 bytes a cgroup), and
        # cgroup -> its wds, one slot per thing watched.
        self._wd_path: tuple[dict[int, str], ...] = tuple({} for _ in range(5))
        self._wds: dict[str, list[Optional[int]]] = {}
        self._missing: dict[str, int] = {}  # cgroup -> bits of what is not watched
        self._unwatched_dirs: set[str] = set()  # cgroups whose directory is not watched (listed instead)
        self._starved: set[str] = set()  # cgroups with a watch refused for want of inotify watches
        self._unreadable: dict[str, str] = {}  # cgroup -> what of it could not be read or watched
        self._freed = False  # watches went away (cgroups removed) since the last retry
        self._said: tuple[bool, bool] = (False, False)  # (starved, unreadable) as last logged
        self._stop_r, self._stop_w = os.pipe()
        self._closed = False
        self.error: Optional[str] = None
        self.alive = False
        self.health = WatchHealth()  # what other threads read of the above (and of the sets), replaced whole
        self._published: tuple = (False, None, 0, 0)
        self.callback_errors = 0  # callbacks that raised: logged with their cgroup, the watcher goes on
        # Counters for metrics: each time a cgroup became not fully watched, by reason (not each refused call, nor
        # each retry).
        self.watch_errors = 0  # out of inotify watches (ENOSPC, ENOMEM)
        self.unreadable_errors = 0  # refused for permission (or any other error but ENOENT)

    # --- what is known ---------------------------------------------------------------------------------

    def known(self) -> list[str]:
        return list(self._known)

    def subtree(self, path: str) -> list[str]:
        """`path` and every known cgroup below it, parents first; in time of the subtree's size."""
        if path not in self._known:
            return []
        found, stack = [], [path]
        while stack:
            p = stack.pop()
            found.append(p)
            stack.extend(self._children.get(p, ()))
        return found

    def _blind(self) -> Optional[str]:
        """Why part of the tree is not watched; None while every cgroup is (on the watcher's thread)."""
        parts = []
        if self._starved:
            parts.append(f"{len(self._starved)} cgroup(s) not fully watched: out of inotify watches (raise the "
                         f"sysctl fs.inotify.max_user_watches, now {self._watch_limit()})")
        if self._unreadable:
            parts.append(f"{len(self._unreadable)} cgroup(s) unreadable to this agent (uid {os.geteuid()}), "
                         f"e.g. {next(iter(self._unreadable.values()))}")
        return "; ".join(parts) or None

    def _publish(self) -> None:
        """Replace `health` when what it says changed (on the thread that changes the sets it counts)."""
        seen = (self.alive, self.error, len(self._starved), len(self._unreadable))
        if seen != self._published:
            self._published = seen
            self.health = WatchHealth(self.alive, self.error, self._blind(),
                                      {"inotify_watches": seen[2], "unreadable": seen[3]})

    @property
    def watches(self) -> int:
        """The inotify watches held (each counts against fs.inotify.max_user_watches)."""
        return sum(map(len, self._wd_path))

    # --- watching --------------------------------------------------------------------------------------

    def start_watching(self) -> list[str]:
        """Watch the whole tree; returns the cgroups found (the caller's initial state)."""
        found = [path for path in self.fs.walk(on_error=self._listing_failed) if self.watch(path)]
        self._say()
        return found

    def _listing_failed(self, path: str, exc: OSError) -> None:
        if path in self._known:
            self._refused(path, _DIR, f"{self.fs.abspath(path)} (listing)", exc)

    def watch(self, path: str) -> bool:
        """Watch a cgroup and record it as known (the loop does for each cgroup it finds); False when it is gone
        already."""
        flags = self._flags
        base = self.fs.abspath(path)
        try:
            wd = self._inotify.add_watch(base, flags.CREATE | flags.DELETE | flags.MOVED_TO | flags.MOVED_FROM
                                         | flags.ONLYDIR | flags.DELETE_SELF)
        except OSError as exc:
            if exc.errno in _GONE_ERRNOS:
                return False
            wd = None
            self._know(path)
            self._refused(path, _DIR, base, exc)
        else:
            self._know(path)
            self._add_wd(path, _DIR, wd)
        if path != "/":
            for what, name in _FILES:
                self._watch_file(path, what, f"{base}/{name}")
        return True

    def _know(self, path: str) -> None:
        if path in self._known:
            return
        self._known[path] = None
        parent = _parent(path)
        if parent is not None:
            self._children.setdefault(parent, set()).add(path)

    def _watch_file(self, path: str, what: int, file: str) -> bool:
        try:
            wd = self._inotify.add_watch(file, self._flags.MODIFY)
        except OSError as exc:
            if exc.errno not in _GONE_ERRNOS:  # ENOENT: no memory controller here (or gone)
                self._refused(path, what, file, exc)
            return False
        self._add_wd(path, what, wd)
        return True

    def _add_wd(self, path: str, what: int, wd: int) -> None:
        slots = self._wds.get(path)
        if slots is None:
            slots = self._wds[path] = [None] * 5
        slots[what] = wd
        self._wd_path[what][wd] = path

    def _watched(self, wd: int) -> Optional[tuple[int, str]]:
        # memory.events first: in a storm nearly every event is one
        for what in (_EVENTS, _POPULATED, _DIR, _MAX, _GROUP):
            path = self._wd_path[what].get(wd)
            if path is not None:
                return what, path
        return None

    def _refused(self, path: str, what: int, name: str, exc: OSError) -> None:
        """A watch (or listing) of `path` refused; counted once per cgroup and reason, not per retry."""
        self._missing[path] = self._missing.get(path, 0) | (1 << what)
        if what == _DIR:
            self._unwatched_dirs.add(path)
        if (1 << what) & _SIGNALLED:
            self.unwatched_limits.add(path)  # a scrape reads its signalled files every time
        if exc.errno in _STARVED_ERRNOS:
            if path not in self._starved:
                self.watch_errors += 1
                self._starved.add(path)
        elif path not in self._unreadable:
            self.unreadable_errors += 1
            self._unreadable[path] = f"{name}: {exc.strerror or exc}"

    def forget(self, path: str) -> list[str]:
        """Drop `path` and its subtree, their watches freed (the loop does when a cgroup's directory is removed);
        returns the cgroups dropped, parents first."""
        gone = self.subtree(path)
        parent = _parent(path)
        if gone and parent is not None:
            siblings = self._children.get(parent)
            if siblings is not None:
                siblings.discard(path)
                if not siblings:
                    del self._children[parent]
        for p in gone:
            del self._known[p]
            self._children.pop(p, None)
            for what, wd in enumerate(self._wds.pop(p, ())):
                if wd is not None:
                    self._wd_path[what].pop(wd, None)
                    self._freed = True
            self._missing.pop(p, None)
            self._unwatched_dirs.discard(p)
            self._starved.discard(p)
            self._unreadable.pop(p, None)
            self.unwatched_limits.discard(p)
        return gone

    def stop(self) -> None:
        if not self._closed:  # (a watcher whose run() ended and was closed has nothing to stop)
            os.write(self._stop_w, b"x")

    def close(self) -> None:
        """Release the inotify descriptor and its watches (after run() has returned); once."""
        if self._closed:
            return
        self._closed = True
        self._inotify.close()
        for fd in (self._stop_r, self._stop_w):
            os.close(fd)

    def run(self) -> None:
        """The watcher loop; returns on stop()."""
        import select

        flags = self._flags
        # What a cgroup's watches say that matters: a file modified, the directory itself gone, a child directory
        # made, removed or moved (IN_ISDIR is set only for directories)
        wanted = flags.MODIFY | flags.DELETE_SELF | flags.ISDIR
        try:
            poller = select.poll()
            poller.register(self._inotify.fileno(), select.POLLIN)
            poller.register(self._stop_r, select.POLLIN)
            self.alive = True
            self._publish()
            rescan_at = time.monotonic() + UNWATCHED_RESCAN_SECONDS
            while True:
                # Blocks for good while everything is watched; wakes to list unwatched directories otherwise.
                unwatched = bool(self._unwatched_dirs or self._starved or self._unreadable)
                timeout = max(0, int((rescan_at - time.monotonic()) * 1000)) if unwatched else None
                ready = {fd for fd, _ in poller.poll(timeout)}
                if self._stop_r in ready:
                    return
                if unwatched and time.monotonic() >= rescan_at:  # due, however busy inotify is
                    self._rescan_unwatched()
                    self._say()
                if time.monotonic() >= rescan_at:
                    rescan_at = time.monotonic() + UNWATCHED_RESCAN_SECONDS
                if self._inotify.fileno() not in ready:
                    continue
                # Coalesced per read: a cgroup whose memory.events moved five times since the last read is
                # read once (an OOM storm moves every ancestor's counters with every kill).
                events_changed: dict[str, None] = {}
                populated: dict[str, None] = {}
                limits: dict[str, None] = {}
                overflowed = False
                for event in self._inotify.read(timeout=0):
                    if event.mask & flags.Q_OVERFLOW:
                        overflowed = True  # one rescan for the batch, after its events (it sees what they said)
                        continue
                    if not event.mask & wanted:
                        continue  # a watch dropped with its file, a file made or removed in a cgroup: 5 of 7 a rmdir
                    watched = self._watched(event.wd)
                    if watched is None:
                        continue
                    what, path = watched
                    if what != _DIR:
                        if event.mask & flags.MODIFY:
                            (events_changed if what == _EVENTS else populated if what == _POPULATED
                             else limits)[path] = None
                        continue
                    if event.mask & flags.DELETE_SELF:
                        for p in self.forget(path):
                            self._call(self.on_removed, p)
                        continue
                    if not event.mask & flags.ISDIR:
                        continue
                    child = ("" if path == "/" else path) + "/" + event.name
                    if event.mask & (flags.CREATE | flags.MOVED_TO):
                        self._add_subtree(child)
                    elif event.mask & (flags.DELETE | flags.MOVED_FROM):
                        for p in self.forget(child):
                            self._call(self.on_removed, p)
                for path in events_changed:
                    if path in self._known:  # not removed in the same batch
                        self._call(self.on_events, path)
                for path in populated:
                    if path in self._known:
                        self._call(self.on_populated, path)
                for path in limits:
                    if path in self._known:
                        self._call(self.on_limits, path)
                if overflowed:
                    log.warning("inotify queue overflowed; re-reading the cgroup tree")
                    self._resync(events_changed)
                if self._freed and self._starved:
                    self._rewatch()
                self._freed = False
                self._say()
        except Exception as exc:  # the agent reports this in /healthz
            self.error = f"cgroup watcher stopped: {exc}"
            log.exception("cgroup watcher stopped")
        finally:
            self.alive = False
            self._publish()

    def _call(self, callback: CgroupCallback, path: str) -> None:
        """One cgroup's trouble (a file no kernel writes, a bug) must not stop the watch of all the others."""
        try:
            callback(path)
        except Exception:
            self.callback_errors += 1
            log.exception("cgroup watcher: handling %s failed; going on with the other cgroups", path)

    def _add_subtree(self, path: str) -> None:
        # Children may have been created before our watch on `path` existed: walk them too.
        sub_fs = CgroupFS(self.fs.abspath(path))
        for sub in sub_fs.walk(on_error=lambda p, exc: self._listing_failed(path if p == "/" else path + p, exc)):
            full = path if sub == "/" else path + sub
            if full not in self._known and self.watch(full):
                self._call(self.on_added, full)

    def _resync(self, read_already: Optional[dict[str, None]] = None) -> None:
        """After an overflow: the tree listed again (cgroups made and removed meanwhile), and the memory.events of
        every cgroup re-read (a counter that moved while its event was dropped is a kill to count)."""
        self.on_resync()
        present = set(self.fs.walk(on_error=self._listing_failed))
        for path in list(self._known):
            if path not in present:
                for p in self.forget(path):
                    self._call(self.on_removed, p)
        for path in sorted(present):
            if path not in self._known and self.watch(path):
                self._call(self.on_added, path)
        for path in list(self._known):
            if path != "/" and path not in (read_already or ()):
                self._call(self.on_events, path)
        if self._starved:
            self._rewatch()

    def _rewatch(self) -> None:
        """Place the watches refused for want of watches, while the kernel gives them (removed cgroups freed
        some). Stops at the first refusal: the cost is what is placed, not what is missing."""
        while self._starved:
            for path in list(itertools.islice(self._starved, 64)):
                if not self._retry(path):  # True takes `path` out of _starved
                    return

    def _retry(self, path: str) -> bool:
        """Try the watches `path` lacks again; False when the kernel is still out of watches. A directory
        watched now is listed for what it gained meanwhile."""
        if path not in self._known:
            self._starved.discard(path)
            return True
        bits = self._missing.get(path, 0)
        base = self.fs.abspath(path)
        flags = self._flags
        for what in range(5):
            if not bits & (1 << what):
                continue
            if what == _DIR:
                target, mask = base, (flags.CREATE | flags.DELETE | flags.MOVED_TO | flags.MOVED_FROM
                                      | flags.ONLYDIR | flags.DELETE_SELF)
            else:
                target, mask = f"{base}/{_FILE_NAMES[what]}", flags.MODIFY
            try:
                wd = self._inotify.add_watch(target, mask)
            except OSError as exc:
                if exc.errno in _GONE_ERRNOS:
                    bits &= ~(1 << what)
                    continue
                if exc.errno in _STARVED_ERRNOS:
                    self._starved.add(path)  # (a path retried as unreadable may have been out of watches)
                    self._settle(path, bits)
                    return False
                self._unreadable.setdefault(path, f"{target}: {exc.strerror or exc}")
                continue
            self._add_wd(path, what, wd)  # (the same wd again where the inode was watched already)
            bits &= ~(1 << what)
            if what == _DIR:
                self._unwatched_dirs.discard(path)
                self._missing[path] = bits
                self._list_children(path)
                if path not in self._known:  # gone meanwhile: forgotten with its watches
                    return True
        self._settle(path, bits)
        self._starved.discard(path)  # what is still missing now is missing for want of read access
        return True

    def _settle(self, path: str, bits: int) -> None:
        if path not in self._known:
            return
        if bits:
            self._missing[path] = bits
            return
        self._missing.pop(path, None)
        self._unwatched_dirs.discard(path)
        self._starved.discard(path)
        self._unreadable.pop(path, None)
        self.unwatched_limits.discard(path)

    def _rescan_unwatched(self) -> None:
        """Every UNWATCHED_RESCAN_SECONDS while part of the tree is not watched: try the refused watches
        again, and list the directories still not watched for cgroups made or removed under them since."""
        if self._starved:
            self._rewatch()
        for path in list(self._unreadable):
            if not self._retry(path):
                break
        for path in list(self._unwatched_dirs):
            if path in self._known:
                self._list_children(path)

    def _list_children(self, path: str) -> None:
        base = self.fs.abspath(path)
        try:
            with os.scandir(base) as it:
                names = {e.name for e in it if e.is_dir(follow_symlinks=False)}
        except (FileNotFoundError, NotADirectoryError):
            for p in self.forget(path):
                self._call(self.on_removed, p)
            return
        except OSError as exc:  # unreadable
            self._refused(path, _DIR, f"{base} (listing)", exc)
            return
        prefix = "" if path == "/" else path
        present = {f"{prefix}/{name}" for name in names}
        for child in sorted(self._children.get(path, set()) - present):
            for p in self.forget(child):
                self._call(self.on_removed, p)
        for child in sorted(present):
            if child not in self._known:
                self._add_subtree(child)

    def _watch_limit(self) -> str:
        """The limit in force: the smaller of the sysctl and this user namespace's own."""
        limits = [int(t) for t in (cat(self._max_user_watches), cat(USER_NS_MAX_WATCHES))
                  if t is not None and t.strip().isdigit()]
        return str(min(limits)) if limits else "unknown"

    def _say(self) -> None:
        """One log line when part of the tree stops being watched, one when all of it is again; `health` anew."""
        self._publish()
        now = (bool(self._starved), bool(self._unreadable))
        if now == self._said:
            return
        starved, unreadable = now
        if starved and not self._said[0]:
            limit = self._watch_limit()
            suggest = (str(max(int(limit) * 2, int(limit) + 5 * len(self._starved))) if limit.isdigit()
                       else "<a larger value>")
            log.error("inotify watches exhausted: %d cgroup(s) are not fully watched (fs.inotify.max_user_watches="
                      "%s, shared by every process of this user); their OOM counters are read at each scrape "
                      "instead of when they move, and new cgroups under them are found by a listing every %.0f s. "
                      "Raise the sysctl: sysctl -w fs.inotify.max_user_watches=%s (and user.max_inotify_watches where "
                      "the agent runs in a user namespace)", len(self._starved), limit,
                      UNWATCHED_RESCAN_SECONDS, suggest)
        elif not starved and self._said[0]:
            log.warning("inotify watches: every cgroup is watched again")
        if unreadable and not self._said[1]:
            what = next(iter(self._unreadable.values()))
            log.error("%d cgroup(s) are unreadable to this agent (uid %d), e.g. %s; their series may be missing "
                      "and their changes unseen: run the agent as root or give it read access",
                      len(self._unreadable), os.geteuid(), what)
        elif not unreadable and self._said[1]:
            log.warning("every cgroup is readable to this agent again")
        self._said = now


def _parent(path: str) -> Optional[str]:
    if path == "/":
        return None
    parent = path.rsplit("/", 1)[0]
    return parent or "/"
