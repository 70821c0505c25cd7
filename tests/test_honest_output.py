"""Issue 33 item 4: what inspect shows comes from one model and claims nothing the log does not hold: text and JSON
from the same incident, unknown as null or "unknown" (never 0 or a default), advice that fits the workload and the
constraint, sizes as small as they are, and a closed stream a clear error."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import pytest

from oomwatch.config import Config
from oomwatch.explain import size
from oomwatch.holders import advice_for, verdict
from oomwatch.inspect import build_report, render_text

UTC = dt.timezone.utc
KILL = ("Memory cgroup out of memory: Killed process 4242 (hog) total-vm:123456kB, anon-rss:100000kB, "
        "file-rss:2000kB, shmem-rss:0kB, UID:0 pgtables:300kB oom_score_adj:0")


def report_of(tmp_path: Path, text: str) -> dict:
    log = tmp_path / "pasted.log"
    log.write_text(text)
    return build_report(Config(kmsg=str(log), boot_time=1_700_000_000.0), node_view=False, clock=lambda: 0.0,
                        tz=UTC)


def test_a_kill_known_only_from_its_reaper_line_says_so_with_an_unknown_scope(tmp_path: Path) -> None:
    report = report_of(tmp_path, "[  100.000001] oom_reaper: reaped process 4242 (hog), now anon-rss:0kB, "
                                 "file-rss:0kB, shmem-rss:0kB\n")
    (incident,) = report["incidents"]
    assert incident["evidence"] == "oom_reaper" and incident["scope"] == "unknown"
    assert incident["victim"]["pid"] == 4242 and incident["memory_breakdown"] is None  # no sizes survived
    text = render_text(report)
    assert "scope unknown, 1 killed (known only from the oom_reaper line)" in text


def test_text_and_json_say_the_same_scope(tmp_path: Path) -> None:
    report = report_of(tmp_path, f"[  100.000001] {KILL}\n")  # a kill line alone: which cgroup ran out is unknown
    (incident,) = report["incidents"]
    assert incident["scope"] == "unknown" and incident["oom_cgroup"] is None
    assert f"scope {incident['scope']}, 1 killed" in render_text(report)


def test_a_line_without_a_time_gives_a_kill_without_one(tmp_path: Path) -> None:
    report = report_of(tmp_path, KILL + "\n")
    (incident,) = report["incidents"]
    assert incident["time"] is None and incident.get("since_boot_seconds") is None
    assert "time not in the log" in render_text(report)
    assert "0.000000 s after boot" not in render_text(report)


@pytest.mark.parametrize("n,shown", [(24, "24 B"), (1023, "1023 B"), (1024, "1 KiB"), (512 << 10, "512 KiB"),
                                     (1 << 20, "1 MiB"), (3 << 29, "1.5 GiB")])
def test_sizes_below_a_mib_are_not_0_mib(n: int, shown: str) -> None:
    assert size(n) == shown


@pytest.mark.parametrize("constraint,oom_cgroup,workload,key", [
    ("global", "/", "k8s-container", "node"), ("cpuset", None, "systemd", "node"), ("memcg", "/", "other", "node"),
    ("memcg", "/kubepods/pod1/c", "k8s-container", "k8s"), ("memcg", "/kubepods/pod1", "k8s-pod", "k8s"),
    ("memcg", "/system.slice/job_1", "slurm", "slurm"), ("memcg", "/system.slice/a.service", "systemd", "systemd"),
    ("memcg", "/a", "other", "other"), ("memcg", "/a", None, "other")])
def test_advice_is_chosen_by_the_constraint_and_the_workload(constraint, oom_cgroup, workload, key) -> None:
    assert advice_for(constraint, oom_cgroup, workload) == key


def test_a_global_oom_is_never_told_to_raise_the_limit_nor_a_unit_to_set_an_emptydir() -> None:
    holders = [{"pid": 1, "comm": "java", "rss_bytes": 900 << 20, "killed": True}]
    _, node = verdict({"anon_bytes": 900 << 20}, holders, advice="node")
    assert "raise the limit" not in node and "give the node more memory" in node
    shm = {"shmem_bytes": 900 << 20}
    _, unit = verdict(shm, [], limit_bytes=1 << 30, advice="systemd")
    _, pod = verdict(shm, [], limit_bytes=1 << 30, advice="k8s")
    assert "emptyDir" not in unit and "size=" in unit
    assert "emptyDir's sizeLimit" in pod
    _, step = verdict({"anon_bytes": 900 << 20}, holders, limit_bytes=1 << 30, advice="slurm")
    assert step.endswith("request more memory (--mem, --mem-per-cpu)")


def test_a_global_oom_in_a_pasted_log_is_advised_about_the_node() -> None:
    path = Path(__file__).parent.parent / "fixtures" / "kmsg" / "linux-6.1-global-oom-group.kmsg"
    report = build_report(Config(kmsg=str(path), boot_time=0.0), node_view=False, clock=lambda: 0.0, tz=UTC)
    (incident,) = report["incidents"]
    assert incident["constraint"] == "global" and incident["scope"] == "node"
    assert "raise the limit" not in incident["explanation"]


@pytest.mark.parametrize("redirect,said", [
    (["--kmsg", "-"], "standard input is closed"),
    (["--kmsg", str(Path(__file__).parent.parent / "fixtures" / "kmsg" / "linux-6.1-memcg-scenarios.kmsg")],
     "standard output is closed")])
def test_a_closed_standard_stream_is_a_clear_error(redirect: list[str], said: str) -> None:
    closing = {"stdin": subprocess.DEVNULL} if "input" in said else {}
    code = ("import os, sys\n"
            + ("os.close(0); sys.stdin = None\n" if "input" in said else "os.close(1); sys.stdout = None\n")
            + "from oomwatch.cli import main\n"
            + f"main(['inspect', *{redirect!r}])\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, **closing)
    assert result.returncode == 2
    assert said in result.stderr and "Traceback" not in result.stderr


def test_a_date_that_cannot_be_read_keeps_its_kill_and_is_said(tmp_path: Path) -> None:
    """Issue 33 item 3: a date the front end cannot read leaves the record in, with an unknown time, and a note."""
    report = report_of(tmp_path, f"[Mon Feb 30 10:00:00 2023] {KILL}\n")
    (incident,) = report["incidents"]
    assert incident["victim"]["pid"] == 4242 and incident["time"] is None
    assert report["kmsg"]["text"]["unknown_dates"] == 1
    assert any(note.startswith("1 line of this log carried a date oomwatch cannot read (the first: '[Mon Feb 30")
               and note.endswith("kept, with no time.") for note in report["notes"])
