"""The kernel log through syslog(2) (glibc `klogctl`), for containers that may not open /dev/kmsg.

A container runtime's device cgroup does not list /dev/kmsg, so open() fails with EPERM even with
CAP_SYSLOG; syslog(2) is no device and needs only CAP_SYSLOG (and only while kernel.dmesg_restrict=1).
SYSLOG_ACTION_READ_ALL returns the ring buffer as `dmesg -r` text without consuming it (READ, action 2,
and /proc/kmsg would steal records from journald/rsyslog). The price: no sequence numbers, no way to block
until a record arrives, and every call returns the whole ring, so `new_records` works out what is new by
timestamp (or, when printk time is off, by position).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import select
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Union

from oomwatch.model import KmsgRecord
from oomwatch.sources.logitems import KmsgItem, KmsgUnavailable, Lost

SYSLOG_ACTION_READ_ALL = 3
SYSLOG_ACTION_SIZE_BUFFER = 10

FALLBACK_BUFFER = 1 << 20  # when SIZE_BUFFER fails
MAX_BUFFER = 64 << 20
# READ_ALL drops the oldest records that do not fit; a result within this of the buffer's end may have
# been cut. One printed record is at most PRINTK_MESSAGE_MAX (2 KiB) including the prefix of each line.
RECORD_MARGIN = 4096

# `<PRI>[ SSSS.UUUUUU][ Tnnn] text`: time is absent with printk.time=0, the caller with !CONFIG_PRINTK_CALLER;
# the kernel adds one space after the prefix only when one of the two is there.
_LINE = re.compile(rb"<(\d+)>(?:\[\s*(\d+)\.(\d+)\])?(\[\s*[TC]\d+\])?")

# klogctl(type, buf, len) -> int, errno via ctypes.get_errno(); tests pass a fake.
Syscall = Callable[[int, Optional[ctypes.Array], int], int]


@dataclass(frozen=True)
class KlogCursor:
    """What the previous snapshots returned, so the next one yields only what is new.

    `usec`: the newest timestamp returned. `seen`: occurrence keys (see `_keys`) of the records at `usec`
    already returned, since several records can share a microsecond; None means all of them (a cursor
    restored from a saved sequence number, which keeps no texts). `lines`: without timestamps, the texts of
    the previous snapshot, to find where the next one continues it (None: no such snapshot). `seq`: the
    last sequence number handed out."""

    usec: Optional[int] = None
    seen: Optional[frozenset[str]] = frozenset()
    lines: Optional[tuple[str, ...]] = None
    seq: Optional[int] = None

    @classmethod
    def after(cls, seq: Optional[int]) -> "KlogCursor":
        """The cursor the agent saved (a `seq`, which is a usec here): everything up to it was handled."""
        return cls(usec=seq, seen=None, seq=seq) if seq is not None else cls()


def parse_read_all(text: Union[str, bytes]) -> list[KmsgRecord]:
    """READ_ALL text, one record per line (a multi-line record comes as several lines with one prefix
    each). `usec` is None when printk time is off. Lines without `<PRI>` cannot come from the kernel (it
    prefixes every line) and are skipped. Not `parse_text_log`: that drops untimed lines and keeps the
    `[  T123]` caller field in the text."""
    raw = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    records = []
    for line in raw.split(b"\n"):
        m = _LINE.match(line)
        if not m:
            continue
        body = line[m.end():]
        if (m.group(2) is not None or m.group(4) is not None) and body.startswith(b" "):
            body = body[1:]
        usec = int(m.group(2)) * 1_000_000 + int(m.group(3).ljust(6, b"0")[:6]) if m.group(2) else None
        records.append(KmsgRecord(priority=int(m.group(1)), seq=None, usec=usec,
                                  text=body.decode("utf-8", "backslashreplace")))
    return records


def _keys(records: list[KmsgRecord]) -> list[str]:
    """Identity of each record among those with its timestamp: the text, tagged with its occurrence
    number from the second time the same text appears (the lines of two memcg stat dumps repeat)."""
    counts: dict[tuple[Optional[int], str], int] = {}
    keys = []
    for r in records:
        n = counts[(r.usec, r.text)] = counts.get((r.usec, r.text), 0) + 1
        keys.append(r.text if n == 1 else f"{r.text}\0{n}")
    return keys


def _overlap(prev: tuple[str, ...], cur: list[str]) -> int:
    """How many leading lines of `cur` continue `prev` (the ring grew at its end and lost lines at its
    start); 0 when none do. The longest overlap wins: a ring repeating itself is read as not wrapped."""
    if len(cur) >= len(prev) and tuple(cur[:len(prev)]) == prev:
        return len(prev)
    for k in range(min(len(prev) - 1, len(cur)), 0, -1):
        if cur[k - 1] == prev[-1] and tuple(cur[:k]) == prev[len(prev) - k:]:
            return k
    return 0


def new_records(text: Union[str, bytes], cursor: KlogCursor) -> tuple[list[KmsgItem], KlogCursor]:
    """The items of one READ_ALL snapshot not returned before, and the cursor for the next snapshot.

    Each record gets `seq = usec`: syslog(2) has no sequence numbers, and timestamps are a stand-in that
    only grows within a boot, so the agent's cursor (`seq`, "records up to it are done", restart from
    `pending - 1`) keeps working. Unlike kernel sequence numbers they are not unique (the lines of one
    record, or records of several CPUs, share a microsecond), which is why records at the cursor's own
    timestamp are told apart by text.

    `Lost(None)` comes first when the snapshot's oldest record is newer than the cursor: the ring wrapped
    between reads (or `dmesg -C` cleared it, which READ_ALL cannot tell apart; what was cleared unread is
    lost to us as well). When every record is older than the cursor the log is not the one the cursor came
    from (a reboot under a kept cursor): `Lost(None)` and the whole snapshot, and the cursor starts again.

    Without timestamps (printk.time=0) records cannot be ordered by time: they get `usec=None` and a
    counted `seq`, and the snapshot is matched by position against the previous one (its lines that
    continue the previous snapshot's tail are old, the rest new; no overlap at all is a wrap). A first
    untimed snapshot after a restored cursor cannot be matched: nothing is returned but `Lost(None)`, and
    it becomes the baseline.
    """
    records = parse_read_all(text)
    if not records:
        return [], cursor
    if any(r.usec is None for r in records):
        return _new_untimed(records, cursor)
    if cursor.usec is None and cursor.lines is not None:
        # printk time was switched on since the last read: continue by position this once.
        k = _overlap(cursor.lines, [r.text for r in records])
        items: list[KmsgItem] = [] if k or not cursor.lines else [Lost(None)]
        return _emit_timed(items, records[k:], records, cursor)
    after = cursor.usec
    if after is None:
        return _emit_timed([], records, records, cursor)
    if max(r.usec for r in records) < after or min(r.usec for r in records) > after:
        return _emit_timed([Lost(None)], records, records, cursor)
    fresh = []
    for r, key in zip(records, _keys(records)):
        if r.usec > after or (r.usec == after and cursor.seen is not None and key not in cursor.seen):
            fresh.append(r)
    return _emit_timed([], fresh, records, cursor)


def _emit_timed(items: list[KmsgItem], fresh: list[KmsgRecord], snapshot: list[KmsgRecord],
                cursor: KlogCursor) -> tuple[list[KmsgItem], KlogCursor]:
    if not fresh:
        return items, cursor
    top = max(r.usec for r in fresh)
    at_top = [r for r in snapshot if r.usec == top]
    items += [KmsgRecord(r.priority, r.usec, r.usec, r.text) for r in fresh]
    return items, KlogCursor(usec=top, seen=frozenset(_keys(at_top)), lines=None, seq=top)


def _new_untimed(records: list[KmsgRecord], cursor: KlogCursor) -> tuple[list[KmsgItem], KlogCursor]:
    texts = [r.text for r in records]
    baseline = KlogCursor(usec=None, seen=frozenset(), lines=tuple(texts), seq=cursor.seq)
    if cursor.lines is None:
        if cursor.usec is not None or cursor.seq is not None:
            return [Lost(None)], baseline  # restored cursor (or timestamps switched off): cannot match
        fresh, items = records, []
    else:
        k = _overlap(cursor.lines, texts)
        fresh = records[k:]
        items = [] if k or not cursor.lines else [Lost(None)]
    seq = cursor.seq or 0
    for i, r in enumerate(fresh, 1):
        items.append(KmsgRecord(r.priority, seq + i, None, r.text))
    return items, KlogCursor(usec=None, seen=frozenset(), lines=tuple(texts), seq=seq + len(fresh))


def libc_klogctl() -> Syscall:
    """glibc's klogctl(3), errno kept for ctypes.get_errno()."""
    fn = ctypes.CDLL(None, use_errno=True).klogctl
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def in_container() -> bool:
    """Whether this process runs in a container (the fix for a missing capability is said differently)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST") or os.environ.get("container")
                or os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"))


def explain_syslog_error(label: str, err: int, container: Optional[bool] = None) -> str:
    if err == errno.EPERM:
        restrict = ""
        try:
            with open("/proc/sys/kernel/dmesg_restrict") as f:
                restrict = f" (kernel.dmesg_restrict={f.read().strip()} here)"
        except OSError:
            pass
        container = in_container() if container is None else container
        fix = ("add CAP_SYSLOG to the container's capabilities (securityContext.capabilities.add)" if container
               else "run it as root, or grant CAP_SYSLOG (systemd: AmbientCapabilities=CAP_SYSLOG)")
        return (f"{label}: permission denied (EPERM): reading the kernel log needs CAP_SYSLOG while "
                f"kernel.dmesg_restrict=1{restrict}, and a seccomp profile or LSM may block syslog(2); {fix}")
    if err == errno.ENOSYS:
        return f"{label}: not available (ENOSYS: kernel built without CONFIG_PRINTK?)"
    return f"{label}: failed: {os.strerror(err)}"


class SyslogKmsg:
    """Drop-in for `LiveKmsg` that reads the ring with SYSLOG_ACTION_READ_ALL, one snapshot per read.

    There is no file descriptor to poll (`fd` stays None) and no event when a record arrives: `wait`
    polls `wake_fd` and re-reads the ring at least every `fallback_interval` seconds, so a trigger that
    never comes delays a report by at most that long."""

    def __init__(self, path_label: str = "syslog(2)", *, fallback_interval: float = 30.0,
                 syscall: Optional[Syscall] = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path_label
        self.fd: Optional[int] = None
        self.fallback_interval = fallback_interval
        self._syscall = syscall
        self._clock = clock
        self._cursor: Optional[KlogCursor] = None
        self._ready: Optional[list[KmsgItem]] = None  # what `wait` found, for the next read_available
        self._bufsize = 0
        self.snapshot_bytes = 0  # size of the last READ_ALL result, for diagnostics

    def open(self, after_seq: Optional[int] = None) -> None:
        """Check that syslog(2) may be used (raises KmsgUnavailable) and size the buffer; with `after_seq`
        (a usec, see `new_records`), records up to it are skipped and a wrap after it is reported lost."""
        if self._syscall is None:
            try:
                self._syscall = libc_klogctl()
            except (OSError, AttributeError) as exc:
                raise KmsgUnavailable(f"{self.path}: no klogctl in the C library: {exc}") from exc
        size = self._call(SYSLOG_ACTION_SIZE_BUFFER, None, 0)
        self._bufsize = size if size > 0 else FALLBACK_BUFFER
        self._cursor = KlogCursor.after(after_seq)
        self._ready = None
        self._snapshot()  # READ_ALL itself must work too, or open fails here rather than in the loop

    def close(self) -> None:
        self._cursor = None
        self._ready = None

    def read_available(self) -> Iterator[KmsgItem]:
        """Everything new in the ring now: the snapshot `wait` already took, else a fresh one."""
        assert self._cursor is not None, "open() first"
        items, self._ready = self._ready, None
        if items is None:
            items = self._take()
        yield from items

    def wait(self, timeout: Optional[float], wake_fd: Optional[int] = None) -> bool:
        """True when the ring holds new items (kept for `read_available`), False when `timeout` passed or
        `wake_fd` became readable without any. The ring is read when `wake_fd` fires, at the timeout, and
        every `fallback_interval` in between. A readable `wake_fd` is drained, or it would stay readable
        and turn this into a busy loop."""
        assert self._cursor is not None, "open() first"
        if self._ready:
            return True
        deadline = None if timeout is None else self._clock() + timeout
        poller = select.poll()
        if wake_fd is not None:
            poller.register(wake_fd, select.POLLIN)
        while True:
            step = self.fallback_interval
            if deadline is not None:
                step = min(step, max(0.0, deadline - self._clock()))
            woken = bool(poller.poll(int(step * 1000)))
            if woken:
                os.read(wake_fd, 4096)
            items = self._take()
            if items:
                self._ready = items
                return True
            if woken or (deadline is not None and self._clock() >= deadline):
                return False

    # --- syscall ---------------------------------------------------------------------------------------

    def _call(self, action: int, buf: Optional[ctypes.Array], size: int) -> int:
        assert self._syscall is not None
        n = self._syscall(action, buf, size)
        if n < 0:
            err = ctypes.get_errno()
            raise KmsgUnavailable(explain_syslog_error(self.path, err)) from OSError(err, os.strerror(err))
        return n

    def _snapshot(self) -> bytes:
        """One READ_ALL, in a buffer large enough for the whole ring: the text is longer than the ring
        (a prefix per line), so a result that may have been cut is read again with twice the buffer."""
        while True:
            buf = ctypes.create_string_buffer(self._bufsize)
            n = self._call(SYSLOG_ACTION_READ_ALL, buf, self._bufsize)
            if n <= self._bufsize - RECORD_MARGIN or self._bufsize >= MAX_BUFFER:
                self.snapshot_bytes = n
                return buf.raw[:n]
            self._bufsize = min(self._bufsize * 2, MAX_BUFFER)

    def _take(self) -> list[KmsgItem]:
        assert self._cursor is not None
        items, self._cursor = new_records(self._snapshot(), self._cursor)
        return items
