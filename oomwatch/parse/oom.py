"""The OOM killer's lines (mm/oom_kill.c, mm/memcontrol.c), kernels 3.10 to 6.19, as typed values.

`parse_oom_line(text)` returns one of the `Oom*` classes of oomwatch.model, or None for every other line.
Formats (docs/kernel-facts.md): 3.10 `Killed process … file-rss:NkB` (no shmem-rss; RHEL 7 adds `, UID U,`),
`Task in … killed as a result of limit of …` and `Kill process … or sacrifice child` (up to 5.0); 4.19
`Tasks in … memory.oom.group set` and the `oom-kill:` summary (`constraint=` from 5.0); 5.1 the kill prefix;
5.4 `UID:… pgtables:… oom_score_adj:…`; 5.10 `OOM victim … already exiting`.
"""

from __future__ import annotations

import re
from itertools import combinations
from typing import NamedTuple, Optional, Union

from oomwatch.model import (
    KIB,
    OomAlreadyExiting,
    OomGroup,
    OomInvoked,
    OomKilled,
    OomLine,
    OomMemcgUsage,
    OomSelected,
    OomStackTask,
    OomSummary,
    OomSuppressed,
)

_PREFIX = r"(?P<prefix>Memory cgroup out of memory|Out of memory(?: \(oom_kill_allocating_task\))?)"

# Every variable part is bounded, so no line (a 1 MB comm of `(`, a number of 5,000 digits) costs more than a
# linear scan: a comm is at most 15 bytes (TASK_COMM_LEN), 60 characters once escaped as `\xNN`; a cgroup path
# at most PATH_MAX; pids, sizes and scores fit 20 digits. A line outside these bounds is not a kernel line.
_COMM = r"(?P<comm>.{1,64}?)"
_NUM = r"\d{1,20}"
MAX_PATH = 4096

# `<comm> invoked oom-killer: ` then (3.10) `gfp_mask=0xd0, order=0, oom_score_adj=0` or (4.x+)
# `gfp_mask=0x14000c0(GFP_KERNEL), nodemask=(null),  order=0, oom_score_adj=0`; order=-1 is sysrq's manual OOM.
_INVOKED_REST = re.compile(r"gfp_mask=(?P<gfp>[^,\s]{1,128}),.{0,512}?\border=(?P<order>-?\d{1,3}), "
                           r"(?:oom_adj=-?\d{1,5}, )?oom_score_adj=(?P<adj>-?\d{1,5})$", re.S)
# dump_stack: `CPU: 1 PID: 118 Comm: python3 Not tainted …` (6.10+: `CPU: 1 UID: 0 PID: …`)
_STACK_TASK = re.compile(rf"^CPU: \d{{1,6}} (?:UID: \d{{1,10}} )?PID: (?P<pid>{_NUM}) Comm: {_COMM} "
                         r"(?:Not tainted|Tainted:)", re.S)
_USAGE = re.compile(rf"^memory: usage (?P<usage>{_NUM})kB, limit (?P<limit>{_NUM})kB, failcnt \d{{1,20}}")
# The tail of the `oom-kill:` summary; the head holds nodemask/cpuset/mems_allowed lists that may contain commas,
# so the cgroups are cut out from the right (see _summary).
_SUMMARY_TAIL = re.compile(rf",task={_COMM},pid=(?P<pid>{_NUM}),uid=(?P<uid>{_NUM})$", re.S)
# Some vendor kernels print the summary without constraint and nodemask, its list starting with a comma
# (`oom-kill:,cpuset=…`).
_SUMMARY_HEAD = re.compile(r"^oom-kill:(?:constraint=CONSTRAINT_(?P<constraint>[A-Z_]{1,20}),)?(?:nodemask=|,cpuset=)")
# Killed process: 3.10 `Killed process P (comm) total-vm:NkB, anon-rss:NkB, file-rss:NkB`; RHEL 7 adds
# `, UID U,` after the comm (RHEL 6, 2.6.32: `Killed process P, UID U, (comm) …`); 4.6+ `, shmem-rss:NkB`; 5.1+ the prefix; 5.4+ `, UID:U pgtables:NkB oom_score_adj:N`.
_KILLED = re.compile(
    rf"^(?:{_PREFIX}: )?Killed process (?P<pid>{_NUM})(?:, UID (?P<uid_rhel6>{_NUM}),)? \({_COMM}\)"
    rf"(?:, UID (?P<uid_rhel>{_NUM}),)? "
    rf"total-vm:(?P<vm>{_NUM})kB, anon-rss:(?P<anon>{_NUM})kB, file-rss:(?P<file>{_NUM})kB"
    rf"(?:, shmem-rss:(?P<shmem>{_NUM})kB)?"
    rf"(?:,? UID:(?P<uid>{_NUM})(?: pgtables:(?P<pgt>{_NUM})kB)?(?: oom_score_adj:(?P<adj>-?\d{{1,5}}))?)?", re.S)
_SELECTED = re.compile(rf"^{_PREFIX}: Kill process (?P<pid>{_NUM}) \({_COMM}\) score (?P<score>-?\d{{1,20}}) "
                       r"or sacrifice child$", re.S)
_EXITING = re.compile(rf"^{_PREFIX}: OOM victim (?P<pid>{_NUM}) \({_COMM}\) is already exiting\. "
                      r"Skip killing the task$", re.S)
# mm/oom_kill.c oom_reap_task_mm (4.6+): `oom_reaper: reaped process P (comm), now anon-rss:NkB, …`. The reaper
# only reaps OOM victims: the line proves a kill whose `Killed process` line may be missing (a cut paste).
_REAPED = re.compile(rf"^oom_reaper: reaped process (?P<pid>{_NUM}) \({_COMM}\), now anon-rss:", re.S)
_GROUP_HEAD, _GROUP_TAIL = "Tasks in ", " are going to be killed due to memory.oom.group set"
_TASK_IN_HEAD, _TASK_IN_MID = "Task in ", " killed as a result of limit of "
# Only the OOM killer's own ratelimit: other subsystems print the same words.
_SUPPRESSED = re.compile(r"^(?P<fn>oom_kill_process|dump_header|out_of_memory): (?P<n>\d{1,20}) callbacks "
                         r"suppressed$")

_CONSTRAINTS = {"NONE": "global", "MEMCG": "memcg", "CPUSET": "cpuset", "MEMORY_POLICY": "mempolicy"}

# A cgroup without a limit prints PAGE_COUNTER_MAX pages in kB (9007199254740988kB on 64-bit); no real
# limit comes near 2^52 kB (4 EiB).
_UNLIMITED_KB = 1 << 52


class OomReaped(NamedTuple):
    """`oom_reaper: reaped process P (comm), now anon-rss:…`: the reaper freed an OOM victim's memory, so
    that process was OOM-killed (its kill line may be missing from a cut paste). Sizes are those after
    reaping, not the victim's: not kept. (Here, not in oomwatch.model, until the correlator reads it.)"""

    pid: int
    comm: str


def oom_kind_of(prefix: Optional[str]) -> str:
    if prefix is None:
        return "unknown"
    return "memcg" if prefix.startswith("Memory cgroup") else "global"


def _kb(value: Optional[str]) -> Optional[int]:
    return None if value is None else int(value) * KIB


def _cgroup(path: str) -> Optional[str]:
    # A run of spaces in a path is a terminal's wrap re-joined (parse_oom_line reads the line again).
    return path if 0 < len(path) <= MAX_PATH and "  " not in path else None


def _summary(text: str) -> Optional[OomSummary]:
    """`oom-kill:constraint=C,nodemask=…,cpuset=…,mems_allowed=…,oom_memcg=P|global_oom,task_memcg=P,task=comm,
    pid=N,uid=N` (4.19 without `constraint=`)."""
    head = _SUMMARY_HEAD.match(text)
    tail = _SUMMARY_TAIL.search(text, max(0, len(text) - 130))
    if not head:
        return None
    if not tail:
        return _cut_summary(text, head)
    body = text[:tail.start()]
    cut = body.rfind(",task_memcg=")
    if cut < 0:
        return None
    task_cgroup, body = _cgroup(body[cut + len(",task_memcg="):]), body[:cut]
    if body.endswith(",global_oom"):
        oom_cgroup: Optional[str] = "/"
    else:
        cut = body.rfind(",oom_memcg=")
        oom_cgroup = _cgroup(body[cut + len(",oom_memcg="):]) if cut >= 0 else None
    if task_cgroup is None or oom_cgroup is None:
        return None
    name = head["constraint"]
    if name is None:  # 4.19 printed no constraint: a memcg path means a memcg OOM
        constraint = "global" if oom_cgroup == "/" and body.endswith(",global_oom") else "memcg"
    else:
        constraint = _CONSTRAINTS.get(name, name.lower())
    return OomSummary(constraint=constraint, oom_cgroup=oom_cgroup, task_cgroup=task_cgroup, comm=tail["comm"],
                      pid=int(tail["pid"]), uid=int(tail["uid"]))


# A kill line cut short (`cut -c1-N`, a log system's limit, a search excerpt): its sizes read while whole (each
# ends with its unit), in the kernel's order; at least total-vm must be whole.
_KILLED_CUT = re.compile(rf"^(?:{_PREFIX}: )?Killed process (?P<pid>{_NUM})(?:, UID (?P<uid_rhel6>{_NUM}),)? "
                         rf"\({_COMM}\)(?:, UID (?P<uid_rhel>{_NUM}),)? ?(?=total-vm:|$)", re.S)
_CUT_SIZES = re.compile(rf"(total-vm|anon-rss|file-rss|shmem-rss):({_NUM})kB(?:, |$)")


def _cut_killed(m: re.Match, text: str) -> OomKilled:
    sizes: dict[str, int] = {}
    at = m.end()
    for name in ("total-vm", "anon-rss", "file-rss", "shmem-rss"):
        size = _CUT_SIZES.match(text, at)
        if size is None or size[1] != name:
            break
        sizes[name], at = int(size[2]) * KIB, size.end()
    uid = m["uid_rhel"] or m["uid_rhel6"]
    return OomKilled(pid=int(m["pid"]), comm=m["comm"], oom_kind=oom_kind_of(m["prefix"]),
                     total_vm_bytes=sizes.get("total-vm"), anon_rss_bytes=sizes.get("anon-rss"),
                     file_rss_bytes=sizes.get("file-rss"), shmem_rss_bytes=sizes.get("shmem-rss"),
                     uid=None if uid is None else int(uid))


def _cut_summary(text: str, head: re.Match) -> Optional[OomSummary]:
    """A summary line cut short (`cut -c1-400`, a log system's line limit, a paste): every field a later one
    follows is whole and kept, the rest None, the summary marked cut. None where not even the OOM's cgroup is
    whole (`,task_memcg=` after it)."""
    fields = {}
    for key in ("task_memcg", "task", "pid"):  # each whole where the next one follows it
        at = text.rfind(f",{key}=")
        if at < 0:
            break
        fields[key] = at
    if "task_memcg" not in fields:
        return None
    body = text[:fields["task_memcg"]]
    if body.endswith(",global_oom"):
        oom_cgroup: Optional[str] = "/"
    else:
        at = body.rfind(",oom_memcg=")
        oom_cgroup = _cgroup(body[at + len(",oom_memcg="):]) if at >= 0 else None
    if oom_cgroup is None:
        return None
    task_cgroup = comm = pid = None
    if "task" not in fields and text.endswith(","):  # cut just after task_memcg's comma: its value is whole
        task_cgroup = _cgroup(text[fields["task_memcg"] + len(",task_memcg="):-1])
    if "task" in fields and fields["task"] > fields["task_memcg"]:
        task_cgroup = _cgroup(text[fields["task_memcg"] + len(",task_memcg="):fields["task"]])
        if "pid" in fields and fields["pid"] > fields["task"]:
            comm = text[fields["task"] + len(",task="):fields["pid"]][:64] or None
            uid_at = text.find(",uid=", fields["pid"])
            digits = text[fields["pid"] + len(",pid="):uid_at] if uid_at >= 0 else ""
            pid = int(digits) if digits.isdigit() and len(digits) <= 20 else None
    name = head["constraint"]
    if name is None:
        constraint = "global" if oom_cgroup == "/" and body.endswith(",global_oom") else "memcg"
    else:
        constraint = _CONSTRAINTS.get(name, name.lower())
    return OomSummary(constraint=constraint, oom_cgroup=oom_cgroup, task_cgroup=task_cgroup, comm=comm, pid=pid,
                      uid=None, cut=True)


def _killed(m: re.Match) -> OomKilled:
    g = m.groupdict()  # one call for every field: this is the commonest OOM line of a storm
    uid = g["uid"] or g["uid_rhel"] or g["uid_rhel6"]
    shmem, pgt, adj = g["shmem"], g["pgt"], g["adj"]
    return OomKilled(
        pid=int(g["pid"]), comm=g["comm"], oom_kind=oom_kind_of(g["prefix"]),
        total_vm_bytes=int(g["vm"]) * KIB, anon_rss_bytes=int(g["anon"]) * KIB, file_rss_bytes=int(g["file"]) * KIB,
        shmem_rss_bytes=None if shmem is None else int(shmem) * KIB, uid=None if uid is None else int(uid),
        pgtables_bytes=None if pgt is None else int(pgt) * KIB, oom_score_adj=None if adj is None else int(adj))


# Where the OOM lines begin (a cheap test before trying to re-join a wrapped one).
_OOM_START = re.compile(r"(?:Memory cgroup out of memory|Out of memory|Killed process|oom-kill:|Tasks? in |"
                        r"memory: usage |oom_reaper: |\S{1,64} invoked oom-killer)")
_SPACE_RUN = re.compile(r" {2,}")
MAX_REJOINS = 6  # every reading is tried up to this many breaks in a line (2^6)
MAX_WRAPS = 64  # a line of more breaks is no wrapped kernel line
# A kernel record's text is under 1 KiB (printk's limit); padded at each break it stays well under this. Longer
# lines are not read again: hostile input must not cost 2^MAX_REJOINS parses of 64 KiB.
MAX_WRAPPED = 4096


def parse_oom_line(text: str) -> Optional[Union[OomLine, OomReaped]]:
    """One kernel log line → an OOM value, or None when the line is not part of an OOM report.

    A line a terminal wrapped at its width and a paste re-joined with runs of spaces (`task_memcg=/kubepods/bur
    stable/…`, `anon-rss:654      32kB`) is read again with each run removed or made one space, fewest spaces
    first. Cheap first-character tests keep the common case (any other kernel line) fast."""
    line = _parse_oom_line(text)
    if text and "  " in text and len(text) <= MAX_WRAPPED and _OOM_START.match(text):
        if line is None or (type(line) is OomKilled and not _KILLED.fullmatch(text.rstrip())) or (
                type(line) is OomSummary and line.cut):
            # Not read, or a kill line read only up to a break (its optional fields after it lost), or a summary
            # that looked cut at a break.
            return _rejoined(text.rstrip()) or line
    return line


def _rejoined(text: str) -> Optional[Union[OomLine, OomReaped]]:
    """The line with each run of spaces removed (a break inside a word) or made one space (a break at a
    space). A terminal breaks every W columns, so a piece between two runs is W long, or W-1 when the space
    at its end went into the run: that reading is tried first; then, for a few runs, every other reading."""
    runs = list(_SPACE_RUN.finditer(text))
    if not runs or len(runs) > MAX_WRAPS:
        return None
    starts = [0] + [r.end() for r in runs]
    ends = [r.start() for r in runs] + [len(text)]
    lengths = [end - start for start, end in zip(starts, ends)]
    width = max(lengths[1:-1], default=None)  # the first piece is shorter by the prefix the log stripped
    at_space = {i for i in range(1, len(runs)) if width is not None and lengths[i] == width - 1}
    readings: list[set[int]] = [at_space, at_space | {0}]
    if len(runs) <= MAX_REJOINS:
        readings += [set(keep) for spaced in range(len(runs) + 1) for keep in combinations(range(len(runs)), spaced)]
    for keep in readings:
        parts, at = [], 0
        for i, run in enumerate(runs):
            parts += [text[at:run.start()], " " if i in keep else ""]
            at = run.end()
        line = _parse_oom_line("".join(parts) + text[at:])
        if line is not None:
            return line
    return None


def _parse_oom_line(text: str) -> Optional[Union[OomLine, OomReaped]]:
    if not text:
        return None
    text = text.rstrip()
    head = text[:1]
    if head in ("M", "O", "K"):  # `Killed process` without a prefix: before 5.1
        m = _KILLED.match(text)
        if m:
            return _killed(m)
        m = _KILLED_CUT.match(text)
        if m:
            killed = _cut_killed(m, text)
            if killed.total_vm_bytes is not None:  # (a line with no whole size is not taken for a kill)
                return killed
        if head == "K":
            return None
        m = _EXITING.match(text)
        if m:
            return OomAlreadyExiting(pid=int(m["pid"]), comm=m["comm"], oom_kind=oom_kind_of(m["prefix"]))
        m = _SELECTED.match(text)
        if m:
            return OomSelected(pid=int(m["pid"]), comm=m["comm"], score=int(m["score"]),
                               oom_kind=oom_kind_of(m["prefix"]))
        return None
    if text.startswith("oom-kill:"):
        return _summary(text)
    if text.startswith(_GROUP_HEAD) and text.endswith(_GROUP_TAIL):
        cgroup = _cgroup(text[len(_GROUP_HEAD):-len(_GROUP_TAIL)])
        return OomGroup(cgroup=cgroup) if cgroup else None
    if text.startswith(_TASK_IN_HEAD):
        # mem_cgroup_print_oom_info up to 5.0: the victim's memcg, and the memcg whose limit was hit
        task, sep, oom = text[len(_TASK_IN_HEAD):].partition(_TASK_IN_MID)
        task_cgroup, oom_cgroup = _cgroup(task), _cgroup(oom)
        if sep and task_cgroup and oom_cgroup:
            return OomSummary(constraint="memcg", oom_cgroup=oom_cgroup, task_cgroup=task_cgroup, comm=None,
                              pid=None, uid=None)
        return None
    if text.startswith("memory: usage "):
        m = _USAGE.match(text)
        if m:
            limit_kb = int(m["limit"])
            return OomMemcgUsage(usage_bytes=int(m["usage"]) * KIB,
                                 limit_bytes=None if limit_kb >= _UNLIMITED_KB else limit_kb * KIB)
        return None
    if text.startswith("CPU: "):
        m = _STACK_TASK.match(text)
        return OomStackTask(pid=int(m["pid"]), comm=m["comm"]) if m else None
    comm, sep, rest = text.partition(" invoked oom-killer: ")
    if sep:
        m = _INVOKED_REST.match(rest)
        if m and 0 < len(comm) <= 64:
            return OomInvoked(comm=comm, gfp_mask=m["gfp"], order=int(m["order"]), oom_score_adj=int(m["adj"]))
        return None
    if text.startswith("oom_reaper: "):
        m = _REAPED.match(text)
        return OomReaped(pid=int(m["pid"]), comm=m["comm"]) if m else None
    if text.endswith("callbacks suppressed"):
        m = _SUPPRESSED.match(text)
        return OomSuppressed(function=m["fn"], count=int(m["n"])) if m else None
    return None
