"""H200 run only (tests/gpu/h200.sh staged): let the 2023-10-26 ChatGLM3 tokenizer pad on transformers >= 4.45.

Why: transformers >= 4.45 calls `self._pad(..., padding_side=...)` from `pad()`, and it calls
`pad()` for every `encode()` / `__call__`, padding or not. The published ChatGLM3-6B-32k
revision's `tokenization_chatglm.py` (2023-10-26) defines `_pad` without that parameter, so
every text encode fails with "_pad() got an unexpected keyword argument 'padding_side'" (the
kit's rehearsal model reproduces it). The kit's gpu-cu121 lock pins transformers 4.40.2, where
this never happens; the H200 machine has transformers 5.x and vLLM 0.26 needs it.

This module is put on PYTHONPATH only for the second server of `h200.sh staged`, after the first
server has run on the files as staged. It leaves the model directory byte-identical (its
SHA256SUMS still holds) and patches nothing until transformers' tokenizer base module is
imported: then `PreTrainedTokenizerBase.pad` makes sure the tokenizer's class has a `_pad` that,
when the model's own `_pad` refuses the `padding_side` keyword, calls it again without it (the
model pads on the left itself, as the later upstream file does). A `padding_side` other than
the tokenizer's own is still refused.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
from typing import Any

_TARGET = "transformers.tokenization_utils_base"
_MARK = "_glmdeploy_h200_padding_side_compat"


def _compat_pad(own: Any) -> Any:
    @functools.wraps(own)
    def _pad(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return own(self, *args, **kwargs)
        except TypeError as exc:
            if "padding_side" not in kwargs or "padding_side" not in str(exc):
                raise
            side = kwargs.pop("padding_side")
            if side not in (None, getattr(self, "padding_side", None)):
                raise
            return own(self, *args, **kwargs)

    setattr(_pad, _MARK, True)
    return _pad


def _patch(module: Any) -> None:
    base = module.PreTrainedTokenizerBase
    original_pad = base.pad

    @functools.wraps(original_pad)
    def pad(self: Any, *args: Any, **kwargs: Any) -> Any:
        cls = type(self)
        own = getattr(cls, "_pad", None)
        if own is not None and not getattr(own, _MARK, False):
            cls._pad = _compat_pad(own)
            name = f"{cls.__module__}.{cls.__name__}"
            print(f"glmdeploy h200 compat: {name}._pad wrapped (padding_side)", file=sys.stderr)
        return original_pad(self, *args, **kwargs)

    base.pad = pad


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _Finder())
