"""An agent that cannot see says so (issue 20, item 3): a cgroup root that does not exist stops the start; one
that holds no cgroup v2 memory controller (a hybrid host, a mistyped path to some other directory) and a kernel
log that is not one make /healthz 503 with the reason, after one clear log line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from oomwatch.node import cgroup_root_problem
from oomwatch.sources.kernellog import KernelLogSource
from tests.conftest import REPO


def test_a_missing_cgroup_root_is_a_start_failure() -> None:
    with pytest.raises(FileNotFoundError, match="--cgroup-root /nonexistent does not exist"):
        cgroup_root_problem("/nonexistent", "v2")


def test_the_agent_command_refuses_a_missing_cgroup_root(tmp_path: Path) -> None:
    log = tmp_path / "kmsg.txt"
    log.write_text("[    1.000000] Linux version 6.1.0\n")
    run = subprocess.run([sys.executable, "-m", "oomwatch", "agent", "--cgroup-root", "/nonexistent", "--kmsg",
                          str(log), "--listen", "127.0.0.1:0", "--kube-api", "off"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "--cgroup-root /nonexistent does not exist" in run.stderr


@pytest.mark.parametrize("controllers, version, says", [
    ("cpuset cpu io memory pids", "v2", None),
    ("cpuset cpu io pids", "v2", "the memory controller is not enabled"),
    ("", "v2", "the memory controller is not enabled"),
    (None, "v2", "is not a cgroup v2 hierarchy"),
    ("cpuset cpu io pids", "hybrid", "memory is on a cgroup v1 hierarchy on this host (hybrid)"),
    (None, "v1", "memory is on a cgroup v1 hierarchy on this host (v1)"),
])
def test_a_root_without_a_v2_memory_controller_is_named(tmp_path: Path, controllers, version, says) -> None:
    if controllers is not None:
        (tmp_path / "cgroup.controllers").write_text(controllers + "\n")
    problem = cgroup_root_problem(str(tmp_path), version)
    if says is None:
        assert problem is None
    else:
        assert problem is not None and says in problem


@pytest.mark.parametrize("name, content", [
    ("ls", Path("/bin/ls").read_bytes()[:65536]),
    ("empty", b""),
])
def test_a_saved_log_that_is_not_a_kernel_log_is_unhealthy(tmp_path: Path, name: str, content: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    events: list = []
    source = KernelLogSource(str(path), events.append)
    source.open(lambda kind: None)
    source.start()
    source.join(30)
    ok, why = source.health()
    assert not ok
    assert str(path) in why or name in why, why


def test_the_agent_takes_kubernetes_identities_only_below_the_kubelets_cgroup_root(tmp_path: Path) -> None:
    """Issue 19, item 2, wired: the layout the agent builds from the kubelet's config (cgroupRoot) is the one its
    pipeline and cgroup source resolve with, so a kubepods tree planted in a user's delegated subtree is `other`."""
    from oomwatch.node import node_layout
    from oomwatch.workloads import WorkloadResolver

    config = tmp_path / "config.yaml"
    config.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                      "cgroupRoot: /kubelet.slice\n")
    resolver = WorkloadResolver(layout=node_layout(str(config)))
    uid, cid = "0b0c6b3e-9d55-4a52-8f0e-0d2b1c3a4e5f", "4f2a9c1e7b3d5a6c8e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d"
    real = resolver.resolve(f"/kubelet.slice/kubepods/burstable/pod{uid}/{cid}")
    assert real.type == "k8s-container"
    for forged in (f"/kubepods/burstable/pod{uid}/{cid}",
                   f"/user.slice/user-1000.slice/user@1000.service/kubepods/burstable/pod{uid}/{cid}"):
        assert resolver.resolve(forged).type != "k8s-container", forged
    assert node_layout(str(tmp_path / "absent.yaml")).kubelet_cgroup_root == "/"
