"""One generation through the kit's ids path on a server loading a staged model, checked against the weights.

Run by `tests/gpu/h200.sh staged` (H200 machine) against a vLLM server started on a model directory
staged by `make weights` (real weights loaded, no `--load-format dummy`). Records, in one JSON:

- client: the model's own tokenizer loaded from the model directory as the smoke suite and
  `glmdeploy.tools.chat` load it, and the ids `glmdeploy.model.prompt.PromptBuilder` builds for a one-turn chat
  (the exact error where this stack's transformers cannot encode with the model's tokenizer file;
  the golden file's ids for the same chat are used then, and the JSON says so);
- kit: one streamed `/v1/completions` request with those prompt ids (`glmdeploy.api.client.ApiClient`,
  the kit's sampling and stop ids): text, ids, finish reason, the prompt ids the server echoes;
- greedy: the same prompt, temperature 0, 16 tokens, top-5 logprobs keyed by id;
- reference: the same 16 greedy tokens from a plain-torch fp32 forward of ChatGLM's math over the
  staged safetensors (RMSNorm, fused QKV with bias, 2 KV groups, interleaved rotary on half of each
  head, SwiGLU, output layer), so the served ids are shown to come from these weights;
- server_text / server_chat: a text prompt and a chat request, which the *server* tokenizes (its
  served tokenizer), with status or error.
"""

from __future__ import annotations

import argparse
import json
import math
import traceback
from pathlib import Path
from typing import Any

from glmdeploy.api.client import ApiClient
from glmdeploy.config import NodeConfig
from glmdeploy.model import chatglm3
from glmdeploy.model.prompt import PromptBuilder, load_tokenizer

CHAT = [{"role": "user", "content": "你好"}]  # smoke_tests/test_generation.py CHATS["one_turn"]


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def reference_greedy(model_dir: Path, prompt: list[int], steps: int) -> dict[str, Any]:
    """Greedy continuation by a plain-torch forward over the staged safetensors (fp32, no KV cache)."""
    import torch
    from safetensors.torch import load_file

    config = json.loads((model_dir / "config.json").read_text())
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    w: dict[str, torch.Tensor] = {}
    for shard in sorted(set(index["weight_map"].values())):
        w |= {k: v.to(dev, torch.float32) for k, v in load_file(str(model_dir / shard)).items()}
    heads, groups, kv = config["num_attention_heads"], config["multi_query_group_num"], config["kv_channels"]
    eps, rot = config["layernorm_epsilon"], config["kv_channels"] // 2
    theta = 10000.0 * config["rope_ratio"]
    inv_freq = 1.0 / theta ** (torch.arange(0, rot, 2, device=dev, dtype=torch.float32) / rot)

    def rms(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g

    def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # x: [T, H, kv]; GPT-J (interleaved) pairs
        ang = pos[:, None].float() * inv_freq[None, :]  # [T, rot/2]
        cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
        r, rest = x[..., :rot], x[..., rot:]
        x1, x2 = r[..., 0::2], r[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        return torch.cat((out, rest), dim=-1)

    def forward(ids: list[int]) -> torch.Tensor:
        t = len(ids)
        pos = torch.arange(t, device=dev)
        x = w["transformer.embedding.word_embeddings.weight"][torch.tensor(ids, device=dev)]
        mask = torch.full((t, t), float("-inf"), device=dev).triu(1)
        for i in range(config["num_layers"]):
            p = f"transformer.encoder.layers.{i}."
            h = rms(x, w[p + "input_layernorm.weight"])
            qkv = h @ w[p + "self_attention.query_key_value.weight"].T + w[p + "self_attention.query_key_value.bias"]
            q, k, v = qkv.split([heads * kv, groups * kv, groups * kv], dim=-1)
            q, k, v = q.view(t, heads, kv), k.view(t, groups, kv), v.view(t, groups, kv)
            q, k = rope(q, pos), rope(k, pos)
            k, v = k.repeat_interleave(heads // groups, dim=1), v.repeat_interleave(heads // groups, dim=1)
            att = torch.einsum("thd,shd->hts", q, k) / math.sqrt(kv) + mask
            ctx = torch.einsum("hts,shd->thd", att.softmax(-1), v).reshape(t, heads * kv)
            x = x + ctx @ w[p + "self_attention.dense.weight"].T
            h = rms(x, w[p + "post_attention_layernorm.weight"])
            a, b = (h @ w[p + "mlp.dense_h_to_4h.weight"].T).chunk(2, dim=-1)
            x = x + (torch.nn.functional.silu(a) * b) @ w[p + "mlp.dense_4h_to_h.weight"].T
        x = rms(x[-1], w["transformer.encoder.final_layernorm.weight"])
        return (x @ w["transformer.output_layer.weight"].T).log_softmax(-1)

    ids, out, first_top = list(prompt), [], []
    with torch.no_grad():
        for step in range(steps):
            logp = forward(ids)
            if step == 0:
                top = logp.topk(5)
                first_top = [[int(i), round(float(v), 4)] for v, i in zip(top.values, top.indices, strict=True)]
            nxt = int(logp.argmax())
            out.append(nxt)
            ids.append(nxt)
    return {"device": dev, "token_ids": out, "first_top5": first_top}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--node", required=True)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    node = NodeConfig.load(args.node)
    model_dir = Path(node.model_dir)
    client = ApiClient.for_node(node, timeout_s=120)
    golden = json.loads((Path("smoke_tests/golden") / f"{node.model_name}.json").read_text())
    r: dict[str, Any] = {"model_dir": str(model_dir), "chat": CHAT}

    # Client side: the model's tokenizer and the kit's prompt builder, as glmdeploy.tools.chat uses them.
    try:
        tok = load_tokenizer(str(model_dir), node.trust_remote_code)
        r["client_tokenizer"] = {"class": type(tok).__name__, "len": len(tok)}
        try:
            ids = PromptBuilder.from_tokenizer(tok).chat_ids(CHAT)
            r["prompt_ids_from"] = "PromptBuilder"
        except Exception as exc:
            r["prompt_builder_error"] = _error(exc)
            r["prompt_builder_traceback"] = traceback.format_exc()[-1500:]
            ids, r["prompt_ids_from"] = list(golden["chats"]["one_turn"]), "golden file (PromptBuilder failed)"
    except Exception as exc:
        r["client_tokenizer_error"] = _error(exc)
        ids, r["prompt_ids_from"] = list(golden["chats"]["one_turn"]), "golden file (tokenizer failed)"
    r["prompt_ids"] = ids
    r["prompt_ids_match_golden"] = ids == golden["chats"]["one_turn"]

    # The kit's ids path: streamed /v1/completions with prompt ids, the kit's sampling and stop ids.
    try:
        c = client.complete(ids, max_tokens=48)
        r["kit"] = {
            "text": c.text,
            "token_ids": c.token_ids,
            "finish_reason": c.finish_reason,
            "completion_tokens": c.completion_tokens,
            "prompt_token_ids_echoed": c.prompt_token_ids,
            "first_token_s": c.first_token_s,
            "stop_ids_in_output": sorted(set(c.token_ids) & set(chatglm3.STOP_TOKEN_IDS)),
        }
    except Exception as exc:
        r["kit_error"] = _error(exc)

    # Greedy with logprobs keyed by id, and the same from the weights themselves.
    steps = 16
    body = {
        "model": node.served_model_name,
        "prompt": ids,
        "max_tokens": steps,
        "temperature": 0.0,
        "logprobs": 5,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
    }
    try:
        g = json.loads(client._request("POST", "/completions", body).read())["choices"][0]
        top0 = (g.get("logprobs") or {}).get("top_logprobs") or [{}]
        r["greedy"] = {
            "text": g.get("text"),
            "token_ids": g.get("token_ids"),
            "first_top5": sorted(
                ([int(k.split(":")[-1]), round(v, 4)] for k, v in top0[0].items()), key=lambda e: -e[1]
            ),
        }
    except Exception as exc:
        r["greedy_error"] = _error(exc)
    try:
        r["reference"] = reference_greedy(model_dir, ids, steps)
        served = (r.get("greedy") or {}).get("token_ids") or []
        ref = r["reference"]["token_ids"]
        same = 0
        while same < min(len(served), len(ref)) and served[same] == ref[same]:
            same += 1
        r["greedy_vs_reference"] = {"matching_prefix": same, "of": len(ref)}
    except Exception as exc:
        r["reference_error"] = _error(exc) + "\n" + traceback.format_exc()[-1500:]

    # What the server tokenizes itself: a text prompt, and a chat request through the served tokenizer.
    for key, path, req in (
        ("server_text", "/completions", {"prompt": "你好", "max_tokens": 8, "return_token_ids": True}),
        ("server_chat", "/chat/completions", {"messages": CHAT, "max_tokens": 8, "return_token_ids": True}),
    ):
        try:
            resp = json.loads(client._request("POST", path, {"model": node.served_model_name, **req}).read())
            choice = resp["choices"][0]
            r[key] = {
                "ok": True,
                "prompt_token_ids": resp.get("prompt_token_ids") or choice.get("prompt_token_ids"),
                "text": choice.get("text") or (choice.get("message") or {}).get("content"),
            }
        except Exception as exc:
            r[key] = {"ok": False, "error": _error(exc)}
    chat_ids = (r["server_chat"] or {}).get("prompt_token_ids")
    if chat_ids is not None:
        r["server_chat"]["prompt_ids_match_golden"] = chat_ids == golden["chats"]["one_turn"]

    Path(args.json).write_text(json.dumps(r, indent=2, ensure_ascii=False) + "\n")
    short = {k: v for k, v in r.items() if k not in ("prompt_builder_traceback", "reference_error")}
    print(json.dumps(short, ensure_ascii=False)[:4000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
