"""Draw deploy/grafana/oomwatch-dashboard.json's panels from the query results the real-kernel tier saved.

Input: k_image_agent/dashboard-range.json of an e2e run (tests/e2e/guest/image_scenario.py: every panel query run
against Debian's Prometheus scraping the agent from the image: range queries for time series panels, instant
queries for the rest). Layout, titles, units and legends come from the dashboard JSON; the numbers only from
Prometheus. The picture says so on its face: it is a rendering, not a Grafana screenshot (Debian has no Grafana).

    scripts/render-dashboard RUN_DIR/k_image_agent/dashboard-range.json docs/dashboard.png
"""

from __future__ import annotations

import json
import math
import re
import sys
import textwrap
from datetime import datetime, timezone
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.gridspec import GridSpec  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "oomwatch-dashboard.json"
LABEL = "rendered from Prometheus data, not a Grafana screenshot"
BG, PANEL, TEXT, MUTED, GRID = "#111217", "#181b1f", "#d8d9da", "#8e8e8e", "#2c3235"
COLORS = ["#73bf69", "#f2cc0c", "#5794f2", "#ff780a", "#b877d9", "#f2495c", "#8ab8ff", "#fade2a", "#96d98d"]


def legend(fmt: str | None, metric: dict) -> str:
    if not fmt:
        return ", ".join(f"{k}={v}" for k, v in metric.items() if k not in ("job", "instance")) or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt).strip() or "value"


def fmt_value(v: float, unit: str | None) -> str:
    if math.isnan(v):
        return "NaN"
    if unit == "bytes":
        return f"{v / 2**20:.1f} MiB" if not math.isinf(v) else "max"
    if unit == "percentunit":
        return f"{100 * v:.0f}%"
    if unit == "s":
        return f"{v:.2f} s"
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.2f}"


def style(ax, title: str) -> None:
    ax.set_facecolor(PANEL)
    for spine in ax.spines.values():
        spine.set_color(GRID)
    ax.set_title(title, color=TEXT, fontsize=9, loc="left", pad=4)
    ax.tick_params(colors=MUTED, labelsize=7)


def draw_stat(ax, panel: dict, data: dict, unit: str | None) -> None:
    style(ax, panel["title"])
    ax.set_xticks([])
    ax.set_yticks([])
    res = data["targets"][0]["result"] or []
    value = float(res[0]["value"][1]) if res else float("nan")
    color = COLORS[5] if value and not math.isnan(value) and panel["title"] != "OOM kills in range" else COLORS[0]
    if panel["title"] == "OOM kills in range" and value:
        color = COLORS[3]
    ax.text(0.5, 0.45, fmt_value(value, unit), color=color, fontsize=22, ha="center", va="center",
            weight="bold", transform=ax.transAxes)


def draw_timeseries(ax, panel: dict, data: dict, unit: str | None, start: float) -> None:
    style(ax, panel["title"])
    i = 0
    for target, spec in zip(data["targets"], panel["targets"]):
        for series in target["result"] or []:
            xs = [float(t) - start for t, _ in series["values"]]
            ys = [float(v) for _, v in series["values"]]
            if unit == "bytes":
                ys = [y / 2**20 for y in ys]
            ax.plot(xs, ys, color=COLORS[i % len(COLORS)], linewidth=1.3,
                    label=legend(spec.get("legendFormat"), series["metric"]))
            i += 1
    ax.grid(color=GRID, linewidth=0.5)
    ax.set_xlabel("seconds into the run", color=MUTED, fontsize=7)
    if unit == "bytes":
        ax.set_ylabel("MiB", color=MUTED, fontsize=7)
    elif unit == "s":
        ax.set_ylabel("seconds", color=MUTED, fontsize=7)
    if i:
        ax.legend(fontsize=6, loc="upper left", facecolor=PANEL, edgecolor=GRID, labelcolor=TEXT,
                  ncol=2 if i > 4 else 1)


def draw_table(ax, panel: dict, data: dict) -> None:
    style(ax, panel["title"])
    ax.set_xticks([])
    ax.set_yticks([])
    res = data["targets"][0]["result"] or []
    drop = {"job", "instance", "__name__", "node"}
    keys = sorted({k for r in res for k in r["metric"] if k not in drop and r["metric"].get(k)})
    title = panel["title"]
    value_name = {"Recent incidents": "last kill (UTC)", "Top containers by OOM kills": "kills",
                  "Node posture": ""}.get(title, "value")
    rows = []
    for r in res:
        v = float(r["value"][1])
        if title == "Recent incidents":
            shown = datetime.fromtimestamp(v / 1000, timezone.utc).strftime("%H:%M:%S")
        else:
            shown = fmt_value(v, None)
        rows.append([r["metric"].get(k, "") for k in keys] + ([shown] if value_name else []))
    cols = keys + ([value_name] if value_name else [])
    if not rows:
        ax.text(0.5, 0.5, "no data", color=MUTED, ha="center", transform=ax.transAxes)
        return
    table = ax.table(cellText=rows, colLabels=cols, loc="upper center", cellLoc="left", colLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    for (row, _col), cell in table.get_celld().items():
        cell.set_edgecolor(GRID)
        cell.set_facecolor(PANEL if row else "#22252b")
        cell.get_text().set_color(TEXT if row else MUTED)
        cell.set_height(0.11)


def draw_bargauge(ax, panel: dict, data: dict, unit: str | None) -> None:
    style(ax, panel["title"])
    res = data["targets"][0]["result"] or []
    names = [legend(panel["targets"][0].get("legendFormat"), r["metric"]) for r in res]
    values = [float(r["value"][1]) for r in res]
    ax.barh(range(len(values)), values, color=COLORS[1], height=0.5)
    ax.set_xlim(0, 1 if unit == "percentunit" else max(values + [1]))
    ax.set_yticks([])
    ax.set_ylim(-0.5, len(values) - 0.5)
    for i, (name, v) in enumerate(zip(names, values)):
        ax.text(0.01, i + 0.32, name, color=MUTED, fontsize=7)
        ax.text(min(v, 0.85) + 0.02, i, fmt_value(v, unit), color=TEXT, va="center", fontsize=9, weight="bold")
    ax.xaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))


def render(results_path: Path, out: Path) -> None:
    results = json.loads(results_path.read_text())
    dashboard = json.loads(DASHBOARD.read_text())
    by_id = {p["id"]: p for p in results["panels"]}
    panels = [p for p in dashboard["panels"] if p.get("id") in by_id]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(16, rows * 0.3 + 1.6), facecolor=BG)
    top = 1 - 1.3 / (rows * 0.3 + 1.6)
    grid = GridSpec(rows, 24, figure=fig, left=0.04, right=0.99, top=top, bottom=0.03, hspace=0.9, wspace=0.6)
    start = results["start"]
    for panel in panels:
        g = panel["gridPos"]
        ax = fig.add_subplot(grid[g["y"]:g["y"] + g["h"], g["x"]:g["x"] + g["w"]])
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        data = by_id[panel["id"]]
        kind = panel["type"]
        if kind == "stat":
            draw_stat(ax, panel, data, unit)
        elif kind == "timeseries":
            draw_timeseries(ax, panel, data, unit, start)
        elif kind == "table":
            draw_table(ax, panel, data)
        elif kind == "bargauge":
            draw_bargauge(ax, panel, data, unit)
        else:
            raise SystemExit(f"panel type {kind!r} is not drawn")
    when = datetime.fromtimestamp(start, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    fig.text(0.04, 1 - 0.35 / (rows * 0.3 + 1.6), f"{dashboard.get('title', 'oomwatch')}: {LABEL}",
             color=TEXT, fontsize=14, weight="bold", va="top")
    caption = (f"Data: the real-kernel tier (Linux 6.1 under QEMU), the agent from the scripts/build-image image "
             f"run by runc as the DaemonSet runs it, scraped every 2 s by Debian's Prometheus; one group kill and "
             f"one single kill; {int(results['end'] - start)} s from {when}. Variables: "
             + ", ".join(f"{k}={v}" for k, v in sorted(results["variables"].items()))
             + ". Counts are Prometheus' increase(), which extrapolates to the window's edges: hence fractional counts.")
    fig.text(0.04, 1 - 0.7 / (rows * 0.3 + 1.6), "\n".join(textwrap.wrap(caption, 190)),
             color=MUTED, fontsize=8, va="top")
    fig.savefig(out, dpi=80, facecolor=BG)
    print(f"wrote {out} ({out.stat().st_size} bytes) from {results_path}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    render(Path(sys.argv[1]), Path(sys.argv[2]))
