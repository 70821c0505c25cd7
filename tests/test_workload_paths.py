"""cgroup path → workload: table-driven over real-shaped paths (both cgroup drivers, every QoS class,
each runtime, crun children, Slurm, systemd), the kubelet's cgroupRoot, paths forged to look like another
pod's or Slurm job's, and the docs/contract.md `scope` rules."""

from __future__ import annotations

import os

import pytest

from oomwatch.model import Incident, KilledProcess
from oomwatch.sinks.collector import NodeInfo, OomwatchCollector
from oomwatch.store import Store
from oomwatch.workloads import (
    CgroupLayout,
    WorkloadResolver,
    container_cgroup_of,
    identify,
    is_kubepods_root,
    kubepods_level,
    pod_cgroup_of,
    scope_of,
)
from oomwatch.parse.kmsg import unescape
from oomwatch.names import as_logged
from oomwatch.workloads.paths import kubepods_roots, normalize
from oomwatch.workloads.runtime import ContainerNames

UID = "0b0c6e1a-7d2f-4c4e-9a1b-3f5e8d2c7a41"
UID_ = UID.replace("-", "_")
STATIC_UID = "8e3f2d1c0b9a8f7e6d5c4b3a29180706"  # static pods: an md5 hex, no dashes
CID = "4f2a9c1e7b3d5f8a0c2e4b6d8f1a3c5e7b9d0f2a4c6e8b1d3f5a7c9e0b2d4f6a"
CID2 = "9d1e7f3a5b8c0d2e4f6a8b1c3d5e7f9a0b2c4d6e8f1a3b5c7d9e0f2a4b6c8d1e"

SD_BURST_POD = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
SD_BE_POD = f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"
SD_GUAR_POD = f"/kubepods.slice/kubepods-pod{UID_}.slice"
FS_BURST_POD = f"/kubepods/burstable/pod{UID}"
FS_BE_POD = f"/kubepods/besteffort/pod{UID}"
FS_GUAR_POD = f"/kubepods/pod{UID}"

# (path, type, workload cgroup, pod_uid, container_id, runtime, level)
KUBERNETES_CASES = [
    # systemd driver, containerd, each QoS class
    (f"{SD_BURST_POD}/cri-containerd-{CID}.scope", "k8s-container", f"{SD_BURST_POD}/cri-containerd-{CID}.scope",
     UID, CID, "containerd", "container"),
    (f"{SD_BE_POD}/cri-containerd-{CID}.scope", "k8s-container", f"{SD_BE_POD}/cri-containerd-{CID}.scope",
     UID, CID, "containerd", "container"),
    (f"{SD_GUAR_POD}/cri-containerd-{CID}.scope", "k8s-container", f"{SD_GUAR_POD}/cri-containerd-{CID}.scope",
     UID, CID, "containerd", "container"),
    # cgroupfs driver: bare id (containerd or cri-dockerd: the path cannot say which)
    (f"{FS_BURST_POD}/{CID}", "k8s-container", f"{FS_BURST_POD}/{CID}", UID, CID, None, "container"),
    (f"{FS_BE_POD}/{CID}", "k8s-container", f"{FS_BE_POD}/{CID}", UID, CID, None, "container"),
    (f"{FS_GUAR_POD}/{CID}", "k8s-container", f"{FS_GUAR_POD}/{CID}", UID, CID, None, "container"),
    # CRI-O, systemd and cgroupfs
    (f"{SD_BURST_POD}/crio-{CID}.scope", "k8s-container", f"{SD_BURST_POD}/crio-{CID}.scope",
     UID, CID, "cri-o", "container"),
    (f"{FS_BURST_POD}/crio-{CID}", "k8s-container", f"{FS_BURST_POD}/crio-{CID}", UID, CID, "cri-o", "container"),
    # CRI-O's conmon is the pod's, not the container's
    (f"{SD_BURST_POD}/crio-conmon-{CID}.scope", "k8s-pod", f"{SD_BURST_POD}/crio-conmon-{CID}.scope",
     UID, None, "cri-o", "conmon"),
    # docker / cri-dockerd
    (f"{SD_BURST_POD}/docker-{CID}.scope", "k8s-container", f"{SD_BURST_POD}/docker-{CID}.scope",
     UID, CID, "docker", "container"),
    # crun's `container` / `exec` children belong to their container
    (f"{SD_BURST_POD}/crio-{CID}.scope/container", "k8s-container", f"{SD_BURST_POD}/crio-{CID}.scope",
     UID, CID, "cri-o", "container"),
    (f"{SD_GUAR_POD}/cri-containerd-{CID}.scope/exec", "k8s-container", f"{SD_GUAR_POD}/cri-containerd-{CID}.scope",
     UID, CID, "containerd", "container"),
    (f"{FS_BURST_POD}/{CID}/container/nested", "k8s-container", f"{FS_BURST_POD}/{CID}", UID, CID, None,
     "container"),
    # the pod cgroup itself
    (SD_BURST_POD, "k8s-pod", SD_BURST_POD, UID, None, None, "pod"),
    (SD_GUAR_POD, "k8s-pod", SD_GUAR_POD, UID, None, None, "pod"),
    (FS_BE_POD, "k8s-pod", FS_BE_POD, UID, None, None, "pod"),
    (f"/kubepods/burstable/pod{STATIC_UID}", "k8s-pod", f"/kubepods/burstable/pod{STATIC_UID}", STATIC_UID, None,
     None, "pod"),
    # kubepods itself (node allocatable) and its QoS classes: "other", but recognisable
    ("/kubepods.slice", "other", "/kubepods.slice", None, None, None, "node-allocatable"),
    ("/kubepods", "other", "/kubepods", None, None, None, "node-allocatable"),
    ("/kubepods.slice/kubepods-burstable.slice", "other", "/kubepods.slice/kubepods-burstable.slice", None, None,
     None, "qos"),
    ("/kubepods/besteffort", "other", "/kubepods/besteffort", None, None, None, "qos"),
]


@pytest.mark.parametrize("path,wtype,cgroup,pod_uid,container_id,runtime,level", KUBERNETES_CASES)
def test_kubernetes_paths(path, wtype, cgroup, pod_uid, container_id, runtime, level):
    workload = identify(path)
    assert workload.type == wtype
    assert workload.cgroup == cgroup
    assert workload.pod_uid == pod_uid
    assert workload.container_id == container_id
    assert workload.runtime == runtime
    assert kubepods_level(path) == level


# A kubelet with a cgroupRoot:
# (cgroupRoot, path, type, workload cgroup, pod_uid, container_id, runtime, level)
KIND_SD = "/kubelet.slice/kubelet-kubepods.slice"
KIND_IN_DOCKER = f"/system.slice/docker-{CID2}.scope"
KIND_CTR = f"{KIND_SD}/kubelet-kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope"
ROOT_CASES = [
    # cgroupfs driver
    ("/kubelet", f"/kubelet/kubepods/burstable/pod{UID}/{CID}", "k8s-container",
     f"/kubelet/kubepods/burstable/pod{UID}/{CID}", UID, CID, None, "container"),
    # systemd driver (kind: cgroupRoot /kubelet), the root given as cgroupfs names or as the slice
    ("/kubelet", f"{KIND_SD}/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/"
     f"cri-containerd-{CID}.scope", "k8s-container",
     f"{KIND_SD}/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/"
     f"cri-containerd-{CID}.scope", UID, CID, "containerd", "container"),
    ("/kubelet.slice", f"{KIND_SD}/kubelet-kubepods-pod{UID_}.slice", "k8s-pod",
     f"{KIND_SD}/kubelet-kubepods-pod{UID_}.slice", UID, None, None, "pod"),
    ("/kubelet", KIND_SD, "other", KIND_SD, None, None, None, "node-allocatable"),
    ("/kubelet", f"{KIND_SD}/kubelet-kubepods-burstable.slice", "other",
     f"{KIND_SD}/kubelet-kubepods-burstable.slice", None, None, None, "qos"),
    # kind seen from the host: the node container's scope, then the kubelet's root
    (f"{KIND_IN_DOCKER}/kubelet", f"{KIND_IN_DOCKER}{KIND_CTR}", "k8s-container", f"{KIND_IN_DOCKER}{KIND_CTR}",
     UID, CID, "containerd", "container"),
    # with that root, the default root's layout is nobody's pods, and neither is kind's root seen from the host
    ("/kubelet", f"/kubepods/burstable/pod{UID}/{CID}", "other", f"/kubepods/burstable/pod{UID}/{CID}", None,
     None, None, None),
    ("/kubelet", f"{KIND_IN_DOCKER}{KIND_CTR}", "systemd", f"{KIND_IN_DOCKER}{KIND_CTR}", None, CID, "containerd",
     None),
    # the systemd names must carry the root's prefix: an unrecognised child of kubepods, no pod
    ("/kubelet", f"{KIND_SD}/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope", "other",
     f"{KIND_SD}/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope", None, None, None, None),
]


@pytest.mark.parametrize("root,path,wtype,cgroup,pod_uid,container_id,runtime,level", ROOT_CASES)
def test_the_kubelets_cgroup_root(root, path, wtype, cgroup, pod_uid, container_id, runtime, level):
    layout = CgroupLayout(root)
    workload = layout.identify(path)
    assert (workload.type, workload.cgroup, workload.pod_uid, workload.container_id, workload.runtime) == (
        wtype, cgroup, pod_uid, container_id, runtime)
    assert layout.kubepods_level(path) == level
    assert WorkloadResolver(layout=layout).identify(path) == workload


@pytest.mark.parametrize(
    "root,cgroupfs,systemd",
    [
        ("/", "/kubepods", "/kubepods.slice"),
        ("", "/kubepods", "/kubepods.slice"),
        ("/kubelet", "/kubelet/kubepods", "/kubelet.slice/kubelet-kubepods.slice"),
        ("/kubelet.slice", "/kubelet.slice/kubepods", "/kubelet.slice/kubelet-kubepods.slice"),
        ("/a-b/c", "/a-b/c/kubepods", "/a_b.slice/a_b-c.slice/a_b-c-kubepods.slice"),
        (f"{KIND_IN_DOCKER}/kubelet", f"{KIND_IN_DOCKER}/kubelet/kubepods",
         f"{KIND_IN_DOCKER}/kubelet.slice/kubelet-kubepods.slice"),
    ],
)
def test_kubepods_roots(root, cgroupfs, systemd):
    assert ["/" + "/".join(r.parts) for r in kubepods_roots(root)] == [cgroupfs, systemd]


# --- forged identities -----------------------------------------------------------------------------------

USER = "/user.slice/user-1000.slice/user@1000.service"
# (path, type, workload cgroup): anyone with a delegated subtree can spell a pod's or a job's path below it.
FORGED = [
    (f"{USER}/kubepods/burstable/pod{UID}/{CID}", "systemd", USER),
    (f"{USER}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice", "systemd",
     f"{USER}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"),
    (f"{USER}/app.slice/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope", "systemd",
     f"{USER}/app.slice/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope"),
    (f"/rootless/kubepods/pod{UID}/{CID}", "other", f"/rootless/kubepods/pod{UID}/{CID}"),
    (f"{USER}/slurmstepd.scope/job_42/step_0/user/task_0", "systemd", f"{USER}/slurmstepd.scope"),
    (f"{USER}/job_42/step_0", "systemd", USER),
    ("/system.slice/foo.service/slurmstepd.scope/job_42/step_0", "systemd",
     "/system.slice/foo.service/slurmstepd.scope"),
    ("/srv/slurmstepd.scope/job_42/step_batch", "systemd", "/srv/slurmstepd.scope"),
]


@pytest.mark.parametrize("path,wtype,cgroup", FORGED)
def test_a_path_spelt_like_a_pod_or_a_job_elsewhere_is_neither(path, wtype, cgroup):
    workload = identify(path)
    assert (workload.type, workload.cgroup) == (wtype, cgroup)
    assert workload.pod_uid is None and workload.slurm_job is None
    assert kubepods_level(path) is None and pod_cgroup_of(path) is None and container_cgroup_of(path) is None
    assert workload.metric_labels() == ("", "", "", cgroup)  # its own series, under its own cgroup


def test_below_a_real_container_a_forged_pod_is_still_that_container():
    """A container allowed to create cgroups (cgroupns, delegation) nests another pod's path: its kills stay
    its own container's."""
    outer = f"{FS_BURST_POD}/{CID}"
    workload = identify(f"{outer}/kubepods/burstable/pod{STATIC_UID}/{CID2}")
    assert (workload.type, workload.cgroup, workload.container_id, workload.pod_uid) == (
        "k8s-container", outer, CID, UID)


class _Names:
    """The runtime's names of the real container (its bundle), as RuntimeNames.lookup gives them."""

    def lookup(self, container_id, pod_uid=None):
        if container_id == CID or pod_uid == UID:
            return ContainerNames(container_id=container_id, container_type="container", container="trainer",
                                  pod="train-0", namespace="ml", pod_uid=UID, runtime="containerd")
        return None


def _kill(cgroup: str, workload, seq: int) -> Incident:
    victim = KilledProcess(pid=100 + seq, comm="dd", uid=1000, cgroup=cgroup, total_vm_bytes=1,
                           anon_rss_bytes=1, file_rss_bytes=0, shmem_rss_bytes=0, oom_score_adj=0)
    return Incident(time=1795380000.0 + seq, boot_id="b", kernel_seq=seq, kind="group", constraint="memcg",
                    scope="container", oom_cgroup=cgroup, group_cgroup=cgroup, trigger=None, memory=None,
                    victim=victim, killed=(victim,), workload=workload, workloads=(workload,),
                    explanation="x", detected_at=1795380000.5 + seq, evidence="kmsg")


def test_kills_in_a_forged_pod_path_never_reach_the_real_pods_series():
    """Issue 19: three kills in a user's `…/kubepods/burstable/pod<real uid>/<real container id>` raised the
    real container's group kills from 1 to 4: the path resolved to its names through the runtime's bundle."""
    real, forged = f"{FS_BURST_POD}/{CID}", f"{USER}/kubepods/burstable/pod{UID}/{CID}"
    resolver = WorkloadResolver(_Names())  # type: ignore[arg-type]
    real_workload, forged_workload = resolver.resolve(real), resolver.resolve(forged)
    assert real_workload.metric_labels() == ("ml", "train-0", "trainer", "")
    assert (forged_workload.type, forged_workload.pod, forged_workload.namespace) == ("systemd", None, None)
    store = Store(clock=lambda: 1000.0)
    store.publish(_kill(real, real_workload, 1))
    for seq in (2, 3, 4):
        store.publish(_kill(forged, forged_workload, seq))
    text = OomwatchCollector(store, lambda: [], lambda: NodeInfo("6.1", "2", "false")).exposition().decode()
    assert ('oomwatch_oom_kills_total{cgroup="",container="trainer",kind="group",namespace="ml",'
            'pod="train-0"} 1.0\n') in text
    assert (f'oomwatch_oom_kills_total{{cgroup="{USER}",container="",kind="group",namespace="",pod=""}} 3.0\n'
            in text)
    assert resolver.container_appeared(forged) is None  # its names are not even read


def test_names_keep_every_byte_but_slashes():
    """A cgroup name may start or end with spaces or newlines: they are part of its identity."""
    for path in ("/a/b ", "/a/ b", "/a/b\n", "/a/\tb.service\t"):
        assert normalize(path) == path
        assert identify(path).cgroup == path
    assert identify("/system.slice/x.service\n").unit == "system.slice"  # `x.service\n` is no unit name
    assert normalize("//a//b/") == "/a/b"


def test_pod_uid_loses_systemd_underscores():
    workload = identify(f"{SD_BURST_POD}/cri-containerd-{CID}.scope")
    assert workload.pod_uid == UID
    assert "_" not in workload.pod_uid


def test_container_records_its_pod_cgroup():
    assert identify(f"{SD_BE_POD}/crio-{CID}.scope/container").pod_cgroup == SD_BE_POD
    assert identify(f"{FS_GUAR_POD}/{CID}").pod_cgroup == FS_GUAR_POD


@pytest.mark.parametrize(
    "path,pod,container",
    [
        (f"{SD_BURST_POD}/cri-containerd-{CID}.scope/exec", SD_BURST_POD, f"{SD_BURST_POD}/cri-containerd-{CID}.scope"),
        (SD_GUAR_POD, SD_GUAR_POD, None),
        (f"{SD_BURST_POD}/crio-conmon-{CID}.scope", SD_BURST_POD, None),
        ("/kubepods/burstable", None, None),
        ("/system.slice/containerd.service", None, None),
        (f"{FS_BE_POD}/{CID}", FS_BE_POD, f"{FS_BE_POD}/{CID}"),
    ],
)
def test_pod_and_container_cgroup_of(path, pod, container):
    assert pod_cgroup_of(path) == pod
    assert container_cgroup_of(path) == container


def test_is_kubepods_root():
    assert is_kubepods_root("/kubepods.slice")
    assert is_kubepods_root("/kubepods/burstable")
    assert not is_kubepods_root(SD_BURST_POD)
    assert not is_kubepods_root("/system.slice")


# (path, workload cgroup, job, step, task)
SLURM_CASES = [
    ("/system.slice/slurmstepd.scope/job_4187/step_0/user/task_0", "/system.slice/slurmstepd.scope/job_4187/step_0",
     "4187", "0", "0"),
    ("/system.slice/slurmstepd.scope/job_4187/step_batch/user/task_special",
     "/system.slice/slurmstepd.scope/job_4187/step_batch", "4187", "batch", "special"),
    ("/system.slice/slurmstepd.scope/job_4187/step_extern/slurm", "/system.slice/slurmstepd.scope/job_4187/step_extern",
     "4187", "extern", None),
    ("/system.slice/slurmstepd.scope/job_90210/step_interactive/user/task_3",
     "/system.slice/slurmstepd.scope/job_90210/step_interactive", "90210", "interactive", "3"),
    ("/system.slice/slurmstepd.scope/job_4187/step_12", "/system.slice/slurmstepd.scope/job_4187/step_12",
     "4187", "12", None),
    # job level: the job's cgroup is the workload cgroup
    ("/system.slice/slurmstepd.scope/job_4187", "/system.slice/slurmstepd.scope/job_4187", "4187", None, None),
    # multiple-slurmd nodes name the scope after the node
    ("/system.slice/node7_slurmstepd.scope/job_55/step_1/user/task_1",
     "/system.slice/node7_slurmstepd.scope/job_55/step_1", "55", "1", "1"),
]


@pytest.mark.parametrize("path,cgroup,job,step,task", SLURM_CASES)
def test_slurm_paths(path, cgroup, job, step, task):
    workload = identify(path)
    assert workload.type == "slurm"
    assert workload.cgroup == cgroup
    assert (workload.slurm_job, workload.slurm_step, workload.slurm_task) == (job, step, task)


def test_slurmstepd_scope_itself_is_a_systemd_unit():
    workload = identify("/system.slice/slurmstepd.scope/system")
    assert workload.type == "systemd"
    assert workload.unit == "slurmstepd.scope"


# (path, unit, workload cgroup, runtime, container_id)
SYSTEMD_CASES = [
    ("/system.slice/containerd.service", "containerd.service", "/system.slice/containerd.service", None, None),
    ("/system.slice/postgresql@15-main.service", "postgresql@15-main.service",
     "/system.slice/postgresql@15-main.service", None, None),
    ("/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-firefox-4211.scope",
     "app-gnome-firefox-4211.scope",
     "/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-firefox-4211.scope", None, None),
    ("/user.slice/user-1000.slice/session-3.scope", "session-3.scope", "/user.slice/user-1000.slice/session-3.scope",
     None, None),
    ("/user.slice/user-1000.slice", "user-1000.slice", "/user.slice/user-1000.slice", None, None),
    # a unit that delegates its subtree: the unit's cgroup, not the child's
    ("/system.slice/buildkitd.service/runc-worker/abc", "buildkitd.service", "/system.slice/buildkitd.service", None,
     None),
    ("/system.slice/docker-" + CID + ".scope", "docker-" + CID + ".scope", "/system.slice/docker-" + CID + ".scope",
     "docker", CID),
    ("/machine.slice/libpod-" + CID2 + ".scope/container", "libpod-" + CID2 + ".scope",
     "/machine.slice/libpod-" + CID2 + ".scope", "podman", CID2),
    ("/init.scope", "init.scope", "/init.scope", None, None),
]


@pytest.mark.parametrize("path,unit,cgroup,runtime,container_id", SYSTEMD_CASES)
def test_systemd_paths(path, unit, cgroup, runtime, container_id):
    workload = identify(path)
    assert workload.type == "systemd"
    assert workload.unit == unit
    assert workload.cgroup == cgroup
    assert workload.runtime == runtime
    assert workload.container_id == container_id


@pytest.mark.parametrize(
    "path,cgroup",
    [
        ("/", "/"),
        ("", "/"),
        ("/oomtest", "/oomtest"),
        ("/oomtest/a/b", "/oomtest/a/b"),
        ("/batch/job_7", "/batch/job_7"),  # nothing says this job_7 is Slurm's
        ("/kubepods-extra/pod" + UID, "/kubepods-extra/pod" + UID),
        ("//oomtest//x/", "/oomtest/x"),
    ],
)
def test_other_paths(path, cgroup):
    workload = identify(path)
    assert workload.type == "other"
    assert workload.cgroup == cgroup
    assert kubepods_level(path) is None


def test_unrecognised_child_of_pod_is_the_pod():
    path = f"{FS_BURST_POD}/not-a-container"
    workload = identify(path)
    assert workload.type == "k8s-pod"
    assert workload.pod_uid == UID
    assert workload.cgroup == path
    assert kubepods_level(path) is None


CONTAINER = f"{SD_BURST_POD}/cri-containerd-{CID}.scope"


@pytest.mark.parametrize(
    "victim,oom,constraint,scope",
    [
        # global OOMs, whatever the victim
        (CONTAINER, "/", "global", "node"),
        (CONTAINER, None, "global", "node"),
        ("/system.slice/foo.service", "/", "cpuset", "node"),
        # node allocatable and QoS level: node pressure, though the kernel calls it memcg
        (CONTAINER, "/kubepods.slice", "memcg", "node"),
        (CONTAINER, "/kubepods.slice/kubepods-burstable.slice", "memcg", "node"),
        (f"{FS_BE_POD}/{CID}", "/kubepods", "memcg", "node"),
        # the container's own limit, also when the victim sits in a crun child
        (CONTAINER, CONTAINER, "memcg", "container"),
        (CONTAINER + "/container", CONTAINER, "memcg", "container"),
        (f"{FS_GUAR_POD}/{CID}", f"{FS_GUAR_POD}/{CID}/", "memcg", "container"),
        # the pod's limit
        (CONTAINER, SD_BURST_POD, "memcg", "pod"),
        (f"{SD_BURST_POD}/crio-conmon-{CID}.scope", SD_BURST_POD, "memcg", "pod"),
        # a limit inside the container (a crun child with its own limit), or another pod's: "cgroup"
        (CONTAINER + "/container", CONTAINER + "/container", "memcg", "cgroup"),
        (CONTAINER, SD_BE_POD, "memcg", "cgroup"),
        # non-Kubernetes workloads are never container/pod
        ("/system.slice/slurmstepd.scope/job_1/step_0/user/task_0", "/system.slice/slurmstepd.scope/job_1/step_0",
         "memcg", "cgroup"),
        ("/system.slice/foo.service", "/system.slice/foo.service", "memcg", "cgroup"),
        # the summary was ratelimited away: unknown oom cgroup
        (CONTAINER, None, "memcg", "unknown"),  # which cgroup ran out is not in the log
    ],
)
def test_scope_of(victim, oom, constraint, scope):
    assert scope_of(victim, oom, constraint) == scope


def _kernel_escaped(raw: bytes) -> bytes:
    """How /dev/kmsg writes a record's text (docs/kernel-facts.md): bytes < 0x20, >= 0x7f and `\\` as
    `\\xNN`."""
    return b"".join(b"\\x%02x" % b if b < 0x20 or b >= 0x7F or b == 0x5C else bytes([b]) for b in raw)


@pytest.mark.parametrize("piece", [bytes([b]) for b in range(256) if b != 0x2F]
                         + [b"\xc3\xbc", b"\xe2\x82", b"\xed\xa0\x80", b"\xf0\x9f\x98\x80", b"\\xff",
                            b"\xff" * 255])
def test_a_name_from_the_tree_spelt_as_the_kernel_log_spells_it(piece):
    """The cgroup tree gives names with surrogate escapes (os.scandir), the kernel log `\\xNN` escapes that
    oomwatch.parse.kmsg.unescape undoes as far as UTF-8 allows: as_logged makes the first the second, for
    every byte in every position, so one cgroup is one workload whichever source named it."""
    for name in (piece, b"x" + piece + b"y.service", b"x.service" + piece):
        from_tree = os.fsdecode(b"/user.slice/" + name)
        from_log = unescape(_kernel_escaped(b"/user.slice/" + name))
        if piece == b"\\xff":  # the four characters `\xff` spelt out: never spelt as the byte 0xff is
            assert as_logged(from_tree) == from_log != as_logged(os.fsdecode(b"/user.slice/" + name.replace(
                b"\\xff", b"\xff")))
            continue
        assert as_logged(from_tree) == from_log
        assert as_logged(from_tree).encode("utf-8")  # always valid UTF-8
