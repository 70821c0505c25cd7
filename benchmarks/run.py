"""oomwatch benchmarks: how fast the kernel-log pipeline runs and what a scrape costs on a big node.

    .venv/bin/python benchmarks/run.py            # all
    .venv/bin/python benchmarks/run.py pipeline   # one

Targets (what a node agent must hold; checked here, never in timed unit tests):
- pipeline: parse + correlate >= 50,000 kernel records/s on one core (a storm of 150 group kills is ~4,700
  records; the kernel's ring buffer holds a few thousand records, so the agent must outpace it by far);
- scrape: /metrics for 2,000 workload cgroups in < 1 s (Prometheus' default scrape timeout is 10 s);
- memory: agent RSS with 2,000 workloads and 500 stored incidents < 100 MiB.
"""

from __future__ import annotations

import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from oomwatch.agent import Agent  # noqa: E402
from oomwatch.node import make_correlator  # noqa: E402
from oomwatch.config import Config  # noqa: E402
from oomwatch.parse.kmsg import parse_kmsg_record  # noqa: E402
from oomwatch.workloads import WorkloadResolver  # noqa: E402
from tests.conftest import raw_records  # noqa: E402

STORM = REPO / "fixtures" / "kmsg" / "linux-6.1-storm-ratelimited.kmsg"


def bench_pipeline(rounds: int = 20) -> dict:
    raws = raw_records(STORM)
    correlator = make_correlator(boot_id="bench", boot_time=0.0, resolver=WorkloadResolver(),
                                 posture_single=lambda: "false")
    incidents = 0
    start = time.perf_counter()
    for _ in range(rounds):
        for raw in raws:
            incidents += len(correlator.feed(parse_kmsg_record(raw)))
        incidents += len(correlator.flush())
    elapsed = time.perf_counter() - start
    records = len(raws) * rounds
    return {"records": records, "incidents": incidents, "seconds": round(elapsed, 3),
            "records_per_second": int(records / elapsed), "target": 50_000,
            "ok": records / elapsed >= 50_000 and incidents == 150 * rounds}


def make_tree(root: Path, pods: int, containers_per_pod: int) -> None:
    def cg(path: Path, limit: str, group: int) -> None:
        path.mkdir(parents=True)
        for name, value in (("memory.max", limit), ("memory.oom.group", group), ("memory.current", 1 << 20),
                            ("memory.peak", 2 << 20), ("cgroup.procs", "")):
            (path / name).write_text(f"{value}\n")
        events = "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n"
        (path / "memory.events").write_text(events)
        (path / "memory.events.local").write_text(events)

    (root).mkdir(parents=True)
    (root / "cgroup.controllers").write_text("memory\n")
    cg(root / "kubepods", "max", 0)
    cg(root / "kubepods" / "burstable", "max", 0)
    for p in range(pods):
        pod = root / "kubepods" / "burstable" / f"pod{p:08d}-0000-4000-8000-000000000000"
        cg(pod, str(512 << 20), 0)
        for c in range(containers_per_pod):
            cg(pod / f"{p:032x}{c:032x}", str(256 << 20), 1)


def bench_scrape(pods: int = 1000, containers_per_pod: int = 1) -> dict:
    import urllib.request

    tmp = Path(tempfile.mkdtemp(prefix="oomwatch-bench-"))
    try:
        make_tree(tmp / "cgroup", pods, containers_per_pod)
        (tmp / "kmsg").write_bytes(STORM.read_bytes())
        config = Config(kmsg=str(tmp / "kmsg"), cgroup_root=str(tmp / "cgroup"), proc=str(tmp / "proc"),
                        listen="127.0.0.1:0", kube_api="off", kubelet_config=str(tmp / "none"),
                        run_root=str(tmp / "run"), pod_log_dir=str(tmp / "pods"))
        agent = Agent(config)
        started = time.perf_counter()
        agent.start()
        while not agent.kmsg_alive:
            time.sleep(0.01)
        startup = time.perf_counter() - started
        url = "http://%s:%d/metrics" % agent.http.address
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            with urllib.request.urlopen(url) as resp:
                body = resp.read()
            times.append(time.perf_counter() - t0)
        agent.stop()
        workloads = pods * (1 + containers_per_pod)
        rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return {"workload_cgroups": workloads, "startup_seconds": round(startup, 3),
                "scrape_seconds_median": round(sorted(times)[len(times) // 2], 3), "scrape_bytes": len(body),
                "max_rss_mib": round(rss_mib, 1), "ok": sorted(times)[2] < 1.0 and rss_mib < 100}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


BENCHES = {"pipeline": bench_pipeline, "scrape": bench_scrape}


def main(names: list[str]) -> int:
    failed = 0
    for name in names or list(BENCHES):
        result = BENCHES[name]()
        failed += not result["ok"]
        print(f"{name}: " + ", ".join(f"{k}={v}" for k, v in result.items()))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
