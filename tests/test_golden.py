"""Golden end-to-end: a fixture cgroup tree + a real kmsg capture in → the exact /metrics text and incidents
JSON out, compared with checked-in files. `OOMWATCH_UPDATE_GOLDEN=1 pytest tests/test_golden.py` rewrites
them; review the diff before committing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from oomwatch.config import Config
from tests.conftest import BOOT_TIME, DETECTED_AT, FIXTURES, base_url, http_get, running_agent, wait_for

CASES = sorted(p for p in (FIXTURES / "golden").iterdir() if p.is_dir())
UPDATE = os.environ.get("OOMWATCH_UPDATE_GOLDEN") == "1"


def golden_config(case: Path, tmp_path: Path) -> Config:
    return Config(
        kmsg=str(case / "kmsg"), cgroup_root=str(case / "cgroup"), proc=str(case / "proc"), listen="127.0.0.1:0",
        kubelet_config=str(case / "kubelet" / "config.yaml"), run_root=str(case / "run"),
        pod_log_dir=str(case / "pods"), kube_api="off", boot_time=BOOT_TIME,
        events_file=str(tmp_path / "events.jsonl"), state_dir=str(tmp_path / "state"))


def compare(path: Path, actual: str) -> None:
    if UPDATE or not path.exists():
        path.write_text(actual)
        if not UPDATE:
            pytest.fail(f"{path.name} did not exist; written now: review it and run again")
    assert actual == path.read_text(), f"differs from {path} (OOMWATCH_UPDATE_GOLDEN=1 to rewrite)"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_golden_metrics_and_incidents(case: Path, tmp_path: Path) -> None:
    with running_agent(golden_config(case, tmp_path), clock=lambda: DETECTED_AT) as agent:
        assert wait_for(lambda: agent.kmsg_alive), agent.kmsg_error
        status, metrics = http_get(base_url(agent) + "/metrics")
        assert status == 200
        status, incidents = http_get(base_url(agent) + "/incidents")
        assert status == 200
    incidents_json = json.dumps(json.loads(incidents), indent=2, sort_keys=True) + "\n"
    compare(case / "expected-metrics.txt", metrics.decode())
    compare(case / "expected-incidents.json", incidents_json)
    # The events file carries exactly the same incidents, one per line.
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == json.loads(incidents)
