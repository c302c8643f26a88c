"""TrainConfig and the train_entry CLI: bad input gives one clear message and exit 2, no traceback.

Most checks call the parser in-process (fast); a few run `python -m train_entry` to see the real
exit code and stderr, including with DeepSpeed hidden (the missing extra).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpctrain.kernel import jobenv
from hpctrain.kernel.errors import UserError, ValidationError
from train_entry.cli import main, parse
from train_entry.config import TrainConfig, all_keys, check_sizes, load_config

REPO = Path(__file__).resolve().parent.parent


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    e = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith((jobenv.PREFIX, "RANK", "WORLD_SIZE"))
    }
    e.update(OMP_NUM_THREADS="1", **env)
    return subprocess.run(
        [sys.executable, "-m", "train_entry", *args],
        capture_output=True,
        text=True,
        env=e,
        timeout=120,
        cwd=REPO,
    )


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "train.yaml"
    p.write_text(text)
    return p


# ---------------------------------------------------------------- loading and overrides
def test_defaults_file_and_overrides_layer(tmp_path):
    cfg_file = write(tmp_path, "strategy: fsdp\noptim:\n  lr: 0.01\ntrain:\n  max_steps: 7\n")
    cfg = load_config(
        cfg_file, ["--optim.lr", "3e-4", "--optim.betas=[0.8, 0.9]"], {"train.max_steps": 9}
    )
    assert cfg.strategy == "fsdp"
    assert cfg.optim.lr == 3e-4 and cfg.optim.betas == (0.8, 0.9)  # dotted flag beats the file
    assert cfg.train.max_steps == 9  # named flag beats the file
    assert cfg.schedule.decay == "cosine"  # default kept


def test_print_config_round_trips(capsys):
    assert main(["--print-config", "--optim.name=sgd", "--train.precision=bf16"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert TrainConfig.model_validate(printed) == load_config(
        None, ["--optim.name=sgd", "--train.precision=bf16"]
    )


def test_unknown_key_names_file_line_and_close_match(tmp_path):
    cfg_file = write(tmp_path, "train:\n  max_steps: 5\n  micro_bach: 4\n")
    with pytest.raises(ValidationError) as e:
        load_config(cfg_file)
    msg = str(e.value)
    assert f"{cfg_file}:3: train.micro_bach: unknown key; did you mean 'train.micro_batch'?" in msg


def test_duplicate_key_and_unknown_section(tmp_path):
    cfg_file = write(tmp_path, "train:\n  max_steps: 5\n  max_steps: 6\n")
    with pytest.raises(
        ValidationError, match=r"train.yaml:3: train.max_steps: duplicate key \(first on line 2\)"
    ):
        load_config(cfg_file)
    with pytest.raises(
        ValidationError, match=r"train.yaml:1: optimizer: unknown key; did you mean 'optim'\?"
    ):
        load_config(write(tmp_path, "optimizer:\n  lr: 1\n"))


def test_all_problems_at_once_with_origin(tmp_path):
    cfg_file = write(tmp_path, "optim:\n  lr: fast\n  name: adam\n")
    with pytest.raises(ValidationError) as e:
        load_config(cfg_file, ["--train.max_steps=0"])
    msg = str(e.value)
    assert msg.startswith("3 problems found:")
    assert f"{cfg_file}:2: optim.lr:" in msg and "'fast'" in msg
    assert f"{cfg_file}:3: optim.name:" in msg and "'adamw'" in msg and "'sgd'" in msg
    assert "--train.max_steps: Input should be greater than or equal to 1" in msg


def test_bad_yaml_and_non_mapping(tmp_path):
    with pytest.raises(UserError, match=r"train.yaml:3: not valid YAML: expected the node content"):
        load_config(write(tmp_path, "train:\n  max_steps: [1,\n"))
    with pytest.raises(
        UserError,
        match="train.yaml:1: the top level is not a mapping; fix: the config is a mapping of sections",
    ):
        load_config(write(tmp_path, "- 1\n"))


def test_every_key_has_a_description_and_is_in_help():
    text = run_cli("--help").stdout
    for key, desc in all_keys().items():
        assert desc, f"{key} has no description"
        assert f"--{key}=" in text
    for flag in (
        "--config",
        "--strategy",
        "--run-dir",
        "--max-steps",
        "--checkpoint-every",
        "--model",
        "--data",
        "--collate",
        "--profile-steps",
        "--print-config",
        "example:",
    ):
        assert flag in text


# ---------------------------------------------------------------- sizes
def test_indivisible_batch_prints_every_factor(monkeypatch):
    cfg = load_config(None, ["--train.global_batch=20", "--train.micro_batch=8"])
    with pytest.raises(UserError) as e:
        check_sizes(cfg, world=2)
    assert str(e.value.format_message()) == (
        "train.global_batch(20) is not divisible by world_size(2) * train.micro_batch(8) = 16; "
        "set train.global_batch to a multiple of 16"
    )
    cfg = load_config(
        None, ["--train.global_batch=32", "--train.micro_batch=4", "--train.grad_accum=3"]
    )
    with pytest.raises(
        UserError,
        match=r"global_batch\(32\) != world_size\(2\) \* train.micro_batch\(4\)"
        r" \* train.grad_accum\(3\) = 24",
    ):
        check_sizes(cfg, world=2)
    assert (
        check_sizes(
            load_config(None, ["--train.global_batch=32", "--train.micro_batch=4"]), world=2
        )
        == 4
    )


def test_world_size_against_topology(monkeypatch):
    monkeypatch.setenv(jobenv.NNODES, "2")
    monkeypatch.setenv(jobenv.GPUS_PER_NODE, "4")
    with pytest.raises(
        UserError,
        match=rf"WORLD_SIZE\(2\) != {jobenv.NNODES}\(2\) \* "
        rf"{jobenv.GPUS_PER_NODE}\(4\) = 8",
    ):
        check_sizes(TrainConfig(), world=2)
    assert check_sizes(load_config(None, ["--train.micro_batch=2"]), world=8) == 1


def test_cross_field_checks():
    with pytest.raises(ValidationError, match="n_heads=3 does not divide d_model=64"):
        load_config(None, ["--model.n_heads=3"])
    with pytest.raises(ValidationError, match="parameter offload needs zero_stage 3"):
        load_config(None, ["--strategy=deepspeed", "--deepspeed.offload_param=cpu"])
    with pytest.raises(ValidationError, match="set deepspeed.nvme_path"):
        load_config(
            None,
            [
                "--strategy=deepspeed",
                "--deepspeed.zero_stage=3",
                "--deepspeed.offload_optimizer=nvme",
            ],
        )


def test_deepspeed_json_is_validated_by_deepspeed(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    user = tmp_path / "ds.json"
    user.write_text('{"zero_optimization": {"stage": 7}}')
    with pytest.raises(UserError, match=f"{user}: DeepSpeed rejects the config"):
        parse(
            [
                "--strategy",
                "deepspeed",
                "--run-dir",
                str(tmp_path),
                f"--deepspeed.config_file={user}",
            ]
        )
    user.write_text('{"train_batch_size": 24}')
    with pytest.raises(
        UserError,
        match=r"train_batch_size\(24\) != train_micro_batch_size_per_gpu\(8\) \* "
        r"gradient_accumulation_steps\(1\) \* world_size\(2\) = 16",
    ):
        parse(
            [
                "--strategy",
                "deepspeed",
                "--run-dir",
                str(tmp_path),
                f"--deepspeed.config_file={user}",
            ]
        )
    user.write_text('{"zero_optimization": {"stage": 3, "overlap_comm": false}}')
    _, cfg, accum = parse(
        ["--strategy", "deepspeed", "--run-dir", str(tmp_path), f"--deepspeed.config_file={user}"]
    )
    from train_entry.strategies.deepspeed import build_config

    conf = build_config(cfg, world=2, accum=accum)
    assert conf["zero_optimization"] == {"stage": 3, "overlap_comm": False}
    assert conf["train_batch_size"] == 16 and conf["zero_force_ds_cpu_optimizer"] is False


def test_deepspeed_fp16_follows_the_accelerator(tmp_path, monkeypatch):
    """fp16 is refused with the fix where DeepSpeed's accelerator has no fp16, accepted where it has
    (DeepSpeed's CPU accelerator answers from oneDNN, so this depends on the CPU)."""
    monkeypatch.setenv(jobenv.DEVICE, "cpu")
    from deepspeed.accelerator import get_accelerator

    argv = ["--strategy", "deepspeed", "--run-dir", str(tmp_path), "--train.precision=fp16"]
    if get_accelerator().is_fp16_supported():
        _, cfg, _ = parse(argv)
        assert cfg.train.precision == "fp16"
        return
    with pytest.raises(
        UserError,
        match=r"train.precision=fp16: DeepSpeed has no fp16 on this device "
        r"\(cpu\); use --train.precision=bf16 or fp32",
    ):
        parse(argv)


# ---------------------------------------------------------------- the real command: exit 2, one line
@pytest.mark.parametrize(
    "args, message",
    [
        (["--strategy", "horovod"], "strategy: Input should be 'ddp', 'fsdp' or 'deepspeed'"),
        (["--optim.lrr=1"], "optim.lrr: unknown key; did you mean 'optim.lr'?"),
        (["--max-steps", "ten"], "argument --max-steps: invalid int value: 'ten'"),
        (["--train.global_batch=15"], "train.global_batch(15) is not divisible by world_size(1)"),
        (["--train.precision=fp8"], "train.precision: Input should be 'fp32', 'bf16' or 'fp16'"),
    ],
)
def test_bad_input_exit_2_one_clear_message(tmp_path, args, message):
    res = run_cli("--run-dir", str(tmp_path / "run"), *args)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert "Traceback" not in res.stderr and res.stdout == ""
    assert not (tmp_path / "run").exists()  # nothing created before the config is valid


def test_config_file_error_from_the_command(tmp_path):
    cfg_file = write(tmp_path, "data:\n  num_samples: -3\n")
    res = run_cli("--config", str(cfg_file), "--run-dir", str(tmp_path))
    assert res.returncode == 2
    assert (
        f"{cfg_file}:2: data.num_samples: Input should be greater than or equal to 1 (got -3)"
        in res.stderr
    )


def test_missing_run_dir(tmp_path):
    res = run_cli()
    assert res.returncode == 2 and f"pass --run-dir DIR or set {jobenv.RUN_DIR}" in res.stderr


def test_missing_deepspeed_extra(tmp_path):
    """DeepSpeed hidden by a shadow package that fails to import, as on a machine without it."""
    shadow = tmp_path / "shadow" / "deepspeed"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'deepspeed'\", name='deepspeed')\n"
    )
    res = run_cli(
        "--strategy",
        "deepspeed",
        "--run-dir",
        str(tmp_path / "run"),
        PYTHONPATH=str(tmp_path / "shadow"),
    )
    assert res.returncode == 2
    assert (
        res.stderr.strip() == "error: deepspeed is not installed: pip install 'hpctrain[deepspeed]'"
    )


def test_bad_user_factory(tmp_path):
    res = run_cli("--run-dir", str(tmp_path / "run"), "--model", "no_such_pkg.models:make")
    assert res.returncode == 2
    assert "model.factory 'no_such_pkg.models:make': cannot import no_such_pkg.models" in res.stderr
    assert "Traceback" not in res.stderr


def test_import_is_cheap_and_cli_errors_need_no_torch():
    code = (
        "import sys, train_entry; from train_entry.cli import parse\n"
        "try:\n    parse(['--optim.lrr=1'])\nexcept Exception:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 0, res.stderr


def test_the_config_is_read_with_the_profiles_safe_yaml_reader(tmp_path):
    # hpctrain.kernel.yamlsafe: no tags, anchors or aliases; every problem at once, file:line
    text = "train: &t\n  max_steps: !!python/object:os.system 5\noptim: *t\n"
    with pytest.raises(ValidationError) as e:
        load_config(write(tmp_path, text))
    msg = str(e.value)
    assert "train.yaml:1: train: anchor &t is not allowed" in msg
    assert "train.yaml:2: " in msg and "is not allowed (no tag may construct objects)" in msg
    assert "train.yaml:3: optim: alias *t is not allowed" in msg
