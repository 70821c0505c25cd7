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
run.py's `reader_frames` and `agent_steps` from beside this script, so two trees are measured the same way.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve()


def _stage(stage: str, rounds: int) -> None:
    """Run one stage (this process is the one valgrind counts); says where its oomwatch came from. The stages
    are this directory's run.py's (sys.path[0]), whichever tree's oomwatch they drive."""
    import oomwatch
    from run import _storm_rounds, agent_steps, reader_frames

    from oomwatch.pipeline import Settings

    frames, _ = reader_frames(_storm_rounds(rounds))
    if stage == "agent":
        # as the live agent runs (oomwatch/node.py), where the tree knows a page size
        page = {"page_size": os.sysconf("SC_PAGE_SIZE")} if "page_size" in Settings.__dataclass_fields__ else {}
        incidents, _ = agent_steps(frames, **page)
        assert incidents == 150 * rounds, incidents
    print(Path(oomwatch.__file__).resolve().parent.parent)


def _instructions(tree: Path, stage: str, rounds: int) -> int:
    env = dict(os.environ, PYTHONPATH=str(tree))
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
