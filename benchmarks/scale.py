"""7. Scale in simulation: rank 0's checkpoint commit and the verification at 4,096 ranks, and
`hpctrain runs` / `hpctrain status` over 1,000 run folders, each against a stated budget.

Checkpoint: a staging folder laid out as a 4,096-rank save leaves it (one `__<r>_0.raw` data file
and one `rng/rank-<r>.json` per rank, DCP's `.metadata`, `train_state.json`, `config.json`), with
each rank's (size, sha256) as the ranks report them (computed while writing, before the clock).
Timed: `train_entry.checkpoint.commit.commit` (list the files, manifest of 8,195 entries written
and fsynced with every folder in parallel, rename, `latest`, prune) and `verify` of the committed
folder (stat and sha256 of every file, what a resume does). Budgets: commit < 2 s, verify < 5 s
for 4,096 x 16 KiB (64 MiB) on 2 shared cores. Not simulated: the gather of the 4,096 entries to
rank 0 (gloo/NCCL gather_object of about 1 MB) and real shard sizes, where verification is bound by
read bandwidth (the paper figure is in the details).

Runs: one real local run (`hpctrain submit --profile local --wait`, 2 steps) copied into 1,000
run folders; timed: `hpctrain runs` and `hpctrain status` (every run) as fresh processes. The
figure is the child's CPU seconds (user + sys), which a shared machine's load does not inflate as
it does wall time; the wall time is in the details. Budget: < 2 s each.
"""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import time
from pathlib import Path

from benchmarks import common
from hpctrain.kernel import jobenv

RANKS, SHARD = 4096, 16 << 10
RUNS = 1000
HPCTRAIN = str(Path(common.PY).with_name("hpctrain"))


def synthetic_staging(
    root: Path, ranks: int, shard: int
) -> tuple[Path, dict[str, dict[str, object]]]:
    staging = root / "checkpoints" / ".staging-step-00000100"
    (staging / "rng").mkdir(parents=True)
    files: dict[str, dict[str, object]] = {}

    def put(rel: str, data: bytes) -> None:
        (staging / rel).write_bytes(data)
        files[rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    blob = os.urandom(shard)
    for r in range(ranks):
        put(f"__{r}_0.raw", blob[: shard - 8] + r.to_bytes(8, "little"))
        put(f"rng/rank-{r:05d}.json", f'{{"python": [3, {r}], "torch": "..."}}'.encode())
    put(".metadata", os.urandom(ranks * 64))
    put("train_state.json", b'{"step": 100}')
    put("config.json", b"{}")
    os.sync()  # the ranks fsynced their own files before reporting
    return staging, files


def checkpoint_rows(quick: bool) -> list[common.Row]:
    from hpctrain.kernel.checkpoint import verify
    from train_entry.checkpoint.commit import commit
    from train_entry.checkpoint.prune import Pruner
    from train_entry.checkpoint.steps import Target

    ranks = 1024 if quick else RANKS
    reps = 2 if quick else 3
    t_commit, t_verify, manifest_bytes = [], [], 0
    root = common.scratch("scale-ckpt-")
    staging, files = synthetic_staging(root, ranks, SHARD)
    pruner = Pruner(root / "checkpoints", keep=2, log=lambda m: None)
    final = root / "checkpoints" / "step-00000100"
    target = Target(step=100, staging=staging, final=final, rank=0, world=ranks)
    for _ in range(reps):
        t0 = time.perf_counter()
        files_now = {k: dict(v) for k, v in files.items()}
        commit(target, strategy="ddp", files=files_now, prune=pruner.prune)
        t_commit.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        manifest, why = verify(final)
        t_verify.append(time.perf_counter() - t0)
        if manifest is None:
            raise common.NotMeasured(f"the committed synthetic checkpoint does not verify: {why}")
        manifest_bytes = (final / "MANIFEST.json").stat().st_size
        (final / "MANIFEST.json").unlink()  # back to a staging folder for the next rep
        os.rename(final, staging)
    shutil.rmtree(root)
    n_files = 2 * ranks + 3
    paper = (
        "at 4,096 ranks x 1 GiB shards verification reads 4 TiB: at 2 GB/s per reader that "
        "is ~35 min on one node, ~0.5 s if each of the 4,096 ranks verifies its own shard"
    )
    setup = {
        "ranks": ranks,
        "files": n_files,
        "shard_bytes": SHARD,
        "manifest_bytes": manifest_bytes,
        "reps": reps,
        "on_paper": paper,
    }
    return [
        common.settle(
            "scale_checkpoint_commit_4096_ranks_seconds",
            t_commit,
            "< 2.0",
            **setup,
            summary=f"rank 0's commit of a {ranks}-rank save ({n_files} files, manifest "
            f"{manifest_bytes / 1e6:.1f} MB): {common.median(t_commit):.3f} s",
        ),
        common.settle(
            "scale_checkpoint_verify_4096_ranks_seconds",
            t_verify,
            "< 5.0",
            **setup,
            summary=f"verify (stat + sha256 of {n_files} files, "
            f"{ranks * SHARD / 2**20:.0f} MiB): {common.median(t_verify):.3f} s; " + paper,
        ),
    ]


def cpu_and_wall(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    common.run(cmd, timeout=300, cwd=cwd, extra_env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def runs_rows(quick: bool) -> list[common.Row]:
    n = 200 if quick else RUNS
    reps = 3
    cwd = common.scratch("scale-runs-")
    env = {
        "XDG_CONFIG_HOME": str(cwd / "xdg"),
        "XDG_CACHE_HOME": str(cwd / "cache"),
        "XDG_STATE_HOME": str(cwd / "state"),
        jobenv.SITE_PATH: "",
    }
    common.run(
        [
            HPCTRAIN,
            "submit",
            "--profile",
            "local",
            "--nodes",
            "1",
            "--gpus",
            "1",
            "--name",
            "r0000",
            "--wait",
            "--",
            "--max-steps",
            "2",
            "--model.d_model=16",
            "--model.n_layers=1",
            "--model.n_heads=2",
        ],
        timeout=300,
        cwd=cwd,
        extra_env=env,
    )
    runs = cwd / "runs"
    for i in range(1, n):
        # hard links: the same bytes in every folder, made in a fraction of a copy's time
        shutil.copytree(runs / "r0000", runs / f"r{i:04d}", symlinks=True, copy_function=os.link)
    rows = []
    for name, cmd in (
        ("scale_runs_1000_runs_cpu_seconds", [HPCTRAIN, "runs", "--runs-dir", str(runs)]),
        ("scale_status_1000_runs_cpu_seconds", [HPCTRAIN, "status", "--runs-dir", str(runs)]),
    ):
        cpu, wall = [], []
        for _ in range(reps):
            c, w = cpu_and_wall(cmd, cwd, env)
            cpu.append(c)
            wall.append(w)
        rows.append(
            common.settle(
                name,
                cpu,
                "< 2.0",
                runs=n,
                reps=reps,
                cpu_s=cpu,
                wall_s=wall,
                summary=f"`hpctrain {cmd[1]}` over {n} local run "
                f"folders: {common.median(cpu):.2f} s CPU, {common.median(wall):.2f} s wall "
                "(local runs: no sacct; a Slurm run costs one sacct call each, see details)",
                slurm_note="status/runs ask sacct once per Slurm run (hpctrain/dispatch/slurm.py); "
                "1,000 Slurm runs need a batched query (not done)",
            )
        )
    return rows


def run(quick: bool) -> list[common.Row]:
    rows = []
    try:
        rows += checkpoint_rows(quick)
    except common.NotMeasured as e:
        rows += [
            common.not_measured(n, t, str(e))
            for n, t in (
                ("scale_checkpoint_commit_4096_ranks_seconds", "< 2.0"),
                ("scale_checkpoint_verify_4096_ranks_seconds", "< 5.0"),
            )
        ]
    try:
        rows += runs_rows(quick)
    except common.NotMeasured as e:
        rows += [
            common.not_measured(n, "< 2.0", str(e))
            for n in ("scale_runs_1000_runs_cpu_seconds", "scale_status_1000_runs_cpu_seconds")
        ]
    return rows
