"""CPU cost of vLLM's detokenization with the kit's served (slow, SentencePiece) tokenizer.

Run by `tests/gpu/h200.sh served` after the server has stopped, on the same machine:
it loads the release tokenizer directory the way the server does (vLLM's
`get_tokenizer`, remote code), then replays what vLLM's SlowIncrementalDetokenizer
does for each streamed token (`detokenize_incrementally`, the same call with the same
arguments) for bench-like requests: the bench's 512 random prompt ids, then 256
output ids drawn over the whole padded vocabulary (random weights emit any of the
65,024 ids, padding rows included). One Python thread, nothing else running: the
figure is the detokenizer's share of the API server process's per-token work.

    python bench/h200/detok_cost.py MODEL_DIR TOKENIZER_DIR --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("tokenizer_dir")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()

    import transformers
    import vllm
    from vllm.tokenizers import get_tokenizer
    from vllm.tokenizers.detokenizer_utils import convert_prompt_ids_to_tokens, detokenize_incrementally

    from glmdeploy.bench import make_prompts

    t0 = time.perf_counter()
    tokenizer = get_tokenizer(args.tokenizer_dir, trust_remote_code=True)
    load_s = time.perf_counter() - t0
    try:
        from transformers import TokenizersBackend

        rust_backed = isinstance(tokenizer, TokenizersBackend)
    except ImportError:
        rust_backed = None

    rng = random.Random("detok-cost")
    prompts = make_prompts(args.requests, args.input_len)
    outputs = [[rng.randrange(65024) for _ in range(args.output_len)] for _ in range(args.requests)]

    per_token_us: list[float] = []
    prompt_ms: list[float] = []
    text_chars = 0
    start = time.perf_counter()
    for prompt, out in zip(prompts, outputs, strict=True):
        t = time.perf_counter()
        tokens, prefix_offset, read_offset = convert_prompt_ids_to_tokens(tokenizer, prompt, skip_special_tokens=True)
        prompt_ms.append((time.perf_counter() - t) * 1000)
        ids = list(prompt)
        t = time.perf_counter()
        for token_id in out:
            ids.append(token_id)
            new_tokens, text, prefix_offset, read_offset = detokenize_incrementally(
                tokenizer,
                all_input_ids=ids,
                prev_tokens=tokens,
                prefix_offset=prefix_offset,
                read_offset=read_offset,
                skip_special_tokens=True,
                spaces_between_special_tokens=True,
            )
            tokens.extend(new_tokens)
            text_chars += len(text)
        per_token_us.append((time.perf_counter() - t) / len(out) * 1e6)
    total_s = time.perf_counter() - start
    tokens_total = args.requests * args.output_len
    result = {
        "command": "python bench/h200/detok_cost.py " + " ".join(f"{k}={v}" for k, v in vars(args).items()),
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu": next(
            (
                ln.split(":", 1)[1].strip()
                for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if "model name" in ln
            ),
            platform.processor(),
        ),
        "versions": {"vllm": vllm.__version__, "transformers": transformers.__version__},
        "tokenizer_class": type(tokenizer).__name__,
        "tokenizer_mro": [c.__name__ for c in type(tokenizer).__mro__[:6]],
        "is_fast": bool(getattr(tokenizer, "is_fast", False)),
        "rust_backed": rust_backed,
        "load_s": round(load_s, 3),
        "requests": args.requests,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "prompt_to_tokens_ms_median": round(statistics.median(prompt_ms), 3),
        "detokenize_us_per_token_median": round(statistics.median(per_token_us), 2),
        # prompt conversion included: a whole request's detokenization work per output token
        "request_us_per_output_token_mean": round(total_s * 1e6 / tokens_total, 2),
        "one_thread_output_tokens_per_s": round(tokens_total / total_s, 1),
        "text_chars": text_chars,
    }
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
