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


class _OverflowingInotify:
    """inotify whose queue overflowed: the next read says so twice (the kernel's one IN_Q_OVERFLOW, and one more
    queued behind other events), then blocks."""

    def __init__(self) -> None:
        import os

        import inotify_simple

        self._flags = inotify_simple.flags
        self._r, self._w = os.pipe()
        self._next_wd = 0
        self._batches: list[list] = []

    def add_watch(self, path: str, mask: int) -> int:
        self._next_wd += 1
        return self._next_wd

    def overflow(self) -> None:
        import os

        from inotify_simple import Event

        overflow = Event(wd=-1, mask=self._flags.Q_OVERFLOW, cookie=0, name="")
        self._batches.append([overflow, overflow])
        os.write(self._w, b"x")

    def fileno(self) -> int:
        return self._r

    def read(self, timeout=None):
        import os

        os.read(self._r, 1)
        return self._batches.pop(0)

    def close(self) -> None:
        import os

        os.close(self._r)
        os.close(self._w)


def test_an_overflow_rescans_the_tree_once_and_rereads_the_counters(tmp_path: Path) -> None:
    """Events were dropped: the tree is listed again once per overflow (not once per overflow event), cgroups made
    and removed meanwhile are found, and every cgroup's memory.events is read again (a counter whose move was
    dropped is a kill to count)."""
    tree = tmp_path / "cgroup"
    shutil.copytree(FIXTURES / "golden" / "memcg-scenarios" / "cgroup", tree)
    added: list[str] = []
    removed: list[str] = []
    events: list[str] = []
    rescans: list[int] = []
    inotify = _OverflowingInotify()
    watcher = CgroupWatcher(CgroupFS(str(tree)), on_added=added.append, on_removed=removed.append,
                            on_events=events.append, inotify=inotify)
    watcher.on_resync = lambda: rescans.append(1)
    known = watcher.start_watching()
    (tree / "new").mkdir()
    shutil.rmtree(tree / "b")
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    inotify.overflow()
    assert wait_for(lambda: "/new" in added and "/b" in removed)
    watcher.stop()
    thread.join(5)
    assert rescans == [1]
    assert sorted(set(events)) == sorted(p for p in [*known, "/new"] if p != "/" and p != "/b")
    assert len(events) == len(set(events))
