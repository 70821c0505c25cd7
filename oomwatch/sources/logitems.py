"""What every kernel-log reader yields (live /dev/kmsg, syslog(2), a saved log), and its one error.

Its own module so that the readers (sources/kmsg.py, sources/klog.py, sources/kmsgproc.py) share these types
without importing each other.
"""

from __future__ import annotations

from typing import Union

from oomwatch.model import Garbled, KmsgRecord, Lost, ReportMemory, Skipped  # in model: the pipeline takes them too


KmsgItem = Union[KmsgRecord, Lost, Garbled, Skipped, ReportMemory]


class KmsgUnavailable(Exception):
    """The kernel log cannot be read; the message says why and what would fix it."""


class NotAKernelLog(KmsgUnavailable):
    """A saved log that cannot be a kernel log at all (binary data, a device, a directory); the message says
    what it is instead."""
