"""The checkpoint folder format, without torch: what train_entry writes and the CLI reads.

  checkpoints/step-<8 digits>/   one checkpoint; it counts only once MANIFEST.json is in it
  checkpoints/.staging-step-<N>/ a save in progress (a crash leaves at most this)
  checkpoints/latest             text: the folder name of the newest committed checkpoint
  MANIFEST.json                  written last: every file with size and sha256, format, world size,
                                 strategy, step, torch version

A checkpoint verifies when every file the manifest lists has its size and checksum. A truncated or
corrupted one is reported and skipped, never deleted. The writer (train_entry/checkpoint.py) owns
staging, fsync order and pruning; this module owns the names and the verification.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpctrain.kernel.files import fsync_path, write_atomic  # noqa: F401  (part of the format's API)

STEP_RE = re.compile(r"^step-(\d{8})$")
STAGING_PREFIX = ".staging-"
MANIFEST = "MANIFEST.json"
LATEST = "latest"
FORMAT = 1


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def staging_name(step: int) -> str:
    return STAGING_PREFIX + step_name(step)


def step_of(name: str) -> int | None:
    """The step of a folder name `step-<8 digits>` (also with the staging prefix), else None."""
    m = STEP_RE.match(name.removeprefix(STAGING_PREFIX))
    return int(m.group(1)) if m else None


def sha256_file(path: Path) -> str:
    with open(path, "rb", buffering=0) as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def list_files(folder: Path) -> list[str]:
    """Every regular file under `folder` (relative POSIX paths, sorted), the manifest excluded."""
    out = []
    for root, _, files in os.walk(folder):
        for name in files:
            rel = (Path(root) / name).relative_to(folder).as_posix()
            if rel != MANIFEST:
                out.append(rel)
    return sorted(out)


def verify(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(manifest, None) when every file the manifest lists has its size and checksum, else
    (None, why). Reads only regular files inside `folder`: a manifest naming /dev/zero, ../x or a
    symlink out is refused, never followed (verification must not hang or read outside the
    checkpoint)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return None, f"no {MANIFEST} (the save did not finish)"
    except (OSError, ValueError, RecursionError) as exc:
        return None, f"unreadable {MANIFEST}: {exc}"
    if not isinstance(manifest, dict):
        return None, f"{MANIFEST} is not a JSON object"
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return None, f"{MANIFEST} lists no files"
    root = folder.resolve()
    for rel, entry in sorted(files.items()):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("size"), int)
            or not isinstance(entry.get("sha256"), str)
        ):
            return None, f"{MANIFEST}: the entry of {rel!r} has no size and sha256"
        path = folder / rel
        try:
            inside = path.resolve().is_relative_to(root) and not Path(rel).is_absolute()
            st = path.lstat()
        except FileNotFoundError:
            return None, f"{rel} is missing"
        except (OSError, RuntimeError, ValueError) as exc:
            return None, f"{rel} cannot be checked: {exc}"
        if not inside:
            return None, f"{MANIFEST} lists {rel!r}, which is outside the checkpoint folder"
        if not stat.S_ISREG(st.st_mode):
            return None, f"{MANIFEST} lists {rel!r}, which is not a regular file"
        size = st.st_size
        if size != entry["size"]:
            return None, f"{rel} is {size} bytes, the manifest says {entry['size']} (truncated?)"
        if sha256_file(path) != entry["sha256"]:
            return None, f"{rel} does not match its sha256 checksum (corrupted)"
    return manifest, None


def step_folders(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every step-<N> folder, newest first."""
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := STEP_RE.match(p.name))]
    return sorted(found, reverse=True)


def newest_verified(
    ckpt_dir: Path, warn: Callable[[str], None] | None = None
) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint whose manifest verifies; every one skipped on the way is reported."""
    for _, folder in step_folders(ckpt_dir):
        manifest, why = verify(folder)
        if manifest is not None:
            return folder, manifest
        if warn:
            warn(f"checkpoint {folder} skipped: {why}; it is left in place")
    return None


def read_latest(ckpt_dir: Path) -> int | None:
    """The step named by checkpoints/latest (no verification: see newest_verified), or None."""
    try:
        name = (ckpt_dir / LATEST).read_text().strip()
    except OSError:
        return None
    return step_of(name)


if __name__ == "__main__":  # python -m hpctrain.kernel.checkpoint verify DIR
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "verify":
        _, problem = verify(Path(sys.argv[2]))
        print(problem or "ok")
        sys.exit(1 if problem else 0)
    print("usage: python -m hpctrain.kernel.checkpoint verify CKPT", file=sys.stderr)
    sys.exit(2)
