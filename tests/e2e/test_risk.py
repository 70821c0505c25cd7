"""OOM risk on a real kernel (its own VM boot, tests/e2e/guest/risk_scenario.py): a container growing slowly
toward its memory limit raises the risk signal (working set near the limit and PSI full stalls in the agent's
/metrics, and both issue-14 alert expressions true in Debian's Prometheus) before the kernel kills it.

Run alone: .venv/bin/pytest -m e2e tests/e2e/test_risk.py -s   (OOMWATCH_RISK_RUN=<dir> reuses a run)
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import boot_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def risk() -> dict:
    run_dir, _ = boot_for("k_risk", "risk", "OOMWATCH_RISK_RUN")
    path = run_dir / "k_risk" / "risk.json"
    if not path.exists():
        pytest.fail(f"the risk scenario did not run to its end: see {run_dir}/driver.log", pytrace=False)
    r = json.loads(path.read_text())
    gt = json.loads((run_dir / "k_risk" / "ground-truth.json").read_text()) \
        if (run_dir / "k_risk" / "ground-truth.json").exists() else {}
    return {"dir": run_dir, "risk": r, "errors": gt.get("errors", [])}


def _kill_mono(r: dict) -> float:
    assert r["kernel_kills"], "the kernel did not OOM-kill the grower"
    return min(k["kill_mono"] for k in r["kernel_kills"])


def test_the_kernel_killed_it_at_its_limit(risk) -> None:
    r = risk["risk"]
    assert not risk["errors"], risk["errors"]
    _kill_mono(r)
    assert r["memory_events"]["oom_kill"] >= 1 and r["returncode"] == -9
    assert not r["killed_before_lift"], "killed while memory.high still held it: the watch saw the end only"


def test_metrics_show_working_set_and_pressure_before_the_kill(risk) -> None:
    r = risk["risk"]
    kill = _kill_mono(r)
    assert r["psi"], "this kernel has no memory.pressure"
    before = [s for s in r["samples"] if s["mono"] < kill and s["working_set"] is not None]
    assert before and all(s["limit"] == r["limit"] for s in before)
    near = [s for s in before if s["working_set"] > 0.9 * r["limit"]]
    assert near, f"working set never above 90% of the limit before the kill: {[s['working_set'] for s in before]}"
    stalls = [s["full_seconds"] for s in before if s["full_seconds"] is not None]
    assert stalls and stalls[-1] > stalls[0], f"PSI full did not rise before the kill: {stalls}"
    print(f"\nrisk: working set {max(s['working_set'] for s in before) / 2**20:.1f} MiB of "
          f"{r['limit'] / 2**20:.0f} MiB, PSI full {stalls[0]:.3f} -> {stalls[-1]:.3f} s before the kill")


@pytest.mark.parametrize("alert", ["OomwatchMemoryNearLimitUnderPressure", "OomwatchMemoryLimitIn15m"])
def test_alert_expression_true_in_prometheus_before_the_kill(risk, alert: str) -> None:
    r = risk["risk"]
    kill = _kill_mono(r)
    assert alert in r["true_at"], f"{alert}'s expression was never true in Prometheus"
    lead = kill - r["true_at"][alert]
    assert lead > 0, f"{alert}'s expression became true only after the kill"
    print(f"risk: {alert} expression true {lead:.1f} s before the kernel's kill")
