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
from oomwatch.events import PostureRead, StateSaved, Stop, Tick
from oomwatch.node import NodePosture, host_boot_time, scraped_workloads
from oomwatch.pipeline import Effects, Pipeline, Settings, View
from oomwatch.process import malloc_trimmed
from oomwatch.sinks import EventsFileSink, LogSink, PodEventSink, Sink, StateFileSink
from oomwatch.sinks.collector import OomwatchCollector
from oomwatch.sinks.events import EventsFile
from oomwatch.sinks.http import HttpSink
from oomwatch.sources.cgroupfs import CgroupFS, Proc
from oomwatch.sources.cgroupsource import CgroupSource, ProcessSource, cgroup_namespace_prefix
from oomwatch.sources.kernellog import KernelLogSource
from oomwatch.sources.procconn import ProcConnector, ProcConnectorUnavailable
from oomwatch.sources.statcache import StatCache
from oomwatch.statefile import StateFile, StateLocked
from oomwatch.store import Store
from oomwatch.workloads import WorkloadResolver
from oomwatch.workloads.runtime import RuntimeNames

log = logging.getLogger("oomwatch.agent")

# A source that failed for good: /healthz says 503 this long before the process exits non-zero (so the DaemonSet
# or systemd restarts it).
FATAL_GRACE_SECONDS = 30.0
POSTURE_MAX_AGE = 60.0  # the kubelet's config is read again at an incident when older than this
VIEW_INTERVAL = 0.2  # while events keep coming, scrapes see a snapshot at most this old


class Agent:
    def __init__(self, config: Config, clock: Callable[[], float] = time.time,
                 kmsg_factory: Optional[Callable] = None, early_pump=None) -> None:
        self.config, self.clock = config, clock
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.fs, self.proc = CgroupFS(config.cgroup_root), Proc(config.proc)
        self.posture = NodePosture(config, self.proc)
        self.pod_index = _pod_index(config)
        names = RuntimeNames(run_root=config.run_root, pod_log_root=config.pod_log_dir)
        self.stat_cache = StatCache(self.fs)
        self.kernel_log = KernelLogSource(config.kmsg, self.events.put, factory=kmsg_factory, early_pump=early_pump)
        self.cgroups = CgroupSource(self.fs, WorkloadResolver(names, self.pod_index), self.events.put,
                                    stat_cache=self.stat_cache, on_kill=self.kernel_log.wake)
        self.state = StateFileSink(StateFile(config.state_dir)) if config.state_dir else None
        self.sinks: list[Sink] = [LogSink(log)] + _sinks(config, self.pod_index)
        self.store = Store(grace_seconds=config.grace_period)
        self.view: Optional[View] = None
        self.http: Optional[HttpSink] = None
        self.connector: Optional[ProcConnector] = None
        self.connector_error: Optional[str] = None
        self.fatal: Optional[str] = None
        self._wake = threading.Event()  # a signal, or a source that failed for good
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        extra = self.state.load(self.store, self.proc.boot_id()) if self.state else {}
        boot_id = self.proc.boot_id()
        # The kernel log first: records are lost while anything slow runs before the reader does.
        skip = self.kernel_log.open(lambda kind: self.store.cursor_seq if (
            self.store.boot_id == boot_id and self.store.cursor_source == kind) else None)
        self.cgroups.start()
        live = self.kernel_log.kind is not None
        settings = Settings(boot_id=boot_id, boot_time=self.config.boot_time or host_boot_time(),
                            kmsg_source=self.kernel_log.kind, counting=live, quiet=self.config.quiet_seconds,
                            witness_wait=0.5 if self.config.proc_connector else 0.0,
                            persist=self.state is not None, skip_upto=skip, saved_log=self.kernel_log.saved)
        self.pipeline = Pipeline(settings, self.store, WorkloadResolver(RuntimeNames(read_files=False),
                                                                        self.pod_index),
                                 now=self.clock(), accounts=extra.get("accounts"),
                                 single_process_oom_kill=self.posture.single_process_oom_kill())
        self._posture_at = time.monotonic()
        self.view = self.pipeline.view()
        for sink in self.sinks:
            sink.start(self.store.snapshot().incidents)
        self._thread(self.cgroups.run, "cgroups", fatal="cgroup watcher stopped")
        self._thread(self._loop, "pipeline")
        latest = _Latest(lambda: self.view)
        self.collector = OomwatchCollector(latest, lambda: scraped_workloads(
            self.view.workloads, self.stat_cache, self.fs, self.cgroups.watcher.unwatched_limits),
            lambda: self.posture.info_with(self.view.single_process_oom_kill),
            cgroup_parse_errors=lambda: self.fs.parse_errors, drop=self.config.drop_series)
        self.http = _http(self.config, self._metrics, latest, self.health)
        self.http.start()
        if self.config.proc_connector:
            self._start_connector()
        if self.pod_index is not None:
            self.pod_index.start()
        self.kernel_log.start()
        log.info("oomwatch agent listening on %s:%d (cgroups %s, kernel log %s)", *self.http.address,
                 self.config.cgroup_root, "syslog(2)" if self.kernel_log.kind == "syslog" else self.config.kmsg)

    def _start_connector(self) -> None:
        source = ProcessSource(self.proc, self.events.put, cgroup_namespace_prefix(self.proc, self.cgroups.own_cgroup))
        connector = ProcConnector(source.exited, self.clock, on_fork=source.forked, on_exec=source.execd)
        try:
            connector.start()
            self.connector = connector
        except ProcConnectorUnavailable as exc:
            self.connector_error = str(exc)
            log.error("%s; group kills are reported from the kernel log alone", exc)

    def _thread(self, target: Callable[[], None], name: str, fatal: Optional[str] = None) -> None:
        def run() -> None:
            target()
            if fatal and not self._wake.is_set():
                self._fail(fatal)
        thread = threading.Thread(target=run, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _loop(self) -> None:
        """The one loop: each event through the pipeline, then what it asks for."""
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
            for sink in self.sinks:
                try:
                    sink.publish(incident)
                except Exception:  # one sink's failure (an API hiccup) must not cost the others or the next
                    log.exception("sink %s could not take an incident", type(sink).__name__)
        if fx.save is not None and self.state is not None:
            self.state.flush(fx.save)
            for sink in self.sinks:
                sink.flush(fx.save)
            self._apply(self.pipeline.step(StateSaved(self.state.error), self.clock()))
        if fx.wake_kernel_log:
            self.kernel_log.wake()
        if fx.fatal:
            self._fail(fx.fatal)
        if fx.publish and time.monotonic() - self._posture_at > POSTURE_MAX_AGE:
            self._posture_at = time.monotonic()
            self.events.put(PostureRead(self.posture.single_process_oom_kill()))
        if fx.changed or fx.done:
            if fx.done or self.events.empty() or self.clock() - self._view_at >= VIEW_INTERVAL:
                self.view, self._view_at = self.pipeline.view(), self.clock()
        # (the view is replaced whole: a scrape holds the one it took)

    _view_at = 0.0

    def _metrics(self, accept: str):
        content_type, chunks = self.collector.metrics(accept)
        return content_type, malloc_trimmed(chunks)

    def health(self) -> tuple[bool, dict]:
        kmsg_ok, kmsg = self.kernel_log.health()
        watcher = self.cgroups.watcher
        cgroups_ok = watcher.alive and watcher.error is None
        detail = {"kmsg": kmsg, "cgroups": "ok" if cgroups_ok else (watcher.error or "not running")}
        if self.fatal:
            detail["fatal"] = self.fatal
        if self.view is not None and self.view.state_error:  # reported, not fatal: counting goes on in memory
            detail["state"] = self.view.state_error
        if self.config.proc_connector:  # optional: reported, never fatal
            detail["proc_connector"] = self.connector_error or (self.connector.error if self.connector else None) or "ok"
        return kmsg_ok and cgroups_ok and not self.fatal, detail

    def _fail(self, why: str) -> None:
        self.fatal = self.fatal or why
        self._wake.set()

    def stop(self) -> None:
        """Sources first, then the loop publishes what is finished and saves; then the sinks close."""
        self._wake.set()
        self.kernel_log.stop()
        self.cgroups.stop()
        if self.connector is not None:
            self.connector.stop()
        loop = next((t for t in self._threads if t.name == "pipeline"), None)
        if loop is not None and loop.is_alive():
            self.events.put(Stop())
            loop.join()
        for sink in self.sinks:
            sink.close()
        if self.pod_index is not None:
            self.pod_index.stop()
        if self.http is not None:
            self.http.stop()
        self.stat_cache.close()
        if self.state is not None:
            self.state.close()

    def run_until_signalled(self) -> int:
        signalled = threading.Event()

        def on_signal(*_) -> None:
            signalled.set()
            self._wake.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        rc = 0
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
                rc = 1
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.stop()
        log.info("oomwatch agent stopped")
        return rc


def _pod_index(config: Config):
    if config.kube_api == "off":
        return None
    from oomwatch.workloads.kubeapi import PodIndex

    return PodIndex.from_environment(node_name=config.node_name)


def _sinks(config: Config, pod_index) -> list[Sink]:
    sinks: list[Sink] = []
    if config.events_file:
        sinks.append(EventsFileSink(EventsFile(config.events_file, hold=bool(config.state_dir))))
    if pod_index is not None and config.pod_events:
        from oomwatch.sinks.k8s_events import PodEventRecorder

        recorder = PodEventRecorder.from_environment(node_name=config.node_name)
        if recorder is not None:
            sinks.append(PodEventSink(recorder))
    return sinks


def _http(config: Config, metrics, latest: "_Latest", health) -> HttpSink:
    web = tls = None
    if config.web_config_file:
        from oomwatch.sinks.webconfig import load_web_config

        web, tls = load_web_config(config.web_config_file)  # checked by the CLI already
    return HttpSink(config.listen, metrics, latest, health, web=web, tls=tls)


class _Latest:
    """The store the HTTP sink asks for /incidents: the pipeline's latest snapshot."""

    def __init__(self, view: Callable[[], Optional[View]]) -> None:
        self._view = view

    def snapshot(self):
        return self._view().store
