"""The kubelet's config file as an event source: its OOM policy (singleProcessOOMKill) is read at start and again
each time the file is written or replaced (inotify on its directory, so an editor's or a config manager's rename
is seen too), and emitted as `events.PostureRead`. Nothing is read while nothing changes."""

from __future__ import annotations

import logging
import os
import select
import threading
from typing import Any, Callable, Optional

from oomwatch.events import PostureRead

log = logging.getLogger(__name__)


class KubeletConfigWatch:
    """`read()` gives the policy now ("true", "false" or "unknown"); `emit` takes the events."""

    def __init__(self, path: str, read: Callable[[], str], emit: Callable[[Any], None]) -> None:
        self.path, self._read, self._emit = path, read, emit
        self._inotify = None
        self._stop_r, self._stop_w = os.pipe()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        """Watch the file's directory; a node without one (no kubelet) has nothing to watch."""
        from oomwatch.sources.inotify import INotify, flags

        inotify = INotify()
        try:
            inotify.add_watch(os.path.dirname(self.path) or ".",
                              flags.CLOSE_WRITE | flags.MOVED_TO | flags.CREATE | flags.DELETE | flags.ONLYDIR)
        except OSError:
            inotify.close()
            return
        self._inotify = inotify
        self._thread = threading.Thread(target=self._run, name="kubelet-config", daemon=True)
        self._thread.start()

    @property
    def watching(self) -> bool:
        """Whether a thread watches the file's directory (not on a node without it, nor after stop)."""
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        assert self._inotify is not None
        name = os.path.basename(self.path)
        poller = select.poll()
        poller.register(self._inotify.fileno(), select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._stop_r in ready:
                return
            if any(event.name == name for event in self._inotify.read(timeout=0)):
                self._emit(PostureRead(self._read()))

    def stop(self) -> None:
        os.write(self._stop_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._inotify is not None:
            self._inotify.close()
