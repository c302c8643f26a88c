"""`hpctrain preempt`: send a running job the preemption signal the way the scheduler would
(moved from hpctrain/service/resume.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpctrain import dispatch
from hpctrain.kernel import states
from hpctrain.kernel.errors import UserError
from hpctrain.runs.procs import PREEMPT_SIGNALS

if TYPE_CHECKING:
    from hpctrain.runs.folder import RunDir


def preempt(r: RunDir, sig: str | None = None) -> tuple[str, str]:
    """Send run `r` its preemption signal the way the scheduler would: (signal name, target)."""
    name = (sig or r.record().preempt_signal or "USR2").upper()
    name = name.removeprefix("SIG")
    if name not in PREEMPT_SIGNALS:
        raise UserError(
            f"--signal {sig}: not a signal preempt sends; use one of "
            f"{', '.join(PREEMPT_SIGNALS)} (USR2, the default, is what Slurm sends)"
        )
    current = dispatch.state(r)
    if current != states.RUNNING:
        raise UserError(f"{r.name} is {current}, not RUNNING: only a running job can be preempted")
    return name, dispatch.signal(r, name)
