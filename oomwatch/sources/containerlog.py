"""Containers' logs as the kubelet writes them, read for a death the pipeline asks about (Effects.read_logs).

The kubelet keeps each container's output in `<pod log root>/<namespace>_<pod>_<uid>/<container>/<restart
count>.log` (/var/log/pods by default: `--pod-log-dir`); the latest run's file is the one with the highest
count. Only its last MAX_TAIL_BYTES are read, never through a symlink and never from anything but a regular
file (a FIFO is not joined); a pod gone meanwhile, or a file rotated away while being read, is normal and
reads as nothing. What the text says is oomwatch.parse.gpulog's to tell.
"""

from __future__ import annotations

import os
import stat
from typing import Optional

from oomwatch.events import LogRequest, LogTailRead
from oomwatch.parse.gpulog import MAX_TAIL_BYTES, parse_log_tail


def container_log_dir(pod_log_root: str, namespace: str, pod: str, pod_uid: str,
                      container: str) -> Optional[str]:
    """`<root>/<namespace>_<pod>_<uid>/<container>`, the directory whose `<restart count>.log` holds each
    run's output; None when a name could escape it."""
    for part in (namespace, pod, pod_uid, container):
        if not part or "/" in part or part in (".", "..") or "\x00" in part:
            return None
    return f"{pod_log_root.rstrip('/')}/{namespace}_{pod}_{pod_uid}/{container}"


def read_log_tail(path: str, limit: int = MAX_TAIL_BYTES) -> Optional[bytes]:
    """The last `limit` bytes of a log file; None when it is absent, unreadable, or not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        start = max(0, st.st_size - limit)
        return os.pread(fd, limit, start)
    except OSError:
        return None
    finally:
        os.close(fd)


def latest_log_tail(pod_log_root: str, namespace: str, pod: str, pod_uid: str, container: str) -> Optional[bytes]:
    """The end of the container's latest run's log (the highest `<restart count>.log`), or None."""
    folder = container_log_dir(pod_log_root, namespace, pod, pod_uid, container)
    if folder is None:
        return None
    try:
        runs = [int(name[:-4]) for name in os.listdir(folder) if name.endswith(".log") and name[:-4].isdigit()]
    except OSError:  # no such directory (no kubelet here), or gone with the pod
        return None
    return read_log_tail(f"{folder}/{max(runs)}.log") if runs else None


class ContainerLogs:
    """The kubelet's pod logs below `pod_log_root`, read when the pipeline asks (Effects.read_logs)."""

    def __init__(self, pod_log_root: str) -> None:
        self.root = pod_log_root

    def read(self, request: LogRequest) -> LogTailRead:
        """The answer for the death `request.key`: what the container's latest log says about memory
        (oomwatch.parse.gpulog.parse_log_tail), None when nothing was read or it says nothing."""
        data = latest_log_tail(self.root, request.namespace, request.pod, request.pod_uid, request.container)
        return LogTailRead(request.key, parse_log_tail(data) if data else None)
