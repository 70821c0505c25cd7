"""The JSON-lines events file: one incident per line, appended as it is published."""

from __future__ import annotations

import json
import sys
import threading
from typing import Any, Optional, TextIO


class EventsFile:
    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stream: Optional[TextIO] = None

    def open(self) -> None:
        self._stream = sys.stdout if self.path == "-" else open(self.path, "a", encoding="utf-8")

    def write(self, incident_json: dict[str, Any]) -> None:
        line = json.dumps(incident_json, sort_keys=False, separators=(",", ":"))
        with self._lock:
            assert self._stream is not None
            self._stream.write(line + "\n")
            self._stream.flush()

    def close(self) -> None:
        with self._lock:
            if self._stream is not None and self._stream is not sys.stdout:
                self._stream.close()
            self._stream = None
