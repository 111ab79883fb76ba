"""API keys: the control node's store (glmdeploy_control.keys) and the balancer's service (glmdeploy.balancer.lb_keys).

The service runs here on loopback as it runs on a balancer; nginx, which asks it, is what the
fleet test adds (tests/e2e/test_fleet.py: keys, revocation mid-stream, 429s through nginx).
"""

from __future__ import annotations

import json
import stat
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from glmdeploy.balancer import lb_keys
from glmdeploy_control import keys


def free_keys_service(tmp_path: Path, store: Path) -> tuple[lb_keys.Keys, str]:
    service = lb_keys.Keys(store, tmp_path / "used.json")
    server = lb_keys.serve(service, "127.0.0.1", 0)
    return service, f"http://127.0.0.1:{server.server_address[1]}"


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def add(store: Path, name: str, push: list[str] | None = None) -> str:
    return keys.add(store, name, push or [])


def test_the_control_tool_and_the_balancer_hash_keys_alike():
    assert keys.digest("glm-abc") == lb_keys.digest("glm-abc")


def test_a_new_key_is_shown_once_and_only_its_digest_is_stored_root_only(tmp_path):
    store = tmp_path / "secrets" / "api-keys.json"
    key = add(store, "alice")
    text = store.read_text()
    assert key.startswith(keys.PREFIX) and len(key) > 40
    assert key not in text and keys.digest(key) in text
    assert stat.S_IMODE(store.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.parent.stat().st_mode) == 0o700
    assert add(store, "bob") != key


@pytest.mark.parametrize("name", ["Alice", "a-b", "1x", "", "x" * 33, "deployment", "a b"])
def test_a_name_that_is_not_a_plain_identifier_is_refused_with_the_rule(tmp_path, name):
    with pytest.raises(keys.KeysError, match="fix:"):
        add(tmp_path / "store.json", name)
    assert not (tmp_path / "store.json").exists()


def test_a_second_key_of_one_name_is_refused(tmp_path):
    store = tmp_path / "store.json"
    add(store, "alice")
    before = store.read_text()
    with pytest.raises(keys.KeysError, match="exists"):
        add(store, "alice")
    assert store.read_text() == before


def test_a_failed_push_puts_the_store_back_and_shows_no_key(tmp_path, capsys):
    store = tmp_path / "store.json"
    add(store, "alice")
    before = store.read_text()
    rc = keys.main(["--store", str(store), "--add", "bob", "--", sys.executable, "-c", "raise SystemExit(4)"])
    out = capsys.readouterr()
    assert rc == 2 and "exit 4" in out.err and "store is back" in out.err
    assert store.read_text() == before
    assert keys.PREFIX not in out.out
    rc = keys.main(["--store", str(store), "--revoke", "alice", "--", sys.executable, "-c", "raise SystemExit(1)"])
    assert rc == 2 and store.read_text() == before


def test_add_runs_the_push_after_the_store_holds_the_key_then_shows_it(tmp_path, capsys):
    store = tmp_path / "store.json"
    probe = f"import json,sys; sys.exit(0 if 'carol' in json.load(open({str(store)!r}))['keys'] else 3)"
    assert keys.main(["--store", str(store), "--add", "carol", "--", sys.executable, "-c", probe]) == 0
    shown = capsys.readouterr().out.splitlines()[-1]
    assert keys.digest(shown) == json.loads(store.read_text())["keys"]["carol"]["sha256"]


def test_revoking_an_unknown_name_lists_the_known_ones(tmp_path):
    store = tmp_path / "store.json"
    add(store, "alice")
    with pytest.raises(keys.KeysError, match=r"no key named 'bob' \(keys: alice\)"):
        keys.revoke(store, "bob", [])


def test_the_service_names_a_known_key_and_refuses_others(tmp_path):
    store = tmp_path / "store.json"
    alice = add(store, "alice")
    _, url = free_keys_service(tmp_path, store)
    code, headers, _ = get(url + "/auth", {"Authorization": f"Bearer {alice}"})
    assert code == 204 and headers[lb_keys.KEY_HEADER] == "alice"
    for presented in ("", "Bearer ", f"Basic {alice}", f"Bearer {alice}x", alice):
        assert get(url + "/auth", {"Authorization": presented})[0] == 401, presented
    metrics = get(url + "/metrics")[2].decode()
    assert 'glmdeploy_lb_key_requests_total{key="alice"} 1.0' in metrics
    assert "glmdeploy_lb_key_refused_total 5.0" in metrics
    assert alice not in metrics and keys.digest(alice) not in metrics


def test_a_revoked_key_is_refused_from_the_next_request_and_the_others_still_work(tmp_path):
    store = tmp_path / "store.json"
    alice, bob = add(store, "alice"), add(store, "bob")
    _, url = free_keys_service(tmp_path, store)
    assert get(url + "/auth", {"Authorization": f"Bearer {alice}"})[0] == 204
    keys.revoke(store, "alice", [])
    assert get(url + "/auth", {"Authorization": f"Bearer {alice}"})[0] == 401
    assert get(url + "/auth", {"Authorization": f"Bearer {bob}"})[0] == 204


def test_an_unreadable_keys_file_keeps_the_keys_in_force_and_says_so(tmp_path):
    store = tmp_path / "store.json"
    alice = add(store, "alice")
    _, url = free_keys_service(tmp_path, store)
    store.write_text('{"keys": ')  # half a file
    assert get(url + "/auth", {"Authorization": f"Bearer {alice}"})[0] == 204
    listing = json.loads(get(url + "/keys")[2])
    assert "cannot read" in listing["error"]
    assert "glmdeploy_lb_keys_file_error 1.0" in get(url + "/metrics")[2].decode()


def test_over_a_limit_the_answer_is_429_with_retry_after_and_is_counted_by_name(tmp_path):
    store = tmp_path / "store.json"
    add(store, "alice")
    _, url = free_keys_service(tmp_path, store)
    code, headers, body = get(url + "/limited?key=alice&req=REJECTED&conn=&retry_after=12")
    assert code == 429 and headers["Retry-After"] == "12"
    assert "request rate" in json.loads(body)["error"]["message"]
    code, headers, body = get(url + "/limited?key=alice&req=PASSED&conn=REJECTED&retry_after=12")
    assert code == 429 and headers["Retry-After"] == "1" and "concurrent" in json.loads(body)["error"]["message"]
    metrics = get(url + "/metrics")[2].decode()
    assert 'glmdeploy_lb_key_limited_total{key="alice",limit="rate"} 1.0' in metrics
    assert 'glmdeploy_lb_key_limited_total{key="alice",limit="concurrency"} 1.0' in metrics


def test_the_listing_has_last_use_and_no_digest_and_last_use_survives_a_restart(tmp_path):
    store = tmp_path / "store.json"
    alice = add(store, "alice")
    add(store, "bob")
    service, url = free_keys_service(tmp_path, store)
    get(url + "/auth", {"Authorization": f"Bearer {alice}"})
    listing = json.loads(get(url + "/keys")[2])["keys"]
    assert listing["alice"]["last_used"] > 0 and listing["bob"]["last_used"] is None
    assert keys.digest(alice) not in json.dumps(listing)
    service.save_used()
    again = lb_keys.Keys(store, tmp_path / "used.json")
    assert again.listing()["alice"]["last_used"] == listing["alice"]["last_used"]
    table = keys.table(keys.read_store(store), {"alice": listing["alice"]["last_used"]})
    assert table.splitlines()[0].split() == ["name", "created", "last", "use"]
    assert "never" in table.splitlines()[2]
