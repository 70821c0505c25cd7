"""A group kill whose listing is printed slowly stays one incident (seen on the real 6.1 kernel, under TCG with the
host busy: fixtures/kmsg/linux-6.1-slow-group-listing.kmsg). The members came 0.1 s apart in kernel time and later
still to the reader; taken as complete after 0.25 s of quiet, the listing was split and a member became the
victim of a second incident. While a listing is open the pipeline waits longer (Settings.quiet_listing)."""

from __future__ import annotations

from oomwatch.events import CgroupAdded, KernelLog
from tests.conftest import CAPTURES, raw_records
from tests.replay import Replay, kmsg_records, live_settings

RECORDS = kmsg_records(raw_records(CAPTURES / "linux-6.1-slow-group-listing.kmsg"))
GROUP = next(r.text for r in RECORDS if r.text.startswith("Tasks in ")).split()[2]


def test_a_slow_listing_is_one_incident() -> None:
    up_to_sh = next(i for i, r in enumerate(RECORDS) if "Killed process 153 (sh)" in r.text) + 1
    replay = Replay(live_settings(), now=100.0)
    replay.step(CgroupAdded(GROUP, 7, None, 1, True, (153, 158, 159, 160, 162)))
    replay.step(KernelLog(RECORDS[:up_to_sh], drained_at=100.0), now=100.0)
    # The rest reaches the reader 0.4 s later: more than the quiet window of a single kill.
    replay.advance_to(100.4)
    assert replay.published == []
    replay.step(KernelLog(RECORDS[up_to_sh:], drained_at=100.4), now=100.4)
    replay.advance_to(102.0)
    (incident,) = replay.published
    assert incident.kind == "group" and incident.victim.pid == 162
    assert sorted(p.pid for p in incident.killed) == [153, 158, 159, 160, 162]


def test_a_single_kill_is_still_published_after_the_short_quiet_window() -> None:
    """The longer wait is only for an open group listing: a single kill goes out 0.25 s after its line."""
    scenarios = kmsg_records(raw_records(CAPTURES / "linux-6.1-memcg-scenarios.kmsg"))  # first: a single kill
    first_single = next(i for i, r in enumerate(scenarios) if "Killed process 118" in r.text)
    replay = Replay(live_settings(), now=100.0)
    replay.step(KernelLog(scenarios[:first_single + 1], drained_at=100.0), now=100.0)
    replay.advance_to(100.3)
    assert [(i.kind, i.victim.pid) for i in replay.published] == [("single", 118)]


def test_a_report_whose_kills_memory_events_counted_is_not_taken_as_complete_early() -> None:
    """memory.events counts each kill before the kernel prints its line, and the cgroup watcher can be ahead of the
    log's reader: while the counters say a report's cgroup lost more processes than its lines so far show, the
    pipeline waits the longer quiet window (here the victim's line came, the `Tasks in` line and the member's were
    still on their way)."""
    victim = next(i for i, r in enumerate(RECORDS) if "Killed process 162 (dd)" in r.text)
    boot = 100.0 - RECORDS[victim].usec / 1e6  # the kill happened at 100.0, as the counters' readings say
    replay = Replay(live_settings(boot_time=boot), now=99.0)
    replay.step(CgroupAdded(GROUP, 7, {"oom_kill": 0, "oom_group_kill": 0}, 1, True, (153, 158, 159, 160, 162)))
    replay.step(KernelLog(RECORDS[:victim + 1], drained_at=100.0), now=100.0)
    # The counters of the whole group kill (6 lines: the victim twice; 1 group kill) are read before the rest of
    # its lines.
    from oomwatch.events import CgroupChanged

    replay.step(CgroupChanged(GROUP, 7, {"max": 1, "oom": 1, "oom_kill": 6, "oom_group_kill": 1}, 1, True),
                now=100.1)
    replay.advance_to(100.6)
    assert replay.published == []  # 0.6 s of quiet, but four counted lines have not come
    replay.step(KernelLog(RECORDS[victim + 1:], drained_at=100.6), now=100.6)
    replay.advance_to(103.0)
    assert [(i.evidence, i.kind, i.victim.pid, len(i.killed)) for i in replay.published] == [
        ("kmsg", "group", 162, 5)]  # and nothing counted from memory.events: the lines account for every kill
