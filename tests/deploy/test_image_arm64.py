"""The arm64 image (scripts/build-image --arch arm64, built on an amd64 host with Debian's
qemu-user-static): its binaries are aarch64, its agent runs under qemu-user (binfmt_misc, chroot into the
unpacked image) and explains a shipped kernel-log capture exactly as the host's build of the same code does;
and an OCI image index holds it with the host's image (scripts/lib/oci_index.py).

scripts/build-image puts the host's architecture's image in .cache/image and another's in .cache/image-ARCH
(OOMWATCH_ARM64_IMAGE_DIR, OOMWATCH_AMD64_IMAGE_DIR override them); scripts/test builds both. The arm64 one
takes about 7 minutes under qemu on a 2-core amd64 machine (docs/release.md, "Other architectures").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import ROOT
from .test_sbom import _load

pytestmark = pytest.mark.tools

CAPTURE = ROOT / "fixtures" / "kmsg" / "linux-6.1-runc-group-pidns.kmsg"
EM_AARCH64 = 183  # ELF e_machine (elf.h)


def image(arch: str) -> tuple[Path, dict[str, Any]]:
    host_arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                               check=True).stdout.strip()
    default = ROOT / ".cache" / ("image" if arch == host_arch else f"image-{arch}")
    path = Path(os.environ.get(f"OOMWATCH_{arch.upper()}_IMAGE_DIR") or default)
    meta = path / "image.json"
    if not meta.exists():
        pytest.fail(f"no {arch} image in {path}: build it with scripts/build-image --arch {arch}")
    return path, json.loads(meta.read_text())


@pytest.fixture(scope="module")
def arm64() -> tuple[Path, dict[str, Any]]:
    return image("arm64")


def run_in(rootfs: Path, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """A command of the unpacked image, as its entrypoint would run it (chroot, the image's PATH)."""
    if os.geteuid() != 0:
        pytest.fail("running the arm64 image needs root (chroot)")
    if not Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists():
        pytest.fail("qemu-aarch64 is not registered with binfmt_misc: scripts/build-image --arch arm64 "
                    "registers it")
    return subprocess.run(["chroot", str(rootfs), "/usr/bin/env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin",
                           "COLUMNS=80", *args], input=stdin, capture_output=True, timeout=300, check=False)


def test_binaries_are_aarch64(arm64) -> None:
    path, meta = arm64
    assert meta["architecture"] == "arm64"
    rootfs = path / "bundle" / "rootfs"
    header = (rootfs / "usr/bin/python3.11").read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == EM_AARCH64
    # The OCI config says so too (what a node's runtime matches against its own architecture).
    config = json.loads((path / "bundle" / "config.json").read_text())
    assert config["process"]["args"][:2] == ["oomwatch", "agent"]
    layout = path / "oci"
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads((layout / "blobs" / index["manifests"][0]["digest"].replace(":", "/")).read_text())
    image_config = json.loads((layout / "blobs" / manifest["config"]["digest"].replace(":", "/")).read_text())
    assert (image_config["architecture"], image_config["os"]) == ("arm64", "linux")


def test_version_under_qemu(arm64) -> None:
    path, meta = arm64
    out = run_in(path / "bundle" / "rootfs", "oomwatch", "--version")
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode() == f"oomwatch, version {meta['tag']}\n"


def test_inspect_a_capture_under_qemu_as_on_the_host(arm64) -> None:
    path, _meta = arm64
    capture = CAPTURE.read_bytes()
    out = run_in(path / "bundle" / "rootfs", "oomwatch", "inspect", "--kmsg", "-", "--no-color",
                 stdin=capture)
    assert out.returncode == 0, out.stderr.decode()
    host = subprocess.run([sys.executable, "-m", "oomwatch", "inspect", "--kmsg", "-", "--no-color"],
                          input=capture, capture_output=True, timeout=120, check=True,
                          env={**os.environ, "COLUMNS": "80"}, cwd=ROOT)
    assert "GROUP kill, scope container, 2 killed" in out.stdout.decode()
    assert out.stdout.decode() == host.stdout.decode()


def test_sbom_is_arm64(arm64) -> None:
    _path, meta = arm64
    doc = json.loads(Path(meta["sbom"]).read_text())
    archs = {p["value"] for c in doc["components"] for p in c.get("properties", [])
             if p["name"] == "debian:architecture"}
    assert archs == {"arm64", "all"}
    psutil = [c for c in doc["components"] if c["name"] == "psutil"]
    assert psutil and psutil[0]["hashes"], psutil


def test_an_index_holds_both_architectures(arm64, tmp_path: Path) -> None:
    arm_path, arm_meta = arm64
    amd_path, amd_meta = image("amd64")
    oci_index = _load("oci_index")
    summary = oci_index.merge(tmp_path / "index", arm_meta["tag"], [amd_path, arm_path])
    layout = tmp_path / "index" / "oci"
    (tagged,) = json.loads((layout / "index.json").read_text())["manifests"]
    assert tagged["annotations"]["org.opencontainers.image.ref.name"] == arm_meta["tag"]
    assert tagged["mediaType"] == oci_index.INDEX
    index = json.loads(oci_index.read_blob(layout, tagged["digest"]))
    platforms = {m["platform"]["architecture"]: m["digest"] for m in index["manifests"]}
    assert platforms == {"amd64": amd_meta["manifest_digest"], "arm64": arm_meta["manifest_digest"]}
    assert summary["index_digest"] == tagged["digest"]
    # Every blob each manifest names is in the layout (what `skopeo copy --all` pushes).
    for digest in platforms.values():
        manifest = json.loads(oci_index.read_blob(layout, digest))
        for blob in [manifest["config"], *manifest["layers"]]:
            assert oci_index.blob_path(layout, blob["digest"]).stat().st_size == blob["size"]
