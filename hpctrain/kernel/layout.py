"""The run folder's file names (`<storage.runs_dir>/<name>/`): one constant per file.

Paths are relative to the run folder. The batch script gets them from its render context
(`{{ files.STOP }}`), hpctrain.runs.folder.RunDir and train_entry build paths from them.
"""

from __future__ import annotations

import json
from pathlib import Path

from hpctrain.kernel.values import frozen


@frozen
class Entry:
    path: str
    meaning: str
    written_by: str


ENTRIES: tuple[Entry, ...] = (
    Entry(
        "run.yaml",
        "frozen: resolved profile, request, entry args, hpctrain version, created time, "
        "node_python",
        "submit",
    ),
    Entry(
        "job.sh",
        "rendered script: byte for byte what was handed to the scheduler",
        "submit, resume",
    ),
    Entry(
        "jobs.jsonl",
        'one line per submission: {"job_id", "kind": "submit"|"resume"|"chain"|"sweep", "time", '
        '"scheduler"}',
        "submit, resume",
    ),
    Entry("submitit/", "submitit's own files", "dispatch"),
    Entry(
        "logs/batch.log",
        "the batch shell's output (sbatch --output, --open-mode=append)",
        "batch script",
    ),
    Entry("logs/node-<N>.log", "each srun task (one per node)", "per-node command"),
    Entry(
        "logs/rank-<R>.log",
        "each training rank (train_entry writes it, append; user scripts: torchrun --tee)",
        "train_entry",
    ),
    Entry(
        "restarts.jsonl",
        'one line per start of the batch script: {"time", "job_id", "restart_count", "host"}',
        "batch script",
    ),
    Entry(
        "events.jsonl",
        '{"time", "event": "signal"|"requeue"|"preempted"|"done"|"failed"|"timeout"|"resume"|'
        '"segment_end"|"chain_cancel"|"cancel"|"in_job_restart"|"preflight"|"spare_swapped"|'
        '"snapshots_off", ...}',
        "batch script, train_entry, resume, cancel (Slurm), preflight gate",
    ),
    Entry(
        "STOP",
        "the preemption relay flag: created by the batch shell's trap, removed at each start",
        "batch script",
    ),
    Entry(
        "PREEMPTED",
        "launcher srun: a rank left with exit 75 (saved for a restart; srun sees 0), so the batch "
        "shell requeues; removed at each start. Without it, exit 0 after a stop request is COMPLETED",
        "per-node command",
    ),
    Entry(
        "CANCEL",
        "the job ids `hpctrain cancel` stopped, one a line, written before the signal: with "
        "preemption.signal TERM the batch shell tells a cancel from a preemption by it",
        "cancel",
    ),
    Entry(
        "FATAL",
        "an error that repeats (user code, config, a checkpoint that does not load): its cause in "
        "one line; no in-job restart follows, the job fails with it; removed at each start",
        "train_entry, hpctrain.launchers.entry",
    ),
    Entry(
        "state.json",
        'local scheduler only: {"state", "pid", "pgid", "exit_code"} (state: PENDING|RUNNING|'
        "COMPLETED|FAILED|CANCELLED|PREEMPTED|TIMEOUT)",
        "batch script",
    ),
    Entry(
        "checkpoints/step-<8 digits>/",
        "one verified checkpoint per step, MANIFEST.json written last",
        "train_entry",
    ),
    Entry(
        "checkpoints/latest",
        "text file with the folder name of the newest verified checkpoint",
        "train_entry",
    ),
    Entry("metrics.jsonl", "one JSON object per logging step", "train_entry"),
    Entry("train.log", "rank-0 plain progress lines", "train_entry"),
    Entry("final_params.sha256", "written by rank 0 at the end of training", "train_entry"),
    Entry(
        "mesh.json",
        'the newest start\'s layout: {"world", "dp", "tp", "pp", "mesh": "dp 2 x tp 2", '
        '"strategy", "schedule", "microbatches"} (what `status` and `report` show)',
        "train_entry",
    ),
    Entry("plan.json", "`submit --strategy auto`: the plan decision", "submit"),
    Entry(
        "saves.jsonl",
        'one line per checkpoint save: {"step", "blocked_s" (time the loop waited), "time"}',
        "train_entry, hpctrain.runtime",
    ),
    Entry(
        "tracker.json",
        'the experiment tracker run this run continues: {"kind", "id", "project"}',
        "train_entry (train.tracker)",
    ),
    Entry("report/", "`hpctrain report`: PNG plots (loss, throughput, step time, GPU)", "report"),
    Entry(
        "export/step-<8 digits>-<format>[-<dtype>]/",
        "`hpctrain export` without --out: a checkpoint's model weights (docs/export.md)",
        "export",
    ),
    Entry(
        "chain.txt",
        "`submit --chain`: the segments' Slurm job ids, one a line, in order (the script reads it)",
        "submit --chain",
    ),
    Entry(
        "preflight/<job>-<restart>[-<round>]/",
        "the preflight gate of one start: node-<id>.json, fail-<id>.txt, net.json, verdict.json "
        "(docs/bad-nodes.md); `-<round>`: its check after the round-th failed training step "
        "(hot spares, preemption.spare_nodes)",
        "preflight node checks, gate",
    ),
    Entry(
        "preflight/round-trip-<host>-<pid>/",
        "each node's checkpoint round trip at a start, before the ranks meet (removed after)",
        "train_entry",
    ),
    Entry("preflight.json", "the newest preflight verdict (what `status` shows)", "preflight gate"),
    Entry(
        "STALLED",
        "a rank's stall watchdog fired: {rank, host, last_step, last_step_time, stacks}; the batch "
        "shell moves it into stacks/ and requeues",
        "train_entry (watchdog)",
    ),
    Entry(
        "stacks/<job>-<restart>/",
        "rank-<R>.txt: every rank's stack at a stall (py-spy or faulthandler)",
        "train_entry (watchdog)",
    ),
    Entry(
        "failures/<job>-<restart>/rank-<R>.json",
        'a rank ended by an exception: {"rank", "node", "host", "pid", "time", "error", '
        '"lost_peer"} (what `status` weighs to name the rank that failed first)',
        "train_entry",
    ),
    Entry(
        "heartbeat/rank-<R>.json",
        "with watchdog.stall_s: {rank, step, time, pid, host}, every 5-30 s",
        "train_entry (watchdog)",
    ),
    Entry(
        "samples/rank-<R>.jsonl",
        'with data.record_ids: one line per micro-batch read, {"epoch", "pos", "ids"} (the '
        "sample-id proof of a resume: train_entry/data.py)",
        "train_entry",
    ),
)

RUN_YAML = "run.yaml"
JOB_SH = "job.sh"
JOBS = "jobs.jsonl"
SUBMITIT = "submitit"
LOGS = "logs"
BATCH_LOG = "logs/batch.log"
RESTARTS = "restarts.jsonl"
EVENTS = "events.jsonl"
STOP = "STOP"
PREEMPTED = "PREEMPTED"
FATAL = "FATAL"
CANCEL = "CANCEL"
STATE = "state.json"
CHECKPOINTS = "checkpoints"
METRICS = "metrics.jsonl"
TRAIN_LOG = "train.log"
FINAL_PARAMS = "final_params.sha256"
MESH = "mesh.json"
PLAN = "plan.json"
SAVES = "saves.jsonl"
TRACKER = "tracker.json"
REPORT = "report"
EXPORT = "export"
CHAIN = "chain.txt"
PREFLIGHT = "preflight"
PREFLIGHT_LATEST = "preflight.json"
STALLED = "STALLED"
STACKS = "stacks"
HEARTBEAT = "heartbeat"
FAILURES = "failures"
SAMPLES = "samples"
# What `resume` and `status` read as trusted (a script, a profile, a pid to signal): each must be
# yours, not group/other-writable and not a symlink (RunFolder.unsafe).
TRUSTED = (RUN_YAML, JOB_SH, STATE)


def read_mesh(run_path: object) -> dict[str, object] | None:
    """mesh.json of a run folder (the newest start's layout), or None when not written yet."""
    try:
        found = json.loads((Path(str(run_path)) / MESH).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def node_log(node: int | str) -> str:
    return f"logs/node-{node}.log"


def rank_log(rank: int | str) -> str:
    return f"logs/rank-{rank}.log"
