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


def wants_early_start(argv: Sequence[str], environ) -> bool:
    """`oomwatch agent` reading the default /dev/kmsg (not --help, not another --kmsg)."""
    args = list(argv[1:])
    if not args or args[0] != "agent" or any(a in ("--help", "-h") for a in args):
        return False
    for i, a in enumerate(args):
        if a == "--kmsg":
            return i + 1 < len(args) and args[i + 1] == "/dev/kmsg"
        if a.startswith("--kmsg="):
            return a == "--kmsg=/dev/kmsg"
    return environ.get("OOMWATCH_KMSG", "/dev/kmsg") == "/dev/kmsg"


def start_early_pump(argv: Sequence[str], environ=os.environ) -> None:
    """Open /dev/kmsg and start draining it now; on any failure do nothing (the agent opens it later,
    with its fallbacks and error messages)."""
    global _early
    if _early is not None or not wants_early_start(argv, environ):
        return
    from oomwatch.pump import KernelLogPump
    from oomwatch.sources.kmsg import KmsgUnavailable
    from oomwatch.sources.kmsgproc import KmsgChild

    reader = KmsgChild("/dev/kmsg")  # forked now, while the process is small and has no other thread
    try:
        reader.open()
    except KmsgUnavailable:
        return
    pump = KernelLogPump(reader, notify=lambda: None)
    pump.start()
    _early = pump


def take_early_pump() -> Optional[object]:
    """The pump started early, handed over once."""
    global _early
    pump, _early = _early, None
    return pump
