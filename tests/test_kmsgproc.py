"""The kernel-log reader process: records cross the pipe in order, unparsed records as counts, gaps as lost;
it dies with the agent."""

from __future__ import annotations

import os
import time

import pytest

from oomwatch.model import KmsgRecord, ReportMemory
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
    # table) crosses parsed, as one item (issue 21); the rest of the storm's records as counts.
    assert not [r.text for r in records if r.text.startswith((" ", "RIP:", "RAX:", "Code:", "Call Trace"))]
    parts = [i.report for i in items if isinstance(i, ReportMemory)]
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
