"""The pipeline's stages (oomwatch/pipeline.py dispatches each event to the stages that take it; docs/loop.md has
the picture) and what they share: the node `Context` every stage sees (the settings, the store, the workload
resolver, the node state), what one step asks of the agent (`Effects`), and the typed values one stage hands
another through the Pipeline (`Due`, `Named`, `Published`, `CountersMoved`, `SigKilled`, `DeathCounted`).

A stage declares the event types it takes (`TAKES`), offers `step(event, now, fx)` (returning the typed values
it has for other stages), `advance(now, fx)` (whatever is due after every event) and `next_deadline()`, and keeps
its own state: none reads another's fields; what a stage needs of another comes as one of the values below or
through the read-only view that stage declares (its module's `VIEWS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple, Optional, Protocol

from oomwatch.deaths import Death
from oomwatch.events import LogRequest, RayLogRequest  # (what the stages ask the sources to read)
from oomwatch.model import Incident
from oomwatch.nodestate import NodeState
from oomwatch.store import Store
from oomwatch.workloads import WorkloadResolver


@dataclass
class Effects:
    """What one step asks the agent to do; empty most of the time."""

    publish: list[Incident] = field(default_factory=list)  # counted once by the store: for the sinks
    save: Optional[dict[str, Any]] = None  # the state to write (then step a StateSaved with the outcome)
    logs: list[tuple[int, str]] = field(default_factory=list)  # (logging level, message)
    wake_kernel_log: bool = False  # read now (syslog(2) is read only when woken; the reader child says its time)
    changed: bool = False  # the snapshot is out of date
    fatal: Optional[str] = None  # a source failed for good: the agent exits so that it is restarted
    done: bool = False  # Stop handled: the loop ends
    deaths: list[Death] = field(default_factory=list)  # verdicts counted once by the store: for the sinks
    read_logs: list[LogRequest] = field(default_factory=list)  # container logs to read (then step LogTailRead)
    read_marks: list[str] = field(default_factory=list)  # systemd units' cgroups: read systemd-oomd's marks now
    read_ray_logs: list[RayLogRequest] = field(default_factory=list)  # raylet.out tails (then step RayLogRead)
    read_names: list[str] = field(default_factory=list)  # container cgroups: read their bundles (then NamesRead)


@dataclass(frozen=True)
class Settings:
    boot_id: str
    boot_time: float
    kmsg_source: Optional[str]  # "kmsg" | "syslog": the live reader; None: a saved log, or no kernel log
    counting: bool  # a live kernel log is read: memory.events counts the kills its records do not describe
    quiet: float = 0.25  # seconds of a quiet log after which an incident still open is complete
    # The same, while a group kill's listing is being printed: the kernel kills its members one by one (on a
    # loaded or emulated node 0.1-0.2 s apart, plus the reader's own delays), and a listing taken as complete too
    # early makes its next member look like the victim of a new kill.
    quiet_listing: float = 1.0
    witness_wait: float = 0.0  # seconds a group kill waits for the proc connector's exits (0: no connector)
    persist: bool = False  # a state directory is kept
    skip_upto: Optional[int] = None  # an early reader read the ring from its start: records up to here are done
    saved_log: bool = False  # a saved log is replayed: its cursor is its records' place in it ("file")
    page_size: Optional[int] = None  # the task table's page size (this host's); None: told from each report
    read_logs: bool = False  # the agent reads the kubelet's pod logs for deaths that need them (LogRequest)
    # The agent's cgroup source reads a container's bundle again when a kill needs its names (Effects.read_names)
    read_names: bool = False
    # The API server's pods are watched (the pod source): a kill in a pod before its first list waits for it
    pods_watched: bool = False


class Context(NamedTuple):
    """What every stage sees of the node (oomd's plugin context): shared, not any stage's own. The node state
    (pid → cgroup, oom.group flags, counters' hints, the workload registry) is kept up to date by the identity
    stage; the store counts what any stage decided."""

    settings: Settings
    store: Store
    resolver: WorkloadResolver
    node: NodeState


# --- what one stage hands another, through the Pipeline ---------------------------------------------------------


class Due(NamedTuple):
    """Incidents complete now: to be named (the identity stage: a kill whose pod is not known yet waits for its
    names a bounded time), then counted; `timed`: their latency is observed (past the backlog found at start)."""

    incidents: list[Incident]
    timed: bool


class Named(NamedTuple):
    """Complete incidents with every name known by now: to be counted once by the store and published (the
    counts stage), in the order they came due."""

    incidents: list[Incident]
    timed: bool


class Published(NamedTuple):
    """Incidents the store counted for the first time (each published once): kills a death may be."""

    incidents: list[Incident]


class CountersMoved(NamedTuple):
    """A cgroup's memory.events.local as read now, and which counters moved since its last reading."""

    path: str
    ino: Optional[int]
    local: dict
    moved: dict


class SigKilled(NamedTuple):
    """A process ended by SIGKILL, in its cgroup as last seen alive: a group kill's witness."""

    pid: int
    cgroup: Optional[str]
    time: float


class DeathCounted(NamedTuple):
    """A death's verdict the store counted: the state changed."""

    key: str


class Stage(Protocol):
    TAKES: tuple[type, ...]

    def step(self, event: Any, now: float, fx: Effects) -> Iterable[Any]: ...

    def advance(self, now: float, fx: Effects) -> Iterable[Any]: ...

    def next_deadline(self) -> Optional[float]: ...
