"""The release logic (module_utils/glmdeploy_release.py, run on the node by the glmdeploy_release
module): atomic switch, rollback target, marks and pruning of releases and stores."""

from __future__ import annotations

import json
import os
import time

import glmdeploy_release as release  # module_utils/, on sys.path through conftest.py
import pytest

from glmdeploy_control.releases import table


def _release(root, rid, env="cpu-py311-aaa", model="fixture-111", kit="k1", state=None, age=0, legacy=False):
    """A release as roles/release builds it; ``legacy``: as releases made before the kit was a wheel
    (venv -> the lock's environment, app -> kits/<digest> holding the package's files)."""
    kit_dir = f"{kit}/glmdeploy" if legacy else f"{kit}/venv"
    for store, name in (("envs", f"{env}/venv"), ("models", model), ("kits", kit_dir)):
        (root / store / name).mkdir(parents=True, exist_ok=True)
    path = root / "releases" / rid
    path.mkdir(parents=True)
    links = (
        {"venv": f"../../envs/{env}/venv", "app": f"../../kits/{kit}"}
        if legacy
        else {
            "venv": f"../../kits/{kit}/venv",
            "env": f"../../envs/{env}/venv",
        }
    )
    links["model"] = f"../../models/{model}"
    for name, target in links.items():
        os.symlink(target, path / name)
    (path / "release.json").write_text(json.dumps({"env": env, "model": model, "kit": kit}))
    stamp = time.time() - 1000 + age
    os.utime(path / "release.json", (stamp, stamp))
    if state:
        (path / state).write_text("2026-12-01T00:00:00Z\n")
    return path


def test_switch_moves_current_and_keeps_the_old_one_as_previous(tmp_path):
    _release(tmp_path, "r1")
    _release(tmp_path, "r2", model="fixture-222")
    assert release.switch(tmp_path, "r1")["changed"] is True
    result = release.switch(tmp_path, "r2")
    assert result == {"changed": True, "from": "r1", "to": "r2", "previous": "r1", "previous_before": None}
    assert os.readlink(tmp_path / "current") == "releases/r2"
    assert (tmp_path / "current" / "model").resolve() == (tmp_path / "models" / "fixture-222").resolve()
    assert release.switch(tmp_path, "r2")["changed"] is False, "switching to the current release changed something"


def test_rollback_to_previous_twice_returns_to_the_start(tmp_path):
    _release(tmp_path, "r1")
    _release(tmp_path, "r2")
    release.switch(tmp_path, "r1")
    release.switch(tmp_path, "r2")
    assert release.switch(tmp_path, "previous")["to"] == "r1"
    assert release.link_target(tmp_path / "previous") == "r2"
    assert release.switch(tmp_path, "previous")["to"] == "r2"


def test_revert_after_a_failed_release_restores_both_links(tmp_path):
    for rid in ("r1", "r2", "r3"):
        _release(tmp_path, rid)
    release.switch(tmp_path, "r1")
    release.switch(tmp_path, "r2")  # previous = r1
    release.switch(tmp_path, "r3")  # the new release fails its health gate ...
    release.switch(tmp_path, "r2", previous="r1")  # ... and the node goes back as it was
    assert (release.link_target(tmp_path / "current"), release.link_target(tmp_path / "previous")) == ("r2", "r1")


def test_revert_on_a_node_that_had_one_release_leaves_no_previous(tmp_path):
    _release(tmp_path, "r1")
    _release(tmp_path, "r2")
    release.switch(tmp_path, "r1")
    release.switch(tmp_path, "r2")
    release.switch(tmp_path, "r1", previous="none")
    assert release.link_target(tmp_path / "current") == "r1" and not (tmp_path / "previous").is_symlink()


def test_switch_to_an_unknown_or_half_built_release_is_refused_and_changes_nothing(tmp_path):
    _release(tmp_path, "r1")
    release.switch(tmp_path, "r1")
    (tmp_path / "releases" / ".r9.new").mkdir()
    with pytest.raises(release.ReleaseError, match="no release 'r9'"):
        release.switch(tmp_path, "r9")
    with pytest.raises(release.ReleaseError, match="no previous release"):
        release.switch(tmp_path, "previous")
    assert os.readlink(tmp_path / "current") == "releases/r1"


def test_link_swap_leaves_no_moment_without_a_current_link(tmp_path, monkeypatch):
    _release(tmp_path, "r1")
    _release(tmp_path, "r2")
    release.switch(tmp_path, "r1")
    seen = []
    real_replace = os.replace

    def watching_replace(src, dst):
        if os.path.basename(dst) == "current":
            seen.append(os.path.islink(dst))
        real_replace(src, dst)

    monkeypatch.setattr(release.os, "replace", watching_replace)
    release.switch(tmp_path, "r2")
    assert seen and all(seen), "the current link was removed before the new one took its place"


def test_marks_are_exclusive_and_report_change_once(tmp_path):
    _release(tmp_path, "r1")
    assert release.mark(tmp_path, "r1", "failed") is True
    assert release.mark(tmp_path, "r1", "promoted") is True
    assert release.mark(tmp_path, "r1", "promoted") is False
    assert [r["state"] for r in release.status(tmp_path)["releases"]] == ["promoted"]


def test_prune_keeps_current_previous_and_newest_promoted_and_their_stores(tmp_path):
    _release(tmp_path, "r1", env="e1", model="m1", kit="k1", state="promoted", age=1)
    _release(tmp_path, "r2", env="e2", model="m2", kit="k2", state="promoted", age=2)
    _release(tmp_path, "r3", env="e2", model="m3", kit="k2", state="failed", age=3)
    _release(tmp_path, "r4", env="e3", model="m3", kit="k3", state="promoted", age=4)
    _release(tmp_path, "r5", env="e3", model="m3", kit="k3", state="promoted", age=5)
    release.switch(tmp_path, "r1")
    release.switch(tmp_path, "r5")  # previous = r1, though it is the oldest
    removed = release.prune(tmp_path, keep=2)
    left = sorted(p.name for p in (tmp_path / "releases").iterdir())
    assert left == ["r1", "r4", "r5"]
    assert sorted(removed) == ["envs/e2", "kits/k2", "models/m2", "releases/r2", "releases/r3"]
    assert (tmp_path / "current" / "venv").resolve().is_dir() and (tmp_path / "previous" / "model").resolve().is_dir()
    assert release.prune(tmp_path, keep=2) == [], "a second prune removed something"


def test_prune_keeps_the_stores_of_releases_made_before_the_kit_was_a_wheel(tmp_path):
    _release(tmp_path, "old", env="e1", model="m1", kit="k1", state="promoted", age=1, legacy=True)
    _release(tmp_path, "new", env="e1", model="m1", kit="w2-e1", state="promoted", age=2)
    _release(tmp_path, "gone", env="e9", model="m9", kit="w9-e9", state="failed", age=3)
    release.switch(tmp_path, "old")
    release.switch(tmp_path, "new")
    removed = release.prune(tmp_path, keep=1)
    assert sorted(removed) == ["envs/e9", "kits/w9-e9", "models/m9", "releases/gone"]
    assert (tmp_path / "previous" / "app" / "glmdeploy").is_dir(), "the old release lost its kit"
    assert (tmp_path / "current" / "venv").resolve() == (tmp_path / "kits" / "w2-e1" / "venv").resolve()


def test_prune_refuses_to_keep_no_release(tmp_path):
    _release(tmp_path, "r1", state="promoted")
    with pytest.raises(release.ReleaseError, match="must be 1 or more"):
        release.prune(tmp_path, keep=0)
    assert (tmp_path / "releases" / "r1").is_dir()


def test_switch_to_an_unknown_release_names_it(tmp_path):
    with pytest.raises(release.ReleaseError, match="no release 'nope'"):
        release.switch(tmp_path, "nope")


def test_table_names_each_node_current_and_previous(tmp_path):
    text = table(
        {
            "node2": {"current": "r2", "previous": "r1", "releases": [{"id": "r1", "state": "promoted"}]},
            "node1": {"current": "r1", "previous": None, "releases": []},
        }
    )
    lines = text.splitlines()
    assert lines[1].split()[:3] == ["node1", "r1", "-"] and lines[2].split()[:3] == ["node2", "r2", "r1"]


def _tree(root):
    """Every path under root with its link target or file content: what a dry run must not change."""
    return {
        str(p.relative_to(root)): os.readlink(p) if p.is_symlink() else (p.read_text() if p.is_file() else "dir")
        for p in sorted(root.rglob("*"))
    }


def test_dry_runs_answer_as_the_real_call_and_change_nothing(tmp_path):
    _release(tmp_path, "r1", env="e1", model="m1", kit="k1", state="promoted", age=1)
    _release(tmp_path, "r2", env="e2", model="m2", kit="k2", state="promoted", age=2)
    _release(tmp_path, "r3", env="e3", model="m2", kit="k2", age=3)
    release.switch(tmp_path, "r1")
    release.switch(tmp_path, "r2")
    calls = (
        lambda dry: release.switch(tmp_path, "r3", dry_run=dry),
        lambda dry: release.mark(tmp_path, "r3", "promoted", dry_run=dry),
        lambda dry: release.prune(tmp_path, keep=1, dry_run=dry),
        lambda dry: release.switch(tmp_path, "previous", dry_run=dry),
    )
    answers = []
    for call in calls:
        before = _tree(tmp_path)
        planned = call(True)
        assert _tree(tmp_path) == before, f"a dry run changed the node: {planned}"
        assert planned == call(False), "the dry run's answer differs from the real call's"
        answers.append(planned)
    assert answers[0]["changed"] and answers[1] is True and answers[3]["to"] == "r2"
    assert answers[2] == ["releases/r1", "envs/e1", "models/m1", "kits/k1"]
