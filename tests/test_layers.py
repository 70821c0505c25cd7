"""The layers of oomwatch/ stay apart: what a module may not import, directly or through others (every
`import`, at module level or inside a function, as tests/test_import_cycles.py reads them), and parsers that
read no files.

- parse/ (pure functions of text) and model (the typed values) are the bottom: they import only each other and
  the name/time helpers.
- events (what sources tell the pipeline) carries model values only: no runtime reader, no source, no sink.
- sources read and emit events: they know nothing of how deaths are judged (deaths), what holds memory
  (holders), the pipeline's stages, or the sinks.
- sinks show what the pipeline published: they read no source.
- node (what the agent reads once about the node) builds no sink's value.
- the pipeline and its stages never reach the API server's client (oomwatch.workloads.kubeapi) nor the pod
  source: what they know of a pod came as an event (issue 29 item 2), so a replay never depends on when a watch
  delivered.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_import_cycles import PACKAGE, import_graph

BOTTOM = ("oomwatch.parse", "oomwatch.model", "oomwatch.names", "oomwatch.timefmt")
API_CLIENT = ("oomwatch.workloads.kubeapi", "oomwatch.sources.pods")
# (modules, what they may not reach): each a module name or a package prefix ("oomwatch.sinks" is the package
# and every module below it).
FORBIDDEN = [
    ("oomwatch.sources", ("oomwatch.deaths", "oomwatch.holders", "oomwatch.pipeline", "oomwatch.stages",
                          "oomwatch.correlator", "oomwatch.sinks")),
    ("oomwatch.sinks", ("oomwatch.sources",)),
    ("oomwatch.node", ("oomwatch.sinks",)),
    ("oomwatch.events", ("oomwatch.workloads", "oomwatch.sources", "oomwatch.sinks")),
    ("oomwatch.pipeline", API_CLIENT),
    ("oomwatch.stages", API_CLIENT),
]
# File reads a parser must not make: open(), os.open/listdir/scandir, Path.open/read_text/read_bytes.
FILE_READS = {"open", "listdir", "scandir", "read_text", "read_bytes", "pread"}


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def crossings(graph: dict[str, set[str]]) -> list[str]:
    """`module -> forbidden module` for each forbidden module a module reaches, and each module of parse/ or
    model that reaches past the bottom layer."""
    found = []
    for module in sorted(graph):
        reached = reachable(graph, module)
        for prefix, banned in FORBIDDEN:
            if _under(module, prefix):
                found += [f"{module} -> {m}" for m in sorted(reached) if any(_under(m, b) for b in banned)]
        if any(_under(module, b) for b in ("oomwatch.parse", "oomwatch.model")):
            found += [f"{module} -> {m}" for m in sorted(reached) if not any(_under(m, b) for b in BOTTOM)]
    return found


def file_reads(root: Path) -> list[str]:
    """`path:line name` of each call in `root`'s modules that reads a file."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if name in FILE_READS:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {name}")
    return found


def test_no_module_crosses_its_layer() -> None:
    found = crossings(import_graph())
    assert not found, "layers crossed: " + "; ".join(found)


def test_the_pipeline_never_reaches_the_api_server() -> None:
    graph = import_graph()
    reached = reachable(graph, "oomwatch.pipeline")
    assert "oomwatch.stages.identity" in reached and "oomwatch.workloads.resolver" in reached  # (the graph is whole)
    assert not [m for m in sorted(reached) if any(_under(m, b) for b in API_CLIENT)]


def test_parsers_read_no_files() -> None:
    found = file_reads(PACKAGE / "parse")
    assert not found, "parse/ reads files: " + "; ".join(found)


def test_the_checks_find_a_crossing_through_another_module(tmp_path: Path) -> None:
    pkg = tmp_path / "oomwatch"
    for sub in ("sources", "parse"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "deaths.py").write_text("X = 1\n")
    (pkg / "helper.py").write_text("def f():\n    from oomwatch.deaths import X\n    return X\n")
    (pkg / "sources" / "a.py").write_text("from oomwatch import helper\n")
    (pkg / "parse" / "p.py").write_text("import oomwatch.helper\n\ndef read(path):\n    return open(path).read()\n")
    assert crossings(import_graph(pkg)) == [
        "oomwatch.parse.p -> oomwatch.deaths", "oomwatch.parse.p -> oomwatch.helper",
        "oomwatch.sources.a -> oomwatch.deaths"]
    assert file_reads(pkg / "parse") == ["parse/p.py:4 open"]
