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
    """Listens to process exits on a thread of its own and calls `on_exit` for each process ended by a
    signal, from `start()` until `stop()`."""

    def __init__(self, on_exit: Callable[[ProcessExit], None], clock: Callable[[], float]) -> None:
        self._on_exit = on_exit
        self._clock = clock
        self._socket: Any = None
        self._stopped = threading.Event()
        self._open_error: Optional[ProcConnectorUnavailable] = None
        self._thread: Optional[threading.Thread] = None
        self.error: Optional[str] = None

    def start(self) -> None:
        """Open the connector on its own thread (pyroute2's sockets belong to the thread that made them)
        and listen there. Raises ProcConnectorUnavailable when it cannot be opened."""
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="proc-connector", daemon=True)
        self._thread.start()
        if not ready.wait(timeout=10):
            raise ProcConnectorUnavailable("proc connector: no answer from netlink")
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
        except Exception as exc:
            if not self._stopped.is_set():
                self.error = f"proc connector stopped: {exc}"
                log.exception("proc connector stopped")

    def stop(self) -> None:
        self._stopped.set()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
