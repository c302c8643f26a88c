"""The snapshot store against a second account on the node (issue 33, finding 1; docs/security.md):
the attacker is a real unprivileged account (tests/_accounts.py).

- A top folder another account made first (`<base>/hpctrain-<uid>`), with a planted snapshot
  whose pickled skeleton would run a command: a real 2-rank run with a killed rank completes with
  snapshots off (one line, one `snapshots_off` event), the command never runs, nothing planted
  loads and nothing of the run's state lands in the attacker's folder.
- The same squat made read-only, against an unprivileged owner: snapshots off, never a failure.
- Unit level: a wrong signature, another job's key, a step or rank that differs from the file's
  name, a symlinked rank folder or file is no snapshot; a skeleton is data (thaw runs nothing).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path

import pytest
import xxhash
from _accounts import other_account

from hpctrain.kernel import jobenv, layout
from hpctrain.kernel import snapshot as store

KEY = "5e" * 32
OTHER_KEY = "a7" * 32


@pytest.fixture()
def shared():
    """A sticky folder every account may write in (a /dev/shm or /tmp of its own)."""
    where = Path(tempfile.mkdtemp(prefix="hpct-shm-", dir="/tmp"))
    os.chmod(where, 0o1777)
    yield where
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture()
def job(tmp_path, shared, monkeypatch):
    monkeypatch.setenv(jobenv.SNAPSHOT_DIR, str(shared))
    monkeypatch.setenv(jobenv.JOB_ID, "33")
    monkeypatch.setenv(jobenv.RESTART_COUNT, "0")
    monkeypatch.setenv(jobenv.JOB_KEY, KEY)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    return tmp_path / "runs" / "a"


# ---------------------------------------------------------------- unit level
def test_only_a_snapshot_signed_for_its_name_with_this_jobs_key_is_one(job, monkeypatch):
    folder = store.node_folder(job)
    store.write(folder, 0, 10, b"ten" * 100, world=2)
    where = folder / "rank-0"
    assert sorted(store.listing(folder)[0]) == [10]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in (folder, where, folder.parent))

    monkeypatch.setenv(jobenv.JOB_KEY, OTHER_KEY)  # another job start's key
    assert store.listing(folder) == {}
    monkeypatch.setenv(jobenv.JOB_KEY, KEY)

    # the step inside differs from the name: a copy of step 10 named as a newer step
    for suffix in (".bin", ".json"):
        shutil.copy(where / f"step-00000010{suffix}", where / f"step-99999999{suffix}")
    # ... or another rank's: rank 0's snapshot in rank 1's folder
    shutil.copytree(where, folder / "rank-1")
    assert {r: sorted(v) for r, v in store.listing(folder).items()} == {0: [10]}

    # data of the attacker's with an unkeyed digest that matches it: the signature does not
    meta = json.loads((where / "step-00000010.json").read_text())
    forged = b"evil" * 75
    (where / "step-00000010.bin").write_bytes(forged)
    meta |= {"digest": xxhash.xxh3_64_intdigest(forged)}
    (where / "step-00000010.json").write_text(json.dumps(meta))
    assert store.listing(folder) == {}
    assert store.read(folder, 0, 10, meta) is None


def test_a_symlinked_rank_folder_or_file_is_not_followed(job, shared):
    folder = store.node_folder(job)
    store.write(folder, 0, 4, b"four" * 10, world=1)
    meta = store.listing(folder)[0][4]
    elsewhere = shared / "elsewhere"
    shutil.move(folder / "rank-0", elsewhere)
    (folder / "rank-0").symlink_to(elsewhere)  # a valid snapshot, but through a link
    assert store.listing(folder) == {}
    (folder / "rank-0").unlink()
    (folder / "rank-0").mkdir(mode=0o700)
    shutil.move(elsewhere / "step-00000004.json", folder / "rank-0")
    (folder / "rank-0" / "step-00000004.bin").symlink_to(elsewhere / "step-00000004.bin")
    assert store.listing(folder) == {}
    assert store.read(folder, 0, 4, meta) is None


def test_a_top_folder_of_another_account_or_an_unsafe_base_turns_snapshots_off(job, shared):
    folder = store.node_folder(job)
    top = shared / f"hpctrain-{os.getuid()}"
    with other_account("sq") as them:
        made = them.run(["mkdir", "-m", "0777", str(top)])
        assert made.returncode == 0, made.stderr
        why = store.ready(folder)
        assert why is not None and f"belongs to uid {them.uid}" in why, why
        with pytest.raises(store.Unsafe):
            store.write(folder, 0, 1, b"x", world=1)
        assert list(top.iterdir()) == []  # nothing of ours in their folder
    shutil.rmtree(top)
    top.symlink_to(shared / "mine")  # a link where the folder should be
    (shared / "mine").mkdir(mode=0o700)
    assert "a link" in (store.ready(folder) or "")
    top.unlink()
    top.mkdir(mode=0o755)  # ours, from an older version: made private, then used
    assert store.ready(folder) is None and stat.S_IMODE(top.stat().st_mode) == 0o700
    os.chmod(shared, 0o777)  # a base others may write in, not sticky: our entry could be swapped
    assert "not sticky" in (store.ready(folder) or "")


def test_thaw_reads_data_and_never_runs_it(tmp_path):
    import torch

    from hpctrain.runtime.frozen import freeze, thaw

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    def crafted(head: bytes, tail: bytes = b"") -> bytes:
        return len(head).to_bytes(8, "little") + head + tail

    bad = [
        crafted(pickle.dumps((Payload(), []))),  # the old format's pickled skeleton
        crafted(json.dumps({"tree": {"import": "os.system"}, "slots": []}).encode()),
        crafted(json.dumps({"tree": {"s": 0}, "slots": [[0, "load", [1]]]}).encode()),
        crafted(json.dumps({"tree": {"s": 0}, "slots": [[0, "float32", [1 << 20]]]}).encode()),
        crafted(json.dumps({"tree": {"a": [0, "O", [1]]}, "slots": [[0, "uint8", [8]]]}).encode()),
        crafted(json.dumps({"tree": {"d": [[{"l": []}, 1]]}, "slots": []}).encode()),
        crafted(json.dumps({"tree": {"o": {}, "l": []}, "slots": []}).encode()),
        b"\xff" * 8,
    ]
    for data in bad:
        with pytest.raises(ValueError):
            thaw(data)
    assert not marker.exists()
    state = {"w": torch.ones(2), 3: (float("nan"), b"\0", None), "n": torch.zeros(1).numpy()}
    back = thaw(freeze(state))
    assert list(back) == ["w", 3, "n"] and torch.equal(back["w"], state["w"])
    assert back[3][0] != back[3][0] and back[3][1:] == (b"\0", None)
    with pytest.raises(TypeError, match=r"cannot snapshot a Payload at state\['x'\]\[1\]: "):
        freeze({"w": torch.ones(1), "x": [1, Payload()]})


# ---------------------------------------------------------------- the squat, read-only
VICTIM = """
import os, sys, torch
from hpctrain.kernel import jobenv
from hpctrain.runtime.recovery import Snapshots
os.environ.update({jobenv.SNAPSHOT_DIR: sys.argv[1], jobenv.JOB_ID: "33", jobenv.JOB_KEY: sys.argv[2]})
said = []
snaps = Snapshots(sys.argv[3], every=1, budget=0.02, payload=lambda: {"w": torch.ones(4)},
                  apply=int, log=said.append)
for step in range(1, 6):
    snaps.step(step, saved=False)
snaps.close()
print("said:", said)
"""


def test_a_read_only_squat_of_an_unprivileged_owners_folder_is_no_failure(shared, tmp_path):
    """The finding: such a squat failed every run of its owner on that node at the first snapshot
    (PermissionError: FATAL). Owner and attacker both unprivileged accounts."""
    with other_account("ov") as owner, other_account("oa") as them:
        squat = them.run(["mkdir", "-m", "0555", str(shared / f"hpctrain-{owner.uid}")])
        assert squat.returncode == 0, squat.stderr
        out = owner.python(VICTIM, str(shared), KEY, str(owner.home / "run"), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"said: ['snapshots off: {shared}/hpctrain-{owner.uid} belongs to uid {them.uid}" in (
        out.stdout
    ), out.stdout


# ---------------------------------------------------------------- a real run, squatted
PLANT = """
import json, os, pickle, sys, xxhash
marker, nodes = sys.argv[1], sys.argv[2:]


class Run:
    def __reduce__(self):
        return (os.system, (f"touch {marker}",))


data = (lambda h: len(h).to_bytes(8, "little") + h)(pickle.dumps((Run(), [])))
for rank, node in enumerate(nodes):
    where = os.path.join(node, f"rank-{rank}")
    os.makedirs(where, mode=0o777)
    with open(os.path.join(where, "step-99999999.bin"), "wb") as f:
        f.write(data)
    meta = {"step": 99999999, "rank": rank, "world": len(nodes), "size": len(data),
            "digest": xxhash.xxh3_64_intdigest(data), "time": 0, "anchor": False}
    with open(os.path.join(where, "step-99999999.json"), "w") as f:
        json.dump(meta, f)
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_squatted_store_with_a_planted_snapshot_runs_nothing_and_loads_nothing(
    tmp_path, shared, monkeypatch
):
    """A real run (2 simulated nodes x 1 rank, snapshots every 5 steps) whose top snapshot folder
    another account made first, with a snapshot of step 99999999 planted for every rank whose
    skeleton would run a command; one rank is killed after step 32 (disk checkpoint at 25)."""
    from test_in_job_restart import Job, lines

    job = Job(tmp_path, "squat")
    job.home.env[jobenv.SNAPSHOT_DIR] = str(shared)
    monkeypatch.setenv(jobenv.SNAPSHOT_DIR, str(shared))  # the run's folder names, here
    marker = tmp_path / "planted-command-ran"
    run_folder = store.run_folder(job.run.absolute())
    with other_account("at") as them:
        made = them.run(["mkdir", "-p", "-m", "0777", str(run_folder)])
        assert made.returncode == 0, made.stderr
        job.submit(train=["--strategy", "ddp", "--max-steps=60", "--checkpoint-every=25",
                          "--snapshot.every_steps=5"])  # fmt: skip
        deadline = time.monotonic() + 120
        while not lines(job.run / layout.RESTARTS):  # the job id, written as the job starts
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.05)
        jid = lines(job.run / layout.RESTARTS)[0]["job_id"]
        nodes = [run_folder / f"{jid}-0" / f"{socket.gethostname()}.{n}" for n in (0, 1)]
        planted = them.python(PLANT, str(marker), *map(str, nodes))
        assert planted.returncode == 0, planted.stderr
        reached, _ = job.kill_one(1, after_step=32)
        state = job.wait()
        ours = [p for p in run_folder.parent.rglob("*") if p.lstat().st_uid != them.uid]
    log = (job.run / "train.log").read_text()
    assert state == "COMPLETED", (job.run / "logs" / "batch.log").read_text()[-3000:]
    assert not marker.exists()  # the planted skeleton was never unpickled
    assert ours == []  # no snapshot of the run's weights in a folder they own
    line = f"snapshots off: {run_folder.parent} belongs to uid {them.uid}, not to this account"
    assert log.count(line) == 2, log[-3000:]  # one per worker start: the first and the restart
    (off, _) = job.events("snapshots_off")
    assert f"belongs to uid {them.uid}" in off["reason"], off
    shown = job.home.hp("status", job.name).stdout
    assert f"snapshots off (job {jid}): {run_folder.parent} belongs to uid {them.uid}" in shown
    assert "in-memory snapshot" not in log
    (ev,) = job.events("in_job_restart")
    assert ev["resumed_step"] == 25 and reached >= 32, (reached, ev)  # the disk checkpoint
