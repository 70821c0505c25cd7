"""Who may create a cgroup decides whether it is a workload of its own (issue 31, item 1). A subtree delegated to a
user (its directory owned by another uid than the cgroup root's: `user@UID.service`, rootless runtimes,
`systemd-run --user --scope`) is one workload at its delegation root, unless the operator trusts delegated
subtrees; either way the workload cap keeps room for the kubelet's, Slurm's and root's workloads. A logged-in user
with 20,000 hostile scopes used to push a pod created afterwards out of /metrics and make /healthz 503."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oomwatch.agent import health_of
from oomwatch.events import CgroupAdded, KernelLog
from oomwatch.store import MAX_WORKLOADS, Store
from oomwatch.workloads import WorkloadResolver
from tests.test_agent_health import agent
from oomwatch.workloads.runtime import RuntimeNames
from tests.replay import Replay, live_settings, tree_events

USER = "/user.slice/user-1000.slice/user@1000.service"
POD = "/kubepods/burstable/pod0f0e0d0c-0000-4000-8000-000000000001"
CONTAINER = f"{POD}/{'c' * 64}"


def added(path: str, owner: int, limited: bool = True) -> CgroupAdded:
    return CgroupAdded(path, None, None, 0, limited, (), owner=owner)


def node(hostile: int, *, trust: bool = False, max_workloads: int = MAX_WORKLOADS) -> Replay:
    """A node on which user 1000 made `hostile` scopes (each with a memory limit, names of its choosing) under its
    user manager, then a pod started."""
    resolver = WorkloadResolver(RuntimeNames(read_files=False), trust_delegated=trust)
    replay = Replay(live_settings(counting=False), store=Store(max_workloads=max_workloads), resolver=resolver,
                    now=100.0)
    replay.run([added("/", 0, False), added("/user.slice", 0, False), added("/user.slice/user-1000.slice", 0, False),
                added(USER, 1000, False), added(f"{USER}/app.slice", 1000, False)])
    replay.run(added(f"{USER}/app.slice/x\u202e{i}.scope", 1000) for i in range(hostile))
    replay.run([added("/kubepods", 0, False), added("/kubepods/burstable", 0, False), added(POD, 0),
                added(CONTAINER, 0), KernelLog([], drained_at=100.0)])  # (a kernel log with nothing in it)
    return replay


def exported(replay: Replay) -> list[str]:
    return [path for path, _, _ in replay.pipeline.view().workloads]


def healthz(replay: Replay) -> tuple[bool, dict]:
    return health_of(agent(view=replay.pipeline.view()))


def test_20000_hostile_cgroups_of_one_user_are_one_workload_and_a_later_pod_is_exported() -> None:
    replay = node(20_000)
    assert exported(replay) == [USER, POD, CONTAINER]
    assert replay.pipeline.view().workloads_over_cap == 0
    assert healthz(replay) == (True, {"kmsg": "ok", "cgroups": "ok"})


def test_a_kill_in_a_delegated_subtree_is_its_delegation_roots() -> None:
    replay = node(3)
    workload = replay.pipeline.resolver.resolve(f"{USER}/app.slice/x\u202e1.scope/deeper")
    assert (workload.type, workload.cgroup, workload.unit) == ("systemd", USER, "user@1000.service")
    assert replay.pipeline.node.workload_of(f"{USER}/app.slice/x\u202e1.scope") == USER
    # root's own units and the kubelet's cgroups stay one workload each
    assert replay.pipeline.resolver.resolve("/system.slice/cron.service").cgroup == "/system.slice/cron.service"
    assert replay.pipeline.resolver.resolve(CONTAINER).cgroup == CONTAINER


def test_trusted_delegation_gives_each_unit_its_series_but_keeps_room_for_the_others() -> None:
    """With --trust-delegated-cgroups each user scope is a workload, but the user's scopes cannot take the room kept
    for the rest (a quarter of the cap): the pod that starts after them is exported."""
    replay = node(200, trust=True, max_workloads=100)
    paths = exported(replay)
    assert paths[-2:] == [POD, CONTAINER]
    assert len([p for p in paths if p.startswith(USER)]) == 75  # 100 less the room kept (25)
    assert replay.pipeline.view().workloads_over_cap == 200 + 1 - 75  # (the user manager and its scopes)


def test_a_user_manager_in_a_user_namespace_is_told_by_the_root_owner() -> None:
    """An agent in a user namespace that does not map root sees root-owned directories as the overflow uid: the
    cgroup root's owner is the reference, not 0."""
    resolver = WorkloadResolver(RuntimeNames(read_files=False))
    for path, owner in (("/", 65534), ("/system.slice", 65534), ("/system.slice/a.service", 65534),
                        ("/user.slice/user-7.slice/user@7.service", 7)):
        resolver.owned(path, owner)
    assert not resolver.delegated("/system.slice/a.service")
    assert resolver.identify("/user.slice/user-7.slice/user@7.service/x.scope").cgroup == (
        "/user.slice/user-7.slice/user@7.service")


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_the_source_says_who_owns_each_cgroup(tmp_path: Path) -> None:
    tree = tmp_path / "cgroup"
    (tree / "user.slice" / "user@1000.service" / "run-1.scope").mkdir(parents=True)
    os.chown(tree / "user.slice" / "user@1000.service", 1000, 1000)
    os.chown(tree / "user.slice" / "user@1000.service" / "run-1.scope", 1000, 1000)
    owners = {e.path: e.owner for e in tree_events(tree)}
    assert owners == {"/": 0, "/user.slice": 0, "/user.slice/user@1000.service": 1000,
                      "/user.slice/user@1000.service/run-1.scope": 1000}
