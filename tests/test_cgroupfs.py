"""cgroup v2 readers on fixture trees, their parsers, and the inotify watcher on a real directory tree."""

from __future__ import annotations

import math
import os
import queue
import shutil
import threading
from pathlib import Path

from oomwatch.parse.cgroup import (
    parse_flat_keyed,
    parse_limit,
    parse_mounts_cgroup_version,
    parse_pids,
    parse_proc_pid_cgroup,
)
from oomwatch.sources.cgroupfs import CgroupFS, CgroupWatcher, Proc
from tests.conftest import FIXTURES

TREE = FIXTURES / "golden" / "memcg-scenarios" / "cgroup"


def test_read_stats_of_a_fixture_cgroup() -> None:
    fs = CgroupFS(str(TREE))
    a = fs.read_stats("/a", with_pids=True)
    assert (a.oom_group, a.limit_bytes, a.usage_bytes, a.peak_bytes, a.pids) == (0, 64 << 20, 1 << 20, 64 << 20, (117,))
    assert a.events == {"low": 0, "high": 0, "max": 55, "oom": 1, "oom_kill": 1, "oom_group_kill": 0}
    q1 = fs.read_stats("/q/c1")
    assert math.isinf(q1.limit_bytes) and q1.peak_bytes is None  # memory.peak absent (kernel < 5.19)
    assert list(fs.walk()) == ["/", "/a", "/b", "/p", "/p/c1", "/p/c2", "/q", "/q/c1", "/q/c2"]
    assert fs.memory_event_fields() == ("low", "high", "max", "oom", "oom_kill", "oom_group_kill")


def test_a_cgroup_that_vanishes_mid_read_is_skipped_silently(tmp_path: Path) -> None:
    tree = tmp_path / "cg"
    shutil.copytree(TREE, tree)
    fs = CgroupFS(str(tree))
    walk = fs.walk()
    assert next(walk) == "/"
    shutil.rmtree(tree / "p")  # removed between listing the root and descending into it
    rest = list(walk)
    assert "/p/c1" not in rest and "/q/c2" in rest
    assert fs.read_stats("/p") is None
    assert fs.read_pids("/p") == ()
    assert fs.read_events("/p") == (None, None)


def test_parsers_tolerate_what_the_kernel_and_partial_reads_give() -> None:
    assert parse_flat_keyed("max 3\noom 1\nsock_throttled 0\ngarbage\nhalf ") == {"max": 3, "oom": 1,
                                                                                 "sock_throttled": 0}
    assert parse_limit("max\n") == float("inf") and parse_limit("67108864\n") == 67108864.0
    assert parse_limit("") is None
    assert parse_pids("12\n13\n\n") == (12, 13)
    assert parse_proc_pid_cgroup("0::/kubepods/x\n") == "/kubepods/x"
    assert parse_proc_pid_cgroup("0::/a/b (deleted)\n") == "/a/b"
    assert parse_proc_pid_cgroup("12:memory:/docker/x\n") is None  # v1 only


def test_cgroup_version_from_the_mount_table() -> None:
    v2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n"
    hybrid = ("tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
              "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n")
    v1 = "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
    assert [parse_mounts_cgroup_version(t) for t in (v2, hybrid, v1, "")] == ["v2", "hybrid", "v1", "none"]


def test_proc_reader(tmp_path: Path) -> None:
    for pid, stat in ((7, "7 (sleep) S 1 7 7 0 -1 4194304 80 0"), (9, "9 (my (odd) dd) R 1 9 9 0 -1 4194308 80 0"),
                      (10, "10 (sh) Z 1 10 10 0 -1 4194316 80 0")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(stat + " 0 0 0\n")
        (tmp_path / str(pid) / "cgroup").write_text("0::/\n" if pid != 7 else "0::/system.slice/x.service\n")
    proc = Proc(str(tmp_path))
    assert proc.cgroup_of(7) == "/system.slice/x.service"
    assert proc.cgroup_of(8) is None  # exited
    # Being killed (PF_EXITING in the flags) or a zombie: /proc/<pid>/cgroup says "/", which is not where it was
    assert proc.cgroup_of(9) is None and proc.cgroup_of(10) is None
    assert proc.boot_id() == "unknown"


def test_watcher_reports_new_removed_and_changed_cgroups(tmp_path: Path) -> None:
    tree = tmp_path / "cg"
    shutil.copytree(TREE, tree)
    seen: queue.Queue = queue.Queue()
    watcher = CgroupWatcher(CgroupFS(str(tree)), on_added=lambda p: seen.put(("added", p)),
                            on_removed=lambda p: seen.put(("removed", p)),
                            on_events=lambda p: seen.put(("events", p)))
    assert watcher.start_watching() == ["/", "/a", "/b", "/p", "/p/c1", "/p/c2", "/q", "/q/c1", "/q/c2"]
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        staging = tmp_path / "new"
        (staging / "child").mkdir(parents=True)
        for d in (staging, staging / "child"):
            (d / "memory.events").write_text("max 0\n")
        os.rename(staging, tree / "new")  # appears whole, as mkdir on cgroupfs does
        assert seen.get(timeout=5) == ("added", "/new")
        assert seen.get(timeout=5) == ("added", "/new/child")
        (tree / "new" / "child" / "memory.events").write_text("max 1\n")
        assert seen.get(timeout=5) == ("events", "/new/child")
        shutil.rmtree(tree / "new")
        removed: set = set()
        while len(removed) < 2:
            kind, path = seen.get(timeout=5)  # a write is truncate + write: more "events" may be queued
            if kind == "removed":
                removed.add(path)
        assert removed == {"/new", "/new/child"}
    finally:
        watcher.stop()
        thread.join(timeout=5)
    assert not thread.is_alive() and watcher.error is None
