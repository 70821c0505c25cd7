"""Issue 30 item 2: an incident is complete when memory.events says nothing more is coming, not only after the log
has been quiet. The kernel counts each kill in `oom_kill` before printing its line, so a single kill's line is all
there is unless the counter shows more; it counts a group kill in `oom_group_kill` before it lists the group, so
the group's pids read with a counter that counted the kill are whom the listing names (or, empty, that nothing is
left to list). The quiet window stays for what no counter describes."""

from __future__ import annotations

from typing import Optional

from oomwatch.events import CgroupAdded, CgroupChanged, KernelLog
from tests.conftest import CAPTURES, raw_records
from tests.replay import Replay, kmsg_records, live_settings

GROUP_LOG = kmsg_records(raw_records(CAPTURES / "linux-6.1-slow-group-listing.kmsg"))
GROUP = next(r.text for r in GROUP_LOG if r.text.startswith("Tasks in ")).split()[2]
PIDS = (153, 158, 159, 160, 162)
SCENARIOS = kmsg_records(raw_records(CAPTURES / "linux-6.1-memcg-scenarios.kmsg"))  # first: a single kill of /a


def at(records, text: str) -> int:
    return next(i for i, r in enumerate(records) if text in r.text)


def test_a_group_kill_is_never_completed_by_the_counters_mid_listing() -> None:
    """The kernel counts oom_group_kill before it prints the listing, and each member's oom_kill as it kills it:
    counters read mid-listing equal the lines read so far (the real-kernel tier's pool scenario split a group
    kill so). A group kill waits for the quiet window of a listing, whatever the counters say."""
    member = at(GROUP_LOG, "Killed process 153 (sh)")
    victim = at(GROUP_LOG, "Killed process 162 (dd)")
    boot = 100.0 - GROUP_LOG[victim].usec / 1e6  # the kill happened at 100.0, as the counters' readings say
    replay = Replay(live_settings(boot_time=boot), now=100.0)
    replay.step(CgroupAdded(GROUP, 7, {"oom_kill": 0, "oom_group_kill": 0}, 1, True, PIDS))
    # read as the kernel had killed the victim and one member: 2 oom_kill, the group kill counted
    replay.step(CgroupChanged(GROUP, 7, {"max": 1, "oom": 1, "oom_kill": 2, "oom_group_kill": 1}, 1, True),
                now=100.0)
    replay.step(KernelLog(GROUP_LOG[:member + 1], drained_at=100.01), now=100.01)
    replay.advance_to(100.5)
    assert replay.published == []  # 2 lines, 2 counted: still not complete
    replay.step(CgroupChanged(GROUP, 7, {"max": 1, "oom": 1, "oom_kill": 6, "oom_group_kill": 1}, 1, True),
                now=100.55)
    replay.step(KernelLog(GROUP_LOG[member + 1:], drained_at=100.6), now=100.6)
    replay.advance_to(102.0)
    (incident,) = replay.published  # one incident, and nothing counted from memory.events beside it
    assert incident.kind == "group" and sorted(p.pid for p in incident.killed) == [153, 158, 159, 160, 162]


def single_kill(counted: Optional[int]) -> Replay:
    """/a's single kill of 118 read at 100.01, its counter read before as `counted` kills (None: not read yet)."""
    kill = at(SCENARIOS, "Killed process 118")
    replay = Replay(live_settings(boot_time=100.0 - SCENARIOS[kill].usec / 1e6), now=100.0)
    replay.step(CgroupAdded("/a", 3, {"oom_kill": 0, "oom_group_kill": 0}, 0, True, (118,)))
    if counted is not None:
        replay.step(CgroupChanged("/a", 3, {"max": 1, "oom": counted, "oom_kill": counted, "oom_group_kill": 0}, 0,
                                  True), now=100.0)
    replay.step(KernelLog(SCENARIOS[:kill + 1], drained_at=100.01), now=100.01)
    return replay


def test_a_single_kill_goes_out_when_its_one_line_was_counted() -> None:
    replay = single_kill(counted=1)
    assert [(i.kind, i.victim.pid) for i in replay.published] == [("single", 118)]  # not 0.25 s later


def test_a_kill_in_a_grouped_cgroup_without_its_tasks_in_line_is_not_taken_as_single() -> None:
    """memory.oom.group=1 applies: the victim's line alone matches a counter of 1 only until the `Tasks in` line and
    the listing come; the counters alone never make it a single kill."""
    victim = at(GROUP_LOG, "Killed process 162 (dd)")
    replay = Replay(live_settings(), now=100.0)
    replay.step(CgroupAdded(GROUP, 7, {"oom_kill": 0, "oom_group_kill": 0}, 1, True, PIDS))
    replay.step(CgroupChanged(GROUP, 7, {"max": 1, "oom": 1, "oom_kill": 1, "oom_group_kill": 0}, 1, True),
                now=100.0)
    replay.step(KernelLog(GROUP_LOG[:victim + 1], drained_at=100.01), now=100.01)
    assert replay.published == []


def test_without_counters_the_quiet_window_decides() -> None:
    """A cgroup the agent never read (no account): the single kill waits the quiet window, as before."""
    kill = at(SCENARIOS, "Killed process 118")
    replay = Replay(live_settings(), now=100.0)
    replay.step(KernelLog(SCENARIOS[:kill + 1], drained_at=100.0), now=100.0)
    assert replay.published == []
    replay.advance_to(100.3)
    assert [i.victim.pid for i in replay.published] == [118]


def group_replay(**settings) -> tuple[Replay, int]:
    """The slow listing's group kill read whole by 100.6 s, its counters read as the kernel counted it all."""
    victim = at(GROUP_LOG, "Killed process 162 (dd)")
    boot = 100.0 - GROUP_LOG[victim].usec / 1e6
    replay = Replay(live_settings(boot_time=boot, **settings), now=100.0)
    replay.step(CgroupAdded(GROUP, 7, {"oom_kill": 0, "oom_group_kill": 0}, 1, True, PIDS))
    replay.step(CgroupChanged(GROUP, 7, {"max": 1, "oom": 1, "oom_kill": 6, "oom_group_kill": 1}, 1, True),
                now=100.5)
    replay.step(KernelLog(GROUP_LOG, drained_at=100.6), now=100.6)
    return replay, victim


def emptied(group_kills: int, oom_kill: int = 6) -> CgroupChanged:
    """The group seen with no process left, by a reading of memory.events.local taken just before its pids."""
    local = {"max": 1, "oom": 1, "oom_kill": oom_kill, "oom_group_kill": group_kills}
    return CgroupChanged(GROUP, 7, local, 1, True, {GROUP: ()})


def test_a_group_kill_is_complete_once_its_group_is_empty_and_the_log_read_after() -> None:
    """Nothing is left to kill in an empty group, and each member's line is printed before it can exit: once the
    log has been read to its end after the group was seen empty, the listing is whole. No quiet window."""
    replay, _ = group_replay()
    replay.answer_wakes = False  # the reader's answer to the wake comes as its own event, below
    replay.advance_to(100.65)
    assert replay.published == []  # the counters match, but a listing may still be printing
    fx = replay.step(emptied(group_kills=1), now=100.7)
    assert fx.wake_kernel_log  # a read that ends after this is what it waits for
    assert replay.published == []  # the last read ended (100.6) before the group was seen empty
    replay.step(KernelLog([], drained_at=100.72), now=100.72)
    (incident,) = replay.published
    assert incident.kind == "group" and sorted(p.pid for p in incident.killed) == [153, 158, 159, 160, 162]
    replay.advance_to(103.0)
    assert len(replay.published) == 1  # and nothing counted from memory.events beside it


def test_a_group_seen_empty_before_its_kill_does_not_complete_it() -> None:
    """A reading of the group's pids taken before the kill (the cgroup empty between two jobs, or after the last
    round's kill, its event late to the loop) says nothing of this listing: its oom_group_kill had not counted this
    kill yet. The quiet window decides."""
    replay, _ = group_replay()
    replay.step(emptied(group_kills=0, oom_kill=0), now=100.7)
    replay.step(KernelLog([], drained_at=100.72), now=100.72)
    replay.advance_to(101.5)
    assert replay.published == []
    replay.advance_to(101.7)  # 1 s of quiet log after the last record (100.6)
    assert [i.kind for i in replay.published] == ["group"]


def test_a_removed_group_has_printed_its_listing() -> None:
    from oomwatch.events import CgroupRemoved
    replay, _ = group_replay()
    replay.answer_wakes = False
    replay.step(CgroupRemoved(GROUP), now=100.7)
    assert replay.published == []
    replay.step(KernelLog([], drained_at=100.71), now=100.71)
    assert [i.kind for i in replay.published] == ["group"]


def test_a_group_kill_whose_every_process_has_its_line_does_not_wait_for_exits() -> None:
    """With the proc connector, a group kill waits for the exits of members that died unlogged. Complete by the
    counters, with every process its group held (5 pids, read at start) listed in its lines, none can be missing:
    it goes out at once, not witness_wait later."""
    replay, _ = group_replay(witness_wait=0.5)
    replay.step(emptied(group_kills=1), now=100.7)  # (the reader's answer to the wake: read to its end at 100.7)
    assert [i.kind for i in replay.published] == ["group"]


def released_by_the_next_report() -> Replay:
    """The slow listing's group kill, then the next report's kill line (a single kill of /a), read at 100.6 s;
    the group's pids read only before the kill."""
    victim = at(GROUP_LOG, "Killed process 162 (dd)")
    boot = 100.0 - GROUP_LOG[victim].usec / 1e6
    replay = Replay(live_settings(boot_time=boot, witness_wait=0.5), now=100.0)
    replay.step(CgroupAdded(GROUP, 7, {"oom_kill": 0, "oom_group_kill": 0}, 1, True, PIDS))
    replay.step(CgroupAdded("/a", 3, {"oom_kill": 0, "oom_group_kill": 0}, 0, True, (118,)))
    single = next(r for r in SCENARIOS if "Killed process 118" in r.text)
    nxt = single._replace(seq=GROUP_LOG[-1].seq + 1, usec=GROUP_LOG[-1].usec + 1)
    replay.step(KernelLog(GROUP_LOG + [nxt], drained_at=100.6), now=100.6)  # the group kill, then another kill
    replay.advance_to(100.65)
    assert replay.published == []  # finished by the next kill line, waiting for its exits
    return replay


def test_a_group_kill_released_by_the_next_report_waits_for_its_exits_only_until_its_group_is_empty() -> None:
    """The next report's kill line finishes a group kill before its group is empty: it waits for the proc
    connector's exits (witness_wait), but no longer than its group being seen empty by a reading that counted it."""
    replay = released_by_the_next_report()
    replay.step(emptied(group_kills=1), now=100.7)
    assert [i.kind for i in replay.published][:1] == ["group"]  # every process it held has its line: no wait


def test_a_group_kill_released_by_the_next_report_goes_out_at_a_reading_that_names_all_it_held() -> None:
    """The same, when the group's pids are read after the kill was counted (the cgroup source reads them when
    oom_group_kill moves) before it is empty: every pid it held has its line, so no exit is missing: it goes out at
    that reading, not when the group is seen empty nor witness_wait later (the storm's tail of 2026-11-28)."""
    replay = released_by_the_next_report()
    counted = {"max": 1, "oom": 1, "oom_kill": 6, "oom_group_kill": 1}
    replay.step(CgroupChanged(GROUP, 7, counted, 1, True, {GROUP: PIDS}), now=100.7)
    assert [i.kind for i in replay.published][:1] == ["group"]


def test_a_reading_with_a_process_the_lines_do_not_name_keeps_it_waiting_for_its_exit() -> None:
    replay = released_by_the_next_report()
    counted = {"max": 1, "oom": 1, "oom_kill": 6, "oom_group_kill": 1}
    replay.step(CgroupChanged(GROUP, 7, counted, 1, True, {GROUP: PIDS + (170,)}), now=100.7)
    replay.advance_to(101.0)
    assert replay.published == []  # pid 170: no line, no exit yet (it may have died unlogged)
    replay.advance_to(101.11)  # the witness wait (0.5 s from 100.6) is over: out, without 170
    assert [i.kind for i in replay.published][:1] == ["group"]


def test_a_group_kill_is_complete_once_its_lines_name_every_process_its_group_held_after_the_kill() -> None:
    """The kernel counts oom_group_kill before it lists the group: the group's pids read after that reading are
    the processes the listing will name. Once the lines name them all (and match oom_kill), the listing is whole,
    before any of them has exited; mid-listing it is not."""
    member = at(GROUP_LOG, "Killed process 153 (sh)")
    victim = at(GROUP_LOG, "Killed process 162 (dd)")
    boot = 100.0 - GROUP_LOG[victim].usec / 1e6
    replay = Replay(live_settings(boot_time=boot, witness_wait=0.5), now=100.0)
    replay.step(CgroupAdded(GROUP, 7, {"oom_kill": 0, "oom_group_kill": 0}, 1, True, PIDS))
    counted = {"max": 1, "oom": 1, "oom_kill": 2, "oom_group_kill": 1}
    replay.step(CgroupChanged(GROUP, 7, counted, 1, True, {GROUP: PIDS}), now=100.0)  # read after the group kill
    replay.step(KernelLog(GROUP_LOG[:member + 1], drained_at=100.01), now=100.01)
    replay.advance_to(100.5)
    assert replay.published == []  # 2 of its 5 processes named: the listing goes on
    replay.step(CgroupChanged(GROUP, 7, {**counted, "oom_kill": 6}, 1, True), now=100.55)
    replay.step(KernelLog(GROUP_LOG[member + 1:], drained_at=100.6), now=100.6)
    (incident,) = replay.published  # at once: no quiet window, no wait for exits (all 5 have their line)
    assert sorted(p.pid for p in incident.killed) == sorted(PIDS)


def test_pids_read_before_the_group_kill_was_counted_do_not_say_who_it_lists() -> None:
    """The same pids, read with an oom_group_kill that had not counted the kill: a process could have been
    forked between that read and the kill. The quiet window decides."""
    victim = at(GROUP_LOG, "Killed process 162 (dd)")
    boot = 100.0 - GROUP_LOG[victim].usec / 1e6
    replay = Replay(live_settings(boot_time=boot), now=100.0)
    replay.step(CgroupAdded(GROUP, 7, {"oom_kill": 0, "oom_group_kill": 0}, 1, True, PIDS))
    replay.step(CgroupChanged(GROUP, 7, {"max": 1, "oom": 1, "oom_kill": 6, "oom_group_kill": 0}, 1, True,
                              {GROUP: PIDS}), now=100.0)
    replay.step(CgroupChanged(GROUP, 7, {"max": 1, "oom": 1, "oom_kill": 6, "oom_group_kill": 1}, 1, True),
                now=100.5)
    replay.step(KernelLog(GROUP_LOG, drained_at=100.6), now=100.6)
    replay.advance_to(101.5)
    assert replay.published == []
    replay.advance_to(101.7)
    assert [i.kind for i in replay.published] == ["group"]


def test_a_single_kill_goes_out_before_the_agent_reads_its_counter() -> None:
    """The kernel counted the kill before printing its line: a line read before the agent's read of oom_kill (the
    cgroup thread lagging behind the log: 24-225 ms in the real-kernel tier's calm single kills) is complete at
    once; the counter read after it settles, and nothing is counted twice."""
    replay = single_kill(counted=None)
    assert [(i.kind, i.victim.pid) for i in replay.published] == [("single", 118)]
    replay.step(CgroupChanged("/a", 3, {"max": 1, "oom": 1, "oom_kill": 1, "oom_group_kill": 0}, 0, True), now=100.05)
    replay.advance_to(103.0)
    assert [(i.kind, i.victim.pid) for i in replay.published] == [("single", 118)]


def test_more_kills_counted_than_lines_read_still_waits() -> None:
    assert single_kill(counted=2).published == []


def test_kills_published_in_a_burst_are_saved_together() -> None:
    """Each save writes the whole state on the loop: kills published one after another while the log is quiet
    between them (a restart's backlog, a storm) are saved at most every SAVE_QUIET_GAP, the next save taking all
    that came meanwhile; a kill alone is saved as soon as it is published."""
    from oomwatch.stages.counts import SAVE_QUIET_GAP

    first, end = at(SCENARIOS, "invoked oom-killer"), at(SCENARIOS, "Killed process 118")
    report = SCENARIOS[first:end + 1]  # /a's single kill of 118, as printed
    replay = Replay(live_settings(boot_time=100.0 - report[-1].usec / 1e6), now=100.0)
    replay.step(CgroupAdded("/a", 3, {"oom_kill": 0, "oom_group_kill": 0}, 0, True, (118,)))
    replay.advance_to(102.0)
    saved = len(replay.saves)

    def kill(n: int, at_time: float) -> None:  # the same report again, as the n-th kill (its own seqs and times)
        again = [r._replace(seq=r.seq + 1000 * n, usec=r.usec + int((at_time - 102.0) * 1e6)) for r in report]
        replay.step(CgroupChanged("/a", 3, {"max": n, "oom": n, "oom_kill": n, "oom_group_kill": 0}, 0, True),
                    now=at_time)
        replay.step(KernelLog(again, drained_at=at_time), now=at_time)

    for n, when in enumerate((102.0, 102.05, 102.1), start=1):
        kill(n, when)
        assert len(replay.published) == n  # at once: its line is what oom_kill counted
    assert len(replay.saves) - saved == 1  # the first, at once; the next two wait for the gap
    replay.advance_to(102.0 + SAVE_QUIET_GAP)
    assert len(replay.saves) - saved == 2 and len(replay.saves[-1]["incidents"]) == 3
    kill(4, 104.0)
    assert len(replay.saves) - saved == 3 and len(replay.saves[-1]["incidents"]) == 4  # alone: at once
