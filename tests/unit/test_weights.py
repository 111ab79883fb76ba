"""glmdeploy_control.weights: a pinned commit staged whole and checked, or nothing changed.

The hub is tests/hub/hub_standin.py on loopback (the real hub is out of reach here); the
revisions are the fixture generator's two shapes: `published` (seven `.bin` shards, a plain
copy of the repo as the real ChatGLM3-6B-32k revision ships it) and `later` (safetensors).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import importlib.util
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from fixture_model import generate  # tests/support/, on sys.path through conftest.py

from glmdeploy import manifest
from glmdeploy_control import checkpoint, weights

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = weights.DEFAULT_REPO
DEST_NAME = "chatglm3-6b-32k"
BIN_SHARDS = [f"pytorch_model-{k:05d}-of-00007.bin" for k in range(1, 8)]
ST_SHARDS = [f"model-{k:05d}-of-00007.safetensors" for k in range(1, 8)]
#: Where the refused inputs' messages are written for a reader (one per case).
MESSAGES = Path("/tmp/weights-messages.txt")


def _load_standin():
    spec = importlib.util.spec_from_file_location("hub_standin", ROOT / "tests" / "hub" / "hub_standin.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


standin = _load_standin()


def _staged(root, revision=COMMIT):
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"torch_dtype": "float16"}\n')
    (root / "model-00001-of-00001.safetensors").write_bytes(b"\x01" * 4096)
    (root / weights.REVISION_FILE).write_text(f"{weights.DEFAULT_REPO}@{revision}\n")
    manifest.write_manifest(root)
    return root


def _tree(root: Path) -> dict[str, object]:
    """Every path under root: files by content hash, mode and mtime; directories as such."""
    out: dict[str, object] = {}
    for p in sorted(root.rglob("*")):
        st = p.stat()
        rel = p.relative_to(root).as_posix()
        out[rel] = "dir" if p.is_dir() else (hashlib.sha256(p.read_bytes()).hexdigest(), st.st_mode, st.st_mtime_ns)
    return out


def _plain_files(src: Path) -> set[str]:
    return {p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file()}


# ---------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", autouse=True)
def loopback_without_proxy():
    """The stand-in is on loopback: a proxy from the environment must not be asked for it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NO_PROXY", "127.0.0.1,localhost")
        mp.setenv("no_proxy", "127.0.0.1,localhost")
        yield


@pytest.fixture(scope="module")
def published_src(tmp_path_factory) -> Path:
    """A plain copy of the repo in the published revision's shape (.bin shards only)."""
    path = tmp_path_factory.mktemp("published") / DEST_NAME
    generate(path, shape="published")
    return path


@pytest.fixture(scope="module")
def later_src(tmp_path_factory) -> Path:
    """A plain copy of a safetensors-shaped revision (the `later` fixture without its manifest)."""
    path = tmp_path_factory.mktemp("later") / DEST_NAME
    generate(path)
    (path / manifest.MANIFEST).unlink()
    return path


@pytest.fixture(scope="module")
def hub_staged(published_src, tmp_path_factory) -> SimpleNamespace:
    """The published-shape revision staged once from the hub stand-in, in process (--endpoint)."""
    base = tmp_path_factory.mktemp("hub-staged")
    dest, work = base / "models" / DEST_NAME, base / "staging"
    revision = standin.Revision(published_src, REPO, COMMIT)
    with standin.serve(revision) as endpoint:
        rc = weights.main(["--revision", COMMIT, "--dest", str(dest), "--endpoint", endpoint, "--work", str(work)])
    assert rc == 0
    return SimpleNamespace(dest=dest, work=work, endpoint=endpoint, requests=list(revision.requests))


@pytest.fixture(scope="module")
def messages() -> Iterator[dict[str, str]]:
    """The refused inputs' messages, written to MESSAGES at the end of the module."""
    collected: dict[str, str] = {}
    yield collected
    MESSAGES.write_text("".join(f"[{case}]\n{text}\n\n" for case, text in sorted(collected.items())), encoding="utf-8")


@pytest.fixture
def mirror(tmp_path):
    """A loopback HTTP server serving a staged directory (a lab mirror)."""
    served = _staged(tmp_path / "mirror")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


# ---------------------------------------------------------------------------- the hub, in process


def test_bin_only_revision_is_staged_from_the_hub_as_safetensors(hub_staged):
    dest = hub_staged.dest
    names = {p.name for p in dest.iterdir()}
    assert set(ST_SHARDS) | {checkpoint.SAFETENSORS_INDEX} <= names
    assert not [n for n in names if n.endswith(".bin")], names
    assert checkpoint.BIN_INDEX not in names
    index = json.loads((dest / checkpoint.SAFETENSORS_INDEX).read_text())
    assert sorted(set(index["weight_map"].values())) == ST_SHARDS
    requests = hub_staged.requests
    assert f"GET /api/models/{REPO}/revision/{COMMIT}?blobs=True" in requests, requests
    assert [r for r in requests if r.startswith("GET ") and r.endswith(BIN_SHARDS[0])], requests


def test_hub_staged_directory_passes_its_manifest_and_names_repo_at_commit(hub_staged):
    dest = hub_staged.dest
    assert manifest.check_manifest(dest) == []
    assert (dest / weights.REVISION_FILE).read_text() == f"{REPO}@{COMMIT}\n"
    assert not hub_staged.work.exists(), "the work directory was left behind"
    assert sorted(p.name for p in dest.parent.iterdir()) == [DEST_NAME]
    assert not [p for p in dest.rglob(".*")], "huggingface_hub's bookkeeping was staged"


def test_source_json_lists_every_published_file_with_its_sha256(hub_staged, published_src):
    source = json.loads((hub_staged.dest / weights.SOURCE_FILE).read_text())
    assert source["repo"] == REPO and source["revision"] == COMMIT
    assert source["source"] == "hub"
    assert set(source["published"]) == _plain_files(published_src)
    for name, entry in source["published"].items():
        assert entry["sha256"] == manifest.file_sha256(published_src / name), name
        assert entry["size"] == (published_src / name).stat().st_size, name
    assert source["converted"] == {"from": checkpoint.BIN_INDEX, "to": [*ST_SHARDS, checkpoint.SAFETENSORS_INDEX]}


def test_config_tokenizer_and_code_files_are_staged_as_published(hub_staged, published_src):
    dest = hub_staged.dest
    kept = sorted(n for n in _plain_files(published_src) if not n.endswith(".bin") and n != checkpoint.BIN_INDEX)
    for must in ("config.json", "tokenizer.model", "tokenizer_config.json", "tokenization_chatglm.py"):
        assert must in kept
    assert [n for n in kept if n.endswith(".py")], kept
    for name in kept:
        assert (dest / name).read_bytes() == (published_src / name).read_bytes(), name


def test_converted_safetensors_hold_the_published_bin_tensors(hub_staged, published_src):
    import torch
    from safetensors.torch import load_file

    dest = hub_staged.dest
    for bin_name, st_name in zip(BIN_SHARDS, ST_SHARDS, strict=True):
        published = torch.load(str(published_src / bin_name), map_location="cpu", weights_only=True)
        converted = load_file(str(dest / st_name))
        assert sorted(converted) == sorted(published), st_name
        for name, tensor in published.items():
            assert converted[name].dtype == tensor.dtype and torch.equal(converted[name], tensor), name


def test_safetensors_revision_is_staged_from_the_hub_unchanged(later_src, tmp_path, capsys):
    dest, work = tmp_path / "models" / DEST_NAME, tmp_path / "staging"
    with standin.serve(standin.Revision(later_src, REPO, COMMIT)) as endpoint:
        rc = weights.main(["--revision", COMMIT, "--dest", str(dest), "--endpoint", endpoint, "--work", str(work)])
    assert rc == 0
    assert "converting" not in capsys.readouterr().out
    published = _plain_files(later_src)
    assert _plain_files(dest) == published | {weights.REVISION_FILE, weights.SOURCE_FILE, manifest.MANIFEST}
    for name in published:
        assert (dest / name).read_bytes() == (later_src / name).read_bytes(), name
    assert manifest.check_manifest(dest) == []
    source = json.loads((dest / weights.SOURCE_FILE).read_text())
    assert "converted" not in source
    assert {n: e["sha256"] for n, e in source["published"].items()} == {
        n: manifest.file_sha256(later_src / n) for n in published
    }
    assert not work.exists()


# --------------------------------------------------------------------------------- `make weights`


def _make(tmp_path: Path, *assignments: str, endpoint: str | None = None) -> subprocess.CompletedProcess[str]:
    """`make weights` from the checkout, everything it writes under tmp_path.

    `-o` keeps make from rebuilding the reference environment this test runs in (its stamps
    only; the recipe is the one `make weights` runs). Variables `make weights` reads from the
    environment are cleared so that only this call's assignments count.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "HF_ENDPOINT", "HF_HUB_OFFLINE"}
        and k not in {"FROM", "MIRROR", "INCLUDE", "MODEL_DIR", "REVISION", "ARTIFACTS"}
    }
    env |= {
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        "HF_HUB_CACHE": str(tmp_path / "hf-cache"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    refenv = ".venv/tokenizer-ref"
    pth = f"{refenv}/lib/python3.11/site-packages/glmdeploy-checkout-service-module_utils.pth"
    keep = ["-o", f"{refenv}/.stamp", "-o", pth]
    return subprocess.run(
        ["make", "--no-print-directory", *keep, "weights", *assignments, f"ARTIFACTS={tmp_path / 'artifacts'}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.fixture
def checkout_models_unchanged():
    """Nothing named for this test's model is added to the checkout's artifacts/models or staging.

    Only entries named for DEST_NAME are watched: make test runs these tests beside the test
    hosts' chain, which stages the rehearsal model into the same checkout at the same time.
    """
    models, staging = ROOT / "artifacts" / "models", ROOT / "artifacts" / "staging"

    def ours() -> set[str]:
        return {
            f"{d.name}/{p.name}"
            for d in (models, staging)
            if d.is_dir()
            for p in d.iterdir()
            if p.name.lstrip(".").startswith(DEST_NAME)
        }

    before = ours()
    yield
    added = ours() - before
    assert not added, f"make weights wrote into the checkout's artifacts/: {sorted(added)}"


def test_make_weights_stages_from_the_hub_named_by_hf_endpoint(published_src, tmp_path, checkout_models_unchanged):
    dest = tmp_path / "models" / DEST_NAME
    revision = standin.Revision(published_src, REPO, COMMIT)
    with standin.serve(revision) as endpoint:
        done = _make(tmp_path, f"REVISION={COMMIT}", f"MODEL_DIR={dest}", endpoint=endpoint)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "--endpoint" not in done.stdout and f"from {endpoint}:" in done.stdout
    assert f"GET /api/models/{REPO}/revision/{COMMIT}?blobs=True" in revision.requests
    assert manifest.check_manifest(dest) == []
    assert set(ST_SHARDS) <= {p.name for p in dest.iterdir()}
    assert not [p for p in dest.iterdir() if p.name.endswith(".bin")]
    assert (dest / weights.REVISION_FILE).read_text() == f"{REPO}@{COMMIT}\n"
    assert json.loads((dest / weights.SOURCE_FILE).read_text())["source"] == "hub"
    assert not (tmp_path / "artifacts" / "staging").exists()


def test_make_weights_stages_a_plain_copy_given_as_from(published_src, tmp_path, checkout_models_unchanged):
    dest = tmp_path / "models" / DEST_NAME
    done = _make(tmp_path, f"FROM={published_src}", f"REVISION={COMMIT}", f"MODEL_DIR={dest}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert manifest.check_manifest(dest) == []
    assert set(ST_SHARDS) <= {p.name for p in dest.iterdir()}
    assert not [p for p in dest.iterdir() if p.name.endswith(".bin")]
    assert (dest / weights.REVISION_FILE).read_text() == f"{REPO}@{COMMIT}\n"
    source = json.loads((dest / weights.SOURCE_FILE).read_text())
    assert source["source"] == "directory"
    assert set(source["published"]) == _plain_files(published_src)
    assert not (tmp_path / "artifacts" / "staging").exists()


# ------------------------------------------------------------------------------------ refusals

SHARD = BIN_SHARDS[2]
FAKE_TENSOR = "transformer.encoder.layers.0.self_attention.not_in_any_shard.weight"


def _copy(src: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy" / DEST_NAME
    shutil.copytree(src, out)
    return out


@contextlib.contextmanager
def _hub(root: Path, faults: dict[str, str] | None = None, revision_cls=None) -> Iterator[list[str]]:
    revision = (revision_cls or standin.Revision)(root, REPO, COMMIT, faults)
    with standin.serve(revision) as endpoint:
        yield ["--endpoint", endpoint]


class _ListedOneByteLonger(standin.Revision):
    """A hub whose listing gives the shard one byte more than the file it serves."""

    def sibling(self, name):
        entry = super().sibling(name)
        if name == SHARD:
            entry["size"] += 1
        return entry


def _as_given(src, tmp):
    return contextlib.nullcontext(["--from", str(src)])


def _missing_shard(src, tmp):
    copy = _copy(src, tmp)
    (copy / BIN_SHARDS[3]).unlink()
    return contextlib.nullcontext(["--from", str(copy)])


def _index_names_a_tensor_no_shard_holds(src, tmp):
    copy = _copy(src, tmp)
    index = json.loads((copy / checkpoint.BIN_INDEX).read_text())
    index["weight_map"][FAKE_TENSOR] = BIN_SHARDS[0]
    (copy / checkpoint.BIN_INDEX).write_text(json.dumps(index, indent=2))
    return contextlib.nullcontext(["--from", str(copy)])


def _manifest_without_revision(src, tmp):
    copy = _copy(src, tmp)
    manifest.write_manifest(copy)
    return contextlib.nullcontext(["--from", str(copy)])


#: case -> (revision asked for, the source (a context yielding its arguments), phrases the message must hold)
REFUSALS: dict[str, tuple[str, Callable[[Path, Path], contextlib.AbstractContextManager[list[str]]], list[str]]] = {
    "plain_copy_missing_a_shard_the_index_names": (
        COMMIT,
        _missing_shard,
        [checkpoint.BIN_INDEX, BIN_SHARDS[3], "missing", "fix: stage the whole revision again"],
    ),
    "hub_shard_cut_short": (
        COMMIT,
        lambda src, tmp: _hub(src, {SHARD: "truncate"}),
        [SHARD, "the download was cut short", "fix: run make weights again"],
    ),
    "hub_shard_of_another_size_than_listed": (
        COMMIT,
        lambda src, tmp: _hub(src, revision_cls=_ListedOneByteLonger),
        [SHARD, "the hub lists", "cut short", "fix: run make weights again"],
    ),
    "hub_shard_bytes_differ_from_the_listed_sha256": (
        COMMIT,
        lambda src, tmp: _hub(src, {SHARD: "corrupt"}),
        [SHARD, "SHA256 differs from the hub's listing", "fix: run make weights again"],
    ),
    "hub_lists_a_shard_it_does_not_serve": (
        COMMIT,
        lambda src, tmp: _hub(src, {SHARD: "missing"}),
        [SHARD, "answers 404", "fix:"],
    ),
    "index_names_a_tensor_no_shard_holds": (
        COMMIT,
        _index_names_a_tensor_no_shard_holds,
        [checkpoint.BIN_INDEX, FAKE_TENSOR, BIN_SHARDS[0], "none of the 7 shards holds it", "fix: take"],
    ),
    "branch_name_as_revision": ("main", _as_given, ["'main' is not a commit", "pin the 40-hex"]),
    "short_hex_as_revision": (COMMIT[:7], _as_given, ["is not a commit", "pin the 40-hex"]),
    "41_hex_as_revision": (COMMIT + "0", _as_given, ["is not a commit", "pin the 40-hex"]),
    "40_non_hex_as_revision": ("g" * 40, _as_given, ["is not a commit", "pin the 40-hex"]),
    "revision_unknown_at_the_hub": (
        "d" * 40,
        lambda src, tmp: _hub(src),
        [f"{REPO} has no commit {'d' * 40}", "fix: pin a commit"],
    ),
    "plain_copy_with_manifest_but_no_revision": (
        COMMIT,
        _manifest_without_revision,
        [
            manifest.MANIFEST,
            f"but no {weights.REVISION_FILE}",
            f"fix: use the whole staged directory, or remove {manifest.MANIFEST}",
        ],
    ),
}


@pytest.mark.parametrize("prior", ["absent", "staged"])
@pytest.mark.parametrize("case", list(REFUSALS))
def test_bad_input_is_refused_naming_the_file_and_the_fix_and_changes_nothing(
    case, prior, published_src, hub_staged, messages, tmp_path, capsys
):
    revision, source, phrases = REFUSALS[case]
    models, work = tmp_path / "models", tmp_path / "staging"
    dest = models / DEST_NAME
    if prior == "staged":  # a previously staged copy: left byte for byte as it was
        shutil.copytree(hub_staged.dest, dest)
    before = _tree(models) if models.exists() else None
    with source(published_src, tmp_path) as source_args:
        argv = ["--revision", revision, "--dest", str(dest), "--work", str(work), *source_args]
        assert weights.main(argv) == 1
    err = capsys.readouterr().err
    message = err.removeprefix("error: ").split(f"\nnothing was changed in {dest}")[0]
    messages.setdefault(case, message)
    assert err.startswith("error: ") and f"nothing was changed in {dest}" in err, err
    for phrase in phrases:
        assert phrase in message, f"{phrase!r} not in {message!r}"
    assert (_tree(models) if models.exists() else None) == before, "the models directory changed"
    # A hub download that stopped keeps what it received and checked, for the next run (weights.kept_dir).
    kept = weights.kept_dir(work, REPO, revision)
    left = set(work.rglob("*")) if work.exists() else set()
    assert not left - {kept.parent, kept, *kept.rglob("*")}, "staging leftovers"
    assert not (kept / SHARD).exists(), "the refused file was kept"
    expected = {"models"} if prior == "staged" else set()
    expected |= {"copy"} if (tmp_path / "copy").exists() else set()
    expected |= {"staging"} if kept.exists() else set()
    assert {p.name for p in tmp_path.iterdir()} == expected, "something was created beside the models directory"


def test_non_hex_revision_is_refused_before_the_hub_is_asked(published_src, tmp_path, capsys):
    revision = standin.Revision(published_src, REPO, COMMIT)
    with standin.serve(revision) as endpoint:
        argv = ["--revision", "main", "--dest", str(tmp_path / "m"), "--endpoint", endpoint]
        assert weights.main(argv) == 1
    assert revision.requests == []
    assert "not a commit" in capsys.readouterr().err


# ---------------------------------------------------------------------- staged copies and mirrors


def test_branch_name_is_refused_as_a_revision(tmp_path, capsys):
    assert weights.main(["--revision", "main", "--dest", str(tmp_path / "m"), "--from", str(tmp_path)]) == 1
    assert "not a commit" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_mirror_copy_is_staged_with_its_manifest_and_revision(tmp_path, mirror):
    _, url = mirror
    dest = tmp_path / "models" / "chatglm3-6b-32k"
    assert weights.main(["--revision", COMMIT, "--dest", str(dest), "--mirror", url]) == 0
    assert manifest.check_manifest(dest) == []
    assert (dest / weights.REVISION_FILE).read_text().strip().endswith("@" + COMMIT)
    assert not list(dest.parent.glob(".*partial*")), "the side directory was left behind"


def test_damaged_mirror_file_is_named_and_the_staged_copy_is_untouched(tmp_path, mirror, capsys):
    served, url = mirror
    dest = _staged(tmp_path / "models" / "chatglm3-6b-32k")
    before = (dest / "model-00001-of-00001.safetensors").read_bytes()
    (served / "model-00001-of-00001.safetensors").write_bytes(b"\x02" * 4096)
    assert weights.main(["--revision", COMMIT, "--dest", str(dest), "--mirror", url]) == 1
    err = capsys.readouterr().err
    assert "model-00001-of-00001.safetensors" in err and "damaged" in err
    assert (dest / "model-00001-of-00001.safetensors").read_bytes() == before
    assert not (dest.parent / "chatglm3-6b-32k.previous").exists()


def test_source_of_another_revision_is_refused(tmp_path, capsys):
    src = _staged(tmp_path / "elsewhere", revision="f" * 40)
    assert weights.main(["--revision", COMMIT, "--dest", str(tmp_path / "m"), "--from", str(src)]) == 1
    assert f"@{'f' * 40}, not {COMMIT}" in capsys.readouterr().err


def test_restaging_keeps_the_previous_copy_beside_the_new_one(tmp_path):
    src = _staged(tmp_path / "elsewhere")
    dest = tmp_path / "models" / "m"
    shutil.copytree(src, dest)
    assert weights.main(["--revision", COMMIT, "--dest", str(dest), "--from", str(src)]) == 0
    assert (tmp_path / "models" / "m.previous" / manifest.MANIFEST).is_file()
    assert manifest.check_manifest(dest) == []


def test_the_same_revision_from_two_hub_addresses_is_the_same_model(published_src, tmp_path, checkout_models_unchanged):
    """A second control node (or a lab mirror) fetching the same revision from another address gets a
    byte-identical manifest: the model's identity, and so the nodes' releases, do not change with it."""
    manifests = []
    for n in (1, 2):
        dest = tmp_path / f"models-{n}" / DEST_NAME
        with standin.serve(standin.Revision(published_src, REPO, COMMIT)) as endpoint:
            done = _make(tmp_path, f"REVISION={COMMIT}", f"MODEL_DIR={dest}", endpoint=endpoint)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        manifests.append((dest / "SHA256SUMS").read_bytes())
    assert manifests[0] == manifests[1]
