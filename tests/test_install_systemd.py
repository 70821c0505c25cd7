"""The README's one-command systemd install, into a scratch root (no systemd runs here)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.mark.tools
def test_install_systemd_lays_out_a_working_service(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc/default").mkdir(parents=True)
    (root / "etc/default/oomwatch").write_text("OOMWATCH_LISTEN=127.0.0.1:9717\n")  # the admin's: kept
    result = subprocess.run([str(REPO / "scripts/install-systemd"), "--root", str(root)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "installed: oomwatch, version" in result.stdout
    unit = (root / "etc/systemd/system/oomwatch.service").read_text()
    assert unit == (REPO / "systemd/oomwatch.service").read_text()
    assert "ExecStart=/usr/local/bin/oomwatch agent" in unit
    assert (root / "etc/default/oomwatch").read_text() == "OOMWATCH_LISTEN=127.0.0.1:9717\n"
    # Staged for its final place: the link and the script's interpreter name /opt/oomwatch, never the stage.
    link = root / "usr/local/bin/oomwatch"
    assert os.readlink(link) == "/opt/oomwatch/bin/oomwatch"
    staged = root / "opt/oomwatch/bin/oomwatch"
    assert os.access(staged, os.X_OK)
    assert staged.read_text().splitlines()[0] == "#!/opt/oomwatch/bin/python"
    assert not [p.name for p in (root / "opt/oomwatch/bin").iterdir()
                if p.is_file() and not p.is_symlink() and str(root) in p.read_text(errors="replace")]
    # It runs with the staged interpreter (the venv's python links to the system's, wherever it is).
    help_text = subprocess.run([str(root / "opt/oomwatch/bin/python"), str(staged), "agent", "--help"],
                               capture_output=True, text=True, check=True).stdout
    assert "--state-dir" in help_text
