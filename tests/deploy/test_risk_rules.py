"""Issue 14's rules and panels: the risk alerts read the working set, limit and PSI; the three OOMKilled
verdicts join kube-state-metrics with each container's current run (recorded from the kernel's memory.events);
each verdict has an alert or a panel."""

from __future__ import annotations

import json
from typing import Any

import yaml

from .conftest import DASHBOARD, RULE_TESTS, RULES

VERDICTS = ("oomwatch:container_oomkilled_confirmed:15m", "oomwatch:container_oomkilled_stale:15m",
            "oomwatch:container_oom_kill_unreported:15m")


def _rules() -> dict[str, dict[str, Any]]:
    return {r.get("alert") or r["record"]: r for g in yaml.safe_load(RULES.read_text())["groups"]
            for r in g["rules"]}


def test_risk_alerts_read_working_set_limit_and_pressure() -> None:
    rules = _rules()
    near = rules["OomwatchMemoryNearLimitUnderPressure"]["expr"]
    assert "oomwatch_memory_working_set_bytes / oomwatch_memory_limit_bytes > 0.9" in near
    assert 'rate(oomwatch_memory_pressure_seconds_total{kind="full"}' in near
    soon = rules["OomwatchMemoryLimitIn15m"]["expr"]
    assert "predict_linear(oomwatch_memory_working_set_bytes[" in soon and ", 900)" in soon


def test_verdicts_join_kube_state_metrics_with_the_run_series() -> None:
    rules = _rules()
    restart = rules["oomwatch:kube_container_oomkilled_restart:15m"]["expr"]
    assert 'kube_pod_container_status_last_terminated_reason{reason="OOMKilled"}' in restart
    assert "kube_pod_container_status_restarts_total" in restart
    exprs = " ".join(rules[v]["expr"] for v in VERDICTS)
    assert "oomwatch:kube_container_oomkilled_restart:15m" in exprs
    assert "oomwatch:container_run_last_oom_kill_timestamp_seconds[15m]" in exprs
    assert "oomwatch:container_run_kernel_oom_kill:15m" in exprs
    assert "oomwatch:container_run_oom_kills[15m]" in rules["oomwatch:container_run_kernel_oom_kill:15m"]["expr"]
    # Stale only where the kernel's count of the run is exported (not with --drop-series memory-events).
    stale = rules["oomwatch:container_oomkilled_stale:15m"]["expr"]
    assert 'max_over_time(oomwatch_memory_events_total{event="oom_kill", container!=""}[15m])' in stale


def test_the_run_is_recorded_from_series_the_agent_exports() -> None:
    """The current run's kills and last incident time are recording rules over the kernel's memory.events
    oom_kill of the container's cgroup and the container's last incident, not series of the agent; they keep
    every label but `event`, so the scrape's (job, instance, node) match for `and`."""
    rules = _rules()
    kills = rules["oomwatch:container_run_oom_kills"]["expr"]
    assert kills == 'max without (event) (oomwatch_memory_events_total{event="oom_kill", container!=""}) > 0'
    last = rules["oomwatch:container_run_last_oom_kill_timestamp_seconds"]["expr"]
    assert last == 'oomwatch_last_oom_kill_timestamp_seconds{container!=""} and oomwatch:container_run_oom_kills'
    everything = " ".join(r["expr"] for r in rules.values())
    assert "oomwatch_container_run_" not in everything


def test_each_verdict_has_an_alert_or_a_panel_and_a_promtool_case() -> None:
    alerts = " ".join(r["expr"] for r in _rules().values() if "alert" in r)
    panels = " ".join(t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"])
    tested = " ".join(str(c.get("expr")) for path in RULE_TESTS.glob("*.yaml")
                      for test in yaml.safe_load(path.read_text())["tests"]
                      for c in test.get("promql_expr_test", []) if c.get("exp_samples"))
    for verdict in VERDICTS:
        assert verdict in alerts or verdict in panels, verdict
        assert verdict in tested, f"{verdict}: no promtool case with samples"
