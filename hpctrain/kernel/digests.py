"""Checkpoint digests, without torch: which digest a manifest entry names, a file's digest, and
the check of listed files against their entries (hpctrain/kernel/checkpoint.py, the format, uses
them; a resume's ranks hash the weights files as they copy from them: train_entry's reader.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path

# A manifest entry names its digest: "sha256", or "xxh3_128" (the xxhash package; about 30x
# faster than sha256 here) for the weights files train_entry writes since issue 13. Both detect a
# truncated or corrupted file; neither is a signature (the manifest is not signed either).
DIGESTS = ("sha256", "xxh3_128")
XXH3 = "xxh3_128"


def sha256_file(path: Path) -> str:
    with open(path, "rb", buffering=0) as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def digest_file(path: Path, algo: str, blob: bytes | None = None) -> str:
    """The hex digest of a file with one of DIGESTS (of `blob`, its bytes, when read already)."""
    if algo == "sha256":
        return hashlib.sha256(blob).hexdigest() if blob is not None else sha256_file(path)
    import xxhash  # lazy: optional: without it, one line says install xxhash

    h = xxhash.xxh3_128()
    if blob is not None:
        h.update(blob)
        return h.hexdigest()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def algo_of(entry: Mapping[str, object]) -> str | None:
    """The digest a manifest entry names (one of DIGESTS), or None."""
    return next((a for a in DIGESTS if isinstance(entry.get(a), str)), None)


def verify_files(folder: Path, manifest: Mapping[str, object], rels: Iterable[str]) -> str | None:
    """Why one of the files `rels` (listed in the checked `manifest`) does not match its size
    and digest, or None: the digests a rank checks of the files it will read."""
    files = manifest["files"]
    assert isinstance(files, dict)  # check_manifest
    for rel in rels:
        entry = files.get(rel)
        if not isinstance(entry, dict):
            return f"{rel} is not listed in the manifest"
        algo = algo_of(entry)
        assert algo is not None  # check_manifest
        try:
            digest = digest_file(folder / rel, algo)
        except ImportError:
            return f"{rel} has an {algo} checksum: install xxhash to verify it"
        except OSError as exc:
            return f"{rel} cannot be read: {exc}"
        if digest != entry[algo]:
            return f"{rel} does not match its {algo} checksum (corrupted)"
    return None
