"""The long-running agent: sources → correlator → store → sinks, on three threads.

- kmsg thread: reads /dev/kmsg (blocking in poll), feeds the correlator, publishes incidents;
- cgroup thread: inotify on the cgroup tree, keeps the workload set and the pid → cgroup memory;
- HTTP thread: serves /metrics (read from the store and cgroupfs at scrape time), /healthz, /incidents.
The main thread waits for SIGTERM/SIGINT, then stops the sources and flushes the state.
"""

from __future__ import annotations

import logging
import os
import posixpath
import signal
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Callable, Iterable, Optional

from prometheus_client import CollectorRegistry

from oomwatch.config import Config
from oomwatch.correlator import is_within
from oomwatch.explain import explain
from oomwatch.model import CgroupStats, Incident, KmsgRecord
from oomwatch.sinks.collector import OomwatchCollector
from oomwatch.sinks.events import EventsFile
from oomwatch.sinks.http import HttpSink
from oomwatch.sources.cgroupfs import CgroupFS, CgroupWatcher, Proc
from oomwatch.sources.procconn import (
    SIGKILL,
    ProcConnector,
    ProcConnectorUnavailable,
    ProcessExit,
    ProcessFork,
)
from oomwatch.sources.kmsg import (
    Garbled,
    KmsgUnavailable,
    LiveKmsg,
    Lost,
    explain_open_error,
    is_saved_log,
    open_kernel_log,
    read_saved_log,
)
from oomwatch.store import Labels, Store, load_state, save_state
from oomwatch.node import (
    NodePosture,
    host_boot_time,
    is_workload_cgroup,
    make_correlator,
    with_effective_oom_group,
)
from oomwatch.workloads import WorkloadResolver, identify
from oomwatch.workloads.runtime import RuntimeNames

log = logging.getLogger("oomwatch.agent")

# How long a group kill waits for the proc connector's exit events of processes the kernel did not log.
WITNESS_SECONDS = 0.5
# A cgroup's pid list is re-read at most this often while it sits at its limit.
PID_SNAPSHOT_INTERVAL = 0.2
# How long a cgroup's `oom` event is a hint for an incident whose summary the kernel ratelimited away.
OOM_HINT_SECONDS = 10.0


class Agent:
    def __init__(self, config: Config, clock: Callable[[], float] = time.time,
                 kmsg_factory: Optional[Callable[[str], LiveKmsg]] = None) -> None:
        self.config = config
        self.clock = clock
        self._kmsg_factory = kmsg_factory or LiveKmsg
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
        self.events_file = EventsFile(config.events_file) if config.events_file else None
        self.correlator = make_correlator(
            boot_id=self.boot_id, boot_time=self.boot_time, resolver=self.resolver,
            posture_single=self.posture.single_process_oom_kill, cgroup_of_pid=self.cgroup_of_pid,
            oom_cgroup_hint=self.oom_cgroup_hint, victim_cgroup_hint=self.victim_cgroup_hint, clock=clock,
            live=not (kmsg_factory is None and is_saved_log(config.kmsg)))
        self._pids: dict[int, str] = {}
        self._pids_by_cgroup: dict[str, set[int]] = {}  # to forget a removed cgroup's pids
        self._cgns_prefix: Optional[str] = None
        self._pid_snapshot_at: dict[str, float] = {}
        self._last_local: dict[str, dict[str, int]] = {}
        self._oom_at: dict[str, float] = {}
        self._oom_kill_at: dict[str, float] = {}
        self._workloads: dict[str, Labels] = {}  # live workload cgroup → identity labels
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.kmsg_error: Optional[str] = None
        self.kmsg_source = "kmsg"  # or "syslog": which reader wrote the cursor
        self.kmsg_alive = False
        self.proc_connector_error: Optional[str] = None
        self.watcher: Optional[CgroupWatcher] = None
        self.proc_connector: Optional[ProcConnector] = None
        self._sigkilled: deque[tuple[int, Optional[str], float]] = deque(maxlen=10_000)
        self._awaiting_witness: list[tuple[float, Incident]] = []  # (monotonic deadline, incident)
        self.http: Optional[HttpSink] = None
        self.registry = CollectorRegistry()
        self.registry.register(OomwatchCollector(self.store, self.live_workloads, self.posture.info))

    # --- pid → cgroup memory ------------------------------------------------------------------------

    def cgroup_of_pid(self, pid: int) -> Optional[str]:
        """The process's cgroup: live from /proc while it still exists and is not dying, else what we last
        saw of it (cgroup.procs, exec and fork events)."""
        return self.cgroup_of_pid_live(pid) or self._pids.get(pid)

    def cgroup_of_pid_live(self, pid: int) -> Optional[str]:
        path = self.proc.cgroup_of(pid)
        if path is not None and self._cgns_prefix is not None:
            path = posixpath.normpath(self._cgns_prefix + "/" + path.lstrip("/"))
        return path

    def _find_cgroup_namespace_prefix(self) -> Optional[str]:
        """In a container with its own cgroup namespace (the default on cgroup v2), /proc/<pid>/cgroup is
        relative to the agent's own cgroup (`/../../kubepods/…`), while the kernel log and the mounted host
        tree use full paths. Our pid's place in the host tree gives the prefix that turns one into the other."""
        seen_as = self.proc.own_cgroup()
        host_path = self._pids.get(os.getpid())
        if seen_as is None or host_path is None or seen_as == host_path:
            return None
        if seen_as == "/":
            return host_path
        if host_path.endswith(seen_as):
            return host_path[: -len(seen_as)] or None
        return None

    def _snapshot_pids(self, root: str) -> None:
        assert self.watcher is not None  # pids are taken only once the tree is watched
        for path in [p for p in self.watcher.known() if is_within(p, root)]:
            self._remember_pids(path)

    def _remember_pids(self, path: str) -> None:
        pids = self.fs.read_pids(path)
        for pid in pids:
            self._pids[pid] = path
        self._pids_by_cgroup.setdefault(path, set()).update(pids)

    def oom_cgroup_hint(self, victim_cgroup: Optional[str]) -> Optional[str]:
        """For an incident without its `oom-kill:` summary: the deepest ancestor of the victim's cgroup whose
        memory.events.local `oom` moved lately is the cgroup whose limit was hit."""
        if victim_cgroup is None:
            return None
        now = self.clock()
        candidates = [p for p, t in list(self._oom_at.items())
                      if now - t <= OOM_HINT_SECONDS and is_within(victim_cgroup, p)]
        return max(candidates, key=len) if candidates else None

    def victim_cgroup_hint(self, oom_cgroup: Optional[str]) -> Optional[str]:
        """For a kill whose victim we never saw alive and whose summary was ratelimited: the cgroup whose
        memory.events.local `oom_kill` moved most recently (within the oom cgroup when that is known)."""
        now = self.clock()
        candidates = [(t, p) for p, t in list(self._oom_kill_at.items())
                      if now - t <= OOM_HINT_SECONDS and (oom_cgroup is None or is_within(p, oom_cgroup))]
        return max(candidates)[1] if candidates else None

    # --- cgroup watcher callbacks ---------------------------------------------------------------------

    def _cgroup_added(self, path: str) -> None:
        # Processes that joined before our cgroup.events watch existed (a runtime moves a container's init
        # in right after mkdir) are only found by looking. (The watcher reports each new child separately.)
        self._remember_pids(path)
        names = self.resolver.container_appeared(path)
        workload = self.resolver.resolve(path)
        stats = self.fs.read_stats(path)
        if stats is not None and stats.events_local is not None:
            self._last_local[path] = stats.events_local
        if is_workload_cgroup(path, workload, stats):
            self._set_labels(path, workload.metric_labels())
        if names is not None and workload.pod_cgroup in self._workloads:
            # The pod cgroup appeared before any container could name it: now one can.
            self._set_labels(workload.pod_cgroup, self.resolver.resolve(workload.pod_cgroup).metric_labels())

    def _set_labels(self, path: str, labels: Labels) -> None:
        with self._lock:
            old = self._workloads.get(path)
            self._workloads[path] = labels
        self.store.seen(labels)
        if old is not None and old != labels:
            self.store.forget_unused(old)

    def _cgroup_removed(self, path: str) -> None:
        with self._lock:
            labels = self._workloads.pop(path, None)
            still_used = labels in self._workloads.values()
        for per_path in (self._last_local, self._pid_snapshot_at, self._oom_at, self._oom_kill_at):
            per_path.pop(path, None)
        # Its processes are gone (a cgroup is removed only when empty), and their incidents were built.
        for pid in self._pids_by_cgroup.pop(path, ()):
            if self._pids.get(pid) == path:
                del self._pids[pid]
        if labels is not None and not still_used:
            self.store.gone(labels)
        self.store.expire()

    def _cgroup_events(self, path: str) -> None:
        _, local = self.fs.read_events(path)
        if local is None:
            return
        before = self._last_local.get(path, {})
        self._last_local[path] = local
        now = self.clock()
        if self.kmsg_source == "syslog" and local.get("oom_kill", 0) > before.get("oom_kill", 0):
            self._wake()  # syslog(2) cannot be waited on: a kill here is the cue to read
        if local.get("oom", 0) > before.get("oom", 0):
            self._oom_at[path] = now
        if local.get("oom_kill", 0) > before.get("oom_kill", 0):
            self._oom_kill_at[path] = now
        pressing = any(local.get(k, 0) > before.get(k, 0) for k in ("max", "oom", "oom_kill"))
        if pressing and now - self._pid_snapshot_at.get(path, 0.0) >= PID_SNAPSHOT_INTERVAL:
            self._pid_snapshot_at[path] = now
            self._snapshot_pids(path)
        if path not in self._workloads:
            # A plain cgroup that just got a limit or oom.group becomes a workload.
            self._cgroup_added(path)

    # --- scrape-time reads ---------------------------------------------------------------------------

    def live_workloads(self) -> Iterable[tuple[Labels, CgroupStats]]:
        self.store.expire()  # drop the series of workloads gone longer than the grace period
        with self._lock:
            items = list(self._workloads.items())
        seen: set[Labels] = set()
        for path, labels in items:
            if labels in seen:
                continue
            stats = self.fs.read_stats(path, with_local=False)
            if stats is not None:
                seen.add(labels)
                yield labels, with_effective_oom_group(self.fs, identify(path), stats)

    def health(self) -> tuple[bool, dict]:
        kmsg_ok = self.kmsg_alive and self.kmsg_error is None
        cg_ok = self.watcher is not None and self.watcher.alive and self.watcher.error is None
        detail = {
            "kmsg": "ok" if kmsg_ok else (self.kmsg_error or "not running"),
            "cgroups": "ok" if cg_ok else ((self.watcher.error if self.watcher else None) or "not running"),
        }
        if self.config.proc_connector:  # optional: reported, never fatal
            error = self.proc_connector_error or (self.proc_connector.error if self.proc_connector else None)
            detail["proc_connector"] = error or "ok"
        return kmsg_ok and cg_ok, detail

    # --- proc connector witness -------------------------------------------------------------------------

    def _process_forked(self, fork: ProcessFork) -> None:
        """A child starts in its parent's cgroup. It may be moved right after (runc forks its init in its
        own cgroup, then moves it into the container's), and this event can arrive after a cgroup.procs
        snapshot has seen the move: what a snapshot saw is never overwritten from here."""
        cgroup = self._pids.get(fork.parent_task) or self._pids.get(fork.parent)
        if cgroup is not None and fork.child not in self._pids:
            self._pids[fork.child] = cgroup
            self._pids_by_cgroup.setdefault(cgroup, set()).add(fork.child)

    def _process_execd(self, pid: int) -> None:
        """An exec: the process is alive and settled (a container's init execs once it is in the container's
        cgroup), so /proc tells its cgroup; this is the authoritative record, it overwrites."""
        cgroup = self.cgroup_of_pid_live(pid)
        if cgroup is not None:
            self._pids[pid] = cgroup
            self._pids_by_cgroup.setdefault(cgroup, set()).add(pid)

    def _cgroup_populated(self, path: str) -> None:
        """A cgroup got its first process (a container's init): remember it, its children follow by fork."""
        self._snapshot_pids(path)

    def _process_exited(self, process_exit: ProcessExit) -> None:
        if process_exit.signal == SIGKILL:
            # Its cgroup as last seen alive: the exit event comes after the process has left it.
            self._sigkilled.append((process_exit.pid, self._pids.get(process_exit.pid), process_exit.time))

    def _deliver(self, incidents: list[Incident], live: bool) -> None:
        """Publish; a group kill first waits briefly for the exits of processes the kernel did not log, and
        whatever follows it waits its turn (incidents go out in the kernel's order)."""
        if self.proc_connector is None:
            self.publish(incidents, live)
            return
        now = time.monotonic()
        for incident in incidents:
            wait = WITNESS_SECONDS if incident.kind == "group" else 0.0
            self._awaiting_witness.append((now + wait, incident))
        self._release_witnessed(live)

    def _release_witnessed(self, live: bool, everything: bool = False) -> None:
        now = time.monotonic()
        due = 0
        while due < len(self._awaiting_witness) and (everything or self._awaiting_witness[due][0] <= now):
            due += 1
        if not due:
            return
        ready, self._awaiting_witness = self._awaiting_witness[:due], self._awaiting_witness[due:]
        self.publish([self._with_witnesses(i) if i.kind == "group" else i for _, i in ready], live)

    def _with_witnesses(self, incident: Incident) -> Incident:
        known = {p.pid for p in incident.killed} | {p["pid"] for p in incident.exiting}
        died = [{"pid": pid, "cgroup": cgroup, "signal": SIGKILL} for pid, cgroup, when in list(self._sigkilled)
                if pid not in known and cgroup and incident.group_cgroup and is_within(cgroup, incident.group_cgroup)
                and when >= incident.time - 2.0]
        if not died:
            return incident
        incident = replace(incident, died_with=tuple(died))
        return replace(incident, explanation=explain(incident, self.posture.single_process_oom_kill()))

    def _witness_timeout(self) -> Optional[float]:
        if not self._awaiting_witness:
            return None
        return max(0.0, self._awaiting_witness[0][0] - time.monotonic())  # the first holds the rest back

    # --- publishing ----------------------------------------------------------------------------------

    def publish(self, incidents: list[Incident], live: bool) -> None:
        for incident in incidents:
            if not self.store.publish(incident, observe_latency=live):
                continue
            data = incident.to_json()
            log.info("OOM %s kill: %s", incident.kind, incident.explanation)
            if self.events_file is not None:
                self.events_file.write(data)
            if self.pod_events is not None and incident.workload.pod:
                self.pod_events.record(incident)
        self._save_cursor()

    def _pending_since_seq(self) -> Optional[int]:
        """The first record not yet fully published: the correlator's open work, or an incident waiting for
        its witnesses (from its summary on: a crash then loses only its header's trigger and usage)."""
        seqs = [self.correlator.pending_since_seq] + [i.kernel_seq for _, i in self._awaiting_witness]
        seqs = [s for s in seqs if s is not None]
        return min(seqs) if seqs else None

    def _save_cursor(self) -> None:
        pending = self._pending_since_seq()
        cursor = pending - 1 if pending is not None else self.correlator.last_seq
        if cursor is None and self.store.cursor_seq is not None:
            cursor = self.store.cursor_seq
        self.store.set_cursor(self.boot_id, cursor, self.kmsg_source)
        if self.config.state_dir:
            try:
                save_state(self.store, self.config.state_dir)
            except OSError as exc:
                log.error("cannot write state to %s: %s", self.config.state_dir, exc)

    # --- kernel log thread ---------------------------------------------------------------------------

    def _handle(self, item, live: bool) -> bool:
        """One reader item; True when it published something."""
        if isinstance(item, KmsgRecord):
            errors_before = self.correlator.stats.parse_errors
            out = self.correlator.feed(item)
            self.store.count_kmsg(records=1, parse_errors=self.correlator.stats.parse_errors - errors_before)
            if out:
                self._deliver(out, live)
                return True
        elif isinstance(item, Lost):
            self.correlator.lost(item.count or 0)
            self.store.count_kmsg(lost=item.count or 0)
            log.warning("kernel log: %s records lost before they could be read", item.count or "some")
        elif isinstance(item, Garbled):
            self.store.count_kmsg(parse_errors=1)
        return False

    def _replay_saved_log(self) -> None:
        """--kmsg names a saved log: publish its incidents once, then keep serving."""
        try:
            for item in read_saved_log(self.config.kmsg):
                self._handle(item, live=False)
        except OSError as exc:
            self.kmsg_error = explain_open_error(self.config.kmsg, exc)
            log.error("cannot read saved kernel log: %s", self.kmsg_error)
            return
        self.publish(self.correlator.flush(), live=False)
        self.kmsg_alive = True
        log.info("replayed saved kernel log %s: %d incidents", self.config.kmsg, len(self.store.snapshot().incidents))

    def _kmsg_loop(self) -> None:
        if self._kmsg_factory is LiveKmsg and is_saved_log(self.config.kmsg):
            self._replay_saved_log()
            return
        reader = self._open_kernel_log()
        if reader is None:
            return
        self.kmsg_alive = True
        live = False
        last_record = time.monotonic()
        try:
            while not self._stop.is_set():
                published = False
                for item in reader.read_available():
                    published |= self._handle(item, live)
                    last_record = time.monotonic()
                if not published:
                    self._advance_cursor_only()
                live = True
                if self._stop.is_set():
                    break
                timeouts = [t for t in (self.config.quiet_seconds if self.correlator.pending else None,
                                        self._witness_timeout()) if t is not None]
                got_records = reader.wait(min(timeouts) if timeouts else None, self._wake_r)
                self._release_witnessed(live)
                if got_records or self._stop.is_set():
                    continue
                # Quiet long enough: an incident still open is complete (a wake-up with nothing new is not
                # quiet, the kernel may be between two lines of one group listing).
                if self.correlator.pending and time.monotonic() - last_record >= self.config.quiet_seconds:
                    self._deliver(self.correlator.flush(), live)
        except Exception as exc:
            self.kmsg_error = f"kernel log reader stopped: {exc}"
            log.exception("kernel log reader stopped")
        finally:
            self.kmsg_alive = False
            reader.close()

    def _open_kernel_log(self):
        """The live kernel log (see sources.kmsg.open_kernel_log); None, with the reason in `kmsg_error`,
        when it cannot be read."""
        try:
            opened = open_kernel_log(self.config.kmsg, self._cursor_for,
                                     None if self._kmsg_factory is LiveKmsg else self._kmsg_factory)
        except KmsgUnavailable as exc:
            self.kmsg_error = str(exc)
            log.error("kernel log unavailable: %s; serving cgroup metrics only", exc)
            return None
        if opened.fallback:
            log.warning("%s; reading the kernel log through syslog(2) instead, woken by memory.events changes "
                        "(and every %.0f s)", opened.fallback, opened.reader.fallback_interval)
        self.kmsg_source = opened.source
        return opened.reader

    def _cursor_for(self, source: str) -> Optional[int]:
        """The saved cursor, when it was written by the same boot and the same kind of reader (sequence
        numbers from /dev/kmsg and timestamps from syslog(2) do not mix)."""
        if self.store.boot_id != self.boot_id or self.store.cursor_source != source:
            return None
        return self.store.cursor_seq

    def _advance_cursor_only(self) -> None:
        pending = self._pending_since_seq()
        cursor = pending - 1 if pending is not None else self.correlator.last_seq
        self.store.set_cursor(self.boot_id, cursor)

    # --- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        if self.config.state_dir:
            outcome = load_state(self.store, self.config.state_dir, self.boot_id)
            if outcome.startswith("corrupt"):
                log.error("state file in %s is corrupt: %s", self.config.state_dir, outcome)
            else:
                log.info("state in %s: %s", self.config.state_dir, outcome)
        if self.events_file is not None:
            self.events_file.open()
        self.watcher = CgroupWatcher(self.fs, on_added=self._cgroup_added, on_removed=self._cgroup_removed,
                                     on_events=self._cgroup_events, on_populated=self._cgroup_populated)
        for path in self.watcher.start_watching():
            self._cgroup_added(path)
        self._cgns_prefix = self._find_cgroup_namespace_prefix()
        if self._cgns_prefix:
            log.info("in a cgroup namespace rooted at %s: /proc/<pid>/cgroup paths are taken relative to it",
                     self._cgns_prefix)
        self._watcher_thread = threading.Thread(target=self.watcher.run, name="cgroups", daemon=True)
        self._watcher_thread.start()
        self.http = HttpSink(self.config.listen, self.registry, self.store, self.health)
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
        if self.pod_index is not None:
            self.pod_index.start()
        if self.pod_events is not None:
            self.pod_events.start()
        self._kmsg_thread = threading.Thread(target=self._kmsg_loop, name="kmsg", daemon=True)
        self._kmsg_thread.start()
        log.info("oomwatch agent listening on %s:%d (cgroups %s, kernel log %s)", *self.http.address,
                 self.config.cgroup_root, self.config.kmsg)

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # already pending

    def stop(self) -> None:
        self._stop.set()
        self._wake()
        if self.watcher is not None:
            self.watcher.stop()
        if hasattr(self, "_kmsg_thread"):
            self._kmsg_thread.join(timeout=5)
        # Incidents finished but held back are complete: publish them. One still being printed is left
        # to the next start, which re-reads the log from its first record (the cursor stops before it).
        self._deliver(self.correlator.release_finished(), live=True)
        self._release_witnessed(live=True, everything=True)
        if self.proc_connector is not None:
            self.proc_connector.stop()
        if self.pod_events is not None:
            self.pod_events.stop()
        if self.pod_index is not None:
            self.pod_index.stop()
        if self.http is not None:
            self.http.stop()
        if self.events_file is not None:
            self.events_file.close()

    def run_until_signalled(self) -> int:
        stop = threading.Event()
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            stop.wait()  # nothing to do here until a signal: the work happens on the source threads
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.stop()
        log.info("oomwatch agent stopped")
        return 0
