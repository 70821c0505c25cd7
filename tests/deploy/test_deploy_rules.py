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
    # or recording rules of the same file (oomwatch:…), which read contract metrics themselves
    records = set(re.findall(r"\b(oomwatch:[\w:]+)", alert["expr"]))
    recorded = {r["record"] for g in rules_doc()["groups"] for r in g["rules"] if "record" in r}
    assert (names or records) and names <= CONTRACT_METRICS, names - CONTRACT_METRICS
    assert records <= recorded, records - recorded


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


# --- one alert per incident, a runbook per alert -----------------------------------------------------


RUNBOOKS = RULES.parents[2] / "docs/runbooks"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: a["alert"])
def test_every_alert_has_a_runbook_in_the_repository(alert: dict[str, Any]) -> None:
    url = alert["annotations"]["runbook_url"]
    path, _, anchor = url.partition("#")
    assert path.startswith("docs/runbooks/") and path.endswith(".md"), url
    page = RULES.parents[2] / path
    assert page.is_file(), f"{alert['alert']}: {path} does not exist"
    text = page.read_text()
    if anchor:
        headings = [_anchor(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)]
        assert anchor in headings, f"{url}: no heading with that anchor in {path}"
    assert alert["alert"] in (RUNBOOKS / "README.md").read_text(), "docs/runbooks/README.md lists every alert"


@pytest.mark.parametrize("page", ["group-oom-kill.md", "oom-kill.md"])
def test_kill_runbooks_say_how_to_confirm_and_fix(page: str) -> None:
    text = (RUNBOOKS / page).read_text()
    for section in ("## What happened", "## Confirm it", "## Fix"):
        assert section in text, (page, section)
    for needle in ("oomwatch inspect", "kubectl describe pod", "limits.memory", "singleProcessOOMKill",
                   "split", "OOMKillStep"):
        assert needle in text, (page, needle)


def _incident_cases() -> list[tuple[int, str, list[dict[str, Any]], list[dict[str, Any]]]]:
    """(test group index, eval_time, input series, cases) where a test group evaluates every alert at once."""
    names = {a["alert"] for a in alerts()}
    out = []
    for path in sorted(RULE_TESTS.glob("*.yaml")):
        for i, test in enumerate(yaml.safe_load(path.read_text())["tests"]):
            by_time: dict[str, list[dict[str, Any]]] = {}
            for case in test.get("alert_rule_test", []):
                by_time.setdefault(str(case["eval_time"]), []).append(case)
            for eval_time, cases in by_time.items():
                if {c["alertname"] for c in cases} == names:
                    out.append((i, eval_time, test["input_series"], cases))
    return out


def _collateral_kill(series: list[dict[str, Any]]) -> bool:
    return any('role="collateral"' in s["series"] and set(str(s["values"]).split()) - {"0", "0+0x7"}
               for s in series)


def test_a_group_kill_with_collateral_fires_exactly_one_alert() -> None:
    """The promtool cases that evaluate every alert after a group kill with collateral expect one alert:
    OomwatchGroupOOMKillCollateral (promtool itself checks that the rules do what the cases expect)."""
    cases = [c for c in _incident_cases() if _collateral_kill(c[2])]
    assert len(cases) >= 2, "need a Kubernetes and a non-Kubernetes group kill with collateral"
    for index, eval_time, _series, alert_cases in cases:
        firing = [c["alertname"] for c in alert_cases for _ in c.get("exp_alerts") or []]
        assert firing == ["OomwatchGroupOOMKillCollateral"], (index, eval_time, firing)


def test_a_kill_without_collateral_fires_the_workload_alert_only() -> None:
    cases = [c for c in _incident_cases() if not _collateral_kill(c[2])]
    assert cases, "need a group kill without collateral evaluated against every alert"
    for index, eval_time, _series, alert_cases in cases:
        firing = [c["alertname"] for c in alert_cases for _ in c.get("exp_alerts") or []]
        assert firing == ["OomwatchContainerOOMKilled"], (index, eval_time, firing)


def test_chart_runbook_base_url_makes_links(tmp_path) -> None:
    from .conftest import helm_template

    objects = helm_template("prometheusRule.enabled=true",
                            "prometheusRule.runbookBaseURL=https://git.example.com/infra/oomwatch/")
    rules = [r for g in one(objects, "PrometheusRule")["spec"]["groups"] for r in g["rules"] if "alert" in r]
    urls = [r["annotations"]["runbook_url"] for r in rules]
    assert urls and all(u.startswith("https://git.example.com/infra/oomwatch/docs/runbooks/") for u in urls), urls
    assert urls == ["https://git.example.com/infra/oomwatch/" + a["annotations"]["runbook_url"] for a in alerts()]
