"""Draw every panel of deploy/grafana/oomwatch-dashboard.json from what a real Prometheus answers to its queries.

Debian has no Grafana to take a screenshot with, so `scripts/render-dashboard` (which runs this with Debian's
python3-matplotlib) does what Grafana would do with the dashboard, on real data:

1. collect: Debian's Prometheus server scrapes two real `oomwatch agent` processes every second, as
   docs/deploy.md configures it (job oomwatch, honor_labels, a `node` label), with the alert and recording
   rules of deploy/prometheus/oomwatch-rules.yaml loaded. Each agent reads a real kernel log captured on
   Linux 6.1 with the cgroup tree captured beside it (fixtures/golden/<case>/), through a FIFO: the records
   before the first OOM report at once, the reports after some seconds of scrapes, so Prometheus sees the
   counters at 0 and then the kills (a saved log's records are published when it ends, hence one moment per
   node). Then every query of every panel runs: range queries for time series, instant queries (with
   $__range = the run's length) for the rest. The results are saved as JSON beside the picture's source.
2. render: the panels are laid out as the dashboard's gridPos says, with its titles, units, decimals,
   legends, table transformations (merge, organize, sortBy) and overrides. A panel type it cannot draw is an
   error, never a panel left out. The logs panel ("Explanations (Loki)") queries Loki, which Debian does not
   have: its LogQL is not run, and it is drawn as an explicit placeholder that says so and shows the query. The picture carries, in its PNG text chunk `oomwatch-panels`, the id, title
   and type of every panel drawn and the values it printed: tests/deploy/test_dashboard_picture.py checks them
   against the dashboard.

    render_dashboard.py collect RESULTS.json PROMETHEUS   (runs .venv/bin/oomwatch and that server)
    render_dashboard.py render RESULTS.json OUT.png
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.deploy.dashboard import (  # noqa: E402 (stdlib only: runs under Debian's python3)
    LOKI,
    prometheus_targets,
    query_targets,
    substitute,
)

DASHBOARD = REPO / "deploy" / "grafana" / "oomwatch-dashboard.json"
RULES = REPO / "deploy" / "prometheus" / "oomwatch-rules.yaml"
BOOT_TIME = "2026-11-22T20:40:00Z"  # the captures' boot (tests/conftest.py BOOT_TIME): their records' dates
# (node label, fixture): a Kubernetes node with a runc container group-killed; a host with four memcg kills
NODES = (("gpu-1", "k8s-runc"), ("build-2", "memcg-scenarios"))
SCRAPE_SECONDS = 1
LEGEND_MAX = 8
KEEPALIVE_RECORDS = 40  # one every 2 s: up to 80 s between the agent's start and its kill
PNG_KEY = "oomwatch-panels"
LABEL = "drawn from a real Prometheus's answers to every panel's query, not a Grafana screenshot"
BG, PANEL, TEXT, MUTED, GRID = "#111217", "#181b1f", "#d8d9da", "#8e8e8e", "#2c3235"
COLORS = ["#73bf69", "#f2cc0c", "#5794f2", "#ff780a", "#b877d9", "#f2495c", "#8ab8ff", "#fade2a", "#96d98d"]


# ------------------------------------------------------------------------------------------------ collect
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 30) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def _wait(what: str, check, timeout: float) -> None:
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.25)
    raise SystemExit(f"render-dashboard: {what} not ready after {timeout:.0f}s")


def _split_at_first_oom(log: bytes) -> tuple[bytes, bytes]:
    """The capture's records before its first OOM report, and the rest."""
    at = log.find(b"invoked oom-killer")
    start = log.rfind(b"\n", 0, at) + 1
    return log[:start], log[start:]


class Agent:
    """A real `oomwatch agent` on one fixture's captured cgroup tree, its kernel log fed through a FIFO."""

    def __init__(self, node: str, case: str, work: Path, logs: Path, oomwatch: Path):
        self.node, self.case = node, case
        self.dir = REPO / "fixtures" / "golden" / case
        self.port = _free_port()
        self.fifo = work / f"{node}.kmsg"
        os.mkfifo(self.fifo)
        self.before, self.reports = _split_at_first_oom((self.dir / "kmsg").read_bytes())
        self.log = open(logs / f"agent-{node}.log", "wb")
        # O_RDWR: the FIFO has a writer before the agent opens it, so it never sees an end or waits on open
        self.writer = os.open(self.fifo, os.O_RDWR)
        self.proc = subprocess.Popen(
            [str(oomwatch), "agent", "--listen", f"127.0.0.1:{self.port}", "--kmsg", str(self.fifo),
             "--cgroup-root", str(self.dir / "cgroup"), "--proc", str(self.dir / "proc"),
             "--run-root", str(self.dir / "run"), "--kubelet-config", str(self.dir / "kubelet" / "config.yaml"),
             "--pod-log-dir", str(work / "no-pod-logs"), "--kube-api", "off", "--boot-time", BOOT_TIME],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, start_new_session=True)

    def metrics_up(self) -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return b"oomwatch_oom_kills_total{" in r.read()

    def feed(self, data: bytes) -> None:
        os.write(self.writer, data)

    def start_log(self) -> None:
        """The boot's records but the last few, kept to keep the FIFO alive until the kill (the agent gives up
        on a FIFO silent for 10 s)."""
        lines = self.before.splitlines(keepends=True)
        self.kept = lines[-KEEPALIVE_RECORDS:]
        self.feed(b"".join(lines[:-KEEPALIVE_RECORDS]))

    def keepalive(self) -> None:
        if self.writer is not None and self.kept:
            self.feed(self.kept.pop(0))

    def kill_now(self) -> None:
        """The OOM reports, and the end of the log: the agent publishes the kills at once."""
        self.feed(b"".join(self.kept) + self.reports)
        os.close(self.writer)
        self.writer = None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def collect(out: Path, prometheus: str, oomwatch: Path, before: float = 8.0, after: float = 12.0) -> dict:
    dashboard = json.loads(DASHBOARD.read_text())
    work = Path(tempfile.mkdtemp(prefix="oomwatch-dashboard-"))
    agents: list[Agent] = []
    prom = None
    try:
        agents = [Agent(node, case, work, out.parent, oomwatch) for node, case in NODES]
        prom_port = _free_port()
        targets = "".join(
            f"      - targets: [\"127.0.0.1:{a.port}\"]\n        labels: {{node: \"{a.node}\"}}\n" for a in agents)
        (work / "prometheus.yml").write_text(
            "global:\n"
            f"  scrape_interval: {SCRAPE_SECONDS}s\n  scrape_timeout: {SCRAPE_SECONDS}s\n"
            f"  evaluation_interval: {SCRAPE_SECONDS}s\n"
            f"rule_files: [\"{RULES}\"]\n"
            "scrape_configs:\n  - job_name: oomwatch\n    honor_labels: true\n    static_configs:\n" + targets)
        prom_log = open(out.parent / "prometheus.log", "wb")
        prom = subprocess.Popen(
            [prometheus, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
            stdin=subprocess.DEVNULL, stdout=prom_log, stderr=prom_log, start_new_session=True)
        api = f"http://127.0.0.1:{prom_port}/api/v1"
        for a in agents:
            a.start_log()  # the boot's records, no OOM yet

        def pace(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                for a in agents:
                    a.keepalive()
                time.sleep(min(2.0, max(end - time.monotonic(), 0)))

        def ready(check) -> bool:
            pace(0.5)
            return check()

        for a in agents:
            _wait(f"the agent for {a.node} ({a.dir})", lambda: ready(a.metrics_up), 60)
        _wait("Prometheus", lambda: ready(lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{prom_port}/-/ready", timeout=2).status == 200), 60)
        start = time.time()

        def scraped_up() -> bool:
            r = _get(f"{api}/query?" + urllib.parse.urlencode({"query": "count(up == 1)"}))["data"]["result"]
            return bool(r) and int(float(r[0]["value"][1])) == len(agents)

        _wait("both scrape targets", lambda: ready(scraped_up), 30)
        kills_at = {}
        for i, a in enumerate(agents):
            pace(before / 2 if i else before)  # counters at 0 for a few scrapes, then the kill
            a.kill_now()
            kills_at[a.node] = time.time()
        pace(after)
        end = time.time()
        span = int(end - start) + 1
        variables = {"node": ".*", "namespace": ".*", "pod": ".*", "__rate_interval": f"{4 * SCRAPE_SECONDS}s",
                     "__interval": f"{SCRAPE_SECONDS}s", "__range": f"{span}s"}
        results = {"start": start, "end": end, "step": SCRAPE_SECONDS, "variables": variables,
                   "nodes": {a.node: {"fixture": f"fixtures/golden/{a.case}", "kills_fed_at": kills_at[a.node]}
                             for a in agents},
                   "prometheus": _get(f"{api}/status/buildinfo")["data"], "panels": []}
        for panel in dashboard["panels"]:
            entry = {"id": panel.get("id"), "title": panel.get("title"), "type": panel.get("type"), "targets": []}
            if query_targets(panel, LOKI):  # no Loki here: the LogQL is kept, not run
                entry["not_run"] = {"datasource": LOKI, "queries": [t["expr"] for t in query_targets(panel, LOKI)]}
            for target in prometheus_targets(panel):
                expr = substitute(target["expr"], variables)
                if panel.get("type") == "timeseries":
                    q = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": str(SCRAPE_SECONDS)}
                    r = _get(f"{api}/query_range?" + urllib.parse.urlencode(q))
                else:
                    r = _get(f"{api}/query?" + urllib.parse.urlencode({"query": expr, "time": f"{end:.3f}"}))
                entry["targets"].append({"refId": target.get("refId"), "expr": expr, "status": r.get("status"),
                                         "resultType": r["data"]["resultType"], "result": r["data"]["result"]})
            results["panels"].append(entry)
        out.write_text(json.dumps(results, indent=1) + "\n")
        return results
    finally:
        for a in agents:
            a.stop()
        if prom is not None and prom.poll() is None:
            prom.terminate()
            prom.wait(20)
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------------------------- render
def legend(fmt: str | None, metric: dict) -> str:
    if not fmt:
        return ", ".join(f"{k}={v}" for k, v in metric.items() if k not in ("job", "instance")) or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt).strip() or "value"


def fmt_value(v: float, unit: str | None, decimals: int | None) -> str:
    """A value as the dashboard's unit and decimals say Grafana shows it."""
    if math.isnan(v):
        return "NaN"
    if unit == "bytes":
        return "max" if math.isinf(v) else f"{v / 2**20:.{1 if decimals is None else decimals}f} MiB"
    if unit == "percentunit":
        return f"{100 * v:.{0 if decimals is None else decimals}f}%"
    if unit == "s":
        return f"{v:.{2 if decimals is None else decimals}f} s"
    if unit == "dateTimeAsIso":
        return datetime.fromtimestamp(v / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    if decimals is not None:
        return f"{v:.{decimals}f}"
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.2f}"


def matplotlib_line():
    from matplotlib.lines import Line2D

    return Line2D([], [], color=PANEL)


def style(ax, title: str) -> None:
    ax.set_facecolor(PANEL)
    for spine in ax.spines.values():
        spine.set_color(GRID)
    ax.set_title(title, color=TEXT, fontsize=9, loc="left", pad=4)
    ax.tick_params(colors=MUTED, labelsize=7)


def blank(ax) -> None:
    ax.set_xticks([])
    ax.set_yticks([])


def threshold_color(panel: dict, v: float) -> str:
    steps = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps") or []
    color = "green"
    for step in steps:
        if step.get("value") is None or (not math.isnan(v) and v >= step["value"]):
            color = step["color"]
    return {"green": COLORS[0], "red": COLORS[5], "orange": COLORS[3], "yellow": COLORS[1]}.get(color, COLORS[2])


def draw_stat(ax, panel: dict, data: dict, unit, decimals) -> list[str]:
    style(ax, panel["title"])
    blank(ax)
    shown = []
    rows = []
    for target, spec in zip(data["targets"], panel["targets"]):
        for r in target["result"] or [{"metric": {}, "value": [0, "NaN"]}]:
            v = float(r["value"][1])
            rows.append((legend(spec.get("legendFormat"), r["metric"]) if len(panel["targets"]) > 1 else "", v))
    for i, (name, v) in enumerate(rows):
        text = fmt_value(v, unit, decimals)
        shown.append(text)
        y = 0.45 if len(rows) == 1 else 0.8 - i * (0.7 / max(len(rows) - 1, 1))
        if name:
            ax.text(0.03, y, name, color=MUTED, fontsize=8, va="center", transform=ax.transAxes)
            ax.text(0.97, y, text, color=threshold_color(panel, v), fontsize=16, weight="bold", ha="right",
                    va="center", transform=ax.transAxes)
        else:
            ax.text(0.5, y, text, color=threshold_color(panel, v), fontsize=22, weight="bold", ha="center",
                    va="center", transform=ax.transAxes)
    return shown


def draw_timeseries(ax, fig, panel: dict, data: dict, unit, decimals, start: float) -> list[str]:
    from matplotlib.ticker import MaxNLocator

    style(ax, panel["title"])
    shown = []
    lines = []
    for target, spec in zip(data["targets"], panel["targets"]):
        for series in target["result"] or []:
            xs = [float(t) - start for t, _ in series["values"]]
            ys = [float(v) for _, v in series["values"]]
            if unit == "bytes":
                ys = [y / 2**20 for y in ys]
            name = legend(spec.get("legendFormat"), series["metric"])
            (line,) = ax.plot(xs, ys, color=COLORS[len(lines) % len(COLORS)], linewidth=1.3)
            lines.append((line, name))
            shown.append(name)
    ax.grid(color=GRID, linewidth=0.5)
    if unit == "bytes":
        ax.set_ylabel("MiB", color=MUTED, fontsize=7)
    elif unit == "s":
        ax.set_ylabel("seconds", color=MUTED, fontsize=7)
    if decimals == 0:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if not lines:
        ax.text(0.5, 0.5, "no data", color=MUTED, ha="center", transform=ax.transAxes)
        return shown
    if all(math.isnan(y) for ln, _ in lines for y in ln.get_ydata()):
        ax.text(0.5, 0.5, "no values (NaN)", color=MUTED, ha="center", transform=ax.transAxes)
    # Every series is drawn; the legend names those that moved first, at most LEGEND_MAX of them (a panel over
    # every workload of a node lists dozens at 0, and a legend that long leaves no room for the plot).
    moved = [(ln, n) for ln, n in lines if any(y and not math.isnan(y) for y in ln.get_ydata())]
    still = [(ln, n) for ln, n in lines if (ln, n) not in moved]
    listed = (moved + still)[:LEGEND_MAX]
    if len(listed) < len(lines):
        rest = len(lines) - len(listed)
        listed.append((matplotlib_line(), f"… {rest} more series" + (" (all 0)" if len(moved) <= LEGEND_MAX else "")))
    lines = listed
    # The legend goes in the panel's own cell, under its plot (shrunk to make room), as Grafana lays it out:
    # over the plot it hid the lines, under the cell it ran into the next panel.
    ncol = 1 if len(lines) <= 2 else 2 if len(lines) <= 8 else 3
    rows = -(-len(lines) // ncol)
    pos = ax.get_position()
    room = (10 + rows * 8.5) / 72 / fig.get_figheight()  # tick labels, then one 6-point line per row
    ax.set_position([pos.x0, pos.y0 + room, pos.width, pos.height - room])
    width = int(pos.width * fig.get_figwidth() * 72 / 3.6 / ncol) - 4  # 6-point text: ~3.6 points a character
    ax.legend([ln for ln, _ in lines], [textwrap.shorten(n, max(width, 12)) for _, n in lines], fontsize=6,
              loc="upper left", bbox_to_anchor=(pos.x0, pos.y0 + room - 10 / 72 / fig.get_figheight()),
              bbox_transform=fig.transFigure, ncol=ncol, frameon=False, labelcolor=TEXT, borderaxespad=0,
              handlelength=1.5, columnspacing=1.2, labelspacing=0.25)
    return shown


def table_frame(panel: dict, data: dict) -> tuple[list[str], list[dict]]:
    """Rows and columns as Grafana's table transformations make them from instant query results."""
    many = len(data["targets"]) > 1
    frames = []
    for target in data["targets"]:
        column = f"Value #{target['refId']}" if many else "Value"
        # One frame per query, with a column for every label of any of its series: a series without one of them
        # has it empty there (as Grafana's frame does), so that merging never mistakes it for another's row.
        labels = sorted({k for r in target["result"] or [] for k in r["metric"]})
        frames.append([{**dict.fromkeys(labels, ""), **r["metric"], column: float(r["value"][1])}
                       for r in target["result"] or []])
    rows: list[dict] = []
    transformations = panel.get("transformations") or []
    if any(t["id"] == "merge" for t in transformations):
        for frame in frames:  # rows with the same labels become one row
            for row in frame:
                labels = {k: v for k, v in row.items() if not k.startswith("Value")}
                match = next((r for r in rows if all(r.get(k) == v for k, v in labels.items() if k in r)
                              and all(row.get(k) == v for k, v in r.items() if not k.startswith("Value")
                                      and k in row)), None)
                if match is None:
                    rows.append(dict(row))
                else:
                    match.update(row)
    else:
        rows = [dict(r) for frame in frames for r in frame]
    columns: list[str] = []
    for r in rows:
        columns += [k for k in r if k not in columns]
    columns = [c for c in columns if not c.startswith("Value")] + [c for c in columns if c.startswith("Value")]
    for t in transformations:
        opts = t.get("options", {})
        if t["id"] == "organize":
            columns = [c for c in columns if not opts.get("excludeByName", {}).get(c)]
            # as Grafana orders them: the fields indexByName places, by its index, then the others as they came
            index = opts.get("indexByName", {})
            columns.sort(key=lambda c: index.get(c, math.inf))
            rename = opts.get("renameByName", {})
            rows = [{rename.get(k, k): v for k, v in r.items()} for r in rows]
            columns = [rename.get(c, c) for c in columns]
        elif t["id"] == "sortBy":
            for s in reversed(opts.get("sort", [])):
                rows.sort(key=lambda r, f=s["field"]: (r.get(f) is None, r.get(f) or 0), reverse=s.get("desc", False))
    columns = [c for c in columns if c != "__name__"]
    return columns, rows


def column_props(panel: dict, column: str) -> dict:
    props = dict(panel.get("fieldConfig", {}).get("defaults", {}))
    for o in panel.get("fieldConfig", {}).get("overrides", []):
        if o["matcher"]["id"] == "byName" and o["matcher"]["options"] == column:
            props.update({p["id"]: p["value"] for p in o["properties"]})
    return props


def draw_table(ax, fig, panel: dict, data: dict) -> list[str]:
    style(ax, panel["title"])
    blank(ax)
    columns, rows = table_frame(panel, data)
    # columns that are empty in every row carry nothing (Kubernetes labels of a systemd host, and the reverse)
    columns = [c for c in columns if any(r.get(c) not in (None, "") for r in rows)]
    if not rows:
        ax.text(0.5, 0.5, "no data", color=MUTED, ha="center", transform=ax.transAxes)
        return []
    heads = [column_props(panel, c).get("displayName", c) for c in columns]
    cells = []
    for r in rows:
        line = []
        for c in columns:
            v = r.get(c)
            props = column_props(panel, c)
            line.append(fmt_value(v, props.get("unit"), props.get("decimals")) if isinstance(v, float)
                        else (v or ""))
        cells.append(line)
    # widths by content, in characters of the panel's width; long text (the explanation) wraps in its column
    bbox = ax.get_position()
    chars = int(bbox.width * fig.get_figwidth() * 72 / 4.3)  # 7-point text is ~4.3 points a character
    natural = [max([len(h)] + [len(c[i]) for c in cells]) + 2 for i, h in enumerate(heads)]
    widths = list(natural)
    while sum(widths) > chars and max(widths) > 12:
        widths[widths.index(max(widths))] -= 1
    x, xs = 0.01, []
    for w in widths:
        xs.append(x)
        x += 0.98 * w / max(sum(widths), chars)
    lines_per_row = [max(len(textwrap.wrap(str(c[i]), max(widths[i] - 1, 4)) or [""]) for i in range(len(heads)))
                     for c in cells]
    line_h = 7 * 1.35 / (bbox.height * fig.get_figheight() * 72)  # one 7-point line, in axes units
    y = 0.97
    for i, h in enumerate(heads):
        ax.text(xs[i], y, textwrap.shorten(h, max(widths[i] - 1, 4)), color=MUTED, fontsize=7, weight="bold",
                va="top", transform=ax.transAxes)
    y -= line_h * 1.4
    shown = []
    for row, n in zip(cells, lines_per_row):
        if y - n * line_h < 0.02:
            ax.text(0.01, y, f"… {len(cells) - len(shown)} more rows", color=MUTED, fontsize=7, va="top",
                    transform=ax.transAxes)
            break
        for i, c in enumerate(row):
            ax.text(xs[i], y, "\n".join(textwrap.wrap(str(c), max(widths[i] - 1, 4))), color=TEXT, fontsize=7,
                    va="top", transform=ax.transAxes, linespacing=1.2)
        ax.plot([0, 1], [y + line_h * 0.25] * 2, color=GRID, linewidth=0.5, transform=ax.transAxes)
        y -= n * line_h + line_h * 0.4
        shown.append(" | ".join(row))
    return shown


def draw_bargauge(ax, panel: dict, data: dict, unit, decimals) -> list[str]:
    style(ax, panel["title"])
    res = data["targets"][0]["result"] or []
    names = [legend(panel["targets"][0].get("legendFormat"), r["metric"]) for r in res]
    values = [float(r["value"][1]) for r in res]
    top = 1 if unit == "percentunit" else max(values + [1])
    blank(ax)
    ax.set_xlim(0, top)
    ax.set_ylim(len(values), 0)
    shown = []
    for i, (name, v) in enumerate(zip(names, values)):
        # the name on a line of its own above its bar, the value right of the bar's track: nothing overlaps
        ax.text(0.01 * top, i + 0.3, name, color=MUTED, fontsize=7, va="center")
        ax.barh(i + 0.65, v, color=COLORS[1], height=0.35)
        ax.barh(i + 0.65, top, color=GRID, height=0.35, zorder=0)
        text = fmt_value(v, unit, decimals)
        ax.text(0.99 * top, i + 0.3, text, color=TEXT, fontsize=9, weight="bold", ha="right", va="center")
        shown.append(f"{name}: {text}")
    if not values:
        ax.text(0.5, 0.5, "no data", color=MUTED, ha="center", transform=ax.transAxes)
    return shown


def draw_logs_placeholder(ax, panel: dict, data: dict) -> list[str]:
    """A Loki logs panel, not drawn: an explicit placeholder with its LogQL (Debian has no Loki to run it)."""
    style(ax, panel["title"])
    blank(ax)
    queries = (data.get("not_run") or {}).get("queries") or [t["expr"] for t in query_targets(panel, LOKI)]
    bbox = ax.get_position()
    chars = max(int(bbox.width * 16 * 72 / 4.3), 40)
    lines = ["NOT DRAWN: a Loki logs panel, and there is no Loki here (Debian has none), so its LogQL was not run.",
             "In Grafana it lists each kill's explanation from the agent's events file (stdout, via your log shipper):"]
    wrapped = [w for line in lines for w in textwrap.wrap(line, chars)]
    query = [w for q in queries for w in textwrap.wrap(q, chars)]
    y = 0.93
    for line in wrapped:
        ax.text(0.02, y, line, color=COLORS[1], fontsize=7, va="top", transform=ax.transAxes)
        y -= 0.085
    for line in query:
        ax.text(0.02, y, line, color=MUTED, fontsize=6.5, va="top", family="monospace", transform=ax.transAxes)
        y -= 0.075
    ax.text(0.02, max(y - 0.03, 0.02), "Without Loki: the Recent incidents rows link to each agent's /incidents.",
            color=TEXT, fontsize=7, va="top", transform=ax.transAxes)
    return ["placeholder: Loki logs panel not run (no Loki)"]


def render(results_path: Path, out: Path) -> list[dict]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.gridspec import GridSpec

    results = json.loads(results_path.read_text())
    dashboard = json.loads(DASHBOARD.read_text())
    by_id = {p["id"]: p for p in results["panels"]}
    missing = [p["title"] for p in dashboard["panels"] if p.get("id") not in by_id]
    if missing:
        raise SystemExit(f"render-dashboard: {results_path} has no results for {missing}: collect them again")
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"])
    caption_lines = textwrap.wrap(caption_text(results), 200)
    head = 0.95 + 0.15 * len(caption_lines)  # inches above the panels: the title, then the caption's lines
    height = rows * 0.34 + head + 0.3
    fig = plt.figure(figsize=(16, height), facecolor=BG)
    grid = GridSpec(rows, 24, figure=fig, left=0.035, right=0.99, top=1 - head / height, bottom=0.02,
                    hspace=2.2, wspace=0.7)
    start = results["start"]
    drawn = []
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        ax = fig.add_subplot(grid[g["y"]:g["y"] + g["h"], g["x"]:g["x"] + g["w"]])
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        unit, decimals = defaults.get("unit"), defaults.get("decimals")
        data = by_id[panel["id"]]
        kind = panel["type"]
        if kind == "stat":
            shown = draw_stat(ax, panel, data, unit, decimals)
        elif kind == "timeseries":
            shown = draw_timeseries(ax, fig, panel, data, unit, decimals, start)
        elif kind == "table":
            shown = draw_table(ax, fig, panel, data)
        elif kind == "bargauge":
            shown = draw_bargauge(ax, panel, data, unit, decimals)
        elif kind == "logs":
            shown = draw_logs_placeholder(ax, panel, data)
        else:
            raise SystemExit(f"render-dashboard: panel type {kind!r} ({panel['title']!r}) is not drawn")
        drawn.append({"id": panel["id"], "title": panel["title"], "type": kind, "shown": shown})
    fig.text(0.035, 1 - 0.3 / height, f"{dashboard.get('title', 'oomwatch')}: {LABEL}", color=TEXT, fontsize=14,
             weight="bold", va="top")
    fig.text(0.035, 1 - 0.75 / height, "\n".join(caption_lines), color=MUTED, fontsize=8, va="top")
    fig.savefig(out, dpi=80, facecolor=BG, metadata={PNG_KEY: json.dumps(drawn, separators=(",", ":"))})
    plt.close(fig)
    print(f"wrote {out} ({out.stat().st_size} bytes): {len(drawn)} panels from {results_path}")
    return drawn


def caption_text(results: dict) -> str:
    """What the picture is, said on its face: where the data came from and what it cannot show."""
    start = results["start"]
    when = datetime.fromtimestamp(start, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    nodes = "; ".join(f"node {n}: {v['fixture']}" for n, v in results["nodes"].items())
    return (
        f"scripts/render-dashboard, {when}, {int(results['end'] - start)} s: Prometheus "
        f"{results['prometheus'].get('version')} (Debian) scraping two real oomwatch agents every "
        f"{results['step']} s, each reading a kernel log captured on Linux 6.1 with its cgroup tree ({nodes}), "
        "its OOM reports fed after some scrapes at 0. Every panel of deploy/grafana/oomwatch-dashboard.json, "
        "its queries as Grafana sends them (x axes: seconds into the run; variables: " + ", ".join(f"{k}={v}" for k, v in
                                                                  sorted(results["variables"].items()))
        + "); counts as the dashboard queries them: each series' increase() over the range rounded, bars the "
        "counter's change per step. No "
        "detection latency: the agent measures it only for live /dev/kmsg records, not a saved log; no "
        "OOMKilled verdicts: no kube-state-metrics here; no working set (At risk): the captured cgroup trees have no "
        "memory.stat; no job names in Jobs hit by OOM kills: the agents run "
        "without a Kubernetes API here (its rows are the kills without a known job); no explanations panel: no "
        "Loki here (a placeholder shows its LogQL).")


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "collect":
        results = collect(Path(argv[1]), argv[2], REPO / ".venv" / "bin" / "oomwatch")
        print(f"collected {len(results['panels'])} panels' queries into {argv[1]}")
        return 0
    if len(argv) == 3 and argv[0] == "render":
        render(Path(argv[1]), Path(argv[2]))
        return 0
    raise SystemExit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
