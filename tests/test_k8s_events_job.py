"""The Event on the job a pod belongs to (oomwatch.sinks.k8s_events): its involvedObject for a JobSet known from a
label, a PyTorchJob and a batch Job known from the pod's ownerReference, none for a bare pod; one per incident and
death, also across a restart; valid against the Kubernetes schema; a refused job Event leaves the pod's posted."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from oomwatch.deaths import SIGKILL, Death
from oomwatch.model import Workload
from oomwatch.sinks.k8s_events import (
    PodEventRecorder,
    event_for_death,
    event_for_incident,
    job_event_for_death,
    job_event_for_incident,
)
from oomwatch.workloads.kubeapi import pod_info_from_object
from tests.fakeapi import FakeApiServer
from tests.test_k8s_events import CGROUP, KILL_TIME, NODE, make_incident

API_FIXTURES = Path(__file__).resolve().parent.parent / "fixtures/workloads/api"
K8S_VERSIONS = ("1.25.0", "1.35.0")  # as tests/deploy/test_deploy_kubernetes.py validates the manifests


def fixture_pod(name: str) -> dict[str, Any]:
    """A pod as the API server listed or watched it (fixtures/workloads/api)."""
    pods = json.loads((API_FIXTURES / "podlist-gpu-node-7.json").read_text())["items"]
    for line in (API_FIXTURES / "watch-gpu-node-7.jsonl").read_text().splitlines():
        pods.append(json.loads(line)["object"])
    return next(p for p in pods if p["metadata"]["name"] == name)


def workload_of(pod: dict[str, Any], container: str = "trainer") -> Workload:
    """The victim's workload as the resolver gives it with the pod index (owner and job from the pod)."""
    info = pod_info_from_object(pod)
    assert info is not None
    return Workload(type="k8s-container", cgroup=CGROUP, namespace=info.namespace, pod=info.name,
                    container=container, pod_uid=info.uid, runtime="containerd", owner=info.owner, job=info.job)


JOBSET_POD = "pretrain-workers-0-1-x7k2p"  # owned by the JobSet's child Job, labelled with the JobSet's name
PYTORCH_POD = "trainer-worker-0"  # owned by its PyTorchJob (training-operator v1)


def plain_job_pod() -> dict[str, Any]:
    """A batch Job's pod as the Job controller makes it (ownerReference to the Job, its job-name labels)."""
    uid = "5e0c7f3a-1b2d-4c5e-8f9a-0b1c2d3e4f5a"
    return {"metadata": {
        "name": "etl-28910400-x7k2p", "namespace": "batch", "uid": "8d1f6a2b-3c4d-4e5f-9a0b-1c2d3e4f5a6b",
        "labels": {"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": "etl-28910400",
                   "controller-uid": uid, "job-name": "etl-28910400"},
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "etl-28910400", "uid": uid,
                             "controller": True, "blockOwnerDeletion": True}]}}


@pytest.fixture
def api():
    with FakeApiServer() as server:
        yield server


def test_jobset_known_from_its_label_gets_its_group_version_and_no_uid():
    workload = workload_of(fixture_pod(JOBSET_POD))
    incident = make_incident(**{k: getattr(workload, k) for k in ("namespace", "pod", "pod_uid", "owner", "job",
                                                                  "container")})
    body = job_event_for_incident(incident, NODE)
    assert body is not None
    # The pod's owner is the child Job; the JobSet is named by jobset.sigs.k8s.io/jobset-name only: its uid is
    # not on the pod, so none is claimed.
    assert body["involvedObject"] == {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                                      "namespace": "research", "name": "pretrain"}
    assert body["metadata"]["namespace"] == "research" and body["metadata"]["name"].startswith("pretrain.")
    assert body["reason"] == "OOMGroupKill" and body["type"] == "Warning"
    assert body["message"] == f"pod {JOBSET_POD} container trainer: {incident.explanation}"
    pod_body = event_for_incident(incident, NODE)
    assert pod_body is not None and pod_body["metadata"]["name"] != body["metadata"]["name"]
    assert {k: body[k] for k in ("source", "reportingComponent", "reportingInstance", "firstTimestamp",
                                 "lastTimestamp", "count")} == \
        {k: pod_body[k] for k in ("source", "reportingComponent", "reportingInstance", "firstTimestamp",
                                  "lastTimestamp", "count")}


def test_pytorchjob_known_from_its_owner_reference_gets_its_apiversion_and_uid():
    workload = workload_of(fixture_pod(PYTORCH_POD), container="pytorch")
    body = job_event_for_incident(make_incident(kind="single", owner=workload.owner, job=workload.job), NODE)
    assert body is not None
    assert body["involvedObject"] == {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "namespace": "ml-team",
                                      "name": "trainer", "uid": "0b7c2a51-93f4-4c1e-8d5a-6e2f1b0c9d8e"}
    assert body["reason"] == "OOMKill"
    assert body["message"].startswith("pod trainer-worker-0 container pytorch: Container pytorch of pod")


def test_a_plain_batch_job_is_the_pods_job():
    workload = workload_of(plain_job_pod(), container="etl")
    assert workload.job is None and workload.owner is not None  # no training job: its controlling Job is the job
    incident = make_incident(namespace="batch", pod=workload.pod, pod_uid=workload.pod_uid, container="etl",
                             owner=workload.owner, job=None)
    body = job_event_for_incident(incident, NODE)
    assert body is not None
    assert body["involvedObject"] == {"apiVersion": "batch/v1", "kind": "Job", "namespace": "batch",
                                      "name": "etl-28910400", "uid": "5e0c7f3a-1b2d-4c5e-8f9a-0b1c2d3e4f5a"}


@pytest.mark.parametrize("pod", ["debug-shell", "redis-7d9f8b6c5-x2k4q"])  # a bare pod; a Deployment's pod
def test_a_pod_without_a_job_gets_no_job_event(api, pod):
    workload = workload_of(fixture_pod(pod))
    incident = make_incident(namespace=workload.namespace, pod=workload.pod, pod_uid=workload.pod_uid,
                             owner=workload.owner, job=workload.job)
    assert job_event_for_incident(incident, NODE) is None
    recorder = PodEventRecorder(api.client(), NODE)
    recorder.start()
    assert recorder.record(incident)
    assert recorder.wait_idle(5)
    recorder.stop()
    assert [p["body"]["involvedObject"]["kind"] for p in api.posts] == ["Pod"]


@pytest.mark.parametrize("job", [
    {"kind": "Determined", "name": "4b1f9c3e-alloc"},  # an allocation id, no API object
    {"kind": "PodGroup", "name": "group-a"},  # a Kueue pod group: a label, no object
    {"kind": "KubeflowJob", "name": "x"},  # an operator not known: its group is not known
    {"kind": "MPIJob", "name": "mpi"},  # kubeflow.org/v1 or v2beta1: only an ownerReference says which
])
def test_no_job_event_when_the_job_is_no_object_of_a_known_group(job):
    assert job_event_for_incident(make_incident(job=job), NODE) is None


def test_an_mpijob_that_owns_the_pod_is_named_as_its_reference_says():
    owner = {"kind": "MPIJob", "name": "mpi", "apiVersion": "kubeflow.org/v2beta1", "uid": "1f2e3d4c"}
    body = job_event_for_incident(make_incident(job={"kind": "MPIJob", "name": "mpi"}, owner=owner), NODE)
    assert body is not None
    assert body["involvedObject"] == {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "namespace": "ml-team",
                                      "name": "mpi", "uid": "1f2e3d4c"}


def test_job_and_pod_events_are_valid_core_v1_events():
    """The bodies as posted, against the Kubernetes OpenAPI schema the deploy tests use (strict: no unknown
    field)."""
    bodies = []
    for name in (JOBSET_POD, PYTORCH_POD):
        workload = workload_of(fixture_pod(name))
        incident = make_incident(namespace=workload.namespace, pod=workload.pod, pod_uid=workload.pod_uid,
                                 owner=workload.owner, job=workload.job)
        bodies += [event_for_incident(incident, NODE), job_event_for_incident(incident, NODE)]
    assert all(b is not None for b in bodies)
    for body in bodies:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(body, version, strict=True)
    invalid = dict(bodies[1], involvedObject=dict(bodies[1]["involvedObject"], uid=7))
    with pytest.raises(kubernetes_validate.ValidationError):  # the check can fail
        kubernetes_validate.validate(invalid, K8S_VERSIONS[-1], strict=True)


def jobset_incident(seq: int = 517, pid: int = 138):
    workload = workload_of(fixture_pod(JOBSET_POD))
    return make_incident(seq=seq, pid=pid, namespace=workload.namespace, pod=workload.pod, pod_uid=workload.pod_uid,
                         owner=workload.owner, job=workload.job)


def test_posted_once_per_incident_also_across_a_restart(api, caplog):
    first = PodEventRecorder(api.client(), NODE)
    first.start()
    assert first.record(jobset_incident())
    assert not first.record(jobset_incident())  # the same incident again: neither Event is queued again
    assert first.wait_idle(5)
    first.stop()
    assert api.statuses == [201, 201]
    assert sorted(e["involvedObject"]["kind"] for e in api.events.values()) == ["JobSet", "Pod"]

    caplog.set_level(logging.WARNING)
    restarted = PodEventRecorder(api.client(), NODE)  # empty memory: the Events' names dedup
    restarted.start()
    assert restarted.record(jobset_incident())
    assert restarted.record(jobset_incident(seq=530, pid=201))  # a new incident: two new Events
    assert restarted.wait_idle(5)
    restarted.stop()
    assert api.statuses[2:] == [409, 409, 201, 201]
    assert len(api.events) == 4
    assert not caplog.records


def test_a_deaths_verdict_is_an_event_on_the_job_too(api):
    workload = workload_of(fixture_pod(PYTORCH_POD), container="pytorch")
    death = Death(time=KILL_TIME, cause="userspace", sender=None, cgroup=CGROUP, workload=workload, pid=138,
                  comm="python3", signal=SIGKILL, exit_code=None, main=True, processes=1, pids=(138,),
                  evidence=("proc-connector",), explanation="python3 (pid 138) was killed by SIGKILL, not by the "
                  "kernel's OOM killer.", detected_at=KILL_TIME + 5, boot_id="3f1c9a2e")
    body = job_event_for_death(death, NODE)
    assert body is not None and body["reason"] == "KilledBySignal"
    assert body["involvedObject"]["kind"] == "PyTorchJob"
    assert body["message"] == f"pod {PYTORCH_POD} container pytorch: {death.explanation}"
    pod_body = event_for_death(death, NODE)
    assert pod_body is not None and pod_body["metadata"]["name"] != body["metadata"]["name"]
    # A death's job Event is not an incident's: another name for the same pod and time.
    incident_body = job_event_for_incident(make_incident(owner=workload.owner, job=workload.job), NODE)
    assert incident_body is not None and incident_body["metadata"]["name"] != body["metadata"]["name"]

    recorder = PodEventRecorder(api.client(), NODE)
    recorder.start()
    assert recorder.record_death(death)
    assert not recorder.record_death(replace(death))
    assert recorder.wait_idle(5)
    recorder.stop()
    assert sorted(p["body"]["involvedObject"]["kind"] for p in api.posts) == ["Pod", "PyTorchJob"]


@pytest.mark.parametrize("status", [403, 404, 422])
def test_a_refused_job_event_leaves_the_pods_posted_and_is_logged_once(api, caplog, status):
    api.refuse = lambda body: status if body["involvedObject"]["kind"] != "Pod" else None
    caplog.set_level(logging.DEBUG, logger="oomwatch.sinks.k8s_events")
    recorder = PodEventRecorder(api.client(), NODE, retries=3, retry_seconds=0.01)
    recorder.start()
    assert recorder.record(jobset_incident())
    assert recorder.record(jobset_incident(seq=530, pid=201))
    assert recorder.wait_idle(5)
    recorder.stop()
    assert sorted(api.statuses) == [201, 201, status, status]  # each job Event asked once: no retry
    assert [e["involvedObject"]["kind"] for e in api.events.values()] == ["Pod", "Pod"]
    assert recorder.posted_count == 2 and recorder.refused_job_events == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "JobSet research/pretrain" in warnings[0], warnings
    assert sum("on JobSet" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG) == 1
