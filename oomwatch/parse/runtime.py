"""A container runtime's `kill` command line: `runc [global options] kill [--all] <container id> [<signal>]`
(crun's, runsc's and youki's take the same), as a runtime's shim execs it to stop a container (go-runc
`Runc.Kill`, used by containerd's shim; CRI-O's conmon the same). The proc connector sees the exec and its
command line is read while runc runs (oomwatch.deaths tells what such a kill means for a death)."""

from __future__ import annotations

import re
import signal as _signal
from typing import NamedTuple, Optional, Sequence


class RuntimeKill(NamedTuple):
    """`runc kill [--all] <id> <signal>` (or crun's, runsc's, youki's), as exec'd by a runtime's shim."""

    container_id: str
    signal: int
    all: bool
    time: float


_RUNTIMES = ("runc", "crun", "runsc", "youki")
# Global options of runc and crun that take a value when not written `--name=value`.
_VALUE_OPTIONS = {"--root", "--log", "--log-format", "--log-level", "--criu", "--rootless",
                  "--cgroup-manager"}
_CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def runtime_kill_from_argv(argv: Sequence[str], time: float) -> Optional[RuntimeKill]:
    """A runtime's `kill` command line (/proc/PID/cmdline split at NULs) → what it kills with which signal
    (default SIGTERM, as runc's); None for any other command line."""
    if not argv or argv[0].rsplit("/", 1)[-1] not in _RUNTIMES:
        return None
    args = list(argv[1:65])
    at = 0
    while at < len(args) and args[at].startswith("-"):
        at += 2 if args[at] in _VALUE_OPTIONS else 1
    if at >= len(args) or args[at] != "kill":
        return None
    rest, kill_all, positional = args[at + 1:], False, []
    for arg in rest:
        if arg in ("--all", "-a"):
            kill_all = True
        elif arg.startswith("-"):
            continue
        else:
            positional.append(arg)
    if not positional or not _CONTAINER_ID.fullmatch(positional[0]):
        return None
    signum = _signal_number(positional[1]) if len(positional) > 1 else int(_signal.SIGTERM)
    if signum is None:
        return None
    return RuntimeKill(container_id=positional[0], signal=signum, all=kill_all, time=time)


def _signal_number(text: str) -> Optional[int]:
    if text.isdigit() and len(text) <= 3:
        return int(text) if 0 < int(text) < 65 else None
    name = text.upper()
    name = name if name.startswith("SIG") else "SIG" + name
    try:
        return int(_signal.Signals[name])
    except KeyError:
        return None
