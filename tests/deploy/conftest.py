"""Shared fixtures for the deployment tests: real tools, rendered manifests.

Tools come from .cache/tools/bin (scripts/setup-deploy-tools installs them). A missing tool fails the
test that needs it; it never skips.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from oomwatch.cli import agent as agent_command

ROOT = Path(__file__).resolve().parents[2]
TOOLS_BIN = ROOT / ".cache/tools/bin"
CHART = ROOT / "charts/oomwatch"
KUSTOMIZE_BASE = ROOT / "daemonset"
RULES = ROOT / "deploy/prometheus/oomwatch-rules.yaml"
RULE_TESTS = ROOT / "deploy/prometheus/tests"
DASHBOARD = ROOT / "deploy/grafana/oomwatch-dashboard.json"
SYSTEMD_UNIT = ROOT / "systemd/oomwatch.service"
SYSTEMD_ENV = ROOT / "systemd/oomwatch.env"

# `oomwatch agent` options, each also read from OOMWATCH_<NAME> (docs/contract.md): taken from the agent's CLI
# itself, so that a new option is known here the moment it exists.
AGENT_ENV = {param.envvar for param in agent_command.params if isinstance(param.envvar, str)}

# Metric names of docs/contract.md (histogram and counter sample names included) plus Prometheus' `up`.
CONTRACT_METRICS = {
    "oomwatch_oom_kills_total",
    "oomwatch_oom_killed_processes_total",
    "oomwatch_last_oom_kill_timestamp_seconds",
    "oomwatch_last_oom_kill_info",
    "oomwatch_last_oom_kill_memory_bytes",
    "oomwatch_memory_oom_group",
    "oomwatch_memory_limit_bytes",
    "oomwatch_memory_usage_bytes",
    "oomwatch_memory_peak_bytes",
    "oomwatch_memory_events_total",
    "oomwatch_memory_working_set_bytes",
    "oomwatch_memory_pressure_seconds_total",
    "oomwatch_node_oom_kills_total",
    "oomwatch_node_info",
    "oomwatch_workload_job_info",
    "oomwatch_kmsg_records_total",
    "oomwatch_kmsg_lost_records_total",
    "oomwatch_kmsg_parse_errors_total",
    "oomwatch_kmsg_rejected_records_total",
    "oomwatch_oom_kills_counted_from_events_total",
    "oomwatch_state_write_errors_total",
    "oomwatch_workloads_dropped_total",
    "oomwatch_cgroup_parse_errors_total",
    "oomwatch_detection_latency_seconds_bucket",
    "oomwatch_detection_latency_seconds_sum",
    "oomwatch_detection_latency_seconds_count",
    "oomwatch_build_info",
    "up",
}


def tool(name: str) -> str:
    """Path of a real tool installed by scripts/setup-deploy-tools; fails the test if it is missing."""
    path = TOOLS_BIN / name
    if path.exists() and os.access(path, os.X_OK):
        return str(path)
    pytest.fail(f"{name} is not installed in {TOOLS_BIN}: run `bash scripts/setup-deploy-tools` first")


def run(args: list[str], cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, cwd=cwd or ROOT, capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def load_all(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o.get("kind") == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def kustomize(path: Path) -> list[dict[str, Any]]:
    return load_all(run([tool("kubectl"), "kustomize", str(path)]).stdout)


def kustomize_with_components(tmp_path: Path, *components: str) -> list[dict[str, Any]]:
    """Render the base plus components from an overlay outside the base (kustomize forbids cycles)."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = os.path.relpath(KUSTOMIZE_BASE, overlay)
    doc = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [base],
        "components": [os.path.relpath(KUSTOMIZE_BASE / "components" / c, overlay) for c in components],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    return kustomize(overlay)


# The chart has no default image (none is published): every render names one, as a user must.
HELM_IMAGE = "image.repository=registry.example/oomwatch"


def helm_template(*sets: str, namespace: str = "oomwatch") -> list[dict[str, Any]]:
    # --skip-tests: the `helm test` pod is a hook, not part of the installed release (test_deploy_helm_extras.py)
    args = [tool("helm"), "template", "oomwatch", str(CHART), "--namespace", namespace, "--skip-tests"]
    for s in (HELM_IMAGE, *sets):
        args += ["--set", s]
    return load_all(run(args).stdout)


HELM_VARIANTS: dict[str, tuple[str, ...]] = {
    "defaults": (),
    "monitoring": ("serviceMonitor.enabled=true", "prometheusRule.enabled=true"),
    "kubeapi-off": ("kubeApi.mode=off",),
    "proc-connector": ("procConnector.enabled=true",),
    "privileged": ("privileged=true",),
}


@pytest.fixture(scope="session")
def kustomize_base() -> list[dict[str, Any]]:
    return kustomize(KUSTOMIZE_BASE)


@pytest.fixture(scope="session")
def helm_renders() -> dict[str, list[dict[str, Any]]]:
    return {name: helm_template(*sets) for name, sets in HELM_VARIANTS.items()}


@pytest.fixture(scope="session")
def promtool() -> str:
    return tool("promtool")


def which_or_fail(name: str) -> str:
    path = shutil.which(name)
    if not path:
        pytest.fail(f"{name} not found on PATH: run `bash scripts/setup-deploy-tools` first")
    return path
