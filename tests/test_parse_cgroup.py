"""cgroup v2 value parsers on the real text of a 6.1 kernel (the memory.events captured beside the kernel
logs in fixtures/kmsg/) and on values the kernel never prints, which are unknown, never numbers and never
an exception (issue 11: a 400-digit memory.max once crashed the agent)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from oomwatch.parse.cgroup import (
    U64_MAX,
    parse_flat_keyed,
    parse_flat_keyed_counted,
    parse_int,
    parse_limit,
    parse_oom_group,
    parse_pids,
    parse_u64,
)
from oomwatch.sources.cgroupfs import CgroupFS
from tests.conftest import CAPTURES

HOSTILE = ["9" * 400, "-1", "-0", "18446744073709551616", "1e9", "0x10", "12 34", "abc", "", "²", "١٢",
           "+5", "nan", "inf", "\x00", "1" * 5000]


def real_memory_events() -> list[str]:
    """Every memory.events file text captured on Linux 6.1 (sections start with `== <cgroup>`)."""
    texts = []
    for capture in sorted(CAPTURES.glob("*.memory-events.txt")):
        for section in capture.read_text().split("== ")[1:]:
            texts.append(section.split("\n", 1)[1])
    return texts


def test_real_memory_events_parse_whole() -> None:
    texts = real_memory_events()
    assert len(texts) >= 30
    for text in texts:
        values, malformed = parse_flat_keyed_counted(text)
        assert malformed == 0, text
        assert list(values) == ["low", "high", "max", "oom", "oom_kill", "oom_group_kill"]
        assert values == parse_flat_keyed(text)
    # One real value, to be sure numbers come through: the storm's first container.
    storm = (CAPTURES / "linux-6.1-storm-ratelimited.memory-events.txt").read_text()
    first = storm.split("== ")[1].split("\n", 1)[1]
    assert parse_flat_keyed(first) == {"low": 0, "high": 0, "max": 118, "oom": 5, "oom_kill": 15,
                                       "oom_group_kill": 5}


def test_one_value_files_as_the_kernel_prints_them() -> None:
    assert parse_limit("max\n") == math.inf
    assert parse_limit("67108864\n") == 67108864.0
    assert parse_limit("9223372036854771712\n") == 9223372036854771712.0  # PAGE_COUNTER_MAX pages, 4 KiB
    assert parse_int("0\n") == 0 and parse_int("1048576\n") == 1048576
    assert parse_u64(str(U64_MAX)) == U64_MAX
    assert parse_oom_group("1\n") == 1 and parse_oom_group("0\n") == 0
    assert parse_pids("12\n13\n\n") == (12, 13)


@pytest.mark.parametrize("text", HOSTILE, ids=[repr(t[:12]) for t in HOSTILE])
def test_values_the_kernel_never_prints_are_unknown(text: str) -> None:
    assert parse_u64(text) is None
    assert parse_int(text) is None
    assert parse_limit(text) is None  # -1 in particular is not a limit
    assert parse_oom_group(text) is None
    values, malformed = parse_flat_keyed_counted(f"max 3\noom {text}\noom_kill 1\n")
    assert values == {"max": 3, "oom_kill": 1} and malformed == 1
    assert {12, 13} <= set(parse_pids(f"12\n{text}\n13\n"))  # never raises


def test_oom_group_is_zero_or_one() -> None:
    assert parse_oom_group("2\n") is None and parse_oom_group("01") is None


def test_new_kernel_keys_are_kept_and_blank_lines_are_not_errors() -> None:
    values, malformed = parse_flat_keyed_counted("max 1\nsock_throttled 4\n\n")
    assert values == {"max": 1, "sock_throttled": 4} and malformed == 0


def test_reader_counts_each_malformed_value_and_keeps_the_rest(tmp_path: Path) -> None:
    cg = tmp_path / "a"
    cg.mkdir()
    (cg / "memory.max").write_text("9" * 400 + "\n")
    (cg / "memory.current").write_text("-1\n")
    (cg / "memory.peak").write_text("garbage\n")
    (cg / "memory.oom.group").write_text("1\n")
    (cg / "memory.events").write_text("max 5\noom -3\noom_kill " + "7" * 30 + "\n")
    fs = CgroupFS(str(tmp_path))
    stats = fs.read_stats("/a")
    assert (stats.limit_bytes, stats.usage_bytes, stats.peak_bytes, stats.oom_group) == (None, None, None, 1)
    assert stats.events == {"max": 5}
    assert fs.parse_errors == 3 + 2  # three one-value files, two memory.events lines
    events, _ = fs.read_events("/a")
    assert events == {"max": 5} and fs.parse_errors == 7
