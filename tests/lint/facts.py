#!/usr/bin/env python3
"""Check that every fact one role or playbook hands to another is declared (``make lint``).

Why: a fact set with ``ansible.builtin.set_fact`` in one role (or playbook file) and read in
another is a contract between the two, just like a role's settings. Undeclared, it is invisible:
the reader's argument spec does not check it, the README does not mention it, and a rename on one
side leaves the other reading an undefined (or ``default()``-ed) variable without any error.
A review found ``release_switched``, ``release_resumed`` and ``release_revert_error`` used across
files and declared nowhere.

The rule, kept simple so that it is predictable:

- A *fact* is a key of an ``ansible.builtin.set_fact`` task (``set_fact``, ``ansible.legacy.``
  too; ``cacheable`` excluded) in ``roles/*/{tasks,handlers}`` or ``playbooks/``. Variables from
  ``register:`` and from ``vars:`` of an ``include_role`` are out of scope.
- A *unit* is a role (every file under ``roles/<role>/``) or one playbook file (``playbooks/…``).
  A fact is *handed over* when a unit other than the one that sets it reads it: its name, as a
  whole word, in that unit's task, handler, template, defaults or vars files (YAML comment lines,
  Jinja comments and the YAML keys that define a variable are not reads).
- A handed-over fact is *declared* when it is an option of some entry point in some role's
  ``meta/argument_specs.yml`` (the reader takes it as an input), or is named in a code span
  (`` `name` ``) in the ``## Facts`` section of some role's ``README.md`` (the "Consumed" and
  "Set for others" lists).

Exit 1 names each undeclared fact with the file (and line) that sets it, the file that reads it,
and the fix. Reads nothing outside the checkout; changes nothing.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
SET_FACT = {"ansible.builtin.set_fact", "ansible.legacy.set_fact", "set_fact"}
NOT_FACTS = {"cacheable"}
# Role folders whose files read variables (meta/ declares them, files/ is copied as is).
READ_DIRS = ("tasks", "handlers", "templates", "defaults", "vars")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
CODE_SPAN = re.compile(r"`+([^`]+)`+")
# A YAML key that defines a variable or a task argument (`  name:`, `- name:`): not a read.
YAML_KEY = re.compile(r"^(\s*(?:-\s+)*)[A-Za-z_][A-Za-z0-9_]*\s*:(?=\s|$)")
JINJA_COMMENT = re.compile(r"\{#.*?#\}", re.DOTALL)


@dataclass(frozen=True)
class Setter:
    fact: str
    path: Path
    line: int


@dataclass(frozen=True)
class Handover:
    setter: Setter
    reader: Path
    line: int


def display(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def unit_of(path: Path, root: Path) -> str:
    """The role a file belongs to (``role:<name>``), or the playbook file itself."""
    parts = path.relative_to(root).parts
    if parts[0] == "roles" and len(parts) > 2:
        return f"role:{parts[1]}"
    return "/".join(parts)


def yaml_files(folder: Path) -> Iterator[Path]:
    if folder.is_dir():
        yield from sorted(p for p in folder.rglob("*") if p.suffix in {".yml", ".yaml"} and p.is_file())


def setter_files(root: Path) -> list[Path]:
    files = [
        p for role in sorted((root / "roles").glob("*/")) for d in ("tasks", "handlers") for p in yaml_files(role / d)
    ]
    return files + list(yaml_files(root / "playbooks"))


def reader_files(root: Path) -> list[Path]:
    files: list[Path] = []
    for role in sorted((root / "roles").glob("*/")):
        for folder in READ_DIRS:
            if (role / folder).is_dir():
                files += sorted(p for p in (role / folder).rglob("*") if p.is_file())
    return files + list(yaml_files(root / "playbooks"))


def set_fact_keys(node: Any) -> Iterator[str]:
    """Every key of every set_fact task anywhere in a parsed YAML document (plays, blocks, rescues)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in SET_FACT and isinstance(value, dict):
                yield from (str(k) for k in value if k not in NOT_FACTS)
            else:
                yield from set_fact_keys(value)
    elif isinstance(node, list):
        for item in node:
            yield from set_fact_keys(item)


def setters(root: Path) -> list[Setter]:
    found: list[Setter] = []
    for path in setter_files(root):
        text = path.read_text(encoding="utf-8")
        try:
            documents = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            raise SystemExit(f"facts: {display(path, root)} is not valid YAML: {exc}") from exc
        lines = text.splitlines()
        for fact in sorted({key for doc in documents for key in set_fact_keys(doc)}):
            found.append(Setter(fact, path, set_fact_line(lines, fact)))
    return found


def set_fact_line(lines: list[str], fact: str) -> int:
    """The line of the fact's key under a set_fact (else its first key line; 0 when not found)."""
    key = re.compile(rf"^(\s*)(?:-\s+)*{re.escape(fact)}\s*:")
    candidates = [(n, len(m.group(1))) for n, line in enumerate(lines, 1) if (m := key.match(line))]
    for number, indent in candidates:
        for above in reversed(lines[: number - 1]):
            if not above.strip() or above.lstrip().startswith("#"):
                continue
            if len(above) - len(above.lstrip()) < indent:
                if re.search(r"\bset_fact\s*:\s*$", above):
                    return number
                break
    return candidates[0][0] if candidates else 0


def read_text(path: Path) -> list[str]:
    """The file's lines with what is not a read blanked: comments, and YAML keys that define names."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return []
    text = JINJA_COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    if path.suffix not in {".yml", ".yaml"}:
        return text.splitlines()
    return ["" if line.lstrip().startswith("#") else YAML_KEY.sub(r"\1", line) for line in text.splitlines()]


def handovers(root: Path, found: list[Setter]) -> list[Handover]:
    """Each (fact, setting file) with the first line of each other unit's file that reads it."""
    readers = {path: read_text(path) for path in reader_files(root)}
    result: list[Handover] = []
    for setter in found:
        word = re.compile(rf"\b{re.escape(setter.fact)}\b")
        home = unit_of(setter.path, root)
        for path, lines in readers.items():
            if unit_of(path, root) == home:
                continue
            line = next((n for n, text in enumerate(lines, 1) if word.search(text)), 0)
            if line:
                result.append(Handover(setter, path, line))
    return result


def spec_options(root: Path) -> set[str]:
    names: set[str] = set()
    for spec in sorted((root / "roles").glob("*/meta/argument_specs.yml")):
        data = yaml.safe_load(spec.read_text(encoding="utf-8")) or {}
        for entry in (data.get("argument_specs") or {}).values():
            names.update(str(name) for name in (entry or {}).get("options") or {})
    return names


def readme_facts(root: Path) -> set[str]:
    """Names in code spans of each role README's ``## Facts`` section (up to the next ``## `` heading)."""
    names: set[str] = set()
    for readme in sorted((root / "roles").glob("*/README.md")):
        section = re.search(r"^## Facts\s*$(.*?)(?=^## |\Z)", readme.read_text(encoding="utf-8"), re.M | re.S)
        if section:
            for span in CODE_SPAN.findall(section.group(1)):
                names.update(IDENTIFIER.findall(span))
    return names


def problems(root: Path) -> tuple[list[str], int]:
    """(one message per setter of an undeclared handed-over fact, number of handed-over facts)."""
    crossing = handovers(root, setters(root))
    declared = spec_options(root) | readme_facts(root)
    readers: dict[Setter, list[Handover]] = {}
    for item in crossing:
        if item.setter.fact not in declared:
            readers.setdefault(item.setter, []).append(item)
    messages: list[str] = []
    for setter, items in readers.items():
        home = unit_of(setter.path, root)
        reading_roles = sorted(
            {u.removeprefix("role:") for i in items if (u := unit_of(i.reader, root)).startswith("role:")}
        )
        if home.startswith("role:"):
            where = f"roles/{home.removeprefix('role:')}/README.md ('Set for others')"
        elif reading_roles:
            where = " or ".join(f"roles/{r}/README.md" for r in reading_roles) + " ('Consumed')"
        else:
            where = "the README of the role the fact belongs to"
        read_in = ", ".join(f"{display(i.reader, root)}:{i.line}" for i in items)
        messages.append(
            f"fact {setter.fact}, set in {display(setter.path, root)}:{setter.line}, is read in {read_in} "
            f"(another role or playbook), but no role declares it. fix: name it (`{setter.fact}`) in the "
            f"'## Facts' section of {where}, or make it an option of the entry point that reads it "
            "(roles/<role>/meta/argument_specs.yml)"
        )
    return messages, len({i.setter.fact for i in crossing})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: this one)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    messages, count = problems(root)
    for message in messages:
        print(message, file=sys.stderr)
    if messages:
        print(f"facts: {len(messages)} fact(s) handed between roles or playbooks and declared nowhere", file=sys.stderr)
        return 1
    print(f"facts: {count} facts handed between roles and playbooks, each declared in a spec or a role README")
    return 0


if __name__ == "__main__":
    sys.exit(main())
