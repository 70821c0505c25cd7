"""What the OOM report says held the memory (issue 21), as typed values: the `Memory cgroup stats for` block,
the task table, and a global OOM's `Mem-Info:` node counters. Pure: text in, values out; every function
returns None for text that is not its line and never raises.

What the kernel prints (mm/memcontrol.c, mm/oom_kill.c, mm/show_mem.c; real captures in fixtures/kmsg/):
- `Memory cgroup stats for <cgroup>:` then the cgroup's memory.stat. From 5.3 (mem_cgroup_print_oom_meminfo
  calls memory_stat_format) it is the cgroup v2 memory.stat, in bytes, whichever hierarchy the host mounts:
  6.1 prints it as ONE record with newlines inside (`\\x0a` in /dev/kmsg, several lines in dmesg); 6.12 prints
  one record per line (seq_buf_do_printk). Before 5.3 a cgroup v1 kernel printed the v1 keys on the header's
  own line as ` cache:32KB rss:524188KB …`: each value is K(pages), i.e. kB, and says so with its `KB`
  suffix. A bare number in a v1 block is bytes: newer kernels on v1 hosts print the v1 memory.stat file's
  own format (memcg1_stat_format, bytes), and a pasted `cat memory.stat` of cgroup v1 is bytes too.
- `Tasks state (memory values in pages):`, a column header, one row per task. The header names the columns:
  3.10 `… rss nr_ptes swapents …`, 4.15+ `… rss pgtables_bytes swapents …`, Debian's 6.12 (captured;
  6.1 has no split) `… rss rss_anon rss_file rss_shmem pgtables_bytes …`.
  Rows are read by the header they follow.
- `Mem-Info:` then `active_anon:N inactive_anon:N …` in pages (one record with `\\x0a` on 6.1, continuation
  lines in dmesg).
"""

from __future__ import annotations

import re
import sys
from itertools import compress
from operator import itemgetter
from typing import Callable, Container, Iterable, Iterator, Mapping, NamedTuple, Optional, Sequence

from oomwatch.parse.kmsg import unescape

KIB = 1024
# A real memory.stat has under 100 keys (6.12: 76); a block claiming more is not the kernel's. Values are u64.
MAX_STAT_KEYS = 256
# A task table has a row per process of the OOM domain: thousands on a big node. A log that goes on past this
# is not one table (or is hostile); the rows after it are not kept.
MAX_TASK_ROWS = 1 << 16
_U64_DIGITS = 20
_U64_MAX = (1 << 64) - 1
_new_tuple = tuple.__new__  # a named tuple made from its fields in order, without keyword arguments

_STATS_HEAD = "Memory cgroup stats for "
_TASKS_HEAD = "Tasks state (memory values in pages):"
_MEMINFO_HEAD = "Mem-Info:"
_STAT_LINE = re.compile(r"([a-z][a-z0-9_]{0,63}) (\d{1,20})")
# A whole block as the kernel prints it: `key value` lines, nothing around them, values that fit a u64 (19 digits
# always do), at most MAX_STAT_KEYS lines. Read with one match and a split; any other block line by line.
_KERNEL_BLOCK = re.compile(r"(?:[a-z][a-z0-9_]{0,63} \d{1,19}\n){0,%d}[a-z][a-z0-9_]{0,63} \d{1,19}"
                           % (MAX_STAT_KEYS - 1))
# The same, for every line of a block at once (the common case: a v2 block and nothing else)
# The keys of the last such block, interned, the block of them all 0 (None when a key repeats), its dialect,
# and per key filter (memory_reports' `keys`) the kept keys and a getter of their values from a block's words
_SHARED_KEYS: list = [[], None, "v2", {}]
_ZERO = "0"
_STAT_LINES = re.compile(r"^[ \t]*([a-z][a-z0-9_]{0,63}) (\d{1,20})[ \t]*$", re.MULTILINE)
_V1_PAIR = re.compile(r"([a-z][a-z0-9_]{0,63}):(\d{1,20})(KB|kB)?")
_MEMINFO_PAIR = re.compile(r"([a-z][a-z0-9_()]{0,63}):(\d{1,20})")
# Columns every known task table header has, in the kernel's order; the name is always last.
_ROW_HEAD = re.compile(r"\[ *(\d{1,10})\]")
_TASK_COLUMNS_KNOWN = frozenset(
    ("uid", "tgid", "total_vm", "rss", "rss_anon", "rss_file", "rss_shmem", "nr_ptes", "nr_pmds", "pgtables_bytes",
     "swapents", "oom_score_adj", "name")
)
# The kernel's task table layouts (mm/oom_kill.c dump_tasks), by their count of numeric columns after the pid:
# what a table pasted without its header line is read by. 7 columns were 3.10's (nr_ptes) and are 4.15+'s
# (pgtables_bytes): told apart by the values (page-table bytes are whole pages).
TASK_TABLE_LAYOUTS: dict[int, tuple[str, ...]] = {
    7: ("uid", "tgid", "total_vm", "rss", "pgtables_bytes", "swapents", "oom_score_adj", "name"),
    8: ("uid", "tgid", "total_vm", "rss", "nr_ptes", "nr_pmds", "swapents", "oom_score_adj", "name"),  # 4.0-4.14
    10: ("uid", "tgid", "total_vm", "rss", "rss_anon", "rss_file", "rss_shmem", "pgtables_bytes", "swapents",
         "oom_score_adj", "name"),  # 6.8+ splits rss
}
_LAYOUT_3_10 = ("uid", "tgid", "total_vm", "rss", "nr_ptes", "swapents", "oom_score_adj", "name")
_ROW_NUMBERS = re.compile(r"\[ *\d{1,10}\]((?:\s+-?\d{1,21}){7,10})\s+\S")


class MemcgStatsHeader(NamedTuple):
    cgroup: str
    # the stats printed on the header's own line (cgroup v1 kernels before 5.3), else None: the block follows
    inline: Optional["MemoryStat"]


class MemoryStat(NamedTuple):
    """A memory.stat block. `values` are bytes whatever the kernel printed (kB values are multiplied out);
    `dialect` is "v2" (anon/file/… keys) or "v1" (cache/rss/… keys); `printed_unit` is "bytes" or "kB"."""

    values: Mapping[str, int]
    dialect: str
    printed_unit: str


class TaskTableHeader(NamedTuple):
    """The column names of a task table, in order, without the leading `pid` (e.g. 6.12's has rss_anon)."""

    columns: tuple[str, ...]

    @property
    def splits_rss(self) -> bool:
        return "rss_anon" in self.columns


class TaskRow(NamedTuple):
    """One task of the table. Memory columns are pages as printed (pgtables_bytes is bytes); a column the
    kernel did not print is None (rss_* before 6.8, pgtables_bytes on 3.10 which prints nr_ptes)."""

    pid: int
    uid: int
    tgid: int
    total_vm_pages: int
    rss_pages: int
    rss_anon_pages: Optional[int]
    rss_file_pages: Optional[int]
    rss_shmem_pages: Optional[int]
    pgtables_bytes: Optional[int]
    nr_ptes: Optional[int]
    swapents_pages: int
    oom_score_adj: int
    name: str


class NodeMemInfo(NamedTuple):
    """A global OOM's `Mem-Info:` counters, in pages as printed (active_anon, inactive_file, shmem…)."""

    pages: Mapping[str, int]


def parse_memcg_stats_header(text: str) -> Optional[MemcgStatsHeader]:
    """`Memory cgroup stats for /a:` (the block follows) or, before 5.3, `… for /a: cache:32KB rss:…`."""
    if not text.startswith(_STATS_HEAD):
        return None
    rest = text[len(_STATS_HEAD):].rstrip()
    if rest.endswith(":"):
        cgroup, inline_text = rest[:-1], ""
    else:
        cgroup, sep, inline_text = rest.partition(": ")
        if not sep:
            return None
    if not cgroup.startswith("/") or "\n" in cgroup or len(cgroup) > 4096:
        return None
    inline = None
    if inline_text.strip():
        inline = parse_memory_stat_block(inline_text)
        if inline is None:
            return None
    return MemcgStatsHeader(cgroup, inline)


def parse_memory_stat_line(text: str) -> Optional[tuple[str, int]]:
    """One `key value` line of a v2 block (6.12 prints each as its own record): (key, bytes)."""
    m = _STAT_LINE.fullmatch(text.strip())
    if not m or int(m[2]) > _U64_MAX:
        return None
    return m[1], int(m[2])


def parse_memory_stat_block(text: str, keys: Optional[frozenset[str]] = None) -> Optional[MemoryStat]:
    """A whole block: `key value` lines (v2 keys in bytes, or a v1 file's keys in bytes), or v1's
    `key:NKB key:NKB` on one line (kB). None when any part is not such a pair, or for no pairs at all.
    `keys`: only these keys are kept (the block is still checked whole, and its dialect told from all of its
    keys); the others are not converted."""
    block = text.strip()
    if _KERNEL_BLOCK.fullmatch(block):  # the kernel's own shape (one `key value` a line): no line-by-line reading
        words = block.replace("\n", " ").split(" ")
        shared, zeros, dialect, kept = _SHARED_KEYS
        if words[::2] != shared:  # a kernel prints the same keys in every block: one string each, pickled
            # once a batch
            shared = list(map(sys.intern, words[::2]))
            zeros = dict.fromkeys(shared, 0) if len(set(shared)) == len(shared) else None
            dialect = _dialect(shared)
            kept = {}
            _SHARED_KEYS[:] = shared, zeros, dialect, kept
        if keys is not None:  # the named keys only: int() of a few values, a small dict
            if keys not in kept:
                # (a repeated key: its last value, as dict() keeps below)
                at = [i for i, key in enumerate(shared) if key in keys]
                kept[keys] = ([shared[i] for i in at],
                              itemgetter(*(2 * i + 1 for i in at)) if len(at) > 1 else
                              (lambda w, i=2 * at[0] + 1: (w[i],)) if at else (lambda w: ()))
            names, values_of = kept[keys]
            return MemoryStat(dict(zip(names, map(int, values_of(words)))), dialect, "bytes")
        numbers = words[1::2]
        if zeros is None:
            values = dict(zip(shared, map(int, numbers)))
        else:  # most of a block is 0: the others are converted (int() is most of a block's cost)
            nonzero = list(map(_ZERO.__ne__, numbers))
            values = zeros.copy()
            values.update(zip(compress(shared, nonzero), map(int, compress(numbers, nonzero))))
        return MemoryStat(values, dialect, "bytes")
    pairs = _STAT_LINES.findall(block)
    if pairs and len(pairs) == block.count("\n") + 1 and len(pairs) <= MAX_STAT_KEYS:  # one pair a line
        fast = {key: int(value) for key, value in pairs}
        if max(fast.values()) <= _U64_MAX:
            return MemoryStat(_only(fast, keys), _dialect(fast), "bytes")
    values: dict[str, int] = {}
    unit = "bytes"
    lines = text.split("\n", MAX_STAT_KEYS + 1)
    if len(lines) > MAX_STAT_KEYS + 1:
        return None
    for line in lines:
        line = line.strip()
        if not line:
            continue
        pair = parse_memory_stat_line(line)
        if pair is not None:
            values[pair[0]] = pair[1]
            continue
        tokens = line.split(None, MAX_STAT_KEYS + 1)
        if len(tokens) > MAX_STAT_KEYS:
            return None
        for token in tokens:
            m = _V1_PAIR.fullmatch(token)
            if not m:
                return None
            value = int(m[2])
            if m[3]:
                value, unit = value * KIB, "kB"
            if value > _U64_MAX:
                return None
            values[m[1]] = value
        if len(values) > MAX_STAT_KEYS:
            return None
    if not values:
        return None
    return MemoryStat(_only(values, keys), _dialect(values), unit)


def _dialect(keys: Container[str]) -> str:
    """A block's dialect from its keys: v1 has `cache`/`rss` (and no `anon`), v2 `anon`/`file`/…"""
    return "v1" if ("cache" in keys or "rss" in keys) and "anon" not in keys else "v2"


def _only(values: dict[str, int], keys: Optional[frozenset[str]]) -> dict[str, int]:
    return values if keys is None else {key: value for key, value in values.items() if key in keys}


def parse_task_table_header(text: str) -> Optional[TaskTableHeader]:
    """The column header `[  pid  ]   uid  tgid total_vm      rss … name` (3.10's says `[ pid ]`)."""
    if text in _HEADERS:  # every report of a node prints the same header
        return _HEADERS[text]
    header = _task_table_header(text)
    if len(_HEADERS) >= _HEADERS_KEPT:
        _HEADERS.clear()
    _HEADERS[text] = header
    return header


_HEADERS: dict[str, Optional[TaskTableHeader]] = {}
_HEADERS_KEPT = 16


def _task_table_header(text: str) -> Optional[TaskTableHeader]:
    s = text.strip()
    if not s.startswith("[") or "]" not in s[:12]:
        return None
    if s[1:s.index("]")].strip() != "pid":
        return None
    columns = tuple(s[s.index("]") + 1:].split())
    if not columns or columns[-1] != "name" or "rss" not in columns or len(columns) > 16:
        return None
    if not set(columns) <= _TASK_COLUMNS_KNOWN or len(set(columns)) != len(columns):
        return None
    return TaskTableHeader(columns)


class _RowShape(NamedTuple):
    """How to read a row under one header: its count of numeric columns, where each TaskRow field is among
    them (`absent`, one past the last, for a column the header lacks: it reads None), which columns must not
    be negative (all but oom_score_adj) and where oom_score_adj is."""

    numbers: int
    fields: Callable[[Sequence[Optional[int]]], tuple]
    non_negative: tuple[int, ...]
    score_adj: Optional[int]


_REQUIRED_COLUMNS = ("uid", "tgid", "total_vm", "rss", "swapents", "oom_score_adj")
_ROW_FIELDS = ("uid", "tgid", "total_vm", "rss", "rss_anon", "rss_file", "rss_shmem", "pgtables_bytes", "nr_ptes",
               "swapents", "oom_score_adj")  # TaskRow's fields between pid and name, by column name
_SHAPES: dict[tuple[str, ...], Optional[_RowShape]] = {}


def _row_shape(columns: tuple[str, ...]) -> Optional[_RowShape]:
    """None for a header without a column every kernel prints (no row of it can be read)."""
    if columns in _SHAPES:
        return _SHAPES[columns]
    numeric = columns[:-1]
    at = {column: i for i, column in enumerate(numeric)}  # a repeated column: its last value, as a dict keeps
    shape = None
    if all(column in at for column in _REQUIRED_COLUMNS):
        absent = len(numeric)
        shape = _RowShape(len(numeric), itemgetter(*(at.get(f, absent) for f in _ROW_FIELDS)),
                          tuple(i for i, column in enumerate(numeric) if column != "oom_score_adj"),
                          at["oom_score_adj"])
    if len(_SHAPES) >= _HEADERS_KEPT:
        _SHAPES.clear()
    _SHAPES[columns] = shape
    return shape


def parse_task_row(text: str, header: TaskTableHeader) -> Optional[TaskRow]:
    """One row `[    118]     0   118    54933    16454   200704        0             0 python3`, read by
    the columns of `header` (the table's own header line). The name is the rest of the line after the header's
    count of numbers: a comm may hold spaces and start with digits (`1 hog`), but is at most 15 bytes
    (TASK_COMM_LEN), so the numbers of a row of another table's shape do not read as a name. None when the
    numbers do not fit the header."""
    s = text.strip()
    m = _ROW_HEAD.match(s)
    if not m:
        return None
    shape = _row_shape(header.columns)
    if shape is None:
        return None
    n = shape.numbers
    parts = s[m.end():].split(None, n)
    if len(parts) != n + 1:
        return None
    name = parts.pop()
    try:
        values: list[Optional[int]] = list(map(int, parts))
    except ValueError:
        return None
    if max(map(len, parts)) > _U64_DIGITS + 1:
        return None
    if min(values) < 0 and any(values[i] < 0 for i in shape.non_negative):  # type: ignore[operator]
        return None
    if not -1000 <= values[shape.score_adj] <= 1000:  # type: ignore[operator]
        return None
    if len(name) > _COMM_BYTES and (len(name.encode()) > _COMM_BYTES and "\\" not in name or len(name) > 4 * _COMM_BYTES):
        return None  # longer than any comm (one escaped byte is 4 characters)
    values.append(None)  # what a column the header lacks reads
    return _new_tuple(TaskRow, (int(m[1]), *shape.fields(values), name))


_COMM_BYTES = 15  # TASK_COMM_LEN less its NUL


def headerless_task_header(text: str) -> Optional[TaskTableHeader]:
    """The header of a task table pasted without it, from its first row: the kernel's layout
    (TASK_TABLE_LAYOUTS) with the row's count of numbers, or the largest that leaves a name (a comm may start
    with a number). None for a line that is no row."""
    m = _ROW_NUMBERS.match(text.strip())
    if m is None:
        return None
    numbers = m[1].split()
    for count in sorted(TASK_TABLE_LAYOUTS, reverse=True):
        if count <= len(numbers):
            columns = TASK_TABLE_LAYOUTS[count]
            if count == 7 and (int(numbers[4]) % 4096 or int(numbers[4]) == 0):
                columns = _LAYOUT_3_10  # a page-table count, not whole pages of bytes
            return TaskTableHeader(columns)
    return None


def is_task_table_title(text: str) -> bool:
    return text.strip() == _TASKS_HEAD


def is_meminfo_title(text: str) -> bool:
    return text.strip() == _MEMINFO_HEAD


def parse_node_meminfo(text: str) -> Optional[NodeMemInfo]:
    """The counters after `Mem-Info:`: `active_anon:6 inactive_anon:106728 isolated_anon:0` and the lines
    that continue it (one record with newlines, or one line of them), in pages. None unless its first key is
    active_anon (the first the kernel prints), or for any word that is not `key:N`."""
    s = text.strip()
    if not s.startswith("active_anon:"):
        return None
    pages: dict[str, int] = {}
    for word in s.split(None, MAX_STAT_KEYS + 1):
        m = _MEMINFO_PAIR.fullmatch(word)
        if not m or len(pages) >= MAX_STAT_KEYS:
            return None
        pages[m[1]] = int(m[2])
    return NodeMemInfo(pages)


def parse_meminfo_continuation(text: str) -> Optional[NodeMemInfo]:
    """A line that continues the node counters (` active_file:4 inactive_file:2 isolated_file:0` in dmesg
    text, where each line of the record is its own line): pages."""
    words = text.split(None, MAX_STAT_KEYS + 1)
    if not words or len(words) > MAX_STAT_KEYS:
        return None
    pages = {}
    for word in words:
        m = _MEMINFO_PAIR.fullmatch(word)
        if not m:
            return None
        pages[m[1]] = int(m[2])
    return NodeMemInfo(pages)


class OomMemoryReport(NamedTuple):
    """What one OOM report printed about memory: the memcg's stats (None for a global OOM or when lost to the
    ratelimit or a wrapped ring), the node counters of a global OOM, and the task table."""

    cgroup: Optional[str]
    stats: Optional[MemoryStat]
    meminfo: Optional[NodeMemInfo]
    task_header: Optional[TaskTableHeader]
    tasks: tuple[TaskRow, ...]


def first_report(texts: Iterable[str], keys: Optional[frozenset[str]] = None) -> Optional[OomMemoryReport]:
    """The memory part of the one report `texts` come from (what a reader kept of it), or None."""
    return next(iter(memory_reports(texts, keys)), None)


# What a person writes for the rows a paste leaves out of a task table
_ELISIONS = frozenset(("...", "…", "[...]", "[…]", ". . ."))


def memory_reports(texts: Iterable[str], keys: Optional[frozenset[str]] = None) -> Iterator[OomMemoryReport]:
    """The memory parts of each OOM report in a run of message texts (records' text, in order). A report
    starts at `Memory cgroup stats for`, `Mem-Info:` or a task table (its title, or the column header alone:
    3.10 prints no title) that follows no other part, and ends with its task table or at the next report.
    Lines of other kinds between the parts (the node's zone lines, `memory: usage`) are skipped.
    `keys`: the stats block's keys to keep (e.g. oomwatch.model.STAT_KEYS_USED, what the incident reads; the
    agent's lean form); the block is read and checked the same, and its other keys are not converted.
    None keeps every key (inspect, tests)."""
    state = _ReportState()
    for text in _split_heads(texts):
        head = parse_memcg_stats_header(text) if text.startswith(_STATS_HEAD) else None
        if head is not None:
            if state.section == "stats" and state.inline is not None:
                continue  # v1 kernels before 5.3 print a line per cgroup below the OOM one: keep the first
            if state.started:
                yield state.report()
            inline = head.inline
            if inline is not None and keys is not None:
                inline = inline._replace(values=_only(dict(inline.values), keys))
            state = _ReportState(started=True, cgroup=head.cgroup, inline=inline, section="stats")
            continue
        if is_meminfo_title(text):
            if state.started:
                yield state.report()
            state = _ReportState(started=True, section="meminfo")
            continue
        if state.section == "stats" and text[:1] not in ("T", "["):  # the task table follows the block
            block = parse_memory_stat_block(text, keys)
            if block is not None and block.dialect == "v2":
                state.stat_values.update(block.values)
                state.stats_read = True  # (with `keys`, a block may keep none of its values)
                continue
        elif state.section == "meminfo":
            info = parse_node_meminfo(text) if not state.meminfo else parse_meminfo_continuation(text)
            if info is not None:
                state.meminfo.update(info.pages)
                continue
        elif state.section == "tasks" and state.header is not None:
            row = parse_task_row(text, state.header)
            if row is not None:
                if len(state.rows) < MAX_TASK_ROWS:
                    state.rows.append(row)
                continue
            if text.strip() in _ELISIONS:
                continue  # a paste that left rows out ("..."): the table goes on
            yield state.report()
            state = _ReportState()
        if is_task_table_title(text) or text.lstrip().startswith("["):
            header = parse_task_table_header(text) if not is_task_table_title(text) else None
            if is_task_table_title(text) or header is not None:
                if state.header is not None or state.rows:
                    yield state.report()
                    state = _ReportState()
                state.started = True
                state.section = "tasks" if header is not None else "tasks-title"
                state.header = header
                continue
        if state.section == "tasks-title":
            state.header = parse_task_table_header(text)
            state.section = "tasks" if state.header is not None else ""
            continue
        if state.section != "tasks" and text.lstrip().startswith("[") and (
                header := headerless_task_header(text)) is not None:
            # A task table pasted without its title and header: read by the kernel's layout of its count of
            # columns; in the report whose parts came before it.
            if state.header is not None or state.rows:
                yield state.report()
                state = _ReportState()
            state.started, state.section, state.header = True, "tasks", header
            row = parse_task_row(text, header)
            if row is not None:
                state.rows.append(row)
            continue
        if state.section in ("", "tasks-title") and not state.stats_read and state.inline is None \
                and text.startswith("anon ") and (block := parse_memory_stat_block(text, keys)) is not None \
                and block.dialect == "v2":
            # A stats block pasted without its `Memory cgroup stats for` line (memory.stat starts with anon)
            if state.header is not None or state.rows or state.meminfo:
                yield state.report()
                state = _ReportState()
            state.started, state.section, state.stats_read = True, "stats", True
            state.stat_values.update(block.values)
            continue
        if state.section in ("stats", "meminfo"):
            state.section = ""
    if state.started:
        yield state.report()


def _split_heads(texts: Iterable[str]) -> Iterator[str]:
    """The texts, with a part's title line split from the lines a paste joined to it (a log that printed the
    `Memory cgroup stats for` line and its block as one multi-line record)."""
    for text in texts:
        if "\n" in text and text.startswith((_STATS_HEAD, _TASKS_HEAD, _MEMINFO_HEAD)):
            head, _, rest = text.partition("\n")
            yield head
            if rest.strip():
                yield rest
        else:
            yield text


class _ReportState:
    def __init__(self, started: bool = False, cgroup: Optional[str] = None,
                 inline: Optional[MemoryStat] = None, section: str = ""):
        self.started, self.cgroup, self.inline, self.section = started, cgroup, inline, section
        self.stat_values: dict[str, int] = {}
        self.stats_read = False
        self.meminfo: dict[str, int] = {}
        self.header: Optional[TaskTableHeader] = None
        self.rows: list[TaskRow] = []

    def report(self) -> OomMemoryReport:
        stats = self.inline
        if stats is None and self.stats_read:
            stats = MemoryStat(dict(self.stat_values), "v2", "bytes")
        meminfo = NodeMemInfo(dict(self.meminfo)) if self.meminfo else None
        return OomMemoryReport(self.cgroup, stats, meminfo, self.header, tuple(self.rows))


_STATS_HEAD_B = _STATS_HEAD.encode()
_TASKS_HEAD_B = _TASKS_HEAD.encode()
_ESCAPED_NEWLINE = b"\\x0a"
_STAT_KEY = re.compile(rb"[a-z][a-z0-9_]{0,63}")
# A block's form: its keys as printed, in order; read with one match of a pattern made of them (the keys as
# literals, a group for each kept value). A kernel prints the same keys in every block: one form per node.
_BLOCK_FORMS: dict = {}  # (keys as printed, kept keys) -> (kept names, the pattern's fullmatch)
_LAST_FORM: dict = {}  # kept keys -> the form last read with them (tried first)
_FORMS_KEPT = 8
_ROW_FORMS: dict = {}  # a task table's columns -> the fullmatch of its rows' pattern


def part_report(part: bytes, keys: Optional[frozenset[str]] = None) -> Optional[OomMemoryReport]:
    """The memory part of one report as the live reader hands it on (oomwatch.sources.kmsg): its records'
    texts as /dev/kmsg escapes them, one a line. The same as first_report() of the unescaped texts; the kernel's
    own shape (the header, the block as one record with escaped newlines as 6.1 prints it or one record a line
    as 6.12 does, the task table's title, header and rows, nothing escaped but those newlines) is read from the
    bytes with a match a line, without unescaping or the report state machine; anything else goes through
    first_report()."""
    report = parse_kernel_shaped_part(part, keys)
    return report if report is not None else first_report(map(unescape, part.split(b"\n")), keys)


def parse_kernel_shaped_part(part: bytes, keys: Optional[frozenset[str]] = None) -> Optional[OomMemoryReport]:
    """part_report()'s fast path: None for a part of any other shape (first_report() reads it). Where it
    gives a report, first_report() gives the same (tests/test_parse_memstat.py checks it on captures and
    their mutations)."""
    if not part.isascii():  # (the kernel escapes other bytes)
        return None
    lines = part.split(b"\n")
    head = lines[0]
    if not (head.startswith(_STATS_HEAD_B) and head.endswith(b":")) or head[24:25] != b"/" or len(head) > 4096 \
            or 0x5C in head:  # (a backslash: escaped bytes; as an int, see oomwatch.parse.kmsg._BACKSLASH)
        return None
    try:
        title = lines.index(_TASKS_HEAD_B, 2)
    except ValueError:
        return None
    if title + 1 >= len(lines) or len(lines) - title - 2 > MAX_TASK_ROWS:
        return None
    values = _block_values(_ESCAPED_NEWLINE.join(lines[1:title]), keys)
    if values is None:
        return None
    header = parse_task_table_header(lines[title + 1].decode())
    if header is None or (shape := _row_shape(header.columns)) is None:
        return None
    match = _ROW_FORMS.get(header.columns) or _row_form(header.columns)
    score_adj = shape.score_adj + 1
    fields = shape.fields
    rows = []
    for line in lines[title + 2:]:
        m = match(line)
        if m is not None:
            *digits, name = m.groups()
            numbers = list(map(int, digits))
            if -1000 <= numbers[score_adj] <= 1000:
                numbers.append(None)  # what a column the header lacks reads
                rows.append(_new_tuple(TaskRow, (numbers[0], *fields(numbers[1:]), name.decode())))
                continue
        row = parse_task_row(line.decode(), header) if 0x5C not in line else None  # (a shape the match left)
        if row is None:
            return None
        rows.append(row)
    return OomMemoryReport(head[len(_STATS_HEAD_B):-1].decode(), MemoryStat(values, "v2", "bytes"), None, header,
                           tuple(rows))


def _block_values(block: bytes, keys: Optional[frozenset[str]]) -> Optional[dict[str, int]]:
    """The kept values of a v2 block printed as the kernel prints it (`key value` lines, escaped newlines
    between them, values of at most 19 digits), or None."""
    form = _LAST_FORM.get(keys)
    m = form[1](block) if form is not None else None
    if m is None:  # another block's keys, or no block: learn its form
        if block.endswith(_ESCAPED_NEWLINE):
            block = block[:-4]
        words = block.replace(_ESCAPED_NEWLINE, b" ").split(b" ")
        names = tuple(words[::2])
        if len(words) % 2 or len(names) > MAX_STAT_KEYS or not all(map(_STAT_KEY.fullmatch, names)) \
                or b"cache" in names or b"rss" in names:  # (v1 keys: the report state machine tells v1 from v2)
            return None
        form = _BLOCK_FORMS.get((names, keys))
        if form is None:
            if len(_BLOCK_FORMS) >= _FORMS_KEPT:
                _BLOCK_FORMS.clear()
            kept = [keys is None or name.decode() in keys for name in names]
            lines = (re.escape(name) + (rb" (\d{1,19})" if keep else rb" \d{1,19}") for name, keep in zip(names, kept))
            pattern = re.escape(_ESCAPED_NEWLINE).join(lines) + rb"(?:\\x0a)?"
            kept_names = [sys.intern(name.decode()) for name in compress(names, kept)]
            form = _BLOCK_FORMS[(names, keys)] = (kept_names, re.compile(pattern).fullmatch)
        _LAST_FORM[keys] = form
        m = form[1](block)
        if m is None:
            return None
    return dict(zip(form[0], map(int, m.groups())))  # (a repeated key: its last value, as memory_reports keeps)


def _row_form(columns: tuple[str, ...]) -> Callable:
    """The fullmatch of a row under `columns` as the kernel prints it: spaces, digits, oom_score_adj's minus,
    and a name of printable ASCII without a backslash (an escaped byte: the slow way unescapes it)
    (parse_task_row's rules, in one pattern; its groups are the pid, the
    numeric columns and the name)."""
    numbers = b"".join(rb" +(-?\d{1,20})" if column == "oom_score_adj" else rb" +(\d{1,21})"
                       for column in columns[:-1])
    # printable, no backslash, no space at either end
    name = rb"([!-\x5b\x5d-~](?:[ -\x5b\x5d-~]{0,13}[!-\x5b\x5d-~])?)"
    pattern = rb" *\[ *(\d{1,10})\]" + numbers + rb" +" + name + rb" *"
    if len(_ROW_FORMS) >= _FORMS_KEPT:
        _ROW_FORMS.clear()
    match = _ROW_FORMS[columns] = re.compile(pattern).fullmatch
    return match
