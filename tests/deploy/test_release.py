"""Release material: one source for the version, a license, a changelog entry, pinned dependencies.

Plain file checks (unit tier): the version lives in oomwatch/__init__.py; everything that names it again
is compared here, so a release that bumps one place and forgets another fails.
"""

from __future__ import annotations

import re
import tomllib

import yaml
from packaging.requirements import Requirement

import oomwatch

from .conftest import CHART, KUSTOMIZE_BASE, ROOT

VERSION = oomwatch.__version__


def test_version_is_semver() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION), VERSION


def test_pyproject_reads_the_version_from_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in project["project"]["dynamic"] and "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "oomwatch.__version__"}


def test_chart_version_and_app_version_follow_the_package() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION
    assert chart["version"] == VERSION  # the chart is released with the agent (docs/release.md)


def test_kustomize_image_tag_follows_the_package() -> None:
    kustomization = yaml.safe_load((KUSTOMIZE_BASE / "kustomization.yaml").read_text())
    (image,) = [i for i in kustomization["images"] if i["name"] == "oomwatch"]
    assert image["newTag"] == VERSION


def test_build_image_takes_the_tag_from_the_package() -> None:
    script = (ROOT / "scripts/build-image").read_text()
    assert "oomwatch/__init__.py" in script or "oomwatch.__version__" in script
    assert not re.search(r"\b\d+\.\d+\.\d+\b", script.split("\n", 1)[1].replace("0.0.0.0", "")), (
        "scripts/build-image hard-codes a version"
    )


def test_changelog_has_an_entry_for_this_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", text, flags=re.M)
    assert versions and versions[0] == VERSION, f"newest CHANGELOG entry {versions[:1]} != {VERSION}"
    assert "## [Unreleased]" in text


def test_license_is_apache_2() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX" in text  # the full text, not a pointer
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == "Apache-2.0"


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and version and " " not in version, f"constraints.txt: {line!r} is not an exact pin"
        pins[name.lower().replace("_", "-")] = version
    return pins


def test_every_declared_dependency_is_pinned() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    pins = _pins()
    for text in declared:
        req = Requirement(text)
        name = req.name.lower().replace("_", "-")
        assert name in pins, f"{name} is not pinned in constraints.txt"
        assert req.specifier.contains(pins[name]), f"{name}=={pins[name]} does not satisfy {text}"


def test_installers_use_the_constraints() -> None:
    assert "-c constraints.txt" in (ROOT / "scripts/lib/venv.sh").read_text()
    assert "constraints.txt" in (ROOT / "scripts/build-image").read_text()
    dockerfile = (ROOT / "Dockerfile").read_text()
    copies = [line for line in dockerfile.splitlines() if line.startswith("COPY ")]
    assert any("constraints.txt" in line for line in copies) and "-c constraints.txt" in dockerfile
