"""Prometheus metrics: every metric of docs/contract.md, written from current state at each scrape.

`FAMILIES` is the one list of the metric families: name, type, help, labels and where each sample's value
comes from. Both outputs are driven by it: the text exposition format (version 0.0.4), written here directly,
and `collect()`, the same families as prometheus_client objects for a CollectorRegistry.

The exposition is byte for byte what prometheus_client's `generate_latest` writes for the same families
(tests/test_collector.py proves it on the golden trees), because that library's generic path cost more than
half of a scrape: it re-escapes and sorts every label of every series each time. Here a workload's label text
is built once, when its label set is first seen, and a scrape only formats numbers; the body is produced in
chunks so that a scrape of 10,000 containers never holds the whole text at once. prometheus_client is imported
only by `collect()`.

Names come from the node (cgroup directory names, runtime annotations): anything a cgroup name can hold is
exported safely (`label_value`), and one workload whose series cannot be written is left out of the scrape,
logged once and counted (`oomwatch_workloads_not_exported_total`): it never fails the scrape.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from operator import attrgetter
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

from oomwatch import __version__
from oomwatch.deaths import CAUSES
from oomwatch.holders import MEMORY_TYPES
from oomwatch.model import CgroupStats, NodeInfo, Workload
from oomwatch.parse.cgroup import EXPORTED_MEMORY_EVENTS
from oomwatch.store import KINDS, LATENCY_BUCKETS, ROLES, SCOPES, Labels, Snapshot, WorkloadCounters
from oomwatch.names import as_logged
from oomwatch.textsafe import CONTROLS

if TYPE_CHECKING:
    from prometheus_client.core import Metric

log = logging.getLogger(__name__)

IDENTITY = ("namespace", "pod", "container", "cgroup")

# The exposition's media type: the Prometheus text format 0.0.4, what Prometheus, promtool and every
# exporter speak. OpenMetrics is not offered: a client asking for it gets this, which all of them accept.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Series that `--drop-series` can leave out on large fleets (README "How many series").
DROPPABLE = {
    "pods": "the pod-level series of Kubernetes pods (container=\"\"): their kills are counted on the "
            "containers, their memory is the sum of the containers'",
    "memory-events": "oomwatch_memory_events_total (the kernel's memory.events counters, 5 per workload)",
}

# Lines per chunk of the body: about 64 KiB of text.
CHUNK_LINES = 512


# --- label values --------------------------------------------------------------------------------------

# The one policy for every label value the collector exports (docs/contract.md "Label values"): names a
# tenant chose (cgroups, comms, an ownerReference's kind and name) are bounded, carry no control character,
# and two different names never become one value.
LABEL_VALUE_MAX = 1024  # characters: a Kubernetes name is at most 253, a workload's cgroup path far less
# A control character as `\xNN` (C0, DEL) or `\uNNNN` (C1, bidi controls, line separators); a backslash that
# would read as one of those escapes (or as `\x5c`) is itself written `\x5c`.
_LABEL_ESCAPED = re.compile(f"[{CONTROLS}]|\\\\(?=x(?:[01][0-9a-f]|7f|5c)"
                            "|u(?:00[89][0-9a-f]|061c|200[ef]|202[89a-e]|206[6-9]))")


def _label_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}"


def label_value(value: str) -> str:
    """A name as a label value, by the one policy of docs/contract.md "Label values": bytes that are not UTF-8
    (read with surrogate escapes) written `\\xNN`, as the kernel log writes them (oomwatch.names.as_logged);
    control characters written `\\xNN` (below 0x80) or `\\uNNNN`, and a backslash that would read as such an
    escape written `\\x5c`, so that no two names share a value; longer than LABEL_VALUE_MAX characters, cut
    there with a marker that says how long it was and names it by its SHA-256 (a cut value is longer than any
    uncut one). The exposition then escapes only what the format says (`\\`, `"`)."""
    if value.isascii() and value.isprintable() and "\\" not in value and len(value) <= LABEL_VALUE_MAX:
        return value  # (nearly every name: a scrape calls this for each job_info label)
    if not value.isascii():
        value = as_logged(value)
    value = _LABEL_ESCAPED.sub(_label_escape, value)
    if len(value) > LABEL_VALUE_MAX:
        import hashlib  # here, not at the start: it loads OpenSSL's libcrypto (0.1-0.2 s under emulation)

        digest = hashlib.sha256(value.encode("utf-8")).hexdigest()[:16]
        value = f"{value[:LABEL_VALUE_MAX]}…[cut: {len(value)} characters, sha256 {digest}]"
    return value


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


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


# --- the table of metric families ----------------------------------------------------------------------

# A node sample: the sample's name, its labels, its value.
NodeSample = tuple[str, dict[str, str], float]


@dataclass(frozen=True)
class AgentStatus:
    """What the agent says of itself at a scrape (its /healthz, as series): `checks` maps each of AGENT_CHECKS
    it runs to whether it is fine; the counts are its parts' own."""

    checks: dict[str, bool]
    failed_scrapes: int = 0
    unwatched: dict[str, int] = field(default_factory=dict)  # cgroups not fully watched now, by reason
    events_file_errors: int = 0
    workloads_over_cap: int = 0


# /healthz's checks (bounded: a label value): each 1 while fine, 0 while not.
AGENT_CHECKS = ("kmsg", "cgroups", "scrape", "workloads", "state", "cgroup_watch", "events_file", "proc_connector")
UNWATCHED_REASONS = ("inotify_watches", "unreadable")


@dataclass(frozen=True)
class NodeView:
    """What the node-level families read at one scrape."""

    snap: Snapshot
    info: NodeInfo
    cgroup_parse_errors: Optional[int]
    not_exported: int
    agent: Optional[AgentStatus] = None  # None: not an agent (a collector over a replay, a tool)
    # The pipeline's View.workloads, (cgroup, series labels, Workload) of each live workload with series: what
    # oomwatch_workload_job_info reads. None: not given (that family is left out).
    workloads: Optional[Sequence[tuple[str, Labels, Any]]] = None


def _agent(samples: Callable[[AgentStatus], list]) -> Callable[[NodeView], Optional[list]]:
    """A family of the agent's own status: absent where there is no agent."""
    return lambda view: None if view.agent is None else samples(view.agent)


@dataclass(frozen=True)
class Family:
    """One metric family. `source` says what its samples are read from: "counters" (the store's counters of
    every workload it knows), "live" (the CgroupStats of every live workload cgroup, read now) or "node" (one
    NodeView).

    A per-workload family carries IDENTITY plus `labels`. Without labels of its own, `values(row)` is the
    value of the workload's one series (None: no series). With them, the labels' values are fixed: `keys`
    lists one key per series a workload can have (the label's value, or a tuple of the labels' values), and
    `values(row)` maps keys to values (None, or a key it lacks: no such series).
    A node family's `samples(view)` gives its NodeSamples, or None when the family is not exported at all."""

    name: str  # as exposed: counters end in `_total`
    type: str  # counter | gauge | histogram
    help: str
    source: str
    labels: tuple[str, ...] = ()
    keys: tuple[Any, ...] = ()
    values: Optional[Callable[[Any], Any]] = None
    samples: Optional[Callable[[NodeView], Optional[Iterable[NodeSample]]]] = None
    droppable: Optional[str] = None  # the --drop-series choice that leaves this family out

    @property
    def base_name(self) -> str:
        """The name prometheus_client gives the family (a counter's without `_total`)."""
        return self.name[: -len("_total")] if self.type == "counter" else self.name

    def series(self, row: Any) -> list[tuple[tuple[str, ...], float]]:
        """(values of `labels`, value) of each series of one workload (per-workload families)."""
        values = self.values(row)  # type: ignore[misc]
        if not self.keys:
            return [] if values is None else [((), values)]
        if values is None:
            return []
        return [((key,) if isinstance(key, str) else key, values[key]) for key in self.keys
                if values.get(key) is not None]


def _counter(name: str, help_text: str, value: Callable[[NodeView], Optional[float]]) -> Family:
    """A node-level counter without labels; absent where `value` is None."""
    def samples(view: NodeView) -> Optional[list[NodeSample]]:
        n = value(view)
        return None if n is None else [(name, {}, n)]
    return Family(name, "counter", help_text, "node", samples=samples)


def _gauge(name: str, help_text: str, attr: str) -> Family:
    return Family(name, "gauge", help_text, "live", values=attrgetter(attr))


def _pressure(stats: CgroupStats) -> Optional[dict[str, Optional[float]]]:
    pressure = stats.pressure
    if pressure is None:
        return None
    return {"some": pressure.total_seconds("some"), "full": pressure.total_seconds("full")}


# oomwatch_last_oom_kill_info: one series per workload, at the (kind, scope) of its last incident.
_INCIDENT_KEYS = tuple((kind, scope) for kind in KINDS for scope in SCOPES)
_ONE = {key: {key: 1.0} for key in _INCIDENT_KEYS}


def _last_incident(counters: WorkloadCounters) -> Optional[dict[tuple[str, str], float]]:
    last = counters.last_incident
    return None if last is None else _ONE.get((last[0], last[1]))


def _deaths(counters: WorkloadCounters) -> Optional[Mapping[str, int]]:
    # From the workload's first death on, every cause (at 0 but one): issue 14's budget of 16 series per
    # workload holds for the many that never die so.
    deaths = counters.deaths
    return deaths if any(deaths.values()) else None


def _node_info(view: NodeView) -> list[NodeSample]:
    info = view.info
    return [("oomwatch_node_info", {"cgroup_version": info.cgroup_version, "kernel": info.kernel,
                                    "single_process_oom_kill": info.single_process_oom_kill}, 1.0)]


# oomwatch_workload_job_info (issue 22): the job each kill broke, joinable with every per-workload series on
# namespace/pod (Kubernetes; one series per pod) or cgroup (a Slurm job or step). Bounded: at most one series
# per workload with series (so within the store's cap of 20,000), each label one value per job, owner or workload.
JOB_INFO_LABELS = ("cgroup", "job_kind", "job_name", "namespace", "owner_kind", "owner_name", "pod")


def job_info_labels(workloads: Iterable[tuple[str, Labels, Workload]]) -> list[dict[str, str]]:
    """The label sets of oomwatch_workload_job_info, in label order: a Kubernetes pod whose controlling owner or
    training job is known (job_kind/job_name: its training or batch job, else its controlling owner; owner_*:
    the controlling owner), and each Slurm job or step cgroup (job_kind SlurmJob, job_name the job id)."""
    out: dict[tuple[str, str, str], dict[str, str]] = {}
    for _path, labels, workload in workloads:
        namespace, pod, _container, cgroup = labels
        owner = workload.owner or {}
        if workload.is_kubernetes and pod:
            job = workload.job or owner
            if not job:
                continue
            key = (namespace, pod, "")
        elif workload.type == "slurm" and workload.slurm_job:
            job, key = {"kind": "SlurmJob", "name": workload.slurm_job}, ("", "", cgroup)
        else:
            continue
        series = {"cgroup": key[2], "job_kind": job.get("kind", ""), "job_name": job.get("name", ""),
                  "namespace": key[0], "owner_kind": owner.get("kind", ""), "owner_name": owner.get("name", ""),
                  "pod": key[1]}
        # One series per pod (its containers share it); were two of its cgroups told different jobs (the API
        # server answered between them), the least in label order, whatever the order they come in.
        if key not in out or tuple(series.values()) < tuple(out[key].values()):
            out[key] = series
    return [out[key] for key in sorted(out)]


def _job_info(view: NodeView) -> Optional[list[NodeSample]]:
    if view.workloads is None:
        return None
    return [("oomwatch_workload_job_info", labels, 1.0) for labels in job_info_labels(view.workloads)]


def _latency(view: NodeView) -> list[NodeSample]:
    # The store keeps cumulative (`le`) counts, as the exposition wants them.
    snap = view.snap
    name = "oomwatch_detection_latency_seconds"
    samples: list[NodeSample] = [(f"{name}_bucket", {"le": _le(bound)}, n)
                                 for bound, n in zip(LATENCY_BUCKETS, snap.latency_buckets)]
    samples.append((f"{name}_bucket", {"le": "+Inf"}, snap.latency_count))
    samples.append((f"{name}_count", {}, snap.latency_count))
    samples.append((f"{name}_sum", {}, snap.latency_sum))
    return samples


FAMILIES: tuple[Family, ...] = (
    Family("oomwatch_oom_kills_total", "counter", "OOM-kill incidents in which this workload lost at least "
           "one process.", "counters", labels=("kind",), keys=KINDS, values=attrgetter("kills")),
    Family("oomwatch_oom_killed_processes_total", "counter", "Processes killed by the OOM killer, each pid "
           "once; role=collateral are those memory.oom.group took along.", "counters", labels=("role",),
           keys=ROLES, values=attrgetter("killed")),
    Family("oomwatch_last_oom_kill_timestamp_seconds", "gauge", "Time of the last OOM-kill incident of this "
           "workload.", "counters", values=attrgetter("last_kill")),
    # Bounded labels only: the incident's explanation (a sentence with pids) is in /incidents and the events
    # file, not in a label, where every incident would start a new series.
    Family("oomwatch_last_oom_kill_info", "gauge", "The kind and scope of the last OOM-kill incident of this "
           "workload (1; replaced at its next incident). Its explanation is in /incidents and the events "
           "file.",
           "counters", labels=("kind", "scope"), keys=_INCIDENT_KEYS, values=_last_incident),
    Family("oomwatch_last_oom_kill_memory_bytes", "gauge", "What held the memory of the OOM cgroup at this "
           "workload's last OOM-kill incident, by type (the kernel's report; absent where the log did not "
           "say). The verdict and the largest processes are in /incidents and the events file.", "counters",
           labels=("type",), keys=tuple(MEMORY_TYPES), values=attrgetter("last_memory")),
    # Not OOM kills: the verdicts on the workload's deaths (oomwatch.deaths); only cause=kernel-oom deaths are
    # the kernel's kills, and those are counted in oomwatch_oom_kills_total already.
    Family("oomwatch_deaths_total", "counter", "Deaths of this workload's processes that looked like memory "
           "deaths (a SIGKILL, or its main process's end after a GPU or allocation failure), by verdict: "
           "kernel-oom, userspace (a SIGKILL no kernel OOM kill explains), gpu-oom, alloc-failure, not-oom (a "
           "status that will say OOMKilled, stale); from its first such death on. Each death is a line of the "
           "events file.",
           "counters", labels=("cause",), keys=CAUSES, values=_deaths),
    _gauge("oomwatch_memory_oom_group", "Current memory.oom.group of the workload cgroup (1: an OOM kill "
           "takes every process).", "oom_group"),
    _gauge("oomwatch_memory_limit_bytes", "memory.max of the workload cgroup (+Inf when unlimited).",
           "limit_bytes"),
    _gauge("oomwatch_memory_usage_bytes", "memory.current of the workload cgroup.", "usage_bytes"),
    _gauge("oomwatch_memory_peak_bytes", "memory.peak of the workload cgroup (kernel 5.19+).", "peak_bytes"),
    _gauge("oomwatch_memory_working_set_bytes", "memory.current less memory.stat inactive_file, floored at 0 "
           "(the kubelet's working set).", "working_set_bytes"),
    Family("oomwatch_memory_events_total", "counter", "The kernel's own memory.events counters of the "
           "workload cgroup (hierarchical).", "live", labels=("event",), keys=EXPORTED_MEMORY_EVENTS,
           values=attrgetter("events"), droppable="memory-events"),
    Family("oomwatch_memory_pressure_seconds_total", "counter", "Time some (kind=some) or all (kind=full) "
           "non-idle tasks of the workload cgroup were stalled waiting for memory (memory.pressure total; "
           "absent without PSI).", "live", labels=("kind",), keys=("some", "full"), values=_pressure),
    Family("oomwatch_node_oom_kills_total", "counter", "OOM-kill incidents on this node.", "node",
           labels=("kind", "scope"),
           samples=lambda view: [("oomwatch_node_oom_kills_total", {"kind": kind, "scope": scope}, n)
                                 for (kind, scope), n in sorted(view.snap.node_kills.items())]),
    Family("oomwatch_node_info", "gauge", "The node's OOM posture.", "node",
           labels=("cgroup_version", "kernel", "single_process_oom_kill"), samples=_node_info),
    Family("oomwatch_workload_job_info", "gauge", "The job of a workload (1): a Kubernetes pod's training or batch "
           "job, else its controlling owner (job_kind, job_name), and that owner (owner_kind, owner_name); a Slurm "
           "job or step's job (SlurmJob, its id). Join on namespace and pod, or on cgroup.", "node",
           labels=JOB_INFO_LABELS, samples=_job_info),
    _counter("oomwatch_kmsg_records_total", "Kernel log records read.", lambda v: v.snap.kmsg_records),
    _counter("oomwatch_kmsg_lost_records_total", "Kernel log records overwritten before oomwatch could read "
             "them.", lambda v: v.snap.kmsg_lost),
    _counter("oomwatch_kmsg_parse_errors_total", "Kernel log records that looked like OOM reports but did "
             "not parse.", lambda v: v.snap.kmsg_parse_errors),
    _counter("oomwatch_kmsg_rejected_records_total", "Kernel log records with an OOM line from a syslog "
             "facility other than the kernel's (written to /dev/kmsg by a process), ignored.",
             lambda v: v.snap.kmsg_rejected),
    _counter("oomwatch_oom_kills_counted_from_events_total", "OOM kills the kernel counted in memory.events "
             "that no kernel log record described (overwritten before they were read, or while the agent was "
             "down).", lambda v: v.snap.counted_from_events),
    _counter("oomwatch_state_write_errors_total", "State saves that failed (disk full, read-only).",
             lambda v: v.snap.state_errors),
    _counter("oomwatch_workloads_dropped_total", "Workloads whose series were dropped, gone ones first, to "
             "stay under the store's cap.", lambda v: v.snap.workloads_dropped),
    _counter("oomwatch_workloads_not_exported_total", "Workloads left out of /metrics because their series "
             "could not be written (or would repeat another workload's labels), each counted and logged "
             "once.",
             lambda v: v.not_exported),
    _counter("oomwatch_cgroup_parse_errors_total", "cgroup file values the kernel would not print (negative, "
             "out of range, garbage), read as unknown.", lambda v: v.cgroup_parse_errors),
    Family("oomwatch_agent_healthy", "gauge", "Each check of the agent's /healthz: 1 while fine, 0 while not "
           "(kmsg, cgroups, scrape, workloads: /healthz is 503; state, cgroup_watch, events_file, proc_connector: "
           "degraded, named in /healthz). A blind agent says so here too.", "node", labels=("check",),
           samples=_agent(lambda a: [("oomwatch_agent_healthy", {"check": c}, 1.0 if a.checks[c] else 0.0)
                                     for c in AGENT_CHECKS if c in a.checks])),
    _counter("oomwatch_scrape_failures_total", "Scrapes that failed (an error while writing the body, or one "
             "still running past the write timeout); /healthz is 503 until one succeeds.",
             lambda v: None if v.agent is None else v.agent.failed_scrapes),
    Family("oomwatch_cgroups_unwatched", "gauge", "cgroups the agent does not fully watch now: out of inotify "
           "watches (still read at each scrape) or unreadable to it.", "node", labels=("reason",),
           samples=_agent(lambda a: [("oomwatch_cgroups_unwatched", {"reason": r}, float(a.unwatched.get(r, 0)))
                                     for r in UNWATCHED_REASONS])),
    _counter("oomwatch_events_file_write_errors_total", "Incidents the events file could not take when "
             "published (some are written later, once it works again).",
             lambda v: None if v.agent is None else v.agent.events_file_errors),
    Family("oomwatch_workloads_over_cap", "gauge", "Live workloads without series: the store is full of live "
           "ones (20,000).", "node",
           samples=_agent(lambda a: [("oomwatch_workloads_over_cap", {}, float(a.workloads_over_cap))])),
    Family("oomwatch_detection_latency_seconds", "histogram", "Time from the kernel's kill to the incident "
           "being published.", "node", labels=("le",), samples=_latency),
    Family("oomwatch_build_info", "gauge", "oomwatch version.", "node", labels=("version",),
           samples=lambda view: [("oomwatch_build_info", {"version": __version__}, 1.0)]),
)


def _labels_of(item: tuple[Labels, Any]) -> Labels:
    return item[0]


def _header(family: Family) -> str:
    escaped = family.help.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {family.name} {escaped}\n# TYPE {family.name} {family.type}\n"


def _label_pairs(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{escape_label_value(label_value(v))}"' for k, v in sorted(labels.items()))


def _key_texts(family: Family) -> tuple[tuple[Any, str, str, str], ...]:
    """(key, front, middle, end) for each key of a per-workload family: its own labels as text, placed where the
    format's alphabetical order puts them among the identity labels ([front], `cgroup`, `container`, [middle],
    `namespace`, `pod`, [end])."""
    for name in family.labels:
        if not (name < "cgroup" or "container" < name < "namespace" or name > "pod"):
            raise ValueError(f"{family.name}: label {name!r} sorts among the identity labels")
    texts = []
    for key in family.keys:
        pairs = sorted(zip(family.labels, (key,) if isinstance(key, str) else key))
        front = "".join(f'{k}="{escape_label_value(v)}",' for k, v in pairs if k < "cgroup")
        middle = "".join(f'{k}="{escape_label_value(v)}",' for k, v in pairs if "container" < k < "namespace")
        end = "".join(f',{k}="{escape_label_value(v)}"' for k, v in pairs if k > "pod")
        texts.append((key, front, middle, end))
    return tuple(texts)


class _LabelText:
    """One workload's identity labels as exposition text, in the format's (alphabetical) order: `cgroup`,
    `container`, then a family's own label (`event`, `kind`) falls between them and `namespace`, `pod`; `role`
    and `scope` come last. Built once per label set; `key` is the exported identity (what two label sets
    could share once bytes that are not UTF-8 are written `\\xNN`)."""

    __slots__ = ("head", "key", "reported", "seen", "tail")

    def __init__(self, labels: Labels) -> None:
        namespace, pod, container, cgroup = (escape_label_value(label_value(v)) for v in labels)
        self.head = f'cgroup="{cgroup}",container="{container}",'
        self.tail = f'namespace="{namespace}",pod="{pod}"'
        self.head.encode("utf-8")  # what the body will do: fail here, for this workload alone
        self.tail.encode("utf-8")
        self.key = self.head + self.tail
        self.seen = 0
        self.reported = False  # left out of a scrape once already: logged and counted


class _Unexportable:
    """A label set that cannot be written at all; logged and counted once, left out while it stays."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen = 0


class _Lines:
    """Collects text lines and hands them out as UTF-8 chunks."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[str] = []

    def take(self) -> bytes:
        chunk = "".join(self.parts).encode("utf-8")
        self.parts.clear()  # in place: the writer holds a reference to this list
        return chunk


class OomwatchCollector:
    """`store.snapshot()` gives the counters (any object with that method: the agent may hand a fixed one);
    `live_workloads()` returns (identity labels, CgroupStats) for every live workload cgroup, read now;
    `node_info()` the node's posture; `cgroup_parse_errors()`, when given, the count of cgroup values read
    as unknown. Nothing is cached here but label text: a scrape shows the present.

    `metrics(accept)` is what an HTTP server calls: (content type, body chunks). `collect()` yields the
    same as prometheus_client metric families, for a CollectorRegistry."""

    def __init__(self, store: Any, live_workloads: Callable[[], Iterable[tuple[Labels, CgroupStats]]],
                 node_info: Callable[[], NodeInfo], *,
                 cgroup_parse_errors: Optional[Callable[[], int]] = None, drop: Iterable[str] = (),
                 agent_status: Optional[Callable[[], AgentStatus]] = None,
                 workloads: Optional[Callable[[], Sequence[tuple[str, Labels, Any]]]] = None) -> None:
        self._store = store
        self._workloads = workloads  # the View's workloads, for oomwatch_workload_job_info (None: left out)
        self._agent_status = agent_status
        self._live_workloads = live_workloads
        self._node_info = node_info
        self._cgroup_parse_errors = cgroup_parse_errors
        self.drop = frozenset(drop)
        unknown = self.drop - set(DROPPABLE)
        if unknown:
            raise ValueError(f"cannot drop {', '.join(sorted(unknown))}: choose from {', '.join(DROPPABLE)}")
        self.families = tuple(f for f in FAMILIES if f.droppable not in self.drop)
        self._key_texts = {f.name: _key_texts(f) for f in self.families if f.source != "node"}
        self._label_text: dict[Labels, _LabelText | _Unexportable] = {}
        self._scrapes = 0
        self._malformed: set[str] = set()
        self.not_exported = 0  # workloads left out, each counted once while its labels stay

    @property
    def label_texts(self) -> Mapping[Labels, object]:
        """The label text kept per workload (built at its first scrape, dropped once its series are gone), as a
        read-only mapping."""
        return MappingProxyType(self._label_text)

    # --- rows ----------------------------------------------------------------------------------------

    def _exported(self, labels: Labels) -> bool:
        # labels = (namespace, pod, container, cgroup): a pod's own cgroup has a pod and no container.
        return not ("pods" in self.drop and labels[1] and not labels[2])

    def _labels(self, labels: Labels) -> Optional[_LabelText]:
        text = self._label_text.get(labels)
        if text is None:
            try:
                text = _LabelText(labels)
            except Exception as exc:  # a name no fix above foresaw: this workload only, never the scrape
                self._report(labels, f"its labels cannot be written ({exc!r})")
                text = _Unexportable()
            self._label_text[labels] = text
        text.seen = self._scrapes
        return text if isinstance(text, _LabelText) else None

    def _left_out(self, labels: Labels, text: _LabelText, why: str) -> None:
        """This workload is left out of this scrape: logged and counted the first time."""
        if not text.reported:
            text.reported = True
            self._report(labels, why)

    def _report(self, labels: Labels, why: str) -> None:
        self.not_exported += 1
        log.warning("workload %r left out of /metrics: %s", labels, why)

    def _rows(self, items: Iterable[tuple[Labels, Any]]) -> list[tuple[Labels, _LabelText, Any]]:
        """(labels, label text, row) of each exported workload, in label order. A workload whose labels cannot
        be written, or whose exported labels repeat another's (two names that differ only in bytes that are
        not UTF-8 and their `\\xNN` spelling), is left out: Prometheus would keep one of two repeated series
        and count the other as an error."""
        items = list(items)
        try:
            ordered = sorted(items, key=_labels_of)
        except TypeError:  # labels that are not four strings (a bug upstream): left out, not the scrape
            ordered = sorted((item for item in items if self._four_strings(item[0])), key=_labels_of)
        rows = []
        for labels, row in ordered:
            if self._exported(labels):
                text = self._labels(labels)
                if text is not None:
                    rows.append((labels, text, row))
        if len({text.key for _, text, _ in rows}) < len(rows):
            kept: dict[str, Labels] = {}
            unique = []
            for labels, text, row in rows:
                first = kept.setdefault(text.key, labels)
                if first == labels:
                    unique.append((labels, text, row))
                else:
                    self._left_out(labels, text, f"its labels repeat those of {first!r}")
            rows = unique
        return rows

    def _four_strings(self, labels: Any) -> bool:
        if isinstance(labels, tuple) and len(labels) == 4 and all(isinstance(v, str) for v in labels):
            return True
        key = repr(labels)
        if key not in self._malformed:  # logged and counted once
            if len(self._malformed) < 1000:
                self._malformed.add(key)
            self._report(labels, "its labels are not four strings")
        return False

    def _sections(self, snap: Snapshot) -> Iterator[tuple[Family, list[tuple[Labels, _LabelText, Any]]]]:
        """Each per-workload family with its rows: the store's counters, then the live cgroups, read once."""
        counter_rows: Optional[list] = None
        live_rows: Optional[list] = None
        for family in self.families:
            if family.source == "counters":
                if counter_rows is None:
                    counter_rows = self._rows(snap.workloads.items())
                yield family, counter_rows
            elif family.source == "live":
                if live_rows is None:
                    counter_rows = None
                    live_rows = self._rows(self._live_workloads())
                yield family, live_rows

    # --- the exposition ------------------------------------------------------------------------------

    def metrics(self, accept_header: str = "") -> tuple[str, Iterable[bytes]]:
        """The /metrics response: content type and the body in chunks (produced as they are consumed)."""
        return CONTENT_TYPE, self._chunks()

    def exposition(self) -> bytes:
        """The whole body at once (tests, tools)."""
        return b"".join(self._chunks())

    def _chunks(self) -> Iterator[bytes]:
        self._scrapes += 1
        snap = self._store.snapshot()
        out = _Lines()
        parts = out.parts
        fmt = format_value
        failed: set[Labels] = set()  # workloads with a sample that could not be written: out of this scrape
        for family, rows in self._sections(snap):
            name = family.name
            values = family.values
            parts.append(_header(family))
            if not family.keys:  # one series per workload
                for labels, text, row in rows:
                    if failed and labels in failed:
                        continue
                    try:
                        value = values(row)  # type: ignore[misc]
                        if value is not None:
                            parts.append(f"{name}{{{text.head}{text.tail}}} {fmt(value)}\n")
                    except Exception as exc:
                        failed.add(labels)
                        self._left_out(labels, text, f"{name}: {exc!r}")
                    if len(parts) >= CHUNK_LINES:
                        yield out.take()
                continue
            keys = self._key_texts[name]
            for labels, text, row in rows:
                if failed and labels in failed:
                    continue
                written = len(parts)
                try:
                    mapping = values(row)  # type: ignore[misc]
                    if mapping is not None:
                        for key, front, middle, end in keys:
                            value = mapping.get(key)
                            if value is not None:
                                parts.append(f"{name}{{{front}{text.head}{middle}{text.tail}{end}}} {fmt(value)}\n")
                except Exception as exc:
                    del parts[written:]  # none of this workload's series of the family, rather than some
                    failed.add(labels)
                    self._left_out(labels, text, f"{name}: {exc!r}")
                if len(parts) >= CHUNK_LINES:
                    yield out.take()
        self._forget_label_text()
        for family, samples in self._node_samples(snap):
            parts.append(_header(family))
            for sample_name, labels_, value in samples:
                parts.append(f"{sample_name}{{{_label_pairs(labels_)}}} {fmt(value)}\n" if labels_
                             else f"{sample_name} {fmt(value)}\n")
        yield out.take()

    def _node_samples(self, snap: Snapshot) -> list[tuple[Family, Sequence[NodeSample]]]:
        parse_errors = self._cgroup_parse_errors() if self._cgroup_parse_errors else None
        view = NodeView(snap=snap, info=self._node_info(), not_exported=self.not_exported,
                        cgroup_parse_errors=parse_errors,
                        agent=self._agent_status() if self._agent_status is not None else None,
                        workloads=self._workloads() if self._workloads is not None else None)
        out = []
        for family in self.families:
            if family.source == "node":
                samples = family.samples(view)  # type: ignore[misc]
                if samples is not None:
                    out.append((family, list(samples)))
        return out

    def _forget_label_text(self) -> None:
        """Drop the label text of workloads this scrape did not show (gone past their grace period)."""
        current = self._scrapes
        if any(text.seen != current for text in self._label_text.values()):
            self._label_text = {k: v for k, v in self._label_text.items() if v.seen == current}

    # --- prometheus_client --------------------------------------------------------------------------

    def collect(self) -> Iterator["Metric"]:
        """The same metrics as prometheus_client families, for a CollectorRegistry (slower than `metrics()`:
        prometheus_client formats each series generically). tests/test_collector.py checks that
        `generate_latest` of these is byte for byte the exposition."""
        from prometheus_client.core import Metric

        self._scrapes += 1
        snap = self._store.snapshot()
        failed: set[Labels] = set()
        for family, rows in self._sections(snap):
            metric = Metric(family.base_name, family.help, family.type)
            names = IDENTITY + family.labels
            for labels, text, row in rows:
                if labels in failed:
                    continue
                identity = [label_value(v) for v in labels]
                try:
                    samples = [(dict(zip(names, identity + list(key))), float(value))
                               for key, value in family.series(row)]
                except Exception as exc:
                    failed.add(labels)
                    self._left_out(labels, text, f"{family.name}: {exc!r}")
                    continue
                for sample_labels, value in samples:
                    metric.add_sample(family.name, sample_labels, value)
            yield metric
        self._forget_label_text()
        for family, samples in self._node_samples(snap):
            metric = Metric(family.base_name, family.help, family.type)
            for sample_name, labels_, value in samples:
                metric.add_sample(sample_name, {k: label_value(v) for k, v in labels_.items()}, value)
            yield metric
