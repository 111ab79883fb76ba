"""A hub download that stops is not started over: the next `make weights` fetches only the rest.

The hub is tests/hub/hub_standin.py on loopback; its `cut` fault closes the connection in the
middle of one file, once, as a link that drops does, and it counts the bytes it sends per
file. `make weights` runs as a process, as in test_weights_hub.py.
"""

from __future__ import annotations

import collections
import fcntl
import os
from pathlib import Path

import pytest
from huggingface_hub.constants import DOWNLOAD_CHUNK_SIZE
from test_weights_hub import COMMIT, DEST_NAME, REPO, _make_weights, _refusal, standin  # tests/unit/ is on sys.path

from glmdeploy import manifest
from glmdeploy_control import weights

LAST_SHARD = "pytorch_model-00007-of-00007.bin"
OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


@pytest.fixture(scope="module")
def published_src(tmp_path_factory) -> Path:
    from fixture_model import generate  # tests/support/, on sys.path through conftest.py

    path = tmp_path_factory.mktemp("published") / DEST_NAME
    generate(path, shape="published")
    return path


def _sizes(src: Path) -> dict[str, int]:
    """Every file of the revision and its size, in the order the kit fetches them (all are taken)."""
    return {n: (src / n).stat().st_size for n in sorted(standin.Revision(src, REPO, COMMIT).files)}


def _half_way(sizes: dict[str, int], name: str) -> int:
    """The byte of `name` at which half of the revision's bytes have been received."""
    before = sum(size for n, size in sizes.items() if n < name)
    assert before < sum(sizes.values()) // 2 < before + sizes[name]
    return sum(sizes.values()) // 2 - before


def _cut_run(src: Path, tmp_path: Path, revision: standin.Revision, commit: str = COMMIT) -> collections.Counter[str]:
    """A run cut mid-file: refused with the kit's message, the models directory untouched; the bytes it got."""
    with standin.serve(revision) as endpoint:
        done = _make_weights(endpoint, tmp_path, commit)
    message = _refusal(done)
    assert "the download was cut short" in message and message.endswith("fix: run make weights again"), message
    assert "==> kept " in done.stdout and "the next run fetches only the rest" in done.stdout, done.stdout
    assert not (tmp_path / "models").exists()
    return collections.Counter(revision.sent)


def _rerun(tmp_path: Path, revision: standin.Revision, commit: str = COMMIT) -> tuple[collections.Counter[str], str]:
    """The next run, through the same hub: staged; the bytes it transferred and its output."""
    before = collections.Counter(revision.sent)
    with standin.serve(revision) as endpoint:
        done = _make_weights(endpoint, tmp_path, commit)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    dest = tmp_path / "models" / DEST_NAME
    assert manifest.check_manifest(dest) == [] and (dest / weights.REVISION_FILE).read_text() == f"{REPO}@{commit}\n"
    return collections.Counter(revision.sent) - before, done.stdout


#: huggingface_hub writes a download in pieces of this size and drops the piece a cut interrupts.
PIECE = DOWNLOAD_CHUNK_SIZE

#: where the link is cut -> the byte of LAST_SHARD it stops at
CUTS = {
    "at_half_the_revision": lambda sizes: _half_way(sizes, LAST_SHARD),
    "12_mib_into_the_last_shard": lambda sizes: 12 * 2**20,
}


@pytest.mark.parametrize("cut", list(CUTS))
def test_a_download_cut_mid_shard_resumes_and_the_rerun_transfers_only_the_rest(cut, published_src, tmp_path):
    """The rerun sends the files never received and the rest of the cut shard, and nothing received whole.

    The cut shard continues with a Range request at the last whole piece huggingface_hub
    wrote before the cut (PIECE); the kept directory is gone once the revision is staged.
    """
    sizes = _sizes(published_src)
    cut_at = CUTS[cut](sizes)
    revision = standin.Revision(published_src, REPO, COMMIT, {LAST_SHARD: "cut"}, cut_at=cut_at)
    first = _cut_run(published_src, tmp_path, revision)
    second, out = _rerun(tmp_path, revision)

    whole_before = [n for n in sizes if first[n] == sizes[n]]
    never = [n for n in sizes if n not in first]
    kept_part = cut_at // PIECE * PIECE
    assert first[LAST_SHARD] == cut_at and whole_before and never
    assert second == {LAST_SHARD: sizes[LAST_SHARD] - kept_part} | {n: sizes[n] for n in never}
    assert revision.gets[-len(never) - 1] == (LAST_SHARD, kept_part)
    assert f"kept {len(whole_before)} of {len(sizes)} files" in out and f"fetching {len(never) + 1}" in out
    assert ("continuing from 10.0 MiB" in out) == (kept_part > 0), out
    assert not (tmp_path / "staging").exists(), "the kept directory outlived the staging"
    total = sum(sizes.values())
    print(
        f"\n{cut}: the cut run got {sum(first.values())} of {total} bytes ({sum(first.values()) / total:.1%}); "
        f"the rerun transferred {sum(second.values())} ({sum(second.values()) / total:.1%}), "
        f"{cut_at - kept_part} of them received before the cut"
    )


def _flip_last_byte(path: Path) -> None:
    """The same size and mtime, one byte changed: only a hash tells it from the listed file."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_kept_files_that_no_longer_match_the_listing_are_fetched_again(published_src, tmp_path):
    """A kept LFS shard (SHA256 listed) and a kept config file (git blob id listed), altered: each sent whole again."""
    sizes = _sizes(published_src)
    revision = standin.Revision(published_src, REPO, COMMIT, {LAST_SHARD: "cut"})
    first = _cut_run(published_src, tmp_path, revision)
    kept = weights.kept_dir(tmp_path / "staging", REPO, COMMIT)
    altered = ["pytorch_model-00001-of-00007.bin", "config.json"]
    for name in altered:
        assert first[name] == sizes[name]
        _flip_last_byte(kept / name)
    (kept / "tokenizer_config.json").write_text("{}")  # not received before the cut: a stray copy, replaced

    second, out = _rerun(tmp_path, revision)
    for name in altered:
        assert second[name] == sizes[name], name
        assert f"{name}: the kept copy differs from the hub's listing" in out
    assert second["tokenizer_config.json"] == sizes["tokenizer_config.json"]
    assert "pytorch_model-00002-of-00007.bin" not in second
    staged = tmp_path / "models" / DEST_NAME
    assert (staged / "config.json").read_bytes() == (published_src / "config.json").read_bytes()


def test_a_cut_run_of_another_revision_is_not_reused(published_src, tmp_path):
    """The same files at another commit: nothing kept for the first commit is taken, and it stays as it was."""
    sizes = _sizes(published_src)
    _cut_run(published_src, tmp_path, standin.Revision(published_src, REPO, COMMIT, {LAST_SHARD: "cut"}))
    kept = weights.kept_dir(tmp_path / "staging", REPO, COMMIT)
    before = sorted(p.relative_to(kept) for p in kept.rglob("*"))

    other = standin.Revision(published_src, REPO, OTHER_COMMIT)
    sent, out = _rerun(tmp_path, other, OTHER_COMMIT)
    assert dict(sent) == sizes and "kept " not in out
    assert sorted(p.relative_to(kept) for p in kept.rglob("*")) == before
    assert not weights.kept_dir(tmp_path / "staging", REPO, OTHER_COMMIT).exists()


def test_a_second_run_of_a_revision_being_fetched_is_refused_and_leaves_its_files(tmp_path, capsys):
    """While a run holds the kept directory's lock, another is refused before it asks the hub or touches the files."""
    kept = weights.kept_dir(tmp_path / "staging", REPO, COMMIT)
    kept.mkdir(parents=True)
    (kept / "config.json").write_text("{}")  # what the first run has received so far
    argv = ["--revision", COMMIT, "--dest", str(tmp_path / "models" / DEST_NAME), "--work", str(tmp_path / "staging")]
    with kept.with_name(kept.name + ".lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert weights.main([*argv, "--endpoint", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert f"another make weights is fetching this revision into {kept}; fix: wait for it to end" in err, err
    assert [p.name for p in kept.iterdir()] == ["config.json"] and not (tmp_path / "models").exists()
