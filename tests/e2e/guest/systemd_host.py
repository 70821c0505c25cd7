"""Guest side of the systemd host scenario (its own VM boot, systemd as PID 1: tests/e2e/test_systemd.py).

Run as root from virtme-ng's serial getty once systemd has booted. What it does, as a user of a plain systemd
host would:
1. extracts the checkout (a tar of its files, made by the host test) to /tmp/oomwatch-src and runs
   `scripts/install-systemd` there: a virtualenv in /opt/oomwatch, the unit, `systemctl enable --now`. The
   guest has no network: pip reads PIP_NO_INDEX / PIP_FIND_LINKS (a wheelhouse scripts/setup-vm made).
2. waits for the agent's /healthz, then records how the unit really runs: the process's uid and capabilities,
   its namespace view of /dev, `systemd-analyze security oomwatch.service` of the running unit.
3. three OOM kills in units of a slice of their own (oomtest.slice, so its hierarchical memory.events count
   what the units' own counted even after systemd removed their cgroups):
   - `oomtest-hog.service`, MemoryMax=64M, OOMPolicy unset (stop): the kernel kills dd alone, systemd stops
     the rest and fails the unit with result oom-kill;
   - `systemd-run --scope -p MemoryMax=64M` (oomtest-single.scope): the same for a transient scope;
   - `systemd-run --scope -p MemoryMax=64M -p OOMPolicy=kill` (oomtest-group.scope): systemd sets
     memory.oom.group=1 and the kernel kills every process of the scope.
   Each hog (dd with a 128 MiB buffer) waits on a FIFO until the unit's cgroup files were read. After each
   kill: the agent's incident, `journalctl -u UNIT` (text and JSON) and `systemctl status UNIT` as a user runs
   them, `systemctl show`, the unit's memory.events as last read (inotify) and the slice's before and after.
4. the agent's own journal (`journalctl -u oomwatch`), /metrics, /incidents, then `systemctl stop oomwatch`.
Everything lands in the shared directory as systemd.json plus the raw kernel log (kmsg-all.raw).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request

import kmsgtruth  # noqa: E402 (the guest directory is this script's)

CG = "/sys/fs/cgroup"
AGENT = "http://127.0.0.1:9717"
SLICE = "oomtest.slice"
FIFO_DIR = "/run/oomtest"
SRC = "/tmp/oomwatch-src"
HOG = "dd if=/dev/zero of=/dev/null bs=128M count=1"  # its buffer is written by read(): resident
SERVICE = "oomtest-hog.service"
SERVICE_UNIT = f"""[Unit]
Description=oomwatch test: a service that outgrows its MemoryMax

[Service]
Type=exec
Slice={SLICE}
MemoryMax=64M
MemorySwapMax=0
ExecStart=/bin/sh -c 'sleep 1000 & read go < {FIFO_DIR}/{SERVICE}; exec {HOG}'
"""
SLICE_UNIT = "[Unit]\nDescription=oomwatch test units\n"
MEMORY_EVENTS = ("low", "high", "max", "oom", "oom_kill", "oom_group_kill")


def log(msg: str) -> None:
    print(f"[{time.monotonic():8.1f}] {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], timeout: float = 60, env: dict | None = None) -> dict:
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **(env or {})})
        out = {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr}
    except subprocess.TimeoutExpired as e:
        out = {"rc": None, "stdout": str(e.stdout or ""), "stderr": f"timed out after {timeout}s"}
    except OSError as e:
        out = {"rc": None, "stdout": "", "stderr": str(e)}
    out.update(cmd=cmd, seconds=round(time.monotonic() - t, 2))
    return out


def cat(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def http(path: str, timeout: float = 10) -> tuple[int | None, str]:
    try:
        with urllib.request.urlopen(AGENT + path, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return None, str(e)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def events(path: str) -> dict | None:
    text = cat(path)
    return None if text is None else kmsgtruth.parse_memory_events(text)


def show(unit: str) -> dict:
    props = "ActiveState,SubState,Result,LoadState,ControlGroup,MemoryMax,OOMPolicy,MainPID,User,DynamicUser"
    out = run(["systemctl", "show", unit, "-p", props])["stdout"]
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def until(what: str, check, timeout: float, step: float = 0.3):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            if not value:
                log(f"gave up waiting for {what} after {timeout:.0f}s")
            return value
        time.sleep(step)


class KmsgRecorder(threading.Thread):
    """Every /dev/kmsg record of the boot, raw, to kmsg-all.raw (the ring is small)."""

    def __init__(self, path: str) -> None:
        super().__init__(daemon=True)
        self.fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        self.out = open(path, "wb")
        self.raw = bytearray()
        self.lock = threading.Lock()

    def run(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while True:
            try:
                rec = os.read(self.fd, 8192)
            except BlockingIOError:
                self.out.flush()
                poller.poll(200)
                continue
            except BrokenPipeError:
                rec = b"#EPIPE"
            rec = rec if rec.endswith(b"\n") else rec + b"\n"
            with self.lock:
                self.raw += rec
            self.out.write(rec)

    def incidents(self) -> list:
        with self.lock:
            return kmsgtruth.incidents(kmsgtruth.parse_records(bytes(self.raw))[0])


class EventsWatch(threading.Thread):
    """The last memory.events a cgroup showed before it went: read at each inotify change (systemd removes a
    stopped unit's cgroup at once)."""

    def __init__(self, cgroup: str) -> None:
        super().__init__(daemon=True)
        from inotify_simple import INotify, flags

        self.path = f"{CG}{cgroup}/memory.events"
        self.inotify = INotify()
        self.inotify.add_watch(self.path, flags.MODIFY)
        self.last = events(self.path)
        self.reads = 1
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for _ in self.inotify.read(timeout=200):
                now = events(self.path)
                if now is not None:
                    self.last, self.reads = now, self.reads + 1

    def stop(self) -> dict | None:
        now = events(self.path)
        if now is not None:
            self.last, self.reads = now, self.reads + 1
        self.done.set()
        self.join(2)
        return self.last


def install(out: dict, src_tar: str, wheels: str) -> bool:
    log("installing oomwatch with scripts/install-systemd")
    with tarfile.open(src_tar) as tar:
        tar.extractall(SRC)
    r = run([f"{SRC}/scripts/install-systemd"], timeout=420,
            env={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": wheels})
    out["install"] = r
    log(f"install-systemd: rc={r['rc']} in {r['seconds']}s")
    return r["rc"] == 0


def agent_view(out: dict) -> None:
    """How the running unit really is: its process, its view of /dev, its hardening score."""
    props = show("oomwatch.service")
    pid = props.get("MainPID", "0")
    status = cat(f"/proc/{pid}/status") or ""
    out["agent"] = {
        "show": props,
        "status": {k: v.strip() for k, v in (ln.split(":", 1) for ln in status.splitlines() if ":" in ln)
                   if k in ("Uid", "Gid", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs",
                            "Seccomp")},
        "cgroup": (cat(f"/proc/{pid}/cgroup") or "").strip(),
        "dev": run(["nsenter", "-t", pid, "-m", "ls", "/dev"])["stdout"].split(),
        # the processes of the unit that hold /dev/kmsg open (the agent reads it from a child process)
        "kmsg_open": [p for p in (cat(f"{CG}/system.slice/oomwatch.service/cgroup.procs") or "").split()
                      if any(os.path.realpath(f"/proc/{p}/fd/{fd}") == "/dev/kmsg"
                             for fd in _listdir(f"/proc/{p}/fd"))],
        # InaccessiblePaths=: what the unit sees of a root-owned secret, and what the host has there
        "gshadow": run(["nsenter", "-t", pid, "-m", "cat", "/etc/gshadow"]),
        "gshadow_host": len(cat("/etc/gshadow") or ""),
        "security": run(["systemd-analyze", "security", "oomwatch.service", "--no-pager"]),
        "healthz": http("/healthz"),
    }


def prepare_units() -> None:
    os.makedirs(FIFO_DIR, exist_ok=True)
    for name, text in ((SLICE, SLICE_UNIT), (SERVICE, SERVICE_UNIT)):
        with open(f"/etc/systemd/system/{name}", "w") as f:
            f.write(text)
    run(["systemctl", "daemon-reload"])
    run(["systemctl", "start", SLICE])


def kill_in(unit: str, start, fifo: str) -> dict:
    """Start `unit` (start() returns a Popen or None), read its cgroup while its hog waits on `fifo`, release
    the hog, and gather what the kernel, systemd, the agent and the journal say."""
    sc: dict = {"unit": unit, "slice_before": events(f"{CG}/{SLICE}/memory.events")}
    if os.path.exists(fifo):
        os.unlink(fifo)
    os.mkfifo(fifo)
    kernel_before = len(KMSG.incidents())
    proc = start()
    cgroup = f"/{SLICE}/{unit}"

    def waiting():  # the shell (reading the FIFO) and its sleep
        pids = (cat(f"{CG}{cgroup}/cgroup.procs") or "").split()
        return pids if len(pids) >= 2 else None

    procs = until(f"{unit}'s processes", waiting, 30)
    sc["cgroup"] = cgroup
    sc["before"] = {"memory.max": (cat(f"{CG}{cgroup}/memory.max") or "").strip(),
                    "memory.oom.group": (cat(f"{CG}{cgroup}/memory.oom.group") or "").strip(),
                    "procs": {p: (cat(f"/proc/{p}/comm") or "").strip() for p in procs or []},
                    "show": show(unit)}
    watch = EventsWatch(cgroup)
    watch.start()
    with open(fifo, "w") as f:  # opens once the hog's shell reads it
        f.write("go\n")
    log(f"{unit}: hog released")
    until(f"{unit} to stop", lambda: show(unit).get("ActiveState") in ("failed", "inactive"), 60)
    if proc is not None:
        try:
            sc["systemd_run_rc"] = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    sc["unit_events"] = watch.stop()
    sc["unit_events_reads"] = watch.reads
    sc["after"] = {"show": show(unit), "cgroup_exists": os.path.isdir(f"{CG}{cgroup}"),
                   "procs_alive": {p: os.path.exists(f"/proc/{p}") for p in procs or []}}
    sc["kernel"] = [k.summary() for k in KMSG.incidents()[kernel_before:]]

    def published():
        code, body = http("/incidents")
        if code != 200:
            return None
        return [i for i in json.loads(body) if (i.get("workload") or {}).get("unit") == unit] or None

    sc["incidents"] = until(f"the agent's incident for {unit}", published, 30) or []

    def journaled():
        r = run(["journalctl", "-u", unit, "-o", "json", "--no-pager"])
        entries = [json.loads(line) for line in r["stdout"].splitlines() if line.startswith("{")]
        return [e for e in entries if e.get("SYSLOG_IDENTIFIER") == "oomwatch"] and entries

    sc["journal_json"] = until(f"the journal entry on {unit}", journaled, 20) or []
    sc["journalctl"] = run(["journalctl", "-u", unit, "--no-pager"])
    sc["status"] = run(["systemctl", "status", unit, "--no-pager"])
    sc["slice_after"] = events(f"{CG}/{SLICE}/memory.events")
    log(f"{unit}: {len(sc['kernel'])} kernel incident(s), {len(sc['incidents'])} published, "
        f"{sum(e.get('SYSLOG_IDENTIFIER') == 'oomwatch' for e in sc['journal_json'])} journal entries")
    return sc


def scope(unit: str, *props: str):
    fifo = f"{FIFO_DIR}/{unit}"
    argv = ["systemd-run", "--scope", f"--unit={unit}", f"--slice={SLICE}", "-p", "MemoryMax=64M",
            "-p", "MemorySwapMax=0", *[a for p in props for a in ("-p", p)],
            "/bin/sh", "-c", f"sleep 1000 & read go < {fifo}; exec {HOG}"]
    return lambda: subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), fifo


def main() -> int:
    shared, src_tar, wheels = sys.argv[1:4]
    out: dict = {"began_uptime": float((cat("/proc/uptime") or "0").split()[0])}
    log(f"systemd host scenario: began at uptime {out['began_uptime']:.1f}s")
    global KMSG
    KMSG = KmsgRecorder(os.path.join(shared, "kmsg-all.raw"))
    KMSG.start()
    out["system"] = {
        "pid1": (cat("/proc/1/comm") or "").strip(),
        "systemd": run(["systemctl", "--version"])["stdout"].splitlines()[:1],
        "state": run(["systemctl", "is-system-running"])["stdout"].strip(),
        "journal_socket": os.path.exists("/run/systemd/journal/socket"),
        "journald": run(["systemctl", "is-active", "systemd-journald.service"])["stdout"].strip(),
        "kernel": os.uname().release,
        "dmesg_restrict": (cat("/proc/sys/kernel/dmesg_restrict") or "").strip(),
        "masked": run(["systemctl", "is-enabled", "systemd-tmpfiles-setup.service",
                       "systemd-timesyncd.service"])["stdout"].split(),
    }
    with open(os.path.join(shared, "started.json"), "w") as f:
        json.dump(out["system"], f)
    log(f"system: {out['system']}")
    try:
        if install(out, src_tar, wheels):
            started = time.monotonic()
            healthy = until("/healthz 200", lambda: http("/healthz")[0] == 200, 180, 1.0)
            out["healthy_seconds"] = round(time.monotonic() - started, 1) if healthy else None
            log(f"/healthz 200 after {out['healthy_seconds']}s")
            agent_view(out)
            log("agent's view recorded")
            prepare_units()

            def start_service() -> None:
                out["service_start"] = run(["systemctl", "start", SERVICE])

            out["scenarios"] = [
                kill_in(SERVICE, start_service, f"{FIFO_DIR}/{SERVICE}"),
                kill_in("oomtest-single.scope", *scope("oomtest-single.scope")),
                kill_in("oomtest-group.scope", *scope("oomtest-group.scope", "OOMPolicy=kill")),
            ]
            out["metrics"] = http("/metrics")[1]
            out["incidents"] = json.loads(http("/incidents")[1] or "[]")
            out["healthz"] = http("/healthz")
            out["agent_journal"] = run(["journalctl", "-u", "oomwatch.service", "-o", "json", "--no-pager"])
            out["agent_journal_text"] = run(["journalctl", "-u", "oomwatch.service", "--no-pager"])
            out["stop"] = run(["systemctl", "stop", "oomwatch.service"])
            log(f"agent stopped: {out['stop']['rc']}")
            out["after_stop"] = show("oomwatch.service")
    except Exception as e:  # recorded for the host's assertions, never hidden
        import traceback

        out["error"] = f"{e}\n{traceback.format_exc()}"
        log(out["error"])
    finally:
        time.sleep(0.5)
        KMSG.out.flush()
        with open(os.path.join(shared, "systemd.json"), "w") as f:
            json.dump(out, f, indent=1)
    return 0


KMSG: KmsgRecorder

if __name__ == "__main__":
    sys.exit(main())
