"""A CycloneDX 1.5 SBOM of an image's root filesystem: every installed Debian package (the rootfs's own dpkg
database) and every installed Python distribution (each *.dist-info), with versions and package URLs.

    python3 scripts/lib/sbom.py ROOTFS OUT.json --wheels DIR --name oomwatch --version 0.1.0 \
        --digest sha256:... --timestamp 2026-11-25T13:30:00Z

scripts/build-image runs it on the image as unpacked by umoci, and writes OUT beside the OCI layout. Only the
standard library: it runs on the build host's python3. The parsers are pure (text in, records out) and tested
on the image's own files (tests/deploy/test_sbom.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import uuid
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path
from typing import Optional
from urllib.parse import quote


@dataclass(frozen=True)
class DebPackage:
    name: str
    version: str
    architecture: str
    source: Optional[str]  # the source package's name, when it differs from the binary's
    source_version: Optional[str]  # "Source: name (version)": the source's version, when it differs


@dataclass(frozen=True)
class PythonDist:
    name: str
    version: str
    license_expression: Optional[str]
    location: str  # the dist-info directory, relative to the rootfs


def parse_dpkg_status(text: str) -> list[DebPackage]:
    """The installed packages of a dpkg status file (`Status: install ok installed`), in file order."""
    packages = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = None
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") and key:  # a continuation line (Description, Conffiles)
                continue
            key, sep, value = line.partition(":")
            if sep:
                fields[key] = value.strip()
        if not fields.get("Package") or not fields.get("Status", "").endswith(" installed"):
            continue
        source, source_version = None, None
        if "Source" in fields:
            m = re.fullmatch(r"(\S+)(?:\s+\((\S+)\))?", fields["Source"])
            if m:
                source, source_version = m.group(1), m.group(2)
        packages.append(DebPackage(fields["Package"], fields["Version"], fields["Architecture"],
                                   source, source_version))
    return packages


def parse_dist_metadata(text: str, location: str) -> PythonDist:
    """A dist-info METADATA file (core metadata: RFC 822 headers, then the description)."""
    headers = HeaderParser().parsestr(text, headersonly=True)
    return PythonDist(headers["Name"], headers["Version"], headers.get("License-Expression"), location)


def normalize(name: str) -> str:
    """PEP 503's normalized project name (the name in a pypi package URL)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def os_release(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value.strip().strip('"')
    return out


def deb_purl(p: DebPackage, distro: str) -> str:
    purl = f"pkg:deb/debian/{quote(p.name)}@{quote(p.version, safe='')}?arch={p.architecture}&distro={distro}"
    if p.source:
        upstream = p.source if not p.source_version else f"{p.source}@{p.source_version}"
        purl += f"&upstream={quote(upstream, safe='@')}"
    return purl


def sbom(debs: list[DebPackage], dists: list[PythonDist], os_info: dict[str, str], *, name: str, version: str,
         digest: str, wheel_hashes: dict[tuple[str, str], str], timestamp: str) -> dict:
    distro = f"{os_info.get('ID', 'debian')}-{os_info.get('VERSION_ID', '')}"
    components: list[dict] = [{
        "type": "operating-system", "bom-ref": f"os:{distro}", "name": os_info.get("ID", "debian"),
        "version": os_info.get("VERSION_ID", ""), "description": os_info.get("PRETTY_NAME", ""),
    }]
    for p in sorted(debs, key=lambda p: (p.name, p.architecture)):
        purl = deb_purl(p, distro)
        component = {"type": "library", "bom-ref": purl, "name": p.name, "version": p.version, "purl": purl,
                     "properties": [{"name": "debian:architecture", "value": p.architecture}]}
        if p.source:
            component["properties"].append({"name": "debian:source", "value": p.source})
        components.append(component)
    for d in sorted(dists, key=lambda d: normalize(d.name)):
        purl = f"pkg:pypi/{normalize(d.name)}@{quote(d.version, safe='')}"
        component = {"type": "library", "bom-ref": purl, "name": d.name, "version": d.version, "purl": purl,
                     "properties": [{"name": "python:dist-info", "value": d.location}]}
        if d.license_expression:
            component["licenses"] = [{"expression": d.license_expression}]
        wheel_sha256 = wheel_hashes.get((normalize(d.name), d.version))
        if wheel_sha256:
            component["hashes"] = [{"alg": "SHA-256", "content": wheel_sha256}]
        components.append(component)
    image_purl = f"pkg:oci/{name}@{quote(digest, safe='')}?tag={quote(version, safe='')}"
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        # The same image gives the same serial number (and the same document, timestamp aside).
        "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, image_purl)}",
        "version": 1,
        "metadata": {
            "timestamp": timestamp,
            "tools": {"components": [{"type": "application", "name": "oomwatch scripts/build-image"}]},
            "component": {"type": "container", "bom-ref": image_purl, "name": name, "version": version,
                          "purl": image_purl},
        },
        "components": components,
    }


# --- reading the rootfs (thin: the parsing is above) -----------------------------------------


def dist_infos(rootfs: Path) -> list[PythonDist]:
    """Every *.dist-info with a METADATA file in the rootfs's Python directories."""
    dists = []
    for pattern in ("usr/local/lib/python3*/*-packages/*.dist-info",
                    "usr/lib/python3*/*-packages/*.dist-info"):
        for path in sorted(rootfs.glob(pattern)):
            metadata = path / "METADATA"
            if metadata.is_file():
                dists.append(parse_dist_metadata(metadata.read_text(encoding="utf-8", errors="replace"),
                                                 "/" + str(path.relative_to(rootfs))))
    return list({d.location: d for d in dists}.values())


def wheel_hashes(wheels: Optional[Path]) -> dict[tuple[str, str], str]:
    """(normalized name, version) → sha256 of the wheel file it was installed from (PEP 427 file names)."""
    out = {}
    for wheel in sorted(wheels.glob("*.whl")) if wheels else []:
        dist, version = wheel.name.split("-")[:2]
        out[(normalize(dist), version)] = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rootfs", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--wheels", type=Path, help="the wheels installed into the rootfs (for their hashes)")
    parser.add_argument("--name", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--digest", required=True, help="the image manifest's digest")
    parser.add_argument("--timestamp", required=True, help="ISO 8601 UTC")
    args = parser.parse_args(argv)
    status = args.rootfs / "var/lib/dpkg/status"
    debs = parse_dpkg_status(status.read_text(encoding="utf-8"))
    if not debs:
        print(f"sbom: no installed package in {status}", file=sys.stderr)
        return 1
    os_file = args.rootfs / "etc/os-release"
    if not os_file.exists():
        os_file = args.rootfs / "usr/lib/os-release"
    doc = sbom(debs, dist_infos(args.rootfs), os_release(os_file.read_text()), name=args.name,
               version=args.version, digest=args.digest, wheel_hashes=wheel_hashes(args.wheels),
               timestamp=args.timestamp)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"sbom: {args.out}: {len(debs)} Debian packages, {len(doc['components']) - 1 - len(debs)} Python "
          "distributions", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
