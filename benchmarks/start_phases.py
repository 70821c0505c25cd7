"""`oomwatch agent` with its start's phases timed, for benchmarks/start.py: run as
`python benchmarks/start_phases.py AGENT-ARGS...` in the tree to measure, with $OOMWATCH_START_PHASES (a file:
one JSON line a phase) and $OOMWATCH_START_T0 (the parent's CLOCK_MONOTONIC just before the exec). The methods the
start calls are wrapped (timed, then called as they are); nothing else is imported before the agent's own
imports, so that they cost here what they cost the agent.
"""

import os
import sys
import time


def main() -> None:
    t0 = float(os.environ["OOMWATCH_START_T0"])
    out = open(os.environ["OOMWATCH_START_PHASES"], "a")

    def mark(phase: str, seconds: float = -1.0) -> None:
        seconds = time.monotonic() - t0 if seconds < 0 else seconds
        out.write('{"phase": "%s", "s": %.4f}\n' % (phase, seconds))
        out.flush()

    def timed(owner, name: str, phase: str, then=lambda *args: None) -> None:
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            result = original(*args, **kwargs)
            mark(phase)
            then(*args)
            return result

        setattr(owner, name, wrapper)

    def cpu_seconds(agent) -> None:
        """CPU seconds by then: the agent's main thread, its other threads, and the kernel-log reader process."""
        reader = getattr(agent.kernel_log.pump, "reader", None)
        main_thread = os.path.join("/proc/self/task", str(os.getpid()), "stat")
        for what, path in (("agent main thread", main_thread), ("agent, all threads", "/proc/self/stat"),
                           ("reader process", f"/proc/{getattr(reader, 'pid', None)}/stat")):
            try:
                with open(path) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            mark(f"CPU: {what}", (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))

    mark("interpreter")
    sys.path[0] = os.getcwd()  # the tree measured, not this script's directory
    sys.argv = ["oomwatch", *sys.argv[1:]]  # as the console script: the early pump starts at oomwatch.cli's import
    import oomwatch.early

    timed(oomwatch.early, "start_early_pump", "early pump started (its imports, the reader forked)")
    import oomwatch.cli

    mark("cli imported (early pump started)")
    import oomwatch.agent as agent_mod
    from oomwatch.pump import KernelLogPump

    mark("agent imported")

    timed(agent_mod.Agent, "__init__", "Agent built")
    timed(agent_mod.StateFileSink, "load", "state loaded")
    timed(agent_mod.KernelLogSource, "open", "kernel log opened")
    timed(agent_mod.HttpSink, "start", "port listening")
    timed(agent_mod.CgroupSource, "start", "cgroup tree emitted")
    timed(agent_mod, "_pipeline", "pipeline built")
    timed(agent_mod.Agent, "start", "start() done", then=cpu_seconds)
    adopt = KernelLogPump.adopt

    def adopted(self, emit, reopen):
        seen = []

        def first_read_to_the_end(event):
            if not seen and getattr(event, "drained_at", None) is not None:
                seen.append(event)
                mark("backlog read (the pump's first batch read to the log's end)")
            emit(event)

        adopt(self, first_read_to_the_end, reopen)

    KernelLogPump.adopt = adopted
    oomwatch.cli.main()


if __name__ == "__main__":
    main()
