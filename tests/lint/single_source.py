#!/usr/bin/env python3
"""Check that the facts the profile registry defines are not written again in the kit's code.

constraints/profiles.toml (read through service/glmdeploy_control/registry.py) is the one place
for the profile list and each profile's facts, the GPU rule, the lock file and unit name
patterns, the port defaults and the model names; node.json has one schema
(service/glmdeploy/config.py). Before the registry these were spelled out in up to seven places
each, and a new profile meant editing all of them. This check (run by `make lint`) fails, naming
file, line and the registry key to read instead, when one comes back as code.

What counts as code: YAML, Jinja and Makefile lines that are not comments, and Python outside
comments and docstrings. Prose (comments, docstrings, task names, descriptions and messages that
mention a profile) is not checked: it names a fact, it does not define it. Tests, docs and the
generated README tables are not checked either.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("roles", "playbooks", "service", "library", "plugins", "module_utils", "smoke_tests", "Makefile")
# The registry itself, and the loader that expands its patterns.
OWNERS = {Path("constraints/profiles.toml"), Path("service/glmdeploy_control/registry.py")}
SUFFIXES = {".yml", ".yaml", ".j2", ".py", ".sh", ".cfg"}

PROFILES = r"(?:cpu|gpu-cu121)"
#: (what, pattern, the registry key to read instead). Patterns match code, not prose.
RULES: list[tuple[str, re.Pattern[str], str]] = [
    (
        "a profile name compared or used as a key",
        re.compile(rf"""(?:[=!]=\s*|\bin\s+\[[^]]*)['"]{PROFILES}['"]|^\s*{PROFILES}:\s"""),
        "glmdeploy_registry.profiles / glmdeploy_plan",
    ),
    (
        "a profile name as a value",
        re.compile(rf"""^\s*[\w.]+:\s*['"]?{PROFILES}['"]?\s*$|=\s*['"]{PROFILES}['"]\s*$"""),
        "the registry's profiles / kit.auto",
    ),
    (
        "a port default",
        re.compile(r"""^\s*[\w.]+:\s*['"]?(?:8000|8501)['"]?\s*$|default\(\s*(?:8000|8501)\s*\)"""),
        "kit.services.<service>.port",
    ),
    (
        "a model name as a value",
        re.compile(r"""^\s*[\w.]+:\s*['"]?chatglm3-(?:6b-32k|fixture)['"]?\s*$|default\(\s*['"]chatglm3-"""),
        "profiles.<name>.model / kit.served_model_name",
    ),
    ("the GPU vendor id", re.compile(r"0x10de"), "kit.gpu_pci_vendor (the plan's gpu_present)"),
    ("the unit name pattern", re.compile(r"glmdeploy-(?:\{|vllm_server|chat_ui)[^ ]*\.service"), "kit.unit"),
    (
        "the lock file name pattern",
        re.compile(r"-py\{|-py\(|-py\d{3}\.txt|-py\*\.txt"),
        "kit.lock_file (the plan's lock_file)",
    ),
]


def _python_code_lines(text: str) -> Iterator[tuple[int, str]]:
    """Python source lines with comments and docstrings blanked (string literals that are code stay)."""
    lines = text.splitlines()
    blank: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                blank.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    comments: dict[int, int] = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.start[1]
    for number, line in enumerate(lines, 1):
        if number not in blank:
            yield number, line[: comments.get(number, len(line))]


def _plain_code_lines(text: str) -> Iterator[tuple[int, str]]:
    """YAML, Jinja, shell and Makefile lines that are not comments, without `## help` tails."""
    for number, line in enumerate(text.splitlines(), 1):
        if not line.lstrip().startswith(("#", "{#")):
            yield number, line.split(" ## ")[0]


def files() -> Iterator[Path]:
    for top in SCANNED:
        path = ROOT / top
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        for file in candidates:
            rel = file.relative_to(ROOT)
            code = file.suffix in SUFFIXES or file.name == "Makefile"
            if file.is_file() and code and rel not in OWNERS and "__pycache__" not in rel.parts:
                yield file


def problems() -> list[str]:
    found = []
    for file in files():
        text = file.read_text(encoding="utf-8")
        lines = _python_code_lines(text) if file.suffix == ".py" else _plain_code_lines(text)
        for number, line in lines:
            for what, pattern, instead in RULES:
                if pattern.search(line):
                    found.append(
                        f"{file.relative_to(ROOT)}:{number}: {what}: {line.strip()[:100]}\n    fix: read {instead}"
                    )
    classes = [
        f"{f.relative_to(ROOT)}"
        for top in ("service", "tests", "smoke_tests")
        for f in (ROOT / top).rglob("*.py")
        if "__pycache__" not in f.parts and re.search(r"^class NodeConfig\b", f.read_text(encoding="utf-8"), re.M)
    ]
    if classes != ["service/glmdeploy/config.py"]:
        found.append(f"node.json's schema must be defined once, in service/glmdeploy/config.py; found in {classes}")
    return found


def main() -> int:
    found = problems()
    for problem in found:
        print(problem, file=sys.stderr)
    if found:
        print(
            f"single source: {len(found)} fact(s) the registry defines are written again (constraints/profiles.toml)",
            file=sys.stderr,
        )
        return 1
    print("single source: the registry's facts appear in code only where they are read")
    return 0


if __name__ == "__main__":
    sys.exit(main())
