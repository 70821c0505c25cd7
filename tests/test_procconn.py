"""The proc connector: exit events as values, the real netlink connector on this machine, and the agent
naming the processes a group kill took down without a kernel log line."""

from __future__ import annotations

import json
import queue
import shutil
import signal
import subprocess
import time
from pathlib import Path

from oomwatch.sources.procconn import (
    ProcConnector,
    ProcessExit,
    ProcessFork,
    exec_from_event,
    exit_from_event,
    fork_from_event,
    terminating_signal,
)
from tests.conftest import SeqpacketKmsg, incidents_of, running_agent, wait_for
from tests.test_agent import GOLDEN, agent_config


def test_wait_status_and_exit_events() -> None:
    assert terminating_signal(9) == 9 and terminating_signal(15) == 15
    assert terminating_signal(0) is None and terminating_signal(1 << 8) is None  # exit(1)
    assert terminating_signal(0x137F) is None  # stopped, not dead
    event = {"event": "PROC_EVENT_EXIT", "process_pid": 42, "process_tgid": 42, "exit_code": 9}
    assert exit_from_event(event, 5.0) == ProcessExit(pid=42, signal=9, time=5.0)
    assert exit_from_event(dict(event, process_pid=43), 5.0) is None  # a thread of 42
    assert exit_from_event(dict(event, exit_code=0), 5.0) is None
    assert exit_from_event(dict(event, event="PROC_EVENT_FORK"), 5.0) is None
    fork = {"event": "PROC_EVENT_FORK", "parent_pid": 10, "parent_tgid": 10, "child_pid": 11, "child_tgid": 11}
    assert fork_from_event(fork) == ProcessFork(parent=10, child=11, parent_task=10)
    # runc: the init is cloned with CLONE_PARENT, so its parent process is runc, its parent task another
    assert fork_from_event(dict(fork, parent_pid=14)) == ProcessFork(parent=10, child=11, parent_task=14)
    assert fork_from_event(dict(fork, child_pid=12)) is None  # a new thread of 11
    assert fork_from_event(event) is None
    assert exec_from_event({"event": "PROC_EVENT_EXEC", "process_pid": 11, "process_tgid": 11}) == 11
    assert exec_from_event({"event": "PROC_EVENT_EXEC", "process_pid": 12, "process_tgid": 11}) is None


def test_the_real_connector_sees_a_sigkill() -> None:
    exits: queue.Queue = queue.Queue()
    connector = ProcConnector(exits.put, time.time)
    connector.start()  # root here, in the initial namespaces: it must work
    try:
        child = subprocess.Popen(["sleep", "60"])
        child.send_signal(signal.SIGKILL)
        child.wait()
        deadline = time.monotonic() + 5
        seen = None
        while time.monotonic() < deadline and seen is None:
            e = exits.get(timeout=5)
            seen = e if e.pid == child.pid else None
        assert seen is not None and seen.signal == 9
    finally:
        connector.stop()
        subprocess.run(["true"])  # any process event lets the blocked reader see the stop
        assert wait_for(lambda: not connector.alive)
    assert connector.error is None


def test_group_kill_lists_processes_that_died_unlogged(tmp_path: Path) -> None:
    """As when a group kill takes a container's PID 1: the kernel logs two kills, a third process of the
    group dies by SIGKILL without a line; the agent names it from the proc connector."""
    tree = tmp_path / "cgroup"
    shutil.copytree(GOLDEN / "cgroup", tree)
    bystander = subprocess.Popen(["sleep", "60"])
    (tree / "b" / "cgroup.procs").write_text(f"{bystander.pid}\n")  # seen alive in /b at start
    kmsg = SeqpacketKmsg()
    # quiet window as in production: the test sender thread competes with the connector thread for the GIL
    config = agent_config(tmp_path, cgroup_root=str(tree), proc_connector=True, quiet_seconds=0.5)
    try:
        with running_agent(config, kmsg_factory=kmsg.factory) as agent:
            assert agent.proc_connector is not None, agent.proc_connector_error
            kmsg.send([
                b"3,10,1000,-;Memory cgroup out of memory: Killed process 7001 (python3) total-vm:9kB, anon-rss:9kB, "
                b"file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0\n",
                b"6,11,1001,-;Tasks in /b are going to be killed due to memory.oom.group set\n",
                b"3,12,1002,-;Memory cgroup out of memory: Killed process 7000 (sh) total-vm:9kB, anon-rss:9kB, "
                b"file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0\n",
            ])
            bystander.send_signal(signal.SIGKILL)
            bystander.wait()
            # A single kill right after: it may not overtake the group kill waiting for its witnesses.
            kmsg.send([b"6,13,1999,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
                       b"oom_memcg=/a,task_memcg=/a,task=java,pid=7100,uid=0\n",
                       b"3,14,2000,-;Memory cgroup out of memory: Killed process 7100 (java) total-vm:9kB, "
                       b"anon-rss:9kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0\n"])
            assert wait_for(lambda: len(incidents_of(agent)) == 2)
            incident, single = incidents_of(agent)
            assert single["victim"]["pid"] == 7100 and single["kind"] == "single"
    finally:
        bystander.kill()
    assert [p["pid"] for p in incident["killed"]] == [7001, 7000]
    assert incident["died_with"] == [{"pid": bystander.pid, "cgroup": "/b", "signal": 9}]
    assert "1 more process of /b died with it by SIGKILL" in incident["explanation"]
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["died_with"] == incident["died_with"]


def test_a_process_never_seen_in_a_cgroup_gets_it_from_its_parent(tmp_path: Path) -> None:
    """A global OOM gives no memory.events warning to snapshot pids on: the container's init is remembered
    when its cgroup becomes populated (cgroup.events), and what it forks later inherits that cgroup."""
    import psutil

    tree = tmp_path / "cgroup"
    shutil.copytree(GOLDEN / "cgroup", tree)
    (tree / "b" / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    parent = subprocess.Popen(["sh", "-c", "read x; sleep 60; true"], stdin=subprocess.PIPE)
    kmsg = SeqpacketKmsg()
    # quiet window as in production: the test sender thread competes with the connector thread for the GIL
    config = agent_config(tmp_path, cgroup_root=str(tree), proc_connector=True, quiet_seconds=0.5)
    try:
        with running_agent(config, kmsg_factory=kmsg.factory) as agent:
            assert agent.proc_connector is not None, agent.proc_connector_error
            (tree / "b" / "cgroup.procs").write_text(f"{parent.pid}\n")
            (tree / "b" / "cgroup.events").write_text("populated 1\nfrozen 0\n")
            assert wait_for(lambda: agent._pids.get(parent.pid) == "/b")
            parent.stdin.write(b"go\n")
            parent.stdin.flush()
            assert wait_for(lambda: psutil.Process(parent.pid).children())
            (child,) = psutil.Process(parent.pid).children()
            assert wait_for(lambda: agent._pids.get(child.pid) == "/b"), "inherited from its parent by fork"
            child.kill()
            kmsg.send([
                b"3,10,1000,-;Memory cgroup out of memory: Killed process 7001 (python3) total-vm:9kB, anon-rss:9kB, "
                b"file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0\n",
                b"6,11,1001,-;Tasks in /b are going to be killed due to memory.oom.group set\n",
            ])
            assert wait_for(lambda: len(incidents_of(agent)) == 1)
            incident = incidents_of(agent)[0]
    finally:
        parent.kill()
    assert {"pid": child.pid, "cgroup": "/b", "signal": 9} in incident["died_with"]


def test_proc_event_datagrams_parse_as_the_kernel_lays_them_out() -> None:
    """nlmsghdr + cn_msg + proc_event (linux/cn_proc.h), built field by field; the live socket is exercised by
    the tests above on this machine's kernel."""
    import struct

    from oomwatch.sources.procconn import parse_proc_events

    def datagram(what: int, *fields: int) -> bytes:
        event = struct.pack("=IIQ", what, 0, 123456789) + struct.pack(f"={len(fields)}I", *fields)
        cn = struct.pack("=IIIIHH", 1, 1, 7, 0, len(event), 0) + event
        return struct.pack("=IHHII", 16 + len(cn), 3, 0, 7, 0) + cn

    assert parse_proc_events(datagram(1, 10, 10, 11, 11)) == [
        {"event": "PROC_EVENT_FORK", "parent_pid": 10, "parent_tgid": 10, "child_pid": 11, "child_tgid": 11}]
    assert parse_proc_events(datagram(2, 11, 11)) == [{"event": "PROC_EVENT_EXEC", "process_pid": 11,
                                                       "process_tgid": 11}]
    assert parse_proc_events(datagram(0x80000000, 11, 11, 9, 17, 10, 10)) == [
        {"event": "PROC_EVENT_EXIT", "process_pid": 11, "process_tgid": 11, "exit_code": 9, "exit_signal": 17}]
    assert parse_proc_events(datagram(0x200, 11, 11)) == []  # PROC_EVENT_COMM: not ours
    assert parse_proc_events(datagram(1, 10)[:20]) == []  # truncated
    assert parse_proc_events(b"") == []
