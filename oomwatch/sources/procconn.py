"""The netlink proc connector: a second witness of processes that died by SIGKILL.

When a group kill takes a container's PID 1, the kernel tears the pid namespace down and the other
processes die without a `Killed process` line (see docs/kernel-facts.md). Their exit events are the
only record. Exit events carry pid, tgid and the wait status; they need CAP_NET_ADMIN up to 6.1 and reach
only the initial pid namespace (and network namespace: hostNetwork in a pod).

The socket is spoken directly (linux/connector.h, linux/cn_proc.h: a few fixed structs), not through pyroute2,
whose package import alone took most of the agent's start-up time under emulation.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

log = logging.getLogger(__name__)

SIGKILL = 9


class ProcConnectorUnavailable(Exception):
    """The proc connector cannot be used here; the message says why."""


@dataclass(frozen=True)
class ProcessExit:
    pid: int
    signal: Optional[int]  # the signal that ended it (None: it exited)
    time: float  # when we heard of it (epoch seconds)
    code: Optional[int] = None  # its exit status, when it exited (WEXITSTATUS)


def terminating_signal(wait_status: int) -> Optional[int]:
    """The signal in a wait(2) status, None for a normal exit (WIFSIGNALED / WTERMSIG)."""
    signal = wait_status & 0x7F
    return signal if signal not in (0, 0x7F) else None


@dataclass(frozen=True)
class ProcessFork:
    parent: int  # the parent process (tgid)
    child: int
    parent_task: int = 0  # the parent task (pid): with CLONE_PARENT (runc's init) not of the `parent` process


def fork_from_event(event: Mapping[str, Any]) -> Optional[ProcessFork]:
    """A PROC_EVENT_FORK that made a new process (not a thread), else None. The child starts in its parent's
    cgroup: that is how a process the agent never saw alive still gets a cgroup."""
    if event.get("event") != "PROC_EVENT_FORK":
        return None
    child, child_tgid = event.get("child_pid"), event.get("child_tgid")
    if child is None or child != child_tgid:
        return None
    return ProcessFork(parent=int(event.get("parent_tgid", 0)), child=int(child),
                       parent_task=int(event.get("parent_pid", 0)))


def exec_from_event(event: Mapping[str, Any]) -> Optional[int]:
    """The pid of a process that just exec'd (alive, so its cgroup can be read now), else None."""
    if event.get("event") != "PROC_EVENT_EXEC":
        return None
    pid, tgid = event.get("process_pid"), event.get("process_tgid")
    return int(pid) if pid is not None and pid == tgid else None


def exit_from_event(event: Mapping[str, Any], now: float) -> Optional[ProcessExit]:
    """A PROC_EVENT_EXIT of a whole process (not one of its threads), with the signal that ended it or its exit
    status (a workload's main process that exits 1 after its GPU ran out of memory matters too), else None."""
    if event.get("event") != "PROC_EVENT_EXIT":
        return None
    pid, tgid = event.get("process_pid"), event.get("process_tgid")
    if pid is None or pid != tgid:
        return None  # a thread; the process's own exit comes separately
    status = int(event.get("exit_code", 0))
    signal = terminating_signal(status)
    if signal is not None:
        return ProcessExit(pid=int(pid), signal=signal, time=now)
    if status & 0x7F:
        return None  # stopped or continued (0x7F): not an end
    return ProcessExit(pid=int(pid), signal=None, time=now, code=(status >> 8) & 0xFF)


# linux/netlink.h, linux/connector.h, linux/cn_proc.h
NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
NLMSG_DONE = 3
_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_CN_MSG = struct.Struct("=IIIIHH")  # idx, val, seq, ack, len, flags
_EVENT_HEAD = struct.Struct("=IIQ")  # what, cpu, timestamp_ns
_EVENTS = {1: "PROC_EVENT_FORK", 2: "PROC_EVENT_EXEC", 0x80000000: "PROC_EVENT_EXIT"}
_FIELDS = {
    "PROC_EVENT_FORK": ("parent_pid", "parent_tgid", "child_pid", "child_tgid"),
    "PROC_EVENT_EXEC": ("process_pid", "process_tgid"),
    "PROC_EVENT_EXIT": ("process_pid", "process_tgid", "exit_code", "exit_signal"),
}


def parse_proc_events(datagram: bytes) -> list[dict[str, Any]]:
    """The fork, exec and exit events in one netlink datagram from the proc connector (others are left out),
    as dicts named after the kernel's fields."""
    out = []
    at = 0
    while at + _NLMSGHDR.size <= len(datagram):
        length = _NLMSGHDR.unpack_from(datagram, at)[0]
        if length < _NLMSGHDR.size or at + length > len(datagram):
            break
        body = at + _NLMSGHDR.size
        if length >= _NLMSGHDR.size + _CN_MSG.size + _EVENT_HEAD.size:
            idx, val, _, _, data_len, _ = _CN_MSG.unpack_from(datagram, body)
            ev = body + _CN_MSG.size
            if (idx, val) == (CN_IDX_PROC, CN_VAL_PROC) and data_len >= _EVENT_HEAD.size:
                what = _EVENT_HEAD.unpack_from(datagram, ev)[0]
                name = _EVENTS.get(what)
                fields = _FIELDS.get(name or "")
                start = ev + _EVENT_HEAD.size
                if name and fields and start + 4 * len(fields) <= at + length:
                    values = struct.unpack_from(f"={len(fields)}I", datagram, start)
                    out.append({"event": name, **dict(zip(fields, values))})
        at += (length + 3) & ~3  # NLMSG_ALIGN
    return out


def listen_message(seq: int = 1) -> bytes:
    """PROC_CN_MCAST_LISTEN: start sending this socket the process events."""
    op = struct.pack("=I", PROC_CN_MCAST_LISTEN)
    cn = _CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, seq, 0, len(op), 0) + op
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(cn), NLMSG_DONE, 0, seq, os.getpid()) + cn


class ProcConnector:
    """Listens to process events on a thread of its own and calls `on_exit` for each process that ended
    (by a signal or with an exit status), `on_fork` for each new process and `on_exec` for each exec, from `start()` until `stop()`."""

    def __init__(self, on_exit: Callable[[ProcessExit], None], clock: Callable[[], float],
                 on_fork: Callable[[ProcessFork], None] = lambda fork: None,
                 on_exec: Callable[[int], None] = lambda pid: None) -> None:
        self._on_exit = on_exit
        self._on_fork = on_fork
        self._on_exec = on_exec
        self._clock = clock
        self._socket: Optional[socket.socket] = None
        self._stop_r, self._stop_w = os.pipe()
        self._stopped = threading.Event()
        self._open_error: Optional[ProcConnectorUnavailable] = None
        self._thread: Optional[threading.Thread] = None
        self.error: Optional[str] = None

    def start(self) -> None:
        """Open the connector and listen on a thread of its own. Raises ProcConnectorUnavailable when it
        cannot be opened."""
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_CONNECTOR)
        except OSError as exc:
            raise ProcConnectorUnavailable(f"proc connector: {exc.strerror or exc}") from exc
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # bursts of forks in a storm
            sock.bind((0, CN_IDX_PROC))
            sock.send(listen_message())
        except PermissionError as exc:
            sock.close()
            raise ProcConnectorUnavailable(
                "proc connector: permission denied (needs CAP_NET_ADMIN on kernels up to 6.1, and the host's "
                "network namespace: hostNetwork in a pod)") from exc
        except OSError as exc:
            sock.close()
            raise ProcConnectorUnavailable(f"proc connector: {exc.strerror or exc}") from exc
        self._socket = sock
        self._thread = threading.Thread(target=self._run, name="proc-connector", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self._socket is not None
        sock = self._socket
        try:
            while not self._stopped.is_set():
                ready, _, _ = select.select([sock, self._stop_r], [], [])
                if self._stop_r in ready:
                    return
                try:
                    datagram = sock.recv(65536)
                except OSError as exc:
                    if exc.errno == 105:  # ENOBUFS: events overflowed the socket; go on with the next ones
                        log.warning("proc connector: events dropped (socket buffer full)")
                        continue
                    raise
                for event in parse_proc_events(datagram):
                    process_exit = exit_from_event(event, self._clock())
                    if process_exit is not None:
                        self._on_exit(process_exit)
                        continue
                    fork = fork_from_event(event)
                    if fork is not None:
                        self._on_fork(fork)
                        continue
                    pid = exec_from_event(event)
                    if pid is not None:
                        self._on_exec(pid)
        except Exception as exc:
            if not self._stopped.is_set():
                self.error = f"proc connector stopped: {exc}"
                log.exception("proc connector stopped")
        finally:
            sock.close()

    def stop(self) -> None:
        self._stopped.set()
        try:
            os.write(self._stop_w, b"x")
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
