"""The README's commands run as written after the README's own set-up (`scripts/oomwatch` or `scripts/test`,
which make .venv): each program they call is one of this checkout's scripts, a file of .venv, or a tool of the
host or the cluster, never `oomwatch` alone, which only `pip install .`, the image and the systemd unit put on
PATH (`journalctl -k -b -1 | oomwatch inspect --kmsg -` was "command not found" after the README's set-up)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# programs of the host, the cluster or the package manager, which the README's set-up does not provide
HOST_TOOLS = {"kubectl", "helm", "journalctl", "tr", "htpasswd", "curl", "pip", "git"}
# inline spans that are commands: a script of the checkout or .venv, or a program file given arguments
COMMAND_SPAN = re.compile(r"(sudo |[A-Z_]+=\S* )*(scripts/|\.venv/bin/|\.ci/|[\w/]+\.py \S)")
# a shell pipeline starts with a program's name (a LogQL or PromQL query with `|` starts with `{` or a metric)
PIPELINE_SPAN = re.compile(r"(sudo )?[a-z.][\w./-]* -")
VENV_MADE = {".venv/bin/python", ".venv/bin/pytest", ".venv/bin/oomwatch"}  # made by ensure_venv


def readme_commands(text: str) -> list[str]:
    """Command lines of ```sh blocks, and inline `code` spans that are pipelines or start with a path."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        commands += [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    commands += [span for span in re.findall(r"`([^`\n]+)`", text)
                 if PIPELINE_SPAN.match(span) and " | " in span or COMMAND_SPAN.match(span)]
    return commands


def programs(command: str) -> list[str]:
    out = []
    for stage in command.split("|"):
        words = shlex.split(stage.split("#", 1)[0])
        while words and ("=" in words[0] or words[0] == "sudo"):  # VAR=value, sudo: the program follows
            words = words[1:]
        if words:
            out.append(words[0])
    return out


def runnable(program: str) -> bool:
    if program in HOST_TOOLS or program in VENV_MADE:
        return True
    path = ROOT / program
    return "/" in program and path.is_file() and path.stat().st_mode & 0o111 != 0


def test_readme_commands_call_programs_the_setup_provides() -> None:
    commands = readme_commands(README.read_text())
    assert any("scripts/oomwatch inspect --kmsg -" in c for c in commands), "the journalctl pipeline is gone"
    bad = [(c, p) for c in commands for p in programs(c) if not runnable(p)]
    assert not bad, bad
    scripts = [shlex.split(c)[1] for c in commands if c.startswith(".venv/bin/python ")]
    assert scripts and all((ROOT / s).is_file() for s in scripts), scripts


def test_a_bare_oomwatch_is_refused() -> None:
    """The check above would have caught the README's old line."""
    assert programs("journalctl -k -b -1 | oomwatch inspect --kmsg -") == ["journalctl", "oomwatch"]
    assert not runnable("oomwatch")
    assert runnable("scripts/oomwatch") and runnable("scripts/test")
