"""The real agent on fixture trees, with a stand-in /dev/kmsg: restarts, lost records, health, signals,
live cgroup changes, and promtool on its /metrics."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from oomwatch.config import Config
from tests.conftest import (
    BOOT_TIME,
    CAPTURES,
    FIXTURES,
    REPO,
    SeqpacketKmsg,
    base_url,
    http_get,
    incidents_of,
    raw_records,
    running_agent,
    wait_for,
)

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


def test_restart_publishes_each_incident_exactly_once(tmp_path: Path) -> None:
    # First life: the kernel has printed the first two incidents (single /a, group /b).
    kmsg = SeqpacketKmsg()
    kmsg.send(upto(521))
    with running_agent(agent_config(tmp_path), kmsg_factory=kmsg.factory) as agent:
        assert wait_for(lambda: len(incidents_of(agent)) == 2)
    assert [e["victim"]["pid"] for e in events(tmp_path)] == [118, 125]
    # While it is down the kernel prints two more; the ring buffer still holds everything.
    kmsg = SeqpacketKmsg()
    kmsg.send(SCENARIOS)
    with running_agent(agent_config(tmp_path), kmsg_factory=kmsg.factory) as agent:
        assert wait_for(lambda: len(incidents_of(agent)) == 4)
        time.sleep(0.3)  # longer than the quiet window: nothing more may come
        assert len(incidents_of(agent)) == 4
        _, metrics = http_get(base_url(agent) + "/metrics")
    victims = [e["victim"]["pid"] for e in events(tmp_path)]
    assert victims == [118, 125, 132, 139]
    assert b'oomwatch_node_oom_kills_total{kind="group",scope="cgroup"} 3.0' in metrics
    assert b'oomwatch_node_oom_kills_total{kind="single",scope="cgroup"} 1.0' in metrics


def test_stop_in_the_middle_of_a_group_listing_loses_nothing(tmp_path: Path) -> None:
    # The agent stops after "Tasks in /b" but before the group's kill lines: the incident is unfinished, so
    # the cursor must stop before it and the next start must read it whole.
    kmsg = SeqpacketKmsg()
    kmsg.send(upto(518))
    config = agent_config(tmp_path, quiet_seconds=30.0)  # no quiet flush during this test
    with running_agent(config, kmsg_factory=kmsg.factory) as agent:
        assert wait_for(lambda: agent.correlator.last_seq == 518)
    first = events(tmp_path)
    assert [e["victim"]["pid"] for e in first] == [118]
    kmsg = SeqpacketKmsg()
    kmsg.send(upto(607))
    with running_agent(agent_config(tmp_path), kmsg_factory=kmsg.factory) as agent:
        assert wait_for(lambda: len(incidents_of(agent)) == 4)
    group_b = [e for e in events(tmp_path) if e["victim"]["pid"] == 125]
    assert len(group_b) == 1
    assert sorted(p["pid"] for p in group_b[0]["killed"]) == [122, 123, 125]


def test_records_overwritten_while_down_are_counted_as_lost(tmp_path: Path) -> None:
    kmsg = SeqpacketKmsg()
    kmsg.send(upto(400))
    with running_agent(agent_config(tmp_path), kmsg_factory=kmsg.factory) as agent:
        assert wait_for(lambda: agent.store.cursor_seq == 400)
    kmsg = SeqpacketKmsg()
    kmsg.send([r for r in SCENARIOS if seq_of(r) > 450])  # 401..450 were overwritten
    with running_agent(agent_config(tmp_path), kmsg_factory=kmsg.factory) as agent:
        assert wait_for(lambda: len(incidents_of(agent)) == 4)
        _, metrics = http_get(base_url(agent) + "/metrics")
    assert b"oomwatch_kmsg_lost_records_total 50.0" in metrics


def test_new_boot_starts_fresh(tmp_path: Path) -> None:
    kmsg = SeqpacketKmsg()
    kmsg.send(SCENARIOS)
    with running_agent(agent_config(tmp_path), kmsg_factory=kmsg.factory) as agent:
        assert wait_for(lambda: len(incidents_of(agent)) == 4)
    proc = tmp_path / "proc"
    shutil.copytree(GOLDEN / "proc", proc)
    (proc / "sys/kernel/random/boot_id").write_text("00000000-1111-2222-3333-444444444444\n")
    kmsg = SeqpacketKmsg()
    kmsg.send(upto(480))  # after a reboot the sequence starts again
    with running_agent(agent_config(tmp_path, proc=str(proc)), kmsg_factory=kmsg.factory) as agent:
        assert wait_for(lambda: len(incidents_of(agent)) == 1)
        assert incidents_of(agent)[0]["boot_id"] == "00000000-1111-2222-3333-444444444444"


def test_corrupt_state_is_reported_and_replaced_not_fatal(tmp_path: Path, caplog) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "state.json").write_text('{"version": 1, "boot_id": ')
    kmsg = SeqpacketKmsg()
    kmsg.send(SCENARIOS)
    with caplog.at_level("ERROR"):
        with running_agent(agent_config(tmp_path), kmsg_factory=kmsg.factory) as agent:
            assert wait_for(lambda: len(incidents_of(agent)) == 4)
    assert any("corrupt" in r.getMessage() for r in caplog.records)
    assert list(state.glob("state.json.corrupt-*"))
    from oomwatch.store import STATE_VERSION

    assert json.loads((state / "state.json").read_text())["version"] == STATE_VERSION


def test_missing_kmsg_keeps_cgroup_metrics_and_reports_unhealthy(tmp_path: Path) -> None:
    config = agent_config(tmp_path, kmsg=str(tmp_path / "no-such-kmsg"))
    with running_agent(config) as agent:
        assert wait_for(lambda: agent.kmsg_error is not None)
        status, body = http_get(base_url(agent) + "/healthz")
        assert status == 503
        health = json.loads(body)
        assert "no-such-kmsg does not exist" in health["kmsg"]
        assert health["cgroups"] == "ok"
        status, metrics = http_get(base_url(agent) + "/metrics")
    assert status == 200
    assert b'oomwatch_memory_limit_bytes{cgroup="/a",container="",namespace="",pod=""} 6.7108864e+07' in metrics


def test_explain_open_error_names_the_fix() -> None:
    import errno

    from oomwatch.sources.kmsg import explain_open_error

    text = explain_open_error("/dev/kmsg", OSError(errno.EPERM, "Operation not permitted"))
    assert "CAP_SYSLOG" in text and "dmesg_restrict" in text
    assert "does not exist" in explain_open_error("/dev/kmsg", OSError(errno.ENOENT, "No such file"))


def test_live_cgroup_changes_are_seen_without_rescans(tmp_path: Path) -> None:
    tree = tmp_path / "cgroup"
    shutil.copytree(GOLDEN / "cgroup", tree)
    kmsg = SeqpacketKmsg()
    # The kill below is stamped 30 s after boot: boot 30 s ago, so hints and kill are dated alike.
    config = agent_config(tmp_path, cgroup_root=str(tree), grace_period=0.0, boot_time=time.time() - 30.0)
    with running_agent(config, kmsg_factory=kmsg.factory) as agent:
        # A cgroup appears with its files already there, as mkdir on cgroupfs does: build it aside, move it in.
        staging = tmp_path / "staging" / "jobs"
        new_aside = staging / "train"
        new_aside.mkdir(parents=True)
        (new_aside / "memory.max").write_text(f"{32 << 20}\n")
        (new_aside / "memory.oom.group").write_text("1\n")
        for name in ("memory.events", "memory.events.local"):
            (new_aside / name).write_text("max 0\noom 0\noom_kill 0\n")
        os.rename(staging, tree / "jobs")
        new = tree / "jobs" / "train"
        assert wait_for(lambda: "/jobs/train" in agent.watcher.known())
        # It reaches its limit: the kernel bumps memory.events (and .local) and signals IN_MODIFY.
        (new / "memory.events.local").write_text("max 3\noom 1\noom_kill 0\n")
        (new / "memory.events").write_text("max 3\noom 1\noom_kill 0\n")
        label = b'oomwatch_memory_limit_bytes{cgroup="/jobs/train",container="",namespace="",pod=""} 3.3554432e+07'
        assert wait_for(lambda: label in http_get(base_url(agent) + "/metrics")[1])
        assert wait_for(lambda: "/jobs/train" in agent._oom_at)
        # A ratelimited incident (no header, no summary) is placed by the cgroup whose `oom` just moved.
        kmsg.send([
            b"3,900,30000000,-;Memory cgroup out of memory: Killed process 4001 (python3) total-vm:1000kB, "
            b"anon-rss:900kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:40kB oom_score_adj:0\n",
            b"6,901,30000100,-;Tasks in /jobs/train are going to be killed due to memory.oom.group set\n",
            b"3,902,30000200,-;Memory cgroup out of memory: Killed process 4000 (sleep) total-vm:1000kB, "
            b"anon-rss:90kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:40kB oom_score_adj:0\n",
        ])
        assert wait_for(lambda: len(incidents_of(agent)) == 1)
        incident = incidents_of(agent)[0]
        assert incident["kind"] == "group" and incident["group_cgroup"] == "/jobs/train"
        assert incident["oom_cgroup"] == "/jobs/train"
        assert [p["pid"] for p in incident["killed"]] == [4001, 4000]
        shutil.rmtree(new)
        assert wait_for(lambda: label not in http_get(base_url(agent) + "/metrics")[1])


def test_sigterm_stops_cleanly_with_state_flushed(tmp_path: Path) -> None:
    oomwatch = Path(sys.executable).with_name("oomwatch")
    args = [str(oomwatch), "agent", "--listen", "127.0.0.1:0", "--kmsg", str(CAPTURES / "linux-6.1-memcg-scenarios.kmsg"),
            "--cgroup-root", str(GOLDEN / "cgroup"), "--proc", str(GOLDEN / "proc"), "--kube-api", "off",
            "--state-dir", str(tmp_path / "state"), "--events-file", str(tmp_path / "events.jsonl")]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: len(events(tmp_path)) == 4, timeout=20)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    assert "agent stopped" in stderr
    state = json.loads((tmp_path / "state" / "state.json").read_text())
    assert len(state["incidents"]) == 4


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


@pytest.mark.tools
def test_promtool_finds_nothing_to_complain_about(tmp_path: Path) -> None:
    promtool = shutil.which("promtool", path=f"{REPO / '.cache/tools/bin'}:{os.environ.get('PATH', '')}")
    assert promtool, "promtool missing: scripts/test installs Debian's prometheus package"
    kmsg = SeqpacketKmsg()
    kmsg.send(SCENARIOS)
    with running_agent(agent_config(tmp_path), kmsg_factory=kmsg.factory) as agent:
        assert wait_for(lambda: len(incidents_of(agent)) == 4)
        _, metrics = http_get(base_url(agent) + "/metrics")
    result = subprocess.run([promtool, "check", "metrics"], input=metrics, capture_output=True)
    assert result.returncode == 0 and result.stdout == b"" and result.stderr == b"", result


def test_proc_cgroup_paths_inside_a_cgroup_namespace_are_made_absolute(tmp_path: Path) -> None:
    # The agent runs in /kubepods/besteffort/podA/agent; its cgroup namespace shows that as "/", and a victim
    # in another pod as "/../../../burstable/podB/ctr".
    tree = tmp_path / "cgroup"
    me = tree / "kubepods/besteffort/podA/agent"
    me.mkdir(parents=True)
    (me / "cgroup.procs").write_text(f"{os.getpid()}\n")
    (tree / "kubepods/burstable/podB/ctr").mkdir(parents=True)
    proc = tmp_path / "proc"
    shutil.copytree(GOLDEN / "proc", proc)
    (proc / "self").mkdir(exist_ok=True)
    (proc / "self/cgroup").write_text("0::/\n")
    (proc / "4242").mkdir()
    (proc / "4242/cgroup").write_text("0::/../../../burstable/podB/ctr\n")
    kmsg = SeqpacketKmsg()
    with running_agent(agent_config(tmp_path, cgroup_root=str(tree), proc=str(proc)),
                       kmsg_factory=kmsg.factory) as agent:
        assert agent.cgroup_of_pid(4242) == "/kubepods/burstable/podB/ctr"


def test_refused_device_falls_back_to_syslog_woken_by_memory_events(tmp_path: Path, monkeypatch) -> None:
    """An unprivileged container: open("/dev/kmsg") fails with EPERM (device cgroup), syslog(2) works with
    CAP_SYSLOG. The agent reads through syslog(2), and a kill seen in memory.events is its cue to read."""
    import errno

    import oomwatch.sources.klog as klog_module
    from oomwatch.sources.klog import SyslogKmsg
    from oomwatch.sources.kmsg import KmsgUnavailable, LiveKmsg
    from tests.test_klog import FakeKlogctl, syslog_lines

    def refuse(self, after_seq=None):
        raise KmsgUnavailable("/dev/kmsg: permission denied") from PermissionError(errno.EPERM, "denied")

    monkeypatch.setattr(LiveKmsg, "open", refuse)
    kernel = FakeKlogctl(syslog_lines(upto_seq=521))  # the first two incidents are in the ring
    monkeypatch.setattr(klog_module, "SyslogKmsg",
                        lambda: SyslogKmsg(syscall=kernel, fallback_interval=3600))
    tree = tmp_path / "cgroup"
    shutil.copytree(GOLDEN / "cgroup", tree)
    config = agent_config(tmp_path, kmsg="/dev/kmsg", cgroup_root=str(tree))
    with running_agent(config) as agent:
        assert wait_for(lambda: len(incidents_of(agent)) == 2)
        assert agent.kmsg_source == "syslog"
        assert http_get(base_url(agent) + "/healthz")[0] == 200
        # The kernel prints two more incidents; nothing wakes a syslog(2) reader but the cgroups' counters.
        kernel.lines = syslog_lines()
        time.sleep(0.3)
        assert len(incidents_of(agent)) == 2, "no wake-up yet: nothing read"
        (tree / "q" / "c1" / "memory.events.local").write_text("max 0\noom 0\noom_kill 6\noom_group_kill 0\n")
        (tree / "q" / "c1" / "memory.events").write_text("max 0\noom 0\noom_kill 6\noom_group_kill 0\n")
        assert wait_for(lambda: len(incidents_of(agent)) == 4)
    assert [e["victim"]["pid"] for e in events(tmp_path)] == [118, 125, 132, 139]
    state = json.loads((tmp_path / "state" / "state.json").read_text())
    assert state["cursor_source"] == "syslog"


def test_a_ratelimited_kill_of_an_unseen_process_is_placed_by_memory_events(tmp_path: Path) -> None:
    """Only the kill line arrived (header and summary ratelimited away) and the victim was never seen in a
    cgroup.procs: the cgroup whose memory.events.local oom_kill moved is where it was."""
    tree = tmp_path / "cgroup"
    shutil.copytree(GOLDEN / "cgroup", tree)
    kmsg = SeqpacketKmsg()
    config = agent_config(tmp_path, cgroup_root=str(tree), boot_time=time.time() - 9.0)  # the kill: 9 s after boot
    with running_agent(config, kmsg_factory=kmsg.factory) as agent:
        (tree / "a" / "memory.events.local").write_text("max 60\noom 2\noom_kill 2\noom_group_kill 0\n")
        (tree / "a" / "memory.events").write_text("max 60\noom 2\noom_kill 2\noom_group_kill 0\n")
        assert wait_for(lambda: "/a" in agent._oom_kill_at)
        kmsg.send([b"3,700,9000000,-;Memory cgroup out of memory: Killed process 5555 (python3) total-vm:9kB, "
                   b"anon-rss:9kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0\n"])
        assert wait_for(lambda: len(incidents_of(agent)) == 1)
        incident = incidents_of(agent)[0]
    assert (incident["kind"], incident["victim"]["cgroup"], incident["oom_cgroup"]) == ("single", "/a", "/a")
    assert incident["workload"]["type"] == "other"
