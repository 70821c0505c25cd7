"""Dockerfile: no Docker engine here, so parse it and check what it relies on, and build the wheel
the way its builder stage does, from exactly the files .dockerignore lets into the context."""

from __future__ import annotations

import fnmatch
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from .conftest import ROOT

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for ins in instructions():
        if ins[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


def test_two_stages_on_slim_python() -> None:
    build, runtime = stages()
    assert build[0][1].startswith("python:3.11-slim") and build[0][1].endswith("AS build")
    assert runtime[0][1].startswith("python:3.11-slim")


def test_builder_builds_the_wheel() -> None:
    build, _ = stages()
    runs = " ".join(args for word, args in build if word == "RUN")
    assert "pip wheel" in runs and "/wheels" in runs


def test_runtime_installs_the_wheel_only() -> None:
    _, runtime = stages()
    runs = " ".join(args for word, args in runtime if word == "RUN")
    assert "pip install --no-index --find-links=/wheels oomwatch" in runs
    assert not any(word == "COPY" and "--from" not in args for word, args in runtime), "no source in the runtime image"


def test_entrypoint_is_the_console_script() -> None:
    _, runtime = stages()
    entry = [json.loads(args) for word, args in runtime if word == "ENTRYPOINT"]
    cmd = [json.loads(args) for word, args in runtime if word == "CMD"]
    assert entry == [["oomwatch"]] and cmd == [["agent"]]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "oomwatch" in scripts, "ENTRYPOINT oomwatch must be a console script of the package"


def test_user_is_numeric_and_not_root() -> None:
    _, runtime = stages()
    users = [args for word, args in runtime if word == "USER"]
    assert users, "USER missing"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric so Kubernetes' runAsNonRoot can check it


def ignored(rel: str, patterns: list[str]) -> bool:
    result = False
    for pat in patterns:
        negate = pat.startswith("!")
        pat = pat.lstrip("!").rstrip("/")
        parts = rel.split("/")
        hit = any(
            fnmatch.fnmatch("/".join(parts[: i + 1]), pat) or fnmatch.fnmatch("/".join(parts[: i + 1]), pat.replace("**/", ""))
            for i in range(len(parts))
        ) or (pat.startswith("**/") and any(fnmatch.fnmatch(p, pat[3:]) for p in parts))
        if hit:
            result = not negate
    return result


def context_files() -> list[str]:
    patterns = [
        line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()
    return [f for f in files if not ignored(f, patterns) and (ROOT / f).exists()]


def test_copy_sources_are_in_the_build_context() -> None:
    ctx = context_files()
    build, _ = stages()
    for word, args in build:
        if word == "COPY" and "--from" not in args:
            *sources, _dest = args.split()
            for src in sources:
                assert src in ctx or any(f.startswith(src.rstrip("/") + "/") for f in ctx), (
                    f"COPY {src}: not in the build context (missing, or excluded by .dockerignore)"
                )


def test_context_leaves_out_the_rest() -> None:
    ctx = context_files()
    assert not [f for f in ctx if f.startswith((".venv/", ".git/", "tests/", ".cache/"))]


def test_builder_stage_builds_a_wheel_from_the_context(tmp_path: Path) -> None:
    """What `pip wheel .` in the builder sees: only the context's files."""
    ctx = tmp_path / "ctx"
    for rel in context_files():
        dest = ctx / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path / "w"), str(ctx)],
        capture_output=True, text=True, timeout=300,
    )
    if out.returncode != 0:
        pytest.fail(f"pip wheel of the build context failed:\n{out.stdout}\n{out.stderr}")
    wheels = list((tmp_path / "w").glob("oomwatch-*.whl"))
    assert wheels, "no oomwatch wheel built"
    import zipfile

    names = zipfile.ZipFile(wheels[0]).namelist()
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "oomwatch = oomwatch.cli:main" in zipfile.ZipFile(wheels[0]).read(entry_points).decode()
