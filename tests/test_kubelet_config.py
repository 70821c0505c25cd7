"""KubeletConfiguration `singleProcessOOMKill`: parsing (YAML, JSON, garbage) and the node posture it implies."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomwatch.workloads.kubelet import (
    KubeletOomPolicy,
    parse_kubelet_config,
    read_kubelet_cgroup_root,
    read_kubelet_config,
    single_process_oom_kill,
)

KUBELET = Path(__file__).resolve().parent.parent / "fixtures" / "workloads" / "kubelet"


@pytest.mark.parametrize(
    "fixture,value",
    [("kubeadm-unset.yaml", None), ("single-process-true.yaml", True), ("group-kill-false.json", False)],
)
def test_parse_fixture_configs(fixture, value):
    policy = parse_kubelet_config((KUBELET / fixture).read_text())
    assert policy.error is None
    assert policy.single_process_oom_kill is value


@pytest.mark.parametrize(
    "text",
    [
        (KUBELET / "garbled.yaml").read_text(),
        "",
        "just a string",
        "- a\n- list\n",
        "kind: Pod\napiVersion: v1\n",
        "kind: KubeletConfiguration\nsingleProcessOOMKill: \"yes please\"\n",
        "kind: KubeletConfiguration\nsingleProcessOOMKill: 1\n",
        "{\"kind\": \"KubeletConfiguration\", \"singleProcessOOMKill\": tru",
        "\x00\x01\x02",
    ],
)
def test_garbled_configs_are_errors_not_crashes(text):
    policy = parse_kubelet_config(text)
    assert policy.error
    assert single_process_oom_kill(policy, 2) == "unknown"


def test_explicit_null_is_unset():
    policy = parse_kubelet_config("kind: KubeletConfiguration\nsingleProcessOOMKill: null\n")
    assert policy == KubeletOomPolicy(single_process_oom_kill=None)


@pytest.mark.parametrize(
    "value,version,expected",
    [
        (None, 2, "false"),  # unset on cgroup v2: group kill
        (False, 2, "false"),
        (True, 2, "true"),
        (None, 1, "true"),  # forced on cgroup v1
        (False, 1, "true"),
        (True, "v1", "true"),
        (None, "2", "false"),
        (True, None, "true"),
        (None, None, "unknown"),
        (False, None, "unknown"),
    ],
)
def test_single_process_oom_kill(value, version, expected):
    assert single_process_oom_kill(KubeletOomPolicy(single_process_oom_kill=value), version) == expected


def test_unreadable_config_is_unknown():
    assert single_process_oom_kill(None, 2) == "unknown"
    assert single_process_oom_kill(None, 1) == "unknown"


def test_read_kubelet_config(tmp_path):
    assert read_kubelet_config(str(tmp_path / "absent.yaml")) is None
    assert read_kubelet_config(str(tmp_path)) is None  # a directory: unreadable as a file
    policy = read_kubelet_config(str(KUBELET / "single-process-true.yaml"))
    assert policy == KubeletOomPolicy(single_process_oom_kill=True)
    garbled = read_kubelet_config(str(KUBELET / "garbled.yaml"))
    assert garbled is not None and garbled.error


# --- cgroupRoot: where the kubelet puts pods (oomwatch.workloads.paths.CgroupLayout) ----------------------


def test_cgroup_root_from_a_config():
    kind = parse_kubelet_config((KUBELET / "kind-cgroup-root.yaml").read_text())
    assert (kind.error, kind.cgroup_root) == (None, "/kubelet")
    assert parse_kubelet_config((KUBELET / "kubeadm-unset.yaml").read_text()).cgroup_root == "/"


@pytest.mark.parametrize(
    "value",
    ['""', "null", "kubelet", "5", "[/a]", '"/a\\0b"'],
)
def test_a_cgroup_root_that_is_no_absolute_path_is_the_default(value):
    assert parse_kubelet_config(f"kind: KubeletConfiguration\ncgroupRoot: {value}\n").cgroup_root == "/"


def test_read_kubelet_cgroup_root(tmp_path):
    assert read_kubelet_cgroup_root(str(KUBELET / "kind-cgroup-root.yaml")) == "/kubelet"
    assert read_kubelet_cgroup_root(str(tmp_path / "absent.yaml")) == "/"
    assert read_kubelet_cgroup_root(str(KUBELET / "garbled.yaml")) == "/"
