"""The kernel-log pump: one thread that drains the kernel log into memory as fast as the kernel writes it.

The ring buffer is small (128 KiB on Debian's kernels: about 1,450 records, some 22 OOM reports) and wraps
under a storm; a record not read in time is gone. So reading is a thread of its own that does nothing else:
it is started before anything slow (the cgroup walk, the backlog's correlation), it only reads, pre-filters
(records without OOM words are counted, not parsed) and emits what each read returned as one
`events.KernelLog` onto the agent's queue. Whatever the pipeline does, it cannot starve the reader. Started
early (oomwatch/early.py), before there is a queue, it keeps its batches until the agent adopts it.

A reader that fails is reopened (resuming after the last sequence read); one that cannot be reopened is
reported dead, and the agent's health turns 503.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Optional

from oomwatch.events import KernelLog, KernelLogEnded
from oomwatch.process import nice_this_thread
from oomwatch.sources.logitems import CaughtUp, KmsgUnavailable, Lost, Skipped

log = logging.getLogger(__name__)

REOPEN_ATTEMPTS = 5
REOPEN_BACKOFF = 0.5  # seconds, doubled each attempt
# The pump thread asks for its reader child's nice value (kmsgproc.READER_NICE) where it may
# (CAP_SYS_NICE): right after a kill the victim's teardown and the agent's other threads want the one CPU
# too, and a record the child had sent waited up to 440 ms for this thread at nice 0 in the real-kernel
# tier's calm single kills, 40 ms at most at -10 in two runs (issue 30,
# benchmarks/runs/2026-11-28T0415Z-issue30-calm-single-kill.log). Else: the agent's own priority.
PUMP_NICE = -10


class KernelLogPump:
    """`reader` is an opened LiveKmsg or SyslogKmsg; `reopen(after_seq)` opens a fresh one. Each read's items go
    to `emit` as one KernelLog event, in kernel order; a reader that fails for good ends with a KernelLogEnded.
    `syslog`: the reader is syslog(2), read only when woken (its reads say when they began, not ended)."""

    def __init__(self, reader: Any, emit: Optional[Callable[[Any], None]] = None,
                 reopen: Optional[Callable[[Optional[int]], Any]] = None, syslog: bool = False) -> None:
        self.reader = reader
        self._emit = emit
        self._held: list = []  # batches read before anyone took them (the early start)
        self._handover = threading.Lock()
        self._reopen = reopen
        self.syslog = syslog
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
        # A batch read to the log's end has been handed on (not only held): the backlog a start found is on the
        # agent's queue, for the /healthz that waits for it (issue 30 item 4: "healthy once the backlog is read").
        self.backlog_read = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kmsg-pump", daemon=True)
        self.alive = True
        self._thread.start()

    def adopt(self, emit: Callable[[Any], None], reopen: Callable[[Optional[int]], Any]) -> None:
        """Taken over by the agent (it was started early, before the agent existed): what was read so far goes
        to `emit` first, in order."""
        with self._handover:
            self._reopen = reopen
            for event in self._held:
                emit(event)
                self._handed(event)
            self._held = []
            self._emit = emit

    def _send(self, event: Any) -> None:
        with self._handover:
            if self._emit is None:
                self._held.append(event)
            else:
                self._emit(event)
                self._handed(event)

    def _handed(self, event: Any) -> None:
        if getattr(event, "drained_at", None) is not None:
            self.backlog_read = True

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
        nice_this_thread(PUMP_NICE)
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
                        self._send(KernelLogEnded(saved=False, error=self.error))
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

    def _pump_until_stopped(self) -> None:
        reader = self.reader
        while True:
            started = time.time()
            items = list(reader.read_available())
            drained: Optional[float] = started if self.syslog else time.time()
            if getattr(reader, "reports_caught_up", False):
                # The reader child says when it last read /dev/kmsg to its end: records printed before then are
                # all here or before, which the pump's own clock cannot say (the child can lag behind a storm).
                marks = [item.at for item in items if isinstance(item, CaughtUp)]
                if marks:
                    items = [item for item in items if not isinstance(item, CaughtUp)]
                drained = max(marks) if marks else None
            for item in reversed(items):  # the cursor a reopen resumes after
                if isinstance(item, Skipped):
                    self.last_seq = item.last_seq
                    break
                seq = None if isinstance(item, Lost) else getattr(item, "seq", None)
                if seq is not None:
                    self.last_seq = seq
                    break
            self.read_started_wall = started
            self.reads += 1
            # Read to its end: /dev/kmsg up to now; syslog(2) up to when the read began; the reader child up to
            # when it said (None: more is coming). A wake with nothing read waits for the child's answer.
            if items or drained is not None:
                self._send(KernelLog(items, drained))
            if self._stop.is_set():
                return
            reader.wait(None, self._wake_r)
            if self._stop.is_set():
                return
