"""The pod source against a local HTTP API server (real lightkube, real sockets): the node field selector is
sent, owners and training jobs come out of real-shaped pods as events, kept in the identity stage's own table as
the pipeline keeps them, and failures degrade to nothing quietly."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Optional

import pytest
from lightkube import Client, KubeConfig
from lightkube.config.models import Cluster, User

from oomwatch.events import PodDeleted, PodsListed, PodUpdated
from oomwatch.sources.pods import PodSource
from oomwatch.stages.identity import PodTable
from oomwatch.workloads import kubeapi
from oomwatch.workloads.kubeapi import controlling_owner, pod_info_from_object, training_job
from tests.fakeapi import FakeApiServer

API = Path(__file__).resolve().parent.parent / "fixtures" / "workloads" / "api"
NODE = "gpu-node-7"
PYTORCH_UID = "24f2bbdc-1d3e-4978-8054-90f565dfe654"
JOBSET_UID = "177f6a60-e89c-425f-a4be-a69f02110502"
REDIS_UID = "7bf73b50-3f74-4daf-9010-e4d48c021cb4"
BARE_UID = "9c8b7a6f-5e4d-4c3b-a2f1-0e9d8c7b6a59"
KUEUE_UID = "e3b0c442-98fc-4c14-9afb-f4c8996fb924"


def node_api(**kwargs: Any) -> FakeApiServer:
    """The API server of node gpu-node-7: the fixture PodList, then one watch stream of the fixture events;
    later watches hang until shutdown (like a quiet API server)."""
    listing = json.loads((API / "podlist-gpu-node-7.json").read_text())
    return FakeApiServer(listing["items"], resource_version=listing["metadata"]["resourceVersion"],
                         watch_lines=(API / "watch-gpu-node-7.jsonl").read_text().splitlines(), **kwargs)


class Heard:
    """What a pod source emitted, and the identity stage's table of it (written on the source's thread)."""

    def __init__(self) -> None:
        self.events: list = []
        self.table = PodTable()

    def __call__(self, event: Any) -> None:
        self.events.append(event)
        self.table.take(event, time.monotonic())

    def info(self, pod_uid: Optional[str]):
        return self.table.get(pod_uid) if pod_uid else None


def _wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_pod_source_lists_and_watches_only_its_node():
    with node_api() as api:
        index = Heard()
        source = PodSource(NODE, api.client(), index)
        source.start()
        try:
            assert source.wait_synced(5)
            assert _wait_for(lambda: index.info(KUEUE_UID) is not None and "tier" in index.info(REDIS_UID).labels)
            assert isinstance(index.events[0], PodsListed)  # then the watch's, one event each
            assert {type(e) for e in index.events[1:]} == {PodUpdated, PodDeleted}

            listing, watch = api.requests[0], api.requests[1]
            assert listing["query"]["fieldSelector"] == f"spec.nodeName={NODE}"
            assert "watch" not in listing["query"]
            assert watch["query"]["fieldSelector"] == f"spec.nodeName={NODE}"
            assert watch["query"]["watch"] == "true"
            assert watch["query"]["resourceVersion"] == "184467"  # continues from the list
            assert listing["authorization"] == "Bearer test-token"
            assert all(r["path"] == "/api/v1/pods" for r in api.requests)  # read-only, pods only

            pytorch = index.info(PYTORCH_UID)
            assert (pytorch.namespace, pytorch.name) == ("ml-team", "trainer-worker-0")
            assert pytorch.owner == {"kind": "PyTorchJob", "name": "trainer", "apiVersion": "kubeflow.org/v1",
                                    "uid": "0b7c2a51-93f4-4c1e-8d5a-6e2f1b0c9d8e"}
            assert pytorch.job == {"kind": "PyTorchJob", "name": "trainer"}

            jobset = index.info(JOBSET_UID)  # deleted by the watch, still known for a while
            assert jobset is not None
            assert jobset.owner == {"kind": "Job", "name": "pretrain-workers-0", "apiVersion": "batch/v1",
                                   "uid": "c1d2e3f4-a5b6-4789-8abc-def012345678"}
            assert jobset.job == {"kind": "JobSet", "name": "pretrain"}
            assert jobset.queue == "team-a"

            redis = index.info(REDIS_UID)
            assert redis.owner == {"kind": "ReplicaSet", "name": "redis-7d9f8b6c5", "apiVersion": "apps/v1",
                                   "uid": "5a6b7c8d-9e0f-4a1b-8c2d-3e4f5a6b7c8d"}
            assert redis.job is None
            assert redis.labels["tier"] == "cache"  # MODIFIED applied

            bare = index.info(BARE_UID)
            assert bare.owner is None and bare.job is None

            kueue_job = index.info(KUEUE_UID)  # ADDED by the watch
            assert kueue_job.owner == {"kind": "Job", "name": "nightly-eval-28910400", "apiVersion": "batch/v1",
                                      "uid": "aa0b1c2d-3e4f-4a5b-9c6d-7e8f9a0b1c2d"}
            assert kueue_job.job == {"kind": "Job", "name": "nightly-eval-28910400"}
            assert kueue_job.queue == "team-a-eval"

            assert index.info("00000000-0000-0000-0000-000000000000") is None
            assert index.info(None) is None
        finally:
            api.closing.set()  # release the hanging watch so the thread sees the stop
            source.stop()
            assert not source.alive


def test_forbidden_degrades_to_none_after_one_log_line(caplog):
    caplog.set_level(logging.DEBUG, logger="oomwatch.sources.pods")
    with node_api(list_status=403) as api:
        heard = Heard()
        source = PodSource(NODE, api.client(), heard, retry_seconds=0.02, max_retry_seconds=0.02)
        source.start()
        try:
            assert _wait_for(lambda: len(api.requests) >= 3)
            assert not source.wait_synced(0)
            assert heard.events == []
            assert source.alive  # keeps retrying in the background
        finally:
            source.stop()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "cannot list/watch pods" in warnings[0].getMessage()


def test_unreachable_api_server_degrades_too(caplog):
    config = KubeConfig.from_one(cluster=Cluster(server="http://127.0.0.1:9"), user=User(token="t"))
    heard = Heard()
    source = PodSource(NODE, Client(config, trust_env=False), heard, retry_seconds=0.02, max_retry_seconds=0.02)
    source.start()
    try:
        assert not source.wait_synced(0.3)
        assert heard.events == []
    finally:
        source.stop()
    assert sum(r.levelno >= logging.WARNING for r in caplog.records) == 1


def test_no_in_cluster_config_means_no_index(monkeypatch, caplog, tmp_path):
    caplog.set_level(logging.INFO, logger="oomwatch.workloads.kubeapi")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert PodSource.from_environment(list.append, NODE) is None
    assert len(caplog.records) == 1
    # in a pod, but without a service account token mounted
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert kubeapi.in_cluster_client(service_account_dir=str(tmp_path)) is None


def test_in_cluster_needs_a_node_name(monkeypatch):
    monkeypatch.setattr(kubeapi, "in_cluster_client", lambda: object())  # pretend the service account works
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert PodSource.from_environment(list.append) is None
    monkeypatch.setenv("NODE_NAME", NODE)
    source = PodSource.from_environment(list.append)
    assert source is not None and source.node_name == NODE
    assert PodSource.from_environment(list.append, "other-node").node_name == "other-node"


def watched(event_type: str, pod: dict[str, Any]) -> list:
    """What the pod source emits for one watch event."""
    heard: list = []
    PodSource(NODE, None, heard.append).watched(event_type, pod)
    return heard


def test_deleted_pods_expire_after_retention():
    table = PodTable(retention=600)
    pod = {"metadata": {"uid": REDIS_UID, "namespace": "default", "name": "redis-7d9f8b6c5-x2k4q"}}
    other = {"metadata": {"uid": BARE_UID, "namespace": "default", "name": "debug-shell"}}
    [added], [deleted] = watched("ADDED", pod), watched("DELETED", pod)
    assert (type(added), type(deleted)) == (PodUpdated, PodDeleted)
    table.take(added, 1000.0)
    table.take(deleted, 1000.0)
    table.take(watched("ADDED", other)[0], 1599.0)
    assert table.get(REDIS_UID) is not None
    table.take(watched("MODIFIED", other)[0], 1601.0)
    assert table.get(REDIS_UID) is None
    assert table.get(BARE_UID) is not None


def test_relist_marks_vanished_pods_deleted():
    table = PodTable(retention=10)
    heard: list = []
    source = PodSource(NODE, None, heard.append)
    source.listed([{"metadata": {"uid": REDIS_UID, "namespace": "default", "name": "redis"}}])
    table.take(heard[-1], 0.0)
    assert not PodTable().listed and table.listed
    source.listed([{"metadata": {"uid": BARE_UID, "namespace": "default", "name": "debug-shell"}}])
    table.take(heard[-1], 5.0)
    assert table.get(REDIS_UID) is not None  # gone from the list, kept for the retention time
    table.take(heard[-1], 16.0)
    assert table.get(REDIS_UID) is None
    assert len(table) == 1


# --- pure parsers ----------------------------------------------------------------------------------


def _owner(kind: str, name: str, controller: Optional[bool] = True) -> dict[str, Any]:
    ref: dict[str, Any] = {"apiVersion": "v1", "kind": kind, "name": name, "uid": "u"}
    if controller is not None:
        ref["controller"] = controller
    return ref


def test_controlling_owner_ignores_non_controllers():
    metadata = {"ownerReferences": [_owner("ConfigMap", "cm", controller=None), _owner("Node", "n", False),
                                    _owner("StatefulSet", "db")]}
    assert controlling_owner(metadata) == {"kind": "StatefulSet", "name": "db", "apiVersion": "v1", "uid": "u"}
    assert controlling_owner({"ownerReferences": [_owner("ConfigMap", "cm", controller=None)]}) is None
    assert controlling_owner({}) is None
    assert controlling_owner({"ownerReferences": "garbage"}) is None


@pytest.mark.parametrize(
    "labels,annotations,owner,job",
    [
        # Kubeflow Trainer v2: the TrainJob runs as a JobSet; the TrainJob is the user's object
        ({"trainer.kubeflow.org/trainjob-name": "llm-ft", "jobset.sigs.k8s.io/jobset-name": "llm-ft"}, {},
         {"kind": "Job", "name": "llm-ft-node-0"}, {"kind": "TrainJob", "name": "llm-ft"}),
        ({"jobset.sigs.k8s.io/jobset-name": "pretrain"}, {}, {"kind": "Job", "name": "pretrain-workers-0"},
         {"kind": "JobSet", "name": "pretrain"}),
        ({"training.kubeflow.org/job-name": "mnist", "training.kubeflow.org/operator-name": "tfjob-controller"}, {},
         {"kind": "TFJob", "name": "mnist"}, {"kind": "TFJob", "name": "mnist"}),
        ({"training.kubeflow.org/job-name": "hvd", "training.kubeflow.org/operator-name": "mpi-operator"}, {},
         {"kind": "MPIJob", "name": "hvd"}, {"kind": "MPIJob", "name": "hvd"}),
        ({"training.kubeflow.org/job-name": "xgb", "training.kubeflow.org/operator-name": "xgboostjob-controller"},
         {}, None, {"kind": "XGBoostJob", "name": "xgb"}),
        ({"training.kubeflow.org/job-name": "p", "training.kubeflow.org/operator-name": "paddlejob-controller"}, {},
         None, {"kind": "PaddleJob", "name": "p"}),
        # an operator name we do not know: the owner's kind when it is a training job, else generic
        ({"training.kubeflow.org/job-name": "j", "training.kubeflow.org/operator-name": "new-controller"}, {},
         {"kind": "PyTorchJob", "name": "j"}, {"kind": "PyTorchJob", "name": "j"}),
        ({"training.kubeflow.org/job-name": "j"}, {}, None, {"kind": "KubeflowJob", "name": "j"}),
        # pre-2021 operators
        ({"group-name": "kubeflow.org", "job-name": "dist-mnist", "tf-job-name": "dist-mnist"}, {},
         {"kind": "TFJob", "name": "dist-mnist"}, {"kind": "TFJob", "name": "dist-mnist"}),
        ({"group-name": "kubeflow.org", "job-name": "resnet", "pytorch-job-name": "resnet"}, {}, None,
         {"kind": "PyTorchJob", "name": "resnet"}),
        ({"group-name": "kubeflow.org", "job-name": "old"}, {}, {"kind": "PyTorchJob", "name": "old"},
         {"kind": "PyTorchJob", "name": "old"}),
        # a batch Job's own `job-name` label is not a Kubeflow job
        ({"job-name": "backup-28910400", "batch.kubernetes.io/job-name": "backup-28910400"}, {},
         {"kind": "Job", "name": "backup-28910400"}, None),
        # owned directly by a training job, labels aside
        ({}, {}, {"kind": "RayJob", "name": "tune"}, {"kind": "RayJob", "name": "tune"}),
        # Determined: the allocation id in the `determined` label
        ({"determined": "7.0b9e1c2d-4f3a-4e5b-8c6d-7e8f9a0b1c2d.1"}, {}, None,
         {"kind": "Determined", "name": "7.0b9e1c2d-4f3a-4e5b-8c6d-7e8f9a0b1c2d.1"}),
        # Kueue: plain pod groups, and queued Jobs
        ({"kueue.x-k8s.io/queue-name": "q", "kueue.x-k8s.io/pod-group-name": "sweep-3"}, {}, None,
         {"kind": "PodGroup", "name": "sweep-3"}),
        ({"kueue.x-k8s.io/queue-name": "q"}, {"kueue.x-k8s.io/workload": "job-eval-1a2b3"},
         {"kind": "Job", "name": "eval"}, {"kind": "Job", "name": "eval"}),
        # ordinary workloads have no training job
        ({"app": "redis"}, {}, {"kind": "ReplicaSet", "name": "redis-7d9f8b6c5"}, None),
        ({}, {}, None, None),
    ],
)
def test_training_job(labels, annotations, owner, job):
    assert training_job(labels, annotations, owner) == job


@pytest.mark.parametrize(
    "obj",
    [{}, {"metadata": None}, {"metadata": {"name": "x", "namespace": "y"}}, {"metadata": {"uid": 5, "name": "x",
                                                                                       "namespace": "y"}}],
)
def test_pod_info_needs_identity(obj):
    assert pod_info_from_object(obj) is None


def test_the_pods_status_reason_message_and_deletion_are_kept_bounded() -> None:
    """What an eviction leaves on the pod (the kubelet's status.reason and message) and a deletion's
    deletionTimestamp; strings are cut (they go into Events and logs), other types are ignored."""
    from oomwatch.workloads.kubeapi import pod_info_from_object

    pod = {"metadata": {"uid": "u1", "namespace": "ml", "name": "p", "deletionTimestamp": "2026-11-26T14:00:00Z"},
           "status": {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory. " * 50}}
    info = pod_info_from_object(pod)
    assert (info.status_reason, info.deleting) == ("Evicted", True)
    assert info.status_message.startswith("The node was low on resource: memory.") and len(info.status_message) == 1024
    bare = pod_info_from_object({"metadata": {"uid": "u2", "namespace": "ml", "name": "q"}, "status": {"reason": 7}})
    assert (bare.status_reason, bare.status_message, bare.deleting) == (None, None, False)
    assert pod_info_from_object({"metadata": {"uid": "u3", "namespace": "ml", "name": "r"}, "status": "x"}) is not None
