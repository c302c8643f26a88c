"""The in-memory snapshots' memory plan (hpctrain/plan/snapshots.py): the arithmetic against a
hand-computed case, one source for the constants with the first snapshot's own check, the demo
GPT's size from its config, `hpctrain plan`'s line and JSON field, and `submit --dry-run`'s line."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from hpctrain.cli import main
from hpctrain.kernel import jobenv
from hpctrain.kernel import snapshot as store
from hpctrain.plan import GIB
from hpctrain.plan.snapshots import plan_snapshots, rank_state_bytes

P = 1_000_000


def flat(text: str) -> str:
    """rich wraps long lines at the terminal's width: compare the words."""
    return " ".join(text.split())


@pytest.mark.parametrize(
    "strategy,optimizer,world,tp,pp,expected",
    [
        ("ddp", "adamw", 8, 1, 1, 12 * P),  # the whole replica: fp32 params 4P + Adam 8P
        ("ddp", "sgd", 8, 1, 1, 4 * P),
        ("ddp", "sgd-momentum", 8, 1, 1, 8 * P),
        ("fsdp", "adamw", 8, 1, 1, 12 * P // 8),  # its fp32 shard
        ("fsdp", "adamw", 8, 2, 2, 12 * (P // 4) // 2),  # P/(tp pp) sharded over dp 2
        ("deepspeed", "adamw", 8, 1, 1, None),  # the engine owns the state: no snapshots
    ],
)
def test_one_ranks_state_is_fp32_params_and_optimizer(strategy, optimizer, world, tp, pp, expected):
    got = rank_state_bytes(strategy, params=P, world=world, optimizer=optimizer, tp=tp, pp=pp)
    assert got == expected


def test_per_node_by_hand():
    # FSDP, AdamW, 2 nodes x 4 ranks: a rank holds 12 * 1e6 / 8 = 1.5e6 bytes; a node holds 4
    # ranks x ((own + partner copy) x 2 kept + the newest step sent) = 20 of them = 30e6 bytes. The
    # node's 1.2e8 bytes give /dev/shm 6e7, of which snapshots may take half: 3e7.
    s = plan_snapshots(strategy="fsdp", params=P, nodes=2, gpus=4, node_mem_bytes=12 * 10**7)
    assert (s.rank_bytes, s.copies, s.kept, s.node_bytes) == (1_500_000, 2, 2, 30_000_000)
    assert s.allowed_bytes == 30_000_000 and s.status == "fits" and s.fits is True
    tight = plan_snapshots(strategy="fsdp", params=P, nodes=2, gpus=4, node_mem_bytes=119_999_999)
    assert tight.status == "too_large" and tight.fits is False
    assert "does not fit, so they will be off" in tight.line()
    assert "--snapshot.every_steps=0" in tight.line() and jobenv.SNAPSHOT_DIR in tight.line()
    # one node: no partner copy (DDP, 4 ranks x 2 kept x 12e6)
    one = plan_snapshots(strategy="ddp", params=P, nodes=1, gpus=4, node_mem_bytes=None)
    assert one.copies == 1 and one.node_bytes == 96_000_000 and one.status == "unknown_memory"
    assert "own copy (one node: no partner)" in one.line()


def test_the_runtime_check_uses_the_same_constants_and_formula():
    from hpctrain.runtime import recovery as runtime

    assert runtime.MEMORY_SHARE is store.MEMORY_SHARE
    assert store.node_bytes(10, ranks_per_node=4, partner=True) == (2 * store.KEEP + 1) * 10 * 4
    from train_entry.config import TrainConfig

    assert TrainConfig().snapshot.budget == store.BUDGET


def test_off_none_and_unknown_size_say_so():
    off = plan_snapshots(strategy="fsdp", params=P, nodes=2, gpus=4, every_steps=0)
    assert off.status == "off" and "off (snapshot.every_steps=0)" in off.line(interval=True)
    ds = plan_snapshots(strategy="deepspeed", params=P, nodes=2, gpus=4)
    assert ds.status == "none" and "none under DeepSpeed" in ds.line()
    mine = plan_snapshots(
        strategy="script", params=None, nodes=2, gpus=4, node_mem_bytes=64 * GIB, every_steps=5
    )
    assert mine.status == "unknown_size" and mine.fits is None
    assert mine.line(interval=True).startswith("in-memory snapshots (every 5 steps): size measured")
    assert "within 16.00 GiB allowed" in mine.line()


def test_demo_gpt_size_from_its_config():
    from train_entry.config import TrainConfig
    from train_entry.model import demo_model

    for cfg in (TrainConfig(), TrainConfig(model={"d_model": 96, "n_layers": 3, "vocab_size": 50})):
        model = demo_model(cfg)
        assert cfg.model.demo_params() == sum(p.numel() for p in model.parameters())
    assert TrainConfig(model={"factory": "a:b"}).model.demo_params() is None


def test_plan_text_and_json():
    args = ["plan", "--params", str(P), "--nodes", "2", "--gpus", "4", "--gpu-mem-gib", "80"]
    res = CliRunner().invoke(main, [*args, "--host-mem-gib", "64"])
    assert res.exit_code == 0, res.output
    # DDP: 4 ranks x ((own + partner) x 2 kept + 1) x 12e6 = 240e6 bytes; 64 GiB / 2 / 2 allowed
    assert (
        "in-memory snapshots: 228.9 MiB per node in /dev/shm (4 rank(s) x (own + partner copy x 2 "
        "kept + the newest step sent to the partner) x 11.4 MiB) of 16.00 GiB allowed (50% of "
        "/dev/shm, 50% of the node's 64.00 GiB): fits"
    ) in flat(res.output)
    res = CliRunner().invoke(main, [*args, "--host-mem-gib", "64", "--json"])
    snap = json.loads(res.output)["snapshots"]
    assert snap["status"] == "fits" and snap["strategy"] == "ddp"
    assert (snap["rank_bytes"], snap["node_bytes"], snap["allowed_bytes"]) == (
        12 * P,
        240 * P,
        16 * GIB,
    )
    assert snap["line"].startswith("in-memory snapshots: 228.9 MiB per node")
    res = CliRunner().invoke(main, [*args, "--json"])  # no node memory: checked at the first one
    assert json.loads(res.output)["snapshots"]["status"] == "unknown_memory"


def test_plan_reads_the_nodes_memory_from_the_profile_with_gpu_mem_given(tmp_path, monkeypatch):
    prof = tmp_path / "site.yaml"
    prof.write_text("name: site\nscheduler: slurm\nslurm:\n  gpus_per_node: 4\n  mem: 64G\n")
    os.chmod(prof, 0o644)
    os.chmod(tmp_path, 0o755)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    res = CliRunner().invoke(
        main,
        ["plan", "--params", str(P), "--profile", str(prof), "--gpus", "4"]
        + ["--gpu-mem-gib", "80", "--json"],
    )
    out = json.loads(res.output)
    assert out["inputs"]["host_mem_bytes"] == 64 * GIB
    assert out["snapshots"]["node_mem_bytes"] == 64 * GIB


@pytest.fixture
def dry(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv(jobenv.SITE_PATH, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text("print(1)\n")
    base = ["submit", "--profile", "loopback", "--nodes", "2", "--name", "d", "--dry-run"]

    def run(*args: str) -> str:
        res = CliRunner().invoke(main, [*base, "--set", "slurm.mem=64G", *args])
        assert res.exit_code == 0, res.output
        assert not (tmp_path / "runs").exists()
        return next(x.strip() for x in res.output.splitlines() if "in-memory snapshots" in x)

    return run


def test_dry_run_shows_the_snapshot_line(dry):
    # train_entry's demo GPT (103,168 parameters), DDP, AdamW: 12 bytes each per rank, 2 nodes x 2
    assert dry() == (
        "in-memory snapshots (interval auto: at most 2% of a step): 11.8 MiB per node in /dev/shm "
        "(2 rank(s) x (own + partner copy x 2 kept + the newest step sent to the partner) x 1.2 "
        "MiB) of 16.00 GiB allowed (50% of "
        "/dev/shm, 50% of the node's 64.00 GiB): fits"
    )
    fsdp = dry("--strategy", "fsdp", "--", "--snapshot.every_steps=4", "--optim.name=sgd")
    # SGD with momentum: (4 + 4) bytes x P / 4 ranks, x 10 per node
    assert fsdp.startswith("in-memory snapshots (every 4 steps): 2.0 MiB per node")
    assert "off (snapshot.every_steps=0)" in dry("--", "--snapshot.every_steps=0")
    mine = dry("--script", "mine.py")
    assert "size measured at the first snapshot" in mine and "within 16.00 GiB allowed" in mine
