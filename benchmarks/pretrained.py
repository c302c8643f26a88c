"""Loading a pretrained model (`--model hf:<folder>`) on 4 ranks with FSDP2, against a factory that
calls transformers' from_pretrained on every rank and then shards (what a user wrote before).

Rows (CPU, gloo, 4 ranks; a Llama of HIDDEN x LAYERS with a 32k vocabulary, 74M parameters, saved
in bf16 (148 MB) and again in float32 (297 MB), 2-3 safetensors files; both sides end with the
same FSDP2-sharded float32 model in memory):
  - peak host memory per rank while loading: the rise of the process's peak resident set
    (VmHWM, reset through /proc/self/clear_refs just before the load) over its resident set then
    (imports and the process group already paid), hf: over from_pretrained; the ranks' median per
    repetition. Target <= 0.35 (each rank holds a quarter; it reads only that).
  - load time: the slowest rank's seconds from nothing to the sharded, loaded model, hf: over
    from_pretrained. Target <= 1.0.
The two sides alternate, 3 pairs on the bf16 folder (the targets), 1 on the float32 one (stated);
each folder is made once (torch.manual_seed(0)) in a scratch folder. pretrained_noise_
from_pretrained_twice (stated): the bf16 from_pretrained loads' time, each over the one before.

    .venv/bin/python -c "from benchmarks import pretrained; print(pretrained.run(quick=True))"
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

from benchmarks import common

RANKS = 4
HIDDEN, LAYERS, VOCAB, INTER = 768, 4, 32000, 2048
SIDES = {
    "hf": "train_entry's load: meta model from config.json, fully_shard, to_empty, each rank "
    "reads its rows of every tensor (safetensors get_slice)",
    "from_pretrained": "AutoModelForCausalLM.from_pretrained(folder) on every rank, then the same "
    "fully_shard",
}


def _make(folder: Path, dtype: str) -> Path:
    import torch  # lazy: the harness imports this module without torch
    import transformers  # lazy: an optional extra (hpctrain[hf])

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        num_hidden_layers=LAYERS,
        num_attention_heads=12,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    )
    auto = transformers.AutoModelForCausalLM
    model = auto.from_config(cfg, dtype=torch.float32)  # type: ignore[no-untyped-call]
    cast = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    model.to(cast).save_pretrained(folder, max_shard_size="120MB")
    return folder


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise NotImplementedError(key)


def worker(side: str, folder: str, out: str) -> None:
    """One rank of one side (run under torchrun)."""
    import torch  # lazy: the worker's own imports; the harness imports this module without torch
    import torch.distributed as dist  # lazy: as above
    import transformers  # lazy: as above

    from hpctrain.kernel import hffolder  # lazy: as above
    from train_entry.config import TrainConfig  # lazy: as above
    from train_entry.pretrained.build import meta_model  # lazy: as above
    from train_entry.pretrained.load import materialize  # lazy: as above
    from train_entry.strategies.fsdp import FSDPStrategy  # lazy: as above

    dist.init_process_group("gloo")
    rank, cpu = dist.get_rank(), torch.device("cpu")
    # both sides' imports paid before the measurement: only the load is measured
    _ = transformers.AutoModelForCausalLM, transformers.LlamaForCausalLM
    cfg = TrainConfig.model_validate({"strategy": "fsdp", "model": {"factory": f"hf:{folder}"}})
    dist.barrier()
    gc.collect()
    before = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    start = time.perf_counter()
    if side == "hf":
        model = meta_model(cfg)
        FSDPStrategy.shard(model, cfg=cfg, device=cpu)
        materialize(model, hffolder.read(Path(folder)), cpu)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        FSDPStrategy.shard(model, cfg=cfg, device=cpu)
    took = time.perf_counter() - start
    peak = _status("VmHWM") - before
    Path(out, f"rank-{rank}.json").write_text(json.dumps({"s": took, "peak": peak}))
    dist.barrier()
    dist.destroy_process_group()


def _side(side: str, folder: Path) -> tuple[float, float]:
    """(median peak rise over the ranks, bytes; the slowest rank's load seconds)."""
    out = common.scratch(f"hfload-{side}-")
    common.run(
        [*common.torchrun(RANKS), "-m", "benchmarks.pretrained", side, str(folder), str(out)],
        timeout=600,
    )
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    if len(rows) != RANKS:
        raise common.NotMeasured(f"{side}: {len(rows)} of {RANKS} ranks reported")
    return common.median([r["peak"] for r in rows]), max(r["s"] for r in rows)


def _pairs(
    dtype: str, reps: int
) -> tuple[list[float], list[float], list[float], dict[str, object]]:
    """(memory ratios, time ratios, from_pretrained's seconds, details) of `reps` alternating pairs
    on a folder of `dtype`."""
    folder = _make(common.scratch(f"hfload-{dtype}-") / "llama", dtype)
    mem, secs, fp, sizes = [], [], [], []
    for _ in range(reps):
        hf_peak, hf_s = _side("hf", folder)
        fp_peak, fp_s = _side("from_pretrained", folder)
        mem.append(hf_peak / fp_peak)
        secs.append(hf_s / fp_s)
        fp.append(fp_s)
        sizes.append(
            {
                "hf_mb": round(hf_peak / 1e6, 1),
                "from_pretrained_mb": round(fp_peak / 1e6, 1),
                "hf_s": round(hf_s, 3),
                "from_pretrained_s": round(fp_s, 3),
            }
        )
    files_mb = sum(p.stat().st_size for p in folder.glob("*.safetensors")) / 1e6
    details = {"ranks": RANKS, "file_dtype": dtype, "files_mb": round(files_mb, 1)}
    return mem, secs, fp, details | {"sides": SIDES, "sizes": sizes}


def run(quick: bool) -> list[common.Row]:
    """The folder in bf16 (as published checkpoints are) trained in float32 (the master weights):
    the targets. The same folder in float32 (no cast: from_pretrained maps the files and copies
    only what fully_shard keeps): stated."""
    rows: list[common.Row] = []
    noise = "pretrained_noise_from_pretrained_twice"
    for dtype, mem_t, time_t, reps in (("bf16", "<= 0.35", "<= 1.0", 3), ("fp32", "-", "-", 1)):
        names = (
            f"pretrained load ({dtype} files): peak host memory per rank vs from_pretrained",
            f"pretrained load ({dtype} files): time vs from_pretrained",
        )
        if not Path("/proc/self/clear_refs").exists():
            rows += [
                common.not_measured(n, t, "needs Linux /proc")
                for n, t in zip(names, (mem_t, time_t), strict=True)
            ]
            continue
        try:
            mem, secs, fp_s, details = _pairs(dtype, common.reps(1 if quick else reps))
        except common.NotMeasured as e:
            rows += [
                common.not_measured(n, t, str(e))
                for n, t in zip(names, (mem_t, time_t), strict=True)
            ]
            continue
        rows += [
            common.settle(names[0], mem, mem_t, **details),
            common.settle(names[1], secs, time_t, **details),
        ]
        if dtype == "bf16":
            rows.append(
                common.noise(
                    noise,
                    common.successive(fp_s),
                    "the bf16 folder's from_pretrained loads: the slowest rank's seconds, each "
                    "over the one before it",
                    from_pretrained_s=[round(x, 3) for x in fp_s],
                )
                if len(fp_s) > 1
                else common.not_measured(noise, "-", "one pair (--quick): nothing to compare")
            )
    return rows


if __name__ == "__main__":
    worker(*sys.argv[1:4])
    os._exit(0)  # gloo's threads: nothing left to flush
