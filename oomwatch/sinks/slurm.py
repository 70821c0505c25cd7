"""Slurm jobs' AdminComment: the explanation where Slurm users look, `scontrol show job` (and `sacct -o
AdminComment` where accounting is enabled).

For each incident in which a Slurm job lost a process, a worker thread runs, as root on the node,
`scontrol show job <id>` (to read the comment the job has) and `scontrol update JobId=<id> AdminComment=<text>`
with the incident's entry appended. The pipeline only queues (bounded, never waits); each scontrol call has a
timeout. What Slurm does with it, from its source (slurmctld/job_mgr.c, scontrol/update_job.c, 22.05 to 25.11):

- Only an administrator may set it (`validate_super_user`: root, SlurmUser or an accounting admin); munge makes
  the node's root the controller's root, so the agent needs no more than the node's slurm.conf and munge key.
- slurmctld keeps the text whole (no length limit of its own) and shows it to everyone who may see the job, its
  owner included: `AdminComment=` in `scontrol show job`; with accounting it is stored when the job ends.
- `AdminComment+=` was removed in 18.08 (scontrol sends the `+=` literally): appending is read, then write.
- A job that has ended cannot be changed (ESLURM_JOB_FINISHED: "Job has already finished for job N"), so
  the comment is written only while the job still runs: a kill that ends the job (its only task, its batch
  script) is usually too quick for it. That refusal is logged, not retried.

Each entry starts with `[oomwatch <time> #<8 hex of the incident key>]`: an entry already in the comment is not
written again. Entries hold no quotes, backslashes or line breaks; one is at most ENTRY_MAX characters and the
whole comment at most COMMENT_MAX: an entry that does not fit is cut, and none is added when under
MIN_ROOM characters are left. The text already there (an administrator's) is never changed.
"""

from __future__ import annotations

import hashlib
import logging
import pwd
import re
import subprocess
from typing import Any, Callable, Optional, Sequence

from oomwatch.model import Incident, KilledProcess, Workload
from oomwatch.sinks import NoLifecycle
from oomwatch.sinks.worker import QueueWorker
from oomwatch.timefmt import utc_seconds

log = logging.getLogger(__name__)

ENTRY_MAX = 512
COMMENT_MAX = 2048
MIN_ROOM = 64
SEPARATOR = " | "
KILLED_LISTED = 4
SCONTROL_TIMEOUT = 10.0
# slurm_strerror() of ESLURM_JOB_FINISHED and ESLURM_ALREADY_DONE: the job has ended
ENDED = ("Job has already finished", "already completing or completed")
NO_SUCH_JOB = "Invalid job id specified"  # slurm_strerror(ESLURM_INVALID_JOB_ID): gone after MinJobAge

_UNSAFE = re.compile(r"['\"\\]")
_SPACE = re.compile(r"\s+")
# `AdminComment=<text> ` on its own line; a comment with line breaks runs on to the next `   Key=` line
_ADMIN_COMMENT = re.compile(r"^[ \t]*AdminComment=(.*?) ?\n(?=[ \t]+[\w/:]+=|[ \t]*\n|[ \t]*$)",
                            re.MULTILINE | re.DOTALL)


def slurm_jobs(incident: Incident) -> list[tuple[str, tuple[Workload, ...]]]:
    """The Slurm jobs that lost a process in this incident, the victim's first, each with its workloads
    (steps)."""
    jobs: dict[str, list[Workload]] = {}
    for workload in (incident.workload, *incident.workloads):
        if workload.type == "slurm" and workload.slurm_job:
            steps = jobs.setdefault(workload.slurm_job, [])
            if workload not in steps:
                steps.append(workload)
    return [(job, tuple(steps)) for job, steps in jobs.items()]


def entry_tag(incident: Incident) -> str:
    """`oomwatch <time> #<8 hex>`: the same for the same incident (its key), also after a restart."""
    digest = hashlib.sha256(repr(tuple(incident.key)).encode()).hexdigest()[:8]
    return f"oomwatch {utc_seconds(incident.time)} #{digest}"


def _in(process: KilledProcess, steps: Sequence[Workload]) -> bool:
    cgroup = process.cgroup or ""
    return any(cgroup == w.cgroup or cgroup.startswith(w.cgroup + "/") for w in steps)


def _clean(text: str) -> str:
    """One line without quotes or backslashes: it reads the same in scontrol, sacct and the database."""
    text = "".join(c if c.isprintable() else " " for c in text)
    return _SPACE.sub(" ", _UNSAFE.sub("", text)).strip()


def comment_entry(incident: Incident, job: str, steps: Sequence[Workload],
                  user_name: Callable[[int], str] = str) -> str:
    """The entry for one job: the tag, the explanation, and the job's killed processes with their users
    (`user_name(uid)`). Pure; at most ENTRY_MAX characters."""
    mine = [p for p in incident.killed if _in(p, steps)]
    if not mine and incident.workload.slurm_job == job:
        mine = list(incident.killed)  # a log without cgroups: the incident is the job's
    listed = []
    for p in mine[:KILLED_LISTED]:
        user = f", user {user_name(p.uid)}" if p.uid is not None else ""
        listed.append(f"{p.comm} (pid {p.pid}{user})")
    if len(mine) > KILLED_LISTED:
        listed.append(f"{len(mine) - KILLED_LISTED} more")
    killed = f" Killed in job {job}: {', '.join(listed)}." if listed else ""
    entry = _clean(f"[{entry_tag(incident)}] {incident.explanation}{killed}")
    return entry if len(entry) <= ENTRY_MAX else entry[: ENTRY_MAX - 3].rstrip() + "..."


def appended(existing: Optional[str], entry: str, tag: str, limit: int = COMMENT_MAX) -> Optional[str]:
    """The comment with `entry` appended to what the job has, or None when there is nothing to write: the
    entry (its `tag`) is there already, or fewer than MIN_ROOM characters are left. Pure."""
    existing = existing or ""
    if tag in existing:
        return None
    lead = existing + SEPARATOR if existing else ""
    room = limit - len(lead)
    if room < MIN_ROOM:
        return None
    if len(entry) > room:
        entry = entry[: room - 3].rstrip() + "..."
    return lead + entry


def job_record(show_job: str, job: str) -> tuple[str, Optional[str]]:
    """From `scontrol show job <job>` text: the id to update (`<array job>_<task>` for an array task, whose
    plain id may be the whole array's) and the AdminComment it has, line breaks included (None: none). Pure."""
    records = [r for r in re.split(r"\n\s*\n", show_job) if re.match(rf"\s*JobId={re.escape(job)}\s", r)]
    record = records[0] if records else show_job
    update_id = job
    array = re.search(r"\bArrayJobId=(\d+) ArrayTaskId=(\d+)\b", record)
    if array:
        update_id = f"{array.group(1)}_{array.group(2)}"
    comment = _ADMIN_COMMENT.search(record if record.endswith("\n") else record + "\n")
    return update_id, comment.group(1) if comment else None


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


class SlurmAdminCommentSink(NoLifecycle):
    """Appends each incident's entry to the AdminComment of the Slurm jobs it touched (see the module's
    docstring), on its own thread behind a bounded queue."""

    def __init__(self, scontrol: str = "scontrol", *, timeout: float = SCONTROL_TIMEOUT, queue_size: int = 256,
                 user_name: Callable[[int], str] = _user_name) -> None:
        self._scontrol, self._timeout, self._user_name = scontrol, timeout, user_name
        self._worker: QueueWorker[tuple[str, tuple[Workload, ...], Incident]] = QueueWorker(
            "oomwatch-slurm", self._handle, queue_size)
        self._off: Optional[str] = None  # why no more is written (no scontrol)
        self.written = self.ended = self.failed = 0

    @property
    def dropped(self) -> int:
        return self._worker.dropped

    def start(self, published: Sequence[dict[str, Any]]) -> None:
        self._worker.start()  # the saved incidents were written (or refused) in an earlier life

    def publish(self, incident: Incident) -> None:
        if self._off:
            return
        for job, steps in slurm_jobs(incident):
            if not self._worker.put((job, steps, incident)):
                log.warning("Slurm AdminComment: queue full, job %s's entry dropped", job)

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (up to `timeout`), then stop the worker."""
        self._worker.close(timeout)

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """True once everything queued so far was written or given up on (tests, shutdown)."""
        return self._worker.wait_idle(timeout)

    def _handle(self, item: tuple[str, tuple[Workload, ...], Incident]) -> None:
        if self._off:
            return
        try:
            self._write(*item)
        except Exception:  # noqa: BLE001 - counted as this job's failure; the worker goes on
            self.failed += 1
            log.exception("Slurm AdminComment: job %s", item[0])

    def _scontrol_run(self, *args: str) -> Optional[subprocess.CompletedProcess]:
        try:
            return subprocess.run([self._scontrol, *args], capture_output=True, text=True, errors="replace",
                                  timeout=self._timeout, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            self._off = f"{self._scontrol} not found"
            log.error("Slurm AdminComment: %s; no comment will be written", self._off)
        except subprocess.TimeoutExpired:
            self.failed += 1
            log.warning("Slurm AdminComment: `%s %s` did not answer in %.0f s", self._scontrol, args[0], self._timeout)
        return None

    def _write(self, job: str, steps: tuple[Workload, ...], incident: Incident) -> None:
        shown = self._scontrol_run("show", "job", job)
        if shown is None:
            return
        if shown.returncode != 0:
            gone = NO_SUCH_JOB in shown.stderr
            self.ended += gone
            self.failed += not gone
            (log.info if gone else log.warning)("Slurm AdminComment: job %s not written: %s", job,
                                                shown.stderr.strip() or f"scontrol exit {shown.returncode}")
            return
        update_id, existing = job_record(shown.stdout, job)
        comment = appended(existing, comment_entry(incident, job, steps, self._user_name), entry_tag(incident))
        if comment is None:
            log.info("Slurm AdminComment: job %s has this incident's entry already, or no room left", job)
            return
        updated = self._scontrol_run("update", f"JobId={update_id}", f"AdminComment={comment}")
        if updated is None:
            return
        if updated.returncode == 0:
            self.written += 1
            log.info("Slurm AdminComment: job %s: %s", job, comment)
        elif any(text in updated.stderr for text in ENDED):
            self.ended += 1
            log.info("Slurm AdminComment: job %s had ended before its comment could be written (slurmctld changes "
                     "no ended job): %s", job, updated.stderr.strip())
        else:
            self.failed += 1
            log.warning("Slurm AdminComment: job %s not written: %s", job,
                        updated.stderr.strip() or f"scontrol exit {updated.returncode}")
