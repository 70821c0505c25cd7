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


# --- "Jobs hit by OOM kills" on two real scrapes of the golden node, its pod a JobSet's worker ------------------

TRAIN_0_UID = "0b0c6b3e-9d55-4a52-8f0e-0d2b1c3a4e5f"  # ml/train-0 of fixtures/golden/k8s-runc


def jobset_scrapes() -> tuple[str, str]:
    """/metrics of the golden k8s-runc node as the agent serves it when the API server says ml/train-0 is a worker
    of JobSet `train` (its pod object through the real PodIndex): before the kernel log is read (every counter
    at 0) and after (the real group kill of its trainer container)."""
    from oomwatch.node import NodePosture
    from oomwatch.pipeline import Settings
    from oomwatch.sinks.collector import OomwatchCollector
    from oomwatch.sources.cgroupfs import CgroupFS, Proc
    from oomwatch.sources.statcache import StatCache
    from oomwatch.node import scraped_workloads
    from oomwatch.workloads import WorkloadResolver
    from oomwatch.workloads.kubeapi import PodIndex
    from oomwatch.workloads.runtime import RuntimeNames
    from tests.conftest import BOOT_TIME, DETECTED_AT
    from tests.replay import Replay, saved_log_events, tree_events
    from tests.test_golden import golden_config

    config = golden_config(GOLDEN, Path("/nonexistent"))
    index = PodIndex("gpu-1", client=None)
    index.apply("ADDED", {"metadata": {
        "namespace": "ml", "name": "train-0", "uid": TRAIN_0_UID,
        "labels": {"jobset.sigs.k8s.io/jobset-name": "train"},
        "ownerReferences": [{"kind": "Job", "name": "train-workers-0", "controller": True, "uid": "j"}]}})
    resolver = WorkloadResolver(RuntimeNames(run_root=config.run_root, pod_log_root=config.pod_log_dir), index)
    posture = NodePosture(config, Proc(config.proc))
    replay = Replay(Settings(boot_id=Proc(config.proc).boot_id(), boot_time=BOOT_TIME, kmsg_source=None,
                             counting=False), now=DETECTED_AT, resolver=resolver,
                    single_process_oom_kill=posture.single_process_oom_kill())
    fs = CgroupFS(config.cgroup_root)

    def scrape() -> str:
        view = replay.pipeline.view()
        return OomwatchCollector(view, lambda: scraped_workloads(view.workloads, StatCache(fs), fs, set()),
                                 lambda: posture.info_with(view.single_process_oom_kill),
                                 workloads=lambda: view.workloads).exposition().decode()

    replay.run(tree_events(GOLDEN / "cgroup", GOLDEN / "run", GOLDEN / "pods"))
    before = scrape()
    replay.run(saved_log_events(GOLDEN / "kmsg"))
    return before, scrape()


def two_scrape_series(before: str, after: str, at: int = 3, samples: int = 11) -> list[dict[str, str]]:
    """promtool input series: each sample of `before` until minute `at`, then of `after` (absent: `_`)."""
    def parse(text: str) -> dict[str, str]:
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, labels, value = _SAMPLE.match(line).groups()
                labels = ",".join(part for part in (labels, SCRAPE_LABELS) if part)
                out[f"{name}{{{labels}}}"] = {"+Inf": "Inf"}.get(value, value)
        return out
    first, second = parse(before), parse(after)
    return [{"series": s, "values": " ".join([first.get(s, "_")] * at + [second.get(s, "_")] * (samples - at))}
            for s in sorted(set(first) | set(second))]


def test_jobs_table_shows_the_jobset_the_kill_broke(promtool: str, tmp_path: Path) -> None:
    """Each query of "Jobs hit by OOM kills", evaluated by promtool on the two scrapes (the kill counted at
    minute 3, the range 10 minutes): one row, JobSet train in namespace ml, 1 kill, 1 group kill, 1 pod, last kill
    at the kernel's time of the kill. No other workload of the node was killed: no row without a job."""
    before, after = jobset_scrapes()
    assert 'oomwatch_workload_job_info{cgroup="",job_kind="JobSet",job_name="train",namespace="ml",' in before
    series = two_scrape_series(before, after)
    kill_time = json.loads((GOLDEN / "expected-incidents.json").read_text())[0]["time"]
    from oomwatch.timefmt import parse_iso8601

    row = '{job_kind="JobSet", job_name="train", namespace="ml"}'
    expected = {"A": 1, "B": 1, "C": 1, "D": parse_iso8601(kill_time) * 1000}
    variables = {"namespace": ".*", "pod": ".*", "node": ".*", "__range": "10m"}
    (jobs,) = [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["title"] == "Jobs hit by OOM kills"]
    from .dashboard import substitute

    for target in jobs["targets"]:
        expr = substitute(target["expr"], variables)
        evaluate_series(promtool, tmp_path, series, expr, "10m",
                        [{"labels": row, "value": expected[target["refId"]]}])


def test_jobs_table_keeps_kills_without_a_job(promtool: str, tmp_path: Path) -> None:
    """Without the API server (no info series), the kill is still in the table: a row of namespace ml with no
    job. So a node whose agent cannot reach the API shows its kills there too."""
    before, after = jobset_scrapes()
    drop = "oomwatch_workload_job_info{"
    series = [s for s in two_scrape_series(before, after) if not s["series"].startswith(drop)]
    (jobs,) = [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["title"] == "Jobs hit by OOM kills"]
    from .dashboard import substitute

    expr = substitute(jobs["targets"][0]["expr"], {"namespace": ".*", "pod": ".*", "node": ".*", "__range": "10m"})
    evaluate_series(promtool, tmp_path, series, expr, "10m", [{"labels": '{namespace="ml"}', "value": 1}])


def evaluate_series(promtool: str, tmp_path: Path, series: list[dict[str, str]], expr: str, eval_time: str,
                    exp_samples: list[dict]) -> None:
    (tmp_path / "empty-rules.yaml").write_text("groups: []\n")
    test = {"rule_files": ["empty-rules.yaml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series,
                       "promql_expr_test": [{"expr": expr, "eval_time": eval_time, "exp_samples": exp_samples}]}]}
    path = tmp_path / "dashboard.test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    out = run([promtool, "test", "rules", str(path)], check=False)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr
