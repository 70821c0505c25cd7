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
from .dashboard import panel_queries, substitute

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
             [{"labels": '{node="gpu-1"}', "value": share}])


def test_the_old_posture_query_would_have_failed(promtool: str, tmp_path: Path) -> None:
    """The evaluation can tell the two apart: every workload cgroup gives 1 of 6."""
    with pytest.raises(AssertionError):
        evaluate(promtool, tmp_path, 'avg by (node, instance) (oomwatch_memory_oom_group{node=~".*"})',
                 [{"labels": '{instance="10.0.0.1:9717", node="gpu-1"}', "value": 0.5}])


# --- "Jobs hit by OOM kills" on two real scrapes of the golden node, its pod a JobSet's worker ------------------

TRAIN_0_UID = "0b0c6b3e-9d55-4a52-8f0e-0d2b1c3a4e5f"  # ml/train-0 of fixtures/golden/k8s-runc


def jobset_scrapes() -> tuple[str, str]:
    """/metrics of the golden k8s-runc node as the agent serves it when the API server says ml/train-0 is a worker
    of JobSet `train` (its pod object as the pod source emits it): before the kernel log is read (every counter
    at 0) and after (the real group kill of its trainer container)."""
    from oomwatch.node import NodePosture
    from oomwatch.pipeline import Settings
    from oomwatch.sinks.collector import OomwatchCollector
    from oomwatch.sources.cgroupfs import CgroupFS, Proc
    from oomwatch.sources.statcache import StatCache
    from oomwatch.node import scraped_workloads
    from oomwatch.workloads import WorkloadResolver
    from oomwatch.workloads.runtime import RuntimeNames
    from tests.conftest import BOOT_TIME, DETECTED_AT
    from tests.replay import Replay, pods_listed, saved_log_events, tree_events
    from tests.test_golden import golden_config

    config = golden_config(GOLDEN, Path("/nonexistent"))
    pods = pods_listed({"metadata": {
        "namespace": "ml", "name": "train-0", "uid": TRAIN_0_UID,
        "labels": {"jobset.sigs.k8s.io/jobset-name": "train"},
        "ownerReferences": [{"kind": "Job", "name": "train-workers-0", "controller": True, "uid": "j"}]}})
    resolver = WorkloadResolver(RuntimeNames(run_root=config.run_root, pod_log_root=config.pod_log_dir))
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

    replay.step(pods)  # the pod source's first list
    replay.run(tree_events(GOLDEN / "cgroup", GOLDEN / "run", GOLDEN / "pods"))
    before = scrape()
    replay.run(saved_log_events(GOLDEN / "kmsg"))
    return before, scrape()


def two_scrape_series(before: str, after: str, at: int = 3, samples: int = 11) -> list[dict[str, str]]:
    """promtool input series: each sample of `before` until minute `at`, then of `after` (absent: `_`)."""
    first, second = scrape_series(before, SCRAPE_LABELS), scrape_series(after, SCRAPE_LABELS)
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


# --- every workload type reads (issue 32): Kubernetes, Slurm, systemd, plain cgroups -----------------------------

MEMCG = ROOT / "fixtures/golden/memcg-scenarios"
SLURM_SCOPE = "/system.slice/slurmstepd.scope"


def scrape_series(text: str, scrape_labels: str) -> dict[str, str]:
    """{promtool series: value} of one /metrics body, with the labels a scrape adds."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, labels, value = _SAMPLE.match(line).groups()
            labels = ",".join(part for part in (labels, scrape_labels) if part)
            out[f"{name}{{{labels}}}"] = {"+Inf": "Inf"}.get(value, value)
    return out


def killed(series: dict[str, str], cgroups: set[str]) -> dict[str, str]:
    """The same scrape after one single kill in each of `cgroups`."""
    return {s: (str(float(v) + 1) if s.startswith("oomwatch_oom_kills_total{") and 'kind="single"' in s
                and any(f'cgroup="{c}"' in s for c in cgroups) else v) for s, v in series.items()}


def hpc_node_scrape() -> str:
    """/metrics of an agent on a Slurm node, as the collector writes it from the pipeline's View: job 42's own
    cgroup and two steps in slurmd's scope, job 9's step in a node-named scope (docs/contract.md "Identity") and a
    systemd unit."""
    from oomwatch.events import CgroupAdded
    from tests.test_job_info import Node

    node = Node([])
    node.replay.run([CgroupAdded(path, ino=None, local=None, oom_group=1, limited=True, pids=()) for path in (
        f"{SLURM_SCOPE}/job_42", f"{SLURM_SCOPE}/job_42/step_0", f"{SLURM_SCOPE}/job_42/step_batch",
        "/hpc-3_slurmstepd.scope/job_9/step_extern", "/system.slice/nginx.service")])
    return node.collector().exposition().decode()


def three_nodes(samples: int = 11, at: int = 3) -> list[dict[str, str]]:
    """promtool input: the golden Kubernetes node (gpu-1, its kill before the range: counters constant), the golden plain-cgroup host (build-2: its four OOM
    incidents, counters at 0 until minute `at`) and the Slurm node (hpc-3: a kill in steps 0 and batch of job 42
    and in the systemd unit at minute `at`)."""
    gpu = scrape_series((GOLDEN / "expected-metrics.txt").read_text(), SCRAPE_LABELS)
    build_after = scrape_series((MEMCG / "expected-metrics.txt").read_text(),
                                'job="oomwatch",instance="10.0.0.2:9717",node="build-2"')
    build_before = {s: ("0.0" if "_total{" in s else v) for s, v in build_after.items()}
    hpc_before = scrape_series(hpc_node_scrape(), 'job="oomwatch",instance="10.0.0.3:9717",node="hpc-3"')
    hpc_after = killed(hpc_before, {f"{SLURM_SCOPE}/job_42/step_0", f"{SLURM_SCOPE}/job_42/step_batch",
                                    "/system.slice/nginx.service"})
    series = [{"series": s, "values": " ".join([v] * samples)} for s, v in gpu.items()]
    for before, after in ((build_before, build_after), (hpc_before, hpc_after)):
        series += [{"series": s, "values": " ".join([before[s]] * at + [after[s]] * (samples - at))} for s in after]
    return series


def test_every_workload_type_reads_as_one_workload_label(promtool: str, tmp_path: Path) -> None:
    """The `workload` label the panels' legends and tables show (here from "Processes killed by role", two series
    per workload: victim and collateral), for every workload of the three nodes: namespace/pod/container, or
    namespace/pod for a pod's own cgroup; Slurm's job and step by name, on their node; any other cgroup (a systemd
    unit, a plain cgroup) by its path, on its node. Never "///a"."""
    expr = substitute(panel_expr_template("Processes killed by role"),
                      {"namespace": ".*", "pod": ".*", "node": ".*", "__interval": "1m"})
    expected = [
        "ml/train-0", "ml/train-0/trainer", "shop/web-5d8f", "shop/web-5d8f/web",
        "/kubepods on gpu-1", "/system.slice/containerd.service on gpu-1",
        "/a on build-2", "/b on build-2", "/p on build-2", "/p/c1 on build-2", "/p/c2 on build-2", "/q on build-2",
        "/q/c1 on build-2",
        "Slurm job 42 on hpc-3", "Slurm job 42 step 0 on hpc-3", "Slurm job 42 step batch on hpc-3",
        "Slurm job 9 step extern on hpc-3", "/system.slice/nginx.service on hpc-3",
    ]
    evaluate_series(promtool, tmp_path, three_nodes(), f"count by (workload) ({expr})", "10m",
                    [{"labels": f'{{workload="{w}"}}', "value": 2} for w in expected])


def test_the_workload_label_leaves_no_helper_label(promtool: str, tmp_path: Path) -> None:
    """named() writes `workload` through a temporary pod_path label, removed again: no series keeps it (a count
    by it is one group of all 18 workloads' two series)."""
    expr = substitute(panel_expr_template("Processes killed by role"),
                      {"namespace": ".*", "pod": ".*", "node": ".*", "__interval": "1m"})
    evaluate_series(promtool, tmp_path, three_nodes(), f"count by (pod_path) ({expr})", "10m",
                    [{"labels": "{}", "value": 2 * 18}])


def panel_expr_template(title: str, ref: str = "A") -> str:
    (p,) = [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["title"] == title]
    (t,) = [t for t in p["targets"] if t["refId"] == ref]
    return t["expr"]


def jobs_query(ref: str) -> str:
    return substitute(panel_expr_template("Jobs hit by OOM kills", ref),
                      {"namespace": ".*", "pod": ".*", "node": ".*", "__range": "10m"})


def test_jobs_table_counts_slurm_steps_and_cgroups_not_pods(promtool: str, tmp_path: Path) -> None:
    """The kills in the range of "Jobs hit by OOM kills": Slurm job 42 (two kills, two workloads: its killed steps)
    and the kills without a job (build-2's five killed cgroups and hpc-3's unit: six kills, six workloads on two
    nodes); no pod was killed in the range. The count column is Workloads, where it said "Pods 4" for plain
    cgroups."""
    series = three_nodes()
    slurm, none = ('{job_kind="SlurmJob", job_name="42"}', "{}")
    for ref, samples in (("A", [(slurm, 2), (none, 6)]), ("C", [(slurm, 2), (none, 6)])):
        evaluate_series(promtool, tmp_path, series, jobs_query(ref), "10m",
                        [{"labels": labels, "value": value} for labels, value in samples])


# --- whole numbers: kills over the range rounded, bars that add up ----------------------------------------------

def counter(values: str) -> list[dict[str, str]]:
    labels = 'cgroup="/a",container="",kind="single",namespace="",pod="",' + SCRAPE_LABELS
    return [{"series": f"oomwatch_oom_kills_total{{{labels}}}", "values": values}]


def test_kills_in_range_is_a_whole_number_where_increase_extrapolates(promtool: str, tmp_path: Path) -> None:
    """One kill at minute 3 of a counter that was 1 already: increase() over a range that starts and ends between
    scrapes extrapolates it to 1.11 kills; the stat says 1."""
    series = counter("1 1 1 2 2 2 2 2 2 2 2 2")
    expr = substitute(panel_expr_template("OOM kills in range"), {"namespace": ".*", "pod": ".*", "node": ".*",
                                                                  "__range": "10m"})
    evaluate_series(promtool, tmp_path, series, expr, "10m30s", [{"labels": "{}", "value": 1}])
    with pytest.raises(AssertionError):  # what the unrounded query says: not a count
        evaluate_series(promtool, tmp_path, series, "sum(increase(oomwatch_oom_kills_total[10m]))", "10m30s",
                        [{"labels": "{}", "value": 1}])


def test_bars_add_up_to_the_kills(promtool: str, tmp_path: Path) -> None:
    """"OOM kills over time by kind" at each step of a range query (a subquery whose step is $__interval, as
    Grafana's): whole numbers that add up to the 4 kills of the range, where increase() over $__rate_interval
    (4 steps) counted each kill in four bars."""
    series = counter("0 0 1 1 1 3 3 3 4 4 4 4")
    expr = substitute(panel_expr_template("OOM kills over time by kind"),
                      {"namespace": ".*", "pod": ".*", "node": ".*", "__interval": "1m"})
    evaluate_series(promtool, tmp_path, series, f"sum_over_time(({expr})[10m:1m])", "11m",
                    [{"labels": '{kind="single"}', "value": 4}])
    evaluate_series(promtool, tmp_path, series, f"count_over_time((({expr}) != 0 and ({expr}) != 1 and ({expr}) != 2)[10m:1m])",
                    "11m", [])
    with pytest.raises(AssertionError):
        evaluate_series(promtool, tmp_path, series,
                        "sum_over_time((sum by (kind) (increase(oomwatch_oom_kills_total[4m])))[10m:1m])", "11m",
                        [{"labels": '{kind="single"}', "value": 4}])
    # a step with no sample a step before (a new series, a Prometheus younger than the step): 0, not nothing
    evaluate_series(promtool, tmp_path, series, expr, "30s", [{"labels": '{kind="single"}', "value": 0}])


def test_top_workloads_table_names_each_type_beside_its_node_column(promtool: str, tmp_path: Path) -> None:
    """The table has a node column, so its workload names leave out " on <node>": the kills in the range, one row
    per workload."""
    expr = substitute(panel_expr_template("Top workloads by OOM kills"),
                      {"namespace": ".*", "pod": ".*", "node": ".*", "__range": "10m"})
    killed_in_range = ["/a", "/b", "/p/c1", "/q", "/q/c1", "Slurm job 42 step 0", "Slurm job 42 step batch",
                       "/system.slice/nginx.service"]
    evaluate_series(promtool, tmp_path, three_nodes(), f"count by (workload) ({expr})", "10m",
                    [{"labels": f'{{workload="{w}"}}', "value": 1} for w in killed_in_range])
