"""The syslog(2) kernel-log reader: which records of a READ_ALL snapshot are new, and the reader around it."""

from __future__ import annotations

import ctypes
import errno
import os
import time

import pytest

from oomwatch.model import KmsgRecord
from oomwatch.parse.kmsg import parse_kmsg_record
from oomwatch.sources.kmsg import KmsgUnavailable, LiveKmsg, Lost
from oomwatch.sources.klog import (SYSLOG_ACTION_READ_ALL, SYSLOG_ACTION_SIZE_BUFFER, KlogCursor, SyslogKmsg,
                                   new_records, parse_read_all)
from tests.conftest import CAPTURES, raw_records

CAPTURE = CAPTURES / "linux-6.1-memcg-scenarios.kmsg"


def syslog_lines(path=CAPTURE, timed: bool = True, upto_seq: int | None = None) -> list[bytes]:
    """A raw /dev/kmsg capture as READ_ALL prints it: `<PRI>[SSSSS.UUUUUU] text`, one line per line of a
    multi-line record, each with the record's prefix (`<PRI>text` when printk time is off)."""
    lines = []
    for raw in raw_records(path):
        if upto_seq is not None and parse_kmsg_record(raw).seq > upto_seq:
            break
        rec = parse_kmsg_record(raw)
        prefix = f"<{rec.priority}>"
        if timed:
            prefix += f"[{rec.usec // 1_000_000:5d}.{rec.usec % 1_000_000:06d}] "
        lines += [(prefix + part).encode() for part in rec.text.split("\n")]
    return lines


LINES = syslog_lines()
PARSED = parse_read_all(b"\n".join(LINES))


def snap(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in lines)


def records(items) -> list[KmsgRecord]:
    assert all(isinstance(i, KmsgRecord) for i in items), items
    return items


def texts(items) -> list[str]:
    return [r.text for r in records(items)]


def index_in_group(usec: int, nth: int) -> int:
    """Index in LINES of the `nth` line stamped `usec`."""
    return [i for i, r in enumerate(PARSED) if r.usec == usec][nth]


# --- parsing READ_ALL text -----------------------------------------------------------------------------


def test_the_converted_capture_parses_back_to_its_records() -> None:
    raw = [parse_kmsg_record(r) for r in raw_records(CAPTURE)]
    assert len(PARSED) == len(LINES) > len(raw) > 600  # the multi-line records became several lines
    assert [r.text for r in PARSED][:3] == [r.text for r in raw][:3]
    assert {r.usec for r in PARSED} == {r.usec for r in raw}
    assert PARSED[0].priority == 5 and PARSED[0].text.startswith("Linux version 6.1.0")


def test_prefix_variants() -> None:
    got = parse_read_all(b"<6>[    1.234567][  T123] with caller\n<4>[   12.5] short fraction\n"
                         b"<6>untimed\n<14>[    T1] untimed with caller\n<6>[    2.000000]  two spaces\n"
                         b"not from the kernel\n<3>[    3.000001] \xffbad utf8\n")
    assert [(r.priority, r.usec, r.text) for r in got] == [
        (6, 1_234_567, "with caller"), (4, 12_500_000, "short fraction"), (6, None, "untimed"),
        (14, None, "untimed with caller"), (6, 2_000_000, " two spaces"), (3, 3_000_001, "\\xffbad utf8")]


# --- new_records on timed snapshots ----------------------------------------------------------------------


def test_first_snapshot_yields_everything_with_seq_equal_to_usec() -> None:
    items, cursor = new_records(snap(LINES), KlogCursor())
    assert texts(items) == [r.text for r in PARSED]
    assert [r.usec for r in items] == [r.usec for r in PARSED]
    assert all(r.seq == r.usec for r in items)
    assert cursor.usec == cursor.seq == PARSED[-1].usec


def test_identical_snapshot_yields_nothing_and_keeps_the_cursor() -> None:
    _, cursor = new_records(snap(LINES), KlogCursor())
    items, again = new_records(snap(LINES), cursor)
    assert items == [] and again == cursor
    assert new_records(b"", cursor) == ([], cursor)  # `dmesg -C` and nothing since


def test_five_more_records_yield_exactly_those_five() -> None:
    cut = 400
    assert len({r.usec for r in PARSED[cut - 1:cut + 5]}) == 6, "a boundary between distinct timestamps"
    _, cursor = new_records(snap(LINES[:cut]), KlogCursor())
    items, cursor = new_records(snap(LINES[:cut + 5]), cursor)
    assert texts(items) == [r.text for r in PARSED[cut:cut + 5]]
    assert cursor.usec == PARSED[cut + 4].usec
    assert new_records(snap(LINES[:cut + 5]), cursor)[0] == []


def test_a_snapshot_taken_inside_a_group_of_equal_timestamps() -> None:
    # 24 lines share usec 8540689 (one memcg OOM report printed within a microsecond's resolution).
    start, tenth = index_in_group(8540689, 0), index_in_group(8540689, 10)
    _, cursor = new_records(snap(LINES[:tenth]), KlogCursor())
    assert cursor.usec == 8540689 and len(cursor.seen) == 10
    items, cursor = new_records(snap(LINES[:tenth + 5]), cursor)
    assert texts(items) == [r.text for r in PARSED[tenth:tenth + 5]]
    assert all(r.seq == 8540689 for r in items)
    assert len(cursor.seen) == 15 and tenth - start == 10


def test_repeated_text_at_one_timestamp_counts_each_occurrence() -> None:
    a = b"<6>[    5.000000] Memory cgroup stats for /a:"
    b = b"<6>[    5.000000] anon 4096"
    _, cursor = new_records(snap([a, b]), KlogCursor())
    items, cursor = new_records(snap([a, b, a, b]), cursor)
    assert texts(items) == ["Memory cgroup stats for /a:", "anon 4096"]
    assert new_records(snap([a, b, a, b]), cursor)[0] == []


def test_a_wrapped_ring_yields_lost_then_everything_left() -> None:
    _, cursor = new_records(snap(LINES[:300]), KlogCursor())
    # Everything up to our cursor and a few records after it were overwritten before the next read.
    oldest = 310
    assert PARSED[oldest].usec > cursor.usec
    items, cursor = new_records(snap(LINES[oldest:]), cursor)
    assert items[0] == Lost(None)
    assert texts(items[1:]) == [r.text for r in PARSED[oldest:]]


def test_old_records_dropping_off_is_no_loss_while_the_cursor_is_still_in_the_ring() -> None:
    _, cursor = new_records(snap(LINES[:300]), KlogCursor())
    items, _ = new_records(snap(LINES[250:305]), cursor)
    assert texts(items) == [r.text for r in PARSED[300:305]]


def test_a_ring_older_than_the_cursor_is_a_new_log() -> None:
    _, cursor = new_records(snap(LINES), KlogCursor())
    items, cursor = new_records(snap(LINES[:50]), cursor)  # as after a reboot under a kept cursor
    assert items[0] == Lost(None) and texts(items[1:]) == [r.text for r in PARSED[:50]]
    assert cursor.usec == PARSED[49].usec
    assert new_records(snap(LINES[:51]), cursor)[0][0].text == PARSED[50].text


def test_a_restored_cursor_skips_everything_at_its_timestamp() -> None:
    # The agent saved seq = 8540689 (all of it handled); it knows no texts.
    items, _ = new_records(snap(LINES), KlogCursor.after(8540689))
    first_after = index_in_group(8540689, -1) + 1
    assert texts(items) == [r.text for r in PARSED[first_after:]]
    assert PARSED[first_after].usec > 8540689


# --- new_records without timestamps ---------------------------------------------------------------------

UNTIMED = syslog_lines(timed=False)


def test_untimed_snapshots_are_matched_by_position() -> None:
    items, cursor = new_records(snap(UNTIMED[:500]), KlogCursor())
    assert texts(items) == [r.text for r in PARSED[:500]]
    assert [r.seq for r in items] == list(range(1, 501)) and all(r.usec is None for r in items)
    assert new_records(snap(UNTIMED[:500]), cursor)[0] == []
    items, cursor = new_records(snap(UNTIMED[:505]), cursor)
    assert texts(items) == [r.text for r in PARSED[500:505]]
    assert [r.seq for r in items] == list(range(501, 506))
    # The ring dropped its 200 oldest lines and gained 3: those 3 only.
    items, cursor = new_records(snap(UNTIMED[200:508]), cursor)
    assert texts(items) == [r.text for r in PARSED[505:508]] and items[0].seq == 506
    # Wrapped past everything we saw: lost, then all of it.
    items, cursor = new_records(snap(UNTIMED[600:650]), cursor)
    assert items[0] == Lost(None) and texts(items[1:]) == [r.text for r in PARSED[600:650]]
    assert items[1].seq == 509


def test_untimed_repeated_lines_are_not_taken_for_old_ones() -> None:
    # A second OOM in the same cgroup prints lines identical to the first one's.
    block = [b"<6>Tasks state (memory values in pages):", b"<6>[  pid  ]   uid  tgid total_vm"]
    _, cursor = new_records(snap(block), KlogCursor())
    items, _ = new_records(snap(block + block), cursor)
    assert texts(items) == ["Tasks state (memory values in pages):", "[  pid  ]   uid  tgid total_vm"]


def test_untimed_after_a_restored_cursor_reports_lost_and_takes_a_baseline() -> None:
    items, cursor = new_records(snap(UNTIMED[:100]), KlogCursor.after(42))
    assert items == [Lost(None)]
    items, _ = new_records(snap(UNTIMED[:102]), cursor)
    assert texts(items) == [r.text for r in PARSED[100:102]] and [r.seq for r in items] == [43, 44]


def test_printk_time_switched_on_continues_by_position() -> None:
    _, cursor = new_records(snap(UNTIMED[:100]), KlogCursor())
    items, cursor = new_records(snap(LINES[:103]), cursor)
    assert texts(items) == [r.text for r in PARSED[100:103]] and items[0].seq == PARSED[100].usec
    assert new_records(snap(LINES[:103]), cursor)[0] == []


# --- the reader, with a fake syscall ------------------------------------------------------------------


class FakeKlogctl:
    """klogctl(2) over a list of lines: READ_ALL returns the newest whole lines that fit, like the kernel."""

    def __init__(self, lines: list[bytes], ring_size: int = 131072,
                 fail: dict[int, int] | None = None) -> None:
        self.lines = list(lines)
        self.ring_size = ring_size
        self.fail = fail or {}
        self.calls: list[tuple[int, int]] = []
        self.on_read = None  # called before each READ_ALL with the call count

    def __call__(self, action: int, buf, size: int) -> int:
        self.calls.append((action, size))
        if action in self.fail:
            ctypes.set_errno(self.fail[action])
            return -1
        if action == SYSLOG_ACTION_SIZE_BUFFER:
            return self.ring_size
        assert action == SYSLOG_ACTION_READ_ALL
        if self.on_read is not None:
            self.on_read(sum(1 for a, _ in self.calls if a == SYSLOG_ACTION_READ_ALL))
        out = b""
        for line in reversed(self.lines):
            if len(out) + len(line) + 1 > size:
                break
            out = line + b"\n" + out
        ctypes.memmove(buf, out, len(out))
        return len(out)


def test_reader_reads_the_ring_then_only_what_is_new() -> None:
    fake = FakeKlogctl(LINES[:600])
    reader = SyslogKmsg(syscall=fake)
    reader.open()
    assert reader.fd is None
    assert texts(list(reader.read_available())) == [r.text for r in PARSED[:600]]
    assert list(reader.read_available()) == []
    fake.lines = LINES[:605]
    assert texts(list(reader.read_available())) == [r.text for r in PARSED[600:605]]
    reader.close()


def test_reader_opened_after_a_saved_cursor() -> None:
    reader = SyslogKmsg(syscall=FakeKlogctl(LINES))
    reader.open(after_seq=PARSED[700].usec)
    items = list(reader.read_available())
    assert items and all(r.usec > PARSED[700].usec for r in records(items))
    assert items[0].text == next(r.text for r in PARSED if r.usec > PARSED[700].usec)


def test_reader_grows_its_buffer_until_the_ring_fits() -> None:
    fake = FakeKlogctl(LINES, ring_size=4096)  # the text is far longer than the ring claims
    reader = SyslogKmsg(syscall=fake)
    reader.open()
    assert texts(list(reader.read_available())) == [r.text for r in PARSED]
    sizes = [size for action, size in fake.calls if action == SYSLOG_ACTION_READ_ALL]
    assert sizes[0] == 4096 and sizes == sorted(sizes) and sizes[-1] > len(snap(LINES))
    assert reader.snapshot_bytes == len(snap(LINES))
    fake.lines = LINES + [b"<6>[99999.000000] grown", b"<6>[99999.000001] grown again"]
    assert texts(list(reader.read_available())) == ["grown", "grown again"]


@pytest.mark.parametrize("action", [SYSLOG_ACTION_SIZE_BUFFER, SYSLOG_ACTION_READ_ALL])
def test_eperm_is_kmsg_unavailable_naming_cap_syslog(action: int) -> None:
    reader = SyslogKmsg(syscall=FakeKlogctl(LINES, fail={action: errno.EPERM}))
    with pytest.raises(KmsgUnavailable, match="CAP_SYSLOG") as info:
        reader.open()
    assert "dmesg_restrict" in str(info.value) and "EPERM" in str(info.value)


def test_enosys_is_kmsg_unavailable() -> None:
    with pytest.raises(KmsgUnavailable, match="ENOSYS"):
        SyslogKmsg(syscall=FakeKlogctl([], fail={SYSLOG_ACTION_SIZE_BUFFER: errno.ENOSYS})).open()


def test_wait_times_out_when_nothing_new() -> None:
    reader = SyslogKmsg(syscall=FakeKlogctl(LINES[:10]), fallback_interval=0.02)
    reader.open()
    list(reader.read_available())
    start = time.monotonic()
    assert reader.wait(0.15) is False
    assert 0.15 <= time.monotonic() - start < 1.0


def test_wait_finds_new_records_on_the_fallback_interval() -> None:
    fake = FakeKlogctl(LINES[:10])
    reader = SyslogKmsg(syscall=fake, fallback_interval=0.05)
    reader.open()
    list(reader.read_available())
    reads_before = sum(1 for a, _ in fake.calls if a == SYSLOG_ACTION_READ_ALL)
    fake.on_read = lambda n: setattr(fake, "lines", LINES[:12]) if n >= reads_before + 3 else None
    start = time.monotonic()
    assert reader.wait(None) is True  # no timeout: only the fallback interval can end this
    assert 0.1 <= time.monotonic() - start < 1.0
    reads = sum(1 for a, _ in fake.calls if a == SYSLOG_ACTION_READ_ALL)
    assert texts(list(reader.read_available())) == [r.text for r in PARSED[10:12]]
    assert sum(1 for a, _ in fake.calls if a == SYSLOG_ACTION_READ_ALL) == reads  # wait's snapshot was used


def test_wait_reads_when_woken_and_drains_the_wake_fd() -> None:
    fake = FakeKlogctl(LINES[:10])
    reader = SyslogKmsg(syscall=fake, fallback_interval=30.0)
    reader.open()
    list(reader.read_available())
    r, w = os.pipe()
    try:
        os.write(w, b"x")
        start = time.monotonic()
        assert reader.wait(None, r) is False  # woken, nothing new
        fake.lines = LINES[:11]
        os.write(w, b"x")
        assert reader.wait(None, r) is True
        assert time.monotonic() - start < 1.0
        assert texts(list(reader.read_available())) == [PARSED[10].text]
        os.set_blocking(r, False)
        with pytest.raises(BlockingIOError):
            os.read(r, 1)  # drained, or the next wait would return at once
        start = time.monotonic()
        assert reader.wait(0.05, r) is False
        assert time.monotonic() - start >= 0.05
    finally:
        os.close(r)
        os.close(w)


# --- the real syscall ---------------------------------------------------------------------------------


def test_real_syslog_read_all() -> None:
    reader = SyslogKmsg()
    reader.open()  # must not raise here: this suite runs as root (CAP_SYSLOG)
    items = list(reader.read_available())
    recs = records(items)
    assert len(recs) > 10
    assert all(r.usec is not None and r.seq == r.usec for r in recs)
    assert [r.usec for r in recs[:20]] == sorted(r.usec for r in recs[:20])
    again = records(list(reader.read_available()))
    assert all(r.usec >= recs[-1].usec for r in again)  # only what was printed since, if anything
    reader.close()


def test_real_syslog_matches_dev_kmsg() -> None:
    """The same ring read both ways: every /dev/kmsg line up to the syslog snapshot's end is in it."""
    reader = SyslogKmsg()
    reader.open()
    syslog = [(r.usec, r.text) for r in records(list(reader.read_available()))]
    live = LiveKmsg()
    try:
        live.open()
    except KmsgUnavailable as exc:
        pytest.skip(f"/dev/kmsg not readable here: {exc}")
    try:
        kmsg = [r for r in live.read_available() if isinstance(r, KmsgRecord)]
    finally:
        live.close()
    end = syslog[-1][0]
    lines = [(r.usec, part) for r in kmsg if syslog[0][0] <= r.usec <= end for part in r.text.split("\n")]
    assert lines and lines == [x for x in syslog if x[0] <= end][-len(lines):]


def test_permission_errors_name_the_fix_for_where_it_runs() -> None:
    import errno

    from oomwatch.sources.klog import explain_syslog_error

    host = explain_syslog_error("syslog(2)", errno.EPERM, container=False)
    pod = explain_syslog_error("syslog(2)", errno.EPERM, container=True)
    assert "run it as root" in host and "container" not in host
    assert "container's capabilities" in pod
    assert explain_syslog_error("syslog(2)", errno.ENOSYS).count("syslog(2)") == 1
