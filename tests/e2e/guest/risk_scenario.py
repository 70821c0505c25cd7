"""Guest side of the OOM-risk scenario (its own VM boot: tests/e2e/test_risk.py).

One kubelet-shaped container cgroup (`/kubepods/burstable/pod<uid>/<id>`, memory.max 64 MiB, no swap) whose
process grows by 1 MiB every half second toward the limit. memory.high is 92% of the limit, as the kubelet's
MemoryQoS sets it (requests + 0.9 x (limit - requests)): above it the kernel throttles the process, and the
time it sleeps there is a memory stall (PSI `full`, all of the cgroup's tasks stalled). The driver watches the
agent's /metrics and the issue-14 alert expressions in Debian's Prometheus (scraping every 2 s), until both
are true or 150 s have passed; then it lifts memory.high (to end the scenario in bounded time: a throttled
process would otherwise approach the limit for minutes) and the kernel OOM-kills the process at memory.max.
Everything is recorded with monotonic times, the kill's from the kernel's own record.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import __main__ as driver  # imported by tests/e2e/guest/driver.py, which runs as the guest's main script

CG, Scenario, cg_enable, hexid, jdump = driver.CG, driver.Scenario, driver.cg_enable, driver.hexid, driver.jdump
log, uid_for, wfile = driver.log, driver.uid_for, driver.wfile

LIMIT = 64 << 20
HIGH = LIMIT * 92 // 100
GROW = ("import time\nheld = []\nwhile True:\n    held.append(b'\\x01' * (1 << 20))  # written: resident\n"
        "    time.sleep(0.5)\n")
WATCH_SECONDS = 150.0
RULES = os.path.join(driver.REPO, "deploy", "prometheus", "oomwatch-rules.yaml")
ALERTS = ("OomwatchMemoryNearLimitUnderPressure", "OomwatchMemoryLimitIn15m")


def alert_exprs() -> dict[str, str]:
    """The two risk alerts' expressions, as shipped."""
    import yaml

    with open(RULES) as f:
        doc = yaml.safe_load(f)
    return {r["alert"]: r["expr"] for g in doc["groups"] for r in g["rules"] if r.get("alert") in ALERTS}


def sample(text: str, name: str, cgroup: str, **labels: str) -> float | None:
    """One series' value from exposition text (exact label values)."""
    want = [f'cgroup="{cgroup}"'] + [f'{k}="{v}"' for k, v in labels.items()]
    for line in text.splitlines():
        if line.startswith(name + "{") and all(w in line for w in want):
            try:
                return float(line.rsplit(" ", 1)[1])
            except ValueError:
                return None
    return None


class Risk(Scenario):
    name = "k_risk"
    description = ("a container growing 2 MiB/s toward its 64M limit (memory.high at 92%, as MemoryQoS sets it): "
                   "working set, PSI and the risk alerts' expressions before the kernel kills it")

    def setup(self):
        if not self.ctx.prometheus:
            raise RuntimeError("no Prometheus server given (--prometheus; scripts/setup-vm provides it)")
        self.prom = driver.Prometheus(self.ctx.prometheus, self.dir)
        self.gt["prometheus"] = {"start": self.prom.start(), "node": self.prom.node}
        uid = uid_for("risk-0")
        pod = f"/kubepods/burstable/pod{uid}"
        cg_enable(pod)
        self.cleanup_cgroups.append(pod)
        self.cgroup = f"{pod}/{hexid('risk-0')}"
        os.makedirs(f"{CG}{self.cgroup}", exist_ok=True)
        wfile(f"{CG}{self.cgroup}/memory.max", LIMIT)
        wfile(f"{CG}{self.cgroup}/memory.high", HIGH)
        wfile(f"{CG}{self.cgroup}/memory.swap.max", 0)
        self.gt["risk"] = {"cgroup": self.cgroup, "limit": LIMIT, "high": HIGH, "samples": [], "true_at": {},
                           "exprs": alert_exprs(),
                           "psi": os.path.exists(f"{CG}{self.cgroup}/memory.pressure")}

    def spawn(self) -> subprocess.Popen:
        cgroup = self.cgroup

        def enter() -> None:
            with open(f"{CG}{cgroup}/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(driver.kubelet_oom_score_adj("burstable", LIMIT)))

        return subprocess.Popen([sys.executable, "-c", GROW], preexec_fn=enter, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def act(self):
        ctx, prom, r = self.ctx, self.prom, self.gt["risk"]
        ready = prom.wait_ready(120)
        r["prometheus_ready_after"] = ready
        if ready is None:
            raise RuntimeError(f"Prometheus not ready after 120 s (see {self.name}/prometheus.log)")
        seq0 = ctx.kmsg.last_seq()
        proc = self.spawn()
        r["started_mono"] = time.monotonic()
        log(f"  risk: grower pid {proc.pid} in {self.cgroup}")
        end = time.monotonic() + WATCH_SECONDS
        while time.monotonic() < end and proc.poll() is None:
            now = time.monotonic()
            text = ctx.agent.metrics() or ""
            s = {"mono": now,
                 "working_set": sample(text, "oomwatch_memory_working_set_bytes", self.cgroup),
                 "limit": sample(text, "oomwatch_memory_limit_bytes", self.cgroup),
                 "full_seconds": sample(text, "oomwatch_memory_pressure_seconds_total", self.cgroup, kind="full"),
                 "some_seconds": sample(text, "oomwatch_memory_pressure_seconds_total", self.cgroup, kind="some"),
                 "current_file": driver.rfile(f"{CG}{self.cgroup}/memory.current")}
            for alert, expr in r["exprs"].items():
                res = (prom.query(expr).get("data") or {}).get("result") or []
                s[alert] = any(x.get("metric", {}).get("cgroup") == self.cgroup for x in res)
                if s[alert] and alert not in r["true_at"]:
                    r["true_at"][alert] = now
                    r[f"metrics_when_{alert}"] = text
                    log(f"  risk: {alert} expression true {now - r['started_mono']:.1f}s after the start")
            r["samples"].append(s)
            if len(r["true_at"]) == len(ALERTS):
                break
            time.sleep(1.0)
        r["watch_ended_mono"] = time.monotonic()
        r["killed_before_lift"] = proc.poll() is not None
        wfile(f"{CG}{self.cgroup}/memory.high", "max")  # let it reach memory.max now
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.gt["errors"].append("the grower was not killed within 120 s of lifting memory.high")
            proc.kill()
            proc.wait()
        r["returncode"] = proc.returncode
        ctx.kmsg.wait_quiet(2.0, 60)
        kills = ctx.kmsg.incidents_since(seq0)
        r["kernel_kills"] = [{"kill_mono": ctx.kmsg_to_mono(k.first_kill_usec or k.usec)} for k in kills]
        r["memory_events"] = driver.cg_events(self.cgroup)
        time.sleep(3.0)  # the agent publishes the kill
        self.save_agent_view()
        jdump(f"{self.dir}/risk.json", r)

    def finish(self):
        if getattr(self, "prom", None):
            self.prom.stop()
