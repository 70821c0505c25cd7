"""The proc connector's witness: processes that died by SIGKILL in a group cgroup without a kernel line.

When a group kill reaches a container's PID 1, the kernel tears the pid namespace down and the other
processes die unlogged (docs/kernel-facts.md). A group kill therefore waits for their exit events before it is
published: `wait` seconds, or less when the kernel-log stage knows more (`add(..., wait)`: none when every process
its group held has a line or an exit; `shorten`: when a new reading of its group says so, e.g. briefly once its
group is empty; docs/loop.md), and whatever follows it waits its turn: incidents go out in kernel order.
Owned by the pipeline (one thread, fed by events); times are the pipeline's `now`, given with each call.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Callable, Iterable, Optional

from oomwatch.correlator import is_within
from oomwatch.model import Incident

SIGKILL = 9
WITNESS_SECONDS = 0.5
EXIT_WINDOW = 2.0  # an exit by SIGKILL this long before a kill can still be its (the clocks of exits and kills differ)


class WitnessQueue:
    def __init__(self, explain: Callable[[Incident], str], wait: float = WITNESS_SECONDS) -> None:
        self._explain = explain
        self.wait = wait
        self._sigkilled: deque[tuple[int, Optional[str], float]] = deque(maxlen=10_000)
        self._awaiting: deque[tuple[float, Incident]] = deque()

    def exited(self, pid: int, cgroup: Optional[str], when: float) -> None:
        """A process died by SIGKILL; `cgroup` is where it was last seen alive."""
        self._sigkilled.append((pid, cgroup, when))

    def add(self, incidents: list[Incident], now: float, wait: Optional[float] = None) -> None:
        """`wait`: for group kills, instead of `self.wait` (shorter when their exits are known to be all but in)."""
        wait = self.wait if wait is None else wait
        for incident in incidents:
            self._awaiting.append((now + (wait if incident.kind == "group" and incident.killed else 0.0), incident))

    def shorten(self, group: str, now: float, wait_of: Callable[[Incident], float]) -> None:
        """A new reading of `group` (its pids, or none left): its group kills waiting here wait no longer than
        `wait_of(incident)` from now (never longer than they did)."""
        self._awaiting = deque((min(due, now + wait_of(incident)) if incident.group_cgroup == group else due, incident)
                               for due, incident in self._awaiting)

    def unaccounted(self, pids: Iterable[int], named: set, since: float) -> bool:
        """Whether one of `pids` is neither `named` (by kill lines) nor seen dying by SIGKILL from EXIT_WINDOW before
        `since` on: then it may still be listed, or its exit may still be on its way."""
        unnamed = set(pids) - named
        if unnamed:  # (the exits looked through only then: this runs at each step while a group kill is open)
            unnamed -= {pid for pid, _, when in self._sigkilled if when >= since - EXIT_WINDOW}
        return bool(unnamed)

    def due(self, now: float, everything: bool = False) -> list[Incident]:
        """The incidents whose wait is over at `now`, in order (the first holds the rest back), detected now: their
        latency is the kill's to its publication, the wait for witnesses included."""
        out = []
        while self._awaiting and (everything or self._awaiting[0][0] <= now):
            incident = self._with_witnesses(self._awaiting.popleft()[1])
            out.append(incident if incident.detected_at >= now else replace(incident, detected_at=now))
        return out

    def next_due(self) -> Optional[float]:
        """When the first incident's wait is over (None: nothing waits)."""
        return self._awaiting[0][0] if self._awaiting else None

    def pending_since_seq(self) -> Optional[int]:
        seqs = [i.kernel_seq for _, i in self._awaiting if i.kernel_seq is not None]
        return min(seqs) if seqs else None

    def __len__(self) -> int:
        return len(self._awaiting)

    def _with_witnesses(self, incident: Incident) -> Incident:
        if incident.kind != "group" or not incident.killed or not incident.group_cgroup or incident.killed_truncated:
            # (a listing cut short does not say who else was killed: exits cannot be told from it)
            return incident
        known = {p.pid for p in incident.killed} | {p["pid"] for p in incident.exiting}
        died = [{"pid": pid, "cgroup": cgroup, "signal": SIGKILL} for pid, cgroup, when in list(self._sigkilled)
                if pid not in known and cgroup and is_within(cgroup, incident.group_cgroup)
                and when >= incident.time - EXIT_WINDOW]
        if not died:
            return incident
        incident = replace(incident, died_with=tuple(died))
        return replace(incident, explanation=self._explain(incident))
