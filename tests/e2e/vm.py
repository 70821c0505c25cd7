"""Host-side harness of the end-to-end tier: boot Debian's kernel under virtme-ng (QEMU TCG, one vCPU) and run
one command in the guest, capturing everything it printed.

The guest sees the host's filesystem read-only (9p), with copy-on-write overlays on /etc, /usr, /tmp, /var...;
`shared_dir` is mounted read-write at GUEST_SHARED (virtme-ng `--rwdir`), so the guest's results land on the
host. Prepare the machine first with `scripts/setup-vm` (root, packages, kernel, modules, busybox rootfs);
`prepare()` runs it (it is cached and takes a fraction of a second once done).

The kernel command line stays short whatever the checkout's path: the kernel truncates it at
COMMAND_LINE_SIZE (2,048 bytes on x86), and a truncated one panicked the guest at its first instant from a
60-character checkout path ("detected buffer overflow in __fortify_strlen"). So the guest's command is a file
in the shared directory (GUEST_COMMAND, written here), the shared directory has a short guest path, the guest
starts in / and the kernel image is passed from a directory without lib/modules above it, so virtme-ng uses
the host's /lib/modules/<version> (scripts/setup-vm installs it) instead of naming the cache's. Only init=
(virtme-ng's own guest tools in .venv) still carries the checkout's path, once. A guest that panics before
its command runs, or whose command has not started within `start_timeout`, is stopped at once and reported
with the console's last lines.

Facts this relies on (measured on a 2-core Debian 12 host without usable KVM):
- `--disable-kvm`: KVM aborts on an MSR assertion here; TCG boots the 6.1 kernel in ~10 s.
- `--cpus 1`: with two vCPUs TCG livelocks.
- `--force-9p`: virtme-ng otherwise spends seconds trying virtiofsd, which cannot start here.
- host `udev` installed: without it the guest has no /dev/virtio-ports and virtme-ng loses the command's
  separate stdout/stderr and exit status.

Manual use:  .venv/bin/python -m tests.e2e.vm [--only a,b] [--memory 768] [OUT_DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv"
CACHE = Path(os.environ.get("OOMWATCH_VM_CACHE", REPO / ".cache" / "vm"))
GUEST_DIR = Path(__file__).resolve().parent / "guest"
DEFAULT_MEMORY_MIB = 768
DEFAULT_TIMEOUT = 540  # the whole tier must stay under 10 minutes
# The guest command begins 20-40 s after launch under TCG here, 90 s on a host loaded 3x over its 2 cores;
# a guest still silent at 300 s will not start (a panic is seen at once, whatever this says).
DEFAULT_START_TIMEOUT = 300.0
KERNEL_CMDLINE_MAX = 2048  # COMMAND_LINE_SIZE, arch/x86/include/asm/setup.h: the kernel cuts a longer one
GUEST_SHARED = "/run/oomwatch-shared"  # the run directory, as the guest sees it (a tmpfs mount point there)
GUEST_COMMAND = "guest-command.sh"  # in the run directory: what the guest runs (virtme.exec only names it)
GUEST_BEGAN = "guest-began"  # written by the guest command's first line: the guest booted and runs it
# Console lines that end a boot before the guest command runs (an early BUG kills init or hangs the boot:
# the harness must not wait for its timeout), and those that end a guest at any time.
FATAL_BEFORE_START = ("Kernel panic", "kernel BUG at", "detected buffer overflow", "BUG: unable to handle",
                      "general protection fault", "Oops: ")
FATAL_ANY_TIME = ("Kernel panic - not syncing",)
CONSOLE_TAIL_LINES = 40
BLACKLIST = (
    "kvm",
    "kvm_amd",
    "kvm_intel",
    "ccp",
    "irqbypass",
    "ahci",
    "libahci",
    "libata",
    "sr_mod",
    "cdrom",
    "sg",
    "scsi_mod",
    "aesni_intel",
    "crypto_simd",
    "cryptd",
    "ghash_clmulni_intel",
    "crc32_pclmul",
    "crc32c_intel",
    "crct10dif_pclmul",
    "sha1_ssse3",
    "sha256_ssse3",
    "sha512_ssse3",
    "sha512_generic",
    "evdev",
    "button",
    "pcspkr",
    "psmouse",
    "serio_raw",
    "i2c_i801",
    "i2c_smbus",
    "lpc_ich",
    "iTCO_wdt",
    "iTCO_vendor_support",
    "intel_pmc_bxt",
    "i6300esb",
    "watchdog",
    "qemu_fw_cfg",
    "powernow_k8",
    "intel_rapl_msr",
    "intel_rapl_common",
    "joydev",
    "input_leds",
    "bochs",
    "drm",
)


# `vng --systemd`: the host's systemd as PID 1; virtme-ng runs the command from serial-getty@ttyS0.service.
# `container=` (empty) in PID 1's environment tells systemd it is not in a container: on a host that is one
# (/.dockerenv), systemd would take the VM for Docker and start no serial getty: the command would never run.
# The other processes then read the empty $container of PID 1 as "some container", and a container's kernel
# command line is PID 1's argv: systemd's options go in $SYSTEMD_PROC_CMDLINE instead (systemd's override of
# /proc/cmdline, in PID 1's environment, which the generators inherit). The getty is the default unit: the
# boot starts sysinit.target (journald, udev) and basic.target, not the host's own services (a database,
# slurmd), which multi-user.target would start under TCG. Masked: tmpfiles' boot run (it tries to empty the
# host's /tmp and more, read-only here over 9p, for a minute or more) and timesyncd (no network: it fails and
# is restarted).
SYSTEMD_OPTIONS = ("systemd.unit=serial-getty@ttyS0.service", "systemd.mask=systemd-tmpfiles-setup.service",
                   "systemd.mask=systemd-timesyncd.service")
SYSTEMD_BOOT = ("--systemd", "--append", "container=",
                "--append", shlex.quote("SYSTEMD_PROC_CMDLINE=" + " ".join(SYSTEMD_OPTIONS)),
                "--overlay-rwdir", "/root")  # root's home writable, as on a host (pip's cache)


class VMUnavailable(RuntimeError):
    """The VM cannot be started here (setup failed, qemu/kernel/virtme-ng missing)."""


@dataclass
class VMEnv:
    kernel_version: str
    vmlinuz: Path
    rootfs: Path
    prometheus: Path | None = None  # Debian's Prometheus server (scenario i), from scripts/setup-vm
    setup_seconds: float = 0.0


@dataclass
class VMResult:
    returncode: int | None
    seconds: float
    boot_seconds: float | None  # launch -> the guest command's first file appeared
    timed_out: bool
    stdout_path: Path
    console_path: Path
    command: list[str] = field(default_factory=list)
    failure: str | None = None  # why the harness stopped the guest early (panic, never started)

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    @property
    def console(self) -> str:
        """Kernel console (loglevel 4) and the guest command's stderr, interleaved."""
        return self.console_path.read_text(errors="replace") if self.console_path.exists() else ""

    def console_tail(self, lines: int = CONSOLE_TAIL_LINES) -> str:
        return "\n".join(self.console.splitlines()[-lines:])

    def failure_report(self) -> str | None:
        """What went wrong with the VM itself (not with a scenario), with the console's last lines; None when
        the guest ran its command to the end."""
        if self.failure:
            why = self.failure
        elif self.timed_out:
            why = f"the VM run timed out after {self.seconds:.0f}s"
        else:
            return None
        return f"{why}; console ({self.console_path}), last lines:\n{self.console_tail()}"


def console_failure(text: str, began: bool) -> str | None:
    """The console line that means the guest is lost: a panic at any time, or an oops/BUG before the guest
    command began (`began`). None when the console shows nothing fatal."""
    patterns = FATAL_ANY_TIME if began else FATAL_BEFORE_START
    for line in text.splitlines():
        if any(p in line for p in patterns):
            return line.strip()
    return None


def prepare() -> VMEnv:
    """Run scripts/setup-vm (idempotent, cached), return what it prepared; VMUnavailable if it fails."""
    t = time.monotonic()
    script = REPO / "scripts" / "setup-vm"
    try:
        r = subprocess.run(
            ["bash", str(script)],
            capture_output=True,
            text=True,
            timeout=1800,
            env={**os.environ, "OOMWATCH_VM_CACHE": str(CACHE)},
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise VMUnavailable(f"scripts/setup-vm could not run: {e}") from e
    if r.returncode != 0:
        raise VMUnavailable(
            f"scripts/setup-vm failed (exit {r.returncode}):\n{r.stderr[-4000:]}\n{r.stdout[-2000:]}"
        )
    env = {}
    for line in (CACHE / "env").read_text().splitlines():
        k, _, v = line.partition("=")
        env[k] = v
    vm = VMEnv(
        env["KVER"],
        Path(env["VMLINUZ"]),
        Path(env["ROOTFS"]),
        Path(env["PROMETHEUS"]) if env.get("PROMETHEUS") else None,
        time.monotonic() - t,
    )
    for p, what in (
        (vm.vmlinuz, "kernel image"),
        (vm.rootfs / "bin" / "busybox", "container rootfs"),
        (VENV / "bin" / "vng", "virtme-ng"),
        (Path(f"/lib/modules/{vm.kernel_version}/modules.dep"), "kernel modules"),
        (vm.prometheus or Path("/nonexistent/prometheus"), "Prometheus server"),
    ):
        if not p.exists():
            raise VMUnavailable(f"{what} missing at {p} after scripts/setup-vm")
    return vm


def vng_command(vm: VMEnv, shared_dir: Path, memory_mib: int, venv: Path = VENV,
                systemd: bool = False) -> list[str]:
    """virtme-ng's command line for one boot that runs shared_dir/GUEST_COMMAND (see guest_command_script);
    nothing in it but init= (virtme-ng's guest tools) depends on where the checkout is. `systemd`: systemd is
    PID 1 (SYSTEMD_BOOT), and the command runs from its serial getty."""
    return [
        str(venv / "bin" / "vng"),
        "--verbose",
        "--force-9p",
        "--run",
        str(vm.vmlinuz),
        "--disable-kvm",
        "--cpus",
        "1",
        "--memory",
        f"{memory_mib}M",
        f"--rwdir={GUEST_SHARED}={Path(shared_dir).resolve()}",
        # the guest command changes to the repository itself: virtme_chdir would carry its path
        "--cwd",
        "/",
        # console at warning level: boot problems and OOM kill lines, not the whole OOM report (the
        # serial console is slow under TCG; the guest reads every record from /dev/kmsg anyway)
        "--append",
        "loglevel=4",
        # udev (needed for the virtio ports that carry the command's stdio and exit status) coldplugs every
        # emulated device; under TCG loading those modules costs ~15 s of boot. None is needed here.
        "--append",
        "modprobe.blacklist=" + ",".join(BLACKLIST),
        *(SYSTEMD_BOOT if systemd else ()),
        "--exec",
        f"exec /bin/sh {GUEST_SHARED}/{GUEST_COMMAND}",
    ]


def guest_command_script(guest_argv: list[str], cwd: Path = REPO) -> str:
    """The guest's command, as a shell script read from the shared directory (not from the kernel command
    line, which is too short for the checkout's paths). Its first line tells the host the guest is up."""
    return (
        "# written by tests/e2e/vm.py; run by the guest's init (virtme-ng --exec)\n"
        f": > {GUEST_SHARED}/{GUEST_BEGAN}\n"
        f"cd {shlex.quote(str(cwd))} || exit 97\n"
        f"exec {shlex.join(guest_argv)}\n"
    )


def kernel_command_line(vng_argv: list[str], env: dict | None = None) -> str:
    """The kernel command line virtme-ng builds for `vng_argv` (its --dry-run, no VM started)."""
    r = subprocess.run(
        [*vng_argv, "--dry-run"], capture_output=True, text=True, timeout=60, cwd="/", env=env
    )
    for line in r.stdout.splitlines():
        words = shlex.split(line) if "-append" in line else []
        if "-append" in words:
            return words[words.index("-append") + 1]
    raise VMUnavailable(f"virtme-ng --dry-run printed no kernel command line (exit {r.returncode}):\n"
                        f"{r.stderr[-2000:]}{r.stdout[-2000:]}")


def run_guest(
    vm: VMEnv,
    guest_argv: list[str],
    shared_dir: Path,
    *,
    memory_mib: int = DEFAULT_MEMORY_MIB,
    timeout: float = DEFAULT_TIMEOUT,
    start_timeout: float = DEFAULT_START_TIMEOUT,
    started_marker: str = "started.json",
    systemd: bool = False,
) -> VMResult:
    """Boot the kernel once and run `guest_argv` in it as root, in the repository directory; the guest sees
    shared_dir at GUEST_SHARED, so paths in `guest_argv` that the guest writes to name GUEST_SHARED.

    stdout of the guest command goes to shared_dir/guest-stdout.txt, the kernel console and the command's
    stderr to shared_dir/console.txt. `boot_seconds` is the time until shared_dir/<started_marker> appeared.
    The guest is stopped at once, with `failure` set, when the console shows a panic (or an oops before the
    command ran), or when the command has not begun within `start_timeout` seconds.
    """
    shared_dir = Path(shared_dir).resolve()
    shared_dir.mkdir(parents=True, exist_ok=True)
    if not (Path("/usr/bin/qemu-system-x86_64").exists() or _which("qemu-system-x86_64")):
        raise VMUnavailable("qemu-system-x86_64 not installed (run scripts/setup-vm)")
    (shared_dir / GUEST_BEGAN).unlink(missing_ok=True)
    (shared_dir / GUEST_COMMAND).write_text(guest_command_script(guest_argv))
    cmd = vng_command(vm, shared_dir, memory_mib, systemd=systemd)
    env = {**os.environ, "PATH": f"{VENV / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    cmdline = kernel_command_line(cmd, env)
    if len(cmdline.encode()) >= KERNEL_CMDLINE_MAX:
        raise VMUnavailable(
            f"the kernel command line virtme-ng builds is {len(cmdline.encode())} bytes, over the kernel's "
            f"{KERNEL_CMDLINE_MAX} (the guest would panic at boot): {cmdline}"
        )
    return _supervise(cmd, env, shared_dir, timeout, start_timeout, started_marker)


def _supervise(
    cmd: list[str], env: dict, shared_dir: Path, timeout: float, start_timeout: float, started_marker: str
) -> VMResult:
    """Run the VM command, watching its console; see run_guest."""
    stdout_path, console_path = shared_dir / "guest-stdout.txt", shared_dir / "console.txt"
    marker, began_marker = shared_dir / started_marker, shared_dir / GUEST_BEGAN
    t0 = time.monotonic()
    boot = None
    timed_out = False
    failure = None
    fatal_at = None  # when the fatal line was seen: the guest gets a moment to print the rest of its trace
    seen = ""  # the console's last bytes, so a line split between two reads still matches
    with open(stdout_path, "wb") as out, open(console_path, "wb") as err, open(console_path, "rb") as con:
        err.write(f"# {shlex.join(cmd)}\n".encode())
        err.flush()
        try:
            proc = subprocess.Popen(
                cmd,
                cwd="/",
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        except OSError as e:
            raise VMUnavailable(f"cannot start virtme-ng: {e}") from e
        while proc.poll() is None:
            now = time.monotonic() - t0
            began = began_marker.exists()
            if boot is None and marker.exists():
                boot = now
            chunk = con.read().decode(errors="replace")
            if chunk and failure is None:
                seen = seen[-4096:] + chunk
                fatal = console_failure(seen[: seen.rfind("\n") + 1], began)
                if fatal:
                    when = f"{now:.0f}s after launch, " + (
                        "while the guest command ran" if began else "before the guest command began"
                    )
                    failure, fatal_at = f"the guest kernel failed ({when}): {fatal}", now
            if fatal_at is not None and now - fatal_at > 1.0:
                _kill_group(proc)
                break
            if failure is None and not began and now > start_timeout:
                failure = (
                    f"the guest command had not begun {start_timeout:.0f}s after launch "
                    f"(no {GUEST_BEGAN} in {shared_dir})"
                )
                _kill_group(proc)
                break
            if now > timeout:
                timed_out = True
                _kill_group(proc)
                break
            time.sleep(0.1)
    if boot is None and marker.exists():
        boot = time.monotonic() - t0  # finished between two polls
    return VMResult(
        proc.returncode, time.monotonic() - t0, boot, timed_out, stdout_path, console_path, cmd, failure
    )


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _which(name: str) -> str | None:
    for d in os.environ.get("PATH", "").split(":"):
        if d and os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    return None


def scenario_argv(vm: VMEnv, only: str = "", agent: Path | None = None, demo: bool = False) -> list[str]:
    """The guest driver's command; it writes its results to the shared directory (GUEST_SHARED there)."""
    argv = [
        str(VENV / "bin" / "python"),
        str(GUEST_DIR / "driver.py"),
        "--out",
        GUEST_SHARED,
        "--rootfs",
        str(vm.rootfs),
        "--agent",
        str(agent or VENV / "bin" / "oomwatch"),
    ]
    if vm.prometheus:
        argv += ["--prometheus", str(vm.prometheus)]
    if only:
        argv += ["--only", only]
    if demo:
        argv += ["--demo"]
    return argv


def compile_python() -> subprocess.Popen:
    """Byte-compile the project and the venv on the host, in the background while the guest boots: the guest
    sees a read-only filesystem, cannot write .pyc files, and compiling at every import costs seconds
    there."""
    return subprocess.Popen(
        [
            str(VENV / "bin" / "python"),
            "-m",
            "compileall",
            "-q",
            "-j0",
            str(REPO / "oomwatch"),
            str(GUEST_DIR),
            str(REPO / "tests" / "__init__.py"),
            str(REPO / "tests" / "deploy" / "__init__.py"),
            str(REPO / "tests" / "deploy" / "dashboard.py"),
            str(next((VENV / "lib").glob("python3*/site-packages"))),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


AGENT_MODULES = "agent-modules.json"  # in the run directory: what the guest copies to its own disk (driver.py)


def write_agent_modules(out_dir: Path) -> None:
    """The source file of each module `oomwatch agent` imports at its start, and of every module of their packages
    (oomwatch's among them: some it imports later), for the guest driver, which runs the agent from their
    byte-compiled copies on the guest's tmpfs (tests/e2e/guest/driver.py, local_agent): listed here, where importing
    takes a fraction of a second, not in the guest, where it takes 7-10 s."""
    code = ("import json, sys; import oomwatch.cli, oomwatch.agent; "
            "print(json.dumps({n: getattr(m, '__file__', None) for n, m in list(sys.modules.items())}))")
    site_packages = str(next((VENV / "lib").glob("python3*/site-packages")))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), site_packages])}
    out = subprocess.run([str(VENV / "bin" / "python"), "-S", "-c", code], cwd=str(REPO), env=env,
                         capture_output=True, text=True, check=True, timeout=120).stdout
    modules = {name: path for name, path in json.loads(out).items() if path}
    # A package's every module: the copy of a package hides the rest of it (click imports click._textwrap when
    # it first wraps help text)
    for name, path in list(modules.items()):
        if os.path.basename(path) == "__init__.py":
            for source in sorted(Path(path).parent.rglob("*")):
                if source.suffix in (".py", ".so") and "__pycache__" not in source.parts:
                    parts = source.relative_to(Path(path).parent).parts
                    stem = source.name.split(".")[0]
                    parts = [*name.split("."), *parts[:-1], *([] if stem == "__init__" else [stem])]
                    modules.setdefault(".".join(parts), str(source))
    (Path(out_dir) / AGENT_MODULES).write_text(json.dumps({"site_packages": site_packages, "modules": modules}))


def run_scenarios(
    out_dir: Path, only: str = "", memory_mib: int = DEFAULT_MEMORY_MIB, timeout: float = DEFAULT_TIMEOUT
) -> tuple[VMEnv, VMResult]:
    vm = prepare()
    comp = compile_python()
    write_agent_modules(Path(out_dir))
    try:
        res = run_guest(
            vm, scenario_argv(vm, only), Path(out_dir), memory_mib=memory_mib, timeout=timeout
        )
    finally:
        comp.wait()
    return vm, res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default=str(REPO / "artifacts" / "e2e" / "manual"))
    ap.add_argument("--only", default="", help="scenario names or letters, comma-separated")
    ap.add_argument("--memory", type=int, default=DEFAULT_MEMORY_MIB)
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    ap.add_argument(
        "--exec", dest="exec_", default="",
        help=f"run this shell command instead of the scenarios (the run directory is {GUEST_SHARED} there)"
    )
    ap.add_argument("--agent", default=None, help="oomwatch executable to test (default: .venv/bin/oomwatch)")
    a = ap.parse_args()
    out = Path(a.out)
    vm = prepare()
    comp = compile_python()
    out.mkdir(parents=True, exist_ok=True)
    if not a.exec_ and not a.agent:  # the copy is of this checkout's package: for its own agent only
        write_agent_modules(out)
    argv = (
        ["sh", "-c", a.exec_]
        if a.exec_
        else scenario_argv(vm, a.only, Path(a.agent) if a.agent else None)
    )
    res = run_guest(
        vm,
        argv,
        out,
        memory_mib=a.memory,
        timeout=a.timeout,
        started_marker="started.json" if not a.exec_ else GUEST_BEGAN,
    )
    comp.wait()
    print(res.stdout)
    if res.failure_report():
        print(res.failure_report(), file=sys.stderr)
    print(
        f"rc={res.returncode} boot={res.boot_seconds} total={res.seconds:.1f}s timed_out={res.timed_out} "
        f"out={out}",
        file=sys.stderr,
    )
    return 0 if res.returncode == 0 and not res.timed_out and not res.failure else 1


if __name__ == "__main__":
    sys.exit(main())
