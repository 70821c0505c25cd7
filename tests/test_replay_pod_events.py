"""Issue 29 item 2: replays are deterministic. What the pipeline knows of a pod comes only as the pod source's
events, and an incident complete before the source's first list waits a bounded time for it: every real capture,
replayed with the pod events before its kills and again with them after, gives the same incidents, pods'
names, namespaces, owners and jobs included."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pytest

from oomwatch.events import KernelLog, PodsListed
from oomwatch.model import PodInfo
from oomwatch.parse.kmsg import parse_kmsg_record
from oomwatch.stages.identity import NAMES_WAIT_SECONDS
from tests.conftest import FIXTURES, raw_records
from tests.replay import Replay, live_reads, live_settings
from tests.test_one_engine import strip

CAPTURES = sorted((FIXTURES / "kmsg").glob("*.kmsg")) + sorted((FIXTURES / "golden").glob("*/kmsg"))
READ_EVERY = 0.01  # seconds between two reads of the live log (32 records each)
LIST_LATE = 2.0  # seconds after the last read that the first list comes in the replay "after"


def replayed(path: Path, pods: Optional[PodsListed], before: bool) -> list[dict]:
    """The capture read by the live reader, as test_one_engine reads it, by an agent whose pod source is running;
    its first list (`pods`) stepped before the first read, or once every kill is complete."""
    agent = Replay(live_settings(counting=False, persist=False, pods_watched=True))
    now = 1.0
    if before and pods is not None:
        agent.step(pods, now)
    for items in live_reads(raw_records(path)):
        now += READ_EVERY
        agent.step(KernelLog(items, drained_at=now), now)
    if not before and pods is not None:
        agent.advance_to(now + LIST_LATE)  # every kill complete (the quiet windows are over) before the list
        agent.step(pods)
    agent.settle()
    return [strip(incident.to_json()) for incident in agent.published]


def pods_of(incidents: list[dict]) -> PodsListed:
    """A list of the pods the capture's kills were in, as the API server would name them."""
    workloads = [w for i in incidents for w in [i["workload"], *i.get("workloads", ())]]
    uids = sorted({w["pod_uid"] for w in workloads if w.get("pod_uid")})
    return PodsListed(tuple(PodInfo(uid, f"ns-{n}", f"pod-{n}", owner={"kind": "Job", "name": f"job-{n}"},
                                    job={"kind": "JobSet", "name": f"train-{n}"}) for n, uid in enumerate(uids)))


def test_the_captures_hold_kills_in_pods() -> None:
    in_pods = [path for path in CAPTURES if pods_of(replayed(path, None, before=True)).pods]
    assert len(CAPTURES) >= 10 and len(in_pods) >= 3


@pytest.mark.parametrize("path", CAPTURES, ids=[f"{p.parent.name}/{p.stem}" for p in CAPTURES])
def test_pod_events_before_or_after_the_kills_give_the_same_incidents(path: Path) -> None:
    reads = len(live_reads(raw_records(path)))
    assert reads * READ_EVERY + LIST_LATE < NAMES_WAIT_SECONDS  # (the list comes within the wait)
    pods = pods_of(replayed(path, None, before=True))
    before, after = replayed(path, pods, before=True), replayed(path, pods, before=False)
    assert before, "the capture holds kills"
    assert after == before
    named = {info.uid: info for info in pods.pods}
    for incident in after:
        for workload in [incident["workload"], *incident.get("workloads", ())]:
            info = named.get(workload.get("pod_uid"))
            if info is not None:
                assert (workload["namespace"], workload["pod"]) == (info.namespace, info.name)
                assert workload["owner"] == info.owner and workload["job"] == info.job


def single_kill(seq: int, pid: int, cgroup: str) -> list:
    """A memcg kill's two records (its oom-kill summary and its kill line), as the live reader yields them."""
    return [parse_kmsg_record(r) for r in (
        f"6,{seq},{seq * 1000},-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
        f"oom_memcg={cgroup},task_memcg={cgroup},task=python,pid={pid},uid=0\n".encode(),
        f"3,{seq + 1},{seq * 1000 + 1},-;Memory cgroup out of memory: Killed process {pid} (python) "
        "total-vm:9kB, anon-rss:9kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0\n".encode())]


def test_a_pod_list_that_never_comes_is_waited_for_once() -> None:
    """The API server refuses the pod source (it retries in the background, emitting nothing): the first kill
    in a pod waits NAMES_WAIT_SECONDS for the list; the next ones are published without waiting for it."""
    cgroup = "/kubepods/burstable/pod0b0c6b3e-9d55-4a52-8f0e-0d2b1c3a4e5f/" + "4f" * 32
    agent = Replay(live_settings(counting=False, persist=False, pods_watched=True), now=1.0)
    agent.step(KernelLog(single_kill(10, 300, cgroup), drained_at=1.0), 1.0)
    agent.advance_to(1.0 + NAMES_WAIT_SECONDS - 0.1)
    assert agent.published == []
    agent.advance_to(20.0)
    agent.step(KernelLog(single_kill(20, 301, cgroup), drained_at=20.0), 20.0)
    agent.advance_to(21.0)
    first, second = agent.published
    assert first.detected_at > 1.0 + NAMES_WAIT_SECONDS and second.detected_at < 20.5
    assert first.workload.pod_uid == second.workload.pod_uid and first.workload.pod is None
