"""What every kernel-log reader yields (live /dev/kmsg, syslog(2), a saved log), and its one error.

Its own module so that the readers (sources/kmsg.py, sources/klog.py, sources/kmsgproc.py) share these types
without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from oomwatch.model import KmsgRecord


@dataclass(frozen=True)
class Lost:
    """Records the reader could not get. `count` is None when the size of the gap is unknown."""

    count: Optional[int]


@dataclass(frozen=True)
class Skipped:
    """`count` records that cannot be part of an OOM report were read and not parsed; `last_seq` is the
    sequence number of the last (the cursor may move past them)."""

    count: int
    last_seq: Optional[int]


@dataclass(frozen=True)
class Garbled:
    """A record that did not parse (counted, never fatal)."""

    raw: bytes


KmsgItem = Union[KmsgRecord, Lost, Garbled, Skipped]


class KmsgUnavailable(Exception):
    """The kernel log cannot be read; the message says why and what would fix it."""


class NotAKernelLog(KmsgUnavailable):
    """A saved log that cannot be a kernel log at all (binary data, a device, a directory); the message says
    what it is instead."""
