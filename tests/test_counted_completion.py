"""Issue 30 item 2: an incident is complete when its lines are what memory.events counted for its cgroups, not only
after the log has been quiet. The kernel counts each kill in `oom_kill` before printing its line and a group kill in
`oom_group_kill` once its listing is printed, so lines matching the counters mean nothing more is coming; the quiet
window stays for what no counter describes."""

from __future__ import annotations

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


def test_a_single_kill_goes_out_when_its_one_line_was_counted() -> None:
    kill = at(SCENARIOS, "Killed process 118")
    replay = Replay(live_settings(), now=100.0)
    replay.step(CgroupAdded("/a", 3, {"oom_kill": 0, "oom_group_kill": 0}, 0, True, (118,)))
    replay.step(CgroupChanged("/a", 3, {"max": 1, "oom": 1, "oom_kill": 1, "oom_group_kill": 0}, 0, True), now=100.0)
    replay.step(KernelLog(SCENARIOS[:kill + 1], drained_at=100.01), now=100.01)
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
