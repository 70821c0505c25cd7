"""The JSON-lines events file: one incident per line, appended as it is published.

Idempotent across a crash, with the state file as the record of what was published: with a state directory the
agent holds each line until the state that counts its incident is saved (`hold=True`, then `flush()`), and at
start `catch_up()` writes the incidents the saved state holds and the file lacks (a crash between the two
writes). So a line is never written for an incident the next start will publish again (or count from
memory.events), and none the state counts is missing. On open, the keys of the incidents in the file's tail are
read back, and an incident already written is not written again.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
import threading
from typing import Any, Optional, TextIO

from oomwatch.model import Incident, incident_key_of_json

log = logging.getLogger(__name__)

# How much of an existing file is read back for keys: far more than one ring buffer's worth of incidents.
TAIL_BYTES = 8 << 20


class EventsFile:
    def __init__(self, path: str, hold: bool = False) -> None:
        self.path = path
        self.hold = hold  # keep lines until flush(): the state that counts them is saved first
        self._held: list[tuple[tuple, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._stream: Optional[TextIO] = None
        self._written: set[tuple] = set()
        self.errors = 0
        self.last_error: Optional[str] = None

    def open(self) -> None:
        if self.path == "-":
            self._stream = sys.stdout
            return
        self._written = written_keys(self.path)
        self._stream = open(self.path, "a", encoding="utf-8")

    def publish(self, incident: Incident) -> None:
        key = incident.key
        if key in self._written:
            return
        if self.hold:
            self._held.append((key, incident.to_json()))
            return
        self.write(incident.to_json())
        self._written.add(key)

    def flush(self) -> None:
        """Write the held lines (their incidents are in the saved state now)."""
        held, self._held = self._held, []
        for key, data in held:
            if key not in self._written:
                self.write(data)
                self._written.add(key)

    def catch_up(self, published: list[dict[str, Any]]) -> int:
        """Write the incidents the saved state holds (JSON, oldest first) that the file lacks; how many."""
        written = 0
        for data in published:
            key = incident_key_of_json(data)
            if key is not None and _hashable(key) not in self._written:
                self.write(data)
                self._written.add(_hashable(key))
                written += 1
        return written

    def write(self, incident_json: dict[str, Any]) -> None:
        line = json.dumps(incident_json, sort_keys=False, separators=(",", ":"))
        with self._lock:
            assert self._stream is not None
            try:
                self._stream.write(line + "\n")
                self._stream.flush()
            except OSError as exc:
                # Disk full or read-only: say which file, count it, keep running (the store still has it).
                self.errors += 1
                self.last_error = f"{self.path}: {exc.strerror or exc}"
                log.error("cannot write incident to events file %s", self.last_error)

    def close(self) -> None:
        with self._lock:
            if self._stream is not None and self._stream is not sys.stdout:
                try:
                    self._stream.close()
                except OSError as exc:
                    log.error("cannot close events file %s: %s", self.path, exc.strerror or exc)
            self._stream = None


def written_keys(path: str) -> set[tuple]:
    """Keys of the incidents in the last TAIL_BYTES of an events file (a torn last line is skipped)."""
    keys: set[tuple] = set()
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return keys  # a pipe or a device (/dev/stdout, /dev/full) has no past to read back
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - TAIL_BYTES))
            tail = f.read()
    except OSError:
        return keys
    lines = tail.split(b"\n")
    if size > TAIL_BYTES:
        lines = lines[1:]  # the first is cut
    for line in lines:
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            key = incident_key_of_json(data)
            if key is not None:
                keys.add(_hashable(key))
    return keys


def _hashable(key: tuple) -> tuple:
    return tuple(tuple(x) if isinstance(x, list) else x for x in key)
