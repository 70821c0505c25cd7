"""/dev/kmsg read by a small child process, so that no thread of the agent can starve the reader.

/dev/kmsg returns one record per read(). A Python thread that reads it gives up the GIL at every read and must
win it back from whatever else runs: with busy threads beside it, that is one record per switch interval (5 ms),
about 200 records/s, while an OOM storm writes thousands per second into a ring of about 1,450 (measured on the
real 6.1 kernel in the VM: thousands of records lost per second while the agent ran). A forked child does nothing
but read, pre-filter (oomwatch.parse.prefilter: records without OOM words travel as counts) and forward batches
through a pipe; the agent's pump thread then takes hundreds of records per read. The child dies with the agent
(PR_SET_PDEATHSIG) and when the pipe closes.

The items the child sends are the same `KmsgRecord`/`Skipped`/`Lost`/`Garbled` values LiveKmsg yields, pickled
per batch behind a 4-byte length.
"""

from __future__ import annotations

import ctypes  # here, not in the child: imported before the fork, its pages stay shared
import errno
import gc
import os
import pickle
import select
import signal
import struct
from collections import deque
from typing import Iterator, Optional

from oomwatch.sources.kmsg import LiveKmsg, wait_readable
from oomwatch.sources.logitems import CaughtUp, KmsgItem, KmsgUnavailable, Lost

_HEADER = struct.Struct("<I")
# The reader asks for this nice value where it may (CAP_SYS_NICE: root on a host, the systemd unit): during a
# storm the OOMing tasks are many and runnable, and an equal share of one CPU among them is too little to drain
# the ring before it wraps. Without the privilege it runs at the agent's own priority.
READER_NICE = -10
PIPE_SIZE = 1 << 20  # F_SETPIPE_SZ: room for a storm's worth of batches before the child must hold them
MAX_HELD = 200_000  # items the child holds while the agent does not read; beyond that they count as lost
_F_SETPIPE_SZ = 1031


class KmsgChild:
    """The agent-side end: open() forks the reader; read_available() and wait() as LiveKmsg's."""

    def __init__(self, path: str = "/dev/kmsg", reader_factory=LiveKmsg) -> None:
        self.path = path
        self._reader_factory = reader_factory  # tests pass a stand-in /dev/kmsg
        self.pid: Optional[int] = None
        self._fd: Optional[int] = None
        self._ask: Optional[int] = None
        self._buf = bytearray()
        self.reports_caught_up = True  # its batches carry CaughtUp: the pump's drained_at comes from them

    def open(self, after_seq: Optional[int] = None) -> None:
        reader = self._reader_factory(self.path)
        reader.prefilter = True
        reader.open(after_seq=after_seq)  # raises KmsgUnavailable here, in the agent, with its reason
        r, w = os.pipe()
        # The agent → child direction: a byte asks the child when it last read the log to its end (CaughtUp), so
        # that a quiet log's drain time can move on without the child waking for nothing.
        ask_r, ask_w = os.pipe()
        try:
            import fcntl

            fcntl.fcntl(w, _F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:
            pass  # a smaller pipe only means the child holds more itself
        # The child's collector must not write to the objects it shares with the agent (copying their pages):
        # what exists now is frozen out of its reach. The agent unfreezes its own at once, unless it had frozen
        # what lives as long as it (process.freeze_long_lived: a reader started again after the agent's start).
        frozen_before = gc.get_freeze_count()
        gc.freeze()
        pid = os.fork()
        if pid != 0 and not frozen_before:
            gc.unfreeze()
        if pid == 0:  # the child: never returns
            os.close(r)
            os.close(ask_w)
            code = 0
            try:
                _child(reader, w, ask_r)
            except BaseException:
                code = 1
            os._exit(code)
        os.close(w)
        os.close(ask_r)
        reader.close()
        os.set_blocking(r, False)
        os.set_blocking(ask_w, False)
        self.pid, self._fd, self._ask = pid, r, ask_w

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._ask is not None:
            os.close(self._ask)
            self._ask = None
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.pid = None

    def read_available(self) -> Iterator[KmsgItem]:
        assert self._fd is not None
        while True:
            try:
                chunk = os.read(self._fd, PIPE_SIZE)
            except BlockingIOError:
                break
            if not chunk:
                raise KmsgUnavailable(f"{self.path}: the kernel log reader process (pid {self.pid}) exited")
            self._buf += chunk
        buf, at = self._buf, 0
        while len(buf) - at >= _HEADER.size:
            (size,) = _HEADER.unpack_from(buf, at)
            if len(buf) - at - _HEADER.size < size:
                break
            items = pickle.loads(bytes(buf[at + _HEADER.size: at + _HEADER.size + size]))
            at += _HEADER.size + size
            yield from items
        del buf[:at]

    def wait(self, timeout: Optional[float], wake_fd: Optional[int] = None) -> bool:
        """As LiveKmsg's; a wake also asks the child when it last read the log to its end (its answer comes as a
        frame that holds a CaughtUp)."""
        assert self._fd is not None
        return wait_readable(self._fd, timeout, wake_fd, on_wake=self.ask)

    def ask(self) -> None:
        if self._ask is not None:
            try:
                os.write(self._ask, b"?")
            except (BlockingIOError, BrokenPipeError):
                pass  # asked already (the pipe is full), or the child is gone (the next read says so)


def _child(reader: LiveKmsg, out_fd: int, ask_fd: Optional[int] = None) -> None:
    """Read, pre-filter, forward; hold batches while the agent is busy; exit when it is gone."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, 0, READER_NICE)
    except OSError:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the agent stops it; a terminal's ^C goes to the agent
    os.set_blocking(out_fd, False)
    held: deque[tuple[bytes, int]] = deque()  # (frame, items in it)
    held_items = 0
    pending, pending_items = b"", 0
    assert reader.fd is not None
    if ask_fd is not None:
        os.set_blocking(ask_fd, False)
    # The agent asked when the log was last read to its end (at the start: it waits for that to be caught up);
    # the last time sent.
    asked, told = True, None
    while True:
        items: list = list(reader.read_available(limit=4096))
        if items and held_items + len(items) > MAX_HELD:
            items = [Lost(sum(getattr(i, "count", 1) or 1 for i in items))]
        caught_up = reader.caught_up_at
        if (items or asked) and caught_up is not None and caught_up != told:
            items.append(CaughtUp(caught_up))  # every record read before it is in this frame or an earlier one
            told = caught_up
        asked = False
        if items:
            data = pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)
            held.append((_HEADER.pack(len(data)) + data, len(items)))
            held_items += len(items)
        while pending or held:
            if not pending:
                pending, pending_items = held.popleft()
            try:
                n = os.write(out_fd, pending)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    return  # the agent is gone
                raise
            pending = pending[n:]
            if not pending:
                held_items -= pending_items
        if items:
            continue  # more may be there: read again before sleeping
        poller = select.poll()
        poller.register(reader.fd, select.POLLIN)
        if ask_fd is not None:
            poller.register(ask_fd, select.POLLIN)
        if pending or held:
            poller.register(out_fd, select.POLLOUT)
        for fd, ev in poller.poll():
            if fd == out_fd and ev & (select.POLLERR | select.POLLHUP):
                return
            if fd == ask_fd:
                try:
                    if not os.read(ask_fd, 4096):
                        return  # the agent closed its end: it is gone
                except BlockingIOError:
                    pass
                asked = True
