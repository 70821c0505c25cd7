"""The JSON-lines events file: one incident per line, appended as it is published, and beside them one line per
death's verdict (`"record": "death"`, oomwatch.deaths), which readers of incidents skip.

Idempotent across a crash, with the state file as the record of what was published: with a state directory the
agent holds each line until the state that counts its incident is saved (`hold=True`, then `flush()`), and at
start `catch_up()` writes the incidents the saved state holds and the file lacks (a crash between the two
writes). So a line is never written for an incident the next start will publish again (or count from
memory.events), and none the state counts is missing. On open, the keys of the incidents in the file's tail are
read back, and an incident already written is not written again.

The path must name a regular file (or be `-`, stdout): it is opened without following a symlink and without
blocking (a FIFO with no reader would hang the agent before its port opens), and anything but a regular file
(FIFO, device, socket, directory) is refused. A torn last line (a crash or a full disk mid-write) gets its newline
before the next line, so every later line parses. The file never stops the agent: a file that cannot be opened
or written is said once in the log when it starts failing and once when it works again (`failing` holds why, for
/healthz). Each incident not written when published is counted in `errors`, and the last UNWRITTEN_KEPT of
them are written first once writing works again (a full disk freed soon loses none).

Bounded in memory whatever is replayed through it: it remembers the keys of the last WRITTEN_KEYS_KEPT lines
(a replay of 200k kills remembered 200k keys), and a held line is kept as its encoded text, not as a dict.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import stat
import sys
import threading
from collections import deque
from typing import Any, Optional

from oomwatch.model import Incident, death_key_of_json, incident_key_of_json

log = logging.getLogger(__name__)

# How much of an existing file is read back for keys: far more than one ring buffer's worth of incidents.
TAIL_BYTES = 8 << 20
# Lines kept while the file cannot be written, written first once it can: a full disk freed within this many
# incidents loses none (and the next start writes what the saved state holds and the file lacks).
UNWRITTEN_KEPT = 1000
# Keys of the lines last written that are remembered (the oldest forgotten first): more than the store remembers
# of incidents and deaths (10,000 and 2,000), so what the store publishes again is still known here; about 130
# bytes each.
WRITTEN_KEYS_KEPT = 20_000
# O_NOFOLLOW: a symlink planted at the path is not followed (ELOOP). O_NONBLOCK: opening a FIFO with no reader
# fails (ENXIO) instead of waiting for one. O_NOCTTY: a terminal named by mistake does not become ours.
_OPEN_FLAGS = os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class EventsFile:
    def __init__(self, path: str, hold: bool = False) -> None:
        self.path = path
        self.hold = hold  # keep lines until flush(): the state that counts them is saved first
        self._held: list[tuple[tuple, bytes]] = []  # (key, line): encoded at once, a fraction of the dict's size
        self._lock = threading.Lock()
        self._fd: Optional[int] = None
        self._opened = False  # open() was called (and close() not yet)
        self._refused = False  # the path names something that is not a regular file: not opened again
        self._torn = False  # the file ends in a partial line: a newline goes first
        self._written: dict[tuple, None] = {}  # the keys of the last WRITTEN_KEYS_KEPT lines, oldest first
        self.errors = 0  # incidents that could not be written when published (some may be written later)
        self.dropped = 0  # incidents never written: more than UNWRITTEN_KEPT waited
        self._unwritten: deque[tuple[Optional[tuple], bytes]] = deque()
        self.last_error: Optional[str] = None
        self.failing: Optional[str] = None  # why lines are not being written now; None while they are

    def open(self) -> None:
        """Open the file (never raises: a file that cannot be opened is retried at the next line, unless it is
        not a regular file)."""
        with self._lock:
            self._opened = True
            if self.path != "-":
                self._open_file()

    def _open_file(self) -> bool:
        try:
            try:
                fd = os.open(self.path, os.O_RDWR | _OPEN_FLAGS, 0o666)
            except PermissionError:  # writable but not readable: no keys to read back, no tear to see
                fd = os.open(self.path, os.O_WRONLY | _OPEN_FLAGS, 0o666)
        except OSError as exc:
            self._failed(_open_error(self.path, exc))
            return False
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                self._refused = True
                self._failed(f"{self.path} is {_kind(info.st_mode)}, not a regular file; nothing is written to it "
                             "(use a regular file, or - for stdout)")
                os.close(fd)
                return False
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
            tail = _read_tail(fd, info.st_size)
        except OSError as exc:
            os.close(fd)
            self._failed(f"{self.path}: {exc.strerror or exc}")
            return False
        self._fd = fd
        if tail is not None:
            for key in _keys_in_tail(tail, info.st_size > len(tail)):
                self._remember(key)
            self._torn = bool(tail) and not tail.endswith(b"\n")
        if self._torn:
            self._write_line(b"")  # repaired now, while nothing else is being written
        return True

    def publish(self, incident: Incident) -> None:
        key = incident.key
        if key in self._written:
            return
        if self.hold:
            self._held.append((key, _line(incident.to_json())))
            return
        self.write(incident.to_json(), key)

    def publish_death(self, death_json: dict[str, Any]) -> None:
        """A death's verdict (oomwatch.deaths.Death.to_json), held like an incident until the state that counts
        it is saved; written once (its key is read back from the file's tail on open)."""
        key = death_key_of_json(death_json)
        if key is None or key in self._written:
            return
        if self.hold:
            self._held.append((key, _line(death_json)))
            return
        self.write(death_json, key)

    def flush(self) -> None:
        """Write the held lines (their incidents are in the saved state now)."""
        held, self._held = self._held, []
        for key, line in held:
            if key not in self._written:
                self._write_line_of(key, line)

    def catch_up(self, published: list[dict[str, Any]]) -> int:
        """Write the incidents the saved state holds (JSON, oldest first) that the file lacks; how many."""
        written = 0
        for data in published:
            key = incident_key_of_json(data)
            if key is not None and _hashable(key) not in self._written and self.write(data, _hashable(key)):
                written += 1
        return written

    def write(self, incident_json: dict[str, Any], key: Optional[tuple] = None) -> bool:
        """One line (the incident `key` is then known to be in the file); False when it could not be written
        now: counted, said in the log once per failing spell, and kept (up to UNWRITTEN_KEPT lines, oldest
        first) to be written before the next line once writing works again."""
        return self._write_line_of(key, _line(incident_json))

    def _write_line_of(self, key: Optional[tuple], line: bytes) -> bool:
        with self._lock:
            if self._unwritten:
                if not self._write_unwritten():
                    self._keep_unwritten(key, line)
                    return False
                if key is not None and key in self._written:  # it was one of the kept lines
                    return True
            if self._put(line):
                if key is not None:
                    self._remember(key)
                return True
            self._keep_unwritten(key, line)
            return False

    def _put(self, line: bytes) -> bool:
        if self.path == "-":
            try:
                sys.stdout.write(line.decode())
                sys.stdout.flush()
            except (OSError, ValueError) as exc:  # a closed pipe; ValueError: stdout closed
                self._failed(f"stdout: {exc}")
                return False
            self._ok()
            return True
        if self._fd is None and not (self._opened and not self._refused and self._open_file()):
            return False
        return self._write_line(line)

    def _keep_unwritten(self, key: Optional[tuple], line: bytes) -> None:
        self.errors += 1
        if len(self._unwritten) >= UNWRITTEN_KEPT:
            self._unwritten.popleft()
            self.dropped += 1
        self._unwritten.append((key, line))

    def _write_unwritten(self) -> bool:
        """The lines a failing spell kept, oldest first; False at the first that still fails."""
        while self._unwritten:
            key, line = self._unwritten[0]
            if not self._put(line):
                return False
            self._unwritten.popleft()
            if key is not None:
                self._remember(key)
        return True

    def _remember(self, key: tuple) -> None:
        self._written[key] = None
        if len(self._written) > WRITTEN_KEYS_KEPT:
            del self._written[next(iter(self._written))]

    def _write_line(self, line: bytes) -> bool:
        """Append `line` (after the newline a torn last line needs) in one write: O_APPEND keeps it whole
        against other writers; a short write (the disk filled up mid-line) leaves a tear for the next line."""
        assert self._fd is not None
        prefix = b"\n" if self._torn else b""
        data = prefix + line
        done = 0
        try:
            while done < len(data):
                n = os.write(self._fd, data[done:])
                if n <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                done += n
        except OSError as exc:
            if done >= len(prefix):
                self._torn = done > len(prefix)
            self._failed(f"{self.path}: {exc.strerror or exc}")
            return False
        self._torn = False
        if line:
            self._ok()
        return True

    def _failed(self, reason: str) -> None:
        self.last_error = reason
        if self.failing is None:
            # Once per spell: a full disk fails every incident, and 20,000 identical lines help no one.
            log.error("events file: %s; incidents are not written to it until it works again (they stay in "
                      "/incidents and the state)", reason)
        self.failing = reason

    def _ok(self) -> None:
        if self.failing is not None:
            log.warning("events file %s: writing again; %d line(s) kept while it failed are written first "
                        "(%d more were dropped)", self.path, len(self._unwritten), self.dropped)
            self.failing = None

    def close(self) -> None:
        with self._lock:
            self._opened = False
            if self._fd is not None:
                try:
                    os.close(self._fd)
                except OSError as exc:
                    log.error("cannot close events file %s: %s", self.path, exc.strerror or exc)
            self._fd = None


def _read_tail(fd: int, size: int) -> Optional[bytes]:
    """The last TAIL_BYTES of the file; None when it cannot be read (opened write-only)."""
    if size == 0:
        return b""
    start = max(0, size - TAIL_BYTES)
    chunks = []
    try:
        while start < size:
            chunk = os.pread(fd, min(1 << 20, size - start), start)
            if not chunk:
                break
            chunks.append(chunk)
            start += len(chunk)
    except OSError as exc:
        if exc.errno == errno.EBADF:
            return None
        raise
    return b"".join(chunks)


def _line(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, sort_keys=False, separators=(",", ":")) + "\n").encode()


def keys_of_tail(tail: bytes, cut: bool) -> set[tuple]:
    """Keys of the incidents in an events file's tail (`cut`: its first line is partial; a torn last line
    does not parse and is skipped)."""
    return set(_keys_in_tail(tail, cut))


def _keys_in_tail(tail: bytes, cut: bool) -> list[tuple]:
    """keys_of_tail, in the file's order."""
    keys: list[tuple] = []
    lines = tail.split(b"\n")
    if cut:
        lines = lines[1:]
    for line in lines:
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            key = incident_key_of_json(data) or death_key_of_json(data)
            if key is not None:
                keys.append(_hashable(key))
    return keys


def written_keys(path: str) -> set[tuple]:
    """Keys of the incidents in the last TAIL_BYTES of an events file (a torn last line is skipped); nothing
    for a path that is not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return set()
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return set()
        tail = _read_tail(fd, info.st_size)
    except OSError:
        return set()
    finally:
        os.close(fd)
    return keys_of_tail(tail or b"", info.st_size > TAIL_BYTES)


def _open_error(path: str, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return f"{path} is a symlink; it is not followed and nothing is written (name the file itself)"
    if exc.errno == errno.ENXIO:
        return f"{path} is a FIFO with no reader (or a device without one); nothing is written to it"
    return f"{path}: {exc.strerror or exc}"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _hashable(key: tuple) -> tuple:
    return tuple(tuple(x) if isinstance(x, list) else x for x in key)
