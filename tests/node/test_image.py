"""The image scripts/image builds without a registry or daemon matches what the Dockerfile
describes: same user, entrypoint and command, the same static binary at /bouncer, and the files of
the distroless base that bouncer relies on."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import tarfile
from pathlib import Path
from typing import Any

from conftest import ROOT


def final_stage(dockerfile: Path) -> dict[str, Any]:
    """USER, ENTRYPOINT, CMD and COPY instructions of the Dockerfile's last stage."""
    stage: dict[str, Any] = {}
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            stage = {"COPY": []}
        elif word in ("ENTRYPOINT", "CMD"):
            stage[word] = json.loads(rest)
        elif word == "USER":
            stage[word] = rest.strip()
        elif word == "COPY":
            stage["COPY"].append([a for a in shlex.split(rest) if not a.startswith("--")])
    return stage


def read_archive(path: Path) -> tuple[dict[str, Any], dict[str, tuple[tarfile.TarInfo, bytes]]]:
    """The image config and every file of its layers (path -> header, content) from an OCI archive."""
    with tarfile.open(path) as archive:
        def blob(digest: str) -> bytes:
            member = archive.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}")
            assert member is not None
            return member.read()

        index = json.loads(archive.extractfile("index.json").read())  # type: ignore[union-attr]
        (entry,) = index["manifests"]
        manifest = json.loads(blob(entry["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        files: dict[str, tuple[tarfile.TarInfo, bytes]] = {}
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=io.BytesIO(blob(layer["digest"]))) as t:
                for m in t.getmembers():
                    f = t.extractfile(m) if m.isfile() else None
                    files["/" + m.name.lstrip("./")] = (m, f.read() if f else b"")
        config["_ref"] = entry["annotations"]["org.opencontainers.image.ref.name"]
    return config, files


def test_bouncer_image_matches_the_dockerfile() -> None:
    archive = Path(os.environ["BOUNCER_IMAGE_ARCHIVE"])
    binary = Path(os.environ["BOUNCER_STATIC_BIN"])
    want = final_stage(ROOT / "Dockerfile")
    config, files = read_archive(archive)

    assert config["_ref"] == os.environ["BOUNCER_IMAGE_BOUNCER"]
    assert config["config"]["User"] == want["USER"] == "65532:65532"
    assert config["config"]["Entrypoint"] == want["ENTRYPOINT"]
    assert config["config"]["Cmd"] == want["CMD"]
    assert config["os"] == "linux" and config["architecture"] == "amd64"

    # The Dockerfile copies the builder's static binary to each destination: here, the same bytes.
    dests = [copy[-1] for copy in want["COPY"]]
    assert dests == ["/bouncer"], want["COPY"]
    header, content = files["/bouncer"]
    assert header.mode & 0o777 == 0o755 and header.isfile()
    assert hashlib.sha256(content).digest() == hashlib.sha256(binary.read_bytes()).digest()
    assert content[:4] == b"\x7fELF"

    # What distroless/static:nonroot gives the Dockerfile's image and bouncer uses.
    assert b"nonroot:x:65532:65532:" in files["/etc/passwd"][1]
    assert b"nonroot:x:65532:" in files["/etc/group"][1]
    assert files["/etc/ssl/certs/ca-certificates.crt"][1].count(b"BEGIN CERTIFICATE") > 50
    assert files["/tmp"][0].isdir() and files["/tmp"][0].mode & 0o7777 == 0o1777
    # Nothing else: no shell, no libc, no package manager.
    assert not [p for p in files if p.startswith(("/bin", "/lib", "/usr"))], sorted(files)
