"""The kernel log as an event source, whichever it is: the live /dev/kmsg (read by a child process, often started
before the agent: oomwatch/early.py), syslog(2) where the device is refused, or a saved log replayed once.
It emits `events.KernelLog` batches and, at its end or on a failure it cannot recover from, `KernelLogEnded`.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Optional

from oomwatch.events import KernelLog, KernelLogEnded
from oomwatch.model import KmsgRecord
from oomwatch.pump import KernelLogPump
from oomwatch.sources.kmsg import (
    LIVE_KMSG,
    KmsgUnavailable,
    LiveKmsg,
    explain_open_error,
    is_saved_log,
    kernel_log_kind,
    open_kernel_log,
    read_saved_log,
    saved_log_verdict,
)
from oomwatch.parse.kmsg import TextLogStats
from oomwatch.sources.kmsgproc import KmsgChild

log = logging.getLogger(__name__)

# Items of a saved log handed to the pipeline at a time, and how many events may wait on the loop's queue before
# the replay waits for it: a log is read faster than the pipeline takes it, and parsed records waiting there
# were most of the agent's memory in a replay of 200,000 kills (issue 31 item 3).
REPLAY_BATCH = 512
REPLAY_QUEUED_MAX = 8
REPLAY_WAIT = 0.005  # seconds between two looks at the queue while it is full


class KernelLogSource:
    """`path` as --kmsg gives it; `factory` opens a live reader (tests give a stand-in for /dev/kmsg);
    `early_pump` is one already draining /dev/kmsg. Its cursor decides where a restart resumes."""

    def __init__(self, path: str, emit: Callable[[Any], None], *, factory: Optional[Callable] = None,
                 early_pump: Optional[KernelLogPump] = None, queued: Callable[[], int] = lambda: 0) -> None:
        self.path, self._emit = path, emit
        self._queued = queued  # events waiting on the loop's queue (a saved log's replay keeps it short)
        self._stopping = threading.Event()
        self._factory = factory
        self._early = early_pump
        self.saved = factory is None and is_saved_log(path)
        self.kind: Optional[str] = None  # "kmsg" | "syslog" once a live reader is open
        self.pump: Optional[KernelLogPump] = None
        self.error: Optional[str] = None
        self._replay: Optional[threading.Thread] = None
        self.replayed = False

    def open(self, cursor_for: Callable[[str], Optional[int]]) -> Optional[int]:
        """Start reading. `cursor_for(kind)` is the saved cursor for a reader of that kind (sequence numbers of
        /dev/kmsg and timestamps of syslog(2) do not mix). Returns the cursor up to which an adopted early
        reader's records are already done (it read the ring from its start), else None."""
        early, self._early = self._early, None
        if self.saved:
            if early is not None:
                early.stop()
            self._replay = threading.Thread(target=self._replay_saved_log, name="kmsg", daemon=True)
            return cursor_for("file")  # the records a replay before this one already counted
        if early is not None and self._factory is None and kernel_log_kind(self.path) == LIVE_KMSG:
            self.pump, self.kind = early, "kmsg"
            return cursor_for("kmsg")
        if early is not None:
            early.stop()
        try:
            opened = open_kernel_log(self.path, cursor_for, self._factory or KmsgChild,
                                     fallback=self._factory is None)
        except KmsgUnavailable as exc:
            self.error = str(exc)
            log.error("kernel log unavailable: %s; serving cgroup metrics only", exc)
            return None
        if opened.fallback:
            log.warning("%s; reading the kernel log through syslog(2) instead, woken by memory.events changes "
                        "(and every %.0f s)", opened.fallback, opened.reader.fallback_interval)
        self._prefilter(opened.reader)
        self.kind = opened.source
        # Read from now on, but held until start(): the pipeline must know the cgroups before the records.
        self.pump = KernelLogPump(opened.reader, None, reopen=self._reopen, syslog=self.kind == "syslog")
        self.pump.start()
        return None

    def start(self) -> None:
        """Hand what was read since open() to the pipeline, and go on (once the cgroup tree has been emitted:
        records of a backlog name cgroups and pids the pipeline must know first). A saved log's replay starts."""
        if self.pump is not None:
            self.pump.adopt(self._emit, self._reopen)
        if self._replay is not None:
            self._replay.start()

    def _reopen(self, after_seq: Optional[int]):
        opened = open_kernel_log(self.path, lambda kind: after_seq if kind == self.kind else None,
                                 self._factory or KmsgChild, fallback=self._factory is None)
        self._prefilter(opened.reader)
        return opened.reader

    @staticmethod
    def _prefilter(reader: Any) -> None:
        if isinstance(reader, LiveKmsg):
            reader.prefilter = True  # records without OOM words are counted, not parsed

    def _replay_saved_log(self) -> None:
        """--kmsg names a saved log: its records once, then the end. Records of a text log have no sequence
        number: each gets its place among the log's records, so that the cursor saved with the state says how far
        a replay got, and the next replay of the same log counts nothing twice however long it is."""
        batch: list = []
        index = 0
        stats = TextLogStats()
        try:
            for item in read_saved_log(self.path, stats=stats):
                if isinstance(item, KmsgRecord):
                    if item.seq is None:
                        item = item._replace(seq=index)
                    index = item.seq + 1
                batch.append(item)
                if len(batch) >= REPLAY_BATCH:
                    while self._queued() >= REPLAY_QUEUED_MAX and not self._stopping.is_set():
                        self._stopping.wait(REPLAY_WAIT)
                    self._emit(KernelLog(batch))
                    batch = []
        except OSError as exc:
            self.error = explain_open_error(self.path, exc)
            log.error("cannot read saved kernel log: %s", self.error)
            return
        except KmsgUnavailable as exc:
            self.error = str(exc)
            log.error("cannot read saved kernel log: %s", self.error)
            return
        verdict = saved_log_verdict(self.path, stats)
        if verdict is not None:  # nothing in it is a kernel log: say so, never replay it silently
            self.error = verdict
            log.error("saved kernel log: %s", verdict)
        self._emit(KernelLog(batch, drained_at=0.0))
        self.replayed = True
        self._emit(KernelLogEnded(saved=True))

    def join(self, timeout: Optional[float] = None) -> None:
        """Wait for a saved log's replay to end."""
        if self._replay is not None and self._replay.is_alive():
            self._replay.join(timeout)

    def wake(self) -> None:
        if self.pump is not None:
            self.pump.wake()

    def starting(self) -> Optional[str]:
        """Why the agent is not ready yet on the kernel log's side: what the ring held at start is being read."""
        if self.pump is not None and not self.pump.backlog_read:
            return "reading the kernel log's backlog"
        return None

    def health(self) -> tuple[bool, str]:
        if self.saved:
            return self.error is None, self.error or "ok"
        if self.pump is None:
            return False, self.error or "not running"
        if not self.pump.alive or self.pump.error is not None:
            return False, self.pump.error or "kernel log reader stopped"
        return True, "ok"

    def stop(self) -> None:
        self._stopping.set()
        if self.pump is not None:
            self.pump.stop()
