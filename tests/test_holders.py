"""oomwatch/holders.py: the breakdown, top holders, pools and verdict of each real capture must be what the
capture shows (fixtures/kmsg: the 6.12 pool/tmpfs/single scenarios, the 6.1 memcg scenarios, a dd in a runc
container, the global OOM and the 30x5 storm), and each threshold is checked at its edge."""

from __future__ import annotations

import pytest

from oomwatch.holders import (
    BREAKDOWN_KEYS,
    DOMINANT_SHARE,
    breakdown,
    human_bytes,
    pools,
    top_holders,
    verdict,
)
from oomwatch.model import OomMemcgUsage
from oomwatch.parse.memstat import MemoryStat, TaskRow, memory_reports, parse_memory_stat_block
from oomwatch.parse.oom import parse_oom_line
from tests.test_parse_memstat import CORPUS, KMSG, PAGE, kmsg_texts, killed_pids, text_log

MIB = 1 << 20


def analysed(name: str) -> list[dict]:
    """Each report of a capture, with its limit (the `memory: usage` line before it), as the agent would see
    it: breakdown, top holders, pools, verdict."""
    texts = kmsg_texts(name)
    limits = [u.limit_bytes for u in map(parse_oom_line, texts) if isinstance(u, OomMemcgUsage)]
    killed = killed_pids(texts)
    out = []
    for report in memory_reports(texts):
        limit = limits.pop(0) if report.cgroup else None
        parts = breakdown(report.stats or report.meminfo, PAGE)
        top = top_holders(report.tasks, PAGE, killed, limit)
        pooled = pools(report.tasks, PAGE, killed, limit)
        v, sentence = verdict(parts, top, pooled, limit)
        out.append({"report": report, "limit": limit, "breakdown": parts, "top": top, "pools": pooled,
                    "verdict": v, "sentence": sentence})
    return out


def test_6_12_pool_of_workers():
    pool = analysed("linux-6.12-holders.kmsg")[0]
    assert pool["report"].cgroup == "/pool" and pool["limit"] == 160 * MIB
    assert pool["verdict"] == "pool"
    assert pool["sentence"].startswith("8 × pt_data_worker held ")
    assert "of the 160 MiB limit" in pool["sentence"]
    (workers,) = pool["pools"]  # pool_leader is alone: not a pool
    rows = [t for t in pool["report"].tasks if t.name == "pt_data_worker"]
    assert workers["processes"] == 8 and workers["killed"] == 8  # memory.oom.group=1: all of them
    assert workers["rss_bytes"] == sum(t.rss_pages for t in rows) * PAGE
    assert workers["anon_bytes"] == sum(t.rss_anon_pages for t in rows) * PAGE
    assert workers["shmem_bytes"] == 0
    # top holders: the table's five largest rows by rss, largest first, with the kernel's split
    largest = sorted(pool["report"].tasks, key=lambda t: -t.rss_pages)[:5]
    assert [h["pid"] for h in pool["top"]] == [t.pid for t in largest] == [175, 173, 176, 179, 174]
    first = pool["top"][0]
    assert first == {"pid": 175, "comm": "pt_data_worker", "rss_pages": 7015, "rss_bytes": 7015 * PAGE,
                     "anon_bytes": 6430 * PAGE, "file_bytes": 585 * PAGE, "shmem_bytes": 0,
                     "limit_share": round(7015 * PAGE / (160 * MIB), 4), "killed": True}
    # the breakdown is the printed block: anon filled the limit
    assert pool["breakdown"]["anon_bytes"] == 166264832 and pool["breakdown"]["kernel_bytes"] == 1507328


def test_6_12_tmpfs_filler():
    shm = analysed("linux-6.12-holders.kmsg")[1]
    assert shm["verdict"] == "shmem"
    assert shm["breakdown"]["shmem_bytes"] == 96 * MIB
    assert shm["breakdown"]["file_bytes"] == 0  # the kernel's `file` is the tmpfs pages: not page cache
    assert "96 MiB of the 128 MiB limit" in shm["sentence"]
    assert "stay charged after a restart" in shm["sentence"]
    # the filler (dd) had exited: the only task is the app, killed, whose own rss is a quarter of the limit
    assert [(h["comm"], h["killed"]) for h in shm["top"]] == [("python", True)]


def test_6_12_single_process():
    single = analysed("linux-6.12-holders.kmsg")[2]
    assert single["verdict"] == "process"
    assert single["sentence"].startswith("python (pid 187) held 68 MiB of the 64 MiB limit")
    assert single["pools"] == []


def test_6_1_memcg_scenarios():
    scenarios = analysed("linux-6.1-memcg-scenarios.kmsg")
    got = [(a["report"].cgroup, a["verdict"], a["top"][0]["pid"]) for a in scenarios]
    assert got == [("/a", "process", 118), ("/b", "process", 125), ("/p", "process", 132),
                   ("/q", "process", 139)]


def test_6_1_dd_in_a_container_is_a_process():
    (dd,) = analysed("linux-6.1-runc-group-pidns.kmsg")
    assert dd["verdict"] == "process" and dd["top"][0]["comm"] == "dd" and dd["top"][0]["killed"]
    assert dd["top"][0]["anon_bytes"] is None  # 6.1 does not split rss


def test_6_1_storm():
    storm = analysed("linux-6.1-storm-ratelimited.kmsg")
    assert len(storm) == 100
    assert {a["verdict"] for a in storm} == {"process"}
    assert all(a["top"][0]["comm"] == "python3" and a["top"][0]["killed"] for a in storm)


def test_6_1_global_oom_from_node_counters():
    (glob,) = analysed("linux-6.1-global-oom-group.kmsg")
    parts = glob["breakdown"]
    assert parts["anon_bytes"] == (6 + 106728 - 5) * PAGE  # tmpfs pages sit on the anon LRU
    assert parts["shmem_bytes"] == 5 * PAGE and parts["file_bytes"] == (4 + 2) * PAGE
    assert parts["kernel_bytes"] == (2375 + 3335 + 266) * PAGE and parts["sock_bytes"] is None
    assert glob["verdict"] == "process" and glob["top"][0]["pid"] == 118
    assert glob["top"][0]["limit_share"] is None  # a global OOM has no limit


def test_v1_pasted_report():
    (v1,) = memory_reports(text_log(CORPUS / "k8s-56891-rhel7-3.10-dmesg-T.log"))
    parts = breakdown(v1.stats)
    assert parts["anon_bytes"] == 524188 * 1024
    assert parts["file_bytes"] is None and parts["shmem_bytes"] is None  # 3.10 prints no shmem: cache unsplit
    assert parts["kernel_bytes"] is None and parts["unevictable_bytes"] == 0
    v, _ = verdict(parts, top_holders(v1.tasks, PAGE, {28438}), pools(v1.tasks, PAGE), None)
    assert v == "process"


def test_breakdown_keys_and_nothing():
    assert breakdown(None) is None
    parts = breakdown(parse_memory_stat_block("anon 1"))
    assert tuple(parts) == BREAKDOWN_KEYS
    assert parts["anon_bytes"] == 1 and all(parts[k] is None for k in BREAKDOWN_KEYS[1:])


def test_breakdown_kernel_without_its_key():
    """Before 5.18 memory.stat has no `kernel` key: its parts as printed are summed."""
    parts = breakdown(parse_memory_stat_block("kernel_stack 10\npagetables 20\nslab_reclaimable 1\n"
                                              "slab_unreclaimable 2\npercpu 3"))
    assert parts["kernel_bytes"] == 36
    assert breakdown(parse_memory_stat_block("kernel_stack 10\nslab 5"))["kernel_bytes"] == 15


def test_breakdown_node_counters_need_the_page_size():
    (glob,) = memory_reports(kmsg_texts("linux-6.1-global-oom-group.kmsg"))
    assert all(v is None for v in breakdown(glob.meminfo).values())


def stat(**values: int) -> dict:
    return breakdown(MemoryStat(values, "v2", "bytes"))


LIMIT = 100 * MIB
BASE = dict(anon=0, file=0, shmem=0, kernel=0, sock=0, unevictable=0, file_dirty=0, file_writeback=0)


@pytest.mark.parametrize("key,expected", [
    ("shmem", "shmem"), ("unevictable", "unevictable"), ("kernel", "kernel"), ("sock", "sock"),
    ("file", "file"),
])
def test_each_kind_dominates_at_half_the_limit(key, expected):
    half = int(DOMINANT_SHARE * LIMIT)
    values = dict(BASE, **{key: half})
    if key == "shmem":
        values["file"] = half  # the kernel counts tmpfs in `file` too
    assert verdict(stat(**values), [], [], LIMIT)[0] == expected
    values[key] = half - 1
    if key == "shmem":
        values["file"] = half - 1
    assert verdict(stat(**values), [], [], LIMIT)[0] == "unknown"


def test_file_sentence_names_dirty_pages():
    v, sentence = verdict(stat(**dict(BASE, file=80 * MIB, file_dirty=30 * MIB, file_writeback=10 * MIB)),
                          [], [], LIMIT)
    assert v == "file" and "80 MiB of the 100 MiB limit (40 MiB dirty or under writeback)" in sentence


def row(pid: int, name: str, rss_pages: int) -> TaskRow:
    return TaskRow(pid, 0, pid, rss_pages, rss_pages, None, None, None, 0, None, 0, 0, name)


def test_process_before_pool_and_the_edges():
    page_limit = LIMIT // PAGE
    half = page_limit // 2
    one_big = [row(1, "java", half), row(2, "java", half // 4)]
    top, pooled = top_holders(one_big, PAGE, {1}, LIMIT), pools(one_big, PAGE, {1}, LIMIT)
    assert verdict(stat(**dict(BASE, anon=LIMIT)), top, pooled, LIMIT)[0] == "process"
    workers = [row(10 + i, "pt_data_worker", half // 4) for i in range(4)]
    top, pooled = top_holders(workers, PAGE, (), LIMIT), pools(workers, PAGE, (), LIMIT)
    v, sentence = verdict(stat(**dict(BASE, anon=LIMIT)), top, pooled, LIMIT)
    assert v == "pool" and sentence.startswith("4 × pt_data_worker held 50 MiB of the 100 MiB limit;")
    short = workers[:3]
    top, pooled = top_holders(short, PAGE), pools(short, PAGE)
    assert verdict(stat(**dict(BASE, anon=LIMIT)), top, pooled, LIMIT)[0] == "unknown"


def test_top_holders_bounded_and_ordered():
    rows = [row(100 + i, f"p{i}", 10 * (i % 4) + 1) for i in range(12)]
    top = top_holders(rows, PAGE)
    assert len(top) == 5
    assert [h["rss_bytes"] for h in top] == sorted((h["rss_bytes"] for h in top), reverse=True)
    assert [h["pid"] for h in top] == [103, 107, 111, 102, 106]  # ties: lower pid first
    assert all(h["limit_share"] is None and h["killed"] is False for h in top)
    assert top_holders([], PAGE) == [] and pools([], PAGE) == []


def test_unknown_when_nothing_was_printed():
    v, sentence = verdict(None, [], [], LIMIT)
    assert v == "unknown" and "not in the log" in sentence


def test_tmpfs_volume_named():
    _, sentence = verdict(stat(**dict(BASE, shmem=90 * MIB, file=90 * MIB)), [], [], LIMIT,
                          tmpfs_volumes=["cache (emptyDir)"])
    assert sentence.startswith("tmpfs or /dev/shm (cache (emptyDir)) held 90 MiB")


@pytest.mark.parametrize("n,text", [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (160 * MIB, "160 MiB"),
                                    (11_200 * MIB, "11 GiB"), (int(1.5 * (1 << 30)), "1.5 GiB")])
def test_human_bytes(n, text):
    assert human_bytes(n) == text


def test_6_12_locked_pages_are_unevictable():
    locked, _writer = analysed("linux-6.12-holders-locked-writer.kmsg")
    assert locked["report"].cgroup == "/locked" and locked["verdict"] == "unevictable"
    assert locked["breakdown"]["unevictable_bytes"] == 78581760  # the 64 MiB it locked, and what it mapped
    assert locked["sentence"].startswith("unevictable (locked or pinned) pages held 75 MiB of the 96 MiB limit")
    # the locker was also the largest task, and the kernel chose it: unevictable is checked first because
    # locked anonymous pages are counted in anon as well
    assert locked["top"][0]["pid"] == 173 and locked["top"][0]["killed"]


def test_6_12_writer_file_pages_reclaimed_before_the_kill():
    """dd rewriting a file on a RAM disk: its pages are written back and reclaimed as fast as they come, so
    at the kill page cache is 172 KiB and the app that filled anon is the verdict."""
    _locked, writer = analysed("linux-6.12-holders-locked-writer.kmsg")
    assert writer["breakdown"]["file_bytes"] == 176128 and writer["breakdown"]["file_dirty_bytes"] == 0
    assert writer["verdict"] == "process" and writer["top"][0]["comm"] == "python"
    assert [h["comm"] for h in writer["top"]] == ["python", "dd", "sh"]


@pytest.mark.parametrize("capture", ["linux-6.12-holders", "linux-6.12-holders-locked-writer"])
def test_breakdown_from_memory_stat_read_before_the_kill(capture):
    """The fallback the agent has when the block is lost: the cgroup's memory.stat file, read just before the
    kill. Its breakdown matches the kernel's printed one within 1% of the limit, part by part."""
    reads = (KMSG / f"{capture}.memory-stat.txt").read_text().split("== ")[1:]
    printed = {a["report"].cgroup: a for a in analysed(f"{capture}.kmsg")}
    for block in reads:
        title, _, body = block.partition("\n")
        cgroup = "/" + title.split()[0]
        from_file = breakdown(parse_memory_stat_block(body))
        at_kill = printed[cgroup]["breakdown"]
        for key in BREAKDOWN_KEYS:
            assert abs(from_file[key] - at_kill[key]) <= 0.01 * printed[cgroup]["limit"], (cgroup, key)
