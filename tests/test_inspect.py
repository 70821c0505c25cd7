"""`oomwatch inspect`: golden text and JSON on fixture nodes, filters, 80 columns, and what it says when it
cannot see something."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from oomwatch.cli import jsonable, main
from oomwatch.config import Config
from oomwatch.inspect import build_report, parse_since, render_text
from tests.conftest import BOOT_TIME, CAPTURES, DETECTED_AT, FIXTURES, REPO
from tests.test_golden import compare

# Relative to the repository (the tests run from there), so golden output holds no checkout path.
NODES = {
    "k8s-runc": Path("fixtures/golden/k8s-runc"),
    "layouts": Path("fixtures/inspect/layouts"),
}


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch) -> None:
    monkeypatch.chdir(REPO)


def node_config(root: Path, **overrides) -> Config:
    values = dict(kmsg=str(root / "kmsg"), cgroup_root=str(root / "cgroup"), proc=str(root / "proc"),
                  kubelet_config=str(root / "kubelet" / "config.yaml"), run_root=str(root / "run"),
                  pod_log_dir=str(root / "var" / "log" / "pods"), boot_time=BOOT_TIME)
    values.update(overrides)
    return Config(**values)


def report_of(root: Path, **kwargs) -> dict:
    return build_report(node_config(root), clock=lambda: DETECTED_AT, **kwargs)


@pytest.mark.parametrize("name", sorted(NODES))
def test_golden_inspect_text_and_json(name: str) -> None:
    root = NODES[name]
    report = report_of(root)
    text = render_text(report, color=False, width=80)
    compare(root / "expected-inspect.txt", text)
    compare(root / "expected-inspect.json", json.dumps(jsonable(report), indent=2) + "\n")
    assert all(len(line) <= 80 for line in text.splitlines()), "fits an 80-column terminal"
    assert "\033[" not in text


def test_every_runtime_driver_and_qos_layout_is_named() -> None:
    rows = {r["cgroup"]: r for r in report_of(NODES["layouts"])["workloads"]}
    names = {r["name"] for r in rows.values()}
    assert {"prod/api-7f9c api", "prod/api-7f9c", "ml/train-0 trainer", "ml/train-0", "batch/report-28731 report",
            "batch/report-28731", "Slurm job 4242 step 0", "nginx.service"} <= names
    by_name = {r["name"]: r for r in rows.values()}
    assert by_name["ml/train-0 trainer"]["workload"]["type"] == "k8s-container"
    assert by_name["ml/train-0"]["workload"]["type"] == "k8s-pod"
    # conmon is not a workload of its own; the crun `container` child belongs to its container
    assert not any("conmon" in c for c in rows) and not any(c.endswith("/container") for c in rows)
    # Slurm's OOMKillStep flag sits on the step's user cgroup: the step shows as group-killed
    assert by_name["Slurm job 4242 step 0"]["oom_group"] == 1
    # sorted by risk: the containers that OOM-killed come first
    assert [r["name"] for r in report_of(NODES["layouts"])["workloads"][:2]] == ["ml/train-0 trainer",
                                                                                 "Slurm job 4242 step 0"]


def test_posture_mismatch_between_kubelet_and_cgroups_is_reported() -> None:
    node = report_of(NODES["layouts"])["node"]
    assert node["single_process_oom_kill"] == "true"
    assert (node["container_cgroups"], node["container_cgroups_oom_group"]) == (3, 2)
    assert "singleProcessOOMKill=true, yet 2 of 3" in node["mismatch"]


def test_filters_by_pod_container_cgroup_and_time() -> None:
    root = NODES["k8s-runc"]
    by_pod = report_of(root, target="ml/train-0")
    assert {r["name"] for r in by_pod["workloads"]} == {"ml/train-0", "ml/train-0 trainer"}
    assert len(by_pod["incidents"]) == 1
    assert report_of(root, target="shop/web-5d8f")["incidents"] == []
    assert [r["name"] for r in report_of(root, container="web")["workloads"]] == ["shop/web-5d8f web"]
    by_cgroup = report_of(root, target="/kubepods/besteffort")
    assert {r["name"] for r in by_cgroup["workloads"]} == {"shop/web-5d8f", "shop/web-5d8f web"}
    assert len(report_of(root, since=BOOT_TIME)["incidents"]) == 1
    assert report_of(root, since=BOOT_TIME + 3600)["incidents"] == []


def test_since_parsing() -> None:
    assert parse_since("30m", 10_000.0) == 8_200.0
    assert parse_since("2026-11-22T20:40:00Z", 0) == BOOT_TIME
    with pytest.raises(ValueError, match="duration"):
        parse_since("yesterday", 0)


def test_cgroup_v1_host_is_explained_plainly(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mounts").write_text(
        "tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n")
    root = tmp_path / "cgroup"
    root.mkdir()
    report = build_report(Config(kmsg=str(CAPTURES / "linux-6.1-memcg-scenarios.kmsg"), cgroup_root=str(root),
                                 proc=str(proc), kubelet_config=str(tmp_path / "none")), node_view=True)
    assert report["node"]["cgroup_version"] == "hybrid"
    (note,) = [n for n in report["notes"] if "cgroup v1" in n]
    assert f"the v1 memory tree ({root}/memory) is not read" in note
    assert "each is a single-process kill (memory.oom.group is a cgroup v2 feature)" in note
    assert len(report["incidents"]) == 4, "what it can see is still shown"


def test_unreadable_kernel_log_is_one_clear_note_and_the_rest_still_shows(tmp_path: Path) -> None:
    root = NODES["k8s-runc"]
    report = build_report(node_config(root, kmsg=str(tmp_path / "missing-kmsg")), node_view=True)
    assert any("cannot read the kernel log" in n for n in report["notes"])
    assert report["workloads"] and report["incidents"] == []
    assert "unknown (kernel log unreadable)" in render_text(report)


def test_cli_saved_log_offline_and_json() -> None:
    runner = CliRunner()
    storm = str(CAPTURES / "linux-6.1-storm-ratelimited.kmsg")
    result = runner.invoke(main, ["inspect", "--kmsg", storm, "--json", "--limit", "0"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["node"] is None, "a saved log from elsewhere: this host's cgroups are not shown"
    assert len(data["incidents"]) == 150 and data["kmsg"]["suppressed_reports"] == 42
    text = runner.invoke(main, ["inspect", "--kmsg", str(CAPTURES / "linux-6.1-global-oom-group.kmsg")]).output
    assert "The node ran out of memory (no cgroup limit was hit)" in text


def test_cli_reads_standard_input() -> None:
    dmesg = (CAPTURES / "documented-4.19-memcg-group.dmesg").read_bytes()
    result = CliRunner().invoke(main, ["inspect", "--kmsg", "-", "--json"], input=dmesg)
    assert result.exit_code == 0, result.output
    assert [i["kind"] for i in json.loads(result.output)["incidents"]] == ["group"]


def test_cli_errors_are_clear(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(main, ["inspect", "--kmsg", str(tmp_path / "nope.log")])
    assert missing.exit_code == 1 and "cannot read the kernel log" in missing.output
    bad_since = runner.invoke(main, ["inspect", "--since", "soon"])
    assert bad_since.exit_code == 2 and "--since" in bad_since.output


def test_colour_only_when_asked_or_on_a_terminal() -> None:
    args = ["inspect", "--kmsg", str(CAPTURES / "linux-6.1-runc-group-pidns.kmsg")]
    assert "\033[31mGROUP" in CliRunner().invoke(main, args + ["--color"]).output
    assert "\033[" not in CliRunner().invoke(main, args).output  # CliRunner's stdout is not a TTY


@pytest.mark.parametrize("command", [[], ["agent"], ["inspect"]])
def test_help_says_what_it_does_with_an_example(command) -> None:
    result = CliRunner().invoke(main, command + ["--help"])
    assert result.exit_code == 0
    assert "Example" in result.output and "oomwatch" in result.output


def test_version() -> None:
    from oomwatch import __version__

    assert CliRunner().invoke(main, ["--version"]).output.strip() == f"oomwatch, version {__version__}"


def test_not_root_is_said_in_one_line(monkeypatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    notes = report_of(NODES["k8s-runc"])["notes"]
    assert sum("not running as root" in n for n in notes) == 1


def test_exiting_and_died_with_are_shown() -> None:
    report = {"node": None, "workloads": [], "notes": [], "kmsg": {}, "incidents": [{
        "time": "2026-11-22T20:40:09.320870Z", "kind": "group", "scope": "container", "explanation": "x.",
        "killed": [{"pid": 127, "comm": "dd"}, {"pid": 119, "comm": "sh"}],
        "exiting": [{"pid": 124, "comm": "sleep"}], "died_with": [{"pid": 125, "cgroup": "/c", "signal": 9}]}]}
    text = render_text(report)
    assert "killed: dd(127), sh(119)" in text
    assert "already exiting, died with it: sleep(124)" in text
    assert "also died by SIGKILL, unlogged (proc connector): pids 125" in text


# --- saying what was and was not understood (issue 10) -----------------------------------------------------

GROUP_419 = CAPTURES / "documented-4.19-memcg-group.dmesg"


def inspect_cli(*args: str, input: bytes | None = None):
    return CliRunner().invoke(main, ["inspect", *args], input=input)


def test_every_run_says_what_it_read_understood_and_found() -> None:
    result = inspect_cli("--kmsg", str(GROUP_419))
    assert result.exit_code == 0 and result.stderr == ""
    assert ("kernel log: " + str(GROUP_419) + ": 12 lines read, 11 kernel records understood (dmesg 11); 1 "
            "comment line skipped; 1 OOM report found.") in " ".join(result.stdout.split())


@pytest.mark.parametrize("data,said", [
    (b"", "standard input is empty"),
    (b"\n\n", "standard input is empty"),
    (b"No journal files were found.\n", "only journalctl's \"No journal files were found.\""),
    (b"-- No entries --\n", "only journalctl's \"-- No entries --\""),
])
def test_empty_input_is_an_error(data, said) -> None:
    result = inspect_cli("--kmsg", "-", input=data)
    assert result.exit_code == 1
    assert said in result.stderr and "cannot read the kernel log" in result.stderr


def test_unreadable_input_is_an_error(tmp_path: Path) -> None:
    result = inspect_cli("--kmsg", str(tmp_path))  # a directory
    assert result.exit_code == 1 and "cannot read the kernel log" in result.stderr


def test_lines_not_understood_are_a_warning_with_the_first_of_them() -> None:
    data = (GROUP_419.read_bytes() + b"[  901.0] Out of memory: Killed process xyz (a) total-vm:1kB\n"
            b'{"_TRANSPORT":"kernel","MESSAGE":1}\n')  # (a date that cannot be read is no longer unreadable)
    result = inspect_cli("--kmsg", "-", input=data)
    assert result.exit_code == 0
    assert ("oomwatch: warning: 2 lines could not be read (1 of them looks like OOM killer lines); first: "
            "'Out of memory: Killed process xyz (a) "
            "total-vm:1kB'") in result.stderr
    assert "1 OOM report found" in " ".join(result.stdout.split())


def test_text_that_is_no_kernel_log_is_a_warning() -> None:
    result = inspect_cli("--kmsg", "-", input=b"hello\nworld\n")
    assert result.exit_code == 0
    assert "no line has a kernel log prefix" in result.stderr


def test_filters_that_hide_kills_say_so() -> None:
    for args, said in ((["--container", "nope"], "1 kill in the log, 0 match --container nope"),
                       (["shop/web"], "1 kill in the log, 0 match shop/web"),
                       (["--since", "2000-01-01T00:00:00Z"], None)):
        out = " ".join(inspect_cli("--kmsg", str(GROUP_419), *args).stdout.split())
        if said is None:
            assert "match" not in out and "none in the kernel log" not in out
        else:
            assert said in out and "none in the kernel log" not in out
    out = " ".join(inspect_cli("--kmsg", str(GROUP_419), "--since", "1h", "--boot-time", "2000-01-01T00:00:00Z"
                               ).stdout.split())
    assert "1 kill in the log, 0 match --since 1h" in out  # the value was dropped: "0 match --since"


@pytest.mark.parametrize("option", ["--cgroup-root", "--proc"])
def test_bad_paths_are_errors(option) -> None:
    result = inspect_cli(option, "/nonexistent")
    assert result.exit_code == 2 and "/nonexistent is not a directory" in result.stderr


def test_bad_time_zone_is_an_error() -> None:
    result = inspect_cli("--kmsg", str(GROUP_419), "--tz", "Mars/Olympus")
    assert result.exit_code == 2 and "unknown time zone" in result.stderr


def test_a_guessed_year_and_the_time_zone_are_used_and_said() -> None:
    journal = (b"Jan  2 03:04:05 node kernel: Tasks in /b are going to be killed due to memory.oom.group set\n"
               b"Jan  2 03:04:05 node kernel: Memory cgroup out of memory: Killed process 5 (x) total-vm:1kB, "
               b"anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0\n")
    result = inspect_cli("--kmsg", "-", "--json", "--tz", "Asia/Tokyo", input=journal)
    data = json.loads(result.stdout)
    (note,) = [n for n in data["notes"] if "carry no year" in n]
    (year,) = data["kmsg"]["text"]["guessed_years"]
    assert f"{year} was assumed" in note
    assert data["incidents"][0]["time"] == f"{year}-01-01T18:04:05.000000Z", "03:04:05 in Tokyo"


def test_limit_shows_the_newest_and_sums_up_the_rest_by_workload() -> None:
    storm = str(CAPTURES / "linux-6.1-storm-ratelimited.kmsg")
    result = inspect_cli("--kmsg", storm, "--limit", "3")
    out = " ".join(result.stdout.split())
    assert "Recent OOM kills (3 of 150, newest first)" in out
    assert out.count("GROUP kill") == 3
    assert "147 older kills not shown (--limit); by workload: /storm/c" in out
    data = json.loads(inspect_cli("--kmsg", storm, "--limit", "3", "--json").stdout)
    assert data["not_shown"]["count"] == 147 and sum(data["not_shown"]["by_workload"].values()) == 147
    # 20 of 150 kills, at most 10 lines each (each says what held the memory: here the kill lines)
    assert len(inspect_cli("--kmsg", storm).stdout.splitlines()) < 220, "the default limit keeps it short"


def test_a_50_mb_name_does_not_hang_the_renderer() -> None:
    report = {"node": None, "workloads": [], "notes": ["x" * 50_000_000], "kmsg": {}, "incidents": []}
    assert len(render_text(report)) < 10_000


def test_inspect_on_a_live_node_shows_kills_the_ring_no_longer_describes() -> None:
    """This machine's real /dev/kmsg (which holds no OOM of the fixture's cgroups) and the golden tree, whose
    container counted one group kill: inspect shows it, counted from memory.events, without pids."""
    import os

    if not os.access("/dev/kmsg", os.R_OK):
        pytest.fail("this test reads the machine's /dev/kmsg: run the unit tier as root, as scripts/test does")
    golden = FIXTURES / "golden" / "k8s-runc"
    result = CliRunner().invoke(main, ["inspect", "--cgroup-root", str(golden / "cgroup"), "--proc",
                                       str(golden / "proc"), "--run-root", str(golden / "run"), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output[result.output.index("{"):])
    counted = [i for i in data["incidents"] if i["evidence"] == "memory.events"]
    assert [(i["kind"], i["workload"].get("container"), i["victim"], i["killed"]) for i in counted] == \
        [("group", "trainer", None, [])]
    text = CliRunner().invoke(main, ["inspect", "--cgroup-root", str(golden / "cgroup"), "--proc",
                                     str(golden / "proc"), "--run-root", str(golden / "run")]).output
    assert "counted from memory.events" in text and "no longer in" in text
