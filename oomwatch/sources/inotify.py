"""inotify(7) through the libc this process already has mapped: what the agent's watchers use of it (an instance,
watches added and removed, events read), in inotify_simple's shape (INotify, flags, Event).

inotify_simple looks libc up with ctypes.util.find_library, which imports subprocess, shutil and tempfile and runs
`/sbin/ldconfig -p` in a child process, at every start of the agent (issue 30 item 4: slow under emulation).
`ctypes.CDLL(None)` is the running process's own symbols, glibc's inotify functions among them.
"""

from __future__ import annotations

import os
import select
import struct
from typing import NamedTuple, Optional

_HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name, NUL-padded)


class flags:  # noqa: N801 (inotify_simple's name: the watchers and their tests spell masks as flags.X)
    """The IN_* masks of <sys/inotify.h>."""

    ACCESS = 0x1
    MODIFY = 0x2
    ATTRIB = 0x4
    CLOSE_WRITE = 0x8
    CLOSE_NOWRITE = 0x10
    OPEN = 0x20
    MOVED_FROM = 0x40
    MOVED_TO = 0x80
    CREATE = 0x100
    DELETE = 0x200
    DELETE_SELF = 0x400
    MOVE_SELF = 0x800
    UNMOUNT = 0x2000
    Q_OVERFLOW = 0x4000
    IGNORED = 0x8000
    ONLYDIR = 0x1000000
    DONT_FOLLOW = 0x2000000
    EXCL_UNLINK = 0x4000000
    MASK_ADD = 0x20000000
    ISDIR = 0x40000000
    ONESHOT = 0x80000000


class Event(NamedTuple):
    wd: int
    mask: int
    cookie: int
    name: str


class INotify:
    """One inotify instance (close-on-exec, non-blocking: read() waits in poll, never in read)."""

    def __init__(self) -> None:
        import ctypes  # already imported by the start (the reader process, malloc tuning)

        self._libc, self._errno = ctypes.CDLL(None, use_errno=True), ctypes.get_errno
        self._fd = self._call(self._libc.inotify_init1, os.O_CLOEXEC | os.O_NONBLOCK)

    def _call(self, function, *args) -> int:
        while True:
            result = function(*args)
            if result != -1:
                return result
            errno = self._errno()
            if errno != 4:  # EINTR: again
                raise OSError(errno, os.strerror(errno))

    def fileno(self) -> int:
        return self._fd

    def add_watch(self, path: str, mask: int) -> int:
        return self._call(self._libc.inotify_add_watch, self._fd, os.fsencode(path), mask)

    def rm_watch(self, wd: int) -> None:
        self._call(self._libc.inotify_rm_watch, self._fd, wd)

    def read(self, timeout: Optional[int] = None) -> list[Event]:
        """The events queued now; with none, wait up to `timeout` milliseconds (None: until there are some)."""
        data = self._read_all()
        if not data and timeout != 0:
            poller = select.poll()
            poller.register(self._fd, select.POLLIN)
            if poller.poll(timeout):
                data = self._read_all()
        return parse_events(data)

    def _read_all(self) -> bytes:
        chunks = []
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def parse_events(data: bytes) -> list[Event]:
    events, at = [], 0
    while at + _HEADER.size <= len(data):
        wd, mask, cookie, size = _HEADER.unpack_from(data, at)
        at += _HEADER.size
        events.append(Event(wd, mask, cookie, os.fsdecode(data[at:at + size].rstrip(b"\0"))))
        at += size
    return events
