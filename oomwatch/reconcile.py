"""The kernel's `memory.events.local` counters are the count of record; the kernel log is the detail.

The log can lose records (the ring buffer wraps under a storm, or while the agent is down or starting); the
counters cannot. Per cgroup, `Reconciler` keeps the counter values already accounted for: it starts at what
the kernel said when the cgroup was first seen (kills before that are not ours), every incident the log
describes accounts for its lines (`oom_group_kill` +1 in the group cgroup, `oom_kill` +1 per `Killed process`
line in the victim's and members' cgroups, as the kernel counts them), and what is left over once the log has
been read past it becomes incidents marked `evidence: memory.events`, with their cgroup, kind and time window
but no pids. The accounted values persist with the kernel-log cursor in one atomic state file, so the sum is
exact across agent restarts and downtime, and never counts a kill twice.

Kernel facts (docs/kernel-facts.md): `oom_kill` is charged to the victim's cgroup, once per `Killed process`
line (a group kill's victim twice); `oom_group_kill` (5.17+) to the cgroup whose `memory.oom.group` was used;
both move before the kernel prints the lines. A deficit is therefore only believed once it has outlived a
drain of the log (`settle`): a kill whose lines are still being read is not a kill without lines.

Pure: fed counter readings, incidents and times; returns incidents. No I/O, no clock of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from oomwatch.correlator import is_within
from oomwatch.model import Incident, Workload

COUNTERS = ("oom_kill", "oom_group_kill")
# A deficit must survive this long, and a drain of the log after it, before it is taken as a lost record.
SETTLE_SECONDS = 1.0
# At most this many incidents are made for one cgroup at a time: a counter that jumps by millions (a
# corrupted file, a misread) must not flood the store.
MAX_INCIDENTS_PER_CGROUP = 1000


class Counts:
    """oom_kill and oom_group_kill, indexed by name like a dict but a fraction of one's memory (one of these per
    cgroup, twice, on a node of thousands)."""

    __slots__ = ("oom_kill", "oom_group_kill")

    def __init__(self, values: dict) -> None:
        self.oom_kill = int(values.get("oom_kill", 0))
        self.oom_group_kill = int(values.get("oom_group_kill", 0))

    def __getitem__(self, name: str) -> int:
        return getattr(self, name)

    def __setitem__(self, name: str, value: int) -> None:
        setattr(self, name, value)

    def to_dict(self) -> dict[str, int]:
        return {"oom_kill": self.oom_kill, "oom_group_kill": self.oom_group_kill}


@dataclass(slots=True)
class Account:
    """One cgroup's accounting: `seen` is what is accounted for, `kernel` the last reading."""

    ino: int  # the cgroup directory's inode: a cgroup removed and made again under the same path starts anew
    first_seen: float  # kernel-clock epoch seconds: log records older than this are not ours to account
    seen: Counts
    kernel: Counts
    since: float  # the end of the last window in which this cgroup's counters were all accounted for
    deficit_at: Optional[float] = None  # when a positive deficit was first noticed
    gone: bool = False
    grouped: bool = False  # memory.oom.group=1 here or above: every kill in it is a group kill

    def to_state(self) -> dict:
        return {"ino": self.ino, "first_seen": self.first_seen, "seen": self.seen.to_dict(),
                "kernel": self.kernel.to_dict(), "since": self.since}


@dataclass
class ReconcileStats:
    missing_group_counter: bool = False  # kernel before 5.17: no oom_group_kill
    notes: list[str] = field(default_factory=list)


class Reconciler:
    """`observe(path, ino, counters, now)` with each reading of a cgroup's memory.events.local;
    `account(incident)` with each incident the log described; `reconcile(now, log_drained_at)` returns the
    kills nobody described. `make_incident(...)` builds those incidents (workload, scope, explanation)."""

    def __init__(self, make_incident: Callable[..., Incident], settle: float = SETTLE_SECONDS) -> None:
        self._make_incident = make_incident
        self.settle = settle
        self.accounts: dict[str, Account] = {}
        # Cgroups whose kernel counters are ahead of what is accounted: `pending()` and `settles_at()` look only
        # at these (a node has thousands of accounts, and the pipeline asks after every event).
        self._unsettled: set[str] = set()
        self.stats = ReconcileStats()

    # --- input -------------------------------------------------------------------------------------

    def observe(self, path: str, ino: int, counters: dict[str, int], now: float, grouped: bool = False) -> bool:
        """A reading of `path`'s memory.events.local (`grouped`: memory.oom.group=1 on it or an ancestor, as
        last read). Returns True when it shows kills not yet accounted."""
        reading = {k: _count(counters.get(k)) for k in COUNTERS}
        if "oom_group_kill" not in counters and not self.stats.missing_group_counter:
            self.stats.missing_group_counter = True
            self.stats.notes.append("this kernel has no memory.events oom_group_kill (before 5.17): kills the "
                                    "log lost are counted from oom_kill alone, and their kind is unknown")
        acct = self.accounts.get(path)
        if acct is None or acct.ino != ino:
            self.accounts[path] = Account(ino=ino, first_seen=now, seen=Counts(reading), kernel=Counts(reading),
                                          since=now, grouped=grouped)
            return False
        acct.gone = False
        acct.grouped = grouped
        for k in COUNTERS:
            acct.kernel[k] = max(acct.kernel[k], reading[k])  # counters never go down
        if any(acct.kernel[k] > acct.seen[k] for k in COUNTERS):
            self._unsettled.add(path)
            if acct.deficit_at is None:
                acct.deficit_at = now
            return True
        acct.since = now
        return False

    def removed(self, path: str) -> None:
        """The cgroup is gone: its last reading is final; the account goes after the next reconcile."""
        acct = self.accounts.get(path)
        if acct is not None:
            acct.gone = True
            if path not in self._unsettled:
                del self.accounts[path]  # all accounted: nothing more can come of it

    def account(self, incident: Incident) -> None:
        """An incident the log described: its lines are accounted in the cgroups that counted them."""
        if incident.evidence != "kmsg":
            return
        if incident.kind == "group" and incident.group_cgroup:
            acct = self._account_for(incident.group_cgroup, incident.time)
            if acct is not None:
                acct.seen["oom_group_kill"] += 1
                self._settled_maybe(incident.group_cgroup, acct)
        for cgroup, lines in incident.kill_lines:
            acct = self._account_for(cgroup, incident.time)
            if acct is not None:
                acct.seen["oom_kill"] += lines
                self._settled_maybe(cgroup, acct)

    def _settled_maybe(self, path: str, acct: Account) -> None:
        if path in self._unsettled and all(acct.kernel[k] <= acct.seen[k] for k in COUNTERS):
            self._unsettled.discard(path)
            acct.deficit_at = None

    def _account_for(self, cgroup: str, when: float) -> Optional[Account]:
        acct = self.accounts.get(cgroup) if cgroup else None
        if acct is None or when < acct.first_seen - self.settle:
            return None  # a kill from before we knew the cgroup: already in its first reading
        return acct

    # --- output ------------------------------------------------------------------------------------

    def unaccounted_kills(self, path: str) -> int:
        """`oom_kill` the kernel counted in `path` that no incident accounts for yet (0 for a cgroup not seen)."""
        acct = self.accounts.get(path)
        return max(0, acct.kernel.oom_kill - acct.seen.oom_kill) if acct is not None else 0

    def accounted_group_kills(self, path: str) -> Optional[int]:
        """`oom_group_kill` of `path` that incidents account for (None: no reading of the cgroup yet)."""
        acct = self.accounts.get(path)
        return acct.seen.oom_group_kill if acct is not None else None

    def pending(self) -> bool:
        """Whether some cgroup shows kills not yet accounted (the caller then calls reconcile soon)."""
        return bool(self._unsettled)

    def settles_at(self) -> Optional[float]:
        """The earliest time a read of the log that begins then can settle a noticed deficit (None: none)."""
        times = [a.deficit_at + self.settle for a in (self.accounts.get(p) for p in self._unsettled)
                 if a is not None and a.deficit_at is not None]
        return min(times) if times else None

    def reconcile(self, now: float, log_drained_at: float) -> list[Incident]:
        """Kills the counters show and the log did not describe. `log_drained_at`: the last time the kernel
        log was read to its end with every incident built and accounted. A deficit first noticed at t is
        believed once `log_drained_at >= t + settle`."""
        group_deficits: dict[str, int] = {}
        line_deficits: dict[str, int] = {}
        for path, a in self.accounts.items():
            dg = a.kernel["oom_group_kill"] - a.seen["oom_group_kill"]
            dk = a.kernel["oom_kill"] - a.seen["oom_kill"]
            if dg <= 0 and dk <= 0:
                a.deficit_at = None
                if dk < 0 or dg < 0:
                    line_deficits[path] = dk  # over-accounted: the log placed lines here that were counted below
                continue
            if a.deficit_at is None:
                a.deficit_at = now
            if log_drained_at < a.deficit_at + self.settle:
                continue
            if dg > 0:
                group_deficits[path] = dg
            line_deficits[path] = dk
        out: list[Incident] = []
        # Group kills first: each takes the unaccounted lines of its subtree.
        for path, n in sorted(group_deficits.items()):
            a = self.accounts[path]
            inside = [p for p, d in line_deficits.items() if d > 0 and is_within(p, path)]
            affected = tuple(sorted(inside)) or (path,)
            for i in range(min(n, MAX_INCIDENTS_PER_CGROUP)):
                out.append(self._make_incident(kind="group", cgroup=path, affected=affected,
                                               window=(a.since, now), counter=a.seen["oom_group_kill"] + i + 1,
                                               ino=a.ino))
            a.seen["oom_group_kill"] = a.kernel["oom_group_kill"]
            for p in inside:
                line_deficits[p] = 0
                self.accounts[p].seen["oom_kill"] = self.accounts[p].kernel["oom_kill"]
        # Lines the log placed in an ancestor (a process whose own cgroup was unknown) cover its descendants.
        for path in sorted((p for p, d in line_deficits.items() if d < 0), key=len, reverse=True):
            spare = -line_deficits[path]
            for p in sorted(line_deficits):
                if spare <= 0:
                    break
                if p != path and line_deficits[p] > 0 and is_within(p, path):
                    take = min(spare, line_deficits[p])
                    line_deficits[p] -= take
                    self.accounts[p].seen["oom_kill"] += take
                    self.accounts[path].seen["oom_kill"] -= take
                    spare -= take
        # What is left in a cgroup is single kills, one line each; but where memory.oom.group=1 every kill is a
        # group kill, counted exactly by oom_group_kill: lines left there are a logged group kill's own (its
        # first lines lost with the records before it, the victim's reprint among them), not more kills.
        for path, d in sorted(line_deficits.items()):
            if d <= 0:
                continue
            a = self.accounts[path]
            if a.grouped and not self.stats.missing_group_counter:
                a.seen["oom_kill"] = a.kernel["oom_kill"]
                continue
            for i in range(min(d, MAX_INCIDENTS_PER_CGROUP)):
                out.append(self._make_incident(kind="single", cgroup=path, affected=(path,),
                                               window=(a.since, now), counter=a.seen["oom_kill"] + i + 1,
                                               ino=a.ino))
            a.seen["oom_kill"] = a.kernel["oom_kill"]
        for path, a in list(self.accounts.items()):
            if all(a.kernel[k] <= a.seen[k] for k in COUNTERS):
                a.deficit_at = None
                a.since = now
                self._unsettled.discard(path)
                if a.gone:
                    del self.accounts[path]
        return out

    # --- persistence -------------------------------------------------------------------------------

    def to_state(self) -> dict[str, dict]:
        return {path: a.to_state() for path, a in self.accounts.items()}

    def load_state(self, state: dict) -> None:
        """Restore accounts saved with the cursor (validated by the caller's schema check)."""
        for path, entry in state.items():
            acct = self.accounts[path] = Account(ino=entry["ino"], first_seen=entry["first_seen"],
                                                 seen=Counts(entry["seen"]), kernel=Counts(entry["kernel"]),
                                                 since=entry["since"], gone=True)  # until seen again this run
            if any(acct.kernel[k] > acct.seen[k] for k in COUNTERS):
                self._unsettled.add(path)  # noticed (`deficit_at`) when the pipeline starts: see started()

    def started(self, now: float) -> None:
        """Deficits restored from the state are noticed now: they settle after a drain of the log from here."""
        for path in self._unsettled:
            acct = self.accounts.get(path)
            if acct is not None and acct.deficit_at is None:
                acct.deficit_at = now


def _count(value: Optional[int]) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


def counted_incident(*, boot_id: str, kind: str, cgroup: str, affected: Iterable[str],
                     window: tuple[float, float], counter: int, ino: int, detected_at: float,
                     resolve: Callable[[str], Workload], scope_of: Callable[[Optional[str], Optional[str], str], str],
                     explain: Callable[[Incident], str]) -> Incident:
    """An incident the kernel counted and no log record describes."""
    from dataclasses import replace

    workload = resolve(cgroup)
    workloads: list[Workload] = []
    for path in affected:
        w = resolve(path)
        if w not in workloads:
            workloads.append(w)
    if workload not in workloads:
        workloads.insert(0, workload)
    incident = Incident(
        time=window[1], boot_id=boot_id, kernel_seq=None, kind=kind, constraint="memcg",
        scope=scope_of(cgroup, cgroup, "memcg"), oom_cgroup=None,
        group_cgroup=cgroup if kind == "group" else None, trigger=None, memory=None, victim=None, killed=(),
        workload=workload, explanation="", detected_at=detected_at, workloads=tuple(workloads),
        evidence="memory.events", window_start=window[0], live=False,
        counted_in=(cgroup, ino, "oom_group_kill" if kind == "group" else "oom_kill", counter))
    return replace(incident, explanation=explain(incident))


def counted_since_creation(readings: dict[str, tuple[int, dict[str, int], bool]],
                           make_incident: Callable[..., Incident], since: float) -> Reconciler:
    """For a one-shot look (`oomwatch inspect` on a live node): a reconciler whose accounts start at zero, the
    value each cgroup's memory.events.local counters had when it was made (after `since`, the boot). Account
    the ring buffer's incidents, then `reconcile(now, now)` returns the kills whose records the ring has
    overwritten. `readings`: path → (inode, counters, memory.oom.group effective there)."""
    r = Reconciler(make_incident, settle=0.0)
    for path, (ino, counters, grouped) in readings.items():
        r.observe(path, ino, {k: 0 for k in COUNTERS}, since, grouped)
        r.observe(path, ino, counters, since, grouped)
    return r
