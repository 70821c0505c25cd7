"""The cgroup watcher where inotify runs out or the agent may not read: every cgroup is still reported, what is not
watched is said once, counted and exposed (its `health`: `blind` and the `unwatched` counts), and the tree is
watched again when watches are freed. Real kernel errors: ENOSPC from a user namespace whose
`user.max_inotify_watches` is small (the host's limit is untouched), EACCES from a child that drops to a uid no
process uses (so no other process holds that uid's inotify budget). Removal costs what is removed."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from oomwatch.sources.cgroupfs import CgroupFS, CgroupWatcher

REPO = Path(__file__).resolve().parent.parent
FILES = ("memory.events", "cgroup.events", "memory.max", "memory.oom.group")


def make_cgroup(path: Path) -> None:
    path.mkdir(parents=True)
    for name in FILES:
        (path / name).write_text("0\n")


def run_child(script: str, tree: Path, prefix: list[str]) -> dict:
    """`script` in a fresh interpreter under `prefix` (unshare, setpriv); its last stdout line is JSON."""
    code = f"import sys; sys.path.insert(0, {str(REPO)!r}); TREE = {str(tree)!r}\n" + script
    result = subprocess.run(prefix + [sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


CHILD_COMMON = """
import json, logging, os, threading, time
import oomwatch.sources.cgroupfs as cgroupfs
from oomwatch.sources.cgroupfs import CgroupFS, CgroupWatcher

class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []
    def emit(self, record):
        self.lines.append([record.levelname, record.getMessage()])

said = Lines()
logging.getLogger("oomwatch").addHandler(said)
logging.getLogger("oomwatch").setLevel(logging.INFO)
seen = {"added": [], "removed": []}
watcher = CgroupWatcher(CgroupFS(TREE), on_added=seen["added"].append, on_removed=seen["removed"].append,
                        on_events=lambda p: None)

def wait(predicate, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.02)
    return predicate()
"""

OUT_OF_WATCHES = CHILD_COMMON + """
def set_limit(n):
    with open("/proc/sys/user/max_inotify_watches", "w") as f:
        f.write(str(n))

set_limit(100)  # this user namespace's own limit: the host's is not touched
cgroupfs.UNWATCHED_RESCAN_SECONDS = 0.2
watcher._max_user_watches = "/proc/sys/user/max_inotify_watches"
found = watcher.start_watching()
out = {"found": len(found), "blind": watcher.health.blind, "counts": watcher.health.unwatched,
       "unwatched_limits": len(watcher.unwatched_limits), "watch_errors": watcher.watch_errors}
thread = threading.Thread(target=watcher.run, daemon=True)
thread.start()
# A cgroup made under a directory inotify does not watch is found by the listing, late but not never, and
# however busy inotify is (a watched memory.events moving every 10 ms).
busy = threading.Event()
def churn():
    while not busy.is_set():
        with open(TREE + "/pod00/memory.events", "w") as f:
            f.write("oom 1\\n")
        time.sleep(0.01)
threading.Thread(target=churn, daemon=True).start()
last = sorted(found)[-1]
os.mkdir(TREE + last + "/late")
out["late_found"] = wait(lambda: last + "/late" in seen["added"])
busy.set()
set_limit(100000)
out["watched_again"] = wait(lambda: watcher.health.blind is None)
out["counts_after"] = watcher.health.unwatched
out["unwatched_limits_after"] = len(watcher.unwatched_limits)
watcher.stop()
thread.join(5)
watcher.close()
out["lines"] = said.lines
print(json.dumps(out))
"""


def unshare_available() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-U", "-r", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not unshare_available(), reason="needs unprivileged user namespaces (unshare -U)")
def test_out_of_inotify_watches_every_cgroup_is_still_reported_said_once_and_watched_again(tmp_path: Path) -> None:
    tree = tmp_path / "cg"
    tree.mkdir()
    for i in range(40):  # 40 cgroups x 5 watches: twice the 100 allowed
        make_cgroup(tree / f"pod{i:02d}")
    out = run_child(OUT_OF_WATCHES, tree, ["unshare", "-U", "-r"])
    assert out["found"] == 41  # the root and all 40: before, cgroups whose directory watch failed were dropped
    assert out["counts"]["inotify_watches"] >= 20 and out["counts"]["unreadable"] == 0
    assert out["watch_errors"] == out["counts"]["inotify_watches"]
    assert out["unwatched_limits"] >= 20  # their memory.events and limits are read at every scrape instead
    assert "fs.inotify.max_user_watches, now 100" in out["blind"]
    assert out["late_found"], "a cgroup made under an unwatched directory was never found"
    assert out["watched_again"] and out["counts_after"] == {"inotify_watches": 0, "unreadable": 0}
    assert out["unwatched_limits_after"] == 0
    errors = [m for level, m in out["lines"] if level == "ERROR"]
    assert len(errors) == 1 and "sysctl -w fs.inotify.max_user_watches=" in errors[0], out["lines"]
    assert [m for level, m in out["lines"] if level == "WARNING"] == [
        "inotify watches: every cgroup is watched again"]


def unused_uid() -> int:
    """A uid no process on this machine has (real, effective, saved or filesystem): inotify's per-user budget
    (`fs.inotify.max_user_instances`, `max_user_watches`) is charged per uid, and a uid another process also has
    (nobody's, 65534: often a daemon's or another container's) may have spent it."""
    used = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:  # gone while listed
            continue
        for line in text.splitlines():
            if line.startswith(("Uid:", "Gid:")):
                used.update(int(n) for n in line.split()[1:])
    rng = random.Random()  # not the test run's seed: two runs at once should not pick the same uid
    while True:
        uid = rng.randrange(1 << 20, 1 << 30)
        if uid not in used:
            return uid


# As root: import everything while still root (the checkout may sit under a directory only root may enter), then
# drop to the unused uid before the watcher makes its inotify instance, so that instance is charged to that uid.
DROP_TO_UID = """
import json, logging, os, select, threading, time
import inotify_simple
import oomwatch.sources.cgroupfs
os.setgroups([])
os.setresgid(UID, UID, UID)
os.setresuid(UID, UID, UID)
"""

UNREADABLE = CHILD_COMMON + """
found = watcher.start_watching()
print(json.dumps({"found": sorted(found), "blind": watcher.health.blind, "counts": watcher.health.unwatched,
                  "unwatched_limits": sorted(watcher.unwatched_limits), "lines": said.lines}))
"""


def test_unreadable_directories_and_files_are_reported_said_once_and_counted() -> None:
    # Not root: the watcher runs as this user, for whom a 0o000 file is unreadable too.
    uid = unused_uid() if os.geteuid() == 0 else os.geteuid()
    script = f"UID = {uid}\n" + DROP_TO_UID + UNREADABLE if os.geteuid() == 0 else UNREADABLE
    # World-traversable, unlike pytest's tmp_path under a 0700 directory.
    top = Path(tempfile.mkdtemp(prefix="oomwatch-unreadable-", dir="/dev/shm" if os.path.isdir("/dev/shm")
                                else None))
    try:
        top.chmod(0o755)
        tree = top / "cg"
        make_cgroup(tree / "open")
        make_cgroup(tree / "secret" / "inner")
        make_cgroup(tree / "closed-file")
        for p in (tree, *tree.rglob("*")):
            p.chmod(0o755 if p.is_dir() else 0o644)
        (tree / "secret").chmod(0o000)
        (tree / "closed-file" / "memory.events").chmod(0o000)
        out = run_child(script, tree, [])
    finally:
        for p in (top / "cg" / "secret",):
            if p.exists():
                p.chmod(0o755)
        shutil.rmtree(top)
    # /secret is known (its series can still be tried) though it cannot be watched or listed
    assert out["found"] == ["/", "/closed-file", "/open", "/secret"]
    assert out["counts"] == {"inotify_watches": 0, "unreadable": 2}
    assert f"2 cgroup(s) unreadable to this agent (uid {uid})" in out["blind"]
    assert out["unwatched_limits"] == ["/closed-file", "/secret"]
    errors = [m for level, m in out["lines"] if level == "ERROR"]
    assert len(errors) == 1 and "unreadable" in errors[0] and "Permission denied" in errors[0], out["lines"]


class CountingInotify:
    """Gives every watch; counts them (no kernel: watch() needs nothing else)."""

    def __init__(self) -> None:
        self.next = 0

    def add_watch(self, path: str, mask: int) -> int:
        self.next += 1
        return self.next


def watcher_knowing(n: int) -> CgroupWatcher:
    watcher = CgroupWatcher(CgroupFS("/nonexistent"), on_added=lambda p: None, on_removed=lambda p: None,
                            on_events=lambda p: None, inotify=CountingInotify())
    for i in range(n // 10):
        watcher.watch(f"/pod{i}")
        for j in range(9):
            watcher.watch(f"/pod{i}/c{j}")
    return watcher


def test_removal_forgets_exactly_the_subtree() -> None:
    watcher = watcher_knowing(100)
    watcher.watch("/pod1x")  # a sibling that shares the prefix
    subtree = watcher.subtree("/pod1")
    assert subtree[0] == "/pod1" and sorted(subtree[1:]) == [f"/pod1/c{j}" for j in range(9)]
    gone = watcher.forget("/pod1")
    assert gone[0] == "/pod1" and sorted(gone[1:]) == [f"/pod1/c{j}" for j in range(9)]
    assert "/pod1x" in watcher.known() and not [p for p in watcher.known() if p.startswith("/pod1/")]
    assert watcher.forget("/pod1") == []  # the parent's IN_DELETE after the directory's own IN_DELETE_SELF
    assert watcher.watches == (100 - 10 + 1) * 5  # every watch of the subtree dropped, no other


def test_removal_costs_what_is_removed_not_what_is_watched() -> None:
    def seconds_to_remove_1000(known: int) -> float:
        watcher = watcher_knowing(known)
        leaves = [f"/pod{i}/c{j}" for i in range(100) for j in range(9)][:1000]
        start = time.perf_counter()
        for leaf in leaves:
            watcher.forget(leaf)
        return time.perf_counter() - start

    small, large = seconds_to_remove_1000(1000), seconds_to_remove_1000(20_000)
    # Linear in the tree (before): 20x more per removal. Constant: about the same; 5x allows for a noisy host.
    assert large < 5 * small + 0.01, (small, large)
