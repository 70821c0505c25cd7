"""Dashboard queries evaluated by the real PromQL engine (promtool's rule-test evaluator) on the golden
metrics: the series the agent exports for the golden k8s-runc node (fixtures/golden/k8s-runc/expected-metrics.txt,
itself checked against the agent by tests/test_golden.py), with the labels a scrape adds."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from .conftest import DASHBOARD, ROOT, run
from .dashboard import panel_queries

pytestmark = pytest.mark.tools

GOLDEN = ROOT / "fixtures/golden/k8s-runc"
SCRAPE_LABELS = 'job="oomwatch",instance="10.0.0.1:9717",node="gpu-1"'
_SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")


def golden_series() -> list[dict[str, str]]:
    """Each sample of the golden /metrics as a promtool input series, constant for 10 minutes."""
    series = []
    for line in (GOLDEN / "expected-metrics.txt").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, line
        name, labels, value = match.groups()
        labels = ",".join(part for part in (labels, SCRAPE_LABELS) if part)
        value = {"+Inf": "Inf", "-Inf": "-Inf"}.get(value, value)
        series.append({"series": f"{name}{{{labels}}}", "values": " ".join([value] * 11)})
    return series


def panel_expr(title: str) -> str:
    (expr,) = [q for t, q in panel_queries(DASHBOARD, {"namespace": ".*", "pod": ".*", "node": ".*"}) if t == title]
    return expr


def evaluate(promtool: str, tmp_path: Path, expr: str, exp_samples: list[dict]) -> None:
    (tmp_path / "empty-rules.yaml").write_text("groups: []\n")
    test = {
        "rule_files": ["empty-rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": golden_series(),
            "promql_expr_test": [{"expr": expr, "eval_time": "5m", "exp_samples": exp_samples}],
        }],
    }
    path = tmp_path / "dashboard.test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    out = run([promtool, "test", "rules", str(path)], check=False)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


def test_posture_panel_counts_containers_as_inspect_does(promtool: str, tmp_path: Path) -> None:
    """`oomwatch inspect` on the golden node says 1 of 2 containers (50%); the panel must show the same share,
    not the share of every workload cgroup (pods and system cgroups too: 1 of 6 there)."""
    node = json.loads((GOLDEN / "expected-inspect.json").read_text())["node"]
    share = node["container_cgroups_oom_group"] / node["container_cgroups"]
    assert share == node["oom_group_share"]
    evaluate(promtool, tmp_path, panel_expr("Containers with memory.oom.group=1"),
             [{"labels": '{instance="10.0.0.1:9717", node="gpu-1"}', "value": share}])


def test_the_old_posture_query_would_have_failed(promtool: str, tmp_path: Path) -> None:
    """The evaluation can tell the two apart: every workload cgroup gives 1 of 6."""
    with pytest.raises(AssertionError):
        evaluate(promtool, tmp_path, 'avg by (node, instance) (oomwatch_memory_oom_group{node=~".*"})',
                 [{"labels": '{instance="10.0.0.1:9717", node="gpu-1"}', "value": 0.5}])
