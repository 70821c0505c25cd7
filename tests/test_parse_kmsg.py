"""The /dev/kmsg record format and saved-log text formats."""

from __future__ import annotations

import io

import pytest

from oomwatch.parse.kmsg import GARBLED, LOST_MARKER, KmsgParseError, parse_kmsg_record, parse_text_log, unescape
from tests.conftest import CAPTURES, raw_records

CAPTURE_FILES = sorted(CAPTURES.glob("linux-6.1-*.kmsg"))


@pytest.mark.parametrize("path", CAPTURE_FILES, ids=[p.stem for p in CAPTURE_FILES])
def test_every_captured_record_parses_with_consecutive_sequence_numbers(path) -> None:
    records = [parse_kmsg_record(raw) for raw in raw_records(path)]
    seqs = [r.seq for r in records]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a capture without EPIPE has no gaps"
    assert all(r.usec is not None and r.usec >= 0 for r in records)
    assert [r.usec for r in records] == sorted(r.usec for r in records)


def test_record_fields_escapes_and_continuation_lines() -> None:
    rec = parse_kmsg_record(b"6,339,5140559,-,caller=T1;pci 0000:00:01.0: \\x5cok\\x09tab\n"
                            b" SUBSYSTEM=pci\n DEVICE=+pci:0000:00:01.0\n")
    assert (rec.priority, rec.level, rec.seq, rec.usec) == (6, 6, 339, 5140559)
    assert rec.text == "pci 0000:00:01.0: \\ok\ttab"
    assert rec.fields == (("SUBSYSTEM", "pci"), ("DEVICE", "+pci:0000:00:01.0"))


def test_memcg_stats_record_keeps_its_embedded_newlines() -> None:
    raw = next(r for r in raw_records(CAPTURES / "linux-6.1-memcg-scenarios.kmsg") if b"anon 66777088" in r)
    rec = parse_kmsg_record(raw)
    assert rec.text.splitlines()[0] == "anon 66777088"
    assert "thp_fault_alloc 27" in rec.text.splitlines()


def test_non_utf8_comm_survives_as_escapes() -> None:
    rec = parse_kmsg_record(b"3,7,100,-;Memory cgroup out of memory: Killed process 9 (tr\\xffin\\xc3\\xa9) "
                            b"total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB\n")
    assert "(tr\\xffiné)" in rec.text
    assert unescape(b"\\xe2\\x9c\\x93") == "✓"


@pytest.mark.parametrize("raw", [b"no semicolon here", b"6,1;short prefix", b"x,1,2,-;text", b"6,-1,2,-;neg",
                                 b";", b""])
def test_garbled_records_raise_a_parse_error(raw) -> None:
    with pytest.raises(KmsgParseError):
        parse_kmsg_record(raw)


def texts(data: bytes) -> list:
    return list(parse_text_log(io.BytesIO(data), year=2026))


def test_dmesg_formats() -> None:
    plain, raw, decoded = texts(b"[ 8548.134001] oom-kill:constraint=X\n"
                                b"<3>[    8.549782] Memory cgroup out of memory: Killed\n"
                                b"kern  :err   : [    9.1] Out of memory: Killed\n")
    assert (plain.usec, plain.text, plain.priority) == (8548134001, "oom-kill:constraint=X", 6)
    assert (raw.usec, raw.priority, raw.level) == (8549782, 3, 3)
    assert (decoded.usec, decoded.priority, decoded.text) == (9100000, 3, "Out of memory: Killed")


def test_dmesg_human_time_and_journalctl_formats() -> None:
    t, short, iso, mono = texts(
        b"[Sun Nov 22 17:38:21 2026] Tasks in /b are going\n"
        b"Nov 22 17:38:21 node-1 kernel: Tasks in /c are going\n"
        b"2026-11-22T17:38:21.250000+0000 node-1 kernel: Tasks in /d are going\n"
        b"[  123.456789] node-1 kernel: Tasks in /e are going\n")
    assert t.wall_time == short.wall_time == 1795369101.0
    assert iso.wall_time == 1795369101.25 and iso.text == "Tasks in /d are going"
    assert mono.usec == 123456789 and mono.wall_time is None


def test_saved_raw_dump_with_epipe_marker_and_garbage() -> None:
    items = texts(b"6,1,10,-;first\n SUBSYSTEM=x\n#EPIPE\n6,9,20,-;after the gap\nrandom noise line\n")
    assert [i.text for i in items] == ["first", "#EPIPE", "after the gap"]
    assert items[0].fields == (("SUBSYSTEM", "x"),)
    assert items[1].priority == LOST_MARKER


def test_truncated_raw_record_in_a_dump_is_flagged_not_fatal() -> None:
    items = texts(b"6,1,10,-;ok\n6,2,99999999999999999999999999,-;" + b"x" * 10 + b"\n")
    assert items[0].text == "ok"
    assert items[1].priority in (GARBLED, 6)


def test_live_reader_counts_an_overrun_from_the_sequence_gap_and_keeps_reading(monkeypatch) -> None:
    """/dev/kmsg returns EPIPE once when records were overwritten; the next read continues with the oldest
    record still there, and the sequence gap is the loss."""
    import errno

    from oomwatch.sources import kmsg as kmsg_source

    script = [b"6,10,1,-;before\n", BrokenPipeError(errno.EPIPE, "overrun"), b"6,15,2,-;after the gap\n",
              b"6,16,3,-;next\n", BlockingIOError(errno.EAGAIN, "empty")]

    def fake_read(fd, size):
        item = script.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    monkeypatch.setattr(kmsg_source.os, "read", fake_read)
    reader = kmsg_source.LiveKmsg("/dev/kmsg")
    reader.fd = 99  # never touched: reads are scripted
    items = list(reader.read_available())
    assert [type(i).__name__ for i in items] == ["KmsgRecord", "Lost", "KmsgRecord", "KmsgRecord"]
    assert items[1].count == 4 and items[2].text == "after the gap"
    assert script == [], "it read on past the overrun to the end"
