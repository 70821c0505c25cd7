"""Golden end-to-end: a fixture cgroup tree + a real kmsg capture in → the exact /metrics text and incidents
JSON out, compared with checked-in files. `OOMWATCH_UPDATE_GOLDEN=1 pytest tests/test_golden.py` rewrites
them; review the diff before committing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from oomwatch.config import Config
from oomwatch.node import NodePosture
from oomwatch.pipeline import Settings
from oomwatch.sources.cgroupfs import Proc
from tests.conftest import BOOT_TIME, DETECTED_AT, FIXTURES, base_url, http_get, running_agent, wait_for
from tests.replay import Replay, saved_log_events, tree_events

CASES = sorted(p for p in (FIXTURES / "golden").iterdir() if p.is_dir())
UPDATE = os.environ.get("OOMWATCH_UPDATE_GOLDEN") == "1"


def golden_config(case: Path, tmp_path: Path) -> Config:
    return Config(
        kmsg=str(case / "kmsg"), cgroup_root=str(case / "cgroup"), proc=str(case / "proc"), listen="127.0.0.1:0",
        kubelet_config=str(case / "kubelet" / "config.yaml"), run_root=str(case / "run"),
        pod_log_dir=str(case / "pods"), kube_api="off", boot_time=BOOT_TIME,
        events_file=str(tmp_path / "events.jsonl"), state_dir=str(tmp_path / "state"))


def expected(path: Path, actual: str) -> str:
    """The golden text at `path`; `actual` is written there first with OOMWATCH_UPDATE_GOLDEN=1 (or when there is
    none yet, and the test fails: a new golden file is reviewed before it counts)."""
    if UPDATE or not path.exists():
        path.write_text(actual)
        if not UPDATE:
            pytest.fail(f"{path.name} did not exist; written now: review it and run again")
    return path.read_text()


def compare(path: Path, actual: str) -> None:
    assert actual == expected(path, actual), f"differs from {path} (OOMWATCH_UPDATE_GOLDEN=1 to rewrite)"


def replayed(case: Path) -> tuple[str, str]:
    """The case's tree and log through the pipeline, as the agent's loop feeds it: (/metrics, /incidents JSON)."""
    config = golden_config(case, Path("/nonexistent"))
    replay = Replay(Settings(boot_id=Proc(config.proc).boot_id(), boot_time=BOOT_TIME, kmsg_source=None,
                             counting=False), now=DETECTED_AT,
                    single_process_oom_kill=NodePosture(config, Proc(config.proc)).single_process_oom_kill())
    replay.run(tree_events(case / "cgroup", case / "run", case / "pods") + saved_log_events(case / "kmsg"))
    incidents = list(replay.pipeline.view().store.incidents)
    return replay.metrics(config).decode(), json.dumps(incidents, indent=2, sort_keys=True) + "\n"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_golden_metrics_and_incidents(case: Path) -> None:
    metrics, incidents = replayed(case)
    rewrite = "(OOMWATCH_UPDATE_GOLDEN=1 to rewrite)"
    assert metrics == expected(case / "expected-metrics.txt", metrics), f"/metrics of {case.name} differs {rewrite}"
    assert incidents == expected(case / "expected-incidents.json", incidents), \
        f"/incidents of {case.name} differs {rewrite}"


def test_the_running_agent_serves_the_golden_output(tmp_path: Path) -> None:
    """Smoke test of the wiring: the real agent (threads, HTTP, events file) on a golden case. Its kernel log is a
    FIFO, written only once the agent serves: before any record, every workload of the tree already has its series
    at 0 (Prometheus' increase() needs them to see the first kill); after, it serves exactly the golden output,
    and its events file carries the same incidents, one per line."""
    import os
    import threading

    case = FIXTURES / "golden" / "memcg-scenarios"
    expected = json.loads((case / "expected-incidents.json").read_text())
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    config = golden_config(case, tmp_path)
    config = Config(**{**config.__dict__, "kmsg": str(fifo)})
    writer = threading.Thread(target=lambda: (fifo.open("wb").write((case / "kmsg").read_bytes()) if gate.wait(30)
                                              else None), daemon=True)
    gate = threading.Event()
    writer.start()
    with running_agent(config, clock=lambda: DETECTED_AT) as agent:
        assert wait_for(lambda: http_get(base_url(agent) + "/healthz")[0] == 200)
        before = http_get(base_url(agent) + "/metrics")[1].decode()
        gate.set()
        assert wait_for(lambda: len(json.loads(http_get(base_url(agent) + "/incidents")[1])) == len(expected))
        status, metrics = http_get(base_url(agent) + "/metrics")
        status, incidents = http_get(base_url(agent) + "/incidents")
    zero = {line.split("{")[1].split("}")[0] for line in before.splitlines()
            if line.startswith("oomwatch_oom_kills_total{") and line.endswith(" 0.0")}
    tree = Replay(Settings(boot_id="b", boot_time=BOOT_TIME, kmsg_source=None, counting=False))
    tree.run(tree_events(case / "cgroup"))
    workloads = {f'cgroup="{path}",container="",kind="{kind}",namespace="",pod=""'
                 for path, _, _ in tree.pipeline.view().workloads for kind in ("single", "group")}
    assert len(workloads) == 12 and zero == workloads  # /a /b /p /p/c1 /p/c2 /q; /q/c1 only once it is killed
    assert metrics.decode() == (case / "expected-metrics.txt").read_text()
    assert json.loads(incidents) == expected
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == expected
