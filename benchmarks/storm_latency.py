"""Where a storm's detection latency goes: the kernel's own pace against the agent's.

    .venv/bin/python benchmarks/storm_latency.py artifacts/e2e/storm-YYYYMMDD-HHMMSS [...]

An incident can be published only once it is complete: when the next report begins (the log's next
`invoked oom-killer`), or after the quiet window (1 s while a group listing may still be printing). For each
incident the agent published live (evidence kmsg) this takes, from the tier's artefacts (kmsg-all.raw,
run.json, agent/events.jsonl), the earliest time it could have been complete ("ideal": the next report's start
or the last record of its own report plus 1 s) and prints the median and tail of what the agent took beyond it
("residual"), with the kernel's gap between reports and the latency itself. A residual that grows through the
storm is the agent's cost; a latency that follows the gap is the kernel's pace.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime
from pathlib import Path

QUIET_LISTING = 1.0  # oomwatch.pipeline.Settings.quiet_listing


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def analyse(run: Path) -> dict:
    wall_minus_mono = json.loads((run / "run.json").read_text())["wall_minus_mono"]
    records: dict[int, tuple[float, str]] = {}
    for line in (run / "kmsg-all.raw").read_text(errors="replace").splitlines():
        m = re.match(r"(\d+),(\d+),(\d+),[^;]*;(.*)", line)
        if m:
            records[int(m[2])] = (int(m[3]) / 1e6, m[4])
    seqs = sorted(records)
    events = [json.loads(line) for line in (run / "agent" / "events.jsonl").read_text().splitlines() if line]
    live = sorted((e for e in events if e.get("evidence") == "kmsg" and e.get("latency_seconds") is not None
                   and e["latency_seconds"] < 5.0), key=lambda e: e["kernel_seq"])  # (not the restart's backlog)
    residual, gaps, latency = [], [], []
    for e in live:
        start = records[e["kernel_seq"]][0]
        published = datetime.fromisoformat(e["detected_at"].replace("Z", "+00:00")).timestamp() - wall_minus_mono
        last, following = start, None
        for seq in seqs[seqs.index(e["kernel_seq"]) + 1:]:
            at, text = records[seq]
            if "invoked oom-killer" in text:
                following = at
                break
            last = at
        ideal = min(following if following is not None else float("inf"), last + QUIET_LISTING)
        residual.append(published - ideal)
        gaps.append((following if following is not None else start) - start)
        latency.append(e["latency_seconds"])
    return {"incidents": len(live),
            "residual": {q: round(quantile(residual, q), 2) for q in (0.5, 0.9)} | {"max": round(max(residual), 2)},
            "gap_p50": round(quantile(gaps, 0.5), 2),
            "latency": {q: round(quantile(latency, q), 2) for q in (0.5, 0.99)},
            "residual_by_quarter": [round(quantile(part, 0.5), 2) for part in
                                    (residual[i * len(residual) // 4:(i + 1) * len(residual) // 4] for i in range(4))]}


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(arg, json.dumps(analyse(Path(arg))))
