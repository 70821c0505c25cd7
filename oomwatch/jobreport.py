"""`oomwatch inspect --job NAME`: one job's OOM kills on this node, and whether each restart of its pods
followed one.

Which job a Kubernetes pod belongs to is known to the agent (the API server's owner references and the pod's
labels: docs/contract.md `workload.job` and `workload.owner`), not to the kernel log: the kills come from the
agent's `/incidents` or its events file (`--incidents URL|PATH`), else from the kernel log, where only Slurm
jobs are named (by their cgroup). The restarts are this node's: a container's restart count from its pod log
files and its current run's start (its cgroup's creation), as `inspect` reads them; the kills say which run
they hit (the container id).

The incidents are input from elsewhere (an HTTP server, a file), read as untrusted: a record is kept only when its
fields have the types docs/contract.md gives them (`incident_problem`), else skipped and counted; nesting deeper
than MAX_DEPTH is refused without recursing into it; a URL is read within an overall deadline (a server that
trickles one byte at a time is cut off), a path only when it is a regular file.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat
import threading
import urllib.parse
from typing import Any, Callable, Optional

from oomwatch.config import Config
from oomwatch.timefmt import parse_iso8601, utc_seconds

# What is read of an events file: its last lines (the agent appends one per incident; a year of a busy node's
# kills is far less).
MAX_EVENTS_BYTES = 64 << 20
MAX_INCIDENTS = 100_000
# Deepest nesting of one record (an incident is 4 deep: incident, top_holders, a holder, its fields).
MAX_DEPTH = 32
# The whole answer of a URL, connection to last byte (each read also waits at most `timeout`).
URL_DEADLINE = 30.0


class IncidentsUnavailable(Exception):
    """The agent's /incidents or the events file could not be read (the message says which and why)."""


def incidents_url(source: str) -> Optional[str]:
    """An agent's /incidents URL for `http://HOST:PORT[/incidents]`; None for a path."""
    if not source.startswith(("http://", "https://")):
        return None
    return source if source.rstrip("/").endswith("/incidents") else source.rstrip("/") + "/incidents"


# --- what a record must hold: the fields the reports read, with their types --------------------------

_NONE = type(None)
_TEXT = (str, _NONE)
_NUMBER = (int, float, _NONE)
_PROCESS = {"pid": int, "comm": str, "cgroup": _TEXT, "uid": (int, _NONE)}
_REQUIRED_OF_PROCESS = ("pid", "comm")
_WORKLOAD = {key: _TEXT for key in ("type", "cgroup", "namespace", "pod", "container", "container_id", "pod_uid",
                                    "unit", "slurm_job", "slurm_step", "runtime")}
_JOB = {"kind": _TEXT, "name": _TEXT}
_INCIDENT = {"time": _TEXT, "since_boot_seconds": _NUMBER, "kind": str, "scope": str, "explanation": str,
             "evidence": _TEXT, "oom_cgroup": _TEXT, "group_cgroup": _TEXT, "workload": dict,
             "victim": (dict, _NONE), "killed": list, "exiting": (list, _NONE), "died_with": (list, _NONE),
             "memory_breakdown": (dict, _NONE), "top_holders": (list, _NONE), "pools": (list, _NONE)}
_DEATH = {"time": _TEXT, "cause": _TEXT, "sender": _TEXT, "explanation": _TEXT, "workload": (dict, _NONE)}
# What a record may lack, and what it then stands for (the renderer indexes these).
_INCIDENT_DEFAULTS = {"kind": "unknown", "scope": "unknown", "explanation": "", "killed": []}


def _depth(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether `value` nests at most `limit` containers deep (walked level by level, without recursion)."""
    level = [value] if isinstance(value, (dict, list)) else []
    for _ in range(limit):
        if not level:
            return True
        level = [v for item in level for v in (item.values() if isinstance(item, dict) else item)
                 if isinstance(v, (dict, list))]
    return not level


def _wrong(record: dict[str, Any], types: dict[str, Any], where: str) -> Optional[str]:
    for key, wanted in types.items():
        if key in record and not isinstance(record[key], wanted):
            return f"{where}{key} is {type(record[key]).__name__}"
    return None


def _processes(items: Any, where: str, fields: dict[str, Any], required: tuple[str, ...]) -> Optional[str]:
    for item in items or ():
        if not isinstance(item, dict):
            return f"{where} holds a {type(item).__name__}"
        missing = [key for key in required if key not in item]
        if missing:
            return f"{where} lacks {missing[0]}"
        problem = _wrong(item, fields, f"{where}.")
        if problem:
            return problem
    return None


def _time_problem(record: dict[str, Any]) -> Optional[str]:
    if record.get("time") is None:
        return None
    try:
        parse_iso8601(record["time"])
    except (TypeError, ValueError):
        return "time is not an ISO 8601 UTC time"
    return None


def incident_problem(record: dict[str, Any], shallow: bool = False) -> Optional[str]:
    """Why `record` cannot be an incident of the report (a field of the wrong type, nesting too deep), or None.
    Missing fields the report reads are filled in (`_INCIDENT_DEFAULTS`); unknown fields are kept. `shallow`:
    known to nest no deeper than MAX_DEPTH (its text has fewer brackets)."""
    if not shallow and not _depth(record):
        return f"nested deeper than {MAX_DEPTH}"
    problem = _wrong(record, _INCIDENT, "") or _time_problem(record)
    if problem:
        return problem
    workload = record["workload"]
    problem = _wrong(workload, _WORKLOAD, "workload.") or next(
        (f"workload.{key} is {type(workload[key]).__name__}" for key in ("job", "owner")
         if workload.get(key) is not None and not isinstance(workload[key], dict)), None)
    for key in ("job", "owner"):
        problem = problem or (_wrong(workload[key], _JOB, f"workload.{key}.") if workload.get(key) else None)
    problem = problem or (_wrong(record["victim"], _PROCESS, "victim.") if record.get("victim") else None)
    problem = problem or _processes(record.get("killed"), "killed", _PROCESS, _REQUIRED_OF_PROCESS) \
        or _processes(record.get("exiting"), "exiting", _PROCESS, _REQUIRED_OF_PROCESS) \
        or _processes(record.get("died_with"), "died_with", {"pid": int}, ("pid",)) \
        or _processes(record.get("top_holders"), "top_holders",
                      {"pid": int, "comm": str, "rss_bytes": _NUMBER, "killed": (bool, _NONE), "from": _TEXT},
                      _REQUIRED_OF_PROCESS) \
        or _processes(record.get("pools"), "pools", {"processes": int, "comm": str, "rss_bytes": _NUMBER},
                      ("processes", "comm"))
    breakdown = record.get("memory_breakdown")
    if not problem and breakdown:
        problem = next((f"memory_breakdown.{key} is {type(value).__name__}" for key, value in breakdown.items()
                        if not isinstance(value, (str, int, float, _NONE))), None)
    if problem:
        return problem
    for key, value in _INCIDENT_DEFAULTS.items():
        if record.get(key) is None:
            record[key] = list(value) if isinstance(value, list) else value
    return None


def death_problem(record: dict[str, Any], shallow: bool = False) -> Optional[str]:
    """Why `record` (a death's verdict line) cannot be shown, or None."""
    if not shallow and not _depth(record):
        return f"nested deeper than {MAX_DEPTH}"
    return _wrong(record, _DEATH, "") or _time_problem(record) or (
        _wrong(record["workload"], _WORKLOAD, "workload.") if record.get("workload") else None)


def _json(text: str | bytes) -> Any:
    """json.loads, with nesting too deep for its recursion (100,000 `[`) a ValueError like any other bad JSON."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deep") from None


def parse_events_lines(lines: list[str], deaths: Optional[list] = None,
                       invalid: Optional[list] = None) -> tuple[list[dict[str, Any]], int]:
    """The incidents of an events file's lines (one JSON object each), and how many lines were not one (a torn
    last line, another program's output on the same stdout). A death's verdict (`"record": "death"`) is neither:
    it goes to `deaths` when given. A record whose fields have the wrong types is not kept: why goes to `invalid`
    (when given; else it counts as a line that was not an incident)."""
    incidents, bad = [], 0
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            value = _json(line)
        except ValueError:
            bad += 1
            continue
        # (a line with fewer opening brackets than MAX_DEPTH cannot nest deeper: most are not walked)
        shallow = line.count("{") + line.count("[") <= MAX_DEPTH
        if isinstance(value, dict) and value.get("record") == "death":
            problem = death_problem(value, shallow)
            if problem is None and deaths is not None:
                deaths.append(value)
        elif isinstance(value, dict) and "workload" in value and "time" in value:
            problem = incident_problem(value, shallow)
            if problem is None:
                incidents.append(value)
        else:
            bad += 1
            continue
        if problem is not None:
            if invalid is None:
                bad += 1
            else:
                invalid.append(problem)
    return incidents[-MAX_INCIDENTS:], bad


def _get_within(url: str, timeout: float, deadline: float) -> bytes:
    """The body of GET `url`, at most MAX_EVENTS_BYTES + 1 bytes, within `deadline` seconds in all: past it the
    connection is shut down under the reader, whatever the server still trickles."""
    parts = urllib.parse.urlsplit(url)
    connection_type = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_type(parts.hostname or "", parts.port, timeout=min(timeout, deadline))
    expired = threading.Event()

    def cut_off() -> None:
        expired.set()
        sock = connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed meanwhile

    timer = threading.Timer(deadline, cut_off)
    timer.daemon = True
    timer.start()
    try:
        connection.connect()
        if expired.is_set():
            cut_off()
        connection.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
                           headers={"Accept": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise IncidentsUnavailable(f"{url}: HTTP {response.status} {response.reason}")
        body = bytearray()
        while len(body) <= MAX_EVENTS_BYTES:
            chunk = response.read1(min(1 << 16, MAX_EVENTS_BYTES + 1 - len(body)))
            if not chunk:
                break
            body += chunk
        if expired.is_set():
            raise OSError("cut off")
        return bytes(body)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if expired.is_set():
            raise IncidentsUnavailable(f"{url}: no complete answer within {deadline:g} s") from None
        raise IncidentsUnavailable(f"{url}: {getattr(exc, 'strerror', None) or exc}") from None
    finally:
        timer.cancel()
        connection.close()


def _read_events_file(source: str) -> str:
    """The last MAX_EVENTS_BYTES of the events file at `source`: a regular file only (a FIFO or device is
    refused, never waited on)."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise IncidentsUnavailable(f"{source}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise IncidentsUnavailable(f"{source}: not a regular file (an events file or an agent's URL)")
            if info.st_size > MAX_EVENTS_BYTES:
                f.seek(info.st_size - MAX_EVENTS_BYTES)
                f.readline()  # the first line read from the middle is a part of one
            return f.read(MAX_EVENTS_BYTES).decode("utf-8", "replace")
        except OSError as exc:
            raise IncidentsUnavailable(f"{source}: {exc.strerror or exc}") from None


def load_incidents(source: str, timeout: float = 10.0, deaths: Optional[list] = None,
                   invalid: Optional[list] = None,
                   deadline: Optional[float] = None) -> tuple[list[dict[str, Any]], int]:
    """The incidents of the agent's /incidents (a URL) or of an events file (a path), oldest first, and how
    many lines of the file were not incidents; an events file's deaths' verdicts go to `deaths` when given, why
    each record of the wrong shape was skipped to `invalid`. A URL's answer takes at most `deadline` seconds
    (URL_DEADLINE)."""
    url = incidents_url(source)
    if url is None:
        return parse_events_lines(_read_events_file(source).splitlines(), deaths, invalid)
    body = _get_within(url, timeout, URL_DEADLINE if deadline is None else deadline)
    if len(body) > MAX_EVENTS_BYTES:
        raise IncidentsUnavailable(f"{url}: more than {MAX_EVENTS_BYTES >> 20} MiB")
    try:
        incidents = _json(body)
    except ValueError as exc:
        why = "nested too deep" if str(exc) == "nested too deep" else "not JSON"
        raise IncidentsUnavailable(f"{url}: {why} (is it the oomwatch agent's port?)") from None
    if not isinstance(incidents, list):
        raise IncidentsUnavailable(f"{url}: expected a JSON array of incidents")
    kept = []
    for record in incidents:
        problem = incident_problem(record) if isinstance(record, dict) and "workload" in record else \
            f"a {type(record).__name__}, not an incident"
        if problem is None:
            kept.append(record)
        elif invalid is not None:
            invalid.append(problem)
    return kept[-MAX_INCIDENTS:], 0


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
    from oomwatch.node import node_layout, node_resolver
    from oomwatch.sources.cgroupfs import CgroupFS

    fs = CgroupFS(config.cgroup_root)
    if not os.path.isdir(config.cgroup_root):
        return {}
    resolver = node_resolver(config, node_layout(config.kubelet_config))
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
        invalid: list[str] = []
        incidents, unreadable = load_incidents(source, deaths=deaths, invalid=invalid)
        if unreadable:
            one = unreadable == 1
            notes.append(f"{unreadable} line{'' if one else 's'} of {source} {'is' if one else 'are'} not an "
                         "incident (a torn line, or another program's output): skipped")
        if invalid:
            one = len(invalid) == 1
            notes.append(f"{len(invalid)} record{'' if one else 's'} of {source} {'has' if one else 'have'} "
                         f"fields of the wrong type: skipped (the first: {invalid[0]})")
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
