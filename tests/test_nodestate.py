"""The node state on its own (oomwatch/nodestate.py): where each pid is, which cgroups kill as a group, the
hints memory.events gives the correlator, and the workload registry with labels that several cgroups share."""

from __future__ import annotations

import oomwatch.nodestate as nodestate_module
from oomwatch.model import Workload
from oomwatch.nodestate import OOM_HINT_SECONDS, NodeState, is_workload
from oomwatch.workloads import WorkloadResolver
from oomwatch.workloads.runtime import RuntimeNames


def node() -> NodeState:
    return NodeState(WorkloadResolver(RuntimeNames(read_files=False)))


def local(max_=0, oom=0, oom_kill=0, oom_group_kill=0) -> dict:
    return {"low": 0, "high": 0, "max": max_, "oom": oom, "oom_kill": oom_kill,
            "oom_group_kill": oom_group_kill}


def test_pids_from_snapshots_forks_and_execs() -> None:
    n = node()
    n.remember_pids("/b", (10, 11))
    assert n.cgroup_of_pid(10) == "/b" and n.cgroup_of_pid(99) is None
    n.process_forked(parent=10, parent_task=10, child=12)  # a child starts in its parent's cgroup
    assert n.cgroup_of_pid(12) == "/b"
    n.process_forked(parent=13, parent_task=10, child=14)  # runc's CLONE_PARENT: the parent task decides
    assert n.cgroup_of_pid(14) == "/b"
    n.remember_pids("/c", (15,))
    n.process_forked(parent=10, parent_task=10, child=15)  # a fork never overwrites what a snapshot saw
    assert n.cgroup_of_pid(15) == "/c"
    n.process_execd(15, "/b/moved")  # an exec: /proc said where it is now
    assert n.cgroup_of_pid(15) == "/b/moved"
    n.process_execd(16, None)  # gone before /proc could be read: nothing learnt
    assert n.cgroup_of_pid(16) is None


def test_a_removed_cgroup_forgets_its_pids_but_not_those_that_moved_away() -> None:
    n = node()
    n.remember_pids("/b", (10, 11))
    n.process_execd(11, "/c")
    n.cgroup_removed("/b")
    assert n.cgroup_of_pid(10) is None and n.cgroup_of_pid(11) == "/c"


def test_the_pid_map_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr(nodestate_module, "MAX_PIDS", 4)
    n = node()
    n.remember_pids("/b", (1, 2, 3))
    n.remember_pids("/c", (4, 5))  # would be 5: the map starts again
    assert [n.cgroup_of_pid(p) for p in (1, 2, 3, 4, 5)] == [None, None, None, "/c", "/c"]


def test_group_cgroups_by_the_flags_as_last_read() -> None:
    n = node()
    n.set_oom_group("/p", 1)
    n.set_oom_group("/p/c1", 0)
    n.set_oom_group("/p/c2", None)  # not read: the last reading stays
    assert n.is_grouped("/p/c1/x") and n.oom_group_cgroup("/p/c1", None) == "/p"
    assert n.oom_group_of("/p") == 1 and n.oom_group_of("/p/c2") is None
    n.set_oom_group("/p", 0)
    assert not n.is_grouped("/p/c1")


def test_counter_moves_are_hints_near_their_time() -> None:
    n = node()
    n.first_reading("/p", local(oom=1))
    assert n.counters_read("/p", local(oom=1), now=100.0) == {"max": False, "oom": False, "oom_kill": False,
                                                               "oom_group_kill": False}
    assert n.counters_read("/p", local(max_=3, oom=2), now=100.0)["oom"]
    n.first_reading("/p/c1", local())
    assert n.counters_read("/p/c1", local(oom_kill=1), now=100.2)["oom_kill"]
    n.first_reading("/p/c2", local())
    n.counters_read("/p/c2", local(oom_kill=1), now=104.0)
    # the deepest ancestor of the victim's cgroup whose `oom` moved near the kill
    assert n.oom_cgroup_hint("/p/c1/x", at=101.0) == "/p"
    assert n.oom_cgroup_hint("/p/c1/x", at=100.0 + OOM_HINT_SECONDS + 1) is None
    assert n.oom_cgroup_hint("/q", at=100.0) is None and n.oom_cgroup_hint(None, at=100.0) is None
    # the cgroup whose `oom_kill` moved nearest the kill, within the OOM cgroup
    assert n.victim_cgroup_hint("/p", at=100.3) == "/p/c1"
    assert n.victim_cgroup_hint("/p", at=103.5) == "/p/c2"
    assert n.victim_cgroup_hint("/q", at=100.3) is None
    n.cgroup_removed("/p/c1")  # its hints go with it
    assert n.victim_cgroup_hint("/p", at=100.3) == "/p/c2"


def test_labels_shared_by_cgroups_are_gone_only_with_the_last() -> None:
    n = node()
    labels = ("ml", "train-0", "trainer", "")
    assert n.set_workload("/k/ctr-a", labels) is None
    assert n.set_workload("/k/ctr-a", labels) == labels  # the same again: nothing changes
    n.set_workload("/k/ctr-b", labels)  # a restarted container: same names, another cgroup
    assert n.is_workload("/k/ctr-a") and n.is_workload("/k/ctr-b")
    assert n.cgroup_removed("/k/ctr-a") is None  # ctr-b still uses them
    assert n.cgroup_removed("/k/ctr-b") == labels
    assert n.cgroup_removed("/not-a-workload") is None
    assert n.set_workload("/k/pod", ("ml", "train-0", "", "")) is None
    assert n.set_workload("/k/pod", labels) == ("ml", "train-0", "", "")  # relabelled: returns the old ones
    assert n.workloads == {"/k/pod": labels}


def test_which_cgroups_are_workloads() -> None:
    def w(**kw) -> Workload:
        return Workload(**{"type": "other", "cgroup": "/x", **kw})

    assert not is_workload("/x", w(), None, False)
    assert is_workload("/x", w(), 1, False) and is_workload("/x", w(), 0, True)
    assert is_workload("/x", w(type="k8s-container"), None, False)
    assert is_workload("/x", w(type="systemd", unit="a.service"), None, False)
    assert not is_workload("/x", w(type="systemd", unit="a.slice"), None, False)
    assert not is_workload("/x/sub", w(), 1, True), "inside a workload, not its own"
    assert not is_workload("/x", w(type="k8s-container", sandbox=True), None, False)


def test_memory_events_moves_are_told_by_one_delta() -> None:
    """OomCounters: the cgroup source and the node state each keep one (on their own threads), the same rules."""
    from oomwatch.model import OomCounters

    counters = OomCounters()
    counters.first("/a", {"low": 7, "max": 3, "oom": 1, "oom_kill": 1})
    assert counters.read("/a", {"max": 4, "oom": 1, "oom_kill": 2, "oom_group_kill": 1}) == {
        "max": True, "oom": False, "oom_kill": True, "oom_group_kill": True}
    assert counters.last("/a", "oom_kill") == 2
    assert counters.read("/b", {"oom": 1}) == {"max": False, "oom": True, "oom_kill": False,
                                               "oom_group_kill": False}  # never read before: from 0
    counters.forget("/a")
    assert counters.last("/a", "oom_kill") is None
