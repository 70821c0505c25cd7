"""Thin readers for the kernel log: live /dev/kmsg, or a saved dump / `dmesg` / `journalctl -k` text.

Both yield `KmsgRecord`s and `Lost(n)` markers; neither interprets what the records say.
"""

from __future__ import annotations

import errno
import os
import select
import stat
import sys
from dataclasses import dataclass
from typing import BinaryIO, Iterator, Optional, Union

from oomwatch.model import KmsgRecord
from oomwatch.parse.kmsg import GARBLED, LOST_MARKER, KmsgParseError, parse_kmsg_record, parse_text_log
from oomwatch.parse.prefilter import skippable_seq

READ_SIZE = 8192  # one read returns one record; the kernel caps a record well below this
CHASE_RECORDS = 64  # overwritten again within this many records after an EPIPE: jump to the newest


@dataclass(frozen=True)
class Lost:
    """Records the reader could not get. `count` is None when the size of the gap is unknown."""

    count: Optional[int]


@dataclass(frozen=True)
class Skipped:
    """`count` records that cannot be part of an OOM report were read and not parsed; `last_seq` is the
    sequence number of the last (the cursor may move past them)."""

    count: int
    last_seq: Optional[int]


@dataclass(frozen=True)
class Garbled:
    """A record that did not parse (counted, never fatal)."""

    raw: bytes


KmsgItem = Union[KmsgRecord, Lost, Garbled, Skipped]


class KmsgUnavailable(Exception):
    """The kernel log cannot be read; the message says why and what would fix it."""


def is_live_kmsg(path: str) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def explain_open_error(path: str, exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return f"{path} does not exist"
    if exc.errno in (errno.EPERM, errno.EACCES):
        if exc.errno == errno.EPERM:
            return (f"{path}: permission denied (EPERM: in a container, the runtime's device cgroup refuses "
                    "/dev/kmsg unless it is privileged; on a host, printk_devkmsg=off, or CAP_SYSLOG missing "
                    "while kernel.dmesg_restrict=1); run as root or grant CAP_SYSLOG")
        return f"{path}: permission denied; run as root or grant CAP_SYSLOG"
    return f"{path}: {exc.strerror or exc}"


class LiveKmsg:
    """/dev/kmsg, read non-blocking. Each read() returns one record; EPIPE means records were overwritten
    before we read them, and the next read continues with the oldest record still there."""

    def __init__(self, path: str = "/dev/kmsg", prefilter: bool = False) -> None:
        self.path = path
        self.fd: Optional[int] = None
        self._last_seq: Optional[int] = None
        self.prefilter = prefilter  # records that cannot be OOM lines come out as Skipped counts, unparsed
        self.jumps = 0  # times the reader jumped to the newest record rather than chase the tail

    def open(self, after_seq: Optional[int] = None) -> None:
        """Open; with `after_seq`, records up to it are skipped and a gap after it is reported as lost."""
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise KmsgUnavailable(explain_open_error(self.path, exc)) from exc
        self._last_seq = after_seq

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def read_available(self, limit: int = 1 << 62) -> Iterator[KmsgItem]:
        """Every record available now (at most `limit`); returns when a read would block."""
        assert self.fd is not None
        skipped = 0
        since_epipe = CHASE_RECORDS
        # Locals: this loop runs once per record of a storm, most of them skipped.
        read, fd, size = os.read, self.fd, READ_SIZE
        skip = skippable_seq if self.prefilter else None
        for _ in range(limit):
            try:
                raw = read(fd, size)
            except BlockingIOError:
                break
            except BrokenPipeError:
                # The gap is measured from the sequence numbers of the next record we get. Overwritten again
                # within a few records: the reader is more than a ring behind and would only chase the tail;
                # jump to the newest record instead (the kills in between are counted from memory.events).
                if since_epipe < CHASE_RECORDS:
                    os.lseek(fd, 0, os.SEEK_END)
                    self.jumps += 1
                since_epipe = 0
                continue
            except OSError as exc:
                if exc.errno == errno.EINVAL:  # buffer too small for a record: cannot happen at 8 KiB
                    yield Garbled(b"")
                    continue
                raise
            if not raw:
                break
            since_epipe += 1
            if skip is not None:
                seq = skip(raw)
                if seq is not None:
                    last = self._last_seq
                    if last is not None and seq != last + 1:
                        if seq <= last:
                            continue  # already processed before a restart
                        if skipped:
                            yield Skipped(skipped, last)
                            skipped = 0
                        yield Lost(seq - last - 1)
                    self._last_seq = seq
                    skipped += 1
                    continue
            if skipped:
                yield Skipped(skipped, self._last_seq)
                skipped = 0
            try:
                record = parse_kmsg_record(raw)
            except KmsgParseError:
                yield Garbled(raw)
                continue
            if self._last_seq is not None and record.seq is not None:
                if record.seq <= self._last_seq:
                    continue  # already processed before a restart
                if record.seq > self._last_seq + 1:
                    yield Lost(record.seq - self._last_seq - 1)
            self._last_seq = record.seq
            yield record
        if skipped:
            yield Skipped(skipped, self._last_seq)

    def wait(self, timeout: Optional[float], wake_fd: Optional[int] = None) -> bool:
        """Block until a record is readable (True), the timeout passes or `wake_fd` becomes readable."""
        assert self.fd is not None
        return wait_readable(self.fd, timeout, wake_fd)


def wait_readable(fd: int, timeout: Optional[float], wake_fd: Optional[int] = None) -> bool:
    """Block until `fd` is readable (True), `timeout` passes, or `wake_fd` becomes readable (it is drained, or
    the next wait would return at once)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if wake_fd is not None:
        poller.register(wake_fd, select.POLLIN)
    events = poller.poll(None if timeout is None else int(timeout * 1000))
    if wake_fd is not None and any(ready == wake_fd for ready, _ in events):
        try:
            os.read(wake_fd, 4096)
        except BlockingIOError:
            pass
    return any(ready == fd for ready, _ in events)


def read_saved_log(source: Union[str, BinaryIO], tz=None, stats=None) -> Iterator[KmsgItem]:
    """A saved raw kmsg dump, `dmesg` or `journalctl -k` text; "-" is standard input. `tz`: the zone of dates
    printed without one; `stats` (parse.kmsg.TextLogStats): filled with what the reader understood."""
    if source == "-":
        stream: BinaryIO = sys.stdin.buffer
        close = False
    elif isinstance(source, str):
        stream = open(source, "rb")
        close = True
    else:
        stream, close = source, False
    try:
        for record in parse_text_log(stream, tz=tz, stats=stats):
            if record.priority == LOST_MARKER:
                yield Lost(None)
            elif record.priority == GARBLED:
                yield Garbled(record.text.encode())
            else:
                yield record
    finally:
        if close:
            stream.close()


# `--kmsg syslog`: read the kernel log through syslog(2) rather than /dev/kmsg.
SYSLOG_SOURCE = "syslog"


def is_saved_log(path: str) -> bool:
    """`--kmsg` names a saved log (a file, or `-` for stdin) rather than the live kernel log."""
    if path == "-":
        return True
    if path == SYSLOG_SOURCE:
        return False
    try:
        return not stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        # Missing: a device path is the live log (opening it says why it cannot be read), anything else a
        # saved log the user meant to name.
        return not path.startswith("/dev/")


@dataclass
class OpenedLog:
    """A live kernel-log reader and how it was reached: `source` is "kmsg" or "syslog" (which kind of cursor
    it understands); `fallback` says why /dev/kmsg was not used, when it was refused."""

    reader: object  # LiveKmsg or sources.klog.SyslogKmsg: open(), read_available(), wait(), close()
    source: str
    fallback: Optional[str] = None


def open_kernel_log(path: str, cursor_for=lambda source: None, kmsg_factory=None,
                    fallback: bool = True) -> OpenedLog:
    """The live kernel log: `path` (/dev/kmsg), or syslog(2) where the device is refused (an unprivileged
    container: the runtime's device cgroup does not list /dev/kmsg, while syslog(2) needs only CAP_SYSLOG),
    or syslog(2) always when `path` is "syslog". `cursor_for(source)` gives the sequence to resume after.
    Raises KmsgUnavailable naming every reason."""
    from oomwatch.sources.klog import SyslogKmsg  # only where the fallback is needed

    device_error = None
    if path != SYSLOG_SOURCE:
        factory = kmsg_factory or LiveKmsg
        reader = factory(path)
        try:
            reader.open(after_seq=cursor_for("kmsg"))
            return OpenedLog(reader, "kmsg")
        except KmsgUnavailable as exc:
            if not fallback or not isinstance(exc.__cause__, PermissionError):
                raise
            device_error = str(exc)
    syslog = SyslogKmsg()
    try:
        syslog.open(after_seq=cursor_for("syslog"))
    except KmsgUnavailable as exc:
        raise KmsgUnavailable(str(exc) if device_error is None else f"{device_error}; {exc}") from exc
    return OpenedLog(syslog, "syslog", device_error)
