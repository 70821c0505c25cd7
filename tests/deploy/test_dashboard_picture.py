"""docs/dashboard.png, the dashboard drawn by scripts/render-dashboard (Debian has no Grafana to screenshot):
every panel of deploy/grafana/oomwatch-dashboard.json is in it, and counts are shown as the dashboard's decimals
say (0: integers, where increase() answers 2.03).

The picture names what it drew in its PNG text chunk `oomwatch-panels` (scripts/lib/render_dashboard.py writes
it from the panels it drew and the values it printed); these tests read it back."""

from __future__ import annotations

import json
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from .conftest import DASHBOARD, ROOT

PICTURE = ROOT / "docs" / "dashboard.png"
PNG_KEY = "oomwatch-panels"


def png_text(path: Path) -> dict[str, str]:
    """The PNG's text chunks (tEXt, zTXt, iTXt), read with the format's own layout."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    out, pos = {}, 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            out[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"zTXt":
            key, _, rest = body.partition(b"\0")
            out[key.decode("latin-1")] = zlib.decompress(rest[1:]).decode("latin-1")
        elif kind == b"iTXt":
            key, _, rest = body.partition(b"\0")
            compressed, rest = rest[0], rest[2:]
            _lang, _, rest = rest.partition(b"\0")
            _translated, _, text = rest.partition(b"\0")
            out[key.decode("latin-1")] = (zlib.decompress(text) if compressed else text).decode("utf-8")
    return out


def drawn_panels(path: Path) -> list[dict]:
    text = png_text(path)
    assert PNG_KEY in text, f"{path} does not say which panels it shows: redraw it with scripts/render-dashboard"
    return json.loads(text[PNG_KEY])


def dashboard_panels() -> list[dict]:
    return json.loads(DASHBOARD.read_text())["panels"]


def assert_every_panel_drawn(path: Path) -> list[dict]:
    drawn = drawn_panels(path)
    want = [(p["id"], p["title"], p["type"]) for p in dashboard_panels()]
    got = [(p["id"], p["title"], p["type"]) for p in drawn]
    assert got == want, (f"{path.name} shows {len(got)} panels, the dashboard has {len(want)}; missing "
                         f"{sorted(set(want) - set(got))}, extra {sorted(set(got) - set(want))}: "
                         "run scripts/render-dashboard")
    return drawn


def assert_counts_are_integers(drawn: list[dict]) -> None:
    by_id = {p["id"]: p for p in dashboard_panels()}
    for p in drawn:
        if p["type"] == "stat" and by_id[p["id"]].get("fieldConfig", {}).get("defaults", {}).get("decimals") == 0:
            assert p["shown"], p
            for value in p["shown"]:
                assert value.isdigit(), f"{p['title']!r} shows {value!r}, not a count"


def test_the_docs_picture_shows_every_panel_of_the_dashboard() -> None:
    assert_counts_are_integers(assert_every_panel_drawn(PICTURE))


@pytest.mark.tools
def test_render_dashboard_draws_every_panel_from_a_real_prometheus(tmp_path: Path) -> None:
    """scripts/render-dashboard end to end: Debian's Prometheus scraping two real agents that read real captured
    kernel logs; the picture has every panel, and each stat shows what Prometheus answered, with the
    dashboard's decimals."""
    out, queries = tmp_path / "dashboard.png", tmp_path / "queries.json"
    r = subprocess.run(["bash", str(ROOT / "scripts" / "render-dashboard"), str(out), str(queries)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    drawn = assert_every_panel_drawn(out)
    assert_counts_are_integers(drawn)
    answers = {p["id"]: p for p in json.loads(queries.read_text())["panels"]}
    for p in drawn:
        if p["type"] != "stat":
            continue
        values = [float(s["value"][1]) for t in answers[p["id"]]["targets"] for s in t["result"]]
        assert [f"{v:.0f}" for v in values] == p["shown"], (p["title"], values, p["shown"])
    shown = {p["title"]: p["shown"] for p in drawn}
    # the fixtures' kills reached Prometheus: gpu-1's group kill of ml/train-0 trainer at least (how many of
    # build-2's four show depends on whether the agent exports their cgroups at 0 before the kill)
    assert int(shown["OOM kills in range"][0]) >= 1
    assert any(row.startswith("ml/train-0/trainer | gpu-1 | ") for row in shown["Top workloads by OOM kills"])
    # build-2's plain cgroups are named by their path on their node, not run together with empty Kubernetes labels
    assert any(row.startswith("/a | build-2 | ") for row in shown["Top workloads by OOM kills"])
