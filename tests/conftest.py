"""Shared test helpers: fixture paths and a real agent started on a fixture tree."""

from __future__ import annotations

import json
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"
CAPTURES = FIXTURES / "kmsg"

# Fixed clocks for golden output: kernel time 0 of the captured boot, and "now".
BOOT_TIME = 1795380000.0  # 2026-11-22T20:40:00Z
DETECTED_AT = 1795390000.0


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


@contextmanager
def running_agent(config, **kwargs) -> Iterator:
    from oomwatch.agent import Agent

    agent = Agent(config, **kwargs)
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()


def base_url(agent) -> str:
    host, port = agent.http.address
    return f"http://{host}:{port}"


def incidents_of(agent) -> list[dict]:
    return json.loads(http_get(base_url(agent) + "/incidents")[1])


@pytest.fixture
def capture_path():
    return lambda name: str(CAPTURES / name)


def raw_records(path) -> list[bytes]:
    """A saved raw /dev/kmsg dump split back into the records one read() returned (continuation lines
    belong to the record before them)."""
    records: list[bytes] = []
    for line in Path(path).read_bytes().splitlines(keepends=True):
        if line.startswith(b" ") and records:
            records[-1] += line
        elif line.strip() and not line.startswith(b"#"):
            records.append(line)
    return records


class SeqpacketKmsg:
    """Stands in for /dev/kmsg in agent tests: a SOCK_SEQPACKET pair returns one record per read(), blocks
    and polls like the device. `send(records)` is what the kernel would print."""

    def __init__(self) -> None:
        import socket

        self.reader, self.writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.reader.setblocking(False)

    def send(self, records) -> None:
        """Queue records from a thread: the socket holds only a few hundred, as the reader drains them."""
        import threading

        records = list(records)
        if len(records) <= 64:  # fits the socket: queued at once, as the kernel prints a report's lines at once
            for r in records:
                self.writer.send(r)
            return
        thread = threading.Thread(target=lambda: [self.writer.send(r) for r in records], daemon=True)
        thread.start()
        self.senders = getattr(self, "senders", []) + [thread]

    def factory(self, path: str):
        from oomwatch.sources.kmsg import LiveKmsg

        fake = self

        class _Reader(LiveKmsg):
            def open(self, after_seq=None) -> None:
                self.fd = fake.reader.fileno()
                self._last_seq = after_seq

            def close(self) -> None:
                pass

        return _Reader(path)


def make_correlator(*, boot_id: str, boot_time: float, resolver, posture_single=lambda: "unknown", view=None,
                    cgroup_of_pid=None, clock=time.time, live: bool = True):
    """A correlator alone, for its unit tests (the agent and inspect run it inside the pipeline: oomwatch.replay):
    `view` or `cgroup_of_pid` what it may know of the node; `live`: this host's log (its page size)."""
    import os

    from oomwatch.correlator import BlindView, Correlator
    from oomwatch.explain import explain

    if view is None and cgroup_of_pid is not None:
        class PidView(BlindView):
            def cgroup_of_pid(self, pid: int):
                return cgroup_of_pid(pid)

        view = PidView()
    return Correlator(boot_id=boot_id, boot_time=boot_time, resolve_workload=resolver.resolve,
                      scope_of=resolver.layout.scope_of, explain=lambda incident: explain(incident, posture_single()),
                      view=view or BlindView(), detected_clock=clock, live=live,
                      page_size=os.sysconf("SC_PAGE_SIZE") if live else None, tmpfs_mounts=resolver.tmpfs_mounts)
