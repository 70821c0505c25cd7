"""Thin readers for the kernel log: live /dev/kmsg, or a saved dump / `dmesg` / `journalctl -k` text.

Both yield `KmsgRecord`s and `Lost(n)` markers; neither interprets what the records say. What `--kmsg` names is
decided once, here (`kernel_log_kind`), for the agent, `inspect` and the early reader; `open_kernel_log` opens
the live log for all three, `read_saved_log` reads a saved one.
"""

from __future__ import annotations

import errno
import io
import os
import select
import stat
import sys
import time
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator, Optional, Union

from oomwatch.model import KmsgRecord
from oomwatch.parse.kmsg import (
    GARBLED,
    LOST_MARKER,
    KmsgParseError,
    NotText,
    TextLogStats,
    parse_kmsg_record,
    parse_text_log,
    text_lines,
)
from oomwatch.parse.prefilter import report_skipper
from oomwatch.sources.logitems import (  # noqa: F401 (re-exported: the readers' items live there)
    Garbled,
    KmsgItem,
    KmsgUnavailable,
    Lost,
    NotAKernelLog,
    Skipped,
)

READ_SIZE = 8192  # one read returns one record; the kernel caps a record well below this
CHASE_RECORDS = 64  # overwritten again within this many records after an EPIPE: jump to the newest


def explain_open_error(path: str, exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return f"{path} does not exist"
    if exc.errno == errno.EISDIR:
        return f"{path} is a directory, not a kernel log"
    if exc.errno == errno.ENXIO:  # open() of a socket
        return f"{path} is a socket, not a kernel log"
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
        self._skip = report_skipper()  # remembers a report in progress across reads
        self._part: list[bytes] = []  # the memory part of the report in progress (it can span two reads)
        self.jumps = 0  # times the reader jumped to the newest record rather than chase the tail
        # When a read last found the log at its end (epoch seconds), taken so that every record printed before it
        # had been read: the time after one read found nothing, confirmed by a second read that found nothing
        # (a record printed while the first returned would be there for the second).
        self.caught_up_at: Optional[float] = None

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
        skip = self._skip if self.prefilter else None
        empty_at: Optional[float] = None
        for _ in range(limit):
            try:
                raw = read(fd, size)
            except BlockingIOError:
                if empty_at is not None:
                    self.caught_up_at = empty_at
                    break
                empty_at = time.time()
                continue
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
            empty_at = None
            since_epipe += 1
            if skip is not None:
                seq = skip(raw)
                if seq is not None:
                    part = seq < 0  # a record of a full report's memory part
                    if part:
                        seq = ~seq
                    last = self._last_seq
                    if last is not None and seq != last + 1:
                        if seq <= last:
                            continue  # already processed before a restart
                        if skipped:
                            yield Skipped(skipped, last)
                            skipped = 0
                        if self._part:
                            yield self._memory_part(last)
                        yield Lost(seq - last - 1)
                    if part:
                        if skipped:
                            yield Skipped(skipped, last)
                            skipped = 0
                        self._part.append(raw)
                    else:
                        if self._part:
                            yield self._memory_part(last)
                        skipped += 1
                    self._last_seq = seq
                    continue
            if skipped:
                yield Skipped(skipped, self._last_seq)
                skipped = 0
            if self._part:
                yield self._memory_part(self._last_seq)
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

    def _memory_part(self, last_seq: Optional[int]) -> Skipped:
        """The memory part read so far as one item: the texts of the kernel's own records (facility 0: a
        process may write /dev/kmsg), still escaped, one a line. Not parsed here: the reader's loop is the hot
        path of a storm, and the agent reads only the parts of the reports that become incidents."""
        raws, self._part = self._part, []
        texts = []
        for raw in raws:  # the skipper matched each one's prefix (`PRI,SEQ,…;`): its text, less dictionary lines
            # facility 0 is a PRI below 8: one digit 0-7 as the kernel prints it, else read the number
            if (raw[0] < 56 and raw[1] == 44) or int(raw[:raw.index(b",")]) >> 3 == 0:
                start = raw.index(b";") + 1
                end = raw.find(b"\n", start)
                texts.append(raw[start:end] if end >= 0 else raw[start:])
        return Skipped(len(raws), last_seq, b"\n".join(texts))

    def wait(self, timeout: Optional[float], wake_fd: Optional[int] = None) -> bool:
        """Block until a record is readable (True), the timeout passes or `wake_fd` becomes readable."""
        assert self.fd is not None
        return wait_readable(self.fd, timeout, wake_fd)


def wait_readable(fd: int, timeout: Optional[float], wake_fd: Optional[int] = None,
                  on_wake: Optional[Callable[[], None]] = None) -> bool:
    """Block until `fd` is readable (True), `timeout` passes, or `wake_fd` becomes readable (it is drained, or
    the next wait would return at once; then `on_wake()` is called)."""
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
        if on_wake is not None:
            on_wake()
    return any(ready == fd for ready, _ in events)


# `--kmsg syslog`: read the kernel log through syslog(2) rather than /dev/kmsg.
SYSLOG_SOURCE = "syslog"
# What `--kmsg` names (kernel_log_kind).
LIVE_KMSG, SYSLOG, SAVED = "kmsg", "syslog", "saved"
# /dev/kmsg is character device 1:11 (drivers/char/mem.c); any other device (/dev/zero, /dev/urandom, a tty)
# would be read as an endless log.
KMSG_DEVICE = (1, 11)
# A FIFO with nothing written to it for this long is refused rather than waited on for ever.
FIFO_IDLE_TIMEOUT = 10.0
_READ_CHUNK = 1 << 16


def kernel_log_kind(path: str, stat_fn=os.stat) -> str:
    """What `--kmsg` names, decided here for the agent, `inspect` and the early reader alike: LIVE_KMSG (the
    kernel's /dev/kmsg device, read live), SYSLOG (syslog(2)), or SAVED (anything else: `-` for standard
    input, a file, a FIFO; `read_saved_log` refuses what cannot be a log). A missing path under /dev/ is the
    live log (opening it says why it cannot be read), any other missing path a saved log the user meant."""
    if path == "-":
        return SAVED
    if path == SYSLOG_SOURCE:
        return SYSLOG
    try:
        st = stat_fn(path)
    except OSError:
        return LIVE_KMSG if path.startswith("/dev/") else SAVED
    if stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == KMSG_DEVICE:
        return LIVE_KMSG
    return SAVED


def is_saved_log(path: str) -> bool:
    """`--kmsg` names a saved log (see kernel_log_kind) rather than the live kernel log."""
    return kernel_log_kind(path) == SAVED


def _what_it_is(mode: int, rdev: int) -> Optional[str]:
    """Why a file of this type cannot be read as a saved log; None when it can (a file, a FIFO)."""
    if stat.S_ISDIR(mode):
        return "is a directory"
    if stat.S_ISSOCK(mode):
        return "is a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        kind = "character" if stat.S_ISCHR(mode) else "block"
        return (f"is a {kind} device ({os.major(rdev)}:{os.minor(rdev)}), not a saved log; the only device read "
                "is the kernel's /dev/kmsg (1:11)")
    return None


def explain_saved_open_error(path: str, exc: OSError) -> str:
    """Why a saved log cannot be opened: a file's own permissions, not the kernel log's CAP_SYSLOG."""
    if exc.errno in (errno.EPERM, errno.EACCES):
        return f"{path}: permission denied (the file's owner and mode; read it as its owner or root)"
    return explain_open_error(path, exc)


def _chunks_of_fd(fd: int, path: str, fifo: bool, idle_timeout: Optional[float]) -> Iterator[bytes]:
    """A FIFO is waited on for its first bytes `idle_timeout` seconds at most (nothing may ever open it for
    writing); once they came, a writer exists and is waited for as long as it takes."""
    first = True
    while True:
        if fifo and not wait_readable(fd, idle_timeout if first else None):
            raise KmsgUnavailable(f"{path} is a FIFO and nothing was written to it in {idle_timeout:g} s "
                                  "(start the writer first, or pipe the log to `--kmsg -`)")
        try:
            data = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            continue
        if not data:
            return
        first = False
        yield data


def _named_fifo(fd: int) -> bool:
    """A FIFO in the file system (mkfifo), which may never get a writer; not a pipe (`<(journalctl -k)`
    names one as /dev/fd/N), whose writer exists from the start."""
    try:
        return not os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
    except OSError:
        return True


def _chunks_of_stream(stream: BinaryIO) -> Iterator[bytes]:
    read = getattr(stream, "read1", stream.read)
    while True:
        data = read(_READ_CHUNK)
        if not data:
            return
        yield data


def saved_log_chunks(source: Union[str, BinaryIO], idle_timeout: float = FIFO_IDLE_TIMEOUT) -> Iterator[bytes]:
    """The bytes of a saved log: `-` (standard input), a path or an open binary stream. Refuses, with
    KmsgUnavailable naming what the path is instead, directories, sockets and devices (/dev/zero would never
    end); a FIFO silent for `idle_timeout` seconds is refused rather than waited on."""
    if source == "-":
        stdin = sys.stdin.buffer
        try:
            st = os.fstat(stdin.fileno())
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            st = None  # not a file descriptor (a test's stream)
        if st is not None and not os.isatty(stdin.fileno()):  # a terminal is typed or pasted into: read it
            refused = _what_it_is(st.st_mode, st.st_rdev)
            if refused is not None:  # `< /dev/zero` would never end
                raise NotAKernelLog(f"standard input {refused}")
        yield from _chunks_of_stream(stdin)
        return
    if not isinstance(source, str):
        yield from _chunks_of_stream(source)
        return
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block the open
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise NotAKernelLog(explain_open_error(source, exc)) from exc
        raise KmsgUnavailable(explain_saved_open_error(source, exc)) from exc
    try:
        st = os.fstat(fd)
        refused = _what_it_is(st.st_mode, st.st_rdev)
        if refused is not None:
            if source == "/dev/kmsg":  # kind and k3d nodes link it to /dev/console
                refused += "; this /dev/kmsg is a stand-in (a container's?): use --kmsg syslog to read the kernel log"
            raise NotAKernelLog(f"{source} {refused}")
        fifo = stat.S_ISFIFO(st.st_mode)
        yield from _chunks_of_fd(fd, source, fifo, idle_timeout if fifo and _named_fifo(fd) else None)
    except OSError as exc:
        raise KmsgUnavailable(explain_open_error(source, exc)) from exc
    finally:
        os.close(fd)


def read_saved_log(source: Union[str, BinaryIO], tz=None, stats=None,
                   idle_timeout: float = FIFO_IDLE_TIMEOUT) -> Iterator[KmsgItem]:
    """A saved raw kmsg dump, `dmesg` or `journalctl -k` text (also compressed, UTF-16, with NULs or CRLF:
    parse.kmsg.text_lines); "-" is standard input. `tz`: the zone of dates printed without one; `stats`
    (parse.kmsg.TextLogStats): filled with what the reader understood (see `saved_log_verdict` once read).
    Raises NotAKernelLog for what cannot be a log (binary data, a device, a directory), KmsgUnavailable for
    what cannot be read."""
    stats = stats if stats is not None else TextLogStats()
    try:
        lines = text_lines(saved_log_chunks(source, idle_timeout), stats)
        for record in parse_text_log(lines, tz=tz, stats=stats):
            if record.priority == LOST_MARKER:
                yield Lost(None)
            elif record.priority == GARBLED:
                yield Garbled(record.text.encode())
            else:
                yield record
    except NotText as exc:
        raise NotAKernelLog(f"{_source_name(source)} holds {exc}, not a kernel log") from None


def _source_name(source: Union[str, BinaryIO]) -> str:
    if source == "-":
        return "standard input"
    return source if isinstance(source, str) else getattr(source, "name", "the input")


def saved_log_verdict(source: str, stats: TextLogStats) -> Optional[str]:
    """Once a saved log was read whole: why it holds no kernel log at all (to be reported as an error:
    nothing was read, journalctl said it found nothing, or not one line is a kernel log line), or None."""
    name = _source_name(source)
    if stats.notice is not None and not stats.records:
        if stats.notice == "No journal files were found.":
            return (f"{name} holds no kernel log, only journalctl's \"{stats.notice}\" (there is no journal "
                    "where it looked: on the node itself, or with --directory/--file, or -D /var/log/journal)")
        return f"{name} holds no kernel log, only journalctl's \"{stats.notice}\" (no entries matched; run it " \
               "as root, or on the node itself)"
    if not stats.lines:
        return f"{name} is empty"
    return None


@dataclass
class OpenedLog:
    """A live kernel-log reader and how it was reached: `source` is "kmsg" or "syslog" (which kind of cursor
    it understands); `fallback` says why /dev/kmsg was not used, when it was refused."""

    reader: object  # LiveKmsg or sources.klog.SyslogKmsg: open(), read_available(), wait(), close()
    source: str
    fallback: Optional[str] = None


def open_kernel_log(path: str, cursor_for=lambda source: None, kmsg_factory=None,
                    fallback: bool = True) -> OpenedLog:
    """The live kernel log, for the agent, `inspect` and the early reader alike: `path` (/dev/kmsg), or
    syslog(2) where the device is refused (an unprivileged container: the runtime's device cgroup does not list
    /dev/kmsg, while syslog(2) needs only CAP_SYSLOG), or syslog(2) always when `path` is "syslog".
    `cursor_for(source)` gives the sequence to resume after; `kmsg_factory` makes the device's reader (LiveKmsg,
    KmsgChild, a test's stand-in). Raises KmsgUnavailable naming every reason, NotAKernelLog for a path that
    kernel_log_kind calls a saved log (/dev/zero read as a live log would never end)."""
    if kmsg_factory is None and kernel_log_kind(path) == SAVED:
        raise NotAKernelLog(f"{path} is not the live kernel log (/dev/kmsg, or `syslog`): read it as a saved log")
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
    from oomwatch.sources.klog import SyslogKmsg  # only where it is needed (ctypes, before the early fork)

    syslog = SyslogKmsg()
    try:
        syslog.open(after_seq=cursor_for("syslog"))
    except KmsgUnavailable as exc:
        raise KmsgUnavailable(str(exc) if device_error is None else f"{device_error}; {exc}") from exc
    return OpenedLog(syslog, "syslog", device_error)


def read_kernel_log(path: str, tz=None, stats: Optional[TextLogStats] = None) -> tuple[str, Iterator[KmsgItem]]:
    """Everything the kernel log `path` holds now, for a one-shot reader (`inspect`): the live log's records
    (open_kernel_log: /dev/kmsg, else syslog(2)), or a saved log's (read_saved_log, `tz` and `stats` as
    there). Returns (what was read: the path, or "syslog(2)"; its items)."""
    if kernel_log_kind(path) == SAVED:
        return path, read_saved_log(path, tz, stats)
    opened = open_kernel_log(path)
    try:
        items = list(opened.reader.read_available())
    finally:
        opened.reader.close()
    return ("syslog(2)" if opened.source == "syslog" else path), iter(items)
