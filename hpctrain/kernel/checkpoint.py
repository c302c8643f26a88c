"""The checkpoint folder format, without torch: what train_entry writes and the CLI reads.

  checkpoints/step-<8 digits>/   one checkpoint; it counts only once MANIFEST.json is in it
  checkpoints/.staging-step-<N>/ a save in progress (a crash leaves at most this)
  checkpoints/latest             text: the folder name of the newest committed checkpoint
  MANIFEST.json                  written last: every file with size and digest, format, world size,
                                 strategy, step, torch version

A checkpoint verifies when every file the manifest lists has its size and checksum. A truncated or
corrupted one is reported and skipped, never deleted. A resume splits the check (issue 37): rank 0
(and `hpctrain resume` on the login node) `check_manifest` (names, sizes; no file read), each rank
then the digests of the files it reads. This module owns the names, the verification
and the commit sequence (`write_manifest`, `publish`, `prune`), which train_entry's Checkpointer
and the runtime API (hpctrain/runtime/) both call; the writers own what goes into staging. A digest
is no signature: `not_private` says whether another account could have written a checkpoint, for
the formats only a full unpickler reads (train_entry/checkpoint/safeload.py).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import stat
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

from hpctrain.kernel.digests import DIGESTS as DIGESTS  # the format's API, from its digests
from hpctrain.kernel.digests import XXH3 as XXH3
from hpctrain.kernel.digests import algo_of, digest_file
from hpctrain.kernel.digests import sha256_file as sha256_file
from hpctrain.kernel.digests import verify_files as verify_files
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
# The files of one checkpoint (docs/checkpoint-resume.md); W ranks' DCP save is W + 4 files:
METADATA = ".metadata"  # DCP's (rank 0)
TRAIN_STATE = "train_state.json"  # rank 0: step, data position, scheduler, ...
CONFIG = "config.json"  # rank 0: the frozen TrainConfig
RNG = "rng"  # a weights file's manifest entry: where its rank's generators lie in it


def raw_name(rank: int) -> str:
    """Rank `rank`'s weights file (DCP's prefix `__<rank>_`, hpctrain's raw format); its tail
    holds the rank's generators (the entry's RNG)."""
    return f"__{rank}_0.raw"


def old_rng_name(rank: int) -> str:
    """Before issue 37 (and an engine's save, which writes no raw file): one RNG file per rank."""
    return f"rng/rank-{rank:05d}.json"


_RANK_FILE = re.compile(r"^(?:__(\d+)_0\.raw|rng/rank-(\d+)\.json)$")


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def staging_name(step: int) -> str:
    return STAGING_PREFIX + step_name(step)


def step_of(name: str) -> int | None:
    """The step of a folder name `step-<8 digits>` (also with the staging prefix), else None."""
    m = STEP_RE.match(name.removeprefix(STAGING_PREFIX))
    return int(m.group(1)) if m else None


def list_files(folder: Path) -> list[str]:
    """Every regular file under `folder` (relative POSIX paths, sorted), the manifest excluded."""
    out = []
    for root, _, files in os.walk(folder):
        for name in files:
            rel = (Path(root) / name).relative_to(folder).as_posix()
            if rel != MANIFEST:
                out.append(rel)
    return sorted(out)


def check_manifest(folder: Path) -> tuple[dict[str, object] | None, str | None]:
    """(manifest, None) when the manifest parses, has a step, and every file it lists is a
    regular file inside `folder` of its listed size, else (None, why). Reads the manifest and
    lstats the files, never their bytes: what the login node (`hpctrain resume`) and rank 0 check
    before the ranks each verify the digests of the files they read (`verify_files`). A manifest
    naming /dev/zero, ../x or a symlink out is refused, never followed."""
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
            or not algo_of(entry)
        ):
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
        if st.st_size != entry["size"]:
            return (
                None,
                f"{rel} is {st.st_size} bytes, the manifest says {entry['size']} (truncated?)",
            )
    step = manifest.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return None, f"{MANIFEST} has no step (a step number is what a resume starts from)"
    return manifest, None


def verify(folder: Path) -> tuple[dict[str, object] | None, str | None]:
    """(manifest, None) when every file the manifest lists has its size and checksum, else
    (None, why): `check_manifest` and every digest, by one process (`python -m
    train_entry.checkpoint verify`, export, tests). A resume splits the digests across its ranks
    instead (train_entry/checkpoint/load.py)."""
    manifest, why = check_manifest(folder)
    if manifest is None:
        return None, why
    files = manifest["files"]
    assert isinstance(files, dict)
    why = verify_files(folder, manifest, sorted(files))
    return (None, why) if why else (manifest, None)


def read_verified(folder: Path, manifest: Mapping[str, object], rel: str) -> bytes:
    """A small listed file's bytes, read once and checked against its digest in memory (nothing
    unverified is parsed, and no second read can see other bytes); ValueError why not."""
    files = manifest["files"]
    entry = files.get(rel) if isinstance(files, dict) else None
    if not isinstance(entry, dict):
        raise ValueError(f"{rel} is not listed in {MANIFEST}")
    return _checked(folder / rel, 0, entry, rel)


def _checked(path: Path, offset: int, entry: Mapping[str, object], what: str) -> bytes:
    size, algo = entry.get("size"), algo_of(entry)
    if not isinstance(size, int) or algo is None:
        raise ValueError(f"{MANIFEST}: the entry of {what!r} has no size and digest")
    try:
        with open(path, "rb", buffering=0) as f:
            f.seek(offset)
            blob = f.read(size)
    except OSError as exc:
        raise ValueError(f"{what} cannot be read: {exc}") from None
    if len(blob) != size:
        raise ValueError(f"{what} is shorter than the manifest says (truncated?)")
    try:
        digest = digest_file(path, algo, blob)
    except ImportError:
        raise ValueError(f"{what} has an {algo} checksum: install xxhash to verify it") from None
    if digest != entry[algo]:
        raise ValueError(f"{what} does not match its {algo} checksum (corrupted)")
    return blob


def rng_blob(folder: Path, manifest: Mapping[str, object], rank: int) -> bytes | None:
    """Rank `rank`'s generators as saved (JSON bytes, verified), or None when the checkpoint has
    none for it (saved by fewer ranks). Since issue 37 they are the tail of the rank's weights
    file (its manifest entry's "rng": offset, size, sha256); older checkpoints have
    rng/rank-<R>.json (read still). ValueError when damaged."""
    files = manifest["files"]
    assert isinstance(files, dict)
    raw = files.get(raw_name(rank))
    if isinstance(raw, dict) and isinstance(raw.get(RNG), dict):
        tail = raw[RNG]
        offset = tail.get("offset")
        size = tail.get("size")
        if not (isinstance(offset, int) and isinstance(size, int) and 0 <= offset <= raw["size"]):
            raise ValueError(f"{MANIFEST}: the rng of {raw_name(rank)} has no offset")
        if not 0 <= size <= raw["size"] - offset:  # checked against the file by check_manifest
            raise ValueError(f"{MANIFEST}: the rng of {raw_name(rank)} lies past its end")
        return _checked(folder / raw_name(rank), offset, tail, f"{raw_name(rank)} (rng)")
    if old_rng_name(rank) in files:
        return read_verified(folder, manifest, old_rng_name(rank))
    return None


def rng_ranks(manifest: Mapping[str, object]) -> list[int]:
    """The ranks whose generators a checkpoint holds (either layout)."""
    files = manifest.get("files")
    found = set()
    for rel, entry in (files or {}).items() if isinstance(files, dict) else ():
        m = _RANK_FILE.match(rel)
        if m and (m.group(2) is not None or (isinstance(entry, dict) and RNG in entry)):
            found.add(int(m.group(1) or m.group(2)))
    return sorted(found)


def merge_entries(
    parts: Iterable[Mapping[str, Mapping[str, object]] | None],
) -> dict[str, Mapping[str, object]] | None:
    """Rank 0: every rank's {file: entry} in one dict, one pass (linear in the entries); None
    when a rank did not hash its files (an engine's: the commit reads them)."""
    out: dict[str, Mapping[str, object]] = {}
    for part in parts:
        if part is None:
            return None
        out.update(part)
    return out


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
    ckpt_dir: Path, warn: Callable[[str], None] | None = None, *, digests: bool = True
) -> tuple[Path, dict[str, object]] | None:
    """The newest checkpoint whose manifest verifies; every one skipped on the way is reported.
    `digests=False`: only `check_manifest` (no file's bytes read; the ranks check the digests)."""
    for _, folder in step_folders(ckpt_dir):
        manifest, why = verify(folder) if digests else check_manifest(folder)
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
