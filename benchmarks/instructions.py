"""Instructions (valgrind callgrind, Ir) per round of the storm capture in each stage of the kernel-log
pipeline, as benchmarks/run.py's `pipeline` runs them: a figure that does not move with the machine's load
(run.py's records/s move by half from one minute to the next on a shared machine).

    .venv/bin/python benchmarks/instructions.py                      # this tree
    .venv/bin/python benchmarks/instructions.py --tree /tmp/before   # another checkout (git worktree), same script

For each stage, valgrind runs this script at 1 and at 1 + ROUNDS rounds of fixtures/kmsg/linux-6.1-storm-
ratelimited.kmsg (4,658 records, 100 full reports, 150 incidents a round); per round = the difference / ROUNDS,
so start-up, imports (those made at the first incident too, compiled from source where no .pyc is current) and
first-time caches cancel out. `reader`: LiveKmsg(prefilter=True).read_available(limit=4096) on a
SOCK_SEQPACKET pair and pickle.dumps of each batch (the sends that stand in for the kernel's printk are counted
too, the same in every tree); `agent`: pickle.loads of each batch and Pipeline.step (the reader's batches are made
first and subtracted: agent = (reader and agent) - reader). The oomwatch imported is the tree's; the stages are
this script's, so two trees are measured the same way.
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve()


def _reader_frames(rounds: int) -> list[bytes]:
    from run import _storm_rounds  # benchmarks/run.py of the tree under test

    from oomwatch.sources.kmsg import LiveKmsg

    records = _storm_rounds(rounds)
    kernel_end, reader_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    kernel_end.setblocking(False)
    reader_end.setblocking(False)
    reader = LiveKmsg("bench", prefilter=True)
    reader.fd = reader_end.fileno()
    frames, at = [], 0
    while at < len(records):
        while at < len(records):
            try:
                kernel_end.send(records[at])
            except BlockingIOError:
                break
            at += 1
        frames.append(pickle.dumps(list(reader.read_available(limit=4096)), protocol=pickle.HIGHEST_PROTOCOL))
    return frames


def _agent(frames: list[bytes]) -> int:
    from oomwatch.events import KernelLog, KernelLogEnded
    from oomwatch.pipeline import Pipeline, Settings
    from oomwatch.store import Store
    from oomwatch.workloads import WorkloadResolver

    settings = Settings(boot_id="bench", boot_time=0.0, kmsg_source="kmsg", counting=True)
    if "page_size" in Settings.__dataclass_fields__:  # as the live agent runs (oomwatch/node.py)
        settings = Settings(boot_id="bench", boot_time=0.0, kmsg_source="kmsg", counting=True,
                            page_size=os.sysconf("SC_PAGE_SIZE"))
    pipeline = Pipeline(settings, Store(), WorkloadResolver(), now=0.0)
    incidents = 0
    for n, frame in enumerate(frames):
        incidents += len(pipeline.step(KernelLog(pickle.loads(frame), drained_at=None), float(n)).publish)
    return incidents + len(pipeline.step(KernelLogEnded(saved=True), float(len(frames))).publish)


def _stage(stage: str, rounds: int) -> None:
    """Run one stage (this process is the one valgrind counts); says where its oomwatch came from."""
    import oomwatch

    frames = _reader_frames(rounds)
    if stage == "agent":
        incidents = _agent(frames)
        assert incidents == 150 * rounds, incidents
    print(Path(oomwatch.__file__).resolve().parent.parent)


def _instructions(tree: Path, stage: str, rounds: int) -> int:
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{tree / 'benchmarks'}")
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                           str(HERE), "--run", stage, str(rounds)], env=env, cwd=tree, capture_output=True,
                          text=True, check=True)
    assert Path(done.stdout.strip()) == tree, (done.stdout, tree)  # the tree's oomwatch, not an installed one
    return int(re.search(r"Collected : (\d+)", done.stderr).group(1))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=HERE.parent.parent, help="the checkout to measure")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--run", nargs=2, metavar=("STAGE", "ROUNDS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        _stage(args.run[0], int(args.run[1]))
        return 0
    tree = args.tree.resolve()
    reader = (_instructions(tree, "reader", 1 + args.rounds) - _instructions(tree, "reader", 1)) // args.rounds
    both = (_instructions(tree, "agent", 1 + args.rounds) - _instructions(tree, "agent", 1)) // args.rounds
    print(f"{tree}: per round of the storm capture: reader {reader:,} instructions, agent {both - reader:,}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
