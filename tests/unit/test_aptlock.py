"""The apt lock and the kit's repository, against a real signed archive on disk.

The archive is made here with Debian's own tools (dpkg-deb, apt-ftparchive, gpg) in the
layout of a Debian mirror (dists/<suite>/Release signed into InRelease, pool/): apt reads it
through a file: URI exactly as it reads a mirror over HTTP. No network is used.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import tomllib

from glmdeploy.manifest import file_sha256
from glmdeploy_control import aptlock, registry

pytestmark = pytest.mark.skipif(
    not shutil.which("apt-ftparchive") or not shutil.which("gpg"),
    reason="needs apt-ftparchive and gpg: apt install apt-utils gnupg (make test-packages)",
)
ROOT = Path(__file__).resolve().parents[2]
SUITE = "testrel"


def _deb(pool: Path, name: str, version: str, depends: str = "") -> None:
    tree = pool / f"{name}-{version}"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "usr/share/doc" / name).mkdir(parents=True)
    (tree / "usr/share/doc" / name / "README").write_text(f"{name} {version}\n")
    control = f"Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: t <t@example.invalid>\n"
    control += f"Depends: {depends}\n" if depends else ""
    (tree / "DEBIAN/control").write_text(control + f"Description: {name} for the apt lock tests\n")
    subprocess.run(["dpkg-deb", "-Zgzip", "--build", str(tree), str(pool / f"{name}_{version}_all.deb")], check=True,
                   capture_output=True)  # fmt: skip
    shutil.rmtree(tree)


class Archive:
    """A signed Debian archive of one suite, main only, arch all packages (apt lists them for amd64)."""

    def __init__(self, root: Path, suites: tuple[str, ...] = (SUITE,)) -> None:
        self.root = root
        self.suites = suites
        self.pool = root / "pool" / "main"
        self.pool.mkdir(parents=True)
        self.gnupg = root.parent / "archive-gnupg"
        self.gnupg.mkdir(mode=0o700)
        self.keyring = root.parent / "archive-key.gpg"
        self._gpg("--quick-gen-key", "test archive", "ed25519", "sign", "never")
        self.keyring.write_bytes(
            subprocess.run(["gpg", "--homedir", str(self.gnupg), "--export"], check=True, capture_output=True).stdout
        )

    def _gpg(self, *args: str) -> None:
        subprocess.run(["gpg", "--homedir", str(self.gnupg), "--batch", "--quiet", "--pinentry-mode", "loopback",
                        "--passphrase", "", *args], check=True, capture_output=True)  # fmt: skip

    def add(self, name: str, version: str, depends: str = "", suite: str = "") -> None:
        """Into the release suite's pool, or into the pool of another suite (its updates)."""
        pool = self.root / "pool" / suite if suite else self.pool
        pool.mkdir(parents=True, exist_ok=True)
        _deb(pool, name, version, depends)

    def remove(self, name: str, version: str) -> None:
        (self.pool / f"{name}_{version}_all.deb").unlink()

    def index(self) -> None:
        for suite in self.suites:
            pool = "pool/main" if suite == self.suites[0] else f"pool/{suite}"
            binary = self.root / "dists" / suite / "main" / "binary-amd64"
            binary.mkdir(parents=True, exist_ok=True)
            (self.root / pool).mkdir(parents=True, exist_ok=True)
            packages = subprocess.run(["apt-ftparchive", "packages", pool], cwd=self.root, check=True,
                                      capture_output=True, text=True).stdout  # fmt: skip
            (binary / "Packages").write_text(packages)
            dist = self.root / "dists" / suite
            release = subprocess.run(
                ["apt-ftparchive", "-o", f"APT::FTPArchive::Release::Suite={suite}", "-o",
                 "APT::FTPArchive::Release::Components=main", "-o", "APT::FTPArchive::Release::Architectures=amd64",
                 "release", "."], cwd=dist, check=True, capture_output=True, text=True,
            ).stdout  # fmt: skip
            (dist / "Release").write_text(release)
            (dist / "InRelease").unlink(missing_ok=True)
            self._gpg("--clearsign", "--output", str(dist / "InRelease"), str(dist / "Release"))


@pytest.fixture
def archive(tmp_path: Path) -> Archive:
    arch = Archive(tmp_path / "archive")
    arch.add("libdep", "1.0")
    arch.add("kitpkg", "2.0", "libdep (>= 1.0)")
    arch.add("basepkg", "3.0")
    arch.index()
    return arch


def _registry(tmp_path: Path, archive: Archive, roles: dict[str, list[str]] | None = None) -> registry.Registry:
    """The kit's registry with one test release on the archive above, installers cut to its packages."""
    data: dict[str, Any] = tomllib.loads((ROOT / "constraints" / "profiles.toml").read_text())
    data["kit"]["packages"] = ["basepkg"]
    data["kit"]["image"]["host_packages"] = ["basepkg"]
    for profile in data["profile"].values():
        profile["packages"] = []
    data["kit"]["apt"] = {
        "lock_file": "apt/{release}.lock",
        "driver": {},
        "driver_libraries": {},
        "roles": roles if roles is not None else {"load_balancer": ["kitpkg"]},
        "releases": {
            "test-1": {
                "distribution": "Debian",
                "version": "1",
                "codename": SUITE,
                "suites": ["{codename}"],
                "components": ["main"],
                "kernel_headers_meta": "linux-headers-amd64",
                "gpu": False,
                "keyring": str(archive.keyring),
            }
        },
    }
    constraints = tmp_path / "constraints"
    constraints.mkdir(exist_ok=True)
    return registry.parse(data, constraints / "profiles.toml")


def _mirror(archive: Archive) -> str:
    return f"file:{archive.root}"


def test_lock_pins_apts_choice_with_the_signed_index_sha256_and_relocks_byte_identical(tmp_path, archive):
    reg = _registry(tmp_path, archive)
    path = aptlock.write_lock(reg, "test-1", _mirror(archive))
    lock = json.loads(path.read_text())
    assert sorted(lock["packages"]) == ["basepkg", "kitpkg", "libdep"], "the dependency is closed over"
    deb = archive.pool / "kitpkg_2.0_all.deb"
    assert lock["packages"]["kitpkg"]["version"] == "2.0"
    assert lock["packages"]["kitpkg"]["sha256"] == file_sha256(deb)
    assert lock["installs"]["load_balancer"] == ["kitpkg"]
    first = path.read_bytes()
    aptlock.write_lock(reg, "test-1", _mirror(archive))
    assert path.read_bytes() == first, "a re-lock of an unchanged input and mirror must give the same bytes"


def test_check_names_a_version_the_mirror_moved_past_and_fails_only_when_strict(tmp_path, archive, capsys):
    reg = _registry(tmp_path, archive)
    aptlock.write_lock(reg, "test-1", _mirror(archive))
    archive.add("libdep", "1.1")
    archive.index()
    assert aptlock.check(reg, ["test-1"], _mirror(archive), strict=False) == 0
    out = capsys.readouterr().out
    assert "libdep: locked 1.0, the mirror gives 1.1" in out
    assert aptlock.check(reg, ["test-1"], _mirror(archive), strict=True) == 1


def test_check_fails_when_the_registry_asks_for_a_package_the_lock_was_not_resolved_from(tmp_path, archive, capsys):
    aptlock.write_lock(_registry(tmp_path, archive), "test-1", _mirror(archive))
    grown = _registry(tmp_path, archive, roles={"load_balancer": ["kitpkg"], "node_firewall": ["basepkg"]})
    assert aptlock.check(grown, ["test-1"], _mirror(archive), strict=False) == 1
    out = capsys.readouterr().out
    assert "node_firewall: the registry asks for ['basepkg'], the lock has None" in out
    assert "fix: make lock" in out


def _apt_sim(repo: Path, key: Path, work: Path, *packages: str) -> str:
    """apt on a node with the kit's repository as its only source (as library/glmdeploy_apt.py sets it up)."""
    for sub in ("parts", "lists/partial", "cache/archives/partial"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    (work / "sources.list").write_text(f"deb [signed-by={key}] file:{repo} ./\n")
    opts = ["-o", f"Dir::Etc::SourceList={work / 'sources.list'}", "-o", f"Dir::Etc::SourceParts={work / 'parts'}",
            "-o", f"Dir::State::Lists={work / 'lists'}", "-o", f"Dir::Cache={work / 'cache'}",
            "-o", f"Dir::State::status={work / 'status'}", "-o", "Debug::NoLocking=1"]  # fmt: skip
    (work / "status").touch()
    update = subprocess.run(["apt-get", *opts, "update"], capture_output=True, text=True)
    assert update.returncode == 0 and "NO_PUBKEY" not in update.stderr, update.stderr
    sim = subprocess.run(["apt-get", *opts, "-s", "install", *packages], capture_output=True, text=True)
    assert sim.returncode == 0, sim.stderr
    return sim.stdout


def test_repo_is_signed_by_the_kits_key_and_apt_installs_the_locked_versions_from_it(tmp_path, archive):
    reg = _registry(tmp_path, archive)
    aptlock.write_lock(reg, "test-1", _mirror(archive))
    artifacts = tmp_path / "artifacts"
    repo = aptlock.build_repo(reg, "test-1", artifacts, tmp_path / "cache", _mirror(archive))
    assert repo.name == aptlock.repo_name(reg, "test-1")
    assert (repo / "InRelease").read_text().startswith("-----BEGIN PGP SIGNED MESSAGE-----")
    assert "PRIVATE" not in (artifacts / "apt" / "glmdeploy-apt.asc").read_text(), "only the public key is served"
    archive.add("kitpkg", "9.9", "libdep (>= 1.0)")  # the mirror moves on; the repository does not
    archive.index()
    sim = _apt_sim(repo, artifacts / "apt" / "glmdeploy-apt.asc", tmp_path / "node", "kitpkg")
    assert "Inst kitpkg (2.0 glmdeploy:test-1" in sim and "Inst libdep (1.0 glmdeploy:test-1" in sim, sim


def test_a_checkout_at_a_long_path_still_signs_its_repository(tmp_path, archive):
    """gpg's agent socket lives in its home, and a socket path is limited to 108 bytes: a second
    control node restored at a long path once failed to sign ("No agent running")."""
    reg = _registry(tmp_path, archive)
    aptlock.write_lock(reg, "test-1", _mirror(archive))
    artifacts = tmp_path / ("a-long-directory-name-" * 5) / "artifacts"
    assert len(str(artifacts / "secrets" / "apt" / "S.gpg-agent.browser")) > 108
    repo = aptlock.build_repo(reg, "test-1", artifacts, tmp_path / "cache", _mirror(archive))
    assert (repo / "InRelease").read_text().startswith("-----BEGIN PGP SIGNED MESSAGE-----")


def test_a_tampered_cached_deb_is_fetched_again_before_the_repository_is_built(tmp_path, archive):
    reg = _registry(tmp_path, archive)
    aptlock.write_lock(reg, "test-1", _mirror(archive))
    cache = tmp_path / "cache"
    packages = json.loads(aptlock.lock_path(reg, "test-1").read_text())["packages"]
    aptlock._fetch(reg, "test-1", packages, cache / "test-1", _mirror(archive))
    target = cache / "test-1" / "kitpkg_2.0_all.deb"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    # _fetch sees the bad hash and fetches it again: the repository is right, from a good copy
    repo = aptlock.build_repo(reg, "test-1", tmp_path / "artifacts", cache, _mirror(archive))
    assert file_sha256(repo / "kitpkg_2.0_all.deb") == file_sha256(archive.pool / "kitpkg_2.0_all.deb")


def test_a_locked_version_gone_from_the_mirror_names_it_and_the_fix(tmp_path, archive):
    reg = _registry(tmp_path, archive)
    aptlock.write_lock(reg, "test-1", _mirror(archive))
    archive.remove("libdep", "1.0")
    archive.add("libdep", "1.1")
    archive.index()
    with pytest.raises(aptlock.AptLockError) as err:
        aptlock.build_repo(reg, "test-1", tmp_path / "artifacts", tmp_path / "cache", _mirror(archive))
    assert "libdep 1.0 no longer on the mirror" in str(err.value) and "fix: make lock" in str(err.value)
    assert not [p for p in (tmp_path / "artifacts" / "apt").iterdir() if p.name.startswith("test-1")]


def test_an_ubuntu_release_resolves_its_suites_from_the_mirror_it_is_given(tmp_path):
    """The same code for an Ubuntu-shaped release: its suites (release, updates) from a mirror the
    command names, the updates suite's newer version locked. The archive is made here, not
    Ubuntu's own (this machine reaches no Ubuntu mirror): it proves the path, not Ubuntu's data."""
    arch = Archive(tmp_path / "ubuntu", suites=("jammy", "jammy-updates"))
    arch.add("libdep", "1.0")
    arch.add("kitpkg", "2.0", "libdep (>= 1.0)")
    arch.add("basepkg", "3.0")
    arch.add("kitpkg", "2.0ubuntu0.1", "libdep (>= 1.0)", suite="jammy-updates")
    arch.index()
    reg = _registry(tmp_path, arch)
    data = dataclasses.replace(
        reg.kit.apt.releases["test-1"], distribution="Ubuntu", version="22.04", codename="jammy",
        suites=["{codename}", "{codename}-updates"],
    )  # fmt: skip
    reg = dataclasses.replace(
        reg, kit=dataclasses.replace(reg.kit, apt=dataclasses.replace(reg.kit.apt, releases={"ubuntu-22.04": data}))
    )
    lock = json.loads(aptlock.write_lock(reg, "ubuntu-22.04", _mirror(arch)).read_text())
    assert lock["distribution"] == "Ubuntu" and lock["version"] == "22.04"
    assert lock["packages"]["kitpkg"]["version"] == "2.0ubuntu0.1"
    assert lock["packages"]["kitpkg"]["pool"] == "jammy-updates/kitpkg_2.0ubuntu0.1_all.deb"
    with pytest.raises(aptlock.AptLockError, match="APT_MIRROR"):
        aptlock.mirror_sources(data, None)  # this machine's apt sources carry no jammy
