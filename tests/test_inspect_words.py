"""What `inspect` says about each kill must be what the log says (issue 20, items 4 and 8): no date made up
for a log from an unknown boot, a header scope that agrees with its sentence, the filter's own words, and
warnings that never call an unreadable OOM line "no OOM line"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from oomwatch.cli import main
from oomwatch.config import Config
from oomwatch.inspect import build_report, reader_warnings, render_text
from tests.conftest import BOOT_TIME, CAPTURES

SYSRQ = CAPTURES / "documented-5.10-sysrq-manual.dmesg"
GROUP_419 = CAPTURES / "documented-4.19-memcg-group.dmesg"


def inspect_cli(*args: str, input: bytes | None = None):
    return CliRunner().invoke(main, ["inspect", *args], input=input)


def test_a_log_without_dates_from_an_unknown_boot_shows_times_since_boot_not_dates(tmp_path: Path) -> None:
    """A 2019 log with a year's uptime was dated in 2027 (this host's boot time plus its offsets)."""
    log = tmp_path / "old.dmesg"
    log.write_text(GROUP_419.read_text().replace("[  900.", "[31536900."))
    result = inspect_cli("--kmsg", str(log), "--json")
    incident = json.loads(result.stdout)["incidents"][0]
    assert incident["time"] is None and incident["since_boot_seconds"] == pytest.approx(31536900.00007)
    text = " ".join(inspect_cli("--kmsg", str(log)).stdout.split())
    assert "31536900.000070 s after boot GROUP kill" in text
    assert "each kill is shown by its time since its boot; pass --boot-time" in text
    # With the boot's start given, or a log that carries dates, they are dates.
    dated = json.loads(inspect_cli("--kmsg", str(log), "--json", "--boot-time", "2019-01-01T00:00:00Z").stdout)
    assert dated["incidents"][0]["time"].startswith("2020-01-01T00:15")


def test_the_live_log_says_its_times_come_from_this_boot_not_from_a_given_one() -> None:
    """`times_from` said "boot time given" for the live /dev/kmsg when none was given."""
    from oomwatch.inspect import read_incidents
    from oomwatch.sources.kmsg import LIVE_KMSG, kernel_log_kind
    from oomwatch.workloads import WorkloadResolver

    if kernel_log_kind("/dev/kmsg") != LIVE_KMSG:
        pytest.skip("no /dev/kmsg device here")
    try:
        _, health = read_incidents(Config(kmsg="/dev/kmsg"), WorkloadResolver(), "unknown")
    except Exception as exc:  # not readable here (no privilege): nothing to check
        pytest.skip(f"/dev/kmsg not readable: {exc}")
    assert health["live"] and health["times_from"] in ("log", "this host's boot time")


def test_the_header_scope_agrees_with_a_sentence_that_says_the_log_does_not_say(tmp_path: Path) -> None:
    """Kill lines alone: the header said `scope cgroup` while the sentence said the log does not say which
    limit was hit."""
    log = tmp_path / "kills.dmesg"
    log.write_text("[  10.000001] Killed process 5125 (python3) total-vm:219732kB, anon-rss:64864kB, "
                   "file-rss:904kB, shmem-rss:0kB\n")
    report = build_report(Config(kmsg=str(log), boot_time=BOOT_TIME), node_view=False, clock=lambda: 0.0)
    text = " ".join(render_text(report).split())
    assert "single kill, scope unknown, 1 killed" in text and "the log does not say" in text


def test_counts_agree_with_their_nouns() -> None:
    report = {"incidents": [], "kmsg": {}, "filter": {"filters": ["--since 2h"], "in_log": 2, "matching": 1}}
    assert "2 kills in the log, 1 matches --since 2h" in render_text(report)
    report["filter"].update(in_log=1, matching=0)
    assert "1 kill in the log, 0 match --since 2h" in render_text(report)


def test_unreadable_oom_lines_are_never_called_no_oom_line() -> None:
    """A log whose OOM lines cannot be read said both "2 lines could not be read" and "none is an OOM line"."""
    kmsg = {"source": "-", "records": 2, "parse_errors": 1, "oom_lines_unread": 1, "oom_reports": 0,
            "first_parse_error": "Out of memory: Killed process xyz",
            "text": {"formats": {"bare": 2}, "kernel_records": 2, "lines": 2}}
    warnings = reader_warnings(kmsg)
    assert any("1 of them looks like OOM killer lines" in w for w in warnings)
    assert not any("none is an OOM line" in w for w in warnings)
    kmsg.pop("oom_lines_unread")
    kmsg["parse_errors"] = 0
    assert any("none is an OOM line" in w for w in reader_warnings(kmsg))


def test_the_sysrq_fixture_is_explained_as_a_manual_kill() -> None:
    report = build_report(Config(kmsg=str(SYSRQ), boot_time=BOOT_TIME), node_view=False, clock=lambda: 0.0)
    assert report["incidents"][0]["explanation"].startswith("A manual OOM kill (sysrq f")


def test_a_report_cut_before_its_kill_line_is_a_warning_not_silence() -> None:
    """Its `invoked oom-killer` and `oom-kill:` lines were read, and inspect said only "0 OOM reports found"."""
    cut = "".join(line + "\n" for line in GROUP_419.read_text().splitlines() if "Killed process" not in line)
    result = inspect_cli("--kmsg", "-", input=cut.encode())
    assert result.exit_code == 0 and "0 OOM reports found" in " ".join(result.stdout.split())
    assert "1 line of an OOM report (`invoked oom-killer`, `oom-kill:`) is in the log, but no kill line follows" \
        in result.stderr


def test_since_on_a_log_without_dates_says_what_it_compared(tmp_path: Path) -> None:
    out = " ".join(inspect_cli("--kmsg", str(GROUP_419), "--since", "1d").stdout.split())
    assert "--since was compared with times counted from this host's boot" in out
    dated = " ".join(inspect_cli("--kmsg", str(GROUP_419), "--since", "1d", "--boot-time",
                                 "2026-01-01T00:00:00Z").stdout.split())
    assert "--since was compared" not in dated
