"""mixin/ (jsonnet, monitoring-mixins layout) rendered by the real jsonnet: the shipped rules, PrometheusRules
and dashboard are exactly what it renders (scripts/generate-mixin --check), it has the fields kube-prometheus
reads, and its _config reaches every rule and query (a multi-cluster rendering, checked by promtool)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import ROOT, run, tool
from .dashboard import panel_queries
from .test_sbom import _load

pytestmark = pytest.mark.tools

MIXIN = ROOT / "mixin"
generate_mixin = _load("generate_mixin")

# A deployment that overrides every knob (what a kube-prometheus user writes in their own jsonnet).
CUSTOM = """
(import 'mixin.libsonnet') + {
  _config+:: {
    oomwatchSelector: 'job="oomwatch", namespace="monitoring"',
    nodeLabel: 'instance',
    clusterLabel: 'k8s_cluster',
    showMultiCluster: true,
    runbookURLPattern: 'https://git.example.com/infra/oomwatch/-/blob/v0.1.0/docs/runbooks/%s',
    dashboardUid: 'oomwatch-prod',
  },
}
"""


def jsonnet(program: str) -> Any:
    out = run([tool("jsonnet"), "-e", program], cwd=MIXIN)
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def custom() -> dict[str, Any]:
    return jsonnet(f"local m = {CUSTOM}; {{alerts: m.prometheusAlerts, rules: m.prometheusRules, "
                   "dashboards: m.grafanaDashboards}")


def test_shipped_files_are_what_the_mixin_renders() -> None:
    out = subprocess.run([str(ROOT / "scripts/generate-mixin"), "--check"], capture_output=True, text=True,
                         env={"PATH": f"{ROOT / '.cache/tools/bin'}:/usr/bin:/bin"}, check=False)
    assert out.returncode == 0, out.stderr


def test_check_fails_when_a_file_differs(monkeypatch, tmp_path: Path) -> None:
    """--check can fail: a generated file edited by hand is named."""
    copy = tmp_path / "oomwatch-dashboard.json"
    copy.write_text(generate_mixin.DASHBOARD.read_text().replace('"oomwatch: OOM kills"', '"edited"'))
    monkeypatch.setattr(generate_mixin, "DASHBOARD", copy)
    monkeypatch.setattr(generate_mixin, "ROOT", tmp_path.parent)
    assert generate_mixin.main(["--check"]) == 1
    assert copy.read_text().count('"edited"') == 1  # --check writes nothing


def test_monitoring_mixin_fields() -> None:
    fields = jsonnet("local m = import 'mixin.libsonnet'; {alerts: std.objectHasAll(m, 'prometheusAlerts'), "
                     "rules: std.objectHasAll(m, 'prometheusRules'), "
                     "dashboards: std.objectFieldsAll(m.grafanaDashboards), "
                     "config: std.objectHasAll(m, '_config')}")
    assert fields == {"alerts": True, "rules": True, "dashboards": ["oomwatch-dashboard.json"],
                      "config": True}


def test_one_prometheus_rule_can_hold_alerts_and_rules(custom) -> None:
    """kube-prometheus puts prometheusAlerts' and prometheusRules' groups in one PrometheusRule: no group
    name may repeat (Prometheus refuses a file that repeats one)."""
    names = [g["name"] for g in custom["alerts"]["groups"] + custom["rules"]["groups"]]
    assert len(names) == len(set(names)), names


def _rules(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in doc["groups"] for r in g["rules"]]


def test_config_reaches_the_rules(custom, promtool: str, tmp_path: Path) -> None:
    rules = _rules(custom["alerts"]) + _rules(custom["rules"])
    alerts = {r["alert"]: r for r in rules if "alert" in r}
    assert alerts["OomwatchAgentDown"]["expr"] == 'up{job="oomwatch", namespace="monitoring"} == 0'
    assert alerts["OomwatchAgentAbsent"]["expr"] == 'absent(up{job="oomwatch", namespace="monitoring"})'
    # Aggregations keep the cluster label; the node label, named twice, once.
    assert alerts["OomwatchOOMStorm"]["expr"].startswith("sum by (k8s_cluster, job, instance) (")
    records = {r["record"]: r["expr"] for r in rules if "record" in r}
    # the workload's series are joined with its job on the agent and the workload; kills per job per namespace
    job_clauses = {"k8s_cluster, job, instance, namespace, pod, cgroup", "k8s_cluster, namespace, job_kind, job_name, kind"}
    for expr in records.values():
        for clause in re.findall(r"\b(?:by|on) \(([^)]*)\)", expr):
            if "namespace" in clause:
                assert clause in {"k8s_cluster, namespace, pod, container"} | job_clauses, expr
    for name in ("OomwatchGroupOOMKillCollateral", "OomwatchContainerOOMKilled", "OomwatchCgroupOOMKilled"):
        assert ("* on (k8s_cluster, job, instance, namespace, pod, cgroup) group_left (job_kind, job_name) "
                "oomwatch:workload_job_info:10m or ignoring (job_kind, job_name)") in alerts[name]["expr"], name
    for alert in alerts.values():
        url = alert["annotations"]["runbook_url"]
        assert url.startswith("https://git.example.com/infra/oomwatch/-/blob/v0.1.0/docs/runbooks/"), url
        page = url.split("/blob/v0.1.0/")[1].split("#")[0]
        assert (ROOT / page).is_file(), page
    path = tmp_path / "custom-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": custom["alerts"]["groups"] + custom["rules"]["groups"]}))
    out = run([promtool, "check", "rules", str(path)]).stdout
    assert f"SUCCESS: {len(rules)} rules found" in out


def test_config_reaches_the_dashboard(custom, promtool: str, tmp_path: Path) -> None:
    dashboard = custom["dashboards"]["oomwatch-dashboard.json"]
    assert dashboard["uid"] == "oomwatch-prod"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["cluster"]["hide"] == 0  # showMultiCluster shows it
    assert variables["cluster"]["query"]["query"] == "label_values(oomwatch_node_info, k8s_cluster)"
    assert variables["node"]["query"]["query"] == (
        'label_values(oomwatch_node_info{k8s_cluster=~"$cluster"}, instance)')
    path = tmp_path / "dashboard.json"
    path.write_text(json.dumps(dashboard))
    queries = panel_queries(path, {"namespace": ".*", "pod": ".*", "node": ".*", "cluster": "prod"})
    for title, expr in queries:
        assert 'k8s_cluster=~"prod"' in expr, (title, expr)
        assert "node=~" not in expr, (title, expr)  # the node matcher is on nodeLabel
    # the jobs table's joins keep the cluster label
    (jobs,) = [expr for title, expr in queries if title == "Jobs hit by OOM kills"][:1]
    assert "sum by (k8s_cluster, namespace, job_kind, job_name) (" in jobs
    assert "on (k8s_cluster, job, instance, namespace, pod, cgroup) group_left" in jobs
    rules = [{"record": f"oomwatch:dashboard_query_{i}", "expr": expr} for i, (_, expr) in enumerate(queries)]
    (tmp_path / "queries.yaml").write_text(yaml.safe_dump({"groups": [{"name": "q", "rules": rules}]}))
    out = run([promtool, "check", "rules", str(tmp_path / "queries.yaml")]).stdout
    assert f"SUCCESS: {len(rules)} rules found" in out


def test_shipped_dashboard_has_cluster_datasource_and_import_metadata() -> None:
    dashboard = json.loads(generate_mixin.DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert list(variables) == ["datasource", "logs", "cluster", "node", "namespace", "pod", "job"]
    assert variables["cluster"]["hide"] == 2 and variables["cluster"]["allValue"] == ".*"
    assert dashboard["__inputs"] == []
    required = {(r["type"], r["id"]) for r in dashboard["__requires"]}
    panel_types = {p["type"] for p in dashboard["panels"]}
    assert required == ({("grafana", "grafana"), ("datasource", "prometheus"), ("datasource", "loki")}
                        | {("panel", t) for t in panel_types})
    # Every query filters on the cluster ("All" by default, which also matches series without the label).
    for title, expr in panel_queries(generate_mixin.DASHBOARD, {"namespace": ".*", "pod": ".*", "node": ".*",
                                                                "cluster": "CLUSTER"}):
        assert 'cluster=~"CLUSTER"' in expr, (title, expr)


def test_rules_layout_loads_back_and_keeps_rule_order() -> None:
    text = generate_mixin.RULES.read_text()
    groups = yaml.safe_load(text)["groups"]
    assert [g["name"] for g in groups] == ["oomwatch", "oomwatch-risk", "oomwatch-oomkilled", "oomwatch-jobs"]
    first = text[text.index("      - alert: OomwatchAgentDown"):]
    keys = [line.strip().split(":")[0] for line in first.splitlines()[1:5]]
    assert keys == ["expr", "for", "labels", "severity"]


def _logql(dashboard: dict[str, Any]) -> str:
    (query,) = [t["expr"] for p in dashboard["panels"] if p["type"] == "logs" for t in p["targets"]]
    return query


def test_config_reaches_the_explanations_panel(custom) -> None:
    """The Loki stream labels are _config: the cluster's follows clusterLabel unless set, '' leaves a matcher
    out, and logsSelector is whatever the deployment's shipper labels the agent's lines with (a systemd host's
    journal here)."""
    assert _logql(custom["dashboards"]["oomwatch-dashboard.json"]).startswith(
        '{k8s_cluster=~"$cluster", node_name=~"$node", container="oomwatch"} |= ')
    journal = jsonnet("local m = (import 'mixin.libsonnet') + {_config+:: {logsSelector: 'unit=\"oomwatch.service\"', "
                      "logsNodeLabel: 'host', logsClusterLabel: ''}}; m.grafanaDashboards")
    assert _logql(journal["oomwatch-dashboard.json"]).startswith('{host=~"$node", unit="oomwatch.service"} |= ')
    alloy = jsonnet("local m = (import 'mixin.libsonnet') + {_config+:: {logsNodeLabel: ''}}; m.grafanaDashboards")
    assert _logql(alloy["oomwatch-dashboard.json"]).startswith('{cluster=~"$cluster", container="oomwatch"} |= ')
