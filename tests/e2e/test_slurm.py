"""Real Slurm on a real kernel (its own VM boot, tests/e2e/guest/slurm.py): Debian's munged, slurmctld and slurmd
(Slurm 22.05, cgroup/v2, task/cgroup, ConstrainRAMSpace=yes), with slurmdbd and a MariaDB server for accounting,
run four jobs past their --mem; slurmd and slurmstepd make every job's cgroups. oomwatch, started before them,
must name each kill's job, step, user and processes, count exactly what the step cgroups' memory.events count,
agree with what Slurm itself reports (JobState=OUT_OF_MEMORY, slurmstepd's "Detected N oom-kill event(s)") and
write its explanation into the job's AdminComment, which the real `scontrol show job` shows to root and to the
job's owner, and `sacct` (from slurmdbd's database) shows the owner with the job's and the step's OUT_OF_MEMORY.

Run alone: .venv/bin/pytest -m e2e tests/e2e/test_slurm.py -s   (OOMWATCH_SLURM_RUN=<dir> reuses a run)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

import pytest

from oomwatch.model import incident_key_of_json
from tests.e2e import vm
from tests.e2e.conftest import ARTIFACTS, parse_metrics, select
from tests.e2e.guest import kmsgtruth

pytestmark = pytest.mark.e2e

GUEST = Path(__file__).resolve().parent / "guest" / "slurm.py"
JOBS = ["single_task", "multi_task", "batch", "forked_workers"]
# Jobs that run on after their kill (another task, the rest of the batch script, the other workers): slurmctld
# still takes a change to them when the agent writes. A single-task step ends with its kill, and slurmctld
# refuses any change to an ended job: whether the agent wrote in time is a race, and both outcomes are checked.
STILL_RUNNING = {"multi_task", "batch", "forked_workers"}
USER, UID = "alice", 2001
MEMORY_MIB = 1280  # the jobs' limits (up to 160 MiB), the daemons beside the agent and MariaDB
# boot, MariaDB's first start and slurmdbd's tables (~75 s on a loaded 2-core host), four jobs (~30 s each, up to
# 100 s on a loaded host) and the accounting: room for a slower host
VM_TIMEOUT = 840
MIB = {"64M": 64, "96M": 96, "160M": 160}  # the jobs' --mem
TAG = re.compile(r"\[oomwatch \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ #[0-9a-f]{8}\]")


@pytest.fixture(scope="module")
def slurm() -> dict:
    reuse = os.environ.get("OOMWATCH_SLURM_RUN")
    if reuse:
        run_dir = Path(reuse)
    else:
        try:
            vm_env = vm.prepare()
        except vm.VMUnavailable as e:
            pytest.fail(f"the end-to-end VM cannot run on this machine: {e}", pytrace=False)
        run_dir = ARTIFACTS / time.strftime("slurm-%Y%m%d-%H%M%S")
        run_dir.mkdir(parents=True)
        argv = [str(vm.VENV / "bin" / "python"), str(GUEST), "--out", vm.GUEST_SHARED,
                "--agent", str(vm.VENV / "bin" / "oomwatch")]
        compiling = vm.compile_python()
        try:
            result = vm.run_guest(vm_env, argv, run_dir, memory_mib=MEMORY_MIB, timeout=VM_TIMEOUT)
        except vm.VMUnavailable as e:
            pytest.fail(f"the end-to-end VM cannot run on this machine: {e}", pytrace=False)
        finally:
            compiling.wait()
        if result.failure_report():
            pytest.fail(f"the Slurm VM boot ({run_dir}): {result.failure_report()}", pytrace=False)
    path = run_dir / "slurm" / "slurm.json"
    if not path.exists() or not (run_dir / "done").exists():
        console = (run_dir / "console.txt").read_text(errors="replace")[-4000:] \
            if (run_dir / "console.txt").exists() else ""
        pytest.fail(f"the Slurm scenario did not run to its end: see {run_dir}/driver.log\n{console}", pytrace=False)
    data = json.loads(path.read_text())
    data["dir"] = run_dir
    data["by_name"] = {j["spec"]["name"]: j for j in data["jobs"]}
    # The kernel's own account, read here from the raw records with the tier's independent regexes
    records, _ = kmsgtruth.parse_records((run_dir / "kmsg-all.raw").read_bytes())
    kills = kmsgtruth.incidents(records)
    for rec in data["jobs"]:
        rec["_dir"] = str(run_dir)
        rec["kills"] = [k for k in kills if re.search(rf"/job_{rec.get('job_id')}(/|$)", k.task_memcg or "")]
    return data


def job(slurm: dict, name: str) -> dict:
    rec = slurm["by_name"].get(name)
    if rec is None:
        pytest.fail(f"job {name} did not run: {slurm['errors']} (see {slurm['dir']}/driver.log)")
    assert rec["errors"] == [], rec["errors"]
    assert rec["kills"], f"the kernel killed nothing in job {name}"
    assert [k.seq for k in rec["kills"]] == [k["seq"] for k in rec["kernel"]]  # what the guest waited for
    return rec


def step_cgroup(rec: dict) -> str:
    """The step's cgroup, as slurmstepd made it: <scope>/job_<id>/step_<step>."""
    [cgroup] = {re.sub(r"(/step_[^/]+)/.*$", r"\1", k.task_memcg) for k in rec["kills"]}
    assert cgroup.endswith(f"/job_{rec['job_id']}/step_{rec['spec']['step']}"), cgroup
    return cgroup


def final_events(rec: dict, cgroup: str) -> dict:
    """The cgroup's memory.events as last read before slurmstepd removed it."""
    assert cgroup in rec["cgroups"], f"{cgroup} was never read (read: {sorted(rec['cgroups'])})"
    return rec["cgroups"][cgroup]["last"]["memory.events"]


def step_messages(rec: dict) -> str:
    """Where slurmstepd's messages reach the user: srun's stderr, or the batch job's output file."""
    if rec["spec"]["submit"] == "sbatch":
        return rec.get("batch_output") or ""
    path = Path(rec["_dir"]) / "slurm" / f"{rec['spec']['name']}.srun.err"
    return path.read_text(errors="replace") if path.exists() else ""


def test_slurm_ran_and_made_the_jobs_cgroups(slurm) -> None:
    assert slurm["errors"] == [] and not slurm["prepare"].get("controller_errors")
    started = slurm["slurm"]
    assert started["munged"]["rc"] == 0 and "Success" in started["munge_check"]["stdout"]
    assert started["slurmctld"]["rc"] == 0 and started["slurmd"]["rc"] == 0
    assert started["database"]["ping"]["rc"] == 0 and started["database"]["grants"]["rc"] == 0
    assert started["accounting"]["slurmdbd"]["rc"] == 0 and started["accounting"]["cluster"]["rc"] == 0
    assert f"oomwatch|oomwatch|{USER}" in started["accounting"]["associations"]["stdout"].split()
    assert started["node_state"] == "idle"
    slurmd_log = (slurm["dir"] / "slurm" / "slurmd.log").read_text(errors="replace")
    assert "is not enabled" not in slurmd_log and "cgroup controller is not available" not in slurmd_log
    print(f"\nslurm: {started['versions']['slurmd']}, {started['versions']['slurmdbd']}, "
          f"{started['database']['version']}; node idle {started['seconds']:.1f} s after munged started")
    scope = re.compile(r"^/system\.slice/(?:[\w.-]+_)?slurmstepd\.scope/job_(\d+)/step_[\w]+(/.*)?$")
    for rec in slurm["jobs"]:
        made = [c for c in rec["cgroups"] if scope.match(c)]
        assert made, f"job {rec['job_id']}: no cgroup under slurmstepd.scope was seen"
        assert any(c.endswith("/user/task_0") for c in made), made
        print(f"slurm: job {rec['job_id']} ({rec['spec']['name']}): {sorted(made)}")


@pytest.mark.parametrize("name", JOBS)
def test_the_kernel_killed_the_jobs_process_at_its_limit(slurm, name: str) -> None:
    rec = job(slurm, name)
    cgroup = step_cgroup(rec)
    limit = MIB[rec["spec"]["mem"]] << 20
    for k in rec["kills"]:
        assert k.victim_uid == UID and {line.uid for line in k.kill_lines} == {UID}, k.summary()
        assert re.search(rf"/job_{rec['job_id']}$", k.oom_memcg) or k.oom_memcg.startswith(cgroup), k.summary()
        # the limit the kernel hit is --mem, as slurmstepd wrote it into the cgroup (ConstrainRAMSpace=yes)
        assert k.limit_kb * 1024 == limit, (k.limit_kb, limit)
        assert rec["cgroups"][k.oom_memcg].get("memory.max") == str(limit), rec["cgroups"][k.oom_memcg]
    print(f"\nslurm: {name} (job {rec['job_id']}): " + "; ".join(k.summary() for k in rec["kills"]))


@pytest.mark.parametrize("name", JOBS)
def test_oomwatch_names_job_step_user_and_processes(slurm, name: str) -> None:
    rec = job(slurm, name)
    by_seq = {i["kernel_seq"]: i for i in rec["agent_incidents"]}
    for k in rec["kills"]:
        inc = by_seq.get(k.seq)
        assert inc is not None, f"the agent did not publish the kill seq={k.seq} ({k.summary()})"
        wl = inc["workload"]
        assert (wl["type"], wl.get("slurm_job"), wl.get("slurm_step")) == ("slurm", rec["job_id"], rec["spec"]["step"])
        victim = inc["victim"]
        assert (victim["pid"], victim["comm"], victim["uid"]) == (k.victim_pid, k.victim_comm, UID)
        assert {p["pid"] for p in inc["killed"]} == k.killed_pids
        assert inc["memory"]["limit_bytes"] == k.limit_kb * 1024
        assert all(p["uid"] == UID for p in inc["killed"])
        assert f"Slurm job {rec['job_id']} step {rec['spec']['step']}" in inc["explanation"]
        print(f"\nslurm: {name}: oomwatch: {inc['explanation']}")


@pytest.mark.parametrize("name", JOBS)
def test_counts_equal_the_step_cgroups_memory_events(slurm, name: str) -> None:
    rec = job(slurm, name)
    cgroup = step_cgroup(rec)
    events = final_events(rec, cgroup)
    killed = sum(len(k.killed_pids) for k in rec["kills"])
    assert events["oom_kill"] == killed, f"memory.events {events}, kernel lines {killed}"
    at_kill = rec["at_kill"][-1]["cgroups"].get(cgroup)
    assert at_kill is not None and at_kill["memory.events"]["oom_kill"] == events["oom_kill"]
    job_cgroup = cgroup.rsplit("/", 1)[0]
    assert final_events(rec, job_cgroup)["oom_kill"] == events["oom_kill"]  # the job holds nothing else that died
    metrics = parse_metrics((Path(rec["_dir"]) / "slurm" / f"{name}.metrics.txt").read_text())
    processes = sum(s.value for s in select(metrics, "oomwatch_oom_killed_processes_total", cgroup=cgroup))
    incidents = sum(s.value for s in select(metrics, "oomwatch_oom_kills_total", cgroup=cgroup))
    assert processes == events["oom_kill"], f"agent killed processes {processes}, memory.events {events}"
    assert incidents == len(rec["kills"]), f"agent incidents {incidents}, kernel {len(rec['kills'])}"
    print(f"\nslurm: {name}: {cgroup}: memory.events oom_kill={events['oom_kill']} oom={events['oom']}; "
          f"oomwatch {processes:.0f} processes in {incidents:.0f} incidents")


@pytest.mark.parametrize("name", JOBS)
def test_slurm_reports_the_same_kills(slurm, name: str) -> None:
    rec = job(slurm, name)
    assert rec["job_state"] == "OUT_OF_MEMORY", rec["scontrol_root"]["stdout"]
    detected = re.findall(r"Detected (\d+) oom-kill event\(s\) in StepId=(\d+)\.(\w+)", step_messages(rec))
    user_cgroup = step_cgroup(rec) + "/user"
    want = final_events(rec, user_cgroup)["oom_kill"]  # what slurmstepd reads: the step's user cgroup
    assert (str(want), rec["job_id"], rec["spec"]["step"]) in detected, (detected, want)
    line = next(m for m in re.findall(r".*Detected \d+ oom-kill event.*", step_messages(rec)))
    print(f"\nslurm: {name}: JobState={rec['job_state']}; {line.strip()}")


def entry_for(inc: dict) -> str:
    """The tag the agent gives an incident's entry: 8 hex of sha256 over its key (oomwatch.sinks.slurm)."""
    return hashlib.sha256(repr(tuple(incident_key_of_json(inc))).encode()).hexdigest()[:8]


def admin_comment(text: str) -> str | None:
    m = re.search(r"^\s*AdminComment=(.*?) ?$", text, re.MULTILINE)
    return m.group(1) if m else None


@pytest.mark.parametrize("name", JOBS)
def test_the_explanation_is_in_the_jobs_admin_comment(slurm, name: str) -> None:
    rec = job(slurm, name)
    root_view = admin_comment(rec["scontrol_root"]["stdout"])
    written = [line for line in rec["agent_sink_lines"] if re.search(rf"job {rec['job_id']}: \[oomwatch", line)]
    ended = [line for line in rec["agent_sink_lines"] if "had ended before its comment could be written" in line]
    if name not in STILL_RUNNING and not written:
        # the race the agent may lose: slurmctld refused, and said why
        assert ended and "Job has already finished" in ended[0], rec["agent_sink_lines"]
        assert root_view is None
        print(f"\nslurm: {name}: the job had ended before the agent wrote: {ended[0]}")
        return
    assert written, f"the agent wrote no AdminComment for job {rec['job_id']}: {rec['agent_sink_lines']}"
    assert root_view is not None, rec["scontrol_root"]["stdout"]
    assert written[-1].endswith(f"job {rec['job_id']}: {root_view}")  # what it wrote is what slurmctld keeps
    assert admin_comment(rec["scontrol_owner"]["stdout"]) == root_view  # the job's owner sees it too
    for inc in rec["agent_incidents"]:
        assert f"#{entry_for(inc)}] " in root_view, (inc["kernel_seq"], root_view)
        victim = inc["victim"]
        assert f"{victim['comm']} (pid {victim['pid']}, user {USER})" in root_view
        assert inc["explanation"].replace("'", "").replace('"', "") in root_view
    assert len(TAG.findall(root_view)) == len(rec["agent_incidents"])
    print(f"\nslurm: {name}: scontrol show job {rec['job_id']}: AdminComment={root_view}")


@pytest.mark.parametrize("name", JOBS)
def test_sacct_shows_the_owner_the_out_of_memory_job_and_step_and_the_explanation(slurm, name: str) -> None:
    """What a Slurm user looks at after the job: `sacct -j JOB` from slurmdbd's database, as the job's owner runs
    it. Slurm 22.05 gives the job and the step the kernel killed in OUT_OF_MEMORY; the job's AdminComment is the
    one slurmctld had (the agent's explanation, or nothing where the job ended before the agent wrote)."""
    rec = job(slurm, name)
    owner, root = rec["sacct_owner"], rec["sacct_root"]
    assert owner["rc"] == 0 and owner["rows"], owner
    assert owner["rows"] == root["rows"]  # the owner sees what root sees of the job
    rows = {r["JobID"]: r for r in owner["rows"]}
    job_row, step_row = rows.get(rec["job_id"]), rows.get(f"{rec['job_id']}.{rec['spec']['step']}")
    assert job_row is not None and step_row is not None, owner["stdout"]
    assert (job_row["User"], job_row["JobName"]) == (USER, rec["job_name"])
    assert (job_row["State"], step_row["State"]) == ("OUT_OF_MEMORY", "OUT_OF_MEMORY"), owner["stdout"]
    comment = admin_comment(rec["scontrol_root"]["stdout"])
    assert job_row["AdminComment"] == (comment or ""), (job_row["AdminComment"], comment)
    assert all(r["AdminComment"] == "" for r in owner["rows"] if r is not job_row)  # steps have none
    if comment is not None:
        for inc in rec["agent_incidents"]:
            assert f"#{entry_for(inc)}] " in job_row["AdminComment"]
            assert inc["explanation"].replace("'", "").replace('"', "") in job_row["AdminComment"]
    print(f"\nslurm: {name}: sacct -j {rec['job_id']} as {USER} after the four jobs (slurmdbd had it all at "
          f"sacct call {root.get('calls')}): "
          + "; ".join(f"{r['JobID']} {r['State']} {r['ExitCode']}" for r in owner["rows"])
          + f"; AdminComment={job_row['AdminComment'] or '(none)'}")
