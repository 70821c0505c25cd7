"""Classification that survives lost lines: the real storm capture (150 group kills on Linux 6.1) with the lines
a wrapped ring buffer or the kernel's ratelimit can take away, and a node view that knows what the agent
knows before a kill (memory.oom.group flags, and the pids it saw in cgroup.procs)."""

from __future__ import annotations

import re
from typing import Optional

from oomwatch.model import KmsgRecord
from tests.conftest import make_correlator
from oomwatch.parse.kmsg import parse_text_log
from oomwatch.parse.prefilter import could_be_oom
from oomwatch.parse.oom import parse_oom_line
from oomwatch.workloads import WorkloadResolver
from tests.conftest import CAPTURES

STORM = CAPTURES / "linux-6.1-storm-ratelimited.kmsg"


class KnownNode:
    """What the agent knew: every /storm/cNN has memory.oom.group=1; pids as cgroup.procs showed them."""

    def __init__(self, pids: dict[int, str], oom_group: set[str]) -> None:
        self.pids, self.oom_group = pids, oom_group

    def cgroup_of_pid(self, pid: int) -> Optional[str]:
        return self.pids.get(pid)

    def oom_group_cgroup(self, cgroup: str, within: Optional[str]) -> Optional[str]:
        found, path = None, cgroup
        while path and path != "/":
            if path in self.oom_group:
                found = path
            if path == within:
                break
            path = path.rsplit("/", 1)[0] or "/"
        return found

    def oom_cgroup_hint(self, victim_cgroup, at):
        return None

    def victim_cgroup_hint(self, oom_cgroup, at):
        return None


def storm_records() -> list[KmsgRecord]:
    with open(STORM, "rb") as f:
        return list(parse_text_log(f))


def storm_truth(records: list[KmsgRecord]) -> tuple[dict[int, str], list[str]]:
    """pid → cgroup (what cgroup.procs showed the agent before the kills) and the group cgroup of each of the
    150 kills in order, from the complete capture (tests/test_correlator.py checks that reading against the
    same boot's memory.events)."""
    complete = correlate(records, None)
    assert len(complete) == 150
    pids = {p.pid: i.group_cgroup for i in complete for p in i.killed}
    return pids, [i.group_cgroup for i in complete]


def correlate(records, view):
    correlator = make_correlator(boot_id="t", boot_time=0.0, resolver=WorkloadResolver(),
                                 posture_single=lambda: "false", view=view)
    out = []
    for r in records:
        out += correlator.feed(r)
    return out + correlator.flush()


def test_storm_without_any_tasks_in_line_is_still_150_group_kills_in_the_right_cgroups() -> None:
    records = storm_records()
    pids, groups = storm_truth(records)
    view = KnownNode(pids, set(groups))
    lossy = [r for r in records if not r.text.startswith("Tasks in ")]
    incidents = correlate(lossy, view)
    assert len(incidents) == 150
    assert [i.kind for i in incidents] == ["group"] * 150
    assert [i.group_cgroup for i in incidents] == groups
    assert all(i.group_inferred for i in incidents)
    assert all(len(i.killed) == 2 for i in incidents)  # the victim and its cgroup's sleep


def test_storm_without_summaries_headers_or_tasks_in_lines_keeps_every_kind() -> None:
    """Only the `Killed process` lines are left (the kernel never ratelimits them)."""
    records = storm_records()
    pids, groups = storm_truth(records)
    only_kills = [r for r in records if "Killed process" in r.text]
    incidents = correlate(only_kills, KnownNode(pids, set(groups)))
    assert [i.kind for i in incidents] == ["group"] * 150
    assert [i.group_cgroup for i in incidents] == groups


def test_a_reprinted_victim_makes_a_group_kill_without_any_node_knowledge() -> None:
    """Only group listings print a pid twice: with the `Tasks in` line lost and nothing known of the cgroups,
    a victim reprinted right after its kill line is still a group kill."""
    lines = [KmsgRecord(priority=3, seq=n, usec=n, text=t) for n, t in enumerate([
        "Memory cgroup out of memory: Killed process 10 (dd) total-vm:1kB, anon-rss:1kB, file-rss:0kB, "
        "shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0",
        "Memory cgroup out of memory: Killed process 10 (dd) total-vm:1kB, anon-rss:1kB, file-rss:0kB, "
        "shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0",
    ])]
    incidents = correlate(lines, None)
    assert [(i.kind, i.group_inferred, dict(i.kill_lines)) for i in incidents] == [("group", True, {"": 2})]


def test_kill_lines_are_counted_as_the_kernel_counts_them() -> None:
    """memory.events oom_kill counts the victim's reprint: the incident's kill_lines say so."""
    records = storm_records()
    pids, groups = storm_truth(records)
    incidents = correlate(records, KnownNode(pids, set(groups)))
    assert all(dict(i.kill_lines)[i.group_cgroup] == 3 for i in incidents)


def test_forged_userspace_oom_lines_are_rejected() -> None:
    """Facility user (priority 12: what `echo … > /dev/kmsg` produces) cannot report a kill."""
    forged = KmsgRecord(priority=12, seq=1, usec=1, text=(
        "Memory cgroup out of memory: Killed process 999 (evil) total-vm:1kB, anon-rss:1kB, file-rss:0kB, "
        "shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0"))
    correlator = make_correlator(boot_id="t", boot_time=0.0, resolver=WorkloadResolver(),
                                 posture_single=lambda: "false")
    assert correlator.feed(forged) == [] and correlator.flush() == []
    assert correlator.stats.rejected == 1 and "Killed process 999" in correlator.stats.first_rejected
    kernel = KmsgRecord(priority=3, seq=2, usec=2, text=forged.text)
    correlator.feed(kernel)
    assert len(correlator.flush()) == 1


def test_prefilter_keeps_every_oom_line_of_every_capture() -> None:
    """The bytes pre-filter may skip a record only if the OOM parser would ignore it."""
    kept = skipped = 0
    for path in sorted(CAPTURES.glob("*.kmsg")):
        for raw in path.read_bytes().splitlines():
            if not re.match(rb"^\d+,\d+,\d+,", raw):
                continue
            text = raw.partition(b";")[2].decode("utf-8", "replace")
            if could_be_oom(raw):
                kept += 1
            else:
                skipped += 1
                assert parse_oom_line(text) is None, text
    assert kept and skipped > 3 * kept, (kept, skipped)  # most of a report is not OOM lines


def test_prefilter_keeps_every_oom_line_of_the_corpus() -> None:
    """Every line of the corpus of real reports that parses as an OOM line passes the pre-filter in its raw
    kmsg form (`6,1,1,-;<text>`)."""
    from tests.conftest import FIXTURES

    checked = 0
    for path in sorted((FIXTURES / "corpus").glob("*")) + sorted(CAPTURES.glob("*")):
        if path.suffix == ".md" or not path.is_file():
            continue
        for line in path.read_bytes().splitlines():
            text = line.decode("utf-8", "replace")
            for candidate in {text, text.partition(";")[2], re.sub(r"^.*?\] ", "", text)}:
                if candidate and parse_oom_line(candidate) is not None:
                    checked += 1
                    assert could_be_oom(b"6,1,1,-;" + candidate.encode()), candidate
    assert checked > 500


def test_an_incident_that_begins_after_lost_records_is_marked_partial() -> None:
    """The ring wrapped in the middle of a report: its first `Killed process` line (the victim's) is gone."""
    correlator = make_correlator(boot_id="t", boot_time=0.0, resolver=WorkloadResolver(),
                                 posture_single=lambda: "false")
    kill = ("Memory cgroup out of memory: Killed process {} ({}) total-vm:1kB, anon-rss:1kB, file-rss:0kB, "
            "shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0")
    correlator.lost(40)
    out = []
    for n, text in enumerate(["Tasks in /c are going to be killed due to memory.oom.group set",
                              kill.format(273, "sleep"), kill.format(303, "dd")]):
        out += correlator.feed(KmsgRecord(priority=3, seq=100 + n, usec=n, text=text))
    out += correlator.feed(KmsgRecord(priority=6, seq=200, usec=9, text=(
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/d,"
        "task_memcg=/d,task=dd,pid=400,uid=0")))
    out += correlator.feed(KmsgRecord(priority=3, seq=201, usec=10, text=kill.format(400, "dd")))
    out += correlator.flush()
    assert [(i.kind, i.partial) for i in out] == [("group", True), ("single", False)]
    assert out[0].to_json()["partial"] is True and "lost the start of this report" in out[0].explanation
    assert "partial" not in out[1].to_json()
