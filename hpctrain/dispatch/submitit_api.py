"""The one place hpctrain touches submitit, including the parts of it that are not public.

submitit is the mission's dispatcher, but its public API submits pickled Python functions; we hand
the scheduler our own rendered script. So three private pieces are used, each in ONE function here.
sacct is no longer asked through submitit's watcher: it asks for one job at a time (its registered
ids only grow, so a listing of N runs asked N(N+1)/2 ids); dispatch/slurm.py asks for every run of
a listing in one call (issue 37), with dispatch/sacct.py's command and parser.


  SlurmExecutor._make_submission_file_text  overridden: the sbatch file is our job.sh, byte for byte
  SlurmExecutor._make_submission_command     overridden: sbatch [extra options] FILE
  SlurmExecutor._submit_command             runs sbatch on it and parses the job id (submit_sbatch)
  LocalExecutor (its controller module)      started the way LocalExecutor._submit_command does
                                             (start_local), with our command

The supported range is pinned in pyproject.toml (SUPPORTED below says the same) and
tests/test_dispatch.py fails with a clear message when an upgrade changes any of these.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from hpctrain.kernel.rundir import RunFolder

SUPPORTED = (">=1.5.1", "<1.6")  # keep in step with pyproject.toml's dependency on submitit
PRIVATE = {  # attribute path -> the parameters we rely on
    "submitit.slurm.slurm.SlurmExecutor._make_submission_file_text": ["self", "command", "uid"],
    "submitit.slurm.slurm.SlurmExecutor._make_submission_command": ["self", "submission_file_path"],
    "submitit.slurm.slurm.SlurmExecutor._submit_command": ["self", "command"],
    "submitit.local._local": None,  # a module run as `python -m submitit.local._local FOLDER`
}


def check_private_api() -> list[str]:
    """What no longer matches in the installed submitit (empty: all good)."""
    problems = []
    for path, params in PRIVATE.items():
        if params is None:
            if importlib.util.find_spec(path) is None:
                problems.append(f"{path}: module is gone")
            continue
        module, _, rest = path.partition(".slurm.slurm.")
        # Any: submitit's private module (untyped)
        obj: Any = importlib.import_module(module + ".slurm.slurm")
        try:
            for part in rest.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            problems.append(f"{path}: no such attribute")
            continue
        got = list(inspect.signature(obj).parameters)
        if got != params:
            problems.append(f"{path}: parameters {got}, expected {params}")
    return problems


def _slurm() -> ModuleType:
    """submitit's Slurm module, on first use: submitit loads ~190 modules, more than the whole CLI,
    and a local run or `status` of a finished one never needs it. Its logger is quieted here, after
    submitit's own logging set-up ran: we report sbatch and sacct trouble ourselves."""
    import submitit.slurm.slurm as slurm  # lazy: CLI start-up (submitit only to submit or ask sacct)

    slurm.logger.get_logger().setLevel(40)  # type: ignore[attr-defined]  # logging.ERROR
    return slurm


def failed_job_error() -> type[Exception]:
    """submitit's exception for a refused sbatch (for an `except` clause; submitit is loaded
    by then: only submit_sbatch raises it)."""
    return _slurm().utils.FailedJobError  # type: ignore[no-any-return]


def submit_sbatch(folder: Path, script: str, extra_args: list[str] | None = None) -> str:
    """sbatch `script` as it is (plus `extra_args` on the sbatch command line); the job id."""

    class _ScriptExecutor(_slurm().SlurmExecutor):  # type: ignore[misc]
        def _make_submission_file_text(self, command: str, uid: str) -> str:
            return script

        def _make_submission_command(self, submission_file_path: Path) -> list[str]:
            return ["sbatch", *(extra_args or []), str(submission_file_path)]

    folder.mkdir(parents=True, exist_ok=True)  # submitit writes its submission file there
    return str(_ScriptExecutor(folder)._submit_command("").job_id)


def start_local(folder: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """submitit's local controller on `folder` (SUBMITIT_LOCAL_* in `env` say what to run), in its
    own session with no terminal, output to folder/controller.log: it outlives the CLI."""
    with RunFolder(folder).open_log("controller.log") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "submitit.local._local", str(folder)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
