"""memory.events as the count of record: the reconciler against logged incidents, lost records, restarts."""

from __future__ import annotations

from oomwatch.model import Incident, KilledProcess, Workload
from oomwatch.reconcile import Reconciler, counted_incident
from oomwatch.workloads import WorkloadResolver, scope_of

C = "/kubepods/burstable/pod0b0c6b3e-9d55-4a52-8f0e-0d2b1c3a4e5f/4f2a9c1e7b3d5a6c8e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d"


def make(**kw) -> Incident:
    return counted_incident(boot_id="b", detected_at=kw["window"][1], resolve=WorkloadResolver().resolve,
                            scope_of=scope_of, explain=lambda i: "x", **kw)


def logged(kind: str, cgroup: str, lines: int, at: float) -> Incident:
    victim = KilledProcess(pid=1, comm="dd", cgroup=cgroup)
    return Incident(time=at, boot_id="b", kernel_seq=1, kind=kind, constraint="memcg", scope="container",
                    oom_cgroup=cgroup, group_cgroup=cgroup if kind == "group" else None, trigger=None,
                    memory=None, victim=victim, killed=(victim,), workload=Workload(type="other", cgroup=cgroup),
                    explanation="", detected_at=at, kill_lines=((cgroup, lines),))


def counters(kill: int, group: int) -> dict[str, int]:
    return {"max": 9, "oom": 1, "oom_kill": kill, "oom_group_kill": group}


def test_logged_kills_leave_nothing_to_add() -> None:
    r = Reconciler(make)
    r.observe(C, 7, counters(0, 0), now=100.0)
    r.observe(C, 7, counters(3, 1), now=101.0)
    r.account(logged("group", C, 3, at=101.0))
    assert not r.pending()
    assert r.reconcile(now=110.0, log_drained_at=110.0) == []


def test_kills_no_record_describes_become_counted_incidents_once_the_log_was_read_past_them() -> None:
    r = Reconciler(make, settle=1.0)
    r.observe(C, 7, counters(0, 0), now=100.0)
    r.observe(C, 7, counters(6, 2), now=101.0)  # two group kills, their lines overwritten before being read
    assert r.pending()
    assert r.reconcile(now=101.0, log_drained_at=101.0) == [], "not before the log was drained after settle"
    assert r.reconcile(now=102.5, log_drained_at=101.5) == [], "drained, but too soon after"
    out = r.reconcile(now=103.0, log_drained_at=102.2)
    assert [(i.kind, i.evidence, i.group_cgroup, i.victim, i.killed) for i in out] == \
        [("group", "memory.events", C, None, ())] * 2
    assert [i.workload.container_id for i in out] == [C.rsplit("/", 1)[1]] * 2
    assert out[0].window_start == 100.0 and out[0].time == 103.0
    assert out[0].key != out[1].key
    assert r.reconcile(now=200.0, log_drained_at=200.0) == [], "never twice"


def test_a_single_kill_without_lines_is_a_single_kill() -> None:
    r = Reconciler(make, settle=0.0)
    r.observe("/system.slice/a.service", 3, counters(0, 0), now=1.0)
    r.observe("/system.slice/a.service", 3, counters(1, 0), now=2.0)
    out = r.reconcile(now=3.0, log_drained_at=3.0)
    assert [(i.kind, i.workload.unit) for i in out] == [("single", "a.service")]


def test_accounts_survive_a_restart_and_count_the_downtime_once() -> None:
    r = Reconciler(make, settle=0.0)
    r.observe(C, 7, counters(3, 1), now=1.0)  # first seen after one kill: not ours
    r.observe(C, 7, counters(6, 2), now=2.0)
    r.account(logged("group", C, 3, at=2.0))
    saved = r.to_state()
    again = Reconciler(make, settle=0.0)
    again.load_state(saved)
    again.observe(C, 7, counters(12, 4), now=50.0)  # two kills while the agent was down, their records lost
    out = again.reconcile(now=51.0, log_drained_at=51.0)
    assert [i.kind for i in out] == ["group", "group"]
    assert again.reconcile(now=52.0, log_drained_at=52.0) == []


def test_a_cgroup_made_again_under_the_same_path_starts_anew() -> None:
    r = Reconciler(make, settle=0.0)
    r.observe("/system.slice/a.service", 3, counters(5, 0), now=1.0)
    r.observe("/system.slice/a.service", 4, counters(0, 0), now=2.0)  # restarted unit: new inode, zeros
    assert r.reconcile(now=3.0, log_drained_at=3.0) == []


def test_lines_placed_in_an_ancestor_cover_its_descendants() -> None:
    """A member whose own cgroup was unknown is placed in the group cgroup; the kernel counted it below."""
    r = Reconciler(make, settle=0.0)
    for path in ("/pod", "/pod/c1", "/pod/c2"):
        r.observe(path, 1, counters(0, 0), now=1.0)
    r.observe("/pod", 1, counters(0, 1), now=2.0)
    r.observe("/pod/c1", 1, counters(2, 0), now=2.0)
    r.observe("/pod/c2", 1, counters(1, 0), now=2.0)
    pod_kill = logged("group", "/pod", 0, at=2.0)
    from dataclasses import replace

    r.account(replace(pod_kill, kill_lines=(("/pod/c1", 2), ("/pod", 1))))
    assert r.reconcile(now=3.0, log_drained_at=3.0) == []


def test_a_kernel_without_oom_group_kill_is_said() -> None:
    r = Reconciler(make)
    r.observe("/a", 1, {"oom": 0, "oom_kill": 0}, now=1.0)
    assert r.stats.missing_group_counter and "5.17" in r.stats.notes[0]


def test_inspect_finds_the_kills_the_ring_no_longer_describes() -> None:
    from oomwatch.reconcile import counted_since_creation

    readings = {C: (7, counters(6, 2), True), "/system.slice/a.service": (3, counters(1, 0), False),
                "/quiet": (4, counters(0, 0), False)}
    r = counted_since_creation(readings, make, since=100.0)
    r.account(logged("group", C, 3, at=500.0))  # the newer of C's two group kills is still in the ring
    out = r.reconcile(1000.0, log_drained_at=1000.0)
    assert sorted((i.kind, i.workload.type) for i in out) == [("group", "k8s-container"), ("single", "systemd")]
    assert all(i.window_start == 100.0 and i.time == 1000.0 for i in out)


def test_lines_left_in_a_grouped_cgroup_are_not_single_kills() -> None:
    """A group kill whose first line (the victim's) was overwritten: its reprint and members were logged, one
    line short of what the kernel counted. With memory.oom.group=1 every kill there is a group kill, and
    oom_group_kill says all of them are accounted for: the line left over is not a single kill."""
    r = Reconciler(make, settle=0.0)
    r.observe(C, 7, counters(0, 0), now=1.0, grouped=True)
    r.observe(C, 7, counters(3, 1), now=2.0, grouped=True)
    r.account(logged("group", C, 2, at=2.0))
    assert r.reconcile(now=3.0, log_drained_at=3.0) == []
    assert not r.pending()
