"""What the agent has learnt: counters per workload, node counters, recent incidents, the kernel-log cursor.

One lock; sinks only ever see `snapshot()`, an immutable copy. `save()` writes the state file atomically
(write a temp file, fsync, rename) so a crash leaves the old or the new state, never half of one.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from oomwatch.model import Incident

log = logging.getLogger(__name__)

STATE_VERSION = 1
KINDS = ("single", "group")
ROLES = ("victim", "collateral")
SCOPES = ("container", "pod", "node", "cgroup")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

Labels = tuple[str, str, str, str]  # namespace, pod, container, cgroup (CONTRACT identity labels)


@dataclass
class WorkloadCounters:
    kills: dict[str, int] = field(default_factory=lambda: {k: 0 for k in KINDS})
    killed: dict[str, int] = field(default_factory=lambda: {r: 0 for r in ROLES})
    last_kill: Optional[float] = None
    gone_since: Optional[float] = None  # set when its cgroup disappears; dropped after the grace period


@dataclass(frozen=True)
class Snapshot:
    """Everything a sink may show, copied under the lock."""

    workloads: dict[Labels, WorkloadCounters]
    node_kills: dict[tuple[str, str], int]
    incidents: tuple[dict[str, Any], ...]
    kmsg_records: int
    kmsg_lost: int
    kmsg_parse_errors: int
    latency_buckets: tuple[int, ...]
    latency_count: int
    latency_sum: float


class StateError(Exception):
    pass


class Store:
    def __init__(self, *, max_incidents: int = 500, grace_seconds: float = 600.0,
                 clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self.grace_seconds = grace_seconds
        self._workloads: dict[Labels, WorkloadCounters] = {}
        self._node_kills = {(k, s): 0 for k in KINDS for s in SCOPES}
        self._incidents: deque[dict[str, Any]] = deque(maxlen=max_incidents)
        self._keys: deque[list] = deque(maxlen=max(10_000, max_incidents))
        self._key_set: set[tuple] = set()
        self._kmsg = {"records": 0, "lost": 0, "parse_errors": 0}
        self._buckets = [0] * len(LATENCY_BUCKETS)
        self._lat_count = 0
        self._lat_sum = 0.0
        self.boot_id: Optional[str] = None
        self.cursor_seq: Optional[int] = None
        self.cursor_source = "kmsg"  # the reader that wrote the cursor: "kmsg" (sequence) or "syslog" (µs)

    # --- updates -----------------------------------------------------------------------------------

    def publish(self, incident: Incident, *, observe_latency: bool = True) -> bool:
        """Count an incident once. False (nothing changed) when it was already published."""
        key = incident.key
        with self._lock:
            if key in self._key_set:
                return False
            self._remember_key(key)
            by_labels: dict[Labels, list[str]] = {}
            for proc, role in zip(incident.killed, ["victim"] + ["collateral"] * len(incident.collateral)):
                workload = next((w for w in incident.workloads if proc.cgroup and w.cgroup and
                                 (proc.cgroup == w.cgroup or proc.cgroup.startswith(w.cgroup.rstrip("/") + "/"))),
                                incident.workload)
                by_labels.setdefault(workload.metric_labels(), []).append(role)
            for labels, roles in by_labels.items():
                counters = self._workloads.setdefault(labels, WorkloadCounters())
                counters.kills[incident.kind] += 1
                for role in roles:
                    counters.killed[role] += 1
                counters.last_kill = max(counters.last_kill or 0.0, incident.time)
                if counters.gone_since is not None:
                    counters.gone_since = self._clock()  # an incident keeps a gone workload visible a while
            self._node_kills[(incident.kind, incident.scope)] += 1
            self._incidents.append(incident.to_json())
            if observe_latency:
                latency = incident.latency_seconds
                self._lat_count += 1
                self._lat_sum += latency
                for i, bound in enumerate(LATENCY_BUCKETS):
                    if latency <= bound:
                        self._buckets[i] += 1
            return True

    def _remember_key(self, key: tuple) -> None:
        if len(self._keys) == self._keys.maxlen:
            self._key_set.discard(tuple(self._keys[0]))
        self._keys.append(list(key))
        self._key_set.add(key)

    def seen(self, labels: Labels) -> None:
        """A live workload: its counters exist (at 0 before its first kill) and it is not gone."""
        with self._lock:
            self._workloads.setdefault(labels, WorkloadCounters()).gone_since = None

    def gone(self, labels: Labels) -> None:
        with self._lock:
            counters = self._workloads.get(labels)
            if counters is not None and counters.gone_since is None:
                counters.gone_since = self._clock()

    def forget_unused(self, labels: Labels) -> None:
        """Drop a workload's series if nothing was ever counted for it (its labels were provisional: a pod
        cgroup seen before any of its containers named it)."""
        with self._lock:
            c = self._workloads.get(labels)
            if c is not None and c.last_kill is None and not any(c.kills.values()) and not any(c.killed.values()):
                del self._workloads[labels]

    def expire(self) -> int:
        """Drop workloads gone for longer than the grace period; returns how many."""
        now = self._clock()
        with self._lock:
            dead = [labels for labels, c in self._workloads.items()
                    if c.gone_since is not None and now - c.gone_since >= self.grace_seconds]
            for labels in dead:
                del self._workloads[labels]
            return len(dead)

    def count_kmsg(self, records: int = 0, lost: int = 0, parse_errors: int = 0) -> None:
        with self._lock:
            self._kmsg["records"] += records
            self._kmsg["lost"] += lost
            self._kmsg["parse_errors"] += parse_errors

    def set_cursor(self, boot_id: str, seq: Optional[int], source: str = "kmsg") -> None:
        with self._lock:
            self.boot_id, self.cursor_seq, self.cursor_source = boot_id, seq, source

    # --- reads -------------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(
                workloads={k: WorkloadCounters(dict(v.kills), dict(v.killed), v.last_kill, v.gone_since)
                           for k, v in self._workloads.items()},
                node_kills=dict(self._node_kills),
                incidents=tuple(self._incidents),
                kmsg_records=self._kmsg["records"],
                kmsg_lost=self._kmsg["lost"],
                kmsg_parse_errors=self._kmsg["parse_errors"],
                latency_buckets=tuple(self._buckets),
                latency_count=self._lat_count,
                latency_sum=self._lat_sum,
            )

    # --- persistence -------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        with self._lock:
            return {
                "version": STATE_VERSION,
                "boot_id": self.boot_id,
                "cursor_seq": self.cursor_seq,
                "cursor_source": self.cursor_source,
                "workloads": [{"labels": list(k), "kills": v.kills, "killed": v.killed, "last_kill": v.last_kill,
                               "gone_since": v.gone_since} for k, v in self._workloads.items()],
                "node_kills": [[k, s, n] for (k, s), n in self._node_kills.items()],
                "incidents": list(self._incidents),
                "keys": list(self._keys),
                "kmsg": dict(self._kmsg),
                "latency": {"buckets": self._buckets, "count": self._lat_count, "sum": self._lat_sum},
            }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore a saved state. Raises StateError when it does not look like ours."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise StateError(f"unknown state version {state.get('version') if isinstance(state, dict) else state!r}")
        try:
            workloads = {}
            for entry in state["workloads"]:
                labels = tuple(str(x) for x in entry["labels"])
                if len(labels) != 4:
                    raise StateError("bad workload labels")
                c = WorkloadCounters()
                c.kills.update({k: int(v) for k, v in entry["kills"].items() if k in KINDS})
                c.killed.update({k: int(v) for k, v in entry["killed"].items() if k in ROLES})
                c.last_kill = entry.get("last_kill")
                c.gone_since = entry.get("gone_since")
                workloads[labels] = c
            node = {(k, s): 0 for k in KINDS for s in SCOPES}
            for kind, scope, n in state["node_kills"]:
                if (kind, scope) in node:
                    node[(kind, scope)] = int(n)
            lat = state["latency"]
            buckets = [int(x) for x in lat["buckets"]]
            if len(buckets) != len(LATENCY_BUCKETS):
                buckets = [0] * len(LATENCY_BUCKETS)
            kmsg = {k: int(state["kmsg"].get(k, 0)) for k in ("records", "lost", "parse_errors")}
            keys = [tuple(k) for k in state["keys"]]
            incidents = [i for i in state["incidents"] if isinstance(i, dict)]
            cursor = state["cursor_seq"]
            boot_id = state["boot_id"]
            cursor_source = str(state.get("cursor_source", "kmsg"))
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"malformed state: {exc}") from exc
        with self._lock:
            self._workloads = workloads
            self._node_kills = node
            self._buckets, self._lat_count, self._lat_sum = buckets, int(lat["count"]), float(lat["sum"])
            self._kmsg = kmsg
            self._incidents.clear()
            self._incidents.extend(incidents)
            self._keys.clear()
            self._key_set.clear()
            for key in keys:
                self._remember_key(key)
            self.boot_id, self.cursor_seq, self.cursor_source = boot_id, cursor, cursor_source


STATE_FILE = "state.json"


def save_state(store: Store, state_dir: str) -> None:
    os.makedirs(state_dir, exist_ok=True)
    data = json.dumps(store.to_state(), separators=(",", ":"))
    fd, tmp = tempfile.mkstemp(prefix=".state-", dir=state_dir)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(state_dir, STATE_FILE))
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def load_state(store: Store, state_dir: str, boot_id: str) -> str:
    """Restore `store` from `state_dir`. Returns what happened, for one log line: "restored", "none",
    "new boot" (the counters and cursor of another boot are not ours to continue) or "corrupt: …"
    (the file is moved aside and the agent starts fresh: never a crash loop)."""
    path = os.path.join(state_dir, STATE_FILE)
    try:
        with open(path) as f:
            state = json.load(f)
        probe = Store()
        probe.load_state(state)
    except FileNotFoundError:
        return "none"
    except (OSError, ValueError, StateError) as exc:
        aside = f"{path}.corrupt-{int(time.time())}"
        try:
            os.replace(path, aside)
        except OSError:
            pass
        return f"corrupt ({exc}); moved to {aside}; starting fresh"
    if state.get("boot_id") != boot_id:
        return "new boot"
    store.load_state(state)
    return "restored"
