"""Per-file SHA256 manifest of a model directory: written once, checked on every deploy.

Why: a node must refuse a model whose files differ from the pinned revision
(a truncated copy, a tampered file, a tokenizer swapped under the weights),
and say which file, before any running service is touched.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from glmdeploy.integrity import file_sha256, format_sums, parse_sums

__all__ = ["MANIFEST", "check_manifest", "file_sha256", "read_manifest", "write_manifest"]

MANIFEST = "SHA256SUMS"


def model_files(model_dir: Path) -> list[Path]:
    return sorted(
        p
        for p in model_dir.rglob("*")
        if p.is_file()
        and p.name != MANIFEST
        and not any(part.startswith(".") for part in p.relative_to(model_dir).parts)
    )


def write_manifest(model_dir: Path) -> Path:
    """Write `SHA256SUMS` in `sha256sum -c` format, so a node can also check it with coreutils."""
    out = model_dir / MANIFEST
    out.write_text(format_sums({p.relative_to(model_dir).as_posix(): file_sha256(p) for p in model_files(model_dir)}))
    return out


def read_manifest(model_dir: Path) -> dict[str, str]:
    path = model_dir / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing")
    return parse_sums(path.read_text(encoding="utf-8"))


def check_manifest(model_dir: Path) -> list[str]:
    """Return one message per problem; empty means the directory matches its manifest exactly."""
    if not model_dir.is_dir():
        return [f"model directory {model_dir} does not exist"]
    try:
        expected = read_manifest(model_dir)
    except FileNotFoundError as exc:
        return [f"{exc}: write it with `python -m glmdeploy.manifest write {model_dir}` from a trusted copy"]
    problems = []
    present = {p.relative_to(model_dir).as_posix(): p for p in model_files(model_dir)}
    for name, digest in sorted(expected.items()):
        if name not in present:
            problems.append(f"missing model file: {name}")
        elif file_sha256(present[name]) != digest:
            problems.append(f"model file changed: {name} does not match its SHA256 in {MANIFEST}")
    problems += [f"unexpected model file: {name} is not in {MANIFEST}" for name in sorted(set(present) - set(expected))]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m glmdeploy.manifest", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["write", "check"])
    parser.add_argument("model_dir", type=Path)
    args = parser.parse_args(argv)
    if args.action == "write":
        print(f"wrote {write_manifest(args.model_dir)}")
        return 0
    problems = check_manifest(args.model_dir)
    for problem in problems:
        print(f"ERROR: {problem}", file=sys.stderr)
    if problems:
        print(
            f"fix: restore the model files in {args.model_dir} from the pinned revision: `make fixture` "
            "for the cpu profile; for ChatGLM3-6B-32k copy the pinned revision's files and SHA256SUMS there "
            "(docs/howto/weights.md)",
            file=sys.stderr,
        )
        return 1
    print(f"{args.model_dir}: {len(read_manifest(args.model_dir))} files match {MANIFEST}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
