"""hpctrain export: a run's weights leave as files that load without hpctrain.

The runs are real: torchrun, 2 processes, gloo, CPU, train_entry with DDP, FSDP2, DeepSpeed ZeRO-1
and ZeRO-3, a checkpoint at every step (the last two kept). Per run:
  - the checkpoint before the last step, exported and loaded into a fresh model, gives on the last
    step's batches (every rank's, from the checkpoint's data position) the loss the run logged for
    its last step;
  - the newest export loads with stock safetensors and torch.load (shards with an index, bf16) in a
    process that imports neither hpctrain nor train_entry, and its parameters hash to the run's own
    final_params.sha256 (train_entry.state.params_sha256's recipe), bit for bit.
With DCP's files, stock `dcp.load` with our RawReader gives the same tensors. A transformers GPT-2
(DDP) exports as a from_pretrained folder that gives the last step's loss without hpctrain.
Bad input (no run, no checkpoint, no such step, an existing --out) is one line, exit 2, nothing
written; those use checkpoints of the runtime API (hpctrain.runtime), made in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctrain.cli import main
from hpctrain.kernel import jobenv

REPO = Path(__file__).resolve().parent.parent
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
STEPS = 4
VARIANTS = {
    "ddp": ["--strategy", "ddp"],
    "fsdp": ["--strategy", "fsdp"],
    "zero1": ["--strategy", "deepspeed", "--deepspeed.zero_stage=1"],
    "zero3": ["--strategy", "deepspeed", "--deepspeed.zero_stage=3"],
}


def cli(*args: str) -> object:
    return CliRunner().invoke(main, ["export", *args])


def one_line_exit_2(res: object, *words: str) -> str:
    out = res.output.strip()  # type: ignore[attr-defined]
    assert res.exit_code == 2, out  # type: ignore[attr-defined]
    assert len(out.splitlines()) == 1 and out.startswith("Error: "), out
    assert "Traceback" not in out
    for w in words:
        assert w in out, out
    return out


# ---------------------------------------------------------------- real runs
def train(run_dir: Path, *args: str) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith((jobenv.PREFIX, "RANK", "WORLD_SIZE", "MASTER_", "LOCAL_RANK"))
    }
    env.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{REPO / 'tests'}"  # the user code below
    env[jobenv.DEVICE] = "cpu"
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "train_entry"]
    cmd += ["--run-dir", str(run_dir), "--max-steps", str(STEPS), "--checkpoint-every", "1"]
    cmd += ["--train.log_every=1", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}\n{res.stderr[-3000:]}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("export-runs")
    done: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in done:
            train(root / name, *VARIANTS[name])
            done[name] = root / name
        return done[name]

    return get


def last_step_loss(run: Path, weights: dict) -> float:
    """The loss of the run's last step, recomputed: a fresh model with `weights` (the checkpoint
    of the step before), on every rank's batches of that step, averaged as the trainer does."""
    import torch

    from train_entry.config import TrainConfig, check_sizes
    from train_entry.data import build_batches
    from train_entry.model import build_model, compute_loss

    before = run / "checkpoints" / f"step-{STEPS - 1:08d}"
    cfg = TrainConfig.model_validate(json.loads((before / "config.json").read_text()))
    world = json.loads((before / "train_state.json").read_text())["world_size"]
    accum = check_sizes(cfg, world)
    position = json.loads((before / "train_state.json").read_text())["data"]
    model = build_model(cfg, rank=0, world_size=world)
    model.load_state_dict(weights, strict=True)
    total = torch.zeros(())
    with torch.no_grad():
        for rank in range(world):
            batches = build_batches(cfg, rank=rank, world_size=world)
            batches.restore(position)
            for _ in range(accum):
                total += compute_loss(model, next(batches)).float()
    return float(total) / (accum * world)


CLEAN = r"""
import hashlib, json, sys
import torch
from safetensors.torch import load_file

single, sharded = sys.argv[1], sys.argv[2]
sd = load_file(single + "/model.safetensors")
index = json.load(open(sharded + "/pytorch_model.bin.index.json"))
files = sorted(set(index["weight_map"].values()))
tb = {}
for f in files:
    tb.update(torch.load(sharded + "/" + f, map_location="cpu", weights_only=True))
digest = hashlib.sha256()  # train_entry.state.params_sha256, written out again
for name in sorted(sd):
    t = sd[name].contiguous()
    digest.update(f"{name}|{str(t.dtype).removeprefix('torch.')}|{tuple(t.shape)}\n".encode())
    digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
print(json.dumps({
    "sha256": digest.hexdigest(),
    "bf16_equal": sorted(tb) == sorted(sd)
    and all(torch.equal(tb[k], sd[k].to(torch.bfloat16)) for k in sd),
    "bf16_dtypes": sorted({str(t.dtype) for t in tb.values()}),
    "shards": len(files),
    "imported": sorted(m for m in sys.modules if m.split(".")[0] in ("hpctrain", "train_entry")),
}))
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "variant",
    [pytest.param(v, marks=[] if v == "zero1" else [pytest.mark.lane]) for v in VARIANTS],
)
def test_export_loads_without_hpctrain_and_gives_the_runs_loss(runs, variant, tmp_path):
    run = runs(variant)
    from safetensors.torch import load_file

    # the step before the last: loaded into a fresh model, the last step's loss
    res = cli(str(run), "--step", str(STEPS - 1), "--out", str(tmp_path / "before"), "--json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got["step"] == STEPS - 1 and got["files"] == ["model.safetensors"]
    weights = load_file(str(tmp_path / "before" / "model.safetensors"))
    logged = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert logged["step"] == STEPS
    loss = last_step_loss(run, weights)
    assert abs(loss - logged["loss"]) <= 1e-6 * logged["loss"], (variant, loss, logged["loss"])
    if (run / "checkpoints" / f"step-{STEPS - 1:08d}" / ".metadata").exists():
        # DCP's own load, with the reader we ship, as docs/export.md shows it
        import torch
        import torch.distributed.checkpoint as dcp

        from train_entry.checkpoint.reader import RawReader

        sd = {"app": {"model": {k: torch.zeros_like(v) for k, v in weights.items()}}}
        dcp.load(sd, storage_reader=RawReader(run / "checkpoints" / f"step-{STEPS - 1:08d}"))
        assert all(torch.equal(sd["app"]["model"][k], weights[k]) for k in weights)

    # the newest (default): one file, and bf16 shards with an index; read by stock tools only
    single = cli(str(run), "--out", str(tmp_path / "single"), "--json")
    assert single.exit_code == 0, single.output
    assert json.loads(single.output)["step"] == STEPS
    sharded = cli(
        str(run),
        "--format=torch",
        "--dtype=bf16",
        "--max-shard-size=20KB",
        "--out",
        str(tmp_path / "sharded"),
        "--json",
    )
    assert sharded.exit_code == 0, sharded.output
    meta = json.loads(sharded.output)
    assert meta["index"] == "pytorch_model.bin.index.json" and len(meta["files"]) > 3
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", CLEAN, str(tmp_path / "single"), str(tmp_path / "sharded")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    clean = json.loads(proc.stdout.strip().splitlines()[-1])
    assert clean["imported"] == []
    assert clean["sha256"] == (run / "final_params.sha256").read_text().strip()
    assert clean["bf16_equal"] and clean["bf16_dtypes"] == ["torch.bfloat16"]
    assert clean["shards"] == len(meta["files"]) - 1


# ---------------------------------------------------------------- bad input (runtime-API checkpoints)
@pytest.fixture
def script_run(tmp_path, monkeypatch):
    """A run folder with runtime-API checkpoints of steps 1 and 2 (rank 0, no process group)."""
    import torch

    from hpctrain import runtime

    run = tmp_path / "script-run"
    monkeypatch.setenv(jobenv.RUN_DIR, str(run))
    ckpt = runtime.Checkpoint(run / "checkpoints")
    model = torch.nn.Linear(4, 3)
    for step in (1, 2):
        with torch.no_grad():
            model.weight.fill_(step)
        ckpt.save(step, {"model": model.state_dict(), "step": step})
    return run


def test_runtime_checkpoint_exports(script_run, tmp_path):
    import torch
    from safetensors.torch import load_file

    res = cli(str(script_run), "--step", "1", "--out", str(tmp_path / "w1"))
    assert res.exit_code == 0, res.output
    assert "step 1" in res.output and "model.safetensors" in res.output
    got = load_file(str(tmp_path / "w1" / "model.safetensors"))
    assert sorted(got) == ["bias", "weight"] and torch.equal(got["weight"], torch.ones(3, 4))
    res = cli(str(script_run), "--json")  # newest, default place in the run folder
    out = Path(json.loads(res.output)["out"])
    assert out == script_run / "export" / "step-00000002-safetensors"
    assert load_file(str(out / "model.safetensors"))["weight"].eq(2).all()
    (script_run / "run.yaml").write_text("{}\n")  # a run as `hpctrain status` finds it: by name
    res = cli(
        "script-run", "--runs-dir", str(tmp_path), "--step", "1", "--format", "torch", "--json"
    )
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got["out"] == str(script_run / "export" / "step-00000001-torch")
    assert got["files"] == ["pytorch_model.bin"] and got["run"] == "script-run"


def test_no_such_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_line_exit_2(cli("nope"), "no run 'nope'")


def test_no_checkpoint(tmp_path):
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    one_line_exit_2(cli(str(empty)), "no verified checkpoint")


def test_step_not_found_lists_the_steps(script_run):
    one_line_exit_2(cli(str(script_run), "--step", "7"), "no checkpoint of step 7", "1, 2")
    assert not (script_run / "export").exists()


def test_existing_out_is_never_written(script_run, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    one_line_exit_2(cli(str(script_run), "--out", str(out)), "exists")
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (
        out / "keep.txt"
    ).read_text() == "mine"
    f = tmp_path / "file.safetensors"
    f.write_bytes(b"x")
    one_line_exit_2(cli(str(script_run), "--out", str(f)), "exists")
    assert f.read_bytes() == b"x"


def test_unverified_step_and_bad_size(script_run):
    state = script_run / "checkpoints" / "step-00000001" / "state.pt"
    state.write_bytes(state.read_bytes()[:-10])
    one_line_exit_2(cli(str(script_run), "--step", "1"), "does not verify", "truncated")
    one_line_exit_2(cli(str(script_run), "--max-shard-size", "lots"), "--max-shard-size")
    assert not (script_run / "export").exists()


def test_an_export_without_weights_writes_nothing(script_run, tmp_path):
    import torch

    from hpctrain import runtime

    runtime.Checkpoint(script_run / "checkpoints").save(3, {"weights": torch.ones(2)})
    out = tmp_path / "w"
    one_line_exit_2(cli(str(script_run), "--out", str(out)), "no model weights under 'model'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["script-run"]


# ---------------------------------------------------------------- a transformers model
def hf_gpt2(config):
    """User code (`--model test_export:hf_gpt2`): a tiny GPT-2, a transformers PreTrainedModel."""
    from transformers import GPT2Config, GPT2LMHeadModel

    m = config.model
    return GPT2LMHeadModel(
        GPT2Config(
            vocab_size=m.vocab_size,
            n_positions=m.seq_len,
            n_embd=32,
            n_layer=2,
            n_head=2,
            bos_token_id=0,
            eos_token_id=0,
            resid_pdrop=0.0,  # no dropout: the logged loss is then the eval loss
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
    )


def hf_data(config):
    """User data (`--data test_export:hf_data`): the demo task as Hugging Face batches."""
    from train_entry.data import Progressions

    class Data(Progressions):
        def __getitem__(self, i):
            x = super().__getitem__(i)["idx"]
            return {"input_ids": x, "labels": x}

    m = config.model
    return Data(vocab_size=m.vocab_size, seq_len=m.seq_len, num_samples=4096, seed=1)


HF_CLEAN = r"""
import json, sys
import torch
from transformers import AutoModelForCausalLM

out, batches = sys.argv[1], torch.load(sys.argv[2], weights_only=True)
model = AutoModelForCausalLM.from_pretrained(out)
with torch.no_grad():
    losses = [model(**b).loss.float() for b in batches]
print(json.dumps({
    "loss": float(sum(losses)) / len(losses),
    "type": type(model).__name__,
    "imported": sorted(m for m in sys.modules if m.split(".")[0] in ("hpctrain", "train_entry")),
}))
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_transformers_model_exports_as_a_save_pretrained_folder(tmp_path):
    """DDP on a GPT-2 from transformers: the export is a from_pretrained folder (config.json), and
    the model it loads (no hpctrain) gives the run's last-step loss on that step's batches."""
    pytest.importorskip("transformers")  # not in the compatibility lane's venv
    import torch

    from train_entry.config import TrainConfig, check_sizes
    from train_entry.data import build_batches

    run = tmp_path / "hf"
    train(
        run, "--strategy", "ddp", "--model", "test_export:hf_gpt2", "--data", "test_export:hf_data"
    )
    res = cli(str(run), "--step", str(STEPS - 1), "--out", str(tmp_path / "out"), "--json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert (
        got["huggingface"] and "config.json" in got["files"] and "model.safetensors" in got["files"]
    )

    before = run / "checkpoints" / f"step-{STEPS - 1:08d}"
    cfg = TrainConfig.model_validate(json.loads((before / "config.json").read_text()))
    state = json.loads((before / "train_state.json").read_text())
    accum = check_sizes(cfg, state["world_size"])
    batches = []
    for rank in range(state["world_size"]):
        stream = build_batches(cfg, rank=rank, world_size=state["world_size"])
        stream.restore(state["data"])
        batches += [next(stream) for _ in range(accum)]
    torch.save(batches, tmp_path / "batches.pt")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", HF_CLEAN, str(tmp_path / "out"), str(tmp_path / "batches.pt")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    clean = json.loads(proc.stdout.strip().splitlines()[-1])
    logged = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert clean["imported"] == [] and clean["type"] == "GPT2LMHeadModel"
    assert logged["step"] == STEPS
    assert abs(clean["loss"] - logged["loss"]) <= 1e-5 * logged["loss"], (clean, logged)
