"""The image's SBOM (scripts/lib/sbom.py, written by scripts/build-image beside the image): its parsers on
text taken from the image (tests/deploy/data), and, on the built image, that it lists every Debian package dpkg
says is installed in the rootfs and every Python distribution importlib finds there, at their versions.

The built image is .cache/image (scripts/test builds it before the tools tier), or OOMWATCH_IMAGE_DIR.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import ROOT

DATA = Path(__file__).resolve().parent / "data"


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "lib" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


sbom = _load("sbom")


# --- the parsers, on the image's own files ---------------------------------------------------


def test_dpkg_status_stanzas() -> None:
    packages = sbom.parse_dpkg_status((DATA / "dpkg-status-bookworm-amd64.txt").read_text())
    assert packages == [
        sbom.DebPackage("bash", "5.2.15-2+b13", "amd64", "bash", "5.2.15-2"),
        sbom.DebPackage("python3", "3.11.2-1+b1", "amd64", "python3-defaults", "3.11.2-1"),
        sbom.DebPackage("zlib1g", "1:1.2.13.dfsg-1", "amd64", "zlib", None),
    ]


def test_dpkg_status_skips_packages_not_installed() -> None:
    # dpkg keeps a removed package's conffiles as "deinstall ok config-files": not in the image's software.
    text = (DATA / "dpkg-status-bookworm-amd64.txt").read_text().replace(
        "Package: bash\nEssential: yes\nStatus: install ok installed",
        "Package: bash\nStatus: deinstall ok config-files")
    assert [p.name for p in sbom.parse_dpkg_status(text)] == ["python3", "zlib1g"]


def test_dist_metadata() -> None:
    dist = sbom.parse_dist_metadata((DATA / "click-8.5.1-METADATA.txt").read_text(),
                                    "/usr/local/lib/python3.11/dist-packages/click-8.5.1.dist-info")
    assert (dist.name, dist.version, dist.license_expression) == ("click", "8.5.1", "BSD-3-Clause")


def test_package_urls() -> None:
    bash, _python3, zlib = sbom.parse_dpkg_status((DATA / "dpkg-status-bookworm-amd64.txt").read_text())
    # purl: the version percent-encoded (+ and the epoch's :), the source package as `upstream`.
    assert sbom.deb_purl(bash, "debian-12") == \
        "pkg:deb/debian/bash@5.2.15-2%2Bb13?arch=amd64&distro=debian-12&upstream=bash@5.2.15-2"
    assert sbom.deb_purl(zlib, "debian-12") == \
        "pkg:deb/debian/zlib1g@1%3A1.2.13.dfsg-1?arch=amd64&distro=debian-12&upstream=zlib"
    assert sbom.normalize("typing_extensions") == "typing-extensions"
    assert sbom.normalize("PyYAML") == "pyyaml"


def test_document_shape() -> None:
    debs = sbom.parse_dpkg_status((DATA / "dpkg-status-bookworm-amd64.txt").read_text())
    click = sbom.parse_dist_metadata((DATA / "click-8.5.1-METADATA.txt").read_text(),
                                     "/x/click-8.5.1.dist-info")
    doc = sbom.sbom(debs, [click], {"ID": "debian", "VERSION_ID": "12"}, name="oomwatch", version="0.1.0",
                    digest="sha256:" + "ab" * 32, wheel_hashes={("click", "8.5.1"): "cd" * 32},
                    timestamp="2026-11-25T13:30:00Z")
    assert (doc["bomFormat"], doc["specVersion"]) == ("CycloneDX", "1.5")
    assert doc["metadata"]["component"]["purl"] == f"pkg:oci/oomwatch@sha256%3A{'ab' * 32}?tag=0.1.0"
    (pypi,) = [c for c in doc["components"] if c.get("purl", "").startswith("pkg:pypi/")]
    assert pypi["hashes"] == [{"alg": "SHA-256", "content": "cd" * 32}]
    assert pypi["licenses"] == [{"expression": "BSD-3-Clause"}]
    assert [c["type"] for c in doc["components"]] == ["operating-system"] + ["library"] * 4
    again = sbom.sbom(debs, [click], {"ID": "debian", "VERSION_ID": "12"}, name="oomwatch", version="0.1.0",
                      digest="sha256:" + "ab" * 32, wheel_hashes={}, timestamp="2026-11-25T13:30:00Z")
    assert again["serialNumber"] == doc["serialNumber"]  # one image, one serial number


# --- the built image -------------------------------------------------------------------------


def image_dir() -> Path:
    return Path(os.environ.get("OOMWATCH_IMAGE_DIR") or ROOT / ".cache" / "image")


@pytest.fixture(scope="module")
def built() -> tuple[Path, dict[str, Any], dict[str, Any]]:
    image = image_dir()
    meta_path = image / "image.json"
    if not meta_path.exists():
        pytest.fail(f"no image in {image}: scripts/test builds it with scripts/build-image before this tier")
    meta = json.loads(meta_path.read_text())
    if "sbom" not in meta:
        pytest.fail(f"{image} was built without an SBOM: run scripts/build-image again")
    return image / "bundle" / "rootfs", meta, json.loads(Path(meta["sbom"]).read_text())


def _components(doc: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [c for c in doc["components"] if c.get("purl", "").startswith(f"pkg:{kind}/")]


@pytest.mark.tools
def test_sbom_lists_every_installed_debian_package(built) -> None:
    rootfs, meta, doc = built
    # dpkg itself reads the image's database: not the parser under test.
    out = subprocess.run(["dpkg-query", "--admindir", str(rootfs / "var/lib/dpkg"), "-W", "-f",
                          "${db:Status-Abbrev} ${Package} ${Version} ${Architecture}\n"],
                         capture_output=True, text=True, check=True).stdout
    installed = {tuple(line.split()[1:]) for line in out.splitlines() if line.startswith("ii ")}
    listed = {(c["name"], c["version"], properties["debian:architecture"]) for c in _components(doc, "deb")
              for properties in [{p["name"]: p["value"] for p in c["properties"]}]}
    assert len(installed) > 50, out
    assert listed == installed
    assert {arch for _name, _version, arch in installed} <= {meta["architecture"], "all"}


@pytest.mark.tools
def test_sbom_lists_every_installed_wheel(built) -> None:
    rootfs, meta, doc = built
    site = [str(p) for p in rootfs.glob("usr/local/lib/python3*/dist-packages")]
    assert site, "no site-packages in the image"
    installed = {(sbom.normalize(d.metadata["Name"]), d.version)
                 for d in importlib.metadata.distributions(path=site)}
    listed = {(sbom.normalize(c["name"]), c["version"]) for c in _components(doc, "pypi")}
    assert ("oomwatch", meta["tag"]) in installed
    assert listed == installed
    # Every wheel pip installed came from the build's wheel directory, whose hashes the SBOM carries.
    unhashed = [c["name"] for c in _components(doc, "pypi") if not c.get("hashes")]
    assert unhashed == []


@pytest.mark.tools
def test_sbom_names_the_image(built) -> None:
    _rootfs, meta, doc = built
    component = doc["metadata"]["component"]
    assert component["version"] == meta["tag"]
    assert component["purl"].startswith(f"pkg:oci/oomwatch@{meta['manifest_digest'].replace(':', '%3A')}")
