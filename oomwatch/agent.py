"""The long-running agent: wiring only (docs/loop.md has the picture).

Sources read and emit events onto one queue: the kernel log (sources.kernellog: a reader process and its pump
thread), the cgroup tree (sources.cgroupsource, on the "cgroups" thread) and the proc connector. One loop, on
the "pipeline" thread, takes each event, lets `Pipeline.step(event, now)` decide, and applies what it returns:
sinks publish, the state file is written, the kernel log is woken, and scrapes get the pipeline's new snapshot.
The main thread waits for SIGTERM/SIGINT or a source that failed for good, then stops everything in order.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from typing import Callable, Optional

from oomwatch.config import Config
from oomwatch.events import StateSaved, Stop, Tick
from oomwatch.node import (NodePosture, cgroup_root_problem, host_boot_time, node_layout, node_resolver,
                           scraped_workloads)
from oomwatch.pipeline import Effects, Pipeline, Settings, View
from oomwatch.process import freeze_long_lived, malloc_trimmed, nice_this_thread
from oomwatch.sinks import EventsFileSink, LogSink, PodEventSink, Sink, StateFileSink
from oomwatch.sinks.collector import AGENT_CHECKS, AgentStatus, OomwatchCollector
from oomwatch.sinks.events import EventsFile
from oomwatch.sinks.http import HttpSink
from oomwatch.sources.cgroupfs import CgroupFS, Proc
from oomwatch.sources.cgroupsource import CgroupSource, ProcessSource, cgroup_namespace_prefix
from oomwatch.sources.containerlog import ContainerLogs
from oomwatch.sources.kernellog import KernelLogSource
from oomwatch.sources.kubeletconfig import KubeletConfigWatch
from oomwatch.sources.procconn import ProcConnector, ProcConnectorUnavailable
from oomwatch.sources.raylet import RayletLogs
from oomwatch.sources.statcache import StatCache
from oomwatch.statefile import StateFile, StateLocked
from oomwatch.store import Store
from oomwatch.workloads import WorkloadResolver
from oomwatch.workloads.runtime import RuntimeNames

log = logging.getLogger("oomwatch.agent")

# A source that failed for good: /healthz says 503 this long before the process exits non-zero (so the DaemonSet
# or systemd restarts it).
FATAL_GRACE_SECONDS = 30.0
VIEW_INTERVAL = 0.2  # while events keep coming, scrapes see a snapshot at most this old
LOOP_NICE = -5


class Agent:
    def __init__(self, config: Config, clock: Callable[[], float] = time.time,
                 kmsg_factory: Optional[Callable] = None, early_pump=None) -> None:
        self.config, self.clock = config, clock
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.fs, self.proc = CgroupFS(config.cgroup_root), Proc(config.proc)
        self.posture = NodePosture(config, self.proc)
        self.pods = _pod_source(config, self.events.put)  # the API server's pods, as events (None: no API)
        self.stat_cache = StatCache(self.fs)
        self.kubelet_config = KubeletConfigWatch(config.kubelet_config, self.posture.single_process_oom_kill,
                                                 self.events.put)
        self.kernel_log = KernelLogSource(config.kmsg, self.events.put, factory=kmsg_factory, early_pump=early_pump,
                                          queued=self.events.qsize)
        self.layout = node_layout(config.kubelet_config)  # Kubernetes identities only below the kubelet's root
        names = node_resolver(config, self.layout)  # the bundles' names, read by the source
        self.cgroups = CgroupSource(self.fs, names, self.events.put, stat_cache=self.stat_cache,
                                    on_kill=self.kernel_log.wake)
        self.container_logs, self.raylet = ContainerLogs(config.pod_log_dir), RayletLogs(self.fs, config.proc)
        self.state = StateFileSink(StateFile(config.state_dir)) if config.state_dir else None
        self.sinks: list[Sink] = [LogSink(log)] + _sinks(config, self.pods)
        self.store = Store(grace_seconds=config.grace_period)
        self.latest = _Latest(clock)  # the view scrapes and /healthz read
        self.http: Optional[HttpSink] = None
        self.connector: Optional[ProcConnector] = None
        self.fatal: Optional[str] = None  # why the agent must stop (a source failed for good)
        self._wake = threading.Event()  # a signal, or a source that failed for good
        self._loop_thread = threading.Thread(target=self._loop, name="pipeline", daemon=True)
        self.blind: Optional[str] = None  # why it cannot see the cgroups
        self.starting: Optional[str] = "reading the cgroup tree"  # /healthz says so until the first full scan

    def start(self) -> None:
        self.blind = _blind(self.config, self.posture)  # why it cannot see the cgroups (a missing root raises)
        boot_id = self.proc.boot_id()
        extra = self.state.load(self.store, boot_id) if self.state else {}
        # The kernel log first: records are lost while anything slow runs before the reader does.
        skip = self.kernel_log.open(lambda kind: self.store.cursor_seq if (
            self.store.boot_id == boot_id and self.store.cursor_source == kind) else None)
        # Listen before the tree is read (100,000 cgroups took 67 s): /healthz answers "starting" (503: not ready,
        # and no liveness failure: /livez) and /metrics and /incidents serve the restored state meanwhile.
        self.latest.view = View(self.store.snapshot(), (), self.posture.single_process_oom_kill(),
                                self.state.error if self.state else None)
        self.collector = _collector(self, self.latest)
        self.http = _http(self.config, self._metrics, self.latest, lambda: health_of(self))
        self.http.start()
        if self.pods is not None:  # the first pod list comes while the tree is read
            self.pods.start()
        self.cgroups.start()
        self.pipeline = _pipeline(self, boot_id, skip, extra)
        while not self.events.empty():  # the tree as found, before the first scrape: /metrics is whole from then
            self._apply(self.pipeline.step(self.events.get_nowait(), self.clock()))
        self.latest.view = self.pipeline.view()  # scrapes see this until it is replaced
        self.starting = None
        freeze_long_lived()
        for sink in self.sinks:
            sink.start(self.store.snapshot().incidents)
        threading.Thread(target=_until_failed, args=(self, self.cgroups.run, "the cgroup watcher stopped",
                                                     self.cgroups.watcher.close), name="cgroups", daemon=True).start()
        self._loop_thread.start()
        if self.config.proc_connector:
            self.connector = _connector(self.proc, self.events.put, self.cgroups.own_cgroup, self.clock)
        self.kubelet_config.start()
        self.kernel_log.start()
        log.info("oomwatch agent listening on %s:%d (cgroups %s, kernel log %s)", *self.http.address,
                 self.config.cgroup_root, "syslog(2)" if self.kernel_log.kind == "syslog" else self.config.kmsg)

    def _loop(self) -> None:  # the one loop: each event through the pipeline, then what it asks for
        nice_this_thread(LOOP_NICE)  # keeps up with a storm's runnable OOMing tasks, where it may (CAP_SYS_NICE)
        try:
            while True:
                deadline = self.pipeline.next_deadline()
                try:
                    event = self.events.get(timeout=None if deadline is None else max(0.0, deadline - self.clock()))
                except queue.Empty:
                    event = Tick()
                fx = self.pipeline.step(event, self.clock())
                self._apply(fx)
                if fx.done:
                    return
        except Exception as exc:
            log.exception("the pipeline stopped")
            self._fail(f"the pipeline stopped: {exc}")

    def _apply(self, fx: Effects) -> None:
        for level, message in fx.logs:
            log.log(level, "%s", message)
        for incident in fx.publish:
            publish_to(self.sinks, lambda sink: sink.publish(incident))
        hand_over(self, fx)
        if fx.wake_kernel_log:  # (the reader reads while the state is saved)
            self.kernel_log.wake()
        # Scrapes see what was published before the state save (1-2 ms a save in a storm: benchmarks/stage_cost.py)
        self.latest.offer(fx.changed, fx.done or self.events.empty(), self.pipeline.view)
        if fx.save is not None and self.state is not None:
            for sink in [self.state, *self.sinks]:  # the state first: a line never precedes what counts it
                sink.flush(fx.save)
            self._apply(self.pipeline.step(StateSaved(self.state.error), self.clock()))
        for path in fx.read_names:  # by the source that reads bundles, stepped at once (not behind a storm's queue)
            self._apply(self.pipeline.step(self.cgroups.read_names(path), self.clock()))
        if fx.fatal:
            self._fail(fx.fatal)

    def _metrics(self, accept: str):
        content_type, chunks = self.collector.metrics(accept)
        return content_type, malloc_trimmed(chunks)  # a big scrape's garbage goes back to the kernel

    def _fail(self, why: str) -> None:
        self.fatal = self.fatal or why
        self._wake.set()

    def stop(self) -> None:
        """Sources first, then the loop publishes what is finished and saves; then the sinks close."""
        self._wake.set()
        for part in (self.kernel_log, self.cgroups, self.connector, self.kubelet_config):
            if part is not None:
                part.stop()
        if self._loop_thread.is_alive():
            self.events.put(Stop())
            self._loop_thread.join()
        for part in [*self.sinks, self.state, self.stat_cache]:
            if part is not None:
                part.close()
        for part in (self.pods, self.http):
            if part is not None:
                part.stop()

    def run_until_signalled(self) -> int:
        signalled = threading.Event()

        def on_signal(*_) -> None:
            signalled.set()
            self._wake.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            try:
                self.start()
            except StateLocked as exc:
                log.error("%s", exc)
                self.state = None  # not ours: never touch it
                return 2
            self._wake.wait()  # the work happens on the loop and the source threads
            if not signalled.is_set():
                log.error("%s; exiting in %.0f s so that the service is restarted", self.fatal, FATAL_GRACE_SECONDS)
                signalled.wait(FATAL_GRACE_SECONDS)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.stop()
        log.info("oomwatch agent stopped")
        return 0 if signalled.is_set() and not self.fatal else 1


def publish_to(sinks: list[Sink], publish: Callable[[Sink], None]) -> None:
    for sink in sinks:
        try:
            publish(sink)
        except Exception:  # one sink's failure (an API hiccup) must not cost the others or the next
            log.exception("sink %s could not take what was published", type(sink).__name__)


def hand_over(agent: Agent, fx: Effects) -> None:
    """Deaths' verdicts to the sinks that show them; what the pipeline asked to be read, to the source that owns
    those files (container logs, systemd-oomd's marks, Ray's raylet.out), whose answer is stepped as an event."""
    for death in fx.deaths:
        publish_to(agent.sinks, lambda sink: sink.publish_death(death))
    answers = [*map(agent.container_logs.read, fx.read_logs), *map(agent.cgroups.read_oomd_marks, fx.read_marks),
               *map(agent.raylet.read, fx.read_ray_logs)]  # (at once: the cgroup and its last processes go soon)
    for answer in answers:
        agent.events.put(answer)


def health_of(agent: Agent) -> tuple[bool, dict]:
    """/healthz from what each part last said of itself (its own snapshot: nothing here walks a part's live
    state): 200 only while the agent can see (its kernel log and its cgroup tree), else 503 and why; 503
    "starting" until the tree has been read once and what the kernel log held at start is read and published."""
    kmsg_ok, kmsg = agent.kernel_log.health()
    view = agent.latest.view
    backlog = kmsg_ok and not agent.kernel_log.saved and view is not None and not view.kernel_log_live
    starting = agent.starting or agent.kernel_log.starting() or (
        "publishing what the kernel log held at start" if backlog else None)  # (a saved log is all backlog)
    if starting:
        return False, {"starting": starting}
    watch = agent.cgroups.health()
    # Blind: no memory controller, or cgroups this agent cannot read. Cgroups inotify cannot watch are still
    # read (at each scrape, their directories listed every 30 s): said, not failed (a restart gives no watches).
    blind = agent.blind or (watch.blind if watch.unwatched.get("unreadable") else None)
    cgroups_ok = watch.alive and watch.error is None and not blind
    detail = {"kmsg": kmsg, "cgroups": "ok" if cgroups_ok else (blind or watch.error or "not running")}
    if watch.blind and not blind:
        detail["cgroup_watch"] = watch.blind
    for part in [*agent.sinks, agent.http]:  # what each says is wrong now: events_file (said), scrape (fails)
        if part is not None:
            detail.update(part.health())
    if agent.fatal:
        detail["fatal"] = agent.fatal
    if view is not None and view.workloads_over_cap:  # blind to those: not healthy
        detail["workloads"] = f"{view.workloads_over_cap} live workloads over the cap are not exported"
    if view is not None and view.state_error:  # reported, not fatal: counting goes on in memory
        detail["state"] = view.state_error
    if agent.config.proc_connector:  # optional: reported, never fatal
        connector = agent.connector
        detail["proc_connector"] = (connector.error if connector is not None else "not running") or "ok"
    return kmsg_ok and cgroups_ok and not agent.fatal and not {"workloads", "scrape"} & set(detail), detail


def _pipeline(agent: Agent, boot_id: str, skip: Optional[int], extra: dict) -> Pipeline:
    config, kernel_log = agent.config, agent.kernel_log
    settings = Settings(boot_id=boot_id, boot_time=config.boot_time or host_boot_time(),
                        kmsg_source=kernel_log.kind, counting=kernel_log.kind is not None,
                        quiet=config.quiet_seconds, witness_wait=0.5 if config.proc_connector else 0.0,
                        persist=agent.state is not None, skip_upto=skip, saved_log=kernel_log.saved,
                        page_size=None if kernel_log.saved else os.sysconf("SC_PAGE_SIZE"),
                        read_logs=bool(config.pod_log_dir), read_names=True, pods_watched=agent.pods is not None)
    resolver = WorkloadResolver(RuntimeNames(read_files=False), layout=agent.layout,
                                trust_delegated=config.trust_delegated_cgroups)
    return Pipeline(settings, agent.store, resolver, now=agent.clock(), accounts=extra.get("accounts"),
                    single_process_oom_kill=agent.posture.single_process_oom_kill(),
                    state_error=agent.state.error if agent.state else None)


def _until_failed(agent: Agent, run: Callable[[], None], why: str, close: Callable[[], None]) -> None:
    """A source's thread: when it returns before the agent stops, the agent must stop. Then what it holds is
    released (the cgroup watcher's inotify instance: 128 a user)."""
    run()
    close()
    if not agent._wake.is_set():
        agent._fail(why)


def _blind(config: Config, posture: NodePosture) -> Optional[str]:
    problem = cgroup_root_problem(config.cgroup_root, posture.cgroup_version)
    if problem:
        log.error("cannot see the cgroups: %s; /healthz says so (503)", problem)
    return problem


def _collector(agent: Agent, latest: "_Latest") -> OomwatchCollector:
    """/metrics: the pipeline's latest snapshot, and each workload's cgroup files read at the scrape."""
    return OomwatchCollector(latest, lambda: scraped_workloads(
        agent.latest.view.workloads, agent.stat_cache, agent.fs, agent.cgroups.unwatched_limits()),
        lambda: agent.posture.info_with(agent.latest.view.single_process_oom_kill),
        cgroup_parse_errors=lambda: agent.fs.parse_errors, drop=agent.config.drop_series,
        agent_status=lambda: status_of(agent), workloads=lambda: agent.latest.view.workloads)


def status_of(agent: Agent) -> AgentStatus:
    """/healthz as series (oomwatch_agent_healthy{check}), with the parts' own counts."""
    _, detail = health_of(agent)
    checks = {c: True for c in AGENT_CHECKS if c != "proc_connector" or agent.config.proc_connector}
    checks.update({c: value == "ok" for c, value in detail.items() if c in checks})
    return AgentStatus(
        checks=checks, failed_scrapes=agent.http.failed_scrapes if agent.http is not None else 0,
        unwatched=agent.cgroups.health().unwatched,
        events_file_errors=sum(s.errors for s in agent.sinks if isinstance(s, EventsFileSink)),
        workloads_over_cap=agent.latest.view.workloads_over_cap if agent.latest.view is not None else 0)


def _connector(proc: Proc, emit, own_cgroup: Optional[str], clock) -> Optional[ProcConnector]:
    source = ProcessSource(proc, emit, cgroup_namespace_prefix(proc, own_cgroup))
    connector = ProcConnector(source.exited, clock, on_fork=source.forked, on_exec=source.execd)
    try:
        connector.start()
    except ProcConnectorUnavailable as exc:
        connector.error = str(exc)
        log.error("%s; group kills are reported from the kernel log alone", exc)
    return connector


def _pod_source(config: Config, emit):
    if config.kube_api == "off":
        return None
    from oomwatch.sources.pods import PodSource

    return PodSource.from_environment(emit, node_name=config.node_name)


def _sinks(config: Config, pods) -> list[Sink]:
    sinks: list[Sink] = []
    if config.events_file:
        sinks.append(EventsFileSink(EventsFile(config.events_file, hold=bool(config.state_dir))))
    if pods is not None and config.pod_events:
        from oomwatch.sinks.k8s_events import PodEventRecorder

        recorder = PodEventRecorder.from_environment(node_name=config.node_name)
        if recorder is not None:
            sinks.append(PodEventSink(recorder))
    from oomwatch.sinks.journal import JournalSink, journal_wanted

    if journal_wanted(config.journal):  # kills in systemd units, beside the unit's own lines
        sinks.append(JournalSink())
    if config.slurm_admin_comment:  # kills in Slurm jobs, where `scontrol show job` shows them
        from oomwatch.sinks.slurm import SlurmAdminCommentSink

        sinks.append(SlurmAdminCommentSink())
    return sinks


def _http(config: Config, metrics, latest: "_Latest", health) -> HttpSink:
    web = tls = None
    if config.web_config_file:
        from oomwatch.sinks.webconfig import load_web_config

        web, tls = load_web_config(config.web_config_file)  # checked by the CLI already
    return HttpSink(config.listen, metrics, latest, health, web=web, tls=tls)


class _Latest:
    """The pipeline's latest view, which scrapes, /incidents and /healthz read: replaced whole once something
    changed, at once when the loop is idle, else every VIEW_INTERVAL while busy (a change seen while busy is kept
    until then)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.view: Optional[View] = None
        self._clock = clock
        self._at, self._stale = 0.0, False

    def offer(self, changed: bool, idle: bool, make: Callable[[], View]) -> None:
        self._stale = self._stale or changed
        if self._stale and (idle or self._clock() - self._at >= VIEW_INTERVAL):
            self.view, self._at, self._stale = make(), self._clock(), False

    def snapshot(self):  # the store the HTTP sink asks for /incidents
        return self.view.store
