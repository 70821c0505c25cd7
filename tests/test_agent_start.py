"""The agent listens first (issues 30 item 4, 31 item 12): with 100,000 cgroups its port opened only after the
tree had been read (67 s), and a liveness probe on /healthz could fail all that while. Now /healthz answers 503
"starting" (not ready) and /livez 200 (alive) from the moment it listens, until the first full scan; the restored
state is served meanwhile. And pods whose cgroups were found before the first pod list returned get their owners
and jobs once the list arrives (they stayed without them: an identity was resolved once, when its cgroup was
found)."""

from __future__ import annotations

import gc
import json
import threading
from pathlib import Path

from oomwatch.events import CgroupAdded
from oomwatch.store import Store
from oomwatch.workloads import WorkloadResolver
from oomwatch.workloads.runtime import ContainerNames, RuntimeNames
from tests.conftest import base_url, http_get
from tests.replay import Replay, live_settings, pod_updated, pods_listed
from tests.test_agent import agent_config
from tests.test_job_info import container_id, pod_object, uid_of


def test_the_port_answers_starting_while_the_tree_is_read(tmp_path: Path, monkeypatch) -> None:
    from oomwatch.agent import Agent

    gc.unfreeze()  # (what an earlier test's agent froze)
    agent = Agent(agent_config(tmp_path, kmsg=str(tmp_path / "no-such-kmsg")))
    reading, release = threading.Event(), threading.Event()
    read_tree = agent.cgroups.start

    def slow_tree() -> None:  # the tree read as on a node with 100,000 cgroups: until the test says
        reading.set()
        release.wait(60)
        read_tree()

    monkeypatch.setattr(agent.cgroups, "start", slow_tree)
    starter = threading.Thread(target=agent.start, daemon=True)
    starter.start()
    try:
        assert reading.wait(30)
        status, body = http_get(base_url(agent) + "/healthz")
        assert (status, json.loads(body)) == (503, {"starting": "reading the cgroup tree"})
        assert http_get(base_url(agent) + "/livez")[0] == 200
        assert http_get(base_url(agent) + "/incidents") == (200, b"[]\n")
        assert http_get(base_url(agent) + "/metrics")[0] == 200
        assert gc.get_freeze_count() == 0  # (unfrozen below: nothing frozen yet while it starts)
        release.set()
        starter.join(30)
        assert agent.starting is None
        # what the start built lives as long as the agent: out of a full collection's scan from now on
        assert gc.get_freeze_count() > 0
        status, body = http_get(base_url(agent) + "/healthz")
        assert "starting" not in json.loads(body)
        assert http_get(base_url(agent) + "/livez")[0] == 200
    finally:
        release.set()
        starter.join(30)
        agent.stop()


def test_owners_come_when_the_pod_list_arrives_after_the_cgroups() -> None:
    resolver = WorkloadResolver(RuntimeNames(read_files=False))
    replay = Replay(live_settings(counting=False), store=Store(), resolver=resolver, now=1000.0)
    uid = uid_of(1)
    pod_path = f"/kubepods/burstable/pod{uid}"
    names = ContainerNames(container_id=container_id(1), container_type="container", container="main",
                           pod="trainer-0", namespace="ml", pod_uid=uid)
    replay.run([CgroupAdded(pod_path, None, None, 0, False, ()),
                CgroupAdded(f"{pod_path}/{container_id(1)}", None, None, 1, True, (), names=names)])
    assert all(w.owner is None for _, _, w in replay.pipeline.view().workloads)  # no list yet
    # the pod source's first list
    replay.step(pods_listed(pod_object("ml", "trainer-0", uid, owner=("Job", "train"))), now=1001.0)
    owners = {path: (w.owner or {}).get("name") for path, _, w in replay.pipeline.view().workloads}
    assert owners == {pod_path: "train", f"{pod_path}/{container_id(1)}": "train"}
    replay.step(pod_updated(pod_object("ml", "trainer-0", uid, owner=("Job", "train-2"))), now=1002.0)
    assert {(w.owner or {}).get("name") for _, _, w in replay.pipeline.view().workloads} == {"train-2"}
