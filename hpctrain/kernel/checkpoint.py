"""The checkpoint folder format, without torch: what train_entry writes and the CLI reads.

  checkpoints/step-<8 digits>/   one checkpoint; it counts only once MANIFEST.json is in it
  checkpoints/.staging-step-<N>/ a save in progress (a crash leaves at most this)
  checkpoints/latest             text: the folder name of the newest committed checkpoint
  MANIFEST.json                  written last: every file with size and digest, format, world size,
                                 strategy, step, torch version

A checkpoint verifies when every file the manifest lists has its size and checksum. A truncated or
corrupted one is reported and skipped, never deleted. This module owns the names, the verification
and the commit sequence (`write_manifest`, `publish`, `prune`), which train_entry's Checkpointer
and the runtime API (hpctrain/runtime/) both call; the writers own what goes into staging. A digest
is no signature: `not_private` says whether another account could have written a checkpoint, for
the formats only a full unpickler reads (train_entry/checkpoint/safeload.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import shutil
import stat
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

from hpctrain.kernel.files import (  # noqa: F401  (the format's API)
    fsync_path,
    private_group,
    utc_now,
    write_atomic,
)

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


# A manifest entry names its digest: "sha256", or "xxh3_128" (the xxhash package; about 30x
# faster than sha256 here) for the weights files train_entry writes since issue 13. Both detect a
# truncated or corrupted file; neither is a signature (the manifest is not signed either).
DIGESTS = ("sha256", "xxh3_128")
XXH3 = "xxh3_128"


def sha256_file(path: Path) -> str:
    with open(path, "rb", buffering=0) as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def digest_file(path: Path, algo: str) -> str:
    """The hex digest of a file with one of DIGESTS."""
    if algo == "sha256":
        return sha256_file(path)
    import xxhash  # lazy: optional: without it, one line says install xxhash

    h = xxhash.xxh3_128()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def list_files(folder: Path) -> list[str]:
    """Every regular file under `folder` (relative POSIX paths, sorted), the manifest excluded."""
    out = []
    for root, _, files in os.walk(folder):
        for name in files:
            rel = (Path(root) / name).relative_to(folder).as_posix()
            if rel != MANIFEST:
                out.append(rel)
    return sorted(out)


def verify(folder: Path) -> tuple[dict[str, object] | None, str | None]:
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
        algo = next(
            (a for a in DIGESTS if isinstance(entry, dict) and isinstance(entry.get(a), str)), None
        )
        if not isinstance(entry, dict) or not isinstance(entry.get("size"), int) or algo is None:
            return None, f"{MANIFEST}: the entry of {rel!r} has no size and digest (sha256)"
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
        try:
            digest = digest_file(path, algo)
        except ImportError:
            return None, f"{rel} has an {algo} checksum: install xxhash to verify it"
        if digest != entry[algo]:
            return None, f"{rel} does not match its {algo} checksum (corrupted)"
    step = manifest.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return None, f"{MANIFEST} has no step (a step number is what a resume starts from)"
    return manifest, None


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def not_private(folder: Path, root: Path) -> str | None:
    """Why another account could have written a file under `folder` (every file in it, the folder
    and each folder up to `root`, the run folder), or None: each belongs to this user or root, is
    no symlink below `root`, and is writable by nobody else. For formats only the full unpickler
    reads (DeepSpeed's): their content runs as code when loaded."""
    uid = os.geteuid()
    folder, root = Path(os.path.abspath(folder)), Path(os.path.abspath(root))
    chain = [folder, *(p for p in folder.parents if p.is_relative_to(root))]
    if root not in chain:
        return f"{folder} is not inside the run folder {root}"
    try:
        files = [Path(r) / n for r, dirs, names in os.walk(folder) for n in dirs + names]
        for path in [*files, *chain]:
            st = path.stat() if path == root else path.lstat()
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                return f"{path} is a symlink (it may lead to a file of another account)"
            if st.st_uid not in (uid, 0):
                return f"{path} belongs to {_owner(st.st_uid)}, not to you"
            if mode & 0o002 or (mode & 0o020 and not private_group(st.st_gid, uid)):
                return f"{path} is writable by other accounts (mode {mode:04o})"
    except OSError as exc:
        return f"{exc.filename or folder} cannot be checked ({exc.strerror})"
    return None


def step_folders(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every step-<N> folder, newest first."""
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := STEP_RE.match(p.name))]
    return sorted(found, reverse=True)


def newest_verified(
    ckpt_dir: Path, warn: Callable[[str], None] | None = None
) -> tuple[Path, dict[str, object]] | None:
    """The newest checkpoint whose manifest verifies; every one skipped on the way is reported."""
    for _, folder in step_folders(ckpt_dir):
        manifest, why = verify(folder)
        if manifest is not None:
            return folder, manifest
        if warn:
            warn(f"checkpoint {folder} skipped: {why}; it is left in place")
    return None


# ---------------------------------------------------------------- the commit sequence
def latest_tmp(ckpt_dir: Path) -> Path:
    """The temporary `latest` a commit writes before `publish` renames it over `latest`."""
    return ckpt_dir / f".{LATEST}.tmp-{os.getpid()}"


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_manifest(
    staging: Path,
    final: Path,
    fields: Mapping[str, object],
    files: Mapping[str, Mapping[str, object]] | None = None,
    *,
    pool: Executor | None = None,
) -> None:
    """The first half of a commit: the manifest (`fields` plus every file with its size and
    sha256) into the staging folder. `files` holds the entries the writers took from memory
    (an entry with "unsynced": True still needs its fsync); any other file there is read, hashed
    and fsynced here. The manifest, those files, the folders and a new `latest` temp file are
    fsynced in parallel (one fsync each). Nothing counts the folder before `publish`."""
    entries = {rel: dict(e) for rel, e in (files or {}).items()}
    unsynced = [r for r, e in entries.items() if e.pop("unsynced", False)]
    rels = list_files(staging)
    extra = [r for r in rels if r not in entries]
    missing = sorted(set(entries) - set(rels))
    if missing:
        raise OSError(f"{staging}: {missing[0]} was written but is not there")

    def synced_entry(rel: str) -> dict[str, object]:
        path = staging / rel
        fsync_path(path)
        return {"size": path.stat().st_size, "sha256": sha256_file(path)}

    own = pool is None
    ex: Executor = pool if pool is not None else ThreadPoolExecutor(8, "hpctrain-commit")
    try:
        entries.update(zip(extra, ex.map(synced_entry, extra), strict=True))
        manifest = {"format": FORMAT, **fields, "files": dict(sorted(entries.items()))}
        blob = json.dumps(manifest, indent=1, sort_keys=True).encode()
        fd = os.open(staging / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, blob)
            dirs = {staging / Path(r).parent for r in rels} | {staging}
            tmp = latest_tmp(final.parent)
            jobs = [
                ex.submit(os.fsync, fd),
                *(ex.submit(fsync_path, d) for d in dirs),
                *(ex.submit(fsync_path, staging / r) for r in unsynced),
                ex.submit(_write_synced, tmp, (final.name + "\n").encode()),
            ]
            for j in jobs:
                j.result()
        finally:
            os.close(fd)
    finally:
        if own:
            ex.shutdown()


def publish(staging: Path, final: Path) -> None:
    """The second half, once every file of the folder is durable: rename it to step-N, replace
    `latest`, one fsync of the checkpoints folder (it makes both renames durable; journaling
    filesystems keep their order, and a resume goes by the newest verified step-N, never by
    `latest`)."""
    ckpt_dir = final.parent
    os.rename(staging, final)
    os.replace(latest_tmp(ckpt_dir), ckpt_dir / LATEST)
    fsync_path(ckpt_dir)  # the checkpoint (and then `latest`) is durable from here


def prune(
    ckpt_dir: Path,
    newest: int,
    keep: int,
    *,
    log: Callable[[str], None] = lambda m: None,
    delete: Callable[[list[Path]], None] | None = None,
) -> None:
    """After step `newest` was published: drop stale staging folders older than it and the step
    folders beyond the newest `keep`. Each doomed step folder first leaves the step-N namespace
    (one atomic rename to .pruning-step-N), then is deleted by `delete` (default: now): a kill in
    the middle of a delete never leaves a half-deleted folder named like a checkpoint, and the
    next prune finishes it."""
    for staging in ckpt_dir.glob(STAGING_PREFIX + "step-*"):
        # Left by a save that was killed; older than a committed checkpoint, it can never be
        # completed (only the process that wrote it renames it). Not a checkpoint: no manifest.
        old = step_of(staging.name)
        if old is not None and old < newest and not (staging / MANIFEST).exists():
            log(f"removing {staging.name}: an older save that never finished")
            shutil.rmtree(staging, ignore_errors=True)
    doomed = list(ckpt_dir.glob(".pruning-step-*"))  # a prune killed half way: finish it
    kept = 0
    for step, folder in step_folders(ckpt_dir):
        if step > newest or not (folder / MANIFEST).exists():
            continue
        kept += 1
        if kept > keep:
            doomed.append(folder.with_name(f".pruning-{folder.name}"))
            os.rename(folder, doomed[-1])
    if doomed:
        (delete or _delete)(doomed)


def _delete(folders: list[Path]) -> None:
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":  # python -m hpctrain.kernel.checkpoint verify DIR
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "verify":
        _, problem = verify(Path(sys.argv[2]))
        print(problem or "ok")
        sys.exit(1 if problem else 0)
    print("usage: python -m hpctrain.kernel.checkpoint verify CKPT", file=sys.stderr)
    sys.exit(2)
