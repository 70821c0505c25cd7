"""StatCache: signalled files kept until invalidated, memory.current/peak read with pread on held
descriptors, re-opened when the cgroup goes and comes back, bounded descriptors, malformed values counted.

The fixture trees are plain files; a removed cgroup's ENODEV (checked on a real cgroup2 mount: a held
descriptor reads ENODEV after rmdir, and still after a mkdir of the same name) is simulated where needed."""

from __future__ import annotations

import errno
import math
import os
import shutil
from pathlib import Path

import pytest

import oomwatch.sources.statcache as statcache_module
from oomwatch.sources.cgroupfs import CgroupFS
from oomwatch.sources.statcache import StatCache, descriptor_budget
from tests.conftest import FIXTURES

TREE = FIXTURES / "golden" / "memcg-scenarios" / "cgroup"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copytree(TREE, tmp_path / "cg")
    return tmp_path / "cg"


def rewrite(path: Path, text: str) -> None:
    """In place, as the kernel's file changes (the held descriptor keeps pointing at it)."""
    with open(path, "r+") as f:
        f.truncate(0)
        f.write(text)


def test_same_values_as_a_plain_read(tree: Path) -> None:
    fs = CgroupFS(str(tree))
    cache = StatCache(fs, max_open=100)
    for path in ("/a", "/b", "/p/c1", "/q/c1"):
        assert cache.read(path) == fs.read_stats(path, with_local=False)
    assert cache.read("/q/c1").peak_bytes is None  # no memory.peak there (kernel < 5.19)
    assert cache.open_descriptors == 4 + 3


def test_signalled_files_are_kept_until_invalidated(tree: Path) -> None:
    cache = StatCache(CgroupFS(str(tree)), max_open=100)
    before = cache.read("/a")
    rewrite(tree / "a/memory.max", "max\n")
    rewrite(tree / "a/memory.oom.group", "1\n")
    rewrite(tree / "a/memory.events", "low 0\nhigh 0\nmax 56\noom 2\noom_kill 2\noom_group_kill 1\n")
    kept = cache.read("/a")
    assert (kept.limit_bytes, kept.oom_group, kept.events) == (before.limit_bytes, 0, before.events)
    cache.invalidate("/a")
    fresh = cache.read("/a")
    assert (fresh.limit_bytes, fresh.oom_group, fresh.events["oom_group_kill"]) == (math.inf, 1, 1)
    rewrite(tree / "a/memory.max", "1024\n")
    cache.invalidate_all()
    assert cache.read("/a").limit_bytes == 1024.0


def test_current_and_peak_are_read_fresh_through_held_descriptors(tree: Path, monkeypatch) -> None:
    cache = StatCache(CgroupFS(str(tree)), max_open=100)
    assert cache.read("/a").usage_bytes == 1 << 20
    opened = []
    real_open = os.open
    monkeypatch.setattr(statcache_module.os, "open",
                        lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    rewrite(tree / "a/memory.current", "2097152\n")
    rewrite(tree / "a/memory.peak", "99999999\n")
    again = cache.read("/a")
    assert (again.usage_bytes, again.peak_bytes) == (2 << 20, 99999999)
    assert not [p for p in opened if p.endswith(("memory.current", "memory.peak"))]  # pread, no open


def test_removed_cgroup_is_none_and_one_back_under_the_same_name_is_read_again(tree: Path,
                                                                              monkeypatch) -> None:
    cache = StatCache(CgroupFS(str(tree)), max_open=100)
    assert cache.read("/b").limit_bytes == 64 << 20
    held = set(cache.descriptors("/b"))
    real_pread = os.pread

    def pread(fd, n, offset):
        if fd in held:  # what cgroupfs answers on a descriptor of a removed cgroup
            held.discard(fd)  # (the number is reused by the next open)
            raise OSError(errno.ENODEV, "No such device")
        return real_pread(fd, n, offset)

    monkeypatch.setattr(statcache_module.os, "pread", pread)
    saved = tree.parent / "b-saved"
    shutil.move(tree / "b", saved)
    assert cache.read("/b") is None
    assert cache.descriptors("/b") is None and cache.open_descriptors == 0
    shutil.move(saved, tree / "b")  # created again, another limit
    rewrite(tree / "b/memory.max", "max\n")
    again = cache.read("/b")
    assert again is not None and again.limit_bytes == math.inf and again.usage_bytes == 0


def test_a_stale_descriptor_drops_the_kept_values_too(tree: Path, monkeypatch) -> None:
    cache = StatCache(CgroupFS(str(tree)), max_open=100)
    cache.read("/a")
    held = set(cache.descriptors("/a"))
    real_pread = os.pread

    def pread(fd, n, offset):
        if fd in held:
            held.discard(fd)
            raise OSError(errno.ENODEV, "No such device")
        return real_pread(fd, n, offset)

    monkeypatch.setattr(statcache_module.os, "pread", pread)
    rewrite(tree / "a/memory.max", "4096\n")  # the new cgroup of the same name, no inotify seen
    assert cache.read("/a").limit_bytes == 4096.0


def test_forget_closes_descriptors(tree: Path) -> None:
    cache = StatCache(CgroupFS(str(tree)), max_open=100)
    cache.read("/a")
    fds = cache.descriptors("/a")
    assert fds
    cache.forget("/a")
    assert cache.open_descriptors == 0
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)
    cache.read("/b")
    cache.close()
    assert cache.open_descriptors == 0


def test_beyond_the_budget_files_are_read_by_path(tree: Path) -> None:
    fs = CgroupFS(str(tree))
    cache = StatCache(fs, max_open=3)
    for path in ("/a", "/b", "/p", "/p/c1"):
        assert cache.read(path) == fs.read_stats(path, with_local=False)
    assert cache.open_descriptors == 3


def test_a_missing_peak_is_looked_for_again_later(tree: Path) -> None:
    now = [0.0]
    cache = StatCache(CgroupFS(str(tree)), max_open=100, clock=lambda: now[0])
    assert cache.read("/q/c1").peak_bytes is None
    (tree / "q/c1/memory.peak").write_text("4096\n")
    assert cache.read("/q/c1").peak_bytes is None  # not looked for at every scrape
    now[0] += statcache_module.ABSENT_RETRY_SECONDS
    assert cache.read("/q/c1").peak_bytes == 4096


def test_malformed_values_are_unknown_and_counted(tree: Path) -> None:
    fs = CgroupFS(str(tree))
    cache = StatCache(fs, max_open=100)
    rewrite(tree / "a/memory.max", "-1\n")
    rewrite(tree / "a/memory.current", "9" * 400 + "\n")
    rewrite(tree / "a/memory.events", "max 1\noom x\n")
    stats = cache.read("/a")
    assert (stats.limit_bytes, stats.usage_bytes, stats.events) == (None, None, {"max": 1})
    assert fs.parse_errors == 3
    cache.read("/a")  # memory.current is read again (+1); kept values are not parsed again
    assert fs.parse_errors == 4


def test_descriptor_budget_leaves_a_reserve() -> None:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert descriptor_budget(raise_limit=False) == max(0, soft - statcache_module.RESERVED_DESCRIPTORS)
