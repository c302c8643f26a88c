"""The local scheduler: submitit's LocalExecutor runs our rendered job.sh on this machine.

The controller (submitit's `python -m submitit.local._local`) starts in its own session with no
terminal and its output in submitit/controller.log, so the job survives the CLI exiting (and Ctrl-C
in the CLI's terminal). It enforces the time limit and sends the profile's signal `warning_s` before
it, as Slurm would. State comes from the script's own state.json plus pid liveness.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.dispatch import mark_cancel
from hpctrain.dispatch.submitit_api import start_local
from hpctrain.kernel import layout, states
from hpctrain.kernel.errors import UserError
from hpctrain.runs import procs
from hpctrain.runs.folder import RunDir

if TYPE_CHECKING:
    from hpctrain.profiles.resolved import ResolvedProfile

# Keep the controllers' Popen objects alive: their __del__ would warn about a still-running child.
_CONTROLLERS: list[subprocess.Popen[bytes]] = []


def _start(run: RunDir, command: str, *, time_min: int, signal_name: str, warning_s: int) -> str:
    """submitit's local controller runs `command` (one task), enforcing the time limit and sending
    `signal_name` warning_s before it, as Slurm would; detached from this process. The job id is
    the controller's pid."""
    env = dict(os.environ)
    env.update(
        SUBMITIT_LOCAL_NTASKS="1",
        SUBMITIT_LOCAL_COMMAND=command,
        SUBMITIT_LOCAL_TIMEOUT_S=str(60 * time_min),
        SUBMITIT_LOCAL_SIGNAL_DELAY_S=str(warning_s),
        SUBMITIT_LOCAL_NODEID="0",
        SUBMITIT_LOCAL_JOB_NUM_NODES="1",
        SUBMITIT_STDERR_TO_STDOUT="1",
        SUBMITIT_EXECUTOR="local",
        SUBMITIT_LOCAL_WITH_SHELL="",
        SUBMITIT_PREEMPT_SIGNAL=signal_name,
    )
    process = start_local(run.submitit, env)
    _CONTROLLERS.append(process)
    return str(process.pid)


def submit(run: RunDir, *, time_min: int, signal_name: str, warning_s: int) -> str:
    """Start job.sh; returns the controller's pid as the job id."""
    token = (
        procs.new_token()
    )  # on the script's command line: cancel/preempt check it before a signal
    _write_state(
        run, {"state": states.PENDING, "pid": None, "pgid": None, "exit_code": None, "token": token}
    )
    return _start(
        run,
        f"bash {shlex.quote(str(run.job_sh))} {token}",
        time_min=time_min,
        signal_name=signal_name,
        warning_s=warning_s,
    )


def script_pid(run: RunDir) -> int | None:
    """The pid of the run's batch script, only if that process is still the script this run started
    (start time and token match: a reused pid is never signalled); else None."""
    st = run.local_state() or {}
    pid = st.get("pid")
    if pid is not None and procs.is_run_script(
        pid, job_sh=run.job_sh, start=st.get("start"), token=st.get("token")
    ):
        return int(pid)
    return None


def _write_state(run: RunDir, state: Mapping[str, object]) -> None:
    run.write(layout.STATE, json.dumps(state) + "\n", durable=False)


def alive(pid: int | None) -> bool:
    """True if pid runs (a zombie does not count)."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def state(run: RunDir) -> str:
    st = run.local_state() or {}
    value = str(st.get("state") or states.UNKNOWN)
    if value == states.PENDING:
        job_id = run.last_job_id()
        if job_id and not alive(int(job_id)):
            return states.LOST  # the controller ended before the script started
    if value == states.RUNNING and not _still_running(run, st):
        # The script may have recorded its end between our read and the liveness check: read again.
        value = str((run.local_state() or {}).get("state") or states.UNKNOWN)
        if value == states.RUNNING:
            return states.LOST  # the script was killed before it could record its end
    return value


def _still_running(run: RunDir, st: Mapping[str, object]) -> bool:
    if "start" in st:  # a script that records its start time: the pid must still be it
        return script_pid(run) is not None
    pid = st.get("pid")
    return alive(pid if isinstance(pid, int) else None)


def cancel(run: RunDir, *, grace_s: float = 60.0) -> str:
    """TERM to the script (it stops the nodes, which save); after grace_s, KILL the whole group."""
    st = run.local_state() or {}
    job_id = run.last_job_id()
    controller = int(job_id) if job_id and job_id.isdigit() else None
    if (
        st.get("state") == states.PENDING
        and controller is not None
        and procs.is_run_controller(controller, submitit_dir=run.submitit)
    ):
        os.killpg(controller, signal.SIGKILL)  # the controller leads its own session
        _write_state(run, {**st, "state": states.CANCELLED, "exit_code": 143})
        return states.CANCELLED
    pid = script_pid(run)
    if pid is None:
        return state(run)  # not running, or the pid now belongs to another process: no signal
    if job_id:
        mark_cancel(run, job_id)  # the batch script's JOB_ID is the controller's pid
    try:
        pgid = os.getpgid(pid)
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return state(run)
    deadline = time.monotonic() + grace_s
    while script_pid(run) == pid and time.monotonic() < deadline:
        time.sleep(0.2)
    if script_pid(run) == pid:
        os.killpg(pgid, signal.SIGKILL)
        _write_state(run, {**st, "state": states.CANCELLED, "exit_code": 137})
    return state(run)


class Local:
    def submit(self, run: RunDir, profile: ResolvedProfile, *, time_min: int) -> str:
        pre = profile.preemption
        return submit(run, time_min=time_min, signal_name=pre.signal, warning_s=pre.warning_s)

    def state(self, run: RunDir) -> str:
        return state(run)

    def cancel(self, run: RunDir) -> str:
        return cancel(run)

    def signal(self, run: RunDir, name: str) -> str:
        pid = script_pid(run)
        if not pid:
            raise UserError(
                f"{run.name}: no running batch script of this run (state.json names none, or "
                "its pid now belongs to another process); nothing was signalled"
            )
        try:
            os.kill(int(pid), getattr(signal, f"SIG{name}"))
        except ProcessLookupError:
            raise UserError(f"{run.name}: the script (pid {pid}) is gone") from None
        return f"the batch script (pid {pid}, kill -{name})"


SCHEDULER = Local()
