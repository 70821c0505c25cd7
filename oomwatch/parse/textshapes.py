"""The text shapes a pasted kernel log comes in, as data: read by oomwatch.parse.kmsg.parse_text_log (the text
front end) before any OOM parser sees a line. Each shape is tested on a real public report in
tests/test_text_shapes.py (its source URL is in the test).

Three tables:
- LINE_DECORATIONS: what a person or a tool put in front of each line (a mail or Markdown quote, `cat -n` or an
  editor's line numbers, a `kubectl get events` row quoting the kernel's line). Removed before the line's log
  format is read; what remains keeps its own indentation (a multi-line record's later lines are told by it).
- MONTHS: month names and forms of every locale `dmesg -T` and `journalctl` print in (util-linux's
  translations of "%a %b %e %H:%M:%S %Y" and glibc's abbreviated month names). `local_date` reads any of their
  layouts by the parts it finds (a month, a day, a time, maybe a year), never by a layout per language.
- CUT_MARKERS: what marks a line cut short (`…`, `[truncated]`): removed, and the line counted as cut.
- TEXT_REPAIRS: what was changed inside a kernel OOM line (thousands separators, a closing backtick): undone.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Optional

from oomwatch.parse import LazyPattern  # the local dates' patterns: compiled when one is read


class LineDecoration(NamedTuple):
    name: str
    pattern: "re.Pattern[bytes]"  # matches the decoration at the start of a line; removed
    numbered: bool = False  # a line number: removed only where the numbers run on (group 1 is the number)
    tail: Optional["re.Pattern[bytes]"] = None  # its end at the line's end (a closing backtick, quote): removed


# Where a kernel OOM line starts (what a decoration that quotes one is recognised by)
_KERNEL_OOM_LINE = (rb"(?=Memory cgroup out of memory|Out of memory|Killed process|oom-kill:|oom_reaper: |Task in |"
                    rb"\S{1,64} invoked oom-killer)")

# In the order they are removed (a line may carry several: a quoted, numbered line). Each is one of the shapes
# of tests/test_text_shapes.py, where its public source is named.
LINE_DECORATIONS: tuple[LineDecoration, ...] = (
    # the console of a VMware guest as vmware.log records it: `2023-12-04T10:49:30.125Z In(05) vcpu-5 - Guest: `
    LineDecoration("vmware.log guest", re.compile(rb"^\d{4}-\d\d-\d\dT[\d:.]{8,15}Z? [A-Z][a-z](?:\(\d{1,3}\))? "
                                                  rb"vcpu-\d{1,4} - Guest: ")),
    LineDecoration("quote", re.compile(rb"^[ \t]{0,8}(?:>[ \t]?){1,8}")),  # mail, Markdown: `> `, `> > `, `>> `
    # Markdown inline code or a fence glued to the text: `` `[ts] Killed process …` ``, ```` ```[ts] … ````
    LineDecoration("inline code", re.compile(rb"^[ \t]{0,8}`{1,3}(?=\S)"), tail=re.compile(rb"`{1,3}[ \t]*$")),
    # `cat -n` prints "%6d\t"; vim `:set nu` "%3d "; editors and pastebins `  12: `, `12|`, `12 |`. Taken for a
    # decoration only where the numbers run on from the line before, or a kernel log line follows the number
    # (a kernel line may itself start with a number: `0 pages in swap cache`).
    LineDecoration("line number", re.compile(rb"^[ \t]{0,8}(\d{1,7})(?:\t|: |:(?=\[)| ?\| ?| )"), numbered=True),
    # a table a log viewer exported (Kibana, Grafana, Markdown): `date | kernel | [ts] text`
    LineDecoration("table row", re.compile(rb"^[ \t|]{0,8}[^|]{0,64}\|[ \t]{0,8}kernel[ \t]{0,8}\|[ \t]{0,8}")),
    # `kubectl get events` / `kubectl describe` rows of node-problem-detector's OOMKilling event: the kernel's
    # line is the MESSAGE column, the row's last
    LineDecoration("kubectl event", re.compile(rb"^.{0,512}?\b(?:Warning|Normal)\s{1,64}OOMKilling\b.{0,512}?"
                                               + _KERNEL_OOM_LINE)),
    # a JSON document's message field on its own line (`kubectl get events -o json`, a log shipper's record)
    LineDecoration("JSON message field", re.compile(rb'^[ \t]{0,64}"(?:message|msg|MESSAGE|log)": ?"' + _KERNEL_OOM_LINE),
                   tail=re.compile(rb'(?:\\n)?",?[ \t]*$')),
    # a syslog line of which only the tag was kept (`kernel: Killed process …`)
    LineDecoration("syslog tag only", re.compile(rb"^kernel(?:\[\d{1,10}\])?: (?=\S)")),
    # `dmesg -H` / `dmesg -e`: a relative time (`[  +0.000082] `) or a minute (`[Jun25 12:42] `): no time
    # of the record can be told from it (it is left unknown)
    LineDecoration("dmesg relative time", re.compile(rb"^[ \t]{0,8}\[ {0,4}[+-]\d{1,6}\.\d{6}\] |"
                                                     rb"^[ \t]{0,8}\[[A-Z][a-z]{2}[ \d]\d \d\d:\d\d\] ")),
)

# What marks a line a tool cut short, at its end: an ellipsis, a log system's words, `less -S`'s `>` at the
# screen's edge.
CUT_MARKERS = re.compile(r"\s?(?:…|\.\.\.|\[\.\.\.\]|\[truncated\]|\(truncated\)|<truncated>|(?<=\S)>)$")


class TextRepair(NamedTuple):
    """A change a person or a tool made inside a kernel OOM line's text, undone."""

    name: str
    pattern: "re.Pattern[str]"
    replacement: str


TEXT_REPAIRS: tuple[TextRepair, ...] = (
    # thousands separators typed or printed into a size (`total-vm:26,184,840kB`): the kernel prints none
    TextRepair("thousands separators", re.compile(r"(?<=[a-z]:)(\d{1,3}(?:,\d{1,3}){1,6})(?=kB)"), "digits"),
    # a Markdown code span or fence closed at the line's end (its opening was on an earlier line)
    TextRepair("closing backticks", re.compile(r"\s?`{1,3}$"), ""),
)

# Abbreviated (and full) month names as glibc's locales print %b, lower case, without a final dot; month 1 first.
# Where two languages give one word to two months (Croatian `lis` is October, Polish and Czech November), the
# word is left out: such a date reads as unknown rather than wrong.
MONTHS: dict[str, int] = {name: month for month, names in enumerate((
    "jan janv janvier januar jän jänner ene enero gen gennaio janeiro januari sty led leden янв январь січ",
    "feb févr fevr février februar febr febrero febbraio fev fevereiro februari lut úno únor фев февраль лют",
    "mar mars märz mär mrz marzo mrt maart março marco maa bře březen мар март бер",
    "apr avr avril april abr abril aprile kwi dub duben апр апрель кві",
    "may mai mayo mag maggio mei maj kvě květen май мая тра",
    "jun juin juni junio giu giugno junho cze čvn červen июн июнь чер",
    "jul juil juillet juli julio lug luglio julho lip čvc červenec июл июль лип",
    "aug août aout august ago agosto augustus sie srp srpen авг август сер",
    "sep sept septembre september septiembre set settembre setembro wrz zář září сен сентябрь вер",
    "oct okt octobre oktober octubre ott ottobre out outubro paź říj říjen окт октябрь жов",
    "nov novembre november noviembre novembro lis listopad ноя нояб ноябрь",
    "dec déc décembre dez dezember dic diciembre dicembre dezembro december gru pro prosinec дек декабрь гру"),
    start=1) for name in names.split()}

# A month written with its number: Chinese and Japanese `11月`, Korean `11월` (glibc's %b there).
_NUMBER_MONTH = LazyPattern(r"^(\d{1,2})[月월]$")
_TIME = LazyPattern(r"^(\d{1,2})[:.](\d\d)[:.](\d\d)$")
_YEAR = LazyPattern(r"^\d{4}\.?$")
_DAY = LazyPattern(r"^(\d{1,2})[.,日일]?$")
# Where the parts of a local date are told apart: spaces, and the punctuation util-linux's translations add
# (`%b%e日(%a)`, `%a, %e. %b %Y,`).
_SPLIT = LazyPattern(r"[\s,()]+|(?<=[月월])(?=\d)|(?<=[日일])(?=\S)")


class LocalDate(NamedTuple):
    year: Optional[int]  # None where the layout prints none (Korean dmesg -T)
    month: Optional[int]  # None: a month word not known (the time stays unknown)
    day: int
    hms: str  # HH:MM:SS


def month_number(word: str) -> Optional[int]:
    """A month as a locale prints it (`Nov`, `nov.`, `ноя`, `11月`, ` 1月`) → 1-12, or None."""
    word = word.strip().rstrip(".").lower()
    m = _NUMBER_MONTH.match(word)
    if m:
        number = int(m[1])
        return number if 1 <= number <= 12 else None
    return MONTHS.get(word)


def local_date(text: str) -> Optional[LocalDate]:
    """The date of a `dmesg -T` stamp (the text between its brackets) in any locale's layout: a time, a day of
    the month, a month word or number, maybe a year; weekday words are skipped. None where the text is not a
    date (no time, or no day); a LocalDate with month None where the month word is not known."""
    if len(text) > 64:
        return None
    year = day = hms = None
    months: list[int] = []
    words = 0  # words that are no month: a weekday, or a month word not known
    for part in filter(None, _SPLIT.split(text.strip())):
        if hms is None and (t := _TIME.match(part)):
            hms = f"{int(t[1]):02d}:{t[2]}:{t[3]}"
        elif year is None and _YEAR.match(part):
            year = int(part.rstrip("."))
        elif (number := month_number(part)) is not None:
            months.append(number)
        elif day is None and (d := _DAY.match(part)) and 1 <= int(d[1]) <= 31:
            day = int(d[1])
        elif not part.isdigit():
            words += 1
        else:
            return None
    if hms is None or day is None or words + len(months) > 3:
        return None
    # Every layout puts the weekday before the month: of two month words (French `mar.` is Tuesday, and March
    # elsewhere) the month is the last.
    return LocalDate(year, months[-1] if months else None, day, hms)
