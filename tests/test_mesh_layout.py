"""The parallel layout's one validation (hpctrain/kernel/mesh.py) and train_entry's parallel keys."""

from __future__ import annotations

import pytest

from hpctrain.kernel import mesh
from hpctrain.kernel.errors import UserError, ValidationError
from train_entry.config import check_sizes, load_config


def _lines(**kw: object) -> list[str]:
    return [str(p) for p in mesh.check_layout(**kw)]  # type: ignore[arg-type]


def test_valid_layouts_have_no_problem_and_dp_fills_the_rest() -> None:
    assert _lines(world=4, tp=2, gpus_per_node=2, strategy="fsdp") == []
    assert _lines(world=8, tp=2, pp=2, gpus_per_node=4, n_layers=4, strategy="fsdp") == []
    assert _lines(world=128, tp=8, pp=16, gpus_per_node=8, n_layers=128) == []
    assert mesh.Layout.of(8, tp=2, pp=2) == mesh.Layout(dp=2, tp=2, pp=2)
    assert mesh.Layout.of(8, tp=2, pp=2).shape == (2, 2, 2)  # ("pp", "dp", "tp")
    assert mesh.Layout(dp=2, tp=2).describe() == "dp 2 x tp 2"
    assert mesh.Layout().describe() == "dp 1"


@pytest.mark.parametrize(
    ("kw", "key", "fix"),
    [
        (dict(world=6, tp=3, gpus_per_node=2), "parallel.tp", "set --parallel.tp to one of 1, 2"),
        (dict(world=9, pp=3, n_layers=8), "parallel.pp", "set --parallel.pp to one of 2, 4, 8"),
        (dict(world=6, tp=2, pp=2), "parallel", "multiple of 4"),
        (dict(world=4, tp=2, strategy="deepspeed"), "strategy", "use --strategy fsdp"),
        (dict(world=4, pp=2, strategy="ddp"), "strategy", "use --strategy fsdp"),
        (dict(world=4, pp=2, microbatches=1), "parallel.microbatches", "--parallel.microbatches 2"),
        (dict(world=4, schedule="interleaved_1f1b"), "parallel.schedule", "--parallel.pp 2"),
        (
            dict(world=4, pp=2, n_layers=2, schedule="interleaved_1f1b"),
            "parallel.pp",
            "multiple of 4",
        ),
        (dict(world=4, pp=2, micro_batch=3), "train.micro_batch", "multiple of 2"),
    ],
)
def test_each_bad_layout_is_one_problem_with_its_key_and_fix(kw: dict, key: str, fix: str) -> None:
    found = mesh.check_layout(**kw)
    assert [p.key for p in found if p.key == key] == [key], [str(p) for p in found]
    assert any(fix in p.message for p in found), [str(p) for p in found]


def test_every_problem_is_returned_not_only_the_first() -> None:
    keys = [p.key for p in mesh.check_layout(world=6, tp=4, pp=3, gpus_per_node=2, n_layers=8)]
    assert keys == ["parallel", "parallel.tp", "parallel.pp"]


def test_the_batch_is_per_data_parallel_rank() -> None:
    cfg = load_config(None, ["--strategy=fsdp", "--parallel.tp=2", "--parallel.pp=2"])
    cfg.model.n_layers = 4
    # 8 ranks, dp 2: the default global batch 16 stays, 8 samples per data-parallel rank
    assert check_sizes(cfg, world=8, gpus_per_node=4) == 1
    assert (cfg.train.global_batch, cfg.train.micro_batch) == (16, 8)
    cfg = load_config(None, ["--strategy=fsdp", "--parallel.tp=2", "--train.global_batch=12"])
    with pytest.raises(UserError) as e:
        check_sizes(cfg, world=4, gpus_per_node=2)
    assert "not divisible by dp(2) (world_size(4) / (tp x pp)) * train.micro_batch(8)" in str(
        e.value
    )


def test_a_bad_layout_in_train_entry_lists_every_problem() -> None:
    # an explicit ddp (the default strategy would become fsdp for a layout: issue 34)
    cfg = load_config(None, ["--strategy=ddp", "--parallel.tp=2", "--parallel.pp=3"])
    with pytest.raises(ValidationError) as e:
        check_sizes(cfg, world=8, gpus_per_node=4)
    text = str(e.value)
    assert "3 problems found" in text
    assert "--parallel: world size(8) is not divisible by tp(2) * pp(3) = 6" in text
    assert "--parallel.pp: pp(3) stages do not divide the model's 2 layers" in text
    assert "--strategy: ddp (DistributedDataParallel) does not compose with tp/pp" in text


def test_a_user_model_without_plan_or_split_is_told_what_to_provide() -> None:
    with pytest.raises(ValidationError) as e:
        load_config(None, ["--model.factory=pkg.mod:make", "--parallel.tp=2", "--parallel.pp=2"])
    text = str(e.value)
    assert "parallel.tp_plan: parallel.tp=2 with your model (pkg.mod:make) needs" in text
    assert "parallel.pp_split: parallel.pp=2 with your model (pkg.mod:make) needs" in text
    assert "examples/gpt_parallel.py" in text
