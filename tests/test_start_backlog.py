"""The kernel-log pump says when the backlog a start found has been handed on (issue 30 item 4: "healthy once the
backlog is read"): only a batch read to the log's end and given to the agent counts, not one held before the
agent adopted the pump, nor one the reader child sent before it reached the end."""

from __future__ import annotations

import select

from oomwatch.pump import KernelLogPump
from oomwatch.sources.logitems import CaughtUp, Lost
from tests.conftest import SeqpacketKmsg, wait_for
from tests.test_agent import SCENARIOS, seq_of


class ChildLikeReader:
    """As sources.kmsgproc.KmsgChild: its batches say (CaughtUp) when the child last read /dev/kmsg to its end."""

    reports_caught_up = True

    def __init__(self, batches: list[list]) -> None:
        self.batches = batches

    def read_available(self):
        return self.batches.pop(0) if self.batches else []

    def wait(self, timeout, wake_fd=None) -> bool:
        return bool(select.select([wake_fd], [], [], timeout)[0])

    def close(self) -> None:
        pass


def test_a_backlog_held_before_the_agent_adopts_the_pump_is_read_once_handed_on() -> None:
    kmsg = SeqpacketKmsg()
    kmsg.send(SCENARIOS)
    reader = kmsg.factory("/dev/kmsg")
    reader.open()
    pump = KernelLogPump(reader)
    pump.start()
    try:
        assert wait_for(lambda: pump.last_seq == seq_of(SCENARIOS[-1]))  # read to the end, and held
        assert not pump.backlog_read
        emitted: list = []
        pump.adopt(emitted.append, lambda after_seq: None)
        assert emitted and pump.backlog_read
    finally:
        pump.stop()


def test_a_batch_the_reader_child_sent_before_it_reached_the_end_is_not_the_backlog_read() -> None:
    reader = ChildLikeReader([[Lost(3)], [CaughtUp(5.0)]])
    emitted: list = []
    pump = KernelLogPump(reader, emitted.append)
    pump.start()
    try:
        assert wait_for(lambda: len(emitted) == 1)
        assert emitted[0].drained_at is None and not pump.backlog_read
        pump.wake()  # the child's next frame: it has read to the end
        assert wait_for(lambda: pump.backlog_read)
        assert [(e.items, e.drained_at) for e in emitted[1:]] == [([], 5.0)]
    finally:
        pump.stop()


def test_healthz_says_starting_until_the_backlog_is_read() -> None:
    """Issue 30 item 4: healthy once the backlog is read: /healthz says so while the pump has not yet handed a
    batch read to the log's end to the agent (the kernel-log source's word, from its pump's)."""
    from types import SimpleNamespace

    from oomwatch.agent import health_of
    from oomwatch.sources.kernellog import KernelLogSource
    from tests.test_agent_health import agent

    source = KernelLogSource("/dev/kmsg-test", lambda event: None)
    source.pump = SimpleNamespace(backlog_read=False, alive=True, error=None)  # (a pump before its first batch)
    assert health_of(agent(kernel_log=source)) == (False, {"starting": "reading the kernel log's backlog"})
    source.pump.backlog_read = True
    assert health_of(agent(kernel_log=source)) == (True, {"kmsg": "ok", "cgroups": "ok"})


def test_an_empty_backlog_read_to_its_end_makes_the_view_ready() -> None:
    """A quiet node: the first read finds nothing in the ring. That read alone changes the view (scrapes and
    /healthz read a view replaced only on a change), or /healthz would say starting until the next kill."""
    from oomwatch.events import KernelLog
    from tests.replay import Replay, live_settings

    replay = Replay(live_settings(), now=100.0)
    assert not replay.pipeline.view().kernel_log_live
    fx = replay.step(KernelLog([], drained_at=100.0), now=100.0)
    assert fx.changed and replay.pipeline.view().kernel_log_live
