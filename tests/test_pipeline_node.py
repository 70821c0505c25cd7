"""What the pipeline learns of the node from its sources, without the agent's threads: cgroups that appear,
move and go (the real cgroup source on a tree), processes placed by /proc inside a cgroup namespace, by fork
and by cgroup.procs, kills placed by memory.events when the log does not say where, and a group kill that
waits for the proc connector's witnesses of processes that died without a line."""

from __future__ import annotations

import logging
import os
import queue
import shutil
import threading
from pathlib import Path

from oomwatch.events import CgroupAdded, CgroupChanged, CgroupRemoved, KernelLog
from oomwatch.parse.kmsg import parse_kmsg_record
from oomwatch.sources.cgroupfs import CgroupFS, Proc
from oomwatch.sources.cgroupsource import CgroupSource, ProcessSource, cgroup_namespace_prefix
from oomwatch.sources.procconn import ProcessExit, ProcessFork
from oomwatch.store import Store
from oomwatch.workloads import WorkloadResolver
from tests.conftest import wait_for
from tests.replay import RecordedTree, Replay, live_settings
from tests.test_agent import GOLDEN

BOOT = 1_000.0


def records(*lines: bytes) -> list:
    return [parse_kmsg_record(line) for line in lines]


def killed(seq: int, usec: int, pid: int, comm: str) -> bytes:
    return (f"3,{seq},{usec},-;Memory cgroup out of memory: Killed process {pid} ({comm}) total-vm:9kB, "
            f"anon-rss:9kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0\n").encode()


def tasks_in(seq: int, usec: int, cgroup: str) -> bytes:
    return f"6,{seq},{usec},-;Tasks in {cgroup} are going to be killed due to memory.oom.group set\n".encode()


def workload_paths(replay: Replay) -> set[str]:
    return {path for path, _, _ in replay.pipeline.view().workloads}


def test_live_cgroup_changes_are_seen_and_place_a_ratelimited_group_kill(tmp_path: Path) -> None:
    """The real watcher on its thread sees a cgroup appear (built aside and moved in, as mkdir on cgroupfs
    gives it with its files), reach its limit, and go; its events, replayed with the kernel's lines of a
    ratelimited group kill (no header, no summary), make the cgroup a workload, place the kill, and drop its
    series."""
    tree = tmp_path / "cgroup"
    shutil.copytree(GOLDEN / "cgroup", tree)
    got: queue.SimpleQueue = queue.SimpleQueue()
    source = CgroupSource(CgroupFS(str(tree)), WorkloadResolver(), got.put)
    source.start()
    thread = threading.Thread(target=source.run)
    thread.start()
    seen: list = []

    def saw(kind, path, test=lambda e: True) -> bool:
        while not got.empty():
            seen.append(got.get())
        return any(isinstance(e, kind) and e.path == path and test(e) for e in seen)

    try:
        staging = tmp_path / "staging" / "jobs"
        aside = staging / "train"
        aside.mkdir(parents=True)
        (aside / "memory.max").write_text(f"{32 << 20}\n")
        (aside / "memory.oom.group").write_text("1\n")
        for name in ("memory.events", "memory.events.local"):
            (aside / name).write_text("max 0\noom 0\noom_kill 0\n")
        os.rename(staging, tree / "jobs")
        assert wait_for(lambda: saw(CgroupAdded, "/jobs/train"))
        new = tree / "jobs" / "train"
        # It reaches its limit: the kernel bumps memory.events (and .local) and signals IN_MODIFY.
        (new / "memory.events.local").write_text("max 3\noom 1\noom_kill 0\n")
        (new / "memory.events").write_text("max 3\noom 1\noom_kill 0\n")
        assert wait_for(lambda: saw(CgroupChanged, "/jobs/train", lambda e: e.local and e.local["oom"] == 1))
        shutil.rmtree(new)
        assert wait_for(lambda: saw(CgroupRemoved, "/jobs/train"))
    finally:
        source.stop()
        thread.join()
        source.watcher.close()
    added = next(n for n, e in enumerate(seen) if isinstance(e, CgroupAdded) and e.path == "/jobs/train")
    changed = next(n for n, e in enumerate(seen) if isinstance(e, CgroupChanged) and e.path == "/jobs/train")
    removed = next(n for n, e in enumerate(seen) if isinstance(e, CgroupRemoved) and e.path == "/jobs/train")
    replay = Replay(live_settings(boot_time=BOOT), now=BOOT + 29.0, store=Store(grace_seconds=0.0))
    replay.run(seen[:changed])
    assert "/jobs/train" in workload_paths(replay) and added < changed
    replay.step(seen[changed], BOOT + 29.9)
    lines = records(killed(900, 30_000_000, 4001, "python3"), tasks_in(901, 30_000_100, "/jobs/train"),
                    killed(902, 30_000_200, 4000, "sleep"))
    replay.step(KernelLog(lines, drained_at=BOOT + 30.01), BOOT + 30.01)
    replay.settle()
    (incident,) = replay.published
    assert incident.kind == "group" and incident.group_cgroup == "/jobs/train"
    assert incident.oom_cgroup == "/jobs/train"  # from memory.events: its `oom` moved at the kill
    assert [p.pid for p in incident.killed] == [4001, 4000]
    replay.run(seen[changed + 1:removed + 1], now=BOOT + 40.0)
    replay.settle()
    assert "/jobs/train" not in workload_paths(replay)
    assert not any(labels[3] == "/jobs/train" for labels in replay.pipeline.view().store.workloads)


def test_a_ratelimited_kill_of_an_unseen_process_is_placed_by_memory_events(tmp_path: Path) -> None:
    """Only the kill line arrived (header and summary ratelimited away) and the victim was never seen in a
    cgroup.procs: the cgroup whose memory.events.local oom_kill moved is where it was."""
    tree = tmp_path / "cgroup"
    shutil.copytree(GOLDEN / "cgroup", tree)
    recorded = RecordedTree(tree)
    replay = Replay(live_settings(boot_time=BOOT), now=BOOT + 8.0)
    replay.run(recorded.start())
    (tree / "a" / "memory.events.local").write_text("max 60\noom 2\noom_kill 2\noom_group_kill 0\n")
    replay.run(recorded.changed("/a"), now=BOOT + 9.0)
    recorded.close()
    lines = records(killed(700, 9_000_000, 5555, "python3"))
    replay.step(KernelLog(lines, drained_at=BOOT + 9.01), BOOT + 9.01)
    replay.settle()
    (incident,) = replay.published
    assert (incident.kind, incident.victim.cgroup, incident.oom_cgroup) == ("single", "/a", "/a")
    assert incident.workload.type == "other"


def test_proc_cgroup_paths_inside_a_cgroup_namespace_are_made_absolute(tmp_path: Path) -> None:
    # The agent runs in /kubepods/besteffort/podA/agent; its cgroup namespace shows that as "/", and a victim
    # in another pod as "/../../../burstable/podB/ctr".
    tree = tmp_path / "cgroup"
    me = tree / "kubepods/besteffort/podA/agent"
    me.mkdir(parents=True)
    (me / "cgroup.procs").write_text(f"{os.getpid()}\n")
    (tree / "kubepods/burstable/podB/ctr").mkdir(parents=True)
    proc = tmp_path / "proc"
    shutil.copytree(GOLDEN / "proc", proc)
    (proc / "self").mkdir(exist_ok=True)
    (proc / "self/cgroup").write_text("0::/\n")
    (proc / "4242").mkdir()
    (proc / "4242/cgroup").write_text("0::/../../../burstable/podB/ctr\n")
    recorded = RecordedTree(tree)
    started = recorded.start()
    recorded.close()
    assert recorded.source.own_cgroup == "/kubepods/besteffort/podA/agent"
    prefix = cgroup_namespace_prefix(Proc(str(proc)), recorded.source.own_cgroup)
    emitted: list = []
    ProcessSource(Proc(str(proc)), emitted.append, prefix).execd(4242)
    assert [(e.pid, e.cgroup) for e in emitted] == [(4242, "/kubepods/burstable/podB/ctr")]
    replay = Replay(live_settings(boot_time=BOOT), now=BOOT + 5.0)
    replay.run(started + emitted)
    replay.step(KernelLog(records(killed(10, 6_000_000, 4242, "java")), drained_at=BOOT + 6.01), BOOT + 6.01)
    replay.settle()
    (incident,) = replay.published
    assert incident.victim.cgroup == "/kubepods/burstable/podB/ctr"


def golden_node(tmp_path: Path, procs_b: str) -> tuple[Replay, RecordedTree, Path, ProcessSource, list]:
    """The golden tree's cgroup source (its /b holding `procs_b`) and proc connector beside a live pipeline
    (witness wait 0.5 s), the tree as found stepped in: /b's first reading counts oom_kill 4, oom_group_kill 1
    (kills before ours). The connector's events gather in the list returned."""
    tree = tmp_path / "cgroup"
    shutil.copytree(GOLDEN / "cgroup", tree)
    (tree / "b" / "cgroup.procs").write_text(procs_b)
    recorded = RecordedTree(tree)
    processes: list = []
    connector = ProcessSource(Proc(str(GOLDEN / "proc")), processes.append)
    replay = Replay(live_settings(boot_time=BOOT, witness_wait=0.5), now=BOOT)
    replay.run(recorded.start())
    return replay, recorded, tree, connector, processes


def test_group_kill_lists_processes_that_died_unlogged(tmp_path: Path) -> None:
    """As when a group kill takes a container's PID 1: the kernel logs two kills, a third process of the group
    dies by SIGKILL without a line; the proc connector's exit names it. A single kill right after may not
    overtake the group kill waiting for its witnesses."""
    replay, recorded, _, connector, processes = golden_node(tmp_path, "7000\n7001\n7002\n")  # alive in /b
    recorded.close()
    replay.step(KernelLog(records(killed(10, 1_000, 7001, "python3"), tasks_in(11, 1_001, "/b"),
                                  killed(12, 1_002, 7000, "sh")), drained_at=BOOT + 0.01), BOOT + 0.01)
    connector.exited(ProcessExit(pid=7002, signal=9, time=BOOT + 0.02))
    connector.exited(ProcessExit(pid=7003, signal=15, time=BOOT + 0.02))  # not a SIGKILL: not a witness
    replay.run(processes, now=BOOT + 0.02)
    replay.step(KernelLog(records(
        b"6,13,1999,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
        b"oom_memcg=/a,task_memcg=/a,task=java,pid=7100,uid=0\n", killed(14, 2_000, 7100, "java")),
        drained_at=BOOT + 0.03), BOOT + 0.03)
    replay.advance_to(BOOT + 0.4)
    assert replay.published == [], "the group kill waits for its witnesses, and the single kill behind it"
    replay.settle()
    group, single = replay.published
    assert single.victim.pid == 7100 and single.kind == "single"
    assert [p.pid for p in group.killed] == [7001, 7000]
    assert group.died_with == ({"pid": 7002, "cgroup": "/b", "signal": 9},)
    assert "1 more process of /b died with it by SIGKILL" in group.explanation


def test_a_process_never_seen_in_a_cgroup_gets_it_from_its_parent(tmp_path: Path) -> None:
    """A global OOM gives no memory.events warning to snapshot pids on: the container's init is remembered
    when its cgroup becomes populated (cgroup.events), and what it forks later inherits that cgroup."""
    replay, recorded, tree, connector, processes = golden_node(tmp_path, "")
    (tree / "b" / "cgroup.procs").write_text("8000\n")
    populated = recorded.populated("/b")
    recorded.close()
    assert [(type(e), e.pids) for e in populated] == [(CgroupChanged, {"/b": (8000,)})]
    replay.run(populated, now=BOOT + 0.1)
    connector.forked(ProcessFork(parent=8000, child=8001, parent_task=8000))
    connector.forked(ProcessFork(parent=9000, child=9001, parent_task=9000))  # a parent never seen: no cgroup
    connector.exited(ProcessExit(pid=8001, signal=9, time=BOOT + 1.0))
    connector.exited(ProcessExit(pid=9001, signal=9, time=BOOT + 1.0))
    replay.run(processes, now=BOOT + 1.0)
    replay.step(KernelLog(records(killed(10, 1_000_000, 7001, "python3"), tasks_in(11, 1_000_100, "/b")),
                          drained_at=BOOT + 1.01), BOOT + 1.01)
    replay.settle()
    (incident,) = replay.published
    assert incident.died_with == ({"pid": 8001, "cgroup": "/b", "signal": 9},)


def emptied_group(tmp_path: Path) -> tuple[Replay, RecordedTree, Path, ProcessSource, list]:
    """/b (memory.oom.group=1) holds 7000, 7001 and 7002; the kernel kills 7001 and lists 7000."""
    replay, recorded, tree, connector, processes = golden_node(tmp_path, "7000\n7001\n7002\n")
    replay.step(KernelLog(records(killed(10, 1_000, 7001, "python3"), tasks_in(11, 1_001, "/b"),
                                  killed(12, 1_002, 7000, "sh")), drained_at=BOOT + 0.01), BOOT + 0.01)
    (tree / "b" / "memory.events.local").write_text("low 0\nhigh 0\nmax 40\noom 2\noom_kill 6\noom_group_kill 2\n")
    (tree / "b" / "cgroup.procs").write_text("")
    return replay, recorded, tree, connector, processes


def test_a_group_kill_goes_out_once_the_source_sees_its_group_empty(tmp_path: Path) -> None:
    """Issue 30: the cgroup source reads memory.events.local before the pids when cgroup.events moves, so a
    reading that finds the group empty and counted its group kill came after the kill: the listing is whole once
    the log is read after it. With every process the group held accounted for (a kill line, or its exit by
    SIGKILL), it goes out at once, not after a second of quiet log and 0.5 s of witnesses."""
    replay, recorded, _, connector, processes = emptied_group(tmp_path)
    connector.exited(ProcessExit(pid=7002, signal=9, time=BOOT + 0.02))
    replay.run(processes, now=BOOT + 0.02)
    emptied = recorded.populated("/b")
    recorded.close()
    assert [(e.local["oom_group_kill"], e.pids) for e in emptied] == [(2, {"/b": ()})]
    replay.run(emptied, now=BOOT + 0.03)  # (its wake answered: the log read to its end at BOOT + 0.03)
    (group,) = replay.published
    assert [p.pid for p in group.killed] == [7001, 7000]
    assert group.died_with == ({"pid": 7002, "cgroup": "/b", "signal": 9},)
    replay.settle()
    assert len(replay.published) == 1  # nothing counted from memory.events beside it


def test_a_group_kill_complete_by_the_counters_waits_briefly_for_an_exit_not_yet_in(tmp_path: Path) -> None:
    """7002 died unlogged, its exit not yet through the proc connector when the group is seen empty: the group
    kill waits EXITS_AFTER_EMPTY for it, and names it."""
    from oomwatch.stages.kernellog import EXITS_AFTER_EMPTY
    replay, recorded, _, connector, processes = emptied_group(tmp_path)
    emptied = recorded.populated("/b")
    recorded.close()
    replay.run(emptied, now=BOOT + 0.03)
    assert replay.published == []
    connector.exited(ProcessExit(pid=7002, signal=9, time=BOOT + 0.04))
    replay.run(processes, now=BOOT + 0.04)
    replay.advance_to(BOOT + 0.03 + EXITS_AFTER_EMPTY)
    (group,) = replay.published
    assert group.died_with == ({"pid": 7002, "cgroup": "/b", "signal": 9},)


def test_a_kill_waiting_for_its_names_is_not_counted_again_from_memory_events() -> None:
    """An incident complete in the log waits in the identity stage for its container's names (the bundle read
    again): memory.events has counted its kill meanwhile. The counts stage reconciles only once it has come, so
    the kill is one incident, not one from the log and one from memory.events (the storm of 03:32 UTC counted a
    container's kill twice so after the agent's restart), and the cursor stays before it until it is published."""
    container = "/kubepods/burstable/pod1f602e8c-0a49-40ea-817d-80e6c4d5d455/" + "3d" * 32
    replay = Replay(live_settings(boot_time=BOOT, read_names=True), now=BOOT)
    replay.step(CgroupAdded(container, 9, {"oom_kill": 0, "oom_group_kill": 0}, 0, True, (500,)))
    replay.step(CgroupChanged(container, 9, {"max": 1, "oom": 1, "oom_kill": 1, "oom_group_kill": 0}, 0, True),
                now=BOOT + 0.01)
    fx = replay.step(KernelLog(records(killed(40, 1_000, 500, "python3")), drained_at=BOOT + 0.02), BOOT + 0.02)
    assert replay.published == [] and fx.read_names == [container]  # its names asked for, not answered
    assert replay.pipeline.state()["cursor_seq"] in (None, 39)  # read again after a restart
    replay.advance_to(BOOT + 4.0)  # long past the counters' settle time, the log read to its end
    assert replay.published == []
    replay.settle()
    assert [(i.evidence, i.victim.pid if i.victim else None) for i in replay.published] == [("kmsg", 500)]


def test_a_process_that_died_unlogged_before_the_group_was_read_again_is_still_waited_for(tmp_path: Path) -> None:
    """A group kill took 7002 down without a line (its pid namespace torn down) before the reading after the kill,
    which holds only 7000: the listing is whole (7001 and 7000 named), but 7002, in the reading before the kill,
    has no exit yet: the incident waits for it (the real-kernel tier's dashboard scenario of 03:59 UTC published
    such a kill without the two processes that died with it)."""
    replay, recorded, tree, connector, processes = golden_node(tmp_path, "7000\n7001\n7002\n")
    (tree / "b" / "memory.events.local").write_text("low 0\nhigh 0\nmax 40\noom 2\noom_kill 4\noom_group_kill 1\n")
    replay.run(recorded.changed("/b"), now=BOOT + 0.005)  # at its limit: 7000, 7001 and 7002 read again
    (tree / "b" / "memory.events.local").write_text("low 0\nhigh 0\nmax 40\noom 2\noom_kill 6\noom_group_kill 2\n")
    (tree / "b" / "cgroup.procs").write_text("7000\n")
    after = recorded.changed("/b")  # the group kill counted: who the listing will name
    recorded.close()
    assert [e.pids for e in after] == [{"/b": (7000,)}]
    replay.run(after, now=BOOT + 0.008)
    replay.step(KernelLog(records(killed(10, 1_000, 7001, "python3"), tasks_in(11, 1_001, "/b"),
                                  killed(12, 1_002, 7000, "sh")), drained_at=BOOT + 0.01), BOOT + 0.01)
    replay.advance_to(BOOT + 0.3)
    assert replay.published == []  # the listing is whole, but 7002's exit has not come
    connector.exited(ProcessExit(pid=7002, signal=9, time=BOOT + 0.35))
    replay.run(processes, now=BOOT + 0.35)
    replay.settle()
    (group,) = replay.published
    assert [p.pid for p in group.killed] == [7001, 7000]
    assert group.died_with == ({"pid": 7002, "cgroup": "/b", "signal": 9},)


def test_a_group_kill_the_quiet_log_completes_does_not_wait_for_exits_its_readings_account_for(
        tmp_path: Path) -> None:
    """memory.events counts a kill in /b that no line describes (a line lost or ratelimited), so the counters
    cannot complete the group kill and the quiet window does; the reading after the kill holds only the two
    processes its lines name, so it goes out then, without the witness wait (it waited the whole 0.5 s so)."""
    replay, recorded, tree, _, _ = golden_node(tmp_path, "7000\n7001\n")
    (tree / "b" / "memory.events.local").write_text("low 0\nhigh 0\nmax 40\noom 2\noom_kill 7\noom_group_kill 2\n")
    replay.run(recorded.changed("/b"), now=BOOT + 0.005)  # after the kill: 7000 and 7001 not yet gone
    recorded.close()
    replay.step(KernelLog(records(killed(10, 1_000, 7001, "python3"), tasks_in(11, 1_001, "/b"),
                                  killed(12, 1_002, 7000, "sh")), drained_at=BOOT + 0.01), BOOT + 0.01)
    quiet_over = BOOT + 0.01 + 1.0  # lines owed: the listing's quiet window (Settings.quiet_listing)
    replay.advance_to(quiet_over - 0.01)
    assert replay.published == []
    replay.advance_to(quiet_over)
    group = next(i for i in replay.published if i.kind == "group")
    assert [p.pid for p in group.killed] == [7001, 7000] and group.detected_at == quiet_over
    # why the quiet log completed it, for `--log-level debug`
    assert (logging.DEBUG, "kernel log: complete after 1.0 s of quiet log, not by the counters: /b: memory.events "
                           "counts 3 kills, the lines 2") in replay.logs
