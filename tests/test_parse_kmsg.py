"""The /dev/kmsg record format and saved-log text formats."""

from __future__ import annotations

import datetime as dt
import io
import json
import time
from zoneinfo import ZoneInfo

import pytest

from oomwatch.parse.kmsg import (
    GARBLED,
    LOST_MARKER,
    MAX_LINE,
    KmsgParseError,
    TextLogStats,
    parse_kmsg_record,
    parse_text_log,
    unescape,
)
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


def texts(data: bytes, **kwargs) -> list:
    kwargs.setdefault("year", 2026)
    kwargs.setdefault("tz", UTC)
    return list(parse_text_log(io.BytesIO(data), **kwargs))


UTC = dt.timezone.utc
TEXT = "Memory cgroup out of memory: Killed process 4711 (python3) total-vm:1kB"
# 2023-08-22 16:10:45 UTC
WALL = 1692720645.0

# One line per wrapper, as each tool prints it: (format detected, line, usec, wall time). The text after the
# wrapper is always TEXT. Dates without a zone are read in UTC here (tz=UTC); the year of dates printed without
# one is 2023 (year=2023).
SAMPLES = [
    ("kmsg", f"6,1170,139201253,-;{TEXT}", 139201253, None),
    ("kmsg", f"6,1170,139201253,-,caller=T4711;{TEXT}", 139201253, None),
    ("dmesg", f"[  139.201253] {TEXT}", 139201253, None),
    ("dmesg", f"[  139.201253] [ T4711] {TEXT}", 139201253, None),  # CONFIG_PRINTK_CALLER
    ("dmesg", f"[  139.201253][    C1] {TEXT}", 139201253, None),
    ("dmesg -r", f"<6>[  139.201253] {TEXT}", 139201253, None),
    ("dmesg -x", f"kern  :info  : [  139.201253] {TEXT}", 139201253, None),
    ("dmesg -T", f"[Tue Aug 22 16:10:45 2023] {TEXT}", None, WALL),
    ("dmesg -T", f"[Tue Aug 22 16:10:45 2023] [ T4711] {TEXT}", None, WALL),
    ("dmesg iso", f"2023-08-22T16:10:45,201253+00:00 {TEXT}", None, WALL + 0.201253),
    ("journal short", f"Aug 22 16:10:45 gpu-node-7 kernel: {TEXT}", None, WALL),
    ("journal short", f"Aug 22 16:10:45  kernel: {TEXT}", None, WALL),  # empty hostname
    ("journal short", f"Aug 22 16:10:45 kernel: {TEXT}", None, WALL),  # --no-hostname
    ("journal short-precise", f"Aug 22 16:10:45.201253 gpu-node-7 kernel: {TEXT}", None, WALL + 0.201253),
    ("journal short-iso", f"2023-08-22T16:10:45+0000 gpu-node-7 kernel: {TEXT}", None, WALL),
    ("journal short-iso", f"2023-08-22T18:10:45+02:00 gpu-node-7 kernel: {TEXT}", None, WALL),
    ("journal short-iso-precise", f"2023-08-22T16:10:45.201253+0000 gpu-node-7 kernel: {TEXT}", None,
     WALL + 0.201253),
    ("journal short-full", f"Tue 2023-08-22 16:10:45 UTC gpu-node-7 kernel: {TEXT}", None, WALL),
    ("journal short-unix", f"1692720645.201253 gpu-node-7 kernel: {TEXT}", None, WALL + 0.201253),
    ("journal short-monotonic", f"[  139.201253] gpu-node-7 kernel: {TEXT}", 139201253, None),
    ("journal short-monotonic", f"[  139.201253]  kernel: {TEXT}", 139201253, None),
    ("journal short-monotonic", f"[  139.201253 <    0.000010>] gpu-node-7 kernel: {TEXT}", 139201253, None),
    ("journal json", '{"__REALTIME_TIMESTAMP":"1692720645201253","_SOURCE_MONOTONIC_TIMESTAMP":"139201253",'
                     '"PRIORITY":"3","_TRANSPORT":"kernel","SYSLOG_IDENTIFIER":"kernel","MESSAGE":"' + TEXT + '"}',
     139201253, WALL + 0.201253),
    ("journal json", '\x1e{"__REALTIME_TIMESTAMP":"1692720645201253","_TRANSPORT":"kernel","MESSAGE":"' + TEXT
     + '"}', None, WALL + 0.201253),  # -o json-seq
    ("syslog", f"Aug 22 16:10:45 gpu-node-7 kernel: [  139.201253] {TEXT}", 139201253, WALL),
    ("syslog", f"Aug 22 16:10:45 gpu-node-7 kernel: [  139.201253] [ T4711] {TEXT}", 139201253, WALL),
    ("syslog iso-precise", f"2023-08-22T16:10:45.201253+00:00 gpu-node-7 kernel: [  139.201253] {TEXT}",
     139201253, WALL + 0.201253),
    ("syslog rfc3164", f"<3>Aug 22 16:10:45 gpu-node-7 kernel: {TEXT}", None, WALL),
    ("syslog rfc3164", f"<3>Aug 22 16:10:45 gpu-node-7 kernel: [  139.201253] {TEXT}", 139201253, WALL),
    ("syslog rfc5424", f"<3>1 2023-08-22T16:10:45.201253Z gpu-node-7 kernel - - - {TEXT}", None, WALL + 0.201253),
    ("syslog rfc5424", f'<3>1 2023-08-22T16:10:45Z gpu-node-7 kernel - - [meta x="1"] [  139.201253] {TEXT}',
     139201253, WALL),
    ("bare", TEXT, None, None),  # journalctl -o cat, netconsole, a trimmed paste
]


@pytest.mark.parametrize("fmt,line,usec,wall", SAMPLES, ids=[f"{s[0]}:{s[1][:30]}" for s in SAMPLES])
@pytest.mark.parametrize("decoration", ["", "   ", "\t", "crlf", "> ", "> > "])
def test_each_wrapper_is_detected_and_read(fmt, line, usec, wall, decoration) -> None:
    """Each sample, also indented (a web page, a code block), quoted (a mail, a Markdown comment) and with CRLF
    line ends (a Windows paste)."""
    data = (decoration.replace("crlf", "") + line + ("\r\n" if decoration == "crlf" else "\n")).encode()
    stats = TextLogStats()
    (record,) = texts(data, year=2023, stats=stats)
    assert stats.formats == {fmt: 1}
    assert record.text == TEXT
    assert record.usec == usec
    assert record.wall_time == (pytest.approx(wall) if wall is not None else None)
    assert stats.garbled == 0 and stats.records == 1


def test_dmesg_levels_and_syslog_priorities() -> None:
    raw, decoded, rfc3164, rfc5424, plain = texts(
        b"<3>[    8.549782] a\nkern  :err   : [    9.1] b\n<4>Aug 22 16:10:45 h kernel: c\n"
        b"<2>1 2023-08-22T16:10:45Z h kernel - - - d\n[ 8548.134001] e\n")
    assert [r.priority for r in (raw, decoded, rfc3164, rfc5424, plain)] == [3, 3, 4, 2, 6]
    assert decoded.usec == 9100000


def test_local_time_is_this_machines_zone_or_the_given_one(monkeypatch) -> None:
    """`dmesg -T` and journalctl print local time: 16:10:45 in New York is 20:10:45Z."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        (local,) = list(parse_text_log(io.BytesIO(b"[Tue Aug 22 16:10:45 2023] x\n")))
        (short,) = list(parse_text_log(io.BytesIO(b"Aug 22 16:10:45 h kernel: x\n"), year=2023))
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert local.wall_time == short.wall_time == WALL + 4 * 3600
    (given,) = texts(b"[Tue Aug 22 16:10:45 2023] x\n", tz=ZoneInfo("Europe/Berlin"))
    assert given.wall_time == WALL - 2 * 3600
    (explicit,) = texts(b"2023-08-22T16:10:45+0000 h kernel: x\n", tz=ZoneInfo("Europe/Berlin"))
    assert explicit.wall_time == WALL, "a printed zone wins over --tz"


def test_a_date_without_a_year_is_guessed_and_said() -> None:
    now = dt.datetime(2024, 3, 1, 12, tzinfo=UTC).timestamp()
    stats = TextLogStats()
    dec, feb29 = texts(b"Dec 31 23:59:59 h kernel: a\nFeb 29 10:00:00 h kernel: b\n", year=None, now=now,
                       stats=stats)
    assert dec.wall_time == dt.datetime(2023, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp(), "not in the future"
    assert feb29.wall_time == dt.datetime(2024, 2, 29, 10, tzinfo=UTC).timestamp()
    assert stats.guessed_years == {2023, 2024}
    later = dt.datetime(2025, 6, 1, tzinfo=UTC).timestamp()
    (leap,) = texts(b"Feb 29 10:00:00 h kernel: b\n", year=None, now=later)
    assert leap.wall_time == dt.datetime(2024, 2, 29, 10, tzinfo=UTC).timestamp(), "the last year it existed"
    stats = TextLogStats()
    (unknown,) = texts(b"Feb 29 10:00:00 h kernel: b\n", year=2025, stats=stats)
    assert unknown.text == "b" and unknown.wall_time is None, "the year was given: no guessing"
    assert stats.unknown_dates == 1 and stats.first_unknown_date.startswith("Feb 29") and stats.garbled == 0


@pytest.mark.parametrize("line", [
    b"[Mon Feb 30 10:00:00 2023] x", b"[Mon Jan 01 25:61:00 2023] x", b"Foo 12 10:00:00 h kernel: x",
    b"2023-13-45T10:00:00+0000 h kernel: x", b"2023-01-01T10:00:00+9999 h kernel: x",
    b"<3>1 2023-02-30T10:00:00Z h kernel - - - x",
])
def test_a_date_that_cannot_be_read_leaves_the_record_in_with_an_unknown_time(line) -> None:
    stats = TextLogStats()
    (record,) = texts(line + b"\n", stats=stats)
    assert record.text == "x" and record.wall_time is None and record.usec is None
    assert stats.unknown_dates == 1 and stats.first_unknown_date == line.decode() and stats.garbled == 0


@pytest.mark.parametrize("line", [b'{"_TRANSPORT":"kernel","MESSAGE":1}', b"{not json", b"[" * 5000 + b"]" * 5000])
def test_broken_wrappers_are_counted_not_raised(line) -> None:
    stats = TextLogStats()
    records = texts(line + b"\n", stats=stats)
    assert stats.garbled + stats.bare == 1 and stats.lines == 1
    assert all(r.text for r in records)


def test_other_programs_and_journal_markers_are_skipped_and_counted() -> None:
    stats = TextLogStats()
    records = texts(
        b"-- Boot 4c1f3a527e0b4d2e9a8c1b6f0e2d3c4a --\n"
        b"Aug 22 16:10:45 node systemd[1]: Started foo.service.\n"
        b"Aug 22 16:10:45 node kubelet[812]: E0822 pod_workers.go:1298] Error syncing pod\n"
        b'{"_TRANSPORT":"syslog","SYSLOG_IDENTIFIER":"sshd","MESSAGE":"Accepted"}\n'
        b"<30>1 2023-08-22T16:10:45Z node systemd 1 - - Started\n"
        b"[  139.201253] node systemd[1]: Started foo.service.\n"
        b"[  139.201253] usb 1-1: new high-speed USB device\n"  # plain dmesg, not another program
        b"[    5.301105] systemd[1]: Started Journal Service.\n"  # systemd writing to /dev/kmsg: plain dmesg
        b"# dmesg\n"
        b"Aug 22 16:10:45 node kernel: a\n", stats=stats)
    assert [r.text for r in records] == ["usb 1-1: new high-speed USB device", "systemd[1]: Started Journal Service.",
                                         "a"]
    assert stats.other == 5 and stats.comments == 1 and stats.lines == 10


@pytest.mark.parametrize("notice", [b"No journal files were found.", b"-- No entries --"])
def test_journalctls_nothing_to_show_is_noted(notice) -> None:
    stats = TextLogStats()
    assert texts(notice + b"\n", stats=stats) == []
    assert stats.notice == notice.decode()


def test_journal_multiline_record_continuation_is_joined_into_its_record() -> None:
    stats = TextLogStats()
    records = texts(b"Aug 22 16:10:45 node kernel: anon 66777088\n"
                    b"                             file 0\n"
                    b"                              active_file:4\n"  # the kernel's own leading space: kept
                    b"Aug 22 16:10:45 node kernel: b\n", stats=stats)
    assert [r.text for r in records] == ["anon 66777088\nfile 0\n active_file:4", "b"]
    assert stats.continuation == 2 and stats.records == 2


def test_json_message_as_bytes_and_other_fields() -> None:
    line = json.dumps({"_TRANSPORT": "kernel", "MESSAGE": list(b"Killed process 1 (tr\xffin)"),
                       "__REALTIME_TIMESTAMP": "9" * 5000, "PRIORITY": "\u00b2"})  # a digit int() refuses
    (record,) = texts(line.encode() + b"\n")
    assert record.text == "Killed process 1 (tr\\xffin)"
    assert record.wall_time is None and record.priority == 6


def test_saved_raw_dump_with_epipe_marker_and_garbage() -> None:
    stats = TextLogStats()
    items = texts(b"6,1,10,-;first\n SUBSYSTEM=x\n#EPIPE\n6,9,20,-;after the gap\nrandom noise line\n",
                  stats=stats)
    assert [i.text for i in items] == ["first", "#EPIPE", "after the gap", "random noise line"]
    assert items[0].fields == (("SUBSYSTEM", "x"),)
    assert items[1].priority == LOST_MARKER
    assert stats.formats == {"kmsg": 2, "bare": 1}


def test_truncated_raw_record_in_a_dump_is_flagged_not_fatal() -> None:
    stats = TextLogStats()
    items = texts(b"6,1,10,-;ok\n6,2,99999999999999999999,-;" + b"x" * 10 + b"\n", stats=stats)
    assert items[0].text == "ok"
    assert items[1].priority == GARBLED and stats.garbled == 1


@pytest.mark.parametrize("raw", [b"6,18446744073709551616,1,-;x", b"6,1,18446744073709552,-;x",
                                 b"6," + b"9" * 5000 + b",1,-;x"])
def test_raw_numbers_beyond_the_kernels_u64_are_garbled(raw) -> None:
    with pytest.raises(KmsgParseError):
        parse_kmsg_record(raw)


def test_over_long_lines_are_cut_without_holding_them() -> None:
    stats = TextLogStats()
    huge = b"[    1.000000] " + b"(" * (3 * MAX_LINE) + b"\n[    2.000000] next\n"
    records = texts(huge, stats=stats)
    assert stats.truncated == 1
    assert len(records[0].text) < MAX_LINE and records[1].text == "next"
    assert len(next(parse_text_log(iter([b"x" * (2 * MAX_LINE)]))).text) == MAX_LINE


def test_live_reader_counts_an_overrun_from_the_sequence_gap_and_keeps_reading(monkeypatch) -> None:
    """/dev/kmsg returns EPIPE once when records were overwritten; the next read continues with the oldest
    record still there, and the sequence gap is the loss."""
    import errno

    from oomwatch.sources import kmsg as kmsg_source

    script = [b"6,10,1,-;before\n", BrokenPipeError(errno.EPIPE, "overrun"), b"6,15,2,-;after the gap\n",
              b"6,16,3,-;next\n", BlockingIOError(errno.EAGAIN, "empty"),
              BlockingIOError(errno.EAGAIN, "still empty")]  # (the second read confirms the end: caught_up_at)

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


# --- issue 20, items 5 and 6 ----------------------------------------------------------------------------------

def test_kernel_lines_with_colons_and_brackets_are_not_other_programs() -> None:
    """`[0.142496] x86/fpu: xstate_offset[2]: 576` read as host `x86/fpu:` and program `xstate_offset`."""
    stats = TextLogStats()
    records = list(parse_text_log([b"[    0.142496] x86/fpu: xstate_offset[2]:  576, xstate_sizes[2]:  256\n",
                                   b"[    1.000000] node-1 kubelet[811]: started\n"], stats=stats))
    assert [r.text for r in records] == ["x86/fpu: xstate_offset[2]:  576, xstate_sizes[2]:  256"]
    assert stats.other == 1


@pytest.mark.parametrize("line,wall", [
    ("[dim. 19 avril 18:03:30 2026] text", dt.datetime(2026, 4, 19, 18, 3, 30)),
    ("[So Apr 19 18:03:30 2026] text", dt.datetime(2026, 4, 19, 18, 3, 30)),
    ("[dom 19 abr 18:03:30 2026] text", dt.datetime(2026, 4, 19, 18, 3, 30)),
    ("[mar. déc.  1 08:00:00 2026] text", dt.datetime(2026, 12, 1, 8, 0, 0)),
    ("[xyz 19 qqq 18:03:30 2026] text", None),  # a month not known: read, time unknown
])
def test_dmesg_T_in_other_languages_is_read(line: str, wall) -> None:
    stats = TextLogStats()
    records = list(parse_text_log([line.encode()], tz=dt.timezone.utc, stats=stats))
    assert [r.text for r in records] == ["text"] and stats.formats == {"dmesg -T": 1} and stats.garbled == 0
    expected = None if wall is None else wall.replace(tzinfo=dt.timezone.utc).timestamp()
    assert records[0].wall_time == expected


def test_journalctl_verbose_entries_are_records() -> None:
    text = (b"Sun 2026-04-19 20:03:30.441000 CEST [s=5a1b;i=1f30;b=8e2c;m=1afd7ba30;t=64fd3ffe95b28;x=8c1d]\n"
            b"    _TRANSPORT=kernel\n    PRIORITY=3\n    SYSLOG_IDENTIFIER=kernel\n"
            b"    _SOURCE_MONOTONIC_TIMESTAMP=7245118000\n    MESSAGE=Memory cgroup out of memory: Killed process\n"
            b"    _HOSTNAME=node\n"
            b"Sun 2026-04-19 20:03:30.441009 CEST [s=5a1b;i=1f31;b=8e2c;m=1afd7ba39;t=64fd3ffe95b31;x=8c1e]\n"
            b"    _TRANSPORT=stdout\n    SYSLOG_IDENTIFIER=kubelet\n    MESSAGE=I0419 sync\n")
    stats = TextLogStats()
    records = list(parse_text_log(io.BytesIO(text), stats=stats))
    assert [(r.priority, r.usec, r.text, r.wall_time) for r in records] == [
        (3, 7245118000, "Memory cgroup out of memory: Killed process", 0x64fd3ffe95b28 / 1e6)]
    assert stats.formats == {"journal verbose": 1} and stats.other == 1


@pytest.mark.parametrize("prefix", ["1234:", "kern.log:", "/var/log/kern.log.1:88:", "/var/log/kern.log.1:88-",
                                    "dmesg.txt:7:"])
def test_grep_file_and_line_prefixes_are_dropped(prefix: str) -> None:
    """`grep -n oom /var/log/kern.log*` pastes: the OOM line was bare text starting with `1234:`."""
    for line in ("[  900.000070] Killed process 5125 (python3) total-vm:219732kB",
                 "May 15 23:09:30 node kernel: [  518.050606] Out of memory: Killed process 15784 (python3)",
                 "2026-11-20T10:15:01+0000 node-7 kernel: Killed process 9120 (java)"):
        stats = TextLogStats()
        records = list(parse_text_log([(prefix + line).encode()], tz=dt.timezone.utc, stats=stats))
        assert [r.text.partition("Killed")[1] for r in records] == ["Killed"] and "bare" not in stats.formats
    # Lines that merely start with digits and a colon or dash are left alone.
    for line in ("2026-11-20T10:15:01+0000 node-7 kernel: x", "6,339,5140559,-;x", "12:30 lunch"):
        stats = TextLogStats()
        assert [r.text for r in parse_text_log([line.encode()], stats=stats)][0].endswith(("x", "lunch"))
