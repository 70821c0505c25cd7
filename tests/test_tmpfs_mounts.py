"""The tmpfs volumes behind a shmem verdict (issue 21 item 3): a container's memory-medium emptyDirs and its pod's
/dev/shm, read from the runtime's bundle (the OCI config.json the cgroup source already reads for names) when the
container appears, and named by the incident whose tmpfs pages filled the limit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from oomwatch.model import Workload
from oomwatch.workloads import WorkloadResolver
from oomwatch.workloads.runtime import MAX_TMPFS_MOUNTS, RuntimeNames, host_is_tmpfs, parse_oci_config, tmpfs_mounts
from tests.conftest import FIXTURES
from tests.test_held_memory import KMSG, incidents_of, read_like_the_agent
from tests.conftest import raw_records

BUNDLES = FIXTURES / "workloads" / "run" / "containerd" / "io.containerd.runtime.v2.task" / "k8s.io"
CONTAINER_ID = "6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b"
POD_UID = "24f2bbdc-1d3e-4978-8054-90f565dfe654"
VOLUMES = f"/var/lib/kubelet/pods/{POD_UID}/volumes/kubernetes.io~empty-dir"


def spec_with_empty_dirs() -> dict:
    """The real-shaped containerd bundle of a PyTorch container, with two emptyDirs mounted as the kubelet
    mounts them: "dshm" (medium: Memory) at /dev/shm and "cache" (on disk) at /cache."""
    spec = json.loads((BUNDLES / CONTAINER_ID / "config.json").read_text())
    spec["mounts"] = [m for m in spec["mounts"] if m["destination"] != "/dev/shm"] + [
        {"destination": "/dev/shm", "type": "bind", "source": f"{VOLUMES}/dshm", "options": ["rbind", "rw"]},
        {"destination": "/cache", "type": "bind", "source": f"{VOLUMES}/cache", "options": ["rbind", "rw"]},
    ]
    return spec


def memory_medium(path: str) -> bool | None:
    return {f"{VOLUMES}/dshm": True, f"{VOLUMES}/cache": False}.get(path)


def test_the_pods_dev_shm_is_named_from_the_bundle_alone() -> None:
    spec = json.loads((BUNDLES / CONTAINER_ID / "config.json").read_text())
    assert tmpfs_mounts(spec) == ("the pod's /dev/shm",)
    sandbox = json.loads((BUNDLES / "5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9" /
                          "config.json").read_text())
    assert parse_oci_config(json.dumps(sandbox)).tmpfs_mounts == ("the pod's /dev/shm",)


def test_only_memory_medium_empty_dirs_are_named() -> None:
    spec = spec_with_empty_dirs()
    assert tmpfs_mounts(spec, memory_medium) == ('emptyDir "dshm" at /dev/shm',)  # not the disk one
    assert tmpfs_mounts(spec) == ()  # a pure parse cannot tell a memory emptyDir from a disk one: none named
    assert tmpfs_mounts(spec, lambda path: None) == ()  # nor can a host whose kubelet directory is not visible


def test_odd_or_many_mounts_are_bounded() -> None:
    mounts = [{"destination": f"/v{i}", "source": f"{VOLUMES}/v{i}"} for i in range(50)]
    mounts += [{"destination": "/x", "source": f"{VOLUMES}/"}, {"destination": 7, "source": None}, "junk",
               {"destination": "/y" * 500, "source": f"{VOLUMES}/" + "n" * 300}]
    named = tmpfs_mounts({"mounts": mounts}, lambda path: True)
    assert len(named) == MAX_TMPFS_MOUNTS and named[0] == 'emptyDir "v0" at /v0'
    long = tmpfs_mounts({"mounts": mounts[-1:]}, lambda path: True)
    assert long == (f'emptyDir "{"n" * 63}" at {("/y" * 500)[:256]}',)
    assert tmpfs_mounts({"mounts": "no"}, lambda path: True) == () and tmpfs_mounts({}, None) == ()


def test_the_host_check_reads_the_filesystem_type(tmp_path: Path) -> None:
    is_tmpfs = host_is_tmpfs(str(tmp_path / "proc"))
    assert is_tmpfs("/dev/shm") is True  # a tmpfs on this machine
    assert is_tmpfs(str(tmp_path)) is False  # a directory on disk
    assert is_tmpfs(str(tmp_path / "gone")) is None  # neither here nor through <proc>/1/root
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "root").symlink_to("/")  # as the host's root looks from a container
    assert is_tmpfs("/dev/shm") is True


def test_the_resolver_names_the_containers_tmpfs_volumes(tmp_path: Path) -> None:
    bundle = tmp_path / "run/containerd/io.containerd.runtime.v2.task/k8s.io" / CONTAINER_ID
    shutil.copytree(BUNDLES / CONTAINER_ID, bundle)
    (bundle / "config.json").write_text(json.dumps(spec_with_empty_dirs()))
    names = RuntimeNames(run_root=str(tmp_path / "run"), pod_log_root=str(tmp_path / "pods"), is_tmpfs=memory_medium)
    resolver = WorkloadResolver(names)
    cgroup = f"/kubepods/burstable/pod{POD_UID}/{CONTAINER_ID}"
    workload = resolver.resolve(cgroup)
    assert workload.type == "k8s-container" and workload.container_id == CONTAINER_ID
    assert resolver.tmpfs_mounts(workload) == ('emptyDir "dshm" at /dev/shm',)
    assert resolver.tmpfs_mounts(Workload(type="systemd-unit", cgroup="/system.slice/x.service")) == ()


def test_a_shmem_verdict_names_the_volumes_behind_it() -> None:
    """The real 6.12 tmpfs scenario: the container's tmpfs held most of the limit; its incident names the
    volumes its bundle said are tmpfs."""

    class Volumes(WorkloadResolver):
        def tmpfs_mounts(self, workload: Workload) -> tuple[str, ...]:
            return ('emptyDir "dshm" at /dev/shm',) if workload.cgroup == "/shm" else ()

    from tests.conftest import make_correlator

    correlator = make_correlator(boot_id="t", boot_time=0.0, resolver=Volumes(), posture_single=lambda: "false")
    incidents = {i.oom_cgroup: i for i in incidents_of(read_like_the_agent(raw_records(KMSG / "linux-6.12-holders.kmsg")),
                                                       correlator)}
    shm = incidents["/shm"]
    assert shm.verdict == "shmem"
    assert 'tmpfs or /dev/shm (emptyDir "dshm" at /dev/shm) held' in shm.explanation
    assert "emptyDir" not in incidents["/single"].explanation
