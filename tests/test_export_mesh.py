"""Export reads DCP generically: a checkpoint of DTensors laid out as tensor parallelism lays them
(a column-parallel Linear: weight rows split over the mesh; a row-parallel one: columns split),
written by train_entry's own storage layer on a real 2-rank gloo mesh, exports to the full tensors.

The launched script is this file's __main__ (torchrun, 2 processes); it writes the checkpoint
and, on rank 0, commits it with the kernel's sequence and saves the unsharded values to compare.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctrain.kernel import jobenv

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.lane
@pytest.mark.timeout(600)
def test_tensor_parallel_layouts_export_whole(tmp_path):
    import torch
    from safetensors.torch import load_file

    from hpctrain.cli import main

    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith((jobenv.PREFIX, "RANK", "WORLD_SIZE", "MASTER_", "LOCAL_RANK"))
    }
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    torchrun = str(Path(sys.executable).parent / "torchrun")
    cmd = [torchrun, "--standalone", "--nproc-per-node", "2", __file__, str(tmp_path / "run")]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]

    folder = tmp_path / "run" / "checkpoints" / "step-00000001"
    chunks = json.loads((tmp_path / "run" / "chunks.json").read_text())
    assert chunks["app.model.0.weight"] == [[0, 0], [6, 0]]  # rows split (column-parallel)
    assert chunks["app.model.2.weight"] == [[0, 0], [0, 6]]  # columns split (row-parallel)
    out = CliRunner().invoke(
        main, ["export", str(tmp_path / "run"), "--out", str(tmp_path / "w"), "--json"]
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["checkpoint"] == str(folder)
    got = load_file(str(tmp_path / "w" / "model.safetensors"))
    full = torch.load(tmp_path / "run" / "full.pt", weights_only=True)
    assert sorted(got) == sorted(full)
    for k in full:
        assert torch.equal(got[k], full[k]), k


def main(run: Path) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from hpctrain.kernel.checkpoint import publish, staging_name, step_name, write_manifest
    from train_entry.checkpoint.writer import HashingWriter

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)  # the same values on every rank before sharding
    model = nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 6))
    model[0].weight.data += torch.arange(96.0).reshape(12, 8)  # every element distinct
    full = {k: v.detach().clone() for k, v in model.state_dict().items()}
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    sd = get_model_state_dict(model)
    ckpt = run / "checkpoints"
    staging, final = ckpt / staging_name(1), ckpt / step_name(1)
    writer = HashingWriter(staging)
    md = dcp.save({"app": {"model": sd}}, storage_writer=writer)
    writer.durable()
    dist.barrier()
    if rank == 0:
        write_manifest(staging, final, {"step": 1, "strategy": "fsdp", "world_size": 2})
        publish(staging, final)
        torch.save(full, run / "full.pt")
        meta = md.state_dict_metadata
        chunks = {
            k: sorted(list(c.offsets) for c in m.chunks)
            for k, m in meta.items()
            if k.endswith("weight")
        }
        (run / "chunks.json").write_text(json.dumps(chunks))
    dist.barrier()


if __name__ == "__main__":
    from train_entry.dist import exit_now

    main(Path(sys.argv[1]))
    exit_now(0)
