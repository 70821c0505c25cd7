"""oomwatch_workload_job_info (issue 22, "the job each kill broke"): which Kubernetes pods and Slurm jobs belong to
which job, as the collector writes it from the pipeline's View.

The pods' owners and training jobs come from the real PodIndex (oomwatch.workloads.kubeapi), fed the pod objects
an API server's watch would deliver, and the cgroups from the CgroupAdded events the cgroup source emits: the
pipeline resolves each workload as the agent does, and the collector reads its View. The cardinality test runs
10,000 pods in 1,000 JobSets through it: one info series per pod, within the store's cap of workloads, and every
label value one of the cluster's own names."""

from __future__ import annotations

import time
from typing import Any, Optional

import pytest
from prometheus_client.parser import text_string_to_metric_families

from oomwatch.events import CgroupAdded
from oomwatch.model import CgroupStats, Workload
from oomwatch.sinks.collector import JOB_INFO_LABELS, NodeInfo, OomwatchCollector, job_info_labels
from oomwatch.store import MAX_WORKLOADS, Store
from oomwatch.workloads import WorkloadResolver
from oomwatch.workloads.runtime import ContainerNames, RuntimeNames
from tests.replay import Replay, live_settings, pods_listed
from tests.test_collector import ReferenceCollector, promtool_complaint, reference_text

INFO = "oomwatch_workload_job_info"


def pod_object(namespace: str, name: str, uid: str, *, owner: Optional[tuple[str, str]] = None,
               labels: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """A Pod as the API server's watch delivers it (the fields PodIndex reads)."""
    metadata: dict[str, Any] = {"namespace": namespace, "name": name, "uid": uid, "labels": labels or {}}
    if owner is not None:
        metadata["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": owner[0], "name": owner[1],
                                        "uid": "owner-" + uid, "controller": True}]
    return {"metadata": metadata, "spec": {"nodeName": "gpu-1"}}


def jobset_pod(namespace: str, jobset: str, replica: int, uid: str) -> dict[str, Any]:
    """A JobSet's pod: owned by the child Job of its replicated job, labelled with the JobSet's name
    (kubernetes-sigs/jobset JobSetNameKey)."""
    return pod_object(namespace, f"{jobset}-workers-0-{replica}", uid, owner=("Job", f"{jobset}-workers-0"),
                      labels={"jobset.sigs.k8s.io/jobset-name": jobset})


def uid_of(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-000000000000"


def container_id(i: int) -> str:
    return f"{i:064x}"


class Node:
    """The pipeline of an agent with API access on a node whose pods the test lists."""

    def __init__(self, pods: list[dict[str, Any]], *, max_workloads: int = MAX_WORKLOADS) -> None:
        resolver = WorkloadResolver(RuntimeNames(read_files=False))
        self.replay = Replay(live_settings(counting=False), store=Store(max_workloads=max_workloads),
                             resolver=resolver, now=1000.0)
        self.replay.step(pods_listed(*pods))  # the pod source's first list

    def start_pod(self, pod: dict[str, Any], i: int, container: str = "main") -> None:
        """The pod's cgroup and one container's, as the cgroup source finds them (the container's names read
        from its runtime bundle)."""
        meta = pod["metadata"]
        pod_path = f"/kubepods/burstable/pod{meta['uid']}"
        names = ContainerNames(container_id=container_id(i), container_type="container", container=container,
                               pod=meta["name"], namespace=meta["namespace"], pod_uid=meta["uid"])
        self.replay.run([
            CgroupAdded(pod_path, ino=None, local=None, oom_group=0, limited=False, pids=()),
            CgroupAdded(f"{pod_path}/{container_id(i)}", ino=None, local=None, oom_group=1, limited=True, pids=(),
                        names=names),
        ])

    def collector(self) -> OomwatchCollector:
        view = self.replay.pipeline.view()
        return OomwatchCollector(view, lambda: [], lambda: NodeInfo("6.1.0", "2", "false"),
                                 workloads=lambda: view.workloads)


def info_samples(body: bytes) -> list[dict[str, str]]:
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    return [s.labels for s in families[INFO].samples]


# --- which workloads get a series, and what it says ---------------------------------------------------


def test_a_jobset_pod_has_one_series_whatever_its_containers() -> None:
    pod = jobset_pod("ml", "train", 0, uid_of(1))
    node = Node([pod])
    node.start_pod(pod, 1, "trainer")
    # a second container of the same pod
    meta = pod["metadata"]
    node.replay.run([CgroupAdded(f"/kubepods/burstable/pod{meta['uid']}/{container_id(2)}", ino=None, local=None,
                                 oom_group=1, limited=True, pids=(),
                                 names=ContainerNames(container_id=container_id(2), container_type="container",
                                                      container="loader", pod=meta["name"], namespace="ml",
                                                      pod_uid=meta["uid"]))])
    assert info_samples(node.collector().exposition()) == [
        {"cgroup": "", "job_kind": "JobSet", "job_name": "train", "namespace": "ml", "owner_kind": "Job",
         "owner_name": "train-workers-0", "pod": "train-workers-0-0"}]


def test_job_is_the_training_job_else_the_controlling_owner() -> None:
    pods = [
        pod_object("ml", "pt-master-0", uid_of(1), owner=("PyTorchJob", "pt"),
                   labels={"training.kubeflow.org/job-name": "pt",
                           "training.kubeflow.org/operator-name": "pytorchjob-controller"}),
        pod_object("batch", "etl-x7k2p", uid_of(2), owner=("Job", "etl")),  # a plain batch Job: its owner
        pod_object("shop", "web-5d8f-abcde", uid_of(3), owner=("ReplicaSet", "web-5d8f")),
        pod_object("ray", "raycluster-head-xyz", uid_of(4), owner=("RayCluster", "raycluster")),
        pod_object("kueue", "sample-job-abc", uid_of(5), owner=("Job", "sample-job"),
                   labels={"kueue.x-k8s.io/queue-name": "user-queue"}),
        pod_object("det", "exp-1-trial-2", uid_of(6), labels={"determined": "alloc-17"}),
        pod_object("default", "bare", uid_of(7)),  # no owner, no job: no series
    ]
    node = Node(pods)
    for i, pod in enumerate(pods, 1):
        node.start_pod(pod, i)
    got = {(s["namespace"], s["pod"]): (s["job_kind"], s["job_name"], s["owner_kind"], s["owner_name"])
           for s in info_samples(node.collector().exposition())}
    assert got == {
        ("ml", "pt-master-0"): ("PyTorchJob", "pt", "PyTorchJob", "pt"),
        ("batch", "etl-x7k2p"): ("Job", "etl", "Job", "etl"),
        ("shop", "web-5d8f-abcde"): ("ReplicaSet", "web-5d8f", "ReplicaSet", "web-5d8f"),
        ("ray", "raycluster-head-xyz"): ("RayCluster", "raycluster", "RayCluster", "raycluster"),
        ("kueue", "sample-job-abc"): ("Job", "sample-job", "Job", "sample-job"),
        ("det", "exp-1-trial-2"): ("Determined", "alloc-17", "", ""),
    }


def test_slurm_job_steps_and_other_workloads() -> None:
    node = Node([])
    scope = "/system.slice/slurmstepd.scope"
    node.replay.run([
        CgroupAdded(f"{scope}/job_42", ino=None, local=None, oom_group=0, limited=True, pids=()),
        CgroupAdded(f"{scope}/job_42/step_0", ino=None, local=None, oom_group=1, limited=True, pids=()),
        CgroupAdded(f"{scope}/job_42/step_batch", ino=None, local=None, oom_group=1, limited=True, pids=()),
        CgroupAdded("/system.slice/nginx.service", ino=None, local=None, oom_group=0, limited=True, pids=()),
        # a job_<id> spelt outside slurmd's scope is not Slurm's (docs/contract.md "Identity")
        CgroupAdded("/user.slice/user-1000.slice/job_43/step_0", ino=None, local=None, oom_group=1,
                    limited=True, pids=()),
    ])
    samples = info_samples(node.collector().exposition())
    # the job's own cgroup (it has a limit: a workload of its own) and each step's
    assert {s["cgroup"]: (s["job_kind"], s["job_name"]) for s in samples} == {
        f"{scope}/job_42": ("SlurmJob", "42"),
        f"{scope}/job_42/step_0": ("SlurmJob", "42"),
        f"{scope}/job_42/step_batch": ("SlurmJob", "42"),
    }
    assert all(s["namespace"] == s["pod"] == s["owner_kind"] == s["owner_name"] == "" for s in samples)


def test_a_pod_told_two_jobs_gets_one_series_in_any_order() -> None:
    a = Workload(type="k8s-pod", cgroup="/k/pod1", namespace="ml", pod="p", owner={"kind": "Job", "name": "b"})
    b = Workload(type="k8s-container", cgroup="/k/pod1/c", namespace="ml", pod="p", container="c",
                 owner={"kind": "Job", "name": "a"})
    rows = [("/k/pod1", ("ml", "p", "", ""), a), ("/k/pod1/c", ("ml", "p", "c", ""), b)]
    assert job_info_labels(rows) == job_info_labels(rows[::-1])
    assert [s["job_name"] for s in job_info_labels(rows)] == ["a"]


def test_left_out_where_the_collector_has_no_workloads() -> None:
    """A collector given no View workloads (a tool over a bare store) writes no such family at all."""
    body = OomwatchCollector(Store(), lambda: [], lambda: NodeInfo("k", "2", "false")).exposition().decode()
    assert INFO not in body


def test_hostile_job_names_match_prometheus_client() -> None:
    """Names from the API server go through the same label escaping as the workloads': the collector's text is
    prometheus_client's, byte for byte."""
    w = Workload(type="k8s-pod", cgroup="/k/p", namespace="n\"s", pod="p\\od\n",
                 owner={"kind": "Job", "name": "x\udcffy"}, job={"kind": "Train\"Job", "name": "j\nk"})
    rows = [("/k/p", ("n\"s", "p\\od\n", "", ""), w)]
    store = Store()
    store.seen(("n\"s", "p\\od\n", "", ""))
    stats = CgroupStats(path="/k/p", oom_group=0, events={}, limit_bytes=1.0, usage_bytes=1, peak_bytes=None)

    def live():
        return [(("n\"s", "p\\od\n", "", ""), stats)]

    def info():
        return NodeInfo("k", "2", "false")

    ours = OomwatchCollector(store, live, info, workloads=lambda: rows)
    reference = ReferenceCollector(store, live, info, workloads=lambda: rows)
    assert ours.exposition() == reference_text(reference)
    assert ours.exposition() == reference_text(ours)
    assert 'job_name="j\\\\x0ak"' in ours.exposition().decode() and 'owner_name="x\\\\xffy"' in ours.exposition().decode()


# --- cardinality --------------------------------------------------------------------------------------


def test_ten_thousand_pods_in_a_thousand_jobs_stay_within_the_cap() -> None:
    """10,000 pods of 1,000 JobSets (10 workers each) on one node: 20,000 workloads (pod and container cgroups),
    exactly the store's cap, all exported; one info series per pod, 1,000 job names, and no label value that is
    not a name the cluster gave."""
    pods = [jobset_pod(f"team-{i % 7}", f"train-{i // 10}", i % 10, uid_of(i)) for i in range(10_000)]
    node = Node(pods)
    t = time.monotonic()
    for i, pod in enumerate(pods):
        node.start_pod(pod, i)
    view = node.replay.pipeline.view()
    assert view.workloads_over_cap == 0 and len(view.workloads) == MAX_WORKLOADS
    collector = node.collector()
    body = collector.exposition()
    elapsed = time.monotonic() - t
    samples = info_samples(body)
    assert len(samples) == 10_000
    assert len({(s["namespace"], s["pod"]) for s in samples}) == 10_000
    assert len({s["job_name"] for s in samples}) == 1_000
    assert {s["job_kind"] for s in samples} == {"JobSet"} and {s["owner_kind"] for s in samples} == {"Job"}
    names = {p["metadata"]["name"] for p in pods}
    namespaces = {p["metadata"]["namespace"] for p in pods}
    jobs = {p["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] for p in pods}
    owners = {p["metadata"]["ownerReferences"][0]["name"] for p in pods}
    for s in samples:
        assert set(s) == set(JOB_INFO_LABELS)
        assert s["pod"] in names and s["namespace"] in namespaces and s["cgroup"] == ""
        assert s["job_name"] in jobs and s["owner_name"] in owners
    # every series of the scrape: each workload's, the node's, and one info series per pod
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    per_workload = sum(1 for line in body.decode().splitlines() if line.startswith("oomwatch_oom_kills_total{"))
    assert per_workload == 2 * MAX_WORKLOADS  # single and group, for each of the 20,000
    assert series - len(samples) == 4 * MAX_WORKLOADS + _node_series(body)  # kills x2, killed x2 per workload
    print(f"\n10,000 pods in 1,000 jobs: {len(samples)} info series, {series} series in all, "
          f"{len(body) / 1e6:.1f} MB, {elapsed:.1f} s through the pipeline and one scrape")


def _node_series(body: bytes) -> int:
    workload_prefixes = ("oomwatch_oom_kills_total{", "oomwatch_oom_killed_processes_total{", INFO + "{")
    return sum(1 for line in body.decode().splitlines()
               if line and not line.startswith("#") and not line.startswith(workload_prefixes))


def test_pods_beyond_the_cap_get_no_info_series() -> None:
    """When the store is full of live workloads, those beyond it have no series (oomwatch_workloads_over_cap),
    and no info series either: the info follows the workloads that are exported."""
    pods = [jobset_pod("ml", f"train-{i // 10}", i % 10, uid_of(i)) for i in range(300)]
    node = Node(pods, max_workloads=400)
    for i, pod in enumerate(pods):
        node.start_pod(pod, i)
    view = node.replay.pipeline.view()
    assert len(view.workloads) == 400 and view.workloads_over_cap == 200
    samples = info_samples(node.collector().exposition())
    exported_pods = {labels[:2] for _, labels, _ in view.workloads}
    assert {(s["namespace"], s["pod"]) for s in samples} == exported_pods
    assert len(samples) <= 400


@pytest.mark.tools
def test_promtool_accepts_the_info_family() -> None:
    """The real promtool on a scrape with JobSet, batch Job and Slurm series: nothing to say (no lint either:
    an info gauge named `_info`, value 1)."""
    pods = [jobset_pod("ml", "train", 0, uid_of(1)), pod_object("batch", "etl-1", uid_of(2), owner=("Job", "etl"))]
    node = Node(pods)
    for i, pod in enumerate(pods, 1):
        node.start_pod(pod, i)
    node.replay.run([CgroupAdded("/system.slice/slurmstepd.scope/job_7/step_0", ino=None, local=None, oom_group=1,
                                 limited=True, pids=())])
    body = node.collector().exposition()
    assert len(info_samples(body)) == 3
    assert promtool_complaint(body) is None
