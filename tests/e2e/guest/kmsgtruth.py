"""Ground truth from the kernel's own records: a small, independent reading of raw /dev/kmsg dumps.

This is NOT oomwatch's parser, and must not import it: it is what the end-to-end tests hold the agent to.
It reads the raw record format (`PRI,SEQ,USEC,FLAG;text`, one record per line, continuation lines starting
with a space, `#EPIPE` markers written by the recorder) and groups the OOM-killer lines into incidents with a
handful of regexes. Used by the guest driver (to know when the kernel has acted) and by the host-side tests.
Standard library only: it runs with the guest's python as well as in pytest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

RECORD = re.compile(r"^(\d+),(\d+),(\d+),([^,;]*)[^;]*;(.*)$")
OOM_KILL = re.compile(
    r"^oom-kill:constraint=(?P<constraint>CONSTRAINT_\w+),nodemask=[^,]*,cpuset=(?P<cpuset>[^,]*),"
    r"mems_allowed=[^,]*,(?:oom_memcg=(?P<oom_memcg>[^,]*)|(?P<global>global_oom)),"
    r"task_memcg=(?P<task_memcg>[^,]*),task=(?P<task>.*),pid=(?P<pid>\d+),uid=(?P<uid>\d+)$"
)
KILLED = re.compile(
    r"^(?P<prefix>Memory cgroup out of memory|Out of memory(?: \(oom_kill_allocating_task\))?): "
    r"Killed process (?P<pid>\d+) \((?P<comm>.*)\) total-vm:(?P<total_vm>\d+)kB, "
    r"anon-rss:(?P<anon_rss>\d+)kB, file-rss:(?P<file_rss>\d+)kB, shmem-rss:(?P<shmem_rss>\d+)kB, "
    r"UID:(?P<uid>\d+) pgtables:(?P<pgtables>\d+)kB "
    r"oom_score_adj:(?P<oom_score_adj>-?\d+)$"
)
TASKS_IN = re.compile(r"^Tasks in (?P<cgroup>\S+) are going to be killed due to memory\.oom\.group set$")
EXITING = re.compile(
    r"^(?:[\w ()]+: )?OOM victim (?P<pid>\d+) \((?P<comm>.*)\) is already exiting\. Skip killing the task$"
)
INVOKED = re.compile(
    r"^(?P<comm>.*) invoked oom-killer: gfp_mask=\S+, order=(?P<order>-?\d+), oom_score_adj=(?P<adj>-?\d+)$"
)
CPU_PID = re.compile(r"^CPU: \d+ PID: (?P<pid>\d+) Comm: (?P<comm>\S+)")
MEMCG_USAGE = re.compile(r"^memory: usage (?P<usage>\d+)kB, limit (?P<limit>\d+)kB, failcnt \d+$")
SUPPRESSED = re.compile(r"^oom_kill_process: (\d+) callbacks suppressed$")


def unescape(text: str) -> str:
    r"""/dev/kmsg escapes bytes < 0x20, >= 0x7f and backslash as \xNN."""
    return re.sub(r"\\x([0-9a-fA-F]{2})", lambda m: chr(int(m.group(1), 16)), text)


@dataclass
class Record:
    seq: int
    usec: int
    pri: int
    text: str

    @property
    def seconds(self) -> float:
        return self.usec / 1e6


def parse_records(raw: bytes | str) -> tuple[list[Record], int]:
    """Raw dump -> (records in order, number of #EPIPE markers)."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    records: list[Record] = []
    epipe = 0
    for line in raw.split("\n"):
        if not line:
            continue
        if line.startswith("#EPIPE"):
            epipe += 1
            continue
        if line.startswith(" "):  # continuation (KEY=value dictionary lines)
            continue
        m = RECORD.match(line)
        if not m:
            continue
        records.append(
            Record(seq=int(m.group(2)), usec=int(m.group(3)), pri=int(m.group(1)), text=unescape(m.group(5)))
        )
    return records, epipe


@dataclass
class Killed:
    pid: int
    comm: str
    uid: int
    total_vm_kb: int
    anon_rss_kb: int
    file_rss_kb: int
    shmem_rss_kb: int
    oom_score_adj: int
    seq: int
    usec: int


@dataclass
class Incident:
    """One invocation of the OOM killer as the kernel recorded it."""

    seq: int | None  # seq of the oom-kill: summary (None when ratelimited away)
    usec: int  # timestamp of the summary, or of the first kill line
    constraint: str | None = None  # CONSTRAINT_MEMCG / CONSTRAINT_NONE / ...
    oom_memcg: str | None = None  # "/" for a global OOM
    task_memcg: str | None = None
    victim_pid: int | None = None
    victim_comm: str | None = None
    victim_uid: int | None = None
    trigger_pid: int | None = None
    trigger_comm: str | None = None
    trigger_order: int | None = None  # the failed allocation's order (-1: sysrq f)
    usage_kb: int | None = None
    limit_kb: int | None = None
    group_cgroup: str | None = None
    kill_lines: list[Killed] = field(default_factory=list)  # every `Killed process` line, duplicates included
    exiting: list[tuple[int, str]] = field(default_factory=list)  # `OOM victim P (comm) is already exiting`

    @property
    def kind(self) -> str:
        return "group" if self.group_cgroup is not None else "single"

    @property
    def is_global(self) -> bool:
        return self.oom_memcg == "/"

    @property
    def killed(self) -> dict[int, Killed]:
        """pid -> first kill line, each pid once (the victim is printed twice in a group kill)."""
        out: dict[int, Killed] = {}
        for k in self.kill_lines:
            out.setdefault(k.pid, k)
        return out

    @property
    def killed_pids(self) -> set[int]:
        return set(self.killed)

    @property
    def first_kill_usec(self) -> int | None:
        return self.kill_lines[0].usec if self.kill_lines else None

    def summary(self) -> str:
        where = "global" if self.is_global else f"memcg {self.oom_memcg}"
        grp = f", group {self.group_cgroup}" if self.group_cgroup else ""
        killed = ", ".join(f"{k.pid}({k.comm})" for k in self.killed.values())
        ex = ", ".join(f"{p}({c})" for p, c in self.exiting)
        return (
            f"seq={self.seq} {where}{grp}: {len(self.kill_lines)} kill lines, {len(self.killed)} pids "
            f"[{killed}]" + (f"; already exiting: [{ex}]" if ex else "")
        )


def incidents(records: list[Record]) -> list[Incident]:
    """Group OOM-killer records into incidents: a header/summary opens one, kill lines attach to the open one.

    A `Killed process` line with no open incident (summary ratelimited away) opens one of its own.
    """
    out: list[Incident] = []
    cur: Incident | None = None
    pending_trigger: dict = {}  # header lines come before the summary
    for r in records:
        t = r.text
        m = INVOKED.match(t)
        if m:
            pending_trigger = {"comm": m.group("comm"), "order": int(m.group("order"))}
            cur = None  # a new invocation starts
            continue
        m = CPU_PID.match(t)
        if m and pending_trigger and "pid" not in pending_trigger:
            pending_trigger["pid"] = int(m.group("pid"))
            pending_trigger.setdefault("comm_cpu", m.group("comm"))
            continue
        m = MEMCG_USAGE.match(t)
        if m and pending_trigger:
            pending_trigger["usage"] = int(m.group("usage"))
            pending_trigger["limit"] = int(m.group("limit"))
            continue
        m = OOM_KILL.match(t)
        if m:
            cur = Incident(
                seq=r.seq,
                usec=r.usec,
                constraint=m.group("constraint"),
                oom_memcg="/" if m.group("global") else m.group("oom_memcg"),
                task_memcg=m.group("task_memcg"),
                victim_pid=int(m.group("pid")),
                victim_comm=m.group("task"),
                victim_uid=int(m.group("uid")),
                trigger_pid=pending_trigger.get("pid"),
                trigger_comm=pending_trigger.get("comm"),
                trigger_order=pending_trigger.get("order"),
                usage_kb=pending_trigger.get("usage"),
                limit_kb=pending_trigger.get("limit"),
            )
            pending_trigger = {}
            out.append(cur)
            continue
        m = KILLED.match(t)
        if m:
            k = Killed(
                pid=int(m.group("pid")),
                comm=m.group("comm"),
                uid=int(m.group("uid")),
                total_vm_kb=int(m.group("total_vm")),
                anon_rss_kb=int(m.group("anon_rss")),
                file_rss_kb=int(m.group("file_rss")),
                shmem_rss_kb=int(m.group("shmem_rss")),
                oom_score_adj=int(m.group("oom_score_adj")),
                seq=r.seq,
                usec=r.usec,
            )
            if cur is None:
                cur = Incident(
                    seq=None,
                    usec=r.usec,
                    victim_pid=k.pid,
                    victim_comm=k.comm,
                    victim_uid=k.uid,
                    constraint="CONSTRAINT_NONE"
                    if m.group("prefix").startswith("Out of memory")
                    else "CONSTRAINT_MEMCG",
                )
                out.append(cur)
            cur.kill_lines.append(k)
            continue
        m = TASKS_IN.match(t)
        if m and cur is not None:
            cur.group_cgroup = m.group("cgroup")
            continue
        m = EXITING.match(t)
        if m:
            if cur is not None:
                cur.exiting.append((int(m.group("pid")), m.group("comm")))
            continue
    return [i for i in out if i.kill_lines or i.exiting]


def parse_memory_events(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out
