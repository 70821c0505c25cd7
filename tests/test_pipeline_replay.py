"""The kernel-log cursor through Pipeline.step(), without a thread: the real 6.1 memcg capture read by the
live reader (tests/replay.live_reads), restarts from the state a pipeline's Effects.save gave (after a
SIGKILL: the last periodic save; after SIGTERM: the Stop's), records lost while the agent was down, a new
boot, the early reader that reads the ring from its start, the syslog(2) reader's timestamp cursor, a record
that breaks."""

from __future__ import annotations

import logging
from typing import Any, Iterable, Optional

import pytest

from oomwatch.events import KernelLog, Stop
from oomwatch.sources.klog import SyslogKmsg
from tests.conftest import CAPTURES, raw_records
from tests.replay import BOOT_ID, Replay, cursor_for_restart, live_reads, live_settings
from tests.test_klog import LINES, PARSED, FakeKlogctl, syslog_lines

SCENARIOS = raw_records(CAPTURES / "linux-6.1-memcg-scenarios.kmsg")
BOOT = 1_000.0  # the capture's kernel time 0, as epoch seconds: its kills are at BOOT + 8.5 … 23.9 s


def seq_of(record: bytes) -> int:
    return int(record.split(b",", 2)[1])


def upto(seq: int) -> list[bytes]:
    return [r for r in SCENARIOS if seq_of(r) <= seq]


def after(seq: int) -> list[bytes]:
    return [r for r in SCENARIOS if seq_of(r) > seq]


def settings(**overrides: Any):
    return live_settings(boot_time=BOOT, **overrides)


def read(replay: Replay, raw: Iterable[bytes], after_seq: Optional[int] = None, every: float = 0.01) -> None:
    """The live reader's reads of `raw` stepped in, `every` seconds apart, each read to the log's end."""
    for items in live_reads(raw, after_seq):
        replay.step(KernelLog(items, drained_at=replay.now + every), replay.now + every)


def victims(incidents) -> list[int]:
    return [i.victim.pid for i in incidents]


def test_a_restart_after_sigkill_publishes_each_incident_exactly_once() -> None:
    # First life: the kernel has printed the first two incidents (single /a, group /b).
    first = Replay(settings(), now=BOOT + 14.0)
    read(first, upto(521))
    first.advance_to(BOOT + 16.0)
    assert victims(first.published) == [118, 125]
    state = first.saves[-1]  # SIGKILL: no Stop, the last state written is what the next start finds
    assert state["cursor_seq"] == 521
    # While it is down the kernel prints two more; the ring buffer still holds everything.
    second = Replay.restarted(state, settings(), now=BOOT + 30.0)
    read(second, SCENARIOS, after_seq=cursor_for_restart(state))
    second.settle()
    assert victims(second.published) == [132, 139]
    store = second.pipeline.view().store
    assert [i["victim"]["pid"] for i in store.incidents] == [118, 125, 132, 139]
    assert store.node_kills[("group", "cgroup")] == 3 and store.node_kills[("single", "cgroup")] == 1
    assert second.saves[-1]["cursor_seq"] == seq_of(SCENARIOS[-1])


def test_a_restart_from_the_same_ring_without_a_cursor_publishes_nothing_twice() -> None:
    """The reader opened without a cursor (the records read again) but the state restored: the store knows
    every incident it counted and publishes none again."""
    first = Replay(settings(), now=BOOT + 24.0)
    read(first, SCENARIOS)
    first.settle()
    second = Replay.restarted(first.saves[-1], settings(), now=BOOT + 40.0)
    read(second, SCENARIOS)
    second.settle()
    assert victims(first.published) == [118, 125, 132, 139] and second.published == []
    assert len(second.pipeline.view().store.incidents) == 4


@pytest.mark.parametrize("ending", ["sigterm", "sigkill"])
def test_stop_in_the_middle_of_a_group_listing_loses_nothing(ending: str) -> None:
    # The agent stops after "Tasks in /b" but before the group's kill lines: the incident is unfinished, so
    # the cursor must stop before it and the next start must read it whole.
    first = Replay(settings(quiet=30.0), now=BOOT + 13.6)  # no quiet flush in this life
    read(first, upto(518))
    first.advance_to(first.now + 2.0)  # the periodic save after the single kill was published
    if ending == "sigterm":
        fx = first.step(Stop())
        assert fx.done and fx.save is not None
    assert victims(first.published) == [118]
    state = first.saves[-1]
    assert state["cursor_seq"] < 516  # before the group kill's first record
    second = Replay.restarted(state, settings(), now=BOOT + 30.0)
    read(second, upto(607), after_seq=cursor_for_restart(state))
    second.settle()
    assert victims(second.published) == [125, 132, 139]
    (group_b,) = [i for i in second.published if i.victim.pid == 125]
    assert sorted(p.pid for p in group_b.killed) == [122, 123, 125]
    assert [i["victim"]["pid"] for i in second.pipeline.view().store.incidents] == [118, 125, 132, 139]


def test_records_overwritten_while_down_are_counted_as_lost() -> None:
    first = Replay(settings(), now=BOOT + 5.0)
    read(first, upto(400))
    first.step(Stop())
    state = first.saves[-1]
    assert state["cursor_seq"] == 400
    second = Replay.restarted(state, settings(), now=BOOT + 30.0)
    read(second, after(450), after_seq=cursor_for_restart(state))  # 401..450 were overwritten
    second.settle()
    store = second.pipeline.view().store
    assert store.kmsg_lost == 50
    assert victims(second.published) == [118, 125, 132, 139]
    assert (logging.WARNING, "kernel log: 50 records lost before they could be read (the kernel's "
                             "memory.events still count their kills)") in second.logs


def test_new_boot_starts_fresh() -> None:
    first = Replay(settings(), now=BOOT + 24.0)
    read(first, SCENARIOS)
    first.step(Stop())
    state = first.saves[-1]
    new_boot = settings(boot_id="00000000-1111-2222-3333-444444444444")
    assert cursor_for_restart(state, new_boot.boot_id) is None
    second = Replay.restarted(state, new_boot, now=BOOT + 10.0)
    read(second, upto(480))  # after a reboot the sequence starts again
    second.settle()
    assert victims(second.published) == [118]
    store = second.pipeline.view().store
    assert [i["boot_id"] for i in store.incidents] == ["00000000-1111-2222-3333-444444444444"]
    assert store.node_kills[("single", "cgroup")] == 1 and store.node_kills[("group", "cgroup")] == 0


def test_an_early_reader_skips_to_the_saved_cursor() -> None:
    """The early reader (oomwatch/early.py) read the ring from its oldest record before the state was loaded:
    the pipeline drops what the cursor says was done (Settings.skip_upto) and counts nothing as lost."""
    first = Replay(settings(), now=BOOT + 14.0)
    read(first, upto(521))
    first.advance_to(first.now + 1.0)
    first.step(Stop())
    assert victims(first.published) == [118, 125]
    state = first.saves[-1]
    second = Replay.restarted(state, settings(skip_upto=cursor_for_restart(state)), now=BOOT + 30.0)
    read(second, SCENARIOS)
    second.settle()
    assert victims(second.published) == [132, 139]
    assert second.pipeline.view().store.kmsg_lost == 0


def test_a_gap_between_the_cursor_and_the_oldest_record_an_early_reader_found_is_lost() -> None:
    first = Replay(settings(), now=BOOT + 5.0)
    read(first, upto(400))
    first.step(Stop())
    state = first.saves[-1]
    second = Replay.restarted(state, settings(skip_upto=cursor_for_restart(state)), now=BOOT + 30.0)
    read(second, after(450))
    second.settle()
    assert victims(second.published) == [118, 125, 132, 139]
    assert second.pipeline.view().store.kmsg_lost == 50


def test_a_record_that_breaks_processing_is_skipped_counted_and_said(monkeypatch) -> None:
    from oomwatch import correlator as correlator_module

    real = correlator_module.parse_oom_line

    def breaks_on_118(text):
        if "Killed process 118" in text:
            raise RuntimeError("boom")
        return real(text)

    monkeypatch.setattr(correlator_module, "parse_oom_line", breaks_on_118)
    replay = Replay(settings(), now=BOOT + 14.0)
    read(replay, upto(521))
    replay.settle()
    assert victims(replay.published) == [125]
    assert replay.pipeline.view().store.kmsg_parse_errors >= 1
    errors = [message for level, message in replay.logs if level == logging.ERROR]
    assert errors and all("cannot process record" in m and "RuntimeError('boom')" in m for m in errors)


def test_syslog_restart_publishes_each_incident_once_with_usec_cursors() -> None:
    """The cursor logic (saved position, `pending - 1` at a stop) on timestamps instead of sequence numbers:
    the syslog(2) reader's reads of the same capture, its cursor saved as the syslog kind."""
    kernel = FakeKlogctl(syslog_lines(upto_seq=521))  # the first two incidents (single /a, group /b)
    reader = SyslogKmsg(syscall=kernel, fallback_interval=3600)
    reader.open()
    first = Replay(settings(kmsg_source="syslog"), now=BOOT + 14.0)
    first.step(KernelLog(list(reader.read_available()), drained_at=first.now), first.now)
    first.settle()
    first.step(Stop())
    state = first.saves[-1]
    assert victims(first.published) == [118, 125] and state["cursor_source"] == "syslog"
    assert cursor_for_restart(state, kind="kmsg") is None  # a /dev/kmsg reader cannot use a timestamp
    kernel.lines = LINES  # two more while it was down; the ring still holds everything
    reader = SyslogKmsg(syscall=kernel, fallback_interval=3600)
    reader.open(after_seq=cursor_for_restart(state, kind="syslog"))
    second = Replay.restarted(state, settings(kmsg_source="syslog"), now=BOOT + 30.0)
    for _ in range(3):  # several reads (as the fallback interval gives): nothing may come twice
        second.step(KernelLog(list(reader.read_available()), drained_at=second.now), second.now + 1.0)
    second.settle()
    assert victims(second.published) == [132, 139]
    seqs = {r.usec for r in PARSED}
    assert all(i["kernel_seq"] in seqs for i in second.pipeline.view().store.incidents)
    assert BOOT_ID == state["boot_id"]
