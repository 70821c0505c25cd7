"""The witness queue on its own (oomwatch/witness.py): a group kill waits for the proc connector's exits, what
follows it waits its turn, and the processes that died by SIGKILL in its group cgroup without a line are
named."""

from __future__ import annotations

from dataclasses import replace

from oomwatch.model import Incident, KilledProcess, Workload
from oomwatch.witness import SIGKILL, WitnessQueue


def incident(kind: str, seq: int, at: float, pids: tuple[int, ...] = (1,), group: str = "/b") -> Incident:
    killed = tuple(KilledProcess(pid=p, comm="x", cgroup=group) for p in pids)
    return Incident(time=at, boot_id="b", kernel_seq=seq, kind=kind, constraint="memcg", scope="cgroup",
                    oom_cgroup=group, group_cgroup=group if kind == "group" else None, trigger=None,
                    memory=None, victim=killed[0], killed=killed, workload=Workload(type="other", cgroup=group),
                    explanation="before", detected_at=at)


def queue(wait: float = 0.5) -> WitnessQueue:
    return WitnessQueue(explain=lambda i: f"{len(i.died_with)} died with it", wait=wait)


def test_a_single_kill_is_due_at_once_and_a_group_kill_after_its_wait() -> None:
    q = queue()
    q.add([incident("single", 10, 100.0)], now=100.0)
    assert q.next_due() == 100.0
    assert [i.kernel_seq for i in q.due(100.0)] == [10] and len(q) == 0 and q.next_due() is None
    q.add([incident("group", 20, 101.0, (5, 6))], now=101.0)
    assert q.next_due() == 101.5 and q.pending_since_seq() == 20
    assert q.due(101.4) == []
    assert [i.kernel_seq for i in q.due(101.5)] == [20] and q.pending_since_seq() is None


def test_what_follows_a_group_kill_waits_its_turn() -> None:
    q = queue()
    q.add([incident("group", 20, 101.0, (5, 6)), incident("single", 30, 101.1)], now=101.0)
    q.add([incident("single", 40, 101.2)], now=101.2)
    assert q.due(101.3) == [], "the single kills may not overtake the group kill"
    assert q.pending_since_seq() == 20 and len(q) == 3
    assert [i.kernel_seq for i in q.due(101.5)] == [20, 30, 40]


def test_everything_is_due_at_a_stop() -> None:
    q = queue()
    q.add([incident("group", 20, 101.0, (5, 6))], now=101.0)
    assert [i.kernel_seq for i in q.due(101.0, everything=True)] == [20]


def test_sigkilled_processes_of_the_group_cgroup_are_named_once_and_explained() -> None:
    q = queue()
    q.exited(7, "/b/worker", 100.9)  # in the group cgroup's subtree: a witness
    q.exited(5, "/b", 100.9)  # killed with a line already: not again
    q.exited(8, "/c", 100.9)  # another cgroup
    q.exited(9, None, 100.9)  # never seen in a cgroup
    q.exited(10, "/b", 98.0)  # died long before the kill
    q.add([incident("group", 20, 101.0, (5, 6))], now=101.0)
    (out,) = q.due(101.5)
    assert out.died_with == ({"pid": 7, "cgroup": "/b/worker", "signal": SIGKILL},)
    assert out.explanation == "1 died with it"


def test_no_witnesses_for_a_single_kill_or_a_listing_cut_short() -> None:
    q = queue()
    q.exited(7, "/b", 100.9)
    cut = replace(incident("group", 20, 101.0, (5, 6)), killed_count=5000)  # does not say who else died
    q.add([incident("single", 10, 101.0), cut], now=101.0)
    single, group = q.due(102.0)
    assert single.died_with == () and group.died_with == () and group.explanation == "before"


def test_without_a_connector_nothing_waits() -> None:
    q = queue(wait=0.0)
    q.add([incident("group", 20, 101.0, (5, 6))], now=101.0)
    assert [i.kernel_seq for i in q.due(101.0)] == [20]
