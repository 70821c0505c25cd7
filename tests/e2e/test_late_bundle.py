"""Identity read more than once, on a real kernel (issue 29 item 2): the guest's s_late_bundle
(tests/e2e/guest/late_bundle_scenario.py) writes a runc container's bundle where containerd keeps it only after the
agent found the container's cgroup and its processes, with no names; the incident of the kernel's kill in it must
name the container, its pod and its namespace (the agent reads the bundle again when the kill needs it).
Run alone: .venv/bin/pytest -m e2e tests/e2e/test_late_bundle.py -s   (OOMWATCH_LATE_BUNDLE_RUN=<dir> reuses a run)
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import boot_for

pytestmark = pytest.mark.e2e
SCENARIO = "s_late_bundle"


@pytest.fixture(scope="module")
def late() -> dict:
    run_dir, _ = boot_for(SCENARIO, "late-bundle", "OOMWATCH_LATE_BUNDLE_RUN")
    gt_path = run_dir / SCENARIO / "ground-truth.json"
    if not gt_path.exists():
        pytest.fail(f"{SCENARIO} did not run to its end: see {run_dir}/driver.log", pytrace=False)
    incidents = run_dir / SCENARIO / "incidents.json"
    return {"gt": json.loads(gt_path.read_text()),
            "incidents": json.loads(incidents.read_text()) if incidents.exists() else None}


def test_the_pod_is_named_though_its_bundle_came_after_its_cgroup(late) -> None:
    gt = late["gt"]
    assert not gt["errors"], gt["errors"]
    assert gt["task_bundle_at_start"] is False, "the bundle was where the agent reads it from the start"
    agent = gt["agent"]
    assert agent["exported_unnamed_after"] is not None, "the agent never exported the container"
    assert agent["named_before_bundle"] is False, "the agent had the container's names before its bundle existed"
    assert len(gt["kernel_incidents"]) == 1, gt["kernel_incidents"]
    [cgroup] = [c for c, w in gt["workloads"].items() if w["type"] == "k8s-container"]
    pod = gt["pod"]
    ours = [i for i in late["incidents"] or [] if i["workload"].get("container_id") == gt["workloads"][cgroup][
        "container_id"]]
    assert len(ours) == 1, f"the agent's incidents for the container: {ours}"
    workload = ours[0]["workload"]
    assert (workload.get("namespace"), workload.get("pod"), workload.get("container")) == (
        pod["namespace"], pod["name"], "learner"), workload
    assert workload["pod_uid"] == pod["uid"]
    [detection] = agent["detection"]
    print(f"\n{SCENARIO}: incident {ours[0]['kind']} kill of {ours[0]['victim']['comm']} in "
          f"{workload['namespace']}/{workload['pod']}/{workload['container']} (bundle written after the cgroup), "
          f"published {detection.get('latency_seconds')} s after the kill")
