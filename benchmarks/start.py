"""Where an agent's start goes (issue 30 item 4): exec to the port answering and to /healthz 200, split into
the interpreter, the imports and the start's own phases, in the real-kernel VM (TCG, one vCPU) where the storm
tier restarts the agent, or here.

    .venv/bin/python benchmarks/start.py                    # in the VM: 3 rounds
    .venv/bin/python benchmarks/start.py --before e3e617c   # that commit's package too, alternating
    .venv/bin/python benchmarks/start.py --local            # also from a .pyc copy in the guest's tmpfs, no site
    .venv/bin/python benchmarks/start.py --here             # on this machine, no VM

Each round, for each tree (alternating, so that a loaded host weighs on both alike):
- the interpreter alone: `python -S -c pass`, and `python -c pass` (the venv's site: its .pth files, among them
  the editable install's finder);
- the imports of `oomwatch agent` (`-X importtime` of oomwatch.cli and oomwatch.agent, self times summed by group:
  site, stdlib, click, oomwatch), and the same imports from a copy of their .pyc files in the guest's tmpfs
  (the guest reads the checkout over 9p: the difference is the round trips a node's own disk does not make);
- the agent's start on the live /dev/kmsg with a state directory (restored from the round before) and a
  cgroup tree of --cgroups kubelet-shaped containers: exec to the port answering and to /healthz 200 (polled
  every 50 ms on a bare socket), and inside the agent (benchmarks/start_phases.py wraps it, nothing changed in it)
  when the early pump had started, its imports were done, the state loaded, the kernel log adopted, the port
  listening, the tree emitted, the pipeline built, start() done and the pump's first batch handed over (the
  backlog read); the CPU seconds of the agent's threads and of its kernel-log reader process by start()'s end.
Printed as a table (median of the rounds); --json writes every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
PORT = 9718
IMPORTS = "import oomwatch.cli, oomwatch.agent"
PHASES = Path(__file__).resolve().parent / "start_phases.py"  # the agent, its start's phases timed


def http_status(path: str) -> int | None:
    """The status of a GET, on a bare socket: on one vCPU the poller's own CPU is taken from the agent's start
    (urllib's costs tens of milliseconds a try under emulation)."""
    try:
        with socket.create_connection(("127.0.0.1", PORT), timeout=2) as conn:
            conn.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
            head = conn.recv(64)
    except OSError:
        return None
    parts = head.split(None, 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def make_tree(root: str, containers: int) -> None:
    """Kubelet-shaped container cgroups (real ones in the guest, where the root is /sys/fs/cgroup)."""
    for i in range(containers):
        os.makedirs(os.path.join(root, "kubepods", "burstable", f"podstart{i:05d}", f"c{i:05d}"), exist_ok=True)


def agent_start(tree: Path, work: str, cgroup_root: str, local: bool = False) -> dict:
    """One start, its phases. `local`: `tree` is the .pyc copy in the guest's tmpfs, run without site (no .pth,
    no editable finder), the 9p view of the rest only where it has no copy: the agent as a node's disk holds it."""
    phases_path = os.path.join(work, "phases.jsonl")
    Path(phases_path).write_text("")
    argv = ["agent", "--listen", f"127.0.0.1:{PORT}", "--state-dir", os.path.join(work, "state"),
            "--events-file", os.path.join(work, "events.jsonl"), "--kube-api", "off",
            "--cgroup-root", cgroup_root, "--proc-connector"]
    t0 = time.monotonic()
    env = {**os.environ, "OOMWATCH_START_PHASES": phases_path, "OOMWATCH_START_T0": repr(t0)}
    if local:
        import site

        env["PYTHONPATH"] = os.pathsep.join(site.getsitepackages())
    with open(os.path.join(work, "agent.log"), "a") as log:
        agent = subprocess.Popen([PY, *(["-S"] if local else []), str(PHASES), *argv], cwd=str(tree), env=env,
                                 stdout=log, stderr=subprocess.STDOUT)
    port = healthy = None
    try:
        while time.monotonic() - t0 < 120 and agent.poll() is None:
            code = http_status("/healthz")
            if code is not None and port is None:
                port = time.monotonic() - t0
            if code == 200:
                healthy = time.monotonic() - t0
                break
            time.sleep(0.05)
        time.sleep(1.0)  # the backlog's first batch, if the pump had not handed it over yet
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(60)
    phases = {p["phase"]: p["s"] for p in map(json.loads, Path(phases_path).read_text().splitlines())}
    return {"port answers": port, "healthz 200": healthy, **phases}


def wall(argv: list[str], cwd: Path) -> float:
    t0 = time.monotonic()
    subprocess.run(argv, cwd=str(cwd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.monotonic() - t0


def import_groups(tree: Path, argv_prefix: list[str]) -> dict:
    """-X importtime's self times summed by group, and the module count. What the interpreter's site imports
    (the venv's .pth files: the editable install's finder pulls pathlib, urllib.parse, re...) is "site"."""
    r = subprocess.run([*argv_prefix, "-X", "importtime", "-c", IMPORTS], cwd=str(tree), capture_output=True,
                       text=True, check=True)
    rows = re.findall(r"^import time:\s+(\d+) \|\s+\d+ \|( *)(\S+)$", r.stderr, re.M)
    groups: dict[str, float] = {}
    top = None
    for micros, indent, name in reversed(rows):  # a module's line comes after those it imported
        if len(indent) <= 1:
            top = name
        first = name.split(".")[0]
        group = ("site" if top == "site" else "oomwatch" if first == "oomwatch" else "click" if first == "click"
                 else "stdlib")
        groups[group] = groups.get(group, 0.0) + int(micros) / 1e6
    return {**{f"imports: {g}": round(s, 3) for g, s in sorted(groups.items())}, "modules": len(rows)}


def bundle(tree: Path, dest: str) -> None:
    """The .pyc files (and extension modules) of the agent's imports, laid out as a sourceless tree."""
    code = ("import sys, json; " + IMPORTS + "; print(json.dumps({n: getattr(m, '__file__', None) "
            "for n, m in list(sys.modules.items())}))")
    files = json.loads(subprocess.run([PY, "-c", code], cwd=str(tree), capture_output=True, text=True,
                                      check=True).stdout)
    import importlib.util

    for py in (tree / "oomwatch").rglob("*.py"):  # every module of the package: the agent imports some later
        name = ".".join(py.relative_to(tree).with_suffix("").parts)
        files.setdefault(name[:-len(".__init__")] if name.endswith(".__init__") else name, str(py))
    for name, path in files.items():
        if not path:
            continue
        if path.endswith(".py"):
            target = name.replace(".", "/") + ("/__init__.pyc" if path.endswith("__init__.py") else ".pyc")
            os.makedirs(os.path.dirname(os.path.join(dest, target)) or dest, exist_ok=True)
            shutil.copy(importlib.util.cache_from_source(path), os.path.join(dest, target))
        elif path.endswith(".so"):
            shutil.copy(path, os.path.join(dest, os.path.basename(path)))


def measure(trees: dict[str, Path], rounds: int, containers: int, cgroup_root: str,
            local_start: bool = False) -> dict:
    results: dict[str, list[dict]] = {label: [] for label in trees}
    work = {label: tempfile.mkdtemp(prefix=f"oomwatch-start-{label}-") for label in trees}
    local = {label: tempfile.mkdtemp(prefix=f"oomwatch-start-pyc-{label}-") for label in trees}
    try:
        for label, tree in trees.items():
            bundle(tree, local[label])
        make_tree(cgroup_root, containers)
        for _ in range(rounds):
            for label, tree in trees.items():
                row = {"python -S -c pass": wall([PY, "-S", "-c", "pass"], tree),
                       "python -c pass": wall([PY, "-c", "pass"], tree),
                       "python -c imports": wall([PY, "-c", IMPORTS], tree)}
                from_tmpfs = f"import sys; sys.path[:0] = [{local[label]!r}]; {IMPORTS}"
                row["python -S -c imports, .pyc in tmpfs"] = wall([PY, "-S", "-c", from_tmpfs], tree)
                row.update(import_groups(tree, [PY]))
                row.update(agent_start(tree, work[label], cgroup_root))
                if local_start:
                    local_row = agent_start(Path(local[label]), work[label], cgroup_root, local=True)
                    row.update({f"local .pyc, no site: {k}": v for k, v in local_row.items()
                                if k in ("port answers", "healthz 200", "agent imported")})
                results[label].append(row)
                print(label, json.dumps(row), flush=True)
    finally:  # the agents' state and logs, the .pyc copies
        for where in [*work.values(), *local.values()]:
            shutil.rmtree(where, ignore_errors=True)
    return results


def table(results: dict[str, list[dict]]) -> str:
    keys = list(dict.fromkeys(k for rows in results.values() for row in rows for k in row))
    lines = ["seconds (median of %s) | %s" % ("/".join(str(len(r)) for r in results.values()),
                                              " | ".join(results))]
    for key in keys:
        cells = []
        for rows in results.values():
            values = [row[key] for row in rows if row.get(key) is not None]
            cells.append(f"{statistics.median(values):.3f}" if values else "-")
        lines.append(f"{key} | " + " | ".join(cells))
    return "\n".join(lines)


def snapshot(commit: str | None) -> Path:
    """A copy of the package, byte-compiled (the guest cannot write .pyc files): the commit's, or the working
    tree's as it is now (others may edit it while the benchmark runs)."""
    where = Path(tempfile.mkdtemp(prefix="oomwatch-start-src-"))
    where.chmod(0o755)
    if commit:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "oomwatch"], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    else:
        shutil.copytree(REPO / "oomwatch", where / "oomwatch", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([PY, "-m", "compileall", "-q", str(where / "oomwatch")], check=True)
    return where


def in_vm(args: argparse.Namespace, trees: dict[str, Path]) -> int:
    sys.path.insert(0, str(REPO))
    from tests.e2e import vm

    env = vm.prepare()
    out = Path(tempfile.mkdtemp(prefix="oomwatch-start-vm-"))
    out.chmod(0o755)
    compiling = vm.compile_python()  # the guest's view is read-only: .pyc files are written here first
    compiling.wait()
    spec = ",".join(f"{label}={path}" for label, path in trees.items())
    argv = [PY, str(Path(__file__).resolve()), "--guest", vm.GUEST_SHARED, "--trees", spec,
            "--rounds", str(args.rounds), "--cgroups", str(args.cgroups), *(["--local"] if args.local else [])]
    result = vm.run_guest(env, argv, out, memory_mib=1024, timeout=900, started_marker="results.json")
    if not (out / "results.json").exists():
        print(f"the guest wrote no results ({result.failure_report() or result.returncode}): {out}")
        return 1
    report(json.loads((out / "results.json").read_text()), args.json, "the VM (Linux 6.1, TCG, one vCPU)")
    return 0


def report(results: dict, json_path: str | None, where: str) -> None:
    print(f"start of `oomwatch agent` in {where}:")
    print(table(results))
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cgroups", type=int, default=50, help="kubelet-shaped containers in the tree")
    parser.add_argument("--local", action="store_true",
                        help="also start the agent from its .pyc copy in tmpfs, without site (as from a node's disk)")
    parser.add_argument("--before", help="also measure this commit's tree, alternating")
    parser.add_argument("--here", action="store_true", help="on this machine, not in the VM")
    parser.add_argument("--json")
    parser.add_argument("--guest", help=argparse.SUPPRESS)  # the guest's side: where to write
    parser.add_argument("--trees", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.guest:
        trees = {label: Path(path) for label, path in (t.split("=", 1) for t in args.trees.split(","))}
        tempfile.tempdir = "/run"  # the guest's tmpfs (its /tmp is an overlay over the host's, read over 9p)
        results = measure(trees, args.rounds, args.cgroups, "/sys/fs/cgroup", args.local)
        Path(args.guest, "results.json").write_text(json.dumps(results))
        return 0
    trees = {"now": snapshot(None)}
    if args.before:
        trees[args.before] = snapshot(args.before)
    root = tempfile.mkdtemp(prefix="oomwatch-start-cgroups-", dir="/dev/shm")
    try:
        if not args.here:
            return in_vm(args, trees)
        Path(root, "cgroup.controllers").write_text("cpu memory pids\n")
        report(measure(trees, args.rounds, args.cgroups, root, args.local), args.json, "this machine")
    finally:
        for where in [root, *trees.values()]:
            shutil.rmtree(where, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
