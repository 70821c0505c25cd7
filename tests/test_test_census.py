"""The tests test through the public surface (issue 29): what a test observes is a public, documented accessor
or an event, so reads of private attributes (`obj._name`) stay rare, and every test asserts something.

Counted in the unit tier: tests/ less the real-kernel tier (tests/e2e drives a VM; its guest scripts are
programs) and the tools tier (tests/deploy, which runs kubectl, helm and promtool):
- a private attribute: `x._name` on anything but the test's own `self`/`cls`; a named tuple's public methods
  (`_replace`, `_asdict`, `_fields`, `_make`) are not private;
- a test with nothing to fail: a `test_*` function whose body holds no `assert` and no `pytest.raises`,
  `pytest.fail` or `pytest.warns` (a helper that asserts in its place hides what the test checks).
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PRIVATE_READS_ALLOWED = 5
NAMED_TUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
FAILS = {"raises", "fail", "warns"}


def census_files(root: Path = TESTS) -> list[Path]:
    """The unit tier's modules: tests/ less the real-kernel tier (e2e) and the tools tier (deploy)."""
    return sorted(p for p in root.rglob("*.py") if not {"e2e", "deploy"} & set(p.relative_to(root).parts))


def private_reads(paths: list[Path]) -> list[str]:
    """`path:line x._name` for each private attribute a test module reaches into."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and node.attr not in NAMED_TUPLE_API
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def _fails(node: ast.AST) -> bool:
    return isinstance(node, ast.Assert) or (isinstance(node, ast.Attribute) and node.attr in FAILS
                                            and isinstance(node.value, ast.Name) and node.value.id == "pytest")


def unchecked_tests(paths: list[Path]) -> list[str]:
    """`path:line name` of each test function whose body cannot fail by itself."""
    found = []
    for path in paths:
        if not path.name.startswith("test_"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")
                    and not any(_fails(inner) for inner in ast.walk(node))):
                found.append(f"{path.name}:{node.lineno} {node.name}")
    return found


def test_unit_tests_read_few_private_attributes() -> None:
    found = private_reads(census_files())
    assert len(found) <= PRIVATE_READS_ALLOWED, "private attributes read by tests: " + "; ".join(found)


def test_every_test_asserts_something() -> None:
    found = unchecked_tests(census_files())
    assert found == [], "tests with nothing that can fail: " + "; ".join(found)


def test_the_census_sees_what_it_counts(tmp_path: Path) -> None:
    for tier in ("e2e", "deploy"):  # not counted
        (tmp_path / tier).mkdir()
        (tmp_path / tier / "test_vm.py").write_text("def test_boot(vm):\n    vm._console.read()\n")
    (tmp_path / "test_x.py").write_text(
        "import pytest\n\n"
        "def helper(thing):\n    assert thing._ready\n\n"
        "def test_nothing(thing):\n    helper(thing)\n\n"
        "def test_raises():\n    with pytest.raises(ValueError):\n        int('x')\n\n"
        "def test_reads(thing, row):\n    assert thing._state == 1 and row._replace(a=1) and thing.__dict__\n\n"
        "class Fake:\n    def read(self):\n        return self._data\n")
    paths = census_files(tmp_path)
    assert [p.name for p in paths] == ["test_x.py"]
    assert private_reads(paths) == ["test_x.py:4 thing._ready", "test_x.py:14 thing._state"]
    assert unchecked_tests(paths) == ["test_x.py:6 test_nothing"]
