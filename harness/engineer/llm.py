"""The LLM engineer: an OpenAI-compatible chat endpoint (`vllm serve`, any /v1/chat/completions) or a local
transformers checkpoint, including the current policy checkpoint ("policy as engineer").

The prompt holds the Diagnosis text (raw failure evidence, history, round bookkeeping), the Proposal JSON schema and
the rules (single factor, allowed knobs and their ranges). A reply that fails validation is sent back with the reason
appended and retried up to `max_retries` times; after that the rule engineer steps in (see `harness.engineer.propose`).

    vllm serve Qwen/Qwen3-4B --port 8000      # elsewhere; then in the run config:
    engineer: {kind: llm, base_url: "http://127.0.0.1:8000/v1", model: "Qwen/Qwen3-4B"}

HTTP goes through httpx (`post_json`: a deadline per request, a bounded read, redirects refused so the key never
reaches another host). The API key, when needed, is read from the environment variable named by `api_key_env`, never
from a config file.
"""

from __future__ import annotations

import json
import os
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.engineer.proposal import Knob, Proposal, entry_text, mixture_text, space_text, target_text
from harness.records import Diagnosis

Messages = list[dict[str, str]]
ReplyFn = Callable[[Messages, int], str]  # (messages, attempt) -> reply text; raises EndpointError on transport failure


class EndpointError(RuntimeError):
    """The engineer could not be reached or answered with something that is not a chat completion. `transient`: worth
    asking again (the server unreachable, busy or failing: HTTP 429 and 5xx), not a deadline already spent or a reply
    that is wrong in itself."""

    def __init__(self, message: str, transient: bool = False, retry_after: float | None = None):
        super().__init__(message)
        self.transient = transient
        self.retry_after = retry_after  # seconds the server asked for (HTTP Retry-After), if it said


def _retry_after(value: str | None) -> float | None:
    """HTTP Retry-After in seconds (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    from email.utils import parsedate_to_datetime

    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


class Reply(str):
    """A reply's text, marked `truncated` when the endpoint says generation stopped at `max_tokens`
    (`finish_reason: length`): a rejection of it then names the budget."""

    truncated: bool = False


class Usage:
    """What an engineer's replies cost, summed over its calls: tokens read (prompt) and written (completion), and the
    seconds the run waited. An endpoint's tokens are its `usage` field's (OpenAI-compatible servers, `vllm serve`,
    send it); a completion whose reply has none is counted in `unreported` with its tokens unknown (0). A local
    checkpoint's are counted from its token ids. The graph charges the sum to the compute ledger (kind `engineer`),
    apart from the policy's compute."""

    def __init__(self) -> None:
        self.calls = self.unreported = self.prompt_tokens = self.completion_tokens = 0
        self.seconds = 0.0

    def add(self, seconds: float, prompt_tokens: int | None, completion_tokens: int | None,
            answered: bool = True) -> None:
        """One call: its seconds always (a call that failed or timed out was waited for too); its tokens where the
        reply named them; a call that got no completion (`answered` False) counts no tokens and is not unreported."""
        self.calls += 1
        self.seconds += max(0.0, seconds)
        if not answered:
            return
        if prompt_tokens is None or completion_tokens is None:
            self.unreported += 1
            return
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens


def _usage_of(payload: Any) -> tuple[int | None, int | None]:
    """(prompt_tokens, completion_tokens) from a chat completion's `usage`, or (None, None) where it has none or
    they are not non-negative integers."""
    u = payload.get("usage") if isinstance(payload, dict) else None
    if not isinstance(u, dict):
        return None, None
    p, c = u.get("prompt_tokens"), u.get("completion_tokens")
    ok = all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**40 for x in (p, c))
    return (p, c) if ok else (None, None)


# --- the prompt -------------------------------------------------------------------------------------------------------

SYSTEM = ("You are the training-environment engineer of an RL run. You read a diagnosis of the policy's failures and "
          "propose single-factor changes to its training harness. You answer with ONE JSON object and nothing else.")

RULES = """Rules:
1. Single factor: each candidate changes exactly ONE knob (or adds/revises ONE diagnostic file). Never two knobs in
   one candidate; propose several candidates instead.
2. Use only the allowed knobs below, with a NEW value (not a delta) inside the knob's range; integer knobs take integers;
   env.mixture (where listed) takes an object of weights: the whole training mix, still ONE factor.
3. Address the failure evidence; preserve what already works (do not starve slices that are already solved).
4. Do not repeat a change the history shows was rejected from the same state.
5. A diagnostic file is diagnostics/<name>.py defining diagnose(rollouts) -> {"findings": [...], "metrics": {...}}
   and optionally veto(control, candidate) -> str | None; put its source in "code" and leave "value" out. It runs in
   a sandbox (standard library only, no network, no files) on the rollouts as plain dicts with at least `valid`
   (bool), `failure` (str or None), `reward` (float) and `slices` (dict of str -> str). A finding is a dict with
   `code` (short name), `severity` (info|warn|critical), `count`, `rate` (0..1), optional `slice` ({"<key>": "<value>"}),
   `message` and optional `knobs`; metrics are plain numbers. veto gets the control's and the candidate's metrics
   and returns a reason to block the promotion, or None. A revision must keep every finding code, metric and veto
   the file has now (listed below)."""

MAX_DIAGNOSTIC_CHARS = 4000  # of one diagnostic file's source in the prompt (the rest cut, and said so)


def diagnostics_text(files: dict[str, str]) -> str:
    """The harness's diagnostic files as prompt text: each path and its source, a long one cut."""
    out = []
    for path, src in files.items():
        more = len(src) - MAX_DIAGNOSTIC_CHARS
        out.append(f"--- {path}\n{src[:MAX_DIAGNOSTIC_CHARS]}" + (f"\n... ({more} more chars)" if more > 0 else ""))
    return "Diagnostic files in the harness now:\n" + "\n".join(out) if out else ""


def skills_text(skills: list[tuple[Any, bool]], task: str | None = None) -> str:
    """The skills the library retrieved for this diagnosis, as prompt lines: trigger, change, expected outcome and
    the evidence behind it (promotions / tries, mean effect), marked when borrowed from another task family. A
    family-neutral knob (`@frontier`) is shown as this task's own knob template."""
    from harness.engineer.rule import resolve_knob

    lines = []
    for sk, borrowed in skills:
        ev = sk.evidence
        iv = sk.intervention
        knob = resolve_knob(iv.knob, task) or iv.knob
        value = f"{iv.value:g}" if isinstance(iv.value, int | float) else str(iv.value)
        change = knob if sk.kind == "diagnostic" else f"{knob} {iv.op} {value}"
        fam = f"; borrowed from {', '.join(sk.domains)} (not yet tried on this family)" if borrowed else ""
        lines.append(f"- {sk.name} [{sk.kind}]: when {', '.join(sk.trigger.findings)}"
                     f"{' and ' + sk.trigger.condition if sk.trigger.condition else ''}: {change}. Expected: "
                     f"{sk.expected}. Evidence: {ev.promotions}/{ev.tries} promoted, mean effect {ev.mean_effect:+.3f}"
                     f"{'; general' if sk.general else ''}{fam}")
    return "\n".join(lines)


def build_messages(diagnosis: Diagnosis, space: dict[str, Knob], max_candidates: int,
                   skills: list[tuple[Any, bool]] | None = None) -> Messages:
    """The engineer's prompt: the diagnosis, the allowed knobs, the skills the library retrieved for these findings
    ((skill, borrowed) pairs: in-family first, then other families'), the rules and the reply schema."""
    from harness.diagnostics import diagnosis_text

    schema = json.dumps(Proposal.model_json_schema(), indent=1)
    known = (f"Skills from the library that match these findings (what worked before; adapt a template's "
             f"{{slice}} to this diagnosis, or propose something else):\n{skills_text(skills, diagnosis.task)}\n\n") if skills else ""
    mix = "\n".join(t for t in (mixture_text(diagnosis), entry_text(diagnosis), target_text(diagnosis),
                                diagnostics_text(diagnosis.diagnostics)) if t)
    user = (f"{diagnosis_text(diagnosis)}\n\nAllowed knobs (path, current value, range):\n{space_text(space)}\n"
            f"{mix + chr(10) if mix else ''}\n"
            f"{known}{RULES}\n\nPropose at most {max_candidates} candidate(s), best first. Reply with a JSON object matching "
            f"this schema:\n{schema}")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def retry_message(reason: str) -> str:
    return (f"Your reply was rejected: {reason}\nReply again with only the corrected JSON object "
            "{\"candidates\": [...]}, one knob per candidate, values inside the allowed ranges.")


# --- an OpenAI-compatible endpoint ------------------------------------------------------------------------------------


MAX_RESPONSE_BYTES = 4_000_000  # a chat completion larger than this is refused (read stops there)


def post_json(url: str, payload: dict, headers: dict[str, str], timeout_s: float,
              max_bytes: int = MAX_RESPONSE_BYTES, proxy: str | None = None, verify: str | bool = True,
              meta: dict[str, Any] | None = None) -> tuple[int, bytes]:
    """POST `payload` as JSON; (HTTP status, body). Raises EndpointError when no complete reply arrives within
    `timeout_s` for the WHOLE request (connect, headers and body: a server that drips one byte at a time cannot hold
    the run), when the body exceeds `max_bytes`, on a redirect (never followed: the API key must not reach another
    address) and on transport errors.

    httpx rather than urllib: urllib follows redirects and re-sends the Authorization header to wherever they point,
    and neither applies a deadline to a whole request; httpx does not follow redirects unless asked, and the request
    runs in a worker thread the caller stops waiting for at the deadline (the client is then closed, and each of its
    reads is bounded by the same timeout, so the thread ends too). The environment's proxy variables are not read
    (`trust_env=False`: the key goes only where the run config says); `proxy` names one (`engineer.proxy`), and
    `verify` a CA bundle for an https endpoint signed by one's own CA (`engineer.ca_bundle`; the environment's
    SSL_CERT_FILE is not read either). `meta` receives the reply's `retry_after` header."""
    import httpx

    box: dict[str, Any] = {}
    stop = threading.Event()
    client = httpx.Client(follow_redirects=False, trust_env=False, proxy=proxy, verify=verify,
                          timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)))

    def work() -> None:
        try:
            with client.stream("POST", url, json=payload, headers={**headers, "Accept-Encoding": "identity"}) as resp:
                box["status"], box["location"] = resp.status_code, resp.headers.get("location")
                box["retry_after"] = resp.headers.get("retry-after")
                box["encoding"] = resp.headers.get("content-encoding")
                if resp.is_redirect:
                    return
                buf = bytearray()
                for chunk in resp.iter_raw():
                    buf += chunk
                    if len(buf) > max_bytes:
                        box["too_big"] = True
                        return
                    if stop.is_set():
                        return
                box["body"] = bytes(buf)
        except Exception as exc:  # noqa: BLE001 - reported to the caller below
            box["error"] = exc

    t = threading.Thread(target=work, name="engineer-http", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        stop.set()
        client.close()
        raise EndpointError(f"engineer endpoint {url} sent no complete reply within {timeout_s:g}s (engineer.timeout_s)")
    client.close()
    if "error" in box:
        exc = box["error"]
        if isinstance(exc, httpx.TimeoutException):
            raise EndpointError(f"engineer endpoint {url} timed out after {timeout_s:g}s (engineer.timeout_s)")
        if "CERTIFICATE_VERIFY_FAILED" in str(exc) or isinstance(exc.__context__, ssl.SSLCertVerificationError):
            raise EndpointError(f"engineer endpoint {url}: its TLS certificate does not verify ({str(exc)[:160]}); "
                                "for an endpoint signed by your own CA set engineer.ca_bundle to that CA's PEM file")
        raise EndpointError(f"engineer endpoint {url} unreachable: {type(exc).__name__}: {str(exc)[:200]}; is the "
                            "server running?", transient=True)
    if box.get("location") is not None and 300 <= box.get("status", 0) < 400:
        raise EndpointError(f"engineer endpoint {url} redirected (HTTP {box['status']}) to "
                            f"{str(box['location'])[:200]}; redirects are not followed (the API key is never sent to "
                            "another address): set engineer.base_url to the final address")
    if box.get("too_big"):
        raise EndpointError(f"engineer endpoint {url} sent more than {max_bytes} bytes: refused")
    if meta is not None:
        meta["retry_after"] = box.get("retry_after")
    if box["status"] >= 400:  # an error's body is read only for its words: its status and Retry-After decide
        return box["status"], box["body"]
    return box["status"], _decoded(box["body"], box.get("encoding"), url, max_bytes)


def _decoded(body: bytes, encoding: str | None, url: str, max_bytes: int) -> bytes:
    """The body as sent before any content coding: a server (or a proxy in front of it) may compress despite
    `Accept-Encoding: identity`; gzip and deflate (zlib-wrapped, or raw as some servers send it) are undone within
    `max_bytes` of output (a small compressed body must not expand past the bound), any other coding is named."""
    import zlib

    def inflate(data: bytes, wbits: int) -> bytes | None:
        out = b""
        while True:  # gzip may hold several members one after another (RFC 1952 2.2): each is inflated
            d = zlib.decompressobj(wbits)
            try:
                out += d.decompress(data, max_bytes + 1 - len(out))
            except zlib.error:
                return None
            if len(out) > max_bytes or d.unconsumed_tail:
                raise EndpointError(f"engineer endpoint {url} sent more than {max_bytes} bytes (once decompressed): "
                                    "refused")
            if not d.eof:
                return None
            data = d.unused_data
            if not data:
                return out
            if wbits < 0:  # raw deflate has no members: bytes after its end are not part of it
                return None

    codings = [c.strip().lower() for c in (encoding or "").split(",") if c.strip().lower() not in ("", "identity")]
    for coding in reversed(codings):  # applied in the order listed: undone last first
        if coding not in ("gzip", "x-gzip", "deflate"):
            raise EndpointError(f"engineer endpoint {url} sent its reply with Content-Encoding {coding!r} despite "
                                "Accept-Encoding: identity; only gzip and deflate are undone: configure the server "
                                "(or its proxy) not to compress")
        # 47 = 32 + 15: a gzip or zlib header, detected; -15: raw deflate
        out = inflate(body, 47) if coding != "deflate" else inflate(body, 15)
        if out is None and coding == "deflate":
            out = inflate(body, -15)
        if out is None and body.lstrip()[:1] in (b"{", b"["):  # a plain JSON body under a wrong label: read as is
            continue
        if out is None:
            raise EndpointError(f"engineer endpoint {url} sent a {coding} body that does not decompress (truncated "
                                "or not that coding)")
        body = out
    return body


def chat_endpoint(base_url: str, model: str, api_key_env: str | None, temperature: float, max_tokens: int,
                  timeout_s: float, usage: Usage | None = None, proxy: str | None = None,
                  ca_bundle: str | None = None) -> ReplyFn:
    """A reply function that POSTs to `{base_url}/chat/completions` (`post_json`: one deadline per request, a bounded
    read, no redirects). Each answered call is added to `usage` (its `usage` field's tokens, the seconds it took). The
    API key never appears in what it raises (a server that echoes the Authorization header in its error body would
    have put it in run.db's notes and the report)."""
    headers = {"Content-Type": "application/json"}
    key = None
    if api_key_env:
        key = os.environ.get(api_key_env)
        if not key:
            raise EndpointError(f"the engineer's API key variable {api_key_env} is not set: export it, or drop "
                                "api_key_env for an endpoint without auth (vllm serve's default)")
        headers["Authorization"] = f"Bearer {key}"
    url = base_url.rstrip("/") + "/chat/completions"

    def redact(text: str) -> str:
        return text.replace(key, "***") if key else text

    def reply(messages: Messages, attempt: int) -> str:
        try:
            return ask(messages)
        except EndpointError as exc:
            raise EndpointError(redact(str(exc)), exc.transient, exc.retry_after) from None

    def ask(messages: Messages) -> str:
        t0 = time.perf_counter()
        status, payload, meta = 0, None, {}
        try:
            status, raw = post_json(url, {"model": model, "messages": messages, "temperature": temperature,
                                          "max_tokens": max_tokens}, headers, timeout_s, proxy=proxy,
                                    verify=str(Path(ca_bundle).expanduser()) if ca_bundle else True, meta=meta)
            try:
                payload = json.loads(raw.decode("utf-8")) if status < 400 else None
            except (UnicodeDecodeError, ValueError, RecursionError):
                payload = None
            if isinstance(payload, dict) and "error" in payload and "choices" not in payload:
                status = status if status >= 400 else 502  # an error object sent with 200: not an answer
        finally:  # a call that failed or ran out its deadline was waited for too
            if usage is not None:
                usage.add(time.perf_counter() - t0, *_usage_of(payload),
                          answered=payload is not None and status < 400)
        if status >= 400:
            body = json.dumps(payload["error"])[:200] if isinstance(payload, dict) and "error" in payload else \
                raw[:200].decode("utf-8", "replace")
            raise EndpointError(f"engineer endpoint {url} answered HTTP {status}: {body}",
                                transient=status == 429 or status >= 500, retry_after=_retry_after(meta.get("retry_after")))
        if payload is None:
            raise EndpointError(f"engineer endpoint {url} did not return UTF-8 JSON")
        try:
            content = payload["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise EndpointError(f"engineer endpoint {url} returned no choices[0].message.content") from None
        # `vllm serve --reasoning-parser` puts the thinking apart (`reasoning_content`; newer servers drop the field
        # name's suffix) and leaves content null when the budget ran out before the answer
        if content is None:
            message = payload["choices"][0]["message"]
            thought = next((v for v in (message.get("reasoning_content"), message.get("reasoning")) if isinstance(v, str)),
                           None)
            if isinstance(thought, str):  # even empty: a one-token reply that was only `<think>`, parsed away
                return f"<think>{thought}"  # an unclosed think block: a recorded rejection naming engineer.max_tokens
        if not isinstance(content, str):
            raise EndpointError(f"engineer endpoint {url} returned non-text content")
        out = Reply(content)
        out.truncated = payload["choices"][0].get("finish_reason") == "length"
        return out

    return reply


# --- a local transformers checkpoint ----------------------------------------------------------------------------------


def local_model(path: Path, temperature: float, max_tokens: int, seed: int = 0, usage: Usage | None = None) -> ReplyFn:
    """A reply function that samples from a local checkpoint (e.g. the current policy). Loaded once, on CPU/GPU. Each
    call is added to `usage` (the prompt's and the generated token ids, the seconds it took)."""
    import torch

    from policies.model import format_prompt, load_policy

    model, tok = load_policy(str(path))
    model.eval()

    def reply(messages: Messages, attempt: int) -> str:
        t0 = time.perf_counter()
        text = "\n\n".join(m["content"] for m in messages)
        prompt = format_prompt(tok, text)
        ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
        max_pos = getattr(model.config, "max_position_embeddings", 4096)
        new = min(max_tokens, max_pos // 2)
        ids = {k: v[:, -(max_pos - new):] for k, v in ids.items()}  # too long: keep the end (schema, rules, ask)
        torch.manual_seed(seed + attempt)
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=new, do_sample=temperature > 0,
                                 temperature=max(temperature, 1e-5), pad_token_id=tok.pad_token_id)
        read = ids["input_ids"].shape[1]
        if usage is not None:
            usage.add(time.perf_counter() - t0, int(read), int(out.shape[1] - read))
        text = Reply(tok.decode(out[0, read:], skip_special_tokens=True))
        text.truncated = out.shape[1] - read >= new  # stopped at the budget, not at its end of text
        return text

    return reply
