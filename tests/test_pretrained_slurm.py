"""An `hf:` fine-tune on the live Slurm cluster, 2 nodes x 2 workers, FSDP2: `hpctrain preempt`
mid-run (every rank saves, exit 75, requeue, resume from the checkpoint) ends bit-identical to the
same fine-tune uninterrupted. The resumed start builds the model on the meta device again and
loads the folder, then the checkpoint over it: what it trains from is the checkpoint's.

    sudo .venv/bin/python -m pytest -m slurm tests/test_pretrained_slurm.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import _hf
import pytest
from _hold import held
from test_slurm_e2e import ENDED, lines, steps
from test_slurm_e2e import runs as runs  # the fixture: one Runs per test, nothing left queued

from hpctrain.kernel import jobenv, layout

STEPS = 8
TRAIN = [
    "--strategy", "fsdp", "--max-steps", str(STEPS), "--optim.lr", "1e-2",
    "--train.micro_batch=4", "--train.global_batch=16", "--train.log_every=1",
]  # fmt: skip


def _reference(folder: Path, train: list[str]) -> subprocess.Popen:
    """The fine-tune uninterrupted: torchrun of the job's 4 ranks on this machine (the launch does
    not change the hash: tests/_demo.py, tests/test_spares_live.py). It trains beside the job; a
    second 2 x 2 job would wait for the first, as the cluster's two nodes have 2 GPUs each."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(jobenv.PREFIX)}
    return subprocess.Popen(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
            "-m", "train_entry", "--run-dir", str(folder), *train,
        ],
        env={**env, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_a_preempted_hf_finetune_ends_bit_identical(runs):
    folder = _hf.make(runs.root / "llama", "llama")
    train = ["--model", f"hf:{folder}", *TRAIN]
    ref = _reference(runs.root / "ref", train)
    try:
        runs.submit("pre", train=train)
        run = runs.run("pre")
        runs.until("step 3", lambda: len(steps(run)) >= 3, 300, poll=0.2)
        with held(run):  # the preempt lands mid-run however loaded the machine is
            assert max(steps(run)) < STEPS, "the run finished before the preempt"
            runs.hp("preempt", "pre")
        info = runs.wait("pre", ENDED - {"PREEMPTED"}, 360)  # PREEMPTED: on its way back
        assert info["state"] == "COMPLETED", info
        out = ref.communicate(timeout=360)[0]
        assert ref.returncode == 0, f"the reference:\n{out[-3000:]}"
    finally:
        if ref.poll() is None:
            ref.kill()
            ref.communicate()
    names = [e["event"] for e in lines(run / layout.EVENTS)]
    assert names[:3] == ["signal", "preempted", "requeue"] and names[-1] == "done", names
    want = (runs.root / "ref" / "final_params.sha256").read_text()
    assert (run / "final_params.sha256").read_text() == want
    assert sorted(set(steps(run))) == list(range(1, STEPS + 1))
