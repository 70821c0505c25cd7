"""Start reading the kernel log before anything slow is imported.

The ring buffer wraps within seconds in an OOM storm, and an agent that is starting (imports, the cgroup walk)
reads nothing meanwhile: under emulation that was 20-30 s and hundreds of lost records. So `oomwatch agent` on
the live /dev/kmsg opens the device and starts the pump (oomwatch.pump: a few small modules) first, before
click, prometheus_client and the rest are imported; the agent then takes over the running pump and skips what
its saved cursor says was already processed. Anything else (another --kmsg, syslog(2), inspect) starts as usual.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

_early = None  # the pump started by start_early_pump(), until the agent takes it


def early_kmsg_path(argv: Sequence[str], environ) -> Optional[str]:
    """The kernel log `oomwatch agent` will read live from the /dev/kmsg device, found in argv (click has not
    parsed it yet) and decided as the agent and inspect decide (sources.kmsg.kernel_log_kind); None for any
    other command, for --help, and for syslog(2) or a saved log."""
    args = list(argv[1:])
    if not args or args[0] != "agent" or any(a in ("--help", "-h") for a in args):
        return None
    path = environ.get("OOMWATCH_KMSG", "/dev/kmsg")
    for i, a in enumerate(args):
        if a == "--kmsg":
            path = args[i + 1] if i + 1 < len(args) else ""
            break
        if a.startswith("--kmsg="):
            path = a[len("--kmsg="):]
            break
    from oomwatch.sources.kmsg import LIVE_KMSG, kernel_log_kind

    return path if path and kernel_log_kind(path) == LIVE_KMSG else None


def wants_early_start(argv: Sequence[str], environ) -> bool:
    """`oomwatch agent` reading the live /dev/kmsg (not --help, not syslog(2), not a saved log)."""
    return early_kmsg_path(argv, environ) is not None


def start_early_pump(argv: Sequence[str], environ=os.environ) -> None:
    """Open /dev/kmsg and start draining it now; on any failure do nothing (the agent opens it later,
    with its fallbacks and error messages)."""
    global _early
    path = None if _early is not None else early_kmsg_path(argv, environ)
    if path is None:
        return
    from oomwatch.pump import KernelLogPump
    from oomwatch.sources.kmsg import KmsgUnavailable, open_kernel_log
    from oomwatch.sources.kmsgproc import KmsgChild

    try:  # the child is forked now, while the process is small and has no other thread
        reader = open_kernel_log(path, kmsg_factory=KmsgChild, fallback=False).reader
    except KmsgUnavailable:
        return
    pump = KernelLogPump(reader)  # holds what it reads until the agent adopts it
    pump.start()
    _early = pump


def take_early_pump() -> Optional[object]:
    """The pump started early, handed over once."""
    global _early
    pump, _early = _early, None
    return pump
