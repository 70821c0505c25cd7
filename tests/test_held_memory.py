"""What held the memory, carried by every incident (issue 21): the live reader passes each report's memory part,
the correlator keeps it with its report, and the incident, its explanation and `inspect` say what held the
memory. Real captures only (fixtures/kmsg: Linux 6.12's pool/tmpfs/single scenarios, 6.1's storm, global OOM
and runc group kill; the corpus' pasted reports)."""

from __future__ import annotations

import socket

import pytest

from oomwatch.config import Config
from oomwatch.holders import BREAKDOWN_KEYS, breakdown, held_memory, page_size_of
from oomwatch.inspect import held_lines, read_incidents, render_text
from oomwatch.model import STAT_KEYS_USED, KmsgRecord, Skipped
from tests.conftest import make_correlator
from oomwatch.parse.kmsg import TextLogStats, parse_kmsg_record, parse_text_log, text_lines
from oomwatch.parse.memstat import memory_reports, parse_memory_stat_block, part_report
from oomwatch.sources.kmsg import LiveKmsg
from oomwatch.workloads import WorkloadResolver
from tests.conftest import FIXTURES, raw_records

KMSG = FIXTURES / "kmsg"
CAPTURES = sorted(KMSG.glob("*.kmsg"))
# every capture and pasted log with OOM reports: raw records (.kmsg) and text (dmesg, journal, syslog)
LOGS = CAPTURES + sorted(p for p in [*KMSG.iterdir(), *(FIXTURES / "corpus").iterdir()]
                         if p.suffix in (".dmesg", ".log", ".journal"))


def read_like_the_agent(raw: list[bytes]) -> list:
    """What the live reader hands on for these records (oomwatch/sources/kmsg.py: one read() a record, as from
    /dev/kmsg): records that may be OOM lines, counts of the others, and each full report's memory part as one
    Skipped item with its `part`."""
    kernel_end, reader_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    reader = LiveKmsg("test", prefilter=True)
    reader.fd = reader_end.fileno()
    reader_end.setblocking(False)
    items: list = []
    try:
        for at in range(0, len(raw), 64):  # a burst at a time, as printk fills the ring
            for record in raw[at:at + 64]:
                kernel_end.send(record)
            items += reader.read_available()
    finally:
        kernel_end.close()
        reader_end.close()
    return items


def incidents_of(items: list, correlator=None) -> list:
    correlator = correlator or make_correlator(boot_id="t", boot_time=0.0, resolver=WorkloadResolver(),
                                               posture_single=lambda: "false")
    out = []
    for item in items:
        if isinstance(item, KmsgRecord):
            out += correlator.feed(item)
        elif isinstance(item, Skipped):
            correlator.skipped(item.count, item.last_seq, getattr(item, "part", None))
    return out + correlator.flush()


def every_record(raw: list[bytes]) -> list[KmsgRecord]:
    return [parse_kmsg_record(r) for r in raw]


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.stem)
def test_the_reader_hands_on_every_report_s_memory_part(capture):
    raw = raw_records(capture)
    items = read_like_the_agent(raw)
    parts = [i.part for i in items if isinstance(i, Skipped) and i.part is not None]
    # each as the kernel's texts, still escaped, that part_report() reads as memory_reports() reads the records
    assert [part_report(p) for p in parts] == list(memory_reports(r.text for r in every_record(raw)))
    assert [part_report(p, STAT_KEYS_USED) for p in parts] == list(
        memory_reports((r.text for r in every_record(raw)), keys=STAT_KEYS_USED))
    assert sum(i.count for i in items if isinstance(i, Skipped)) + sum(
        isinstance(i, KmsgRecord) for i in items) == len(raw)  # every record is counted once


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.stem)
def test_incidents_are_the_same_from_the_live_reader_and_from_every_record(capture):
    raw = raw_records(capture)
    live = [i.to_json() for i in incidents_of(read_like_the_agent(raw))]
    whole = [i.to_json() for i in incidents_of(every_record(raw))]
    for incident in live + whole:
        incident.pop("detected_at"), incident.pop("latency_seconds")
    assert live == whole


def log_texts(path) -> list[str]:
    if path.suffix == ".kmsg":
        return [r.text for r in every_record(raw_records(path))]
    return [r.text for r in parse_text_log(text_lines([path.read_bytes()], TextLogStats()), year=2020)]


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_the_lean_form_says_the_same_as_the_full_form(log):
    """What the incident says of held memory (breakdown, top holders, pools, verdict and its sentence) is the
    same from the reader's lean form (keys=STAT_KEYS_USED) as from every key of the block."""
    texts = log_texts(log)
    full = list(memory_reports(texts))
    lean = list(memory_reports(texts, keys=STAT_KEYS_USED))
    assert len(lean) == len(full)
    for lean_report, full_report in zip(lean, full):
        # the task rows and node counters are kept whole
        assert lean_report._replace(stats=None) == full_report._replace(stats=None)
        assert (lean_report.stats is None) == (full_report.stats is None)
        if full_report.stats is not None:
            assert lean_report.stats.dialect == full_report.stats.dialect
            assert lean_report.stats.values == {k: v for k, v in full_report.stats.values.items()
                                                if k in STAT_KEYS_USED}
        tasks = full_report.tasks
        for limit in (None, 1 << 30):
            said = [held_memory(r, limit_bytes=limit, killed_pids=[t.pid for t in tasks[-1:]], page_size=4096,
                                oom_cgroup=r.cgroup) for r in (lean_report, full_report)]
            assert said[0] == said[1]


def by_cgroup(capture: str) -> dict:
    return {i.oom_cgroup: i for i in incidents_of(read_like_the_agent(raw_records(KMSG / capture)))}


def read_before_the_kill(capture: str) -> dict:
    """The scenario's own memory.stat reads, taken just before each kill (scripts/capture-holders)."""
    out = {}
    for block in (KMSG / capture).read_text().split("== ")[1:]:
        title, _, body = block.partition("\n")
        out["/" + title.split()[0]] = breakdown(parse_memory_stat_block(body))
    return out


def test_a_pool_of_eight_workers_is_named_and_summed():
    pool = [i for i in incidents_of(read_like_the_agent(raw_records(KMSG / "linux-6.12-holders.kmsg")))
            if i.oom_cgroup == "/pool"]
    first = pool[0]  # the group kill's incident carries the report
    assert first.verdict == "pool"
    assert first.memory_breakdown["source"] == "kmsg" and first.memory_breakdown["age_seconds"] == 0.0
    top = first.top_holders
    assert len(top) == 5 and [h["rss_bytes"] for h in top] == sorted((h["rss_bytes"] for h in top), reverse=True)
    assert all(h["comm"] == "pt_data_worker" and h["anon_bytes"] is not None for h in top)  # 6.12 splits rss
    assert first.pools[0]["comm"] == "pt_data_worker" and first.pools[0]["processes"] == 8
    assert first.pools[0]["killed"] == 8  # the group took them all
    assert "8 × pt_data_worker held" in first.explanation
    limit = first.memory["limit_bytes"]
    before = read_before_the_kill("linux-6.12-holders.memory-stat.txt")["/pool"]
    for key in BREAKDOWN_KEYS:  # the kernel's printed stats against memory.stat read just before: within 1%
        assert abs(first.memory_breakdown[key] - before[key]) <= 0.01 * limit, key


def test_tmpfs_that_filled_the_limit_says_a_restart_will_not_free_it():
    shm = by_cgroup("linux-6.12-holders.kmsg")["/shm"]
    assert shm.verdict == "shmem"
    assert shm.memory_breakdown["shmem_bytes"] >= 0.5 * shm.memory["limit_bytes"]
    assert "stay charged after a restart" in shm.explanation


def test_one_process_that_filled_the_limit():
    single = by_cgroup("linux-6.12-holders.kmsg")["/single"]
    assert single.verdict == "process" and single.top_holders[0]["killed"] is True
    assert single.top_holders[0]["pid"] == single.victim.pid


def test_locked_pages_and_a_writer():
    found = by_cgroup("linux-6.12-holders-locked-writer.kmsg")
    assert found["/locked"].verdict == "unevictable"
    writer = found["/writer"].memory_breakdown
    before = read_before_the_kill("linux-6.12-holders-locked-writer.memory-stat.txt")["/writer"]
    assert writer["source"] == "kmsg" and before["file_bytes"] is not None
    for key in BREAKDOWN_KEYS:
        assert abs(writer[key] - before[key]) <= 0.01 * found["/writer"].memory["limit_bytes"], key


def test_a_storm_s_ratelimited_reports_are_explained_from_their_own_kill_lines_never_another_report_s_stats():
    """Issue 33 item 1: the ratelimit hid most reports' headers in the storm capture, but every kill line is
    there: those incidents carry a process-level breakdown of their own killed processes (source "kill_lines",
    with what it cannot see), and their holders are those processes, marked so."""
    incidents = incidents_of(read_like_the_agent(raw_records(KMSG / "linux-6.1-storm-ratelimited.kmsg")))
    with_stats = [i for i in incidents if i.memory_breakdown["source"] == "kmsg"]
    from_kills = [i for i in incidents if i.memory_breakdown["source"] == "kill_lines"]
    assert with_stats and from_kills and len(with_stats) + len(from_kills) == len(incidents) == 150
    assert all(h["from"] == "task_table" for i in with_stats for h in i.top_holders)
    assert all(i.top_holders[0]["pid"] in {p.pid for p in i.killed} or not i.top_holders[0]["killed"]
               for i in with_stats)
    for i in from_kills:
        parts = i.memory_breakdown
        assert parts["anon_bytes"] == sum(p.anon_rss_bytes for p in i.killed)
        assert parts["file_bytes"] == sum(p.file_rss_bytes for p in i.killed)
        assert parts["shmem_bytes"] == sum(p.shmem_rss_bytes for p in i.killed)
        assert parts["kernel_bytes"] is None and "kernel memory" in parts["unseen"]
        assert {h["pid"] for h in i.top_holders} <= {p.pid for p in i.killed}
        assert all(h["killed"] and h["from"] == "kill_lines" for h in i.top_holders)
        # the hog (python3) held nearly all of what was killed, but the limit went with the report's header: of
        # what the killed processes held one always dominates, so no process is blamed; what they held is said
        assert i.top_holders[0]["comm"] == "python3" and i.verdict == "unknown"
        assert i.verdict_sentence.startswith("only the kill lines survived: the killed processes held ")
        assert i.verdict_sentence.endswith("; the limit, page cache they did not map and kernel memory are not in "
                                           "the log")
        assert i.verdict_sentence in i.explanation


def test_the_global_oom_uses_the_node_counters():
    (incident,) = incidents_of(read_like_the_agent(raw_records(KMSG / "linux-6.1-global-oom-group.kmsg")))
    assert incident.memory_breakdown["source"] == "meminfo"
    assert incident.top_holders[0]["comm"] == "python3" and incident.top_holders[0]["killed"]


def test_a_forged_task_row_inside_a_report_is_not_taken():
    """A process may write to /dev/kmsg (facility user): a row it plants in a report's table is not the kernel's,
    whether the live reader or a saved log brings it."""
    raw = raw_records(KMSG / "linux-6.12-holders.kmsg")
    at = next(n for n, r in enumerate(raw) if b";[  pid  ]" in r)
    seq = int(raw[at].split(b",")[1])
    forged = b"14,%d,1,-;[  99999]     0 99999  9999999  9999999  9999999 0 0 0 0 0 evil" % (seq + 1)
    renumbered = [b"%s,%d,%s" % (r.split(b",", 2)[0], int(r.split(b",", 2)[1]) + 1, r.split(b",", 2)[2])
                  for r in raw[at + 1:]]
    planted = raw[:at + 1] + [forged] + renumbered
    for items in (read_like_the_agent(planted), every_record(planted)):
        (pool, *_) = [i for i in incidents_of(items) if i.oom_cgroup == "/pool"]
        assert pool.top_holders and "evil" not in [h["comm"] for h in pool.top_holders]


def test_page_size_is_told_from_the_victim_s_row():
    texts = [parse_kmsg_record(r).text for r in raw_records(KMSG / "linux-6.12-holders.kmsg")]
    report = next(iter(memory_reports(texts)))
    victim = next(r for r in report.tasks if r.pid == 175)
    assert page_size_of(report.tasks, 175, victim.rss_pages * 4096) == 4096
    assert page_size_of(report.tasks, 175, victim.rss_pages * 3000) is None  # no page size: unknown
    assert page_size_of(report.tasks, 4242, 1 << 20) is None


def test_inspect_on_a_pasted_report_prints_what_held_the_memory(tmp_path):
    config = Config(kmsg=str(KMSG / "linux-6.12-holders.kmsg"), boot_time=0.0)
    incidents, health = read_incidents(config, WorkloadResolver(), "false")
    shm = next(i for i in incidents if i.oom_cgroup == "/shm")
    assert shm.verdict == "shmem" and shm.top_holders  # page size told from the victim's row (a saved log)
    report = {"incidents": [i.to_json() | {"since_boot_seconds": None} for i in incidents]}
    lines = "\n".join(render_text_incidents(report))
    assert "memory at the kill (the kernel's stats): anon" in lines and "8 × pt_data_worker" in lines


def test_inspect_says_which_evidence_it_drew_the_memory_from():
    config = Config(kmsg=str(KMSG / "linux-6.1-storm-ratelimited.kmsg"), boot_time=0.0)
    incidents, _ = read_incidents(config, WorkloadResolver(), "false")
    report = {"incidents": [i.to_json() for i in incidents]}
    lines = render_text_incidents(report)
    assert any(line.startswith("memory at the kill (the kill lines: the killed processes only): anon 24 MiB, file ")
               for line in lines)
    assert "memory at the kill (the kernel's stats): anon 24 MiB, kernel 204 KiB" in lines
    assert not any("not in the log" in line for line in lines)  # every kill line survived the ratelimit


def test_inspect_says_when_the_log_does_not_hold_it():
    incident = {"memory_breakdown": None, "top_holders": []}  # a kill counted from memory.events: no lines
    assert held_lines(incident) == ["what held the memory: not in the log (its report was ratelimited or lost)"]


def render_text_incidents(report: dict) -> list[str]:
    return [line for inc in report["incidents"] for line in held_lines(inc)]
