"""A model revision's weight files: check their layout, and turn `.bin` pickles into safetensors.

Why: the published ChatGLM3-6B-32k revision ships only `pytorch_model-0000k-of-00007.bin`
shards. A `.bin` file is a pickle: loading it can run code. The kit reads each pickle
once, here on the control node, with `torch.load(weights_only=True)` (torch's restricted
unpickler: tensors and plain containers only), checks every tensor's name, shape and
dtype against the index and config.json, and writes the same tensors as safetensors
(a format with no code in it). Nodes serve the safetensors; no node that serves users
ever unpickles (docs/decisions.md, "Nodes never unpickle the weights").

Expected shapes come from config.json with ChatGLM's parameter names (the ones vLLM's
`chatglm.py` loader maps): a shard that holds a tensor of another shape, an index that
names a tensor no shard holds, or a shard that holds one the index does not name is
refused, naming the file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Weight formats as transformers names them: shard pattern, index file, single-file name.
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
SAFETENSORS_SHARD = "model-{k:05d}-of-{n:05d}.safetensors"
_SHARD = re.compile(r"^(model|pytorch_model)-(\d{5})-of-(\d{5})\.(safetensors|bin)$")
_SINGLE = {"model.safetensors": "safetensors", "pytorch_model.bin": "bin"}


class CheckpointError(RuntimeError):
    """The weight files are not a whole, consistent checkpoint; the message names the file."""


@dataclass(frozen=True)
class Layout:
    """Which weight files a model directory holds and which tensor each shard carries."""

    kind: str  # "safetensors" or "bin"
    index: str | None  # the index file's name; None for a single unsharded file
    weight_map: dict[str, str]  # tensor name -> shard file name

    @property
    def shards(self) -> list[str]:
        return sorted(set(self.weight_map.values()))


def weight_files(model_dir: Path) -> list[str]:
    """Names of the weight shards and single weight files in a directory."""
    return sorted(p.name for p in model_dir.iterdir() if _SHARD.match(p.name) or p.name in _SINGLE)


def read_layout(model_dir: Path) -> Layout:
    """The directory's checkpoint: safetensors when it has them (as loaders prefer), else `.bin`.

    Refuses an index that names a missing shard, a shard the index does not name, and a
    directory with no weights at all.
    """
    for kind, index in (("safetensors", SAFETENSORS_INDEX), ("bin", BIN_INDEX)):
        if (model_dir / index).is_file():
            return _indexed_layout(model_dir, kind, index)
    for single, kind in _SINGLE.items():
        if (model_dir / single).is_file():
            return Layout(kind, None, {})
    raise CheckpointError(
        f"{model_dir} has no weights: expected {SAFETENSORS_INDEX} or {BIN_INDEX} with their shards "
        "(or model.safetensors / pytorch_model.bin); fix: stage the whole revision"
    )


def _indexed_layout(model_dir: Path, kind: str, index: str) -> Layout:
    try:
        weight_map = json.loads((model_dir / index).read_text(encoding="utf-8"))["weight_map"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{index} is not a weights index (no weight_map): {exc}") from exc
    layout = Layout(kind, index, {str(k): str(v) for k, v in weight_map.items()})
    missing = [s for s in layout.shards if not (model_dir / s).is_file()]
    if missing:
        raise CheckpointError(
            f"{index} names {missing[0]}, which is missing"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            + "; fix: stage the whole revision again (a download stopped early?)"
        )
    suffix = "." + kind
    stray = [n for n in weight_files(model_dir) if n.endswith(suffix) and n not in layout.shards]
    if stray:
        raise CheckpointError(f"{stray[0]} is not named in {index}: the directory mixes two checkpoints")
    return layout


def expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of a ChatGLM checkpoint, with the shape config.json implies."""
    hidden, ffn = int(config["hidden_size"]), int(config["ffn_hidden_size"])
    heads, kv = int(config["num_attention_heads"]), int(config["kv_channels"])
    groups = int(config["multi_query_group_num"]) if config.get("multi_query_attention") else heads
    vocab = int(config["padded_vocab_size"])
    qkv = (heads + 2 * groups) * kv
    shapes: dict[str, tuple[int, ...]] = {
        "transformer.embedding.word_embeddings.weight": (vocab, hidden),
        "transformer.rotary_pos_emb.inv_freq": (kv // 4,),
        "transformer.encoder.final_layernorm.weight": (hidden,),
        "transformer.output_layer.weight": (vocab, hidden),
    }
    for i in range(int(config["num_layers"])):
        p = f"transformer.encoder.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (hidden,),
            p + "self_attention.query_key_value.weight": (qkv, hidden),
            p + "self_attention.dense.weight": (hidden, heads * kv),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "mlp.dense_h_to_4h.weight": (2 * ffn, hidden),
            p + "mlp.dense_4h_to_h.weight": (hidden, ffn),
        }
        if config.get("add_qkv_bias"):
            shapes[p + "self_attention.query_key_value.bias"] = (qkv,)
    return shapes


def check_tensors(
    shard: str, tensors: dict[str, tuple[tuple[int, ...], str]], layout: Layout, config: dict[str, Any]
) -> None:
    """One shard's tensors (name -> (shape, dtype)) against the index and config.json."""
    want_dtype = str(config.get("torch_dtype", "float16"))
    shapes = expected_shapes(config)
    named = {n for n, s in layout.weight_map.items() if s == shard} if layout.index else set(shapes)
    for name in sorted(set(tensors) - named):
        where = f"{layout.index} puts it elsewhere" if name in layout.weight_map else "no index names it"
        raise CheckpointError(f"{shard} holds {name}, but {where}: the shard belongs to another checkpoint")
    for name in sorted(named - set(tensors)):
        raise CheckpointError(
            f"{layout.index or 'the checkpoint'} names {name} in {shard}, but {shard} does not hold it: "
            "the shard is damaged or from another revision; fix: stage the revision again"
        )
    for name, (shape, dtype) in sorted(tensors.items()):
        if name not in shapes:
            raise CheckpointError(f"{shard}: {name} is not a ChatGLM parameter")
        if tuple(shape) != shapes[name]:
            raise CheckpointError(
                f"{shard}: {name} has shape {list(shape)}, config.json implies {list(shapes[name])}: "
                "the weights and config.json are from different models"
            )
        if dtype != want_dtype:
            raise CheckpointError(f"{shard}: {name} is {dtype}, config.json says torch_dtype {want_dtype}")


def check_all_present(layout: Layout, config: dict[str, Any], seen: set[str]) -> None:
    """After every shard: the checkpoint holds each parameter config.json implies."""
    missing = sorted(set(expected_shapes(config)) - seen)
    if missing:
        raise CheckpointError(
            f"no shard holds {missing[0]}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            + ": the checkpoint is incomplete"
        )


def check_safetensors(model_dir: Path, layout: Layout, config: dict[str, Any]) -> None:
    """Read only each shard's header (names, shapes, dtypes): cheap at any size."""
    from safetensors import safe_open

    seen: set[str] = set()
    for shard in layout.shards or ["model.safetensors"]:
        try:
            with safe_open(str(model_dir / shard), framework="np") as fh:
                tensors = {}
                for name in fh.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    sl = fh.get_slice(name)
                    tensors[name] = (tuple(sl.get_shape()), _st_dtype(sl.get_dtype()))
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(f"{shard} is not a readable safetensors file ({exc}): truncated or damaged") from exc
        check_tensors(shard, tensors, layout, config)
        seen |= set(tensors)
    check_all_present(layout, config, seen)


def _st_dtype(code: str) -> str:
    return {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}.get(code, code.lower())


def convert_bin(
    src: Path, dest: Path, layout: Layout, config: dict[str, Any], progress: Callable[[str], None] = print
) -> list[str]:
    """Each `.bin` shard read with `torch.load(weights_only=True)`, checked, written as safetensors.

    The shards keep their split (k of n), so the index maps each tensor to the same
    shard number. Returns the file names written in `dest` (shards and index).
    """
    import torch
    from safetensors.torch import save_file

    shards = layout.shards or ["pytorch_model.bin"]
    n = len(shards)
    new_map: dict[str, str] = {}
    written: list[str] = []
    total = 0
    for k, shard in enumerate(shards, 1):
        progress(f"  reading {shard} ({k}/{n}, weights only) ...")
        try:
            state = torch.load(str(src / shard), map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # torch raises RuntimeError, pickle errors, zip errors
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CheckpointError(
                f"{shard} cannot be read as a weights-only checkpoint: {first}; "
                "fix: stage the revision again (truncated or damaged file, or a pickle with code in it)"
            ) from exc
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise CheckpointError(f"{shard} is not a state dict of tensors")
        tensors = {name: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in state.items()}
        check_tensors(shard, tensors, layout, config)
        out = SAFETENSORS_SHARD.format(k=k, n=n) if n > 1 else "model.safetensors"
        save_file({name: t.contiguous() for name, t in state.items()}, str(dest / out), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in state.values())
        new_map |= dict.fromkeys(state, out)
        written.append(out)
        del state
    check_all_present(layout, config, set(new_map))
    if n > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(new_map.items()))}
        (dest / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        written.append(SAFETENSORS_INDEX)
    return written
