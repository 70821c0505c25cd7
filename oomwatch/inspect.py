"""`oomwatch inspect`: a one-shot, read-only report of this node's OOM posture, workloads and recent kills.

`build_report()` gathers the data (a plain dict, which is also the `--json` output); `render_text()` turns it
into an 80-column report. Nothing here parses kernel or cgroup text: that is done by the sources/parsers.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import time
from collections import Counter, deque
from typing import Any, Callable, Iterable, Optional

from oomwatch.config import Config
from oomwatch.correlator import is_within, oom_group_ancestor
from oomwatch.explain import explain, size
from oomwatch.holders import human_bytes
from oomwatch.model import CgroupStats, Incident, KmsgRecord
from oomwatch.events import CgroupAdded
from oomwatch.node import (
    NodePosture,
    cgroup_version_label,
    host_boot_time,
    is_workload_cgroup,
    node_layout,
    node_resolver,
    with_effective_oom_group,
)
from oomwatch.replay import LogReplay, saved_log_settings
from oomwatch.sources.cgroupfs import CgroupFS, Proc
from oomwatch.parse.kmsg import TextLogStats
from oomwatch.sources.kmsg import (
    SAVED,
    Garbled,
    KmsgUnavailable,
    Lost,
    kernel_log_kind,
    read_kernel_log,
    saved_log_verdict,
)
from oomwatch.reconcile import counted_incident, counted_since_creation
from oomwatch.timefmt import utc_seconds
from oomwatch.workloads import WorkloadResolver
from oomwatch.workloads.paths import CgroupLayout
from oomwatch.workloads.kubelet import read_kubelet_config

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")


def parse_since(text: str, now: float) -> float:
    """`--since`: a duration back from now (`30m`, `2h`, `1d`) or an ISO time (`2026-11-22T17:00:00`)."""
    m = _DURATION.match(text.strip())
    if m:
        return now - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    import datetime as dt

    try:
        value = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValueError(f"--since wants a duration like 30m, 2h, 1d or an ISO time, got {text!r}") from exc
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return value.timestamp()


def read_incidents(config: Config, resolver: WorkloadResolver, single: str, node_events: Iterable[Any] = (),
                   boot_id: str = "unknown", clock=time.time, tz=None,
                   on_incident: Optional[Callable[[Incident], None]] = None) -> tuple[list[Incident], dict]:
    """Every incident still in the kernel's ring buffer (or in the saved log), found by the agent's own pipeline
    (oomwatch.replay) after `node_events` (the cgroups found on this node, as events.CgroupAdded). Returns
    (incidents, reader health: what was read, understood and found). With `on_incident`, each incident goes
    there as it is found and none is kept (a log of a million kills). Raises KmsgUnavailable when the log cannot
    be read at all, or when a saved log holds nothing (empty input, or journalctl saying it found no journal)."""
    kind = kernel_log_kind(config.kmsg)
    live = kind != SAVED
    boot_time = config.boot_time if config.boot_time is not None else host_boot_time()
    health: dict[str, Any] = {"source": config.kmsg, "live": live, "records": 0, "lost": 0, "parse_errors": 0,
                              "suppressed_reports": 0}
    text_stats = TextLogStats()
    health["source"], items = read_kernel_log(config.kmsg, tz, text_stats)
    incidents: list[Incident] = []
    found = 0

    def take(incident: Incident) -> None:
        nonlocal found
        found += 1
        if on_incident is None:
            incidents.append(incident)
        else:
            on_incident(incident)

    settings = saved_log_settings(boot_id=boot_id if live else "saved-log", boot_time=boot_time,
                                  page_size=os.sysconf("SC_PAGE_SIZE") if live else None)
    replay = LogReplay(settings, resolver, now=clock(), on_incident=take, single_process_oom_kill=single)
    seen = {"wall_clock": False, "report_starts": 0, "first_garbled": None}

    def counted(items: Iterable[Any]) -> Iterable[Any]:
        """The items as read, noting what the reader's health says of them."""
        for item in items:
            if isinstance(item, KmsgRecord):
                seen["wall_clock"] = seen["wall_clock"] or item.wall_time is not None
                text = item.text
                if " invoked oom-killer: " in text or text.startswith("oom-kill:"):
                    seen["report_starts"] += 1  # reports that began, found or not
            elif isinstance(item, Lost):
                health["lost"] += item.count or 0
            elif isinstance(item, Garbled):
                health["parse_errors"] += 1
                if seen["first_garbled"] is None:
                    seen["first_garbled"] = item.raw[:200].decode("utf-8", "backslashreplace")
            yield item

    try:
        replay.run(node_events, counted(items))
    except OSError as exc:
        raise KmsgUnavailable(f"{config.kmsg}: {exc.strerror or exc}") from exc
    stats = replay.pipeline.correlator.stats
    first_error = seen["first_garbled"] or stats.first_parse_error
    wall_clock, report_starts = seen["wall_clock"], seen["report_starts"]
    if report_starts and not found:
        health["reports_without_kill"] = report_starts
    health["records"] = stats.records
    health["parse_errors"] += stats.parse_errors
    if stats.parse_errors:  # lines with OOM words the OOM parser could not read
        health["oom_lines_unread"] = stats.parse_errors
    health["first_parse_error"] = first_error
    health["suppressed_reports"] = stats.suppressed_reports
    health["oom_reports"] = found
    health["boot_time"] = boot_time
    if wall_clock:
        health["times_from"] = "log"
    elif config.boot_time is not None:
        health["times_from"] = "boot time given"
    else:  # the live log is this boot's; a saved one is assumed to be
        health["times_from"] = "this host's boot time"
    if not live:
        verdict = saved_log_verdict(config.kmsg, text_stats)
        if verdict is not None:
            raise KmsgUnavailable(verdict)
        health["text"] = {
            "lines": text_stats.lines, "kernel_records": text_stats.records, "formats": dict(text_stats.formats),
            "other_program_lines": text_stats.other, "comment_lines": text_stats.comments, "unreadable_lines": text_stats.garbled,
            "first_unreadable": text_stats.first_garbled, "cut_lines": text_stats.truncated,
            "guessed_years": sorted(text_stats.guessed_years), "unknown_dates": text_stats.unknown_dates,
            "first_unknown_date": text_stats.first_unknown_date,
        }
        if text_stats.decoded:  # what was undone before reading: "gzip", "UTF-16LE", "NUL"
            health["text"]["decoded"] = list(text_stats.decoded)
        health["parse_errors"] += text_stats.garbled
        if first_error is None:
            health["first_parse_error"] = text_stats.first_garbled
    return incidents, health


def _source_name(source: str) -> str:
    return "standard input" if source == "-" else source


_FORMAT_NAMES = {"kmsg": "raw kmsg", "bare": "without prefix"}
_DECODED = {"gzip": "decompressed (gzip)", "xz": "decompressed (xz)", "bzip2": "decompressed (bzip2)",
            "UTF-16LE": "converted from UTF-16LE", "UTF-16BE": "converted from UTF-16BE", "NUL": "NUL bytes removed"}


def reader_summary(kmsg: dict) -> str:
    """One sentence: what the kernel-log reader read, understood and found."""
    reports = kmsg.get("oom_reports", 0)
    found = f"{reports} OOM report{'' if reports == 1 else 's'} found"
    text = kmsg.get("text")
    if text is None:
        return f"{kmsg['source']}: {kmsg['records']} records read, {found}."
    formats = ", ".join(f"{_FORMAT_NAMES.get(name, name)} {n}"
                        for name, n in sorted(text["formats"].items(), key=lambda kv: -kv[1]))
    decoded = ", ".join(_DECODED.get(step, step) for step in text.get("decoded", []))
    parts = [f"{_source_name(kmsg['source'])}: " + (f"{decoded}; " if decoded else "")
             + f"{text['lines']} lines read, {text['kernel_records']} kernel records understood"
             + (f" ({formats})" if formats else "")]
    if text["other_program_lines"]:
        n = text["other_program_lines"]
        parts.append(f"{n} line{'' if n == 1 else 's'} of other programs skipped")
    if text["comment_lines"]:
        parts.append(f"{text['comment_lines']} comment line{'' if text['comment_lines'] == 1 else 's'} skipped")
    if text["unreadable_lines"]:
        parts.append(f"{text['unreadable_lines']} unreadable")
    return "; ".join(parts) + f"; {found}."


def reader_warnings(kmsg: Optional[dict]) -> list[str]:
    """What the user must be told on stderr: input read but not (fully) understood."""
    if not kmsg or kmsg.get("error"):
        return []
    warnings = []
    text = kmsg.get("text") or {}
    if not kmsg.get("records"):
        warnings.append(f"no kernel log records in {_source_name(kmsg['source'])}"
                        + (f" (first line not understood: {text['first_unreadable']!r})"
                           if text.get("first_unreadable") else ""))
    elif kmsg.get("parse_errors"):
        n, oom = kmsg["parse_errors"], kmsg.get("oom_lines_unread", 0)
        warnings.append(f"{n} line{'' if n == 1 else 's'} could not be read"
                        + (f" ({oom} of them {'looks' if oom == 1 else 'look'} like OOM killer lines)" if oom else "")
                        + f"; first: {kmsg['first_parse_error']!r}")
    if (text and not kmsg.get("oom_reports") and not kmsg.get("oom_lines_unread")
            and text["formats"].get("bare", 0) == text["kernel_records"] > 0):
        warnings.append("no line has a kernel log prefix (dmesg, journalctl, syslog), and none is an OOM line: "
                        "is this a kernel log?")
    if kmsg.get("reports_without_kill"):
        n = kmsg["reports_without_kill"]
        warnings.append(f"{n} line{'' if n == 1 else 's'} of an OOM report (`invoked oom-killer`, `oom-kill:`) "
                        f"{'is' if n == 1 else 'are'} in the log, but no kill line follows: was the log cut?")
    if text.get("cut_lines"):
        warnings.append(f"{text['cut_lines']} lines longer than 64 KiB were cut")
    return warnings


def _headroom(limit: Optional[float], usage: Optional[int]) -> Optional[float]:
    if limit is None or usage is None or math.isinf(limit):
        return None
    return limit - usage


def _risk(row: dict) -> tuple:
    events = row.get("events") or {}
    limit, usage = row.get("limit_bytes"), row.get("usage_bytes")
    ratio = usage / limit if limit and usage is not None and not math.isinf(limit) else 0.0
    return (-(events.get("oom_kill", 0) + events.get("oom_group_kill", 0)), -events.get("oom", 0), -ratio,
            -(events.get("max", 0)), row["cgroup"])


# "At risk": a finite limit with at least this share of it used, or any full memory stall in the last minute.
AT_RISK_SHARE = 0.8
# A kernel kill this long before a container's new run began can be what ended the previous run (the kubelet's
# CrashLoopBackOff waits at most 5 minutes before it restarts a container).
RESTART_AFTER_KILL_SECONDS = 600.0


def _pressure_json(stats: CgroupStats) -> Optional[dict[str, Optional[float]]]:
    p = stats.pressure
    if p is None:
        return None
    return {f"{kind}_{field}": getattr(line, field) if line is not None else None
            for kind, line in (("some", p.some), ("full", p.full)) for field in ("avg10", "avg60")}


def at_risk(row: dict, stats: CgroupStats) -> Optional[dict[str, Any]]:
    """A workload near its limit or stalled on memory, with the reason in one line; None for the others.
    The working set (memory.current less inactive file pages, as the kubelet counts it) is measured against
    memory.max; where memory.stat is unreadable, memory.current is."""
    limit = stats.limit_bytes
    used, measure = ((stats.working_set_bytes, "working set") if stats.working_set_bytes is not None
                     else (stats.usage_bytes, "usage"))
    if limit is None or math.isinf(limit) or not limit or used is None:
        return None
    pressure = _pressure_json(stats)
    full = max((pressure or {}).get("full_avg10") or 0.0, (pressure or {}).get("full_avg60") or 0.0)
    share = used / limit
    if share < AT_RISK_SHARE and not full:
        return None
    parts = [f"{measure} {size(used)} of {size(limit)} ({share:.0%}), {size(max(0.0, limit - used))} free"]
    if pressure is None:
        parts.append("pressure unknown (no memory.pressure: PSI off)")
    else:
        parts.append(f"stalled on memory {pressure['some_avg10'] or 0:.1f}% (some) / "
                     f"{pressure['full_avg10'] or 0:.1f}% (full) of the last 10 s")
    hits = (stats.events or {}).get("max", 0)
    if hits:
        parts.append(f"limit hit {hits} time{'s' if hits != 1 else ''}")
    return {"cgroup": row["cgroup"], "name": row["name"], "limit_bytes": limit, "measure": measure,
            "used_bytes": used, "headroom_bytes": max(0.0, limit - used), "pressure": pressure,
            "reason": "; ".join(parts)}


def restart_count(pod_log_dir: str, workload: dict) -> Optional[int]:
    """How many times the kubelet restarted a container, from its log files (`<pod log dir>/<namespace>_<pod>_
    <uid>/<container>/<restart count>.log`, rotated ones `N.log.<date>`); None when they cannot be read."""
    ns, pod, uid, name = (workload.get(k) for k in ("namespace", "pod", "pod_uid", "container"))
    if not (ns and pod and uid and name):
        return None
    try:
        files = os.listdir(os.path.join(pod_log_dir, f"{ns}_{pod}_{uid}", name))
    except OSError:
        return None
    counts = [int(f.split(".", 1)[0]) for f in files if f.split(".", 1)[0].isdigit() and ".log" in f]
    return max(counts) if counts else None


def restart_cause(restarts: int, run_started: float, kills: list[tuple[float, str]],
                  log_readable: bool) -> dict[str, Any]:
    """Whether a container's last restart followed an OOM kill: the last kernel-log kill of the container
    before its current run (cgroup) began, within RESTART_AFTER_KILL_SECONDS. `kills`: (time, victim) of the
    container's incidents in the kernel log."""
    began = utc_seconds(run_started)
    out: dict[str, Any] = {"restarts": restarts, "run_started": began, "oom_kill": None, "kill_time": None}
    before = [k for k in kills if k[0] <= run_started]
    if not log_readable:
        out["why"] = f"restarted {restarts}x, current run since {began}; unknown why: the kernel log is unreadable"
        return out
    last = max(before) if before else None
    if last is not None and run_started - last[0] <= RESTART_AFTER_KILL_SECONDS:
        out.update(oom_kill=True, kill_time=utc_seconds(last[0]))
        out["why"] = (f"restarted {restarts}x; the last restart followed an OOM kill ({last[1]} killed at "
                      f"{out['kill_time']}, {run_started - last[0]:.0f} s before the current run began)")
    else:
        out["oom_kill"] = False
        out["why"] = (f"restarted {restarts}x; no OOM kill of it in the kernel log in the 10 minutes before the "
                      f"current run began ({began}): not an OOM kill, unless the log no longer reaches back")
    return out


def _matches(target: Optional[str], container: Optional[str], workload: dict, cgroup: Optional[str]) -> bool:
    if container and workload.get("container") != container:
        return False
    if not target:
        return True
    if target.startswith("/"):
        return bool(cgroup) and is_within(cgroup, target.rstrip("/") or "/")
    ns, sep, pod = target.partition("/")
    if sep:
        return workload.get("namespace") == ns and workload.get("pod") == pod
    return workload.get("pod") == target or workload.get("container") == target


def build_report(config: Config, *, target: Optional[str] = None, container: Optional[str] = None,
                 since: Optional[float] = None, node_view: bool = True, clock=time.time, tz=None,
                 limit: Optional[int] = None, since_label: Optional[str] = None) -> dict[str, Any]:
    """The report as data. `node_view=False` (a saved log from elsewhere) skips this host's posture and
    workloads: they would describe the wrong node. `tz`: the zone of a saved log's dates printed without one
    (default: this machine's); `limit`: show at most this many incidents (the rest are summed up by workload);
    `since_label`: `since` as the user wrote it, for the filter line."""
    proc = Proc(config.proc)
    fs = CgroupFS(config.cgroup_root)
    notes: list[str] = []
    # On a live node, identities as the agent gives them: Kubernetes ones only below the kubelet's cgroupRoot.
    layout = node_layout(config.kubelet_config) if node_view else CgroupLayout()
    resolver = node_resolver(config, layout)
    posture = NodePosture(config, proc)
    single = posture.single_process_oom_kill() if node_view else "unknown"
    report: dict[str, Any] = {"node": None, "workloads": [], "incidents": [], "kmsg": None, "notes": notes}

    found_cgroups: list[CgroupAdded] = []  # the node's cgroups, for the pipeline that reads the kernel log
    if node_view:
        version = posture.cgroup_version
        fields = fs.memory_event_fields() if os.path.isdir(config.cgroup_root) else ()
        policy = read_kubelet_config(config.kubelet_config)
        rows = []
        containers = containers_grouped = 0
        paths = list(fs.walk()) if os.path.isdir(config.cgroup_root) else []
        counted: dict[str, tuple[int, dict[str, int], Optional[int]]] = {}
        risks: list[dict[str, Any]] = []
        restarted: list[tuple[dict, int, float]] = []  # (row, restart count, run start)
        for path in paths:  # containers first: their bundles name their pods too
            resolver.container_appeared(path)
        for path in paths:
            workload = resolver.resolve(path)
            stats = fs.read_stats(path, with_pids=True)
            if stats is None:
                continue
            try:
                ino: Optional[int] = os.stat(fs.abspath(path)).st_ino
            except OSError:
                ino = None  # gone meanwhile
            if stats.events_local is not None and ino is not None:
                counted[path] = (ino, stats.events_local, stats.oom_group)
            # the cgroup as the agent's cgroup source would hand it to the pipeline (names: read above)
            limited = stats.limit_bytes is not None and not math.isinf(stats.limit_bytes)
            found_cgroups.append(CgroupAdded(path, ino, stats.events_local, stats.oom_group, limited, stats.pids))
            if workload.type == "k8s-container" and workload.cgroup == path and not workload.sandbox:
                containers += 1
                containers_grouped += stats.oom_group == 1
            if not is_workload_cgroup(path, workload, stats):
                continue
            stats = with_effective_oom_group(fs, workload, stats)
            rows.append({
                "cgroup": path,
                "workload": workload.to_json(),
                "name": workload.display_name(),
                "oom_group": stats.oom_group,
                "limit_bytes": stats.limit_bytes,
                "usage_bytes": stats.usage_bytes,
                "peak_bytes": stats.peak_bytes,
                "headroom_bytes": _headroom(stats.limit_bytes, stats.usage_bytes),
                "events": {k: v for k, v in (stats.events or {}).items()
                           if k in ("max", "high", "oom", "oom_kill", "oom_group_kill")},
            })
            risk = at_risk(rows[-1], stats)
            if risk is not None:
                risks.append(risk)
            restarts = restart_count(config.pod_log_dir, rows[-1]["workload"]) if workload.container else None
            if restarts:
                try:  # a restart makes a new cgroup: its creation is the current run's start
                    restarted.append((rows[-1], restarts, os.stat(fs.abspath(path)).st_ctime))
                except OSError:
                    pass
        rows.sort(key=_risk)
        report["workloads"] = [r for r in rows if _matches(target, container, r["workload"], r["cgroup"])]
        shown_cgroups = {r["cgroup"] for r in report["workloads"]}
        report["at_risk"] = sorted((r for r in risks if r["cgroup"] in shown_cgroups),
                                   key=lambda r: (r["headroom_bytes"] / r["limit_bytes"], r["cgroup"]))
        share = containers_grouped / containers if containers else None
        mismatch = None
        if single == "false" and containers and containers_grouped < containers:
            mismatch = (f"the kubelet asks for group kills, but {containers - containers_grouped} of {containers} "
                        "container cgroups have memory.oom.group=0 (a runtime that ignores the request, or "
                        "containers started before the kubelet changed)")
        elif single == "true" and containers_grouped:
            mismatch = (f"singleProcessOOMKill=true, yet {containers_grouped} of {containers} container cgroups "
                        "have memory.oom.group=1")
        report["node"] = {
            "kernel": posture.kernel,
            "cgroup_version": cgroup_version_label(version),
            "memory_events_fields": list(fields),
            "oom_group_kill_counted": "oom_group_kill" in fields,
            "kubelet_config": config.kubelet_config,
            "kubelet_config_readable": policy is not None and policy.error is None,
            "single_process_oom_kill": single,
            "container_cgroups": containers,
            "container_cgroups_oom_group": containers_grouped,
            "oom_group_share": share,
            "mismatch": mismatch,
        }
        if version in ("v1", "hybrid"):
            v1_memory = os.path.join(config.cgroup_root, "memory")
            notes.append(f"memory is on cgroup v1 here ({version} hierarchy): oomwatch reads cgroup v2 files only, "
                         f"so the v1 memory tree ({v1_memory}) is not read: workloads have no limits, usage or "
                         "memory.events counts here. OOM kills are still explained from the kernel log, and each "
                         "is a single-process kill (memory.oom.group is a cgroup v2 feature).")
        elif version == "none":
            notes.append(f"no cgroup hierarchy found at {config.cgroup_root}: workloads cannot be shown.")
        if fields and "oom_group_kill" not in fields:
            notes.append("this kernel's memory.events has no oom_group_kill (added in 5.17): group kills are "
                         "told apart from the kernel log only.")
        if os.geteuid() != 0:
            notes.append("not running as root: some cgroups and the kernel log may be unreadable; what is "
                         "readable is shown.")

    shown = _Selection(target, container, since, limit)
    reconciler = None
    if node_view and kernel_log_kind(config.kmsg) != SAVED and counted:
        # The kernel's counters are the count of record: kills they show that the ring no longer describes.
        boot = config.boot_time if config.boot_time is not None else host_boot_time()
        reconciler = counted_since_creation(
            {path: (ino, local, oom_group_ancestor(path, None, lambda p: counted.get(p, (0, {}, 0))[2] == 1)
                    is not None) for path, (ino, local, _) in counted.items()},
            lambda **kw: counted_incident(boot_id=proc.boot_id(), detected_at=clock(), resolve=resolver.resolve,
                                          scope_of=resolver.layout.scope_of, explain=lambda i: explain(i, single),
                                          **kw),
            since=boot)

    container_kills: dict[tuple, list[tuple[float, str]]] = {}

    def offer(incident: Incident) -> None:
        if reconciler is not None:
            reconciler.account(incident)
        shown.offer(incident)
        for w in incident.workloads or (incident.workload,):
            if w is not None and w.container:
                victim = incident.victim.comm if incident.victim is not None else "a process"
                container_kills.setdefault((w.namespace, w.pod, w.container), []).append((incident.time, victim))

    try:
        _, health = read_incidents(config, resolver, single, found_cgroups, boot_id=proc.boot_id(), clock=clock,
                                   tz=tz, on_incident=offer)
        if reconciler is not None:
            found = reconciler.reconcile(clock(), log_drained_at=clock())
            for incident in found:
                shown.offer(incident)
            if found:
                notes.append(f"{len(found)} OOM kill{'' if len(found) == 1 else 's'} counted by the kernel's memory.events "
                             f"{'is' if len(found) == 1 else 'are'} no longer in "
                             "the kernel log (its ring buffer overwrote them): shown with their cgroup and kind, "
                             "without process details.")
        report["kmsg"] = health
    except KmsgUnavailable as exc:
        report["kmsg"] = {"source": config.kmsg, "error": str(exc)}
        notes.append(f"cannot read the kernel log: {exc}. Recent incidents are not shown; the node posture and "
                     "workloads above are.")
    boot = (report["kmsg"] or {}).pop("boot_time", None)
    # A saved log without wall-clock times from an unknown boot: its kills' dates cannot be known (the host's
    # boot time would make them up, a 2019 log dated in 2027); they are shown as seconds since that boot.
    times_unknown = (boot is not None and not report["kmsg"].get("live")
                     and report["kmsg"].get("times_from") == "this host's boot time")
    if shown.in_log and times_unknown:
        notes.append("this log carries no wall-clock times: each kill is shown by its time since its boot; pass "
                     "--boot-time (when that boot began) to see dates.")
    if shown.in_log and times_unknown and since is not None:
        notes.append("--since was compared with times counted from this host's boot (the log carries no dates, "
                     "and its boot is not known): pass --boot-time for a filter by date.")
    years = ((report["kmsg"] or {}).get("text") or {}).get("guessed_years")
    if years:
        notes.append(f"this log's dates carry no year: {'/'.join(map(str, years))} was assumed (the latest year in "
                     "which each date is not in the future).")
    text = (report["kmsg"] or {}).get("text") or {}
    if text.get("unknown_dates"):  # kept, never dropped: a kill there is shown without its time
        n = text["unknown_dates"]
        notes.append(f"{n} line{'' if n == 1 else 's'} of this log carried a date oomwatch cannot read (the first: "
                     f"{text['first_unknown_date']!r}): kept, with no time.")
    if report["kmsg"] and report["kmsg"].get("lost"):
        notes.append(f"{report['kmsg']['lost']} kernel log records were lost (overwritten) before they could be read.")
    since_shown = since_label or (utc_seconds(since) if since is not None else None)
    filters = [f for f in (target, container and f"--container {container}",
                           since is not None and f"--since {since_shown}") if f]
    report["filter"] = {"filters": filters, "in_log": shown.in_log, "matching": shown.matching}
    if shown.hidden:
        report["not_shown"] = {"count": sum(shown.hidden.values()),
                               "by_workload": dict(shown.hidden.most_common())}
    report["incidents"] = [_incident_json(i, boot if times_unknown else None)
                           for i in reversed(shown.newest)]  # newest first
    if node_view and restarted:
        readable = not (report["kmsg"] or {}).get("error")
        report["restarts"] = []
        for row, restarts, started in restarted:
            if row["cgroup"] not in {r["cgroup"] for r in report["workloads"]}:
                continue
            w = row["workload"]
            kills = container_kills.get((w.get("namespace"), w.get("pod"), w.get("container")), [])
            report["restarts"].append({"cgroup": row["cgroup"], "name": row["name"],
                                       **restart_cause(restarts, started, kills, readable)})
    report["warnings"] = reader_warnings(report["kmsg"])
    return report


def _incident_json(incident: Incident, unknown_boot: Optional[float]) -> dict[str, Any]:
    """The incident as JSON; with `unknown_boot` (the boot time assumed for a log that has none) its time
    is not a date but `since_boot_seconds`."""
    out = incident.to_json()
    if unknown_boot is not None:
        out["time"] = None
        out["since_boot_seconds"] = round(incident.time - unknown_boot, 6) if incident.time_known else None
    return out


class _Selection:
    """The incidents a report shows, taken as they are found: those that match the filters, at most `limit`
    of them (the newest), and the older ones counted by workload, so that no log grows the report."""

    def __init__(self, target: Optional[str], container: Optional[str], since: Optional[float],
                 limit: Optional[int]) -> None:
        self.target, self.container, self.since = target, container, since
        self.newest: deque[Incident] = deque(maxlen=limit or None)
        self.hidden: Counter[str] = Counter()
        self.in_log = self.matching = 0

    def offer(self, incident: Incident) -> None:
        self.in_log += 1
        if not self._matches(incident):
            return
        self.matching += 1
        if self.newest.maxlen is not None and len(self.newest) == self.newest.maxlen:
            older = self.newest[0]
            name = older.workload.display_name() or older.victim.cgroup or older.oom_cgroup
            self.hidden[name or "cgroup unknown"] += 1
        self.newest.append(incident)

    def _matches(self, incident: Incident) -> bool:
        if self.since is not None and incident.time < self.since:
            return False
        target, container = self.target, self.container
        if not target and not container:
            return True
        cgroups = [p.cgroup for p in incident.killed]
        return any(_matches(target, container, w.to_json(), w.cgroup or c)
                   for w, c in zip(incident.workloads or (incident.workload,), cgroups)) or any(
            _matches(target, container, incident.workload.to_json(), c) for c in cgroups)


# --- text rendering -----------------------------------------------------------------------------------


class Style:
    def __init__(self, color: bool) -> None:
        self.color = color

    def _c(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.color else text

    def bold(self, text: str) -> str:
        return self._c("1", text)

    def red(self, text: str) -> str:
        return self._c("31", text)

    def yellow(self, text: str) -> str:
        return self._c("33", text)


# Longest text wrapped: textwrap's cost grows faster than linearly with the length of a word, and nothing a
# person reads in a terminal is longer (names and paths are already bounded by the parsers).
_WRAP_MAX = 4000


_GLUE = "\ue000"  # stands for a space that must not break a line (a private-use character, never in input)
_BACKTICKED = re.compile(r"`[^`\n]{1,200}`")


def _wrap(text: str, width: int, indent: str = "  ", keep: Iterable[Optional[str]] = ()) -> list[str]:
    """Lines of at most `width` columns where words allow. Never broken, whatever the width (what a person
    copies must survive it): a word (paths, cgroups: not at their hyphens, nor when longer than a line),
    each of `keep` (names with spaces), and a `command` in backticks."""
    import textwrap

    if len(text) > _WRAP_MAX:
        text = text[:_WRAP_MAX] + "…"
    if _GLUE in text:
        text = text.replace(_GLUE, " ")
    for phrase in sorted({k for k in keep if k and " " in k}, key=len, reverse=True):
        text = text.replace(phrase, phrase.replace(" ", _GLUE))
    text = _BACKTICKED.sub(lambda m: m.group(0).replace(" ", _GLUE), text)
    lines = textwrap.wrap(text, width=width, initial_indent=indent, subsequent_indent=indent + "  ",
                          break_on_hyphens=False, break_long_words=False) or [indent]
    return [line.replace(_GLUE, " ") for line in lines]


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"


def render_text(report: dict[str, Any], color: bool = False, width: int = 80) -> str:
    s = Style(color)
    out: list[str] = []
    node = report.get("node")
    if node is not None:
        out.append(s.bold("Node"))
        out.append(f"  kernel {node['kernel']}, cgroup v{node['cgroup_version']}"
                   if node["cgroup_version"] in ("1", "2") else
                   f"  kernel {node['kernel']}, cgroup {node['cgroup_version']}")
        fields = node["memory_events_fields"]
        if fields:
            out.append(f"  memory.events: {' '.join(fields)}")
        single = node["single_process_oom_kill"]
        policy = {"false": "group kill (singleProcessOOMKill false or unset)",
                  "true": "single-process kill (singleProcessOOMKill=true)",
                  "unknown": "unknown (kubelet config not readable at " + node["kubelet_config"] + ")"}[single]
        out.extend(_wrap(f"kubelet OOM policy: {policy}", width))
        if node["container_cgroups"]:
            pct = round(100 * node["oom_group_share"])
            out.append(f"  containers with memory.oom.group=1: {node['container_cgroups_oom_group']} of "
                       f"{node['container_cgroups']} ({pct}%)")
        if node["mismatch"]:
            out.extend(_wrap(s.yellow("mismatch: " + node["mismatch"]), width))
        out.append("")
    for note in report.get("notes", []):
        out.extend(_wrap(s.yellow("note: ") + note, width, indent=""))
    if report.get("notes"):
        out.append("")
    if node is not None:
        rows = report["workloads"]
        out.append(s.bold(f"Workloads ({len(rows)})"))
        if rows:
            out.append(f"  {'WORKLOAD':<26} {'GRP':>3} {'LIMIT':>8} {'USAGE':>8} {'PEAK':>8} {'FREE':>8} "
                       f"{'OOMS':>4} {'KILLS':>5}")
            for r in rows:
                ev = r["events"]
                out.append(
                    f"  {_fit(r['name'], 26):<26} {'-' if r['oom_group'] is None else r['oom_group']:>3} "
                    f"{_size_cell(r['limit_bytes']):>8} {_size_cell(r['usage_bytes']):>8} "
                    f"{_size_cell(r['peak_bytes']):>8} {_size_cell(r['headroom_bytes']):>8} "
                    f"{ev.get('oom', 0):>4} {ev.get('oom_kill', 0):>5}")
            out.extend(_wrap("GRP: memory.oom.group; FREE: limit - usage; OOMS, KILLS: the cgroup's "
                             "memory.events oom (its limit was hit and the OOM killer ran) and oom_kill "
                             "(processes killed in it or below), since it was created", width))
        else:
            out.append("  none found")
        out.append("")
        risks = report.get("at_risk", [])
        out.append(s.bold(f"At risk ({len(risks)}, least headroom first)"))
        for r in risks:
            out.extend(_wrap(f"{s.yellow(r['name'])}: {r['reason']}", width))
        if not risks:
            out.extend(_wrap(f"none: no workload uses {AT_RISK_SHARE:.0%} of its limit or stalls on memory", width))
        out.append("")
    if report.get("restarts"):
        out.append(s.bold("Restarted containers"))
        for r in report["restarts"]:
            out.extend(_wrap(f"{r['name']}: {r['why']}", width))
        out.extend(_wrap("inspect sees the current run's cgroup and the kernel log only: the ended run's cgroup "
                         "(its memory.events) is gone, and Kubernetes' own reason is in `kubectl describe pod`",
                         width))
        out.append("")
    incidents = report["incidents"]
    kmsg = report.get("kmsg") or {}
    filt = report.get("filter") or {}
    not_shown = report.get("not_shown")
    heading = f"Recent OOM kills ({len(incidents)}"
    if not_shown:
        heading += f" of {len(incidents) + not_shown['count']}"
    out.append(s.bold(heading + ", newest first)"))
    if kmsg.get("source") and not kmsg.get("error"):
        out.extend(_wrap("kernel log: " + reader_summary(kmsg), width, keep=[_source_name(kmsg["source"])]))
    if filt.get("filters") and filt["matching"] < filt["in_log"]:
        n = filt["in_log"]
        out.extend(_wrap(f"{n} kill{'' if n == 1 else 's'} in the log, {filt['matching']} match"
                         f"{'es' if filt['matching'] == 1 else ''} {' '.join(filt['filters'])}", width,
                         keep=filt["filters"]))
    if not incidents:
        if kmsg.get("error"):
            out.append("  unknown (kernel log unreadable)")
        elif not filt.get("in_log"):
            out.append("  none in the kernel log")
    for inc in incidents:
        killed = inc["killed"]
        when = (utc_seconds(_epoch(inc["time"])) if inc["time"] is not None
                else f"{inc['since_boot_seconds']:.6f} s after boot" if inc.get("since_boot_seconds") is not None
                else "time not in the log")
        tag = s.red("GROUP") if inc["kind"] == "group" else "single"
        if inc.get("evidence") == "memory.events":  # counted by the kernel, no longer in its log: no pids
            out.append(f"  {when}  {tag} kill, scope {inc['scope']}, counted from memory.events")
            out.extend(_wrap(inc["explanation"], width, indent="    ", keep=_names_in(inc)))
            continue
        seen = " (known only from the oom_reaper line)" if inc.get("evidence") == "oom_reaper" else ""
        out.append(f"  {when}  {tag} kill, scope {inc['scope']}, {len(killed)} killed{seen}")
        out.extend(_wrap(inc["explanation"], width, indent="    ", keep=_names_in(inc)))
        pids = ", ".join(f"{p['comm']}({p['pid']})" for p in killed)
        out.extend(_wrap(f"killed: {pids}", width, indent="    "))
        for line in held_lines(inc):
            out.extend(_wrap(line, width, indent="    "))
        if inc.get("exiting"):
            ex = ", ".join(f"{p['comm']}({p['pid']})" for p in inc["exiting"])
            out.extend(_wrap(f"already exiting, died with it: {ex}", width, indent="    "))
        if inc.get("died_with"):
            pids = ", ".join(str(p["pid"]) for p in inc["died_with"])
            out.extend(_wrap(f"also died by SIGKILL, unlogged (proc connector): pids {pids}", width, indent="    "))
    if not_shown:
        parts = ", ".join(f"{name} {n}" for name, n in not_shown["by_workload"].items())
        out.extend(_wrap(f"{not_shown['count']} older kills not shown (--limit); by workload: {parts}", width))
    return "\n".join(out) + "\n"


_BREAKDOWN_SHOWN = (("anon_bytes", "anon"), ("file_bytes", "file"), ("shmem_bytes", "shmem (tmpfs)"),
                    ("kernel_bytes", "kernel"), ("sock_bytes", "sock"), ("unevictable_bytes", "unevictable"))


def held_lines(inc: dict) -> list[str]:
    """What held the memory at the kill (issue 21), in two lines at most: the breakdown's non-zero parts, then
    the largest processes and pools of same-named ones; or that the log does not say. The verdict's sentence
    is in the explanation."""
    parts, holders, pools = inc.get("memory_breakdown"), inc.get("top_holders") or [], inc.get("pools") or []
    if parts is None and not holders:
        return ["what held the memory: not in the log (its report was ratelimited or lost)"]
    out = []
    if parts is not None:
        where = {"kmsg": "the kernel's stats", "meminfo": "the node's counters",
                 "kill_lines": "the kill lines: the killed processes only"}.get(
            parts.get("source"), f"memory.stat {parts.get('age_seconds')} s before")
        sizes = ", ".join(f"{name} {human_bytes(parts[key])}" for key, name in _BREAKDOWN_SHOWN if parts.get(key))
        dirty = (parts.get("file_dirty_bytes") or 0) + (parts.get("file_writeback_bytes") or 0)
        out.append(f"memory at the kill ({where}): {sizes or 'nothing charged'}"
                   + (f" ({human_bytes(dirty)} of file dirty or under writeback)" if dirty else ""))
    named = [f"{h['comm']}({h['pid']}) " + (human_bytes(h["rss_bytes"]) if h.get("rss_bytes") is not None
                                            else f"{h['rss_pages']} pages")
             + (" killed" if h.get("killed") else "")
             for h in holders if h.get("rss_bytes") is not None or h.get("rss_pages") is not None]
    pooled = [f"{p['processes']} × {p['comm']} {human_bytes(p['rss_bytes'])}" for p in pools
              if p.get("rss_bytes") is not None]
    if named or pooled:
        which = "largest killed" if holders and holders[0].get("from") == "kill_lines" else "largest"
        out.append(f"{which}: " + "; ".join(x for x in (", ".join(named), ", ".join(pooled)) if x))
    return out


def _names_in(inc: dict) -> list[Optional[str]]:
    """What an incident's sentence may name that holds spaces: workloads' names (`ml/train-0 trainer`),
    cgroups, processes."""
    names: list[Optional[str]] = [inc.get("oom_cgroup"), inc.get("group_cgroup")]
    for p in inc.get("killed") or []:
        names += [p.get("cgroup"), p.get("comm")]
    from oomwatch.model import Workload

    try:
        names.append(Workload(**{"cgroup": "", **inc["workload"]}).display_name())
    except (TypeError, KeyError):
        pass
    return names


def _size_cell(n: Optional[float]) -> str:
    if n is None:
        return "-"
    return "max" if n == float("inf") else size(n)


def _epoch(iso: str) -> float:
    from oomwatch.timefmt import parse_iso8601

    return parse_iso8601(iso)


def terminal_width() -> int:
    return min(100, shutil.get_terminal_size((80, 24)).columns)


__all__ = ["build_report", "render_text", "parse_since", "read_incidents"]
