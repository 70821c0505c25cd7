"""The state directory against what a node can do to it: read-only, full, a state.json too large to read, or
one that is not a regular file. None of these stops the agent or throws counts away silently; a second agent is
still refused."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

import oomwatch.statefile as statefile
from oomwatch.statefile import StateFile, StateLocked, save_state
from oomwatch.store import Store

BOOT = "b0"


@contextmanager
def tmpfs(where: Path, size: str = "1m") -> Iterator[Path]:
    """A real filesystem of its own (to be made read-only or filled); skipped where mounting is not allowed."""
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs to mount a tmpfs (root)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def fill(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"x" * 4096):
            pass
    except OSError:  # ENOSPC: full
        pass
    finally:
        os.close(fd)


def remount_read_only(where: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)


def write_state(state_dir: Path, cursor: int = 41) -> str:
    store = Store()
    store.set_cursor(BOOT, cursor)
    save_state(store, str(state_dir))
    return (state_dir / "state.json").read_text()


def test_a_state_file_over_the_read_cap_is_kept_never_replaced_by_a_fresh_start(tmp_path: Path,
                                                                                monkeypatch) -> None:
    state_dir = tmp_path / "state"
    text = write_state(state_dir)
    monkeypatch.setattr(statefile, "MAX_STATE_BYTES", len(text) - 1)
    f = StateFile(str(state_dir))
    f.lock()
    store = Store()
    outcome, extra = f.load(store, BOOT)
    assert outcome.startswith("kept: ") and extra == {}
    assert f"is {len(text):,} bytes, over the {len(text) - 1:,}" in f.problem and not f.saving
    assert "moved away" in f.problem  # what the operator does about it
    assert store.cursor_seq is None and not f.loaded
    with pytest.raises(OSError, match="kept as it is"):
        f.save(store, {})
    assert (state_dir / "state.json").read_text() == text
    assert not list(state_dir.glob("state.json.corrupt-*"))
    # The operator moves it away: the next save writes, no restart needed.
    os.rename(state_dir / "state.json", state_dir / "big.json")
    f.save(store, {})
    assert f.saving and json.loads((state_dir / "state.json").read_text())["cursor_seq"] is None
    f.unlock()


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
def test_a_state_file_that_is_not_a_regular_file_is_kept_and_never_blocks(tmp_path: Path, kind: str) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    decoy = tmp_path / "decoy.json"
    decoy.write_text(write_state(tmp_path / "elsewhere"))
    path = state_dir / "state.json"
    {"fifo": lambda: os.mkfifo(path), "symlink": lambda: path.symlink_to(decoy),
     "directory": lambda: path.mkdir()}[kind]()
    f = StateFile(str(state_dir))
    f.lock()
    result: list = []
    reader = threading.Thread(target=lambda: result.append(f.load(Store(), BOOT)), daemon=True)
    reader.start()
    reader.join(5)  # a FIFO with no writer blocked open(2) for ever
    assert result, "load blocked"
    outcome, _ = result[0]
    assert outcome.startswith("kept: ") and str(path) in outcome
    with pytest.raises(OSError):
        f.save(Store(), {})
    f.unlock()
    assert decoy.read_text() == (tmp_path / "elsewhere" / "state.json").read_text()  # never written through
    assert os.path.lexists(path) and not list(state_dir.glob("state.json.corrupt-*"))


def test_a_corrupt_file_is_still_moved_aside_and_replaced(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "state.json").write_text('{"version": 1, "boot_id": ')
    f = StateFile(str(state_dir))
    f.lock()
    outcome, _ = f.load(Store(), BOOT)
    assert outcome.startswith("corrupt (") and f.loaded and f.saving
    f.save(Store(), {})
    f.unlock()
    assert [p.read_text() for p in state_dir.glob("state.json.corrupt-*")] == ['{"version": 1, "boot_id": ']


def test_a_read_only_state_directory_degrades_and_still_refuses_a_second_agent(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro") as root:
        state_dir = root / "state"
        text = write_state(state_dir, cursor=77)
        (state_dir / ".lock").unlink()  # the worst case: no lock file to open either
        remount_read_only(root)
        f = StateFile(str(state_dir))
        f.lock()  # raised "Read-only file system: …/.lock" and the agent exited 1
        assert f.problem is not None and "Read-only file system" in f.problem and ".lock" in f.problem
        store = Store()
        assert f.load(store, BOOT) == ("restored", {"accounts": {}})
        assert store.cursor_seq == 77  # the counts are read even though they cannot be saved
        with pytest.raises(OSError, match="Read-only file system"):
            f.save(store, {})
        with pytest.raises(StateLocked, match="another oomwatch agent"):
            StateFile(str(state_dir)).lock()
        f.unlock()
        assert (state_dir / "state.json").read_text() == text


def test_a_read_only_directory_that_becomes_writable_is_saved_to_again(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro") as root:
        state_dir = root / "state"
        write_state(state_dir, cursor=5)
        os.unlink(state_dir / ".lock")
        remount_read_only(root)
        f = StateFile(str(state_dir))
        f.lock()
        store = Store()
        f.load(store, BOOT)
        with pytest.raises(OSError):
            f.save(store, {})
        subprocess.run(["mount", "-o", "remount,rw", str(root)], check=True)
        store.set_cursor(BOOT, 6)
        f.save(store, {})  # takes .lock now, then writes
        assert f.saving and json.loads((state_dir / "state.json").read_text())["cursor_seq"] == 6
        with pytest.raises(StateLocked):
            StateFile(str(state_dir)).lock()
        f.unlock()


def test_a_full_disk_fails_the_save_keeps_the_old_state_and_leaves_no_temp_file(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", size="64k") as root:
        state_dir = root / "state"
        text = write_state(state_dir, cursor=3)
        f = StateFile(str(state_dir))
        f.lock()
        store = Store()
        f.load(store, BOOT)
        fill(root / "filler")
        store.set_cursor(BOOT, 4)
        with pytest.raises(OSError, match="No space left on device"):
            f.save(store, {})
        assert "state.json" in f.problem or str(state_dir) in f.problem
        assert (state_dir / "state.json").read_text() == text
        assert not [n for n in os.listdir(state_dir) if n.startswith(".state-")]
        os.unlink(root / "filler")
        f.save(store, {})
        assert f.saving and json.loads((state_dir / "state.json").read_text())["cursor_seq"] == 4
        f.unlock()


def test_a_missing_directory_that_cannot_be_created_degrades(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    f = StateFile(str(tmp_path / "file" / "state"))  # ENOTDIR: a path no directory can be made at
    f.lock()
    assert "Not a directory" in f.problem
    assert f.load(Store(), BOOT)[0].startswith("kept: ")
    with pytest.raises(OSError, match="Not a directory"):
        f.save(Store(), {})
    f.unlock()


def test_every_failed_save_names_the_file(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro") as root:
        state_dir = root / "state"
        write_state(state_dir)
        remount_read_only(root)
        f = StateFile(str(state_dir))
        f.lock()  # .lock is there: opened read-only and locked, so the save goes on to mkstemp
        assert f.load(Store(), BOOT)[0] == "restored"
        with pytest.raises(OSError) as raised:  # mkstemp's error names only its temp file
            f.save(Store(), {})
        f.unlock()
    assert raised.value.strerror == f"Read-only file system (writing {state_dir}/state.json)" == f.problem


def test_a_save_imports_nothing(tmp_path: Path) -> None:
    """The first save comes just after an agent's first kill, on the loop's path: an import there (tempfile's
    shutil, random, bz2 and lzma) held the next kills back. In a fresh interpreter with the agent's modules
    imported, a save imports no module, and its temp file is gone after the rename."""
    import sys

    code = ("import sys\n"
            "import oomwatch.cli, oomwatch.agent\n"
            "from oomwatch.statefile import StateFile\n"
            "from oomwatch.store import Store\n"
            f"state = StateFile({str(tmp_path)!r})\n"
            "state.lock()\n"
            "state.load(Store(), 'boot')\n"
            "before = set(sys.modules)\n"
            "state.save(Store(), {})\n"
            "print(sorted(set(sys.modules) - before))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert sorted(os.listdir(tmp_path)) == [".lock", "state.json"]


def test_a_temp_file_name_left_by_a_crashed_save_is_passed_over(tmp_path: Path) -> None:
    first_fd, first = statefile.new_temp_file(str(tmp_path))
    second_fd, second = statefile.new_temp_file(str(tmp_path))
    os.close(first_fd)
    os.close(second_fd)
    assert first != second and os.path.basename(first).startswith(statefile.TEMP_PREFIX)
    assert oct(os.stat(first).st_mode & 0o777) == "0o600"
