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


def test_a_group_kill_is_published_once_its_lines_match_the_counters_without_the_quiet_window() -> None:
    replay = Replay(live_settings(), now=100.0)
    replay.step(CgroupAdded(GROUP, 7, {"oom_kill": 0, "oom_group_kill": 0}, 1, True, PIDS))
    # the counters of the whole kill (the victim twice, four members; one group kill), then every line
    replay.step(CgroupChanged(GROUP, 7, {"max": 1, "oom": 1, "oom_kill": 6, "oom_group_kill": 1}, 1, True),
                now=100.0)
    replay.step(KernelLog(GROUP_LOG, drained_at=100.01), now=100.01)
    (incident,) = replay.published  # at once: not 1 s later (the listing's quiet window)
    assert incident.kind == "group" and incident.victim.pid == 162 and sorted(p.pid for p in incident.killed) == [
        153, 158, 159, 160, 162]


def test_a_listing_whose_counted_lines_have_not_all_come_waits() -> None:
    """The same kill with its last member's line (and the victim's reprint) still in the reader: the counters say
    two lines are owed, so nothing is published until they come, though the counters did move."""
    last = at(GROUP_LOG, "Killed process 160 (sh)")
    replay = Replay(live_settings(), now=100.0)
    replay.step(CgroupAdded(GROUP, 7, {"oom_kill": 0, "oom_group_kill": 0}, 1, True, PIDS))
    replay.step(CgroupChanged(GROUP, 7, {"max": 1, "oom": 1, "oom_kill": 6, "oom_group_kill": 1}, 1, True),
                now=100.0)
    replay.step(KernelLog(GROUP_LOG[:last], drained_at=100.01), now=100.01)
    replay.advance_to(100.5)
    assert replay.published == []
    replay.step(KernelLog(GROUP_LOG[last:], drained_at=100.6), now=100.6)
    assert [len(i.killed) for i in replay.published] == [5]


def test_a_group_kill_whose_oom_group_kill_has_not_moved_waits_for_the_quiet_window() -> None:
    """oom_kill matches the lines, but oom_group_kill (counted after the listing) was read before it moved: more
    members may be on their way, so the counters do not complete it; the quiet window does."""
    replay = Replay(live_settings(), now=100.0)
    replay.step(CgroupAdded(GROUP, 7, {"oom_kill": 0, "oom_group_kill": 0}, 1, True, PIDS))
    replay.step(CgroupChanged(GROUP, 7, {"max": 1, "oom": 1, "oom_kill": 6, "oom_group_kill": 0}, 1, True),
                now=100.0)
    replay.step(KernelLog(GROUP_LOG, drained_at=100.01), now=100.01)
    assert replay.published == []
    replay.advance_to(101.2)
    assert [i.kind for i in replay.published] == ["group"]


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
