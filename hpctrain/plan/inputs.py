"""The planner's inputs: the model's size (a parameter count, or a factory built on the meta
device), the GPU memory (a flag, the profile's slurm.gpu_mem_gib, or this machine's RAM for CPU
workers) resolved into a hpctrain.plan.Workload."""

from __future__ import annotations

import importlib
import math
import os
import sys

from hpctrain.kernel import hffolder
from hpctrain.kernel.errors import UserError
from hpctrain.plan.model import GIB, Workload
from hpctrain.plan.snapshots import meminfo_gib, node_memory_gib
from hpctrain.profiles import resolve

# Beyond these no real run goes (the largest models have ~2e12 parameters, ~130 layers); a typo's
# 10**24 would make the layout search loop for hours.
MAX_PARAMS = 10**15
MAX_GIB = 2.0**20  # a PiB of memory per GPU or node
LIMITS = {
    "nodes": 100_000,
    "gpus": 100_000,
    "domain": 100_000,
    "layers": 10_000,
    "heads": 100_000,
    "hidden": 10**7,
    "seq_len": 10**9,
    "micro_batch": 10**9,
    "global_batch": 10**12,
}


def check_sizes(counts: dict[str, int | None], mems: dict[str, float | None]) -> None:
    """One line for a count or memory no machine has (inf, nan, 10**24), naming its flag."""
    for key, value in counts.items():
        most = MAX_PARAMS if key == "params" else LIMITS[key]
        if value is not None and value > most:
            text = str(value)
            shown = text if len(text) <= 24 else f"{text[:6]}... ({len(text)} digits)"
            raise UserError(
                f"--{key.replace('_', '-')} {shown}: not a realistic value (at most {most:,}); "
                "give a real one"
            )
    for key, mem in mems.items():
        if mem is not None and not (math.isfinite(mem) and 0 < mem <= MAX_GIB):
            what = (
                "the memory in GiB, a number above 0 and "
                f"at most {MAX_GIB:,.0f} (80 for an 80 GiB GPU)"
                if key.endswith("_gib")
                else f"a number above 0 and at most {MAX_GIB:,.0f}"
            )
            raise UserError(f"--{key.replace('_', '-')} {mem}: give {what}")


def workload(
    *,
    params: int | None,
    model: str | None,
    precision: str,
    optimizer: str,
    nodes: int,
    gpus: int,
    gpu_mem_gib: float | None,
    profile: str | None,
    micro_batch: int | None = None,
    seq_len: int | None = None,
    hidden: int | None = None,
    layers: int | None = None,
    host_mem_gib: float | None = None,
    heads: int | None = None,
    global_batch: int | None = None,
    schedule: str = "1f1b",
    domain: int | None = None,
    inter_gbps: float | None = None,
    intra_gbps: float | None = None,
    tflops: float | None = None,
) -> Workload:
    """Resolve the inputs (model size, GPU memory, the fast-link domain and the bandwidth between
    nodes from the flags or the profile) into a Workload."""
    if (params is None) == (model is None):
        raise UserError(
            "give exactly one of --params N or --model pkg.mod:factory (or hf:<folder>)"
        )
    check_sizes(
        {
            "params": params,
            "nodes": nodes,
            "gpus": gpus,
            "domain": domain,
            "layers": layers,
            "heads": heads,
            "hidden": hidden,
            "seq_len": seq_len,
            "micro_batch": micro_batch,
            "global_batch": global_batch,
        },
        {
            "gpu_mem_gib": gpu_mem_gib,
            "host_mem_gib": host_mem_gib,
            "inter_gbps": inter_gbps,
            "intra_gbps": intra_gbps,
            "tflops": tflops,
        },
    )
    if profile is not None and inter_gbps is None:  # what the preflight gate expects between nodes
        inter_gbps = resolve(profile).preflight.expected_busbw_gbps
    largest = None
    if model is not None:
        params, largest = count_params(model)
        shape = _folder_shape(model)  # an hf: folder's config.json fills what was not given
        hidden = hidden or shape.get("hidden_size")
        layers = layers or shape.get("num_hidden_layers")
        heads = heads or shape.get("num_attention_heads")
    mem, host_mem_gib, domain = _memory(
        profile, nodes=nodes, gpus=gpus, gpu=gpu_mem_gib, host=host_mem_gib, domain=domain
    )
    # the profile's values (or a --model's count) pass the same bounds as the flags
    check_sizes(
        {"params": params, "domain": domain}, {"gpu_mem_gib": mem, "host_mem_gib": host_mem_gib}
    )
    assert params is not None  # exactly one of params and model was given, checked above
    return Workload(
        params=int(params),
        precision=precision,
        optimizer=optimizer,
        nodes=nodes,
        gpus=gpus,
        gpu_mem_bytes=int(mem * GIB),
        micro_batch=micro_batch,
        seq_len=seq_len,
        hidden=hidden,
        layers=layers,
        host_mem_bytes=None if host_mem_gib is None else int(host_mem_gib * GIB),
        largest_param=largest,
        heads=heads,
        global_batch=global_batch,
        schedule=schedule,
        domain=None if domain is None else min(domain, gpus),  # TP stays inside a node
        inter_gbps=inter_gbps,
        intra_gbps=intra_gbps,
        tflops=tflops,
    )


def _memory(
    profile: str | None,
    *,
    nodes: int,
    gpus: int,
    gpu: float | None,
    host: float | None,
    domain: int | None,
) -> tuple[float, float | None, int | None]:
    """(GPU memory GiB, host memory GiB per node, fast-link domain GPUs): the flags', else the
    profile's; the GPU memory must be known."""
    if profile is not None and None in (gpu, domain, host):
        pmem, phost, pdomain = _profile_memory(profile, nodes=nodes, gpus=gpus)
        gpu = gpu if gpu is not None else pmem
        host = host if host is not None else phost
        domain = domain if domain is not None else pdomain
    if domain is not None and not (domain % gpus == 0 or gpus % domain == 0):
        raise UserError(
            f"fast-link domain of {domain} GPUs and {gpus} GPUs per node: one must divide the "
            "other; fix --domain (or the profile's slurm.gpus_per_domain)"
        )
    if gpu is None:
        where = f"profile {profile!r} has no slurm.gpu_mem_gib" if profile else "no --profile given"
        raise UserError(
            f"GPU memory unknown ({where}): set slurm.gpu_mem_gib in the site profile, or "
            "pass --gpu-mem-gib M to hpctrain plan"
        )
    return gpu, host, domain


def _profile_memory(
    name: str, *, nodes: int, gpus: int
) -> tuple[float | None, float | None, int | None]:
    """(GPU memory GiB, host memory GiB per node, fast-link domain GPUs) from a profile. A profile
    without GPUs (local, CPU workers) shares this machine's RAM between all its workers."""
    slurm = resolve(name).slurm
    host = node_memory_gib(slurm.mem, gpu_mem_gib=slurm.gpu_mem_gib, gpus=slurm.gpus_per_node)
    if slurm.gpu_mem_gib is None and not (slurm.gpus_per_node or 0):
        ram = meminfo_gib()
        if ram:
            return ram / max(1, nodes * gpus), ram, slurm.gpus_per_domain
    return slurm.gpu_mem_gib, host, slurm.gpus_per_domain


def _folder_shape(spec: str) -> dict[str, int]:
    path = hffolder.folder_of(spec)
    if path is None:
        return {}
    f = hffolder.read(path)
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads")
    return {k: v for k in keys if (v := f.int(k)) is not None}


def count_params(spec: str) -> tuple[int, int]:
    """(parameters, largest parameter's elements) of `pkg.mod:factory()`, built on the meta
    device: no memory, no weights. `hf:<folder>`: from its safetensors headers' shapes (exact, no
    torch; a tied head is stored once, and counted once)."""
    path = hffolder.folder_of(spec)
    if path is not None:
        folder = hffolder.read(path)
        sizes = [math.prod(t.shape) for t in folder.tensors.values()]
        if not sizes:
            raise UserError(f"--model {spec!r}: the folder's safetensors hold no tensors")
        return sum(sizes), max(sizes)
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise UserError(
            f"--model {spec!r}: expected pkg.module:factory (a callable returning an nn.Module)"
        )
    if "" not in sys.path and os.getcwd() not in sys.path:
        # as `python -m` (submit's nodes, train_entry) finds it: the current folder first
        sys.path.insert(0, os.getcwd())
    try:
        factory = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as e:
        raise UserError(f"--model {spec!r}: cannot import: {e}") from None
    import torch  # lazy: torch on a torch-free path (--model only)

    with torch.device("meta"):
        model = factory()
    if not isinstance(model, torch.nn.Module):
        raise UserError(
            f"--model {spec!r}: the factory returned {type(model).__name__}, not a torch.nn.Module"
        )
    sizes = [p.numel() for p in model.parameters()]  # parameters() skips tied duplicates
    if not sizes:
        raise UserError(f"--model {spec!r}: the model has no parameters")
    return sum(sizes), max(sizes)
