"""The long-running agent: wiring only. Each part has one owner and its own tests:

- `pump.KernelLogPump` (thread "kmsg-pump"): drains the kernel log into memory, started first;
- the processor (thread "kmsg"): correlator → witness queue → store and sinks; the reconciler (memory.events,
  the count of record); batched state writes. It alone owns the correlator, the witness queue, the
  reconciler and the state file;
- `sources.cgroupfs.CgroupWatcher` (thread "cgroups"): inotify; updates `nodestate.NodeState` and hands
  counter readings to the processor through a queue;
- the proc connector (optional): forks and execs into NodeState, SIGKILL exits into the witness queue;
- the HTTP sink: reads the store and NodeState at scrape time, never writes.
The main thread waits for SIGTERM/SIGINT or a dead thread, then stops everything and flushes the state.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
import time
from collections import deque
from typing import Callable, Optional

from oomwatch.config import Config
from oomwatch.explain import explain
from oomwatch.model import Incident, KmsgRecord
from oomwatch.node import NodePosture, host_boot_time, make_correlator
from oomwatch.nodestate import NodeState
from oomwatch.pump import KernelLogPump
from oomwatch.reconcile import Reconciler, counted_incident
from oomwatch.sinks import IncidentSink, LogSink, PodEventSink
from oomwatch.sinks.collector import OomwatchCollector
from oomwatch.sinks.events import EventsFile
from oomwatch.sinks.http import HttpSink
from oomwatch.sources.cgroupfs import CgroupFS, CgroupWatcher, Proc
from oomwatch.sources.statcache import StatCache
from oomwatch.sources.kmsgproc import KmsgChild
from oomwatch.sources.kmsg import (
    Garbled,
    KmsgUnavailable,
    LiveKmsg,
    Lost,
    Skipped,
    explain_open_error,
    is_saved_log,
    open_kernel_log,
    read_saved_log,
)
from oomwatch.sources.procconn import SIGKILL, ProcConnector, ProcConnectorUnavailable, ProcessExit, ProcessFork
from oomwatch.statefile import StateFile, StateLocked
from oomwatch.store import Store
from oomwatch.witness import WitnessQueue
from oomwatch.workloads import WorkloadResolver, scope_of
from oomwatch.workloads.runtime import RuntimeNames

log = logging.getLogger("oomwatch.agent")

# State is written at most this often while incidents keep coming (and at once when the log goes quiet).
SAVE_INTERVAL = 1.0
PROCESSOR_NICE = -5
# A thread that died and could not recover: /healthz says 503 this long before the process exits non-zero
# (so the DaemonSet or systemd restarts it).
FATAL_GRACE_SECONDS = 30.0


def _then_release_memory(chunks):
    """A scrape's body, then its garbage handed back to the kernel: a 2,000-container body is megabytes of
    short-lived strings, and glibc keeps freed heap (RSS grew by a third over 1,000 scrapes without this)."""
    yield from chunks
    _malloc_trim()


def limit_malloc_arenas(arenas: int = 2) -> None:
    """glibc gives each thread that allocates its own malloc arena, and freed memory scattered over a handful of
    arenas is not handed back: the agent's threads (reader pump, processor, cgroup watcher, HTTP, scrape) kept
    megabytes each. Two arenas, set before the threads start (mallopt M_ARENA_MAX)."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(-8, arenas)  # M_ARENA_MAX


def _malloc_trim() -> None:
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


@functools.lru_cache(maxsize=1)
def _glibc():
    """glibc, for its malloc tuning; None elsewhere (musl, macOS): nothing to tune."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except (OSError, AttributeError):
        return None


class Agent:
    def __init__(self, config: Config, clock: Callable[[], float] = time.time,
                 kmsg_factory: Optional[Callable[[str], LiveKmsg]] = None,
                 early_pump: Optional[KernelLogPump] = None) -> None:
        self.config = config
        self._early_pump = early_pump  # /dev/kmsg already being drained (oomwatch/early.py)
        self._skip_upto: Optional[int] = None  # an early pump read from the ring's start: skip to the cursor
        self.clock = clock
        self._kmsg_factory = kmsg_factory
        self.fs = CgroupFS(config.cgroup_root)
        self.proc = Proc(config.proc)
        self.posture = NodePosture(config, self.proc)
        self.boot_id = self.proc.boot_id()
        self.boot_time = config.boot_time if config.boot_time is not None else host_boot_time()
        self.store = Store(grace_seconds=config.grace_period, clock=clock)
        self.pod_index = None
        if config.kube_api != "off":
            from oomwatch.workloads.kubeapi import PodIndex

            self.pod_index = PodIndex.from_environment(node_name=config.node_name)
        self.resolver = WorkloadResolver(RuntimeNames(run_root=config.run_root, pod_log_root=config.pod_log_dir),
                                         self.pod_index)
        self.pod_events = None
        if self.pod_index is not None and config.pod_events:
            from oomwatch.sinks.k8s_events import PodEventRecorder

            self.pod_events = PodEventRecorder.from_environment(node_name=config.node_name)
        self.events_file = (EventsFile(config.events_file, hold=bool(config.state_dir)) if config.events_file
                            else None)
        self.sinks: list[IncidentSink] = [LogSink(log)]  # after the store: each incident once
        if self.events_file is not None:
            self.sinks.append(self.events_file)
        if self.pod_events is not None:
            self.sinks.append(PodEventSink(self.pod_events))
        self.state_file = StateFile(config.state_dir) if config.state_dir else None
        self.node = NodeState(self.fs, self.proc, self.resolver, self.store, clock)
        self.saved_log = kmsg_factory is None and is_saved_log(config.kmsg)
        self.correlator = make_correlator(boot_id=self.boot_id, boot_time=self.boot_time, resolver=self.resolver,
                                          posture_single=self.posture.single_process_oom_kill, view=self.node,
                                          clock=clock, live=not self.saved_log)
        self.witness = WitnessQueue(explain=self._explain)
        self.reconciler = Reconciler(self._counted_incident)
        self._observations: deque = deque()  # (kind, path, ino, counters, time) from the cgroup thread
        self._wakeup = threading.Event()
        self._stop = threading.Event()
        self._fatal = threading.Event()
        self.kmsg_error: Optional[str] = None
        self.kmsg_source = "kmsg"  # or "syslog": which reader wrote the cursor
        self.kmsg_alive = False
        self.pump: Optional[KernelLogPump] = None
        self.proc_connector_error: Optional[str] = None
        self.proc_connector: Optional[ProcConnector] = None
        self.watcher: Optional[CgroupWatcher] = None
        self.state_error: Optional[str] = None
        self._dirty = False
        self._saved_at = 0.0
        self._drained_at = 0.0  # wall time the log was last read to its end with everything published
        self.http: Optional[HttpSink] = None
        self.stat_cache = StatCache(self.fs)
        self.node.stat_cache = self.stat_cache
        self.collector = OomwatchCollector(self.store, self.node.live_workloads, self.posture.info,
                                          cgroup_parse_errors=lambda: self.fs.parse_errors,
                                          drop=config.drop_series)

    # --- helpers for the parts ----------------------------------------------------------------------

    def _explain(self, incident: Incident) -> str:
        return explain(incident, self.posture.single_process_oom_kill())

    def _counted_incident(self, **kw) -> Incident:
        return counted_incident(boot_id=self.boot_id, detected_at=self.clock(), resolve=self.resolver.resolve,
                                scope_of=scope_of, explain=self._explain, **kw)

    def cgroup_of_pid(self, pid: int) -> Optional[str]:
        return self.node.cgroup_of_pid(pid)

    @property
    def _oom_kill_at(self) -> dict:  # tests look at these to know inotify has been seen
        return self.node._oom_kill_at

    @property
    def _oom_at(self) -> dict:
        return self.node._oom_at

    @property
    def _pids(self) -> dict:
        return self.node._pids

    def live_workloads(self):
        return self.node.live_workloads()

    def _wake(self) -> None:
        self._wakeup.set()

    # --- cgroup watcher thread -----------------------------------------------------------------------

    def _observe(self, path: str) -> None:
        if self.pump is None:
            return
        ino, local = self.fs.read_local_events(path)
        if ino is not None and local is not None:
            self._queue_observation(("counters", path, ino, local, self.clock(), self._grouped(path)))

    def _queue_observation(self, item: tuple) -> None:
        # Only the kernel-log processor takes these; without one (a saved log replayed, or no kernel log to
        # read) they would pile up for as long as the agent runs.
        if self.pump is not None:
            self._observations.append(item)
            self._wake()

    def _grouped(self, path: str) -> bool:
        return self.node.oom_group_cgroup(path, None) is not None

    def _cgroup_added(self, path: str) -> None:
        self.node.cgroup_added(path)
        self._observe(path)

    def _cgroup_removed(self, path: str) -> None:
        self.stat_cache.forget(path)
        self.node.cgroup_removed(path)
        self._queue_observation(("removed", path, 0, {}, self.clock(), False))

    def _cgroup_events(self, path: str) -> None:
        ino, local = self.fs.read_local_events(path)
        if local is None or ino is None:
            return
        self.stat_cache.invalidate(path)
        moved = self.node.events_changed(path, local)
        if moved["oom_kill"] or moved["oom_group_kill"]:
            self._queue_observation(("counters", path, ino, local, self.clock(), self._grouped(path)))
            if self.kmsg_source == "syslog" and self.pump is not None:
                self.pump.wake()  # syslog(2) cannot be waited on: a kill here is the cue to read

    def _metrics(self, accept: str):
        content_type, chunks = self.collector.metrics(accept)
        return content_type, _then_release_memory(chunks)

    def _limits_changed(self, path: str) -> None:
        self.stat_cache.invalidate(path)
        self.node.limits_changed(path)

    # --- proc connector thread -----------------------------------------------------------------------

    def _process_forked(self, fork: ProcessFork) -> None:
        self.node.process_forked(fork.parent, fork.parent_task, fork.child)

    def _process_execd(self, pid: int) -> None:
        self.node.process_execd(pid)

    def _process_exited(self, process_exit: ProcessExit) -> None:
        if process_exit.signal == SIGKILL:
            # Its cgroup as last seen alive: the exit event comes after the process has left it.
            self.witness.exited(process_exit.pid, self.node.last_cgroup_of(process_exit.pid), process_exit.time)

    # --- publishing (processor thread) ---------------------------------------------------------------

    def publish(self, incidents: list[Incident], live: bool) -> None:
        for incident in incidents:
            if not self.store.publish(incident, observe_latency=live):
                continue
            self.reconciler.account(incident)
            self._dirty = True
            for sink in self.sinks:
                try:
                    sink.publish(incident)
                except Exception:  # one sink's failure (an API hiccup) must not cost the others or the next
                    log.exception("sink %s could not take an incident", type(sink).__name__)

    def _cursor(self) -> Optional[int]:
        """The last record fully published: a restart reads from the first record of anything pending."""
        pending = [s for s in (self.correlator.pending_since_seq, self.witness.pending_since_seq()) if s is not None]
        cursor = min(pending) - 1 if pending else self.correlator.last_seq
        if cursor is None and self.store.cursor_seq is not None:
            cursor = self.store.cursor_seq
        return cursor

    def _save_state(self, force: bool = False) -> None:
        """Write the state in bounded batches: at most every SAVE_INTERVAL while busy, at once when quiet."""
        self.store.set_cursor(self.boot_id, self._cursor(), self.kmsg_source)
        if self.state_file is None or not (self._dirty or force):
            return
        self._dirty = False
        self._saved_at = time.monotonic()
        try:
            self.state_file.save(self.store, {"accounts": self.reconciler.to_state()})
            self.state_error = None
        except OSError as exc:
            self.store.count_state_error()
            if self.state_error is None:
                log.error("cannot write state: %s", exc.strerror or exc)
            self.state_error = str(exc.strerror or exc)
        if self.events_file is not None:
            self.events_file.flush()  # after the state that counts them (or after trying: never held for ever)

    # --- processor thread ------------------------------------------------------------------------------

    def _handle(self, item) -> None:
        if isinstance(item, KmsgRecord):
            stats = self.correlator.stats
            errors_before, rejected_before = stats.parse_errors, stats.rejected
            out = self.correlator.feed(item)
            self.store.count_kmsg(records=1, parse_errors=stats.parse_errors - errors_before,
                                  rejected=stats.rejected - rejected_before)
            if stats.rejected > rejected_before:
                log.warning("kernel log: rejected an OOM line from syslog facility %d, not the kernel "
                            "(written to /dev/kmsg by a process?): %.200s", item.priority >> 3, item.text)
            if out:
                self.witness.add(out)
        elif isinstance(item, Skipped):
            self.correlator.skipped(item.count, item.last_seq)
            self.store.count_kmsg(records=item.count)
        elif isinstance(item, Lost):
            self.correlator.lost(item.count or 0)
            self.store.count_kmsg(lost=item.count or 0)
            log.warning("kernel log: %s records lost before they could be read (the kernel's memory.events "
                        "still count their kills)", item.count or "some")
        elif isinstance(item, Garbled):
            self.store.count_kmsg(parse_errors=1)

    def _handle_safely(self, item) -> None:
        """One bad record must not stop the reader: log it with the record, count it, go on."""
        try:
            self._handle(item)
        except Exception:
            self.store.count_kmsg(parse_errors=1)
            log.exception("kernel log: cannot process record %.300r; skipped", item)

    def _after_cursor(self, items: list) -> list:
        """An early pump read the ring from its oldest record: drop what the saved cursor says was done, and
        count a gap between the cursor and the oldest record still there as lost."""
        if self._skip_upto is None or not items:
            return items
        cursor, out = self._skip_upto, []
        for n, item in enumerate(items):
            seq = item.last_seq if isinstance(item, Skipped) else getattr(item, "seq", None)
            if seq is None or seq <= cursor:
                continue
            first = seq - item.count + 1 if isinstance(item, Skipped) else seq
            if first > cursor + 1:
                out.append(Lost(first - cursor - 1))
            out.extend(items[n:])
            self._skip_upto = None
            break
        return out

    def _take_observations(self) -> None:
        while self._observations:
            kind, path, ino, counters, when, grouped = self._observations.popleft()
            if kind == "removed":
                self.reconciler.removed(path)
            else:
                self.reconciler.observe(path, ino, counters, when, grouped)

    def _reconcile(self, live: bool) -> None:
        """Kills the counters show and no log record describes (only once the log has been read past them)."""
        if not self.reconciler.pending():
            return
        found = self.reconciler.reconcile(self.clock(), self._drained_at)
        if found:
            log.warning("%d OOM kill(s) counted by memory.events that no kernel log record describes",
                        len(found))
            self.publish(found, live)

    def _process_loop(self) -> None:
        assert self.pump is not None
        try:
            # Where it may (CAP_SYS_NICE), the processor keeps up with a storm's runnable OOMing tasks; nice is
            # per thread on Linux, so the HTTP and cgroup threads stay as they are.
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PROCESSOR_NICE)
        except OSError:
            pass
        live = False  # the backlog already in the ring at start is not timed
        last_record = time.monotonic()
        quiet = self.config.quiet_seconds
        try:
            while not self._stop.is_set():
                self._wakeup.clear()
                items = self._after_cursor(self.pump.take())
                for item in items:
                    self._handle_safely(item)
                now = time.monotonic()
                if items:
                    last_record = now
                self._take_observations()
                if (self.correlator.pending and not items and self.pump.backlog() == 0
                        and now - last_record >= quiet):
                    # Quiet long enough: an incident still open is complete.
                    self.witness.add(self.correlator.flush())
                self.publish(self.witness.due(), live)
                caught_up = self.pump.backlog() == 0
                if caught_up and not self.correlator.pending and not len(self.witness):
                    # /dev/kmsg wakes the reader with every record: caught up, the log is read up to now.
                    # syslog(2) is read only when woken: up to when its last read began.
                    self._drained_at = (min(self.clock(), self.pump.read_started_wall)
                                        if self.kmsg_source == "syslog" else self.clock())
                    live = live or self.pump.reads > 0
                self._reconcile(live)
                settles_at = self.reconciler.settles_at()
                if (settles_at is not None and self.kmsg_source == "syslog" and caught_up
                        and self.pump.read_started_wall < settles_at <= self.clock()):
                    self.pump.wake()  # syslog(2) is read only when woken: a read after the counters moved
                self.store.set_cursor(self.boot_id, self._cursor(), self.kmsg_source)
                if self._dirty and (time.monotonic() - self._saved_at >= SAVE_INTERVAL
                                    or (caught_up and not self.correlator.pending)):
                    self._save_state()
                timeouts = [t for t in (
                    max(0.0, quiet - (time.monotonic() - last_record)) if self.correlator.pending else None,
                    self.witness.timeout(),
                    self.reconciler.settle if self.reconciler.pending() else None,
                    max(0.0, SAVE_INTERVAL - (time.monotonic() - self._saved_at)) if self._dirty else None,
                ) if t is not None]
                if not self.pump.alive and not self.pump.backlog():
                    if self.pump.dead:
                        self.kmsg_error = self.pump.error
                        self._fatal.set()
                    return
                self._wakeup.wait(min(timeouts) if timeouts else None)
        except Exception as exc:
            self.kmsg_error = f"kernel log processor stopped: {exc}"
            log.exception("kernel log processor stopped")
            self._fatal.set()
        finally:
            self.kmsg_alive = False

    def _replay_saved_log(self) -> None:
        """--kmsg names a saved log: publish its incidents once, then keep serving."""
        try:
            for item in read_saved_log(self.config.kmsg):
                self._handle_safely(item)
                self.publish(self.witness.due(everything=True), live=False)
        except OSError as exc:
            self.kmsg_error = explain_open_error(self.config.kmsg, exc)
            log.error("cannot read saved kernel log: %s", self.kmsg_error)
            return
        self.witness.add(self.correlator.flush())
        self.publish(self.witness.due(everything=True), live=False)
        self._save_state(force=True)
        self.kmsg_alive = True
        log.info("replayed saved kernel log %s: %d incidents", self.config.kmsg, len(self.store.snapshot().incidents))

    def _open_kernel_log(self):
        """The live kernel log (see sources.kmsg.open_kernel_log); None, with the reason in `kmsg_error`,
        when it cannot be read."""
        try:
            opened = open_kernel_log(self.config.kmsg, self._cursor_for, self._kmsg_factory or KmsgChild,
                                     fallback=self._kmsg_factory is None)
        except KmsgUnavailable as exc:
            self.kmsg_error = str(exc)
            log.error("kernel log unavailable: %s; serving cgroup metrics only", exc)
            return None
        if opened.fallback:
            log.warning("%s; reading the kernel log through syslog(2) instead, woken by memory.events changes "
                        "(and every %.0f s)", opened.fallback, opened.reader.fallback_interval)
        if isinstance(opened.reader, LiveKmsg):
            opened.reader.prefilter = True
        self.kmsg_source = opened.source
        return opened.reader

    def _reopen_kernel_log(self, after_seq: Optional[int]):
        opened = open_kernel_log(self.config.kmsg, lambda source: after_seq if source == self.kmsg_source else None,
                                 self._kmsg_factory or KmsgChild, fallback=self._kmsg_factory is None)
        if isinstance(opened.reader, LiveKmsg):
            opened.reader.prefilter = True
        return opened.reader

    def _cursor_for(self, source: str) -> Optional[int]:
        """The saved cursor, when it was written by the same boot and the same kind of reader (sequence
        numbers from /dev/kmsg and timestamps from syslog(2) do not mix)."""
        if self.store.boot_id != self.boot_id or self.store.cursor_source != source:
            return None
        return self.store.cursor_seq

    # --- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        limit_malloc_arenas()
        extra: dict = {}
        if self.state_file is not None:
            self.state_file.lock()  # raises StateLocked: a second agent on the same directory
            outcome, extra = self.state_file.load(self.store, self.boot_id)
            (log.error if outcome.startswith("corrupt") else log.info)("state in %s: %s", self.config.state_dir,
                                                                       outcome)
        self.reconciler.load_state(extra.get("accounts", {}))
        # The kernel log first: records are lost while anything slow runs before the reader does.
        if self._early_pump is not None and not self.saved_log and self.config.kmsg == "/dev/kmsg":
            self.pump, self.kmsg_source = self._early_pump, "kmsg"
            self._skip_upto = self._cursor_for("kmsg")
            self.pump.adopt(self._wake, self._reopen_kernel_log)
        else:
            if self._early_pump is not None:
                self._early_pump.stop()
            reader = None if self.saved_log else self._open_kernel_log()
            if reader is not None:
                self.pump = KernelLogPump(reader, self._wake, reopen=self._reopen_kernel_log)
                self.pump.start()
        if self.events_file is not None:
            self.events_file.open()
            caught_up = self.events_file.catch_up(list(self.store.snapshot().incidents))
            if caught_up:
                log.info("events file: %d incident(s) the saved state holds were written now", caught_up)
        self.watcher = CgroupWatcher(self.fs, on_added=self._cgroup_added, on_removed=self._cgroup_removed,
                                     on_events=self._cgroup_events, on_populated=self.node.populated)
        self.node.known = self.watcher.known
        self.watcher.on_limits = self._limits_changed
        self.watcher.on_resync = self.stat_cache.invalidate_all
        self.node.unwatched_limits = self.watcher.unwatched_limits
        for path in self.watcher.start_watching():
            self._cgroup_added(path)
        self.node.cgns_prefix = self.node.find_cgroup_namespace_prefix()
        if self.node.cgns_prefix:
            log.info("in a cgroup namespace rooted at %s: /proc/<pid>/cgroup paths are taken relative to it",
                     self.node.cgns_prefix)
        if self.reconciler.stats.notes:
            log.warning("%s", "; ".join(self.reconciler.stats.notes))
        self._watcher_thread = threading.Thread(target=self._run_watcher, name="cgroups", daemon=True)
        self._watcher_thread.start()
        web = tls = None
        if self.config.web_config_file:
            from oomwatch.sinks.webconfig import load_web_config

            web, tls = load_web_config(self.config.web_config_file)  # checked by the CLI already
        self.http = HttpSink(self.config.listen, self._metrics, self.store, self.health, web=web, tls=tls)
        self.http.start()
        if self.config.proc_connector:
            connector = ProcConnector(self._process_exited, self.clock, on_fork=self._process_forked,
                                      on_exec=self._process_execd)
            try:
                connector.start()
                self.proc_connector = connector
            except ProcConnectorUnavailable as exc:
                self.proc_connector_error = str(exc)
                log.error("%s; group kills are reported from the kernel log alone", exc)
        else:
            self.witness.wait = 0.0  # nothing to wait for
        if self.pod_index is not None:
            self.pod_index.start()
        if self.pod_events is not None:
            self.pod_events.start()
        if self.saved_log:
            self._kmsg_thread = threading.Thread(target=self._replay_saved_log, name="kmsg", daemon=True)
            self._kmsg_thread.start()
        elif self.pump is not None:
            self.kmsg_alive = True
            self._kmsg_thread = threading.Thread(target=self._process_loop, name="kmsg", daemon=True)
            self._kmsg_thread.start()
        log.info("oomwatch agent listening on %s:%d (cgroups %s, kernel log %s)", *self.http.address,
                 self.config.cgroup_root, "syslog(2)" if self.kmsg_source == "syslog" else self.config.kmsg)

    def _run_watcher(self) -> None:
        assert self.watcher is not None
        self.watcher.run()
        if not self._stop.is_set():
            self._fatal.set()

    def health(self) -> tuple[bool, dict]:
        pump_ok = self.saved_log or (self.pump is not None and self.pump.alive and self.pump.error is None)
        kmsg_ok = self.kmsg_alive and self.kmsg_error is None and pump_ok
        cg_ok = self.watcher is not None and self.watcher.alive and self.watcher.error is None
        kmsg_reason = self.kmsg_error or (self.pump.error if self.pump is not None else None) or "not running"
        detail = {
            "kmsg": "ok" if kmsg_ok else kmsg_reason,
            "cgroups": "ok" if cg_ok else ((self.watcher.error if self.watcher else None) or "not running"),
        }
        if self.state_error:  # reported, not fatal: counting goes on in memory
            detail["state"] = self.state_error
        if self.config.proc_connector:  # optional: reported, never fatal
            error = self.proc_connector_error or (self.proc_connector.error if self.proc_connector else None)
            detail["proc_connector"] = error or "ok"
        return kmsg_ok and cg_ok, detail

    def stop(self) -> None:
        self._stop.set()
        self._wake()
        if self.pump is not None:
            self.pump.stop()
        if self.watcher is not None:
            self.watcher.stop()
        if hasattr(self, "_kmsg_thread"):
            self._kmsg_thread.join(timeout=5)
        if not self.saved_log and self.pump is not None:
            # Incidents finished but held back are complete: publish them. One still being printed is left
            # to the next start, which re-reads the log from its first record (the cursor stops before it).
            for item in self.pump.take():
                self._handle_safely(item)
            self.witness.add(self.correlator.release_finished())
            self.publish(self.witness.due(everything=True), live=True)
            self._take_observations()
        if self.state_file is not None and self.state_file.loaded:
            self._save_state(force=True)
        if self.proc_connector is not None:
            self.proc_connector.stop()
        if self.pod_events is not None:
            self.pod_events.stop()
        if self.pod_index is not None:
            self.pod_index.stop()
        if self.http is not None:
            self.http.stop()
        self.stat_cache.close()
        if self.events_file is not None:
            self.events_file.flush()  # whatever a failed state save left held
            self.events_file.close()
        if self.state_file is not None:
            self.state_file.unlock()

    def run_until_signalled(self) -> int:
        wake = self._fatal  # set by a signal, or by a thread that died for good
        signalled = threading.Event()

        def on_signal(*_) -> None:
            signalled.set()
            wake.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        rc = 0
        try:
            try:
                self.start()
            except StateLocked as exc:
                log.error("%s", exc)
                self.state_file = None  # not ours: never touch it
                return 2
            wake.wait()  # nothing to do here: the work happens on the source threads
            if not signalled.is_set():
                log.error("a source thread stopped (%s); exiting in %.0f s so that the service is restarted",
                          self.health()[1], FATAL_GRACE_SECONDS)
                signalled.wait(FATAL_GRACE_SECONDS)
                rc = 1
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.stop()
        log.info("oomwatch agent stopped")
        return rc
