"""The pipeline with the pod source a (local, fake) Kubernetes API server feeds, as the agent wires it: the
incident carries the pod's owner and training job, and the pod-event sink posts an Event with the explanation.
No real cluster, no agent threads (the pod source and the recorder keep theirs)."""

from __future__ import annotations

from pathlib import Path

import oomwatch.workloads.kubeapi as kubeapi
from oomwatch.sinks.k8s_events import PodEventRecorder
from oomwatch.events import KernelLog
from oomwatch.parse.kmsg import parse_kmsg_record
from oomwatch.sinks import PodEventSink
from oomwatch.sources.pods import PodSource
from oomwatch.workloads import WorkloadResolver
from oomwatch.workloads.runtime import RuntimeNames
from tests.conftest import wait_for
from tests.replay import Replay, live_settings, tree_events
from tests.test_kubeapi import NODE, PYTORCH_UID, node_api

CONTAINER_ID = "6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b"
POD_CG = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{PYTORCH_UID.replace('-', '_')}.slice"
CTR_CG = f"{POD_CG}/cri-containerd-{CONTAINER_ID}.scope"


def kill(seq: int, pid: int, comm: str) -> bytes:
    return (f"3,{seq},{seq * 100},-;Memory cgroup out of memory: Killed process {pid} ({comm}) total-vm:9kB, "
            f"anon-rss:9kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0\n").encode()


def test_incident_gets_owner_job_and_a_pod_event(tmp_path: Path, monkeypatch) -> None:
    tree = tmp_path / "cgroup"
    (tree / CTR_CG.lstrip("/")).mkdir(parents=True)
    with node_api() as api:
        monkeypatch.setattr(kubeapi, "in_cluster_client", lambda *a, **k: api.client())
        heard: list = []
        pods = PodSource.from_environment(heard.append, node_name=NODE)
        assert pods is not None
        pods.start()
        sink = PodEventSink(PodEventRecorder(api.client(), NODE))
        sink.start(())
        try:
            assert pods.wait_synced(60)
            # The resolver as the agent gives the pipeline one: no file read; pods named by the events heard.
            replay = Replay(live_settings(), now=1.0, sinks=[sink],
                            resolver=WorkloadResolver(RuntimeNames(read_files=False)))
            replay.run(heard[:1])  # the first list
            replay.run(tree_events(tree))
            replay.step(KernelLog([parse_kmsg_record(r) for r in [
                b"6,10,1000,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
                + f"oom_memcg={CTR_CG},task_memcg={CTR_CG},task=python,pid=300,uid=0\n".encode(),
                kill(11, 300, "python"),
                f"6,12,1300,-;Tasks in {CTR_CG} are going to be killed due to memory.oom.group set\n".encode(),
                kill(13, 301, "pt_data_worker"),
                kill(14, 300, "python"),
            ]], drained_at=1.0))
            replay.settle()
            (incident,) = replay.published
            assert wait_for(lambda: len(api.events) == 2, timeout=60)  # the pod's Event and its PyTorchJob's
        finally:
            sink.close()
            pods.stop()
    workload = incident.to_json()["workload"]
    assert workload["pod_uid"] == PYTORCH_UID and workload["container_id"] == CONTAINER_ID
    assert workload["job"]["kind"] == "PyTorchJob" and workload["owner"]
    assert workload["namespace"] and workload["pod"]
    event, job_event = sorted(api.events.values(), key=lambda e: e["involvedObject"]["kind"] != "Pod")
    assert event["reason"] == "OOMGroupKill" and event["type"] == "Warning"
    assert event["message"] == incident.explanation
    assert event["involvedObject"]["uid"] == PYTORCH_UID and event["involvedObject"]["name"] == workload["pod"]
    # The job's Event names the PyTorchJob as the pod's ownerReference does (apiVersion and uid included).
    assert job_event["involvedObject"] == {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                           "namespace": workload["namespace"], "name": workload["job"]["name"],
                                           "uid": workload["owner"]["uid"]}
    assert job_event["reason"] == "OOMGroupKill"
    assert job_event["message"] == f"pod {workload['pod']}: {incident.explanation}"  # container name not known here
    assert [p.pid for p in incident.killed] == [300, 301]
