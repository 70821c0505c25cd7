"""The agent's wiring, and the two smoke tests that start it: SIGTERM flushes the state and exits 0 (and a
second agent on the same state directory exits 2); a source that fails makes /healthz 503 and the process
exit 1. What the agent decides is tested through Pipeline.step() without threads (tests/test_pipeline_*.py);
the kernel-log source's choices (a missing log, the syslog(2) fallback) are tested on the source here."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from oomwatch.config import Config
from tests.conftest import BOOT_TIME, CAPTURES, FIXTURES, REPO, base_url, http_get, raw_records, wait_for

SCENARIOS = raw_records(CAPTURES / "linux-6.1-memcg-scenarios.kmsg")
GOLDEN = FIXTURES / "golden" / "memcg-scenarios"


def seq_of(record: bytes) -> int:
    return int(record.split(b",", 2)[1])


def upto(seq: int) -> list[bytes]:
    return [r for r in SCENARIOS if seq_of(r) <= seq]


def agent_config(tmp_path: Path, **overrides) -> Config:
    values = dict(kmsg="/dev/kmsg-test", cgroup_root=str(GOLDEN / "cgroup"), proc=str(GOLDEN / "proc"),
                  listen="127.0.0.1:0", kube_api="off", boot_time=BOOT_TIME, state_dir=str(tmp_path / "state"),
                  events_file=str(tmp_path / "events.jsonl"), kubelet_config=str(tmp_path / "none.yaml"),
                  run_root=str(tmp_path / "run"), pod_log_dir=str(tmp_path / "pods"), quiet_seconds=0.1)
    values.update(overrides)
    return Config(**values)


def events(tmp_path: Path) -> list[dict]:
    path = tmp_path / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_explain_open_error_names_the_fix() -> None:
    import errno

    from oomwatch.sources.kmsg import explain_open_error

    text = explain_open_error("/dev/kmsg", OSError(errno.EPERM, "Operation not permitted"))
    assert "CAP_SYSLOG" in text and "dmesg_restrict" in text
    assert "does not exist" in explain_open_error("/dev/kmsg", OSError(errno.ENOENT, "No such file"))


def test_env_vars_configure_every_option(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from oomwatch import cli

    seen = {}

    class FakeAgent:
        def __init__(self, config, early_pump=None):
            seen["config"] = config

        def run_until_signalled(self):
            return 0

    env = {"OOMWATCH_LISTEN": "127.0.0.1:9999", "OOMWATCH_EVENTS_FILE": "-", "OOMWATCH_STATE_DIR": "/tmp/s",
           "OOMWATCH_CGROUP_ROOT": "/cg", "OOMWATCH_KMSG": "/k", "OOMWATCH_PROC": "/p", "OOMWATCH_NODE_NAME": "n1",
           "OOMWATCH_KUBE_API": "off", "OOMWATCH_GRACE_PERIOD": "5"}
    import oomwatch.agent as agent_module

    original = agent_module.Agent
    agent_module.Agent = FakeAgent
    try:
        result = CliRunner().invoke(cli.main, ["agent"], env=env)
    finally:
        agent_module.Agent = original
    assert result.exit_code == 0, result.output
    c = seen["config"]
    assert (c.listen, c.events_file, c.state_dir, c.cgroup_root, c.kmsg, c.proc, c.node_name, c.kube_api,
            c.grace_period) == ("127.0.0.1:9999", "-", "/tmp/s", "/cg", "/k", "/p", "n1", "off", 5.0)


def test_bad_listen_address_is_a_clear_error() -> None:
    from click.testing import CliRunner

    from oomwatch import cli

    result = CliRunner().invoke(cli.main, ["agent", "--listen", "localhost"])
    assert result.exit_code == 2
    assert "HOST:PORT" in result.output


def test_sigterm_stops_cleanly_with_state_flushed_and_a_second_agent_is_refused(tmp_path: Path) -> None:
    """Smoke test of the process: `oomwatch agent` replays a saved log, a second agent on its state directory
    exits 2 without touching it, SIGTERM makes the first exit 0 with its state saved."""
    from oomwatch.agent import Agent

    oomwatch = Path(sys.executable).with_name("oomwatch")
    kmsg = str(CAPTURES / "linux-6.1-memcg-scenarios.kmsg")
    args = [str(oomwatch), "agent", "--listen", "127.0.0.1:0", "--kmsg", kmsg,
            "--cgroup-root", str(GOLDEN / "cgroup"), "--proc", str(GOLDEN / "proc"), "--kube-api", "off", "--state-dir", str(tmp_path / "state"),
            "--events-file", str(tmp_path / "events.jsonl")]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: len(events(tmp_path)) == 4, timeout=120)  # bounds a loaded machine's start
        second = Agent(agent_config(tmp_path / "second", kmsg=kmsg, state_dir=str(tmp_path / "state")))
        assert second.run_until_signalled() == 2
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "agent stopped" in stderr
    state = json.loads((tmp_path / "state" / "state.json").read_text())
    assert len(state["incidents"]) == 4


def test_a_failed_source_is_503_with_the_reason_then_the_agent_exits_1(tmp_path: Path, monkeypatch) -> None:
    """Smoke test of the health wiring: no kernel log (not fatal: cgroup metrics go on) and a cgroup watcher
    that dies (fatal): /healthz says both with 503 while /metrics still serves the tree, then the process
    exits 1 so that it is restarted. The agent is held from stopping until the scraper has seen the 503 (a
    loaded machine may not schedule the scraper within any grace period): the test waits for that state."""
    import errno
    import shutil
    import threading

    import oomwatch.agent as agent_module
    from oomwatch.agent import Agent
    from oomwatch.sources.inotify import INotify

    def goes_bad(self, timeout=None):
        raise OSError(errno.EBADF, "the inotify descriptor went bad")

    monkeypatch.setattr(INotify, "read", goes_bad)  # at the watcher's first event: it stops, and says why
    monkeypatch.setattr(agent_module, "FATAL_GRACE_SECONDS", 0.5)
    tree = tmp_path / "cgroup"
    shutil.copytree(GOLDEN / "cgroup", tree)
    agent = Agent(agent_config(tmp_path, kmsg=str(tmp_path / "no-such-kmsg"), cgroup_root=str(tree)))
    seen: dict = {}
    scraped = threading.Event()
    stop = agent.stop

    def stop_once_scraped() -> None:  # the agent serves until the scraper saw what this test asserts
        scraped.wait(120)
        stop()

    monkeypatch.setattr(agent, "stop", stop_once_scraped)

    def scrape() -> None:
        def served() -> bool:
            (tree / "a" / "memory.events").write_text("oom 0\n")  # an event for the watcher (it then fails)
            try:
                seen["health"] = http_get(base_url(agent) + "/healthz")
                seen["metrics"] = http_get(base_url(agent) + "/metrics")
            except (AttributeError, TypeError, OSError):  # not listening yet
                return False
            # every part says its own failure from its own thread: wait for all that is asserted below
            health = json.loads(seen["health"][1])
            return seen["health"][0] == 503 and "fatal" in health and health.get("kmsg", "ok") != "ok"
        try:
            wait_for(served, timeout=120)
        finally:
            scraped.set()

    scraper = threading.Thread(target=scrape)
    scraper.start()
    assert agent.run_until_signalled() == 1
    scraper.join()
    status, body = seen["health"]
    health = json.loads(body)
    assert status == 503
    assert "no-such-kmsg does not exist" in health["kmsg"]
    assert "the inotify descriptor went bad" in health["cgroups"]
    assert seen["metrics"][0] == 200
    assert b'oomwatch_memory_limit_bytes{cgroup="/a",container="",namespace="",pod=""} 6.7108864e+07' in \
        seen["metrics"][1]


def test_a_missing_kernel_log_is_unhealthy_and_named(tmp_path: Path) -> None:
    from oomwatch.sources.kernellog import KernelLogSource

    emitted: list = []
    source = KernelLogSource(str(tmp_path / "no-such-kmsg"), emitted.append)
    assert source.open(lambda kind: None) is None
    source.start()  # its reading fails on its thread
    assert wait_for(lambda: not source.health()[0], timeout=60)
    assert "no-such-kmsg does not exist" in source.health()[1]
    assert emitted == []
    source.stop()


def test_a_refused_device_falls_back_to_syslog(monkeypatch) -> None:
    """An unprivileged container: open("/dev/kmsg") fails with EPERM (device cgroup), syslog(2) works with
    CAP_SYSLOG. The source reads through syslog(2), its reads are the syslog kind, and the cursor it is given
    is the syslog one. (What wakes it, and how its reads settle memory.events: tests/test_pipeline_counts.py.)
    """
    import errno

    import oomwatch.sources.klog as klog_module
    from oomwatch.events import KernelLog
    from oomwatch.sources.kernellog import KernelLogSource
    from oomwatch.sources.klog import SyslogKmsg
    from oomwatch.sources.kmsg import KmsgUnavailable, LiveKmsg
    from tests.test_klog import FakeKlogctl, syslog_lines

    def refuse(self, after_seq=None):
        raise KmsgUnavailable("/dev/kmsg: permission denied") from PermissionError(errno.EPERM, "denied")

    monkeypatch.setattr(LiveKmsg, "open", refuse)
    kernel = FakeKlogctl(syslog_lines(upto_seq=521))
    monkeypatch.setattr(klog_module, "SyslogKmsg", lambda: SyslogKmsg(syscall=kernel, fallback_interval=3600))
    emitted: list = []
    asked: list = []
    source = KernelLogSource("/dev/kmsg", emitted.append)
    source.open(lambda kind: asked.append(kind))
    try:
        assert source.kind == "syslog" and asked == ["kmsg", "syslog"]
        source.start()
        assert wait_for(lambda: any(isinstance(e, KernelLog) and e.items for e in emitted), timeout=60)
        assert source.health() == (True, "ok")
    finally:
        source.stop()


@pytest.mark.tools
def test_promtool_finds_nothing_to_complain_about(tmp_path: Path) -> None:
    from oomwatch.events import KernelLog
    from tests.replay import Replay, live_reads, live_settings, tree_events

    promtool = shutil.which("promtool", path=f"{REPO / '.cache/tools/bin'}:{os.environ.get('PATH', '')}")
    assert promtool, "promtool missing: scripts/test installs Debian's prometheus package"
    replay = Replay(live_settings(boot_time=BOOT_TIME), now=BOOT_TIME + 24.0)
    replay.run(tree_events(GOLDEN / "cgroup"))
    for items in live_reads(SCENARIOS):
        replay.step(KernelLog(items, drained_at=replay.now))
    replay.settle()
    assert len(replay.published) == 4
    metrics = replay.metrics(agent_config(tmp_path))
    result = subprocess.run([promtool, "check", "metrics"], input=metrics, capture_output=True)
    assert result.returncode == 0 and result.stdout == b"" and result.stderr == b"", result
