"""The LLM engineer: an OpenAI-compatible chat endpoint (`vllm serve`, any /v1/chat/completions) or a local
transformers checkpoint, including the current policy checkpoint ("policy as engineer").

The prompt holds the Diagnosis text (raw failure evidence, history, round bookkeeping), the Proposal JSON schema and
the rules (single factor, allowed knobs and their ranges). A reply that fails validation is sent back with the reason
appended and retried up to `max_retries` times; after that the rule engineer steps in (see `harness.engineer.propose`).

    vllm serve Qwen/Qwen3-4B --port 8000      # elsewhere; then in the run config:
    engineer: {kind: llm, base_url: "http://127.0.0.1:8000/v1", model: "Qwen/Qwen3-4B"}

Only the standard library is used for HTTP (urllib). The API key, when needed, is read from the environment variable
named by `api_key_env`, never from a config file.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from harness.engineer.proposal import Knob, Proposal, space_text
from harness.records import Diagnosis

Messages = list[dict[str, str]]
ReplyFn = Callable[[Messages, int], str]  # (messages, attempt) -> reply text; raises EndpointError on transport failure


class EndpointError(RuntimeError):
    """The engineer could not be reached or answered with something that is not a chat completion."""


# --- the prompt -------------------------------------------------------------------------------------------------------

SYSTEM = ("You are the training-environment engineer of an RL run. You read a diagnosis of the policy's failures and "
          "propose single-factor changes to its training harness. You answer with ONE JSON object and nothing else.")

RULES = """Rules:
1. Single factor: each candidate changes exactly ONE knob (or adds/revises ONE diagnostic file). Never two knobs in
   one candidate; propose several candidates instead.
2. Use only the allowed knobs below, with a NEW value (not a delta) inside the knob's range; integer knobs take integers.
3. Address the failure evidence; preserve what already works (do not starve slices that are already solved).
4. Do not repeat a change the history shows was rejected from the same state.
5. A diagnostic file is diagnostics/<name>.py defining diagnose(rollouts) -> {"findings": [...], "metrics": {...}}
   and optionally veto(control, candidate) -> str | None; put its source in "code" and leave "value" out."""


def build_messages(diagnosis: Diagnosis, space: dict[str, Knob], max_candidates: int) -> Messages:
    from harness.diagnostics import diagnosis_text

    schema = json.dumps(Proposal.model_json_schema(), indent=1)
    user = (f"{diagnosis_text(diagnosis)}\n\nAllowed knobs (path, current value, range):\n{space_text(space)}\n\n"
            f"{RULES}\n\nPropose at most {max_candidates} candidate(s), best first. Reply with a JSON object matching "
            f"this schema:\n{schema}")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def retry_message(reason: str) -> str:
    return (f"Your reply was rejected: {reason}\nReply again with only the corrected JSON object "
            "{\"candidates\": [...]}, one knob per candidate, values inside the allowed ranges.")


# --- an OpenAI-compatible endpoint ------------------------------------------------------------------------------------


def chat_endpoint(base_url: str, model: str, api_key_env: str | None, temperature: float, max_tokens: int,
                  timeout_s: float) -> ReplyFn:
    """A reply function that POSTs to `{base_url}/chat/completions`."""
    headers = {"Content-Type": "application/json"}
    if api_key_env:
        key = os.environ.get(api_key_env)
        if not key:
            raise EndpointError(f"the engineer's API key variable {api_key_env} is not set: export it, or drop "
                                "api_key_env for an endpoint without auth (vllm serve's default)")
        headers["Authorization"] = f"Bearer {key}"
    url = base_url.rstrip("/") + "/chat/completions"

    def reply(messages: Messages, attempt: int) -> str:
        body = json.dumps({"model": model, "messages": messages, "temperature": temperature,
                           "max_tokens": max_tokens}).encode()
        req = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                payload = json.loads(resp.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            raise EndpointError(f"engineer endpoint {url} answered HTTP {exc.code}: "
                                f"{exc.read()[:200].decode('utf-8', 'replace')}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise EndpointError(f"engineer endpoint {url} unreachable: {exc}; is the server running?") from None
        except json.JSONDecodeError:
            raise EndpointError(f"engineer endpoint {url} did not return JSON") from None
        try:
            content = payload["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise EndpointError(f"engineer endpoint {url} returned no choices[0].message.content") from None
        if not isinstance(content, str):
            raise EndpointError(f"engineer endpoint {url} returned non-text content")
        return content

    return reply


# --- a local transformers checkpoint ----------------------------------------------------------------------------------


def local_model(path: Path, temperature: float, max_tokens: int, seed: int = 0) -> ReplyFn:
    """A reply function that samples from a local checkpoint (e.g. the current policy). Loaded once, on CPU/GPU."""
    import torch

    from policies.model import format_prompt, load_policy

    model, tok = load_policy(str(path))
    model.eval()

    def reply(messages: Messages, attempt: int) -> str:
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
        return tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)

    return reply
