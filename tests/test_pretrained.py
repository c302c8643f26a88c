"""`--model hf:<folder>` on the local profile: the loss at step 0 equals transformers'
from_pretrained loss on the same batch for DDP, FSDP2, FSDP2 x TP 2 and PP 2; with lr 0 the export
gives the input tensors back bit for bit (and from_pretrained loads it); bad folders are refused
at submit in one line, exit 2, nothing queued; `plan` counts the folder's parameters without torch.

The folders are made here (tests/_hf.py: Llama untied, Qwen2 tied, 6 safetensors files each).
The four runs start together (one optimizer step each) and share the module's fixture.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import _hf
import pytest
import torch
from click.testing import CliRunner
from test_parallel_layouts import Home, losses

from hpctrain import dispatch
from hpctrain.cli import main
from hpctrain.runs.folder import RunDir

# float32 rounding: the layouts sum the same products in other orders (measured <= 5e-7)
LOSS_TOL = 1e-5
COMMON = ["--max-steps", "1", "--optim.lr", "0", "--data.shuffle=false"]
# name -> (architecture, ranks, flags); the one 4-rank run is FSDP2 x TP 2
RUNS = {
    "ddp": ("qwen2", 2, ["--strategy", "ddp"]),
    "fsdp": ("llama", 2, ["--strategy", "fsdp"]),
    "tp": ("qwen2", 4, ["--strategy", "fsdp", "--parallel.tp", "2"]),
    "pp": ("llama", 2, ["--strategy", "fsdp", "--parallel.pp", "2"]),
}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Home:
    root = tmp_path_factory.mktemp("hf")
    for arch in _hf.ARCHS:
        _hf.make(root / arch, arch)
    return Home(root)


@pytest.fixture(scope="module")
def runs(home: Home) -> dict[str, Path]:
    """The four runs, submitted together, each to its end."""
    for name, (arch, ranks, flags) in RUNS.items():
        home.hp(
            "submit", "--profile", "local", "--nodes", "1", "--gpus", str(ranks),
            "--name", name, "--", "--model", f"hf:{home.root / arch}", *COMMON, *flags,
        )  # fmt: skip
    out = {name: home.root / "runs" / name for name in RUNS}
    for name, run in out.items():
        state = dispatch.wait(RunDir(run), poll_s=0.5)
        assert state == "COMPLETED", f"{name}: {state}\n{(run / 'train.log').read_text()}"
    return out


@pytest.mark.parametrize("name", list(RUNS))
def test_step0_loss_is_from_pretrained_loss(home, runs, name):
    """Global batch 16, unshuffled: samples 0..15 in every layout (dp 2 x 8, or pp's 2 x 8)."""
    arch = RUNS[name][0]
    want = _hf.reference_loss(home.root / arch, _hf.demo_batch(list(range(16))))
    got = losses(runs[name])[1]
    assert abs(got - want) <= LOSS_TOL, f"{name} ({arch}): {got} vs from_pretrained {want}"


@pytest.mark.parametrize("name", ["tp", "pp"])
def test_export_gives_back_the_input_bit_for_bit(home, runs, name):
    """lr 0: the export of the 2D (tied) run and of the pipeline run is the input folder, the
    same names (the tied head once, as transformers writes it), dtypes and bytes; transformers
    loads it without hpctrain."""
    arch = RUNS[name][0]
    out = home.root / f"export-{name}"
    res = CliRunner().invoke(
        main, ["export", name, "--runs-dir", str(home.root / "runs"), "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    given, back = _hf.tensors(home.root / arch), _hf.tensors(out)
    assert sorted(back) == sorted(given)
    for key, t in given.items():
        assert back[key].dtype == t.dtype and torch.equal(back[key], t), key
    import transformers  # lazy: an optional extra

    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert sum(p.numel() for p in model.parameters()) == sum(t.numel() for t in given.values())


def _refused(home: Home, folder: Path, *flags: str) -> str:
    """`submit` of this folder: exit 2, one line naming the file, nothing queued. In this process
    (what `submit` checks itself needs no torch); the TP plan is checked by train_entry --check."""
    with contextlib.chdir(home.root):
        res = CliRunner().invoke(
            main,
            ["submit", "--profile", "local", "--gpus", "2", "--name", "bad",
             "--", "--model", f"hf:{folder}", *flags],
            env=home.env,
        )  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and not (home.root / "runs" / "bad").exists()
    return res.output


def test_bad_folders_are_refused_before_anything_is_queued(home, tmp_path):
    llama = home.root / "llama"
    empty = tmp_path / "empty"
    empty.mkdir()
    err = _refused(home, empty)
    assert f"{empty / 'config.json'}: no config.json there" in err, err
    # config.json says one width, the files hold another: the file and the tensor are named
    wrong = tmp_path / "wrong"
    shutil.copytree(llama, wrong)
    config = json.loads((wrong / "config.json").read_text())
    (wrong / "config.json").write_text(json.dumps(config | {"vocab_size": 96}))
    err = _refused(home, wrong)
    index = _hf.index(wrong)
    file = wrong / index["model.embed_tokens.weight"]
    assert f"{file}: model.embed_tokens.weight: shape [64, 32] disagrees with" in err, err
    # a shard named by the index is missing
    gone = tmp_path / "gone"
    shutil.copytree(llama, gone)
    (gone / index["lm_head.weight"]).unlink()
    assert f"{gone / index['lm_head.weight']}: missing" in _refused(home, gone)
    # an architecture transformers gives no tensor-parallel plan (GPT-2), with tp 2
    import transformers  # lazy: an optional extra

    gpt2 = tmp_path / "gpt2"
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=64)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(gpt2)
    err = _refused(home, gpt2, "--parallel.tp", "2")
    assert f"{gpt2 / 'config.json'}: base_model_tp_plan: GPT2Config has no tensor-parallel" in err


def test_plan_counts_the_folder_without_torch(home):
    """The count is the headers' (exact: the tied head once), as from_pretrained counts it."""
    folder = home.root / "qwen2"
    code = (
        "import sys; from hpctrain.cli import main; "
        f"main(['plan', '--model', 'hf:{folder}', '--nodes', '1', '--gpus', '2', "
        "'--gpu-mem-gib', '80'], standalone_mode=False); "
        "assert 'torch' not in sys.modules, 'plan imported torch'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    n = sum(t.numel() for t in _hf.tensors(folder).values())
    assert f"{n:,} parameters" in out.stdout, out.stdout
    assert "shape: 2 layers, hidden 32, 4 heads" in out.stdout, out.stdout


@pytest.mark.parametrize("arch", _hf.ARCHS)
def test_a_bf16_folder_loads_as_from_pretrained_does(home, tmp_path, arch):
    """In this process, no ranks (the whole-model path DDP and DeepSpeed take): a bf16 folder
    read into float32 master weights equals from_pretrained(dtype=float32) in every parameter and
    buffer (the rotary inv_freq recomputed, not left empty); a tied head stays one tensor."""
    import transformers  # lazy: an optional extra

    from hpctrain.kernel import hffolder
    from train_entry.config import TrainConfig
    from train_entry.pretrained.build import meta_model
    from train_entry.pretrained.load import materialize

    folder = tmp_path / arch
    transformers.AutoModelForCausalLM.from_pretrained(home.root / arch).to(
        torch.bfloat16
    ).save_pretrained(folder, max_shard_size="20KB")
    assert len(_hf.files(folder)) >= 2
    model = meta_model(TrainConfig.model_validate({"model": {"factory": f"hf:{folder}"}}))
    materialize(model, hffolder.read(folder), torch.device("cpu"))
    want = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    got_state, want_state = model.state_dict(), want.state_dict()
    assert sorted(got_state) == sorted(want_state)
    for key, t in want_state.items():
        assert got_state[key].dtype == torch.float32 and torch.equal(got_state[key], t), key
    for (key, b), (_, w) in zip(model.named_buffers(), want.named_buffers(), strict=True):
        assert torch.equal(b, w), key
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    assert tied == (arch == "qwen2")
