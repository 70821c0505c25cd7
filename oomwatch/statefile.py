"""The agent's state directory: `state.json` (the store, the reconciler's accounts and the cursor, in one atomic
write: a temp file, fsync, rename, so a crash leaves the old or the new state, never half of one) and an flock
that keeps a second agent out. Every field is validated when read back (oomwatch.store.Store.load_state).

The directory never stops the agent (docs/contract.md, `--state-dir`): one that is read-only, full, missing
or unwritable degrades to running without persistence, said in `problem` (for /healthz and the log) until a
save succeeds again. A `state.json` that cannot be read (too large, unreadable, not a regular file) is kept as it
is and never written over: its counts are not thrown away for a fresh start. Only a file that was read whole and
is not a state we write (bad JSON, a field out of range) is moved aside as corrupt.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import time
from typing import Any, Iterator, Optional

from oomwatch.store import Store, StateError, _Validator, _is_count


STATE_FILE = "state.json"
LOCK_FILE = ".lock"
TEMP_PREFIX = ".state-"
# The largest state.json read back. The store bounds what it keeps so the file stays far below this; a file
# over it is kept, not read (reading it could take the agent's memory limit).
MAX_STATE_BYTES = 64 << 20
# Opened without following a symlink and without blocking on a FIFO; fstat then says what it is.
_OPEN_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


class StateLocked(Exception):
    """Another agent holds the state directory."""


class StateFile:
    """The agent's state directory: `state.json` (the store, the reconciler's accounts and the cursor, in
    one atomic write) and an flock that keeps a second agent out.

    Two flocks: on the directory itself (taken wherever the directory can be opened, read-only included) and on
    `.lock` (what older agents take, and what a save needs; taken again at the next save when the directory
    was read-only or full at start). `problem` is None while the state is saved, else why it is not."""

    def __init__(self, state_dir: str) -> None:
        self.dir = state_dir
        self.path = os.path.join(state_dir, STATE_FILE)
        self._lock_fd: Optional[int] = None
        self._dir_fd: Optional[int] = None
        self.loaded = False  # a start that did not load (or find nothing) never writes over the file
        self.kept = False  # state.json could not be read: kept, and not written over while it is there
        self.problem: Optional[str] = None
        self._encoded = EncodedItems()  # the stored incidents' text, kept from one save to the next

    @property
    def saving(self) -> bool:
        """The last save (or, before any, the start) found nothing in the way."""
        return self.problem is None

    def lock(self) -> None:
        """Take the directory. Raises StateLocked when another agent holds it; any other trouble (read-only,
        full, missing and not creatable, unreadable) is set in `problem` and the agent runs without saving."""
        try:
            os.makedirs(self.dir, exist_ok=True)
            fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            self.problem = f"{self.dir}: {_reason(exc)}; the state is not saved"
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateLocked(self._locked_message()) from None
        self._dir_fd = fd
        self._lock_file()

    def _locked_message(self) -> str:
        return (f"{self.dir} is in use by another oomwatch agent (flock on the directory or {LOCK_FILE}); "
                "give each agent its own --state-dir")

    def _lock_file(self) -> bool:
        """flock `.lock` (created when it can be). Raises StateLocked; False (with `problem` set) when the file
        can be neither created nor opened: a read-only directory without one, a full disk."""
        lock_path = os.path.join(self.dir, LOCK_FILE)
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | _OPEN_FLAGS, 0o600)
        except OSError as exc:
            self.problem = f"{lock_path}: {_reason(exc)}; the state is not saved"
            try:  # an existing .lock on a read-only directory: flock needs no write access
                fd = os.open(lock_path, os.O_RDONLY | _OPEN_FLAGS)
            except OSError:
                return False
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                self.problem = f"{lock_path} is {_kind(mode)}, not a regular file; the state is not saved"
                os.close(fd)
                return False
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateLocked(self._locked_message()) from None
        self._lock_fd = fd
        self._remove_temp_files()
        return True

    def _remove_temp_files(self) -> None:
        # Temp files of a save that crashed (or hit a full disk and could not unlink): ours now that we hold the
        # lock, and on a full disk they are the space the next save needs.
        try:
            names = [n for n in os.listdir(self.dir) if n.startswith(TEMP_PREFIX)]
        except OSError:
            return
        for name in names:
            try:
                os.unlink(os.path.join(self.dir, name))
            except OSError:
                pass

    def unlock(self) -> None:
        for fd in (self._lock_fd, self._dir_fd):
            if fd is not None:
                os.close(fd)
        self._lock_fd = self._dir_fd = None

    def load(self, store: Store, boot_id: str) -> tuple[str, dict]:
        """Restore `store`; returns (what happened, the extra sections). "restored", "none", "new boot"
        (another boot's counters and cursor are not ours to continue), "corrupt: …" (read whole but not a state
        we write: moved aside, kept, and the agent starts fresh: never a crash loop) or "kept: …" (could not be
        read: too large, unreadable, not a regular file; kept as it is, never written over, `problem` says why
        and the agent counts from zero without saving until the file is moved away)."""
        try:
            data = self._read()
        except FileNotFoundError:
            self.loaded = True
            return "none", {}
        except _Unreadable as exc:
            return self._keep(str(exc))
        try:
            state = json.loads(data)
            Store().load_state(state)  # validate everything before touching the live store
            extra = _validated_extra(state)
        except (ValueError, StateError, RecursionError) as exc:
            aside = f"{self.path}.corrupt-{int(time.time())}"
            try:
                os.replace(self.path, aside)
            except OSError as move_exc:
                return self._keep(f"is corrupt ({exc}) and could not be moved aside ({_reason(move_exc)})")
            self.loaded = True
            return f"corrupt ({exc}); moved to {aside}; starting fresh", {}
        self.loaded = True
        if state.get("boot_id") != boot_id:
            return "new boot", {}
        store.load_state(state)
        return "restored", extra

    def _read(self) -> bytes:
        try:
            fd = os.open(self.path, os.O_RDONLY | _OPEN_FLAGS)
        except FileNotFoundError:
            raise
        except OSError as exc:  # ELOOP: a symlink; EACCES, EIO, ENXIO, …
            raise _Unreadable(f"cannot be opened ({_reason(exc)})") from exc
        try:
            info = os.fstat(fd)
            mode, size = info.st_mode, info.st_size
            if not stat.S_ISREG(mode):
                raise _Unreadable(f"is {_kind(mode)}, not a regular file")
            if size > MAX_STATE_BYTES:
                raise _Unreadable(f"is {size:,} bytes, over the {MAX_STATE_BYTES:,} the agent reads")
            chunks, total = [], 0
            while total <= MAX_STATE_BYTES:
                chunk = os.read(fd, min(1 << 20, MAX_STATE_BYTES + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            if total > MAX_STATE_BYTES:  # grew after fstat: someone else is writing it
                raise _Unreadable(f"grew past the {MAX_STATE_BYTES:,} bytes the agent reads while read")
            return b"".join(chunks)
        except OSError as exc:
            raise _Unreadable(f"cannot be read ({_reason(exc)})") from exc
        finally:
            os.close(fd)

    def _keep(self, why: str) -> tuple[str, dict]:
        self.loaded = False
        self.kept = True
        self.problem = (f"{self.path} {why}: kept as it is and not written over; counting starts from zero and "
                        "is not saved until it is moved away")
        return f"kept: {self.problem}", {}

    def save(self, store: Store, extra: dict) -> None:
        """Write atomically. Raises OSError naming the file when the disk refuses (full, read-only) or the
        state is not to be written (a kept file, another agent's lock); `problem` says the same until a save
        succeeds."""
        try:
            self._save(store, extra)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if self.dir not in reason:  # mkstemp's own error names only its temp file, in exc.filename
                reason = f"{reason} (writing {self.path})"
            self.problem = reason
            raise OSError(exc.errno, reason) from exc
        self.problem = None

    def _save(self, store: Store, extra: dict) -> None:
        if not self.loaded:
            if not (self.kept and not os.path.lexists(self.path)):
                raise OSError(self.problem or f"{self.path}: not written (it could not be read back at start, "
                                               "and is kept as it is)")
            self.loaded, self.kept = True, False  # moved away by someone: nothing left to write over
        if self._lock_fd is None:
            try:
                if self._dir_fd is None:
                    self.lock()
                    if self._dir_fd is None:
                        raise OSError(self.problem)
                elif not self._lock_file():
                    raise OSError(self.problem)
            except StateLocked as exc:
                raise OSError(f"{self.path}: not written: {exc}") from None
        state = store.to_state()
        state.update(extra)
        fd, tmp = new_temp_file(self.dir)
        try:
            with os.fdopen(fd, "w") as f:
                write_json(f, state, self._encoded)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        if self._dir_fd is not None:
            os.fsync(self._dir_fd)  # the rename itself survives a crash only once the directory is on disk


def new_temp_file(directory: str) -> tuple[int, str]:
    """A new file in `directory` for a save to write before it renames it (mode 0600, created here or not at all),
    named for this process: what tempfile.mkstemp does, without importing tempfile, which imports shutil, random,
    bz2 and lzma: the first save, just after an agent's first kill, imported them on the loop's path (the storm
    tier's second kill was published 0.25-0.48 s after the floor behind it under emulation). Raises OSError as
    os.open does."""
    for n in range(10_000):  # (the names of saves that crashed are removed when the directory is locked)
        path = os.path.join(directory, f"{TEMP_PREFIX}{os.getpid()}-{n}")
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), path
        except FileExistsError:
            continue
    raise FileExistsError(f"{directory}: no free name for a temporary state file")


class _Unreadable(Exception):
    """state.json is there and could not be read: kept, never written over."""


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def _validated_extra(state: dict) -> dict:
    """The reconciler's accounts: {cgroup: {ino, first_seen, seen{}, kernel{}, since}}."""
    accounts = state.get("accounts", {})
    v = _Validator(state)
    v.expect(isinstance(accounts, dict) and len(accounts) <= 1_000_000, "accounts")
    for path, entry in accounts.items():
        v.expect(isinstance(path, str) and path.startswith("/") and len(path) <= 4096, f"account path {path!r}")
        v.expect(isinstance(entry, dict) and _is_count(entry.get("ino")), f"account {path}")
        v.time(entry, "first_seen")
        v.time(entry, "since")
        v.expect(entry.get("first_seen") is not None and entry.get("since") is not None, f"account {path} times")
        for section in ("seen", "kernel"):
            v.counts(entry, section, ("oom_kill", "oom_group_kill"))
            v.expect(set(entry[section]) == {"oom_kill", "oom_group_kill"}, f"account {path} {section}")
    return {"accounts": accounts}


_PIECE = 256  # list items or dict entries encoded at a time
# Lists whose items are never changed once stored (the store's incidents: each is its incident's JSON, made once),
# so each item's text can be kept between saves.
UNCHANGING = ("incidents",)


class EncodedItems:
    """The text of each item of the UNCHANGING lists as last written, by the item's identity. The state is saved
    every second of an OOM storm, and its incidents are most of it (about 2.5 KB each since issue 21, up to the
    store's 500): encoding only the new ones keeps a save's CPU from growing with the incidents kept (the
    50x4 storm's detection latency grew through each round while every save encoded them all)."""

    def __init__(self) -> None:
        self._texts: dict[int, tuple[Any, str]] = {}  # id(item) → (item, text): the item is held, so its id stays

    def texts(self, items: list, dumps) -> Iterator[str]:
        kept, self._texts = self._texts, {}
        for item in items:
            entry = kept.get(id(item))
            if entry is None or entry[0] is not item:
                entry = (item, dumps(item))
            self._texts[id(item)] = entry  # items no longer in the list are dropped with `kept`
            yield entry[1]


def write_json(f: Any, value: dict[str, Any], encoded: Optional[EncodedItems] = None) -> None:
    """`value` as json.dumps writes it (compact), in pieces of at most _PIECE items, each encoded by json's C
    encoder: the whole text of thousands of workloads at once would be the agent's largest allocation, and
    json.dump, which writes as it goes, encodes in pure Python at several times the CPU (the state is saved
    every second of an OOM storm). With `encoded`, the UNCHANGING lists' items are encoded once."""
    def dumps(v: Any) -> str:
        return json.dumps(v, separators=(",", ":"))

    def pieces(open_: str, texts: Iterator[str], close: str) -> None:
        f.write(open_)
        for j, text in enumerate(texts):
            f.write("," + text if j else text)
        f.write(close)

    f.write("{")
    for i, (key, item) in enumerate(value.items()):
        f.write(("," if i else "") + dumps(key) + ":")
        if encoded is not None and key in UNCHANGING and isinstance(item, list):
            pieces("[", encoded.texts(item, dumps), "]")
        elif isinstance(item, list) and len(item) > _PIECE:
            pieces("[", (dumps(item[j:j + _PIECE])[1:-1] for j in range(0, len(item), _PIECE)), "]")
        elif isinstance(item, dict) and len(item) > _PIECE:
            entries = list(item.items())
            pieces("{", (dumps(dict(entries[j:j + _PIECE]))[1:-1] for j in range(0, len(entries), _PIECE)), "}")
        else:
            f.write(dumps(item))
    f.write("}")


def save_state(store: Store, state_dir: str) -> None:
    """One-shot save (tests, tools): the agent keeps a StateFile."""
    f = StateFile(state_dir)
    f.lock()
    try:
        f.loaded = True
        f.save(store, {})
    finally:
        f.unlock()
