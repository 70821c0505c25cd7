"""The agent's log handler: lines formatted where they are logged, written by a thread of their own.

The loop logs a line for each incident it publishes. Written there, a stderr that does not take them (a full pipe
to the container runtime, a journald busy with the storm itself, a log file on a disk that stalls) would stall
the loop and every kill behind it; here the loop only queues the line. A writer stalled for good holds at most
BACKLOG lines; the lines past that are counted, and said once the writer can write again.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import TextIO

BACKLOG = 10_000
_CLOSE = object()


class BackgroundLogHandler(logging.Handler):
    def __init__(self, stream: TextIO, formatter: logging.Formatter) -> None:
        super().__init__()
        self.setFormatter(formatter)
        self.stream = stream
        self.dropped = 0  # lines the full backlog turned away, not yet said
        # (its own lock, not the handler's: logging.shutdown holds that one while close() waits for the writer)
        self._dropped_lock = threading.Lock()
        self._lines: queue.Queue = queue.Queue(maxsize=BACKLOG)
        self._writer = threading.Thread(target=self._write, name="log-writer", daemon=True)
        self._writer.start()

    def emit(self, record: logging.LogRecord) -> None:  # (called with the handler's lock held)
        try:
            line = self.format(record) + "\n"
        except Exception:
            self.handleError(record)
            return
        try:
            self._lines.put_nowait(line)
        except queue.Full:
            with self._dropped_lock:
                self.dropped += 1

    def _write(self) -> None:
        while True:
            line = self._lines.get()
            if line is _CLOSE:
                return
            with self._dropped_lock:
                dropped, self.dropped = self.dropped, 0
            if dropped:
                line = f"({dropped} log lines dropped: the log's stream took none for {BACKLOG} lines)\n" + line
            try:
                self.stream.write(line)
                self.stream.flush()
            except (OSError, ValueError):  # stderr closed, or gone: nothing left to say it on
                pass

    def flush(self) -> None:
        """Nothing to do here: the writer writes each line as it comes (close() waits for it)."""

    def close(self) -> None:
        """Write what is queued (at exit: logging.shutdown), waiting for the writer a few seconds at most."""
        if self._writer.is_alive():
            try:
                self._lines.put(_CLOSE, timeout=5)
            except queue.Full:
                pass
            self._writer.join(5)
        super().close()
