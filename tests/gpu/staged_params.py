"""Every parameter of vLLM's loaded model compared with the staged checkpoint's tensor (H200 run).

Why: vLLM 0.26's "Following weights were not initialized from checkpoint" check counts every
parameter of a module that has a quant method (all linear and embedding layers, quantized or not)
as loaded, so a checkpoint missing such a tensor starts and serves (tests/gpu/h200.sh staged, its
negative control). This loads MODEL_DIR in vLLM's own offline engine (in process, eager, no
tokenizer) and compares each parameter, bit for bit, with the tensor of the same name in
REFERENCE_DIR's safetensors (the staged model): a parameter the checkpoint did not fill differs.

    python3 tests/gpu/staged_params.py MODEL_DIR REFERENCE_DIR OUT.json
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

model_dir, ref_dir, out = sys.argv[1:4]


def compare(model):
    import torch
    from safetensors.torch import load_file

    index = json.loads(Path(f"{ref_dir}/model.safetensors.index.json").read_text())
    ck = {}
    for shard in sorted(set(index["weight_map"].values())):
        ck.update(load_file(f"{ref_dir}/{shard}"))
    rows, used = [], set()
    # vLLM's names -> the checkpoint's: the embedding drops `.word_embeddings` (chatglm.py's
    # hf_to_vllm_mapper); `lm_head` is the same module as `transformer.output_layer`, listed twice.
    alias = {
        "transformer.embedding.weight": "transformer.embedding.word_embeddings.weight",
        "lm_head.weight": "transformer.output_layer.weight",
    }
    for name, p in model.named_parameters(remove_duplicate=False):
        cname = alias.get(name, name)
        t = ck.get(cname)
        equal = t is not None and tuple(t.shape) == tuple(p.shape) and torch.equal(t.to(p.device, p.dtype), p.data)
        rows.append(
            {
                "param": name,
                "checkpoint": cname if t is not None else None,
                "equal": bool(equal),
                "dtype": str(p.dtype),
                "shape": list(p.shape),
            }
        )
        used.add(cname)
    return {"params": rows, "checkpoint_tensors": len(ck), "checkpoint_unused": sorted(set(ck) - used)}


from vllm import LLM  # noqa: E402

llm = LLM(
    model=model_dir,
    dtype="float16",
    max_model_len=4096,
    gpu_memory_utilization=0.3,
    enforce_eager=True,
    trust_remote_code=True,
    skip_tokenizer_init=True,
)
result = llm.apply_model(compare)[0]
rows = result["params"]
bad = [r for r in rows if not r["equal"]]
summary = {
    "model_dir": model_dir,
    "reference_dir": ref_dir,
    "parameters": len(rows),
    "equal_to_checkpoint": len(rows) - len(bad),
    "not_equal": [r["param"] for r in bad],
    "checkpoint_tensors": result["checkpoint_tensors"],
    "checkpoint_unused": result["checkpoint_unused"],
}
Path(out).write_text(json.dumps({**summary, "params": rows}, indent=1))
print(json.dumps(summary))
