#!/usr/bin/env python3
"""Check that the facts the profile registry defines are not written again in the kit's code.

constraints/profiles.toml (read through service/glmdeploy_control/registry.py) is the one place
for the profile list and each profile's facts, the GPU rule, the lock file and unit name
patterns, the ports and the model names; node.json has one schema (service/glmdeploy/config.py).
Before the registry these were spelled out in up to seven places each, and a new profile meant
editing all of them. This check (run by `make lint`) fails, naming file, line and the registry key
to read instead, when one comes back as code.

The rules are built from the registry itself, not from a copy of its values: a port, profile or
model added there is checked from then on (a hand-written list of the values let a planted
`node_metrics_prober_port: 9811` through, because it knew only the two ports of its day).

What is checked: every file of the checkout that git sees (tracked, or new and not ignored) that is
code (YAML, Jinja, Python, shell, Makefile, config), outside tests/ (tests plant the values on
purpose), docs/ and bench/ (prose and recorded runs), and outside the registry and its loader.
Prose is not checked: it names a fact, it does not define it. Prose is comments; Python docstrings
and the help texts of argparse; YAML task and play names, messages (msg, fail_msg, success_msg)
and descriptions (argument specs, alert annotations).
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
# The loader of this checkout, whatever else the interpreter has on its path.
sys.path.insert(0, str(ROOT / "service"))
from glmdeploy_control import registry  # noqa: E402

REGISTRY_FILE = Path("constraints/profiles.toml")
# The registry itself, and the loader that expands its patterns.
OWNERS = {REGISTRY_FILE, Path("service/glmdeploy_control/registry.py")}
# Top-level folders that are not the kit's code: tests plant registry values on purpose, docs and
# bench (recorded measurements and their one-off scripts) are prose and records.
NOT_SCANNED = {"tests", "docs", "bench"}
SUFFIXES = {".yml", ".yaml", ".j2", ".jinja", ".py", ".sh", ".cfg", ".ini", ".conf", ".toml"}
NAMES = {"Makefile", "Containerfile"}
YAML_SUFFIXES = {".yml", ".yaml"}
# YAML keys whose values are prose wherever they are (Ansible messages, argument spec and
# alert descriptions); `name` is prose only as a task's or play's name (see _yaml_prose_lines).
PROSE_KEYS = {"msg", "fail_msg", "success_msg", "description", "short_description", "summary"}
PLAY_KEYWORDS = {"block", "hosts", "import_playbook", "tasks", "roles", "handlers"}
# Python keyword arguments whose string is prose (argparse's texts).
PROSE_KWARGS = {"help", "description", "epilog", "usage"}
# A placeholder in a name built from a pattern: Jinja, str.format, shell and Make, printf, and a
# string concatenated with an expression (`'x-' ~ name ~ '.y'`, `"x-" + name + ".y"`).
PLACEHOLDER = r"""(?:\{\{[^}]*\}\}|\{[^{}]*\}|\$\{[^}]*\}|\$\([^)]*\)|\$\w+|%s|%\(\w+\)s|['"]\s*[~+].*?[~+]\s*['"])"""
# A setting's value on its own: `key: v`, `- v`, `X := v`, `X = v` (YAML, INI, Makefile, Python).
VALUE_ALONE = r"""^\s*(?:-\s+)?(?:['"]?[\w.-]+['"]?\s*(?::=|\?=|[:=])\s*)?['"]?{v}['"]?\s*,?\s*$"""


@dataclass(frozen=True)
class Rule:
    """One registry value in one shape of code: what it is, how it looks, the key to read instead."""

    #: One report per line and family ("port", "profile", "model", "gpu", "pattern"), however many
    #: of the family's shapes the line has.
    family: str
    what: str
    pattern: re.Pattern[str]
    key: str
    #: Text every match contains (lower case): lines without it are not searched, which keeps the
    #: check to a second on the whole tree.
    needle: str


# ---------------------------------------------------------------------------- rules from the registry


def _ports(data: Any, where: str = "") -> Iterator[tuple[str, int]]:
    """(dotted key, port) for every key ending in `port` anywhere in the registry."""
    if isinstance(data, dict):
        for key, value in data.items():
            dotted = f"{where}.{key}" if where else str(key)
            if str(key).endswith("port") and isinstance(value, int) and not isinstance(value, bool):
                yield dotted, value
            else:
                yield from _ports(value, dotted)
    elif isinstance(data, list):
        for index, item in enumerate(data):
            yield from _ports(item, f"{where}[{index}]")


def port_rules(reg: registry.Registry) -> list[Rule]:
    """Each port the registry defines, as a setting, a default, an argument or in an address."""
    rules = []
    for key, port in _ports(reg.to_dict()):
        n = rf"{port}(?!\d)"
        shapes = [
            VALUE_ALONE.format(v=n),
            rf"""(?i:\w*port\w*)['"]?\s*(?::\s*int\s*)?(?:==|!=|=|:)\s*['"]?(?<!\d){n}""",  # port=9811, "port": 9811
            rf"""default\(\s*['"]?{n}""",  # Jinja default(9811)
            rf"""-port['"]?(?:\s*,\s*|[= ])['"]?{n}""",  # --port 9811, "--port", "9811"
            rf"""[\w\]}}]:{n}""",  # an address: 127.0.0.1:9811, [::1]:9811, {{ host }}:9811
            rf"""\blisten\s+{n}""",  # nginx
        ]
        rules.append(Rule("port", f"port {port}", re.compile("|".join(shapes)), key, str(port)))
    return rules


def profile_rules(reg: registry.Registry) -> list[Rule]:
    """Each profile name compared, used as a key or set as a value (prose may name them)."""
    rules = []
    for name in reg.profiles:
        p = re.escape(name)
        auto = [f"kit.auto.{k}" for k, v in vars(reg.kit.auto).items() if v == name]
        key = " / ".join([f"profiles.{name}", *auto]) + " (a node's profile: glmdeploy_plan)"
        compared = (
            rf"""(?:[=!]=\s*|\bin\s+[\[(][^])]*)['"]{p}['"]"""  # == 'cpu', in ['cpu', ...]
            rf"""|^\s*{p}:\s"""  # a YAML key
        )
        value = rf"""{VALUE_ALONE.format(v=p)}|=\s*['"]{p}['"]\s*$|default\(\s*['"]{p}['"]"""
        what = f"profile name {name!r}"
        rules.append(Rule("profile", f"{what} compared or used as a key", re.compile(compared), key, name.lower()))
        rules.append(Rule("profile", f"{what} as a value", re.compile(value), key, name.lower()))
    return rules


def model_rules(reg: registry.Registry) -> list[Rule]:
    """Each profile's model and the served model name, as a string, a value, a path or an argument."""
    keys: dict[str, list[str]] = {}
    for name, profile in reg.profiles.items():
        keys.setdefault(profile.model, []).append(f"profiles.{name}.model")
    keys.setdefault(reg.kit.served_model_name, []).append("kit.served_model_name")
    rules = []
    for model, where in keys.items():
        m = re.escape(model)
        shapes = [
            rf"""['"]{m}['"]""",  # a string literal that is the name
            VALUE_ALONE.format(v=m),
            rf"""(?:models/|--[\w-]+[= ]|[=:]\s*['"]?|default\(\s*['"]?){m}(?![\w.-])""",
        ]
        pattern = re.compile("|".join(shapes))
        rules.append(Rule("model", f"model name {model!r}", pattern, " / ".join(where), model.lower()))
    return rules


def gpu_rules(reg: registry.Registry) -> list[Rule]:
    """The GPU rule's vendor id anywhere in code, with or without its 0x."""
    vendor = reg.kit.gpu_pci_vendor
    digits = vendor.lower().removeprefix("0x")
    pattern = re.compile(rf"(?<!\w)(?:0x)?{re.escape(digits)}(?!\w)", re.I)
    return [Rule("gpu", f"the GPU vendor id {vendor}", pattern, "kit.gpu_pci_vendor (glmdeploy_plan)", digits)]


def pattern_rules(reg: registry.Registry) -> list[Rule]:
    """A name the registry builds from a pattern, written out or built again from the pattern's text.

    kit.log ("{service}.log") is left out: its only literal part is an extension every log has.
    """
    globbed = r"\*"
    values = {
        "profile": [*map(re.escape, reg.lock_sets()), globbed],
        "xy": [r"\d{2,3}", globbed],
        # A node's units: its services, then the portless ones (kit.node_units, where the registry
        # has them). No glob: the balancer's units share the prefix, so a glob over it means the
        # host's units, not this pattern.
        "service": [re.escape(s) for s in [*reg.kit.services, *getattr(reg.kit, "node_units", [])]],
        "release": [*map(re.escape, reg.kit.apt.releases), globbed],
    }
    patterns = {
        "kit.lock_file": reg.kit.lock_file,
        "kit.wheelhouse": reg.kit.wheelhouse,
        "kit.unit": reg.kit.unit,
        "kit.apt.lock_file": reg.kit.apt.lock_file,
    }
    rules = []
    for key, text in patterns.items():
        parts = re.split(r"\{(\w+)\}", text)  # literal, placeholder, literal, ...
        regex = "".join(
            re.escape(part) if i % 2 == 0 else "(?:" + "|".join([PLACEHOLDER, *values.get(part, [])]) + ")"
            for i, part in enumerate(parts)
        )
        needle = max(parts[::2], key=len).lower()
        rules.append(Rule("pattern", f"the name pattern {text!r}", re.compile(regex + r"(?![\w.])"), key, needle))
    return rules


def rules(reg: registry.Registry) -> list[Rule]:
    return [*port_rules(reg), *profile_rules(reg), *model_rules(reg), *gpu_rules(reg), *pattern_rules(reg)]


# ---------------------------------------------------------------------------- code, not prose


def _blank(lines: list[str], start: tuple[int, int], end: tuple[int, int]) -> None:
    """Spaces over (line, UTF-8 byte column) start..end, lines 1-based as ast gives them."""

    def chars(number: int, column: int) -> int:
        return len(lines[number - 1].encode("utf-8")[:column].decode("utf-8", "replace"))

    (l1, c1), (l2, c2) = start, end
    for number in range(l1, l2 + 1):
        line = lines[number - 1]
        a = chars(number, c1) if number == l1 else 0
        b = chars(number, c2) if number == l2 else len(line)
        lines[number - 1] = line[:a] + " " * (b - a) + line[b:]


def _python_code_lines(text: str) -> Iterator[tuple[int, str]]:
    """Python source lines with comments, docstrings and argparse help texts blanked (other string
    literals are code and stay)."""
    lines = text.splitlines()
    prose: list[ast.expr] = []
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            prose.append(first.value)
        if isinstance(node, ast.Call):
            prose += [k.value for k in node.keywords if k.arg in PROSE_KWARGS]
    for node in prose:
        _blank(lines, (node.lineno, node.col_offset), (node.end_lineno or node.lineno, node.end_col_offset or 0))
    comments = {
        tok.start[0]: tok.start[1]
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    }
    for number, line in enumerate(lines, 1):
        yield number, line[: comments.get(number, len(line))]


def _node_lines(node: yaml.Node) -> range:
    """The 1-based lines a YAML node spans (a block scalar's end mark is the next line's column 0)."""
    end = node.end_mark.line if node.end_mark.column == 0 and node.end_mark.line > node.start_mark.line else None
    last = end if end is not None else node.end_mark.line + 1
    return range(node.start_mark.line + 1, last + 1)


def _yaml_prose_lines(text: str) -> set[int]:
    """Lines of task and play names, messages and descriptions (empty when the file is not YAML)."""
    found: set[int] = set()

    def visit(node: yaml.Node, item: bool) -> None:
        if isinstance(node, yaml.MappingNode):
            keys = {k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)}
            task = item and any("." in str(k) or k in PLAY_KEYWORDS for k in keys)
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else None
                if name in PROSE_KEYS or (name == "name" and task and isinstance(value, yaml.ScalarNode)):
                    found.update(_node_lines(value))
                else:
                    visit(value, False)
        elif isinstance(node, yaml.SequenceNode):
            for child in node.value:
                visit(child, True)

    try:
        for document in yaml.compose_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            if document is not None:
                visit(document, False)
    except yaml.YAMLError:
        return set()
    return found


def _plain_code_lines(text: str, yaml_file: bool) -> Iterator[tuple[int, str]]:
    """YAML, Jinja, shell and Makefile lines that are not comments or prose, without `## help` tails."""
    prose = _yaml_prose_lines(text) if yaml_file else set()
    for number, line in enumerate(text.splitlines(), 1):
        if number not in prose and not line.lstrip().startswith(("#", "{#")):
            yield number, line.split(" ## ")[0]


def code_lines(path: Path, text: str) -> Iterator[tuple[int, str]]:
    if path.suffix == ".py" or (not path.suffix and text.startswith("#!") and "python" in text.split("\n", 1)[0]):
        return _python_code_lines(text)
    return _plain_code_lines(text, path.suffix in YAML_SUFFIXES)


# ---------------------------------------------------------------------------- the tree


def _tree(root: Path) -> list[Path]:
    """What git sees of the checkout (tracked, and new files it does not ignore); a folder that is
    not a git checkout (a test's copy) is taken whole."""
    git = ["git", "-C", str(root)]
    top = subprocess.run([*git, "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=False)
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root.resolve():
        return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())
    listed = [*git, "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    out = subprocess.run(listed, capture_output=True, check=True).stdout.decode()
    return sorted({Path(p) for p in out.split("\0") if p})


def _is_code(path: Path) -> bool:
    if path.suffix in SUFFIXES or path.name in NAMES:
        return True
    if path.suffix:
        return False
    with path.open("rb") as fh:
        return fh.read(2) == b"#!"


def files(root: Path) -> Iterator[Path]:
    for rel in _tree(root):
        if rel.parts[0] in NOT_SCANNED or rel in OWNERS or "__pycache__" in rel.parts:
            continue
        path = root / rel
        if path.is_file() and _is_code(path):
            yield path


# ---------------------------------------------------------------------------- the check


def problems(root: Path) -> list[str]:
    """One message per line (and kind of value) that writes a registry value again."""
    every = rules(registry.load(root / REGISTRY_FILE))
    found = []
    for path in files(root):
        text = path.read_text(encoding="utf-8")
        lowered = text.lower()
        checks = [rule for rule in every if rule.needle in lowered]
        for number, line in code_lines(path, text) if checks else ():
            found += [f"{path.relative_to(root)}:{number}: {problem}" for problem in line_problems(line, checks)]
    return found + schema_problems(root)


def line_problems(line: str, checks: list[Rule]) -> Iterator[str]:
    """The first rule of each family that the line breaks (one value can match several shapes)."""
    lowered = line.lower()
    seen: set[str] = set()
    for rule in checks:
        if rule.family not in seen and rule.needle in lowered and rule.pattern.search(line):
            seen.add(rule.family)
            shown = line.strip()[:100]
            yield f"{rule.what} written as a literal: {shown}\n    fix: read {rule.key} from the registry instead"


def schema_problems(root: Path) -> list[str]:
    classes = [
        f"{f.relative_to(root)}"
        for top in ("service", "tests", "smoke_tests")
        for f in sorted((root / top).rglob("*.py"))
        if "__pycache__" not in f.parts and re.search(r"^class NodeConfig\b", f.read_text(encoding="utf-8"), re.M)
    ]
    if classes != ["service/glmdeploy/config.py"]:
        return [f"node.json's schema must be defined once, in service/glmdeploy/config.py; found in {classes}"]
    return []


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: this one)")
    root = parser.parse_args(argv).root.resolve()
    found = problems(root)
    for problem in found:
        print(problem, file=sys.stderr)
    if found:
        print(
            f"single source: {len(found)} fact(s) the registry defines are written again ({REGISTRY_FILE}). "
            "Read a key as glmdeploy_registry.<key> in Ansible, glmdeploy_control.registry.load() in Python, "
            "$(REG_*) or `python -m glmdeploy_control.registry get <key>` in the Makefile",
            file=sys.stderr,
        )
        return 1
    print("single source: the registry's facts appear in code only where they are read")
    return 0


if __name__ == "__main__":
    sys.exit(main())
