"""Generated tables inside the documentation: a block between two marker lines, rewritten by
the command that owns it (`gpu_docs --write`, `audit table --write`) and checked by `make lint`."""

from __future__ import annotations


def replace_block(text: str, begin: str, end: str, block: str, doc: str) -> str:
    """`text` with what lies between `begin` and `end` (markers included) replaced by `block`;
    ValueError naming the document when either marker is missing."""
    if begin not in text or end not in text:
        raise ValueError(f"{doc} lacks the markers {begin!r} ... {end!r}; fix: put them where the table goes")
    head, rest = text.split(begin, 1)
    return head + block + rest.split(end, 1)[1]
