"""The netlink proc connector: a second witness of processes that died by SIGKILL.

When a group kill takes a container's PID 1, the kernel tears the pid namespace down and the other
processes die without a `Killed process` line (see ../shared/KERNEL-FACTS.md). Their exit events are the
only record. Exit events carry pid, tgid and the wait status; they need CAP_NET_ADMIN up to 6.1 and reach
only the initial pid namespace (and network namespace: hostNetwork in a pod).
"""

from __future__ import annotations

import logging
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
    signal: int  # the signal that ended it
    time: float  # when we heard of it (epoch seconds)


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
    """A PROC_EVENT_EXIT of a whole process (not one of its threads) ended by a signal, else None."""
    if event.get("event") != "PROC_EVENT_EXIT":
        return None
    pid, tgid = event.get("process_pid"), event.get("process_tgid")
    if pid is None or pid != tgid:
        return None  # a thread; the process's own exit comes separately
    signal = terminating_signal(int(event.get("exit_code", 0)))
    return ProcessExit(pid=int(pid), signal=signal, time=now) if signal is not None else None


class ProcConnector:
    """Listens to process events on a thread of its own and calls `on_exit` for each process ended by a
    signal, `on_fork` for each new process and `on_exec` for each exec, from `start()` until `stop()`."""

    def __init__(self, on_exit: Callable[[ProcessExit], None], clock: Callable[[], float],
                 on_fork: Callable[[ProcessFork], None] = lambda fork: None,
                 on_exec: Callable[[int], None] = lambda pid: None) -> None:
        self._on_exit = on_exit
        self._on_fork = on_fork
        self._on_exec = on_exec
        self._clock = clock
        self._socket: Any = None
        self._stopped = threading.Event()
        self._open_error: Optional[ProcConnectorUnavailable] = None
        self._thread: Optional[threading.Thread] = None
        self.error: Optional[str] = None

    def start(self) -> None:
        """Open the connector on its own thread (pyroute2's sockets belong to the thread that made them)
        and listen there. Raises ProcConnectorUnavailable when it cannot be opened."""
        try:  # imported here, not on the thread: pyroute2 is slow to import on a slow machine
            import pyroute2.netlink.connector.cn_proc  # noqa: F401
        except ImportError as exc:
            raise ProcConnectorUnavailable(f"proc connector: {exc}") from exc
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="proc-connector", daemon=True)
        self._thread.start()
        if not ready.wait(timeout=30):
            raise ProcConnectorUnavailable("proc connector: no answer from netlink in 30 s")
        if self._open_error is not None:
            raise self._open_error

    def _open(self) -> Any:
        try:
            from pyroute2.netlink.connector.cn_proc import ProcEventSocket

            sock = ProcEventSocket()
            sock.bind()
            sock.control(listen=True)
            return sock
        except PermissionError as exc:
            raise ProcConnectorUnavailable(
                "proc connector: permission denied (needs CAP_NET_ADMIN on kernels up to 6.1, and the host's "
                "network namespace: hostNetwork in a pod)") from exc
        except (OSError, ImportError) as exc:
            raise ProcConnectorUnavailable(f"proc connector: {exc}") from exc

    def _run(self, ready: threading.Event) -> None:
        try:
            self._socket = self._open()
        except ProcConnectorUnavailable as exc:
            self._open_error = exc
            ready.set()
            return
        ready.set()
        # pyroute2 buffers several datagrams per recv and hands out one per get(): polling its fd would
        # stall with events waiting in that buffer, so this thread blocks in get(). Process events are
        # frequent on any host, so stop() takes effect at the next one (the thread is a daemon).
        try:
            while not self._stopped.is_set():
                for event in self._socket.get():
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

    def stop(self) -> None:
        self._stopped.set()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
