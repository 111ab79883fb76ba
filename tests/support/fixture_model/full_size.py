"""A model directory at ChatGLM3-6B-32k's real size: its parameter shapes, random fp16 weights.

Why: every deploy of make test moves a 34 MB fixture, so what a deploy costs at 12.5 GB (the
copy, the checks, a re-run, the fan-out) never showed. This writes the published revision's file
set (seven ``pytorch_model-0000k-of-00007.bin`` shards in torch's zip format, the index, the
fixture's tokenizer and configuration with the real sizes) plus a SHA256SUMS manifest, as
``make weights`` stages a model. No server loads it (the cpu profile cannot hold it, and the
values are noise): it is for transfer and checking costs only.

Written once into a cache outside any checkout, keyed on this generator's source, and checked
by its manifest each time it is used; one tensor at a time in memory (at most ~1 GB).

Usage: ``python -m fixture_model.full_size [--cache DIR] [--stage DIR]`` (``make fixture-full``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import struct
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from fixture_model import (
    _PLACEHOLDERS,
    _STORAGE,
    CONFIG,
    FORMATS,
    FULL_SIZE,
    PUBLISHED_CHAT_TEMPLATE,
    PUBLISHED_SHARDS,
    SOURCES,
    TOKENIZER_CONFIG,
    _dump,
    _pickle_state_dict,
    build_sentencepiece_model,
    shard_count,
    tokenizer_source,
)
from glmdeploy.manifest import check_manifest, write_manifest
from glmdeploy.model import chatglm3

NAME = "chatglm3-6b-32k-full-size"
DEFAULT_CACHE = Path(os.environ.get("GLMDEPLOY_FIXTURE_CACHE", "/var/cache/glmdeploy/fixtures"))
SEED = 20261204


def parameters(config: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], float]]:
    """Name -> (shape, std) in the checkpoint's module order (as fixture_model.build_weights)."""
    hidden, ffn = int(config["hidden_size"]), int(config["ffn_hidden_size"])
    heads, groups, kv = (int(config[k]) for k in ("num_attention_heads", "multi_query_group_num", "kv_channels"))
    vocab, qkv = chatglm3.PADDED_VOCAB_SIZE, (heads + 2 * groups) * kv
    p: dict[str, tuple[tuple[int, ...], float]] = {
        "transformer.embedding.word_embeddings.weight": ((vocab, hidden), 0.02),
        "transformer.rotary_pos_emb.inv_freq": ((kv // 4,), 0.0),
    }
    for i in range(int(config["num_layers"])):
        prefix = f"transformer.encoder.layers.{i}."
        p[prefix + "input_layernorm.weight"] = ((hidden,), 0.0)
        p[prefix + "self_attention.query_key_value.weight"] = ((qkv, hidden), 0.02)
        p[prefix + "self_attention.query_key_value.bias"] = ((qkv,), 0.02)
        p[prefix + "self_attention.dense.weight"] = ((hidden, heads * kv), 0.02)
        p[prefix + "post_attention_layernorm.weight"] = ((hidden,), 0.0)
        p[prefix + "mlp.dense_h_to_4h.weight"] = ((2 * ffn, hidden), 0.02)
        p[prefix + "mlp.dense_4h_to_h.weight"] = ((hidden, ffn), 0.02)
    p["transformer.encoder.final_layernorm.weight"] = ((hidden,), 0.0)
    p["transformer.output_layer.weight"] = ((vocab, hidden), 0.02)
    return p


def _tensor(rng: Any, shape: tuple[int, ...], std: float) -> bytes:
    """Random fp16 values of a weight's magnitude (about 0.008 to 0.03, either sign), from random
    bits: drawing 6.2 billion normals took over 10 minutes on 2 cores; these bits take seconds.
    Random mantissas make the bytes as incompressible as real weights. No NaN, no infinity."""
    import numpy as np

    if std == 0.0:  # layer norms (ones) and the rotary frequencies: not random in a checkpoint
        return np.ones(shape, dtype="<f2").tobytes()
    bits = rng.integers(0, 1 << 16, math.prod(shape), dtype=np.uint16)
    # sign and mantissa random, exponent 8 or 9 of 0..30: |x| in [2**-7, 2**-5)
    return bytes(((bits & np.uint16(0x87FF)) | np.uint16(0x2000)).tobytes())


def _aligned(name: str, offset: int, align: int = 64) -> zipfile.ZipInfo:
    """A stored entry whose data starts on a 64-byte boundary, as torch's writer pads it."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    info.create_system = 0
    pad = (-(offset + 30 + len(name.encode()) + 4)) % align
    info.extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
    return info


def write_shard(path: Path, archive: str, params: dict[str, tuple[tuple[int, ...], float]], rng: Any) -> int:
    """One `torch.save` zip, streamed: the pickle first, then each tensor generated as it is written."""
    entries = [(name, _STORAGE["float16"], shape) for name, (shape, _) in params.items()]
    with path.open("wb") as fh, zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED) as zf:
        records: list[tuple[str, Any]] = [
            (f"{archive}/data.pkl", _pickle_state_dict(entries)),
            (f"{archive}/byteorder", b"little"),
        ]
        for name, data in records:
            zf.writestr(_aligned(name, zf.start_dir), data)
        for key, (shape, std) in enumerate(params.values()):
            zf.writestr(_aligned(f"{archive}/data/{key}", zf.start_dir), _tensor(rng, shape, std))
        zf.writestr(_aligned(f"{archive}/version", zf.start_dir), b"3\n")
    return path.stat().st_size


def cache_key() -> str:
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for source in (here / "__init__.py", here / "full_size.py"):
        digest.update(source.read_bytes())
    return digest.hexdigest()[:12]


def generate(dest: Path) -> None:
    """Write the directory beside dest, then rename: a cut run never leaves half a model."""
    import numpy as np

    config = {**CONFIG, **FULL_SIZE, "_name_or_path": f"glmdeploy/{NAME}"}
    params = parameters(config)
    dest.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.") as tmp:
        work = Path(tmp)
        (work / "tokenizer.model").write_bytes(build_sentencepiece_model())
        _dump(work / "tokenizer_config.json", {**TOKENIZER_CONFIG, "chat_template": PUBLISHED_CHAT_TEMPLATE})
        shutil.copyfile(SOURCES / "configuration_chatglm.py", work / "configuration_chatglm.py")
        (work / "tokenization_chatglm.py").write_text(tokenizer_source("published"), encoding="utf-8")
        for name, text in _PLACEHOLDERS.items():
            (work / name).write_text(text, encoding="utf-8")
        _dump(work / "config.json", config)
        pattern, index_name = FORMATS["bin"]
        shards = shard_count(dict.fromkeys(params), PUBLISHED_SHARDS)
        weight_map, total, started = {}, 0, time.monotonic()
        for k, part in enumerate(shards, 1):
            name = pattern.format(k=k, n=len(shards))
            size = write_shard(work / name, name.removesuffix(".bin"), {n: params[n] for n in part}, rng)
            weight_map.update(dict.fromkeys(part, name))
            total += sum(fp16_bytes(params[n][0]) for n in part)
            print(f"==> {name}: {size / 1e9:.2f} GB ({time.monotonic() - started:.0f} s)", flush=True)
        _dump(work / index_name, {"metadata": {"total_size": total}, "weight_map": weight_map})
        print("==> SHA256SUMS (one read of every file)", flush=True)
        write_manifest(work)
        work.chmod(0o755)
        for f in work.iterdir():
            f.chmod(0o444)
        work.rename(dest)
        work.mkdir()  # TemporaryDirectory's cleanup expects it


def fp16_bytes(shape: tuple[int, ...]) -> int:
    return 2 * math.prod(shape)


def cached_dir(cache: Path) -> Path:
    return cache / f"{NAME}-{cache_key()}"


def make_room(cache: Path, keep: Path) -> None:
    """Remove the caches of earlier generators, then check that the new one fits.

    Why: the key changes with this file, and each stale copy held 12.5 GB for good; a disk that
    fills halfway through a shard fails with a bare ENOSPC in zipfile.
    """
    cache.mkdir(parents=True, exist_ok=True)
    for stale in cache.glob(f"{NAME}-*"):
        if stale != keep and stale.is_dir():
            print(f"==> removing {stale} (written by an earlier version of this generator)", flush=True)
            shutil.rmtree(stale)
    config = {**CONFIG, **FULL_SIZE}
    need = int(sum(fp16_bytes(shape) for shape, _ in parameters(config).values()) * 1.02)
    free = shutil.disk_usage(cache).free
    if free < need:
        raise SystemExit(
            f"{cache} has {free / 1e9:.1f} GB free and the full-size model needs {need / 1e9:.1f} GB; "
            "fix: free space there (a staged copy elsewhere keeps its blocks while its links exist) "
            "or point GLMDEPLOY_FIXTURE_CACHE at a disk with room"
        )


def ensure(cache: Path) -> Path:
    """The cached directory, generated when absent, checked against its manifest either way."""
    dest = cached_dir(cache)
    if not dest.is_dir():
        make_room(cache, keep=dest)
        print(f"==> writing the full-size model into {dest} (about 12.5 GB, a few minutes)", flush=True)
        generate(dest)
    started = time.monotonic()
    problems = check_manifest(dest)
    if problems:
        raise SystemExit(f"{dest} does not match its manifest: {'; '.join(problems)}; fix: delete it and run again")
    size = sum(p.stat().st_size for p in dest.iterdir())
    print(f"==> {dest}: {size / 1e9:.2f} GB, matches its manifest ({time.monotonic() - started:.0f} s)", flush=True)
    return dest


def stage(source: Path, where: Path) -> None:
    """Hard links of the cache under the checkout's artifacts/models (no copy; same filesystem)."""
    if where.exists() and (where / "SHA256SUMS").read_bytes() == (source / "SHA256SUMS").read_bytes():
        return
    tmp = where.with_name(f".{where.name}.staging")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp, copy_function=os.link)
    shutil.rmtree(where, ignore_errors=True)
    tmp.rename(where)
    print(f"==> staged as {where} (hard links of the cache)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fixture_model.full_size", description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"cache directory (default {DEFAULT_CACHE})")
    parser.add_argument("--stage", type=Path, help="also link it here (a staged model directory under artifacts/)")
    args = parser.parse_args(argv)
    if args.stage and not cached_dir(args.cache).is_dir():
        # Links of a stale cache: their blocks would stay taken while the new one is written.
        shutil.rmtree(args.stage, ignore_errors=True)
    source = ensure(args.cache)
    if args.stage:
        stage(source, args.stage)
    json.dump({"path": str(source)}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
