"""The agent wired to a (local, fake) Kubernetes API server: the incident carries the pod's owner and
training job from the pod index, and a pod Event is posted with the explanation. No real cluster."""

from __future__ import annotations

from pathlib import Path

import oomwatch.workloads.kubeapi as kubeapi
from oomwatch.sinks.k8s_events import PodEventRecorder
from tests.conftest import SeqpacketKmsg, incidents_of, running_agent, wait_for
from tests.test_agent import agent_config
from tests.test_k8s_events import FakeEventsApi
from tests.test_kubeapi import NODE, PYTORCH_UID, FakeApiServer

CONTAINER_ID = "6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b"
POD_CG = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{PYTORCH_UID.replace('-', '_')}.slice"
CTR_CG = f"{POD_CG}/cri-containerd-{CONTAINER_ID}.scope"


def kill(seq: int, pid: int, comm: str) -> bytes:
    return (f"3,{seq},{seq * 100},-;Memory cgroup out of memory: Killed process {pid} ({comm}) total-vm:9kB, "
            f"anon-rss:9kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0\n").encode()


def test_incident_gets_owner_job_and_a_pod_event(tmp_path: Path, monkeypatch) -> None:
    tree = tmp_path / "cgroup"
    (tree / CTR_CG.lstrip("/")).mkdir(parents=True)
    events_api = FakeEventsApi()
    with FakeApiServer() as pods_api:
        monkeypatch.setattr(kubeapi, "in_cluster_client", lambda *a, **k: pods_api.client())
        monkeypatch.setattr(PodEventRecorder, "from_environment",
                            classmethod(lambda cls, node_name=None, **kw: cls(events_api.client(), node_name)))
        config = agent_config(tmp_path, cgroup_root=str(tree), kube_api="auto", node_name=NODE)
        kmsg = SeqpacketKmsg()
        with running_agent(config, kmsg_factory=kmsg.factory) as agent:
            assert agent.pod_index is not None and agent.pod_index.wait_synced(5)
            kmsg.send([
                b"6,10,1000,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
                + f"oom_memcg={CTR_CG},task_memcg={CTR_CG},task=python,pid=300,uid=0\n".encode(),
                kill(11, 300, "python"),
                f"6,12,1300,-;Tasks in {CTR_CG} are going to be killed due to memory.oom.group set\n".encode(),
                kill(13, 301, "pt_data_worker"),
                kill(14, 300, "python"),
            ])
            assert wait_for(lambda: len(incidents_of(agent)) == 1)
            incident = incidents_of(agent)[0]
            assert wait_for(lambda: len(events_api.events) == 1)
    workload = incident["workload"]
    assert workload["pod_uid"] == PYTORCH_UID and workload["container_id"] == CONTAINER_ID
    assert workload["job"]["kind"] == "PyTorchJob" and workload["owner"]
    assert workload["namespace"] and workload["pod"]
    (event,) = events_api.events.values()
    assert event["reason"] == "OOMGroupKill" and event["type"] == "Warning"
    assert event["message"] == incident["explanation"]
    assert event["involvedObject"]["uid"] == PYTORCH_UID and event["involvedObject"]["name"] == workload["pod"]
    assert [p["pid"] for p in incident["killed"]] == [300, 301]
