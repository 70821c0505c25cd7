"""The OOM killer's lines (mm/oom_kill.c, mm/memcontrol.c), kernels 4.14 to 6.19, as typed values.

`parse_oom_line(text)` returns one of the `Oom*` classes of oomwatch.model, or None for every other line.
Formats (../shared/KERNEL-FACTS.md): 4.14 `Task in … killed as a result of limit of …` and `Kill process … or
sacrifice child`; 4.19 `Tasks in … memory.oom.group set`; 5.0 the `oom-kill:` summary; 5.1 the kill prefix;
5.4 `UID:… pgtables:… oom_score_adj:…`; 5.10 `OOM victim … already exiting`.
"""

from __future__ import annotations

import re
from typing import Optional

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

_INVOKED = re.compile(r"^(?P<comm>.*) invoked oom-killer: gfp_mask=(?P<gfp>\S+?),.*?"
                      r"order=(?P<order>-?\d+), oom_score_adj=(?P<adj>-?\d+)\s*$")
# dump_stack: `CPU: 1 PID: 118 Comm: python3 Not tainted …` (6.10+: `CPU: 1 UID: 0 PID: …`)
_STACK_TASK = re.compile(r"^CPU: \d+ (?:UID: \d+ )?PID: (?P<pid>\d+) Comm: (?P<comm>.*?) "
                         r"(?:Not tainted|Tainted:)")
_USAGE = re.compile(r"^memory: usage (?P<usage>\d+)kB, limit (?P<limit>\d+)kB, failcnt \d+")
_SUMMARY = re.compile(
    r"^oom-kill:constraint=CONSTRAINT_(?P<constraint>[A-Z_]+),nodemask=.*?,cpuset=.*?,mems_allowed=.*?,"
    r"(?:oom_memcg=(?P<oom>.*?)|(?P<global>global_oom)),task_memcg=(?P<task>.*?),"
    r"task=(?P<comm>.*),pid=(?P<pid>\d+),uid=(?P<uid>\d+)\s*$")
_TASK_IN_414 = re.compile(r"^Task in (?P<task>.+) killed as a result of limit of (?P<oom>.+?)\s*$")
_KILLED = re.compile(
    rf"^(?:{_PREFIX}: )?Killed process (?P<pid>\d+) \((?P<comm>.*)\) total-vm:(?P<vm>\d+)kB, "
    r"anon-rss:(?P<anon>\d+)kB, file-rss:(?P<file>\d+)kB, shmem-rss:(?P<shmem>\d+)kB"
    r"(?:,? UID:(?P<uid>\d+) pgtables:(?P<pgt>\d+)kB oom_score_adj:(?P<adj>-?\d+))?")
_SELECTED = re.compile(rf"^{_PREFIX}: Kill process (?P<pid>\d+) \((?P<comm>.*)\) score (?P<score>-?\d+) "
                       r"or sacrifice child\s*$")
_GROUP = re.compile(r"^Tasks in (?P<cg>.+) are going to be killed due to memory\.oom\.group set\s*$")
_EXITING = re.compile(rf"^{_PREFIX}: OOM victim (?P<pid>\d+) \((?P<comm>.*)\) is already exiting\. "
                      r"Skip killing the task\s*$")
# Only the OOM killer's own ratelimit: other subsystems print the same words.
_SUPPRESSED = re.compile(r"^(?P<fn>oom_kill_process|dump_header|out_of_memory): (?P<n>\d+) callbacks "
                         r"suppressed\s*$")

_CONSTRAINTS = {"NONE": "global", "MEMCG": "memcg", "CPUSET": "cpuset", "MEMORY_POLICY": "mempolicy"}

# A cgroup without a limit prints PAGE_COUNTER_MAX pages in kB (9007199254740988kB on 64-bit); no real
# limit comes near 2^52 kB (4 EiB).
_UNLIMITED_KB = 1 << 52


def oom_kind_of(prefix: Optional[str]) -> str:
    if prefix is None:
        return "unknown"
    return "memcg" if prefix.startswith("Memory cgroup") else "global"


def _kb(value: Optional[str]) -> Optional[int]:
    return None if value is None else int(value) * KIB


def parse_oom_line(text: str) -> Optional[OomLine]:
    """One kernel log line → an OOM value, or None when the line is not part of an OOM report.

    Cheap first-character tests keep the common case (any other kernel line) fast."""
    if not text:
        return None
    head = text[0]
    if head in "MO":
        m = _KILLED.match(text)
        if m:
            return OomKilled(
                pid=int(m["pid"]), comm=m["comm"], oom_kind=oom_kind_of(m["prefix"]),
                total_vm_bytes=_kb(m["vm"]), anon_rss_bytes=_kb(m["anon"]), file_rss_bytes=_kb(m["file"]),
                shmem_rss_bytes=_kb(m["shmem"]), uid=None if m["uid"] is None else int(m["uid"]),
                pgtables_bytes=_kb(m["pgt"]), oom_score_adj=None if m["adj"] is None else int(m["adj"]))
        m = _EXITING.match(text)
        if m:
            return OomAlreadyExiting(pid=int(m["pid"]), comm=m["comm"], oom_kind=oom_kind_of(m["prefix"]))
        m = _SELECTED.match(text)
        if m:
            return OomSelected(pid=int(m["pid"]), comm=m["comm"], score=int(m["score"]),
                               oom_kind=oom_kind_of(m["prefix"]))
        return None
    if head == "K":  # 4.14 kill line without prefix
        m = _KILLED.match(text)
        if m:
            return OomKilled(
                pid=int(m["pid"]), comm=m["comm"], oom_kind="unknown", total_vm_bytes=_kb(m["vm"]),
                anon_rss_bytes=_kb(m["anon"]), file_rss_bytes=_kb(m["file"]), shmem_rss_bytes=_kb(m["shmem"]),
                uid=None if m["uid"] is None else int(m["uid"]), pgtables_bytes=_kb(m["pgt"]),
                oom_score_adj=None if m["adj"] is None else int(m["adj"]))
        return None
    if text.startswith("oom-kill:"):
        m = _SUMMARY.match(text)
        if not m:
            return None
        constraint = _CONSTRAINTS.get(m["constraint"], m["constraint"].lower())
        return OomSummary(constraint=constraint, oom_cgroup="/" if m["global"] else m["oom"],
                          task_cgroup=m["task"], comm=m["comm"], pid=int(m["pid"]), uid=int(m["uid"]))
    if text.startswith("Tasks in "):
        m = _GROUP.match(text)
        return OomGroup(cgroup=m["cg"]) if m else None
    if text.startswith("Task in "):
        m = _TASK_IN_414.match(text)
        if m:
            return OomSummary(constraint="memcg", oom_cgroup=m["oom"], task_cgroup=m["task"], comm=None,
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
    if " invoked oom-killer: " in text:
        m = _INVOKED.match(text)
        if m:
            return OomInvoked(comm=m["comm"], gfp_mask=m["gfp"], order=int(m["order"]),
                              oom_score_adj=int(m["adj"]))
        return None
    if text.endswith("callbacks suppressed"):
        m = _SUPPRESSED.match(text)
        return OomSuppressed(function=m["fn"], count=int(m["n"])) if m else None
    return None
