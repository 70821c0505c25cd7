"""memory.stat readings of cgroups at their limit, kept for the kills whose OOM report lost its stats block (the
kernel's ratelimit hides it after the first few reports of a storm; issue 21). Owned by the pipeline's thread;
no I/O, no clock: readings come as `MemoryStatRead` events, time only with the kernel log's reads.

The rule that keeps a reading taken after a kill (the reaper has freed the victim's anonymous memory by then)
from being shown as the state at the kill: a reading counts as "before" a kill only when a read of the kernel
log that ended after the reading did NOT contain the kill. Each `KernelLog` batch is numbered; at the start of
batch j, the readings taken at or before the previous batch's `drained_at`, less READER_LAG, are confirmed for
the kills of batch j and later. The kernel's printk timestamps are never compared with a reading's time to
decide order (printk's clock and the wall clock drift apart over uptime).

READER_LAG: `drained_at` is when the reader last found /dev/kmsg at its end (the reader child says so with each
batch: oomwatch/sources/kmsgproc.py CaughtUp), so no record printed before it is still on its way; a small margin
stays for the clocks' reads around the reader's last, empty, read.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any, Optional

READER_LAG = 0.05
CONFIRMED_KEPT = 8  # confirmed readings kept per cgroup, newest last (an incident is built a few batches late)
UNCONFIRMED_MAX = 8192  # readings waiting for a read of the log, all cgroups (none comes while it is not live)
GONE_KEPT = 1024  # removed cgroups whose readings are kept: a kill's lines can come after its cgroup's removal


class Reading:
    __slots__ = ("path", "taken", "stat", "confirmed")

    def __init__(self, path: str, taken: float, stat: Any) -> None:
        self.path = path
        self.taken = taken  # epoch seconds (time.time()) when the read had ended
        self.stat = stat  # oomwatch.parse.memstat.MemoryStat, only the keys a breakdown uses
        self.confirmed: Optional[int] = None  # the first batch whose kills it is known to precede


class MemoryReadings:
    def __init__(self, reader_lag: float = READER_LAG) -> None:
        self.reader_lag = reader_lag
        self.batch = 0  # the number of the kernel-log batch being processed (0: none yet)
        self._drained: Optional[float] = None  # the latest drained_at of a batch
        self._confirmed: dict[str, deque[Reading]] = {}  # live cgroups
        self._gone: OrderedDict[str, deque[Reading]] = OrderedDict()  # removed ones, oldest removal first
        self._live: set[str] = set()  # cgroups added and not removed
        self._unconfirmed: deque[Reading] = deque(maxlen=UNCONFIRMED_MAX)  # in arrival order

    def __len__(self) -> int:
        kept = sum(len(q) for q in self._confirmed.values()) + sum(len(q) for q in self._gone.values())
        return kept + len(self._unconfirmed)

    def add(self, path: str, taken: float, stat: Any) -> None:
        self._unconfirmed.append(Reading(path, taken, stat))  # (the source kept only STAT_KEYS_USED of it)

    def batch_started(self) -> int:
        """A kernel-log batch is about to be processed: its number. Readings the last complete read covers are
        confirmed for the kills from this batch on."""
        self.batch += 1
        if self._drained is not None:
            upto = self._drained - self.reader_lag
            waiting = self._unconfirmed
            # (arrival order is the source's read order; one out of order waits for a later batch: later is safe)
            while waiting and waiting[0].taken <= upto:
                reading = waiting.popleft()
                reading.confirmed = self.batch
                queue = self._confirmed.get(reading.path)
                if queue is None:
                    queue = self._gone.get(reading.path)
                    if queue is None:
                        queue = deque(maxlen=CONFIRMED_KEPT)
                        if reading.path in self._live:
                            self._confirmed[reading.path] = queue
                        else:  # removed while its readings waited
                            self._keep_gone(reading.path, queue)
                queue.append(reading)
        return self.batch

    def batch_ended(self, drained_at: Optional[float]) -> None:
        """The batch's `drained_at` (None: more is coming at once, the log was not read to its end)."""
        if drained_at is not None:
            self._drained = drained_at if self._drained is None else max(self._drained, drained_at)

    def added(self, path: str) -> None:
        """A cgroup appeared: readings of an earlier cgroup of that path (a restarted unit) are not its own."""
        self._gone.pop(path, None)
        self._live.add(path)
        if any(r.path == path for r in self._unconfirmed):
            self._unconfirmed = deque((r for r in self._unconfirmed if r.path != path), maxlen=UNCONFIRMED_MAX)

    def removed(self, path: str) -> None:
        self._live.discard(path)
        queue = self._confirmed.pop(path, None)
        if queue:
            self._keep_gone(path, queue)

    def _keep_gone(self, path: str, queue: deque[Reading]) -> None:
        self._gone[path] = queue
        while len(self._gone) > GONE_KEPT:
            self._gone.popitem(last=False)

    def before(self, path: str, batch: int) -> Optional[Reading]:
        """The freshest reading of `path` known to precede the kills of batch `batch` (None: none)."""
        queue = self._confirmed.get(path)
        if queue is None:
            queue = self._gone.get(path)
        if not queue:
            return None
        for reading in reversed(queue):
            if reading.confirmed is not None and reading.confirmed <= batch:
                return reading
        return None
