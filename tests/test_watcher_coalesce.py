"""The cgroup watcher coalesces: a cgroup's memory.events that moved many times between two reads is handled
once (an OOM storm moves every ancestor's counters with every kill)."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

from oomwatch.sources.cgroupfs import CgroupFS, CgroupWatcher
from tests.conftest import FIXTURES, wait_for


def test_many_changes_between_reads_are_one_call(tmp_path: Path) -> None:
    tree = tmp_path / "cgroup"
    shutil.copytree(FIXTURES / "golden" / "memcg-scenarios" / "cgroup", tree)
    calls: list[str] = []
    watcher = CgroupWatcher(CgroupFS(str(tree)), on_added=lambda p: None, on_removed=lambda p: None,
                            on_events=calls.append)
    watcher.start_watching()
    for n in range(5):  # queued before the watcher reads: one batch
        (tree / "a" / "memory.events").write_text(f"max {n}\noom 0\noom_kill 0\n")
        (tree / "b" / "memory.events").write_text(f"max {n}\noom 0\noom_kill 0\n")
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    assert wait_for(lambda: len(calls) >= 2)
    watcher.stop()
    thread.join(5)
    assert sorted(calls) == ["/a", "/b"]
