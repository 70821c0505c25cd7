"""oomwatch/parse/memstat.py on real kernel text: the 6.1 and 6.12 captures of fixtures/kmsg (raw /dev/kmsg
records) and the pasted reports of fixtures/corpus (dmesg text, cgroup v1 and v2), plus hostile input."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oomwatch.model import OomKilled, Skipped
from oomwatch.parse.kmsg import TextLogStats, parse_kmsg_record, parse_text_log, text_lines, unescape
from oomwatch.parse.memstat import (
    MemcgStatsHeader,
    MemoryStat,
    NodeMemInfo,
    OomMemoryReport,
    TaskRow,
    TaskTableHeader,
    first_report,
    is_meminfo_title,
    is_task_table_title,
    memory_reports,
    parse_memcg_stats_header,
    parse_meminfo_continuation,
    parse_memory_stat_block,
    parse_memory_stat_line,
    parse_node_meminfo,
    parse_task_row,
    parse_kernel_shaped_part,
    parse_task_table_header,
    part_report,
)
from oomwatch.parse.oom import parse_oom_line
from tests.conftest import raw_records

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
KMSG = FIXTURES / "kmsg"
CORPUS = FIXTURES / "corpus"
PAGE = 4096  # x86-64, where every capture was made


def kmsg_texts(name: str) -> list[str]:
    """The text of every record of a raw capture (continuation lines ` KEY=value` and `#EPIPE` skipped)."""
    out = []
    for raw in (KMSG / name).read_bytes().splitlines():
        if raw.startswith((b"#", b" ")) or b";" not in raw:
            continue
        out.append(parse_kmsg_record(raw).text)
    return out


def text_log(path: Path) -> list[str]:
    return [r.text for r in parse_text_log(text_lines([path.read_bytes()], TextLogStats()), year=2020)]


def memory_stat_reads(name: str) -> dict[str, dict[str, int]]:
    """The capture's `.memory-stat.txt`: each cgroup's memory.stat as read just before its kill."""
    out: dict[str, dict[str, int]] = {}
    for block in (KMSG / name).read_text().split("== ")[1:]:
        title, _, body = block.partition("\n")
        out[title.split()[0]] = {k: int(v) for k, v in (line.split() for line in body.splitlines() if line)}
    return out


def killed_pids(texts: list[str]) -> set[int]:
    return {line.pid for line in map(parse_oom_line, texts) if isinstance(line, OomKilled)}


# ---- the stats header -------------------------------------------------------------------------------------

def test_stats_header_v2():
    texts = kmsg_texts("linux-6.1-memcg-scenarios.kmsg")
    heads = [h for h in map(parse_memcg_stats_header, texts) if h is not None]
    assert heads == [MemcgStatsHeader(c, None) for c in ("/a", "/b", "/p", "/q")]


def test_stats_header_kubepods_path():
    head = next(h for h in map(parse_memcg_stats_header, kmsg_texts("linux-6.1-runc-group-pidns.kmsg")) if h)
    assert head.cgroup.startswith("/kubepods/burstable/pod0b0c6b3e-") and head.inline is None


def test_stats_header_v1_inline_kb():
    """3.10 (cgroup v1) prints the stats on the header's line, each value K(pages) with a KB suffix."""
    text = next(t for t in text_log(CORPUS / "k8s-56891-rhel7-3.10-dmesg-T.log") if "cgroup stats" in t)
    head = parse_memcg_stats_header(text)
    assert head is not None
    assert head.cgroup.endswith("/6895a3e13439535852d3184ac2aadd26d7363cc035f171545ec7d4ce74073b0b")
    assert head.inline.dialect == "v1" and head.inline.printed_unit == "kB"
    assert head.inline.values["rss"] == 524188 * 1024
    assert head.inline.values["cache"] == 32 * 1024
    assert head.inline.values["swap"] == 524356 * 1024
    assert "shmem" not in head.inline.values


@pytest.mark.parametrize("text", [
    "Memory cgroup stats for", "Memory cgroup stats for /a", "Memory cgroup stats for a:",
    "Memory cgroup stats for /a: cache:32KB rss:nope", "memory: usage 65536kB, limit 65536kB, failcnt 739",
    "Memory cgroup out of memory: Killed process 118 (python3)", "",
])
def test_stats_header_rejects(text):
    assert parse_memcg_stats_header(text) is None


# ---- the stats block --------------------------------------------------------------------------------------

def test_block_6_1_one_record():
    """6.1 prints the whole memory.stat as one record; /dev/kmsg escapes its newlines (\\x0a)."""
    texts = kmsg_texts("linux-6.1-memcg-scenarios.kmsg")
    i = texts.index("Memory cgroup stats for /a:")
    stat = parse_memory_stat_block(texts[i + 1])
    assert stat is not None and stat.dialect == "v2" and stat.printed_unit == "bytes"
    assert len(stat.values) == 51
    assert stat.values["anon"] == 66777088 and stat.values["file"] == 0 and stat.values["kernel"] == 331776
    assert stat.values["slab"] == 52888 and stat.values["thp_collapse_alloc"] == 0


def test_block_6_12_one_record_per_line():
    """6.12 prints one record per key (seq_buf_do_printk): each parses alone, and as a block."""
    texts = kmsg_texts("linux-6.12-holders.kmsg")
    i = texts.index("Memory cgroup stats for /shm:")
    assert parse_memory_stat_line(texts[i + 1]) == ("anon", 33107968)
    lines = []
    for t in texts[i + 1:]:
        if parse_memory_stat_line(t) is None:
            break
        lines.append(t)
    assert len(lines) == 65 and lines[-1] == "numa_hint_faults 0"
    stat = parse_memory_stat_block("\n".join(lines))
    assert stat.values["shmem"] == stat.values["file"] == 100663296


def test_block_6_12_matches_memory_stat_read_before_the_kill():
    """What the kernel printed at the kill is what memory.stat said tens of ms before (each part within 1% of
    the total); the tmpfs pages exactly."""
    texts = kmsg_texts("linux-6.12-holders.kmsg")
    reads = memory_stat_reads("linux-6.12-holders.memory-stat.txt")
    reports = {r.cgroup: r for r in memory_reports(texts)}
    assert set(reports) == {"/pool", "/shm", "/single"}
    for name, read in reads.items():
        printed = reports["/" + name].stats.values
        assert set(printed) == set(read)
        assert printed["shmem"] == read["shmem"], name
        total = printed["anon"] + printed["file"] + printed["kernel"]
        for key in ("anon", "file", "kernel", "unevictable", "sock"):
            assert abs(printed[key] - read[key]) <= 0.01 * total, (name, key)


def test_block_read_whole_as_line_by_line():
    """A block of the kernel's shape is read in one piece (every key kept, the same keys shared from one block
    to the next); one of another shape line by line: the values are the same either way, a repeated key keeps
    its last value, 0 or not."""
    texts = kmsg_texts("linux-6.1-storm-ratelimited.kmsg")
    blocks = [t for t in texts if t.startswith("anon ")][:3]
    for block in blocks + blocks[:1]:
        by_line = dict(parse_memory_stat_line(line) for line in block.split("\n"))
        assert parse_memory_stat_block(block).values == by_line
        assert parse_memory_stat_block(" " + block.replace("\n", " \n")).values == by_line  # line by line
    assert parse_memory_stat_block("anon 5\nfile 0\nanon 0").values == {"anon": 0, "file": 0}
    assert parse_memory_stat_block("anon 0\nfile 0\nanon 7").values == {"anon": 7, "file": 0}
    assert parse_memory_stat_block("anon 5\nfile 0").values == {"anon": 5, "file": 0}
    assert parse_memory_stat_block("anon 0\nfile 3").values == {"anon": 0, "file": 3}
    assert parse_memory_stat_block("anon 007\nfile 00").values == {"anon": 7, "file": 0}


def test_block_v1_bytes_and_v2_dialects():
    v1 = parse_memory_stat_block("cache 4096\nrss 8192\nshmem 0\ndirty 0\nunevictable 0")
    assert v1.dialect == "v1" and v1.printed_unit == "bytes" and v1.values["rss"] == 8192
    assert parse_memory_stat_block("anon 1\nfile 2").dialect == "v2"


@pytest.mark.parametrize("text", [
    "", "\n\n", "anon", "anon -1", "anon 1x", "Anon 1", "anon 1 2", "anon 1\nnot a stat line",
    "anon " + "9" * 21, "anon 18446744073709551616", "\n".join(f"k{i} 1" for i in range(300)),
    "Tasks state (memory values in pages):",
])
def test_block_rejects(text):
    assert parse_memory_stat_block(text) is None


# ---- the task table ---------------------------------------------------------------------------------------

HEADER_6_1 = "[  pid  ]   uid  tgid total_vm      rss pgtables_bytes swapents oom_score_adj name"
HEADER_6_12 = ("[  pid  ]   uid  tgid total_vm      rss rss_anon rss_file rss_shmem pgtables_bytes swapents "
               "oom_score_adj name")
HEADER_3_10 = "[ pid ]   uid  tgid total_vm      rss nr_ptes swapents oom_score_adj name"


def test_task_headers_from_the_captures():
    assert HEADER_6_1 in kmsg_texts("linux-6.1-memcg-scenarios.kmsg")
    assert HEADER_6_12 in kmsg_texts("linux-6.12-holders.kmsg")
    assert HEADER_3_10 in text_log(CORPUS / "k8s-56891-rhel7-3.10-dmesg-T.log")
    h61, h612, h310 = map(parse_task_table_header, (HEADER_6_1, HEADER_6_12, HEADER_3_10))
    assert not h61.splits_rss and h612.splits_rss and not h310.splits_rss
    assert h612.columns[3:7] == ("rss", "rss_anon", "rss_file", "rss_shmem")
    assert "nr_ptes" in h310.columns and "pgtables_bytes" not in h310.columns
    assert is_task_table_title("Tasks state (memory values in pages):")


def test_task_rows_6_1():
    h = parse_task_table_header(HEADER_6_1)
    row = parse_task_row("[    118]     0   118    54933    16454   200704        0             0 python3", h)
    assert row == TaskRow(118, 0, 118, 54933, 16454, None, None, None, 200704, None, 0, 0, "python3")


def test_task_rows_6_12_split_rss():
    h = parse_task_table_header(HEADER_6_12)
    texts = kmsg_texts("linux-6.12-holders.kmsg")
    rows = [r for r in (parse_task_row(t, h) for t in texts) if r is not None]
    assert len(rows) == 11  # 9 in the pool (leader and 8 workers), 1 in shm, 1 in single
    assert [r.name for r in rows].count("pt_data_worker") == 8
    for r in rows:  # the kernel's rss is the sum of its three counters
        assert r.rss_pages == r.rss_anon_pages + r.rss_file_pages + r.rss_shmem_pages
    by_pid = {r.pid: r for r in rows}
    assert by_pid[175] == TaskRow(175, 0, 175, 8963, 7015, 6430, 585, 0, 114688, None, 0, 0, "pt_data_worker")
    # the chosen victim's kill line, printed right after the table, gives the same counters in kB (the rest
    # of a group kill is printed later: those workers were still allocating)
    victims = [t for t in texts if t.startswith("oom-kill:")]
    for summary in victims:
        pid = int(re.search(r",pid=(\d+),", summary)[1])
        killed = next(k for k in map(parse_oom_line, texts) if isinstance(k, OomKilled) and k.pid == pid)
        assert killed.anon_rss_bytes == by_pid[pid].rss_anon_pages * PAGE
        assert killed.file_rss_bytes == by_pid[pid].rss_file_pages * PAGE
    assert len(victims) == 3


def test_task_row_shape_from_the_header_not_the_numbers():
    """A 6.12 row read by a 6.1 header has three numbers too many: its "name" is longer than any comm (15
    bytes), so it is not a row, not a guess."""
    row = "[    175]     0   175     8963     7015     6430      585         0   114688        0        0 w"
    assert parse_task_row(row, parse_task_table_header(HEADER_6_1)) is None
    assert parse_task_row(row, parse_task_table_header(HEADER_6_12)).rss_anon_pages == 6430


def test_task_rows_read_by_headers_that_alternate():
    """Each header's shape is kept once (a node prints the same header in every report): rows of two tables
    read in turn each get their own columns."""
    row_6_1 = "[    118]     0   118    54933    16454   200704        0             0 python3"
    row_6_12 = "[    175]     0   175     8963     7015     6430      585         0   114688        0        0 w"
    for _ in range(2):
        assert parse_task_row(row_6_1, parse_task_table_header(HEADER_6_1)).pgtables_bytes == 200704
        assert parse_task_row(row_6_12, parse_task_table_header(HEADER_6_12)).rss_file_pages == 585
        assert parse_task_row(row_6_1, parse_task_table_header(HEADER_3_10)).nr_ptes == 200704
    assert parse_task_row(row_6_1, TaskTableHeader(("uid", "tgid", "rss", "name"))) is None  # no swapents


def test_task_row_3_10_and_a_name_with_spaces():
    h = parse_task_table_header(HEADER_3_10)
    row = parse_task_row("[28438]     0 28438  5063909   119961    1661   136409          -998 java", h)
    assert row.nr_ptes == 1661 and row.pgtables_bytes is None and row.oom_score_adj == -998
    spaced = parse_task_row("[  900]  1000   900    10000     2000      12        0        0 tmux: server", h)
    assert spaced.name == "tmux: server"


@pytest.mark.parametrize("text", [
    "", "[    118]", "[    118]     0   118    54933    16454   200704        0             0",
    "[    118]     0   118    54933    -16454   200704        0             0 python3",
    "[    118]     0   118    54933    16454   200704        0          1001 python3",
    "[  pid  ]   uid  tgid total_vm      rss pgtables_bytes swapents oom_score_adj name",
    "118     0   118    54933    16454   200704        0             0 python3",
])
def test_task_row_rejects(text):
    assert parse_task_row(text, parse_task_table_header(HEADER_6_1)) is None


@pytest.mark.parametrize("text", [
    "", "[  pid  ]", "[  pid  ]   uid  tgid total_vm", "[  tid  ]   uid  tgid total_vm      rss name",
    "[  pid  ]   uid  tgid total_vm      rss bogus name", "[  pid  ]   uid uid rss name",
    "[    118]     0   118    54933    16454   200704        0             0 python3",
])
def test_task_header_rejects(text):
    assert parse_task_table_header(text) is None


# ---- node counters of a global OOM -------------------------------------------------------------------------

def test_meminfo_6_1_one_record():
    texts = kmsg_texts("linux-6.1-global-oom-group.kmsg")
    i = texts.index("Mem-Info:")
    assert is_meminfo_title(texts[i])
    info = parse_node_meminfo(texts[i + 1])
    assert info.pages["active_anon"] == 6 and info.pages["inactive_anon"] == 106728
    assert info.pages["shmem"] == 5 and info.pages["slab_unreclaimable"] == 3335
    assert len(info.pages) == 20


def test_meminfo_dmesg_continuation_lines():
    """`dmesg -T` prints the record's later lines indented, without a timestamp (fixtures/corpus)."""
    lines = (CORPUS / "docker-for-linux-1001-dmesg-T-meminfo-continuation.log").read_text().splitlines()
    first = next(line for line in lines if "active_anon:" in line)
    info = parse_node_meminfo(re.sub(r"^\[[^]]*\] ", "", first))
    assert info.pages == {"active_anon": 57988, "inactive_anon": 147, "isolated_anon": 0}
    rest = [parse_meminfo_continuation(line) for line in lines[lines.index(first) + 1:]]
    assert all(isinstance(r, NodeMemInfo) for r in rest)
    merged = {k: v for r in rest for k, v in r.pages.items()}
    assert merged["inactive_file"] == 1353156 and merged["shmem"] == 289 and merged["dirty"] == 120


@pytest.mark.parametrize("text", ["", "Mem-Info:", "inactive_anon:1", "active_anon:x",
                                  "active_anon:1 Node 0"])
def test_meminfo_rejects(text):
    assert parse_node_meminfo(text) is None


# ---- whole reports -----------------------------------------------------------------------------------------

def test_reports_6_12():
    reports = list(memory_reports(kmsg_texts("linux-6.12-holders.kmsg")))
    assert [(r.cgroup, len(r.tasks)) for r in reports] == [("/pool", 9), ("/shm", 1), ("/single", 1)]
    assert all(r.task_header.splits_rss and len(r.stats.values) == 65 for r in reports)


def test_reports_6_1_memcg_and_global():
    memcg = list(memory_reports(kmsg_texts("linux-6.1-memcg-scenarios.kmsg")))
    assert [(r.cgroup, [t.pid for t in r.tasks]) for r in memcg] == [
        ("/a", [118, 117]), ("/b", [122, 123, 125]), ("/p", [129, 132, 130]), ("/q", [136, 139, 137])]
    (glob,) = memory_reports(kmsg_texts("linux-6.1-global-oom-group.kmsg"))
    assert glob.cgroup is None and glob.stats is None and glob.meminfo.pages["inactive_anon"] == 106728
    assert [t.name for t in glob.tasks] == ["sh", "sh", "sleep", "python3"]


def test_reports_storm_each_block_has_its_table():
    """The storm's ratelimit drops whole headers (150 kills, 100 reports): each report printed is whole."""
    texts = kmsg_texts("linux-6.1-storm-ratelimited.kmsg")
    reports = list(memory_reports(texts))
    assert len(reports) == 100
    assert all(r.stats is not None and [t.name for t in r.tasks] == ["sleep", "python3"] for r in reports)
    assert all(r.cgroup.startswith("/storm/c") for r in reports)
    assert {r.tasks[1].pid for r in reports} <= killed_pids(texts)


def test_reports_pasted_v1_and_headerless_tables():
    (v1,) = memory_reports(text_log(CORPUS / "k8s-56891-rhel7-3.10-dmesg-T.log"))
    assert v1.stats.dialect == "v1" and [t.pid for t in v1.tasks] == [28438]
    (trimmed,) = memory_reports(text_log(CORPUS / "ert-7797-dmesg-time-format-iso.log"))
    assert trimmed.task_header is not None and trimmed.tasks == () and trimmed.stats is None


def test_reports_rows_are_bounded(monkeypatch):
    import oomwatch.parse.memstat as memstat

    monkeypatch.setattr(memstat, "MAX_TASK_ROWS", 3)
    rows = [f"[{pid:7d}]     0 {pid:5d}      623      142    49152        0      0 sleep" for pid in range(10)]
    (report,) = memory_reports(["Tasks state (memory values in pages):", HEADER_6_1, *rows])
    assert [t.pid for t in report.tasks] == [0, 1, 2]


def test_reports_none_in_a_log_without_them():
    assert list(memory_reports(text_log(CORPUS / "redis-2174-rhel6-syslog-no-ts.log"))) == []


# ---- the lean form (keys=: the live reader keeps only what the breakdown reads) ----------------------------

LEAN = frozenset(("anon", "file", "shmem", "cache"))


@pytest.mark.parametrize("text", [
    "anon 1\nfile 20\nshmem 0\nslab 7\nanon 5",  # the kernel's shape, a repeated key: its last value
    "file 3\nslab 4",  # one kept key
    "slab 4\npercpu 9",  # none kept: still a block
    " anon 1 \nfile 2",  # not the kernel's shape: read line by line
    "cache:32KB rss:524188KB shmem:0KB",  # v1 on one line, kB
    "cache 4096\nrss 8192",  # a v1 file, bytes
])
def test_a_lean_block_is_the_full_block_s_kept_keys(text):
    full, lean = parse_memory_stat_block(text), parse_memory_stat_block(text, LEAN)
    assert (lean.dialect, lean.printed_unit) == (full.dialect, full.printed_unit)
    assert lean.values == {k: v for k, v in full.values.items() if k in LEAN}


def test_a_lean_block_is_refused_where_the_full_one_is():
    assert parse_memory_stat_block("anon 1\nfile x", LEAN) is None
    assert parse_memory_stat_block("anon 99999999999999999999", LEAN) is None  # over a u64


def test_lean_reports_keep_a_block_with_none_of_the_keys():
    texts = ["Memory cgroup stats for /a:", "slab 4", "percpu 8", "Tasks state (memory values in pages):",
             HEADER_6_1, "[    118]     0   118    54933    16454   200704        0             0 python3"]
    (full,) = memory_reports(texts)
    (lean,) = memory_reports(texts, keys=LEAN)
    assert lean.stats == MemoryStat({}, "v2", "bytes") and full.stats.values == {"slab": 4, "percpu": 8}
    assert lean.tasks == full.tasks


def test_lean_reports_6_12_and_v1():
    (pool, *_) = memory_reports(kmsg_texts("linux-6.12-holders.kmsg"), keys=LEAN)
    assert set(pool.stats.values) == {"anon", "file", "shmem"}
    (v1,) = memory_reports(text_log(CORPUS / "k8s-56891-rhel7-3.10-dmesg-T.log"), keys=LEAN)
    assert v1.stats.dialect == "v1" and set(v1.stats.values) <= LEAN and "cache" in v1.stats.values


# ---- hostile input -----------------------------------------------------------------------------------------

PIECES = ["Memory cgroup stats for ", "/a", ":", " ", "\n", "anon ", "file ", "cache:", "KB", "kB", "[", "]",
          "  pid  ", "uid", " tgid", " rss", " rss_anon", " name", "active_anon:", "Mem-Info:", "-", "0", "1",
          "18446744073709551616", "9" * 30, "\x00", "\udcff", "Tasks state (memory values in pages):"]
hostile = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=8)), max_size=30).map("".join)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(hostile)
def test_parsers_never_raise(text):
    assert isinstance(parse_memcg_stats_header(text), (MemcgStatsHeader, type(None)))
    assert isinstance(parse_memory_stat_block(text), (MemoryStat, type(None)))
    assert isinstance(parse_memory_stat_line(text), (tuple, type(None)))
    header = parse_task_table_header(text)
    assert isinstance(header, (TaskTableHeader, type(None)))
    for h in (header, parse_task_table_header(HEADER_6_12)):
        if h is not None:
            row = parse_task_row(text, h)
            assert row is None or (row.pid >= 0 and len(row.name) <= len(text))
    assert isinstance(parse_node_meminfo(text), (NodeMemInfo, type(None)))
    assert isinstance(parse_meminfo_continuation(text), (NodeMemInfo, type(None)))
    stat = parse_memory_stat_block(text)
    assert stat is None or all(0 <= v < 1 << 74 for v in stat.values.values())
    lean = parse_memory_stat_block(text, LEAN)
    assert (lean is None) == (stat is None)
    assert lean is None or lean.values == {k: v for k, v in stat.values.items() if k in LEAN}


@FUZZ
@given(st.lists(hostile, max_size=20))
def test_reports_never_raise(texts):
    for report in memory_reports(texts):
        assert isinstance(report, OomMemoryReport)
    full, lean = list(memory_reports(texts)), list(memory_reports(texts, keys=LEAN))
    assert [r._replace(stats=None) for r in lean] == [r._replace(stats=None) for r in full]


# --- the live reader's form: part_report() -------------------------------------------------------------


def reader_parts() -> list[bytes]:
    """Each full report's memory part of every raw capture, as the live reader hands it on."""
    from tests.test_held_memory import read_like_the_agent

    parts = []
    for capture in sorted(KMSG.glob("*.kmsg")):
        parts += [i.part for i in read_like_the_agent(raw_records(capture))
                  if isinstance(i, Skipped) and i.part is not None]
    return parts


PARTS = reader_parts()
MEMCG_PARTS = sorted({p for p in PARTS if p.startswith(b"Memory cgroup stats for ")})


def read_slowly(part: bytes, keys=None):
    """What part_report() must equal: the report state machine on the unescaped texts."""
    return first_report(map(unescape, part.split(b"\n")), keys)


def test_the_kernel_s_own_parts_are_read_on_the_fast_path():
    assert len(PARTS) >= 100 and len(MEMCG_PARTS) >= 15  # 6.1 and 6.12 parts, the storm's among them
    assert any(b"\\x0a" in p for p in MEMCG_PARTS) and any(b"\\x0a" not in p for p in MEMCG_PARTS)
    for part in MEMCG_PARTS:
        for keys in (None, LEAN):
            fast = parse_kernel_shaped_part(part, keys)
            assert fast is not None and fast.stats is not None and fast.tasks
            assert fast == read_slowly(part, keys)
    for part in PARTS:  # a global OOM's node counters: not the fast path's shape, read the slow way
        assert part_report(part, LEAN) == read_slowly(part, LEAN)


# What a mutation inserts or writes over: the bytes and pieces the fast path's checks are about.
PIECES = (b"0", b"7", b"a", b"_", b" ", b"  ", b"\\x0a", b"\\x09", b"\\x5c", b"\\", b"\n", b"-", b"+", b"[", b"]",
          b":", b"/", b"\t", b"\x1f", b"\x7f", b"\x80", b"\xc3\xa9", b"rss 5\\x0a", b"cache 1\\x0a", b"anon 1\\x0a",
          b"shmem 3\\x0a", b"\\x0ashmem 3", b"12345678901234567890", b"99999999999999999999999", b"-1001", b"1000",
          b"-1000", b"12 ", b"1_0", b"000000000000000000000001", b"\nTasks state (memory values in pages):\n",
          b"\n[  pid  ]   uid  tgid total_vm      rss pgtables_bytes swapents oom_score_adj name",
          b"\n[    7]     0     7      100      50    4096        0             0 a b  ",
          b"\n[    8]     0     8      100      50    4096        0         -1000 12 x",
          b"\nMemory cgroup stats for /x:\n", b"\nMem-Info:\n")


@pytest.mark.parametrize("seed", range(6))
def test_part_report_equals_the_slow_read_of_mutated_parts(seed):
    """Where the fast path reads a part, it reads it as first_report() does; where it cannot, first_report()
    reads it: on every capture's parts with a few bytes inserted, written over or deleted anywhere, or a digit
    changed (a part of the kernel's shape with other values)."""
    rng = random.Random(seed)
    fast = 0
    for _ in range(300):
        part = bytearray(rng.choice(MEMCG_PARTS))
        for _ in range(rng.randint(1, 3)):
            piece, at = rng.choice(PIECES), rng.randrange(len(part) + 1)
            op = rng.randrange(4)
            if op == 3:
                digits = [i for i, c in enumerate(part) if 48 <= c <= 57]
                part[rng.choice(digits)] = rng.choice(b"0123456789")
            elif op == 0:
                part[at:at] = piece
            elif op == 1:
                part[at:at + len(piece)] = piece
            else:
                del part[at:at + rng.randint(1, 4)]
        mutated = bytes(part)
        for keys in (None, LEAN):
            assert part_report(mutated, keys) == read_slowly(mutated, keys), mutated
        fast += parse_kernel_shaped_part(mutated, LEAN) is not None
    assert fast >= 30  # (a changed digit leaves a part the fast path still reads, unless its shape changed too)


# --- issue 31 item 8: the name is the rest of the row; issue 33: old layouts, tables and blocks without headers

@pytest.mark.parametrize("name", ["1 hog", "2024 job", "-1 x", "9 9 9", "a  b"])
def test_a_comm_that_starts_with_digits_and_a_space_keeps_its_row(name):
    """A task row is read by its header's count of columns: a process that names itself `1 hog` is still the
    top holder, not dropped (before: the row was taken for another table's shape and the verdict blamed the
    next process)."""
    header = parse_task_table_header(HEADER_6_1)
    row = f"[    118]     0   118    54933    16454   200704        0             0 {name}"
    parsed = parse_task_row(row, header)
    assert parsed is not None and parsed.name == name and parsed.rss_pages == 16454
    report = first_report(["Tasks state (memory values in pages):", HEADER_6_1, row,
                           "[    117]     0   117      623      142    49152        0             0 sleep"])
    assert [r.name for r in report.tasks] == [name, "sleep"]
    part = "\n".join(["Memory cgroup stats for /a:", "anon 1\\x0afile 2", "Tasks state (memory values in pages):",
                      HEADER_6_1, row]).encode()
    assert parse_kernel_shaped_part(part).tasks[0].name == name, "the live reader's fast path reads it too"


# A 4.x table (nr_ptes and nr_pmds: from 4.0, which began counting pmd page tables, to 4.14; 4.15 prints
# pgtables_bytes instead), the layout of public reports of those kernels.
HEADER_4_X = "[ pid ]   uid  tgid total_vm      rss nr_ptes nr_pmds swapents oom_score_adj name"


def test_a_4x_table_with_nr_pmds_keeps_its_rows():
    header = parse_task_table_header(HEADER_4_X)
    assert header is not None and "nr_pmds" in header.columns
    row = parse_task_row("[ 2712]  1000  2712   996245   515434    1389       7        0             0 java", header)
    assert (row.name, row.rss_pages, row.nr_ptes, row.swapents_pages) == ("java", 515434, 1389, 0)


@pytest.mark.parametrize("row,columns,rss,name", [
    ("[    118]     0   118    54933    16454   200704        0             0 python3", 7, 16454, "python3"),
    ("[28438]     0 28438  5063909   119961    1661   136409          -998 java", 7, 119961, "java"),
    ("[ 2712]  1000  2712   996245   515434    1389       7        0             0 java", 8, 515434, "java"),
    ("[    175]     0   175     8963     7015     6430      585         0   114688        0        0 w", 10, 7015,
     "w"),
])
def test_a_task_table_pasted_without_its_header_is_read_by_the_kernels_layouts(row, columns, rss, name):
    report = first_report([row, row.replace("]", "1]", 1)])
    assert report is not None and len(report.task_header.columns) == columns + 1
    assert [(t.rss_pages, t.name) for t in report.tasks] == [(rss, name)] * 2
    if columns == 7:  # 3.10's nr_ptes or 4.15+'s pgtables_bytes: page-table bytes are whole pages
        assert ("pgtables_bytes" in report.task_header.columns) == row.startswith("[    118]")


def test_a_stats_block_pasted_without_its_header_is_read():
    report = first_report(["anon 66777088\nfile 4096\nkernel 331776\nshmem 0", "Tasks state (memory values in pages):",
                           HEADER_6_1, "[    118]     0   118    54933    16454   200704        0             0 python3"])
    assert report.cgroup is None and report.stats.values["file"] == 4096 and report.tasks[0].name == "python3"


def test_a_stats_header_joined_with_its_block_is_split():
    """A log that printed the `Memory cgroup stats for` line and its block as one multi-line record."""
    report = first_report(["Memory cgroup stats for /a:\nanon 1\nfile 2\nshmem 3"])
    assert report.cgroup == "/a" and report.stats.values == {"anon": 1, "file": 2, "shmem": 3}
