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

Bounded: at most RAY_PIDS_TRIED processes, the last 64 KiB of one file, never a wait (a FIFO is not opened
for reading, a process that is gone is the next one's turn).
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Optional

from oomwatch.deaths import ray_killed_pids
from oomwatch.events import RayLogRead
from oomwatch.parse.cgroup import parse_pids
from oomwatch.sources.cgroupfs import cat

RAYLET_OUT = "tmp/ray/session_latest/logs/raylet.out"  # under the container's root (Ray's default temp dir)
RAYLET_TAIL_BYTES = 64 << 10
RAY_PIDS_TRIED = 4  # live processes of the container tried in turn (one that exits meanwhile: the next)
MAX_LINKS = 8


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
    file that is not a regular file is refused (EINVAL)."""
    fd = open_in_root(root, path)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        start = max(0, info.st_size - limit)
        data = os.pread(fd, limit, start)
    finally:
        os.close(fd)
    if start > 0:
        cut = data.find(b"\n")
        data = data[cut + 1:] if cut >= 0 else b""
    return data


def open_in_root(root: str, path: str) -> int:
    """A read-only descriptor of `path` looked up under `root` as if `root` were `/`: each component opened
    with O_NOFOLLOW relative to its directory, each symlink read and resolved here (an absolute one from
    `root`), `..` never above `root`; a FIFO or device is opened without waiting (O_NONBLOCK)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    dirs = [os.open(root, flags & ~os.O_NOFOLLOW | os.O_DIRECTORY)]  # (root itself: /proc/PID/root, a link)
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
                fd = os.open(part, flags | (os.O_NONBLOCK if not parts else os.O_DIRECTORY), dir_fd=dirs[-1])
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                try:
                    target = os.readlink(part, dir_fd=dirs[-1])
                except OSError:
                    raise exc from None  # not a link: a file where a directory was wanted
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
        return dirs.pop()
    finally:
        for fd in dirs:
            os.close(fd)


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]
