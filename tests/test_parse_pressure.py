"""memory.stat and PSI parsers on real text: this development machine's /proc/pressure/* and its cgroup v2
root's memory.pressure (fixtures/cgroup-text/, copied as read), and memory.stat in the key order of Linux 6.1.
Values the kernel never prints are unknown, never an exception."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomwatch.parse.pressure import (
    Pressure,
    PressureLine,
    parse_memory_stat_field,
    parse_pressure,
    parse_pressure_line,
    working_set_bytes,
)

TEXT = Path(__file__).resolve().parents[1] / "fixtures" / "cgroup-text"


def test_real_psi_files() -> None:
    cpu = parse_pressure((TEXT / "proc-pressure-cpu.txt").read_text())
    assert cpu.some == PressureLine(avg10=95.58, avg60=54.56, avg300=35.74, total_usec=2392050060)
    assert cpu.full == PressureLine(0.0, 0.0, 0.0, 0)
    io = parse_pressure((TEXT / "proc-pressure-io.txt").read_text())
    assert io.total_seconds("some") == pytest.approx(40.6984)
    assert io.total_seconds("full") == pytest.approx(15.363929)
    for name in ("proc-pressure-memory.txt", "unified-root-memory.pressure"):
        memory = parse_pressure((TEXT / name).read_text())
        assert memory.some == memory.full == PressureLine(0.0, 0.0, 0.0, 0)


@pytest.mark.parametrize("line, expected", [
    ("avg10=101.00 avg60=0.00 avg300=0.00 total=5", PressureLine(None, 0.0, 0.0, 5)),
    ("avg10=-1.00 avg60=nan avg300=1e3 total=-5", None),
    ("avg10=1.00 avg60=2.00 avg300=3.00 total=" + "9" * 400, PressureLine(1.0, 2.0, 3.0, None)),
    ("avg10=1.5 total=18446744073709551615", PressureLine(avg10=1.5, total_usec=18446744073709551615)),
    ("garbage", None),
    ("", None),
    ("avg10=0.00 avg60=0.00 avg300=0.00 total=7 future=3", PressureLine(0.0, 0.0, 0.0, 7)),
])
def test_pressure_line_out_of_range_is_unknown(line: str, expected) -> None:
    assert parse_pressure_line(line) == expected


def test_pressure_file_missing_or_hostile_lines() -> None:
    assert parse_pressure("") == Pressure()
    only_some = parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=12\n")
    assert only_some.full is None and only_some.total_seconds("full") is None
    assert only_some.total_seconds("some") == pytest.approx(12e-6)
    # A second `some` line (not the kernel's) does not replace the first.
    twice = parse_pressure("some total=1\nsome total=2\nfull total=x\n")
    assert twice.total_seconds("some") == pytest.approx(1e-6) and twice.full is None
    for hostile in ("\x00" * 50, "some\nfull\n", "some avg10=" + "1" * 5000):
        parse_pressure(hostile)  # never raises


def test_memory_stat_field_and_working_set() -> None:
    stat = (TEXT / "linux-6.1-memory.stat").read_text()
    assert parse_memory_stat_field(stat, "inactive_file") == 16384000
    assert parse_memory_stat_field(stat, "anon") == 52035584
    assert parse_memory_stat_field(stat, "file") == 20480000  # not `file_mapped`, `inactive_file`, …
    assert parse_memory_stat_field(stat, "thp_collapse_alloc") == 0  # last line, no newline needed
    assert parse_memory_stat_field(stat, "missing") is None
    assert parse_memory_stat_field("inactive_file -1\n", "inactive_file") is None
    assert parse_memory_stat_field("inactive_file " + "9" * 400, "inactive_file") is None
    # The kubelet's arithmetic: usage less inactive file pages, never below zero; unknown stays unknown.
    assert working_set_bytes(80_000_000, 16384000) == 63_616_000
    assert working_set_bytes(1000, 16384000) == 0
    assert working_set_bytes(None, 5) is None and working_set_bytes(5, None) is None


PSI_PIECES = ["some ", "full ", "avg10=", "avg60=", "avg300=", "total=", ".", " ", "\n", "=", "-", "100.01",
              "99.99", "0.00", "18446744073709551616", "9" * 30, "nan", "inf", "\x00", "inactive_file ", "anon "]
psi_text = st.lists(st.one_of(st.sampled_from(PSI_PIECES), st.text(max_size=6),
                              st.integers(min_value=-(10 ** 25), max_value=10 ** 25).map(str)),
                    max_size=40).map("".join)


@settings(max_examples=300, deadline=None)
@given(psi_text)
def test_never_raises_and_values_stay_in_range(text: str) -> None:
    p = parse_pressure(text)
    for line in (p.some, p.full):
        if line is not None:
            for avg in (line.avg10, line.avg60, line.avg300):
                assert avg is None or 0.0 <= avg <= 100.0
            assert line.total_usec is None or 0 <= line.total_usec < 2 ** 64
    value = parse_memory_stat_field(text, "inactive_file")
    assert value is None or 0 <= value < 2 ** 64
