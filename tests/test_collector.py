"""The metrics: one table of families (checked against an independent list and docs/contract.md), written byte
for byte as prometheus_client writes the same families (on the golden trees through a real agent, and on
label values that need escaping), with every byte a cgroup name can hold exported safely and one bad workload
never failing a scrape.

The reference collector below is built from prometheus_client's own metric classes (CounterMetricFamily,
GaugeMetricFamily, HistogramMetricFamily) fed with the values of the collector's table: what it checks is the
hand-written formatting (escaping, label order, number format, chunks), which is what prometheus_client knows
and the collector re-implements. That it is fed from the table means it cannot catch a wrong family by itself:
`test_the_table_is_the_contract` does, against `EXPECTED_FAMILIES` (written out here, independently of the
table) and the metrics table of docs/contract.md, and the golden files hold every family's exact text."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Optional

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from oomwatch import __version__
from oomwatch.deaths import CAUSES
from oomwatch.holders import MEMORY_TYPES
from oomwatch.model import CgroupStats, Incident, KilledProcess, Workload
from oomwatch.parse.cgroup import EXPORTED_MEMORY_EVENTS
from oomwatch.sinks.collector import (
    AGENT_CHECKS,
    AgentStatus,
    CONTENT_TYPE,
    FAMILIES,
    IDENTITY,
    NodeInfo,
    NodeView,
    UNWATCHED_REASONS,
    OomwatchCollector,
    format_value,
    label_value,
)
from oomwatch.node import NodePosture, scraped_workloads
from oomwatch.pipeline import Settings
from oomwatch.sources.cgroupfs import CgroupFS, Proc
from oomwatch.sources.statcache import StatCache
from oomwatch.statefile import StateFile, save_state, write_json
from oomwatch.store import KINDS, LATENCY_BUCKETS, ROLES, SCOPES, Store
from tests.conftest import BOOT_TIME, DETECTED_AT, FIXTURES, REPO
from tests.replay import Replay, saved_log_events, tree_events
from tests.test_golden import golden_config

GOLDEN = sorted(p for p in (FIXTURES / "golden").iterdir() if p.is_dir())

# (name, type, labels beyond the workload identity, or every label of a node family): docs/contract.md,
# written out by hand.
WORKLOAD_FAMILIES = [
    ("oomwatch_oom_kills_total", "counter", ("kind",)),
    ("oomwatch_oom_killed_processes_total", "counter", ("role",)),
    ("oomwatch_last_oom_kill_timestamp_seconds", "gauge", ()),
    ("oomwatch_last_oom_kill_info", "gauge", ("kind", "scope")),
    ("oomwatch_last_oom_kill_memory_bytes", "gauge", ("type",)),
    ("oomwatch_deaths_total", "counter", ("cause",)),
    ("oomwatch_memory_oom_group", "gauge", ()),
    ("oomwatch_memory_limit_bytes", "gauge", ()),
    ("oomwatch_memory_usage_bytes", "gauge", ()),
    ("oomwatch_memory_peak_bytes", "gauge", ()),
    ("oomwatch_memory_working_set_bytes", "gauge", ()),
    ("oomwatch_memory_events_total", "counter", ("event",)),
    ("oomwatch_memory_pressure_seconds_total", "counter", ("kind",)),
]
NODE_FAMILIES = [
    ("oomwatch_node_oom_kills_total", "counter", ("kind", "scope")),
    ("oomwatch_node_info", "gauge", ("cgroup_version", "kernel", "single_process_oom_kill")),
    ("oomwatch_workload_job_info", "gauge",
     ("cgroup", "job_kind", "job_name", "namespace", "owner_kind", "owner_name", "pod")),
    ("oomwatch_kmsg_records_total", "counter", ()),
    ("oomwatch_kmsg_lost_records_total", "counter", ()),
    ("oomwatch_kmsg_parse_errors_total", "counter", ()),
    ("oomwatch_kmsg_rejected_records_total", "counter", ()),
    ("oomwatch_oom_kills_counted_from_events_total", "counter", ()),
    ("oomwatch_state_write_errors_total", "counter", ()),
    ("oomwatch_workloads_dropped_total", "counter", ()),
    ("oomwatch_workloads_not_exported_total", "counter", ()),
    ("oomwatch_cgroup_parse_errors_total", "counter", ()),
    ("oomwatch_agent_healthy", "gauge", ("check",)),
    ("oomwatch_scrape_failures_total", "counter", ()),
    ("oomwatch_cgroups_unwatched", "gauge", ("reason",)),
    ("oomwatch_events_file_write_errors_total", "counter", ()),
    ("oomwatch_workloads_over_cap", "gauge", ()),
    ("oomwatch_detection_latency_seconds", "histogram", ("le",)),
    ("oomwatch_build_info", "gauge", ("version",)),
]
EXPECTED_FAMILIES = WORKLOAD_FAMILIES + NODE_FAMILIES


def _contract_metrics() -> dict[str, tuple[str, set[str]]]:
    """docs/contract.md's metrics table: name → (type, the labels its third column names)."""
    text = (REPO / "docs/contract.md").read_text()
    table = text[text.index("| name | type |"):]
    out = {}
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        names, kind, labels = (cell.strip() for cell in line.strip("|").split("|")[:3])
        for name in re.findall(r"`([a-z_]+)`", names):
            out[name] = (kind.split()[0], set(re.findall(r"`([a-z_]+)`", labels)))
    return out


def test_the_table_is_the_contract() -> None:
    assert [(f.name, f.type, f.labels) for f in FAMILIES] == EXPECTED_FAMILIES
    assert {f.name for f in FAMILIES if f.source != "node"} == {name for name, _, _ in WORKLOAD_FAMILIES}
    contract = _contract_metrics()
    assert set(contract) == {name for name, _, _ in EXPECTED_FAMILIES}
    for name, kind, labels in EXPECTED_FAMILIES:
        assert contract[name] == (kind, set(labels) - {"le"}), name


class ReferenceCollector:
    """The same metrics as prometheus_client's typed families, fed from the table's values (see the module
    docstring)."""

    def __init__(self, store, live_workloads, node_info, cgroup_parse_errors=None, not_exported=0,
                 agent_status=None, workloads=None) -> None:
        self.store, self.live_workloads, self.node_info = store, live_workloads, node_info
        self.cgroup_parse_errors, self.not_exported = cgroup_parse_errors, not_exported
        self.agent_status, self.workloads = agent_status, workloads

    def collect(self):
        snap = self.store.snapshot()
        rows = {"counters": sorted(snap.workloads.items()),
                "live": sorted(self.live_workloads(), key=lambda item: item[0])}
        classes = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily}
        for family in FAMILIES:
            if family.source == "node":
                continue
            metric = classes[family.type](family.base_name, family.help, labels=[*IDENTITY, *family.labels])
            for labels, row in rows[family.source]:
                for values, value in family.series(row):
                    metric.add_metric([label_value(v) for v in (*labels, *values)], value)
            yield metric
        view = NodeView(snap=snap, info=self.node_info(), not_exported=self.not_exported,
                        cgroup_parse_errors=self.cgroup_parse_errors() if self.cgroup_parse_errors else None,
                        agent=self.agent_status() if self.agent_status else None,
                        workloads=self.workloads() if self.workloads else None)
        for family in FAMILIES:
            if family.source != "node" or family.samples(view) is None:
                continue
            samples = list(family.samples(view))
            if family.type == "histogram":
                buckets = [(labels["le"], value) for name, labels, value in samples
                           if name.endswith("_bucket")]
                total = next(value for name, _, value in samples if name.endswith("_sum"))
                yield HistogramMetricFamily(family.name, family.help, buckets=buckets, sum_value=total)
            elif not family.labels:
                (_, _, value), = samples
                yield classes[family.type](family.base_name, family.help, value=value)
            else:
                metric = classes[family.type](family.base_name, family.help, labels=sorted(family.labels))
                for _, labels, value in samples:
                    metric.add_metric([label_value(labels[k]) for k in sorted(family.labels)], value)
                yield metric


def reference_text(collector) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)


def golden_inputs(case: Path, parse_errors: Optional[int] = None):
    """A golden case's tree and log through the pipeline (as tests/test_golden.py replays them): what the
    agent hands its collector, (snapshot source, live workloads, node info, cgroup parse errors)."""
    config = golden_config(case, Path("/nonexistent"))
    replay = Replay(Settings(boot_id=Proc(config.proc).boot_id(), boot_time=BOOT_TIME, kmsg_source=None,
                             counting=False), now=DETECTED_AT,
                    single_process_oom_kill=NodePosture(config, Proc(config.proc)).single_process_oom_kill())
    replay.run(tree_events(case / "cgroup", case / "run", case / "pods") + saved_log_events(case / "kmsg"))
    view = replay.pipeline.view()
    fs = CgroupFS(config.cgroup_root)
    posture = NodePosture(config, Proc(config.proc))
    return (view, lambda: scraped_workloads(view.workloads, StatCache(fs), fs, set()),
            lambda: posture.info_with(view.single_process_oom_kill),
            lambda: fs.parse_errors if parse_errors is None else parse_errors)


@pytest.mark.parametrize("case", GOLDEN, ids=[c.name for c in GOLDEN])
def test_golden_trees_byte_identical_to_prometheus_client(case: Path) -> None:
    view, live, info, parse_errors = golden_inputs(case)
    healthy = AgentStatus(checks={c: True for c in AGENT_CHECKS if c != "proc_connector"},
                          unwatched={"inotify_watches": 0, "unreadable": 0})  # a running agent's
    ours = OomwatchCollector(view, live, info, cgroup_parse_errors=parse_errors, agent_status=lambda: healthy,
                             workloads=lambda: view.workloads)  # as the agent builds it (agent.py _collector)
    reference = ReferenceCollector(view, live, info, cgroup_parse_errors=parse_errors,
                                   agent_status=lambda: healthy, workloads=lambda: view.workloads)
    content_type, chunks = ours.metrics("text/plain")
    body = b"".join(chunks)
    assert body == reference_text(reference)
    assert content_type == CONTENT_TYPE
    # The golden file holds the same bytes (what the agent serves: tests/test_golden.py).
    assert body.decode() == (case / "expected-metrics.txt").read_text()
    # A registry still works: prometheus_client renders collect() to the same text.
    assert reference_text(ours) == body


def _incident(kind: str, cgroup: str, workload: Workload, killed: int, when: float) -> Incident:
    procs = tuple(KilledProcess(pid=100 + i, comm="dd", uid=0, cgroup=cgroup, total_vm_bytes=1,
                                anon_rss_bytes=1, file_rss_bytes=0, shmem_rss_bytes=0, oom_score_adj=0)
                  for i in range(killed))
    return Incident(time=when, boot_id="b", kernel_seq=int(when), kind=kind, constraint="memcg",
                    scope="container", oom_cgroup=cgroup, group_cgroup=cgroup if kind == "group" else None,
                    trigger=None, memory=None,
                    victim=procs[0], killed=procs, workload=workload, workloads=(workload,),
                    explanation="x", detected_at=when + 0.25, evidence="kmsg")


HOSTILE = [
    ("ns", 'we"ird', "c\\1", ""),
    ("ns", "p\nq", "", ""),
    ("", "", "", "/sys\\tem.slice/a \"b\".service"),
    ("ünï", "pød-✓", "ctr", ""),
    ("ns", "pod", "", ""),
]


def _stats(i: int) -> CgroupStats:
    events = {"low": 1, "max": 7 * i, "oom": i, "oom_kill": 2, "oom_group_kill": 1, "sock_throttled": 0}
    return CgroupStats(path=f"/x{i}", oom_group=i % 2, events=events,
                       limit_bytes=float("inf") if i % 2 else float(1 << (20 + i)), usage_bytes=123456789 * i,
                       peak_bytes=None if i == 2 else 10 ** (i + 3))


def _store(labels_list=HOSTILE, killed_cgroup: str = "/k/p/c") -> Store:
    store = Store(clock=lambda: 1000.0)
    for labels in labels_list:
        store.seen(labels)
    workload = Workload(type="k8s-container", cgroup=killed_cgroup, namespace="ns", pod='we"ird',
                        container="c\\1")
    try:
        store.publish(_incident("group", killed_cgroup, workload, 3, 1795380009.320870))
        store.publish(_incident("single", killed_cgroup, workload, 1, 1795380019.5))
    except TypeError as exc:  # the Incident model changed shape: this test's helper must follow
        pytest.fail(f"update _incident() to the model: {exc}")
    return store


def _node() -> NodeInfo:
    return NodeInfo(kernel='6.1.0 "x"\\y', cgroup_version="2", single_process_oom_kill="unknown")


def test_hostile_label_values_and_odd_numbers_match_prometheus_client() -> None:
    store = _store()

    def live():
        return [(labels, _stats(i)) for i, labels in enumerate(HOSTILE)]

    ours = OomwatchCollector(store, live, _node, cgroup_parse_errors=lambda: 3)
    assert ours.exposition() == reference_text(ReferenceCollector(store, live, _node, lambda: 3))
    assert ours.exposition() == reference_text(ours)  # the registry path (collect()) agrees
    text = ours.exposition().decode()
    assert 'pod="we\\"ird"' in text and 'pod="p\\\\x0aq"' in text  # (the newline, by the label policy)
    assert "oomwatch_cgroup_parse_errors_total 3.0" in text


# --- every byte a cgroup name can hold -------------------------------------------------------------------

# The kernel allows any byte but `/` (and NUL, which no file name holds: tested as a label all the same).
ALL_BYTES = [bytes([b]) for b in range(256) if b != 0x2F]
# Sequences that are not UTF-8 although every byte of them can start or continue one.
NOT_UTF8 = [b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80",
            b"\xed\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xfe\xff", b"\x80\xbf"]
LONG_NAMES = [b"\xff" * 4096, b"\\" * 4096, b'"' * 4096, b"\n" * 4096, "✓".encode() * 1365, b"a" * 4096,
              b"\\xff" * 1024]


def hostile_names() -> list[bytes]:
    """Each hostile byte or sequence alone, first, in the middle and last in a name, then the long names."""
    names = []
    for piece in ALL_BYTES + NOT_UTF8:
        names += [piece, piece + b"x.service", b"x" + piece + b"y.service", b"x.service" + piece]
    return list(dict.fromkeys(names + LONG_NAMES))  # 0xc3 alone is in both lists


def hostile_rows(names: list[bytes]) -> list[tuple[tuple[str, str, str, str], CgroupStats]]:
    """Workloads named as the cgroup tree names them: os.fsdecode, with surrogate escapes, as os.scandir reads
    a directory (in the cgroup label, and as a pod and container name too)."""
    rows = []
    for i, name in enumerate(names):
        path = os.fsdecode(b"/user.slice/user-1000.slice/user@1000.service/" + name)
        labels = ("", "", "", path) if i % 3 else ("ns", os.fsdecode(name), os.fsdecode(name) + "c", "")
        rows.append((labels, CgroupStats(path=path, oom_group=1, usage_bytes=i, events={"oom_kill": i})))
    return rows


def expected_text(label: str) -> str:
    """What the contract ("Label values") says a name becomes, written here from its words, not the collector's
    code: its bytes read as UTF-8, each byte that is not written `\\xNN` (Python's own backslashreplace); each
    control character `\\xNN` below 0x80, else `\\uNNNN`, and a backslash that would read as such an escape or
    as `\\x5c` written `\\x5c`; cut at 1,024 characters with a marker of the length and SHA-256."""
    import hashlib

    text = os.fsencode(label).decode("utf-8", "backslashreplace")
    controls = {chr(c) for c in [*range(0x20), *range(0x7F, 0xA0), 0x61C, 0x200E, 0x200F, 0x2028, 0x2029,
                                 *range(0x202A, 0x202F), *range(0x2066, 0x206A)]}
    escapes = {(f"\\x{ord(c):02x}" if ord(c) < 0x80 else f"\\u{ord(c):04x}") for c in controls} | {"\\x5c"}
    out = []
    for i, char in enumerate(text):
        if char in controls:
            out.append(f"\\x{ord(char):02x}" if ord(char) < 0x80 else f"\\u{ord(char):04x}")
        elif char == "\\" and any(text.startswith(e, i) for e in escapes):
            out.append("\\x5c")
        else:
            out.append(char)
    value = "".join(out)
    if len(value) > 1024:
        digest = hashlib.sha256(value.encode()).hexdigest()[:16]
        value = f"{value[:1024]}…[cut: {len(value)} characters, sha256 {digest}]"
    return value


def _hostile_collector(names: list[bytes]) -> tuple[OomwatchCollector, list, Store]:
    rows = hostile_rows(names)
    store = Store(clock=lambda: 1000.0, max_workloads=len(rows) + 10)
    for labels, _ in rows:
        store.seen(labels)
    first = rows[1][0][3]  # a cgroup label: a kill counted on a hostile name
    store.publish(_incident("group", first, Workload(type="systemd", cgroup=first), 2, 1795380009.5))
    return OomwatchCollector(store, lambda: rows, _node), rows, store


def test_every_byte_of_a_cgroup_name_is_exported_as_utf8_text() -> None:
    names = hostile_names()
    ours, rows, store = _hostile_collector(names)
    body = ours.exposition()
    assert body == reference_text(ReferenceCollector(store, lambda: rows, _node))
    text = body.decode("utf-8")  # strict: the whole body is UTF-8
    families = {f.name: f for f in text_string_to_metric_families(text)}
    usage = {(s.labels["namespace"], s.labels["pod"], s.labels["container"], s.labels["cgroup"]): s.value
             for s in families["oomwatch_memory_usage_bytes"].samples}
    # Every workload has its series, under the name the contract gives it, and no two share one.
    assert len(usage) == len(rows)
    for i, (labels, _) in enumerate(rows):
        assert usage[tuple(expected_text(v) for v in labels)] == i
    assert "oomwatch_workloads_not_exported_total 0.0" in text
    kills = [s for s in families["oomwatch_oom_kills"].samples
             if s.labels["cgroup"] == expected_text(rows[1][0][3]) and s.labels["kind"] == "group"]
    assert [s.value for s in kills] == [1.0]
    # A byte that is not UTF-8 is written as the kernel log writes it, a control character shown, a backslash
    # that would read as an escape escaped itself; everything else is itself.
    assert label_value(os.fsdecode(b"x\xffy.service")) == "x\\xffy.service"
    assert label_value(os.fsdecode("x\ny\"z\\ü\x00".encode())) == 'x\\x0ay"z\\ü\\x00'
    assert label_value("a\x1bb") == "a\\x1bb" and label_value("a\\x1bb") == "a\\x5cx1bb"
    assert label_value("\x85\u202e") == "\\u0085\\u202e" and label_value("sys\\x2dgetty") == "sys\\x2dgetty"


def _promtool() -> str:
    promtool = shutil.which("promtool", path=f"{REPO / '.cache/tools/bin'}:{os.environ.get('PATH', '')}")
    assert promtool, "promtool missing: scripts/test installs Debian's prometheus package"
    return promtool


def promtool_complaint(body: bytes) -> Optional[str]:
    """What `promtool check metrics` says against `body` (exit status and output), None when it accepts it
    without a word."""
    result = subprocess.run([_promtool(), "check", "metrics"], input=body, capture_output=True)
    if result.returncode == 0 and result.stdout == b"" and result.stderr == b"":
        return None
    return f"exit {result.returncode}: {(result.stdout + result.stderr).decode(errors='replace')}"


@pytest.mark.tools
def test_promtool_accepts_every_byte_of_a_cgroup_name() -> None:
    """The real promtool (Debian's prometheus) on the exposition of every hostile name: it refuses a body with
    one label value that is not UTF-8, as Prometheus refuses the scrape."""
    assert promtool_complaint(_hostile_collector(hostile_names())[0].exposition()) is None
    # The check can fail: the same body with one name's bytes written raw is refused.
    raw = b'# HELP m x\n# TYPE m gauge\nm{cgroup="/x\xff.service"} 1\n'
    assert subprocess.run([_promtool(), "check", "metrics"], input=raw, capture_output=True).returncode != 0


def test_names_that_meet_once_escaped_are_exported_once() -> None:
    """`x\\xff` spelt out and the byte 0xff are two cgroups with one exported name: a repeated series would be
    refused, so the second in label order is left out, logged and counted once."""
    spelt, byte = "/u/x\\xff.service", os.fsdecode(b"/u/x\xff.service")
    rows = [(("", "", "", spelt), _stats(1)), (("", "", "", byte), _stats(3))]
    store = Store(clock=lambda: 1000.0)
    for labels, _ in rows:
        store.seen(labels)
    ours = OomwatchCollector(store, lambda: rows, _node)
    for _ in range(2):
        text = ours.exposition().decode()
        usage = [s for f in text_string_to_metric_families(text) if f.name == "oomwatch_memory_usage_bytes"
                 for s in f.samples]
        assert [(s.labels["cgroup"], s.value) for s in usage] == [("/u/x\\xff.service", 123456789.0)]
        assert "oomwatch_workloads_not_exported_total 1.0" in text
    rows.pop(0)  # the first one goes: the other is exported again
    store.gone(("", "", "", spelt))
    store.grace_seconds = 0
    store.expire()
    text = ours.exposition().decode()
    line = 'oomwatch_memory_usage_bytes{cgroup="/u/x\\\\xff.service",container="",namespace="",pod=""}'
    assert f"{line} {format_value(_stats(3).usage_bytes)}\n" in text


class _Broken:
    """A value no source should produce (a reader bug): it cannot be formatted."""

    def __float__(self) -> float:
        raise ValueError("not a number")


def test_one_workload_that_cannot_be_written_never_fails_a_scrape(caplog) -> None:
    good, bad = ("ns", "good", "c", ""), ("ns", "bad", "c", "")
    store = Store(clock=lambda: 1000.0)
    for labels in (good, bad):
        store.seen(labels)
    broken = CgroupStats(path="/b", oom_group=1, usage_bytes=_Broken(),  # type: ignore[arg-type]
                         events={"oom": 1})
    rows = [(good, _stats(1)), (bad, broken)]
    ours = OomwatchCollector(store, lambda: rows, _node)
    with caplog.at_level(logging.WARNING, logger="oomwatch.sinks.collector"):
        for _ in range(3):
            text = ours.exposition().decode()
            families = {f.name: f for f in text_string_to_metric_families(text)}
            pods = lambda name: {s.labels["pod"] for s in families[name].samples}  # noqa: E731
            assert pods("oomwatch_memory_usage_bytes") == {"good"}
            assert pods("oomwatch_memory_events") == {"good"}  # left out of the rest of the scrape
            assert pods("oomwatch_oom_kills") == {"good", "bad"}  # what came before it stays
            assert "oomwatch_workloads_not_exported_total 1.0" in text
            assert reference_text(ours).decode().count('pod="bad"') == text.count('pod="bad"')
    assert [r.getMessage() for r in caplog.records if "left out of /metrics" in r.getMessage()] == [
        "workload ('ns', 'bad', 'c', '') left out of /metrics: oomwatch_memory_usage_bytes: "
        "ValueError('not a number')"]


def test_labels_that_are_not_four_strings_never_fail_a_scrape(caplog) -> None:
    """A bug upstream (a None name, a list) costs its own workload, not the scrape."""
    good = ("ns", "good", "c", "")
    store = Store(clock=lambda: 1000.0)
    store.seen(good)
    rows = [(good, _stats(1)), (("ns", None, "c", ""), _stats(2)), (["ns", "list", "c", ""], _stats(3))]
    ours = OomwatchCollector(store, lambda: rows, _node)
    with caplog.at_level(logging.WARNING, logger="oomwatch.sinks.collector"):
        for _ in range(2):
            text = ours.exposition().decode()
            usage = [s for f in text_string_to_metric_families(text) if f.name == "oomwatch_memory_usage_bytes"
                     for s in f.samples]
            assert [s.labels["pod"] for s in usage] == ["good"]
            assert "oomwatch_workloads_not_exported_total 2.0" in text
            registry_text = reference_text(ours).decode()  # collect() leaves them out too, counted once
            assert 'pod="good"' in registry_text and "oomwatch_workloads_not_exported_total 2.0" in registry_text
    assert len([r for r in caplog.records if "not four strings" in r.getMessage()]) == 2


def test_hostile_names_survive_a_save_and_restore(tmp_path: Path) -> None:
    """The state file (json) keeps every name as it was read, and a restored agent exports it the same way."""
    ours, rows, store = _hostile_collector([name for name in hostile_names() if len(name) < 4000])
    store.set_cursor("boot-1", 7)
    save_state(store, str(tmp_path))
    restored = Store(clock=lambda: 1000.0, max_workloads=store.max_workloads)
    assert StateFile(str(tmp_path)).load(restored, "boot-1")[0] == "restored"
    assert restored.snapshot().workloads.keys() == store.snapshot().workloads.keys()
    again = OomwatchCollector(restored, lambda: rows, _node)
    assert again.exposition() == ours.exposition()


def test_a_long_cgroup_path_survives_a_save_and_restore(tmp_path: Path) -> None:
    """A delegated subtree can nest cgroups past 4,096 bytes of path; one such workload must not cost the
    node's saved counters."""
    ours, rows, store = _hostile_collector(LONG_NAMES)
    store.set_cursor("boot-1", 7)
    save_state(store, str(tmp_path))
    restored = Store(clock=lambda: 1000.0)
    assert StateFile(str(tmp_path)).load(restored, "boot-1")[0] == "restored"
    assert restored.snapshot().workloads.keys() == store.snapshot().workloads.keys()


def test_values_format_as_go_does() -> None:
    for value in (0, 1, 0.5, 1e-9, 123456, 1234567, 67108864.0, 1795380009.32087, 2 ** 63, 2 ** 64 - 1,
                  float("inf"), float("-inf"), float("nan"), -5, -1234567.0, 1e22, 12345678901234567890):
        assert format_value(value) == floatToGoString(value), value


def test_body_comes_in_bounded_chunks() -> None:
    store = Store(clock=lambda: 1000.0)
    many = [("ns", f"pod-{i:05d}", "c", "") for i in range(3000)]
    for labels in many:
        store.seen(labels)
    ours = OomwatchCollector(store, lambda: [(labels, _stats(1)) for labels in many],
                             lambda: NodeInfo("k", "2", "false"))
    chunks = list(ours.metrics("")[1])
    assert len(chunks) > 10
    assert max(len(c) for c in chunks) < 256 * 1024
    assert b"".join(chunks).count(b"\n") == sum(c.count(b"\n") for c in chunks)


def test_label_text_is_built_once_and_forgotten_with_the_workload() -> None:
    store = Store(clock=lambda: 1000.0)
    live = [(("ns", "a", "c", ""), _stats(1)), (("ns", "b", "c", ""), _stats(1))]
    for labels, _ in live:
        store.seen(labels)
    ours = OomwatchCollector(store, lambda: live, lambda: NodeInfo("k", "2", "false"))
    ours.exposition()
    first = ours.label_texts[("ns", "a", "c", "")]
    ours.exposition()
    assert ours.label_texts[("ns", "a", "c", "")] is first  # not rebuilt
    store.gone(("ns", "b", "c", ""))
    store.grace_seconds = 0
    store.expire()
    live.pop()
    ours.exposition()
    assert set(ours.label_texts) == {("ns", "a", "c", "")}


def test_drop_series_leaves_out_pods_and_memory_events() -> None:
    store = _store()

    def live():
        return [(labels, _stats(i)) for i, labels in enumerate(HOSTILE)]

    def info():
        return NodeInfo("k", "2", "false")
    full = OomwatchCollector(store, live, info).exposition().decode()
    slim_collector = OomwatchCollector(store, live, info, drop=["pods", "memory-events"])
    slim = slim_collector.exposition().decode()
    assert reference_text(slim_collector).decode() == slim  # the registry path drops the same
    assert 'pod="pod"' in full and "oomwatch_memory_events_total" in full
    # both pod-level (container="")
    assert 'namespace="ns",pod="pod"' not in slim and 'pod="p\\nq"' not in slim
    assert "oomwatch_memory_events_total" not in slim
    assert 'pod="we\\"ird"' in slim  # containers stay
    # What is left is still valid exposition, and every other family is unchanged.
    names = {f.name for f in text_string_to_metric_families(slim)}
    assert "oomwatch_memory_usage" not in names and "oomwatch_memory_usage_bytes" in names
    with pytest.raises(ValueError, match="choose from"):
        OomwatchCollector(store, live, info, drop=["containers"])


def test_series_per_workload() -> None:
    """What the README says a node exports per container and per pod (series with a kill timestamp once a
    workload was killed, and memory.peak where the kernel has it)."""
    store = Store(clock=lambda: 1000.0)
    container, pod = ("ns", "p", "c", ""), ("ns", "p", "", "")
    for labels in (container, pod):
        store.seen(labels)
    full = CgroupStats(path="/x", oom_group=1, events=dict.fromkeys(EXPORTED_MEMORY_EVENTS, 0),
                       limit_bytes=1.0, usage_bytes=1, peak_bytes=1)
    ours = OomwatchCollector(store, lambda: [(container, full), (pod, full)],
                             lambda: NodeInfo("k", "2", "false"))
    lines = [line for line in ours.exposition().decode().splitlines() if not line.startswith("#")]
    per_container = [line for line in lines if 'container="c"' in line]
    per_pod = [line for line in lines if 'container=""' in line and 'pod="p"' in line]
    assert len(per_container) == len(per_pod) == 2 + 2 + 4 + 5  # kills, killed, 4 gauges, 5 events
    node_level = len(lines) - len(per_container) - len(per_pod)
    # node kills, node_info, kmsg counters, the agent's own health counters, histogram, build_info
    assert node_level == 10 + 1 + 3 + 5 + 16 + 1  # (node kills: 2 kinds x 5 scopes)


@pytest.mark.tools
@pytest.mark.parametrize("case", GOLDEN, ids=[c.name for c in GOLDEN])
def test_promtool_accepts_the_exposition(case: Path) -> None:
    """The real promtool (Debian's prometheus, installed by scripts/setup-deploy-tools) on what the collector
    writes for a golden tree, with the cgroup parse-error counter and the hostile label values added."""
    view, live, info, parse_errors = golden_inputs(case, parse_errors=2)
    golden = OomwatchCollector(view, live, info, cgroup_parse_errors=parse_errors).exposition()
    store = _store()
    hostile = OomwatchCollector(store, lambda: [(labels, _stats(i)) for i, labels in enumerate(HOSTILE)],
                                lambda: NodeInfo('6.1 "x"', "2", "unknown")).exposition()
    assert [promtool_complaint(body) for body in (golden, hostile)] == [None, None]


# --- bounded labels ------------------------------------------------------------------------------------

IDENTITY_VALUES = "one value per workload: the agent's own bounded set of workloads (docs/contract.md)"
# Every label name /metrics may carry, and what bounds its values: a fixed set, or why it is bounded. A label
# whose values are free text (a sentence, pids, a time) would start a new series at every incident.
BOUNDED_LABELS: dict[str, object] = {
    **dict.fromkeys(IDENTITY, IDENTITY_VALUES),
    "kind": set(KINDS) | {"some", "full"},
    "scope": set(SCOPES),
    "role": set(ROLES),
    "event": set(EXPORTED_MEMORY_EVENTS),
    "le": {repr(float(b)) for b in LATENCY_BUCKETS} | {"+Inf"},
    "cgroup_version": {"1", "2", "unknown"},
    "single_process_oom_kill": {"true", "false", "unknown"},
    "kernel": "one series per node (the running kernel's release)",
    "version": {__version__},
    "check": set(AGENT_CHECKS),
    "reason": set(UNWATCHED_REASONS),
    "type": set(MEMORY_TYPES),
    "cause": set(CAUSES),  # oomwatch_deaths_total: oomwatch.deaths' fixed verdicts
    # oomwatch_workload_job_info: names the API server or Slurm gave, one per job or owner of an exported
    # workload (tests/test_job_info.py: 10,000 pods in 1,000 jobs give 1,000 job names)
    **dict.fromkeys(("job_kind", "owner_kind"), "one per kind of job or owner in the cluster (JobSet, Job, ...)"),
    **dict.fromkeys(("job_name", "owner_name"), "one per job or owner of a workload with series"),
}


def test_every_family_has_bounded_labels_only() -> None:
    for family in FAMILIES:
        assert set(family.labels) <= set(BOUNDED_LABELS), family.name


@pytest.mark.parametrize("case", GOLDEN, ids=[c.name for c in GOLDEN])
def test_golden_metrics_have_bounded_labels_only(case: Path) -> None:
    text = (case / "expected-metrics.txt").read_text()
    seen = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for name, value in sample.labels.items():
                assert name in BOUNDED_LABELS, (sample.name, name, value)
                allowed = BOUNDED_LABELS[name]
                if isinstance(allowed, set):
                    assert value in allowed, (sample.name, name, value)
                seen.add(name)
    assert {"kind", "scope", "role", "le"} <= seen  # the golden trees have incidents: the check ran on them
    assert "oomwatch_last_oom_kill_info{" in text


# --- hostile names through the pipeline ------------------------------------------------------------------

# Directory names a user can make in a delegated subtree (NAME_MAX is 255 bytes).
HOSTILE_DIRS = [b"x\xffy.service", b"\xc3", b"a\nb.service", b" lead.scope", b'q"\\.service', b"\xfe" * 255,
                b"\xed\xa0\x80", b"\x01\x1b[31m"]


def _hostile_tree(tmp_path: Path) -> Path:
    """memcg-scenarios' tree with the hostile names added beside `/a`, each a copy of it (a 64 MiB limit)."""
    tree = tmp_path / "cgroup"
    shutil.copytree(FIXTURES / "golden" / "memcg-scenarios" / "cgroup", tree)
    for name in HOSTILE_DIRS:
        directory = os.path.join(os.fsencode(tree), name)
        os.mkdir(directory)
        for f in (tree / "a").iterdir():
            shutil.copyfile(f, os.path.join(directory, os.fsencode(f.name)))
    return tree


def test_hostile_cgroup_names_through_the_pipeline_and_a_restart(tmp_path: Path) -> None:
    """The cgroup source reads the names (os.scandir: surrogate escapes), the pipeline keeps them, /metrics
    exports each as the contract says, and after the state is written as the agent writes it and read back the
    same series come out."""
    case = FIXTURES / "golden" / "memcg-scenarios"
    tree = _hostile_tree(tmp_path)
    config = dataclasses.replace(golden_config(case, tmp_path), cgroup_root=str(tree))
    posture = NodePosture(config, Proc(config.proc))
    settings = Settings(boot_id=Proc(config.proc).boot_id(), boot_time=BOOT_TIME, kmsg_source=None,
                        counting=False)
    replay = Replay(settings, now=DETECTED_AT, single_process_oom_kill=posture.single_process_oom_kill())
    replay.run(tree_events(tree) + saved_log_events(case / "kmsg"))
    body = replay.metrics(config)
    families = {f.name: f for f in text_string_to_metric_families(body.decode("utf-8"))}
    exported = {s.labels["cgroup"] for s in families["oomwatch_memory_usage_bytes"].samples}
    for name in HOSTILE_DIRS:
        assert expected_text(os.fsdecode(b"/" + name)) in exported, name
    assert families["oomwatch_workloads_not_exported"].samples[0].value == 0
    state = tmp_path / "state.json"
    with open(state, "w") as f:
        write_json(f, replay.pipeline.state())
    saved = json.loads(state.read_text())
    store = Store()
    store.load_state(saved)  # as the agent starts: the store and the reconciler's accounts from the file
    restarted = Replay(settings, now=DETECTED_AT, store=store, accounts=saved["accounts"],
                       single_process_oom_kill=posture.single_process_oom_kill())
    restarted.run(tree_events(tree))  # the cgroups it finds at start; the log was read before
    assert restarted.metrics(config) == body


@pytest.mark.tools
def test_promtool_accepts_hostile_cgroup_names_through_the_pipeline(tmp_path: Path) -> None:
    case = FIXTURES / "golden" / "memcg-scenarios"
    tree = _hostile_tree(tmp_path)
    config = dataclasses.replace(golden_config(case, tmp_path), cgroup_root=str(tree))
    replay = Replay(Settings(boot_id=Proc(config.proc).boot_id(), boot_time=BOOT_TIME, kmsg_source=None,
                             counting=False), now=DETECTED_AT)
    replay.run(tree_events(tree) + saved_log_events(case / "kmsg"))
    assert promtool_complaint(replay.metrics(config)) is None
