"""Chat with the deployed model from a terminal, streaming the reply.

Why: the quickest way for an admin to see a node answer, through the same
prompt builder and client as the web UI.
"""

from __future__ import annotations

import argparse
import sys

from glmdeploy.api.client import ApiClient, ServerError, ServerUnavailable
from glmdeploy.config import NodeConfig
from glmdeploy.model.prompt import PromptBuilder, load_tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m glmdeploy.tools.chat", description=__doc__.splitlines()[0])
    parser.add_argument("message", nargs="+", help="one or more user turns, sent in order")
    parser.add_argument("--config", help="node config (default: /etc/glmdeploy/node.json)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-p", type=float, default=0.8)
    args = parser.parse_args(argv)
    node = NodeConfig.load(args.config)
    client = ApiClient.for_node(node)
    # The deployed profile says whether the model's tokenizer is its own code (ChatGLM3's is).
    builder = PromptBuilder.from_tokenizer(load_tokenizer(node.model_dir, node.trust_remote_code))
    history: list[dict[str, str]] = []
    try:
        for turn in args.message:
            history.append({"role": "user", "content": turn})
            print(f"user> {turn}\nassistant> ", end="", flush=True)
            reply = ""
            for piece in client.stream_completion(
                builder.chat_ids(history), args.max_tokens, args.temperature, args.top_p
            ):
                reply += piece
                print(piece, end="", flush=True)
            print()
            history.append({"role": "assistant", "content": reply})
    except (ServerUnavailable, ServerError) as exc:
        print(f"\nERROR: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
