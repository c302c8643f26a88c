"""In-memory snapshots: the node-local store (no torch here; the ranks' exchange is
hpctrain/runtime/recovery.py, which train_entry and the runtime API share).

A snapshot is one rank's training state at one step, as bytes, in node-local memory:

    <base>/hpctrain-<uid>/<run>-<hash>/<job>-<restart>/<node>/rank-<R>/step-<8 digits>.bin
                                                                        .../step-<8 digits>.json

The .json ({"step", "rank", "world", "size", "digest", "time"}) is renamed into place after the .bin,
so a .bin without its .json is no snapshot. A node folder holds its own ranks' snapshots and the
copies its partners sent (docs/recovery.md). `<base>` is jobenv.SNAPSHOT_DIR, else /dev/shm,
else the temp folder. One job start has its own folder (`<restart>`: Slurm's requeue count), and
only an in-job restart reads it: a disk checkpoint stays the durable record.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path

from hpctrain.kernel import jobenv

KEEP = 2  # per rank: the newest, and the one before it while a newer one may be half taken
# The memory plan, one source for the first snapshot's check (train_entry) and for `hpctrain plan`
# and `submit --dry-run` (hpctrain/plan/snapshots.py):
MEMORY_SHARE = 0.5  # snapshots may plan at most this share of the node folder's free memory
SHM_SHARE = 0.5  # /dev/shm is a tmpfs of half the node's RAM unless the site sizes it otherwise
BUDGET = 0.02  # snapshot.every_steps auto: at most this share of a step's time
_STEP = re.compile(r"^step-(\d{8})\.json$")


def node_bytes(rank_bytes: int, *, ranks_per_node: int, partner: bool) -> int:
    """Node-local memory snapshots take on one node: KEEP steps of each of its ranks' state, and
    when the run spans more than one node, the newest step also sent to the partner (one more
    when the partner's copy goes less often) and KEEP of the copies its partners send."""
    return (2 * KEEP + 1 if partner else KEEP) * rank_bytes * ranks_per_node


def base() -> Path:
    given = jobenv.get(jobenv.SNAPSHOT_DIR)
    if given:
        return Path(given)
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def node_name() -> str:
    """This node under Slurm (SLURMD_NODENAME, stable across steps); a simulated node of the local
    executor is its host plus its node index."""
    name = os.environ.get("SLURMD_NODENAME")
    if name:
        return name
    return f"{socket.gethostname()}.{jobenv.get(jobenv.NODEID, '0')}"


def run_folder(run_dir: str | os.PathLike[str]) -> Path:
    """Every job start of one run (`<hash>`: of its absolute path, two runs may share a name)."""
    path = Path(run_dir).absolute()
    name = re.sub(r"[^A-Za-z0-9._-]", "_", path.name)[:80]
    tag = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    return base() / f"hpctrain-{os.getuid()}" / f"{name}-{tag}"


def job_folder(run_dir: str | os.PathLike[str]) -> Path:
    job = re.sub(r"[^A-Za-z0-9._-]", "_", jobenv.get(jobenv.JOB_ID) or "none")
    start = re.sub(r"[^0-9]", "", jobenv.get(jobenv.RESTART_COUNT) or "0") or "0"
    return run_folder(run_dir) / f"{job}-{start}"


def node_folder(run_dir: str | os.PathLike[str]) -> Path:
    return job_folder(run_dir) / node_name()


def checksum(data: bytes | memoryview) -> int:
    """xxh3_64: a snapshot guards against a torn or lost write or a damaged copy in this user's own
    memory, not an attacker, and the check is paid at every snapshot (5 MiB: 0.3 ms, against 1.8
    for zlib's crc32 and 6 for sha256 here)."""
    import xxhash  # lazy: a core dependency, but only the ranks that snapshot need it

    return int(xxhash.xxh3_64_intdigest(data))


def write(
    folder: Path,
    rank: int,
    step: int,
    data: bytes | memoryview,
    world: int,
    digest: int | None = None,
    anchor: bool = False,
) -> dict[str, object]:
    """Store rank `rank`'s snapshot of `step` under `folder` (a node folder); older ones pruned.
    `digest`: the checksum its sender computed (a partner's copy), else computed here. `anchor`:
    this step's copy went to the partner too; the newest anchor is kept past KEEP (with the
    partners' copies, it is the step a lost node's ranks can restore)."""
    where = folder / f"rank-{rank}"
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    name = f"step-{step:08d}"
    meta: dict[str, object] = {
        "step": step,
        "rank": rank,
        "world": world,
        "size": len(data),
        "digest": checksum(data) if digest is None else digest,
        "time": time.time(),
        "anchor": anchor,
    }
    tmp = where / f".{name}.bin.{os.getpid()}"
    _recycle(where, tmp)
    with open(tmp, "r+b" if tmp.exists() else "wb") as f:
        f.write(data)
        f.truncate()
    os.replace(tmp, where / f"{name}.bin")
    tmp_meta = where / f".{name}.json.{os.getpid()}"
    tmp_meta.write_text(json.dumps(meta))
    os.replace(tmp_meta, where / f"{name}.json")
    prune(where)
    return meta


def _spent(where: Path, keep: int) -> list[int]:
    """The steps past the `keep` newest, the newest anchor left out."""
    steps = sorted(_steps(where))
    anchors = [s for s in steps if _meta(where, s).get("anchor")]
    return [s for s in steps[: len(steps) - keep] if not anchors or s != anchors[-1]]


def _meta(where: Path, step: int) -> dict[str, object]:
    try:
        meta = json.loads((where / f"step-{step:08d}.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _recycle(where: Path, tmp: Path) -> None:
    """The oldest spent snapshot's file becomes `tmp` (it would be pruned next): writing over its
    pages costs a copy, a fresh tmpfs file also the pages' allocation (2.5 ms against 0.7 per
    5 MiB here). Its .json goes first, so it is never listed half written."""
    spent = _spent(where, KEEP - 1)
    if not spent:
        return
    old = where / f"step-{spent[0]:08d}"
    with contextlib.suppress(OSError):
        old.with_suffix(".json").unlink()
        old.with_suffix(".bin").rename(tmp)


def prune(where: Path, keep: int = KEEP) -> None:
    for step in _spent(where, keep):
        for suffix in (".json", ".bin"):  # the .json first: never a .json without its data
            with contextlib.suppress(OSError):
                (where / f"step-{step:08d}{suffix}").unlink()


def _steps(where: Path) -> list[int]:
    try:
        return [int(m.group(1)) for p in where.iterdir() if (m := _STEP.match(p.name))]
    except OSError:
        return []


def listing(folder: Path) -> dict[int, dict[int, dict[str, object]]]:
    """rank -> step -> meta of every snapshot a node folder holds whose data is all there."""
    out: dict[int, dict[int, dict[str, object]]] = {}
    try:
        ranks = [p for p in folder.iterdir() if p.name.startswith("rank-")]
    except OSError:
        return out
    for where in ranks:
        with contextlib.suppress(ValueError):
            rank = int(where.name.removeprefix("rank-"))
            for step in _steps(where):
                try:
                    meta = json.loads((where / f"step-{step:08d}.json").read_text())
                    size = (where / f"step-{step:08d}.bin").stat().st_size
                except (OSError, ValueError):
                    continue
                if isinstance(meta, dict) and meta.get("size") == size:
                    out.setdefault(rank, {})[step] = meta
    return out


def read(folder: Path, rank: int, step: int, meta: dict[str, object]) -> bytes | None:
    """The data of a listed snapshot, or None when it no longer checks out."""
    try:
        data = (folder / f"rank-{rank}" / f"step-{step:08d}.bin").read_bytes()
    except OSError:
        return None
    return data if valid(data, meta) else None


def valid(data: bytes | memoryview, meta: dict[str, object]) -> bool:
    return len(data) == meta.get("size") and checksum(data) == meta.get("digest")


def free_bytes(folder: Path) -> int:
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return 0


def clean(run_dir: str | os.PathLike[str]) -> None:
    """This node's snapshots of this job start (at the run's end: its disk checkpoint is saved)."""
    folder = node_folder(run_dir)
    shutil.rmtree(folder, ignore_errors=True)
    for empty in (folder.parent, folder.parent.parent):  # once every node's is gone
        with contextlib.suppress(OSError):
            empty.rmdir()


def clean_stale(run_dir: str | os.PathLike[str]) -> list[Path]:
    """This node's snapshots of the run's earlier job starts (a failed or killed job leaves its
    own; the next start of the run on this node removes them: at most one stale set per run)."""
    here, gone = job_folder(run_dir), list[Path]()
    try:
        starts = [p for p in run_folder(run_dir).iterdir() if p != here]
    except OSError:
        return gone
    for start in starts:
        stale = start / node_name()
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
            gone.append(stale)
        with contextlib.suppress(OSError):
            start.rmdir()
    return gone
