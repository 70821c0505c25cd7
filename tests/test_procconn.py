"""The proc connector: exit events as values and the real netlink connector on this machine. (What the
pipeline makes of its events, the processes a group kill took down without a kernel log line:
tests/test_pipeline_node.py.)"""

from __future__ import annotations

import queue
import signal
import subprocess
import time

from oomwatch.sources.procconn import (
    ProcConnector,
    ProcessExit,
    ProcessFork,
    exec_from_event,
    exit_from_event,
    fork_from_event,
    terminating_signal,
)
from tests.conftest import wait_for


def test_wait_status_and_exit_events() -> None:
    assert terminating_signal(9) == 9 and terminating_signal(15) == 15
    assert terminating_signal(0) is None and terminating_signal(1 << 8) is None  # exit(1)
    assert terminating_signal(0x137F) is None  # stopped, not dead
    event = {"event": "PROC_EVENT_EXIT", "process_pid": 42, "process_tgid": 42, "exit_code": 9}
    assert exit_from_event(event, 5.0) == ProcessExit(pid=42, signal=9, time=5.0)
    assert exit_from_event(dict(event, process_pid=43), 5.0) is None  # a thread of 42
    # a normal exit comes with its status: exit(1) is how a process whose GPU ran out of memory ends
    assert exit_from_event(dict(event, exit_code=0), 5.0) == ProcessExit(pid=42, signal=None, time=5.0, code=0)
    assert exit_from_event(dict(event, exit_code=1 << 8), 5.0) == ProcessExit(pid=42, signal=None, time=5.0,
                                                                              code=1)
    assert exit_from_event(dict(event, exit_code=0x137F), 5.0) is None  # stopped, not dead
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


def test_the_real_connector_reports_an_exit_status_and_a_container_init_is_known_by_its_ns_pid() -> None:
    """A process that exits 3 arrives with code 3 (a CUDA OOM ends a container's main process with exit 1, no
    signal); /proc/PID/status names a process and its pid in its own namespace (1: a container's init)."""
    import os

    from oomwatch.sources.cgroupfs import cat
    from oomwatch.sources.cgroupsource import name_and_ns_pid

    exits: queue.Queue = queue.Queue()
    connector = ProcConnector(exits.put, time.time)
    connector.start()
    try:
        child = subprocess.Popen(["sh", "-c", "exit 3"])
        child.wait()
        deadline = time.monotonic() + 5
        seen = None
        while time.monotonic() < deadline and seen is None:
            e = exits.get(timeout=5)
            seen = e if e.pid == child.pid else None
        assert seen is not None and (seen.signal, seen.code) == (None, 3)
    finally:
        connector.stop()
        subprocess.run(["true"])
        assert wait_for(lambda: not connector.alive)
    comm, ns_pid = name_and_ns_pid(cat(f"/proc/{os.getpid()}/status"))
    assert comm is not None and comm.startswith("python") and ns_pid is not None
    assert name_and_ns_pid("Name:\tsleep\nUmask:\t0022\nNSpid:\t4242\t1\n") == ("sleep", 1)
    assert name_and_ns_pid(None) == (None, None)
    from oomwatch.sources.cgroupsource import command_line

    argv = command_line(f"/proc/{os.getpid()}/cmdline")
    assert argv is not None and "python" in argv[0] and all("\0" not in a for a in argv)
    assert command_line("/proc/0/cmdline") is None
