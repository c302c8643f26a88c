"""A Hugging Face model folder (`--model hf:<folder>`), read without torch: its config.json, which
safetensors file holds each tensor (one model.safetensors, or model.safetensors.index.json and its
shards) and every tensor's shape and dtype from the files' headers (8 bytes of length, then JSON:
cheap and exact, no weights read).

`submit` and `plan` call `problems(...)` before anything is queued (one line per problem, naming
the file and the key); train_entry reads the same `Folder` to load each rank's slices.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from hpctrain.kernel.errors import UserError

PREFIX = "hf:"
CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
HEADER_CAP = 100 << 20  # a safetensors header above this is not one (its own reader's limit)
# the tensor-parallel styles train_entry maps to torch's (train_entry/pretrained/layout.py)
TP_STYLES = ("colwise", "rowwise")


def folder_of(spec: str | None) -> Path | None:
    """The folder of an `hf:<folder>` model spec; None for anything else."""
    if not spec or not spec.startswith(PREFIX):
        return None
    return Path(spec[len(PREFIX) :]).expanduser()


@dataclass(frozen=True)
class Tensor:
    file: Path
    shape: tuple[int, ...]
    dtype: str  # safetensors' name: F32, BF16, F16, ...
    offset: int = 0  # where its bytes start in the file (row-major, little-endian)


@dataclass(frozen=True)
class Folder:
    path: Path
    config: dict[str, object]
    tensors: dict[str, Tensor]  # name -> where it is, its shape and dtype

    def int(self, key: str) -> int | None:
        v = self.config.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    @property
    def tied(self) -> bool:
        return bool(self.config.get("tie_word_embeddings", False))

    @property
    def tp_plan(self) -> dict[str, str]:
        """The architecture's own tensor-parallel plan (transformers writes it into config.json as
        `base_model_tp_plan` only when it differs from the class default: train_entry reads the
        class's; this is what the folder itself says, possibly empty)."""
        plan = self.config.get("base_model_tp_plan")
        return {str(k): str(v) for k, v in plan.items()} if isinstance(plan, dict) else {}


def _json(path: Path, what: str) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no {what} there; is it a Hugging Face model folder?") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: cannot read {what} ({e})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: {what} is not a JSON object")
    return data


def header(path: Path) -> dict[str, Tensor]:
    """The tensors of one safetensors file, from its header."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            (size,) = struct.unpack("<Q", raw) if len(raw) == 8 else (-1,)
            if not 0 < size <= HEADER_CAP:
                raise UserError(f"{path}: not a safetensors file (bad header length)")
            head = json.loads(f.read(size))
    except FileNotFoundError:
        raise UserError(f"{path}: missing (named by the folder's {INDEX})") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: cannot read its safetensors header ({e})") from None
    return {
        name: Tensor(
            path,
            tuple(int(d) for d in t["shape"]),
            str(t["dtype"]),
            8 + size + int(t["data_offsets"][0]),
        )
        for name, t in head.items()
        if name != "__metadata__"
    }


def read(folder: Path) -> Folder:
    """config.json and every tensor's file, shape and dtype; UserError naming the file if not."""
    if not folder.is_dir():
        raise UserError(f"{folder}: no such folder (from --model hf:{folder})")
    config = _json(folder / CONFIG, CONFIG)
    tensors: dict[str, Tensor] = {}
    if (folder / INDEX).is_file():
        index = _json(folder / INDEX, INDEX)
        wmap = index.get("weight_map")
        if not isinstance(wmap, dict) or not wmap:
            raise UserError(f"{folder / INDEX}: weight_map: missing or empty")
        for fname in sorted({str(v) for v in wmap.values()}):
            found = header(folder / fname)
            for name, file in wmap.items():
                if file == fname and name not in found:
                    raise UserError(f"{folder / fname}: {name}: named by {INDEX}, not in the file")
            tensors.update(found)
    elif (folder / SINGLE).is_file():
        tensors = header(folder / SINGLE)
    else:
        raise UserError(
            f"{folder}: no {SINGLE} or {INDEX}; save the model with "
            "save_pretrained(..., safe_serialization=True)"
        )
    return Folder(folder, config, tensors)


def _expected(f: Folder) -> dict[str, tuple[int, ...]]:
    """Shapes config.json implies for the common decoder layout (Llama, Qwen2, Mistral, ...)."""
    v, h = f.int("vocab_size"), f.int("hidden_size")
    heads, inter = f.int("num_attention_heads"), f.int("intermediate_size")
    if v is None or h is None:
        return {}
    kv = f.int("num_key_value_heads") or heads
    hd = f.int("head_dim") or (h // heads if heads else None)
    out: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (v, h),
        "lm_head.weight": (v, h),
    }
    if heads and kv and hd:
        out["model.layers.0.self_attn.q_proj.weight"] = (heads * hd, h)
        out["model.layers.0.self_attn.k_proj.weight"] = (kv * hd, h)
    if inter:
        out["model.layers.0.mlp.gate_proj.weight"] = (inter, h)
    return out


def problems(f: Folder, *, tp: int = 1, pp: int = 1) -> list[str]:
    """What makes this folder unusable for this layout: one line each, naming file and key."""
    out = []
    for name, shape in _expected(f).items():
        t = f.tensors.get(name)
        if t is not None and t.shape != shape:
            out.append(
                f"{t.file}: {name}: shape {list(t.shape)} disagrees with {f.path / CONFIG} "
                f"(which implies {list(shape)})"
            )
    layers = f.int("num_hidden_layers")
    stored = {n.split(".")[2] for n in f.tensors if n.startswith("model.layers.")}
    if layers is not None and stored and len(stored) != layers:
        out.append(
            f"{f.path}: model.layers.*: {len(stored)} layers stored, {f.path / CONFIG} "
            f"num_hidden_layers is {layers}"
        )
    if tp > 1:
        for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
            n = f.int(key)
            if n is not None and n % tp:
                out.append(
                    f"{f.path / CONFIG}: {key}: {n} is not divisible by --parallel.tp {tp} "
                    "(the TP plan splits it over the tp ranks)"
                )
    if pp > 1 and f.tied:
        out.append(
            f"{f.path / CONFIG}: tie_word_embeddings: true does not split into pipeline stages "
            "(the embedding and the head would sit on different ranks); use --parallel.pp 1"
        )
    if pp > 1 and layers is not None and layers % pp:
        out.append(
            f"{f.path / CONFIG}: num_hidden_layers: {layers} is not divisible by --parallel.pp {pp}"
        )
    return out
