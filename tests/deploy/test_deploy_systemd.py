"""systemd unit: hardened (systemd-analyze security --offline exposure <= 2.5), and set up so the
agent can still read what it needs."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from .conftest import AGENT_ENV, SYSTEMD_ENV, SYSTEMD_UNIT, run, tool

MAX_EXPOSURE = 2.5


def directives() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in SYSTEMD_UNIT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key, []).append(value)
    return out


def last(key: str) -> str:
    values = directives().get(key)
    assert values, f"{key}= missing"
    return values[-1]


@pytest.mark.tools
def test_systemd_analyze_security_exposure() -> None:
    analyze = tool("systemd-analyze")
    help_text = run([analyze, "security", "--help"]).stdout
    assert "--offline" in help_text, "systemd-analyze too old for --offline (systemd >= 250)"
    out = run([analyze, "security", "--offline=true", "--no-pager", str(SYSTEMD_UNIT)], check=False)
    m = re.search(r"Overall exposure level for oomwatch\.service: (\d+\.\d+)", out.stdout + out.stderr)
    assert m, out.stdout + out.stderr
    assert float(m.group(1)) <= MAX_EXPOSURE, out.stdout


@pytest.mark.tools
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    """The unit parses cleanly; the binary is pointed at one that exists here."""
    analyze = tool("systemd-analyze")
    unit = tmp_path / "oomwatch.service"
    true = shutil.which("true") or "/bin/true"
    unit.write_text(SYSTEMD_UNIT.read_text().replace("/usr/local/bin/oomwatch", true))
    out = run([analyze, "verify", "--man=no", str(unit)], check=False)
    complaints = [
        line
        for line in (out.stdout + out.stderr).splitlines()
        if "oomwatch.service" in line or "Unknown" in line or "Invalid" in line
    ]
    assert not complaints, "\n".join(complaints)


def test_exec_start_and_environment() -> None:
    assert last("ExecStart").split()[:2] == ["/usr/local/bin/oomwatch", "agent"]
    assert "-/etc/default/oomwatch" in directives()["EnvironmentFile"]
    for value in directives()["Environment"]:
        name = value.split("=", 1)[0]
        assert name in AGENT_ENV, name


def test_restart_and_oom_score() -> None:
    assert last("Restart") == "on-failure"
    assert last("OOMScoreAdjust") == "-900"


def test_hardening_directives() -> None:
    assert last("ProtectSystem") == "strict"
    assert last("ProtectHome") == "yes"
    assert last("PrivateTmp") == "yes"
    assert last("NoNewPrivileges") == "yes"
    assert last("MemoryDenyWriteExecute") == "yes"
    assert last("ProtectKernelTunables") == "yes"
    assert last("ProtectControlGroups") == "yes"  # read-only cgroupfs: the agent only reads it
    assert last("ProtectKernelModules") == "yes"
    assert last("RestrictNamespaces") == "yes"
    assert last("SystemCallArchitectures") == "native"
    assert "@system-service" in directives()["SystemCallFilter"]
    assert set(last("RestrictAddressFamilies").split()) == {"AF_INET", "AF_INET6", "AF_UNIX", "AF_NETLINK"}


def test_capabilities_only_syslog() -> None:
    assert last("CapabilityBoundingSet") == "CAP_SYSLOG"
    assert last("AmbientCapabilities") == "CAP_SYSLOG"


def test_only_the_state_dir_is_writable() -> None:
    assert last("StateDirectory") == "oomwatch"
    assert "ReadWritePaths" not in directives() or directives()["ReadWritePaths"] == ["/var/lib/oomwatch"]
    assert "LogsDirectory" not in directives() and "CacheDirectory" not in directives()


def test_kernel_log_stays_readable() -> None:
    """The settings that would hide /dev/kmsg or other users' /proc/<pid>/cgroup stay off."""
    d = directives()
    assert d.get("ProtectKernelLogs", ["no"])[-1] == "no"
    assert d.get("PrivateDevices", ["no"])[-1] == "no"
    assert d.get("ProtectProc", ["default"])[-1] == "default"
    assert "/dev/kmsg r" in d["DeviceAllow"]


def test_environment_file_sets_only_agent_options() -> None:
    for line in SYSTEMD_ENV.read_text().splitlines():
        line = line.strip().lstrip("#").strip()
        m = re.match(r"^([A-Z_]+)=", line)
        if m:
            assert m.group(1) in AGENT_ENV, m.group(1)
