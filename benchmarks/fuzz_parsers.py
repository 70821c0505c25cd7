"""A long fuzz session of the kernel-log parsers and of `inspect` on a fuzzed saved log.

    .venv/bin/python benchmarks/fuzz_parsers.py 600     # seconds (default 600)

Runs the properties of tests/test_fuzz_parsers.py (and the whole saved-log path of `inspect`: reader,
correlator, explanation, rendering) in rounds with fresh seeds until the time is up, and prints every
distinct failure found (a shrunk example each) and how many inputs were tried.
"""

from __future__ import annotations

import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from oomwatch.config import Config  # noqa: E402
from oomwatch.inspect import build_report, render_text  # noqa: E402
from tests.test_fuzz_parsers import (  # noqa: E402
    check_kmsg_record,
    check_oom_line,
    check_text_log,
    log_bytes,
    oom_text,
)

EXAMPLES = 500
tried = 0


def check_inspect(data: bytes) -> None:
    with tempfile.NamedTemporaryFile(suffix=".log") as f:
        f.write(data)
        f.flush()
        report = build_report(Config(kmsg=f.name, boot_time=0.0), node_view=False, clock=lambda: 0.0)
        render_text(report)


PROPERTIES = {
    "parse_oom_line": (oom_text, check_oom_line),
    "parse_kmsg_record": (st.binary(max_size=200), check_kmsg_record),
    "parse_text_log": (log_bytes, check_text_log),
    "inspect saved log": (log_bytes, check_inspect),
}


def run(name: str, strategy, check, round_seed: int) -> None:
    def counted(value) -> None:
        global tried
        tried += 1
        check(value)

    test = settings(max_examples=EXAMPLES, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))(given(strategy)(counted))
    seed(round_seed)(test)()


def main() -> int:
    duration = float(sys.argv[1]) if len(sys.argv) > 1 else 600.0
    start = time.monotonic()
    failures: dict[str, str] = {}
    rounds = 0
    while time.monotonic() - start < duration:
        for name, (strategy, check) in PROPERTIES.items():
            try:
                run(name, strategy, check, rounds * 7919 + hash(name) % 1000)
            except Exception as exc:  # noqa: BLE001 - every failure is what we are looking for
                where = traceback.extract_tb(exc.__traceback__)[-1]
                key = f"{name}: {type(exc).__name__} at {Path(where.filename).name}:{where.lineno}"
                if key not in failures:
                    failures[key] = "".join(traceback.format_exception_only(type(exc), exc)).strip()[:500]
                    print(f"FAILURE {key}\n  {failures[key]}", flush=True)
        rounds += 1
    elapsed = time.monotonic() - start
    print(f"fuzz: {elapsed:.0f} s, {rounds} rounds, {tried} inputs tried, {len(failures)} distinct failures")
    for key in failures:
        print(f"  {key}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
