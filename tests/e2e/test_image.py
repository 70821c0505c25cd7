"""The image scripts/build-image makes, built from Debian packages, and its agent run under runc on the real
kernel with the DaemonSet's security context (guest scenario k_image_agent, tests/e2e/guest/image_scenario.py),
in a VM boot of its own (about 4 minutes under TCG).

scripts/test builds the image before this tier; the guest runs the unpacked image (.cache/image/bundle/rootfs)
under an overlay, as containerd would. OOMWATCH_IMAGE_RUN=<dir> reuses the artefacts of an earlier boot; they
stay in artifacts/e2e/image-<time>/."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest
import yaml

from tests.deploy.dashboard import panel_queries
from tests.e2e.conftest import boot_for, load_run, parse_metrics, select

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
IMAGE = REPO / ".cache" / "image"
DASHBOARD = REPO / "deploy" / "grafana" / "oomwatch-dashboard.json"
CAP_SYSLOG = 34  # include/uapi/linux/capability.h
SCENARIO = "k_image_agent"


def image_meta() -> dict:
    path = IMAGE / "image.json"
    if not path.exists():
        pytest.fail("no image: scripts/test builds it with scripts/build-image before this tier")
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def image_run():
    if not os.environ.get("OOMWATCH_IMAGE_RUN"):
        image_meta()  # fail before booting when there is no image
    t0 = time.monotonic()
    run_dir, result = boot_for(SCENARIO, "image", "OOMWATCH_IMAGE_RUN")
    run = load_run(run_dir, result, None, time.monotonic() - t0)
    if result is not None:
        print(f"\nimage VM boot: {result.seconds:.0f}s (timed out: {result.timed_out}); artefacts in {run_dir}")
    return run


def scenario(run):
    sc = run.scenario(SCENARIO)
    assert not sc.gt["errors"], "\n".join(sc.gt["errors"])
    return sc


# ----------------------------------------------------------------------------------------- the image
def test_image_is_an_oci_image_of_the_package_version() -> None:
    import oomwatch

    meta = image_meta()
    assert meta["tag"] == oomwatch.__version__
    index = json.loads((IMAGE / "oci" / "index.json").read_text())
    refs = [m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]]
    assert refs == [oomwatch.__version__]
    manifest_digest = index["manifests"][0]["digest"]
    assert manifest_digest == meta["manifest_digest"]
    manifest = json.loads((IMAGE / "oci" / "blobs" / manifest_digest.replace(":", "/")).read_text())
    config = json.loads((IMAGE / "oci" / "blobs" / manifest["config"]["digest"].replace(":", "/")).read_text())
    assert config["config"]["Entrypoint"] == ["oomwatch"] and config["config"]["Cmd"] == ["agent"]
    assert config["config"]["User"] == "65532:65532"  # as the Dockerfile's USER
    assert config["config"]["Labels"]["org.opencontainers.image.version"] == oomwatch.__version__


def test_image_is_debian_packages_plus_the_pinned_wheels() -> None:
    rootfs = IMAGE / "bundle" / "rootfs"
    status = (rootfs / "var/lib/dpkg/status").read_text()
    packages = {block.split("\n", 1)[0].removeprefix("Package: "): block for block in status.split("\n\n") if block}
    assert "python3" in packages and "Version: 3.11" in packages["python3.11"], "Debian's python3 3.11"
    assert not {"apt", "python3-pip", "perl", "usrmerge"} & packages.keys(), "build-only packages left in"
    site = rootfs / "usr/local/lib/python3.11/dist-packages"
    installed = {}
    for info in site.glob("*.dist-info"):
        name, version = info.name.removesuffix(".dist-info").rsplit("-", 1)
        installed[name.lower().replace("_", "-")] = version
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.lower().replace("_", "-")] = version
    assert "oomwatch" in installed and "pip" not in installed
    wrong = {n: (v, pins.get(n)) for n, v in installed.items() if n != "oomwatch" and pins.get(n) != v}
    assert not wrong, f"image packages not at constraints.txt's versions: {wrong}"


def test_image_size() -> None:
    """Target: under 80 MB to pull (the compressed layer); the unpacked size is reported."""
    meta = image_meta()
    print(f"\nimage {meta['tag']}: {meta['compressed_bytes'] / 1e6:.1f} MB compressed, "
          f"{meta['rootfs_bytes'] / 1e6:.1f} MB unpacked")
    assert meta["compressed_bytes"] < 80e6


# ----------------------------------------------------------------------------------------- in the VM
def test_image_agent_runs_with_the_daemonsets_security_context(image_run) -> None:
    sc = scenario(image_run)
    a = sc.gt["image_agent"]
    ds = yaml.safe_load((REPO / "daemonset" / "daemonset.yaml").read_text())
    assert sc.gt["daemonset_security_context"] == ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    p = a["process"]
    st = p["status"]
    syslog_only = f"{1 << CAP_SYSLOG:016x}"
    assert st["Uid"].split() == ["0"] * 4 and st["Gid"].split() == ["0"] * 4, st
    assert (st["CapEff"], st["CapPrm"], st["CapBnd"]) == (syslog_only,) * 3, st
    assert int(st["CapInh"], 16) == 0 and int(st["CapAmb"], 16) == 0, st
    assert st["NoNewPrivs"] == "1", st
    root_opts = p["root_mount"].split()[5].split(",")
    assert "ro" in root_opts, p["root_mount"]
    assert p["ns"]["pid"] == p["driver_ns"]["pid"], "hostPID: the host's pid namespace"
    assert p["ns"]["net"] != p["driver_ns"]["net"] and p["ns"]["cgroup"] != p["driver_ns"]["cgroup"]
    assert p["exe"].startswith("/usr/bin/python3"), p["exe"]  # Debian's python3 in the image
    assert p["cmdline"][1:3] == ["/usr/local/bin/oomwatch", "agent"], p["cmdline"]
    assert p["dmesg_restrict"] == "1", "the kernel log is root/CAP_SYSLOG-only, as on Debian nodes"


def test_image_agent_is_healthy_reading_the_kernel_log_through_syslog(image_run) -> None:
    sc = scenario(image_run)
    a = sc.gt["image_agent"]
    assert a["health"].get("healthy_after") is not None, a["health"]
    assert a["healthz_end"][0] == 200, a["healthz_end"]
    # /dev/kmsg was refused by the device cgroup (not privileged), and the agent said what it did instead
    assert "/dev/kmsg: permission denied (EPERM" in a["log"] and "through syslog(2) instead" in a["log"], a["log"][-3000:]
    state = json.loads(a["state_files"]["state.json"])
    assert state["cursor_source"] == "syslog", state
    assert a["state_after_sigterm"] in ("stopped", "unknown"), a
    print(f"\nimage agent healthy {a['health']['healthy_after']:.1f}s after runc run (TCG guest)")


def test_image_agent_reports_the_group_and_the_single_kill(image_run) -> None:
    sc = scenario(image_run)
    a = sc.gt["image_agent"]
    assert len(sc.kernel) == 2, [k.summary() for k in sc.kernel]
    for k, key in zip(sc.kernel, ("group", "single")):
        (published,) = a[f"{key}_published"]
        inc = published["incident"]
        assert inc is not None, f"the image's agent never published {k.summary()}"
        assert inc["kind"] == k.kind == key and inc["victim"]["pid"] == k.victim_pid
        assert {p["pid"] for p in inc["killed"]} == set(k.killed), (inc["killed"], k.summary())
        wl = inc["workload"]
        want = {"group": ("vision", "train-3", "trainer"), "single": ("shop", "cart-7d9c", "api")}[key]
        assert (wl.get("namespace"), wl.get("pod"), wl.get("container")) == want, wl
        assert inc["explanation"]
        print(f"\n{key} kill: published by the image's agent")
    group = a["group_published"][0]["incident"]
    assert len(group["killed"]) >= 2, "a group kill with collateral"
    # one JSON line per incident on the container's stdout (OOMWATCH_EVENTS_FILE=-)
    events = [json.loads(line) for line in a["log"].splitlines() if line.startswith("{")]
    assert sorted(e["kind"] for e in events) == ["group", "single"], events


def test_image_agent_metrics_and_memory(image_run) -> None:
    sc = scenario(image_run)
    a = sc.gt["image_agent"]
    samples = parse_metrics((sc.dir / "image-agent-metrics.txt").read_text())
    kills = {s.labels["kind"]: s.value
             for s in select(samples, "oomwatch_oom_kills_total", namespace="vision", pod="train-3", container="trainer")}
    assert kills == {"group": 1, "single": 0}, kills
    collateral = select(samples, "oomwatch_oom_killed_processes_total", container="trainer", role="collateral")
    assert collateral and collateral[0].value >= 1
    limit = int(a["cgroup"]["memory.max"])
    peak = int(a["cgroup"]["memory.peak"])
    print(f"\nimage agent memory.peak {peak / 2**20:.1f} MiB of its {limit / 2**20:.0f} MiB limit")
    assert peak < limit and a["cgroup"]["memory.events"]["oom_kill"] == 0


def test_dashboard_over_the_image_agents_run(image_run) -> None:
    """Prometheus scraped the image's agent; every panel query of the dashboard returned data over the run."""
    sc = scenario(image_run)
    path = sc.dir / "dashboard-range.json"
    assert path.exists(), "no dashboard queries saved"
    run = json.loads(path.read_text())
    exprs = [t["expr"] for p in run["panels"] for t in p["targets"]]
    assert exprs == [q for _, q in panel_queries(DASHBOARD, run["variables"])]
    failed = []
    for p in run["panels"]:
        for t in p["targets"]:
            res = t["result"]
            if t["status"] != "success" or not res:
                failed.append(f"{p['title']}: {t['expr']} -> {t['status']} {t['error']} {res}")
            elif t["resultType"] == "vector" and all(math.isnan(float(r["value"][1])) for r in res):
                failed.append(f"{p['title']}: only NaN")
    assert not failed, "\n".join(failed)
