"""CPU per incident of each piece of work between a kill's records and its publication, and after it, on the
storm capture replayed through the real Pipeline and applied as the agent applies it (issue 30, item 3: what
on the path from kill to publish could wait).

    .venv/bin/python benchmarks/stage_cost.py                      # 15 rounds + 15 untimed (about 30 s)
    .venv/bin/python benchmarks/stage_cost.py --rounds 5 --json benchmarks/runs/X.json

Input: fixtures/kmsg/linux-6.1-storm-ratelimited.kmsg (4,658 records, 150 group kills in 30 cgroups), fed much
as tests/test_pipeline_counts.py feeds it (without its lost round): a fixture tree of 30 cgroups with
memory.oom.group=1 read by the real cgroup source (tests/replay.RecordedTree); the records as a live reader
woken every 10 ms of the capture's kernel time reads them (LiveKmsg, pre-filtering, on a socket pair:
tests/replay.LiveReader), each read stepped as one KernelLog drained at the end of its 10 ms; before a read,
each group killed in it has its memory.events.local moved (oom_kill +3: the victim, its reprint and the
member; oom_group_kill +1) and stepped as the source's CgroupChanged, at the time of the read's first record
(the kernel counts a kill before it prints it). A Tick is stepped at every deadline the pipeline names before
the next event, and at the end until nothing is due. (Reads of 32 records each, stepped at their last record's
time with the Ticks in between, let quiet windows close inside group listings and split 5 of the 150 kills in
two.) Settings as tests/replay.live_settings (live /dev/kmsg, counting, a state directory, no proc connector),
this host's page size.

Each Effects is applied as oomwatch/agent.py's `_apply` applies it, in its order: fx.logs to the agent's
logger (a file), each incident to every sink (the agent's own `publish_to`) of an agent with a state directory
and an events file (LogSink on a logger writing a file with the CLI's formatter, EventsFileSink holding its
lines until the state is saved), then a save: StateFileSink.flush (temp file, fsync, rename) and each sink's
flush (the events file writes its held lines), the outcome stepped back as StateSaved; a wake of the kernel
log answered as the live reader answers it on a log with nothing new (KernelLog([], drained_at=now)); and the
view a scrape reads, Pipeline.view(), taken after every step that changed something (the agent's
`_Latest.offer` when the queue is empty, as it is here). No pod Events, journal or Slurm sink: the storm's
cgroups are not pods or units.

Timed (time.process_time_ns for CPU, time.perf_counter_ns for wall): each stage instance's step and advance,
the counts stage's save_due (builds the state to save), Pipeline.step's own dispatch, inside the kernel-log
stage the correlator's feed and flush (parse and assembly), and the functions its incident building calls for
the holders (oomwatch.parse.memstat part_report / first_report: the report's stats block and task table;
oomwatch.holders.held_memory / advice_for) and the explanation (oomwatch.explain.explain, through the posture
stage, whoever calls it), and Incident.to_json (the store's copy of each incident, the events file's line) --
all wrapped from here, oomwatch/ unchanged; each figure is exclusive of the pieces timed inside it (a timed
call costs a few µs of clock reads, counted in its caller's figure; the rounds without the wrappers,
interleaved, give the whole round's CPU beside it). Per round: a new tree, pipeline, store, sinks and state
directory in a new temporary directory; figures per incident published, the median over the rounds (the first
round, which imports and warms caches, is not counted).

Where each piece runs, relative to the moment an incident is put into fx.publish (CountsStage._publish: the
store has counted it): `before` = in a pipeline step before that step's last append to fx.publish, or in a
step that published nothing while incidents were still to come (work the loop does before it can publish the
next one); `in step after` = in the publishing step after its last append (the rest of the stages' advance,
the state built by save_due): the store has counted the incident but the sinks get it only once the step
returns; `after` = applied by the agent after the step (sinks, the state save, the view; their nested steps
such as StateSaved), and whatever runs after the round's last publication.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Optional

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))

STORM = REPO / "fixtures" / "kmsg" / "linux-6.1-storm-ratelimited.kmsg"
BOOT = 1_000.0
INCIDENTS_PER_ROUND = 150
TASKS_IN = re.compile(rb";Tasks in (/storm/c\d\d) are going")
SPIN_STEP = 0.001
READ_EVERY = 0.01  # the live reader reads what was printed in each 10 ms, at its end
STAGES = ("posture", "kernellog", "deaths", "identity", "counts", "agent")

cpu_ns, wall_ns = time.process_time_ns, time.perf_counter_ns


# --- the timeline: every timed piece, exclusive of the pieces timed inside it -------------------------------


class Timeline:
    def __init__(self) -> None:
        # (piece, cpu ns, wall ns, step id or None (applied by the agent), incidents put into fx.publish so
        # far when the piece began)
        self.segments: list[tuple[str, int, int, Optional[int], int]] = []
        self._stack: list[list] = []  # [piece, child cpu, child wall]
        self.published = 0  # incidents put into fx.publish so far (all steps)
        self.step_id: Optional[int] = None  # the pipeline step running now (None: the agent applying effects)
        self.steps: dict[int, tuple[int, int]] = {}  # step id → (published before it, published after it)
        self.calls = 0

    def top_stage(self) -> str:
        """The stage (or "agent") whose call the running piece is inside."""
        for frame in reversed(self._stack):
            prefix = frame[0].split(":")[0]
            if prefix in STAGES:
                return prefix
        return "pipeline"

    def timed(self, name: Callable[..., str] | str, fn: Callable, fx_arg: Optional[int] = None) -> Callable:
        """`fn` timed as the piece `name` (a callable: named at each call from its arguments, or from what
        runs around it); `fx_arg`: the position of its Effects argument, whose fx.publish it watches."""
        timeline = self

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            piece = name(*args) if callable(name) else name
            frame = [piece, 0, 0]
            timeline._stack.append(frame)
            started_published = timeline.published
            fx = args[fx_arg] if fx_arg is not None else None
            before = len(fx.publish) if fx is not None else 0
            timeline.calls += 1
            c0, w0 = cpu_ns(), wall_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                c, w = cpu_ns() - c0, wall_ns() - w0
                timeline._stack.pop()
                if fx is not None:
                    timeline.published += len(fx.publish) - before
                timeline.segments.append((piece, c - frame[1], w - frame[2], timeline.step_id,
                                          started_published))
                if timeline._stack:
                    timeline._stack[-1][1] += c
                    timeline._stack[-1][2] += w

        return wrapped


def instrument(timeline: Timeline, pipeline: Any) -> None:
    """Wrap the stage instances' step and advance, the save, the correlator's feed and flush."""
    stages = {"posture": pipeline._posture, "kernellog": pipeline._log, "deaths": pipeline.deaths,
              "identity": pipeline._identity, "counts": pipeline._counts}
    for label, stage in stages.items():
        stage.step = timeline.timed(lambda event, *_, label=label: f"{label}: step({type(event).__name__})",
                                    stage.step, fx_arg=2)
        if hasattr(stage, "advance"):
            stage.advance = timeline.timed(f"{label}: advance", stage.advance, fx_arg=1)
    counts = pipeline._counts
    counts.save_due = timeline.timed("counts: save_due (the state to save built)", counts.save_due, fx_arg=1)
    correlator = pipeline._log.correlator
    for method in ("feed", "flush", "release_finished"):
        setattr(correlator, method, timeline.timed("kernellog: correlator parse/assembly",
                                                   getattr(correlator, method)))


def instrument_modules(timeline: Timeline) -> Callable[[], None]:
    """The holders, the explanation and Incident.to_json, wherever they are called from (module globals and a
    method the callers look up at each call); returns what undoes it."""
    import oomwatch.correlator as correlator_module
    import oomwatch.model as model_module
    import oomwatch.stages.posture as posture_module

    patched = [(correlator_module, "part_report", "holders: report parse (part_report)"),
               (correlator_module, "first_report", "holders: report parse (first_report)"),
               (correlator_module, "held_memory", "holders: held_memory"),
               (correlator_module, "advice_for", "holders: held_memory"),
               (posture_module, "explain", "explanation"),
               (model_module.Incident, "to_json", "Incident.to_json")]
    originals = []
    for module, attr, label in patched:
        original = getattr(module, attr)
        originals.append((module, attr, original))
        setattr(module, attr, timeline.timed(lambda *_, label=label: f"{timeline.top_stage()}: {label}",
                                             original))

    def undo() -> None:
        for module, attr, original in originals:
            setattr(module, attr, original)

    return undo


# --- one round: the storm through a pipeline, applied as the agent applies it -------------------------------


def _raw_records(path: Path) -> list[bytes]:
    from run import _raw_records as raw  # benchmarks/run.py's (sys.path[0] is this directory)

    return raw(path)


def usec_of(record: bytes) -> int:
    return int(record.split(b",", 3)[2])


def reads(records: list[bytes]) -> list[tuple[float, list[bytes]]]:
    """The records as a live reader woken every READ_EVERY seconds reads them: (when, the records printed in
    the READ_EVERY before)."""
    out: list[tuple[float, list[bytes]]] = []
    slot = int(READ_EVERY * 1e6)
    for record in records:
        at = BOOT + (usec_of(record) // slot + 1) * READ_EVERY
        if out and out[-1][0] == at:
            out[-1][1].append(record)
        else:
            out.append((at, [record]))
    return out


def _publish_to(sinks: list, incident: Any) -> None:
    """oomwatch/agent.py's loop over the sinks, for one incident (a sink's failure is logged, the others go on)."""
    from oomwatch.agent import publish_to

    publish_to(sinks, lambda sink: sink.publish(incident))


class Round:
    made = 0
    def __init__(self, tmp: Path, timeline: Optional[Timeline]) -> None:
        from oomwatch.cli import log_handler
        from oomwatch.pipeline import Pipeline
        from oomwatch.sinks import EventsFileSink, LogSink, StateFileSink
        from oomwatch.sinks.events import EventsFile
        from oomwatch.statefile import StateFile
        from oomwatch.store import Store
        from oomwatch.workloads import WorkloadResolver
        from oomwatch.workloads.runtime import RuntimeNames
        from tests.replay import RecordedTree, live_settings
        from tests.test_pipeline_counts import storm_tree  # (the storm capture's 30 group cgroups)

        self.tmp, self.timeline = tmp, timeline
        self.tree = storm_tree(tmp)
        self.recorded = RecordedTree(self.tree)
        self.store = Store()
        settings = live_settings(boot_time=BOOT, page_size=os.sysconf("SC_PAGE_SIZE"))
        resolver = WorkloadResolver(RuntimeNames(read_files=False))
        self.pipeline = Pipeline(settings, self.store, resolver, now=BOOT)
        self.now = BOOT
        Round.made += 1
        self.log = logging.getLogger(f"oomwatch.agent.bench{Round.made}")
        self.log.propagate = False
        self.log.setLevel(logging.INFO)
        self._log_stream = open(tmp / "agent.log", "w")
        self.log.addHandler(log_handler(self._log_stream))
        (tmp / "state").mkdir()
        self.state = StateFileSink(StateFile(str(tmp / "state")))
        self.state.load(self.store, "replay-boot")
        events = EventsFile(str(tmp / "events.jsonl"), hold=True)
        self.sinks = [LogSink(self.log), EventsFileSink(events)]
        for sink in self.sinks:
            sink.start(self.store.snapshot().incidents)
        self.publish_to = _publish_to
        self.published = 0
        self.incidents: list = []
        self.saves = self.steps = self.views = 0
        self.view = self.pipeline.view
        self._ticked_at: Optional[float] = None
        if timeline is not None:
            instrument(timeline, self.pipeline)
            for sink in [self.state, *self.sinks]:
                label = type(sink).__name__
                for method in ("publish", "flush"):
                    setattr(sink, method, timeline.timed(f"agent: {label}.{method}", getattr(sink, method)))
            self.view = timeline.timed("agent: Pipeline.view (the scrape's view)", self.pipeline.view)
            self.publish_to = timeline.timed("agent: publish_to (sinks' loop)", _publish_to)
            self._pipeline_step = timeline.timed("pipeline: Pipeline.step dispatch", self.pipeline.step)

    def close(self) -> None:
        for sink in [*self.sinks, self.state]:
            sink.close()
        for handler in list(self.log.handlers):
            self.log.removeHandler(handler)
        self.recorded.close()
        self._log_stream.close()

    # the agent's loop and its _apply (oomwatch/agent.py), minus threads and queue

    def step(self, event: Any, now: float, applying: bool = False) -> Any:
        self.now = now
        self.steps += 1
        timeline = self.timeline
        if timeline is None:
            fx = self.pipeline.step(event, now)
        else:
            outer = timeline.step_id
            step_id = len(timeline.steps)
            timeline.step_id = None if applying else step_id
            before = timeline.published
            fx = self._pipeline_step(event, now)
            timeline.published = before + len(fx.publish)  # (the stages' wrappers counted each append once)
            timeline.steps[step_id] = (before, timeline.published)
            timeline.step_id = outer
        self.published += len(fx.publish)
        self.incidents += fx.publish
        self.apply(fx)
        return fx

    def apply(self, fx: Any) -> None:
        from oomwatch.events import KernelLog, StateSaved

        timeline = self.timeline
        saved_step = timeline.step_id if timeline else None
        if timeline:
            timeline.step_id = None
        for level, message in fx.logs:
            self.log.log(level, "%s", message)
        for incident in fx.publish:
            self.publish_to(self.sinks, incident)
        assert not fx.deaths and not fx.read_logs and not fx.read_marks and not fx.read_ray_logs, fx
        if fx.save is not None:
            self.saves += 1
            for sink in [self.state, *self.sinks]:
                sink.flush(fx.save)
            self.step(StateSaved(self.state.error), self.now, applying=True)
        for path in fx.read_names:
            for event in self.recorded.read_names(path):
                self.step(event, self.now, applying=True)
        if fx.changed:  # _Latest.offer with the queue empty: the view at once
            self.views += 1
            self.view()
        if timeline:
            timeline.step_id = saved_step
        if fx.wake_kernel_log:  # the live reader's answer, on a log with nothing new: a read to its end now
            self.step(KernelLog([], drained_at=self.now), self.now)

    def at(self, when: float) -> None:
        """Ticks at every deadline before `when` (the agent's loop times out waiting for an event)."""
        from oomwatch.events import Tick

        while True:
            deadline = self.pipeline.next_deadline()
            if deadline is None or deadline > when:
                return
            at = max(deadline, self.now)
            if self._ticked_at is not None and at <= self._ticked_at:
                at = self._ticked_at + SPIN_STEP
            self._ticked_at = at
            self.step(Tick(), at)

    def event(self, event: Any, now: float) -> None:
        self.at(now)
        self._ticked_at = None
        self.step(event, max(now, self.now))

    def settle(self) -> None:
        self.at(self.now + 7 * 86400.0)

    def run(self, records: list[bytes]) -> None:
        from oomwatch.events import KernelLog
        from tests.replay import LiveReader

        for event in self.recorded.start():
            self.event(event, BOOT)
        kills: dict[str, int] = {}
        reader = LiveReader()
        try:
            for read_at, chunk in reads(records):
                for match in filter(None, (TASKS_IN.search(r) for r in chunk)):
                    cgroup = match.group(1).decode()
                    kills[cgroup] = kills.get(cgroup, 0) + 1
                    k = kills[cgroup]
                    (self.tree / cgroup.lstrip("/") / "memory.events.local").write_text(
                        f"low 0\nhigh 0\nmax {k}\noom {k}\noom_kill {3 * k}\noom_group_kill {k}\n")
                    for event in self.recorded.changed(cgroup):
                        self.event(event, usec_of(chunk[0]) / 1e6 + BOOT)
                items = reader.read(chunk)
                self.event(KernelLog(items, drained_at=read_at), read_at)
        finally:
            reader.close()
        self.settle()


# --- rounds and figures -------------------------------------------------------------------------------------


def classify(timeline: Timeline, total: int) -> dict[tuple[str, str], tuple[int, int]]:
    """(piece, where) → (cpu ns, wall ns) over the round."""
    out: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for piece, c, w, step_id, started in timeline.segments:
        if step_id is None:
            where = "after"
        else:
            first, last = timeline.steps[step_id]
            if started < last:
                where = "before"
            elif last > first:
                where = "in step after"
            else:
                where = "before" if last < total else "after"
        cell = out[(piece, where)]
        cell[0] += c
        cell[1] += w
    return {k: (v[0], v[1]) for k, v in out.items()}


def one_round(records: list[bytes], timed: bool) -> tuple[int, int, int, Optional[dict], int]:
    """(incidents, CPU ns, wall ns of the whole round, the classified pieces, timed calls)."""
    timeline = Timeline() if timed else None
    undo = instrument_modules(timeline) if timeline else (lambda: None)
    tmp = Path(tempfile.mkdtemp(prefix="oomwatch-stage-cost-"))
    try:
        bench = Round(tmp, timeline)
        c0, w0 = cpu_ns(), wall_ns()
        bench.run(records)
        c, w = cpu_ns() - c0, wall_ns() - w0
        bench.close()
        assert bench.published == INCIDENTS_PER_ROUND, (bench.published, [
            (i.evidence, i.group_cgroup, i.time) for i in bench.incidents if i.evidence != "kmsg"])
        lines = (tmp / "events.jsonl").read_text().splitlines()
        assert len(lines) == INCIDENTS_PER_ROUND, len(lines)
        pieces = classify(timeline, bench.published) if timeline else None
        one_round.counts = {"steps": bench.steps, "saves": bench.saves, "views": bench.views,
                            "state_bytes": (tmp / "state" / "state.json").stat().st_size
                            if (tmp / "state" / "state.json").exists() else None,
                            "reads": len(reads(records))}
        return bench.published, c, w, pieces, timeline.calls if timeline else 0
    finally:
        undo()
        shutil.rmtree(tmp, ignore_errors=True)


def timer_cost(calls: int = 20000) -> float:
    """CPU ns one timed call costs beyond the call itself (the wrapper's clocks and bookkeeping)."""
    timeline = Timeline()
    plain = lambda: None  # noqa: E731
    wrapped = timeline.timed("x", plain)
    best = []
    for _ in range(5):
        c0 = cpu_ns()
        for _ in range(calls):
            plain()
        bare = cpu_ns() - c0
        c0 = cpu_ns()
        for _ in range(calls):
            wrapped()
        best.append((cpu_ns() - c0 - bare) / calls)
        timeline.segments.clear()
    return statistics.median(best)


def commit() -> str:
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                                  check=True).stdout.strip()

        head, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "--", "oomwatch")
        return head + (" (oomwatch/ modified in the working tree)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


WHERE_ORDER = ("before", "in step after", "after")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds (after one warm-up round)")
    parser.add_argument("--plain-rounds", type=int, default=15,
                        help="untimed rounds, one after each timed round, for the wrappers' overhead")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    records = _raw_records(STORM)
    one_round(records, timed=True)  # warm-up: imports, caches
    per_round: list[dict] = []
    totals, calls = [], []
    plain = []
    for n_round in range(args.rounds):
        incidents, c, w, pieces, n = one_round(records, timed=True)
        per_round.append({k: (v[0] / incidents, v[1] / incidents) for k, v in pieces.items()})
        totals.append(c / incidents)
        calls.append(n / incidents)
        if n_round < args.plain_rounds:  # (interleaved: the same load as the timed rounds beside them)
            plain.append(one_round(records, timed=False)[1] / INCIDENTS_PER_ROUND)
    overhead = timer_cost()

    pieces = sorted({p for r in per_round for p, _ in r})
    rows = []
    for piece in pieces:
        cpu_by_where = {where: statistics.median(r.get((piece, where), (0, 0))[0] for r in per_round)
                        for where in WHERE_ORDER}
        wall_by_where = {where: statistics.median(r.get((piece, where), (0, 0))[1] for r in per_round)
                         for where in WHERE_ORDER}
        cpu = statistics.median(sum(r.get((piece, w), (0, 0))[0] for w in WHERE_ORDER) for r in per_round)
        wall = statistics.median(sum(r.get((piece, w), (0, 0))[1] for w in WHERE_ORDER) for r in per_round)
        rows.append({"piece": piece, "cpu_us": cpu / 1e3, "wall_us": wall / 1e3,
                     "cpu_us_by_where": {k: v / 1e3 for k, v in cpu_by_where.items()},
                     "wall_us_by_where": {k: v / 1e3 for k, v in wall_by_where.items()}})
    rows.sort(key=lambda r: (-r["cpu_us"]))
    all_cpu = sum(r["cpu_us"] for r in rows)

    def where_of(row: dict) -> str:
        parts = {k: v for k, v in row["cpu_us_by_where"].items() if v > 0}
        total = sum(parts.values()) or 1
        if len(parts) <= 1:
            return next(iter(parts), "-")
        return " / ".join(f"{k} {100 * v / total:.0f}%" for k, v in parts.items())

    print(f"oomwatch stage cost per incident: {STORM.name}, {INCIDENTS_PER_ROUND} incidents a round, "
          f"{args.rounds} timed rounds (+1 warm-up), median per piece")
    print(f"python {platform.python_version()} ({sys.executable}), commit {commit()}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    counts = one_round.counts
    print(f"a round: {counts['reads']} KernelLog reads, {counts['steps']} pipeline steps, "
          f"{counts['saves']} state saves, {counts['views']} views; the state file at the end "
          f"{counts['state_bytes']} bytes")
    print()
    print(f"{'piece':62} {'CPU µs/inc':>10} {'share':>6} {'wall µs':>9}  where (vs. the fx.publish append)")
    for row in rows:
        print(f"{row['piece']:62} {row['cpu_us']:10.1f} {100 * row['cpu_us'] / all_cpu:5.1f}% "
              f"{row['wall_us']:9.1f}  {where_of(row)}")
    by_where = {where: sum(r["cpu_us_by_where"][where] for r in rows) for where in WHERE_ORDER}
    print(f"{'sum of the pieces':62} {all_cpu:10.1f} {100.0:5.1f}%")
    print("  by place: " + ", ".join(f"{k} {v:.1f} µs ({100 * v / all_cpu:.0f}%)"
                                     for k, v in by_where.items()))
    groups: dict[str, float] = defaultdict(float)
    for row in rows:
        p = row["piece"]
        if p.startswith("kernellog:"):
            kind = ("holders" if "holders" in p else "explanation" if "explanation" in p else
                    "correlator parse/assembly" if "correlator" in p else "the stage's own step/advance")
            groups[kind] += row["cpu_us"]
    if groups:
        kl = sum(groups.values())
        ordered = sorted(groups.items(), key=lambda x: -x[1])
        print(f"  kernel-log stage, {kl:.1f} µs: " + ", ".join(f"{k} {v:.1f} µs ({100 * v / kl:.0f}%)"
                                                              for k, v in ordered))
    print(f"  whole round, timed: {statistics.median(totals) / 1e3:.1f} µs CPU/incident (median); untimed: "
          f"{statistics.median(plain) / 1e3:.1f} µs ({args.plain_rounds} rounds; includes the replay's own "
          f"reads and counter writes, not timed above); {statistics.median(calls):.0f} timed calls/incident "
          f"at "
          f"~{overhead:.0f} ns of wrapper each")
    if args.json:
        args.json.write_text(json.dumps({
            "capture": STORM.name, "incidents_per_round": INCIDENTS_PER_ROUND, "rounds": args.rounds,
            "python": platform.python_version(), "commit": commit(), "load": os.getloadavg(),
            "pieces": rows, "by_where_cpu_us": by_where, "kernellog_split_cpu_us": groups,
            "round_cpu_us_per_incident_timed": statistics.median(totals) / 1e3,
            "round_cpu_us_per_incident_plain": statistics.median(plain) / 1e3,
            "timed_calls_per_incident": statistics.median(calls), "round": one_round.counts,
            "wrapper_ns": overhead}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
