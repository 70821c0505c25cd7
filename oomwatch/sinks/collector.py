"""Prometheus custom collector: every metric of CONTRACT, built fresh from current state at each scrape."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from oomwatch import __version__
from oomwatch.model import CgroupStats
from oomwatch.parse.cgroup import EXPORTED_MEMORY_EVENTS
from oomwatch.store import KINDS, LATENCY_BUCKETS, ROLES, Labels, Store

IDENTITY = ["namespace", "pod", "container", "cgroup"]


@dataclass(frozen=True)
class NodeInfo:
    kernel: str
    cgroup_version: str
    single_process_oom_kill: str  # true | false | unknown


class OomwatchCollector(Collector):
    """`live_workloads()` returns (identity labels, CgroupStats) for every live workload cgroup, read now;
    `node_info()` the node's posture. Neither is cached here: a scrape shows the present."""

    def __init__(self, store: Store, live_workloads: Callable[[], Iterable[tuple[Labels, CgroupStats]]],
                 node_info: Callable[[], NodeInfo]) -> None:
        self._store = store
        self._live_workloads = live_workloads
        self._node_info = node_info

    def collect(self) -> Iterator[Metric]:
        snap = self._store.snapshot()
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
        yield kills
        yield killed
        yield last

        oom_group = GaugeMetricFamily("oomwatch_memory_oom_group", "Current memory.oom.group of the "
                                      "workload cgroup (1: an OOM kill takes every process).", labels=IDENTITY)
        limit = GaugeMetricFamily("oomwatch_memory_limit_bytes", "memory.max of the workload cgroup "
                                  "(+Inf when unlimited).", labels=IDENTITY)
        usage = GaugeMetricFamily("oomwatch_memory_usage_bytes", "memory.current of the workload cgroup.",
                                  labels=IDENTITY)
        peak = GaugeMetricFamily("oomwatch_memory_peak_bytes", "memory.peak of the workload cgroup (kernel "
                                 "5.19+).", labels=IDENTITY)
        events = CounterMetricFamily("oomwatch_memory_events", "The kernel's own memory.events counters of "
                                     "the workload cgroup (hierarchical).", labels=IDENTITY + ["event"])
        for labels, stats in sorted(self._live_workloads(), key=lambda item: item[0]):
            if stats.oom_group is not None:
                oom_group.add_metric(list(labels), stats.oom_group)
            if stats.limit_bytes is not None:
                limit.add_metric(list(labels), stats.limit_bytes)
            if stats.usage_bytes is not None:
                usage.add_metric(list(labels), stats.usage_bytes)
            if stats.peak_bytes is not None:
                peak.add_metric(list(labels), stats.peak_bytes)
            if stats.events is not None:
                for name in EXPORTED_MEMORY_EVENTS:
                    if name in stats.events:
                        events.add_metric([*labels, name], stats.events[name])
        yield oom_group
        yield limit
        yield usage
        yield peak
        yield events

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

        yield CounterMetricFamily("oomwatch_kmsg_records", "Kernel log records read.", value=snap.kmsg_records)
        yield CounterMetricFamily("oomwatch_kmsg_lost_records", "Kernel log records overwritten before "
                                  "oomwatch could read them.", value=snap.kmsg_lost)
        yield CounterMetricFamily("oomwatch_kmsg_parse_errors", "Kernel log records that looked like OOM "
                                  "reports but did not parse.", value=snap.kmsg_parse_errors)
        # The store keeps cumulative (`le`) counts, as the exposition wants them.
        buckets = [(_le(bound), n) for bound, n in zip(LATENCY_BUCKETS, snap.latency_buckets)]
        buckets.append(("+Inf", snap.latency_count))
        yield HistogramMetricFamily("oomwatch_detection_latency_seconds", "Time from the kernel's kill to "
                                    "the incident being published.", buckets=buckets,
                                    sum_value=snap.latency_sum)
        build = GaugeMetricFamily("oomwatch_build_info", "oomwatch version.", labels=["version"])
        build.add_metric([__version__], 1)
        yield build


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))
