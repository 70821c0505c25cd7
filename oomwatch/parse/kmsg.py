"""Kernel log records: the /dev/kmsg record format and the text of `dmesg` / `journalctl -k`.

Pure functions: bytes or text in, `KmsgRecord` out. Readers live in oomwatch/sources/.

/dev/kmsg (Documentation/ABI/testing/dev-kmsg): `PRI,SEQ,USEC,FLAG[,more];TEXT\n` followed by dictionary
continuation lines that start with a space (` SUBSYSTEM=pci`). Bytes < 0x20 (but not the record's own
newline), >= 0x7f and `\\` are written as `\\xNN`.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional

from oomwatch.model import KmsgRecord
from oomwatch.names import as_logged
from oomwatch.parse import LazyPattern  # a saved text log's patterns: compiled when one is read
from oomwatch.parse.oom import MAX_WRAPPED, parse_oom_line
from oomwatch.parse.prefilter import OOM_LINE_START as _OOM_LINE_START
from oomwatch.parse.textshapes import CUT_MARKERS, LINE_DECORATIONS, TEXT_REPAIRS, local_date, month_number

_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")

# Syslog priority for kernel messages when a text format does not say (KERN_INFO).
_DEFAULT_PRIORITY = 6
# Priorities that are not syslog priorities: markers a saved log can carry.
LOST_MARKER = -1  # records lost here (`#EPIPE` in our captures)
GARBLED = -2  # a raw record whose prefix did not parse

# The kernel's sequence number is a u64, its timestamp u64 nanoseconds since boot (584 years): anything larger
# is not a kernel record, and would overflow every date conversion downstream.
MAX_SEQ = (1 << 64) - 1
MAX_USEC = MAX_SEQ // 1000


# A record made from its fields in order (the reader makes one per OOM line of a storm; keyword arguments cost
# more than the rest of the parse): priority, seq, usec, text, fields, wall_time.
_new_record = tuple.__new__
assert KmsgRecord._fields == ("priority", "seq", "usec", "text", "fields", "wall_time"), KmsgRecord._fields


class KmsgParseError(ValueError):
    """A record that does not follow the /dev/kmsg format."""


# Bytes looked for in every record, as ints: `int in bytes` is one memchr, where `bytes in bytes` first tries its
# needle as an int and builds and clears a TypeError (more than the search itself costs).
_BACKSLASH, _NEWLINE, _NUL, _ESC = 0x5C, 0x0A, 0x00, 0x1B


def _decoded(raw: bytes) -> str:
    """UTF-8 text; a name that is not UTF-8 (a process may name itself anything) in oomwatch.names' one spelling,
    as its cgroup read from the tree is spelt."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return as_logged(raw.decode("utf-8", "surrogateescape"))


def unescape(raw: bytes) -> str:
    """Undo the kernel's `\\xNN` escaping; bytes that are not UTF-8, and a backslash that would read as such a
    byte's escape, come out as oomwatch.names.as_logged spells them (`\\xNN`, `\\x5c`) rather than failing."""
    if _BACKSLASH not in raw:  # the common case: nothing escaped
        return _decoded(raw)
    # An OOM report's stats block is one record of lines (6.1): newlines are its only escapes. A backslash of
    # the text itself is escaped too (\x5c), so every `\x0a` is an escaped newline.
    lines = raw.replace(b"\\x0a", b"\n")
    if _BACKSLASH not in lines:
        return _decoded(lines)
    text = _ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), raw)
    return as_logged(text.decode("utf-8", "surrogateescape")) if _BACKSLASH in text or not text.isascii() \
        else text.decode("ascii")


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
    if priority < 0 or seq < 0 or usec < 0 or usec > MAX_USEC or seq > MAX_SEQ:
        raise KmsgParseError(f"field out of range in record prefix {head[:60]!r}")
    rest = rest.rstrip(b"\n")
    if _NEWLINE not in rest:  # no dictionary continuation lines: most records
        return _new_record(KmsgRecord, (priority, seq, usec, unescape(rest), (), None))
    lines = rest.split(b"\n")
    fields = []
    for line in lines[1:]:
        if line.startswith(b" "):
            key, _, value = line[1:].partition(b"=")
            fields.append((unescape(key), unescape(value)))
    return KmsgRecord(priority=priority, seq=seq, usec=usec, text=unescape(lines[0]), fields=tuple(fields))


# --- saved text --------------------------------------------------------------------------------------
#
# A pasted OOM report comes in whatever a human or a log system wrapped around the kernel's lines. Each line is
# read in two layers: an outer log-system wrapper (journalctl, syslog) that names the program and maybe the
# wall-clock time, then the inner `dmesg` prefix (`<pri>`, `fac:lvl:`, `[secs.usec]` or `[human date]`, a
# caller id `[T123]`). A line with neither is kept as bare kernel text (netconsole, serial consoles, trimmed
# pastes, `journalctl -o cat`). The samples each format is tested on are in tests/test_parse_kmsg.py.

# Longest line read whole: a kernel record is under 1 KiB of text (printk's LOG_LINE_MAX), a journal JSON entry
# a few KiB. Longer lines are cut here, so no input grows memory or regex time without bound.
MAX_LINE = 64 * 1024

_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct",
                                        "Nov", "Dec"), start=1)}
_LEVELS = {"emerg": 0, "alert": 1, "crit": 2, "err": 3, "warn": 4, "notice": 5, "info": 6, "debug": 7}
# Syslog priority for kernel messages when a text format does not say (KERN_INFO).
_DEFAULT_PRIORITY = 6
# journalctl's own words when it has nothing to print: the input holds no log at all.
JOURNAL_NOTICES = ("No journal files were found.", "-- No entries --")

# journalctl's `%b %d`: the month as the locale writes it (`Nov`, `nov.`, `ноя`, `11月`; textshapes.MONTHS)
_BSD = (r"(?P<mon>[^\W\d_]{2,12}\.?|\d{1,2}[月월]) {1,2}(?P<day>\d{1,2}) (?P<hms>\d\d:\d\d:\d\d)"
        r"(?:\.(?P<bfrac>\d{1,9}))?")
_ISO = (r"(?P<iso>(?P<idate>\d{4}-\d\d-\d\d)[T ](?P<itime>\d\d:\d\d:\d\d)(?:[.,](?P<ifrac>\d{1,9}))?"
        r"(?P<izone>Z|[+-]\d\d:?\d\d)?)")
_FULL = (r"[A-Z][a-z]{2} (?P<fdate>\d{4}-\d\d-\d\d) (?P<ftime>\d\d:\d\d:\d\d)(?:\.(?P<ffrac>\d{1,9}))? "
         r"(?P<fzone>[A-Za-z][A-Za-z0-9+-]{0,5})")
_UNIX = r"(?P<unix>\d{1,11}\.\d{1,9})"
_MONO = r"\[ *(?P<mono>\d{1,11}\.\d{1,9})(?: <[ \d.]{1,24}>)?\]"
_STAMP = rf"(?:{_BSD}|{_ISO}|{_FULL}|{_UNIX}|{_MONO})"
# journalctl short* / syslog files: `STAMP [host] kernel: …`; the hostname may be empty (two spaces) or absent.
_KERNEL_LINE = LazyPattern(rf"^(?:<(?P<spri>\d{{1,3}})>)?{_STAMP}(?: (?P<host>\S{{0,255}}))? kernel(?:\[\d{{1,10}}\])?: "
                           r"?(?P<rest>.*)$", re.S)
# The same wrapper around another program's line (an unfiltered syslog or journal). After a monotonic stamp
# only `host name[pid]:` counts: `[ 1.2] usb 1-1: new device` and `[ 1.2] systemd[1]: …` are plain dmesg lines.
# A host name is letters, digits, dots, hyphens, underscores: `[ 0.14] x86/fpu: xstate_offset[2]: 576` is the
# kernel's, not a program `xstate_offset` on a host `x86/fpu:`.
_HOST = r"[\w.-]{0,255}"
_OTHER_LINE = LazyPattern(rf"^(?:(?:<\d{{1,3}}>)?(?:{_BSD}|{_ISO}|{_FULL}|{_UNIX}) \S{{0,255}} ?[^\s:\[\]]{{1,128}}"
                          rf"(?:\[\d{{1,10}}\])?|{_MONO} {_HOST} [^\s:\[\]]{{1,128}}\[\d{{1,10}}\]): ")
# RFC 5424: `<PRI>1 TIMESTAMP HOST APP PROCID MSGID SD [MSG]`
_RFC5424 = LazyPattern(r"^<(?P<pri>\d{1,3})>1 (?P<ts>\S{1,64}) \S{1,255} (?P<app>\S{1,48}) \S{1,128} \S{1,32} "
                       r"(?P<sd>-|(?:\[(?:[^\]\\]|\\.){0,4096}\]){1,16}) ?(?P<rest>.*)$", re.S)
# The dmesg layer: `<pri>` (-r), `fac :lvl :` (-x), `[secs.frac]` or `[Tue Aug 22 16:10:45 2023]` (-T), and
# the caller id of CONFIG_PRINTK_CALLER (`[T123]`, `[C1]`).
_DMESG = LazyPattern(
    r"^(?:<(?P<pri>\d{1,3})>)?(?:(?P<fac>[a-z]{2,8}) *:(?P<lvl>[a-z]{2,6}) *: ?)?"
    r"(?:\[ *(?P<secs>\d{1,11})\.(?P<frac>\d{1,9})\]|"
    r"\[(?P<human>(?P<hwd>[A-Z][a-z]{2}) (?P<hmon>[A-Z][a-z]{2}) {1,2}(?P<hday>\d{1,2}) "
    r"(?P<hhms>\d\d:\d\d:\d\d) (?P<hyear>\d{4}))\])?"
    r"(?: ?\[ *(?P<caller>[TC]\d{1,10})\])? ?(?P<text>.*)$", re.S)
# `dmesg -T` in another language (`[dim. 19 avril 18:03:30 2026]`, `[金 11月 27 23:55:06 2026]`,
# `[11月27日(金) 23:55:06 2026]`, `[11월 27일 (금) 23:55:06]`): read by textshapes.local_date; a month it does
# not know leaves the time unknown, the line read.
_DMESG_LOCAL = LazyPattern(r"^\[(?P<date>[^\]\[]{6,64})\] ?(?P<text>.*)$", re.S)
_DMESG_ISO = LazyPattern(rf"^{_ISO} (?P<text>.*)$", re.S)  # dmesg --time-format iso
_ISO_ONLY = LazyPattern(rf"^{_ISO}$")
_RAW = LazyPattern(r"^\d{1,20},\d{1,20},\d{1,20},[^;]{0,256};")
# The commonest line, plain `dmesg` (`[  139.201253] text`), read with one regex; the lookaheads leave a caller id
# and `journalctl -o short-monotonic` (`[ts] host kernel: …`) to the full path.
_PLAIN_DMESG = LazyPattern(rb"\[ *(\d{1,11})\.(\d{1,9})\] (?!\[ *[TC]\d)(?!\S{0,255} kernel(?:\[\d{1,10}\])?: )"
                           rb"(?![\w.-]{0,255} [^\s:\[\]]{1,128}\[\d{1,10}\]: )")
_RAW_FIELD = LazyPattern(rb"^ [A-Za-z0-9_.-]{1,64}=")
# `grep -H` / `grep -n` output: `kern.log:May 15 …`, `1234:[ 5.1] …`, `/var/log/kern.log.1:88-…` (context
# lines with `-`): the prefix is dropped where a kernel log line follows it.
_GREP_PREFIX = LazyPattern(
    rb"^(?:[^\s:\[<{#][^\s:]{0,4095}:(?:\d{1,10}[:-])?|\d{1,10}[:-])"
    rb"(?=\[ *\d|\[[A-Z][a-z]{2} |<\d|\d{1,20},\d{1,20},|[A-Z][a-z]{2} [ \d]\d |\d{4}-\d\d-\d\d[T ]|[A-Z][a-z]{2} \d{4}-|"
    rb"\d{9,11}\.\d|[a-z]{2,8} *:[a-z]{2,6} *:)")
# Terminal colour and cursor sequences (CSI, and the OSC of a title), as `dmesg --color=always` writes them.
_ANSI = LazyPattern(rb"\x1b(?:\[[0-9;?]{0,32}[ -/]{0,2}[@-~]|\][^\x07\x1b]{0,256}(?:\x07|\x1b\\)?)")
# `journalctl -o verbose`: a head line (the date, then the entry's cursor, whose `t=` is its realtime in hex
# microseconds), then its fields indented, `    MESSAGE=…`.
_VERBOSE_HEAD = LazyPattern(rb"^(?:\S{1,16} )?\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,9})? \S{1,64} "
                            rb"\[s=[0-9a-f]{1,64};i=[0-9a-f]{1,16};b=[0-9a-f]{1,64};m=[0-9a-f]{1,16};"
                            rb"t=(?P<t>[0-9a-f]{1,16});x=[0-9a-f]{1,64}\]$")
_VERBOSE_FIELD = LazyPattern(rb"^(?P<key>[A-Z0-9_]{1,64})=(?P<value>.*)$", re.S)
_VERBOSE_INDENT = 4  # of each field's line; a multi-line value's further lines are indented under its value
_VERBOSE_KEPT = (b"MESSAGE", b"_TRANSPORT", b"SYSLOG_IDENTIFIER", b"PRIORITY", b"_SOURCE_MONOTONIC_TIMESTAMP")
_UTC_NAMES = ("UTC", "GMT", "Z")


@dataclass
class TextLogStats:
    """What a saved log held, so that `inspect` can say what it did and did not understand."""

    lines: int = 0  # non-empty lines read
    records: int = 0  # kernel records found (bare text included)
    formats: dict[str, int] = field(default_factory=dict)  # records per wrapper format
    other: int = 0  # lines of other programs (an unfiltered syslog or journal)
    comments: int = 0  # lines starting with `#`
    continuation: int = 0  # indented continuation lines of a multi-line record (journalctl)
    garbled: int = 0  # lines in a known wrapper that could not be read (a broken prefix, an invalid date)
    first_garbled: Optional[str] = None
    truncated: int = 0  # lines cut at MAX_LINE
    guessed_years: set[int] = field(default_factory=set)  # years guessed for dates printed without one
    notice: Optional[str] = None  # journalctl saying it had nothing ("No journal files were found.")
    decoded: list[str] = field(default_factory=list)  # what was undone before reading: "gzip", "UTF-16LE", "NUL"
    # Records kept with an unknown time: their date could not be read (a month name of a locale not known)
    unknown_dates: int = 0
    first_unknown_date: Optional[str] = None
    # Kernel lines a tool cut short (a cut marker such as `…` at their end): their whole fields are read
    cut_records: int = 0
    decorations: dict[str, int] = field(default_factory=dict)  # lines per decoration removed (textshapes)

    def count(self, fmt: str) -> None:
        self.records += 1
        self.formats[fmt] = self.formats.get(fmt, 0) + 1

    def bad(self, line: str) -> None:
        self.garbled += 1
        if self.first_garbled is None:
            self.first_garbled = line[:200]

    def date_unread(self, line: str) -> None:
        self.unknown_dates += 1
        if self.first_unknown_date is None:
            self.first_unknown_date = line[:200]

    @property
    def bare(self) -> int:
        return self.formats.get("bare", 0)


@dataclass(frozen=True)
class _Clock:
    """How to turn printed dates into epoch seconds: `tz` None = this machine's local time zone (as journalctl
    and `dmesg -T` print), `year` for dates printed without one (else guessed: the latest such date not after
    `now`)."""

    tz: Optional[_dt.tzinfo]
    year: Optional[int]
    now: float

    def epoch(self, y: int, mo: int, d: int, hms: str, frac: Optional[str], zone: Optional[_dt.tzinfo] = None
              ) -> Optional[float]:
        h, mi, s = int(hms[0:2]), int(hms[3:5]), int(hms[6:8])
        try:
            value = _dt.datetime(y, mo, d, h, mi, s)
            tz = zone or self.tz
            stamp = value.replace(tzinfo=tz).timestamp() if tz is not None else value.timestamp()
        except (ValueError, OverflowError, OSError):  # 31 Feb, 25:00, out of range
            return None
        return stamp + (int(frac) / 10 ** len(frac) if frac else 0.0)

    def epoch_without_year(self, mo: int, d: int, hms: str, frac: Optional[str], stats: TextLogStats
                           ) -> Optional[float]:
        if self.year is not None:
            return self.epoch(self.year, mo, d, hms, frac)
        # The latest year in which this date exists and is not in the future (Feb 29 only in leap years).
        this_year = _dt.datetime.fromtimestamp(self.now, tz=_dt.timezone.utc).year
        for year in range(this_year, this_year - 8, -1):
            stamp = self.epoch(year, mo, d, hms, frac)
            if stamp is not None and stamp <= self.now + 86400:
                stats.guessed_years.add(year)
                return stamp
        return None


def _zone(text: Optional[str]) -> Optional[_dt.tzinfo]:
    """`Z`, `+0200`, `-05:00` → a fixed offset."""
    if not text:
        return None
    if text == "Z":
        return _dt.timezone.utc
    sign = -1 if text[0] == "-" else 1
    digits = text[1:].replace(":", "")
    return _dt.timezone(sign * _dt.timedelta(hours=int(digits[:2]), minutes=int(digits[2:4])))


def _iso_epoch(m: re.Match, clock: _Clock, prefix: str = "i") -> Optional[float]:
    date = m.group(f"{prefix}date")
    y, mo, d = int(date[0:4]), int(date[5:7]), int(date[8:10])
    if prefix == "f":
        name = m.group("fzone")
        zone = _dt.timezone.utc if name in _UTC_NAMES else None  # other abbreviations are ambiguous: local / --tz
        return clock.epoch(y, mo, d, m.group("ftime"), m.group("ffrac"), zone)
    try:
        zone = _zone(m.group("izone"))
    except ValueError:
        return None
    return clock.epoch(y, mo, d, m.group("itime"), m.group("ifrac"), zone)


def _usec(secs: str, frac: str) -> int:
    return int(secs) * 1_000_000 + int(frac.ljust(6, "0")[:6])


def _stamp(m: re.Match, clock: _Clock, stats: TextLogStats) -> tuple[str, Optional[float], Optional[int], bool]:
    """(format name, wall time, monotonic usec, ok) of the outer wrapper's time stamp. A date that cannot be
    read (a month of a locale not known, 31 Feb) gives no wall time: the record is kept, its time unknown."""
    if m.group("mon"):
        mon = _MONTHS.get(m.group("mon")) or month_number(m.group("mon"))
        wall = None if mon is None else clock.epoch_without_year(mon, int(m.group("day")), m.group("hms"),
                                                                  m.group("bfrac"), stats)
        name = "short-precise" if m.group("bfrac") else "short"
        return name, wall, None, True
    if m.group("iso"):
        wall = _iso_epoch(m, clock)
        return ("short-iso-precise" if m.group("ifrac") else "short-iso"), wall, None, True
    if m.group("fdate"):
        wall = _iso_epoch(m, clock, prefix="f")
        return "short-full", wall, None, True
    if m.group("unix"):
        secs, _, frac = m.group("unix").partition(".")
        return "short-unix", int(secs) + int(frac) / 10 ** len(frac), None, True
    secs, _, frac = m.group("mono").partition(".")
    return "short-monotonic", None, _usec(secs, frac), True


def _inner(text: str, clock: _Clock, stats: TextLogStats
           ) -> tuple[str, int, Optional[int], Optional[float], str, bool]:
    """The dmesg layer of one line: (format, priority, usec, wall time, text, ok). A date that cannot be read
    leaves the time unknown (counted in `stats`), the line read."""
    m = _DMESG.match(text)
    assert m is not None  # every part is optional
    pri, lvl, secs, human = m.group("pri"), m.group("lvl"), m.group("secs"), m.group("human")
    if pri is not None:
        priority, fmt = int(pri), "dmesg -r"
    elif lvl is not None:
        if lvl not in _LEVELS:
            return "bare", _DEFAULT_PRIORITY, None, None, text, True
        priority, fmt = _LEVELS[lvl], "dmesg -x"
    else:
        priority, fmt = _DEFAULT_PRIORITY, "dmesg"
    usec = wall = None
    if secs is not None:
        usec = _usec(secs, m.group("frac"))
    elif human is not None:
        mon = _MONTHS.get(m.group("hmon")) or month_number(m.group("hmon"))
        wall = None if mon is None else clock.epoch(int(m.group("hyear")), mon, int(m.group("hday")),
                                                    m.group("hhms"), None)
        if wall is None:
            stats.date_unread(text)
        fmt = "dmesg -T"
    elif pri is None and lvl is None and m.group("caller") is None:
        local = _DMESG_LOCAL.match(text) if text.startswith("[") else None
        date = local_date(local.group("date")) if local is not None else None
        if date is not None:
            wall = None
            if date.month is not None and date.year is not None:
                wall = clock.epoch(date.year, date.month, date.day, date.hms, None)
            elif date.month is not None:  # Korean `dmesg -T` prints no year
                wall = clock.epoch_without_year(date.month, date.day, date.hms, None, stats)
            if wall is None:
                stats.date_unread(text)
            return "dmesg -T", priority, None, wall, local.group("text"), True
        return "bare", priority, None, None, text, True
    return fmt, priority, usec, wall, m.group("text"), True


def _json_record(line: str) -> tuple[str, Optional[KmsgRecord]]:
    """`journalctl -o json`: one object per line; only the kernel's entries are records."""
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):
        return "garbled", None
    if not isinstance(entry, dict):
        return "garbled", None
    if entry.get("_TRANSPORT") != "kernel" and entry.get("SYSLOG_IDENTIFIER") != "kernel":
        return "other", None
    message = entry.get("MESSAGE")
    if isinstance(message, list):  # journald stores a message that is not UTF-8 as a byte array
        try:
            message = bytes(message[:MAX_LINE]).decode("utf-8", "backslashreplace")
        except (TypeError, ValueError):
            return "garbled", None
    if not isinstance(message, str):
        return "garbled", None

    def number(key: str, limit: int) -> Optional[int]:
        value = entry.get(key)
        if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20:
            return int(value) if int(value) <= limit else None
        return None

    realtime = number("__REALTIME_TIMESTAMP", 253402300799 * 1_000_000)  # up to year 9999
    priority = number("PRIORITY", 7)
    return "journal json", KmsgRecord(
        priority=_DEFAULT_PRIORITY if priority is None else priority, seq=None,
        usec=number("_SOURCE_MONOTONIC_TIMESTAMP", MAX_USEC), text=message.rstrip("\n"),
        wall_time=None if realtime is None else realtime / 1e6)


def parse_text_line(line: str, clock: _Clock, stats: TextLogStats) -> tuple[str, Optional[KmsgRecord]]:
    """One line of saved text (already stripped) → (format name, record). The record is None for lines that
    are not the kernel's: format "other" (another program) or "garbled" (a wrapper that did not read)."""
    if line.startswith(("{", "\x1e{")):  # `-o json`, `-o json-seq` (each entry after an RS byte)
        if line.rstrip() == "{":  # the first line of a pretty-printed document (`kubectl get events -o json`)
            return "other", None
        return _json_record(line.lstrip("\x1e"))
    if line.startswith("<"):
        m5 = _RFC5424.match(line)
        if m5:
            if m5.group("app") != "kernel":
                return "other", None
            fmt, priority, usec, wall_inner, text, ok = _inner(m5.group("rest").lstrip("\ufeff"), clock, stats)
            ts = _ISO_ONLY.match(m5.group("ts"))
            wall = _iso_epoch(ts, clock) if ts else None
            if not ok or (ts is None and m5.group("ts") != "-"):
                return "garbled", None
            if ts is not None and wall is None:
                stats.date_unread(line)
            return "syslog rfc5424", KmsgRecord(priority=int(m5.group("pri")) & 7 if fmt in ("dmesg", "bare")
                                                else priority, seq=None, usec=usec, text=text,
                                                wall_time=wall if wall is not None else wall_inner)
    m = _KERNEL_LINE.match(line)
    if m:
        fmt, wall, usec, ok = _stamp(m, clock, stats)
        if not ok:
            return "garbled", None
        if wall is None and usec is None:
            stats.date_unread(line)
        inner_fmt, priority, inner_usec, inner_wall, text, ok = _inner(m.group("rest"), clock, stats)
        if not ok:
            return "garbled", None
        spri = m.group("spri")
        if spri is not None:
            fmt = "syslog rfc3164"
            if inner_fmt in ("dmesg", "bare"):
                priority = int(spri) & 7
        elif inner_usec is not None and fmt in ("short", "short-precise", "short-iso", "short-iso-precise"):
            fmt = "syslog" if fmt == "short" else "syslog " + fmt.replace("short-", "")  # kern.log: `[ts]` inside
        return ("journal " if fmt.startswith("short") else "") + fmt, KmsgRecord(
            priority=priority, seq=None, usec=inner_usec if inner_usec is not None else usec, text=text,
            wall_time=wall if wall is not None else inner_wall)
    if _OTHER_LINE.match(line):
        return "other", None
    m = _DMESG_ISO.match(line)
    if m and m.group("ifrac") is not None and "," in m.group("iso"):
        wall = _iso_epoch(m, clock)
        if wall is None:
            stats.date_unread(line)
        return "dmesg iso", KmsgRecord(priority=_DEFAULT_PRIORITY, seq=None, usec=None, text=m.group("text"),
                                       wall_time=wall)
    fmt, priority, usec, wall, text, ok = _inner(line, clock, stats)
    if not ok:
        return "garbled", None
    return fmt, KmsgRecord(priority=priority, seq=None, usec=usec, text=text, wall_time=wall)



# --- bytes to lines ----------------------------------------------------------------------------------
#
# What a path or a paste can hold besides plain UTF-8 text with `\n`: a compressed log (`journalctl | gzip`,
# a rotated `kern.log.2.gz`), UTF-16 (PowerShell's `>`, Windows editors), NULs (a log file after a power
# loss, a tool that ends each line with one), `\r\n` or lone `\r` line ends, and data that is no text at all
# (a binary named by mistake). `text_lines` undoes the first four and refuses the last.

class NotText(ValueError):
    """The bytes cannot be a text log; the message says what they look like instead."""


_SNIFF = 4096  # bytes looked at to tell compression, encoding and binary data apart
_CHUNK = 1 << 16  # decompressed at a time: a compressed bomb never holds more than this
_COMPRESSED = ((b"\x1f\x8b", "gzip"), (b"\xfd7zXZ\x00", "xz"), (b"BZh", "bzip2"), (b"\x28\xb5\x2f\xfd", "zstd"))
# Bytes no text log holds: C0 controls but tab, newline, form feed, carriage return, escape (`dmesg --color`)
# and RS (`journalctl -o json-seq`), and DEL. NULs are removed before this is counted.
_TEXT_BYTES = bytes(b for b in range(256) if b >= 0x20 and b != 0x7f or b in b"\t\n\x0c\r\x1b\x1e")
_BINARY_SHARE = 0.01
_MAGIC = ((b"\x7fELF", "an ELF executable"), (b"%PDF", "a PDF"), (b"PK\x03\x04", "a zip archive"),
          (b"\x89PNG", "a PNG image"), (b"LPKSHHRH", "a systemd journal file (read it with journalctl --file)"))


def _decompressed(chunks: Iterator[bytes], kind: str) -> Iterator[bytes]:
    """The decompressed stream, `_CHUNK` bytes at a time; concatenated members (`cat a.gz b.gz`) are read
    one after the other."""
    import bz2
    import lzma
    import zlib

    def fresh():
        return {"gzip": lambda: zlib.decompressobj(31), "xz": lzma.LZMADecompressor,
                "bzip2": bz2.BZ2Decompressor}[kind]()

    d = fresh()
    errors = (zlib.error, lzma.LZMAError, OSError, EOFError)
    try:
        for data in chunks:
            while data:
                if kind == "gzip":
                    out = d.decompress(data, _CHUNK)
                    data = d.unconsumed_tail
                    yield out
                    while not data and not d.eof and out:  # output held back by the max_length
                        out = d.decompress(b"", _CHUNK)
                        yield out
                else:
                    out = d.decompress(data, _CHUNK)
                    data = b""
                    yield out
                    while not d.eof and not d.needs_input:
                        yield d.decompress(b"", _CHUNK)
                if d.eof:
                    data = d.unused_data + data
                    if not data.strip(b"\x00"):  # padding after the last member (tar, dd)
                        data = b""
                    else:
                        d = fresh()
    except errors as exc:
        raise NotText(f"{kind} data that cannot be decompressed ({exc})") from None


def _utf16_as_utf8(chunks: Iterator[bytes], encoding: str) -> Iterator[bytes]:
    import codecs

    decoder = codecs.getincrementaldecoder(encoding)("replace")
    for data in chunks:
        yield decoder.decode(data).encode("utf-8", "surrogateescape")
    yield decoder.decode(b"", final=True).encode("utf-8", "surrogateescape")


def _utf16_without_bom(head: bytes) -> Optional[str]:
    """UTF-16 text of ASCII characters without a byte order mark: every other byte a NUL."""
    sample = head[:512] if len(head) % 2 == 0 else head[:min(512, len(head) - 1)]
    if len(sample) < 8:
        return None
    if sample[1::2].count(0) == len(sample) // 2 and sample[0::2].count(0) == 0:
        return "utf-16-le"
    if sample[0::2].count(0) == len(sample) // 2 and sample[1::2].count(0) == 0:
        return "utf-16-be"
    return None


def _with_head(chunks: Iterator[bytes], want: int) -> tuple[bytes, Iterator[bytes]]:
    """The first `want` bytes (fewer at the end of the input), and the whole stream again."""
    head = b""
    for data in chunks:
        head += data
        if len(head) >= want:
            break
    import itertools

    return head, itertools.chain((head,) if head else (), chunks)


def text_lines(chunks: Iterable[bytes], stats: TextLogStats) -> Iterator[bytes]:
    """The lines of a saved log read as byte chunks (a file, a pipe): decompressed (gzip, xz, bzip2), UTF-16
    turned into UTF-8, NULs removed, `\r\n` and lone `\r` ends read as `\n`, each line at most MAX_LINE bytes
    (the rest is dropped and counted in `stats.truncated`, never held). Raises NotText for data that is not
    text (what was undone is in `stats.decoded`)."""
    head, stream = _with_head(iter(chunks), _SNIFF)
    for _ in range(2):  # a compressed UTF-16 file is both
        kind = next((name for magic, name in _COMPRESSED if head.startswith(magic)), None)
        if kind == "zstd":
            raise NotText("zstd-compressed data (decompress it first: zstd -dc FILE)")
        if kind is None:
            break
        stats.decoded.append(kind)
        head, stream = _with_head(_decompressed(stream, kind), _SNIFF)
    encoding = None
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        encoding = "utf-16"
    else:
        encoding = _utf16_without_bom(head)
    if encoding is not None:
        stats.decoded.append("UTF-16LE" if encoding == "utf-16-le" or head.startswith(b"\xff\xfe") else "UTF-16BE")
        head, stream = _with_head(_utf16_as_utf8(stream, encoding), _SNIFF)
    if head.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark (Windows editors)
        head, stream = _with_head(stream, _SNIFF)
        stream = _drop_prefix(stream, 3)
    sample = head[:_SNIFF].replace(b"\x00", b"")
    what = next((name for magic, name in _MAGIC if head.startswith(magic)), None)
    if what is not None or (sample and len(sample.translate(None, _TEXT_BYTES)) > _BINARY_SHARE * len(sample)):
        raise NotText(f"binary data{f' ({what})' if what else ''}, not text (first bytes: {head[:16]!r})")
    yield from _split_lines(stream, stats)


def _drop_prefix(chunks: Iterator[bytes], n: int) -> Iterator[bytes]:
    for data in chunks:
        if n:
            data, n = data[n:], max(0, n - len(data))
        if data:
            yield data


def _split_lines(chunks: Iterator[bytes], stats: TextLogStats) -> Iterator[bytes]:
    partial: list[bytes] = []  # pieces of the line not yet ended, at most MAX_LINE bytes in all
    size = 0
    cut = nul = False
    for data in chunks:
        if b"\x00" in data:
            data = data.replace(b"\x00", b"")
            nul = True
        if b"\r" in data:
            # A `\r\n` split between two chunks reads as an empty line, which is skipped like any other.
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        pieces = data.split(b"\n")
        last = pieces.pop()  # the start of a line this chunk does not end
        if pieces:
            first = pieces[0]
            if partial or cut:  # the line begun in earlier chunks ends here
                if size + len(first) > MAX_LINE:
                    first, cut = first[:MAX_LINE - size], True
                if cut:
                    stats.truncated += 1
                pieces[0] = b"".join(partial) + first
                partial, size, cut = [], 0, False
            if max(map(len, pieces)) > MAX_LINE:
                stats.truncated += sum(len(p) > MAX_LINE for p in pieces)
                pieces = [p[:MAX_LINE] for p in pieces]
            yield from pieces
        if last and not cut:
            if size + len(last) > MAX_LINE:
                last, cut = last[:MAX_LINE - size], True
            partial.append(last)
            size += len(last)
    if partial or cut:
        if cut:
            stats.truncated += 1
        yield b"".join(partial)
    if nul:
        stats.decoded.append("NUL")


def _bounded_lines(lines: Iterable[bytes], stats: TextLogStats) -> Iterator[bytes]:
    """Lines of at most MAX_LINE bytes; from a file, an over-long line is skipped to its end without being
    held in memory."""
    readline = getattr(lines, "readline", None)
    if readline is None:
        for line in lines:
            if len(line) > MAX_LINE:
                stats.truncated += 1
                line = line[:MAX_LINE]
            yield line
        return
    while True:
        line = readline(MAX_LINE)
        if not line:
            return
        if len(line) == MAX_LINE and not line.endswith(b"\n"):
            stats.truncated += 1
            while True:  # drop the rest of this line
                more = readline(MAX_LINE)
                if not more or more.endswith(b"\n"):
                    break
        yield line


def parse_text_log(lines: Iterable[bytes], year: Optional[int] = None, *, tz: Optional[_dt.tzinfo] = None,
                   now: Optional[float] = None, stats: Optional[TextLogStats] = None) -> Iterator[KmsgRecord]:
    """Records from a saved log in any of the wrappers above; formats may be mixed line by line: the text front
    end, through which every saved log goes before any OOM parser sees it.

    The later lines of a multi-line record (6.1's `Memory cgroup stats` block and `Mem-Info:` counters), which
    dmesg, journalctl and syslog print indented under the first, are joined back into the one record the kernel
    wrote. The decorations of oomwatch.parse.textshapes (quotes, line numbers, kubectl event rows) are removed
    first, and a cut marker at a kernel line's end (`…`) is removed and counted.

    `tz`: the zone of dates printed without one (default: this machine's, as journalctl and `dmesg -T` print
    them); `year`: for dates printed without a year (default: guessed, and recorded in `stats`); `stats`
    collects what was and was not understood. A date that cannot be read leaves its record in with no time
    (`stats.unknown_dates`). `#EPIPE` markers (written by our capture scripts where records were lost) come out
    as a record with priority LOST_MARKER, raw records whose prefix is broken as GARBLED. Lines of other
    programs and journalctl's own notices are skipped (and counted)."""
    stats = stats if stats is not None else TextLogStats()
    held: Optional[KmsgRecord] = None  # the last prefixed record: its continuation lines may follow
    held_indent = held_column = 0
    skipping: Optional[int] = None  # the indentation of the last line of another program (its continuations)
    more: list[bytes] = []  # the held record's further lines
    size = 0
    for record, kind, indent, column, rest in _line_records(lines, year, tz, now, stats):
        if kind == _BARE and indent:
            if held is not None and indent > held_indent:
                # A further line of the held record (dmesg indents it to the text's column, journalctl by its
                # prefix's width; a paste may have squeezed the spaces): joined back as the kernel wrote it.
                if size < MAX_LINE:
                    line = rest[held_column:] if indent >= held_column else rest[indent:]
                    more.append(line)
                    size += len(line)
                stats.continuation += 1
                continue
            if skipping is not None and indent > skipping:
                stats.continuation += 1  # a further line of another program's message
                continue
        if held is not None:
            yield _uncut(_joined(held, more), stats)
            held = None
        skipping = None
        if kind == _OTHER:
            skipping = indent
        elif kind == _PREFIXED:
            held, held_indent, held_column = record, indent, column
            if more:
                more, size = [], 0
        elif kind == _BARE:
            for piece in _unglued(record, stats):
                stats.count("bare")
                yield _uncut(piece, stats)
        else:
            yield _uncut(record, stats)
    if held is not None:
        yield _uncut(_joined(held, more), stats)


def _joined(record: KmsgRecord, more: list[bytes]) -> KmsgRecord:
    """The record with its further lines (as printed, less the indentation) joined back with newlines."""
    if not more:
        return record
    lines = b"\n".join(line.rstrip() for line in more).decode("utf-8", "backslashreplace")
    return _new_record(KmsgRecord, (record.priority, record.seq, record.usec, record.text + "\n" + lines,
                                    record.fields, record.wall_time))


# Where a kernel OOM line may start inside prose it was glued into (after a space)
_GLUED_START = LazyPattern(r"(?<=\s)(?:" + _OOM_LINE_START.decode() + r"|\S{1,64} invoked oom-killer)")


def _unglued(record: KmsgRecord, stats: TextLogStats) -> list[KmsgRecord]:
    """A line of bare text that holds kernel OOM lines glued together and into prose (a paragraph of a blog
    post that quotes the log): one record per OOM line, split where one starts and is read whole by the OOM
    parser (textshapes' "glued lines"); the line itself when it holds none."""
    text = record.text
    if len(text) > MAX_WRAPPED or not _GLUED_START.search(text) or parse_oom_line(text) is not None:
        return [record]
    starts = [m.start() for m in _GLUED_START.finditer(text)]
    pieces = [text[:starts[0]].rstrip()] if text[:starts[0]].strip() else []
    for start, end in zip(starts, starts[1:] + [len(text)]):
        piece = text[start:end].rstrip()
        if parse_oom_line(piece) is None:  # a start word in prose, not a kernel line: part of what came before
            if pieces:
                pieces[-1] = text[text.index(pieces[-1]):end].rstrip()
            else:
                pieces.append(text[:end].rstrip())
            continue
        pieces.append(piece)
    if len(pieces) < 2:
        return [record]
    stats.decorations["glued lines"] = stats.decorations.get("glued lines", 0) + 1
    return [record._replace(text=piece) for piece in pieces]


# What _line_records says each line is: a record with a prefix (dmesg, journal, syslog: its continuation lines
# may follow), a record of bare kernel text, a record of another kind (raw kmsg, JSON), another program's line.
_PREFIXED, _BARE, _OTHER_RECORD, _OTHER = 0, 1, 2, 3
# The starts of a kernel log line (a decoration's number is removed before one even where numbers do not run on)
_LOG_LINE_START = LazyPattern(rb"[ \t]{0,64}(?:\[ *\d|\[[^\W\d_]|<\d|\d{1,20},\d{1,20},|[^\W\d_]{2,12}\.? [ \d]\d |"
                              rb"\d{4}-\d\d-\d\d|\d{1,2}[\xe6\xec]|" + _OOM_LINE_START + rb"|\S{1,64} invoked oom-killer)")


# How every decoration of textshapes.LINE_DECORATIONS but the table row and the kubectl event (looked for by their
# `|` and `OOMKilling`) may begin: lines that begin otherwise skip the table.
_MAYBE_DECORATED = LazyPattern(rb"[ \t]{0,8}(?:[>`\d]|\[ {0,4}[+-]|\[[A-Z][a-z]{2}[ \d]\d \d)|[ \t]{0,64}\"|kernel")


def _undecorated(line: bytes, last_number: Optional[int], stats: TextLogStats) -> tuple[bytes, Optional[int]]:
    """The line without the decorations of textshapes.LINE_DECORATIONS (each at most once, in the table's
    order), and the line number it carried (None if none)."""
    number = None
    if not _MAYBE_DECORATED.match(line) and b"|" not in line and b"OOMKilling" not in line:
        return line, number  # (most lines: a log's own prefix first)
    for decoration in LINE_DECORATIONS:
        m = decoration.pattern.match(line)
        if m is None:
            continue
        if decoration.numbered:
            n = int(m[1])
            rest = line[m.end():]
            if not ((last_number is not None and n == last_number + 1) or _LOG_LINE_START.match(rest)):
                continue
            number = n
        if decoration.tail is not None:
            end = decoration.tail.search(line, max(m.end(), len(line) - 16))  # (a tail is short: at the end)
            line = line[m.end():end.start() if end is not None else len(line)]
        else:
            line = line[m.end():]
        stats.decorations[decoration.name] = stats.decorations.get(decoration.name, 0) + 1
    return line, number


def _uncut(record: KmsgRecord, stats: TextLogStats) -> KmsgRecord:
    """A kernel OOM line as the kernel wrote it: a tool's cut marker (`…`, `[truncated]`) removed (the OOM parser
    reads its whole fields; counted in `stats.cut_records`), textshapes.TEXT_REPAIRS undone."""
    text = record.text
    if text[:1] not in _REPAIRED_STARTS or text[-1:] not in _REPAIRED_ENDS or not _OOM_LINE_START_TEXT.match(text):
        return record
    for repair in TEXT_REPAIRS:
        if repair.replacement == "digits":
            text = repair.pattern.sub(lambda m: m[1].replace(",", ""), text)
        else:
            text = repair.pattern.sub(repair.replacement, text)
    m = CUT_MARKERS.search(text)
    if m is not None:
        stats.cut_records += 1
        text = text[:m.start()]
    return record if text == record.text else record._replace(text=text)


# The first and last characters of a line a repair or a cut marker may apply to: the kill lines and the summary
# (`kB` ends a kill line's sizes)
_REPAIRED_STARTS = frozenset("MOKo")
_REPAIRED_ENDS = frozenset(".…])>`,0123456789B")
_OOM_LINE_START_TEXT = LazyPattern(_OOM_LINE_START.decode() + r"|\S{1,64} invoked oom-killer")


def _line_records(lines: Iterable[bytes], year: Optional[int], tz: Optional[_dt.tzinfo], now: Optional[float],
                  stats: TextLogStats) -> Iterator[tuple[Optional[KmsgRecord], int, int, int, bytes]]:
    """(record, what it is: _PREFIXED…, its line's indentation, the column its text starts at, the line
    without decorations) for each line that is a record or another program's line."""
    clock = _Clock(tz=tz, year=year, now=now if now is not None else _dt.datetime.now().timestamp())
    pending: Optional[bytearray] = None
    entry: Optional[dict[bytes, bytes]] = None  # the `journalctl -o verbose` entry being read
    entry_key: Optional[bytes] = None  # the field its last line gave
    last_number: Optional[int] = None  # the line number the last line carried (textshapes.LINE_DECORATIONS)
    for raw_line in _bounded_lines(lines, stats):
        if _NUL in raw_line:  # a NUL ending each line would hide every line's prefix
            raw_line = raw_line.replace(b"\x00", b"")
        if _ESC in raw_line:  # `dmesg --color=always`, a terminal capture: the kernel's text never holds ESC
            raw_line = _ANSI.sub(b"", raw_line)
        line_bytes = raw_line.rstrip(b"\r\n")
        if pending is not None:
            if _RAW_FIELD.match(line_bytes):
                if len(pending) < MAX_LINE:
                    pending += b"\n" + line_bytes
                continue
            yield _raw_or_garbled(bytes(pending), stats), _OTHER_RECORD, 0, 0, b""
            pending = None
        rest, last_number = _undecorated(line_bytes, last_number, stats)
        body = rest.lstrip(b" \t\x00")
        if not body.strip():
            continue
        stats.lines += 1
        indent = len(rest) - len(body)
        if body[:1] not in b"[<{#":
            grep = _GREP_PREFIX.match(body)
            if grep is not None:
                body = body[grep.end():]
        if entry is not None:
            field_match = _VERBOSE_FIELD.match(body) if indent else None
            if field_match is not None:
                if field_match["key"] in _VERBOSE_KEPT:
                    entry[field_match["key"]] = field_match["value"]
                entry_key = field_match["key"]
                continue
            if entry_key == b"MESSAGE" and indent > _VERBOSE_INDENT and len(entry[b"MESSAGE"]) < MAX_LINE:
                # a further line of a multi-line MESSAGE, indented under its value (`    MESSAGE=`)
                entry[b"MESSAGE"] += b"\n" + rest[min(indent, _VERBOSE_INDENT + len(b"MESSAGE=")):].rstrip()
                stats.continuation += 1
                continue
            record = _verbose_record(entry, stats)
            entry = None
            if record is not None:
                yield record, _OTHER_RECORD, 0, 0, b""
        if b" [s=" in body:
            head = _VERBOSE_HEAD.match(body)
            if head is not None:
                entry, entry_key = {b"t": head["t"]}, None
                continue
        if body.startswith(b"#"):
            if body.startswith(b"#EPIPE"):
                yield KmsgRecord(priority=LOST_MARKER, seq=None, usec=None, text="#EPIPE"), _OTHER_RECORD, 0, 0, b""
            else:
                stats.comments += 1  # a comment, or a root shell prompt pasted with its output (`# dmesg`)
            continue
        if body[:1].isdigit() and _RAW.match(body[:300].decode("latin-1")):
            pending = bytearray(body)
            continue
        plain = _PLAIN_DMESG.match(body)
        if plain:
            stats.count("dmesg")
            yield (KmsgRecord(priority=_DEFAULT_PRIORITY, seq=None,
                              usec=int(plain[1]) * 1_000_000 + int(plain[2].ljust(6, b"0")[:6]),
                              text=body[plain.end():].decode("utf-8", "backslashreplace").rstrip()),
                   _PREFIXED, indent, len(rest) - len(body) + plain.end(), rest)
            continue
        text = body.decode("utf-8", "backslashreplace").rstrip()
        if text in JOURNAL_NOTICES or (text.startswith("-- ") and text.endswith(" --")):
            # journalctl's own lines: `-- Boot 4c1f… --`, `-- Logs begin at … --`, `-- No entries --`
            if text in JOURNAL_NOTICES and stats.notice is None:
                stats.notice = text
            continue
        fmt, record = parse_text_line(text, clock, stats)
        if fmt == "other":
            stats.other += 1
            yield None, _OTHER, indent, 0, rest
            continue
        if record is None:
            stats.bad(text)
            continue
        if fmt == "bare":
            yield record, _BARE, indent, indent, rest
            continue
        stats.count(fmt)
        # The column the record's text starts at, in bytes (dmesg and journalctl indent by bytes)
        head = len(text) - len(record.text) if record.text and text.endswith(record.text) else len(text)
        yield record, _PREFIXED, indent, len(rest) - len(body) + len(text[:head].encode()), rest
    if pending is not None:
        yield _raw_or_garbled(bytes(pending), stats), _OTHER_RECORD, 0, 0, b""
    if entry is not None:
        record = _verbose_record(entry, stats)
        if record is not None:
            yield record, _OTHER_RECORD, 0, 0, b""


def _verbose_record(entry: dict[bytes, bytes], stats: TextLogStats) -> Optional[KmsgRecord]:
    """A `journalctl -o verbose` entry: a record when the kernel wrote it, else counted as another program's."""
    if entry.get(b"_TRANSPORT") != b"kernel" and entry.get(b"SYSLOG_IDENTIFIER") != b"kernel":
        stats.other += 1
        return None
    message = entry.get(b"MESSAGE")
    if message is None:
        stats.bad("journal verbose entry without MESSAGE")
        return None
    mono, priority = entry.get(b"_SOURCE_MONOTONIC_TIMESTAMP", b""), entry.get(b"PRIORITY", b"")
    stats.count("journal verbose")
    return KmsgRecord(
        priority=int(priority) if priority.isdigit() and int(priority) <= 7 else _DEFAULT_PRIORITY, seq=None,
        usec=int(mono) if mono.isdigit() and len(mono) <= 19 and int(mono) <= MAX_USEC else None,
        text=message.decode("utf-8", "backslashreplace").rstrip(), wall_time=int(entry[b"t"], 16) / 1e6)


def _raw_or_garbled(raw: bytes, stats: TextLogStats) -> KmsgRecord:
    try:
        record = parse_kmsg_record(raw)
    except KmsgParseError:
        # A garbled line in a saved dump: keep its text, drop the broken prefix.
        stats.bad(raw[:200].decode("utf-8", "backslashreplace"))
        return KmsgRecord(priority=GARBLED, seq=None, usec=None, text=unescape(raw.partition(b";")[2]))
    stats.count("kmsg")
    return record
