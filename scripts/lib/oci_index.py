"""One OCI image layout whose tag is an image index of single-architecture images (a multi-platform image).

    python3 scripts/lib/oci_index.py OUT TAG LAYOUT_DIR...

Each LAYOUT_DIR is a scripts/build-image output (LAYOUT_DIR/oci holds the image tagged TAG, LAYOUT_DIR/
sbom.cdx.json its SBOM). OUT/oci gets every blob of those images, an image index (application/vnd.oci.image
.index.v1+json) listing each manifest with its platform (from the image config's os and architecture), and
index.json naming that index TAG, so `skopeo copy --all oci:OUT/oci:TAG docker://REGISTRY/oomwatch:TAG`
pushes all of them under one name. OUT/sbom-ARCH.cdx.json are the images' SBOMs; OUT/image.json sums it up.
Only the standard library (it runs on the build host's python3).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

INDEX = "application/vnd.oci.image.index.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"


def blob_path(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    return layout / "blobs" / algorithm / hexdigest


def read_blob(layout: Path, digest: str) -> bytes:
    return blob_path(layout, digest).read_bytes()


def tagged_manifest(layout: Path, tag: str) -> dict[str, Any]:
    """The descriptor index.json names `tag`."""
    index = json.loads((layout / "index.json").read_text())
    found = [m for m in index["manifests"] if m.get("annotations", {}).get(REF_NAME) == tag]
    if len(found) != 1:
        raise SystemExit(f"oci_index: {layout} has {len(found)} manifests tagged {tag}")
    return found[0]


def image_index(entries: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """An image index of (manifest descriptor, image config) pairs, each with the config's platform."""
    manifests = []
    for descriptor, config in entries:
        manifests.append({
            "mediaType": descriptor["mediaType"], "digest": descriptor["digest"], "size": descriptor["size"],
            "platform": {"architecture": config["architecture"], "os": config["os"]},
        })
    platforms = [m["platform"]["architecture"] for m in manifests]
    if len(set(platforms)) != len(platforms):
        raise SystemExit(f"oci_index: one image per architecture, got {platforms}")
    return {"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests}


def merge(out: Path, tag: str, layouts: list[Path]) -> dict[str, Any]:
    oci = out / "oci"
    if out.exists():
        shutil.rmtree(out)
    (oci / "blobs" / "sha256").mkdir(parents=True)
    (oci / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    entries = []
    summary: dict[str, Any] = {"name": "oomwatch", "tag": tag, "layout": str(oci), "images": {}}
    for layout_dir in layouts:
        layout = layout_dir / "oci"
        descriptor = tagged_manifest(layout, tag)
        manifest = json.loads(read_blob(layout, descriptor["digest"]))
        config = json.loads(read_blob(layout, manifest["config"]["digest"]))
        layers = [layer["digest"] for layer in manifest["layers"]]
        for digest in [descriptor["digest"], manifest["config"]["digest"], *layers]:
            target = blob_path(oci, digest)
            if not target.exists():
                shutil.copyfile(blob_path(layout, digest), target)
        entries.append((descriptor, config))
        arch = config["architecture"]
        shutil.copyfile(layout_dir / "sbom.cdx.json", out / f"sbom-{arch}.cdx.json")
        summary["images"][arch] = {"manifest_digest": descriptor["digest"],
                                   "sbom": str(out / f"sbom-{arch}.cdx.json")}
    index_bytes = json.dumps(image_index(entries), indent=1).encode()
    index_digest = "sha256:" + hashlib.sha256(index_bytes).hexdigest()
    blob_path(oci, index_digest).write_bytes(index_bytes)
    tagged = {"mediaType": INDEX, "digest": index_digest, "size": len(index_bytes),
              "annotations": {REF_NAME: tag}}
    (oci / "index.json").write_text(json.dumps({"schemaVersion": 2, "mediaType": INDEX,
                                                "manifests": [tagged]}))
    summary["index_digest"] = index_digest
    (out / "image.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    summary = merge(Path(argv[0]), argv[1], [Path(p) for p in argv[2:]])
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
