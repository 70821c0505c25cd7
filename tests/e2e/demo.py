"""`scripts/demo`: boot Debian's 6.1 kernel in a VM (the end-to-end tier's harness, tests/e2e/vm.py), run
`oomwatch agent` in it, OOM-kill two kubelet-shaped runc containers (one group kill, one single kill), then
print `oomwatch inspect` and the agent's metrics for them. No cluster, nothing left behind but
artifacts/demo/<time>/.

Run it through scripts/demo (which sets up the VM and the virtualenv first):
    scripts/demo [--keep]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time

from tests.e2e import vm

OUT_ROOT = vm.REPO / "artifacts" / "demo"


def _print(msg: str = "") -> None:
    print(msg, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", action="store_true", help="keep the run's artefacts (default: only on failure)")
    a = ap.parse_args()
    t0 = time.monotonic()
    try:
        env = vm.prepare()
    except vm.VMUnavailable as e:
        _print(f"demo: the VM cannot run here: {e}")
        return 1
    out = OUT_ROOT / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    _print(f"== booting Linux {env.kernel_version} under QEMU (no KVM, 1 vCPU); the agent starts in it")
    comp = vm.compile_python()
    box: dict = {}

    def boot() -> None:
        try:
            box["res"] = vm.run_guest(env, vm.scenario_argv(env, demo=True), out, timeout=300)
        except vm.VMUnavailable as e:
            box["err"] = e

    th = threading.Thread(target=boot, daemon=True)
    th.start()
    stdout = out / "guest-stdout.txt"
    pos, booted = 0, False
    said: list[str] = []
    while th.is_alive() or pos < (stdout.stat().st_size if stdout.exists() else 0):
        if not booted and (out / "started.json").exists():
            booted = True
            _print(f"[{time.monotonic() - t0:5.0f}s] guest up, starting `oomwatch agent`")
        if stdout.exists():
            with open(stdout, "rb") as f:
                f.seek(pos)
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1
            for line in chunk[:end].decode(errors="replace").splitlines():
                if line.startswith("» "):
                    said.append(line[2:])
                    _print(f"[{time.monotonic() - t0:5.0f}s] {line[2:]}")
            pos += end
        th.join(0.3)
    comp.wait()
    res = box.get("res")
    report = out / "demo-report.txt"
    if "err" in box or res is None or res.returncode != 0 or not report.exists():
        why = box.get("err") or (
            f"rc={res.returncode}, timed_out={res.timed_out}" if res is not None else "no result"
        )
        _print(f"demo: FAILED ({why}); see {out}/driver.log and {out}/console.txt")
        if res is not None:
            _print(res.failure_report() or res.console_tail())
        return 1
    failed = [line for line in said if "NOT healthy" in line or "did NOT publish" in line]
    if failed:
        # The demo shows what the agent did: an unhealthy agent or a missed kill is a failure, not a show.
        _print(f"demo: FAILED: {'; '.join(failed)}")
        agent_log = out / "agent" / "agent.log"
        if agent_log.exists():
            _print("---- agent log (last lines) ----")
            _print("\n".join(agent_log.read_text(errors="replace").splitlines()[-40:]))
        _print(f"(artefacts in {out})")
        return 1
    _print(f"== done in {time.monotonic() - t0:.0f}s\n")
    _print(report.read_text().rstrip("\n"))
    if a.keep:
        _print(f"\n(artefacts in {out})")
    else:
        shutil.rmtree(out, ignore_errors=True)
        try:
            OUT_ROOT.rmdir()  # only when no other run is kept there
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
