"""Facts about ChatGLM3's tokenizer that every part of the kit must agree on.

These ids are the real model's (see the kit's reference notes); the fixture
model is generated with the same ids so stop tokens and prompt building are
identical for the fixture and for ChatGLM3-6B-32k.
"""

from __future__ import annotations

UNK_ID = 0
PAD_ID = 0
BOS_ID = 1
EOS_ID = 2

SPECIAL_TOKENS: dict[str, int] = {
    "[MASK]": 64789,
    "[gMASK]": 64790,
    "[sMASK]": 64791,
    "sop": 64792,
    "eop": 64793,
    "<|system|>": 64794,
    "<|user|>": 64795,
    "<|assistant|>": 64796,
    "<|observation|>": 64797,
}

ROLES = ("system", "user", "assistant", "observation")
ROLE_IDS: dict[str, int] = {role: SPECIAL_TOKENS[f"<|{role}|>"] for role in ROLES}

#: Generation must stop on eos, on the model starting a new user turn, and on a tool call.
STOP_TOKEN_IDS: tuple[int, ...] = (EOS_ID, SPECIAL_TOKENS["<|user|>"], SPECIAL_TOKENS["<|observation|>"])

#: Every prompt starts with these two ids.
PREFIX_IDS: tuple[int, ...] = (SPECIAL_TOKENS["[gMASK]"], SPECIAL_TOKENS["sop"])

#: The tokenizer's `vocab_size`: 64789 SentencePiece pieces plus the nine specials.
VOCAB_SIZE = 64798
#: `len(tokenizer)` of the real class (transformers 4.40.2 counts the keys of `get_vocab()`, and
#: the class names ids 0, 1 and 2 all ""): 64796. vLLM renders generated ids at or past it as "".
TOKENIZER_LEN = 64796
#: Rows of the embedding and output layer (padded), not the tokenizer size.
PADDED_VOCAB_SIZE = 65024

#: Ids no user text may ever produce: role markers and prompt-structure markers.
STRUCTURAL_IDS = frozenset(SPECIAL_TOKENS.values())
