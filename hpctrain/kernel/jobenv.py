"""The job environment contract: every HPCTRAIN_* variable, its meaning, who sets and reads it.

This file is the only Python file that spells the prefix (tests/test_contract.py fails otherwise).
Everyone else uses the constants below (`jobenv.RUN_DIR` is the variable's name) and reads values
through `get()`; the batch script template gets the names from its render context (`var.RUN_DIR`).
docs/design.md's table is generated from VARS (`python -m hpctrain.kernel.docs`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, TypeVar, overload

from hpctrain.kernel.values import frozen

_F = TypeVar("_F", bound=Any)

PREFIX = "HPCTRAIN_"

# who sets a variable
SCRIPT = "batch script"
NODE = "per-node command"
USER = "user / admin"
CLI = "hpctrain CLI"
TESTS = "tests"


@frozen
class Var:
    key: str  # the name without the prefix
    meaning: str
    set_by: str
    read_by: str

    @property
    def name(self) -> str:
        return PREFIX + self.key


VARS: tuple[Var, ...] = (
    # --- set by the rendered batch script, for every node and rank
    Var(
        "RUN_DIR",
        "absolute run folder; `train_entry --run-dir` defaults to it",
        SCRIPT,
        "train_entry, doctor worker, user scripts",
    ),
    Var(
        "STOP_FILE",
        "`<run folder>/STOP`: the preemption flag; ranks poll it at every step boundary",
        SCRIPT,
        "train_entry, hpctrain.runtime (kernel/stopflag.py)",
    ),
    Var(
        "NNODES",
        "node count, from the one source (the request)",
        SCRIPT,
        "torchrun command, train_entry size check",
    ),
    Var(
        "GPUS_PER_NODE",
        "workers per node, from the request",
        SCRIPT,
        "torchrun command, train_entry size check, doctor worker",
    ),
    Var(
        "WANT_GPU",
        "1 when the profile has GPUs (the node then checks nvidia-smi), else 0",
        SCRIPT,
        "per-node command, doctor worker",
    ),
    Var("SCHEDULER", "`slurm` or `local`: what dispatched the script", SCRIPT, "doctor worker"),
    Var("PROFILE", "the resolved profile's name", SCRIPT, "user scripts"),
    Var("RUN_NAME", "the run's name (its folder's name)", SCRIPT, "user scripts"),
    Var(
        "PYTHON",
        "the nodes' Python; also a user override read at render time",
        f"{SCRIPT}; {USER}",
        "per-node command, render",
    ),
    Var(
        "TEE",
        "1: torchrun writes per-rank log files (user scripts); 0: train_entry writes them",
        SCRIPT,
        "per-node command",
    ),
    Var(
        "JOB_ID",
        "the scheduler's job id (Slurm's, or the local controller's pid); rendezvous id",
        SCRIPT,
        "per-node command, events",
    ),
    Var(
        "RESTART_COUNT",
        "`${SLURM_RESTART_COUNT:-0}` on Slurm; the local loop's counter locally",
        SCRIPT,
        "events, train_entry logs",
    ),
    Var(
        "IN_JOB_RESTART",
        "new training steps started inside this job start (0 first): launcher srun's in-job "
        "restarts, and a step after a hot spare swapped in (either launcher)",
        SCRIPT,
        "train_entry (in-job restart record)",
    ),
    Var(
        "JOB_KEY",
        "a secret of this job start (64 hex digits from /dev/urandom, made by the batch shell): keys "
        "the snapshots' digests and signs the rendezvous state (kernel/jobkey.py); never in a file",
        SCRIPT,
        "train_entry, hpctrain.runtime, the rendezvous backend (launchers/rdzv.py)",
    ),
    Var(
        "RDZV_ENDPOINT",
        "`head-address:port` for torchrun's c10d rendezvous",
        SCRIPT,
        "per-node command, doctor worker",
    ),
    Var(
        "NODEID",
        "this node's index (0 is the rendezvous host)",
        NODE,
        "per-node command, doctor worker, user scripts",
    ),
    Var(
        "DEVICE",
        "`cuda` when the profile wants GPUs and the node has them, else `cpu` "
        "(train_entry re-checks)",
        NODE,
        "train_entry (dist), doctor worker",
    ),
    Var(
        "PG_TIMEOUT_S",
        "the process-group (collective) timeout, from the profile's watchdog.pg_timeout_s",
        SCRIPT,
        "train_entry (watchdog)",
    ),
    Var(
        "RACKS",
        "the profile's network.racks as JSON (rack -> Slurm hostlist): snapshot partners go to "
        "a node of another rack",
        SCRIPT,
        "train_entry, hpctrain.runtime (kernel/partners.py)",
    ),
    Var(
        "STALL_S",
        "a rank with no optimizer step for this many seconds is stalled (watchdog.stall_s)",
        SCRIPT,
        "train_entry (watchdog)",
    ),
    # --- set by people
    Var(
        "SNAPSHOT_DIR",
        "node-local memory folder for in-job restart snapshots (default /dev/shm)",
        USER,
        "train_entry, hpctrain.runtime (kernel/snapshot.py)",
    ),
    Var(
        "SITE_PATH",
        "colon-separated folders where admins publish profiles and templates",
        USER,
        "profile discovery, template loader",
    ),
    # --- test and check-resume hooks (never set by the script)
    Var(
        "STOP_AT_STEP",
        "raise the stop flag once N optimizer steps are done",
        f"{CLI} (check-resume); {TESTS}",
        "train_entry (kernel/stopflag.py)",
    ),
    Var(
        "TEST_SIGNAL_AT",
        "`STEP:MICRO`: the checkpoint test worker signals itself there",
        TESTS,
        "tests/test_checkpoint_worker.py",
    ),
    Var(
        "TEST_KILL_AT",
        "`STEP:MICRO`: the checkpoint test worker SIGKILLs itself there",
        TESTS,
        "tests/test_checkpoint_worker.py",
    ),
    Var(
        "TEST_RESEED_AFTER_LOAD",
        "negative control: the test worker loses its RNG after a load",
        TESTS,
        "tests/test_checkpoint_worker.py",
    ),
    Var(
        "TEST_SEED",
        "the random-kill test's seed (default: from the clock, printed)",
        TESTS,
        "tests/test_preempt_cli.py",
    ),
    Var(
        "TEST_LOG",
        "a file the tests append one line per test phase to as it ends (outcome, seconds, id)",
        TESTS,
        "tests/conftest.py",
    ),
    Var(
        "TEST_STATE",
        "the tests' XDG_STATE_HOME (default: a fresh temp folder)",
        TESTS,
        "tests/conftest.py",
    ),
    Var(
        "UPDATE_GOLDEN",
        "1: rewrite the golden scripts instead of comparing (`make golden`)",
        TESTS,
        "tests/test_render.py",
    ),
    Var(
        "SLURM_STATE", "the loopback Slurm cluster's state folder", TESTS, "tests/slurm/cluster.sh"
    ),
    Var("SLURM_DB_PORT", "the loopback cluster's database port", TESTS, "tests/slurm/cluster.sh"),
    Var(
        "SLURM_SYS_CONF",
        "the slurm.conf link `cluster.sh check-link`/`down` look at (default /etc/slurm/slurm.conf)",
        TESTS,
        "tests/test_cluster_link.py",
    ),
)
BY_KEY: dict[str, Var] = {v.key: v for v in VARS}

# One constant per name, for readers and writers (the value is the variable's name).
RUN_DIR = BY_KEY["RUN_DIR"].name
STOP_FILE = BY_KEY["STOP_FILE"].name
NNODES = BY_KEY["NNODES"].name
GPUS_PER_NODE = BY_KEY["GPUS_PER_NODE"].name
WANT_GPU = BY_KEY["WANT_GPU"].name
SCHEDULER = BY_KEY["SCHEDULER"].name
PROFILE = BY_KEY["PROFILE"].name
RUN_NAME = BY_KEY["RUN_NAME"].name
PYTHON = BY_KEY["PYTHON"].name
TEE = BY_KEY["TEE"].name
JOB_ID = BY_KEY["JOB_ID"].name
RESTART_COUNT = BY_KEY["RESTART_COUNT"].name
JOB_KEY = BY_KEY["JOB_KEY"].name
RDZV_ENDPOINT = BY_KEY["RDZV_ENDPOINT"].name
IN_JOB_RESTART = BY_KEY["IN_JOB_RESTART"].name
NODEID = BY_KEY["NODEID"].name
DEVICE = BY_KEY["DEVICE"].name
PG_TIMEOUT_S = BY_KEY["PG_TIMEOUT_S"].name
STALL_S = BY_KEY["STALL_S"].name
RACKS = BY_KEY["RACKS"].name
SNAPSHOT_DIR = BY_KEY["SNAPSHOT_DIR"].name
SITE_PATH = BY_KEY["SITE_PATH"].name
STOP_AT_STEP = BY_KEY["STOP_AT_STEP"].name
TEST_SIGNAL_AT = BY_KEY["TEST_SIGNAL_AT"].name
TEST_KILL_AT = BY_KEY["TEST_KILL_AT"].name
TEST_RESEED_AFTER_LOAD = BY_KEY["TEST_RESEED_AFTER_LOAD"].name
TEST_SEED = BY_KEY["TEST_SEED"].name
TEST_LOG = BY_KEY["TEST_LOG"].name
TEST_STATE = BY_KEY["TEST_STATE"].name
UPDATE_GOLDEN = BY_KEY["UPDATE_GOLDEN"].name
SLURM_STATE = BY_KEY["SLURM_STATE"].name
SLURM_DB_PORT = BY_KEY["SLURM_DB_PORT"].name
SLURM_SYS_CONF = BY_KEY["SLURM_SYS_CONF"].name

# Cleared from a child's environment when a tool starts a fresh run inside a run (check-resume).
RUN_SCOPED = (STOP_FILE, STOP_AT_STEP, RUN_DIR)


@overload
def get(name: str, default: str, environ: Mapping[str, str] | None = None) -> str: ...
@overload
def get(
    name: str, default: None = None, environ: Mapping[str, str] | None = None
) -> str | None: ...
def get(
    name: str, default: str | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The one reader: the value of contract variable `name` (a constant above), or `default`."""
    if not name.startswith(PREFIX) or name[len(PREFIX) :] not in BY_KEY:
        raise KeyError(f"{name} is not in the job environment contract (hpctrain/kernel/jobenv.py)")
    return (os.environ if environ is None else environ).get(name, default)


def is_contract(name: str) -> bool:
    """A variable in our namespace (a profile may not set these)."""
    return name.startswith(PREFIX)


def without_run_scope(environ: Mapping[str, str], *, everything: bool = False) -> dict[str, str]:
    """`environ` minus the run-scoped variables (everything=True: minus every contract name)."""
    if everything:
        return {k: v for k, v in environ.items() if not is_contract(k)}
    return {k: v for k, v in environ.items() if k not in RUN_SCOPED}


def template_names() -> dict[str, str]:
    """key -> variable name, for the render context (`{{ var.RUN_DIR }}` in the template)."""
    return {v.key: v.name for v in VARS}


def fill(text: str) -> str:
    """Help text that names variables as `{var.SITE_PATH}` (as the template does), names put in."""
    for v in VARS:
        text = text.replace("{var." + v.key + "}", v.name)
    return text


def documented(f: _F) -> _F:
    """Decorator (under @click.command): fill() the docstring, which click shows as help."""
    f.__doc__ = fill(f.__doc__ or "")
    return f
