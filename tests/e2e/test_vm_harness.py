"""The real-kernel tier's harness itself (tests/e2e/vm.py), without booting anything: unit tier.

- the kernel command line virtme-ng builds for the harness stays short from a long checkout path (a cut one
  panicked the guest at its first instant from a 60-character path);
- a guest that panics, or never starts its command, is stopped at once and reported with the console's tail.
"""

from __future__ import annotations

import base64
import os
import struct
import sys
import time
from pathlib import Path

import virtme
import virtme_ng

from tests.e2e import vm

KVER = "6.1.0-99-oomwatch-test"


def _fake_bzimage(path: Path) -> None:
    """An x86 boot header just complete enough for `file` to read the kernel version from it, as virtme-ng
    does (boot flag 0x55aa, "HdrS", the version string's offset at 0x20e, counted from 0x200)."""
    image = bytearray(0x400)
    image[0x1FE:0x200] = b"\x55\xaa"
    image[0x202:0x206] = b"HdrS"
    image[0x206:0x208] = struct.pack("<H", 0x020F)
    image[0x20E:0x210] = struct.pack("<H", 0x100)
    version = f"{KVER} (test@oomwatch) #1 SMP\0".encode()
    image[0x300 : 0x300 + len(version)] = version
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(image))


def _checkout_at(tmp_path: Path, length: int) -> Path:
    root = tmp_path / ("c" * (length - len(str(tmp_path)) - 1))
    assert len(str(root)) == length
    return root


def test_kernel_command_line_stays_short_for_a_200_character_checkout(tmp_path: Path) -> None:
    root = _checkout_at(tmp_path, 200)
    # The checkout's .venv, as virtme-ng finds itself there: its packages are imported from this path (through
    # links to the installed ones), so init= names it as it would in a real checkout at this path.
    site = root / ".venv" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    site.mkdir(parents=True)
    for module in (virtme, virtme_ng):
        (site / module.__name__).symlink_to(Path(module.__file__).parent)
    # The VM cache as scripts/setup-vm lays it out: the extracted package in kernel/ (with its lib/modules),
    # the image booted through the link in boot/.
    cache = root / ".cache" / "vm"
    _fake_bzimage(cache / "kernel" / "boot" / f"vmlinuz-{KVER}")
    (cache / "kernel" / "lib" / "modules" / KVER).mkdir(parents=True)
    (cache / "kernel" / "lib" / "modules" / KVER / "modules.dep").write_text("")
    (cache / "boot").mkdir()
    (cache / "boot" / f"vmlinuz-{KVER}").symlink_to(f"../kernel/boot/vmlinuz-{KVER}")
    shared = root / "artifacts" / "e2e" / "run-20261125-000000"
    shared.mkdir(parents=True)
    fake_bin = tmp_path / "bin"  # virtme-ng looks qemu up even for --dry-run; it never runs it
    fake_bin.mkdir()
    (fake_bin / "qemu-system-x86_64").write_text("#!/bin/sh\nexit 0\n")
    (fake_bin / "qemu-system-x86_64").chmod(0o755)
    env_vm = vm.VMEnv(KVER, cache / "boot" / f"vmlinuz-{KVER}", cache / "rootfs", None)
    env = {
        **os.environ,
        "PATH": f"{fake_bin}:{vm.VENV / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "PYTHONPATH": str(site),
    }

    cmdline = vm.kernel_command_line(vm.vng_command(env_vm, shared, 768), env)

    assert f"init={site}/virtme/guest/" in cmdline, cmdline  # the simulated checkout is the one measured
    assert cmdline.count(str(root)) == 1, cmdline  # only init=: not the run directory, cache, command or cwd
    assert len(cmdline.encode()) <= 1400 < vm.KERNEL_CMDLINE_MAX, (len(cmdline.encode()), cmdline)
    exec_arg = cmdline.split("virtme.exec=`", 1)[1].split("`", 1)[0]
    assert base64.b64decode(exec_arg).decode() == f"exec /bin/sh {vm.GUEST_SHARED}/{vm.GUEST_COMMAND}"


def test_guest_command_script_carries_the_long_paths(tmp_path: Path) -> None:
    root = _checkout_at(tmp_path, 200)
    argv = [f"{root}/.venv/bin/python", f"{root}/tests/e2e/guest/driver.py", "--out", vm.GUEST_SHARED]
    script = vm.guest_command_script(argv, cwd=root)
    lines = script.splitlines()
    assert f": > {vm.GUEST_SHARED}/{vm.GUEST_BEGAN}" in lines  # the host's sign that the guest is up
    assert f"cd {root} || exit 97" in lines
    assert lines[-1] == f"exec {root}/.venv/bin/python {root}/tests/e2e/guest/driver.py --out {vm.GUEST_SHARED}"


# A real failed boot's console (the 60-character checkout of issue 20), shortened.
PANIC_CONSOLE = """\
[    0.000000] Linux version 6.1.0-56-amd64 (debian-kernel@lists.debian.org) #1 SMP PREEMPT_DYNAMIC Debian
[    0.000000] Command line: virtme_hostname=virtme-ng nr_open=1048576 virtme_link_mods=/tmp/clone
[    0.412345] detected buffer overflow in __fortify_strlen
[    0.412399] ------------[ cut here ]------------
[    0.412401] kernel BUG at lib/string_helpers.c:1027!
[    0.412500] invalid opcode: 0000 [#1] PREEMPT SMP NOPTI
[    0.412999] Kernel panic - not syncing: Attempted to kill init! exitcode=0x0000000b
"""


def test_console_failure_names_the_first_fatal_line() -> None:
    assert vm.console_failure(PANIC_CONSOLE, began=False) == "[    0.412345] detected buffer overflow in __fortify_strlen"
    # once the command runs only a panic ends the guest (a soft-lockup warning under TCG does not)
    assert vm.console_failure(PANIC_CONSOLE, began=True).endswith("Kernel panic - not syncing: Attempted to kill init! exitcode=0x0000000b")
    assert vm.console_failure("[   22.1] watchdog: BUG: soft lockup - CPU#0 stuck for 23s!\n", began=True) is None
    assert vm.console_failure("[    1.0] Run /init as init process\n", began=False) is None


def _fake_vm(tmp_path: Path, console: str, then_sleep: float) -> list[str]:
    """A stand-in for virtme-ng: prints `console` on stderr (the serial console), then hangs, as a guest
    whose kernel died without QEMU exiting."""
    return [sys.executable, "-c",
            f"import sys, time; sys.stderr.write({console!r}); sys.stderr.flush(); time.sleep({then_sleep})"]


def test_a_panicking_guest_is_stopped_at_once_with_the_console_tail(tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = vm._supervise(_fake_vm(tmp_path, PANIC_CONSOLE, 60), dict(os.environ), tmp_path, timeout=60,
                        start_timeout=60, started_marker="started.json")
    assert time.monotonic() - t0 < 10
    assert res.failure and "before the guest command began" in res.failure
    assert "detected buffer overflow in __fortify_strlen" in res.failure
    report = res.failure_report()
    assert "kernel BUG at lib/string_helpers.c:1027!" in report and "Kernel panic - not syncing" in report
    assert not res.timed_out and res.returncode is not None


def test_a_silent_guest_is_stopped_at_its_start_timeout(tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = vm._supervise(_fake_vm(tmp_path, "[    0.000000] Linux version 6.1.0-56-amd64\n", 60), dict(os.environ),
                        tmp_path, timeout=60, start_timeout=1.0, started_marker="started.json")
    assert time.monotonic() - t0 < 10
    assert res.failure and f"had not begun 1s after launch (no {vm.GUEST_BEGAN}" in res.failure
    assert "Linux version 6.1.0-56-amd64" in res.failure_report()


def test_a_guest_that_began_is_not_held_to_the_start_timeout(tmp_path: Path) -> None:
    (tmp_path / vm.GUEST_BEGAN).touch()  # as the guest command's first line does
    cmd = [sys.executable, "-c", "import time; time.sleep(0.8)"]
    res = vm._supervise(cmd, dict(os.environ), tmp_path, timeout=60, start_timeout=0.2, started_marker="started.json")
    assert res.failure is None and res.failure_report() is None and res.returncode == 0
