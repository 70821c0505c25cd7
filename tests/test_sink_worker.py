"""The sinks' one background worker (oomwatch.sinks.worker): bounded, never blocks the caller, counts what it
drops, and handles what was queued before close returns."""

from __future__ import annotations

import threading

from oomwatch.sinks.worker import QueueWorker


def test_a_full_queue_drops_and_counts_without_blocking() -> None:
    release = threading.Event()
    handled: list[int] = []

    def handle(item: int) -> None:
        release.wait(5)
        handled.append(item)

    worker: QueueWorker[int] = QueueWorker("test-worker", handle, size=2)
    worker.start()
    accepted = [worker.put(i) for i in range(10)]
    # the thread holds at most one item; two wait; the rest are refused at once
    assert accepted.count(True) in (2, 3) and worker.dropped == accepted.count(False)
    release.set()
    assert worker.wait_idle(5)
    assert handled == [i for i, ok in enumerate(accepted) if ok]
    worker.close(5)
    assert not worker.running


def test_close_handles_what_is_queued_and_sets_closing_first() -> None:
    seen_closing: list[bool] = []
    gate = threading.Event()
    worker: QueueWorker[str] = QueueWorker("test-worker", lambda item: (gate.wait(5), seen_closing.append(
        worker.closing.is_set())), size=8)
    worker.start()
    for item in "abc":
        assert worker.put(item)
    threading.Timer(0.05, gate.set).start()
    worker.close(5)
    assert len(seen_closing) == 3 and all(seen_closing)


def test_a_handler_that_raises_does_not_stop_the_next_item(caplog) -> None:
    handled: list[int] = []

    def handle(item: int) -> None:
        if item == 1:
            raise RuntimeError("boom")
        handled.append(item)

    worker: QueueWorker[int] = QueueWorker("test-worker", handle, size=8)
    worker.start()
    for i in range(3):
        worker.put(i)
    assert worker.wait_idle(5)
    worker.close(5)
    assert handled == [0, 2] and "an item failed" in caplog.text
