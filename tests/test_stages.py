"""The Pipeline dispatches, the stages decide (issue 29 item 1): the Pipeline class stays small, and no stage
reaches into another: a stage module imports from another stage's module only the read-only views that module
declares (its `VIEWS`), and reads private fields (`x._name`) only of itself, or, inside one of its own views, of
the stage that view shows."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_import_cycles import PACKAGE

MAX_PIPELINE_LINES = 200
STAGES = "oomwatch.stages"


def class_lines(path: Path, name: str) -> int:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node.end_lineno - node.lineno + 1
    raise AssertionError(f"no class {name} in {path}")


def declared_views(tree: ast.Module) -> tuple[str, ...]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "VIEWS" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    return ()


def reaches(stages_dir: Path) -> list[str]:
    """`module: what` for each import of another stage's module past its views, and each read of a private field
    not of `self` outside the module's own views."""
    trees = {p.stem: ast.parse(p.read_text(), str(p)) for p in sorted(stages_dir.glob("*.py"))
             if p.name != "__init__.py"}
    views = {name: declared_views(tree) for name, tree in trees.items()}
    found = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [f"{name}: import {a.name}" for a in node.names if a.name.startswith(STAGES + ".")]
            elif isinstance(node, ast.ImportFrom) and node.module == STAGES:
                found += [f"{name}: {a.name}" for a in node.names if a.name in trees]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(STAGES + "."):
                other = node.module.rpartition(".")[2]
                found += [f"{name}: {other}.{a.name}" for a in node.names
                          if other != name and a.name not in views.get(other, ())]
        for cls in [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name not in views[name]]:
            found += [f"{name}: {ast.unparse(n)}" for n in ast.walk(cls)
                      if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__")
                      and not (isinstance(n.value, ast.Name) and n.value.id == "self")]
    return found


def test_the_pipeline_class_only_dispatches() -> None:
    lines = class_lines(PACKAGE / "pipeline.py", "Pipeline")
    assert lines <= MAX_PIPELINE_LINES, f"Pipeline is {lines} lines"


def test_no_stage_reaches_into_another() -> None:
    found = reaches(PACKAGE / "stages")
    assert not found, "a stage reaches into another: " + "; ".join(found)


def test_every_stage_module_declares_its_views() -> None:
    for path in sorted((PACKAGE / "stages").glob("*.py")):
        if path.name != "__init__.py":
            tree = ast.parse(path.read_text())
            assert any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "VIEWS" for t in n.targets)
                       for n in tree.body), f"{path.name} declares no VIEWS"


def test_the_check_finds_a_reach(tmp_path: Path) -> None:
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "a.py").write_text('VIEWS = ("AView",)\n\nclass A:\n    pass\n\n'
                                   'class AView:\n    def f(self):\n        return self._stage._x\n')
    (tmp_path / "b.py").write_text("from oomwatch.stages.a import A, AView\nimport oomwatch.stages.a\n"
                                   "from oomwatch.stages import a\nVIEWS = ()\n\n"
                                   "class B:\n    def f(self, other):\n        return other._x, self._y\n")
    assert reaches(tmp_path) == ["b: a.A", "b: import oomwatch.stages.a", "b: a", "b: other._x"]


def test_every_event_and_every_value_a_stage_tells_has_a_stage_that_takes_it() -> None:
    import oomwatch.events as events
    import oomwatch.stages as stages
    from oomwatch.stages.counts import CountsStage
    from oomwatch.stages.deaths import DeathsStage
    from oomwatch.stages.identity import IdentityStage
    from oomwatch.stages.kernellog import KernelLogStage
    from oomwatch.stages.posture import PostureStage

    taken = {kind for stage in (PostureStage, KernelLogStage, DeathsStage, IdentityStage, CountsStage)
             for kind in stage.TAKES}
    kinds = [v for v in vars(events).values() if isinstance(v, type) and v.__module__ == events.__name__]
    kinds += [getattr(stages, name) for name in ("Due", "Named", "Published", "CountersMoved", "SigKilled",
                                                 "DeathCounted")]
    assert len(kinds) > 20
    # (a Tick only advances what is due; the requests go the other way: what a stage asks a source to read)
    assert [k.__name__ for k in kinds if k not in taken] == ["LogRequest", "RayLogRequest", "Tick"]
