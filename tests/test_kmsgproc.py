"""The kernel-log reader process: records cross the pipe in order, unparsed records as counts, gaps as lost;
it dies with the agent."""

from __future__ import annotations

import os
import time

import pytest

from oomwatch.model import KmsgRecord
from oomwatch.parse.memstat import part_report
from oomwatch.sources.kmsg import KmsgUnavailable, Lost, Skipped
from oomwatch.sources.kmsgproc import KmsgChild
from tests.conftest import CAPTURES, SeqpacketKmsg, raw_records, wait_for

STORM = raw_records(CAPTURES / "linux-6.1-storm-ratelimited.kmsg")


def drain(child: KmsgChild, want_seq: int, timeout: float = 20.0) -> list:
    items, end = [], time.monotonic() + timeout
    while time.monotonic() < end:
        items += list(child.read_available())
        last = [i for i in items if isinstance(i, (KmsgRecord, Skipped))]
        if last and (last[-1].seq if isinstance(last[-1], KmsgRecord) else last[-1].last_seq) >= want_seq:
            break
        child.wait(0.2)
    return items


def seq(raw: bytes) -> int:
    return int(raw.split(b",", 2)[1])


def test_a_storm_crosses_the_pipe_whole_and_in_order() -> None:
    kmsg = SeqpacketKmsg()
    kmsg.send(STORM)
    child = KmsgChild("/dev/kmsg-test", reader_factory=kmsg.factory)
    child.open()
    try:
        items = drain(child, seq(STORM[-1]))
    finally:
        child.close()
    records = [i for i in items if isinstance(i, KmsgRecord)]
    skipped = sum(i.count for i in items if isinstance(i, Skipped))
    assert len(records) + skipped == len(STORM)
    assert [r.seq for r in records] == sorted(r.seq for r in records)
    assert sum("Killed process" in r.text for r in records) == 450  # every kill line, none filtered away
    # The stack traces and registers stay behind as counts; each full report's memory part (stats block, task
    # table) crosses as one item (issue 21), read by the agent; the rest of the storm's records as counts.
    assert not [r.text for r in records if r.text.startswith((" ", "RIP:", "RAX:", "Code:", "Call Trace"))]
    parts = [part_report(i.part) for i in items if isinstance(i, Skipped) and i.part is not None]
    assert len(parts) == 100 and all(p.cgroup and p.stats and p.tasks for p in parts)
    assert skipped > 3 * len(records)


def test_a_gap_after_the_cursor_is_lost_and_the_child_goes_with_its_agent() -> None:
    kmsg = SeqpacketKmsg()
    kmsg.send([r for r in STORM if seq(r) > 1000])
    child = KmsgChild("/dev/kmsg-test", reader_factory=kmsg.factory)
    child.open(after_seq=900)
    pid = child.pid
    try:
        items = drain(child, seq(STORM[-1]))
        assert isinstance(items[0], Lost) and items[0].count == 100
    finally:
        child.close()
    assert child.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_reader_that_cannot_open_fails_in_the_agent_with_its_reason(tmp_path) -> None:
    with pytest.raises(KmsgUnavailable, match="does not exist"):
        KmsgChild(str(tmp_path / "none")).open()


def test_a_dead_child_is_an_error_the_pump_can_report() -> None:
    kmsg = SeqpacketKmsg()
    child = KmsgChild("/dev/kmsg-test", reader_factory=kmsg.factory)
    child.open()
    os.kill(child.pid, 9)
    assert wait_for(lambda: child.wait(0.1))  # the pipe reads its end: the child is gone
    with pytest.raises(KmsgUnavailable, match="exited"):
        for _ in range(50):
            list(child.read_available())
            time.sleep(0.05)
    child.close()


def test_the_child_says_when_it_read_the_log_to_its_end_and_answers_an_ask_on_a_quiet_log() -> None:
    """Each frame after a read to the end carries CaughtUp (the time every record printed before it had been read:
    the agent cannot tell that from its own clock when the child lags behind a storm); a quiet log sends nothing
    by itself, and an ask (the pump's wake) is answered with a fresh CaughtUp and no records."""
    from oomwatch.sources.logitems import CaughtUp

    kmsg = SeqpacketKmsg()
    sent_at = time.time()
    kmsg.send(STORM[:40])
    child = KmsgChild("/dev/kmsg-test", reader_factory=kmsg.factory)
    child.open()
    try:
        items: list = []
        wait_for(lambda: items.extend(child.read_available()) or any(isinstance(i, CaughtUp) for i in items),
                 timeout=20)
        first = [i for i in items if isinstance(i, CaughtUp)][-1]
        assert sent_at <= first.at <= time.time()
        assert isinstance(items[-1], CaughtUp)  # after the records of its frame
        assert max(i.seq if isinstance(i, KmsgRecord) else i.last_seq for i in items
                   if isinstance(i, (KmsgRecord, Skipped))) == seq(STORM[39])  # all 40 read before it
        assert child.wait(0.3) is False and list(child.read_available()) == []  # quiet: nothing by itself
        asked_at = time.time()
        child.ask()
        answer: list = []
        wait_for(lambda: answer.extend(child.read_available()) or bool(answer), timeout=20)
        assert len(answer) == 1 and isinstance(answer[0], CaughtUp) and answer[0].at >= asked_at
        kmsg.send(STORM[40:41])  # a record after the answer: its frame says a later time
        later: list = []
        wait_for(lambda: later.extend(child.read_available()) or any(isinstance(i, CaughtUp) for i in later),
                 timeout=20)
        assert later[-1].at > answer[0].at
    finally:
        child.close()


def test_the_pump_takes_the_childs_time_for_drained_at_and_waits_for_its_answer() -> None:
    """KernelLog.drained_at is the child's CaughtUp (stripped from the items), never the pump's clock; a wake
    with nothing read sends no KernelLog until the child's answer comes."""
    from oomwatch.events import KernelLog
    from oomwatch.pump import KernelLogPump
    from oomwatch.sources.logitems import CaughtUp

    kmsg = SeqpacketKmsg()
    kmsg.send(STORM[:10])
    child = KmsgChild("/dev/kmsg-test", reader_factory=kmsg.factory)
    child.open()
    events: list = []
    pump = KernelLogPump(child, events.append)
    pump.start()
    try:
        wait_for(lambda: any(e.drained_at is not None for e in events if isinstance(e, KernelLog)), timeout=20)
        logs = [e for e in events if isinstance(e, KernelLog)]
        assert not any(isinstance(i, CaughtUp) for e in logs for i in e.items)
        drained = [e.drained_at for e in logs if e.drained_at is not None]
        n = len(logs)
        woken_at = time.time()
        pump.wake()
        wait_for(lambda: len([e for e in events if isinstance(e, KernelLog)]) > n, timeout=20)
        answer = [e for e in events if isinstance(e, KernelLog)][n]
        assert answer.items == [] and answer.drained_at >= woken_at > drained[-1]
    finally:
        pump.stop()
        child.close()


def test_a_reader_started_after_the_agent_froze_what_lives_leaves_it_frozen() -> None:
    """The agent moves what its start built out of the cyclic collector's reach (process.freeze_long_lived); a
    reader forked after that (one started again) must not hand it back to the collector."""
    import gc

    from oomwatch.process import freeze_long_lived

    gc.unfreeze()
    try:
        kept = []
        kept.append(kept)  # a cycle that lives: frozen, its count stays
        freeze_long_lived()
        frozen = gc.get_freeze_count()
        assert frozen > 0
        kmsg = SeqpacketKmsg()
        kmsg.send(STORM[:10])
        child = KmsgChild("/dev/kmsg-test", reader_factory=kmsg.factory)
        child.open()
        child.close()
        assert gc.get_freeze_count() >= frozen
    finally:
        gc.unfreeze()
