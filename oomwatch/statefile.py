"""The agent's state directory: `state.json` (the store, the reconciler's accounts and the cursor, in one atomic
write: a temp file, fsync, rename, so a crash leaves the old or the new state, never half of one) and an flock
that keeps a second agent out. Every field is validated when read back (oomwatch.store.Store.load_state)."""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from typing import Any, Iterator, Optional

from oomwatch.store import Store, StateError, _Validator, _is_count


STATE_FILE = "state.json"
LOCK_FILE = ".lock"


class StateLocked(Exception):
    """Another agent holds the state directory."""


class StateFile:
    """The agent's state directory: `state.json` (the store, the reconciler's accounts and the cursor, in
    one atomic write) and an flock that keeps a second agent out."""

    def __init__(self, state_dir: str) -> None:
        self.dir = state_dir
        self.path = os.path.join(state_dir, STATE_FILE)
        self._lock_fd: Optional[int] = None
        self.loaded = False  # a start that did not load (or find nothing) never writes over the file

    def lock(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        fd = os.open(os.path.join(self.dir, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateLocked(f"{self.dir} is in use by another oomwatch agent (flock on {LOCK_FILE}); "
                              "give each agent its own --state-dir") from None
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def load(self, store: Store, boot_id: str) -> tuple[str, dict]:
        """Restore `store`; returns (what happened, the extra sections). "restored", "none", "new boot"
        (another boot's counters and cursor are not ours to continue) or "corrupt: …" (the file is moved
        aside, kept, and the agent starts fresh: never a crash loop)."""
        try:
            with open(self.path, "rb") as f:
                data = f.read(64 << 20)
            state = json.loads(data)
            Store().load_state(state)  # validate everything before touching the live store
            extra = _validated_extra(state)
        except FileNotFoundError:
            self.loaded = True
            return "none", {}
        except (OSError, ValueError, StateError, RecursionError) as exc:
            aside = f"{self.path}.corrupt-{int(time.time())}"
            try:
                os.replace(self.path, aside)
            except OSError as move_exc:
                # Could not move it aside: refuse to write over it either.
                return f"corrupt ({exc}); could not move it aside ({move_exc}); state will not be saved", {}
            self.loaded = True
            return f"corrupt ({exc}); moved to {aside}; starting fresh", {}
        self.loaded = True
        if state.get("boot_id") != boot_id:
            return "new boot", {}
        store.load_state(state)
        return "restored", extra

    def save(self, store: Store, extra: dict) -> None:
        """Write atomically. Raises OSError naming the file when the disk refuses (full, read-only)."""
        if not self.loaded:
            raise OSError(f"{self.path}: not written (it could not be read back at start, and is kept as it is)")
        state = store.to_state()
        state.update(extra)
        fd, tmp = tempfile.mkstemp(prefix=".state-", dir=self.dir)
        try:
            with os.fdopen(fd, "w") as f:
                write_json(f, state)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(exc, OSError) and not exc.filename:
                raise OSError(exc.errno, f"{exc.strerror or exc} (writing {self.path})") from exc
            raise


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


def write_json(f: Any, value: dict[str, Any]) -> None:
    """`value` as json.dumps writes it (compact), in pieces of at most _PIECE items, each encoded by json's C
    encoder: the whole text of thousands of workloads at once would be the agent's largest allocation, and
    json.dump, which writes as it goes, encodes in pure Python at several times the CPU (the state is saved
    every second of an OOM storm)."""
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
        if isinstance(item, list) and len(item) > _PIECE:
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
    f.loaded = True
    os.makedirs(state_dir, exist_ok=True)
    f.save(store, {})
