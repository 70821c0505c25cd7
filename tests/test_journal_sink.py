"""The journal sink (oomwatch/sinks/journal.py): which unit an incident is attached to, the native protocol's
bytes (read back by a decoder written here from systemd.io/JOURNAL_NATIVE_PROTOCOL, not the sink's code), and
the sink against a real unix datagram socket: one datagram per entry with the sender's credentials, a sealed
memfd for an entry too large for a datagram, and a journald that is missing or does not read never blocking
the caller. Real journald, `journalctl -u` and `systemctl status` are the real-kernel tier's
(tests/e2e/test_systemd.py)."""

from __future__ import annotations

import array
import fcntl
import logging
import os
import socket
import struct
import time
from dataclasses import replace
from pathlib import Path

import pytest

from oomwatch.config import Config
from oomwatch.deaths import Death
from oomwatch.model import Incident, Workload
from oomwatch.sinks.journal import (
    DEATH_MESSAGE_ID,
    MESSAGE_ID,
    JournalSink,
    death_entry,
    encode,
    journal_entries,
    journal_wanted,
    systemd_units,
)
from oomwatch.events import KernelLog
from tests.conftest import CAPTURES, raw_records
from tests.replay import BOOT_ID, Replay, live_reads, live_settings

SYSTEMD_UNITS_LOG = CAPTURES / "linux-6.1-systemd-units.kmsg"
BOOT = 1795693172.0  # the wall-clock time of that boot's kernel time 0 (approximately; any boot time does)
ALL_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL


def decode(data: bytes) -> list[tuple[str, bytes]]:
    """The native protocol, read as journald reads it: `NAME=value\\n`, or `NAME\\n` + le64 length + value +
    `\\n` (journald-native.c)."""
    fields, i = [], 0
    while i < len(data):
        end = data.index(b"\n", i)
        line = data[i:end]
        if b"=" in line:
            name, _, value = line.partition(b"=")
            i = end + 1
        else:
            name = line
            (size,) = struct.unpack("<Q", data[end + 1:end + 9])
            value = data[end + 9:end + 9 + size]
            assert data[end + 9 + size:end + 10 + size] == b"\n", "binary field not ended by a newline"
            i = end + 10 + size
        fields.append((name.decode(), value))
    return fields


def as_bytes(fields) -> list[tuple[str, bytes]]:
    return [(name, str(value).encode("utf-8", "surrogateescape")) for name, value in fields]


@pytest.fixture(scope="module")
def units() -> dict[str, Incident]:
    """The kernel's reports of three kills under systemd 252 (the real-kernel tier's systemd host): a service and
    two transient scopes at their MemoryMax, the last with OOMPolicy=kill (a group kill), replayed through the
    pipeline as the live reader reads them."""
    replay = Replay(live_settings(boot_time=BOOT), now=BOOT + 380.0)
    for items in live_reads(raw_records(SYSTEMD_UNITS_LOG)):
        replay.step(KernelLog(items, drained_at=replay.now + 0.01), replay.now + 0.01)
    replay.settle()
    assert [(i.workload.type, i.kind) for i in replay.published] == [("systemd", "single")] * 2 + [("systemd", "group")]
    return {i.workload.unit: i for i in replay.published}


@pytest.fixture(scope="module")
def service(units: dict[str, Incident]) -> Incident:
    return units["oomtest-hog.service"]


@pytest.mark.parametrize("cgroup, want", [
    ("/system.slice/tomcat.service", ("tomcat.service", None, None)),
    ("/system.slice/tomcat.service/workers", ("tomcat.service", None, None)),
    ("/system.slice/system-getty.slice/getty@tty1.service", ("getty@tty1.service", None, None)),
    ("/system.slice/run-r3f1c.scope", ("run-r3f1c.scope", None, None)),
    ("/init.scope", ("init.scope", None, None)),
    ("/user.slice/user-1000.slice/session-4.scope", ("session-4.scope", None, None)),
    # a user manager's units: the user unit, attached to the manager's own system unit
    ("/user.slice/user-1000.slice/user@1000.service/app.slice/app-firefox.scope",
     ("user@1000.service", "app-firefox.scope", 1000)),
    ("/user.slice/user-1000.slice/user@1000.service/init.scope", ("user@1000.service", "init.scope", 1000)),
    # a delegated subtree may name its cgroups like units: only systemd's own unit counts
    ("/system.slice/docker-4f2a.scope/sshd.service", ("docker-4f2a.scope", None, None)),
    ("/system.slice/slurmstepd.scope/job_12/step_0", ("slurmstepd.scope", None, None)),
    # not a unit's: a cgroup made outside systemd's slices
    ("/kubepods/burstable/pod1/abc", (None, None, None)),
    ("/sneaky/nginx.service", (None, None, None)),
    ("/", (None, None, None)),
    ("/.service", (None, None, None)),
])
def test_systemd_units_names_the_unit_systemd_manages(cgroup: str, want: tuple) -> None:
    assert systemd_units(cgroup) == want


def test_entries_of_real_kills_in_a_service_and_scopes(units: dict[str, Incident]) -> None:
    entries = {unit: journal_entries(incident) for unit, incident in units.items()}
    assert all(len(e) == 1 for e in entries.values())
    fields = dict(entries["oomtest-hog.service"][0])
    assert len(fields) == len(entries["oomtest-hog.service"][0]), "a field twice"
    service = units["oomtest-hog.service"]
    assert fields["MESSAGE"] == service.explanation
    assert fields["MESSAGE_ID"] == MESSAGE_ID and len(MESSAGE_ID) == 32 and int(MESSAGE_ID, 16)
    assert fields["PRIORITY"] == 4 and fields["SYSLOG_IDENTIFIER"] == "oomwatch"
    assert fields["OBJECT_SYSTEMD_UNIT"] == "oomtest-hog.service"
    assert fields["OBJECT_SYSTEMD_CGROUP"] == "/oomtest.slice/oomtest-hog.service"
    assert "UNIT" not in fields and "OBJECT_SYSTEMD_USER_UNIT" not in fields  # UNIT= is PID 1's field
    assert {k: v for k, v in fields.items() if k.startswith("OOMWATCH_")} == {
        "OOMWATCH_KIND": "single", "OOMWATCH_SCOPE": "cgroup", "OOMWATCH_CONSTRAINT": "memcg",
        "OOMWATCH_EVIDENCE": "kmsg", "OOMWATCH_TIME": service.to_json()["time"], "OOMWATCH_BOOT_ID": BOOT_ID,
        "OOMWATCH_KERNEL_SEQ": 585, "OOMWATCH_OOM_CGROUP": "/oomtest.slice/oomtest-hog.service",
        "OOMWATCH_WORKLOAD_TYPE": "systemd", "OOMWATCH_WORKLOAD_CGROUP": "/oomtest.slice/oomtest-hog.service",
        "OOMWATCH_VICTIM_PID": 347, "OOMWATCH_VICTIM_COMM": "dd", "OOMWATCH_VICTIM_UID": 0,
        "OOMWATCH_VICTIM_CGROUP": "/oomtest.slice/oomtest-hog.service", "OOMWATCH_KILLED_COUNT": 1,
        "OOMWATCH_KILLED": "dd(347)", "OOMWATCH_MEMORY_USAGE_BYTES": service.memory["usage_bytes"],
        "OOMWATCH_MEMORY_LIMIT_BYTES": 64 << 20}  # None values (no group cgroup) are left out, never "None"
    group = dict(entries["oomtest-group.scope"][0])
    assert (group["OBJECT_SYSTEMD_UNIT"], group["OOMWATCH_KIND"], group["OOMWATCH_GROUP_CGROUP"],
            group["OOMWATCH_KILLED"], group["OOMWATCH_KILLED_COUNT"]) == (
        "oomtest-group.scope", "group", "/oomtest.slice/oomtest-group.scope", "dd(369) sleep(370)", 2)
    for entry in (e[0] for e in entries.values()):
        assert decode(encode(entry)) == as_bytes(entry)


def test_values_with_newlines_and_raw_bytes_round_trip(service: Incident) -> None:
    """A cgroup name may hold any byte but "/": a newline (which would end a `NAME=value` field) and a byte
    that is not UTF-8 (read as a surrogate escape) go in the binary-safe form, and come back as they were."""
    cgroup = "/system.slice/we\nird\udcff=name.service"
    odd = replace(service, workload=replace(service.workload, cgroup=cgroup, unit="we\nird\udcff=name.service"),
                  workloads=(), explanation="line one\nline two")
    (entry,) = journal_entries(odd)
    data = encode(entry)
    assert b"OBJECT_SYSTEMD_UNIT\n" + struct.pack("<Q", 20) + b"we\nird\xff=name.service\n" in data
    assert b"MESSAGE\n" in data and b"MESSAGE=" not in data
    assert b"SYSLOG_IDENTIFIER=oomwatch\n" in data  # plain values stay in the readable form
    decoded = dict(decode(data))
    assert decoded["OBJECT_SYSTEMD_UNIT"] == b"we\nird\xff=name.service"
    assert decoded["MESSAGE"] == b"line one\nline two"
    assert decode(data) == as_bytes(entry)
    with pytest.raises(ValueError):
        encode([("_SYSTEMD_UNIT", "sshd.service")])  # a trusted field is journald's, never a client's


def test_only_systemd_units_get_entries_one_per_unit(service: Incident) -> None:
    pod = Workload(type="k8s-container", cgroup="/kubepods/burstable/pod1/c1", namespace="ml", pod="train-0",
                   container="trainer")
    assert journal_entries(replace(service, workload=pod, workloads=(pod,))) == []
    other = Workload(type="other", cgroup="/sneaky/nginx.service")
    assert journal_entries(replace(service, workload=other, workloads=(other,))) == []
    # a slice's group kill that took processes of two services (and a pod's): an entry on each unit
    api = Workload(type="systemd", cgroup="/batch.slice/api.service", unit="api.service")
    worker = Workload(type="systemd", cgroup="/batch.slice/worker.service/sub", unit="sub")
    both = replace(service, kind="group", workload=api, workloads=(api, pod, worker, api))
    units = [dict(entry)["OBJECT_SYSTEMD_UNIT"] for entry in journal_entries(both)]
    assert units == ["api.service", "worker.service"]
    # a user unit: on its user manager, and for `journalctl --user-unit`
    app = Workload(type="systemd", unit="app.service",
                   cgroup="/user.slice/user-1000.slice/user@1000.service/app.slice/app.service")
    (entry,) = journal_entries(replace(service, workload=app, workloads=(app,)))
    assert {k: v for k, v in entry if k.startswith("OBJECT_SYSTEMD_")} == {
        "OBJECT_SYSTEMD_UNIT": "user@1000.service", "OBJECT_SYSTEMD_USER_UNIT": "app.service",
        "OBJECT_SYSTEMD_OWNER_UID": 1000, "OBJECT_SYSTEMD_CGROUP": app.cgroup}


def _death(cause: str, workload: Workload | None, **kw) -> Death:
    values = dict(time=1795169701.5, cause=cause, sender="unknown" if cause == "userspace" else None,
                  cgroup=workload.cgroup if workload else "/x", workload=workload, pid=4242, comm="dd",
                  signal=9, exit_code=None, main=True, processes=1, pids=(4242,),
                  evidence=("SIGKILL, no OOM kill",), detected_at=1795169712.0, boot_id="b1",
                  explanation="oomtest-hog.service: dd (pid 4242) was killed with SIGKILL by another process; "
                              "the kernel's OOM killer killed nothing.")
    values.update(kw)
    return Death(**values)


def test_deaths_in_a_unit_get_an_entry_unless_the_kernel_killed_them(service: Incident,
                                                                     tmp_path: Path) -> None:
    unit = service.workload
    entry = death_entry(_death("userspace", unit))
    assert entry is not None
    fields = dict(entry)
    keys = ("MESSAGE_ID", "OBJECT_SYSTEMD_UNIT", "OOMWATCH_CAUSE", "OOMWATCH_SENDER", "OOMWATCH_SIGNAL")
    assert [fields[k] for k in keys] == [DEATH_MESSAGE_ID, "oomtest-hog.service", "userspace", "unknown", 9]
    assert DEATH_MESSAGE_ID != MESSAGE_ID and "OOMWATCH_EXIT_CODE" not in fields
    assert death_entry(_death("kernel-oom", unit)) is None  # the kernel's incident has its entry
    pod = Workload(type="k8s-container", cgroup="/kubepods/burstable/pod1/c1", pod="train-0")
    assert death_entry(_death("userspace", pod)) is None and death_entry(_death("userspace", None)) is None
    path = tmp_path / "socket"
    server = _journald(path)
    sink = JournalSink(str(path))
    sink.start([])
    try:
        sink.publish_death(_death("kernel-oom", unit))
        sink.publish_death(_death("gpu-oom", unit, signal=None, exit_code=1, memory="gpu"))
        assert sink.wait_idle() and sink.sent == 1
        got = dict(decode(_receive(server)[0]))
        assert (got["OOMWATCH_CAUSE"], got["OOMWATCH_EXIT_CODE"]) == (b"gpu-oom", b"1")
    finally:
        sink.close()
        server.close()


def _journald(path: Path) -> socket.socket:
    """A datagram socket where journald's would be, with SO_PASSCRED as journald sets it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    sock.settimeout(5)
    return sock


def _receive(sock: socket.socket) -> tuple[bytes, tuple[int, int, int] | None, list[int]]:
    data, ancdata, _, _ = sock.recvmsg(1 << 20, socket.CMSG_SPACE(12) + socket.CMSG_SPACE(4 * 4))
    creds, fds = None, []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            creds = struct.unpack("iII", payload[:12])
        elif level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += array.array("i", payload[: len(payload) - len(payload) % 4]).tolist()
    return data, creds, fds


def test_sink_sends_one_datagram_per_entry_with_the_senders_credentials(tmp_path: Path,
                                                                        service: Incident) -> None:
    path = tmp_path / "socket"
    server = _journald(path)
    sink = JournalSink(str(path))
    sink.start([])
    try:
        sink.publish(service)
        other = Workload(type="other", cgroup="/x")
        sink.publish(replace(service, workload=other, workloads=()))  # not a unit: no entry
        assert sink.wait_idle()
        data, creds, fds = _receive(server)
        assert decode(data) == as_bytes(journal_entries(service)[0])
        # journald's _PID and _UID come from these, filled in by the kernel: why the unit runs as root
        assert creds is not None and creds[:2] == (os.getpid(), os.getuid()) and fds == []
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):
            server.recvmsg(1 << 20)  # nothing for the incident that is not in a unit
        assert (sink.sent, sink.failed, sink.dropped) == (1, 0, 0)
    finally:
        sink.close()
        server.close()


def test_an_entry_too_large_for_a_datagram_goes_in_a_sealed_memfd(tmp_path: Path, service: Incident) -> None:
    path = tmp_path / "socket"
    server = _journald(path)
    sndbuf = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    huge = replace(service, explanation="x" * (2 * sndbuf + 1))  # more than a datagram can carry here
    sink = JournalSink(str(path))
    sink.start([])
    try:
        sink.publish(huge)
        assert sink.wait_idle()
        data, _, fds = _receive(server)
        assert data == b"" and len(fds) == 1
        try:
            assert fcntl.fcntl(fds[0], fcntl.F_GET_SEALS) & ALL_SEALS == ALL_SEALS  # what journald requires
            content = os.pread(fds[0], os.fstat(fds[0]).st_size, 0)
        finally:
            for fd in fds:
                os.close(fd)
        assert dict(decode(content))["MESSAGE"] == huge.explanation.encode()
        assert sink.memfd_sent == 1 and sink.sent == 1
    finally:
        sink.close()
        server.close()


def test_no_journald_is_one_warning_and_never_blocks(tmp_path: Path, service: Incident,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "socket"
    sink = JournalSink(str(path))
    sink.start([])
    try:
        with caplog.at_level(logging.INFO, logger="oomwatch.sinks.journal"):
            for _ in range(3):
                sink.publish(service)  # no socket at all
            assert sink.wait_idle()
            assert sink.failed == 3 and sink.sent == 0
            warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            assert warnings == [f"journal: cannot send to {path} (no journald socket); entries are dropped "
                                "until it answers"]
            server = _journald(path)  # journald (re)started
            try:
                sink.publish(service)
                assert sink.wait_idle()
                assert decode(_receive(server)[0])[0] == ("MESSAGE", service.explanation.encode())
                assert sink.sent == 1 and sink.problem is None
                assert "journal: entries reach" in caplog.records[-1].getMessage()
            finally:
                server.close()
            sink.publish(service)  # the socket is left, nobody reads it: refused
            assert sink.wait_idle()
            assert "journald is not running" in caplog.records[-1].getMessage()
    finally:
        sink.close()


def test_a_journald_that_does_not_read_drops_entries_and_the_caller_never_waits(
        tmp_path: Path, service: Incident, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "socket"
    server = _journald(path)  # bound, never read: its queue fills (net.unix.max_dgram_qlen)
    qlen = int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text())
    sink = JournalSink(str(path), timeout=0.2)
    sink.start([])
    try:
        with caplog.at_level(logging.WARNING, logger="oomwatch.sinks.journal"):
            started = time.monotonic()
            for _ in range(qlen + 3):
                sink.publish(service)
            assert time.monotonic() - started < 0.5, "publish waited on the socket"
            assert sink.wait_idle(10)
        assert sink.failed >= 1 and sink.sent + sink.failed == qlen + 3
        assert "did not read in time" in caplog.records[-1].getMessage() or "timed out" in caplog.text
    finally:
        sink.close()
        server.close()


def test_a_full_queue_drops_and_says_so(tmp_path: Path, service: Incident,
                                        caplog: pytest.LogCaptureFixture) -> None:
    sink = JournalSink(str(tmp_path / "socket"), queue_size=2)  # not started: nothing takes from the queue
    with caplog.at_level(logging.WARNING, logger="oomwatch.sinks.journal"):
        for _ in range(5):
            sink.publish(service)
    assert sink.dropped == 3
    assert [r.getMessage() for r in caplog.records] == ["journal: 2 entries wait already; dropped one"]


def test_journal_setting(tmp_path: Path) -> None:
    path = tmp_path / "socket"
    assert not journal_wanted("auto", str(path)) and journal_wanted("on", str(path))
    assert not journal_wanted("off", str(path))
    sock = _journald(path)
    try:
        assert journal_wanted("auto", str(path), euid=0) and not journal_wanted("off", str(path), euid=0)
        assert not journal_wanted("auto", str(path), euid=1000)  # not root: not shown under the unit
        assert journal_wanted("on", str(path), euid=1000)
    finally:
        sock.close()


def test_agent_wires_the_sink_only_when_asked() -> None:
    from oomwatch.agent import _sinks

    assert Config().journal == "off"  # a Config built outside the command never writes to this host's journal
    assert not [s for s in _sinks(Config(journal="off"), None) if isinstance(s, JournalSink)]
    sinks = [s for s in _sinks(Config(journal="on"), None) if isinstance(s, JournalSink)]
    assert len(sinks) == 1 and sinks[0].path == "/run/systemd/journal/socket"


def test_cli_default_is_auto() -> None:
    from oomwatch.cli import agent

    (option,) = [p for p in agent.params if p.name == "journal"]
    assert option.default == "auto" and option.envvar == "OOMWATCH_JOURNAL"
    assert list(option.type.choices) == ["auto", "on", "off"]
