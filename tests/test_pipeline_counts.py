"""memory.events as the count of record, through Pipeline.step() without a thread: the kernel's counters move
(read by the real cgroup source on a fixture tree, tests/replay.RecordedTree) interleaved with the kernel-log
records of the real captures as the kernel orders them (counters first, then the lines). Kills the log
describes are never counted again; kills whose records were lost (overwritten in a storm, or while the agent
was down) are counted once, across restarts; syslog(2), read only when woken, is read again before a deficit
is believed."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any, Iterator

from oomwatch.events import KernelLog, Stop, Tick
from oomwatch.sources.klog import SyslogKmsg
from tests.conftest import CAPTURES, FIXTURES, raw_records
from tests.replay import LiveReader, RecordedTree, Replay, live_reads, live_settings
from tests.test_correlator import memory_events
from tests.test_klog import FakeKlogctl, syslog_lines
from tests.test_pipeline_replay import SCENARIOS, seq_of

MEMCG = FIXTURES / "golden" / "memcg-scenarios"
K8S = FIXTURES / "golden" / "k8s-runc"
CONTAINER = ("/kubepods/burstable/pod0b0c6b3e-9d55-4a52-8f0e-0d2b1c3a4e5f/"
             "4f2a9c1e7b3d5a6c8e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d")
TRAINER = ("ml", "train-0", "trainer", "")  # the container's series labels (names from its runtime bundle)
BOOT = 1_000.0
ZERO = "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n"

# The memcg capture's four incidents: kernel time of the kill, the cgroups whose memory.events.local the
# kernel moved for it (the golden tree holds their values after all four), and its records (by sequence
# number).
MEMCG_INCIDENTS = [(8.549782, ("a",), 0, 515), (13.592309, ("b",), 516, 557),
                   (18.755479, ("p", "p/c1"), 558, 598), (23.94538, ("q", "q/c1", "q/c2"), 599, 1 << 30)]


def zero_counters(tree: Path) -> None:
    """The tree as it was before the capture's kills: every memory.events and memory.events.local at zero."""
    for path in list(tree.rglob("memory.events")) + list(tree.rglob("memory.events.local")):
        path.write_text(ZERO)


def move_counters(recorded: RecordedTree, tree: Path, cgroups) -> list[Any]:
    """The kernel moves these cgroups' counters to their values after the kill; the watcher signals each."""
    out = []
    for cgroup in cgroups:
        after = (MEMCG / "cgroup" / cgroup / "memory.events.local").read_text()
        (tree / cgroup / "memory.events.local").write_text(after)
        out += recorded.changed("/" + cgroup)
    return out


def incident_batches(lose: tuple[int, ...] = ()) -> Iterator[tuple[float, tuple[str, ...], list[bytes]]]:
    """(kill time, cgroups moved, raw records) per incident; the records of the incidents numbered in `lose`
    (0-based) left out, as overwritten before they were read."""
    for n, (kill_time, cgroups, first, last) in enumerate(MEMCG_INCIDENTS):
        yield kill_time, cgroups, [] if n in lose else [r for r in SCENARIOS if first <= seq_of(r) <= last]


def memcg_run(tmp_path: Path, lose: tuple[int, ...] = ()) -> Replay:
    tree = tmp_path / "cgroup"
    shutil.copytree(MEMCG / "cgroup", tree)
    zero_counters(tree)
    recorded = RecordedTree(tree)
    replay = Replay(live_settings(boot_time=BOOT), now=BOOT)
    replay.run(recorded.start())
    reader = LiveReader()
    for kill_time, cgroups, raw in incident_batches(lose):
        replay.run(move_counters(recorded, tree, cgroups), now=BOOT + kill_time)
        replay.step(KernelLog(reader.read(raw), drained_at=BOOT + kill_time + 0.01), BOOT + kill_time + 0.01)
    reader.close()
    recorded.close()
    replay.settle()
    return replay


def test_logged_kills_are_not_counted_again_from_memory_events(tmp_path: Path) -> None:
    """The memcg capture's four incidents with the kernel's own counters moving before each: nothing is added,
    and every cgroup's account ends settled at the kernel's values."""
    replay = memcg_run(tmp_path)
    assert [(i.victim.pid, i.evidence) for i in replay.published] == [(118, "kmsg"), (125, "kmsg"),
                                                                        (132, "kmsg"),
                                                                        (139, "kmsg")]
    accounts = replay.pipeline.state()["accounts"]
    for kill_time, cgroups, _, _ in MEMCG_INCIDENTS:
        for cgroup in cgroups:
            assert accounts["/" + cgroup]["seen"] == accounts["/" + cgroup]["kernel"], cgroup
    assert accounts["/b"]["kernel"] == {"oom_kill": 4, "oom_group_kill": 1}
    assert replay.pipeline.view().store.counted_from_events == 0


def test_a_kill_whose_records_were_overwritten_is_counted_from_memory_events_once(tmp_path: Path) -> None:
    replay = memcg_run(tmp_path, lose=(2,))  # the group kill in /p/c1: its 41 records overwritten unread
    assert [(i.victim.pid if i.victim else None, i.evidence) for i in replay.published] == [
        (118, "kmsg"), (125, "kmsg"), (None, "memory.events"), (139, "kmsg")]
    counted = replay.published[2]
    assert (counted.kind, counted.group_cgroup, counted.killed) == ("group", "/p/c1", ())
    store = replay.pipeline.view().store
    assert store.kmsg_lost == 41 and store.counted_from_events == 1
    # The kernel's count, whatever was lost: its group kills are the incidents' group kills.
    kernel = memory_events(CAPTURES / "linux-6.1-memcg-scenarios.memory-events.txt")
    assert store.node_kills[("group", "cgroup")] == sum(
        kernel[f"/{c}"]["oom_group_kill"] for c in ("b", "p/c1", "q"))
    # A restart (after a SIGKILL: the last save) reads the same counters again: nothing more.
    state = replay.saves[-1]
    again = Replay.restarted(state, live_settings(boot_time=BOOT), now=BOOT + 60.0)
    tree = RecordedTree(tmp_path / "cgroup")
    again.run(tree.start())
    tree.close()
    again.step(KernelLog([], drained_at=again.now))
    again.settle()
    assert again.published == []


def k8s_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "cgroup"
    shutil.copytree(K8S / "cgroup", tree)
    return tree


def bump(tree: Path, kill: int, group: int) -> None:
    text = f"low 0\nhigh 0\nmax 9\noom {group}\noom_kill {kill}\noom_group_kill {group}\n"
    for name in ("memory.events.local", "memory.events"):
        (tree / CONTAINER.lstrip("/") / name).write_text(text)


def test_group_kills_whose_records_were_lost_are_counted_from_memory_events(tmp_path: Path) -> None:
    tree = k8s_tree(tmp_path)
    bump(tree, 3, 1)  # one kill before the agent: not ours to count
    recorded = RecordedTree(tree, K8S / "run")
    replay = Replay(live_settings(), now=BOOT)
    replay.run(recorded.start())
    replay.step(KernelLog([], drained_at=BOOT))  # the log read to its end: nothing in it
    bump(tree, 9, 3)  # two group kills whose kernel log records were overwritten before being read
    replay.run(recorded.changed(CONTAINER), now=BOOT + 1.0)
    assert recorded.kills == 1  # the cue that wakes a syslog(2) reader
    replay.settle()
    assert {(i.kind, i.evidence, i.victim, i.killed) for i in replay.published} == {
        ("group", "memory.events", None, ())}
    assert len(replay.published) == 2
    assert all(i.workload.pod == "train-0" and i.workload.container == "trainer" for i in replay.published)
    assert all("no longer describes" in i.explanation for i in replay.published)
    assert replay.pipeline.view().store.workloads[TRAINER].kills["group"] == 2
    # A restart (from the last save, as after a SIGKILL) neither repeats nor loses them ...
    state = replay.saves[-1]
    recorded.close()
    again = Replay.restarted(state, live_settings(), now=BOOT + 30.0)
    recorded = RecordedTree(tree, K8S / "run")
    again.run(recorded.start())
    again.step(KernelLog([], drained_at=again.now))
    bump(tree, 12, 4)  # ... and one more while it runs is counted
    again.run(recorded.changed(CONTAINER), now=BOOT + 31.0)
    recorded.close()
    again.settle()
    assert [(i.kind, i.evidence) for i in again.published] == [("group", "memory.events")]
    store = again.pipeline.view().store
    assert len(store.incidents) == 3 and store.workloads[TRAINER].kills["group"] == 3


def test_kills_while_the_agent_was_down_are_counted_at_start(tmp_path: Path) -> None:
    tree = k8s_tree(tmp_path)
    recorded = RecordedTree(tree, K8S / "run")
    first = Replay(live_settings(), now=BOOT)
    first.run(recorded.start())
    first.step(KernelLog([], drained_at=BOOT))
    first.step(Stop(), BOOT + 1.0)
    recorded.close()
    state = first.saves[-1]
    assert state["cursor_seq"] is None and CONTAINER in state["accounts"]
    bump(tree, 6, 2)  # the agent is down; the ring wraps over the record
    second = Replay.restarted(state, live_settings(), now=BOOT + 100.0)
    recorded = RecordedTree(tree, K8S / "run")
    second.run(recorded.start())
    recorded.close()
    second.step(KernelLog([], drained_at=second.now))
    second.settle()
    assert [(i.kind, i.evidence, i.group_cgroup) for i in second.published] == [
        ("group", "memory.events", CONTAINER)]


def test_syslog_reads_again_before_it_believes_the_counters(tmp_path: Path) -> None:
    """syslog(2) is read only when woken: the memory.events move wakes it before the kernel has printed the
    kill's lines. The pipeline asks for another read once the deficit could settle, and the lines it brings
    account for the kill (found by the image test: every kill in the DaemonSet's syslog mode was reported
    twice)."""
    tree = tmp_path / "cgroup"
    shutil.copytree(MEMCG / "cgroup", tree)
    for cgroup in ("p", "p/c1"):  # before the third kill
        (tree / cgroup / "memory.events.local").write_text(ZERO)
    kernel = FakeKlogctl(syslog_lines(upto_seq=521))
    reader = SyslogKmsg(syscall=kernel, fallback_interval=3600)
    reader.open()
    recorded = RecordedTree(tree)
    replay = Replay(live_settings(boot_time=BOOT, kmsg_source="syslog"), now=BOOT + 16.75)
    replay.run(recorded.start())
    replay.step(KernelLog(list(reader.read_available()), drained_at=replay.now))
    replay.settle()
    assert [i.victim.pid for i in replay.published] == [118, 125]
    # The third kill (kernel time 18.755 s): the counters move (the cue to read: the ring lacks its lines yet)
    # ...
    replay.run(move_counters(recorded, tree, ("p", "p/c1")), now=BOOT + 18.76)
    assert recorded.kills == 1
    woken_at = replay.now + 0.01
    replay.step(KernelLog(list(reader.read_available()), drained_at=woken_at), woken_at)
    kernel.lines = syslog_lines(upto_seq=562)  # ... and the lines come after, with no cue of their own
    deadline = replay.pipeline.next_deadline()
    assert deadline is not None and deadline > woken_at
    fx = replay.step(Tick(), deadline)  # the deficit could settle now, but the log was read before it
    assert fx.wake_kernel_log and fx.publish == []
    replay.step(KernelLog(list(reader.read_available()), drained_at=deadline), deadline + 0.01)
    replay.settle()
    recorded.close()
    assert [(i.victim.pid, i.evidence) for i in replay.published] == [(118, "kmsg"), (125, "kmsg"),
                                                                        (132, "kmsg")]
    assert replay.wakes == 1


def test_syslog_fallback_is_woken_by_memory_events(tmp_path: Path) -> None:
    """An unprivileged container reads the log through syslog(2): nothing is read until memory.events moves
    (the source's kill cue), and then both incidents the kernel printed meanwhile are published."""
    tree = tmp_path / "cgroup"
    shutil.copytree(MEMCG / "cgroup", tree)
    for cgroup in ("p", "p/c1", "q", "q/c1", "q/c2"):  # before the third and fourth kills
        (tree / cgroup / "memory.events.local").write_text(ZERO)
    kernel = FakeKlogctl(syslog_lines(upto_seq=521))  # the first two incidents are in the ring
    reader = SyslogKmsg(syscall=kernel, fallback_interval=3600)
    reader.open()
    recorded = RecordedTree(tree)
    replay = Replay(live_settings(boot_time=BOOT, kmsg_source="syslog"), now=BOOT + 16.0)
    replay.run(recorded.start())
    replay.step(KernelLog(list(reader.read_available()), drained_at=replay.now))
    replay.settle()
    assert [i.victim.pid for i in replay.published] == [118, 125]
    kernel.lines = syslog_lines()  # the kernel prints two more; nothing read them yet
    assert replay.pipeline.next_deadline() is None and replay.wakes == 0  # nothing due: no wake-up, no read
    replay.run(move_counters(recorded, tree, ("p", "p/c1", "q", "q/c1", "q/c2")), now=BOOT + 24.0)
    assert recorded.kills == 3  # p/c1, q/c1, q/c2: each oom_kill move is a cue to read
    replay.step(KernelLog(list(reader.read_available()), drained_at=replay.now + 0.01), replay.now + 0.01)
    replay.settle()
    recorded.close()
    assert [(i.victim.pid, i.evidence) for i in replay.published] == [(118, "kmsg"), (125, "kmsg"),
                                                                        (132, "kmsg"),
                                                                        (139, "kmsg")]
    replay.step(Stop())
    assert replay.saves[-1]["cursor_source"] == "syslog"


def test_counter_readings_do_not_pile_up_without_a_kernel_log_processor(tmp_path: Path) -> None:
    """A saved log replayed, or no kernel log at all: nothing takes the memory.events readings, so none are
    kept (they would grow with every cgroup and every kill for as long as the agent runs)."""
    tree = k8s_tree(tmp_path)
    recorded = RecordedTree(tree, K8S / "run")
    replay = Replay(live_settings(kmsg_source=None, counting=False), now=BOOT)
    replay.run(recorded.start())
    for n in range(1, 6):
        bump(tree, 3 + n, 1 + n)  # from the fixture's 3 and 1
        replay.run(recorded.changed(CONTAINER), now=BOOT + n)
    recorded.close()
    assert recorded.kills == 5  # the source saw every kill
    assert replay.pipeline.state()["accounts"] == {}
    assert replay.pipeline.next_deadline() is None and replay.published == []


# --- the storm: 30 group cgroups, 5 rounds, headers ratelimited
# --------------------------------------------------

STORM = raw_records(CAPTURES / "linux-6.1-storm-ratelimited.kmsg")
TASKS_IN = re.compile(rb";Tasks in (/storm/c\d\d) are going")


def storm_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "cgroup"
    for n in range(30):
        cg = tree / "storm" / f"c{n:02d}"
        cg.mkdir(parents=True)
        (cg / "memory.max").write_text(f"{24 << 20}\n")
        (cg / "memory.oom.group").write_text("1\n")
        (cg / "memory.events.local").write_text(ZERO)
        (cg / "memory.events").write_text(ZERO)
        (cg / "cgroup.procs").write_text("")
    return tree


def test_a_storm_whose_third_round_was_overwritten_counts_every_group_kill_once(tmp_path: Path) -> None:
    """The real storm capture, read 32 records at a time; before each read, the kernel's counters of every
    group killed in it move (oom_kill +3: the victim, its reprint and the member; oom_group_kill +1). The
    third round's records (kernel time 45–60 s) are overwritten before the reader gets them: its 30 kills come
    from memory.events, the other 120 from the log, and each cgroup ends with the kernel's 5."""
    tree = storm_tree(tmp_path)
    recorded = RecordedTree(tree)
    replay = Replay(live_settings(boot_time=BOOT), now=BOOT)
    replay.run(recorded.start())
    kills: dict[str, int] = {}
    lost = [r for r in STORM if 45_000_000 <= int(r.split(b",", 3)[2]) < 60_000_000]
    reader = LiveReader()
    for n in range(0, len(STORM), 32):
        chunk = STORM[n:n + 32]
        now = BOOT + int(chunk[-1].split(b",", 3)[2]) / 1e6
        for match in filter(None, (TASKS_IN.search(r) for r in chunk)):
            cgroup = match.group(1).decode()
            kills[cgroup] = kills.get(cgroup, 0) + 1
            (tree / cgroup.lstrip("/") / "memory.events.local").write_text(
                f"low 0\nhigh 0\nmax {kills[cgroup]}\noom {kills[cgroup]}\noom_kill {3 * kills[cgroup]}\n"
                f"oom_group_kill {kills[cgroup]}\n")
            replay.run(recorded.changed(cgroup), now=now)
        items = reader.read([r for r in chunk if r not in lost])
        replay.step(KernelLog(items, drained_at=now + 0.01), now + 0.01)
    reader.close()
    recorded.close()
    replay.settle()
    # The counters moved as the kernel's own memory.events say they did.
    kernel = memory_events(CAPTURES / "linux-6.1-storm-ratelimited.memory-events.txt")
    assert {c: (3 * k, k) for c, k in kills.items()} == {
        c: (v["oom_kill"], v["oom_group_kill"]) for c, v in kernel.items()}
    per_cgroup: dict[str, int] = {}
    for incident in replay.published:
        assert incident.kind == "group"
        per_cgroup[incident.group_cgroup] = per_cgroup.get(incident.group_cgroup, 0) + 1
    assert per_cgroup == {f"/storm/c{n:02d}": 5 for n in range(30)}
    evidence = [i.evidence for i in replay.published]
    assert evidence.count("memory.events") == 30 and evidence.count("kmsg") == 120
    store = replay.pipeline.view().store
    assert store.kmsg_lost == len(lost) and store.counted_from_events == 30


def test_a_tick_at_a_deadline_never_leaves_it_due(tmp_path: Path) -> None:
    """The agent's loop waits for an event until next_deadline() and steps a Tick when none came: a deadline a
    Tick at that time leaves due makes it spin (0 s waits) until something else changes. The memcg capture's
    last group kill moves memory.events 1 s before its listing may be taken as complete (the 1 s quiet of a
    listing): the reconciler's settle time comes while the log is not drained past it, and then the quiet
    deadline itself, last record + quiet, which a Tick at that very time must complete (1023.95538 + 1.0 -
    1023.95538 < 1.0 in floating point)."""
    replay = memcg_run(tmp_path)
    assert replay.spins == 0, f"{replay.spins} Ticks spun at a deadline that stayed due"
