"""Unit tests run in the reference tokenizer environment (transformers 4.40.2, tokenizers 0.19.1)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The release logic is an Ansible module_utils (it runs on the node with the glmdeploy_release module).
sys.path.insert(0, str(ROOT / "module_utils"))
# Test-support modules (tests/support/: the fixture model's generator `fixture_model`, ...): not part of the kit.
sys.path.insert(0, str(ROOT / "tests" / "support"))


@pytest.fixture(scope="session")
def fixture_dir() -> Path:
    path = ROOT / "artifacts" / "models" / "chatglm3-fixture"
    if not (path / "SHA256SUMS").exists():
        pytest.fail("fixture model missing: run `make fixture` (make unit does it)")
    return path


@pytest.fixture(scope="session")
def tokenizer(fixture_dir: Path) -> object:
    from glmdeploy.model.prompt import load_tokenizer

    return load_tokenizer(str(fixture_dir), trust_remote_code=True)
