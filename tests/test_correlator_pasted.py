"""Correlator cases from pasted logs (written with the issue-10 work): interleaved reports, and the kind of OOM
before 5.1, when the kill line has no prefix."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from oomwatch.config import Config
from oomwatch.inspect import build_report

SUMMARY = ("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg={cg},"
           "task_memcg={cg},task={comm},pid={pid},uid=0")
KILL = ("Memory cgroup out of memory: Killed process {pid} ({comm}) total-vm:1kB, anon-rss:1kB, file-rss:0kB, "
        "shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0")
INVOKED = "{comm} invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0"


def kills(tmp_path: Path, lines: list[str]) -> list[tuple]:
    log = tmp_path / "log"
    log.write_text("".join(f"[{10 + i / 1e6:12.6f}] {line}\n" for i, line in enumerate(lines)))
    report = build_report(Config(kmsg=str(log), boot_time=0.0), node_view=False, clock=lambda: 0.0,
                          tz=dt.timezone.utc)
    return sorted(((inc["oom_cgroup"], [(p["pid"], p["comm"], p["cgroup"]) for p in inc["killed"]])
                   for inc in report["incidents"]), key=repr)


def test_two_interleaved_reports_are_two_incidents_each_with_its_own_cgroup(tmp_path: Path) -> None:
    """A paste that merges two reports line by line (two nodes' logs, or a log system that reorders): each
    kill line belongs to the summary that names its pid. Today: 100 (a) is put in /b, and 200 (b) has no
    cgroup."""
    a, b = dict(comm="a", pid=100, cg="/a"), dict(comm="b", pid=200, cg="/b")
    lines = [INVOKED.format(**a), INVOKED.format(**b), SUMMARY.format(**a), SUMMARY.format(**b),
             KILL.format(**a), KILL.format(**b)]
    assert kills(tmp_path, lines) == [("/a", [(100, "a", "/a")]), ("/b", [(200, "b", "/b")])]


def test_before_5_1_the_kind_of_oom_comes_from_the_kill_process_line(tmp_path: Path) -> None:
    """Up to 5.0 the `Killed process` line has no prefix; `Out of memory: Kill process …` (global) or
    `Memory cgroup out of memory: Kill process …` just before it says which OOM it was. Today the correlator
    looks at the kill line only and calls every such global OOM a memcg one (e.g. fixtures/corpus/
    pandora-49-journal-one-letter-comm.log, redis-2174, ssdb-547). Fix: in Correlator._build, when
    `first.line.oom_kind == "unknown"` and `b.selected` is set, use `b.selected.oom_kind`."""
    for prefix, constraint in (("Out of memory", "global"), ("Out of memory (oom_kill_allocating_task)", "global"),
                               ("Memory cgroup out of memory", "memcg")):
        lines = [f"{prefix}: Kill process 2291 (stress) score 0 or sacrifice child",
                 "Killed process 2291 (stress) total-vm:1056852kB, anon-rss:955648kB, file-rss:0kB"]
        log = tmp_path / "log"
        log.write_text("".join(f"[ 350.00000{i}] {line}\n" for i, line in enumerate(lines)))
        report = build_report(Config(kmsg=str(log), boot_time=0.0), node_view=False, clock=lambda: 0.0)
        assert [i["constraint"] for i in report["incidents"]] == [constraint], prefix


# --- pastes from the wild that gave nothing (issue 20, item 6): fixtures/pasted/ -------------------------------

PASTED = sorted(p for p in (Path(__file__).resolve().parent.parent / "fixtures" / "pasted").iterdir()
                if p.suffix != ".md")
# Pastes the correlator cannot read yet (none now: an `oom_reaper:` line is taken as its victim's kill).
NEEDS_CORRELATOR: set[str] = set()


def header(path: Path, key: str) -> str:
    for line in path.read_text().splitlines():
        if line.startswith(f"# {key}:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"{path.name} has no '# {key}:' line")


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.xfail(
    strict=True, reason="the correlator must count an oom_reaper line as a kill")) if p.name in NEEDS_CORRELATOR
    else p for p in PASTED], ids=[p.name for p in PASTED])
def test_each_paste_gives_its_kill_with_its_cgroups(path: Path) -> None:
    report = build_report(Config(kmsg=str(path), boot_time=0.0), node_view=False, clock=lambda: 0.0,
                          tz=dt.timezone.utc)
    kills = [f"{p['comm']}({p['pid']})" for inc in reversed(report["incidents"]) for p in inc["killed"]]
    assert kills == [k.strip() for k in header(path, "kills").split(",")]
    incident = report["incidents"][0]
    assert incident["oom_cgroup"] == header(path, "oom_cgroup")
    assert incident["victim"]["cgroup"] == header(path, "task_cgroup")
    assert report["warnings"] == [] and report["kmsg"]["parse_errors"] == 0
    assert report["kmsg"]["text"]["other_program_lines"] == (1 if "verbose" in path.name else 0)


# --- issue 31 item 8: a comm can hide the top holder ------------------------------------------------------

def test_a_process_named_with_digits_and_a_space_is_still_the_top_holder(tmp_path: Path) -> None:
    """A task named `1 hog` (a process may name itself anything) holds the memory; another is killed. Its row
    is read by the header's count of columns, so the verdict names it (before: the row was dropped and the
    verdict blamed the next process)."""
    lines = [INVOKED.format(comm="python3"), "memory: usage 65536kB, limit 65536kB, failcnt 739",
             "Memory cgroup stats for /a:", "anon 66777088", "file 0", "shmem 0",
             "Tasks state (memory values in pages):",
             "[  pid  ]   uid  tgid total_vm      rss pgtables_bytes swapents oom_score_adj name",
             "[    118]     0   118    54933    15454   200704        0             0 1 hog",
             "[    119]     0   119     9933     1000    49152        0             0 python3",
             SUMMARY.format(cg="/a", comm="python3", pid=119),
             "Memory cgroup out of memory: Killed process 119 (python3) total-vm:39732kB, anon-rss:4000kB, "
             "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:48kB oom_score_adj:0"]
    log = tmp_path / "log"
    log.write_text("".join(f"[{10 + i / 1e6:12.6f}] {line}\n" for i, line in enumerate(lines)))
    report = build_report(Config(kmsg=str(log), boot_time=0.0), node_view=False, clock=lambda: 0.0,
                          tz=dt.timezone.utc)
    (incident,) = report["incidents"]
    assert [(h["pid"], h["comm"]) for h in incident["top_holders"]][:2] == [(118, "1 hog"), (119, "python3")]
    assert "1 hog" in incident["explanation"]
