"""The rtx-4090 row's vLLM arguments for an H200 that plays a 24 GB card (tests/gpu/h200.sh card24).

vLLM plans its memory as gpu_memory_utilization x the card's total memory: weights, activations
and CUDA graphs first, the KV cache gets the rest. A 24 GB card at the row's 0.90 gives the engine
0.90 x 23.99 GiB; on this GPU the same budget in bytes is that over the H200's total. Prints the
arguments on stdout and the arithmetic on stderr. What this does not emulate: the card's bandwidth
and compute, and the CUDA context's size, which is the H200's.
"""

from __future__ import annotations

import json
import sys

import torch


def main(row_file: str) -> int:
    with open(row_file, encoding="utf-8") as fh:
        row = json.load(fh)
    total = torch.cuda.mem_get_info()[1]
    budget = row["gpu_memory_utilization"] * row["memory_gib"] * 2**30
    util = budget / total
    args = list(row["vllm_args"])
    args[args.index("--gpu-memory-utilization") + 1] = f"{util:.4f}"
    print(
        f"budget {budget / 2**30:.2f} GiB = {row['gpu_memory_utilization']} x {row['memory_gib']} GiB (rtx-4090 row);"
        f" this GPU's total {total / 2**30:.2f} GiB -> --gpu-memory-utilization {util:.4f}",
        file=sys.stderr,
    )
    print(" ".join(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
