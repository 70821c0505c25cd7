"""Ray's raylet.out, read for a SIGKILL death in a Ray pod (the pipeline asks: Effects.read_ray_logs).

Ray's memory monitor runs in the raylet, which logs each worker it kills to raylet.out in the Ray
session's log directory, inside the Ray container: `<temp dir>/session_latest/logs/raylet.out`. Ray's
default temp dir is /tmp/ray; `ray start --temp-dir` (or `ray.init(_temp_dir=…)`) moves it, and then nothing
is found here and the death is judged without it (docs/contract.md, "Death JSON"). The file is reached
through a process still alive in the container's cgroup: `/proc/<pid>/root/…` is the container's own file
tree, its volumes included.

`session_latest` is an absolute symlink (`/tmp/ray/session_<date>_<pid>`, as Ray's node.py makes it): resolved
as is it would lead into the agent's own file tree, so every link on the way is resolved here against the
container's root, one directory at a time (no link and no `..` leaves it). Reading another process's
`/proc/<pid>/root` takes the ptrace read check (the same user and no more capabilities than the agent, else
CAP_SYS_PTRACE): refused, the read says so and the death is judged without it.

Bounded: at most RAY_PIDS_TRIED processes, the last 64 KiB of one file, never a wait and never an open(2) of anything but a regular file (each component is looked up with O_PATH and
its type checked first: a device's driver is never called, a FIFO never joined), a process that is gone is the
next one's turn.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Optional

from oomwatch.events import RayLogRead, RayLogRequest
from oomwatch.parse.cgroup import parse_pids
from oomwatch.parse.raylet import ray_killed_pids
from oomwatch.sources.cgroupfs import CgroupFS, cat

RAYLET_OUT = "tmp/ray/session_latest/logs/raylet.out"  # under the container's root (Ray's default temp dir)
RAYLET_TAIL_BYTES = 64 << 10
RAY_PIDS_TRIED = 4  # live processes of the container tried in turn (one that exits meanwhile: the next)
MAX_LINKS = 8


class RayletLogs:
    """Ray pods' raylet.out, read when the pipeline asks (Effects.read_ray_logs) through a live process of the
    container's cgroup in `fs`."""

    def __init__(self, fs: CgroupFS, proc_root: str = "/proc") -> None:
        self.fs, self.proc_root = fs, proc_root

    def read(self, request: RayLogRequest) -> RayLogRead:
        return raylet_log_read(request.key, self.fs.abspath(request.cgroup), self.proc_root)


def raylet_log_read(key: str, cgroup_dir: str, proc_root: str = "/proc") -> RayLogRead:
    """What raylet.out, read through a live process of the cgroup at `cgroup_dir`, says Ray's memory monitor
    killed (pids of the container's pid namespace); `killed_pids` None when it could not be read."""
    error: Optional[str] = None
    for pid in _live_pids(cgroup_dir)[:RAY_PIDS_TRIED]:
        try:
            tail = read_tail_in_root(f"{proc_root}/{pid}/root", RAYLET_OUT, RAYLET_TAIL_BYTES)
        except (FileNotFoundError, NotADirectoryError):
            continue  # the process is gone, or this container has no Ray session where Ray puts it by default
        except PermissionError as exc:
            error = (f"{exc.strerror} reading /proc/{pid}/root (another user's or a more capable process's "
                     "files take CAP_SYS_PTRACE)")
            break
        except OSError as exc:
            error = f"{exc.strerror or exc} reading raylet.out through /proc/{pid}/root"
            continue
        return RayLogRead(key, ray_killed_pids(tail.decode("utf-8", "replace")))
    return RayLogRead(key, None, error)


def _live_pids(cgroup_dir: str) -> tuple[int, ...]:
    procs = cat(f"{cgroup_dir}/cgroup.procs")  # (None: the cgroup is gone, nothing of the container lives)
    return parse_pids(procs) if procs is not None else ()


def read_tail_in_root(root: str, path: str, limit: int) -> bytes:
    """The last `limit` bytes of `path` as a process whose root directory is `root` sees it (its symlinks
    resolved against `root`), without its first line when that was cut. Raises OSError as open(2) would; a
    file that is not a regular file is refused (EINVAL) before it is ever opened for reading."""
    fd = open_in_root(root, path)
    try:
        info = os.fstat(fd)
        start = max(0, info.st_size - limit)
        data = os.pread(fd, limit, start)
    finally:
        os.close(fd)
    if start > 0:
        cut = data.find(b"\n")
        data = data[cut + 1:] if cut >= 0 else b""
    return data


# Every component is first looked up with O_PATH: no open(2) of the file itself happens (a device's driver is not
# called, a FIFO not joined, a terminal not made ours); only a regular file is then opened for reading.
_LOOKUP = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC


def open_in_root(root: str, path: str) -> int:
    """A read-only descriptor of the regular file `path` looked up under `root` as if `root` were `/`: each
    component looked up with O_PATH|O_NOFOLLOW relative to its directory, each symlink read and resolved here (an
    absolute one from `root`), `..` never above `root`. The last component's type is checked on its O_PATH
    descriptor (fstat) and only a regular file is opened for reading (through /proc/self/fd, the inode the check
    saw, with O_NOCTTY|O_NONBLOCK): a device, FIFO or socket is refused (EINVAL) without being opened."""
    dirs = [os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)]  # (root itself: /proc/PID/root, a link)
    parts = _parts(path)
    links = 0
    try:
        while parts:
            part = parts.pop(0)
            if part == "..":
                if len(dirs) > 1:
                    os.close(dirs.pop())
                continue
            try:
                fd = os.open(part, _LOOKUP | (0 if not parts else os.O_DIRECTORY), dir_fd=dirs[-1])
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                fd = None
                error = exc
            if fd is not None and not parts and stat.S_ISLNK(os.fstat(fd).st_mode):
                os.close(fd)  # O_PATH|O_NOFOLLOW gives the last component's link itself: resolved below
                fd, error = None, OSError(errno.ELOOP, "a symbolic link", path)
            if fd is None:
                try:
                    target = os.readlink(part, dir_fd=dirs[-1])
                except OSError:
                    raise error from None  # not a link: a file where a directory was wanted
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many symbolic links", path) from None
                if target.startswith("/"):
                    while len(dirs) > 1:
                        os.close(dirs.pop())
                parts = _parts(target) + parts
                continue
            dirs.append(fd)
        if len(dirs) == 1:
            raise OSError(errno.EISDIR, "is the root directory", path)
        return _open_regular(dirs.pop(), path)
    finally:
        for fd in dirs:
            os.close(fd)


def _open_regular(path_fd: int, path: str) -> int:
    """A read descriptor of the regular file `path_fd` (an O_PATH descriptor, closed here) refers to."""
    try:
        checked = os.fstat(path_fd)
        if not stat.S_ISREG(checked.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        fd = os.open(f"/proc/self/fd/{path_fd}", _READ)
    finally:
        os.close(path_fd)
    opened = os.fstat(fd)
    if (opened.st_dev, opened.st_ino) != (checked.st_dev, checked.st_ino) or not stat.S_ISREG(opened.st_mode):
        os.close(fd)  # not the inode checked (cannot happen while the O_PATH descriptor held it): refused all the same
        raise OSError(errno.EINVAL, "not a regular file", path)
    return fd


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]
