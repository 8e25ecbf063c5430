"""The LLM engineer end to end against a tiny local OpenAI-compatible server (127.0.0.1, scripted chat-completion
replies, stops itself): the prompt it sends, retries with the validation error appended, the rule fallback, transport
errors, and the API key read from the named environment variable.

    .venv/bin/pytest tests/test_engineer_llm.py -q
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from test_engineer import SPACE, _diag, _one

from harness.engineer import EngineerConfig, propose
from harness.engineer.llm import build_messages
from harness.engineer.proposal import Change, ProposalError, change_key, parse_reply
from skills.library import SkillLibrary
from skills.model import Intervention, Skill, Trigger


class FakeEndpoint:
    """A bounded chat-completions server: serves `replies` in order (an int = that HTTP error), records requests,
    refuses anything past the script, and shuts down on exit."""

    def __init__(self, replies: list[str | int | dict], usage: object = None):
        self.replies, self.requests = list(replies), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
                reply = outer.replies.pop(0) if outer.replies else 503
                if isinstance(reply, int):
                    self.send_response(reply)
                    self.end_headers()
                    self.wfile.write(b"scripted error")
                    return
                data = json.dumps({"id": "x", "object": "chat.completion", "model": body["model"],
                                   "choices": [{"index": 0, "finish_reason": "stop",
                                                "message": reply if isinstance(reply, dict)  # a whole message
                                                else {"role": "assistant", "content": reply}}],
                                   **({"usage": usage} if usage is not None else {})}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.timeout = 5
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def lib(tmp_path):
    with SkillLibrary.open(tmp_path / "skills.db", seed_dir=None) as lib:
        lib.add(Skill(name="raise-holes", kind="env", trigger=Trigger(findings=["mapf.hole"]),
                      intervention=Intervention(knob="env.sizes.{size}.hole_ratio", op="add", value=0.1),
                      expected="fewer hole failures", domains=["mapf"]))
        yield lib


def _cfg(url: str, **kw) -> EngineerConfig:
    return EngineerConfig(**{"kind": "llm", "base_url": url, "model": "qwen-test", "timeout_s": 5, **kw})


def test_llm_retry_with_reason_then_valid(lib):
    good = "Looking at the failures...\n" + json.dumps({"candidates": [_one("recipe.temperature", 1.3)]})
    with FakeEndpoint([json.dumps(_one(value=0.95)), good]) as ep:
        res = propose(_cfg(ep.url), _diag(), lib, 2, np.random.default_rng(0), space=SPACE)
    assert res.engineer_used == "llm" and [c.change.knob for c in res.candidates] == ["recipe.temperature"]
    assert res.candidates[0].engineer == "llm" and len(res.rejected_replies) == 1
    assert res.rejected_replies[0].reason.startswith("out of range: env.sizes.5.hole_ratio = 0.95")
    first, second = ep.requests
    assert first["path"] == "/v1/chat/completions" and first["body"]["model"] == "qwen-test"
    prompt = first["body"]["messages"][-1]["content"]
    for needle in ("mapf.hole (size=5)", "round: 1", "env.sizes.5.hole_ratio  current=0.2  range=[0, 0.6]",
                   "Single factor", '"candidates"', "ProposedChange"):
        assert needle in prompt, needle
    msgs = second["body"]["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert "rejected: out of range" in msgs[-1]["content"] and first["auth"] is None


def test_the_engineers_own_tokens_are_counted_from_the_replies_usage(lib):
    """Every call the engineer answers is counted (its `usage` tokens and seconds), the rejected attempt's too; a
    server that names no usage is counted as such, never as 0 tokens said. Would catch: the engineer's tokens left
    out of what the run charges (they were, until the seventy-ninth session), only the accepted reply counted, or a
    bogus usage field (a string, a negative or boolean count) taken as tokens."""
    good = json.dumps({"candidates": [_one("recipe.temperature", 1.3)]})
    with FakeEndpoint([json.dumps(_one(value=0.95)), good], usage={"prompt_tokens": 700, "completion_tokens": 40,
                                                                   "total_tokens": 740}) as ep:
        res = propose(_cfg(ep.url), _diag(), lib, 2, np.random.default_rng(0), space=SPACE)
    u = res.usage
    assert (u.calls, u.unreported, u.prompt_tokens, u.completion_tokens) == (2, 0, 1400, 80) and u.seconds > 0
    for usage in (None, {"prompt_tokens": "700", "completion_tokens": 40}, {"prompt_tokens": -1, "completion_tokens": 4},
                  {"prompt_tokens": True, "completion_tokens": 4}, [1, 2]):
        with FakeEndpoint([good], usage=usage) as ep:
            u = propose(_cfg(ep.url), _diag(), lib, 2, np.random.default_rng(0), space=SPACE).usage
        assert (u.calls, u.unreported, u.prompt_tokens, u.completion_tokens) == (1, 1, 0, 0), usage
    rule = propose(EngineerConfig(kind="rule"), _diag(), lib, 2, np.random.default_rng(0), space=SPACE).usage
    assert rule.calls == 0 and rule.prompt_tokens == 0


def test_a_thinking_models_draft_json_is_not_its_answer(lib):
    """A thinking chat model (Qwen3, R1 behind vllm serve) writes `<think>...</think>` first, and may draft JSON in
    it: the proposal is the JSON after the block. A reply that is all thinking (never closed within max_tokens) is a
    recorded rejection naming the fix, and the retry's valid reply is used. Would catch the draft's out-of-range hole
    ratio being parsed as the proposal (extract_json takes the first JSON object in the text)."""
    draft = json.dumps({"candidates": [_one(value=0.95)]})
    good = f"<think>maybe {draft}? no, out of range.</think>\n" + json.dumps(
        {"candidates": [_one("recipe.temperature", 1.3)]})
    with FakeEndpoint([f"<think>{draft} and more thoughts", good]) as ep:
        res = propose(_cfg(ep.url), _diag(), lib, 2, np.random.default_rng(0), space=SPACE)
    assert res.engineer_used == "llm" and [c.change.knob for c in res.candidates] == ["recipe.temperature"]
    [bad] = res.rejected_replies
    assert bad.reason.startswith("the reply is a <think> block") and "engineer.max_tokens" in bad.reason


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])  # older servers' name, newer ones'
def test_a_reasoning_parsers_reply_without_an_answer_is_a_think_block_not_a_broken_endpoint(lib, field):
    """`vllm serve --reasoning-parser` returns `content: null` with `reasoning_content` when the budget ran out before
    the answer: that is the thinking model's unclosed think block (a recorded rejection naming engineer.max_tokens,
    then the retry), and the preflight passes; before, the preflight refused the endpoint and blamed the URL, model
    and key, and a stage treated it as a transport failure (an outside attack, seventieth session)."""
    from harness.engineer import preflight

    thinking = {"role": "assistant", "content": None, field: "the mix looks fine, maybe the rate"}
    good = json.dumps({"candidates": [_one("recipe.temperature", 1.3)]})
    with FakeEndpoint([thinking, thinking, good]) as ep:
        assert preflight(_cfg(ep.url)) is None
        res = propose(_cfg(ep.url), _diag(), lib, 2, np.random.default_rng(0), space=SPACE)
    assert res.engineer_used == "llm" and [c.change.knob for c in res.candidates] == ["recipe.temperature"]
    [bad] = res.rejected_replies
    assert bad.reason.startswith("the reply is a <think> block") and "engineer.max_tokens" in bad.reason


def test_json_the_prose_quotes_before_the_answer_is_not_the_answer(lib):
    """An LLM that quotes the current mix as JSON (the prompt shows `current={"3": 0.34, ...}`) before its fenced
    answer: the object holding `candidates` is the proposal, first try. Found by an outside attack (seventieth
    session): the quoted mix was parsed as a bare candidate and both tries were rejected. A bare candidate object with
    no `candidates` around it is still read as before."""
    from harness.engineer.proposal import extract_json

    reply = ('The current mix is {"3": 0.34, "4": 0.33, "5": 0.33}, which already matches the target. My proposal:\n'
             "```json\n" + json.dumps({"candidates": [_one("recipe.temperature", 1.3)]}) + "\n```")
    with FakeEndpoint([reply]) as ep:
        res = propose(_cfg(ep.url), _diag(), lib, 2, np.random.default_rng(0), space=SPACE)
    assert res.engineer_used == "llm" and not res.rejected_replies, res.rejected_replies
    assert [c.change.knob for c in res.candidates] == ["recipe.temperature"] and len(ep.requests) == 1
    assert extract_json('see {"knob": "recipe.temperature", "value": 1.3} then {"x": 1}') == {
        "knob": "recipe.temperature", "value": 1.3}


def test_the_llm_prompt_holds_the_skills_the_library_retrieves(lib):
    """In-family skills first, then other families' (matched by failure kind), with their evidence; a library
    without a matching skill adds no section. Before, the LLM engineer's prompt held no skills at all."""
    lib.add(Skill(name="math-hole-trick", kind="recipe", trigger=Trigger(findings=["math.hole"]),
                  intervention=Intervention(knob="recipe.temperature", op="mul", value=0.9),
                  expected="fewer failures of that kind", domains=["math"]))
    good = json.dumps({"candidates": [_one("recipe.temperature", 1.3)]})
    with FakeEndpoint([good]) as ep:
        res = propose(_cfg(ep.url), _diag(), lib, 2, np.random.default_rng(0), space=SPACE)
    prompt = ep.requests[0]["body"]["messages"][-1]["content"]
    own, borrowed = prompt.find("- raise-holes [env]: when mapf.hole"), prompt.find("- math-hole-trick [recipe]")
    assert 0 < own < borrowed, prompt
    assert "env.sizes.{size}.hole_ratio add 0.1" in prompt and "0/0 promoted" in prompt
    assert "borrowed from math" in prompt[borrowed:]
    from harness.engineer.llm import skills_text
    from skills.library import SEED_DIR, load_skill_file

    frontier = load_skill_file(SEED_DIR / "data-ratio-toward-frontier.md")  # knob @frontier, shown as the task's own
    assert "env.levels.{digits}.data_ratio add 0.1" in skills_text([(frontier, False)], "math")
    assert "env.sizes.{size}.data_ratio add 0.1" in skills_text([(frontier, False)], "mapf")
    assert any("skills in the prompt: raise-holes, math-hole-trick (borrowed)" in n for n in res.notes), res.notes
    empty = SkillLibrary.open(lib.path.parent / "empty.db", seed_dir=None)
    with FakeEndpoint([good]) as ep:
        propose(_cfg(ep.url), _diag(), empty, 2, np.random.default_rng(0), space=SPACE)
    empty.close()
    assert "Skills from the library" not in ep.requests[0]["body"]["messages"][-1]["content"]


def test_llm_invalid_until_out_of_retries_then_rule(lib):
    bad = ["{not json", json.dumps(_one("env.sizes.5.holes")), json.dumps(_one(["a", "b"]))]
    with FakeEndpoint(bad) as ep:
        res = propose(_cfg(ep.url, max_retries=2), _diag(), lib, 2, np.random.default_rng(0), space=SPACE)
    assert len(ep.requests) == 3
    assert res.engineer_used == "rule" and res.candidates[0].skill == "raise-holes"
    reasons = [r.reason for r in res.rejected_replies]
    assert reasons[0].startswith("malformed JSON") and reasons[2].startswith("two factors in one candidate #0")
    assert reasons[1].startswith("unknown knob 'env.sizes.5.holes' in candidate #0 (did you mean env.sizes.5.hole_ratio")
    assert "rule engineer stepped in" in res.notes


def test_llm_http_error_and_unreachable_fall_back(lib):
    with FakeEndpoint([500]) as ep:
        res = propose(_cfg(ep.url), _diag(), lib, 1, np.random.default_rng(0), space=SPACE)
        url = ep.url
    assert res.engineer_used == "rule" and any("HTTP 500" in n for n in res.notes)
    res = propose(_cfg(url, timeout_s=2), _diag(), lib, 1, np.random.default_rng(0), space=SPACE)  # server gone
    assert res.engineer_used == "rule" and any("unreachable" in n for n in res.notes)
    assert res.candidates[0].change.knob == "env.sizes.5.hole_ratio"


def test_llm_api_key_from_named_env_var(lib, monkeypatch):
    monkeypatch.setenv("EVOTRAINER_TEST_KEY", "sk-test-123")
    with FakeEndpoint([json.dumps(_one())]) as ep:
        res = propose(_cfg(ep.url, api_key_env="EVOTRAINER_TEST_KEY"), _diag(), lib, 1, np.random.default_rng(0),
                      space=SPACE)
    assert res.engineer_used == "llm" and ep.requests[0]["auth"] == "Bearer sk-test-123"
    monkeypatch.delenv("EVOTRAINER_TEST_KEY")
    res = propose(_cfg("http://127.0.0.1:9/v1", api_key_env="EVOTRAINER_TEST_KEY"), _diag(), lib, 1,
                  np.random.default_rng(0), space=SPACE)
    assert res.engineer_used == "rule" and any("EVOTRAINER_TEST_KEY is not set" in n for n in res.notes)


def test_a_proxy_is_used_only_when_the_run_config_names_it(lib, monkeypatch):
    """`engineer.proxy` sends the request (and its key) through the named proxy; the environment's proxy variables
    are never read. Would catch: no way through a proxy (the seventy-ninth session's review left it), or HTTPS_PROXY
    picked up from the environment, which sends the key to a proxy nobody named in the run config."""
    monkeypatch.setenv("EVOTRAINER_TEST_KEY", "sk-via-proxy")
    with FakeEndpoint([json.dumps(_one())]) as proxy:  # answers the proxied request itself: it sees the absolute URL
        res = propose(_cfg("http://engineer.invalid/v1", api_key_env="EVOTRAINER_TEST_KEY",
                           proxy=proxy.url.removesuffix("/v1")), _diag(), lib, 1, np.random.default_rng(0), space=SPACE)
    assert res.engineer_used == "llm"
    assert proxy.requests[0]["path"] == "http://engineer.invalid/v1/chat/completions"
    assert proxy.requests[0]["auth"] == "Bearer sk-via-proxy"
    with FakeEndpoint([json.dumps(_one())]) as proxy:
        for var in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY"):
            monkeypatch.setenv(var, proxy.url.removesuffix("/v1"))
        res = propose(_cfg("http://engineer.invalid/v1", api_key_env="EVOTRAINER_TEST_KEY", timeout_s=2, max_retries=0),
                      _diag(), lib, 1, np.random.default_rng(0), space=SPACE)
    assert proxy.requests == [] and res.engineer_used == "rule" and any("unreachable" in n for n in res.notes)
    with pytest.raises(ValueError, match="proxy"):
        EngineerConfig(kind="llm", base_url="http://x/v1", model="m", proxy="proxy.corp:3128")  # no scheme


def test_config_rejects_incomplete_llm_settings():
    with pytest.raises(ValueError, match="base_url \\+ model"):
        EngineerConfig(kind="llm", base_url="http://x/v1")
    with pytest.raises(ValueError, match="not both"):
        EngineerConfig(kind="llm", base_url="http://x/v1", model="m", model_path="policy")
    with pytest.raises(ValueError, match="extra"):
        EngineerConfig.model_validate({"kind": "rule", "temprature": 1})


def test_policy_as_engineer_runs_the_local_checkpoint(lib, tmp_path):
    """The current policy checkpoint as engineer (a tiny untrained model here): its replies go through the same
    validation; garbage is rejected with a reason and the rule engineer steps in."""
    from policies.model import build_model, save_policy

    model, tok = build_model("tiny", "abcdefghijklmnopqrstuvwxyz{}[]\":,. 0123456789_\n")
    save_policy(model, tok, tmp_path / "policy")
    cfg = EngineerConfig(kind="llm", model_path="policy", max_tokens=32, max_retries=1)
    res = propose(cfg, _diag(), lib, 1, np.random.default_rng(0), space=SPACE, policy_ckpt=tmp_path / "policy")
    assert len(res.rejected_replies) == 2 and res.engineer_used == "rule"
    assert all(r.reason.startswith(("malformed JSON", "schema", "unknown knob", "two factors"))
               for r in res.rejected_replies)
    with pytest.raises(ValueError, match="policy checkpoint"):
        propose(cfg, _diag(), lib, 1, np.random.default_rng(0), space=SPACE)


# --- hostile endpoints and replies (issue #15): each costs the proposal, never the run, and is recorded ----------------


class RawEndpoint:
    """A server whose every POST runs `behave(handler)`: drip bytes, redirect, flood, send bad bytes."""

    def __init__(self, behave):
        self.requests = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization")})
                try:
                    behave(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    url = FakeEndpoint.url
    __enter__ = FakeEndpoint.__enter__
    __exit__ = FakeEndpoint.__exit__


def _send(h, body: bytes) -> None:
    """Answer a RawEndpoint request with HTTP 200 and `body`."""
    h.send_response(200)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def _completion(content: str) -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()


def test_a_dripping_endpoint_cannot_hold_the_run_past_its_deadline(lib):
    def drip(h):
        body = _completion(json.dumps(_one()))
        h.send_response(200)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        for b in body:  # one byte every 0.3 s: each read is well inside any per-read timeout
            h.wfile.write(bytes([b]))
            h.wfile.flush()
            time.sleep(0.3)

    with RawEndpoint(drip) as ep:
        t = time.perf_counter()
        res = propose(_cfg(ep.url, timeout_s=1.5, max_retries=0), _diag(), lib, 1, np.random.default_rng(0),
                      space=SPACE)
        took = time.perf_counter() - t
    assert took < 4, took  # the old client waited over 45 s against a 5 s timeout
    assert res.engineer_used == "rule" and any("no complete reply within 1.5s" in n for n in res.notes)


def test_a_redirect_is_not_followed_and_the_key_goes_nowhere_else(lib, monkeypatch):
    monkeypatch.setenv("EVOTRAINER_TEST_KEY", "sk-secret")
    with FakeEndpoint([json.dumps(_one())]) as elsewhere:
        def redirect(h):
            h.send_response(307)
            h.send_header("Location", elsewhere.url + "/chat/completions")
            h.send_header("Content-Length", "0")
            h.end_headers()

        with RawEndpoint(redirect) as ep:
            res = propose(_cfg(ep.url, api_key_env="EVOTRAINER_TEST_KEY", max_retries=0), _diag(), lib, 1,
                          np.random.default_rng(0), space=SPACE)
        assert ep.requests[0]["auth"] == "Bearer sk-secret"  # the configured endpoint got it
        assert elsewhere.requests == []  # the redirect target got nothing, let alone the key
    assert res.engineer_used == "rule" and any("redirected (HTTP 307)" in n and "not followed" in n for n in res.notes)


@pytest.mark.parametrize("behave,why", [
    ("flood", "more than"), ("not_utf8", "did not return UTF-8 JSON"), ("deep", "did not return UTF-8 JSON"),
])
def test_oversized_or_undecodable_bodies_are_refused(lib, behave, why):
    def serve(h):
        if behave == "flood":
            h.send_response(200)
            h.send_header("Content-Length", str(64 << 20))
            h.end_headers()
            chunk = b"a" * (1 << 20)
            for _ in range(64):
                h.wfile.write(chunk)
            return
        _send(h, b"\xff\xfe\xfa not utf-8" if behave == "not_utf8" else b"[" * 100_000)

    with RawEndpoint(serve) as ep:
        res = propose(_cfg(ep.url, timeout_s=10, max_retries=0), _diag(), lib, 1, np.random.default_rng(0),
                      space=SPACE)
    assert res.engineer_used == "rule" and any(why in n for n in res.notes), res.notes


@pytest.mark.parametrize("coding", ["gzip", "gzip-2-members", "mislabelled", "deflate", "raw-deflate", "bomb", "br"])
def test_a_compressed_reply_despite_identity_is_read_or_named(lib, coding):
    """A server (or a proxy in front of it) that gzips despite `Accept-Encoding: identity` was "did not return UTF-8
    JSON"; now gzip and deflate (zlib or raw) are undone within the size bound, a body that expands past it is refused
    as too big, and another coding is named. Would catch a reader that trusts the header or decompresses unbounded."""
    import zlib

    body = _completion(json.dumps(_one()))
    if coding == "gzip":
        sent, header = zlib.compress(body, wbits=31), "gzip"
    elif coding == "gzip-2-members":  # RFC 1952: members one after another, the body their concatenation
        sent, header = zlib.compress(body[:10], wbits=31) + zlib.compress(body[10:], wbits=31), "gzip"
    elif coding == "mislabelled":
        sent, header = body, "gzip"
    elif coding == "deflate":
        sent, header = zlib.compress(body), "deflate"
    elif coding == "raw-deflate":
        c = zlib.compressobj(wbits=-15)
        sent, header = c.compress(body) + c.flush(), "deflate"
    elif coding == "bomb":  # 40 KB on the wire, 40 MB once decompressed
        sent, header = zlib.compress(b" " * (40 << 20), wbits=31), "gzip"
    else:
        sent, header = body, "br"

    def serve(h):
        h.send_response(200)
        h.send_header("Content-Encoding", header)
        h.send_header("Content-Length", str(len(sent)))
        h.end_headers()
        h.wfile.write(sent)

    with RawEndpoint(serve) as ep:
        res = propose(_cfg(ep.url, timeout_s=10, max_retries=0), _diag(), lib, 1, np.random.default_rng(0),
                      space=SPACE)
    if coding in ("gzip", "gzip-2-members", "mislabelled", "deflate", "raw-deflate"):
        assert res.engineer_used == "llm", res.notes
    else:
        assert res.engineer_used == "rule", res.notes
        why = "once decompressed" if coding == "bomb" else "Content-Encoding 'br'"
        assert any(why in n for n in res.notes), res.notes


def test_an_error_status_with_a_compressed_body_keeps_its_status_and_is_retried(lib):
    """A 503 whose body a proxy compressed with a coding not undone (or an empty gzip body) raised a non-transient
    "Content-Encoding" error, so the busy endpoint's status and Retry-After were lost and nothing was retried. An
    error's body is not decoded: the status decides, the second call answers."""
    calls = []

    def serve(h):
        calls.append(1)
        if len(calls) == 1:
            h.send_response(503)
            h.send_header("Content-Encoding", "br")
            h.send_header("Retry-After", "0")
            h.send_header("Content-Length", "3")
            h.end_headers()
            h.wfile.write(b"\x0b\x01\x80")
            return
        _send(h, _completion(json.dumps(_one())))

    with RawEndpoint(serve) as ep:
        res = propose(_cfg(ep.url, timeout_s=10, max_retries=1), _diag(), lib, 1, np.random.default_rng(0),
                      space=SPACE)
    assert len(calls) == 2 and res.engineer_used == "llm", res.notes


HOSTILE_REPLIES = {
    "deep nesting": "[" * 50_000,
    "5000-digit integer": '{"candidates": [{"knob": "env.sizes.5.hole_ratio", "value": ' + "9" * 5000
                          + ', "rationale": "r", "expected": "e"}]}',
    "400-digit integer": json.dumps({"candidates": [_one(value=10 ** 400)]}),
    "blank rationale": json.dumps({"candidates": [_one(rationale="   ")]}),
    "huge knob name": json.dumps({"candidates": [_one(knob="x" * 300_000)]}),
    "non-text reply": None,
}


@pytest.mark.parametrize("name", list(HOSTILE_REPLIES))
def test_hostile_replies_are_recorded_rejections_and_the_rule_engineer_steps_in(lib, name):
    reply = HOSTILE_REPLIES[name]
    with FakeEndpoint([reply if reply is not None else "x"]) as ep:
        if reply is None:  # content that is not a string
            ep.replies = []
            ep.server.RequestHandlerClass.do_POST = _non_text_content
        res = propose(_cfg(ep.url, max_retries=0), _diag(), lib, 1, np.random.default_rng(0), space=SPACE)
    assert res.engineer_used == "rule" and res.candidates  # the stage still gets a candidate
    reasons = [r.reason for r in res.rejected_replies] + res.notes
    assert all(len(r) <= 500 for r in reasons), [len(r) for r in reasons]
    assert all(len(r.reply) <= 2000 for r in res.rejected_replies)


def _non_text_content(self):
    self.rfile.read(int(self.headers["Content-Length"]))
    data = json.dumps({"choices": [{"message": {"content": {"knob": 1}}}]}).encode()
    self.send_response(200)
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)


def test_work_does_not_grow_with_the_number_of_candidates_in_a_reply(lib, monkeypatch):
    from harness.engineer import proposal

    calls = []
    real = proposal.vet_error
    monkeypatch.setattr(proposal, "vet_error", lambda *a, **k: calls.append(1) or real(*a, **k))
    many = {"candidates": [_one()] * 1500 + [_one(value=round(0.01 * i, 2)) for i in range(30, 60)]}
    with FakeEndpoint([json.dumps(many), json.dumps({"candidates": [_one()] * 10_000})]) as ep:
        res = propose(_cfg(ep.url, max_retries=0), _diag(), lib, 2, np.random.default_rng(0), space=SPACE)
        assert res.engineer_used == "llm" and len(res.candidates) == 1  # one knob: later values of it are dropped
        assert len(calls) <= 6  # 3 x max_candidates vetted at most, not 1530
        assert any("1500 duplicate candidate(s) dropped" in n for n in res.notes)
        res = propose(_cfg(ep.url, max_retries=0), _diag(), lib, 2, np.random.default_rng(0), space=SPACE)
    assert res.engineer_used == "rule" and res.rejected_replies[0].reason.startswith("reply too long")


def test_the_preflight_asks_the_endpoint_one_token_and_names_what_is_wrong(tmp_path, monkeypatch):
    """`harness.engineer.preflight`: one 1-token completion through the run's own client; an HTTP error (an unknown
    model is one at vLLM and OpenAI), a dead address, an unset key variable and a local checkpoint that is not one are
    each named. Would catch: a check that never reaches the endpoint, or one that passes whatever it answers."""
    from harness.engineer import preflight

    with FakeEndpoint(["OK"]) as ep:
        assert preflight(_cfg(ep.url)) is None
        (req,) = ep.requests
    assert req["path"] == "/v1/chat/completions" and req["body"]["model"] == "qwen-test"
    assert req["body"]["max_tokens"] == 1 and req["body"]["temperature"] == 0.0
    with FakeEndpoint([404]) as ep:
        assert "answered HTTP 404" in preflight(_cfg(ep.url))
        url = ep.url
    assert "unreachable" in preflight(_cfg(url, timeout_s=2))  # the server is gone
    monkeypatch.delenv("EVOTRAINER_NO_SUCH_KEY", raising=False)
    with FakeEndpoint(["OK"]) as ep:
        why = preflight(_cfg(ep.url, api_key_env="EVOTRAINER_NO_SUCH_KEY"))
        assert "EVOTRAINER_NO_SUCH_KEY is not set" in why and not ep.requests
    why = preflight(EngineerConfig(kind="llm", model_path=str(tmp_path / "nowhere")))
    assert why.startswith("model_path:") and "config.json" in why
    assert preflight(EngineerConfig(kind="llm", model_path="policy")) is None  # the run's own checkpoint
    assert preflight(EngineerConfig(kind="rule")) is None


def test_a_run_whose_engineer_cannot_answer_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    """An overnight run with a dead endpoint used to train all night, every stage falling back to the rule engineer;
    now the start is one line with the fix and no run folder, `engineer.preflight: false` starts anyway, a resume only
    warns (it keeps training unattended), and the experiment refuses an evolved-llm arm that would be the rule
    engineer's under the LLM's name."""
    import yaml

    from harness.benchmarks.run import TINY
    from harness.config import parse_config
    from harness.experiment import ExperimentError, load_experiment, plan
    from harness.lifecycle import RunError, _check_engineer, start_run

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    with FakeEndpoint([]) as ep:
        dead = ep.url
    eng = {"kind": "llm", "base_url": dead, "model": "qwen-test", "timeout_s": 2}
    cfg = parse_config({**TINY, "name": "pf", "engineer": eng})
    with pytest.raises(RunError, match=r"^engineer: engineer endpoint .* unreachable.*start the server.*"
                                       r"engineer\.preflight: false"):
        start_run(cfg, runs_dir=tmp_path / "runs")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "home").exists()
    _check_engineer(parse_config({**TINY, "engineer": {**eng, "preflight": False}}))  # asked not to check: passes

    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({"run": {**TINY, "engineer": eng}, "arms": ["fixed-template", "evolved-llm"]}))
    with pytest.raises(ExperimentError, match=r"arm evolved-llm: the engineer cannot answer: .*unreachable"):
        plan(load_experiment(exp))


def test_a_resume_with_an_engineer_that_cannot_answer_warns_and_goes_on(tmp_path, monkeypatch):
    from harness import lifecycle
    from harness.benchmarks.run import TINY
    from harness.config import parse_config
    from harness.store import RunStore

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    with FakeEndpoint([]) as ep:
        dead = ep.url
    cfg = parse_config({**TINY, "name": "pfr", "engineer": {"kind": "llm", "base_url": dead, "model": "m",
                                                             "timeout_s": 2}})
    run_dir = tmp_path / "runs" / "pfr-1"
    made = lifecycle.open_run(run_dir, cfg)
    made.close()
    made.store.close()
    driven = []
    monkeypatch.setattr(lifecycle, "_drive", lambda run, first, **kw: driven.append(first) or {})
    lifecycle.resume_run(run_dir)
    assert driven, "the resume went on"
    store = RunStore.open(run_dir / "run.db", create=False)
    try:
        warn = [e["message"] for e in store.events(store.runs()[0]) if e["kind"] == "warning"]
    finally:
        store.close()
    assert any(w.startswith("the LLM engineer cannot answer now (engineer endpoint") and "rule engineer" in w
               for w in warn), warn


def test_an_endpoint_timeout_past_what_a_timer_can_wait_is_refused_in_the_config():
    """`engineer.timeout_s: 1e12` was accepted, the preflight passed (it caps its own wait), and then every stage's
    request failed with an OverflowError and fell back to the rule engineer (an outside attack, seventieth session)."""
    import pydantic

    with pytest.raises(pydantic.ValidationError, match="timeout_s"):
        EngineerConfig(kind="llm", base_url="http://127.0.0.1:1/v1", model="m", timeout_s=1.0e12)
    assert EngineerConfig(kind="llm", base_url="http://127.0.0.1:1/v1", model="m", timeout_s=3600).timeout_s == 3600


# --- the seventy-ninth session's review of the LLM engineer: each test fails on the code before it --------------------

GOOD = json.dumps({"candidates": [_one("recipe.temperature", 1.3)]})


def test_a_think_block_the_chat_template_opened_is_not_the_answer():
    """DeepSeek-R1 distills and QwQ open `<think>` in the prompt: the reply closes a block it never opened. Would
    catch the draft inside that block taken as the proposal (the first JSON object holding `candidates`)."""
    draft = json.dumps({"candidates": [_one(value=0.5)]})
    cands, _ = parse_reply(f"Maybe {draft}? No: temperature.\n</think>\n\n{GOOD}", _diag(), SPACE, 2, "llm")
    assert [c.change.knob for c in cands] == ["recipe.temperature"]
    with pytest.raises(ProposalError, match="no answer after it"):
        parse_reply(f"Maybe {draft}?</think>  ", _diag(), SPACE, 2, "llm")


def test_a_local_engineer_that_cannot_load_costs_its_proposal_not_the_run(lib, tmp_path):
    """Would catch a checkpoint that cannot load (gone, damaged, out of memory) raising out of `propose`, which the
    stage does not catch, instead of the rule engineer stepping in with the reason noted."""
    cfg = EngineerConfig(kind="llm", model_path=str(tmp_path / "gone"), preflight=False)
    res = propose(cfg, _diag(), lib, 1, np.random.default_rng(0), space=SPACE)
    assert res.engineer_used == "rule" and res.candidates
    assert any(n.startswith("llm engineer unavailable:") for n in res.notes), res.notes


def test_a_busy_or_failing_endpoint_is_asked_again_and_a_wrong_request_is_not(lib, monkeypatch):
    """HTTP 429 and 5xx and an unreachable server are asked again (within max_retries, after a short wait); a 4xx
    that is the request's fault is not. Would catch one 503 costing the stage's LLM proposal."""
    import harness.engineer as E

    monkeypatch.setattr(E, "TRANSIENT_BACKOFF_S", 0.01)
    with FakeEndpoint([503, 429, GOOD]) as ep:
        res = propose(_cfg(ep.url), _diag(), lib, 2, np.random.default_rng(0), space=SPACE)
    assert res.engineer_used == "llm" and len(ep.requests) == 3 and res.usage.calls == 3
    assert [c.change.knob for c in res.candidates] == ["recipe.temperature"]
    with FakeEndpoint([400, GOOD]) as ep:
        res = propose(_cfg(ep.url), _diag(), lib, 2, np.random.default_rng(0), space=SPACE)
    assert res.engineer_used == "rule" and len(ep.requests) == 1


def test_a_reply_cut_at_the_token_budget_says_so(lib):
    """Would catch a reply truncated at max_tokens rejected as plain malformed JSON, the retry sent with the same
    budget and nothing naming engineer.max_tokens."""
    def cut_short(h):
        _send(h, json.dumps({"choices": [{"index": 0, "finish_reason": "length",
                                          "message": {"role": "assistant", "content": GOOD[:30]}}]}).encode())

    with RawEndpoint(cut_short) as ep:
        res = propose(_cfg(ep.url, max_retries=0, max_tokens=64), _diag(), lib, 1, np.random.default_rng(0),
                      space=SPACE)
    [bad] = res.rejected_replies
    assert "engineer.max_tokens=64" in bad.reason and res.engineer_used == "rule"


def test_one_bad_candidate_costs_itself_not_the_replys_good_one():
    """Would catch a valid first candidate lost because a surplus one (over max_candidates, or beside it) was out of
    range; a reply whose every candidate is bad is still rejected with the first reason."""
    reply = json.dumps({"candidates": [_one("recipe.temperature", 1.3), _one(value=0.95)]})
    cands, notes = parse_reply(reply, _diag(), SPACE, 1, "llm")
    assert [c.change.knob for c in cands] == ["recipe.temperature"] and any("over max_candidates" in n for n in notes)
    cands, notes = parse_reply(reply, _diag(), SPACE, 2, "llm")
    assert [c.change.knob for c in cands] == ["recipe.temperature"]
    assert any(n.startswith("candidate #1 dropped: out of range") for n in notes), notes
    with pytest.raises(ProposalError, match="out of range"):
        parse_reply(json.dumps({"candidates": [_one(value=0.95), _one(value=0.99)]}), _diag(), SPACE, 2, "llm")


def test_a_diagnostic_respelt_with_a_comment_is_the_same_experiment():
    """Would catch a refuted diagnostic coming back as a fresh test (a fresh chance at alpha) after a comment or a
    blank line was added; a change of what it computes is another experiment."""
    code = "def diagnose(rollouts):\n    return {'findings': [], 'metrics': {'n': len(rollouts)}}\n"
    key = lambda c: change_key("s", Change(kind="diagnostic", knob="diagnostics/x.py", code=c))
    assert key(code) == key("# v2\n" + code.replace("return", "\n    return")) 
    assert key(code) != key(code.replace("len(rollouts)", "len(rollouts) + 1"))


def test_a_bare_candidate_list_after_quoted_json_is_the_answer():
    """The prompt shows the current mix as JSON; an answer that quotes it, then gives a bare list of candidates, is
    the list. Would catch the quoted mix parsed as the proposal ("candidates.0.knob: Field required")."""
    text = 'The mix is {"3": 0.34, "5": 0.66}; I propose:\n' + json.dumps([_one("recipe.temperature", 1.3)])
    cands, _ = parse_reply(text, _diag(), SPACE, 2, "llm")
    assert [c.change.knob for c in cands] == ["recipe.temperature"]


def test_the_prompt_shows_the_diagnostic_files_and_what_a_diagnostic_reads():
    """Would catch the prompt inviting a diagnostic revision while showing neither the files the harness has (a
    revision must keep their findings, metrics and vetoes) nor the fields of a rollout and a finding."""
    src = "def diagnose(rollouts):\n    return {'findings': [], 'metrics': {'holes': 0.0}}\n"
    user = build_messages(_diag(diagnostics={"diagnostics/holes.py": src}), SPACE, 2)[1]["content"]
    assert "--- diagnostics/holes.py\n" + src in user
    for needle in ("`valid`", "`failure`", "`slices`", "`severity`", "keep every finding code"):
        assert needle in user, needle


def test_a_call_that_failed_is_charged_its_wait_not_called_unreported(lib):
    """Would catch a call that timed out (the costly case) charged nothing, and an HTTP error counted as a reply
    without usage."""
    def silent(h):
        time.sleep(1.5)

    with RawEndpoint(silent) as ep:
        res = propose(_cfg(ep.url, timeout_s=0.5, max_retries=0), _diag(), lib, 1, np.random.default_rng(0),
                      space=SPACE)
    assert res.usage.calls == 1 and res.usage.seconds >= 0.5 and res.usage.unreported == 0
    with FakeEndpoint([500]) as ep:
        u = propose(_cfg(ep.url, max_retries=0), _diag(), lib, 1, np.random.default_rng(0), space=SPACE).usage
    assert (u.calls, u.unreported) == (1, 0)


# --- transport and lifecycle (an outside review, eighty-second session) ------------------------------------------------


def _error(h, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
    h.send_response(status)
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def test_an_endpoint_that_echoes_the_key_never_puts_it_in_a_note_or_the_preflight(lib, monkeypatch):
    """Some proxies and dev servers answer 401 with the Authorization header they got; the error text went word for
    word into the notes (run.db's events, the report) and the preflight's refusal."""
    from harness.engineer import preflight

    monkeypatch.setenv("EVOTRAINER_TEST_KEY", "sk-SECRET-123456")
    echo = lambda h: _error(h, 401, b'{"error": "invalid token Bearer sk-SECRET-123456"}')
    with RawEndpoint(echo) as ep:
        res = propose(_cfg(ep.url, api_key_env="EVOTRAINER_TEST_KEY", max_retries=0), _diag(), lib, 1,
                      np.random.default_rng(0), space=SPACE)
        said = preflight(_cfg(ep.url, api_key_env="EVOTRAINER_TEST_KEY"))
    assert ep.requests[0]["auth"] == "Bearer sk-SECRET-123456"
    notes = " ".join(res.notes)
    assert "HTTP 401" in notes and "Bearer ***" in notes and "sk-SECRET" not in notes, notes
    assert said is not None and "HTTP 401" in said and "sk-SECRET" not in said, said


def test_a_busy_endpoint_is_asked_again_after_its_retry_after(lib):
    """HTTP 429 with Retry-After: 2 is asked again after two seconds, not after the fixed 1 s backoff; and an error
    object sent with HTTP 200 is an unanswered call naming the server's error, not an answer without `usage`."""
    seen: list[float] = []

    def busy(h):
        seen.append(time.monotonic())
        if len(seen) == 1:
            _error(h, 429, b'{"error": "slow down"}', {"Retry-After": "2"})
        else:
            _send(h, _completion(json.dumps(_one())))

    with RawEndpoint(busy) as ep:
        res = propose(_cfg(ep.url, max_retries=1), _diag(), lib, 1, np.random.default_rng(0), space=SPACE)
    assert res.engineer_used == "llm" and seen[1] - seen[0] >= 1.8, (res.notes, seen)

    with RawEndpoint(lambda h: _send(h, b'{"error": {"message": "model overloaded"}}')) as ep:
        res = propose(_cfg(ep.url, max_retries=0), _diag(), lib, 1, np.random.default_rng(0), space=SPACE)
    assert res.engineer_used == "rule" and any("model overloaded" in n for n in res.notes), res.notes
    assert res.usage.calls == 1 and res.usage.unreported == 0


def test_a_reasoning_reply_with_null_content_and_empty_reasoning_passes_the_preflight():
    """`vllm serve --reasoning-parser`: a one-token preflight whose token is `<think>` comes back as content null and
    reasoning_content "" (the parser strips the tag); it is an answer (a healthy server), not "non-text content"."""
    from harness.engineer import preflight

    with FakeEndpoint([{"role": "assistant", "content": None, "reasoning_content": ""}]) as ep:
        assert preflight(_cfg(ep.url)) is None


def test_a_base_url_without_a_scheme_or_a_missing_ca_bundle_is_a_config_error(tmp_path):
    with pytest.raises(ValueError, match="base_url"):
        EngineerConfig(kind="llm", base_url="127.0.0.1:8000/v1", model="m")
    with pytest.raises(ValueError, match="ca_bundle .* is not a file"):  # before: a traceback from the HTTP client
        EngineerConfig(kind="llm", base_url="https://h/v1", model="m", ca_bundle=str(tmp_path / "none.pem"))


def test_a_ctrl_c_mid_ask_leaves_the_callers_usage_with_what_was_spent(lib):
    """The calls answered before a Ctrl-C are in the caller's `usage` (the graph charges it when the ask is stopped);
    before, they were summed inside `propose` and lost with its frame."""
    import _thread

    from harness.engineer.llm import Usage

    def slow_second(h):
        if not getattr(slow_second, "once", False):
            slow_second.once = True
            _send(h, _completion("not json"))  # answered, rejected: the engineer is asked again
            return
        threading.Timer(0.3, _thread.interrupt_main).start()  # Ctrl-C while the second ask waits
        time.sleep(3)
        _send(h, _completion(json.dumps(_one())))

    spent = Usage()
    with RawEndpoint(slow_second) as ep, pytest.raises(KeyboardInterrupt):
        propose(_cfg(ep.url, max_retries=2, timeout_s=10), _diag(), lib, 1, np.random.default_rng(0), space=SPACE,
                usage=spent)
    assert spent.calls >= 1 and spent.seconds > 0
