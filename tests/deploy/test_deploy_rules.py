"""Alert rules: promtool checks and unit tests, and the three shipped copies are one."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from . import sync_rules
from .conftest import CONTRACT_METRICS, RULE_TESTS, RULES, by_kind, one, run

pytestmark = pytest.mark.tools


def rules_doc() -> dict[str, Any]:
    return yaml.safe_load(RULES.read_text())


def alerts() -> list[dict[str, Any]]:
    return [r for g in rules_doc()["groups"] for r in g["rules"] if "alert" in r]


def test_promtool_check_rules(promtool: str) -> None:
    out = run([promtool, "check", "rules", str(RULES)]).stdout
    assert "SUCCESS" in out


def test_promtool_test_rules(promtool: str) -> None:
    files = sorted(RULE_TESTS.glob("*.yaml"))
    assert files, "no promtool unit tests in deploy/prometheus/tests"
    out = run([promtool, "test", "rules", *map(str, files)])
    assert "SUCCESS" in out.stdout + out.stderr


def _rule_test_cases() -> list[dict[str, Any]]:
    cases = []
    for path in RULE_TESTS.glob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
        for test in doc["tests"]:
            cases.extend(test.get("alert_rule_test", []))
    return cases


@pytest.mark.parametrize("alert", [a["alert"] for a in alerts()])
def test_every_alert_has_a_firing_and_a_quiet_case(alert: str) -> None:
    cases = [c for c in _rule_test_cases() if c["alertname"] == alert]
    assert any(c.get("exp_alerts") for c in cases), f"{alert}: no promtool case where it fires"
    assert any(not c.get("exp_alerts") for c in cases), f"{alert}: no promtool case where it stays quiet"


def test_first_kill_from_zero_is_modelled() -> None:
    """The agent exports counters at 0 before the first incident; the tests must start series at 0."""
    for path in RULE_TESTS.glob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
        for test in doc["tests"]:
            for series in test["input_series"]:
                if series["series"].startswith("oomwatch_") and "_total" in series["series"]:
                    assert str(series["values"]).startswith("0"), series


def test_required_alerts_and_expressions() -> None:
    by_name = {a["alert"]: a for a in alerts()}
    exprs = " ".join(a["expr"] for a in alerts())
    assert 'increase(oomwatch_oom_killed_processes_total{role="collateral"}[5m]) > 0' in exprs
    assert "increase(oomwatch_oom_kills_total{" in by_name["OomwatchContainerOOMKilled"]["expr"]
    assert 'scope="node"' in by_name["OomwatchNodeOOM"]["expr"]
    assert "oomwatch_node_oom_kills_total" in by_name["OomwatchOOMStorm"]["expr"]
    assert "[10m]" in by_name["OomwatchOOMStorm"]["expr"] and "> 5" in by_name["OomwatchOOMStorm"]["expr"]
    assert "increase(oomwatch_kmsg_lost_records_total[10m]) > 0" in exprs
    assert 'up{job=~".*oomwatch.*"} == 0' in by_name["OomwatchAgentDown"]["expr"]
    assert "absent(" in by_name["OomwatchAgentAbsent"]["expr"]


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: a["alert"])
def test_alert_annotations_and_severity(alert: dict[str, Any]) -> None:
    assert alert["labels"]["severity"] in {"critical", "warning", "info"}
    assert alert["annotations"]["summary"].strip()
    assert alert["annotations"]["description"].strip()
    names = set(re.findall(r"\b(oomwatch_\w+|up)\b(?=\s*[{\[])", alert["expr"]))
    assert names and names <= CONTRACT_METRICS, names - CONTRACT_METRICS


@pytest.mark.parametrize(
    "alert",
    ["OomwatchGroupOOMKillCollateral", "OomwatchContainerOOMKilled"],
)
def test_workload_alerts_name_namespace_pod_container(alert: str) -> None:
    a = next(x for x in alerts() if x["alert"] == alert)
    text = a["annotations"]["summary"] + a["annotations"]["description"]
    for label in ("namespace", "pod", "container"):
        assert f"$labels.{label}" in text, (alert, label)


def test_collateral_alert_suggests_limit_or_single_process_oom_kill() -> None:
    a = next(x for x in alerts() if x["alert"] == "OomwatchGroupOOMKillCollateral")
    assert "singleProcessOOMKill" in a["annotations"]["description"]
    assert "memory limit" in a["annotations"]["description"]


def test_generated_copies_are_in_sync() -> None:
    """daemonset/prometheusrule.yaml and the chart's files/ copy are generated from the rules file."""
    text = RULES.read_text()
    assert sync_rules.KUSTOMIZE_RULE.read_text() == sync_rules.kustomize_rule(text), (
        "run .venv/bin/python tests/deploy/sync_rules.py"
    )
    assert sync_rules.CHART_RULES.read_text() == sync_rules.chart_rules(text), (
        "run .venv/bin/python tests/deploy/sync_rules.py"
    )


def _check_prometheusrule(rule: dict[str, Any], promtool: str, tmp_path: Path) -> None:
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    # Identical to the plain rules file, whatever YAML formatting the renderer chose.
    assert rule["spec"] == rules_doc()
    path = tmp_path / "rendered-rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    assert "SUCCESS" in run([promtool, "check", "rules", str(path)]).stdout


def test_kustomize_prometheusrule_matches_rules_file(kustomize_base, promtool, tmp_path) -> None:
    _check_prometheusrule(one(kustomize_base, "PrometheusRule"), promtool, tmp_path)


def test_helm_prometheusrule_matches_rules_file(helm_renders, promtool, tmp_path) -> None:
    assert not by_kind(helm_renders["defaults"], "PrometheusRule"), "PrometheusRule must be opt-in"
    _check_prometheusrule(one(helm_renders["monitoring"], "PrometheusRule"), promtool, tmp_path)
