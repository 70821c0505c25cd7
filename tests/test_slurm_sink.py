"""The Slurm AdminComment sink: the entry's text (pure), reading `scontrol show job` as Slurm 22.05 prints it, and
the sink against a fake `scontrol` on PATH that records its argv and keeps the comment as slurmctld would."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from oomwatch.agent import _sinks
from oomwatch.config import Config
from oomwatch.model import Incident, KilledProcess, Workload
from oomwatch.sinks.slurm import (
    COMMENT_MAX,
    ENTRY_MAX,
    MIN_ROOM,
    SlurmAdminCommentSink,
    appended,
    comment_entry,
    entry_tag,
    job_record,
    slurm_jobs,
)

KILL_TIME = 1795691839.25  # 2026-11-26 11:17:19.25Z
SCOPE = "/system.slice/virtme-ng_slurmstepd.scope"
STEP = f"{SCOPE}/job_3/step_0"
USERS = {1001: "alice", 0: "root"}

# `scontrol show job 1` as Debian's Slurm 22.05.8 printed it in the real-kernel tier's VM (a finished batch job
# without an AdminComment), and the same job's lines once `scontrol update JobId=1 AdminComment=...` set one.
SHOW_JOB = """\
JobId=1 JobName=wrap
   UserId=alice(1001) GroupId=alice(1001) MCS_label=N/A
   Priority=4294901759 Nice=0 Account=(null) QOS=(null)
   JobState=COMPLETED Reason=None Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0
   RunTime=00:00:02 TimeLimit=UNLIMITED TimeMin=N/A
   SubmitTime=2026-11-26T11:17:15 EligibleTime=2026-11-26T11:17:16
   AccrueTime=2026-11-26T11:17:16
   StartTime=2026-11-26T11:17:18 EndTime=2026-11-26T11:17:20 Deadline=N/A
   SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-26T11:17:18 Scheduler=Main
   Partition=debug AllocNode:Sid=localhost:127
   ReqNodeList=(null) ExcNodeList=(null)
   NodeList=virtme-ng
   BatchHost=virtme-ng
   NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   TRES=cpu=1,mem=64M,node=1,billing=1
   Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=*
   MinCPUsNode=1 MinMemoryNode=64M MinTmpDiskNode=0
   Features=(null) DelayBoot=00:00:00
   OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null)
   Command=(null)
   WorkDir=/tmp
   StdErr=/tmp/slurm-1.out
   StdIn=/dev/null
   StdOut=/tmp/slurm-1.out
   Power=
   

"""


def with_comment(text: str, comment: str) -> str:
    """What slurm_sprint_job_info() prints with an AdminComment: its own line after WorkDir, then a space."""
    return text.replace("   WorkDir=/tmp\n", f"   WorkDir=/tmp\n   AdminComment={comment} \n")


def process(pid: int, cgroup: str, uid: int = 1001, comm: str = "python3") -> KilledProcess:
    return KilledProcess(pid=pid, comm=comm, cgroup=cgroup, uid=uid, anon_rss_bytes=60 << 20)


def step_incident(seq: int = 1200, pid: int = 412, job: str = "3", step: str = "0", **changes) -> Incident:
    cgroup = f"{SCOPE}/job_{job}/step_{step}"
    victim = process(pid, f"{cgroup}/user/task_0")
    workload = Workload(type="slurm", cgroup=cgroup, slurm_job=job, slurm_step=step, slurm_task="0")
    incident = Incident(
        time=KILL_TIME, boot_id="6d0b2c1e-7f3a-4b5c-8d9e-0a1b2c3d4e5f", kernel_seq=seq, kind="single",
        constraint="memcg", scope="cgroup", oom_cgroup=f"{SCOPE}/job_{job}", group_cgroup=None,
        trigger={"pid": pid, "comm": "python3"}, memory={"usage_bytes": 96 << 20, "limit_bytes": 96 << 20},
        victim=victim, killed=(victim,), workload=workload, workloads=(workload,),
        explanation=f"Slurm job {job} step {step}: python3 (pid {pid}) pushed {SCOPE}/job_{job} past its 96 MiB "
                    "limit.",
        detected_at=KILL_TIME + 0.4)
    return replace(incident, **changes)


# ------------------------------------------------------------------------------------------ the text (pure)
def test_entry_names_the_tag_the_explanation_and_the_killed_processes_with_their_user():
    incident = step_incident()
    [(job, steps)] = slurm_jobs(incident)
    entry = comment_entry(incident, job, steps, USERS.get)
    assert entry == (f"[{entry_tag(incident)}] Slurm job 3 step 0: python3 (pid 412) pushed {SCOPE}/job_3 past its "
                     "96 MiB limit. Killed in job 3: python3 (pid 412, user alice).")
    assert entry_tag(incident).startswith("oomwatch 2026-11-26 11:17:19Z #")
    assert entry_tag(incident) == entry_tag(replace(incident, detected_at=KILL_TIME + 9))  # the key, not when seen
    assert entry_tag(incident) != entry_tag(step_incident(seq=1201))


def test_entry_lists_only_the_jobs_own_processes_and_counts_the_rest():
    other_step = Workload(type="slurm", cgroup=f"{SCOPE}/job_3/step_batch", slurm_job="3", slurm_step="batch")
    workers = tuple(process(500 + i, f"{STEP}/user/task_0", comm=f"worker{i}") for i in range(6))
    stranger = process(900, "/user.slice/user-1002.slice/session-4.scope", uid=1002, comm="make")
    incident = step_incident(kind="group", killed=workers + (stranger,), victim=workers[0],
                             workloads=(step_incident().workload, other_step))
    [(job, steps)] = slurm_jobs(incident)
    assert job == "3" and [s.slurm_step for s in steps] == ["0", "batch"]
    entry = comment_entry(incident, job, steps, USERS.get)
    assert entry.endswith("Killed in job 3: worker0 (pid 500, user alice), worker1 (pid 501, user alice), "
                          "worker2 (pid 502, user alice), worker3 (pid 503, user alice), 2 more.")
    assert "make" not in entry


def test_entry_holds_no_quotes_backslashes_or_line_breaks_and_is_bounded():
    incident = step_incident(explanation='A "quoted" \\ back\nslash\'s\ttab ' + "x" * 900,
                             killed=(process(412, f"{STEP}/user/task_0", comm="it's"),))
    entry = comment_entry(incident, "3", slurm_jobs(incident)[0][1], USERS.get)
    assert not set("\"'\\\n\t") & set(entry)
    assert "A quoted back slashs tab x" in entry
    assert len(entry) == ENTRY_MAX and entry.endswith("...")


def test_entry_for_a_log_without_cgroups_lists_every_killed_process():
    victim = process(412, None)
    incident = step_incident(victim=victim, killed=(victim,))
    assert comment_entry(incident, "3", slurm_jobs(incident)[0][1], USERS.get).endswith(
        "Killed in job 3: python3 (pid 412, user alice).")


def test_only_slurm_jobs_get_a_comment():
    pod = Workload(type="k8s-container", cgroup="/kubepods/pod1/abc", namespace="ml", pod="p", container="c")
    unit = Workload(type="systemd", cgroup="/system.slice/nginx.service", unit="nginx.service")
    assert slurm_jobs(step_incident(workload=pod, workloads=(pod,))) == []
    assert slurm_jobs(step_incident(workload=unit, workloads=(unit,))) == []
    two = step_incident(workloads=(step_incident().workload, step_incident(job="7").workload))
    assert [job for job, _ in slurm_jobs(two)] == ["3", "7"]


def test_appending_keeps_what_the_job_had_and_adds_each_incident_once():
    entry, tag = "[oomwatch t #1] killed", "oomwatch t #1"
    assert appended(None, entry, tag) == entry
    assert appended("", entry, tag) == entry
    assert appended("set by an admin", entry, tag) == "set by an admin | [oomwatch t #1] killed"
    assert appended("set by an admin | [oomwatch t #1] killed", entry, tag) is None


def test_appending_cuts_the_entry_to_the_room_left_and_adds_none_below_min_room():
    long_entry = "[oomwatch t #2] " + "y" * 600
    existing = "z" * (COMMENT_MAX - 200)
    cut = appended(existing, long_entry, "oomwatch t #2")
    assert cut is not None and len(cut) == COMMENT_MAX and cut.startswith(existing + " | [oomwatch t #2] yy")
    assert cut.endswith("...")
    full = "z" * (COMMENT_MAX - len(" | ") - MIN_ROOM + 1)
    assert appended(full, long_entry, "oomwatch t #2") is None
    assert appended("z" * (COMMENT_MAX + 10), "[oomwatch t #2] y", "oomwatch t #2") is None


def test_reading_scontrol_show_job():
    assert job_record(SHOW_JOB, "1") == ("1", None)
    commented = with_comment(SHOW_JOB, "checked by ops = fine | [oomwatch x #ab] text")
    assert job_record(commented, "1") == ("1", "checked by ops = fine | [oomwatch x #ab] text")
    # an administrator's comment with a line break is read whole, so that writing it back keeps it
    assert job_record(with_comment(SHOW_JOB, "line one\nline two"), "1") == ("1", "line one\nline two")
    # an array task: the plain id may be the whole array's, so the update names the task
    task = SHOW_JOB.replace("JobId=1 JobName=wrap", "JobId=12 ArrayJobId=10 ArrayTaskId=2 JobName=wrap")
    assert job_record(task, "12") == ("10_2", None)
    # `scontrol show job 10` lists every task of the array: the record of job 10 is read, not the first one
    other = with_comment(SHOW_JOB, "not this one").replace("JobId=1 JobName", "JobId=11 ArrayJobId=10 ArrayTaskId=1 "
                                                                             "JobName")
    first = SHOW_JOB.replace("JobId=1 JobName=wrap", "JobId=10 ArrayJobId=10 ArrayTaskId=0 JobName=wrap")
    assert job_record(other + first, "10") == ("10_0", None)


# ------------------------------------------------------------------------------------------ the sink, fake scontrol
FAKE_SCONTROL = r'''#!{python}
"""A stand-in for scontrol: records its argv; `show job N` prints the job as Slurm 22.05 does, `update` keeps
the AdminComment, as slurmctld would; a job in "ended" is refused as slurmctld refuses a finished job."""
import json, os, sys, time
state_path = os.environ["FAKE_SCONTROL_STATE"]
state = json.load(open(state_path))
with open(state_path + ".argv", "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\n")
time.sleep(state.get("delay", 0))
args = sys.argv[1:]
if args[:2] == ["show", "job"]:
    job = args[2]
    if job not in state["jobs"]:
        sys.stderr.write("slurm_load_jobs error: Invalid job id specified\n")
        sys.exit(1)
    text = state["template"].replace("JobId=1 ", "JobId=%s " % job)
    comment = state["jobs"][job]
    if comment is not None:
        text = text.replace("   WorkDir=/tmp\n", "   WorkDir=/tmp\n   AdminComment=%s \n" % comment)
    sys.stdout.write(text)
elif args[0] == "update":
    fields = dict(a.split("=", 1) for a in args[1:])
    job = fields["JobId"]
    if job in state.get("ended", []):
        sys.stderr.write("Job has already finished for job %s\n" % job)
        sys.exit(1)
    state["jobs"][job] = fields["AdminComment"]
    json.dump(state, open(state_path, "w"))
'''


class FakeScontrol:
    def __init__(self, directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        bindir = directory / "bin"
        bindir.mkdir()
        script = bindir / "scontrol"
        script.write_text(FAKE_SCONTROL.replace("{python}", sys.executable))
        script.chmod(0o755)
        self.state_path = directory / "state.json"
        self.state: dict = {"template": SHOW_JOB, "jobs": {}, "ended": []}
        self.save()
        monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("FAKE_SCONTROL_STATE", str(self.state_path))

    def save(self) -> None:
        self.state_path.write_text(json.dumps(self.state))

    def comment(self, job: str):
        return json.loads(self.state_path.read_text())["jobs"][job]

    def argv(self) -> list[list[str]]:
        path = Path(str(self.state_path) + ".argv")
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def scontrol(tmp_path, monkeypatch) -> FakeScontrol:
    return FakeScontrol(tmp_path, monkeypatch)


def started(**kwargs) -> SlurmAdminCommentSink:
    sink = SlurmAdminCommentSink(user_name=USERS.get, **kwargs)
    sink.start([])
    return sink


def test_sink_appends_to_the_jobs_comment_and_writes_each_incident_once(scontrol):
    scontrol.state["jobs"]["3"] = "checked by ops"
    scontrol.save()
    sink = started()
    first, second = step_incident(seq=1200), step_incident(seq=1210, pid=415)
    for incident in (first, second, first):  # the first again: a replay
        sink.publish(incident)
    assert sink.wait_idle(20)
    sink.close()

    entry = comment_entry(first, "3", slurm_jobs(first)[0][1], USERS.get)
    entry2 = comment_entry(second, "3", slurm_jobs(second)[0][1], USERS.get)
    assert scontrol.comment("3") == f"checked by ops | {entry} | {entry2}"
    assert scontrol.argv() == [
        ["show", "job", "3"], ["update", "JobId=3", f"AdminComment=checked by ops | {entry}"],
        ["show", "job", "3"], ["update", "JobId=3", f"AdminComment=checked by ops | {entry} | {entry2}"],
        ["show", "job", "3"],  # the replay: read, found, not written
    ]
    assert (sink.written, sink.ended, sink.failed, sink.dropped) == (2, 0, 0, 0)


def test_sink_takes_an_ended_or_forgotten_job_as_such_and_goes_on(scontrol, caplog):
    scontrol.state["jobs"].update({"3": None, "4": None})
    scontrol.state["ended"] = ["3"]
    scontrol.save()
    sink = started()
    caplog.set_level("INFO", logger="oomwatch.sinks.slurm")
    for incident in (step_incident(job="3"), step_incident(job="9"), step_incident(job="4")):
        sink.publish(incident)
    assert sink.wait_idle(20)
    sink.close()
    assert scontrol.comment("3") is None and scontrol.comment("4").startswith("[oomwatch 2026-11-26 11:17:19Z #")
    assert (sink.written, sink.ended, sink.failed) == (1, 2, 0)
    assert "job 3 had ended before its comment could be written" in caplog.text
    assert "job 9 not written: slurm_load_jobs error: Invalid job id specified" in caplog.text


def test_publish_never_waits_for_scontrol(scontrol):
    scontrol.state["jobs"]["3"] = None
    scontrol.state["delay"] = 2.0  # a slurmctld that answers slowly
    scontrol.save()
    sink = started(queue_size=2)
    t = time.monotonic()
    for seq in range(6):
        sink.publish(step_incident(seq=seq))
    assert time.monotonic() - t < 0.5
    assert sink.dropped >= 3  # one taken by the worker at most, two queued, the rest dropped
    sink.close(timeout=0.1)


def test_a_scontrol_that_hangs_is_given_up_on(scontrol, caplog):
    scontrol.state["jobs"]["3"] = None
    scontrol.state["delay"] = 30
    scontrol.save()
    sink = started(timeout=0.5)
    sink.publish(step_incident())
    assert sink.wait_idle(10)
    sink.close()
    assert sink.failed == 1 and "did not answer in" in caplog.text


def test_without_scontrol_the_sink_says_so_once_and_stops_writing(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))
    sink = started()
    sink.publish(step_incident(seq=1))
    assert sink.wait_idle(10)
    sink.publish(step_incident(seq=2))
    sink.close()
    assert caplog.text.count("scontrol not found; no comment will be written") == 1
    assert sink.written == 0


def test_the_agent_has_the_sink_only_when_asked():
    def names(config: Config) -> list[str]:
        return [type(s).__name__ for s in _sinks(config, None)]

    assert "SlurmAdminCommentSink" not in names(Config())
    assert "SlurmAdminCommentSink" in names(Config(slurm_admin_comment=True))


def test_close_returns_after_its_timeout_even_if_scontrol_hangs(scontrol):
    scontrol.state["jobs"]["3"] = None
    scontrol.state["delay"] = 5
    scontrol.save()
    sink = started(timeout=30)
    sink.publish(step_incident())
    time.sleep(0.2)
    t = time.monotonic()
    sink.close(timeout=0.5)
    assert time.monotonic() - t < 2.0
    assert any(th.name == "oomwatch-slurm" for th in threading.enumerate())  # a daemon: the exit does not wait
