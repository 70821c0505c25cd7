"""The directly written exposition is byte for byte what prometheus_client writes for the same metric
families: on the golden trees (through a real agent) and on label values that need escaping. The reference
families below are the collector as it was built on prometheus_client before the exposition was written by
hand; prometheus_client stays the reference here."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from oomwatch import __version__
from oomwatch.model import CgroupStats, Incident, KilledProcess, Workload
from oomwatch.parse.cgroup import EXPORTED_MEMORY_EVENTS
from oomwatch.sinks.collector import CONTENT_TYPE, NodeInfo, OomwatchCollector, format_value
from oomwatch.store import KINDS, LATENCY_BUCKETS, ROLES, Store
from tests.conftest import DETECTED_AT, FIXTURES, REPO, running_agent, wait_for
from tests.test_golden import golden_config

IDENTITY = ["namespace", "pod", "container", "cgroup"]
GOLDEN = sorted(p for p in (FIXTURES / "golden").iterdir() if p.is_dir())


class ReferenceCollector:
    """The same metrics built as prometheus_client families (the collector before issue 12)."""

    def __init__(self, store, live_workloads, node_info, cgroup_parse_errors=None) -> None:
        self.store, self.live_workloads, self.node_info = store, live_workloads, node_info
        self.cgroup_parse_errors = cgroup_parse_errors

    def collect(self):
        snap = self.store.snapshot()
        kills = CounterMetricFamily("oomwatch_oom_kills", "OOM-kill incidents in which this workload lost at "
                                    "least one process.", labels=IDENTITY + ["kind"])
        killed = CounterMetricFamily("oomwatch_oom_killed_processes", "Processes killed by the OOM killer, "
                                     "each pid once; role=collateral are those memory.oom.group took along.",
                                     labels=IDENTITY + ["role"])
        last = GaugeMetricFamily("oomwatch_last_oom_kill_timestamp_seconds", "Time of the last OOM-kill "
                                 "incident of this workload.", labels=IDENTITY)
        for labels, counters in sorted(snap.workloads.items()):
            for kind in KINDS:
                kills.add_metric([*labels, kind], counters.kills[kind])
            for role in ROLES:
                killed.add_metric([*labels, role], counters.killed[role])
            if counters.last_kill is not None:
                last.add_metric(list(labels), counters.last_kill)
        info = GaugeMetricFamily("oomwatch_last_oom_kill_info", "The last OOM-kill incident of this workload, "
                                 "explained in one sentence (1; replaced at its next incident).",
                                 labels=IDENTITY + ["explanation", "kind", "scope"])
        for labels, counters in sorted(snap.workloads.items()):
            if counters.last_incident is not None:
                kind, scope, explanation = counters.last_incident
                info.add_metric([*labels, explanation, kind, scope], 1)
        yield from (kills, killed, last, info)
        oom_group = GaugeMetricFamily("oomwatch_memory_oom_group", "Current memory.oom.group of the "
                                      "workload cgroup (1: an OOM kill takes every process).",
                                      labels=IDENTITY)
        limit = GaugeMetricFamily("oomwatch_memory_limit_bytes", "memory.max of the workload cgroup "
                                  "(+Inf when unlimited).", labels=IDENTITY)
        usage = GaugeMetricFamily("oomwatch_memory_usage_bytes", "memory.current of the workload cgroup.",
                                  labels=IDENTITY)
        peak = GaugeMetricFamily("oomwatch_memory_peak_bytes", "memory.peak of the workload cgroup (kernel "
                                 "5.19+).", labels=IDENTITY)
        working_set = GaugeMetricFamily("oomwatch_memory_working_set_bytes", "memory.current less memory.stat "
                                        "inactive_file, floored at 0 (the kubelet's working set).",
                                        labels=IDENTITY)
        events = CounterMetricFamily("oomwatch_memory_events", "The kernel's own memory.events counters of "
                                     "the workload cgroup (hierarchical).", labels=IDENTITY + ["event"])
        # Issue 14: PSI.
        pressure = CounterMetricFamily("oomwatch_memory_pressure_seconds", "Time some (kind=some) or all "
                                       "(kind=full) non-idle tasks of the workload cgroup were stalled waiting "
                                       "for memory (memory.pressure total; absent without PSI).",
                                       labels=IDENTITY + ["kind"])
        for labels, stats in sorted(self.live_workloads(), key=lambda item: item[0]):
            for family, value in ((oom_group, stats.oom_group), (limit, stats.limit_bytes),
                                  (usage, stats.usage_bytes), (peak, stats.peak_bytes),
                                  (working_set, stats.working_set_bytes)):
                if value is not None:
                    family.add_metric(list(labels), value)
            for name in EXPORTED_MEMORY_EVENTS:
                if stats.events is not None and name in stats.events:
                    events.add_metric([*labels, name], stats.events[name])
            for kind, line in (("some", stats.pressure and stats.pressure.some),
                               ("full", stats.pressure and stats.pressure.full)):
                if line and line.total_usec is not None:
                    pressure.add_metric([*labels, kind], line.total_usec / 1e6)
        yield from (oom_group, limit, usage, peak, working_set, events, pressure)
        node = CounterMetricFamily("oomwatch_node_oom_kills", "OOM-kill incidents on this node.",
                                   labels=["kind", "scope"])
        for (kind, scope), n in sorted(snap.node_kills.items()):
            node.add_metric([kind, scope], n)
        yield node
        info = self.node_info()
        node_info = GaugeMetricFamily("oomwatch_node_info", "The node's OOM posture.",
                                      labels=["kernel", "cgroup_version", "single_process_oom_kill"])
        node_info.add_metric([info.kernel, info.cgroup_version, info.single_process_oom_kill], 1)
        yield node_info
        yield CounterMetricFamily("oomwatch_kmsg_records", "Kernel log records read.",
                                  value=snap.kmsg_records)
        yield CounterMetricFamily("oomwatch_kmsg_lost_records", "Kernel log records overwritten before "
                                  "oomwatch could read them.", value=snap.kmsg_lost)
        yield CounterMetricFamily("oomwatch_kmsg_parse_errors", "Kernel log records that looked like OOM "
                                  "reports but did not parse.", value=snap.kmsg_parse_errors)
        yield CounterMetricFamily("oomwatch_kmsg_rejected_records", "Kernel log records with an OOM line from a "
                                  "syslog facility other than the kernel's (written to /dev/kmsg by a process), "
                                  "ignored.", value=snap.kmsg_rejected)
        yield CounterMetricFamily("oomwatch_oom_kills_counted_from_events", "OOM kills the kernel counted in "
                                  "memory.events that no kernel log record described (overwritten before they "
                                  "were read, or while the agent was down).", value=snap.counted_from_events)
        yield CounterMetricFamily("oomwatch_state_write_errors", "State saves that failed (disk full, "
                                  "read-only).", value=snap.state_errors)
        yield CounterMetricFamily("oomwatch_workloads_dropped", "Workloads whose series were dropped, gone ones "
                                  "first, to stay under the store's cap.", value=snap.workloads_dropped)
        if self.cgroup_parse_errors is not None:
            yield CounterMetricFamily("oomwatch_cgroup_parse_errors", "cgroup file values the kernel would "
                                      "not print (negative, out of range, garbage), read as unknown.",
                                      value=self.cgroup_parse_errors())
        buckets = [("+Inf" if math.isinf(b) else repr(float(b)), n)
                   for b, n in zip(LATENCY_BUCKETS, snap.latency_buckets)]
        buckets.append(("+Inf", snap.latency_count))
        yield HistogramMetricFamily("oomwatch_detection_latency_seconds", "Time from the kernel's kill to "
                                    "the incident being published.", buckets=buckets,
                                    sum_value=snap.latency_sum)
        build = GaugeMetricFamily("oomwatch_build_info", "oomwatch version.", labels=["version"])
        build.add_metric([__version__], 1)
        yield build


def reference_text(collector) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)


@pytest.mark.parametrize("case", GOLDEN, ids=[c.name for c in GOLDEN])
def test_golden_trees_byte_identical_to_prometheus_client(case: Path, tmp_path: Path) -> None:
    with running_agent(golden_config(case, tmp_path), clock=lambda: DETECTED_AT) as agent:
        assert wait_for(lambda: agent.kmsg_alive), agent.kmsg_error
        ours = agent.collector  # what the agent serves
        reference = ReferenceCollector(agent.store, agent.live_workloads, agent.posture.info,
                                       cgroup_parse_errors=lambda: agent.fs.parse_errors)
        content_type, chunks = ours.metrics("text/plain")
        body = b"".join(chunks)
        assert body == reference_text(reference)
        assert content_type == CONTENT_TYPE
        # The golden file holds the same bytes (what the agent serves).
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


def _store() -> Store:
    store = Store(clock=lambda: 1000.0)
    for labels in HOSTILE:
        store.seen(labels)
    workload = Workload(type="k8s-container", cgroup="/k/p/c", namespace="ns", pod='we"ird', container="c\\1")
    try:
        store.publish(_incident("group", "/k/p/c", workload, 3, 1795380009.320870))
        store.publish(_incident("single", "/k/p/c", workload, 1, 1795380019.5))
    except TypeError as exc:  # the Incident model changed shape: this test's helper must follow
        pytest.fail(f"update _incident() to the model: {exc}")
    return store


def test_hostile_label_values_and_odd_numbers_match_prometheus_client() -> None:
    store = _store()

    def live():
        return [(labels, _stats(i)) for i, labels in enumerate(HOSTILE)]

    def info():
        return NodeInfo(kernel='6.1.0 "x"\\y', cgroup_version="2", single_process_oom_kill="unknown")

    ours = OomwatchCollector(store, live, info, cgroup_parse_errors=lambda: 3)
    assert ours.exposition() == reference_text(ReferenceCollector(store, live, info, lambda: 3))
    assert ours.exposition() == reference_text(ours)  # the registry path (collect()) agrees
    text = ours.exposition().decode()
    assert 'pod="we\\"ird"' in text and 'pod="p\\nq"' in text
    assert "oomwatch_cgroup_parse_errors_total 3.0" in text


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
    first = ours._label_text[("ns", "a", "c", "")]
    ours.exposition()
    assert ours._label_text[("ns", "a", "c", "")] is first  # not rebuilt
    store.gone(("ns", "b", "c", ""))
    store.grace_seconds = 0
    store.expire()
    live.pop()
    ours.exposition()
    assert set(ours._label_text) == {("ns", "a", "c", "")}


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
    assert node_level == 8 + 1 + 3 + 4 + 16 + 1


@pytest.mark.tools
@pytest.mark.parametrize("case", GOLDEN, ids=[c.name for c in GOLDEN])
def test_promtool_accepts_the_exposition(case: Path, tmp_path: Path) -> None:
    """The real promtool (Debian's prometheus, installed by scripts/setup-deploy-tools) on what the collector
    writes for a golden tree, with the cgroup parse-error counter and the hostile label values added."""
    promtool = shutil.which("promtool", path=f"{REPO / '.cache/tools/bin'}:{os.environ.get('PATH', '')}")
    assert promtool, "promtool missing: scripts/test installs Debian's prometheus package"
    with running_agent(golden_config(case, tmp_path), clock=lambda: DETECTED_AT) as agent:
        assert wait_for(lambda: agent.kmsg_alive), agent.kmsg_error
        golden = OomwatchCollector(agent.store, agent.live_workloads, agent.posture.info,
                                   cgroup_parse_errors=lambda: 2).exposition()
    store = _store()
    hostile = OomwatchCollector(store, lambda: [(labels, _stats(i)) for i, labels in enumerate(HOSTILE)],
                                lambda: NodeInfo('6.1 "x"', "2", "unknown")).exposition()
    for body in (golden, hostile):
        result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True)
        assert result.returncode == 0 and result.stdout == b"" and result.stderr == b"", result
