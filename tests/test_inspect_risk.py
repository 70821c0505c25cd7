"""`inspect`'s "At risk" section (working set against the limit, with PSI) and the cause of a container's last
restart (its log files' restart count, its cgroup's creation, the kernel log's kills of it)."""

from __future__ import annotations

import shutil
from pathlib import Path

from oomwatch.inspect import at_risk, build_report, render_text, restart_cause, restart_count
from oomwatch.model import CgroupStats
from oomwatch.parse.pressure import parse_pressure
from tests.conftest import DETECTED_AT, REPO
from tests.test_inspect import node_config

TRAINER = ("cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod22222222_bbbb_4ccc_8ddd_"
           "000000000002.slice/crio-" + "b2" * 32 + ".scope")
UID = "22222222-bbbb-4ccc-8ddd-000000000002"
PSI = "some avg10=40.00 avg60=20.00 avg300=5.00 total=9000000\nfull avg10=12.50 avg60=6.00 avg300=1.00 total=4000000\n"
ROW = {"cgroup": "/c", "name": "ns/p c"}


def test_at_risk_measures_the_working_set_and_says_why() -> None:
    stats = CgroupStats(path="/c", limit_bytes=100 * 2**20, usage_bytes=99 * 2**20, working_set_bytes=95 * 2**20,
                        events={"max": 3}, pressure=parse_pressure(PSI))
    risk = at_risk(ROW, stats)
    assert risk["measure"] == "working set" and risk["headroom_bytes"] == 5 * 2**20
    assert risk["reason"] == ("working set 95 MiB of 100 MiB (95%), 5 MiB free; stalled on memory 40.0% (some) / "
                              "12.5% (full) of the last 10 s; limit hit 3 times")
    # Most of memory.current is inactive file cache: not at risk, unless it stalls.
    cache = CgroupStats(path="/c", limit_bytes=100.0, usage_bytes=99, working_set_bytes=10)
    assert at_risk(ROW, cache) is None
    stalled = CgroupStats(path="/c", limit_bytes=100.0, usage_bytes=99, working_set_bytes=10,
                          pressure=parse_pressure(PSI))
    assert at_risk(ROW, stalled)["pressure"]["full_avg10"] == 12.5
    # No limit, or nothing known: never at risk.
    assert at_risk(ROW, CgroupStats(path="/c", limit_bytes=float("inf"), usage_bytes=10**12)) is None
    assert at_risk(ROW, CgroupStats(path="/c", limit_bytes=100.0)) is None


def test_restart_cause_from_the_kernel_log() -> None:
    started = 1_800_000_000.0
    killed = restart_cause(2, started, [(started - 3600, "old"), (started - 42, "python")], log_readable=True)
    assert killed["oom_kill"] is True and "python killed" in killed["why"] and "42 s before" in killed["why"]
    # A kill long before the restart, or one in the current run (after it began), did not end the last run.
    other = restart_cause(1, started, [(started - 3600, "old"), (started + 5, "new")], log_readable=True)
    assert other["oom_kill"] is False and "not an OOM kill" in other["why"]
    blind = restart_cause(1, started, [], log_readable=False)
    assert blind["oom_kill"] is None and "kernel log is unreadable" in blind["why"]


def test_inspect_shows_at_risk_first_by_headroom_and_restarts(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    root = tmp_path / "node"
    shutil.copytree(REPO / "fixtures/inspect/layouts", root)
    trainer = root / TRAINER
    (trainer / "memory.stat").write_text("anon 1\ninactive_file 0\n")
    (trainer / "memory.pressure").write_text(PSI)
    logs = root / "var/log/pods" / f"ml_train-0_{UID}" / "trainer"
    logs.mkdir(parents=True, exist_ok=True)
    for name in ("0.log", "1.log.20261123-101010", "2.log"):
        (logs / name).write_text("")
    assert restart_count(str(root / "var/log/pods"), {"namespace": "ml", "pod": "train-0", "pod_uid": UID,
                                                      "container": "trainer"}) == 2
    report = build_report(node_config(root), clock=lambda: DETECTED_AT)
    names = [r["name"] for r in report["at_risk"]]
    assert names == ["ml/train-0", "ml/train-0 trainer"]  # same headroom: by cgroup path
    assert report["at_risk"][1]["measure"] == "working set"
    assert report["at_risk"][1]["pressure"]["full_avg10"] == 12.5
    [restart] = report["restarts"]
    assert restart["name"] == "ml/train-0 trainer" and restart["restarts"] == 2
    assert restart["oom_kill"] is None  # this node's kernel log is empty: it cannot say
    text = render_text(report, width=80)
    assert "At risk (2, least headroom first)" in text and "12.5% (full)" in text
    assert "Restarted containers" in text and "kubectl describe pod" in text
