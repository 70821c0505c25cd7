"""What `oomwatch agent` imports before it answers (issue 30 item 4): under emulation every module is a tenth of a
second or more, so what the start does not need stays out of it. And the agent's own inotify (no
ctypes.util.find_library, which runs `ldconfig -p` in a child process) behaves as inotify_simple's did."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import inotify_simple

from oomwatch.sources.inotify import Event, INotify, flags, parse_events

REPO = Path(__file__).resolve().parent.parent

# Imported by nothing the start runs: each was, and cost the start its import (or a child process) for a use
# that comes later or never.
NOT_AT_START = {
    "ctypes.util": "inotify_simple's libc lookup (it runs /sbin/ldconfig -p)",
    "subprocess": "ctypes.util",
    "tempfile": "the state file's first save",
    "shutil": "tempfile",
    "hashlib": "a label value cut for length",
    "ipaddress": "the first HTTP client",
}

START = """
import json, os, sys
sys.argv = ["oomwatch", "agent"]
import oomwatch.cli, oomwatch.agent
from oomwatch.sources.cgroupfs import CgroupFS, CgroupWatcher
from oomwatch.sources.kubeletconfig import KubeletConfigWatch
root = os.environ["ROOT"]
watcher = CgroupWatcher(CgroupFS(root), on_added=print, on_removed=print, on_events=print)
watcher.close()
kubelet = KubeletConfigWatch(os.path.join(root, "config.yaml"), lambda: "", print)
kubelet.start()
kubelet.stop()
print(json.dumps(sorted(sys.modules)))
"""


def test_the_start_imports_nothing_it_does_not_need(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("memory\n")
    # -S: the packages as a node has them installed, not through this checkout's editable finder (its .pth
    # imports pathlib, urllib.parse and ipaddress before any of oomwatch)
    env = {**os.environ, "ROOT": str(tmp_path), "PYTHONPATH": os.pathsep.join(site.getsitepackages())}
    out = subprocess.run([sys.executable, "-S", "-c", START], cwd=str(REPO), env=env, capture_output=True, text=True,
                         check=True, timeout=120).stdout
    imported = set(json.loads(out.splitlines()[-1]))
    assert "oomwatch.agent" in imported and "oomwatch.sources.inotify" in imported
    assert {name: why for name, why in NOT_AT_START.items() if name in imported} == {}


def test_the_masks_are_the_kernels() -> None:
    ours = {name: value for name, value in vars(flags).items() if name.isupper()}
    assert ours == {member.name: member.value for member in inotify_simple.flags}


def test_events_are_read_as_the_kernel_queues_them(tmp_path: Path) -> None:
    inotify = INotify()
    try:
        assert inotify.read(timeout=0) == []  # nothing queued: at once, empty
        wd = inotify.add_watch(str(tmp_path), flags.CREATE | flags.DELETE | flags.ONLYDIR)
        (tmp_path / "c1").mkdir()
        (tmp_path / "c1").rmdir()
        events = inotify.read(timeout=1000)
        assert [(e.wd, e.mask & ~flags.ISDIR, e.name, bool(e.mask & flags.ISDIR)) for e in events] == [
            (wd, flags.CREATE, "c1", True), (wd, flags.DELETE, "c1", True)]
        (tmp_path / "f").touch()
        inotify.read(timeout=0)  # the file's creation
        file_wd = inotify.add_watch(str(tmp_path / "f"), flags.MODIFY)
        (tmp_path / "f").write_text("x")
        assert [(e.wd, e.mask, e.name) for e in inotify.read(timeout=1000)] == [(file_wd, flags.MODIFY, "")]
        inotify.rm_watch(file_wd)
        assert [e.mask for e in inotify.read(timeout=1000)] == [flags.IGNORED]  # the kernel's word on a removal
    finally:
        inotify.close()


def test_a_watch_the_kernel_refuses_raises_its_errno(tmp_path: Path) -> None:
    inotify = INotify()
    try:
        try:
            inotify.add_watch(str(tmp_path / "absent"), flags.MODIFY)
        except OSError as exc:
            assert exc.errno == 2  # ENOENT, as the watcher's callers test for
        else:
            raise AssertionError("a watch on a missing path was accepted")
    finally:
        inotify.close()


def test_parse_events_reads_names_padded_with_nuls() -> None:
    import struct

    data = struct.pack("iIII", 3, flags.CREATE, 0, 16) + b"pod1".ljust(16, b"\0")
    data += struct.pack("iIII", -1, flags.Q_OVERFLOW, 0, 0)
    assert parse_events(data) == [Event(3, flags.CREATE, 0, "pod1"), Event(-1, flags.Q_OVERFLOW, 0, "")]
