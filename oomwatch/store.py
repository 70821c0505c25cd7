"""What the agent has learnt: counters per workload, node counters, recent incidents, the kernel-log cursor.

Owned by the pipeline (oomwatch.pipeline), on its one thread: no lock. Sinks only ever see `snapshot()`, an
immutable copy the pipeline hands them. The state directory (atomic writes, lock) is oomwatch.statefile.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional

from oomwatch.cowmap import CowMap
from oomwatch.deaths import CAUSES
from oomwatch.holders import MEMORY_TYPES, memory_by_type
from oomwatch.model import Incident

log = logging.getLogger(__name__)

STATE_VERSION = 2
KINDS = ("single", "group")
ROLES = ("victim", "collateral")
SCOPES = ("container", "pod", "node", "cgroup", "unknown")  # unknown: the log does not say which limit
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

MAX_EXPLANATION = 1000  # characters of an incident's explanation kept for the info series
# A label value read back from the state: a cgroup path in a delegated subtree can be deeper than PATH_MAX (mkdir
# relative to a deep directory), each name up to 255 bytes; this bounds a damaged file, not a real path.
MAX_LABEL = 1 << 16

# Workloads (series sets) kept at most: a live workload is never dropped, gone ones are, oldest first.
MAX_WORKLOADS = 20_000

Labels = tuple[str, str, str, str]  # namespace, pod, container, cgroup (docs/contract.md identity labels)


# Most workloads are never killed: they share these read-only zero counts. Counts are replaced, never changed in
# place, so a snapshot can share them too.
NO_KILLS: Mapping[str, int] = MappingProxyType({k: 0 for k in KINDS})
NO_KILLED: Mapping[str, int] = MappingProxyType({r: 0 for r in ROLES})
NO_DEATHS: Mapping[str, int] = MappingProxyType({c: 0 for c in CAUSES})
# Deaths remembered as counted, in memory and in the state (a death is judged once, from exits a restart never
# hears again; this guards against counting one twice all the same). A key holds a cgroup path: a few kept.
MAX_DEATH_KEYS = 2_000


@dataclass(slots=True)
class WorkloadCounters:
    kills: Mapping[str, int] = field(default_factory=lambda: NO_KILLS)  # the shared one, not a copy
    killed: Mapping[str, int] = field(default_factory=lambda: NO_KILLED)
    last_kill: Optional[float] = None
    gone_since: Optional[float] = None  # set when its cgroup disappears; dropped after the grace period
    last_incident: Optional[tuple[str, str, str]] = None  # (kind, scope, explanation) of its last incident
    last_memory: Optional[Mapping[str, int]] = None  # what held the memory at its last incident, by type
    deaths: Mapping[str, int] = field(default_factory=lambda: NO_DEATHS)  # verdicts on its deaths, by cause


@dataclass(frozen=True)
class Snapshot:
    """Everything a sink may show, copied under the lock."""

    workloads: Mapping[Labels, WorkloadCounters]  # (a cowmap.FrozenMap: taken in constant time, never changed)
    node_kills: dict[tuple[str, str], int]
    incidents: tuple[dict[str, Any], ...]
    kmsg_records: int
    kmsg_lost: int
    kmsg_parse_errors: int
    kmsg_rejected: int
    counted_from_events: int
    state_errors: int
    workloads_dropped: int
    latency_buckets: tuple[int, ...]
    latency_count: int
    latency_sum: float
    deaths: tuple[dict[str, Any], ...] = ()  # the last deaths judged since the start (Death JSON, oldest first)


class StateError(Exception):
    pass


class Store:
    def __init__(self, *, max_incidents: int = 500, grace_seconds: float = 600.0,
                 clock: Callable[[], float] = time.time, max_workloads: int = MAX_WORKLOADS) -> None:
        self.max_workloads = max_workloads
        self._dropped = 0  # workloads whose series were dropped to stay under max_workloads
        self._clock = clock
        self.grace_seconds = grace_seconds
        # Counters a snapshot holds are never changed: a change replaces them (`_own`). `_private`: labels whose
        # counters no snapshot holds yet. `_gone_order`: (gone_since, labels) as workloads went, oldest first (an
        # entry whose workload came back or went again since is skipped), so that expiring and the cap cost what
        # they drop, not what is kept.
        self._workloads: CowMap = CowMap()
        self._private: set[Labels] = set()
        self._gone_order: deque[tuple[float, Labels]] = deque()
        self._node_kills = {(k, s): 0 for k in KINDS for s in SCOPES}
        self._incidents: deque[dict[str, Any]] = deque(maxlen=max_incidents)
        self._keys: deque[list] = deque(maxlen=max(10_000, max_incidents))
        self._key_set: set[tuple] = set()
        self._kmsg = {"records": 0, "lost": 0, "parse_errors": 0, "rejected": 0}
        self._counted_from_events = 0  # incidents the kernel counted and no log record described
        self._state_errors = 0  # state saves that failed (disk full, read-only)
        self._buckets = [0] * len(LATENCY_BUCKETS)
        self._lat_count = 0
        self._lat_sum = 0.0
        self.boot_id: Optional[str] = None
        self.cursor_seq: Optional[int] = None
        # The reader that wrote the cursor: "kmsg" (sequence), "syslog" (µs) or "file" (a saved log's record)
        self.cursor_source = "kmsg"
        self._expires_at: Optional[float] = None  # the earliest gone_since (a lower bound after a revival)
        self._deaths: deque[dict[str, Any]] = deque(maxlen=max_incidents)
        self._death_keys: deque[list] = deque(maxlen=MAX_DEATH_KEYS)
        self._death_key_set: set[tuple] = set()

    # --- updates -----------------------------------------------------------------------------------

    def use_clock(self, clock: Callable[[], float]) -> None:
        """Take the times it stamps (a workload gone, an expiry) from `clock`: the pipeline's, the events' times."""
        self._clock = clock

    def publish(self, incident: Incident, *, observe_latency: bool = True) -> bool:
        """Count an incident once. False (nothing changed) when it was already published."""
        key = incident.key
        if key in self._key_set:
            return False
        self._remember_key(key)
        by_labels: dict[Labels, list[str]] = {}
        if not incident.killed:  # counted from memory.events: the workloads are known, the pids not
            for workload in incident.workloads or (incident.workload,):
                by_labels.setdefault(workload.metric_labels(), [])
        victim_cgroup = (incident.victim.cgroup or "") if incident.victim is not None else None
        for cgroup, count in incident.killed_per_cgroup():
            workload = next((w for w in incident.workloads if cgroup and w.cgroup and
                             (cgroup == w.cgroup or cgroup.startswith(w.cgroup.rstrip("/") + "/"))),
                            incident.workload)
            roles = by_labels.setdefault(workload.metric_labels(), [])
            if cgroup == victim_cgroup:
                roles.append("victim")
                victim_cgroup, count = None, count - 1
            roles.extend(["collateral"] * count)
        for labels, roles in by_labels.items():
            if labels not in self._workloads:
                # Known only from the log (a replayed log, a cgroup already gone): its series expire after
                # the grace period like those of a workload that went away.
                self._new(labels, gone_since=self._clock())
                self._cap()
                if labels not in self._workloads:  # the store is full of live workloads: counted on the node only
                    continue
            counters = self._own(labels)
            kills, killed = dict(counters.kills), dict(counters.killed)
            kills[incident.kind] += 1
            for role in roles:
                killed[role] += 1
            counters.kills, counters.killed = kills, killed
            if incident.time >= (counters.last_kill or 0.0):
                counters.last_incident = (incident.kind, incident.scope, incident.explanation[:MAX_EXPLANATION])
                counters.last_memory = memory_by_type(incident.memory_breakdown)
            counters.last_kill = max(counters.last_kill or 0.0, incident.time)
            if counters.gone_since is not None:
                counters.gone_since = self._clock()  # an incident keeps a gone workload visible a while
                self._went(labels, counters.gone_since)
        self._node_kills[(incident.kind, incident.scope)] += 1
        self._incidents.append(incident.to_json())
        if incident.evidence != "kmsg":
            self._counted_from_events += 1
        latency = incident.latency_seconds
        if observe_latency and latency is not None:
            self._lat_count += 1
            self._lat_sum += latency
            for i, bound in enumerate(LATENCY_BUCKETS):
                if latency <= bound:
                    self._buckets[i] += 1
        return True

    def count_death(self, key: tuple, cause: str, labels: Optional[Labels], death_json: dict[str, Any]) -> bool:
        """Count a death's verdict once (oomwatch.deaths.Death: `key`, `cause`) on its workload's series
        (`labels`; None: no workload with series). False when it was counted already. Never an OOM kill: the
        incidents' counters are not touched."""
        if key in self._death_key_set or cause not in NO_DEATHS:
            return False
        if len(self._death_keys) == self._death_keys.maxlen:
            self._death_key_set.discard(tuple(self._death_keys[0]))
        self._death_keys.append(list(key))
        self._death_key_set.add(key)
        if labels is not None:
            if labels not in self._workloads:  # its cgroup already gone: kept visible for the grace period
                self._new(labels, gone_since=self._clock())
                self._cap()
            if labels not in self._workloads:  # the store is full of live workloads: in the deaths' JSON only
                self._deaths.append(death_json)
                return True
            counters = self._own(labels)
            if counters.gone_since is not None:
                counters.gone_since = self._clock()
                self._went(labels, counters.gone_since)
            deaths = dict(counters.deaths)
            deaths[cause] += 1
            counters.deaths = deaths
        self._deaths.append(death_json)
        return True

    def _remember_key(self, key: tuple) -> None:
        if len(self._keys) == self._keys.maxlen:
            self._key_set.discard(tuple(self._keys[0]))
        self._keys.append(list(key))
        self._key_set.add(key)

    def seen(self, labels: Labels, room_kept: int = 0) -> bool:
        """A live workload: its counters exist (at 0 before its first kill) and it is not gone. False when the
        store is full of live workloads (max_workloads, less `room_kept`: room no delegated subtree may take, kept
        for the others): this one gets no series, and the caller says so."""
        counters = self._workloads.get(labels)
        if counters is None:
            if len(self._workloads) >= self.max_workloads - room_kept and not self._drop_oldest_gone():
                return False
            self._new(labels)
        elif counters.gone_since is not None:
            self._own(labels).gone_since = None
        return True

    def _new(self, labels: Labels, gone_since: Optional[float] = None) -> WorkloadCounters:
        counters = self._workloads[labels] = WorkloadCounters(gone_since=gone_since)
        self._private.add(labels)
        if gone_since is not None:
            self._went(labels, gone_since)
        return counters

    def _own(self, labels: Labels) -> WorkloadCounters:
        """A workload's counters, to change: a copy of them when a snapshot holds them (a snapshot never changes)."""
        c = self._workloads[labels]
        if labels not in self._private:
            c = self._workloads[labels] = WorkloadCounters(c.kills, c.killed, c.last_kill, c.gone_since,
                                                           c.last_incident, c.last_memory, c.deaths)
            self._private.add(labels)
        return c

    def _drop(self, labels: Labels) -> None:
        del self._workloads[labels]
        self._private.discard(labels)

    def _went(self, labels: Labels, when: float) -> None:
        """`labels` went (or was seen in an incident while gone) at `when`: in the gone order."""
        self._gone_order.append((when, labels))
        self._gone_at(when)
        if len(self._gone_order) > 2 * len(self._workloads) + 1024:  # mostly entries skipped since: rebuilt
            self._gone_order = deque(sorted((c.gone_since, k) for k, c in self._workloads.items()
                                            if c.gone_since is not None))

    def _oldest_gone(self) -> Optional[tuple[float, Labels]]:
        """The gone order's first entry still true (entries of workloads back or gone again since are dropped)."""
        order, workloads = self._gone_order, self._workloads
        while order:
            when, labels = order[0]
            c = workloads.get(labels)
            if c is not None and c.gone_since == when:
                return order[0]
            order.popleft()
        return None

    def _drop_oldest_gone(self) -> bool:
        oldest = self._oldest_gone()
        if oldest is None:
            return False
        self._gone_order.popleft()
        self._drop(oldest[1])
        self._dropped += 1
        return True

    def _cap(self) -> None:
        """At most `max_workloads` series sets (a node running short-lived Slurm steps, Jobs or systemd scopes
        for weeks): beyond it, the workloads gone longest are dropped first, and counted."""
        for _ in range(len(self._workloads) - self.max_workloads):
            if not self._drop_oldest_gone():
                return

    def gone(self, labels: Labels) -> None:
        counters = self._workloads.get(labels)
        if counters is not None and counters.gone_since is None:
            self._own(labels).gone_since = self._clock()
            self._went(labels, self._clock())

    def forget_unused(self, labels: Labels) -> None:
        """Drop a workload's series if nothing was ever counted for it (its labels were provisional: a pod
        cgroup seen before any of its containers named it)."""
        c = self._workloads.get(labels)
        if (c is not None and c.last_kill is None and not any(c.kills.values()) and not any(c.killed.values())
                and not any(c.deaths.values())):
            self._drop(labels)

    def expire(self) -> int:
        """Drop workloads gone for longer than the grace period; returns how many."""
        now, dead = self._clock(), 0
        while True:
            oldest = self._oldest_gone()
            if oldest is None or now - oldest[0] < self.grace_seconds:
                break
            self._gone_order.popleft()
            self._drop(oldest[1])
            dead += 1
        self._expires_at = oldest[0] if oldest is not None else None
        return dead

    def next_expiry(self) -> Optional[float]:
        """When the first gone workload's grace period ends (None: none is gone)."""
        return None if self._expires_at is None else self._expires_at + self.grace_seconds

    def _gone_at(self, when: float) -> None:
        if self._expires_at is None or when < self._expires_at:
            self._expires_at = when

    def count_kmsg(self, records: int = 0, lost: int = 0, parse_errors: int = 0, rejected: int = 0) -> None:
        self._kmsg["records"] += records
        self._kmsg["lost"] += lost
        self._kmsg["parse_errors"] += parse_errors
        self._kmsg["rejected"] += rejected

    def count_state_error(self) -> None:
        self._state_errors += 1

    def set_cursor(self, boot_id: str, seq: Optional[int], source: str = "kmsg") -> None:
        self.boot_id, self.cursor_seq, self.cursor_source = boot_id, seq, source

    # --- reads -------------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        self._private = set()  # every counter is the snapshot's now
        return Snapshot(
            workloads=self._workloads.frozen(),
            node_kills=dict(self._node_kills),
            incidents=tuple(self._incidents),
            kmsg_records=self._kmsg["records"],
            kmsg_lost=self._kmsg["lost"],
            kmsg_parse_errors=self._kmsg["parse_errors"],
            kmsg_rejected=self._kmsg["rejected"],
            counted_from_events=self._counted_from_events,
            state_errors=self._state_errors,
            workloads_dropped=self._dropped,
            latency_buckets=tuple(self._buckets),
            latency_count=self._lat_count,
            latency_sum=self._lat_sum,
            deaths=tuple(self._deaths),
        )

    # --- persistence -------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "boot_id": self.boot_id,
            "cursor_seq": self.cursor_seq,
            "cursor_source": self.cursor_source,
            "workloads": [{"labels": list(k), "kills": dict(v.kills), "killed": dict(v.killed),
                           "last_kill": v.last_kill,
                           "last_incident": list(v.last_incident) if v.last_incident else None,
                           "last_memory": dict(v.last_memory) if v.last_memory is not None else None,
                           "gone_since": v.gone_since,
                           **({"deaths": dict(v.deaths)} if any(v.deaths.values()) else {})}
                          for k, v in self._workloads.items()],
            "node_kills": [[k, s, n] for (k, s), n in self._node_kills.items()],
            "incidents": list(self._incidents),
            "keys": list(self._keys),
            "kmsg": dict(self._kmsg),
            "counted_from_events": self._counted_from_events,
            "latency": {"buckets": self._buckets, "count": self._lat_count, "sum": self._lat_sum},
            "death_keys": list(self._death_keys),  # (the last deaths' JSON is in the events file, not here)
        }

    def load_state(self, state: Any) -> None:
        """Restore a saved state. Raises StateError naming the first field that is not what we write."""
        v = _Validator(state)
        v.expect(v.get(state, "version") == STATE_VERSION, f"unknown state version {v.get(state, 'version')!r}")
        workloads = {}
        for entry in v.list(state, "workloads"):
            labels = tuple(v.list(entry, "labels"))
            v.expect(len(labels) == 4 and all(isinstance(x, str) and len(x) <= MAX_LABEL for x in labels),
                     "workload labels")
            c = WorkloadCounters()
            kills, killed = v.counts(entry, "kills", KINDS), v.counts(entry, "killed", ROLES)
            if any(kills.values()) or any(killed.values()):
                c.kills, c.killed = {**NO_KILLS, **kills}, {**NO_KILLED, **killed}
            c.last_kill = v.time(entry, "last_kill")
            last_incident = entry.get("last_incident")
            v.expect(last_incident is None or (isinstance(last_incident, list) and len(last_incident) == 3 and all(
                isinstance(x, str) and len(x) <= MAX_EXPLANATION for x in last_incident)), "last_incident")
            c.last_incident = tuple(last_incident) if last_incident else None
            last_memory = entry.get("last_memory")  # absent in a state written before issue 21
            v.expect(last_memory is None or (isinstance(last_memory, dict) and all(
                k in MEMORY_TYPES and _is_count(n) for k, n in last_memory.items())), "last_memory")
            c.last_memory = dict(last_memory) if last_memory is not None else None
            c.gone_since = v.time(entry, "gone_since")
            if "deaths" in entry:  # absent in a state written before deaths were judged, and where none was
                deaths = v.counts(entry, "deaths", CAUSES)
                c.deaths = {**NO_DEATHS, **deaths}
            workloads[labels] = c
        node = {(k, s): 0 for k in KINDS for s in SCOPES}
        for row in v.list(state, "node_kills"):
            v.expect(isinstance(row, list) and len(row) == 3 and (row[0], row[1]) in node and _is_count(row[2]),
                     f"node_kills row {row!r}")
            node[(row[0], row[1])] = row[2]
        lat = v.dict(state, "latency")
        buckets = v.list(lat, "buckets")
        v.expect(len(buckets) == len(LATENCY_BUCKETS) and all(_is_count(b) for b in buckets), "latency buckets")
        v.expect(_is_count(lat.get("count")), "latency count")
        v.expect(isinstance(lat.get("sum"), (int, float)) and math.isfinite(lat["sum"]) and lat["sum"] >= 0,
                 "latency sum")
        kmsg = v.counts(state, "kmsg", ("records", "lost", "parse_errors", "rejected"))
        keys = []
        for k in v.list(state, "keys"):
            v.expect(isinstance(k, list) and len(k) == 3 and all(isinstance(x, (str, int, float)) for x in k),
                     f"incident key {k!r}")
            keys.append(tuple(k))
        incidents = v.list(state, "incidents")
        v.expect(all(isinstance(i, dict) for i in incidents), "incidents")
        cursor = v.get(state, "cursor_seq")
        v.expect(cursor is None or _is_count(cursor), f"cursor_seq {cursor!r}")
        boot_id = v.get(state, "boot_id")
        v.expect(boot_id is None or isinstance(boot_id, str), "boot_id")
        cursor_source = v.get(state, "cursor_source")
        v.expect(cursor_source in ("kmsg", "syslog", "file"), f"cursor_source {cursor_source!r}")
        counted = state.get("counted_from_events", 0)
        v.expect(_is_count(counted), "counted_from_events")
        death_keys = []
        for k in state.get("death_keys", []):
            v.expect(isinstance(k, list) and len(k) == 4 and all(isinstance(x, (str, int, float)) for x in k),
                     f"death key {k!r}")
            death_keys.append(tuple(k))
        self._workloads = CowMap(workloads.items())
        self._private = set(workloads)
        self._gone_order = deque(sorted((c.gone_since, k) for k, c in workloads.items() if c.gone_since is not None))
        self._expires_at = self._gone_order[0][0] if self._gone_order else None
        self._node_kills = node
        self._buckets, self._lat_count, self._lat_sum = list(buckets), lat["count"], float(lat["sum"])
        self._kmsg = {k: kmsg.get(k, 0) for k in ("records", "lost", "parse_errors", "rejected")}
        self._counted_from_events = counted
        self._incidents.clear()
        self._incidents.extend(incidents)
        self._keys.clear()
        self._key_set.clear()
        for key in keys:
            self._remember_key(key)
        self._deaths.clear()
        self._death_keys.clear()
        self._death_key_set.clear()
        for key in death_keys[-MAX_DEATH_KEYS:]:
            self._death_keys.append(list(key))
            self._death_key_set.add(key)
        self.boot_id, self.cursor_seq, self.cursor_source = boot_id, cursor, cursor_source


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 63


class _Validator:
    """Checks a state read back from disk, field by field; the first defect raises StateError naming it."""

    def __init__(self, state: Any) -> None:
        if not isinstance(state, dict):
            raise StateError(f"state is {type(state).__name__}, not an object")

    @staticmethod
    def expect(ok: bool, what: str) -> None:
        if not ok:
            raise StateError(f"bad {what}")

    @staticmethod
    def get(d: Any, key: str) -> Any:
        if not isinstance(d, dict) or key not in d:
            raise StateError(f"missing {key}")
        return d[key]

    def list(self, d: Any, key: str) -> list:
        value = self.get(d, key)
        self.expect(isinstance(value, list), f"{key} (not a list)")
        return value

    def dict(self, d: Any, key: str) -> dict:
        value = self.get(d, key)
        self.expect(isinstance(value, dict), f"{key} (not an object)")
        return value

    def counts(self, d: Any, key: str, names: tuple[str, ...]) -> dict[str, int]:
        value = self.dict(d, key)
        out = {}
        for name, n in value.items():
            self.expect(name in names and _is_count(n), f"{key}.{name} = {n!r}")
            out[name] = n
        return out

    def time(self, d: Any, key: str) -> Optional[float]:
        value = d.get(key) if isinstance(d, dict) else None
        self.expect(value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                      and math.isfinite(value) and 0 <= value < 1e11), f"{key} = {value!r}")
        return None if value is None else float(value)
