"""Names from the node: OCI bundle annotations (containerd, CRI-O), the kubelet's log directories, the cache
that outlives a deleted container, and the resolver that puts them on a Workload."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from oomwatch.workloads import WorkloadResolver
from oomwatch.workloads.kubeapi import pod_info_from_object
from oomwatch.workloads.runtime import (
    RuntimeNames,
    parse_container_log_name,
    parse_oci_config,
    parse_pod_log_dir,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "workloads"
CONTAINERD_BUNDLES = FIXTURES / "run/containerd/io.containerd.runtime.v2.task/k8s.io"
CRIO_BUNDLES = FIXTURES / "run/containers/storage/overlay-containers"

# containerd pod ml-team/trainer-worker-0 (burstable, systemd driver)
CTRD_SANDBOX = "5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9"
CTRD_CONTAINER = "6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b"
CTRD_POD_UID = "24f2bbdc-1d3e-4978-8054-90f565dfe654"
# CRI-O pod default/redis-7d9f8b6c5-x2k4q (besteffort)
CRIO_CONTAINER = "d4735e3a265e16eee03f59718b9b5d03019c07d8b6c51f90da3a666eec13ab35"
CRIO_SANDBOX = "4e07408562bedb8b60ce05c1decfe3ad16b72230967de01f640b7e4729b49fce"
CRIO_POD_UID = "7bf73b50-3f74-4daf-9010-e4d48c021cb4"
# cri-dockerd container shop/web-5c9d7f-abcde nginx: only /var/log names it
DOCKER_CONTAINER = "4b227777d4dd1fc61c6f884f48641d02b4d121d3fd328cb08b5531fcacdabf8a"
DOCKER_POD_UID = "a36d08ad-7da3-4032-aac4-2c4b59bc2d7b"
GARBLED = "ef2d127de37b942baad06145e54b0c619a1f22327b2ebbcfbec78f5564afe39d"


def _names(root: Path) -> RuntimeNames:
    return RuntimeNames(run_root=str(root / "run"), pod_log_root=str(root / "var/log/pods"))


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """A private copy of the fixture node, so a test can delete bundles."""
    shutil.copytree(FIXTURES / "run", tmp_path / "run")
    shutil.copytree(FIXTURES / "var", tmp_path / "var")
    return tmp_path


# --- parsers ---------------------------------------------------------------------------------------


def test_parse_containerd_container():
    text = (CONTAINERD_BUNDLES / CTRD_CONTAINER / "config.json").read_text()
    names = parse_oci_config(text)
    assert names is not None
    assert names.container_id == CTRD_CONTAINER  # from linux.cgroupsPath
    assert names.container_type == "container"
    assert names.container == "pytorch"
    assert names.pod == "trainer-worker-0"
    assert names.namespace == "ml-team"
    assert names.pod_uid == CTRD_POD_UID
    assert names.image == "ghcr.io/example/pytorch-train:2.3.1"
    assert names.sandbox_id == CTRD_SANDBOX
    assert names.runtime == "containerd"
    assert not names.is_sandbox


def test_parse_containerd_sandbox():
    names = parse_oci_config((CONTAINERD_BUNDLES / CTRD_SANDBOX / "config.json").read_text())
    assert names is not None
    assert names.is_sandbox
    assert names.container is None
    assert names.container_id == CTRD_SANDBOX
    assert (names.namespace, names.pod, names.pod_uid) == ("ml-team", "trainer-worker-0", CTRD_POD_UID)


def test_parse_crio_container():
    names = parse_oci_config((CRIO_BUNDLES / CRIO_CONTAINER / "userdata/config.json").read_text())
    assert names is not None
    assert names.runtime == "cri-o"
    assert names.container_id == CRIO_CONTAINER
    assert names.container_type == "container"
    assert names.container == "redis"
    assert (names.namespace, names.pod, names.pod_uid) == ("default", "redis-7d9f8b6c5-x2k4q", CRIO_POD_UID)
    assert names.image == "docker.io/library/redis:7.2"
    assert names.sandbox_id == CRIO_SANDBOX


def test_parse_crio_sandbox_is_not_a_container_named_pod():
    names = parse_oci_config((CRIO_BUNDLES / CRIO_SANDBOX / "userdata/config.json").read_text())
    assert names is not None
    assert names.is_sandbox
    assert names.container is None  # "POD" is the sandbox, not a container name
    assert names.pod == "redis-7d9f8b6c5-x2k4q"


def test_parse_crio_falls_back_to_the_labels_json():
    labels = {"io.kubernetes.container.name": "sidecar", "io.kubernetes.pod.name": "api-0",
              "io.kubernetes.pod.namespace": "prod", "io.kubernetes.pod.uid": CRIO_POD_UID}
    text = json.dumps({"ociVersion": "1.0.2-dev", "annotations": {
        "io.kubernetes.cri-o.ContainerType": "container",
        "io.kubernetes.cri-o.ContainerID": CRIO_CONTAINER,
        "io.kubernetes.cri-o.Labels": json.dumps(labels)}})
    names = parse_oci_config(text)
    assert names is not None
    assert (names.container, names.pod, names.namespace, names.pod_uid) == ("sidecar", "api-0", "prod", CRIO_POD_UID)


def test_parse_oci_config_takes_the_bundle_id_over_the_file():
    text = (CONTAINERD_BUNDLES / CTRD_CONTAINER / "config.json").read_text()
    assert parse_oci_config(text, container_id="f" * 64).container_id == "f" * 64


def test_cgroupfs_cgroups_path_gives_the_id():
    text = json.dumps({"annotations": {"io.kubernetes.cri.container-type": "container",
                                       "io.kubernetes.cri.container-name": "app"},
                       "linux": {"cgroupsPath": f"/kubepods/burstable/pod{CTRD_POD_UID}/{CTRD_CONTAINER}"}})
    names = parse_oci_config(text)
    assert names is not None
    assert names.container_id == CTRD_CONTAINER
    assert names.pod_uid is None  # containerd < 1.6.11 wrote no sandbox-uid


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        (CONTAINERD_BUNDLES / GARBLED / "config.json").read_text(),
        "[1, 2, 3]",
        '{"ociVersion": "1.1.0"}',
        '{"annotations": "not a map"}',
        '{"annotations": {"org.opencontainers.image.title": "plain ctr run"}}',
        "\x00\xff garbage",
    ],
)
def test_parse_oci_config_garbage_is_none(text):
    assert parse_oci_config(text) is None


def test_parse_pod_log_dir():
    parsed = parse_pod_log_dir(f"shop_web-5c9d7f-abcde_{DOCKER_POD_UID}")
    assert parsed is not None
    assert (parsed.namespace, parsed.pod, parsed.pod_uid) == ("shop", "web-5c9d7f-abcde", DOCKER_POD_UID)
    assert parse_pod_log_dir("no-underscores") is None
    assert parse_pod_log_dir("a_b_c_d") is None
    assert parse_pod_log_dir("a__c") is None


def test_parse_container_log_name():
    parsed = parse_container_log_name(f"web-5c9d7f-abcde_shop_nginx-sidecar-{DOCKER_CONTAINER}.log")
    assert parsed is not None
    assert (parsed.pod, parsed.namespace, parsed.container, parsed.container_id) == (
        "web-5c9d7f-abcde", "shop", "nginx-sidecar", DOCKER_CONTAINER)
    assert parse_container_log_name("web_shop_nginx-notanid.log") is None
    assert parse_container_log_name("not-a-container-log.txt") is None


# --- reader and cache ------------------------------------------------------------------------------


def test_lookup_reads_containerd_and_crio_bundles(node):
    names = _names(node)
    ctrd = names.lookup(CTRD_CONTAINER)
    crio = names.lookup(CRIO_CONTAINER)
    assert ctrd is not None and ctrd.container == "pytorch" and ctrd.runtime == "containerd"
    assert crio is not None and crio.container == "redis" and crio.runtime == "cri-o"


def test_crio_root_is_configurable(tmp_path):
    shutil.copytree(CRIO_BUNDLES, tmp_path / "storage")
    names = RuntimeNames(run_root=str(tmp_path / "nothing"), pod_log_root=str(tmp_path / "nologs"),
                         crio_root=str(tmp_path / "storage"))
    found = names.lookup(CRIO_CONTAINER)
    assert found is not None and found.container == "redis"


def test_names_survive_the_bundle(node):
    names = _names(node)
    remembered = names.remember(CTRD_CONTAINER)
    assert remembered is not None and remembered.container == "pytorch"
    shutil.rmtree(node / "run/containerd/io.containerd.runtime.v2.task/k8s.io" / CTRD_CONTAINER)
    after = names.lookup(CTRD_CONTAINER)
    assert after == remembered
    # a fresh reader, without the cache, no longer finds the bundle; it falls back to the pod's log dir
    fresh = _names(node).lookup(CTRD_CONTAINER, CTRD_POD_UID)
    assert fresh is not None
    assert fresh.container is None
    assert (fresh.pod, fresh.namespace) == ("trainer-worker-0", "ml-team")


def test_container_log_symlink_names_a_docker_container(node):
    found = _names(node).lookup(DOCKER_CONTAINER, DOCKER_POD_UID)
    assert found is not None
    assert (found.container, found.pod, found.namespace, found.pod_uid) == (
        "nginx", "web-5c9d7f-abcde", "shop", DOCKER_POD_UID)


def test_pod_only_lookup_by_uid(node):
    found = _names(node).lookup(None, CRIO_POD_UID)
    assert found is not None
    assert (found.pod, found.namespace, found.pod_uid, found.container) == (
        "redis-7d9f8b6c5-x2k4q", "default", CRIO_POD_UID, None)


def test_missing_and_garbled_are_none(node):
    names = _names(node)
    assert names.lookup(GARBLED) is None
    assert names.lookup("0" * 64) is None
    assert names.lookup(None, "00000000-0000-0000-0000-000000000000") is None
    assert names.remember("../../etc") is None  # never a path outside the bundle root
    assert len(names) == 0
    assert RuntimeNames(run_root="/nonexistent", pod_log_root="/nonexistent/pods").lookup(CTRD_CONTAINER) is None


def test_cache_is_bounded(node):
    names = RuntimeNames(run_root=str(node / "run"), pod_log_root=str(node / "var/log/pods"), max_entries=2)
    for cid in (CTRD_CONTAINER, CTRD_SANDBOX, CRIO_CONTAINER):
        assert names.remember(cid) is not None
    assert len(names) == 2


# --- resolver --------------------------------------------------------------------------------------

SD_POD = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod24f2bbdc_1d3e_4978_8054_90f565dfe654.slice"
CTRD_CGROUP = f"{SD_POD}/cri-containerd-{CTRD_CONTAINER}.scope"


def test_resolver_names_a_container_after_its_bundle_is_gone(node):
    resolver = WorkloadResolver(_names(node), None)
    assert resolver.container_appeared(CTRD_CGROUP) is not None
    assert resolver.container_appeared(CTRD_CGROUP + "/container") is None  # crun child: nothing new
    assert resolver.container_appeared(SD_POD) is None  # a pod cgroup is not a container
    shutil.rmtree(node / "run/containerd/io.containerd.runtime.v2.task/k8s.io" / CTRD_CONTAINER)
    workload = resolver.resolve(CTRD_CGROUP + "/exec")
    assert workload.type == "k8s-container"
    assert workload.cgroup == CTRD_CGROUP
    assert (workload.namespace, workload.pod, workload.container) == ("ml-team", "trainer-worker-0", "pytorch")
    assert workload.pod_uid == "24f2bbdc-1d3e-4978-8054-90f565dfe654"
    assert workload.runtime == "containerd"
    assert workload.metric_labels() == ("ml-team", "trainer-worker-0", "pytorch", "")


def test_resolver_marks_the_sandbox(node):
    workload = WorkloadResolver(_names(node)).resolve(f"{SD_POD}/cri-containerd-{CTRD_SANDBOX}.scope")
    assert workload.sandbox is True
    assert workload.container is None
    assert workload.pod == "trainer-worker-0"


def test_resolver_adds_owner_and_job_from_the_pods_it_is_given(node):
    info = pod_info_from_object({"metadata": {
        "name": "trainer-worker-0", "namespace": "ml-team", "uid": "24f2bbdc-1d3e-4978-8054-90f565dfe654",
        "labels": {"training.kubeflow.org/job-name": "trainer",
                   "training.kubeflow.org/operator-name": "pytorchjob-controller"},
        "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "trainer",
                             "uid": "0b7c2a51-93f4-4c1e-8d5a-6e2f1b0c9d8e", "controller": True}]}})
    workload = WorkloadResolver(None, {info.uid: info}.get).resolve(CTRD_CGROUP)
    assert workload.owner == {"kind": "PyTorchJob", "name": "trainer", "apiVersion": "kubeflow.org/v1",
                              "uid": "0b7c2a51-93f4-4c1e-8d5a-6e2f1b0c9d8e"}
    assert workload.job == {"kind": "PyTorchJob", "name": "trainer"}
    assert (workload.namespace, workload.pod) == ("ml-team", "trainer-worker-0")
    assert workload.to_json()["job"] == {"kind": "PyTorchJob", "name": "trainer"}


def test_resolver_leaves_non_kubernetes_alone(node):
    resolver = WorkloadResolver(_names(node), {}.get)
    workload = resolver.resolve("/system.slice/slurmstepd.scope/job_4187/step_0/user/task_0")
    assert workload.type == "slurm" and workload.pod is None and workload.owner is None


def test_resolver_without_any_source_is_identify(node):
    workload = WorkloadResolver().resolve(CTRD_CGROUP)
    assert workload.type == "k8s-container"
    assert workload.pod is None and workload.container_id == CTRD_CONTAINER
