"""Prometheus metrics: every metric of docs/contract.md, written from current state at each scrape.

The text exposition format (version 0.0.4) is written here directly, byte for byte what prometheus_client's
`generate_latest` writes for the same families (tests/test_collector.py proves it on the golden trees),
because that library's generic path cost more than half of a scrape: it re-escapes and sorts every label of
every series each time. Here a workload's label text is built once, when its label set is first seen, and a
scrape only formats numbers; the body is produced in chunks so that a scrape of 10,000 containers never holds
the whole text at once. prometheus_client is imported only by `collect()`, for callers that want a registry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Optional

from oomwatch import __version__
from oomwatch.model import CgroupStats
from oomwatch.parse.cgroup import EXPORTED_MEMORY_EVENTS
from oomwatch.store import KINDS, LATENCY_BUCKETS, ROLES, Labels, Snapshot, Store

if TYPE_CHECKING:
    from prometheus_client.core import Metric

IDENTITY = ["namespace", "pod", "container", "cgroup"]

# The exposition's media type: the Prometheus text format 0.0.4, what Prometheus, promtool and every
# exporter speak. OpenMetrics is not offered: a client asking for it gets this, which all of them accept.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Series that `--drop-series` can leave out on large fleets (README "How many series").
DROPPABLE = {
    "pods": "the pod-level series of Kubernetes pods (container=\"\"): their kills are counted on the "
            "containers, their memory is the sum of the containers'",
    "memory-events": "oomwatch_memory_events_total (the kernel's memory.events counters, 5 per workload)",
}

_GAUGES = (
    ("oomwatch_memory_oom_group", "Current memory.oom.group of the workload cgroup (1: an OOM kill takes "
     "every process).", "oom_group"),
    ("oomwatch_memory_limit_bytes", "memory.max of the workload cgroup (+Inf when unlimited).",
     "limit_bytes"),
    ("oomwatch_memory_usage_bytes", "memory.current of the workload cgroup.", "usage_bytes"),
    ("oomwatch_memory_peak_bytes", "memory.peak of the workload cgroup (kernel 5.19+).", "peak_bytes"),
    ("oomwatch_memory_working_set_bytes", "memory.current less memory.stat inactive_file, floored at 0 (the "
     "kubelet's working set).", "working_set_bytes"),
)
_PRESSURE_HELP = ("Time some (kind=some) or all (kind=full) non-idle tasks of the workload cgroup were stalled "
                  "waiting for memory (memory.pressure total; absent without PSI).")
_EVENTS_HELP = "The kernel's own memory.events counters of the workload cgroup (hierarchical)."
_LATENCY_HELP = "Time from the kernel's kill to the incident being published."

# Lines per chunk of the body: about 64 KiB of text.
CHUNK_LINES = 512


@dataclass(frozen=True)
class NodeInfo:
    kernel: str
    cgroup_version: str
    single_process_oom_kill: str  # true | false | unknown


_LAST_INFO_HELP = ("The last OOM-kill incident of this workload, explained in one sentence (1; replaced at its "
                   "next incident).")


def escape_label_value(value: str) -> str:
    """The text format's label-value escaping: backslash, newline and double quote."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def format_value(value: float) -> str:
    """A sample value as Go (and so prometheus_client's floatToGoString) writes it: `1.0`, `+Inf`,
    `6.7108864e+07` (Go switches to an exponent beyond 6 integer digits, Python only beyond 16)."""
    d = float(value)
    if math.isinf(d):
        return "+Inf" if d > 0 else "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def _header(name: str, help_text: str, kind: str) -> str:
    escaped = help_text.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {escaped}\n# TYPE {name} {kind}\n"


class _LabelText:
    """One workload's identity labels as exposition text, in the format's (alphabetical) order: `cgroup`,
    `container`, then an extra label (`event`, `kind`) falls between them and `namespace`, `pod`; `role`
    comes last. Built once per label set."""

    __slots__ = ("head", "seen", "tail")

    def __init__(self, labels: Labels) -> None:
        namespace, pod, container, cgroup = (escape_label_value(v) for v in labels)
        self.head = f'cgroup="{cgroup}",container="{container}",'
        self.tail = f'namespace="{namespace}",pod="{pod}"'
        self.seen = 0


class _Lines:
    """Collects text lines and hands them out as UTF-8 chunks."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[str] = []

    def full(self) -> bool:
        return len(self.parts) >= CHUNK_LINES

    def take(self) -> bytes:
        chunk = "".join(self.parts).encode("utf-8")
        self.parts.clear()  # in place: the writer holds a reference to this list
        return chunk


class OomwatchCollector:
    """`live_workloads()` returns (identity labels, CgroupStats) for every live workload cgroup, read now;
    `node_info()` the node's posture; `cgroup_parse_errors()`, when given, the count of cgroup values read
    as unknown. Nothing is cached here but label text: a scrape shows the present.

    `metrics(accept)` is what an HTTP server calls: (content type, body chunks). `collect()` yields the
    same as prometheus_client metric families, for a CollectorRegistry."""

    def __init__(self, store: Store, live_workloads: Callable[[], Iterable[tuple[Labels, CgroupStats]]],
                 node_info: Callable[[], NodeInfo], *,
                 cgroup_parse_errors: Optional[Callable[[], int]] = None, drop: Iterable[str] = ()) -> None:
        self._store = store
        self._live_workloads = live_workloads
        self._node_info = node_info
        self._cgroup_parse_errors = cgroup_parse_errors
        self.drop = frozenset(drop)
        unknown = self.drop - set(DROPPABLE)
        if unknown:
            raise ValueError(f"cannot drop {', '.join(sorted(unknown))}: choose from {', '.join(DROPPABLE)}")
        self._label_text: dict[Labels, _LabelText] = {}
        self._scrapes = 0

    # --- the exposition ------------------------------------------------------------------------------

    def metrics(self, accept_header: str = "") -> tuple[str, Iterable[bytes]]:
        """The /metrics response: content type and the body in chunks (produced as they are consumed)."""
        return CONTENT_TYPE, self._chunks()

    def exposition(self) -> bytes:
        """The whole body at once (tests, tools)."""
        return b"".join(self._chunks())

    def _labels(self, labels: Labels) -> _LabelText:
        text = self._label_text.get(labels)
        if text is None:
            text = self._label_text[labels] = _LabelText(labels)
        text.seen = self._scrapes
        return text

    def _exported(self, labels: Labels) -> bool:
        # labels = (namespace, pod, container, cgroup): a pod's own cgroup has a pod and no container.
        return not ("pods" in self.drop and labels[1] and not labels[2])

    def _chunks(self) -> Iterator[bytes]:
        self._scrapes += 1
        snap = self._store.snapshot()
        out = _Lines()
        parts = out.parts
        fmt = format_value

        workloads = sorted((labels, counters) for labels, counters in snap.workloads.items()
                           if self._exported(labels))
        texts = [self._labels(labels) for labels, _ in workloads]
        parts.append(_header("oomwatch_oom_kills_total", "OOM-kill incidents in which this workload lost at "
                             "least one process.", "counter"))
        for text, (_, counters) in zip(texts, workloads):
            for kind in KINDS:
                parts.append(f'oomwatch_oom_kills_total{{{text.head}kind="{kind}",{text.tail}}} '
                             f'{fmt(counters.kills[kind])}\n')
            if out.full():
                yield out.take()
        parts.append(_header("oomwatch_oom_killed_processes_total", "Processes killed by the OOM killer, "
                             "each pid once; role=collateral are those memory.oom.group took along.",
                             "counter"))
        for text, (_, counters) in zip(texts, workloads):
            for role in ROLES:
                parts.append(f'oomwatch_oom_killed_processes_total{{{text.head}{text.tail},role="{role}"}} '
                             f'{fmt(counters.killed[role])}\n')
            if out.full():
                yield out.take()
        parts.append(_header("oomwatch_last_oom_kill_timestamp_seconds", "Time of the last OOM-kill incident "
                             "of this workload.", "gauge"))
        for text, (_, counters) in zip(texts, workloads):
            if counters.last_kill is not None:
                parts.append(f"oomwatch_last_oom_kill_timestamp_seconds{{{text.head}{text.tail}}} "
                             f"{fmt(counters.last_kill)}\n")
        parts.append(_header("oomwatch_last_oom_kill_info", _LAST_INFO_HELP, "gauge"))
        for text, (_, counters) in zip(texts, workloads):
            if counters.last_incident is not None:
                kind, scope, explanation = counters.last_incident
                parts.append(f'oomwatch_last_oom_kill_info{{{text.head}explanation="{escape_label_value(explanation)}",'
                             f'kind="{kind}",{text.tail},scope="{scope}"}} 1.0\n')
            if out.full():
                yield out.take()
        del workloads, texts

        live = sorted(((labels, stats) for labels, stats in self._live_workloads() if self._exported(labels)),
                      key=lambda item: item[0])
        texts = [self._labels(labels) for labels, _ in live]
        for name, help_text, attr in _GAUGES:
            parts.append(_header(name, help_text, "gauge"))
            for text, (_, stats) in zip(texts, live):
                value = getattr(stats, attr)
                if value is not None:
                    parts.append(f"{name}{{{text.head}{text.tail}}} {fmt(value)}\n")
                if out.full():
                    yield out.take()
        if "memory-events" not in self.drop:
            parts.append(_header("oomwatch_memory_events_total", _EVENTS_HELP, "counter"))
            for text, (_, stats) in zip(texts, live):
                events = stats.events
                if events is not None:
                    for event in EXPORTED_MEMORY_EVENTS:
                        if event in events:
                            parts.append(f'oomwatch_memory_events_total{{{text.head}event="{event}",'
                                         f'{text.tail}}} {fmt(events[event])}\n')
                if out.full():
                    yield out.take()
        parts.append(_header("oomwatch_memory_pressure_seconds_total", _PRESSURE_HELP, "counter"))
        for text, (_, stats) in zip(texts, live):
            pressure = stats.pressure
            if pressure is not None:
                for kind in ("some", "full"):
                    seconds = pressure.total_seconds(kind)
                    if seconds is not None:
                        parts.append(f'oomwatch_memory_pressure_seconds_total{{{text.head}kind="{kind}",'
                                     f'{text.tail}}} {fmt(seconds)}\n')
            if out.full():
                yield out.take()
        del live, texts
        self._forget_label_text()

        parts.extend(self._node_lines(snap))
        yield out.take()

    def _forget_label_text(self) -> None:
        """Drop the label text of workloads this scrape did not show (gone past their grace period)."""
        current = self._scrapes
        if any(text.seen != current for text in self._label_text.values()):
            self._label_text = {k: v for k, v in self._label_text.items() if v.seen == current}

    def _node_lines(self, snap: Snapshot) -> list[str]:
        fmt = format_value
        lines = [_header("oomwatch_node_oom_kills_total", "OOM-kill incidents on this node.", "counter")]
        lines += [f'oomwatch_node_oom_kills_total{{kind="{kind}",scope="{scope}"}} {fmt(n)}\n'
                  for (kind, scope), n in sorted(snap.node_kills.items())]
        info = self._node_info()
        lines.append(_header("oomwatch_node_info", "The node's OOM posture.", "gauge"))
        lines.append(f'oomwatch_node_info{{cgroup_version="{escape_label_value(info.cgroup_version)}",'
                     f'kernel="{escape_label_value(info.kernel)}",'
                     f'single_process_oom_kill="{escape_label_value(info.single_process_oom_kill)}"}} 1.0\n')
        for name, help_text, value in self._node_counters(snap):
            lines.append(_header(name, help_text, "counter"))
            lines.append(f"{name} {fmt(value)}\n")
        lines.append(_header("oomwatch_detection_latency_seconds", _LATENCY_HELP, "histogram"))
        # The store keeps cumulative (`le`) counts, as the exposition wants them.
        for bound, n in zip(LATENCY_BUCKETS, snap.latency_buckets):
            lines.append(f'oomwatch_detection_latency_seconds_bucket{{le="{_le(bound)}"}} {fmt(n)}\n')
        lines.append(f'oomwatch_detection_latency_seconds_bucket{{le="+Inf"}} {fmt(snap.latency_count)}\n')
        lines.append(f"oomwatch_detection_latency_seconds_count {fmt(snap.latency_count)}\n")
        lines.append(f"oomwatch_detection_latency_seconds_sum {fmt(snap.latency_sum)}\n")
        lines.append(_header("oomwatch_build_info", "oomwatch version.", "gauge"))
        lines.append(f'oomwatch_build_info{{version="{escape_label_value(__version__)}"}} 1.0\n')
        return lines

    def _node_counters(self, snap: Snapshot) -> list[tuple[str, str, float]]:
        counters = [
            ("oomwatch_kmsg_records_total", "Kernel log records read.", snap.kmsg_records),
            ("oomwatch_kmsg_lost_records_total", "Kernel log records overwritten before oomwatch could read "
             "them.", snap.kmsg_lost),
            ("oomwatch_kmsg_parse_errors_total", "Kernel log records that looked like OOM reports but did "
             "not parse.", snap.kmsg_parse_errors),
        ]
        counters += [
            ("oomwatch_kmsg_rejected_records_total", "Kernel log records with an OOM line from a syslog facility "
             "other than the kernel's (written to /dev/kmsg by a process), ignored.", snap.kmsg_rejected),
            ("oomwatch_oom_kills_counted_from_events_total", "OOM kills the kernel counted in memory.events that "
             "no kernel log record described (overwritten before they were read, or while the agent was "
             "down).", snap.counted_from_events),
            ("oomwatch_state_write_errors_total", "State saves that failed (disk full, read-only).",
             snap.state_errors),
            ("oomwatch_workloads_dropped_total", "Workloads whose series were dropped, gone ones first, to stay "
             "under the store's cap.", snap.workloads_dropped),
        ]
        if self._cgroup_parse_errors is not None:
            counters.append(("oomwatch_cgroup_parse_errors_total", "cgroup file values the kernel would not "
                             "print (negative, out of range, garbage), read as unknown.",
                             self._cgroup_parse_errors()))
        return counters

    # --- prometheus_client --------------------------------------------------------------------------

    def collect(self) -> Iterator["Metric"]:
        """The same metrics as prometheus_client families, for a CollectorRegistry (slower than `metrics()`:
        prometheus_client formats each series generically). tests/test_collector.py checks that
        `generate_latest` of these is byte for byte the exposition."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        snap = self._store.snapshot()
        kills = CounterMetricFamily("oomwatch_oom_kills", "OOM-kill incidents in which this workload lost at "
                                    "least one process.", labels=IDENTITY + ["kind"])
        killed = CounterMetricFamily("oomwatch_oom_killed_processes", "Processes killed by the OOM killer, "
                                     "each pid once; role=collateral are those memory.oom.group took along.",
                                     labels=IDENTITY + ["role"])
        last = GaugeMetricFamily("oomwatch_last_oom_kill_timestamp_seconds", "Time of the last OOM-kill "
                                 "incident of this workload.", labels=IDENTITY)
        for labels, counters in sorted(snap.workloads.items()):
            if not self._exported(labels):
                continue
            for kind in KINDS:
                kills.add_metric([*labels, kind], counters.kills[kind])
            for role in ROLES:
                killed.add_metric([*labels, role], counters.killed[role])
            if counters.last_kill is not None:
                last.add_metric(list(labels), counters.last_kill)
        info = GaugeMetricFamily("oomwatch_last_oom_kill_info", _LAST_INFO_HELP,
                                 labels=IDENTITY + ["explanation", "kind", "scope"])
        for labels, counters in sorted(snap.workloads.items()):
            if self._exported(labels) and counters.last_incident is not None:
                info.add_metric([*labels, counters.last_incident[2], counters.last_incident[0],
                                 counters.last_incident[1]], 1)
        yield from (kills, killed, last, info)
        gauges = [GaugeMetricFamily(name, help_text, labels=IDENTITY) for name, help_text, _ in _GAUGES]
        events = CounterMetricFamily("oomwatch_memory_events", _EVENTS_HELP, labels=IDENTITY + ["event"])
        pressure = CounterMetricFamily("oomwatch_memory_pressure_seconds", _PRESSURE_HELP,
                                       labels=IDENTITY + ["kind"])
        for labels, stats in sorted(self._live_workloads(), key=lambda item: item[0]):
            if not self._exported(labels):
                continue
            for family, (_, _, attr) in zip(gauges, _GAUGES):
                value = getattr(stats, attr)
                if value is not None:
                    family.add_metric(list(labels), value)
            for name in EXPORTED_MEMORY_EVENTS:
                if stats.events is not None and name in stats.events:
                    events.add_metric([*labels, name], stats.events[name])
            if stats.pressure is not None:
                for kind in ("some", "full"):
                    seconds = stats.pressure.total_seconds(kind)
                    if seconds is not None:
                        pressure.add_metric([*labels, kind], seconds)
        yield from gauges
        if "memory-events" not in self.drop:
            yield events
        yield pressure
        node = CounterMetricFamily("oomwatch_node_oom_kills", "OOM-kill incidents on this node.",
                                   labels=["kind", "scope"])
        for (kind, scope), n in sorted(snap.node_kills.items()):
            node.add_metric([kind, scope], n)
        yield node
        info = self._node_info()
        node_info = GaugeMetricFamily("oomwatch_node_info", "The node's OOM posture.",
                                      labels=["kernel", "cgroup_version", "single_process_oom_kill"])
        node_info.add_metric([info.kernel, info.cgroup_version, info.single_process_oom_kill], 1)
        yield node_info
        for name, help_text, value in self._node_counters(snap):
            yield CounterMetricFamily(name[: -len("_total")], help_text, value=value)
        buckets = [(_le(bound), n) for bound, n in zip(LATENCY_BUCKETS, snap.latency_buckets)]
        buckets.append(("+Inf", snap.latency_count))
        yield HistogramMetricFamily("oomwatch_detection_latency_seconds", _LATENCY_HELP, buckets=buckets,
                                    sum_value=snap.latency_sum)
        build = GaugeMetricFamily("oomwatch_build_info", "oomwatch version.", labels=["version"])
        build.add_metric([__version__], 1)
        yield build


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))
