"""Grafana dashboard: provisionable JSON, every panel's PromQL parses (promtool) and uses contract
metrics; the logs panel's LogQL parses with Grafana's own LogQL grammar and selects what the mixin's _config
says; the panel_queries helper substitutes template variables and leaves the LogQL out of the PromQL."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import pytest
import yaml

from .conftest import CONTRACT_METRICS, DASHBOARD, ROOT, RULES, run
from .dashboard import BUILTINS, LOKI, datasource_type, panel_queries, prometheus_targets, substitute

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
    logs = variables["logs"]  # the Explanations panel's Loki, a choice of its own
    assert logs["type"] == "datasource" and logs["query"] == "loki"


def test_no_hard_coded_datasource_uid() -> None:
    d = dashboard()
    # Provisioned dashboards take no import inputs: the data source is the variable (mixin/: __inputs is empty).
    assert d.get("__inputs", []) == []
    for node in walk(d):
        if isinstance(node, dict) and isinstance(node.get("datasource"), dict):
            ds = node["datasource"]
            if ds.get("type") == "grafana":  # the built-in annotations source
                continue
            assert ds in ({"type": "prometheus", "uid": "${datasource}"}, {"type": "loki", "uid": "${logs}"}), ds
    # Loki only in the logs panel, and that panel only on Loki
    for panel in d["panels"]:
        types = {datasource_type(panel, t) for t in panel["targets"]}
        assert types == ({LOKI} if panel["type"] == "logs" else {"prometheus"}), (panel["title"], types)
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
        "Top workloads by OOM kills",
        "Memory usage against limit of OOMing workloads",
        "Node posture",
        "Recent incidents",
        "Kernel log reader",
        "Jobs hit by OOM kills",
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
        "oomwatch_workload_job_info",
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
        # what is left of `$` are label_replace's group references ($1)
        assert not re.search(r"\$(?![0-9]+\b)", expr) and "[[" not in expr, (title, expr)
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
    # label_replace's group references are no variables (Grafana leaves them as they are)
    assert substitute('label_replace(m{n=~"$ns"}, "w", "$1 on $2", "c", "(.+) (.*)")', v) == \
        'label_replace(m{n=~"a|b"}, "w", "$1 on $2", "c", "(.+) (.*)")'


# --- the jobs table and the explanations (issues 22 and 24) ----------------------------------------------------


def panel(title: str) -> dict[str, Any]:
    (found,) = [p for p in dashboard()["panels"] if p["title"] == title]
    return found


def test_jobs_table_joins_each_kill_to_its_job_and_keeps_the_others() -> None:
    """Every query of "Jobs hit by OOM kills" joins the per-workload series to oomwatch_workload_job_info on the
    agent and the workload (instance, namespace, pod, cgroup), takes one info series per workload over the range
    (topk: a many-to-many match would fail the whole query) and keeps the kills of workloads without a job."""
    jobs = panel("Jobs hit by OOM kills")
    targets = jobs["targets"]
    assert [t["refId"] for t in targets] == ["A", "B", "C", "D"]
    for t in targets:
        assert t["instant"] and t["format"] == "table", t["refId"]
        expr = t["expr"]
        assert ("* on (job, instance, namespace, pod, cgroup) group_left (job_kind, job_name) "
                "topk by (job, instance, namespace, pod, cgroup) (1, max_over_time(oomwatch_workload_job_info{") in expr
        assert "or ignoring (job_kind, job_name)" in expr, t["refId"]
        assert "by (namespace, job_kind, job_name" in expr, t["refId"]
    renamed = next(x for x in jobs["transformations"] if x["id"] == "organize")["options"]["renameByName"]
    assert set(renamed.values()) == {"Kind", "Job", "Kills", "Group kills", "Workloads", "Last kill"}
    assert 'kind="group"' in targets[1]["expr"] and "oomwatch_last_oom_kill_timestamp_seconds" in targets[3]["expr"]
    # each row links to the explanations of its job
    (link,) = jobs["fieldConfig"]["defaults"]["links"]
    assert "var-job=${__data.fields.job_name}" in link["url"] and "${logs:queryparam}" in link["url"]


def test_recent_incidents_still_link_to_each_agents_incidents() -> None:
    """Installs without Loki: the explanation is one click away at the node agent's /incidents."""
    (link,) = panel("Recent incidents")["fieldConfig"]["defaults"]["links"]
    assert link["url"] == "http://${__data.fields.instance}/incidents"


def test_job_variable_is_a_text_box_that_matches_everything_by_default() -> None:
    """Only the Explanations panel reads it (a node without jobs must not leave a query variable empty)."""
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    job = variables["job"]
    assert job["type"] == "textbox" and job["query"] == ".*" and job["current"]["value"] == ".*"
    for p in dashboard()["panels"]:
        if p["type"] != "logs":
            assert "$job" not in json.dumps(p["targets"]), p["title"]


LOGS_VARIABLES = {"cluster": ".*", "node": "gpu-1", "namespace": "ml", "pod": "train-0", "job": "train"}


def logql() -> str:
    (query,) = [q for _, q in panel_queries(DASHBOARD, LOGS_VARIABLES, datasource=LOKI)]
    return query


def test_explanations_panel_reads_the_events_file_lines_from_loki() -> None:
    """The logs panel: Loki through the `logs` variable, one range query; its LogQL selects the agent's streams
    by the labels of the mixin's default _config, keeps the incident lines, extracts the contract's fields (the
    workload's namespace, pod, job, owner, Slurm job: docs/contract.md "Incident JSON") and filters them on the
    dashboard's variables, and shows the explanation."""
    logs = panel("Explanations (Loki)")
    assert logs["type"] == "logs" and logs["datasource"] == {"type": "loki", "uid": "${logs}"}
    (target,) = logs["targets"]
    assert target["queryType"] == "range" and target["datasource"] == {"type": "loki", "uid": "${logs}"}
    query = logql()
    assert query.startswith('{cluster=~".*", node_name=~"gpu-1", container="oomwatch"} |= `"explanation"` | json ')
    for extraction in ('workload_namespace="workload.namespace"', 'workload_pod="workload.pod"',
                       'workload_job="workload.job.name"', 'workload_owner="workload.owner.name"',
                       'workload_slurm_job="workload.slurm_job"'):
        assert extraction in query, extraction
    for label_filter in ('workload_namespace=~"ml"', 'workload_pod=~"train-0"',
                         'workload_job=~"train" or workload_owner=~"train" or workload_slurm_job=~"train"'):
        assert label_filter in query, label_filter
    assert query.endswith("| line_format `{{.kind}} kill, scope {{.scope}}: {{.explanation}}`")
    # not a PromQL query: the Prometheus helpers never see it
    assert all("line_format" not in q for _, q in panel_queries(DASHBOARD, {**LOGS_VARIABLES, "node": ".*"}))


def test_the_incident_fields_the_panel_reads_are_the_contracts() -> None:
    """The JSON paths the LogQL extracts are fields of the incident JSON of docs/contract.md."""
    contract = (ROOT / "docs/contract.md").read_text()
    section = contract[contract.index("## Incident JSON"):contract.index("**Counts are the kernel's.**")]
    for path in re.findall(r'="(workload\.[\w.]+)"', logql()) + ["explanation", "kind", "scope"]:
        for part in path.split("."):
            assert f'"{part}"' in section, (path, part)


def check_logql(queries: list[str]) -> list[dict[str, Any]]:
    """Grafana's LogQL grammar on each query (scripts/check-logql: @grafana/lezer-logql under node)."""
    out = subprocess.run([str(ROOT / "scripts/check-logql")], input=json.dumps(queries), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.tools
def test_logql_parses_with_grafanas_grammar() -> None:
    """The query parses without an error node in Grafana's LogQL grammar, as shipped (the variables in its
    strings) and substituted; its stream selector has a matcher that cannot match empty (Loki refuses a selector
    without one), and the grammar sees the same stages the structure test reads. The check can fail: a broken
    query has an error node."""
    raw = panel("Explanations (Loki)")["targets"][0]["expr"]
    shipped, substituted, broken = check_logql([raw, logql(), raw.replace("} |=", " |=", 1)])
    assert shipped["errors"] == [] and substituted["errors"] == []
    assert broken["errors"]
    selector = {(m["label"], m["op"], m["value"]) for m in substituted["selector"]}
    assert selector == {("cluster", "=~", ".*"), ("node_name", "=~", "gpu-1"), ("container", "=", "oomwatch")}
    assert any(op == "=" and value for _, op, value in selector)
    assert substituted["line_filters"] == [{"op": "|=", "value": '"explanation"'}]
    assert {e["label"]: e["path"] for e in substituted["extractions"]} == {
        "kind": "kind", "scope": "scope", "explanation": "explanation",
        "workload_namespace": "workload.namespace", "workload_pod": "workload.pod",
        "workload_job": "workload.job.name", "workload_owner": "workload.owner.name",
        "workload_slurm_job": "workload.slurm_job"}
    filtered = {(f["label"], f["value"]) for f in substituted["label_filters"]}
    assert {("workload_namespace", "ml"), ("workload_pod", "train-0"), ("workload_job", "train"),
            ("workload_owner", "train"), ("workload_slurm_job", "train")} <= filtered
    assert substituted["line_format"] == "{{.kind}} kill, scope {{.scope}}: {{.explanation}}"


# --- legends, tables and counts that read for every workload type (issue 32) ----------------------------------

# Two label templates with nothing but spaces between them: a label that is empty for one workload type runs the
# other into it ("{{node}}{{instance}}" read "build-2127.0.0.1:43947", ".../{{container}}{{cgroup}}" "///a").
_ADJACENT_TEMPLATES = re.compile(r"\}\}\s*\{\{")
_TEMPLATE = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def legends() -> list[tuple[str, str, str]]:
    """(panel title, legendFormat, expr) of every query target with a legend."""
    return [(p["title"], t["legendFormat"], t["expr"]) for p in dashboard()["panels"] for t in p.get("targets", [])
            if t.get("legendFormat")]


def test_the_adjacency_check_catches_the_legends_that_did_not_read() -> None:
    for bad in ("{{node}}{{instance}}", "{{namespace}}/{{pod}}/{{container}}{{cgroup}} {{role}}", "{{a}} {{b}}"):
        assert _ADJACENT_TEMPLATES.search(bad), bad
    for good in ("{{workload}}: {{role}}", "{{node}}: lost", "p99", "{{kind}}"):
        assert not _ADJACENT_TEMPLATES.search(good), good


def test_no_legend_places_two_label_templates_side_by_side() -> None:
    found = legends()
    assert any(_TEMPLATE.search(fmt) for _, fmt, _ in found)
    for title, fmt, _ in found:
        assert not _ADJACENT_TEMPLATES.search(fmt), (title, fmt)


def legend_labels_dropped(fmt: str, expr: str) -> set[str]:
    """The labels a legend names that its query does not keep: not in its outermost `by (...)` nor written by
    label_join/label_replace (`workload`)."""
    by = re.search(r"\bby \(([^)]*)\)", expr)
    kept = {name.strip() for name in by.group(1).split(",")} if by else set()
    kept |= set(re.findall(r'label_(?:join|replace)\(.*?, "(\w+)", ', expr))
    return set(_TEMPLATE.findall(fmt)) - kept


def test_every_legend_label_is_one_the_query_keeps() -> None:
    """A label the aggregation dropped would print as nothing."""
    assert legend_labels_dropped("{{node}}: {{instance}}", "avg by (node) (x)") == {"instance"}
    for title, fmt, expr in legends():
        assert not legend_labels_dropped(fmt, expr), (title, fmt)


def test_workload_legends_and_tables_name_the_workload_once() -> None:
    """Every legend or table over workloads shows the one `workload` label, never the identity labels it is made
    of (most of them empty for any one type)."""
    for title, fmt, expr in legends():
        assert not set(_TEMPLATE.findall(fmt)) & {"namespace", "pod", "container", "cgroup", "instance"}, (title, fmt)
    for title in ("Top workloads by OOM kills", "Recent incidents", "At risk: working set against limit"):
        p = panel(title)
        for t in p["targets"]:
            assert t["expr"].count('"workload"') >= 3, (title, t["refId"])  # named(): the label written
        organize = next(x for x in p["transformations"] if x["id"] == "organize")["options"]
        hidden = {k for k, v in organize["excludeByName"].items() if v}
        assert {"namespace", "pod", "container", "cgroup"} <= hidden, title
        assert organize["indexByName"]["workload"] == 0 and organize["renameByName"]["workload"] == "Workload"


def test_kill_counts_are_rounded_or_counted_per_step() -> None:
    """Counts over the range (stats, the Jobs and Top tables) round each series' increase(); bars count the
    counter's change per step (`offset $__interval`), never increase() over $__rate_interval, whose windows
    overlap: its legend sums counted kills twice and in fractions."""
    counted = 0
    for p in dashboard()["panels"]:
        bars = p.get("fieldConfig", {}).get("defaults", {}).get("custom", {}).get("drawStyle") == "bars"
        counts = p["type"] == "stat" and p["fieldConfig"]["defaults"].get("decimals") == 0
        for t in prometheus_targets(p):
            expr = t["expr"]
            if bars:
                assert "increase(" not in expr and "offset $__interval" in expr, (p["title"], expr)
                counted += 1
            elif counts and "increase(" in expr or p["title"] in ("Top workloads by OOM kills",
                                                                  "Jobs hit by OOM kills"):
                for m in re.finditer(r"increase\(", expr):
                    assert expr[:m.start()].endswith("round("), (p["title"], t["refId"], expr)
                    counted += 1
            assert "[$__rate_interval]))" not in expr or "rate(" in expr, (p["title"], expr)
    assert counted >= 10


def test_jobs_table_counts_workloads_of_every_type_not_pods() -> None:
    """A plain cgroup is no pod: the count column is Workloads, one per pod (its containers are one), Slurm step,
    unit or cgroup on its node."""
    jobs = panel("Jobs hit by OOM kills")
    count = next(t["expr"] for t in jobs["targets"] if t["refId"] == "C")
    renamed = next(x for x in jobs["transformations"] if x["id"] == "organize")["options"]["renameByName"]
    assert renamed["Value #C"] == "Workloads" and "Pods" not in renamed.values()
    assert count.startswith("count by (namespace, job_kind, job_name) "
                            "(sum by (namespace, job_kind, job_name, pod, cgroup, node) (")
