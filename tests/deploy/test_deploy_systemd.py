"""systemd unit: hardened (systemd-analyze security --offline exposure <= 2.0), and set up so the
agent can still read what it needs and attach its journal entries to other units (uid 0). That it does, while
it runs under real systemd, is tests/e2e/test_systemd.py's."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from oomwatch.cli import agent

from .conftest import SYSTEMD_ENV, SYSTEMD_UNIT, run, tool

MAX_EXPOSURE = 2.0
# What `oomwatch agent` reads from the environment: its options' own variables.
AGENT_ENV = {param.envvar for param in agent.params if isinstance(param.envvar, str)}


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
    # netlink only for --proc-connector, added in a drop-in with CAP_NET_ADMIN (systemd/oomwatch.env)
    assert set(last("RestrictAddressFamilies").split()) == {"AF_INET", "AF_INET6", "AF_UNIX"}
    assert last("IPAddressDeny") == "any"
    allowed = last("IPAddressAllow").split()
    assert {"localhost", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"} <= set(allowed)


def test_root_with_only_syslog() -> None:
    """uid 0, because journald shows an entry under another unit (OBJECT_SYSTEMD_UNIT=) only from root; the one
    capability it holds (root's permitted set is the bounding set) is CAP_SYSLOG."""
    assert last("User") == "root"
    assert "DynamicUser" not in directives() and "AmbientCapabilities" not in directives()
    assert last("CapabilityBoundingSet") == "CAP_SYSLOG"
    assert {"-/etc/shadow", "-/etc/ssh"} <= set(last("InaccessiblePaths").split())


def test_only_the_state_dir_is_writable() -> None:
    assert last("StateDirectory") == "oomwatch"
    assert "ReadWritePaths" not in directives() or directives()["ReadWritePaths"] == ["/var/lib/oomwatch"]
    assert "LogsDirectory" not in directives() and "CacheDirectory" not in directives()


def test_kernel_log_stays_readable() -> None:
    """The settings that would hide /dev/kmsg or other users' /proc/<pid>/cgroup stay off; the private /dev
    has /dev/kmsg bound in, and it is the one device allowed."""
    d = directives()
    assert d.get("ProtectKernelLogs", ["no"])[-1] == "no"
    assert d.get("ProtectProc", ["default"])[-1] == "default"
    assert last("PrivateDevices") == "yes" and "/dev/kmsg" in last("BindReadOnlyPaths").split()
    assert d["DeviceAllow"] == ["/dev/kmsg r"]


def test_environment_file_sets_only_agent_options() -> None:
    for line in SYSTEMD_ENV.read_text().splitlines():
        line = line.strip().lstrip("#").strip()
        m = re.match(r"^([A-Z_]+)=", line)
        if m:
            assert m.group(1) in AGENT_ENV, m.group(1)
