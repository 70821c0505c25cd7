"""The kernel-log pump: one thread that drains the kernel log into memory as fast as the kernel writes it.

The ring buffer is small (128 KiB on Debian's kernels: about 1,450 records, some 22 OOM reports) and wraps
under a storm; a record not read in time is gone. So reading is a thread of its own that does nothing else:
it is started before anything slow (the cgroup walk, the backlog's correlation), it only reads, pre-filters
(records without OOM words are counted, not parsed) and appends to a queue, and the processor thread takes
the queue in batches. Whatever the processor does, it cannot starve the reader.

A reader that fails is reopened (resuming after the last sequence read); one that cannot be reopened is
reported dead, and the agent's health turns 503.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from typing import Any, Callable, Optional

from oomwatch.sources.kmsg import KmsgUnavailable, Lost, Skipped

log = logging.getLogger(__name__)

REOPEN_ATTEMPTS = 5
REOPEN_BACKOFF = 0.5  # seconds, doubled each attempt


class KernelLogPump:
    """`reader` is an opened LiveKmsg or SyslogKmsg; `reopen(after_seq)` opens a fresh one. Items come out
    of `take()` in kernel order; `notify()` is called after each batch (the processor's wake-up)."""

    def __init__(self, reader: Any, notify: Callable[[], None],
                 reopen: Optional[Callable[[Optional[int]], Any]] = None) -> None:
        self.reader = reader
        self._notify = notify
        self._reopen = reopen
        self._items: deque = deque()
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()  # a wake-up for readers that cannot be waited on (syslog(2))
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.error: Optional[str] = None
        self.alive = False
        self.dead = False  # failed and could not be reopened
        self.read_started_wall = 0.0  # epoch time the last complete read began: the log was read up to then
        self.reads = 0
        self._thread: Optional[threading.Thread] = None
        self.last_seq: Optional[int] = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kmsg-pump", daemon=True)
        self.alive = True
        self._thread.start()

    def adopt(self, notify: Callable[[], None], reopen: Callable[[Optional[int]], Any]) -> None:
        """Taken over by the agent (it was started early, before the agent existed)."""
        self._reopen = reopen
        self._notify = notify
        notify()

    def take(self) -> list:
        """Everything read so far, in order."""
        out = []
        items = self._items
        while items:
            out.append(items.popleft())
        return out

    def backlog(self) -> int:
        return len(self._items)

    def wake(self) -> None:
        """Read now (a memory.events oom_kill move: the cue for a syslog(2) reader)."""
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass

    def stop(self) -> None:
        self._stop.set()
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.reader.close()
        except OSError:
            pass

    def _run(self) -> None:
        attempts = 0
        try:
            while True:
                try:
                    self._pump_until_stopped()
                    return
                except Exception as exc:  # a reader error: reopen where we were, or report and give up
                    attempts += 1
                    self.error = f"kernel log reader failed: {exc}"
                    log.error("kernel log reader failed (%s); reopening (attempt %d of %d)", exc, attempts,
                              REOPEN_ATTEMPTS)
                    if self._reopen is None or attempts > REOPEN_ATTEMPTS:
                        self.dead = True
                        return
                    time.sleep(REOPEN_BACKOFF * 2 ** (attempts - 1))
                    try:
                        self.reader.close()
                    except OSError:
                        pass
                    try:
                        self.reader = self._reopen(self.last_seq)
                        self.error = None
                    except KmsgUnavailable as reopen_exc:
                        self.error = f"kernel log reader failed: {exc}; reopening: {reopen_exc}"
        finally:
            self.alive = False
            self._notify()

    def _pump_until_stopped(self) -> None:
        reader, items = self.reader, self._items
        while True:
            got = False
            started = time.time()
            for item in reader.read_available():
                items.append(item)
                got = True
                if isinstance(item, Skipped):
                    self.last_seq = item.last_seq
                elif not isinstance(item, Lost):
                    seq = getattr(item, "seq", None)
                    if seq is not None:
                        self.last_seq = seq
            self.read_started_wall = started
            self.reads += 1
            if got:
                self._notify()
            if self._stop.is_set():
                return
            reader.wait(None, self._wake_r)
            if self._stop.is_set():
                return
