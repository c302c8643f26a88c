"""In-memory snapshots: the node-local store (no torch here; the ranks' exchange is
hpctrain/runtime/recovery.py, which train_entry and the runtime API share).

A snapshot is one rank's training state at one step, as bytes, in node-local memory:

    <base>/hpctrain-<uid>/<run>-<hash>/<job>-<restart>/<node>/rank-<R>/step-<8 digits>.bin
                                                                        .../step-<8 digits>.json

The .json ({"step", "rank", "world", "size", "digest", "mac", "time", "anchor"}) is renamed into
place after the .bin, so a .bin without its .json is no snapshot. A node folder holds its own
ranks' snapshots and the copies its partners sent (docs/recovery.md). `<base>` is
jobenv.SNAPSHOT_DIR, else /dev/shm, else the temp folder. One job start has its own folder
(`<restart>`: Slurm's requeue count), and only an in-job restart reads it: a disk checkpoint stays
the durable record.

Another account on the node must neither read nor plant a snapshot (docs/security.md): every
folder from `hpctrain-<uid>` down is made one level at a time, mode 0700, and checked with lstat
(ours, a folder, not a link); files are opened with O_NOFOLLOW. The digest is xxh3 seeded with the
job key (kernel/jobkey.py) and the header (step, rank, world, size, digest, run and job start) is
signed with it: a snapshot whose signature, name or inside disagree is no snapshot.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hpctrain.kernel import jobenv, jobkey

KEEP = 2  # per rank: the newest, and the one before it while a newer one may be half taken
# The memory plan, one source for the first snapshot's check (train_entry) and for `hpctrain plan`
# and `submit --dry-run` (hpctrain/plan/snapshots.py):
MEMORY_SHARE = 0.5  # snapshots may plan at most this share of the node folder's free memory
SHM_SHARE = 0.5  # /dev/shm is a tmpfs of half the node's RAM unless the site sizes it otherwise
BUDGET = 0.02  # snapshot.every_steps auto: at most this share of a step's time
OWN_SHARE = 0.75  # auto on a CPU node: the share of the budget the node's own copy may take
_STEP = re.compile(r"^step-(\d{8})\.json$")
_META_MAX = 1 << 16
_SIGNED = ("step", "rank", "world", "size", "digest")
Held = dict[int, dict[int, dict[str, object]]]  # rank -> step -> header: a node's listing
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # a FIFO planted as a file never blocks


class Unsafe(OSError):
    """A snapshot folder or file another account could have made or changed, or no job key."""


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
    executor is its host plus its node index (uname's: socket.gethostname()'s answer, without
    importing socket in `submit --dry-run`, which reads the memory plan above)."""
    name = (
        os.environ.get("SLURMD_NODENAME")
        or f"{os.uname().nodename}.{jobenv.get(jobenv.NODEID, '0')}"
    )
    return re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "node"


def run_folder(run_dir: str | os.PathLike[str]) -> Path:
    """Every job start of one run (`<hash>`: of its absolute path, two runs may share a name)."""
    path = Path(run_dir).absolute()
    name = re.sub(r"[^A-Za-z0-9._-]", "_", path.name)[:80].lstrip(".")
    tag = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    return base() / f"hpctrain-{os.getuid()}" / f"{name}-{tag}"


def job_folder(run_dir: str | os.PathLike[str]) -> Path:
    job = re.sub(r"[^A-Za-z0-9._-]", "_", jobenv.get(jobenv.JOB_ID) or "none").lstrip(".")
    start = re.sub(r"[^0-9]", "", jobenv.get(jobenv.RESTART_COUNT) or "0") or "0"
    return run_folder(run_dir) / f"{job}-{start}"


def node_folder(run_dir: str | os.PathLike[str]) -> Path:
    return job_folder(run_dir) / node_name()


# ---------------------------------------------------------------- private folders
def private(folder: Path, make: bool = True) -> Path:
    """`folder` (under `<base>/hpctrain-<uid>`) made (`make`) and checked level by level: every
    level ours, a folder, not a link, mode 0700 (one of ours with another mode is set to 0700).
    The base must be root's or ours and, when others may write in it, sticky (nobody else can
    then rename our entry). Unsafe, with the reason, when a check fails."""
    top = f"hpctrain-{os.getuid()}"
    if top not in folder.parts:
        raise Unsafe(f"{folder} is not under a {top} folder")
    at = len(folder.parts) - folder.parts[::-1].index(top) - 1
    root = Path(*folder.parts[:at])
    try:
        st = root.stat()
    except FileNotFoundError:
        if not make:
            raise
        root.mkdir(parents=True, mode=0o700, exist_ok=True)
        st = root.stat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, os.getuid()):
        raise Unsafe(f"{root} is not a folder of root or of this account (uid {st.st_uid})")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise Unsafe(f"{root} is writable by others and not sticky (chmod +t or go-w)")
    level = root
    for part in folder.parts[at:]:
        level = level / part
        if stat.S_IMODE(_own(level, stat.S_ISDIR, make).st_mode) != 0o700:
            os.chmod(level, 0o700)  # ours, not a link (checked): an older version made it 0755
    return folder


def _own(path: Path, kind: Callable[[int], bool], make: bool = False) -> os.stat_result:
    """lstat of `path`: ours and of `kind` (stat.S_ISDIR, S_ISREG), else Unsafe. `make`: a folder
    made (0700) when there is none."""
    try:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            if not make:
                raise
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
            st = os.lstat(path)
    except OSError as e:
        raise Unsafe(f"{path}: {e.strerror}") from None
    if not kind(st.st_mode):
        raise Unsafe(f"{path} is a link or of another kind (mode {st.st_mode:o})")
    if st.st_uid != os.getuid():
        raise Unsafe(f"{path} belongs to uid {st.st_uid}, not to this account ({os.getuid()})")
    return st


def _read(path: Path, limit: int | None = None) -> bytes:
    """A regular file of ours, not through a link; Unsafe or OSError otherwise."""
    fd = os.open(path, _READ)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            raise Unsafe(f"{path} is not a file of this account")
        if limit is not None and st.st_size > limit:
            raise Unsafe(f"{path}: {st.st_size} bytes")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


# ---------------------------------------------------------------- keyed digest and signature
def _key() -> bytes:
    key = jobkey.key()
    if key is None:
        raise Unsafe(f"no job key ({jobenv.JOB_KEY}): a script hpctrain did not start")
    return key


def checksum(data: bytes | memoryview, key: bytes | None = None) -> int:
    """xxh3_64 seeded with the job key: a check paid at every snapshot (5 MiB: 0.3 ms, against 1.8
    for zlib's crc32 and 6 for sha256 here); what an attacker lacks is the signature over it."""
    import xxhash  # lazy: a core dependency, but only the ranks that snapshot need it

    seed = jobkey.seed(key or _key(), b"snapshot")
    return int(xxhash.xxh3_64_intdigest(data, seed=seed))


def _ident(folder: Path) -> bytes:
    """The run and job start a node folder belongs to (a partner's copy: the same)."""
    return f"{folder.parent.parent.name}/{folder.parent.name}".encode()


def signed(meta: object, folder: Path, rank: int, step: int) -> bool:
    """`meta` is the header of rank `rank`'s snapshot of `step`, signed with this job's key."""
    key = jobkey.key()
    if key is None or not isinstance(meta, dict) or not isinstance(meta.get("mac"), str):
        return False
    if any(type(meta.get(k)) is not int for k in _SIGNED):
        return False
    if (meta["step"], meta["rank"]) != (step, rank):
        return False
    with contextlib.suppress(ValueError):
        return jobkey.verify(key, bytes.fromhex(str(meta["mac"])), *_parts(folder, meta))
    return False


def _parts(folder: Path, meta: dict[str, object]) -> list[bytes]:
    return [b"hpctrain-snapshot-1", _ident(folder), *(str(meta[k]).encode() for k in _SIGNED)]


def valid(data: bytes | memoryview, meta: object, folder: Path, rank: int, step: int) -> bool:
    """`data` is rank `rank`'s snapshot of `step` whole: its signed header and keyed digest."""
    return (
        signed(meta, folder, rank, step)
        and isinstance(meta, dict)
        and len(data) == meta["size"]
        and checksum(data) == meta["digest"]
    )


def header(
    folder: Path, *, rank: int, step: int, world: int, size: int, digest: int
) -> dict[str, object]:
    """The signed header of a snapshot (its "mac": hex), as the .json and the partner hold it."""
    meta: dict[str, object] = dict(step=step, rank=rank, world=world, size=size, digest=digest)
    return meta | {"mac": jobkey.sign(_key(), *_parts(folder, meta)).hex()}


def ready(folder: Path) -> str | None:
    """Why snapshots cannot go in `folder` (no job key, a level another account made or could
    change), else None; `folder` made."""
    try:
        _key()
        private(folder)
    except OSError as e:
        return str(e)
    return None


# ---------------------------------------------------------------- the store
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
    `digest`: the keyed checksum its sender computed (a partner's copy the caller verified), else
    computed here. `anchor`: this step's copy went to the partner too; the newest anchor is kept
    past KEEP (with the partners' copies, it is the step a lost node's ranks can restore)."""
    where = private(folder / f"rank-{rank}")
    name = f"step-{step:08d}"
    digest = checksum(data) if digest is None else digest
    meta = header(folder, rank=rank, step=step, world=world, size=len(data), digest=digest)
    meta |= {"time": time.time(), "anchor": anchor}
    tmp = where / f".{name}.bin.{os.getpid()}"
    _recycle(where, tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    with open(fd, "wb") as f:
        f.write(data)
        f.truncate()
    os.replace(tmp, where / f"{name}.bin")
    tmp_meta = where / f".{name}.json.{os.getpid()}"
    fd = os.open(tmp_meta, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with open(fd, "w") as f:
        f.write(json.dumps(meta))
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
        meta = json.loads(_read(where / f"step-{step:08d}.json", _META_MAX))
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


def listing(folder: Path) -> Held:
    """rank -> step -> meta of every snapshot a node folder holds whose data is all there and
    whose header is signed with this job's key for that rank and step."""
    out: Held = {}
    try:
        private(folder, make=False)
        ranks = [p for p in folder.iterdir() if re.fullmatch(r"rank-\d{1,7}", p.name)]
    except OSError:
        return out
    for where in ranks:
        rank = int(where.name.removeprefix("rank-"))
        with contextlib.suppress(OSError):
            _own(where, stat.S_ISDIR)
            for step in _steps(where):
                meta = _meta(where, step)
                with contextlib.suppress(OSError):
                    size = _own(where / f"step-{step:08d}.bin", stat.S_ISREG).st_size
                    if signed(meta, folder, rank, step) and meta["size"] == size:
                        out.setdefault(rank, {})[step] = meta
    return out


def read(folder: Path, rank: int, step: int, meta: dict[str, object]) -> bytes | None:
    """The data of a listed snapshot, or None when it no longer checks out."""
    try:
        _own(folder / f"rank-{rank}", stat.S_ISDIR)  # O_NOFOLLOW covers the file's name only
        data = _read(folder / f"rank-{rank}" / f"step-{step:08d}.bin")
    except OSError:
        return None
    return data if valid(data, meta, folder, rank, step) else None


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
    with contextlib.suppress(OSError):
        private(folder.parent, make=False)  # never into a folder another account made
        shutil.rmtree(folder, ignore_errors=True)
        for empty in (folder.parent, folder.parent.parent):  # once every node's is gone
            empty.rmdir()


def clean_stale(run_dir: str | os.PathLike[str]) -> list[Path]:
    """This node's snapshots of the run's earlier job starts (a failed or killed job leaves its
    own; the next start of the run on this node removes them: at most one stale set per run)."""
    here, gone = job_folder(run_dir), list[Path]()
    try:
        starts = [p for p in private(run_folder(run_dir)).iterdir() if p != here]
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


# ---------------------------------------------------------------- what the ranks hold
def dump(node: str, held: Held) -> bytes:
    """A rank's (node, listing) for the all-gather: JSON (another rank reads it: no pickle)."""
    return json.dumps(
        [node, {str(r): {str(s): m for s, m in v.items()} for r, v in held.items()}]
    ).encode()


def load(raw: bytes, folder: Path) -> tuple[str, Held]:
    """A (node, listing) another rank sent: only headers signed for their rank and step."""
    try:
        node, sent = json.loads(raw)
        ranks = [(int(r), [(int(s), m) for s, m in v.items()]) for r, v in sent.items()]
    except (ValueError, TypeError, AttributeError):
        return "?", {}
    out: Held = {}
    for rank, steps in ranks:
        for step, meta in steps:
            if signed(meta, folder, rank, step):
                out.setdefault(rank, {})[step] = meta
    return str(node), out


def choose(
    held: list[tuple[str, Held]], world: int, newer_than: int
) -> tuple[int | None, dict[int, tuple[int, dict[str, object]]]]:
    """From every rank's (node, listing): the newest step newer than `newer_than` whose snapshot
    of every rank 0..world-1 some node holds, and per rank the holder to read it from (a rank on
    the rank's own node when there is one, else the lowest rank of a node with a copy)."""
    first: dict[str, int] = {}  # node -> its lowest rank: one reader per node
    for rank, (node, _) in enumerate(held):
        first.setdefault(node, rank)
    copies: dict[tuple[int, int], list[tuple[int, dict[str, object]]]] = {}
    for holder in first.values():
        for rank, steps in held[holder][1].items():
            for step, meta in steps.items():
                if meta.get("world") == world and 0 <= rank < world:
                    copies.setdefault((rank, step), []).append((holder, meta))
    for step in sorted({step for _, step in copies}, reverse=True):
        if step <= newer_than:
            break
        per = [copies.get((rank, step), []) for rank in range(world)]
        if not all(per):
            continue
        source = {}
        for rank, found in enumerate(per):
            digests = {meta.get("digest") for _, meta in found}
            if len(digests) != 1:  # two copies that differ: neither can be trusted
                break
            own = first.get(held[rank][0]) if rank < len(held) else None
            source[rank] = next((f for f in found if f[0] == own), found[0])
        else:
            return step, source
    return None, {}


def intervals(own: float, partner: float, budget: float) -> tuple[int, int | None]:
    """(every, partner_every) for snapshots whose own copy costs `own` seconds and the partner's
    `partner` (0: not counted, both go together), within `budget` seconds per step: the own copy
    as often as OWN_SHARE of the budget allows, the partner's at a multiple of that interval
    within the rest (at least 1 - OWN_SHARE of it)."""
    if not partner:
        return max(1, math.ceil(own / budget)), None
    every = max(1, math.ceil(own / (OWN_SHARE * budget)))
    rest = max(budget - own / every, (1 - OWN_SHARE) * budget)
    return every, every * max(1, math.ceil(partner / rest / every))
