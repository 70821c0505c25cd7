"""Real OOM reports from public bug trackers, forums and blogs (fixtures/corpus/): oomwatch reads exactly the
kills a person reads in each, and exactly the truth the kernel's own lines give (kind, constraint, cgroups, the
task table's top holder, each victim's anon-rss: the header lines documented in fixtures/corpus/README.md), and
the same kernel lines give the same incidents in every wrapper a log system puts around them."""

from __future__ import annotations

import datetime as dt
import io
import json
import re
from pathlib import Path

import pytest

from oomwatch.config import Config
from oomwatch.inspect import build_report
from oomwatch.parse.kmsg import parse_text_log
from tests.conftest import BOOT_TIME, CAPTURES, FIXTURES

CORPUS = sorted((FIXTURES / "corpus").glob("*.log"))
UTC = dt.timezone.utc


def header(path: Path, key: str) -> str:
    for line in path.read_text().splitlines():
        if line.startswith(f"# {key}:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"{path.name} has no '# {key}:' line")


def report_for(path: Path) -> dict:
    return build_report(Config(kmsg=str(path), boot_time=BOOT_TIME), node_view=False, clock=lambda: 0.0,
                        tz=UTC)


def kills_in_log_order(report: dict) -> list[str]:
    return [f"{p['comm']}({p['pid']})" for inc in reversed(report["incidents"]) for p in inc["killed"]]


def test_the_corpus_is_there() -> None:
    assert len(CORPUS) >= 60


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_each_report_gives_exactly_the_kills_a_person_reads(path: Path) -> None:
    assert header(path, "source").startswith("https://")
    kills = header(path, "kills")
    expected = [] if kills == "none" else re.findall(r"(\S.*?\(\d+\))(?:, |$)", kills)
    report = report_for(path)
    assert kills_in_log_order(report) == expected
    assert report["kmsg"]["parse_errors"] == 0
    if not expected and report["kmsg"].get("reports_without_kill"):
        # A paste of a report's start without its kill lines: said, as a person reading it would say it.
        assert len(report["warnings"]) == 1 and report["warnings"][0].endswith("but no kill line follows: was the log cut?")
    else:
        assert report["warnings"] == []
    assert report["kmsg"]["text"]["kernel_records"] > 0


# --- the truth the kernel's lines give ------------------------------------------------------------------

TRUTH_KEYS = ("kind", "constraint", "cgroups", "top-holder", "anon-rss")


def _per_incident(value: str) -> list[str]:
    return [v.strip() for v in value.split(";")]


def _cgroups(value: str) -> dict[str, str]:
    """`oom=/a task=/a/b group=/a` -> {"oom": "/a", ...}; `-`: the kernel's lines name none."""
    return {} if value == "-" else dict(item.split("=", 1) for item in value.split())


def truth(path: Path) -> tuple[list[dict], list[int]]:
    """(per incident in log order: kind, constraint, oom/victim/group cgroup, task-table top holder; each kill's
    anon-rss in bytes, in the order of `# kills:`) from the fixture's header lines."""
    if header(path, "kind") == "none":
        assert all(header(path, k) == "-" for k in TRUTH_KEYS[1:]), f"{path.name}: no incident, so no truth"
        return [], []
    columns = [_per_incident(header(path, k)) for k in TRUTH_KEYS[:4]]
    assert len({len(c) for c in columns}) == 1, f"{path.name}: one value per incident in every truth line"
    incidents = []
    for kind, constraint, cgroups, top in zip(*columns):
        names = _cgroups(cgroups)
        assert set(names) <= {"oom", "task", "group"}, f"{path.name}: {cgroups}"
        incidents.append({"kind": kind, "constraint": constraint, "oom_cgroup": names.get("oom"),
                          "victim_cgroup": names.get("task"), "group_cgroup": names.get("group"),
                          "top_holder": top})
    anon = [int(re.fullmatch(r"(\d+)kB", a.strip()).group(1)) * 1024 for a in header(path, "anon-rss").split(",")]
    return incidents, anon


def observed(report: dict) -> tuple[list[dict], list[int]]:
    incidents, anon = [], []
    for inc in reversed(report["incidents"]):
        table = [h for h in inc.get("top_holders") or [] if h.get("from") == "task_table"]
        incidents.append({"kind": inc["kind"], "constraint": inc["constraint"], "oom_cgroup": inc["oom_cgroup"],
                          "victim_cgroup": (inc.get("victim") or {}).get("cgroup"),
                          "group_cgroup": inc["group_cgroup"],
                          "top_holder": (f"{table[0]['comm']}({table[0]['pid']}) rss={table[0]['rss_pages']}"
                                         if table else "-")})
        anon += [p["anon_rss_bytes"] for p in inc["killed"]]
    return incidents, anon


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_each_fixture_states_its_truth_once_per_incident_and_kill(path: Path) -> None:
    kills = header(path, "kills")
    incidents, anon = truth(path)
    assert len(anon) == (0 if kills == "none" else len(re.findall(r"\(\d+\)(?:, |$)", kills)))
    assert len(incidents) <= len(anon)


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_each_report_gives_exactly_the_truth_of_its_kernel_lines(path: Path) -> None:
    """Kind, constraint, the OOM, victim and group cgroups, the task table's largest row (`-`: no row printed, so
    no holder may claim the task table) and every victim's anon-rss, incident by incident in log order."""
    want_incidents, want_anon = truth(path)
    got_incidents, got_anon = observed(report_for(path))
    assert got_incidents == want_incidents
    assert got_anon == want_anon


# --- the same report in every wrapper --------------------------------------------------------------------

def kmsg_escape(text: str) -> str:
    out = []
    for ch in text:
        code = ord(ch)
        out.append(f"\\x{code:02x}" if code < 0x20 or code == 0x7f or ch == "\\" else ch)
    return out and "".join(out) or ""


WALL = dt.datetime(2023, 8, 22, 16, 10, 45, tzinfo=UTC)


def wrap(fmt: str, i: int, text: str) -> str:
    secs = 100 + i / 1000
    when = WALL + dt.timedelta(seconds=i)
    return {
        "kmsg": f"6,{i},{int(secs * 1e6)},-;{kmsg_escape(text)}",
        "dmesg": f"[{secs:12.6f}] {text}",
        "dmesg -r": f"<6>[{secs:12.6f}] {text}",
        "dmesg -x": f"kern  :info  : [{secs:12.6f}] {text}",
        "dmesg -T": f"[{when:%a %b %d %H:%M:%S %Y}] {text}",
        "dmesg caller id": f"[{secs:12.6f}] [ T{i + 1}] {text}",
        "journal short": f"{when:%b %d %H:%M:%S} node-1 kernel: {text}",
        "journal short, empty hostname": f"{when:%b %d %H:%M:%S}  kernel: {text}",
        "journal short-precise": f"{when:%b %d %H:%M:%S}.{i:06d} node-1 kernel: {text}",
        "journal short-iso": f"{when:%Y-%m-%dT%H:%M:%S}+0000 node-1 kernel: {text}",
        "journal short-monotonic": f"[{secs:12.6f}] node-1 kernel: {text}",
        "journal json": json.dumps({"_TRANSPORT": "kernel", "MESSAGE": text, "PRIORITY": "6",
                                    "__REALTIME_TIMESTAMP": str(int(when.timestamp() * 1e6))}),
        "journal cat": text,
        "kern.log": f"{when:%b %d %H:%M:%S} node-1 kernel: [{secs:12.6f}] {text}",
        "syslog rfc3164": f"<6>{when:%b %d %H:%M:%S} node-1 kernel: {text}",
        "syslog rfc5424": f"<6>1 {when:%Y-%m-%dT%H:%M:%S}Z node-1 kernel - - - {text}",
        "indented, CRLF": f"    [{secs:12.6f}] {text}\r",
    }[fmt]


FORMATS = ["dmesg", "dmesg -r", "dmesg -x", "dmesg -T", "dmesg caller id", "journal short",
           "journal short, empty hostname", "journal short-precise", "journal short-iso", "journal short-monotonic",
           "journal json", "journal cat", "kern.log", "syslog rfc3164", "syslog rfc5424", "indented, CRLF"]
REPORTS = CORPUS + sorted(CAPTURES.glob("documented-*"))


def incidents_of(path: Path) -> list[tuple]:
    report = build_report(Config(kmsg=str(path), boot_time=BOOT_TIME), node_view=False, clock=lambda: 0.0,
                          tz=UTC)
    return [(inc["kind"], inc["constraint"], inc["oom_cgroup"], inc["group_cgroup"],
             [(p["pid"], p["comm"]) for p in inc["killed"]]) for inc in report["incidents"]]


@pytest.mark.parametrize("source", REPORTS, ids=[p.stem for p in REPORTS])
def test_every_wrapper_gives_the_incidents_of_the_raw_kmsg_form(source: Path, tmp_path: Path) -> None:
    texts = [r.text for r in parse_text_log(io.BytesIO(source.read_bytes()), tz=UTC, year=2023)]
    raw = tmp_path / "raw.kmsg"
    raw.write_text("".join(wrap("kmsg", i, t) + "\n" for i, t in enumerate(texts)))
    expected = incidents_of(raw)
    for fmt in FORMATS:
        wrapped = tmp_path / "wrapped.log"
        wrapped.write_text("".join(wrap(fmt, i, t.replace("\n", "\\x0a")) + "\n" for i, t in enumerate(texts)))
        assert incidents_of(wrapped) == expected, fmt


def test_a_log_that_names_no_cgroup_is_explained_without_guessing() -> None:
    """Kill lines alone (RHEL 7, pasted from /var/log/messages): no cgroup, no limit, no memory.oom.group is
    known, and the explanation claims none; the older kills are summed up as such."""
    report = build_report(Config(kmsg=str(FIXTURES / "corpus" / "k8s-50632-rhel7-uid-markdown-quote.log"),
                                 boot_time=BOOT_TIME), node_view=False, clock=lambda: 0.0, tz=UTC, limit=2)
    newest = report["incidents"][0]
    assert newest["explanation"] == ("node (pid 801542) was killed by the OOM killer; the log does not say which "
                                     "cgroup's limit was hit, or whether the node itself ran out of memory. What held the memory: "
                                     "only the kill lines survived: the killed processes held 114 MiB (anon 101 "
                                     "MiB, file 13 MiB); the limit, page cache they did not map and kernel memory "
                                     "are not in the log.")
    assert report["not_shown"] == {"count": 6, "by_workload": {"cgroup unknown": 6}}
