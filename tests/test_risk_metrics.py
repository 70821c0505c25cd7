"""Issue 14's series: the working set and PSI read by the StatCache from a cgroup tree, the PSI-less kernel
said once, their exposition (byte for byte prometheus_client's), and the series budget of a workload (the
container's current run is a recording rule now, not an agent series)."""

from __future__ import annotations

import logging
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from oomwatch.model import CgroupStats, Workload
from oomwatch.parse.pressure import parse_pressure
from oomwatch.sinks.collector import NodeInfo, OomwatchCollector
from oomwatch.sources.cgroupfs import CgroupFS
from oomwatch.sources.statcache import StatCache
from oomwatch.store import Store
from tests.test_collector import ReferenceCollector, _incident, reference_text

TEXT = Path(__file__).resolve().parents[1] / "fixtures" / "cgroup-text"
PSI = "some avg10=12.50 avg60=3.10 avg300=0.80 total={some}\nfull avg10=4.00 avg60=1.00 avg300=0.20 total={full}\n"


def _tree(root: Path, *, psi: bool = True) -> Path:
    c = root / "c"
    c.mkdir()
    (c / "memory.current").write_text("80000000\n")
    (c / "memory.max").write_text("100000000\n")
    (c / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 0\noom_kill 0\noom_group_kill 0\n")
    (c / "memory.oom.group").write_text("0\n")
    (c / "memory.stat").write_text((TEXT / "linux-6.1-memory.stat").read_text())  # inactive_file 16384000
    if psi:
        (c / "memory.pressure").write_text(PSI.format(some=1500000, full=250000))
    return c


def test_statcache_reads_working_set_and_pressure_each_scrape(tmp_path: Path) -> None:
    c = _tree(tmp_path)
    cache = StatCache(CgroupFS(str(tmp_path)), max_open=100)
    stats = cache.read("/c")
    assert stats.working_set_bytes == 80000000 - 16384000
    assert stats.pressure.total_seconds("some") == 1.5 and stats.pressure.total_seconds("full") == 0.25
    assert stats.pressure.some.avg10 == 12.5
    assert cache.open_descriptors == 3  # memory.current, memory.stat, memory.pressure (no memory.peak here)
    # Held descriptors read the file anew each time (written in place, as the kernel regenerates it).
    with open(c / "memory.pressure", "r+") as f:
        f.write(PSI.format(some=3000000, full=900000))
    with open(c / "memory.stat", "r+") as f:
        text = f.read().replace("inactive_file 16384000", "inactive_file 99999999")
        f.seek(0)
        f.write(text)
    again = cache.read("/c")
    assert again.pressure.total_seconds("full") == 0.9
    assert again.working_set_bytes == 0  # floored: more inactive file pages than usage
    cache.close()
    assert cache.open_descriptors == 0


def test_malformed_stat_is_unknown_and_counted(tmp_path: Path) -> None:
    c = _tree(tmp_path)
    (c / "memory.stat").write_text("anon 5\ninactive_file -3\n")
    fs = CgroupFS(str(tmp_path))
    stats = StatCache(fs, max_open=0).read("/c")  # by path, no held descriptors
    assert stats.working_set_bytes is None and stats.usage_bytes == 80000000
    assert fs.parse_errors == 1


def test_kernel_without_psi_said_once(tmp_path: Path, caplog) -> None:
    _tree(tmp_path, psi=False)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "memory.current").write_text("1\n")
    cache = StatCache(CgroupFS(str(tmp_path)), max_open=100)
    with caplog.at_level(logging.WARNING, logger="oomwatch.sources.statcache"):
        for _ in range(3):
            assert cache.read("/c").pressure is None
            assert cache.read("/d").pressure is None
    said = [r for r in caplog.records if "memory.pressure" in r.getMessage()]
    assert len(said) == 1 and "psi=0" in said[0].getMessage()


def test_exposition_of_risk_series_and_no_run_series() -> None:
    store = Store(clock=lambda: 1000.0)
    killed = ("ml", "train-0", "trainer", "")
    calm = ("ml", "train-0", "sidecar", "")
    pod = ("ml", "train-0", "", "")
    unit = ("", "", "", "/system.slice/x.service")
    for labels in (killed, calm, pod, unit):
        store.seen(labels)
    store.publish(_incident("single", "/k/p/c", Workload(type="k8s-container", cgroup="/k/p/c", namespace="ml",
                                                         pod="train-0", container="trainer"), 1, 1795380019.5))
    pressure = parse_pressure(PSI.format(some=1500000, full=250000))
    events = {"max": 3, "oom": 2, "oom_kill": 2}

    def live():
        return [
            (killed, CgroupStats(path="/k/p/c", events=events, usage_bytes=10, working_set_bytes=7,
                                 pressure=pressure)),
            (calm, CgroupStats(path="/k/p/s", events={"oom_kill": 0}, working_set_bytes=0)),
            (pod, CgroupStats(path="/k/p", events=events, pressure=pressure)),
            (unit, CgroupStats(path="/system.slice/x.service", events=events)),
        ]

    info = lambda: NodeInfo(kernel="6.1", cgroup_version="2", single_process_oom_kill="false")
    ours = OomwatchCollector(store, live, info)
    text = ours.exposition().decode()
    assert text.encode() == reference_text(ReferenceCollector(store, live, info))
    assert reference_text(ours) == text.encode()
    series = [line for line in text.splitlines() if not line.startswith("#")]
    assert 'oomwatch_memory_working_set_bytes{cgroup="",container="trainer",namespace="ml",pod="train-0"} 7.0' \
        in series
    assert 'oomwatch_memory_working_set_bytes{cgroup="",container="sidecar",namespace="ml",pod="train-0"} 0.0' \
        in series
    assert 'oomwatch_memory_pressure_seconds_total{cgroup="",container="trainer",kind="full",namespace="ml",' \
           'pod="train-0"} 0.25' in series
    assert sum(line.startswith("oomwatch_memory_pressure_seconds_total") for line in series) == 4
    # The container's current run is a recording rule (deploy/prometheus/oomwatch-rules.yaml), not a series of
    # the agent: its inputs are the kernel's oom_kill of the run's cgroup and the last incident's time.
    assert "oomwatch_container_run_" not in text
    assert 'oomwatch_memory_events_total{cgroup="",container="trainer",event="oom_kill",namespace="ml",' \
           'pod="train-0"} 2.0' in series
    assert 'oomwatch_last_oom_kill_timestamp_seconds{cgroup="",container="trainer",namespace="ml",' \
           'pod="train-0"} 1.7953800195e+09' in series


def _workload_series(text: str, labels: tuple[str, str, str, str]) -> list[str]:
    """The sample names of one workload's series in an exposition, one per series."""
    identity = dict(zip(("namespace", "pod", "container", "cgroup"), labels))
    return [sample.name for family in text_string_to_metric_families(text) for sample in family.samples
            if all(sample.labels.get(k, "") == v for k, v in identity.items())]


def test_series_per_kubernetes_container_within_the_budget() -> None:
    """Issue 14's budget of 16 series per workload: a Kubernetes container with PSI, memory.stat and
    memory.peak exports 16 before its first kill, and 18 after it (the kill's time and the last incident's
    explanation), whether or not its current run had the kill."""
    store = Store(clock=lambda: 1000.0)
    labels = ("ml", "train-0", "trainer", "")
    store.seen(labels)
    run = {"events": {"low": 0, "high": 0, "max": 0, "oom": 0, "oom_kill": 0, "oom_group_kill": 0}}

    def live():
        return [(labels, CgroupStats(path="/k/p/c", oom_group=0, events=run["events"], limit_bytes=100000000.0,
                                     usage_bytes=80000000, peak_bytes=90000000, working_set_bytes=63616000,
                                     pressure=parse_pressure(PSI.format(some=1500000, full=250000))))]

    collector = OomwatchCollector(store, live, lambda: NodeInfo(kernel="6.1", cgroup_version="2",
                                                                single_process_oom_kill="false"))

    def count() -> int:
        names = _workload_series(collector.exposition().decode(), labels)
        assert not [n for n in names if n.startswith("oomwatch_container_run_")]
        return len(names)

    assert count() == 16
    store.publish(_incident("single", "/k/p/c", Workload(type="k8s-container", cgroup="/k/p/c", namespace="ml",
                                                         pod="train-0", container="trainer"), 1, 1795380019.5))
    run["events"] = {**run["events"], "max": 4, "oom": 1, "oom_kill": 1}  # the kill is in the current run
    assert count() == 18
    run["events"] = dict.fromkeys(run["events"], 0)  # restarted: a new cgroup, its counters at 0
    assert count() == 18
