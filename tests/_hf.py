"""Tiny Hugging Face model folders made in the tests (nothing from a hub), and transformers' own
loss on a batch, the reference an `--model hf:<folder>` run must match.

Two decoder architectures, both with a tensor-parallel plan in transformers: Llama (untied head,
grouped-query attention) and Qwen2 (tie_word_embeddings=True, q/k/v biases). Weights are float32,
saved with save_pretrained(max_shard_size=...) into several files and an index.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

# shared sizes: heads, kv heads and the MLP divisible by tp 2; 2 layers for pp 2; the demo task's
# tokens (< 16, train_entry's default vocab) are inside the vocabulary
SIZES = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
ARCHS = ("llama", "qwen2")


def make(folder: Path, arch: str = "llama", *, shard: str = "20KB", **sizes: int) -> Path:
    """A saved model folder of `arch` (sharded into >= 2 safetensors files at the default sizes)."""
    import transformers  # lazy: an optional extra (hpctrain[hf])

    torch.manual_seed(0)
    if arch == "llama":
        config = transformers.LlamaConfig(**(SIZES | sizes), tie_word_embeddings=False)
    elif arch == "qwen2":
        config = transformers.Qwen2Config(**(SIZES | sizes), tie_word_embeddings=True)
    else:
        raise ValueError(arch)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # away from transformers' init (norms at 1, biases at 0): a real check
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(folder, max_shard_size=shard)
    return folder


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.safetensors"))


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file  # lazy: only where a test compares weights

    out: dict[str, torch.Tensor] = {}
    for name in files(folder):
        out.update(load_file(str(folder / name)))
    return out


def demo_batch(
    samples: list[int], *, seq_len: int = 16, vocab: int = 16, seed: int = 1234
) -> dict[str, torch.Tensor]:
    """The demo task's samples (train_entry.data.Progressions, train.seed) in transformers' keys, as
    train_entry.pretrained.data.collate gives them."""
    from train_entry.data import Progressions  # lazy: torch-heavy
    from train_entry.pretrained.data import collate  # lazy: as above

    ds = Progressions(vocab_size=vocab, seq_len=seq_len, num_samples=max(samples) + 1, seed=seed)
    batch = collate([ds[i] for i in samples])
    assert isinstance(batch, dict)
    return batch


def reference_loss(folder: Path, batch: dict[str, torch.Tensor]) -> float:
    """from_pretrained's loss on `batch` (float32, eval mode: no dropout)."""
    import transformers  # lazy: an optional extra

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return float(model(**batch).loss)


def index(folder: Path) -> dict[str, str]:
    return json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
