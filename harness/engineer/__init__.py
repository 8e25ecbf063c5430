"""Who proposes harness changes: `rule` (default, no LLM), `llm` (OpenAI-compatible endpoint or a local checkpoint,
the current policy included), `scripted` (replies from a file). One entry point for all three:

    from harness.engineer import EngineerConfig, propose
    res = propose(EngineerConfig(kind="rule"), diagnosis, SkillLibrary.open(), max_candidates=2,
                  rng=np.random.default_rng(seed))
    res.candidates, res.engineer_used, res.notes, res.rejected_replies

LLM and scripted replies go through the same validation (`proposal.parse_reply`); an invalid reply is retried with the
reason appended up to `max_retries` times, then the rule engineer steps in and the reason is recorded in `notes`.
Tests: tests/test_engineer.py, tests/test_engineer_llm.py.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from harness.config import EngineerConfig
from harness.engineer.llm import (
    EndpointError,
    ReplyFn,
    Usage,
    build_messages,
    chat_endpoint,
    local_model,
    retry_message,
)
from harness.engineer.proposal import (
    EngineerUsage,
    Knob,
    ProposalError,
    ProposalResult,
    RejectedReply,
    change_key,
    continue_inconclusive,
    cut,
    knob_space,
    parse_reply,
    rejected_keys_from_history,
)
from harness.engineer.rule import propose_rule, untried_import
from harness.engineer.scripted import ScriptError, scripted_replies
from harness.records import Diagnosis

MAX_PROMPT_SKILLS = 8  # skills shown to an LLM engineer (in-family first, then other families')
TRANSIENT_BACKOFF_S = 8.0  # the longest pause before asking an unreachable, busy (429) or failing (5xx) endpoint again
MAX_RETRY_AFTER_S = 120.0  # the longest a server's Retry-After is waited for (a longer one: this long, then ask)

__all__ = ["EngineerConfig", "EngineerError", "ProposalResult", "change_key", "knob_space", "preflight", "propose"]


class EngineerError(ValueError):
    """An engineer configuration that cannot work (e.g. 'policy' as model_path without a policy checkpoint)."""


def _reply_fn(cfg: EngineerConfig, diagnosis: Diagnosis, policy_ckpt: Path | None, seed: int,
              usage: Usage | None = None) -> ReplyFn:
    if cfg.kind == "scripted":
        return scripted_replies(Path(cfg.script), diagnosis.stage)
    if cfg.base_url:
        return chat_endpoint(cfg.base_url, cfg.model, cfg.api_key_env, cfg.temperature, cfg.max_tokens, cfg.timeout_s,
                             usage, proxy=cfg.proxy, ca_bundle=cfg.ca_bundle)
    path = policy_ckpt if cfg.model_path == "policy" else Path(cfg.model_path)
    if path is None:
        raise EngineerError("engineer model_path 'policy' needs the current policy checkpoint (policy_ckpt)")
    return local_model(path, cfg.temperature, cfg.max_tokens, seed, usage)


PREFLIGHT_TRIES = 3  # tries of the start's one completion while the endpoint answers "busy" (429, 5xx, unreachable)


def backoff(exc: BaseException, attempt: int) -> float:
    """Seconds before asking again after a transient failure: the server's Retry-After where it sent one (at most
    `MAX_RETRY_AFTER_S`), else 1, 2, 4 ... capped at `TRANSIENT_BACKOFF_S`."""
    said = getattr(exc, "retry_after", None)
    if isinstance(said, int | float):
        return min(float(said), MAX_RETRY_AFTER_S)
    return min(2.0 ** attempt, TRANSIENT_BACKOFF_S)


PREFLIGHT_TIMEOUT_S = 60.0  # the longest a start waits for the endpoint's first word (engineer.timeout_s if shorter)


def preflight(cfg: EngineerConfig) -> str | None:
    """Why the configured engineer cannot answer, or None: what a run checks before anything trains, so an overnight
    run does not discover in the morning that every stage fell back to the rule engineer. An endpoint (`base_url`)
    gets one tiny chat completion (`max_tokens` 1, temperature 0) through the run's own client (`chat_endpoint`: the
    API key from its variable, a deadline, no redirects): that checks the address, the key and the model name at once
    (an unknown model is an HTTP error from vLLM and OpenAI alike). A local `model_path` must be a loadable
    checkpoint (`policies.model.check_checkpoint`: config, architecture, tokenizer; the weights are not read);
    'policy' is the run's own checkpoint, always there. The rule and scripted engineers need nothing here (a scripted
    file is checked by `start_run`)."""
    if cfg.kind != "llm":
        return None
    if cfg.base_url:
        last = None
        for attempt in range(PREFLIGHT_TRIES):  # a 429 or 503 at the start is asked again, as a stage would
            try:
                reply = chat_endpoint(cfg.base_url, cfg.model, cfg.api_key_env, 0.0, 1,
                                      min(cfg.timeout_s, PREFLIGHT_TIMEOUT_S), proxy=cfg.proxy, ca_bundle=cfg.ca_bundle)
                reply([{"role": "user", "content": "Reply with the word OK."}], 0)
                return None
            except EndpointError as exc:
                last = exc
                if not exc.transient or attempt + 1 == PREFLIGHT_TRIES:
                    break
                time.sleep(backoff(exc, attempt))
        return str(last)
    if cfg.model_path != "policy":
        from policies.model import PolicyLoadError, check_checkpoint

        try:
            check_checkpoint(cfg.model_path, training=False)  # it only generates: quantized is fine
        except PolicyLoadError as exc:
            return f"model_path: {exc}"
        except OSError as exc:
            return f"model_path {cfg.model_path!r}: {exc.strerror or exc}"
    return None


def propose(engineer_cfg: EngineerConfig, diagnosis: Diagnosis, skills_library: Any, max_candidates: int,
            rng: np.random.Generator, rejected_keys: set[str] | None = None, space: dict[str, Knob] | None = None,
            policy_ckpt: Path | None = None, usage: Usage | None = None) -> ProposalResult:
    """Candidates for this diagnosis. `skills_library` is a `skills.library.SkillLibrary` (its `applicable`). Changes
    rejected from the same harness state (history keys + `rejected_keys`) are never proposed again. Never raises for
    a bad engineer reply: the rule engineer steps in and `notes` says why. `usage`: where the calls' cost is summed
    (also `ProposalResult.usage`), the caller's own so a Ctrl-C mid-ask leaves it what was spent."""
    if max_candidates < 1:
        raise EngineerError(f"max_candidates must be >= 1, got {max_candidates}")
    space = space if space is not None else knob_space(diagnosis)
    rejected = rejected_keys_from_history(diagnosis) | set(rejected_keys or ())
    notes: list[str] = []
    bad: list[RejectedReply] = []
    usage = usage if usage is not None else Usage()  # the caller's: what was spent is known if the ask is stopped

    def spent() -> EngineerUsage:
        return EngineerUsage(calls=usage.calls, unreported=usage.unreported, prompt_tokens=usage.prompt_tokens,
                             completion_tokens=usage.completion_tokens, seconds=round(usage.seconds, 3))

    if engineer_cfg.kind != "rule":
        seed = int(rng.integers(0, 2**31 - 1))
        try:
            reply = _reply_fn(engineer_cfg, diagnosis, policy_ckpt, seed, usage)
        except EngineerError:  # the caller's mistake (no checkpoint for a policy engineer), not the engineer's
            raise
        except Exception as exc:  # noqa: BLE001 - an endpoint refused, a script or a checkpoint that cannot load, OOM
            reply = None
            what = "" if isinstance(exc, EndpointError | ScriptError) else f"{type(exc).__name__}: "
            notes.append(cut(f"{engineer_cfg.kind} engineer unavailable: {what}{exc}"))
        if reply is not None:
            hits = skills_library.applicable([f.code for f in diagnosis.findings], diagnosis.task)
            notes += [cut(n) for n in hits.skipped]
            retrieved = [(sk, False) for sk in hits.in_family] + [(sk, True) for sk in hits.fallback]
            retrieved.sort(key=lambda x: untried_import(x[0]))  # imports this library has not tried: the last slots
            messages = build_messages(diagnosis, space, max_candidates, retrieved[:MAX_PROMPT_SKILLS])
            if retrieved:
                notes.append(cut(f"skills in the prompt: {', '.join(sk.name + (' (borrowed)' if b else '') for sk, b in retrieved[:MAX_PROMPT_SKILLS])}"))
            for attempt in range(engineer_cfg.max_retries + 1):
                try:
                    text = reply(messages, attempt)
                except Exception as exc:  # noqa: BLE001 - any failure of the engineer costs its proposal, not the run
                    notes.append(cut(f"{engineer_cfg.kind} engineer attempt {attempt}: {type(exc).__name__}: {exc}"))
                    if getattr(exc, "transient", False) and attempt < engineer_cfg.max_retries:
                        time.sleep(backoff(exc, attempt))  # busy or failing: ask again, once calmer (Retry-After)
                        continue
                    break
                try:
                    cands, more = parse_reply(text, diagnosis, space, max_candidates, engineer_cfg.kind, rejected)
                except Exception as exc:  # noqa: BLE001 - ProposalError, or a reply that broke a check unexpectedly
                    reason = cut(exc if isinstance(exc, ProposalError) else f"{type(exc).__name__}: {exc}")
                    if getattr(text, "truncated", False):
                        reason = cut(f"{reason} (the reply stopped at engineer.max_tokens={engineer_cfg.max_tokens}: "
                                     "raise it, or answer shorter)")
                    shown = cut(text, 2000) if isinstance(text, str) else cut(repr(text), 2000)
                    bad.append(RejectedReply(attempt=attempt, reason=reason, reply=shown))
                    messages = messages + [{"role": "assistant", "content": shown},
                                           {"role": "user", "content": retry_message(reason)}]
                    continue
                cands, same = continue_inconclusive(diagnosis, cands)
                return ProposalResult(candidates=cands, engineer_used=engineer_cfg.kind,
                                      notes=notes + [cut(n) for n in more + same], rejected_replies=bad, usage=spent())
            if bad:
                notes.append(f"{engineer_cfg.kind} engineer gave no valid proposal in {len(bad)} attempt(s); last "
                             f"reason: {bad[-1].reason}")
        notes.append("rule engineer stepped in")

    hits = skills_library.applicable([f.code for f in diagnosis.findings], diagnosis.task)
    notes += [cut(n) for n in hits.skipped if cut(n) not in notes]
    cands, more = propose_rule(diagnosis, hits.in_family, hits.fallback, max_candidates, rng, space, rejected,
                               spread=engineer_cfg.spread)
    cands, same = continue_inconclusive(diagnosis, cands)
    return ProposalResult(candidates=cands, engineer_used="rule", notes=notes + more + same, rejected_replies=bad,
                          usage=spent())
