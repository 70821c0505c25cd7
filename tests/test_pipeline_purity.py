"""Pipeline.step() decides without I/O: a whole capture with its cgroup events replays with files, sockets and
the clock refused, and gives the same incidents; the pipeline's module imports no source or sink."""

from __future__ import annotations

import builtins
import io
import json
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from oomwatch.events import CgroupChanged, KernelLog
from oomwatch.node import NodePosture
from oomwatch.pipeline import Settings
from oomwatch.sources.cgroupfs import Proc
from tests.conftest import BOOT_TIME, DETECTED_AT, FIXTURES, REPO
from tests.replay import Replay, live_reads, live_settings, saved_log_events, tree_events
from tests.test_golden import CASES, golden_config

MEMCG = FIXTURES / "golden" / "memcg-scenarios"


class Refused(AssertionError):
    pass


@contextmanager
def no_io(monkeypatch) -> Iterator[None]:
    """Every way to a file, a socket or the clock raises while the block runs."""

    def refuse(what: str):
        def refused(*args, **kwargs):
            raise Refused(f"{what} called with {args!r:.200}")
        return refused

    with monkeypatch.context() as patch:
        for module, name in ((builtins, "open"), (io, "open"), (os, "open"), (os, "stat"), (os, "lstat"),
                             (os, "scandir"), (os, "listdir"), (os, "read"), (socket, "socket"),
                             (time, "time"), (time, "monotonic")):
            patch.setattr(module, name, refuse(f"{module.__name__}.{name}"))
        yield


def test_the_refusal_is_real(monkeypatch, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with no_io(monkeypatch):
        for attempt in (lambda: open(tmp_path / "f"), lambda: (tmp_path / "f").read_text(), time.time,
                        lambda: os.stat(tmp_path), lambda: list(os.scandir(tmp_path)), socket.socket):
            with pytest.raises(Refused):
                attempt()
    assert (tmp_path / "f").read_text() == "x"  # and it ends with the block


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_golden_replay_gives_its_incidents_with_io_refused(case: Path, monkeypatch) -> None:
    config = golden_config(case, Path("/nonexistent"))
    replay = Replay(Settings(boot_id=Proc(config.proc).boot_id(), boot_time=BOOT_TIME, kmsg_source=None,
                             counting=False), now=DETECTED_AT,
                    single_process_oom_kill=NodePosture(config, Proc(config.proc)).single_process_oom_kill())
    events = tree_events(case / "cgroup", case / "run", case / "pods") + saved_log_events(case / "kmsg")
    with no_io(monkeypatch):
        replay.run(events)
        replay.settle()
        incidents = [i.to_json() for i in replay.published]
        snapshot = replay.pipeline.view().store
    expected = json.loads((case / "expected-incidents.json").read_text())
    assert json.loads(json.dumps(incidents)) == expected
    assert list(snapshot.incidents) == expected


def test_a_live_replay_with_counters_moving_is_the_same_with_io_refused(monkeypatch, tmp_path: Path) -> None:
    """The memcg capture read live, each incident's memory.events moving before its records (as the kernel
    does), one incident's records lost: kernel log, node state, reconciler, witness queue and saves all run
    with I/O refused, and give what they give with it allowed."""
    import shutil

    from tests.replay import LiveReader, RecordedTree
    from tests.test_pipeline_counts import incident_batches, move_counters, zero_counters

    tree = tmp_path / "cgroup"
    shutil.copytree(MEMCG / "cgroup", tree)
    zero_counters(tree)
    recorded, reader = RecordedTree(tree), LiveReader()
    steps = [(0.0, e) for e in recorded.start()]
    for kill_time, cgroups, raw in incident_batches(lose=(2,)):
        steps += [(kill_time, e) for e in move_counters(recorded, tree, cgroups)]
        steps.append((kill_time + 0.01, KernelLog(reader.read(raw), drained_at=1_000.0 + kill_time + 0.01)))
    recorded.close()
    reader.close()
    assert sum(isinstance(e, CgroupChanged) for _, e in steps) == 7

    def run() -> tuple[list, list, dict]:
        replay = Replay(live_settings(boot_time=1_000.0), now=1_000.0)
        for at, event in steps:
            replay.step(event, 1_000.0 + at)
        replay.settle()
        return [i.to_json() for i in replay.published], replay.saves, replay.pipeline.state()

    allowed = run()
    with no_io(monkeypatch):
        refused = run()
    assert [(i["evidence"], i["kind"]) for i in refused[0]] == [
        ("kmsg", "single"), ("kmsg", "group"), ("memory.events", "group"), ("kmsg", "group")]
    assert refused == allowed


def test_the_pipeline_module_imports_no_source_or_sink() -> None:
    code = ("import sys, oomwatch.pipeline; print('\\n'.join(sorted(m for m in sys.modules if m.startswith("
            "('oomwatch.sources', 'oomwatch.sinks', 'oomwatch.agent', 'oomwatch.pump', "
            "'oomwatch.statefile')))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == []
    # and the check sees such an import when there is one
    code = code.replace("oomwatch.pipeline;", "oomwatch.pipeline, oomwatch.sources.kmsg;")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert "oomwatch.sources.kmsg" in out.stdout.split()
