"""The background worker of the sinks that talk to something slow (journald, scontrol, the API server): one
daemon thread behind a bounded queue, so that the pipeline never waits on them.

`put(item)` never blocks: a full queue drops the item and counts it in `dropped`. `close(timeout)` hands the
worker what is queued, up to `timeout`, then stops it; `closing` is set from the start of `close`, for a handler
that waits between retries (it stops waiting). `wait_idle` says when all that was queued so far was handled.
A handler that raises is logged and the worker goes on with the next item: one item's failure never stops
the others.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable, Generic, Optional, TypeVar

log = logging.getLogger(__name__)

Item = TypeVar("Item")
_STOP = object()  # queued by close(): the worker returns when it takes it


class QueueWorker(Generic[Item]):
    """`handle(item)` on a thread named `name` for each item `put`, in order; at most `size` items wait."""

    def __init__(self, name: str, handle: Callable[[Item], None], size: int) -> None:
        self.name = name
        self._handle = handle
        self._queue: "queue.Queue[object]" = queue.Queue(size)
        self._thread: Optional[threading.Thread] = None
        self.closing = threading.Event()
        self.dropped = 0  # items never handled: the queue was full when they came

    @property
    def size(self) -> int:
        return self._queue.maxsize

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        if self._thread is None:
            self.closing.clear()
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def put(self, item: Item) -> bool:
        """Queue `item`; False (and counted in `dropped`) when `size` items wait already."""
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            return False
        return True

    def close(self, timeout: float) -> None:
        """Handle what is queued (up to `timeout`), then stop the thread; a later `start` starts a new one."""
        if self._thread is None:
            return
        self.closing.set()
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            pass  # the daemon thread is left to the interpreter's exit
        self._thread.join(timeout)
        self._thread = None

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """True once every item queued so far was handled (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                self._handle(item)  # type: ignore[arg-type]
            except Exception:  # noqa: BLE001 - one item's failure must not stop the next
                log.exception("%s: an item failed", self.name)
            finally:
                self._queue.task_done()
