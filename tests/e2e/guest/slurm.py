#!/usr/bin/env python3
"""Guest side of the real Slurm scenario (its own VM boot: tests/e2e/test_slurm.py). Runs INSIDE the virtme-ng
guest, as root, with the project's venv python.

`oomwatch agent` starts first (a plain process, as tests/e2e/guest/driver.py starts it, with
--slurm-admin-comment), then Debian's munged, slurmctld and slurmd (Slurm 22.05: cgroup/v2 with IgnoreSystemd=yes,
task/cgroup with ConstrainRAMSpace=yes, one node). A user submits four jobs that exceed their --mem: a
single-task step (srun), a two-task step whose task 0 grows (srun -n2), a batch step (sbatch), and a step whose
process forks workers. slurmd and slurmstepd make every job's cgroups; the test makes only what systemd would
have made before them (system.slice, the root's controllers). For each job this records what the kernel did
(its /dev/kmsg records, the job's cgroups' memory.events read as soon as the kill is in the log and then every
50 ms until slurmstepd removes them), what Slurm reported (`scontrol show job` as root and as the job's owner,
srun's stderr or the batch output file, slurmd's log) and what the agent published (/incidents, /metrics, its
log lines about the AdminComment it wrote).

Layout of --out: started.json, run.json, driver.log, kmsg-all.raw, agent/ (log, events file),
slurm/slurm.json (everything above, per job), slurm/<job>.metrics.txt, slurm/*.log, slurm/*.conf.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import driver  # noqa: E402 (the real-kernel tier's guest driver: kernel-log recorder, agent, helpers)

CG = driver.CG
WORK = f"{driver.WORK}/slurm"
USER, UID = "alice", 2001  # the jobs' owner, added to the guest's /etc/passwd (an overlay: the host's is untouched)
HOME = f"{WORK}/home"
# The jobs run as alice, who may not read the checkout (a clone under a 0700 home or `mktemp -d` directory): what
# they run is copied into the guest's tmpfs, root's and world-readable, as a site installs a job's program.
JOBS_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slurm_jobs.py")
JOBS_PY = f"{WORK}/bin/slurm_jobs.py"
PYTHON = "/usr/bin/python3"  # the guest's (the host's) python3 runs the jobs, as a user's job would
# glibc's getaddrinfo(AI_ADDRCONFIG), as Slurm calls it, finds no IPv4 address while lo's 127.0.0.1 is the only
# one ("Unable to resolve 127.0.0.1"): a documentation address on lo gives the guest one.
EXTRA_ADDRESS = "192.0.2.1/32"
BATCH_SCRIPT = f"""#!/bin/sh
{PYTHON} {JOBS_PY} hog 300
echo "batch: the hog exited with $?"
sleep 20
echo "batch: done"
"""
# name, how it is submitted, --mem, extra options, what it runs, the step the kill is in
JOBS = [
    {"name": "single_task", "submit": "srun", "mem": "64M", "options": ["-n1"], "run": ["hog", "300"],
     "step": "0"},
    {"name": "multi_task", "submit": "srun", "mem": "96M", "options": ["-n2"], "run": ["tasks", "300", "25"],
     "step": "0"},
    {"name": "batch", "submit": "sbatch", "mem": "64M", "options": [], "run": None, "step": "batch"},
    {"name": "forked_workers", "submit": "srun", "mem": "160M", "options": ["-n1"],
     "run": ["workers", "3", "60", "15"], "step": "0"},
]
# Accounting: Debian's slurmdbd with a MariaDB server of the guest's own (its data on the guest's tmpfs, TCP on
# 127.0.0.1 only), so that `sacct` shows the jobs as a cluster's users see them.
DB_DIR = f"{WORK}/mysql"
DB_SOCKET = f"{DB_DIR}/mysqld.sock"
DB_PORT, DBD_PORT = 3306, 6819
DB_USER, DB_PASSWORD, DB_NAME = "slurm", "oomwatch-e2e", "slurm_acct_db"
ACCOUNT = "oomwatch"
# what sacct prints per job and step; AdminComment last, so that a "|" in it cannot shift a field
SACCT_FIELDS = "JobID,JobName,User,State,ExitCode,AdminComment"
ENDED_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL",
                "PREEMPTED", "DEADLINE")
log = driver.log


def run(argv: list[str], timeout: float = 60, user: str | None = None, env: dict | None = None) -> dict:
    """Run a command (as `user` through runuser); its exit status and output, never an exception."""
    if user:
        argv = ["runuser", "-u", user, "--", *argv]
    t = time.monotonic()
    try:
        r = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout,
                           stdin=subprocess.DEVNULL, env=env)
        out = {"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr}
    except (OSError, subprocess.TimeoutExpired) as e:
        out = {"rc": None, "stdout": "", "stderr": f"{type(e).__name__}: {e}"}
    out.update(argv=argv, seconds=round(time.monotonic() - t, 3))
    return out


# ------------------------------------------------------------------------------------------------ the cluster
def prepare(host: str) -> dict:
    """What the node has before Slurm starts: an address, the cgroup controllers and system.slice (systemd's
    part on a real node), the user, Slurm's and munge's directories and configuration."""
    facts: dict = {"host": host}
    facts["address"] = run(["ip", "addr", "add", EXTRA_ADDRESS, "dev", "lo"])
    for controller in ("cpuset", "cpu", "memory", "pids"):
        try:
            driver.wfile(f"{CG}/cgroup.subtree_control", f"+{controller}")
        except OSError as e:
            facts.setdefault("controller_errors", []).append(f"{controller}: {e}")
    # system.slice as systemd leaves it: memory and pids enabled for its children. Slurm 22.05 reads the last
    # word of cgroup.controllers with its newline (fixed in 23.02.1, commit 316df8dc73 "Fix parsing of
    # cgroup.controllers file"): were memory the scope's last controller, slurmd would say "Controller memory
    # is not enabled!" and task/cgroup would refuse every job.
    os.makedirs(f"{CG}/system.slice", exist_ok=True)
    for controller in ("memory", "pids"):
        try:
            driver.wfile(f"{CG}/system.slice/cgroup.subtree_control", f"+{controller}")
        except OSError as e:
            facts.setdefault("controller_errors", []).append(f"system.slice {controller}: {e}")
    with open("/etc/passwd", "a") as f:
        f.write(f"{USER}:x:{UID}:{UID}:oomwatch e2e:{HOME}:/bin/sh\n")
    with open("/etc/group", "a") as f:
        f.write(f"{USER}:x:{UID}:\n")
    for d, owner, mode in ((driver.WORK, "root", 0o755), (WORK, "root", 0o755), (f"{WORK}/etc", "root", 0o755),
                           (f"{WORK}/bin", "root", 0o755), (DB_DIR, "mysql", 0o755), (f"{WORK}/state", "slurm", 0o755),
                           (f"{WORK}/spool", "root", 0o755), (f"{WORK}/log", "slurm", 0o755),
                           (f"{WORK}/munge", "munge", 0o700), ("/run/munge", "munge", 0o755), (HOME, USER, 0o755)):
        os.makedirs(d, exist_ok=True)
        shutil.chown(d, owner, owner)
        os.chmod(d, mode)
    conf = {
        "slurm.conf": f"""# oomwatch real-kernel tier: one node, written by tests/e2e/guest/slurm.py
ClusterName=oomwatch
SlurmctldHost={host}(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={WORK}/state
SlurmdSpoolDir={WORK}/spool
SlurmctldPidFile={WORK}/slurmctld.pid
SlurmdPidFile={WORK}/slurmd.pid
SlurmctldLogFile={WORK}/log/slurmctld.log
SlurmdLogFile={WORK}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=verbose
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={DBD_PORT}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# the guest has one CPU; four let the two-task step run without oversubscribing
SlurmdParameters=config_overrides
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
MinJobAge=3600
NodeName={host} NodeAddr=127.0.0.1 CPUs=4 RealMemory=512 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""",
        "cgroup.conf": """# slurmd makes its cgroups itself where systemd is not init
CgroupPlugin=cgroup/v2
IgnoreSystemd=yes
CgroupAutomount=yes
ConstrainRAMSpace=yes
ConstrainSwapSpace=no
ConstrainCores=no
""",
    }
    for name, text in conf.items():
        path = f"{WORK}/etc/{name}"
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o644)
    # slurmdbd reads slurmdbd.conf beside SLURM_CONF and refuses it unless SlurmUser owns it, mode 0600 (it holds
    # the database password)
    dbd_conf = f"""# oomwatch real-kernel tier: accounting, written by tests/e2e/guest/slurm.py
AuthType=auth/munge
DbdHost={host}
DbdAddr=127.0.0.1
DbdPort={DBD_PORT}
SlurmUser=slurm
DebugLevel=info
LogFile={WORK}/log/slurmdbd.log
PidFile={WORK}/log/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={DB_PORT}
StorageUser={DB_USER}
StoragePass={DB_PASSWORD}
StorageLoc={DB_NAME}
"""
    path = f"{WORK}/etc/slurmdbd.conf"
    with open(path, "w") as f:
        f.write(dbd_conf)
    shutil.chown(path, "slurm", "slurm")
    os.chmod(path, 0o600)
    conf["slurmdbd.conf"] = dbd_conf.replace(DB_PASSWORD, "<password>")
    shutil.copyfile(JOBS_SOURCE, JOBS_PY)
    os.chmod(JOBS_PY, 0o644)
    with open(f"{HOME}/batch.sh", "w") as f:
        f.write(BATCH_SCRIPT)
    os.chmod(f"{HOME}/batch.sh", 0o755)
    facts["conf"] = conf
    facts["cgroup_root_subtree"] = (driver.rfile(f"{CG}/cgroup.subtree_control") or "").strip()
    return facts


def start_database() -> dict:
    """A MariaDB server as Debian's package runs it (as mysql), with a data directory of its own on the tmpfs and
    only the options a small node needs; then slurmdbd's database user, as Slurm's accounting guide makes it."""
    facts: dict = {"t0": time.monotonic()}
    # install-db runs the server too: with the same sizes, it writes a 16 MiB redo log, not the default 96 MiB
    server = ["--no-defaults", "--user=mysql", f"--datadir={DB_DIR}/data", "--skip-log-bin",
              "--performance-schema=OFF", "--innodb-buffer-pool-size=32M", "--innodb-log-file-size=16M"]
    facts["install_db"] = run(["mariadb-install-db", *server, "--auth-root-authentication-method=socket",
                               "--skip-test-db"], timeout=300)
    log(f"slurm: mariadb-install-db exit {facts['install_db']['rc']} in {facts['install_db']['seconds']:.1f}s")
    err = open(f"{DB_DIR}/mariadbd.err", "ab")
    facts["pid"] = subprocess.Popen(
        ["/usr/sbin/mariadbd", *server, f"--socket={DB_SOCKET}", f"--pid-file={DB_DIR}/mariadbd.pid",
         "--bind-address=127.0.0.1", f"--port={DB_PORT}", "--skip-name-resolve",
         # Slurm's accounting guide: slurmdbd's schema changes and purges hold locks for long
         "--innodb-lock-wait-timeout=900"],
        stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True).pid
    client = ["mariadb", "--no-defaults", f"--socket={DB_SOCKET}", "-u", "root"]
    end = time.monotonic() + 180
    ping = run([*client, "-e", "SELECT 1"])
    while ping["rc"] != 0 and time.monotonic() < end:
        time.sleep(1)
        ping = run([*client, "-e", "SELECT 1"])
    facts["ping"] = ping
    grants = "".join(f"CREATE USER '{DB_USER}'@'{h}' IDENTIFIED BY '{DB_PASSWORD}'; "
                     f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'{h}'; " for h in ("localhost", "127.0.0.1"))
    facts["grants"] = run([*client, "-e", grants])
    facts["version"] = run(["/usr/sbin/mariadbd", "--version"])["stdout"].strip()
    facts["seconds"] = time.monotonic() - facts["t0"]
    log(f"slurm: MariaDB {'up' if ping['rc'] == 0 else 'NOT up'} after {facts['seconds']:.1f}s")
    return facts


def start_slurmdbd() -> dict:
    """slurmdbd, then the cluster, an account and alice's association in it (sacctmgr, as an admin adds them)."""
    facts: dict = {"t0": time.monotonic(), "slurmdbd": run(["/usr/sbin/slurmdbd"])}
    # slurmdbd makes its tables before it listens: sacctmgr answers once it does
    end = time.monotonic() + 240
    facts["cluster"] = run(["sacctmgr", "-i", "add", "cluster", "oomwatch"])
    while facts["cluster"]["rc"] != 0 and time.monotonic() < end:
        time.sleep(2)
        facts["cluster"] = run(["sacctmgr", "-i", "add", "cluster", "oomwatch"])
    facts["account"] = run(["sacctmgr", "-i", "add", "account", ACCOUNT, "Cluster=oomwatch"])
    facts["user"] = run(["sacctmgr", "-i", "add", "user", USER, f"Account={ACCOUNT}", "Cluster=oomwatch"])
    facts["associations"] = run(["sacctmgr", "-n", "-P", "show", "associations", "format=Cluster,Account,User"])
    facts["seconds"] = time.monotonic() - facts["t0"]
    log(f"slurm: slurmdbd answered after {facts['seconds']:.1f}s: {facts['associations']['stdout'].split()}")
    return facts


def start_slurm(host: str) -> dict:
    """munged, MariaDB, slurmdbd, slurmctld, slurmd, as their packages' services would start them; then wait for
    the node."""
    facts: dict = {"t0": time.monotonic()}
    facts["munged"] = run(["runuser", "-u", "munge", "--", "/usr/sbin/munged", f"--log-file={WORK}/munge/munged.log",
                           f"--pid-file={WORK}/munge/munged.pid", f"--seed-file={WORK}/munge/munged.seed"])
    facts["munge_check"] = run(["sh", "-c", "munge -n | unmunge"])
    facts["database"] = start_database()
    facts["accounting"] = start_slurmdbd()
    facts["slurmctld"] = run(["/usr/sbin/slurmctld"])
    facts["slurmd"] = run(["/usr/sbin/slurmd"])
    facts["node_state"] = wait_node_idle(host, 120)
    facts["seconds"] = time.monotonic() - facts["t0"]
    facts["versions"] = {b: run([b, "-V"])["stdout"].strip() for b in ("slurmctld", "slurmd", "scontrol", "sacct")}
    # slurmdbd -V reads its configuration before it says its version: the package's word instead
    facts["versions"]["slurmdbd"] = "slurmdbd " + run(["dpkg-query", "-W", "-f=${Version}", "slurmdbd"])["stdout"]
    facts["cgroups"] = {d: {"controllers": (driver.rfile(f"{CG}{d}/cgroup.controllers") or "").strip(),
                            "subtree_control": (driver.rfile(f"{CG}{d}/cgroup.subtree_control") or "").strip()}
                        for d in ["", "/system.slice", *(s[len(CG):] for s in scope_dirs())]}
    log(f"slurm: node {facts['node_state']} after {facts['seconds']:.1f}s")
    return facts


def scope_dirs() -> list[str]:
    base = f"{CG}/system.slice"
    try:
        return [f"{base}/{n}" for n in sorted(os.listdir(base)) if n.endswith("slurmstepd.scope")]
    except OSError:
        return []


def node_state(host: str) -> str:
    r = run(["sinfo", "-h", "-n", host, "-o", "%T"], timeout=20)
    return r["stdout"].strip() or f"unknown ({r['stderr'].strip()[:200]})"


def wait_node_idle(host: str, timeout: float) -> str:
    end = time.monotonic() + timeout
    state = node_state(host)
    while state != "idle" and time.monotonic() < end:
        time.sleep(1)
        state = node_state(host)
    return state


# ------------------------------------------------------------------------------------------------ ground truth
class CgroupTracker(threading.Thread):
    """Reads every job cgroup slurmstepd made, every 100 ms, until it is gone: the last reading of each is its
    final memory.events (slurmstepd removes the cgroups as the step ends). Its memory.oom.group is read once,
    when it is first seen; its memory.max is the last value read while the file was there."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="cgroup-tracker")
        self.lock = threading.Lock()
        self.readings: dict[str, dict] = {}
        self.stop_evt = threading.Event()

    def run(self) -> None:
        while not self.stop_evt.wait(0.1):
            for scope in scope_dirs():
                for dirpath, _dirs, _files in os.walk(scope):
                    if "/job_" in dirpath:
                        self.read(dirpath[len(CG):])

    def read(self, rel: str) -> dict | None:
        events = driver.cg_events(rel)
        if events is None:
            return None
        reading = {"mono": time.monotonic(), "memory.events": events, "procs": driver.cg_procs(rel),
                   # slurmstepd sets the limits after making the cgroups: read each time
                   "memory.max": (driver.rfile(f"{CG}{rel}/memory.max") or "").strip() or None}
        with self.lock:
            entry = self.readings.get(rel)
            if entry is None:
                entry = self.readings[rel] = {
                    "first": reading,
                    "memory.oom.group": (driver.rfile(f"{CG}{rel}/memory.oom.group") or "").strip() or None,
                }
            entry["last"] = reading
            # the last reading may race slurmstepd's rmdir (memory.events read, memory.max already gone): keep
            # the limit from the last reading that still had it
            if reading["memory.max"] is not None:
                entry["memory.max"] = reading["memory.max"]
        return reading

    def of_job(self, job: str) -> dict:
        with self.lock:
            return {rel: dict(v) for rel, v in self.readings.items() if re.search(rf"/job_{job}(/|$)", rel)}


def job_cgroups(job: str) -> list[str]:
    out = []
    for scope in scope_dirs():
        top = f"{scope}/job_{job}"
        for dirpath, _dirs, _files in os.walk(top):
            out.append(dirpath[len(CG):])
    return out


def job_id_by_name(name: str) -> str | None:
    r = run(["scontrol", "-o", "show", "jobs"], timeout=20)
    ids = re.findall(rf"^JobId=(\d+) JobName={re.escape(name)} ", r["stdout"], re.MULTILINE)
    return ids[-1] if ids else None


def job_state(job: str) -> str | None:
    m = re.search(r"\bJobState=(\S+)", run(["scontrol", "show", "job", job], timeout=20)["stdout"])
    return m.group(1) if m else None


def admin_comment(scontrol_text: str) -> str:
    m = re.search(r"^\s*AdminComment=(.*?) ?$", scontrol_text, re.MULTILINE)
    return m.group(1) if m else ""


def sacct(job: str, user: str | None = None) -> dict:
    """`sacct -j JOB` as `user` (root when None): its output and its rows, one per job and step."""
    r = run(["sacct", "-j", job, "--noheader", "--parsable2", f"--format={SACCT_FIELDS}"], timeout=30, user=user)
    names = SACCT_FIELDS.split(",")
    r["rows"] = [dict(zip(names, line.split("|", len(names) - 1))) for line in r["stdout"].splitlines() if line]
    return r


def accounting(rec: dict) -> None:
    """What sacct shows of the job, once slurmdbd has it as slurmctld last had it: every row ended, and the job's
    AdminComment the one `scontrol show job` showed (slurmctld sends both to slurmdbd as they change)."""
    job = rec["job_id"]
    want = admin_comment(rec["scontrol_root"]["stdout"])
    end = time.monotonic() + 90
    calls = 0
    while True:
        view = sacct(job)
        calls += 1
        rows = view["rows"]
        ended = rows and all(r["State"].split()[0] in ENDED_STATES for r in rows)
        stored = any(r["JobID"] == job and r["AdminComment"] == want for r in rows)
        if (ended and stored) or time.monotonic() > end:
            break
        time.sleep(1)
    view["calls"] = calls  # 1: slurmdbd had it all when first asked
    rec["sacct_root"] = view
    rec["sacct_owner"] = sacct(job, user=USER)
    log(f"  sacct -j {job}: " + "; ".join(f"{r['JobID']} {r['State']}" for r in rows) + f" (sacct call {calls})")


def sink_lines(agent_log: str, job: str) -> list[str]:
    try:
        with open(agent_log, errors="replace") as f:
            return [line.rstrip("\n") for line in f if re.search(rf"Slurm AdminComment: job {job}\b", line)]
    except OSError:
        return []


# ------------------------------------------------------------------------------------------------ the jobs
def run_job(ctx, spec: dict, tracker: CgroupTracker, host: str) -> dict:
    name = f"oomwatch-{spec['name']}"
    rec: dict = {"spec": spec, "job_name": name, "errors": [], "at_kill": []}
    out_dir = os.path.join(ctx.out, "slurm")
    log(f"=== job {spec['name']}: {spec['submit']} --mem={spec['mem']} {' '.join(spec['options'])}")
    seq0 = ctx.kmsg.mark(f"slurm job {spec['name']} begin")[0]
    rec["kmsg_seq_start"] = seq0
    base = ["--job-name", name, f"--mem={spec['mem']}", f"--chdir={HOME}", *spec["options"]]
    proc = None
    rec["t_submit"] = time.monotonic()
    if spec["submit"] == "srun":
        stdout = open(os.path.join(out_dir, f"{spec['name']}.srun.out"), "w")
        stderr = open(os.path.join(out_dir, f"{spec['name']}.srun.err"), "w")
        proc = subprocess.Popen(["runuser", "-u", USER, "--", "srun", *base, PYTHON, JOBS_PY, *spec["run"]],
                                stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)
        job = None
        end = time.monotonic() + 60
        while job is None and time.monotonic() < end:
            time.sleep(0.3)
            job = job_id_by_name(name)
    else:
        r = run(["sbatch", "--parsable", *base, f"--output={HOME}/slurm-%j.out", f"{HOME}/batch.sh"], user=USER)
        rec["sbatch"] = r
        job = r["stdout"].strip().split(";")[0] or None
    rec["job_id"] = job
    if job is None:
        rec["errors"].append("no job id: the job was not submitted")
        return rec
    log(f"  job {name} is {job}")
    # the kernel's kills in this job: memory.events read as soon as each is in the log
    seen = 0
    end = time.monotonic() + 150
    finished = False
    while time.monotonic() < end:
        kills = [k for k in ctx.kmsg.incidents_since(seq0) if re.search(rf"/job_{job}(/|$)", k.task_memcg or "")]
        if len(kills) > seen:
            rec["at_kill"].append({"seq": kills[-1].seq, "mono": time.monotonic(),
                                   "cgroups": {rel: tracker.read(rel) for rel in job_cgroups(job)}})
            log(f"  kernel: {kills[-1].summary()}")
            seen = len(kills)
        if proc is not None:
            finished = proc.poll() is not None
        else:
            finished = (job_state(job) or "").split("+")[0] in ENDED_STATES
        if finished and not job_cgroups(job):
            break
        time.sleep(0.1)
    if proc is not None:
        if proc.poll() is None:
            rec["errors"].append("srun still running after 150 s: killed")
            proc.kill()
        rec["srun_rc"] = proc.wait()
    rec["t_end"] = time.monotonic()
    ctx.kmsg.wait_quiet(1.0, 20)
    kills = [k for k in ctx.kmsg.incidents_since(seq0) if re.search(rf"/job_{job}(/|$)", k.task_memcg or "")]
    rec["kernel"] = [{"seq": k.seq, "summary": k.summary(), "task_memcg": k.task_memcg, "oom_memcg": k.oom_memcg,
                      "victim_pid": k.victim_pid, "victim_comm": k.victim_comm, "victim_uid": k.victim_uid,
                      "killed": sorted(k.killed_pids), "kind": k.kind, "limit_kb": k.limit_kb} for k in kills]
    if not kills:
        rec["errors"].append("the kernel killed nothing in this job")
    # what the agent published, and what its Slurm sink did, for each of the kernel's kills
    end = time.monotonic() + 40
    while time.monotonic() < end:
        incidents = ctx.agent.incidents() or []
        mine = [i for i in incidents if i.get("kernel_seq") in {k.seq for k in kills}]
        lines = sink_lines(ctx.agent.log_path, job)
        if len(mine) >= len(kills) and len(lines) >= len(kills):
            break
        time.sleep(0.5)
    rec["agent_incidents"] = mine
    rec["agent_sink_lines"] = lines
    rec["cgroups"] = tracker.of_job(job)
    rec["scontrol_root"] = run(["scontrol", "show", "job", job])
    rec["scontrol_owner"] = run(["scontrol", "show", "job", job], user=USER)
    rec["job_state"] = job_state(job)
    if spec["submit"] == "sbatch":
        rec["batch_output"] = driver.rfile(f"{HOME}/slurm-{job}.out")
    with open(os.path.join(out_dir, f"{spec['name']}.metrics.txt"), "w") as f:
        f.write(ctx.agent.metrics() or "# agent not running\n")
    rec["node_state_after"] = wait_node_idle(host, 60)
    if rec["node_state_after"] != "idle":
        rec["errors"].append(f"node {rec['node_state_after']} after the job")
        run(["scontrol", "update", f"NodeName={host}", "State=RESUME"])
    rec["kmsg_seq_end"] = ctx.kmsg.mark(f"slurm job {spec['name']} end")[0]
    log(f"  job {job}: {rec['job_state']}; agent published {len(mine)} of {len(kills)}; sink: {lines}")
    return rec


class Ctx:
    def __init__(self, out: str, agent: str) -> None:
        self.out = out
        self.kmsg = driver.KmsgRecorder(os.path.join(out, "kmsg-all.raw"))
        self.agent = driver.Agent(agent, out)
        self.calib: list[dict] = []


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--agent", required=True, help="path of the oomwatch executable")
    ap.add_argument("--agent-start-timeout", type=float, default=60.0)
    args = ap.parse_args()
    out = args.out
    os.makedirs(os.path.join(out, "slurm"), exist_ok=True)
    driver.OUT = out
    driver._log_file = open(os.path.join(out, "driver.log"), "a")
    driver.protect_self()
    host = socket.gethostname()
    run_rec: dict = {
        "uptime_at_start": float(open("/proc/uptime").read().split()[0]),
        "wall_minus_mono": time.time() - time.monotonic(),
        "boot_id": open("/proc/sys/kernel/random/boot_id").read().strip(),
        "kernel": os.uname().release,
        "host": host,
    }
    driver.jdump(os.path.join(out, "started.json"), run_rec)
    log(f"slurm driver up, kernel {run_rec['kernel']}, host {host}")
    ctx = Ctx(out, args.agent)
    ctx.kmsg.start()
    ctx.calib.append(ctx.kmsg.calibrate("calibrate start"))
    result: dict = {"prepare": prepare(host), "jobs": [], "errors": []}
    os.environ["SLURM_CONF"] = f"{WORK}/etc/slurm.conf"  # the daemons', the clients' and the agent's scontrol
    os.environ["OOMWATCH_SLURM_ADMIN_COMMENT"] = "true"
    run_rec["agent_start"] = ctx.agent.start(args.agent_start_timeout)
    tracker = CgroupTracker()
    try:
        result["slurm"] = start_slurm(host)
        if result["slurm"]["node_state"] != "idle":
            result["errors"].append(f"the node is {result['slurm']['node_state']}, not idle")
        else:
            tracker.start()
            for spec in JOBS:
                try:
                    result["jobs"].append(run_job(ctx, spec, tracker, host))
                except Exception as e:  # the other jobs still tell something
                    result["errors"].append(f"{spec['name']}: {type(e).__name__}: {e}")
                    log(f"  ERROR in {spec['name']}: {e}")
                driver.jdump(os.path.join(out, "slurm", "slurm.json"), result)
            for rec in result["jobs"]:
                if rec.get("job_id") and rec.get("scontrol_root"):
                    accounting(rec)
    finally:
        tracker.stop_evt.set()
        result["metrics_final"] = ctx.agent.metrics()
        result["incidents_final"] = ctx.agent.incidents()
        run_rec["agent_stop"] = ctx.agent.stop()
        result["shutdown"] = run(["scontrol", "shutdown"], timeout=30)
        # slurmdbd before its database (else it logs failed reconnections), then munged
        for pid_file in (f"{WORK}/log/slurmdbd.pid", f"{DB_DIR}/mariadbd.pid", f"{WORK}/munge/munged.pid"):
            pid = (driver.rfile(pid_file) or "").strip()
            if pid.isdigit():
                try:
                    os.kill(int(pid), signal.SIGTERM)
                except OSError:
                    continue
                end = time.monotonic() + 20
                while os.path.exists(f"/proc/{pid}") and time.monotonic() < end:
                    time.sleep(0.2)
        for path in (f"{WORK}/log/slurmctld.log", f"{WORK}/log/slurmd.log", f"{WORK}/log/slurmdbd.log",
                     f"{WORK}/munge/munged.log", f"{DB_DIR}/mariadbd.err", f"{WORK}/etc/slurm.conf",
                     f"{WORK}/etc/cgroup.conf"):
            if os.path.exists(path):
                shutil.copy(path, os.path.join(out, "slurm", os.path.basename(path)))
        ctx.calib.append(ctx.kmsg.calibrate("calibrate end"))
        run_rec["calibration"] = ctx.calib
        driver.jdump(os.path.join(out, "slurm", "slurm.json"), result)
        driver.jdump(os.path.join(out, "run.json"), run_rec)
        ctx.kmsg.stop_evt.set()
        ctx.kmsg.join(5)
    log("slurm driver done")
    with open(os.path.join(out, "done"), "w") as f:
        f.write("ok\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
