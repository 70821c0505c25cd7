"""The OOM killer's lines, every format from 4.14 to 6.12, on real captured records and documented strings."""

from __future__ import annotations

from collections import Counter

import pytest

from oomwatch.model import (
    OomAlreadyExiting,
    OomGroup,
    OomInvoked,
    OomKilled,
    OomMemcgUsage,
    OomSelected,
    OomStackTask,
    OomSummary,
    OomSuppressed,
)
from oomwatch.parse.kmsg import parse_kmsg_record
from oomwatch.parse.oom import parse_oom_line
from tests.conftest import CAPTURES, raw_records

# What each real capture holds, counted with grep on the raw files.
EXPECTED = {
    "linux-6.1-memcg-scenarios": {"OomInvoked": 4, "OomStackTask": 4, "OomMemcgUsage": 4, "OomSummary": 4,
                                  "OomKilled": 12, "OomGroup": 3},
    "linux-6.1-global-oom-group": {"OomInvoked": 1, "OomStackTask": 1, "OomSummary": 1, "OomKilled": 3,
                                   "OomGroup": 1},
    "linux-6.1-runc-group-pidns": {"OomInvoked": 1, "OomStackTask": 1, "OomMemcgUsage": 1, "OomSummary": 1,
                                   "OomKilled": 3, "OomGroup": 1},
    "linux-6.1-storm-ratelimited": {"OomInvoked": 100, "OomStackTask": 100, "OomMemcgUsage": 100,
                                    "OomSummary": 100, "OomKilled": 450, "OomGroup": 150, "OomSuppressed": 9},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_record_of_each_capture_is_classified(name) -> None:
    lines = [parse_oom_line(parse_kmsg_record(raw).text) for raw in raw_records(CAPTURES / f"{name}.kmsg")]
    counts = Counter(type(x).__name__ for x in lines if x is not None)
    assert dict(counts) == EXPECTED[name]


def test_storm_suppressed_counts_sum_to_what_the_kernel_said() -> None:
    lines = [parse_oom_line(parse_kmsg_record(raw).text)
             for raw in raw_records(CAPTURES / "linux-6.1-storm-ratelimited.kmsg")]
    assert sum(x.count for x in lines if isinstance(x, OomSuppressed)) == 42


CASES = [
    ("python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
     OomInvoked(comm="python3", gfp_mask="0xcc0(GFP_KERNEL)", order=0, oom_score_adj=0)),
    ("python3 invoked oom-killer: gfp_mask=0x14000c0(GFP_KERNEL), nodemask=(null),  order=0, oom_score_adj=-998",
     OomInvoked(comm="python3", gfp_mask="0x14000c0(GFP_KERNEL)", order=0, oom_score_adj=-998)),
    ("CPU: 1 PID: 118 Comm: python3 Not tainted 6.1.0-56-amd64 #1  Debian 6.1.192-2",
     OomStackTask(pid=118, comm="python3")),
    ("CPU: 0 UID: 0 PID: 727 Comm: dd Tainted: G        W          6.12.57 #1", OomStackTask(pid=727, comm="dd")),
    ("memory: usage 65536kB, limit 65536kB, failcnt 739", OomMemcgUsage(usage_bytes=64 << 20, limit_bytes=64 << 20)),
    ("memory: usage 98304kB, limit 9007199254740988kB, failcnt 0",
     OomMemcgUsage(usage_bytes=96 << 20, limit_bytes=None)),
    ("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/p,task_memcg=/p/c1,"
     "task=python3,pid=132,uid=0",
     OomSummary(constraint="memcg", oom_cgroup="/p", task_cgroup="/p/c1", comm="python3", pid=132, uid=0)),
    ("oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0-1,3,global_oom,task_memcg=/e,"
     "task=my,odd,comm,pid=118,uid=1000",
     OomSummary(constraint="global", oom_cgroup="/", task_cgroup="/e", comm="my,odd,comm", pid=118, uid=1000)),
    ("oom-kill:constraint=CONSTRAINT_CPUSET,nodemask=0,cpuset=batch,mems_allowed=0,global_oom,task_memcg=/,"
     "task=x,pid=2,uid=0",
     OomSummary(constraint="cpuset", oom_cgroup="/", task_cgroup="/", comm="x", pid=2, uid=0)),
    ("oom-kill:constraint=CONSTRAINT_MEMORY_POLICY,nodemask=1,cpuset=/,mems_allowed=0-1,global_oom,task_memcg=/a,"
     "task=x,pid=3,uid=0",
     OomSummary(constraint="mempolicy", oom_cgroup="/", task_cgroup="/a", comm="x", pid=3, uid=0)),
    ("Task in /a/b killed as a result of limit of /a",
     OomSummary(constraint="memcg", oom_cgroup="/a", task_cgroup="/a/b", comm=None, pid=None, uid=None)),
    ("Memory cgroup out of memory: Killed process 118 (python3) total-vm:219732kB, anon-rss:64936kB, "
     "file-rss:880kB, shmem-rss:0kB, UID:0 pgtables:196kB oom_score_adj:0",
     OomKilled(pid=118, comm="python3", oom_kind="memcg", total_vm_bytes=219732 << 10, anon_rss_bytes=64936 << 10,
               file_rss_bytes=880 << 10, shmem_rss_bytes=0, uid=0, pgtables_bytes=196 << 10, oom_score_adj=0)),
    ("Out of memory: Killed process 9 (a (b) c) total-vm:1kB, anon-rss:2kB, file-rss:3kB, shmem-rss:4kB, "
     "UID:1000 pgtables:5kB oom_score_adj:-500",
     OomKilled(pid=9, comm="a (b) c", oom_kind="global", total_vm_bytes=1024, anon_rss_bytes=2048,
               file_rss_bytes=3072, shmem_rss_bytes=4096, uid=1000, pgtables_bytes=5120, oom_score_adj=-500)),
    ("Out of memory (oom_kill_allocating_task): Killed process 5 (x) total-vm:1kB, anon-rss:1kB, file-rss:0kB, "
     "shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0",
     OomKilled(pid=5, comm="x", oom_kind="global", total_vm_bytes=1024, anon_rss_bytes=1024, file_rss_bytes=0,
               shmem_rss_bytes=0, uid=0, pgtables_bytes=4096, oom_score_adj=0)),
    ("Killed process 4711 (python3) total-vm:219732kB, anon-rss:64936kB, file-rss:880kB, shmem-rss:0kB",
     OomKilled(pid=4711, comm="python3", oom_kind="unknown", total_vm_bytes=219732 << 10,
               anon_rss_bytes=64936 << 10, file_rss_bytes=880 << 10, shmem_rss_bytes=0)),
    ("Memory cgroup out of memory: Kill process 4711 (python3) score 1004 or sacrifice child",
     OomSelected(pid=4711, comm="python3", score=1004, oom_kind="memcg")),
    ("Tasks in /kubepods/burstable/pod1/abc are going to be killed due to memory.oom.group set",
     OomGroup(cgroup="/kubepods/burstable/pod1/abc")),
    ("Memory cgroup out of memory: OOM victim 724 (sleep) is already exiting. Skip killing the task",
     OomAlreadyExiting(pid=724, comm="sleep", oom_kind="memcg")),
    ("oom_kill_process: 7 callbacks suppressed", OomSuppressed(function="oom_kill_process", count=7)),
    # 3.10 (RHEL/CentOS 7): no shmem-rss; RHEL 7 prints `, UID U,` after the comm
    ("Killed process 2512 (java) total-vm:4529428kB, anon-rss:1021988kB, file-rss:0kB",
     OomKilled(pid=2512, comm="java", oom_kind="unknown", total_vm_bytes=4529428 << 10,
               anon_rss_bytes=1021988 << 10, file_rss_bytes=0)),
    ("Killed process 24591 (java), UID 1001, total-vm:9815928kB, anon-rss:4185028kB, file-rss:0kB, shmem-rss:0kB",
     OomKilled(pid=24591, comm="java", oom_kind="unknown", total_vm_bytes=9815928 << 10,
               anon_rss_bytes=4185028 << 10, file_rss_bytes=0, shmem_rss_bytes=0, uid=1001)),
    ("Killed process 21578, UID 503, (redis-server) total-vm:9100804kB, anon-rss:9066596kB, file-rss:64kB",
     OomKilled(pid=21578, comm="redis-server", oom_kind="unknown", total_vm_bytes=9100804 << 10,
               anon_rss_bytes=9066596 << 10, file_rss_bytes=64 << 10, uid=503)),  # RHEL 6 (2.6.32)
    ("Out of memory: Kill process 2512 (java) score 929 or sacrifice child",
     OomSelected(pid=2512, comm="java", score=929, oom_kind="global")),
    ("Out of memory (oom_kill_allocating_task): Kill process 77 (stress) score 0 or sacrifice child",
     OomSelected(pid=77, comm="stress", score=0, oom_kind="global")),
    ("java invoked oom-killer: gfp_mask=0x201da, order=0, oom_score_adj=0",
     OomInvoked(comm="java", gfp_mask="0x201da", order=0, oom_score_adj=0)),
    ("java invoked oom-killer: gfp_mask=0x201da, order=0, oom_adj=0, oom_score_adj=0",
     OomInvoked(comm="java", gfp_mask="0x201da", order=0, oom_score_adj=0)),
    # sysrq-f: `sysrq: Manual OOM execution` then the OOM killer invoked by a kworker with order=-1
    ("kworker/0:1 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=-1, oom_score_adj=0",
     OomInvoked(comm="kworker/0:1", gfp_mask="0xcc0(GFP_KERNEL)", order=-1, oom_score_adj=0)),
    ("Task in /kubepods/burstable/pod6a1b/4f2a killed as a result of limit of /kubepods/burstable/pod6a1b/4f2a",
     OomSummary(constraint="memcg", oom_cgroup="/kubepods/burstable/pod6a1b/4f2a",
                task_cgroup="/kubepods/burstable/pod6a1b/4f2a", comm=None, pid=None, uid=None)),
    # 4.19: the summary has no constraint= yet
    ("oom-kill:nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/p,task_memcg=/p/c,task=x,pid=7,uid=0",
     OomSummary(constraint="memcg", oom_cgroup="/p", task_cgroup="/p/c", comm="x", pid=7, uid=0)),
    ("oom-kill:nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/,task=x,pid=7,uid=0",
     OomSummary(constraint="global", oom_cgroup="/", task_cgroup="/", comm="x", pid=7, uid=0)),
    # a newline in a comm, as the kernel escapes it (\x0a) and as /dev/kmsg gives it back once unescaped
    ("Memory cgroup out of memory: Killed process 9 (a\nb) total-vm:1kB, anon-rss:1kB, file-rss:0kB, "
     "shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0",
     OomKilled(pid=9, comm="a\nb", oom_kind="memcg", total_vm_bytes=1024, anon_rss_bytes=1024, file_rss_bytes=0,
               shmem_rss_bytes=0, uid=0, pgtables_bytes=4096, oom_score_adj=0)),
]


@pytest.mark.parametrize("text,expected", CASES, ids=[c[0][:40] for c in CASES])
def test_each_kernel_format(text, expected) -> None:
    assert parse_oom_line(text) == expected


@pytest.mark.parametrize("text", [
    "net_ratelimit: 3 callbacks suppressed",
    "CPU: 0 PID: 1 at kernel/foo.c:12 bar+0x1/0x2",
    "Killed process",
    "Memory cgroup out of memory: Killed process abc (x) total-vm:",
    "oom-kill:constraint=garbled",
    "Tasks state (memory values in pages):",
    "",
    "memory: usage lots",
    # beyond what a kernel can print: a comm over 64 characters, numbers over 20 digits, paths over PATH_MAX
    "Out of memory: Killed process 1 (" + "(" * 100 + ") total-vm:1kB, anon-rss:1kB, file-rss:0kB",
    "Out of memory: Killed process " + "9" * 5000 + " (x) total-vm:1kB, anon-rss:1kB, file-rss:0kB",
    "Tasks in /" + "a" * 5000 + " are going to be killed due to memory.oom.group set",
    "Task in /a killed as a result of limit of ",
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),task=x,pid=1,uid=0",
])
def test_non_oom_and_truncated_lines_are_not_oom_records(text) -> None:
    assert parse_oom_line(text) is None


def kills_and_cgroups(path) -> list[tuple]:
    import datetime as dt

    from oomwatch.config import Config
    from oomwatch.inspect import build_report

    report = build_report(Config(kmsg=str(path), boot_time=0.0), node_view=False, clock=lambda: 0.0,
                          tz=dt.timezone.utc)
    assert report["kmsg"]["parse_errors"] == 0 and report["warnings"] == []
    return [(i["kind"], i["constraint"], i["oom_cgroup"], [(p["pid"], p["comm"], p["cgroup"], p["uid"])
                                                          for p in i["killed"]]) for i in report["incidents"]]


def test_3_10_task_in_line_gives_both_cgroups() -> None:
    """RHEL 7: `Task in <victim memcg> killed as a result of limit of <memcg>` is the only place the kernel
    names the cgroups."""
    assert kills_and_cgroups(CAPTURES / "documented-3.10-rhel7-memcg-kubepods.log") == [
        ("single", "memcg", "/kubepods/burstable/pod0330b2c1",
         [(21284, "java", "/kubepods/burstable/pod0330b2c1/b27201334a41", 1337)])]


def test_sysrq_manual_oom() -> None:
    assert kills_and_cgroups(CAPTURES / "documented-5.10-sysrq-manual.dmesg") == [
        ("single", "global", "/", [(812, "postgres", "/system.slice/postgresql.service", 106)])]


def test_oom_kill_allocating_task_kill_is_read() -> None:
    """The kind of OOM is on the `Kill process` line only (before 5.1 the kill line has no prefix): which
    constraint the incident gets is the correlator's (tests/pending_correlator_cases.py)."""
    ((kind, _, _, killed),) = kills_and_cgroups(CAPTURES / "documented-3.10-oom-kill-allocating-task.dmesg")
    assert (kind, killed) == ("single", [(2291, "stress", None, None)])


# --- issue 20, item 6: lines pasted from the wild ----------------------------------------------------------

def test_the_oom_reaper_line_names_a_killed_process() -> None:
    from oomwatch.parse.oom import OomReaped

    line = "oom_reaper: reaped process 1811 (stress-ng), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB"
    assert parse_oom_line(line) == OomReaped(pid=1811, comm="stress-ng")
    assert parse_oom_line("oom_reaper: started") is None


def test_a_summary_without_constraint_and_nodemask_keeps_its_cgroups() -> None:
    line = parse_oom_line("oom-kill:,cpuset=docker-1.scope,mems_allowed=0,oom_memcg=/docker/1,task_memcg=/docker/1/a,"
                          "task=java,pid=12,uid=0")
    assert (line.constraint, line.oom_cgroup, line.task_cgroup, line.comm, line.pid) == (
        "memcg", "/docker/1", "/docker/1/a", "java", 12)


@pytest.mark.parametrize("width", [60, 80, 132])
def test_a_line_a_terminal_wrapped_and_a_paste_rejoined_with_spaces_is_read(width: int) -> None:
    """Each row padded to the terminal's width and joined with the next: runs of spaces inside words and
    numbers, and where the break fell on a real space, a run that stands for one."""
    cg = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7f3c.slice/cri-containerd-9e8d.scope"
    summary = (f"oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg={cg},"
               f"task_memcg={cg},task=python3,pid=4242,uid=1000")
    kill = ("Memory cgroup out of memory: Killed process 4242 (python3) total-vm:1262148kB, anon-rss:521764kB, "
            "file-rss:11432kB, shmem-rss:0kB, UID:1000 pgtables:1264kB oom_score_adj:937")
    for line in (summary, kill):
        full = "[ 5512.301190] " + line
        rows = [full[i:i + width].rstrip(" ") for i in range(0, len(full), width)]
        pasted = "     ".join(rows)[len("[ 5512.301190] "):]
        assert "  " in pasted
        assert parse_oom_line(pasted) == parse_oom_line(line), pasted
    assert parse_oom_line("Killed process 1 (a)      b) total-vm:") is None


def test_re_reading_a_wrapped_line_stays_cheap_on_hostile_lines() -> None:
    """Each run of spaces doubles the readings tried: a 64 KiB line of six runs cost 5 ms (2^6 parses)."""
    import time

    line = "Tasks in " + "/a  " * 6 + "q" * 65000
    started = time.perf_counter()
    for _ in range(50):
        assert parse_oom_line(line) is None
    assert (time.perf_counter() - started) / 50 < 0.002  # 2 ms a line even on a busy machine
