"""Kernel log records: the /dev/kmsg record format and the text of `dmesg` / `journalctl -k`.

Pure functions: bytes or text in, `KmsgRecord` out. Readers live in oomwatch/sources/.

/dev/kmsg (Documentation/ABI/testing/dev-kmsg): `PRI,SEQ,USEC,FLAG[,more];TEXT\n` followed by dictionary
continuation lines that start with a space (` SUBSYSTEM=pci`). Bytes < 0x20 (but not the record's own
newline), >= 0x7f and `\\` are written as `\\xNN`.
"""

from __future__ import annotations

import calendar
import datetime as _dt
import re
import time
from typing import Iterable, Iterator, Optional

from oomwatch.model import KmsgRecord

_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")

# Syslog priority for kernel messages when a text format does not say (KERN_INFO).
_DEFAULT_PRIORITY = 6
# Priorities that are not syslog priorities: markers a saved log can carry.
LOST_MARKER = -1  # records lost here (`#EPIPE` in our captures)
GARBLED = -2  # a raw record whose prefix did not parse


class KmsgParseError(ValueError):
    """A record that does not follow the /dev/kmsg format."""


def unescape(raw: bytes) -> str:
    """Undo the kernel's `\\xNN` escaping; bytes that are not UTF-8 (a process may name itself anything)
    come out as `\\xNN` again rather than failing."""
    return _ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), raw).decode("utf-8", "backslashreplace")


def parse_kmsg_record(raw: bytes) -> KmsgRecord:
    """One record as returned by one read() of /dev/kmsg (or one record of a saved raw dump)."""
    head, sep, rest = raw.partition(b";")
    if not sep:
        raise KmsgParseError(f"no ';' in record {raw[:60]!r}")
    prefix = head.split(b",")
    if len(prefix) < 3:
        raise KmsgParseError(f"short record prefix {head[:60]!r}")
    try:
        priority, seq, usec = int(prefix[0]), int(prefix[1]), int(prefix[2])
    except ValueError as exc:
        raise KmsgParseError(f"bad record prefix {head[:60]!r}") from exc
    if priority < 0 or seq < 0 or usec < 0:
        raise KmsgParseError(f"negative field in record prefix {head[:60]!r}")
    lines = rest.rstrip(b"\n").split(b"\n")
    fields = []
    for line in lines[1:]:
        if line.startswith(b" "):
            key, _, value = line[1:].partition(b"=")
            fields.append((unescape(key), unescape(value)))
    return KmsgRecord(priority=priority, seq=seq, usec=usec, text=unescape(lines[0]), fields=tuple(fields))


# --- saved text --------------------------------------------------------------------------------------

# Raw /dev/kmsg dump, one record per line (+ continuation lines).
_RAW = re.compile(rb"^\d+,\d+,\d+,[^;]*;")
# `dmesg`, `dmesg -r` (`<3>[ 1.2] …`), `dmesg -x` (`kern  :err   : [ 1.2] …`)
_DMESG = re.compile(r"^(?:<(?P<pri>\d+)>)?(?:(?P<fac>[a-z]+)\s*:(?P<lvl>[a-z]+)\s*: )?"
                    r"\[\s*(?P<secs>\d+)\.(?P<frac>\d+)\] ?(?P<text>.*)$")
# `dmesg -T`: `[Sun Nov 22 17:38:21 2026] …`
_DMESG_T = re.compile(r"^\[(?P<wall>[A-Z][a-z]{2} [A-Z][a-z]{2} +\d+ \d\d:\d\d:\d\d \d{4})\] ?(?P<text>.*)$")
# journalctl -k: short (`Nov 22 17:38:21 host kernel: …`), short-precise (µs), short-iso
# (`2026-11-22T17:38:21+0000 host kernel: …`), short-monotonic (`[  123.456789] host kernel: …`)
_JOURNAL = re.compile(
    r"^(?:(?P<bsd>[A-Z][a-z]{2} +\d+ \d\d:\d\d:\d\d(?:\.\d+)?)|"
    r"(?P<iso>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:?\d\d|Z)?)|"
    r"\[\s*(?P<mono>\d+\.\d+)\]) \S+ kernel: ?(?P<text>.*)$")
_LEVELS = {"emerg": 0, "alert": 1, "crit": 2, "err": 3, "warn": 4, "notice": 5, "info": 6, "debug": 7}


def _journal_wall(m: re.Match, year: int) -> Optional[float]:
    if m.group("bsd"):
        text = m.group("bsd")
        stamp, _, frac = text.partition(".")
        parsed = time.strptime(f"{year} {stamp}", "%Y %b %d %H:%M:%S")
        # journalctl prints local time; the agent runs in UTC containers, so local == UTC there.
        return calendar.timegm(parsed) + (float(f"0.{frac}") if frac else 0.0)
    if m.group("iso"):
        text = m.group("iso")
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        elif re.search(r"[+-]\d{4}$", text):
            text = text[:-2] + ":" + text[-2:]
        parsed_dt = _dt.datetime.fromisoformat(text)
        if parsed_dt.tzinfo is None:
            parsed_dt = parsed_dt.replace(tzinfo=_dt.timezone.utc)
        return parsed_dt.timestamp()
    return None


def parse_text_log(lines: Iterable[bytes], year: Optional[int] = None) -> Iterator[KmsgRecord]:
    """Records from a saved log: a raw /dev/kmsg dump, `dmesg` (plain, -r, -x, -T) or `journalctl -k`
    (short, short-precise, short-iso, short-monotonic). Formats may be mixed line by line. A line that is
    none of these is skipped; `#EPIPE` markers (written by our capture scripts where records were lost)
    come out as a record with priority -1 so the caller can count the loss."""
    year = year or time.gmtime().tm_year
    pending: Optional[bytearray] = None
    line_no = 0
    for raw_line in lines:
        line_no += 1
        line = raw_line.rstrip(b"\r\n")
        if pending is not None and line.startswith(b" "):
            pending += b"\n" + line
            continue
        if pending is not None:
            yield _raw_or_none(bytes(pending))
            pending = None
        if not line:
            continue
        if line.startswith(b"#EPIPE"):
            yield KmsgRecord(priority=LOST_MARKER, seq=None, usec=None, text="#EPIPE")
            continue
        if _RAW.match(line):
            pending = bytearray(line)
            continue
        text = line.decode("utf-8", "backslashreplace")
        m = _DMESG.match(text)
        if m:
            if m.group("pri"):
                priority = int(m.group("pri"))
            elif m.group("lvl") in _LEVELS:
                priority = _LEVELS[m.group("lvl")]
            else:
                priority = _DEFAULT_PRIORITY
            usec = int(m.group("secs")) * 1_000_000 + int(m.group("frac").ljust(6, "0")[:6])
            yield KmsgRecord(priority=priority, seq=None, usec=usec, text=m.group("text"))
            continue
        m = _DMESG_T.match(text)
        if m:
            wall = calendar.timegm(time.strptime(m.group("wall"), "%a %b %d %H:%M:%S %Y"))
            yield KmsgRecord(priority=_DEFAULT_PRIORITY, seq=None, usec=None, text=m.group("text"),
                             wall_time=float(wall))
            continue
        m = _JOURNAL.match(text)
        if m:
            usec = None
            if m.group("mono"):
                secs, _, frac = m.group("mono").partition(".")
                usec = int(secs) * 1_000_000 + int(frac.ljust(6, "0")[:6])
            yield KmsgRecord(priority=_DEFAULT_PRIORITY, seq=None, usec=usec, text=m.group("text"),
                             wall_time=_journal_wall(m, year))
            continue
    if pending is not None:
        yield _raw_or_none(bytes(pending))


def _raw_or_none(raw: bytes) -> KmsgRecord:
    try:
        return parse_kmsg_record(raw)
    except KmsgParseError:
        # A garbled line in a saved dump: keep its text, drop the broken prefix.
        return KmsgRecord(priority=GARBLED, seq=None, usec=None, text=unescape(raw.partition(b";")[2]))
