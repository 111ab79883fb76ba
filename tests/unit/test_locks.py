import hashlib
from pathlib import Path

import pytest

from glmdeploy_control import lock

ROOT = Path(__file__).resolve().parents[2]


def test_every_profile_has_a_lock_per_python_with_hashes_on_every_entry():
    for name, spec in lock.load_profiles().items():
        for python in spec.python:
            entries = lock.parse_lock(lock.lock_path(name, python))
            assert entries, f"{name} py{python} is empty"
            unhashed = [pkg for pkg, (_, hashes) in entries.items() if not hashes]
            assert not unhashed, f"{name} py{python}: entries without hashes: {unhashed}"


@pytest.mark.parametrize("python", ["3.10", "3.11"])
def test_gpu_lock_pins_the_cuda121_stack(python):
    entries = lock.parse_lock(lock.lock_path("gpu-cu121", python))
    pins = {name: version for name, (version, _) in entries.items()}
    assert pins["vllm"] == "0.4.3" and pins["torch"] == "2.3.0"
    assert pins["transformers"] == "4.40.2" and pins["tokenizers"] == "0.19.1"
    assert pins["numpy"].startswith("1.")
    assert {"streamlit", "nvidia-ml-py", "pytest"} <= set(pins)


def test_cpu_lock_leaves_out_the_cuda_extras_that_break_the_server():
    entries = lock.parse_lock(lock.lock_path("cpu", "3.11"))
    assert entries["torch"][0] == "2.13.0+cpu"
    assert not {"torchvision", "torchaudio", "torchcodec", "triton"} & set(entries)


def test_reference_tokenizer_stack_is_pinned():
    entries = lock.parse_lock(lock.lock_path("tokenizer-ref", "3.11"))
    assert entries["transformers"][0] == "4.40.2" and entries["tokenizers"][0] == "0.19.1"


def _mini_lock(tmp_path, files):
    lines = []
    for name, data in files.items():
        lines.append(f"{name}==1.0 \\\n    --hash=sha256:{hashlib.sha256(data).hexdigest()}")
    path = tmp_path / "mini.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_wheelhouse_check_names_missing_and_tampered_wheels(tmp_path):
    good, other = b"good wheel", b"other wheel"
    locked = _mini_lock(tmp_path, {"alpha": good, "beta": other, "gamma": b"never fetched"})
    house = tmp_path / "wh"
    house.mkdir()
    (house / "alpha-1.0-py3-none-any.whl").write_bytes(good)
    (house / "beta-1.0-py3-none-any.whl").write_bytes(b"evil wheel")
    problems = lock.verify_wheelhouse(locked, house)
    assert problems == [
        "tampered wheel: beta-1.0-py3-none-any.whl does not match any sha256 in mini.txt",
        f"missing wheel: gamma==1.0 is not in {house}",
    ]


def test_wheelhouse_check_passes_a_complete_wheelhouse(tmp_path):
    locked = _mini_lock(tmp_path, {"alpha": b"a"})
    (tmp_path / "alpha-1.0-py3-none-any.whl").write_bytes(b"a")
    assert lock.verify_wheelhouse(locked, tmp_path) == []


def test_wheel_cache_fills_a_new_wheelhouse_and_skips_a_damaged_entry(tmp_path):
    locked = _mini_lock(tmp_path, {"alpha": b"a", "beta": b"b"})
    cache, house = tmp_path / "cache", tmp_path / "wh"
    cache.mkdir()
    (cache / "alpha-1.0-py3-none-any.whl").write_bytes(b"a")
    (cache / "beta-1.0-py3-none-any.whl").write_bytes(b"tampered in the cache")
    assert lock.sync_cache(locked, cache, house) == 1
    assert (house / "alpha-1.0-py3-none-any.whl").read_bytes() == b"a"
    assert lock.verify_wheelhouse(locked, house) == [f"missing wheel: beta==1.0 is not in {house}"]
    # A complete wheelhouse goes back into the cache, replacing the damaged entry.
    (house / "beta-1.0-py3-none-any.whl").write_bytes(b"b")
    assert lock.sync_cache(locked, house, cache) == 1
    assert lock.verify_wheelhouse(locked, cache) == []


def test_wheel_cache_that_cannot_be_written_is_skipped_with_a_warning(tmp_path, capsys):
    locked = _mini_lock(tmp_path, {"alpha": b"a"})
    (tmp_path / "alpha-1.0-py3-none-any.whl").write_bytes(b"a")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    assert lock.sync_cache(locked, tmp_path, blocker / "cache") == 0
    assert "wheel cache" in capsys.readouterr().err


def test_wheelhouse_command_refuses_a_tampered_wheel_instead_of_fetching_it_again(tmp_path, monkeypatch):
    locked = _mini_lock(tmp_path, {"alpha": b"a"})
    house = tmp_path / "wh"
    house.mkdir()
    (house / "alpha-1.0-py3-none-any.whl").write_bytes(b"evil")
    monkeypatch.setattr(lock, "lock_path", lambda profile, python: locked)
    monkeypatch.setattr(lock.subprocess, "run", lambda *a, **k: pytest.fail("pip must not run"))
    assert lock.main(["wheelhouse", "--profile", "x", "--dest", str(house)]) == 2
    assert (house / "alpha-1.0-py3-none-any.whl").read_bytes() == b"evil"
