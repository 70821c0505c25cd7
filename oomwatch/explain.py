"""Incident → one plain sentence a person can act on."""

from __future__ import annotations

from typing import Optional

from oomwatch.model import Incident, KilledProcess
from oomwatch.workloads import kubepods_level


def size(n: Optional[float]) -> str:
    """Bytes in MiB/GiB, as operators size limits; below 1 MiB in KiB, below 1 KiB in bytes (never "0 MiB")."""
    if n is None:
        return "?"
    if n == float("inf"):
        return "unlimited"
    if n < 1 << 10:
        return f"{int(n)} B"
    if n >= 1 << 30:
        value, unit = n / (1 << 30), "GiB"
    elif n >= 1 << 20:
        value, unit = n / (1 << 20), "MiB"
    else:
        value, unit = n / (1 << 10), "KiB"
    text = f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{text} {unit}"


def _proc(p: KilledProcess) -> str:
    return f"{p.comm} (pid {p.pid})"


def _others(procs: tuple[KilledProcess, ...], limit: int = 3) -> str:
    names = [p.comm for p in procs[:limit]]
    if len(procs) > limit:
        names.append(f"{len(procs) - limit} more")
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]


def explain(incident: Incident, single_process_oom_kill: str = "unknown") -> str:
    sentence = _explain(incident, single_process_oom_kill)
    if incident.partial:
        sentence += (" (The kernel log lost the start of this report: its records were overwritten before they "
                     "could be read, so the first process named may not be the one the kernel chose.)")
    if incident.died_with:
        n = len(incident.died_with)
        sentence += (f" {n} more process{'es' if n > 1 else ''} of {incident.group_cgroup} died with it by SIGKILL "
                     "without a kernel log line (seen by the proc connector).")
    if incident.verdict_sentence and (incident.verdict != "unknown"
                                      or (incident.memory_breakdown or {}).get("source") == "kill_lines"):
        sentence += f" What held the memory: {incident.verdict_sentence}."
    return sentence


def _counted(incident: Incident) -> str:
    """A kill the kernel counted in memory.events while no log record still describes it."""
    from oomwatch.timefmt import iso8601

    who = incident.workload.display_name() or incident.group_cgroup or "a cgroup"
    window = ""
    if incident.window_start is not None:
        window = f" between {iso8601(incident.window_start)} and {iso8601(incident.time)}"
    if incident.kind == "group":
        what = (f"{who}: the kernel group-killed its processes{window} (memory.events oom_group_kill moved, "
                "memory.oom.group=1)")
    else:
        what = f"{who}: the kernel OOM-killed a process{window} (memory.events oom_kill moved)"
    return (what + "; the kernel log no longer describes this kill (its records were overwritten before "
            "they could be read, or the agent was not running), so which processes died is unknown.")


def _explain(incident: Incident, single_process_oom_kill: str) -> str:
    if incident.evidence == "memory.events":
        return _counted(incident)
    w = incident.workload
    victim = incident.victim
    if incident.kind == "single" and incident.oom_cgroup is None and not victim.cgroup and not w.cgroup:
        # A log that names no cgroup (kill lines alone, or a kernel before 4.19 without its `Task in` line):
        # whether a limit or the node ran out is not known, nor what the rest of the workload did.
        return (f"{_proc(victim)} was killed by the OOM killer; the log does not say which cgroup's limit was "
                "hit, or whether the node itself ran out of memory.")
    who = w.display_name() if w.cgroup or w.pod else (victim.cgroup or "an unknown cgroup")
    limit = incident.memory["limit_bytes"] if incident.memory else None
    limit_text = f"its {size(limit)} limit" if limit else "its memory limit"
    collateral = incident.collateral
    group_note = ""
    if incident.kind == "group":
        if incident.group_cgroup == w.cgroup:
            on = "the container" if w.type == "k8s-container" else "its cgroup"
        elif w.pod_cgroup and incident.group_cgroup == w.pod_cgroup:
            on = "the pod"
        else:
            on = incident.group_cgroup
        if collateral:
            group_note = f"memory.oom.group=1 on {on} also killed {_others(collateral)}"
        else:
            group_note = f"memory.oom.group=1 on {on} was set, but no other process was left to kill"

    if (incident.trigger or {}).get("order") == -1:
        # order=-1: no allocation failed; sysrq-f (`echo f > /proc/sysrq-trigger`) asked for one kill.
        sentence = (f"A manual OOM kill (sysrq f: `echo f > /proc/sysrq-trigger` or Alt+SysRq+F), not a "
                    f"shortage: the kernel chose {_proc(victim)} of {who}")
        sentence += f", and {group_note}." if group_note else "."
        return sentence + " Find who triggered it (nothing needs more memory because of it)."
    if incident.constraint == "cpuset":
        sentence = (f"The memory nodes {who}'s cpuset allows (cpuset.mems) ran out, not the whole node and no "
                    f"cgroup limit; the kernel chose {_proc(victim)}")
        sentence += f", and {group_note}." if group_note else "."
        return sentence + " Give the cpuset more memory nodes or lower what runs in it."
    if incident.constraint == "mempolicy":
        sentence = (f"The NUMA nodes {_proc(victim)}'s memory policy binds it to (mbind, set_mempolicy, "
                    f"numactl --membind) ran out, not the whole node and no cgroup limit; the kernel chose "
                    f"{_proc(victim)} of {who}")
        sentence += f", and {group_note}." if group_note else "."
        return sentence + " Widen the memory policy or lower the usage on those nodes."
    if incident.constraint == "unknown":
        sentence = (f"{_proc(victim)} of {who} was killed by the OOM killer; the log does not say whether a cgroup "
                    "limit was hit or the node ran out of memory")
        sentence += f", and {group_note}." if group_note else "."
        return sentence
    level = kubepods_level(incident.oom_cgroup) if incident.oom_cgroup else None
    if incident.constraint != "memcg" or incident.scope == "node" and level is None:
        sentence = (f"The node ran out of memory (no cgroup limit was hit); the kernel chose {_proc(victim)} of "
                    f"{who}")
        sentence += f", and {group_note}." if group_note else "."
        if w.is_kubernetes:
            return sentence + " Reserve memory for the system (kubelet system-reserved and eviction " \
                              "thresholds) or lower what the node runs."
        return sentence + " Lower what the node runs, or give its services limits (MemoryMax) so that one " \
                          "of them is killed before the node runs out."
    if level in ("node-allocatable", "qos"):
        sentence = (f"Pods on this node together hit the kubepods limit ({size(limit)}, node allocatable); the "
                    f"kernel chose {_proc(victim)} of {who}")
        sentence += f", and {group_note}." if group_note else "."
        return sentence + " The kubelet's eviction did not act in time: lower pod limits or raise eviction " \
                          "thresholds."

    if incident.scope == "pod":
        sentence = (f"{w.display_name() if w.pod else who}: the pod's {size(limit)} limit was hit; the kernel "
                    f"chose {_proc(victim)}")
        if group_note:
            sentence += f" and {group_note}"
        if incident.group_cgroup and incident.group_cgroup == w.pod_cgroup:
            sentence += "; every container of the pod died"
        return sentence + ". Raise the pod's containers' limits or lower their usage."

    where = "the container past" if w.type == "k8s-container" else "the cgroup past"
    if w.type == "systemd" and incident.oom_cgroup == w.cgroup:
        where, limit_text = "the unit past", f"its MemoryMax ({size(limit)})" if limit else "its MemoryMax"
    if incident.scope == "cgroup" and incident.oom_cgroup and incident.oom_cgroup != w.cgroup:
        where = f"{incident.oom_cgroup} past"
        limit_text = f"its {size(limit)} limit" if limit else "its limit"
    trigger = incident.trigger or {}
    if trigger.get("pid") not in (None, victim.pid) or (trigger.get("comm") and trigger.get("comm") != victim.comm):
        head = (f"{who}: {trigger.get('comm')} (pid {trigger.get('pid')}) pushed {where} {limit_text} and the "
                f"kernel killed {_proc(victim)}")
        alone = " alone"  # the victim is named already
    else:
        head = f"{who}: {_proc(victim)} pushed {where} {limit_text}"
        alone = " and was killed alone"
    if incident.kind == "group":
        sentence = f"{head}; {group_note}."
        if collateral and w.is_kubernetes and single_process_oom_kill != "true":
            sentence += f" With singleProcessOOMKill=true only {victim.comm} would have died."
        return sentence
    if w.type == "systemd" and w.unit and not w.unit.endswith(".slice"):
        # systemd's OOMPolicy=stop (its default) stops the rest of the unit after a kernel OOM kill
        return (f"{head}{alone} (memory.oom.group=0); systemd then stops the rest of the unit unless its "
                "OOMPolicy=continue.")
    sentence = f"{head}{alone} (memory.oom.group=0); its other processes kept running."
    return sentence
