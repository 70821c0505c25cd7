"""The agent-side reader of Ray's raylet.out (oomwatch.sources.raylet), on a temporary directory laid out as the
agent sees a node: <cgroup>/cgroup.procs and <proc>/<pid>/root/tmp/ray/session_latest/logs/raylet.out, with Ray's
own absolute session_latest link. The texts are Ray's (fixtures/gpulogs, from Ray's docs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oomwatch.sources.raylet import RAYLET_TAIL_BYTES, open_in_root, raylet_log_read, read_tail_in_root
from tests.conftest import FIXTURES

GPULOGS = FIXTURES / "gpulogs"
KILLS = (GPULOGS / "ray-docs-raylet-memory-monitor.txt").read_text()  # selects pids 3310152 and 3310153
OTHER_KILL = (GPULOGS / "ray-docs-driver-outofmemoryerror.txt").read_text()  # names pid=11362
SUMMARY = (GPULOGS / "ray-docs-raylet-summary.txt").read_text()  # names no pid
SESSION = "session_2026-11-26_14-00-00_123456_1"


def node(tmp_path: Path, procs: str, raylet_pid: int = 5001, text: str | None = KILLS) -> tuple[str, str]:
    """(cgroup dir, proc root): the container's cgroup lists `procs`; process `raylet_pid`'s root holds a Ray
    session with raylet.out (`text`, None: no Ray session at all)."""
    cgroup = tmp_path / "cgroup" / "kubepods" / "pod1" / "ctr"
    cgroup.mkdir(parents=True)
    (cgroup / "cgroup.procs").write_text(procs)
    root = tmp_path / "proc" / str(raylet_pid) / "root"
    (root / "tmp").mkdir(parents=True)
    if text is not None:
        logs = root / "tmp" / "ray" / SESSION / "logs"
        logs.mkdir(parents=True)
        (logs / "raylet.out").write_text(text)
        (root / "tmp" / "ray" / "session_latest").symlink_to(f"/tmp/ray/{SESSION}")  # as Ray's node.py makes it
    return str(cgroup), str(tmp_path / "proc")


def test_the_kills_are_read_through_a_live_process_of_the_container(tmp_path: Path) -> None:
    # 4999 has exited since cgroup.procs was read (no /proc/4999): the next process is tried.
    cgroup, proc = node(tmp_path, "4999\n5001\n", text=SUMMARY + "\n" + KILLS)
    read = raylet_log_read("/kubepods/pod1/ctr", cgroup, proc)
    assert (read.key, read.killed_pids, read.error) == ("/kubepods/pod1/ctr", {3310152, 3310153}, None)
    cgroup, proc = node(tmp_path / "other", "5001\n", text=OTHER_KILL)
    assert raylet_log_read("k", cgroup, proc).killed_pids == {11362}


def test_no_ray_session_no_process_or_no_cgroup_reads_nothing(tmp_path: Path) -> None:
    cgroup, proc = node(tmp_path, "5001\n", text=None)
    assert raylet_log_read("k", cgroup, proc) == ("k", None, None)  # missing: normal, nothing to say
    cgroup, proc = node(tmp_path / "gone", "7000\n")  # its only process is gone
    assert raylet_log_read("k", cgroup, proc) == ("k", None, None)
    assert raylet_log_read("k", str(tmp_path / "no-such-cgroup"), proc) == ("k", None, None)


def test_only_the_last_64_kib_are_read(tmp_path: Path) -> None:
    """A kill logged long before (more than 64 KiB of raylet.out since) is not taken; a line cut by the tail's
    start is dropped, not half-read."""
    filler = (SUMMARY.rstrip("\n") + "\n") * (2 * RAYLET_TAIL_BYTES // len(SUMMARY) + 1)
    cgroup, proc = node(tmp_path, "5001\n", text=OTHER_KILL + "\n" + filler + KILLS)
    assert raylet_log_read("k", cgroup, proc).killed_pids == {3310152, 3310153}
    root = f"{proc}/5001/root"
    tail = read_tail_in_root(root, "tmp/ray/session_latest/logs/raylet.out", RAYLET_TAIL_BYTES)
    assert len(tail) <= RAYLET_TAIL_BYTES and tail.startswith(SUMMARY.split("\n")[0].encode()[:20])


def test_links_are_resolved_inside_the_containers_root(tmp_path: Path) -> None:
    """An absolute link (Ray's session_latest) and `..` resolve against the container's root, never the
    agent's: a link aimed at a file of the agent's own tree finds the container's file of that name, or none."""
    cgroup, proc = node(tmp_path, "5001\n")
    root = Path(proc) / "5001" / "root"
    outside = tmp_path / "agent-secret"
    outside.write_text("pid=1 killed due to the node running low on memory\n")
    (root / "tmp" / "escape").symlink_to(str(outside))  # absolute: the container's /…/agent-secret, not ours
    with pytest.raises(FileNotFoundError):
        open_in_root(str(root), "tmp/escape")
    (root / "tmp" / "up").symlink_to("../../../../../../../../" + str(outside).lstrip("/"))
    with pytest.raises(FileNotFoundError):
        open_in_root(str(root), "tmp/up")
    (root / "etc").mkdir()
    (root / "etc" / "hostname").write_text("ray-worker\n")
    (root / "tmp" / "host").symlink_to("/../../etc/hostname")  # `..` stops at the container's root
    fd = open_in_root(str(root), "tmp/host")
    try:
        assert os.read(fd, 100) == b"ray-worker\n"
    finally:
        os.close(fd)
    (root / "tmp" / "loop").symlink_to("loop")
    with pytest.raises(OSError):
        open_in_root(str(root), "tmp/loop")


def test_a_fifo_or_directory_is_refused_without_waiting(tmp_path: Path) -> None:
    cgroup, proc = node(tmp_path, "5001\n", text=None)
    logs = Path(proc) / "5001" / "root" / "tmp" / "ray" / "session_latest" / "logs"
    logs.mkdir(parents=True)
    os.mkfifo(logs / "raylet.out")  # a reader opening a FIFO would wait for a writer
    read = raylet_log_read("k", cgroup, proc)
    assert read.killed_pids is None and "not a regular file" in (read.error or "")
    (logs / "raylet.out").unlink()
    (logs / "raylet.out").mkdir()
    assert raylet_log_read("k", cgroup, proc).killed_pids is None


def test_a_refused_read_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/proc/<pid>/root of another user's or a more capable process is refused by the kernel's ptrace check
    (EACCES) to an agent without CAP_SYS_PTRACE; the tests run as root, so the refusal is the kernel's answer
    stood in for."""
    import errno

    from oomwatch.sources import raylet

    cgroup, proc = node(tmp_path, "5001\n")

    def refused(root: str, path: str, limit: int) -> bytes:
        raise PermissionError(errno.EACCES, "Permission denied", root)

    monkeypatch.setattr(raylet, "read_tail_in_root", refused)
    read = raylet_log_read("k", cgroup, proc)
    assert read.killed_pids is None and read.error == (
        "Permission denied reading /proc/5001/root (another user's or a more capable process's files take "
        "CAP_SYS_PTRACE)")


def _opens(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every os.open of the reader, (path, flags), recorded while it still opens them."""
    calls: list[tuple[str, int]] = []
    real_open = os.open

    def recording(path, flags, *args, **kwargs):
        calls.append((str(path), flags))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording)
    return calls


@pytest.mark.parametrize("kind", ["fifo", "char device", "socket"])
def test_what_is_not_a_regular_file_is_never_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    kind: str) -> None:
    """A container's raylet.out made a FIFO, a device (a watchdog starts when it is opened; /dev/null's numbers
    here) or a socket is looked up with O_PATH only: its type is checked before any open(2) of it for reading."""
    import socket
    import stat

    cgroup, proc = node(tmp_path, "5001\n", text=None)
    logs = Path(proc) / "5001" / "root" / "tmp" / "ray" / "session_latest" / "logs"
    logs.mkdir(parents=True)
    target = logs / "raylet.out"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "socket":
        listener = socket.socket(socket.AF_UNIX)
        monkeypatch.chdir(logs)  # (a socket's path is at most 107 bytes)
        listener.bind("raylet.out")
        listener.close()
    else:
        if os.geteuid() != 0:
            pytest.skip("mknod of a device takes root")
        os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    calls = _opens(monkeypatch)
    read = raylet_log_read("k", cgroup, proc)
    assert read.killed_pids is None and "not a regular file" in (read.error or "")
    last = [flags for path, flags in calls if path == "raylet.out" or path.startswith("/proc/self/fd/")]
    assert last and all(flags & os.O_PATH for flags in last), calls


def test_a_regular_file_is_opened_for_reading_without_becoming_a_controlling_terminal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cgroup, proc = node(tmp_path, "5001\n")
    calls = _opens(monkeypatch)
    assert raylet_log_read("k", cgroup, proc).killed_pids == {3310152, 3310153}
    reads = [flags for path, flags in calls if not flags & os.O_PATH and not path.endswith("cgroup.procs")]
    assert len(reads) == 1 and reads[0] & os.O_NOCTTY and reads[0] & os.O_NONBLOCK, calls
