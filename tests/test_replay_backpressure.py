"""A saved log's replay waits for the loop (issue 31 item 3): a log is read faster than the pipeline takes it, and
the parsed records waiting on the loop's queue were most of the agent's memory in a replay of 200,000 kills. The
replay hands a batch on only while fewer than REPLAY_QUEUED_MAX events wait."""

from __future__ import annotations

import threading

from oomwatch.events import KernelLog, KernelLogEnded
from oomwatch.sources.kernellog import REPLAY_BATCH, REPLAY_QUEUED_MAX, KernelLogSource
from tests.conftest import CAPTURES


def test_the_replay_hands_on_batches_only_while_the_queue_has_room() -> None:
    storm = CAPTURES / "linux-6.1-storm-ratelimited.kmsg"  # 4,658 records: 10 batches
    emitted: list = []
    room = threading.Event()
    full_seen = threading.Event()

    def queued() -> int:
        if room.is_set():
            return 0
        full_seen.set()
        return REPLAY_QUEUED_MAX  # full until the test makes room

    source = KernelLogSource(str(storm), emitted.append, queued=queued)
    source.open(lambda kind: None)
    source.start()
    assert full_seen.wait(10)
    # the replay read its first batch and waits: nothing handed on while the queue is full
    assert not any(isinstance(e, KernelLog) and e.items for e in emitted)
    room.set()
    source.join(30)
    batches = [e for e in emitted if isinstance(e, KernelLog)]
    assert sum(len(b.items) for b in batches) >= 4658 // 2 and all(len(b.items) <= REPLAY_BATCH for b in batches)
    assert isinstance(emitted[-1], KernelLogEnded) and emitted[-1].saved


def test_a_stop_ends_a_replay_waiting_for_room() -> None:
    storm = CAPTURES / "linux-6.1-storm-ratelimited.kmsg"
    emitted: list = []
    source = KernelLogSource(str(storm), emitted.append, queued=lambda: REPLAY_QUEUED_MAX)
    source.open(lambda kind: None)
    source.start()
    source.stop()
    source.join(5)
    assert source.replayed and isinstance(emitted[-1], KernelLogEnded)  # it did not wait for room any more
