"""What every kernel-log reader yields (live /dev/kmsg, syslog(2), a saved log), and its one error.

Its own module so that the readers (sources/kmsg.py, sources/klog.py, sources/kmsgproc.py) share these types
without importing each other.
"""

from __future__ import annotations

from typing import NamedTuple, Union

from oomwatch.model import Garbled, KmsgRecord, Lost, Skipped  # in model: the pipeline takes them too


KmsgItem = Union[KmsgRecord, Lost, Garbled, Skipped]


class CaughtUp(NamedTuple):
    """The reader child read /dev/kmsg to its end at `at` (epoch seconds): every record printed before then is in
    this frame or an earlier one. The pump takes it for the batch's `drained_at` and hands it on no further."""

    at: float


class KmsgUnavailable(Exception):
    """The kernel log cannot be read; the message says why and what would fix it."""


class NotAKernelLog(KmsgUnavailable):
    """A saved log that cannot be a kernel log at all (binary data, a device, a directory); the message says
    what it is instead."""
