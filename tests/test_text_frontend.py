"""The text front end (oomwatch.parse.kmsg.parse_text_log): each real 6.1 capture rendered as the tools print
it gives the incidents and the memory breakdown of the raw kmsg, with wall-clock times where the text has them.

The renderers below print what the tools print (read from their sources):
- util-linux dmesg (sys-utils/dmesg.c, print_record): `[%5ld.%06ld] ` before the text; a record's later lines
  (6.1 prints its `Memory cgroup stats` block and `Mem-Info:` counters as one record with newlines) are written
  by safe_fwrite with `indent` spaces after each newline, `indent` being the prefix's length in bytes (snprintf's
  count). `dmesg -T`: `[%s] ` of strftime(_("%a %b %e %H:%M:%S %Y")) in the user's locale: util-linux's
  translations keep that layout for zh_CN, change it to `%b%e日(%a) %H:%M:%S %Y` for ja and to
  `%b %e일 (%a) %H:%M:%S` (no year) for ko; the names are glibc's (localedata/locales: zh_CN abmon `11月`, ja_JP
  abmon ` 1月`…`12月`, ko_KR abmon ` 1월`…).
- systemd journalctl -o short (logs-show.c, output_short / print_multiline): strftime("%b %d %H:%M:%S") in the
  locale, the host, `kernel: `, the text; later lines indented by the prefix's width in bytes. `-o verbose`
  (output_verbose): each field `    KEY=value`, a value's later lines indented under it.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Callable

import pytest

from oomwatch.config import Config
from oomwatch.inspect import build_report
from oomwatch.model import KmsgRecord
from oomwatch.parse.kmsg import parse_kmsg_record
from tests.conftest import BOOT_TIME, CAPTURES

UTC = dt.timezone.utc
CAPTURES_6_1 = sorted(CAPTURES.glob("linux-6.1-*.kmsg"))

# glibc's LC_TIME names (abday Sunday first, abmon January first) of the locales rendered here
LOCALES = {
    "C": (("Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"),
          ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")),
    "zh_CN": (tuple("日一二三四五六"), tuple(f"{m}月" for m in range(1, 13))),
    "ja_JP": (tuple("日月火水木金土"), tuple(f"{m:2d}月" for m in range(1, 13))),
    "ko_KR": (tuple("일월화수목금토"), tuple(f"{m:2d}월" for m in range(1, 13))),
}
# util-linux's po/*.po msgstr for "%a %b %e %H:%M:%S %Y" (an empty msgstr keeps the C layout)
DMESG_T_LAYOUT = {"C": "%a %b %e %H:%M:%S %Y", "zh_CN": "%a %b %e %H:%M:%S %Y", "ja_JP": "%b%e日(%a) %H:%M:%S %Y",
                  "ko_KR": "%b %e일 (%a) %H:%M:%S"}


def strftime(layout: str, when: dt.datetime, locale: str) -> str:
    """strftime with the locale's %a and %b (Python's own would use this process's locale)."""
    days, months = LOCALES[locale]
    out = layout.replace("%a", days[(when.weekday() + 1) % 7]).replace("%b", months[when.month - 1])
    return when.strftime(out)


def capture_records(path: Path) -> list[KmsgRecord]:
    return [parse_kmsg_record(line) for line in path.read_bytes().split(b"\n")
            if line and not line.startswith((b"#", b" "))]


def wall(record: KmsgRecord) -> dt.datetime:
    return dt.datetime.fromtimestamp(BOOT_TIME + record.usec / 1e6, UTC)


def render(records: list[KmsgRecord], prefix_of: Callable[[KmsgRecord], str]) -> str:
    lines = []
    for record in records:
        prefix = prefix_of(record)
        lines.append(prefix + record.text.replace("\n", "\n" + " " * len(prefix.encode())))
    return "\n".join(lines) + "\n"


def dmesg(records: list[KmsgRecord]) -> str:
    return render(records, lambda r: "[%5d.%06d] " % divmod(r.usec, 1_000_000))


def dmesg_T(records: list[KmsgRecord], locale: str) -> str:
    return render(records, lambda r: f"[{strftime(DMESG_T_LAYOUT[locale], wall(r), locale)}] ")


def journalctl_short(records: list[KmsgRecord], locale: str = "C") -> str:
    return render(records, lambda r: f"{strftime('%b %d %H:%M:%S', wall(r), locale)} virtme-ng kernel: ")


def journalctl_verbose(records: list[KmsgRecord]) -> str:
    """`journalctl -k -o verbose` (logs-show.c output_verbose): a head line with the cursor (`t=` the realtime in
    hex microseconds), then each field `    KEY=value`, a multi-line value's later lines indented under it."""
    out = []
    for i, r in enumerate(records):
        realtime = int(BOOT_TIME * 1_000_000) + r.usec
        out.append(f"{wall(r).strftime('%a %Y-%m-%d %H:%M:%S.%f')} UTC [s=5a1b2c3d;i={i:x};b=8e2c4f1a;m={r.usec:x};"
                   f"t={realtime:x};x=8c1d2e3f]")
        out += [f"    _TRANSPORT=kernel", f"    PRIORITY={r.priority & 7}", f"    SYSLOG_IDENTIFIER=kernel",
                f"    _SOURCE_MONOTONIC_TIMESTAMP={r.usec}",
                "    MESSAGE=" + r.text.replace("\n", "\n" + " " * len("    MESSAGE=")), "    _HOSTNAME=virtme-ng"]
    return "\n".join(out) + "\n"


def report_of(path: Path) -> dict:
    return build_report(Config(kmsg=str(path), boot_time=BOOT_TIME), node_view=False,
                        clock=lambda: BOOT_TIME + 86400, tz=UTC)


# What a text that carries no sequence numbers cannot give (kernel_seq), and what is measured when inspect runs
_NOT_IN_TEXT = ("time", "kernel_seq", "detected_at", "latency_seconds")


def comparable(incident: dict) -> str:
    return json.dumps({k: v for k, v in incident.items() if k not in _NOT_IN_TEXT}, sort_keys=True, default=str)


RENDERINGS = {
    "dmesg": (dmesg, "usec"),
    "journalctl -k": (journalctl_short, "seconds"),
    "journalctl -k zh_CN": (lambda r: journalctl_short(r, "zh_CN"), "seconds"),
    "journalctl -k ja_JP": (lambda r: journalctl_short(r, "ja_JP"), "seconds"),
    "journalctl -k -o verbose": (journalctl_verbose, "usec"),
    "dmesg -T zh_CN": (lambda r: dmesg_T(r, "zh_CN"), "seconds"),
    "dmesg -T ja_JP": (lambda r: dmesg_T(r, "ja_JP"), "seconds"),
    "dmesg -T ko_KR": (lambda r: dmesg_T(r, "ko_KR"), "seconds"),
}


def test_the_renderers_print_a_multi_line_record_as_the_tools_do() -> None:
    """The 6.1 stats block, one record, printed as dmesg and journalctl print it: later lines under the text."""
    block = KmsgRecord(priority=6, seq=473, usec=8545707, text="anon 66777088\nfile 0\nkernel 331776")
    assert dmesg([block]).splitlines() == ["[    8.545707] anon 66777088", "               file 0",
                                           "               kernel 331776"]
    first, second, _ = dmesg_T([block], "ja_JP").splitlines()
    assert first == "[11月22日(日) 20:40:08 2026] anon 66777088"
    assert second == " " * len("[11月22日(日) 20:40:08 2026] ".encode()) + "file 0", "indented by bytes"
    first, second, _ = journalctl_short([block], "zh_CN").splitlines()
    assert first == "11月 22 20:40:08 virtme-ng kernel: anon 66777088"
    assert second.strip() == "file 0" and len(second) - len("file 0") == len("11月 22 20:40:08 virtme-ng kernel: ".encode())


@pytest.mark.parametrize("rendering", sorted(RENDERINGS))
@pytest.mark.parametrize("path", CAPTURES_6_1, ids=[p.stem for p in CAPTURES_6_1])
def test_each_capture_as_text_gives_the_incidents_and_breakdown_of_the_raw_kmsg(path: Path, rendering: str,
                                                                              tmp_path: Path) -> None:
    records = capture_records(path)
    assert any("\n" in r.text for r in records), "6.1 prints multi-line records"
    render_text, resolution = RENDERINGS[rendering]
    text = tmp_path / "log.txt"
    text.write_text(render_text(records))
    raw, pasted = report_of(path), report_of(text)
    assert pasted["kmsg"]["parse_errors"] == 0 and not pasted["kmsg"]["text"].get("unreadable_lines")
    assert [comparable(i) for i in pasted["incidents"]] == [comparable(i) for i in raw["incidents"]]
    breakdowns = [i["memory_breakdown"] for i in raw["incidents"] if i["memory_breakdown"]]
    assert [i["memory_breakdown"] for i in pasted["incidents"] if i["memory_breakdown"]] == breakdowns
    stats_blocks = [b for b in breakdowns if b["source"] == "kmsg"]  # a memcg report's own stats block, whole
    assert all(b["file_bytes"] is not None and b["kernel_bytes"] is not None for b in stats_blocks)
    assert stats_blocks or "global" in path.name, "every memcg capture has a stats block to compare"
    for raw_incident, text_incident in zip(raw["incidents"], pasted["incidents"]):
        raw_time = dt.datetime.fromisoformat(raw_incident["time"].replace("Z", "+00:00"))
        text_time = dt.datetime.fromisoformat(text_incident["time"].replace("Z", "+00:00"))
        if resolution == "usec":
            assert text_time == raw_time
        else:  # the wall-clock second the text printed (journalctl's short form has no year: guessed)
            assert text_time.replace(year=raw_time.year) == raw_time.replace(microsecond=0)
    if resolution == "seconds":
        assert pasted["kmsg"]["times_from"] == "log"
