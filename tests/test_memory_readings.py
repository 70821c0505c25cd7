"""memory.stat readings as the breakdown of kills whose report lost its stats block (issue 21 item 1): the cgroup
source reads memory.stat when a cgroup is at its limit, at a bounded rate; the pipeline shows a reading only when
a read of the kernel log that ended after it (less the reader's lag) did not hold the kill; replayed with the
real kernel's ratelimited storm (fixtures/kmsg/linux-6.1-storm-ratelimited.kmsg)."""

from __future__ import annotations

import re
from pathlib import Path

from oomwatch.correlator import MAX_READING_AGE
from oomwatch.events import CgroupAdded, CgroupChanged, KernelLog, MemoryStatRead, Tick
from oomwatch.holders import breakdown
from oomwatch.memreadings import READER_LAG
from oomwatch.parse.kmsg import parse_kmsg_record
from oomwatch.parse.memstat import parse_memory_stat_block
from oomwatch.sources.cgroupfs import CgroupFS
from oomwatch.sources.cgroupsource import STAT_READ_INTERVAL, STAT_READS_PER_SECOND, CgroupSource
from oomwatch.workloads import WorkloadResolver
from tests.conftest import CAPTURES, FIXTURES, raw_records
from tests.replay import Replay, live_reads

STAT_TEXT = (FIXTURES / "cgroup-text" / "linux-6.1-memory.stat").read_text()
STAT = parse_memory_stat_block(STAT_TEXT)
CG = "/kubepods/burstable/podabc/c1"


class Clocks:
    def __init__(self) -> None:
        self.mono, self.wall = 50.0, 1000.0

    def tick(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


def events_file(tree: Path, **counts: int) -> None:
    text = "".join(f"{k} {counts.get(k, 0)}\n" for k in ("low", "high", "max", "oom", "oom_kill", "oom_group_kill"))
    for name in ("memory.events", "memory.events.local"):
        (tree / CG.lstrip("/") / name).write_text(text)


def started_source(tree: Path, got: list, clocks: Clocks) -> CgroupSource:
    source = CgroupSource(CgroupFS(str(tree)), WorkloadResolver(), got.append, clock=lambda: clocks.mono,
                          wall_clock=lambda: clocks.wall)
    source.start()
    return source


def test_the_source_reads_memory_stat_at_the_limit_at_a_bounded_rate(tmp_path: Path) -> None:
    tree = tmp_path / "cgroup"
    leaf = tree / CG.lstrip("/")
    leaf.mkdir(parents=True)
    (leaf / "memory.max").write_text(f"{24 << 20}\n")
    (leaf / "memory.stat").write_text(STAT_TEXT)
    events_file(tree)
    got: list = []
    clocks = Clocks()
    source = started_source(tree, got, clocks)
    try:
        def reads(**counts: int) -> list[MemoryStatRead]:
            events_file(tree, **counts)
            got.clear()
            source.watcher.on_events(CG)
            return [e for e in got if isinstance(e, MemoryStatRead)]

        (first,) = reads(max=1)  # at its limit: read, stamped with the wall clock
        assert first.path == CG and first.taken == clocks.wall and breakdown(first.stat) == breakdown(STAT)
        clocks.tick(STAT_READ_INTERVAL / 2)
        assert reads(max=2) == []  # at its limit again within the interval: not read again
        assert reads(max=2, high=7) == []  # memory.high alone never reads
        clocks.tick(STAT_READ_INTERVAL)
        assert reads(max=3, high=7, oom=1) == []  # an OOM invocation: the kill is as good as done, no use
        assert reads(max=4, high=7, oom=1, oom_kill=1) == []  # a kill: the same
        assert len(reads(max=5, high=7, oom=1, oom_kill=1)) == 1  # at its limit again: the interval has passed
        clocks.tick(STAT_READ_INTERVAL)
        assert reads(max=5, high=90, oom=1, oom_kill=1) == []  # living at memory.high: nothing read
        (leaf / "memory.stat").unlink()  # going away: a vanished file is no reading
        assert reads(max=6, high=90, oom=1, oom_kill=1) == []
    finally:
        source.watcher.close()


# --- the ordering rule in the pipeline ------------------------------------------------------------------------

def summary(seq: int, usec: int, pid: int) -> bytes:
    return (f"6,{seq},{usec},-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
            f"oom_memcg={CG},task_memcg={CG},task=hog,pid={pid},uid=0\n").encode()


def killed(seq: int, usec: int, pid: int) -> bytes:
    return (f"3,{seq},{usec},-;Memory cgroup out of memory: Killed process {pid} (hog) total-vm:90000kB, "
            f"anon-rss:24000kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:100kB oom_score_adj:0\n").encode()


def kill_records(seq: int, at: float, pid: int) -> list:
    """A report whose header and stats block the ratelimit hid: its summary and kill line (kernel time `at`: the
    replay's boot time is 0, so it is also the kill's epoch time)."""
    usec = int(at * 1e6)
    return [parse_kmsg_record(summary(seq, usec, pid)), parse_kmsg_record(killed(seq + 1, usec + 50, pid))]


def pipeline_with_cgroup() -> Replay:
    replay = Replay(now=10.0)
    replay.step(CgroupAdded(CG, 7, {"max": 0, "oom": 0, "oom_kill": 0}, 0, True, ()))
    return replay


def stat_with_anon(anon: int):
    return STAT._replace(values={**STAT.values, "anon": anon})


def test_the_node_reads_at_most_its_budget_of_memory_stat_a_second(tmp_path: Path) -> None:
    """A storm puts many cgroups at their limit at once: memory.stat is read for the first
    STAT_READS_PER_SECOND of them in a second, and again once the next second begins."""
    tree = tmp_path / "cgroup"
    paths = [f"/kubepods/burstable/pod{i}/c" for i in range(STAT_READS_PER_SECOND + 10)]
    for path in paths:
        (tree / path.lstrip("/")).mkdir(parents=True)
        (tree / path.lstrip("/") / "memory.stat").write_text(STAT_TEXT)
    got: list = []
    clocks = Clocks()
    source = started_source(tree, got, clocks)
    try:
        def at_limit(max_events: int) -> list[str]:
            got.clear()
            for path in paths:
                for name in ("memory.events", "memory.events.local"):
                    (tree / path.lstrip("/") / name).write_text(f"low 0\nhigh 0\nmax {max_events}\noom 0\n"
                                                                 "oom_kill 0\noom_group_kill 0\n")
                source.watcher.on_events(path)
            return [e.path for e in got if isinstance(e, MemoryStatRead)]

        assert at_limit(1) == paths[:STAT_READS_PER_SECOND]
        clocks.tick(0.5)
        assert at_limit(2) == []  # the node's second is spent
        clocks.tick(0.6)
        assert len(at_limit(3)) == STAT_READS_PER_SECOND  # a new second: a new budget
    finally:
        source.watcher.close()

def test_a_reading_confirmed_before_the_kill_s_batch_is_its_breakdown_with_its_age() -> None:
    replay = pipeline_with_cgroup()
    tmpfs = STAT._replace(values={**STAT.values, "file": 400 << 20, "shmem": 380 << 20})
    replay.step(MemoryStatRead(CG, 100.0, tmpfs), now=100.0)
    replay.step(KernelLog([], drained_at=100.0 + READER_LAG), now=101.0)  # read to its end: no kill in it
    replay.step(KernelLog(kill_records(10, 103.25, 4242), drained_at=103.3), now=103.3)
    replay.settle()
    (incident,) = replay.published
    parts = incident.memory_breakdown
    assert parts == {"source": "memory.stat", "age_seconds": 3.25, **breakdown(tmpfs)}  # holders.breakdown's
    assert parts["shmem_bytes"] == 380 << 20 and parts["file_bytes"] == 20 << 20
    assert incident.verdict == "shmem"
    assert "What held the memory: memory.stat read 3.25 s before the kill: tmpfs" in incident.explanation


def test_a_reading_older_than_the_cap_at_the_kill_is_not_its_breakdown() -> None:
    """The cgroup was at its limit long before, not since (memory.stat is read while `max` moves): null."""
    replay = pipeline_with_cgroup()
    replay.step(MemoryStatRead(CG, 100.0, STAT), now=100.0)
    replay.step(KernelLog([], drained_at=100.0 + READER_LAG), now=101.0)
    at = 100.0 + MAX_READING_AGE + 0.5
    replay.step(KernelLog(kill_records(10, at, 4242), drained_at=at + 0.05), now=at + 0.05)
    replay.settle()
    (incident,) = replay.published
    assert incident.memory_breakdown["source"] == "kill_lines"  # no reading: the last evidence, its kill line


def test_the_freshest_confirmed_reading_wins_and_an_unconfirmed_one_is_never_shown() -> None:
    replay = pipeline_with_cgroup()
    replay.step(MemoryStatRead(CG, 100.0, stat_with_anon(1 << 20)), now=100.0)
    replay.step(MemoryStatRead(CG, 100.5, stat_with_anon(2 << 20)), now=100.5)
    replay.step(KernelLog([], drained_at=101.6), now=101.6)  # covers the first two, less the reader's lag
    # Taken after that read: the kill may have come before it (the reaper frees the victim's memory at once)
    replay.step(MemoryStatRead(CG, 101.6 - READER_LAG / 2, stat_with_anon(3 << 20)), now=101.6)
    replay.step(KernelLog(kill_records(10, 101.7, 4242), drained_at=101.8), now=101.8)
    replay.settle()
    (incident,) = replay.published
    assert incident.memory_breakdown["anon_bytes"] == 2 << 20
    assert incident.memory_breakdown["age_seconds"] == 1.2


def test_a_reading_taken_after_the_kill_s_batch_is_never_its_breakdown() -> None:
    """The kill's incident is built after later reads of the log (it waits for the log to be quiet: its cgroup's
    memory.events was never read, so no counter says its line is all there is): a reading that later reads confirm
    precedes THEIR kills, not this one's."""
    replay = Replay(now=10.0)
    replay.step(CgroupAdded(CG, None, None, 0, True, ()))
    replay.step(KernelLog(kill_records(10, 103.0, 4242), drained_at=103.0), now=103.0)
    replay.step(MemoryStatRead(CG, 103.05, stat_with_anon(5 << 20)), now=103.05)
    replay.step(KernelLog([], drained_at=104.1), now=103.1)
    replay.step(KernelLog([], drained_at=104.2), now=103.2)  # confirmed from here on
    assert replay.published == []  # still held: the log has not been quiet long enough
    replay.settle()
    (incident,) = replay.published
    assert incident.memory_breakdown["source"] == "kill_lines"  # not the reading


def test_no_reading_without_a_read_of_the_log_after_it_and_none_for_another_cgroup() -> None:
    replay = pipeline_with_cgroup()
    replay.step(CgroupAdded("/other", 8, {"max": 0, "oom": 0, "oom_kill": 0}, 0, True, ()))
    replay.step(MemoryStatRead("/other", 90.0, STAT), now=90.0)
    replay.step(MemoryStatRead(CG, 100.0, STAT), now=100.0)
    replay.step(KernelLog(kill_records(10, 103.0, 4242), drained_at=103.0), now=103.0)  # the first read
    replay.settle()
    (incident,) = replay.published
    assert incident.memory_breakdown["source"] == "kill_lines"  # neither reading


def test_a_kill_after_its_cgroup_was_removed_still_finds_its_reading() -> None:
    from oomwatch.events import CgroupRemoved

    replay = pipeline_with_cgroup()
    replay.step(MemoryStatRead(CG, 100.0, STAT), now=100.0)
    replay.step(CgroupRemoved(CG), now=100.2)  # (its readings still wait for a read of the log)
    replay.step(KernelLog([], drained_at=101.5), now=101.5)
    replay.step(KernelLog(kill_records(10, 101.4, 4242), drained_at=101.6), now=101.6)
    replay.settle()
    (incident,) = replay.published
    assert incident.memory_breakdown["source"] == "memory.stat"
    # A cgroup made again under that path is another cgroup: its kills do not get the old one's readings
    replay.step(CgroupAdded(CG, 9, {"max": 0, "oom": 0, "oom_kill": 0}, 0, True, ()), now=102.0)
    replay.step(KernelLog(kill_records(20, 103.0, 4343), drained_at=103.1), now=103.1)
    replay.settle()
    assert replay.published[-1].memory_breakdown["source"] == "kill_lines"


def test_a_saved_log_takes_no_readings() -> None:
    from tests.replay import live_settings

    replay = Replay(live_settings(kmsg_source=None, counting=False), now=10.0)
    replay.step(CgroupAdded(CG, 7, {"max": 0}, 0, True, ()))
    replay.step(MemoryStatRead(CG, 1.0, STAT), now=1.0)
    assert len(replay.pipeline.readings) == 0


# --- the real storm, replayed ---------------------------------------------------------------------------------

def test_the_ratelimited_storm_replayed_with_readings(monkeypatch) -> None:
    """The real 6.1 storm (30 memory.oom.group containers, 5 rounds each; most reports lost their header and
    stats to the ratelimit), read as the live reader reads it, with what the cgroup source would have emitted:
    each container's `oom` moving and a memory.stat reading just before each of its kills (its anon marks
    which). A report with its stats keeps them; one without shows a reading of its OOM cgroup only when a read
    of the log ended, less the reader's lag, after it; the reading taken just before the kill itself never."""
    import oomwatch.correlator

    # The ordering rule alone: a container's readings come a round apart here (each before its kill), older
    # than the age cap, which test_a_reading_older_than_the_cap_at_the_kill_is_not_its_breakdown covers.
    monkeypatch.setattr(oomwatch.correlator, "MAX_READING_AGE", float("inf"))
    raw = raw_records(CAPTURES / "linux-6.1-storm-ratelimited.kmsg")
    reads = live_reads(raw, per_read=16)
    blind, replay = Replay(now=0.0), Replay(now=0.0)
    containers = sorted({m for r in raw for m in re.findall(rb"Tasks in (/storm/c\d\d) ", r)})
    for path in containers:
        for r in (blind, replay):
            r.step(CgroupAdded(path.decode(), 1, {"oom": 0}, 1, True, ()), now=0.0)
    taken_at: dict[int, float] = {}  # reading (its anon) → when it was taken
    ooms: dict[str, int] = {}
    for items in reads:
        times = [i.usec / 1e6 for i in items if getattr(i, "usec", None)]
        if not times:
            continue
        start, end = min(times), max(times)
        for item in items:
            m = re.match(r"Tasks in (/storm/c\d\d) ", getattr(item, "text", "") or "")
            if m:  # the kill of this container is in this read: `oom` moved and memory.stat was read before it
                path = m[1]
                ooms[path] = ooms.get(path, 0) + 1
                anon = len(taken_at) + 1
                taken_at[anon] = start - 0.001
                replay.step(CgroupChanged(path, 1, {"oom": ooms[path]}, 1, True), now=start - 0.001)
                blind.step(CgroupChanged(path, 1, {"oom": ooms[path]}, 1, True), now=start - 0.001)
                replay.step(MemoryStatRead(path, start - 0.001, stat_with_anon(anon)), now=start - 0.001)
        for r in (blind, replay):
            r.step(KernelLog(items, drained_at=end + 0.01), now=end + 0.01)
    for r in (blind, replay):
        r.step(Tick(), now=r.now + 5.0)
        r.settle()
    assert len(replay.published) == len(blind.published) == 150
    by_kill = {(i.victim.pid, i.kernel_seq): i for i in blind.published}
    from_stat, null = 0, 0
    for incident in replay.published:
        before = by_kill[(incident.victim.pid, incident.kernel_seq)]
        parts = incident.memory_breakdown
        if before.memory_breakdown["source"] == "kmsg":  # the kernel's own stats stay what they were
            assert parts == before.memory_breakdown
            continue
        if parts["source"] == "kill_lines":  # no reading precedes it: its kill lines, as without readings
            assert parts == before.memory_breakdown
            null += 1
            continue
        from_stat += 1
        assert parts["source"] == "memory.stat" and parts["age_seconds"] >= 0
        taken = taken_at[parts["anon_bytes"]]
        # never the reading taken just before this kill (within the reader's lag of its read), always older
        assert incident.time - taken > READER_LAG and parts["age_seconds"] == round(incident.time - taken, 3)
        assert "memory.stat read" in incident.explanation or incident.verdict == "unknown"
    print(f"storm replay: {from_stat} incidents without stats got memory.stat, {null} their kill lines")
    assert from_stat >= 30 and null >= 1

