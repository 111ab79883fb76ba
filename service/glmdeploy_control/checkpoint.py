"""A model revision's weight files: check their layout, and turn `.bin` pickles into safetensors.

Why: the published ChatGLM3-6B-32k revision ships only `pytorch_model-0000k-of-00007.bin`
shards. A `.bin` file is a pickle: loading it can run code. The kit reads each pickle
once, here on the control node, with `torch.load(weights_only=True)` (torch's restricted
unpickler: tensors and plain containers only), memory-mapped so that the first reading
costs only the pickle record: every shard's tensor names, shapes and dtypes are checked
against the index and config.json before any tensor is converted (a fault costs seconds,
not the minutes of converting the shards before it), then the same tensors are written as
safetensors (a format with no code in it). Nodes serve the safetensors; no node that serves users
ever unpickles (docs/decisions.md, "Nodes never unpickle the weights").

Expected shapes come from config.json with ChatGLM's parameter names (the ones vLLM's
`chatglm.py` loader maps): a shard that holds a tensor of another shape, an index that
names a tensor no shard holds, or a shard that holds one the index does not name is
refused, naming the file, the tensor and the fix.
"""

from __future__ import annotations

import json
import re
import zipfile
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
        raise CheckpointError(
            f"{index} is not a weights index (no weight_map): {exc}; fix: stage the revision again"
        ) from exc
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
        raise CheckpointError(
            f"{stray[0]} is not named in {index}: the directory mixes two checkpoints; "
            "fix: stage the revision into an empty directory"
        )
    return layout


#: A shard's tensors as its header or pickle tells them: name -> (shape, dtype), no tensor data.
Held = dict[str, tuple[tuple[int, ...], str]]
#: One dimension of an expected shape: its size, how config.json gives it, and the fields it reads.
Dim = tuple[int, str, tuple[str, ...]]

_FIX_PAIR = "fix: take config.json and the weights from one revision of one model"
_FIX_RESTAGE = "fix: stage the revision again, the index and every shard from one commit"


def _dims(config: dict[str, Any]) -> dict[str, Dim]:
    """Each dimension a ChatGLM tensor has, with the config.json fields that set it (for refusals)."""
    hidden, ffn = int(config["hidden_size"]), int(config["ffn_hidden_size"])
    heads, kv = int(config["num_attention_heads"]), int(config["kv_channels"])
    mqa = bool(config.get("multi_query_attention"))
    groups = int(config["multi_query_group_num"]) if mqa else heads
    group_field = "multi_query_group_num" if mqa else "num_attention_heads"
    return {
        "hidden": (hidden, "hidden_size", ("hidden_size",)),
        "2ffn": (2 * ffn, "2 x ffn_hidden_size", ("ffn_hidden_size",)),
        "ffn": (ffn, "ffn_hidden_size", ("ffn_hidden_size",)),
        "qkv": (
            (heads + 2 * groups) * kv,
            f"(num_attention_heads + 2 x {group_field}) x kv_channels",
            ("num_attention_heads", group_field, "kv_channels", "multi_query_attention"),
        ),
        "heads_kv": (heads * kv, "num_attention_heads x kv_channels", ("num_attention_heads", "kv_channels")),
        "vocab": (int(config["padded_vocab_size"]), "padded_vocab_size", ("padded_vocab_size",)),
        "rope": (kv // 4, "kv_channels / 4", ("kv_channels",)),
    }


#: ChatGLM's parameter names (the ones vLLM's `chatglm.py` loader maps) and their dimensions.
_GLOBAL = {
    "transformer.embedding.word_embeddings.weight": ("vocab", "hidden"),
    "transformer.rotary_pos_emb.inv_freq": ("rope",),
    "transformer.encoder.final_layernorm.weight": ("hidden",),
    "transformer.output_layer.weight": ("vocab", "hidden"),
}
_LAYER = {
    "input_layernorm.weight": ("hidden",),
    "self_attention.query_key_value.weight": ("qkv", "hidden"),
    "self_attention.dense.weight": ("hidden", "heads_kv"),
    "post_attention_layernorm.weight": ("hidden",),
    "mlp.dense_h_to_4h.weight": ("2ffn", "hidden"),
    "mlp.dense_4h_to_h.weight": ("hidden", "ffn"),
}


def expected_dims(config: dict[str, Any]) -> dict[str, tuple[Dim, ...]]:
    """Every tensor of a ChatGLM checkpoint, each dimension with the config.json fields behind it."""
    dims = _dims(config)
    layer = dict(_LAYER)
    if config.get("add_qkv_bias"):
        layer["self_attention.query_key_value.bias"] = ("qkv",)
    table = dict(_GLOBAL)
    for i in range(int(config["num_layers"])):
        table |= {f"transformer.encoder.layers.{i}.{name}": d for name, d in layer.items()}
    return {name: tuple(dims[d] for d in ds) for name, ds in table.items()}


def expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of a ChatGLM checkpoint, with the shape config.json implies."""
    return {name: tuple(d[0] for d in ds) for name, ds in expected_dims(config).items()}


def check_checkpoint(layout: Layout, config: dict[str, Any], held: dict[str, Held]) -> None:
    """All shards' tensors (shard -> its tensors) against the index and config.json, before any conversion.

    Why all at once: only with every shard's names in hand can a refusal say whether the
    index or a shard is wrong (an index entry no shard holds, a tensor in another shard than
    the index says); and it costs headers only, so a fault is found in seconds, not after
    minutes of converting the shards before it.
    """
    check_index(layout, config, held)
    dims = expected_dims(config)
    for shard, tensors in held.items():
        for name, (shape, dtype) in sorted(tensors.items()):
            check_tensor(shard, name, shape, dtype, dims, config)
    check_all_present(layout, config, {name for tensors in held.values() for name in tensors})


def check_index(layout: Layout, config: dict[str, Any], held: dict[str, Held]) -> None:
    """The index's weight_map against the names every shard holds: both ways, naming who is wrong."""
    if not layout.index:
        return
    holder = {name: shard for shard, tensors in held.items() for name in tensors}
    implied = expected_shapes(config)
    for name, named in sorted(layout.weight_map.items()):
        if name not in holder:
            raise CheckpointError(_unheld(layout.index, name, named, len(held), name in implied))
    for shard, tensors in sorted(held.items()):
        for name in sorted(tensors):
            where = layout.weight_map.get(name)
            if where is None:
                raise CheckpointError(
                    f"{shard} holds {name}, which {layout.index} does not name: the shard belongs to another "
                    f"checkpoint; {_FIX_RESTAGE}"
                )
            if where != shard:
                raise CheckpointError(
                    f"{layout.index} puts {name} in {where}, but {shard} holds it: the index and the shards are "
                    f"from different revisions; {_FIX_RESTAGE}"
                )


def _unheld(index: str, name: str, shard: str, shards: int, implied: bool) -> str:
    """An index entry that no shard holds: a missing parameter blames the shard, an unknown name the index."""
    head = f"{index} names {name} in {shard}, but none of the {shards} shards holds it"
    if implied:
        return f"{head}: {shard} is damaged or from another revision; {_FIX_RESTAGE}"
    return (
        f"{head}, and config.json implies no such parameter: the index was edited or is from another model; "
        f"fix: take {index} from the same commit as the shards (stage the revision again)"
    )


def check_tensor(
    shard: str, name: str, shape: tuple[int, ...], dtype: str, dims: dict[str, tuple[Dim, ...]], config: dict[str, Any]
) -> None:
    """One tensor's name, shape and dtype against what config.json implies; a refusal names the field."""
    if name not in dims:
        layer = re.match(r"transformer\.encoder\.layers\.(\d+)\.", name)
        if layer and int(layer[1]) >= int(config["num_layers"]):
            why = f"config.json's num_layers={config['num_layers']} implies no layer {layer[1]}"
        else:
            why = "it is not a ChatGLM parameter"
        raise CheckpointError(f"{shard} holds {name}, but {why}: the weights are of another model; {_FIX_PAIR}")
    want = dims[name]
    if tuple(shape) != tuple(d[0] for d in want):
        raise CheckpointError(_shape_refusal(shard, name, tuple(shape), want, config))
    want_dtype = str(config.get("torch_dtype", "float16"))
    if dtype != want_dtype:
        raise CheckpointError(
            f"{shard}: {name} is {dtype}, config.json says torch_dtype {want_dtype}: the weights and config.json "
            f"are from different revisions; {_FIX_PAIR}"
        )


def _shape_refusal(shard: str, name: str, shape: tuple[int, ...], want: tuple[Dim, ...], config: dict[str, Any]) -> str:
    """Which dimension disagrees, what config.json's fields make of it, and their values."""
    if len(shape) != len(want):
        why = f"{len(shape)} dimensions, not {len(want)}"
        fields = sorted({f for d in want for f in d[2]})
    else:
        bad = [(i, d) for i, d in enumerate(want) if shape[i] != d[0]]
        why = ", ".join(f"dimension {i} is {d[1]}" for i, d in bad)
        fields = sorted({f for _, d in bad for f in d[2]})
    values = ", ".join(f"{f}={json.dumps(config.get(f))}" for f in fields)
    return (
        f"{shard}: {name} has shape {list(shape)}, config.json implies {[d[0] for d in want]} ({why}; {values}): "
        f"the weights and config.json are from different models; {_FIX_PAIR}"
    )


def check_all_present(layout: Layout, config: dict[str, Any], seen: set[str]) -> None:
    """After every shard: the checkpoint holds each parameter config.json implies."""
    missing = sorted(set(expected_shapes(config)) - seen)
    if missing:
        raise CheckpointError(
            f"no shard holds {missing[0]}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            + f", which config.json implies: the checkpoint is incomplete or of another model; {_FIX_PAIR}"
        )


def check_safetensors(model_dir: Path, layout: Layout, config: dict[str, Any]) -> None:
    """Read only each shard's header (names, shapes, dtypes): cheap at any size."""
    from safetensors import safe_open

    held: dict[str, Held] = {}
    for shard in layout.shards or ["model.safetensors"]:
        try:
            with safe_open(str(model_dir / shard), framework="np") as fh:
                tensors = {}
                for name in fh.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    sl = fh.get_slice(name)
                    tensors[name] = (tuple(sl.get_shape()), _st_dtype(sl.get_dtype()))
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(
                f"{shard} is not a readable safetensors file ({exc}): truncated or damaged; {_FIX_RESTAGE}"
            ) from exc
        held[shard] = tensors
    check_checkpoint(layout, config, held)


def _st_dtype(code: str) -> str:
    return {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}.get(code, code.lower())


# ------------------------------------------------------------------------------------- .bin shards


def load_bin(path: Path) -> dict[str, Any]:
    """A `.bin` shard's state dict, mapped from the file: names, shapes and dtypes cost no tensor reads.

    `torch.load(mmap=True, weights_only=True)`: the restricted unpickler reads the small pickle
    record; each tensor's bytes stay on disk until something reads them (the conversion).
    """
    import torch

    _refuse_truncated(path)
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # torch raises RuntimeError, pickle errors, zip errors
        raise CheckpointError(
            f"{path.name} cannot be read as a weights-only checkpoint: {_first_line(exc)}; "
            "fix: stage the revision again (a damaged file, or a pickle with code in it)"
        ) from exc
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(
            f"{path.name} is not a state dict of tensors: not a model checkpoint; fix: stage the revision again"
        )
    return state


def _refuse_truncated(path: Path) -> None:
    """A shard in torch's zip format that starts as one but lacks the directory torch.save writes last.

    Why its own message: the file was cut short (a copy or download stopped early), and
    saying so points at the fix; torch's own message speaks of an internal zip error.
    """
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(4)
    if size == 0 or (head == b"PK\x03\x04" and not zipfile.is_zipfile(path)):
        raise CheckpointError(
            f"{path.name} is truncated: {size} bytes, and its end (the zip directory torch.save writes last) is "
            "missing; fix: copy the shard again, whole, from the revision (a copy or download stopped early)"
        )


def _bin_held(state: dict[str, Any]) -> Held:
    return {name: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in state.items()}


def check_bin(src: Path, layout: Layout, config: dict[str, Any], progress: Callable[[str], None] = print) -> None:
    """Every `.bin` shard's tensor names, shapes and dtypes checked before any is converted."""
    shards = layout.shards or ["pytorch_model.bin"]
    progress(f"  checking {len(shards)} shards' tensor names, shapes and dtypes (no tensor data read) ...")
    held = {}
    for shard in shards:
        state = load_bin(src / shard)
        held[shard] = _bin_held(state)
        del state
    check_checkpoint(layout, config, held)


def convert_bin(
    src: Path,
    dest: Path,
    layout: Layout,
    config: dict[str, Any],
    progress: Callable[[str], None] = print,
    checked: bool = False,
) -> list[str]:
    """Each `.bin` shard read with `torch.load(weights_only=True)`, written as safetensors, after check_bin.

    The shards keep their split (k of n), so the index maps each tensor to the same
    shard number. `checked`: the caller ran check_bin on `src` already. Returns the file
    names written in `dest` (shards and index).
    """
    from safetensors.torch import save_file

    if not checked:
        check_bin(src, layout, config, progress)
    shards = layout.shards or ["pytorch_model.bin"]
    n = len(shards)
    new_map: dict[str, str] = {}
    written: list[str] = []
    total = 0
    for k, shard in enumerate(shards, 1):
        progress(f"  converting {shard} ({k}/{n}) ...")
        state = load_bin(src / shard)
        out = SAFETENSORS_SHARD.format(k=k, n=n) if n > 1 else "model.safetensors"
        save_file({name: t.contiguous() for name, t in state.items()}, str(dest / out), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in state.values())
        new_map |= dict.fromkeys(state, out)
        written.append(out)
        del state
    if n > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(new_map.items()))}
        (dest / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        written.append(SAFETENSORS_INDEX)
    return written


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
