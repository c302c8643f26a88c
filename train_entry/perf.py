"""Model FLOPs utilisation (MFU): achieved training FLOPs over the devices' peak, where the device
is known (a GPU in PEAK_TFLOPS; a CPU has no agreed peak, so no MFU there).

Training FLOPs per token: 6 N (forward 2N, backward 4N over N parameters) plus attention's
12 L d T (PaLM's appendix B; L layers, width d, T tokens of context). The same formula as
torchtitan and nanoGPT, so the figures compare.
"""

from __future__ import annotations

import torch

from train_entry.config import TrainConfig

# Dense peak TFLOPs per GPU by name fragment and compute dtype (vendor data sheets, no sparsity);
# fp32 is TF32 on Ampere and later (torch's default for matmuls when allowed).
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989.0, "fp16": 989.0, "fp32": 494.0},
    "H100": {"bf16": 989.0, "fp16": 989.0, "fp32": 494.0},
    "A100": {"bf16": 312.0, "fp16": 312.0, "fp32": 156.0},
    "L40S": {"bf16": 362.0, "fp16": 362.0, "fp32": 183.0},
    "A10": {"bf16": 125.0, "fp16": 125.0, "fp32": 62.5},
    "V100": {"fp16": 125.0, "fp32": 15.7},
}


def peak_flops(device: torch.device, precision: str) -> float | None:
    """One device's peak FLOP/s at this precision, None when unknown (CPU, a GPU not listed)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for fragment, peaks in PEAK_TFLOPS.items():
        if fragment in name and precision in peaks:
            return peaks[precision] * 1e12
    return None


def flops_per_token(n_params: int, cfg: TrainConfig) -> float:
    """Training FLOPs per token: 6N, plus attention for the demo GPT (its sizes are known)."""
    flops = 6.0 * n_params
    if cfg.model.factory is None:
        m = cfg.model
        flops += 12.0 * m.n_layers * m.d_model * m.seq_len
    return flops
