"""End-to-end tier: one VM boot per session runs every guest scenario; the tests read its artefacts.

The run directory is artifacts/e2e/run-<time>/. It is removed when every e2e test passed, and kept (path
printed
in the summary) when one failed, or always with OOMWATCH_E2E_KEEP=1. OOMWATCH_E2E_RUN=<dir> reuses the
artefacts of an earlier run instead of booting (to iterate on assertions).
If the VM cannot run here, every test fails: this tier never skips.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.e2e import vm
from tests.e2e.guest import kmsgtruth

ARTIFACTS = vm.REPO / "artifacts" / "e2e"


@dataclass
class Sample:
    name: str
    labels: dict
    value: float


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[Sample]:
    """Prometheus text format, read independently of oomwatch (and of prometheus_client)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = {
            k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
            for k, v in _LABEL.findall(m.group(2) or "")
        }
        v = m.group(3)
        out.append(Sample(m.group(1), labels, float("inf") if v == "+Inf" else float(v)))
    return out


def select(samples: list[Sample], name: str, **labels) -> list[Sample]:
    return [s for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


@dataclass
class ScenarioRun:
    name: str
    dir: Path
    gt: dict
    records: list
    kernel: list  # kmsgtruth.Incident, in order
    incidents: list | None  # the agent's /incidents after the scenario (None: agent not answering)
    metrics_text: str | None
    metrics: list = field(default_factory=list)


@dataclass
class E2ERun:
    dir: Path
    result: vm.VMResult | None
    vm_env: vm.VMEnv | None
    run: dict
    scenarios: dict
    all_records: list
    all_kernel: list
    events: list | None  # parsed events.jsonl (None: missing)
    events_errors: list
    final_metrics: list | None
    wall_seconds: float
    deaths: list = field(default_factory=list)  # the events file's death lines ("record": "death"), apart

    def scenario(self, name: str) -> ScenarioRun:
        if name not in self.scenarios:
            pytest.fail(
                f"scenario {name} produced no ground truth (see {self.dir}/driver.log and console.txt)"
            )
        return self.scenarios[name]

    def kmsg_to_wall(self, usec: int) -> float:
        offs = [c["offset"] for c in self.run.get("calibration", []) if c.get("ok")]
        return usec / 1e6 - (sum(offs) / len(offs) if offs else 0.0) + self.run["wall_minus_mono"]


def _load_json(p: Path):
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def load_run(run_dir: Path, result: vm.VMResult | None, vm_env: vm.VMEnv | None, wall: float) -> E2ERun:
    run = _load_json(run_dir / "run.json") or _load_json(run_dir / "started.json") or {}
    scenarios = {}
    for gt_path in sorted(run_dir.glob("*/ground-truth.json")):
        d = gt_path.parent
        gt = _load_json(gt_path)
        raw = (d / "kmsg.raw").read_bytes() if (d / "kmsg.raw").exists() else b""
        records, _ = kmsgtruth.parse_records(raw)
        mtext = (d / "metrics.txt").read_text() if (d / "metrics.txt").exists() else None
        if mtext is not None and mtext.startswith("# agent not running"):
            mtext = None
        kernel = kmsgtruth.incidents(records)
        if gt.get("pids_before") and (gt.get("expect") or {}).get("constraint") == "global":
            # A global OOM under a slow reaper (TCG, a loaded host) can kill a bystander too while the scenario's
            # victim is still exiting (`OOM victim … is already exiting`, then the next kill): the kernel's doing,
            # not the scenario's. Kept apart; test_node_metrics_count_every_kernel_incident counts it with the node's.
            own = {int(pid) for pid in gt["pids_before"]}
            bystanders = [k for k in kernel[1:] if k.victim_pid not in own]
            gt["bystander_kills"] = [{"seq": k.seq, "kind": k.kind, "victim": k.victim_comm} for k in bystanders]
            kernel = [k for k in kernel if k not in bystanders]
        scenarios[gt["name"]] = ScenarioRun(
            gt["name"],
            d,
            gt,
            records,
            kernel,
            _load_json(d / "incidents.json"),
            mtext,
            parse_metrics(mtext) if mtext else [],
        )
    all_raw = (run_dir / "kmsg-all.raw").read_bytes() if (run_dir / "kmsg-all.raw").exists() else b""
    all_records, _ = kmsgtruth.parse_records(all_raw)
    events, errors, deaths = None, [], []
    ev_path = run_dir / "agent" / "events.jsonl"
    if ev_path.exists():
        events = []
        for i, line in enumerate(ev_path.read_text().splitlines()):
            if line.strip():
                try:
                    data = json.loads(line)
                except ValueError as e:
                    errors.append(f"line {i + 1}: {e}")
                    continue
                (deaths if isinstance(data, dict) and data.get("record") == "death" else events).append(data)
    fm = run_dir / "metrics-final.txt"
    return E2ERun(
        run_dir,
        result,
        vm_env,
        run,
        scenarios,
        all_records,
        kmsgtruth.incidents(all_records),
        events,
        errors,
        parse_metrics(fm.read_text()) if fm.exists() else None,
        wall,
        deaths,
    )


def _summary_lines(r: E2ERun) -> list[str]:
    lines = []
    res = r.result
    if res is not None:
        lines.append(
            f"VM: boot to guest driver {res.boot_seconds or float('nan'):.1f}s, "
            f"whole VM run {res.seconds:.1f}s"
            f" (rc={res.returncode}, timed_out={res.timed_out}); setup-vm {r.vm_env.setup_seconds:.1f}s;"
            f" tier wall {r.wall_seconds:.1f}s"
        )
    if r.run:
        lines.append(
            f"guest: kernel {r.run.get('kernel')}, uptime at driver start {r.run.get('uptime_at_start')}s, "
            f"driver {r.run.get('driver_seconds', float('nan')):.1f}s"
        )
        for s in r.run.get("agent_starts", []):
            lines.append(
                f"agent start: ok={s.get('ok')} in {s.get('startup_seconds', float('nan')):.2f}s"
                + (f" error={s.get('error')}" if s.get("error") else "")
            )
    lines.append("detection latency (kernel kill -> incident visible on /incidents):")
    for name, sc in r.scenarios.items():
        for d in sc.gt.get("agent", {}).get("detection", []):
            if d.get("latency_seconds") is not None:
                lines.append(f"  {name:24s} seq={d['seq']}: {d['latency_seconds']:.3f}s")
            elif d.get("after_resume_seconds") is not None:
                lines.append(
                    f"  {name:24s} seq={d['seq']}: published {d['after_resume_seconds']:.2f}s after the "
                    f"paused agent resumed"
                )
            elif d.get("after_restart_seconds") is not None:
                lines.append(
                    f"  {name:24s} seq={d['seq']}: published {d['after_restart_seconds']:.2f}s after the "
                    f"agent restarted"
                )
            else:
                lines.append(f"  {name:24s} seq={d['seq']}: NOT published")
        for k in sc.kernel:
            lines.append(f"    kernel: {k.summary()}")
    return lines


def pytest_configure(config):
    config._oomwatch_e2e = {"failed": False, "run": None}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and "e2e" in item.keywords:
        item.config._oomwatch_e2e["failed"] = True


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    st = getattr(config, "_oomwatch_e2e", None)
    if not st or st["run"] is None:
        return
    r: E2ERun = st["run"]
    terminalreporter.section("oomwatch end-to-end (real kernel)")
    for line in _summary_lines(r):
        terminalreporter.write_line(line)
    keep = st["failed"] or os.environ.get("OOMWATCH_E2E_KEEP") or os.environ.get("OOMWATCH_E2E_RUN")
    if keep:
        terminalreporter.write_line(f"artefacts kept in {r.dir}")
    else:
        shutil.rmtree(r.dir, ignore_errors=True)
        terminalreporter.write_line(
            f"all e2e tests passed; artefacts removed ({r.dir}); OOMWATCH_E2E_KEEP=1 keeps them"
        )


@pytest.fixture(scope="session")
def e2e(request) -> E2ERun:
    """Boot the VM once and run every scenario (or reuse OOMWATCH_E2E_RUN=<dir>)."""
    reuse = os.environ.get("OOMWATCH_E2E_RUN")
    t0 = time.monotonic()
    if reuse:
        r = load_run(Path(reuse), None, None, 0.0)
        request.config._oomwatch_e2e["run"] = r
        return r
    try:
        vm_env = vm.prepare()
    except vm.VMUnavailable as e:
        pytest.fail(f"the end-to-end VM cannot run on this machine: {e}", pytrace=False)
    run_dir = ARTIFACTS / time.strftime("run-%Y%m%d-%H%M%S")
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    try:
        vm_env, result = vm.run_scenarios(run_dir)
    except vm.VMUnavailable as e:
        pytest.fail(f"the end-to-end VM cannot run on this machine: {e}", pytrace=False)
    r = load_run(run_dir, result, vm_env, time.monotonic() - t0)
    request.config._oomwatch_e2e["run"] = r
    if result.failure:
        request.config._oomwatch_e2e["failed"] = True
        pytest.fail(result.failure_report(), pytrace=False)
    if not (run_dir / "started.json").exists():
        request.config._oomwatch_e2e["failed"] = True
        pytest.fail(
            f"the guest never ran the scenario driver (rc={result.returncode}, timed_out={result.timed_out});"
            f" console, last lines:\n{result.console_tail()}",
            pytrace=False,
        )
    return r


def boot_for(scenario: str, prefix: str, reuse_env: str, memory_mib: int = vm.DEFAULT_MEMORY_MIB,
             settings: dict | None = None):
    """A VM boot of its own for one guest scenario (one that must not share the main boot), or the artefacts
    of an earlier run named by `reuse_env`. `settings` go to the guest as settings.json in the run directory
    (the guest does not see the host's environment). Returns (run directory, vm.VMResult or None)."""
    reuse = os.environ.get(reuse_env)
    if reuse:
        return Path(reuse), None
    try:
        vm.prepare()
    except vm.VMUnavailable as e:
        pytest.fail(f"the end-to-end VM cannot run on this machine: {e}", pytrace=False)
    run_dir = ARTIFACTS / time.strftime(f"{prefix}-%Y%m%d-%H%M%S")
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    (run_dir / "settings.json").write_text(json.dumps(settings or {}))
    try:
        _, result = vm.run_scenarios(run_dir, only=scenario, memory_mib=memory_mib)
    except vm.VMUnavailable as e:
        pytest.fail(f"the end-to-end VM cannot run on this machine: {e}", pytrace=False)
    if result.failure:
        pytest.fail(f"{scenario}'s VM boot ({run_dir}): {result.failure_report()}", pytrace=False)
    return run_dir, result
