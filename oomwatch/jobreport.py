"""`oomwatch inspect --job NAME`: one job's OOM kills on this node, and whether each restart of its pods
followed one.

Which job a Kubernetes pod belongs to is known to the agent (the API server's owner references and the pod's
labels: docs/contract.md `workload.job` and `workload.owner`), not to the kernel log: the kills come from the
agent's `/incidents` or its events file (`--incidents URL|PATH`), else from the kernel log, where only Slurm
jobs are named (by their cgroup). The restarts are this node's: a container's restart count from its pod log
files and its current run's start (its cgroup's creation), as `inspect` reads them; the kills say which run
they hit (the container id).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any, Callable, Optional

from oomwatch.config import Config
from oomwatch.timefmt import parse_iso8601, utc_seconds

# What is read of an events file: its last lines (the agent appends one per incident; a year of a busy node's
# kills is far less).
MAX_EVENTS_BYTES = 64 << 20
MAX_INCIDENTS = 100_000


class IncidentsUnavailable(Exception):
    """The agent's /incidents or the events file could not be read (the message says which and why)."""


def incidents_url(source: str) -> Optional[str]:
    """An agent's /incidents URL for `http://HOST:PORT[/incidents]`; None for a path."""
    if not source.startswith(("http://", "https://")):
        return None
    return source if source.rstrip("/").endswith("/incidents") else source.rstrip("/") + "/incidents"


def parse_events_lines(lines: list[str], deaths: Optional[list] = None) -> tuple[list[dict[str, Any]], int]:
    """The incidents of an events file's lines (one JSON object each), and how many lines were not one (a torn
    last line, another program's output on the same stdout). A death's verdict (`"record": "death"`) is neither:
    it goes to `deaths` when given."""
    incidents, bad = [], 0
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            value = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(value, dict) and value.get("record") == "death":
            if deaths is not None:
                deaths.append(value)
            continue
        if isinstance(value, dict) and "workload" in value and "time" in value:
            incidents.append(value)
        else:
            bad += 1
    return incidents[-MAX_INCIDENTS:], bad


def load_incidents(source: str, timeout: float = 10.0,
                   deaths: Optional[list] = None) -> tuple[list[dict[str, Any]], int]:
    """The incidents of the agent's /incidents (a URL) or of an events file (a path), oldest first, and how
    many lines of the file were not incidents; an events file's deaths' verdicts go to `deaths` when given."""
    url = incidents_url(source)
    if url is not None:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                body = response.read(MAX_EVENTS_BYTES + 1)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise IncidentsUnavailable(f"{url}: {getattr(exc, 'reason', None) or exc}") from None
        try:
            incidents = json.loads(body)
        except ValueError:
            raise IncidentsUnavailable(f"{url}: not JSON (is it the oomwatch agent's port?)") from None
        if not isinstance(incidents, list):
            raise IncidentsUnavailable(f"{url}: expected a JSON array of incidents")
        return [i for i in incidents if isinstance(i, dict)], 0
    try:
        with open(source, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_EVENTS_BYTES:
                f.seek(size - MAX_EVENTS_BYTES)
                f.readline()  # the first line read from the middle is a part of one
            text = f.read(MAX_EVENTS_BYTES).decode("utf-8", "replace")
    except OSError as exc:
        raise IncidentsUnavailable(f"{source}: {exc.strerror or exc}") from None
    return parse_events_lines(text.splitlines(), deaths)


def job_of(workload: dict[str, Any]) -> Optional[tuple[str, str]]:
    """(kind, name) of a workload's job as oomwatch_workload_job_info names it: the training or batch job,
    else the controlling owner; a Slurm job; None when not known."""
    job = workload.get("job") or workload.get("owner")
    if isinstance(job, dict) and job.get("name"):
        return str(job.get("kind") or ""), str(job["name"])
    if workload.get("slurm_job"):
        return "SlurmJob", str(workload["slurm_job"])
    return None


def is_jobs(incident: dict[str, Any], name: str) -> bool:
    """Whether the incident's workload belongs to the job `name` (`NAMESPACE/NAME` narrows the namespace): its
    training job, its controlling owner or its Slurm job has that name."""
    workload = incident.get("workload") or {}
    namespace, sep, bare = name.rpartition("/")
    if sep and workload.get("namespace") != namespace:
        return False
    names = [(workload.get(key) or {}).get("name") if isinstance(workload.get(key), dict) else None
             for key in ("job", "owner")] + [workload.get("slurm_job")]
    return bare in [str(n) for n in names if n]


def _time(incident: dict[str, Any]) -> Optional[float]:
    try:
        return parse_iso8601(incident["time"])
    except (KeyError, TypeError, ValueError):
        return None


def container_runs(config: Config) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Each live Kubernetes container of this node, by (namespace, pod, container): its current run's
    container id and start (its cgroup's creation: a restart makes a new cgroup) and its restart count (pod
    log files)."""
    from oomwatch.inspect import restart_count
    from oomwatch.node import node_layout
    from oomwatch.sources.cgroupfs import CgroupFS
    from oomwatch.workloads import WorkloadResolver
    from oomwatch.workloads.runtime import RuntimeNames

    fs = CgroupFS(config.cgroup_root)
    if not os.path.isdir(config.cgroup_root):
        return {}
    resolver = WorkloadResolver(RuntimeNames(run_root=config.run_root, pod_log_root=config.pod_log_dir),
                                layout=node_layout(config.kubelet_config))
    paths = list(fs.walk())
    for path in paths:  # containers first: their bundles name their pods too
        resolver.container_appeared(path)
    runs: dict[tuple[str, str, str], dict[str, Any]] = {}
    for path in paths:
        workload = resolver.resolve(path)
        if workload.type != "k8s-container" or workload.cgroup != path or workload.sandbox:
            continue
        if not (workload.namespace and workload.pod and workload.container):
            continue
        try:
            started = os.stat(fs.abspath(path)).st_ctime
        except OSError:
            continue  # gone meanwhile
        runs[(workload.namespace, workload.pod, workload.container)] = {
            "cgroup": path, "container_id": workload.container_id, "run_started": started,
            "restarts": restart_count(config.pod_log_dir, workload.to_json())}
    return runs


def after_kill(incident: dict[str, Any], run: Optional[dict[str, Any]]) -> dict[str, Any]:
    """What followed a kill of a container, where this node can know it: the run it hit is the current one
    (no restart since), or an earlier one (the container was restarted since), or the container is not here
    now."""
    workload = incident.get("workload") or {}
    when = _time(incident)
    if run is None:
        return {"restarted": None, "why": "the container is not on this node now (its pod was deleted, or it "
                                          "ran elsewhere): whether it restarted is not known here"}
    killed_id, current_id = workload.get("container_id"), run.get("container_id")
    if killed_id and current_id:
        same = killed_id == current_id
    elif when is not None:
        same = when >= run["run_started"]
    else:
        return {"restarted": None, "why": "the kill's time and run are not known"}
    if same:
        return {"restarted": False, "why": "no restart since: the container runs on in the run that was hit"}
    began = run["run_started"]
    later = f", {began - when:.0f} s after the kill" if when is not None and began >= when else ""
    ended = (" (a group kill of the container: the kill ended that run)"
             if incident.get("kind") == "group" and incident.get("scope") in ("container", "pod") else "")
    why = f"restarted since: its current run began at {utc_seconds(began)}{later}{ended}"
    return {"restarted": True, "why": why}


def build_job_report(config: Config, job: str, source: Optional[str], *,
                     kernel_log_incidents: Callable[[], list[dict[str, Any]]], since: Optional[float] = None,
                     runs: Optional[dict[tuple[str, str, str], dict[str, Any]]] = None) -> dict[str, Any]:
    """The report as data (also the `--json` output). `source`: the agent's /incidents URL or its events
    file; None reads the kernel log (`kernel_log_incidents`, as `inspect` reads it). `since`: only kills since
    then."""
    notes: list[str] = []
    unreadable = 0
    deaths: list[dict[str, Any]] = []  # the events file's deaths' verdicts (oomwatch.deaths)
    if source is not None:
        incidents, unreadable = load_incidents(source, deaths=deaths)
        if unreadable:
            one = unreadable == 1
            notes.append(f"{unreadable} line{'' if one else 's'} of {source} {'is' if one else 'are'} not an "
                         "incident (a torn line, or another program's output): skipped")
    else:
        incidents = kernel_log_incidents()
        notes.append("read from the kernel log, which names Slurm jobs (by their cgroup) but not a "
                     "Kubernetes pod's job: for those, pass --incidents with the agent's /incidents URL or "
                     "its events file")
    kills = sorted((i for i in incidents if is_jobs(i, job)
                    and (since is None or (_time(i) is not None and _time(i) >= since))),
                   key=lambda i: _time(i) or 0.0, reverse=True)
    runs = container_runs(config) if runs is None else runs
    jobs = sorted({job_of(i.get("workload") or {}) or ("", "") for i in kills})
    pods: dict[tuple[str, str], dict[str, Any]] = {}
    rows = []
    for incident in kills:
        w = incident.get("workload") or {}
        key = (w.get("namespace") or "", w.get("pod") or "", w.get("container") or "")
        pod_key = key[:2] if key[1] else ("", _not_a_pod(w, incident))
        pod = pods.setdefault(pod_key, {"kills": 0, "group_kills": 0})
        pod["kills"] += 1
        pod["group_kills"] += incident.get("kind") == "group"
        followed = after_kill(incident, runs.get(key)) if key[1] and key[2] else {
            "restarted": None, "why": "not a Kubernetes container: no restarts to tell"}
        rows.append({"incident": incident, "container": key, "after": followed})
    restarts = []
    for (namespace, pod, container), run in sorted(runs.items()):
        if (namespace, pod) not in pods:
            continue
        mine = [(when, (row["incident"].get("victim") or {}).get("comm") or "a process") for row in rows
                for when in [_time(row["incident"])] if when is not None
                and row["container"] == (namespace, pod, container)]
        restarts.append({"namespace": namespace, "pod": pod, "container": container,
                         **restart_verdict(run, mine)})
    job_deaths = sorted((d for d in deaths if is_jobs(d, job)
                         and (since is None or (_time(d) is not None and _time(d) >= since))),
                        key=lambda d: _time(d) or 0.0, reverse=True)
    after = [{"time": r["incident"].get("time"), "namespace": r["container"][0], "pod": r["container"][1],
              "container": r["container"][2], **r["after"]} for r in rows]
    return {"job": job, "jobs": [{"kind": k, "name": n} for k, n in jobs if n],
            "source": source or config.kmsg,
            "kills": len(kills), "group_kills": sum(i.get("kind") == "group" for i in kills),
            "pods": [{"namespace": ns, "pod": p, **v} for (ns, p), v in sorted(pods.items())],
            "restarts": restarts, "incidents": [r["incident"] for r in rows], "after_kill": after,
            "in_source": len(incidents), "notes": notes, "deaths": job_deaths}


def _not_a_pod(workload: dict[str, Any], incident: dict[str, Any]) -> str:
    """What stands for a pod in the report where the workload is not one: a Slurm job's step, a unit, a
    cgroup."""
    if workload.get("slurm_job"):
        step = f" step {workload['slurm_step']}" if workload.get("slurm_step") else ""
        return f"Slurm job {workload['slurm_job']}{step}"
    return str(workload.get("unit") or incident.get("oom_cgroup") or "cgroup unknown")


def restart_verdict(run: dict[str, Any], kills: list[tuple[float, str]]) -> dict[str, Any]:
    """A container's restarts and whether the last one followed an OOM kill (inspect's own verdict)."""
    from oomwatch.inspect import restart_cause

    restarts = run.get("restarts")
    if restarts is None:
        return {"restarts": None, "oom_kill": None,
                "why": "restart count unknown (its pod log files cannot be read here); current run since "
                       f"{utc_seconds(run['run_started'])}"}
    if restarts == 0:
        return {"restarts": 0, "oom_kill": None, "why": "never restarted"}
    cause = restart_cause(restarts, run["run_started"], kills, True)
    return {"restarts": restarts, "oom_kill": cause["oom_kill"], "why": cause["why"]}


def render_job_text(report: dict[str, Any], color: bool = False, width: int = 80) -> str:
    from oomwatch.inspect import Style, _wrap, render_text

    s = Style(color)
    kinds = ", ".join(f"{j['kind']} {j['name']}" if j["kind"] else j["name"] for j in report["jobs"])
    n, g = report["kills"], report["group_kills"]
    out = [s.bold(f"Job {report['job']}") + (f" ({kinds})" if kinds else "")]
    pods, seen = len(report["pods"]), report["in_source"]
    def plural(count: int, word: str) -> str:
        return f"{count} {word}{'' if count == 1 else 's'}"

    out.extend(_wrap(f"{plural(n, 'OOM kill')} on this node ({plural(g, 'group kill')}) in "
                     f"{plural(pods, 'pod')}, of the {plural(seen, 'incident')} of {report['source']}", width))
    for pod in report["pods"]:
        name = f"{pod['namespace']}/{pod['pod']}" if pod["namespace"] else pod["pod"]
        kills = pod["kills"]
        out.extend(_wrap(f"{name}: {plural(kills, 'kill')}, {pod['group_kills']} group", width))
    for note in report["notes"]:
        out.extend(_wrap(s.yellow("note: ") + note, width, indent=""))
    out.append("")
    if report["restarts"]:
        out.append(s.bold("Restarts of the job's pods on this node"))
        for r in report["restarts"]:
            out.extend(_wrap(f"{r['namespace']}/{r['pod']} {r['container']}: {r['why']}", width))
        out.append("")
    if report["after_kill"]:
        out.append(s.bold("After each kill"))
        for a in report["after_kill"]:
            when = utc_seconds(parse_iso8601(a["time"])) if a.get("time") else "time unknown"
            who = f"{a['namespace']}/{a['pod']} {a['container']}" if a["pod"] else "the workload"
            out.extend(_wrap(f"{when} {who}: {a['why']}", width))
        out.append("")
    if report.get("deaths"):
        out.append(s.bold("Deaths of the job's processes (verdicts; only kernel-oom ones are OOM kills)"))
        for death in report["deaths"]:
            when = utc_seconds(parse_iso8601(death["time"])) if death.get("time") else "time unknown"
            sender = f" by {death['sender']}" if death.get("sender") else ""
            out.extend(_wrap(f"{when} {death.get('cause')}{sender}: {death.get('explanation')}", width))
        out.append("")
    out.append(render_text({"incidents": report["incidents"]}, color=color, width=width).rstrip("\n"))
    return "\n".join(out) + "\n"
