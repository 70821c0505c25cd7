"""Grafana dashboard: provisionable JSON, every panel's PromQL parses (promtool) and uses contract
metrics; the panel_queries helper substitutes template variables."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from .conftest import CONTRACT_METRICS, DASHBOARD, RULES, run
from .dashboard import BUILTINS, panel_queries, substitute

ALL = {"namespace": ".*", "pod": ".*", "node": ".*"}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def walk(obj: Any) -> Any:
    yield obj
    if isinstance(obj, dict):
        for v in obj.values():
            yield from walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from walk(v)


def test_datasource_is_a_template_variable() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"


def test_no_hard_coded_datasource_uid() -> None:
    d = dashboard()
    # Provisioned dashboards take no import inputs: the data source is the variable (mixin/: __inputs is empty).
    assert d.get("__inputs", []) == []
    for node in walk(d):
        if isinstance(node, dict) and isinstance(node.get("datasource"), dict):
            ds = node["datasource"]
            if ds.get("type") == "grafana":  # the built-in annotations source
                continue
            assert ds == {"type": "prometheus", "uid": "${datasource}"}, ds
    assert "${DS_" not in DASHBOARD.read_text()


def test_query_variables_use_label_values_of_oomwatch_metrics() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    for name in ("namespace", "pod", "node"):
        v = variables[name]
        assert v["type"] == "query"
        query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        assert re.fullmatch(rf"label_values\(oomwatch_\w+(\{{.*\}})?, {name}\)", query), query
        # "All" must match series without the label (non-Kubernetes workloads, hosts without `node`).
        assert v["includeAll"] and v["allValue"] == ".*"


def test_required_panels() -> None:
    titles = [title for title, _ in panel_queries(DASHBOARD, ALL)]
    queries = " ".join(q for _, q in panel_queries(DASHBOARD, ALL))
    for wanted in (
        "OOM kills over time by kind",
        "Top containers by OOM kills",
        "Memory usage against limit of OOMing workloads",
        "Node posture",
        "Recent incidents",
        "Kernel log reader",
    ):
        assert wanted in titles, wanted
    assert 'role="collateral"' in queries
    for metric in (
        "oomwatch_memory_usage_bytes",
        "oomwatch_memory_limit_bytes",
        "oomwatch_memory_peak_bytes",
        "oomwatch_node_info",
        "oomwatch_last_oom_kill_timestamp_seconds",
        "oomwatch_kmsg_lost_records_total",
    ):
        assert metric in queries, metric


def test_panels_have_unique_ids_and_positions() -> None:
    panels = dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for p in panels:
        assert {"x", "y", "w", "h"} <= p["gridPos"].keys() and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        assert p["targets"], p["title"]


def test_queries_use_contract_metrics_only() -> None:
    """Contract metrics, or recording rules (`oomwatch:…`) that the shipped rules file defines."""
    recorded = {r["record"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
                if "record" in r}
    for title, expr in panel_queries(DASHBOARD, ALL):
        names = set(re.findall(r"\b(oomwatch_\w+)\b", expr))
        records = set(re.findall(r"\b(oomwatch:[\w:]+)", expr))
        assert names or records, title
        assert names <= CONTRACT_METRICS, (title, names - CONTRACT_METRICS)
        assert records <= recorded, (title, records - recorded)


@pytest.mark.tools
def test_every_query_parses_with_promtool(promtool: str, tmp_path) -> None:
    """Each panel query, variables substituted, as a recording rule: promtool parses every one."""
    rules = [
        {"record": f"oomwatch:dashboard_query_{i}", "expr": expr}
        for i, (_, expr) in enumerate(panel_queries(DASHBOARD, ALL))
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = run([promtool, "check", "rules", str(path)]).stdout
    assert f"SUCCESS: {len(rules)} rules found" in out


# --- the helper ------------------------------------------------------------------------------


def test_panel_queries_substitutes_every_variable() -> None:
    queries = panel_queries(DASHBOARD, {"namespace": "ml", "pod": "trainer-0", "node": "gpu-1"})
    assert queries
    for title, expr in queries:
        assert "$" not in expr and "[[" not in expr, (title, expr)
    assert any('namespace=~"ml"' in q and 'pod=~"trainer-0"' in q for _, q in queries)


def test_substitute_forms() -> None:
    v = {"ns": "a|b", "x": "1"}
    assert substitute('f{n=~"$ns"}', v) == 'f{n=~"a|b"}'
    assert substitute('f{n=~"${ns}"}', v) == 'f{n=~"a|b"}'
    assert substitute('f{n=~"${ns:regex}"}', v) == 'f{n=~"a|b"}'
    assert substitute('f{n=~"[[ns]]"}', v) == 'f{n=~"a|b"}'
    assert substitute("rate(m[$__rate_interval])", v) == f"rate(m[{BUILTINS['__rate_interval']}])"
    assert substitute("x[$__range] $__range_s", v) == "x[1h] 3600"
    assert substitute("rate(m[$__rate_interval])", {"__rate_interval": "2m"}) == "rate(m[2m])"
    with pytest.raises(KeyError):
        substitute("m{a=~'$missing'}", v)
