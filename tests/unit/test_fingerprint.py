"""glmdeploy.serving.fingerprint: unit files compare as templates across nodes with their own addresses."""

from __future__ import annotations

from glmdeploy.serving import fingerprint

UNIT = "ExecStart=/opt/glmdeploy/current/venv/bin/python -m vllm --host {ip} --port 8000\n"


def _unit(tmp_path, host, ip):
    path = tmp_path / host / "glmdeploy-vllm_server.service"
    path.parent.mkdir()
    path.write_text(UNIT.format(ip=ip))
    return path


def test_units_that_differ_only_in_the_node_address_have_one_digest(tmp_path):
    one = fingerprint.units_digest([_unit(tmp_path, "h1", "10.77.0.11")], {"10.77.0.11"})
    two = fingerprint.units_digest([_unit(tmp_path, "h2", "10.77.0.12")], {"10.77.0.12"})
    assert one == two


def test_a_unit_changed_beyond_the_address_still_differs(tmp_path):
    one = fingerprint.units_digest([_unit(tmp_path, "h1", "10.77.0.11")], {"10.77.0.11"})
    other = _unit(tmp_path, "h2", "10.77.0.12")
    other.write_text(other.read_text().replace("8000", "8001"))
    assert fingerprint.units_digest([other], {"10.77.0.12"}) != one


def test_the_lock_is_read_from_the_releases_environment_not_the_kits_venv(tmp_path):
    (tmp_path / "envs" / "e1" / "venv").mkdir(parents=True)
    (tmp_path / "kits" / "w-e1" / "venv").mkdir(parents=True)
    new, old = tmp_path / "releases" / "new", tmp_path / "releases" / "old"
    new.mkdir(parents=True)
    old.mkdir()
    (new / "venv").symlink_to("../../kits/w-e1/venv")
    (new / "env").symlink_to("../../envs/e1/venv")
    (old / "venv").symlink_to("../../envs/e1/venv")  # a release made before the kit was a wheel
    for release in (new, old):
        assert fingerprint._environment(release).resolve() == (tmp_path / "envs" / "e1" / "venv").resolve()


def test_a_node_that_is_also_the_balancer_has_the_units_row_of_the_other_nodes(tmp_path):
    for root, names in ((tmp_path / "lb", ["chat_ui", "lb-health", "lb-keys"]), (tmp_path / "node", ["chat_ui"])):
        units = root / "etc/systemd/system"
        units.mkdir(parents=True)
        for name in names:
            (units / f"glmdeploy-{name}.service").write_text(f"[Service]\nExecStart=/bin/{name.split('-')[0]}\n")
    lb, node = fingerprint.node_units(tmp_path / "lb"), fingerprint.node_units(tmp_path / "node")
    assert [p.name for p in lb] == ["glmdeploy-chat_ui.service"]
    assert fingerprint.units_digest(lb, set()) == fingerprint.units_digest(node, set())
