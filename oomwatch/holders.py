"""What held the memory at an OOM kill (issue 21), from what the report printed (oomwatch/parse/memstat.py):
the breakdown by kind, the largest processes and pools of same-named processes, and a verdict with what to
change. Pure: values in, values out. Unknown is None, never guessed.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from oomwatch.model import KilledProcess
from oomwatch.model import V2_KERNEL_PARTS as _V2_KERNEL_PARTS
from oomwatch.parse.memstat import MemoryStat, NodeMemInfo, OomMemoryReport, TaskRow

BREAKDOWN_KEYS = (
    "anon_bytes", "file_bytes", "file_dirty_bytes", "file_writeback_bytes", "shmem_bytes", "kernel_bytes",
    "sock_bytes", "unevictable_bytes",
)
# oomwatch_last_oom_kill_memory_bytes{type}: the breakdown's parts that do not overlap (dirty and writeback are
# part of file), by the label value they are exported under.
MEMORY_TYPES = {"anon": "anon_bytes", "file": "file_bytes", "shmem": "shmem_bytes", "kernel": "kernel_bytes",
                "sock": "sock_bytes", "unevictable": "unevictable_bytes"}
VERDICTS = ("shmem", "process", "pool", "file", "unevictable", "kernel", "sock", "unknown")
TOP_HOLDERS = 5  # the "five largest": enough to name the culprit, short enough for an Event

# A part that holds at least half of the limit is what filled it: every other part together held less. The
# same share makes one process, or one pool of same-named processes, the cause.
DOMINANT_SHARE = 0.5
# A pool is at least two processes of one comm (forked workers keep their parent's name, or set their own).
POOL_MIN_PROCESSES = 2

_SUMMED = ("anon_bytes", "file_bytes", "shmem_bytes", "kernel_bytes", "sock_bytes")  # disjoint parts


def _v2(values: Mapping[str, int]) -> dict[str, Optional[int]]:
    shmem = values.get("shmem")
    file = values.get("file")
    kernel = values.get("kernel")
    if kernel is None:
        parts = dict(values)
        if "slab" not in parts and ("slab_reclaimable" in parts or "slab_unreclaimable" in parts):
            parts["slab"] = parts.get("slab_reclaimable", 0) + parts.get("slab_unreclaimable", 0)
        present = [parts[k] for k in _V2_KERNEL_PARTS if k in parts]
        kernel = sum(present) if present else None
    return {
        "anon_bytes": values.get("anon"),  # v2 anon excludes shmem (memory.stat's own split)
        # v2 `file` includes tmpfs/shmem pages (Documentation/admin-guide/cgroup-v2.rst): take them out so the
        # parts add up and a tmpfs is not reported as page cache
        "file_bytes": file - shmem if file is not None and shmem is not None and file >= shmem else None,
        "file_dirty_bytes": values.get("file_dirty"),
        "file_writeback_bytes": values.get("file_writeback"),
        "shmem_bytes": shmem,
        "kernel_bytes": kernel,
        "sock_bytes": values.get("sock"),
        "unevictable_bytes": values.get("unevictable"),
    }


def _v1(values: Mapping[str, int]) -> dict[str, Optional[int]]:
    shmem = values.get("shmem")
    cache = values.get("cache")
    return {
        "anon_bytes": values.get("rss"),  # v1 rss: anonymous memory (and swap cache)
        # v1 `cache` holds tmpfs pages too; without a `shmem` key (3.10 prints none) the split is unknown
        "file_bytes": cache - shmem if cache is not None and shmem is not None and cache >= shmem else None,
        "file_dirty_bytes": values.get("dirty"),
        "file_writeback_bytes": values.get("writeback"),
        "shmem_bytes": shmem,
        "kernel_bytes": None,  # v1's OOM report prints no kernel memory
        "sock_bytes": None,
        "unevictable_bytes": values.get("unevictable"),
    }


def _meminfo(pages: Mapping[str, int], page_size: Optional[int]) -> dict[str, Optional[int]]:
    def size(*keys: str) -> Optional[int]:
        if page_size is None or any(k not in pages for k in keys):
            return None
        return sum(pages[k] for k in keys) * page_size

    anon_lru, shmem = size("active_anon", "inactive_anon"), size("shmem")
    slab = size("slab_reclaimable", "slab_unreclaimable")
    tables = size("pagetables")
    return {
        # tmpfs pages sit on the anon LRU (they are swap-backed): take them out of anon
        "anon_bytes": anon_lru - shmem if anon_lru is not None and shmem is not None and anon_lru >= shmem
        else None,
        "file_bytes": size("active_file", "inactive_file"),
        "file_dirty_bytes": size("dirty"),
        "file_writeback_bytes": size("writeback"),
        "shmem_bytes": shmem,
        # kernel stacks are printed per node in kB, not here: slab and page tables only
        "kernel_bytes": slab + tables if slab is not None and tables is not None else None,
        "sock_bytes": None,
        "unevictable_bytes": size("unevictable"),
    }


def breakdown(stats: Union[MemoryStat, NodeMemInfo, None], page_size: Optional[int] = None
              ) -> Optional[dict[str, Optional[int]]]:
    """The issue's memory_breakdown byte fields (BREAKDOWN_KEYS) from a memcg's stats block or a global
    OOM's node counters (which are pages: `page_size` is needed for them, else they are all None); None when
    there is nothing. `file_bytes` is page cache without tmpfs/shmem (the kernel's `file` minus `shmem`);
    `kernel_bytes` is the kernel's `kernel` key, else the sum of kernel_stack, pagetables, sec_pagetables,
    percpu, slab, vmalloc as printed; on a node: slab + page tables. The caller adds `source` and
    `age_seconds`."""
    if isinstance(stats, MemoryStat):
        return _v1(stats.values) if stats.dialect == "v1" else _v2(stats.values)
    if isinstance(stats, NodeMemInfo):
        return _meminfo(stats.pages, page_size)
    return None


def _share(value: Optional[int], limit_bytes: Optional[int]) -> Optional[float]:
    return None if value is None or not limit_bytes else round(value / limit_bytes, 4)


def _sum_pages(pages: Iterable[Optional[int]], page_size: Optional[int]) -> Optional[int]:
    """Bytes of these page counts; None when any is unknown (a column the kernel did not print) or the page size
    is not known."""
    total = 0
    for n in pages:
        if n is None:
            return None
        total += n
    return None if page_size is None else total * page_size


def _bytes(pages: Optional[int], page_size: Optional[int]) -> Optional[int]:
    return None if pages is None or page_size is None else pages * page_size


def _largest_first(row: TaskRow) -> tuple[int, int]:
    return -row.rss_pages, row.pid


def top_holders(rows: Sequence[TaskRow], page_size: Optional[int], killed_pids: Iterable[int] = (),
                limit_bytes: Optional[int] = None, count: int = TOP_HOLDERS) -> list[dict]:
    """The `count` largest tasks by rss, largest first (ties: lower pid first): pid, comm, rss_pages (the table's
    own count), rss_bytes, anon_bytes/file_bytes/shmem_bytes (None where the kernel does not split rss, and every
    byte count None when the page size is not known: a pasted table without its victim's row), limit_share
    (rss over the limit, None when unknown) and killed."""
    killed = set(killed_pids)
    out = []
    for r in sorted(rows, key=_largest_first)[:count]:
        rss = _bytes(r.rss_pages, page_size)
        out.append({"pid": r.pid, "comm": r.name, "rss_pages": r.rss_pages, "rss_bytes": rss,
                    "anon_bytes": _bytes(r.rss_anon_pages, page_size),
                    "file_bytes": _bytes(r.rss_file_pages, page_size),
                    "shmem_bytes": _bytes(r.rss_shmem_pages, page_size),
                    "limit_share": _share(rss, limit_bytes), "killed": r.pid in killed})
    return out


def pools(rows: Sequence[TaskRow], page_size: Optional[int], killed_pids: Iterable[int] = (),
          limit_bytes: Optional[int] = None) -> list[dict]:
    """Tasks that share a comm (POOL_MIN_PROCESSES or more), summed, largest first: comm, processes,
    rss_bytes (the sum of their rss: pages they share, such as a forked parent's, count once in each), the
    split sums where the kernel splits rss, limit_share, killed (how many of them were killed)."""
    if len({r.name for r in rows}) == len(rows):  # no two tasks share a comm: no pool (most reports)
        return []
    killed = set(killed_pids)
    by_comm: dict[str, list[TaskRow]] = {}
    for r in rows:
        by_comm.setdefault(r.name, []).append(r)
    out = []
    for comm, members in by_comm.items():
        if len(members) < POOL_MIN_PROCESSES:
            continue
        rss = _sum_pages((m.rss_pages for m in members), page_size)
        out.append({"comm": comm, "processes": len(members), "rss_pages": sum(m.rss_pages for m in members),
                    "rss_bytes": rss,
                    "anon_bytes": _sum_pages((m.rss_anon_pages for m in members), page_size),
                    "file_bytes": _sum_pages((m.rss_file_pages for m in members), page_size),
                    "shmem_bytes": _sum_pages((m.rss_shmem_pages for m in members), page_size),
                    "limit_share": _share(rss, limit_bytes),
                    "killed": sum(1 for m in members if m.pid in killed)})
    out.sort(key=lambda p: (-p["rss_pages"], p["comm"]))
    return out


def human_bytes(n: int) -> str:
    """1.5 GiB, 160 MiB, 900 KiB: one decimal below 10, none above (what a sentence needs)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.1f} {unit}" if v < 10 else f"{v:.0f} {unit}"
    return f"{n} B"


def _of(limit_bytes: Optional[int]) -> str:
    return f" of the {human_bytes(limit_bytes)} limit" if limit_bytes else ""


# What "more memory" means where the memory ran out (advice fits the workload and the constraint): a Kubernetes
# container's limit, a Slurm job's request, a systemd unit's MemoryMax=, a cgroup's memory.max, or the node.
RAISE = {"k8s": "raise the limit", "slurm": "request more memory (--mem, --mem-per-cpu)",
         "systemd": "raise the unit's MemoryMax=", "other": "raise the cgroup's memory.max",
         "node": "give the node more memory, or set limits on its workloads"}
# Where a tmpfs that filled the limit is capped
CAP_TMPFS = {"k8s": "set the emptyDir's sizeLimit, or count it in the limit",
             "node": "delete its files, or mount it with a smaller size=",
             "other": "delete its files, mount it with a size= that fits, or count it in the limit"}


def advice_for(constraint: str, oom_cgroup: Optional[str], workload_type: Optional[str]) -> str:
    """The RAISE/CAP_TMPFS key of a kill: "node" when the node ran out (a global, cpuset or mempolicy OOM), else
    the kind of workload whose limit was hit."""
    if constraint in ("global", "cpuset", "mempolicy") or oom_cgroup == "/":
        return "node"
    if workload_type and workload_type.startswith("k8s"):
        return "k8s"
    return workload_type if workload_type in ("slurm", "systemd") else "other"


def verdict(parts: Optional[Mapping[str, Optional[int]]], holders: Sequence[Mapping],
            pools_: Sequence[Mapping] = (), limit_bytes: Optional[int] = None,
            tmpfs_volumes: Sequence[str] = (), advice: str = "k8s") -> tuple[str, str]:
    """(verdict, sentence): which kind of memory, process or pool filled the limit, and what to change.

    Checked in this order, each at DOMINANT_SHARE of the limit (or, with no limit known, of the breakdown's
    total, else of the tasks' rss): shmem, unevictable, kernel, sock, file (the kinds a process's rss does not
    explain, or that stay after it dies), then the largest process, then the largest pool. `tmpfs_volumes`:
    names of the Kubernetes volumes behind the cgroup's tmpfs mounts, where the caller knows them. `advice`:
    advice_for()'s key, what "more memory" means here."""
    more = RAISE.get(advice, RAISE["other"])
    parts = parts or {}
    whole = limit_bytes
    if not whole:
        known = [parts.get(k) for k in _SUMMED]
        whole = sum(v for v in known if v) or sum(h.get("rss_bytes") or 0 for h in holders) or None
    if not whole or (not any(parts.values()) and not holders):
        return "unknown", ("what held the memory is not in the log (the report's stats and task table were "
                           "lost)")

    def dominant(key: str) -> Optional[int]:
        v = parts.get(key)
        return v if v is not None and v >= DOMINANT_SHARE * whole else None

    of = _of(limit_bytes)
    if (v := dominant("shmem_bytes")) is not None:
        where = "tmpfs or /dev/shm" + (f" ({', '.join(tmpfs_volumes)})" if tmpfs_volumes else "")
        return "shmem", (f"{where} held {human_bytes(v)}{of}; tmpfs pages stay charged after a restart, so "
                         "the container will be killed again until its files are deleted; "
                         + CAP_TMPFS.get(advice, CAP_TMPFS["other"]))
    if (v := dominant("unevictable_bytes")) is not None:
        return "unevictable", (f"unevictable (locked or pinned) pages held {human_bytes(v)}{of}; the kernel "
                               "cannot reclaim them (mlock, pinned host memory of GPU frameworks): pin less, "
                               "or count the pinned memory in the limit")
    if (v := dominant("kernel_bytes")) is not None:
        return "kernel", (f"kernel memory (slab, stacks, page tables) held {human_bytes(v)}{of}; it is "
                          "charged for what the processes asked of the kernel (many files, sockets, "
                          f"processes or threads): find what they create in numbers, or {more}")
    if (v := dominant("sock_bytes")) is not None:
        return "sock", (f"socket buffers held {human_bytes(v)}{of}; peers did not read or the application "
                        f"did not drain its sockets fast enough: bound the buffers, or {more}")
    if (v := dominant("file_bytes")) is not None:
        dirty = (parts.get("file_dirty_bytes") or 0) + (parts.get("file_writeback_bytes") or 0)
        detail = f" ({human_bytes(dirty)} dirty or under writeback)" if dirty else ""
        return "file", (f"page cache held {human_bytes(v)}{of}{detail}; pages being written could not be "
                        "reclaimed in time: write with less buffered data (fsync as you go, lower "
                        f"vm.dirty_bytes), or {more}")
    top = holders[0] if holders else None
    if top and (top.get("rss_bytes") or 0) >= DOMINANT_SHARE * whole:
        killed = ", and was killed" if top.get("killed") else ""
        # rss counts the file pages a process maps (its binary, libraries) that may be charged elsewhere
        over = limit_bytes and top["rss_bytes"] > limit_bytes
        shared = " (its rss counts shared file pages)" if over else ""
        return "process", (f"{top['comm']} (pid {top['pid']}) held {human_bytes(top['rss_bytes'])}{of}"
                           f"{shared}{killed}; reduce what it holds, or {more}")
    pool = pools_[0] if pools_ else None
    if pool and (pool.get("rss_bytes") or 0) >= DOMINANT_SHARE * whole:
        over = limit_bytes and pool["rss_bytes"] > limit_bytes
        shared = " (pages they share count in each)" if over else ""
        return "pool", (f"{pool['processes']} × {pool['comm']} held {human_bytes(pool['rss_bytes'])}{of}"
                        f"{shared}; together they filled it: fewer workers, less memory per worker, or {more}")
    return "unknown", ("no one kind of memory, process or pool of processes held half of the limit"
                       if limit_bytes else "no one kind of memory, process or pool held half of the memory")


POOLS_KEPT = 3  # an incident names its largest pools; the verdict needs only the first
PAGE_SIZES = (4096, 16384, 65536)  # x86-64 and arm64's base page sizes


def memory_by_type(parts: Optional[Mapping[str, Any]]) -> Optional[dict[str, int]]:
    """A breakdown's known parts by MEMORY_TYPES label value (None: no breakdown)."""
    if not parts:
        return None
    return {name: parts[key] for name, key in MEMORY_TYPES.items() if isinstance(parts.get(key), int)}


def page_size_of(rows: Sequence[TaskRow], victim_pid: Optional[int], victim_rss_bytes: Optional[int]
                 ) -> Optional[int]:
    """The page size the task table's pages are in, told from the victim's own row: its kill line printed
    the same rss in kB (anon + file + shmem). None when the row or the kill line's sizes are missing, or the
    ratio is no page size (the victim's memory changed between the table and the kill line)."""
    if victim_pid is None or not victim_rss_bytes:
        return None
    row = next((r for r in rows if r.pid == victim_pid), None)
    if row is None or not row.rss_pages:
        return None
    ratio = victim_rss_bytes / row.rss_pages
    return next((size for size in PAGE_SIZES if abs(ratio - size) <= 0.1 * size), None)


# What a breakdown from the kill lines cannot see: they print the rss of the processes the kernel killed, nothing
# of the rest of the cgroup's charge.
KILL_LINES_UNSEEN = ("page cache the killed processes did not map", "kernel memory", "processes not killed")
_KIB = 1024  # kill lines print kB: rows made from them count 1 KiB "pages"


def kill_line_rows(killed: Sequence[KilledProcess]) -> list[TaskRow]:
    """The killed processes as task rows in KiB (page size 1024), from their kill lines' anon/file/shmem rss
    (before 4.9 no shmem-rss: None, counted in file-rss); a process whose line printed no sizes is left out."""
    rows = []
    for p in killed:
        if p.anon_rss_bytes is None or p.file_rss_bytes is None:
            continue
        anon, file = p.anon_rss_bytes // _KIB, p.file_rss_bytes // _KIB
        shmem = None if p.shmem_rss_bytes is None else p.shmem_rss_bytes // _KIB  # (before 4.9: in file-rss)
        rows.append(TaskRow(pid=p.pid, uid=p.uid if p.uid is not None else -1, tgid=p.pid,
                            total_vm_pages=(p.total_vm_bytes or 0) // _KIB, rss_pages=anon + file + (shmem or 0),
                            rss_anon_pages=anon, rss_file_pages=file, rss_shmem_pages=shmem,
                            pgtables_bytes=None, nr_ptes=None, swapents_pages=0,
                            oom_score_adj=p.oom_score_adj if p.oom_score_adj is not None else 0, name=p.comm))
    return rows


def kill_lines_breakdown(rows: Sequence[TaskRow]) -> Optional[dict[str, Any]]:
    """A process-level breakdown from the kill lines (rows of kill_line_rows): what the killed processes held
    at the kill, by kind; page cache they did not map and kernel memory are not in it (`unseen`)."""
    if not rows:
        return None
    parts: dict[str, Any] = {"source": "kill_lines", "age_seconds": 0.0}
    parts.update(dict.fromkeys(BREAKDOWN_KEYS))
    parts["anon_bytes"] = sum(r.rss_anon_pages or 0 for r in rows) * _KIB
    parts["file_bytes"] = sum(r.rss_file_pages or 0 for r in rows) * _KIB  # mapped file pages only
    shmem = [r.rss_shmem_pages for r in rows]
    parts["shmem_bytes"] = None if None in shmem else sum(shmem) * _KIB  # mapped tmpfs/shm pages only
    parts["unseen"] = list(KILL_LINES_UNSEEN)
    return parts


def _kill_lines_verdict(sizes: Mapping[str, Optional[int]], holders: Sequence[Mapping], pools_: Sequence[Mapping],
                        limit_bytes: Optional[int], advice: str) -> tuple[str, str]:
    """The verdict from the kill lines alone: a process or pool only by its share of a known limit (of what the
    killed processes held, one of them always dominates: that says nothing); always said to be partial."""
    held = (sizes.get("anon_bytes") or 0) + (sizes.get("file_bytes") or 0) + (sizes.get("shmem_bytes") or 0)
    kinds = ", ".join(f"{k} {human_bytes(sizes[f'{k}_bytes'] or 0)}" for k in ("anon", "file", "shmem")
                      if sizes.get(f"{k}_bytes"))
    said = (f"only the kill lines survived: the killed processes held {human_bytes(held)}"
            + (f" ({kinds})" if kinds else ""))
    if not limit_bytes:
        return "unknown", said + "; the limit, page cache they did not map and kernel memory are not in the log"
    name, sentence = verdict(None, holders, pools_, limit_bytes, advice=advice)
    return name, said + (f"; {sentence}" if name != "unknown" else
                         "; page cache they did not map and kernel memory are not in the log")


def held_memory(report: Optional[OomMemoryReport], *, limit_bytes: Optional[int], killed_pids: Sequence[int],
                page_size: Optional[int], victim_rss_bytes: Optional[int] = None,
                oom_cgroup: Optional[str] = None, tmpfs_volumes: Sequence[str] = (),
                memory_stat: Optional[tuple[MemoryStat, float]] = None,
                killed: Sequence[KilledProcess] = (), advice: str = "k8s") -> dict:
    """What held the memory, from one report's memory part (oomwatch.parse.memstat): {"memory_breakdown":
    {source, age_seconds, BREAKDOWN_KEYS…} | None, "top_holders": […], "pools": […], "verdict": VERDICTS,
    "verdict_sentence": str}. `page_size`: the task table's pages (the agent's own; None for a pasted log: told
    from the victim's row, else the rows are ranked by pages, their bytes unknown). `killed_pids`: the victim first. `oom_cgroup`: the
    cgroup the report's summary names; stats of another cgroup (lines of two reports mixed) are not this kill's,
    and are left out. `memory_stat`: (a memory.stat reading of the OOM cgroup known to be from before the kill,
    seconds before it), used when the report printed no stats block (source "memory.stat"). `killed`: the killed
    processes with their kill lines' sizes: the last evidence, for the breakdown (source "kill_lines") and the
    holders (`"from": "kill_lines"`) where the report's own were lost. `advice`: advice_for()'s key."""
    if report is not None and report.stats is not None and oom_cgroup and report.cgroup not in (None, oom_cgroup):
        report = report._replace(stats=None)
    parts: Optional[dict] = None
    holders: list[dict] = []
    pools_: list[dict] = []
    if report is not None:
        rows = report.tasks
        size = page_size or page_size_of(rows, killed_pids[0] if killed_pids else None, victim_rss_bytes)
        if report.stats is not None:
            parts = {"source": "kmsg", "age_seconds": 0.0, **(breakdown(report.stats) or {})}
        elif report.meminfo is not None and size is not None:
            parts = {"source": "meminfo", "age_seconds": 0.0, **(breakdown(report.meminfo, size) or {})}
        if rows:  # (without a page size: ranked by pages, their bytes unknown)
            holders = top_holders(rows, size, killed_pids, limit_bytes)
            pools_ = pools(rows, size, killed_pids, limit_bytes)[:POOLS_KEPT]
    if parts is None and memory_stat is not None and (report is None or report.meminfo is None):
        stat, age = memory_stat
        parts = {"source": "memory.stat", "age_seconds": age, **(breakdown(stat) or {})}
    for h in holders:
        h["from"] = "task_table"
    from_kill_lines = kill_line_rows(killed) if (parts is None or not holders) and killed else []
    if parts is None:
        parts = kill_lines_breakdown(from_kill_lines)
    if not holders and from_kill_lines:
        holders = top_holders(from_kill_lines, _KIB, killed_pids, limit_bytes)
        pools_ = pools(from_kill_lines, _KIB, killed_pids, limit_bytes)[:POOLS_KEPT]
        for row in (*holders, *pools_):
            row["rss_pages"] = None  # (the kill lines count KiB, not pages)
        for h in holders:
            h["from"] = "kill_lines"
    sizes = {k: parts.get(k) for k in BREAKDOWN_KEYS} if parts else None
    if parts is not None and parts["source"] == "kill_lines":
        name, sentence = _kill_lines_verdict(sizes, holders, pools_, limit_bytes, advice)
    else:
        name, sentence = verdict(sizes, holders, pools_, limit_bytes, tmpfs_volumes, advice)
    if parts is not None and parts["source"] == "memory.stat" and name != "unknown":
        sentence = f"memory.stat read {parts['age_seconds']:.3g} s before the kill: {sentence}"
    return {"memory_breakdown": parts, "top_holders": holders, "pools": pools_, "verdict": name,
            "verdict_sentence": sentence}
