"""PodEventRecorder against a local HTTP API server: the POST body is a valid core/v1 Event on the victim's
pod, an incident is posted once (also across a restart), and the caller never waits."""

from __future__ import annotations

import datetime
import logging
import time
from dataclasses import replace
from typing import Any

import pytest

from oomwatch.model import Incident, KilledProcess, Workload
from oomwatch.sinks.k8s_events import PodEventRecorder, event_for_incident, event_name
from tests.fakeapi import FakeApiServer

NODE = "gpu-node-7"
KILL_TIME = datetime.datetime(2026, 11, 22, 17, 38, 21, 123456, tzinfo=datetime.timezone.utc).timestamp()
POD_UID = "24f2bbdc-1d3e-4978-8054-90f565dfe654"
CGROUP = ("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod24f2bbdc_1d3e_4978_8054_90f565dfe654.slice/"
          "cri-containerd-6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b.scope")


@pytest.fixture
def api():
    with FakeApiServer() as server:
        yield server


def make_incident(kind: str = "group", seq: int = 517, pid: int = 138, **workload_changes: Any) -> Incident:
    victim = KilledProcess(pid=pid, comm="python3", cgroup=CGROUP, uid=0, total_vm_bytes=9_000_000_000,
                           anon_rss_bytes=8_500_000_000, file_rss_bytes=1_000_000, shmem_rss_bytes=0,
                           oom_score_adj=968)
    workload = Workload(type="k8s-container", cgroup=CGROUP, namespace="ml-team", pod="trainer-worker-0",
                        container="pytorch", pod_uid=POD_UID, runtime="containerd")
    workload = replace(workload, **workload_changes)
    return Incident(
        time=KILL_TIME, boot_id="3f1c9a2e-6b4d-4e8f-a1c2-d3e4f5a6b7c8", kernel_seq=seq, kind=kind,
        constraint="memcg", scope="container", oom_cgroup=CGROUP, group_cgroup=CGROUP if kind == "group" else None,
        trigger={"pid": pid, "comm": "python3"}, memory={"usage_bytes": 8589934592, "limit_bytes": 8589934592},
        victim=victim, killed=(victim,), workload=workload,
        explanation="Container pytorch of pod ml-team/trainer-worker-0 hit its 8.0 GiB memory limit; the kernel "
                    "killed python3 (pid 138) and, because memory.oom.group=1, every other process in the container.",
        detected_at=KILL_TIME + 0.004,
    )


def test_posts_a_valid_event_on_the_pod(api):
    recorder = PodEventRecorder(api.client(), NODE)
    recorder.start()
    incident = make_incident()
    assert recorder.record(incident)
    assert recorder.wait_idle(5)
    recorder.stop()

    assert len(api.posts) == 1
    post = api.posts[0]
    assert post["path"].startswith("/api/v1/namespaces/ml-team/events")
    body = post["body"]
    assert body["apiVersion"] == "v1" and body["kind"] == "Event"
    assert body["metadata"]["namespace"] == "ml-team"
    assert body["metadata"]["name"].startswith("trainer-worker-0.")
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "ml-team",
                                      "name": "trainer-worker-0", "uid": POD_UID,
                                      "fieldPath": "spec.containers{pytorch}"}
    assert body["reason"] == "OOMGroupKill"
    assert body["type"] == "Warning"
    assert body["message"] == incident.explanation
    assert body["source"] == {"component": "oomwatch", "host": NODE}
    assert body["reportingComponent"] == "oomwatch.io/agent"
    assert body["reportingInstance"] == NODE
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2026-11-22T17:38:21Z"
    assert body["count"] == 1
    assert api.statuses == [201]
    assert recorder.posted_count == 1


def test_single_kill_reason(api):
    body = event_for_incident(make_incident(kind="single"), NODE)
    assert body is not None and body["reason"] == "OOMKill"


def test_a_repeated_incident_is_posted_once(api):
    recorder = PodEventRecorder(api.client(), NODE)
    recorder.start()
    incident = make_incident()
    assert recorder.record(incident)
    assert not recorder.record(incident)
    assert not recorder.record(make_incident())  # equal key, new object (a replayed events file line)
    assert recorder.record(make_incident(seq=530, pid=201))  # a different incident
    assert recorder.wait_idle(5)
    recorder.stop()
    assert len(api.events) == 2
    assert len(api.posts) == 2


def test_a_restarted_agent_does_not_post_again(api, caplog):
    first = PodEventRecorder(api.client(), NODE)
    first.start()
    first.record(make_incident())
    assert first.wait_idle(5)
    first.stop()

    caplog.set_level(logging.WARNING)
    restarted = PodEventRecorder(api.client(), NODE)  # empty memory: only the Event's name dedups
    restarted.start()
    assert restarted.record(make_incident())
    assert restarted.wait_idle(5)
    restarted.stop()
    assert api.statuses == [201, 409]
    assert len(api.events) == 1  # still one Event on the pod
    assert restarted.posted_count == 0
    assert not caplog.records  # AlreadyExists is success, not a warning


def test_event_names_are_stable_and_valid():
    incident = make_incident()
    assert event_name("trainer-worker-0", incident.key) == event_name("trainer-worker-0", make_incident().key)
    assert event_name("trainer-worker-0", incident.key) != event_name("trainer-worker-0", make_incident(seq=9).key)
    long_name = event_name("p" * 253, incident.key)
    assert len(long_name) <= 253
    body = event_for_incident(make_incident(pod="p" * 253), NODE)
    assert body is not None and body["metadata"]["name"] == long_name


@pytest.mark.parametrize(
    "changes",
    [
        {"type": "slurm", "namespace": None, "pod": None, "container": None, "pod_uid": None, "slurm_job": "4187"},
        {"type": "systemd", "namespace": None, "pod": None, "unit": "foo.service"},
        {"pod": None},  # a Kubernetes container whose pod name could not be learned
        {"namespace": None},
    ],
)
def test_no_event_without_a_known_pod(api, changes):
    recorder = PodEventRecorder(api.client(), NODE)
    recorder.start()
    assert not recorder.record(make_incident(**changes))
    recorder.stop()
    assert api.posts == []


def test_off_without_api_access():
    recorder = PodEventRecorder(None, NODE)
    recorder.start()
    assert not recorder.enabled
    assert not recorder.record(make_incident())
    recorder.stop()


def test_never_blocks_and_drops_when_full(api, caplog):
    api.hold.clear()  # the API server stalls
    recorder = PodEventRecorder(api.client(), NODE, queue_size=1, retries=1)
    recorder.start()
    started = time.monotonic()
    accepted = [recorder.record(make_incident(seq=600 + i, pid=300 + i)) for i in range(5)]
    elapsed = time.monotonic() - started
    assert elapsed < 0.5
    assert accepted[0] is True
    assert accepted.count(False) >= 3  # one in flight, one queued, the rest dropped
    assert recorder.dropped == accepted.count(False)
    assert any("queue full" in r.getMessage() for r in caplog.records)
    api.hold.set()
    assert recorder.wait_idle(5)
    recorder.stop()
    assert len(api.events) == accepted.count(True)


def test_from_environment(monkeypatch, api):
    monkeypatch.delenv("NODE_NAME", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert PodEventRecorder.from_environment() is None  # no node name
    assert PodEventRecorder.from_environment(node_name=NODE) is None  # not in a cluster
    monkeypatch.setenv("NODE_NAME", NODE)
    recorder = PodEventRecorder.from_environment(client=api.client())
    assert recorder is not None and recorder.enabled and recorder.node_name == NODE


def test_a_deaths_verdict_is_an_event_on_its_pod_once_and_a_kernel_kill_is_not_posted_twice(api, tmp_path):
    """The pipeline's own Death (tests/test_pipeline_deaths.py's replay: a container's init SIGKILLed by another
    process) through the pod Event sink; a kernel-oom death is left to its incident's Event."""
    from dataclasses import replace as replaced

    from oomwatch.deaths import SIGKILL
    from oomwatch.events import ProcessExeced, ProcessExited
    from oomwatch.sinks import PodEventSink
    from tests.test_pipeline_deaths import BOOT, CONTAINER, k8s_node

    replay, recorded = k8s_node(tmp_path)
    recorded.close()
    replay.step(ProcessExeced(5001, CONTAINER, 1, "python3"), BOOT + 1.0)
    replay.step(ProcessExited(5001, SIGKILL, KILL_TIME), BOOT + 5.0)
    replay.settle()
    (death,) = replay.deaths
    recorder = PodEventRecorder(api.client(), NODE)
    sink = PodEventSink(recorder)
    sink.start([])
    sink.publish_death(death)
    sink.publish_death(death)  # once
    sink.publish_death(replaced(death, cause="kernel-oom", time=death.time + 60))  # its incident has the Event
    assert recorder.wait_idle(5)
    sink.close()
    [post] = api.posts
    body = post["body"]
    assert post["path"].startswith("/api/v1/namespaces/ml/events")
    assert (body["reason"], body["type"], body["message"]) == ("KilledBySignal", "Warning", death.explanation)
    assert body["involvedObject"]["name"] == "train-0"
    assert body["involvedObject"]["fieldPath"] == "spec.containers{trainer}"
    assert body["firstTimestamp"] == "2026-11-22T17:38:21Z"
    assert body["metadata"]["name"].startswith("train-0.") and api.statuses == [201]
