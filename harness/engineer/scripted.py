"""The scripted engineer: replies read from a file, one round per stage, for tests and replays of recorded runs.

YAML: a list, item i = the reply for stage i. JSONL: one line per stage. A round's reply is either a proposal object
(`{"candidates": [...]}`), a raw reply string (validated like an LLM's text, so malformed replies can be scripted),
or a list of those: successive attempts, the later ones used as retries after a rejection. A stage with `null` (or
beyond the end of the script) has no reply: the rule engineer steps in.

    # replay.yaml
    - {candidates: [{knob: recipe.temperature, value: 0.7, rationale: "parse errors", expected: "fewer"}]}
    - ["not json", {candidates: [{knob: recipe.temperature, value: 1.2, rationale: r, expected: e}]}]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.engineer.llm import EndpointError, Messages, ReplyFn
from sandbox.yamlload import YamlError, load_yaml_text


class ScriptError(ValueError):
    """A script file that cannot be read."""


def load_script(path: Path) -> list[Any]:
    path = Path(path)
    if not path.is_file():
        raise ScriptError(f"engineer script {path} not found: give a .yaml/.yml or .jsonl file of replies")
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        try:
            data = load_yaml_text(text, f"engineer script {path}")
        except YamlError as exc:
            raise ScriptError(str(exc)) from None
        if not isinstance(data, list):
            raise ScriptError(f"engineer script {path}: the YAML must be a list (one reply per stage)")
        return data
    if path.suffix == ".jsonl":
        rounds = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rounds.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ScriptError(f"engineer script {path} line {n}: not JSON ({exc.msg}); each line is one stage's "
                                  "reply (an object, a string, or a list of attempts)") from None
            except (RecursionError, ValueError) as exc:  # nesting past Python's stack, a number past int's digit limit
                raise ScriptError(f"engineer script {path} line {n}: JSON this reader cannot hold "
                                  f"({type(exc).__name__}: {str(exc)[:120]}); shorten that line") from None
        return rounds
    raise ScriptError(f"engineer script {path}: unknown extension {path.suffix!r}; use .yaml, .yml or .jsonl")


def scripted_replies(path: Path, stage: int) -> ReplyFn:
    """A reply function returning the scripted attempts of `stage`, in order."""
    rounds = load_script(path)
    entry = rounds[stage] if 0 <= stage < len(rounds) else None
    attempts = entry if isinstance(entry, list) else [entry]

    def reply(messages: Messages, attempt: int) -> str:
        if attempt >= len(attempts) or attempts[attempt] is None:
            raise EndpointError(f"engineer script {path} has no reply for stage {stage} attempt {attempt}")
        a = attempts[attempt]
        return a if isinstance(a, str) else json.dumps(a)

    return reply
