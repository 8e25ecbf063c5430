"""What an engineer may propose, and how a reply is checked: the Proposal schema, the knob space, validation.

A Proposal is a list of candidates; each is exactly ONE change (one env knob, one recipe knob, one diagnostic file, or
`env.mixture`: the whole training mix's weights at once, for a task with the `Mixture` capability) with its rationale, expected effect and targeted metric. Replies from an LLM or a script are text: `parse_reply`
extracts the JSON, checks it against the schema and the knob space, and either returns validated `Candidate`s or
raises `ProposalError` whose message says what was wrong (malformed JSON, unknown knob, out of range, two factors in
one candidate, ...) so it can be sent back to the engineer for a retry.

    from harness.engineer.proposal import knob_space, parse_reply
    space = knob_space(diagnosis)             # {"env.<field>": Knob(lo=0, hi=0.6, current=0.2), ...}
    cands, notes = parse_reply(text, diagnosis, space, max_candidates=3, engineer="llm")

The ranges are rules kept outside the sandbox: env and reward knobs take the bounds declared on the task's models;
recipe knobs take the vet step's ranges (`harness.vet.RECIPE_KNOBS`).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harness.records import Candidate, Change, Diagnosis, cut
from harness.tasks.knobs import ENTRY, MIXTURE, TARGET, canonical_mixture, entry_diff_text, with_entry

# --- errors -----------------------------------------------------------------------------------------------------------


class ProposalError(ValueError):
    """A reply that cannot become candidates. The message is the reason recorded and sent back to the engineer."""


# Bounds on what a reply may cost: work grows with a reply's length, and reasons are stored and sent back.
MAX_REPLY_CHARS = 200_000  # a longer reply is refused before any parsing
MAX_JSON_STARTS = 64  # '{' / '[' positions tried when looking for the JSON object in prose


# --- the schema the engineer answers in -------------------------------------------------------------------------------


class ProposedChange(BaseModel):
    """One candidate as the engineer writes it: one knob and its new value, or one diagnostic file."""

    model_config = ConfigDict(extra="forbid")
    knob: str = Field(..., max_length=200, description="ONE knob path from the allowed list (e.g. "
                      "env.<list>.<key>.<field>, recipe.temperature) or diagnostics/<name>.py for a diagnostic file")
    value: float | int | dict[str, float] | dict[str, dict[str, float | int | str | bool]] | str | None = Field(
        None, description="the NEW value (not a delta), within the knob's range; for env.mixture an object "
        "{slice value: weight} (the whole mix); for env.entry {slice value: {field: value}} (one entry's fields); "
        "for env.target the word \"target\" or \"frontier\" (the training env becomes the target's config, as the "
        "judge weighs it or weighted to the policy's frontier); omit for a diagnostic")
    code: str | None = Field(None, max_length=100_000, description="Python source of the diagnostic file; only for "
                             "diagnostics/<name>.py")
    rationale: str = Field(..., min_length=1, max_length=4000, description="which finding this addresses and why "
                           "this change helps")
    expected: str = Field(..., min_length=1, max_length=1000, description="the expected effect, one line")
    target_metric: str = Field("valid", max_length=100, description="the metric this change should move (valid, "
                               "optimal, ...)")

    @field_validator("value", mode="before")
    @classmethod
    def _no_booleans(cls, v: Any) -> Any:
        """true/false are not numbers: left to the union below they became 1.0 and 0.0 (a data ratio of 1, a weight
        of 1) before any later check could see them (an outside attack, seventieth session). An entry's own fields
        (`env.entry`, one level deeper) may still be booleans where the task's config has them."""
        if isinstance(v, bool):
            raise ValueError(f"{str(v).lower()} is not a knob value: write a number (or the mix / entry object)")  # noqa: TRY004 - pydantic reports ValueError
        if isinstance(v, dict) and any(isinstance(x, bool) for x in v.values()):
            raise ValueError("a weight of the mix is true/false: write a number for each slice value")
        return v

    @field_validator("rationale", "expected")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must say something (blank text)")
        return v.strip()

    @field_validator("value")
    @classmethod
    def _finite(cls, v: Any) -> Any:
        if isinstance(v, dict):
            for x in v.values():
                cls._finite(x)
            return v
        if v is None or isinstance(v, bool | str):  # a word (env.target's "target") has no magnitude to check
            return v
        try:
            ok = abs(float(v)) < 1e15
        except OverflowError:
            ok = False
        if not ok:
            raise ValueError("must be a finite number below 1e15 in magnitude")
        return v


class Proposal(BaseModel):
    """An engineer's whole reply: one or more single-factor candidates."""

    model_config = ConfigDict(extra="forbid")
    candidates: list[ProposedChange] = Field(..., min_length=1, description="single-factor candidates, best first")


class RejectedReply(BaseModel):
    model_config = ConfigDict(extra="forbid")
    attempt: int
    reason: str
    reply: str = Field("", description="the reply text, abbreviated")


class EngineerUsage(BaseModel):
    """What asking the engineer cost (`harness.engineer.llm.Usage`, summed over its attempts): charged to the compute
    ledger under kind `engineer`, apart from the policy's compute (the engineer is another model)."""

    model_config = ConfigDict(extra="forbid")
    calls: int = 0
    unreported: int = Field(0, description="calls whose reply named no token usage (their tokens are not counted)")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0


class ProposalResult(BaseModel):
    """What `propose` returns: validated candidates, who produced them, and why anything was dropped or replaced."""

    model_config = ConfigDict(extra="forbid")
    candidates: list[Candidate] = Field(default_factory=list)
    engineer_used: str = Field(..., description="rule | llm | scripted (rule when it stepped in for a failing engineer)")
    notes: list[str] = Field(default_factory=list)
    rejected_replies: list[RejectedReply] = Field(default_factory=list)
    usage: EngineerUsage = Field(default_factory=EngineerUsage, description="what asking the engineer cost (an llm "
                                 "engineer's calls, the rule engineer's stepping in included; the rule costs none)")


# --- the knob space ---------------------------------------------------------------------------------------------------

# Recipe knobs NOT offered to the engineer although the vet step accepts them: an arm's length is the backtest budget
# (the same for both arms), so a change of `steps` could never be judged.
NOT_BACKTESTABLE = {"steps"}

class Knob(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    path: str
    kind: Literal["env", "recipe", "reward"]
    lo: float
    hi: float
    integer: bool = False
    current: float | int


def _walk(model: BaseModel, prefix: str, kind: str, out: dict[str, Knob], entry_key: str | None = None) -> None:
    """Bounded numeric fields of a config model become knobs (`harness.tasks.knobs.walk`: the one grammar; keyed lists
    by the task's `entry_key`; ranges declared on the fields). Fields without a range are not offered."""
    from harness.tasks.knobs import walk

    for k in walk(model, prefix, entry_key):
        out[k.path] = Knob(path=k.path, kind=kind, lo=k.lo, hi=k.hi, integer=k.integer, current=k.current)


def knob_space(diagnosis: Diagnosis, task: Any = None) -> dict[str, Knob]:
    """Every knob the engineer may change from this diagnosis' state, with its range and current value: env knobs
    and reward knobs with the bounds declared on the task's models, recipe knobs with the vet step's ranges
    (`harness.vet.RECIPE_KNOBS`, one source of truth) minus those a fixed-budget backtest cannot judge."""
    from harness.tasks import get_task
    from harness.vet import RECIPE_KNOBS
    from policies.train import Recipe

    task = task if task is not None else get_task(diagnosis.task)
    out: dict[str, Knob] = {}
    if diagnosis.env_config:
        _walk(task.spec.config_model.model_validate(diagnosis.env_config), "env", "env", out, task.spec.entry_key)
    recipe = {k: v for k, v in diagnosis.recipe.items() if k != "reward"}
    current = Recipe.model_validate(recipe)
    for field, (lo, hi) in RECIPE_KNOBS.items():
        if field in NOT_BACKTESTABLE:
            continue
        if field == "epsilon" and current.loss_type == "cispo":  # cispo reads its own cap (epsilon_high) only: a
            continue  # change of epsilon would train both arms alike, a null experiment promoted on noise
        value = getattr(current, field)
        out[f"recipe.{field}"] = Knob(path=f"recipe.{field}", kind="recipe", lo=lo, hi=hi,
                                      integer=isinstance(value, int), current=value)
    _walk(task.spec.shaping_model.model_validate(diagnosis.recipe.get("reward") or {}), "reward", "reward", out)
    return out


def current_mixture(diagnosis: Diagnosis, task: Any = None) -> dict[str, float] | None:
    """The training mix's weights ({slice value: weight}, as written) when the task has the `Mixture` capability and
    the diagnosis carries its env config, else None: `env.mixture` is then not a knob."""
    from harness.tasks import Mixture, get_task

    task = task if task is not None else get_task(diagnosis.task)
    if not diagnosis.env_config or not isinstance(task, Mixture):
        return None
    return task.mixture(task.spec.config_model.model_validate(diagnosis.env_config))


def mixture_text(diagnosis: Diagnosis, task: Any = None) -> str:
    """The prompt line for the whole-mixture knob (empty when the task has none)."""
    from harness.tasks import get_task

    cur = current_mixture(diagnosis, task)
    if cur is None:
        return ""
    key = (task if task is not None else get_task(diagnosis.task)).spec.difficulty_slice
    return (f"- {MIXTURE}  current={json.dumps(canonical_mixture(cur))}  value: an object {{<{key}>: weight}}: the "
            f"WHOLE training mix re-weighted as ONE change (weights >= 0, normalised to sum 1; a {key} left out gets "
            f"weight 0; a new {key} adds an entry at its defaults). Use it to move the mix toward the target's "
            "failing slices, or toward what the policy can learn when the mix is too hard")


def entry_text(diagnosis: Diagnosis) -> str:
    """The prompt line for the whole-entry knob, when the target's entries differ from the mix's (else empty)."""
    view = diagnosis.target
    diffs = [s for s in (view.slices if view is not None else []) if s.entry_diff]
    if not diffs:
        return ""

    def scalar(pair: list[Any]) -> bool:
        return not any(isinstance(v, list | dict) for v in pair)

    # a field whose value is a list (a range) is not a value this knob takes: offered under env.target only
    # (an outside review: the prompt offered it and every reply that followed it was refused)
    said = {s.value: {f: p for f, p in s.entry_diff.items() if scalar(p)} for s in diffs}
    where = "; ".join(f"{view.slice_key} {v}: {entry_diff_text(d)}" for v, d in said.items() if d)
    if not where:
        return ""
    rest = sorted({f for s in diffs for f, p in s.entry_diff.items() if not scalar(p)})
    return (f"- {ENTRY}  value: an object {{<{view.slice_key}>: {{field: value, ...}}}}: ONE entry's fields set "
            f"together as ONE change (its weight kept), each a number. The mix's entries differ from the target's "
            f"here: {where}" + (f" (and in {', '.join(rest)}, a range this knob cannot write: {TARGET} takes the "
                                f"target's entries whole)" if rest else ""))


def target_text(diagnosis: Diagnosis) -> str:
    """The prompt line for the train-on-the-target knob, when the training env is not the target (else empty)."""
    view = diagnosis.target
    if view is None or view.config is None or not view.differs:
        return ""
    return (f"- {TARGET}  value: \"target\" or \"frontier\": the training env made the target's generator config as "
            "a whole, ONE change (every difference at once): train on what the policy is judged on (\"frontier\": "
            "its entries weighted to the slices the policy partly solves, the rest at a floor). The training env "
            f"differs from the target in {len(view.differs)} way(s): {'; '.join(view.differs)}")


def space_text(space: dict[str, Knob]) -> str:
    """The allowed knobs as prompt lines: `path  current=x  range=[lo, hi]  (integer)`."""
    return "\n".join(f"- {k.path}  current={k.current:g}  range=[{k.lo:g}, {k.hi:g}]" + ("  integer" if k.integer else "")
                     for k in space.values())


# --- keys, ids, candidates --------------------------------------------------------------------------------------------

DIAGNOSTIC_PATH = re.compile(r"^diagnostics/[a-z_][a-z0-9_]*\.py$")


def _norm(value: Any) -> Any:
    """A value as a change's key sees it: every number a float to 6 significant figures, nested ones too."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(f"{float(value):.6g}")
    if isinstance(value, dict):
        return {str(k): _norm(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_norm(v) for v in value]
    return value


def _canon(value: Any) -> str:
    """A value's spelling in a change's key: a number is keyed as a float to 6 significant figures whether it was
    written 2, 2.0 or 2.00000 (an int and a float of one value set the knob alike: before, `2` and `2.0` were two
    changes, so a refuted one came back respelt and got a fresh test instead of its pooled one)."""
    v = _norm(value)
    return repr(v) if isinstance(v, float) else json.dumps(v, sort_keys=True)


def _code_identity(code: str) -> str:
    """A diagnostic's source as its key sees it: its syntax tree, so a comment, a blank line or other spacing does
    not make a refuted diagnostic a new experiment (the source itself where it does not parse)."""
    import ast

    try:
        return ast.dump(ast.parse(code))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return code


def change_key(state: str, change: Change) -> str:
    """Identity of a change from one harness state: the same key twice means the same experiment twice."""
    if change.kind == "diagnostic":
        what = hashlib.sha1(_code_identity(change.code or "").encode()).hexdigest()[:12]
    elif change.knob == MIXTURE and isinstance(change.value, dict):
        try:  # two mixtures that draw the same distribution are the same experiment
            what = _canon(canonical_mixture(change.value))
        except ValueError:  # not a mixture (vet refuses it): keyed as written
            what = _canon(change.value)
    else:
        what = _canon(change.value)
    return f"{state}|{change.knob}|{what}"


def rejected_keys_from_history(diagnosis: Diagnosis) -> set[str]:
    """Keys of changes already rejected from the diagnosis' harness state (history items carry their `key`)."""
    prefix = f"{diagnosis.state}|"
    return {h.key for h in diagnosis.history if h.verdict == "rejected" and h.key.startswith(prefix)}


REFUTED_SAME = 1e-3  # a number this close (relative) to a rejected one of the knob, from the same state, is that change


def _refuted_nearby(diagnosis: Diagnosis, change: Change, rejected: set[str]) -> Any:
    """The value of a change rejected from this state (its key in `rejected`) of the same knob within REFUTED_SAME
    of `change`'s number, or None. `change_key` tells numbers apart to 6 significant figures, so 0.700001 was a fresh
    test of a refuted 0.7 (an outside attack, seventieth session): a hostile or careless engineer re-testing a refuted
    change by respelling it raises the false-promotion rate. A proposal continuing a step of the same intent is
    `continue_inconclusive`'s business, not this."""
    if change.knob == MIXTURE and isinstance(change.value, dict):  # a mixture within REFUTED_SAME (total variation)
        try:
            mix = canonical_mixture(change.value)
        except ValueError:
            return None
        for h in diagnosis.history:
            if h.verdict == "rejected" and h.knob == change.knob and h.key in rejected and isinstance(h.value, dict):
                try:
                    theirs = canonical_mixture(h.value)
                except ValueError:
                    continue
                if theirs != mix and _tv(mix, theirs) <= REFUTED_SAME + 1e-12:  # float sums of weights
                    return h.value
        return None
    mine = _number(change.value)
    if mine is None:
        return None
    for h in diagnosis.history:
        v = _number(h.value)
        if (h.verdict == "rejected" and h.knob == change.knob and h.key in rejected and v is not None and v != mine
                and abs(mine - v) <= REFUTED_SAME * max(abs(v), abs(mine))):
            return h.value
    return None


def refuted_same_intent(diagnosis: Diagnosis, change: Change, old: Any, rejected: set[str]) -> Any:
    """The value of a change of the same knob rejected from this state whose number `change`'s is near
    (`_near_number`: moved the same way, within NUM_SAME_RATIO), or None. A step sized to a finding's rate
    (`scale_with_rate`) lands on another number each stage the rate moves: 1.013 after a refuted 1.0 was a fresh test
    of the same intent (an outside review of the rule engineer), so the rule engineer goes on from the refuted one
    instead (`extend_spent`: a larger step, or nothing)."""
    mine = _number(change.value)
    if mine is None or change.kind == "diagnostic":
        return None
    before = _number(old)
    for h in diagnosis.history:
        v = _number(h.value)
        if (h.verdict == "rejected" and h.knob == change.knob and h.key in rejected and v is not None
                and _near_number(mine, before, v, _number(h.old))):
            return h.value
    return None


MIX_SAME_TV = 0.1  # a proposed mixture this close (total variation) to an inconclusive one continues its test
NUM_SAME_RATIO = 1.25  # a proposed number within this factor of an inconclusive one's, moved the same way, continues it


def _tv(a: dict[str, float], b: dict[str, float]) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in {*a, *b})


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def _near_number(new: float, old: float | None, earlier: float, earlier_old: float | None) -> bool:
    """Is `new` (from `old`) the same intent as an `earlier` proposal for the knob (from `earlier_old`): both moved
    it the same way, the two within NUM_SAME_RATIO of each other? Numbers of opposite signs, or a zero, are near only
    when equal."""
    before = earlier_old if earlier_old is not None else old
    if old is not None and before is not None and (new - old) * (earlier - before) <= 0:
        return False
    if new == earlier:
        return True
    if new * earlier <= 0:
        return False
    return max(new / earlier, earlier / new) <= NUM_SAME_RATIO


def _continuing(diagnosis: Diagnosis, c: Candidate, change: Change, cid: str, note: str) -> Candidate:
    """Candidate `c` proposed as earlier candidate `cid`'s `change`: that change's id for this stage, its rationale
    saying which test it continues and why."""
    fresh = make_candidate(diagnosis, change, c.old_value, "", c.expected, c.target_metric, c.engineer, c.skill)
    return c.model_copy(update={"id": fresh.id, "change": change,
                                "rationale": cut(f"{c.rationale} [continues {cid}: {note}]", 2000)})


def continue_numbers(diagnosis: Diagnosis, cands: list[Candidate]) -> tuple[list[Candidate], list[str]]:
    """A numeric proposal (a temperature, a rate, the completions per group) within NUM_SAME_RATIO of an inconclusive change of
    the same knob from the same harness state, moved the same way from the current value, whose estimate was positive
    becomes that change, verbatim (its `change_key`, so its new arm pair pools with the earlier evidence), as a mixture
    near one does (`continue_inconclusive`). Why: a skill that scales its step to the symptom proposes a slightly
    different number each stage (a code-family run: temperature 0.1 -> 0.7 at stage 1, +0.039 on one pair; then
    0.5948, then 0.6, each a fresh change decided on one pair, so no test of raising the temperature ever
    accumulated evidence). The nearest earlier number is taken (then the higher lower bound)."""
    earlier: list[tuple[str, float, float, str, Any, float | None]] = []  # knob, value, lower bound, candidate,
    # value as proposed, the knob's value before it
    for h in diagnosis.history:
        v = _number(h.value)
        if (h.verdict != "inconclusive" or v is None or h.effect is None or h.effect <= 0
                or h.key != change_key(diagnosis.state, Change(kind="recipe", knob=h.knob, value=h.value))):
            continue  # not a numeric change from this harness state with a positive estimate
        earlier.append((h.knob, v, h.ci[0] if h.ci else -1.0, h.candidate, h.value, _number(h.old)))
    if not earlier:
        return cands, []
    out, notes = [], []
    taken = {change_key(diagnosis.state, c.change) for c in cands}  # never two candidates of one change in a stage
    for c in cands:
        mine, old = _number(c.change.value), _number(c.old_value)
        near = [e for e in earlier
                if mine is not None and e[0] == c.change.knob and _near_number(mine, old, e[1], e[5])]
        if mine is None or not near or any(e[1] == mine for e in near):
            out.append(c)
            continue
        knob, v, _, cid, value, _ = min(near, key=lambda e: (abs(math.log(mine / e[1])), -e[2]))
        change = c.change.model_copy(update={"value": value})
        if change_key(diagnosis.state, change) in taken:
            out.append(c)
            continue
        taken.add(change_key(diagnosis.state, change))
        note = (f"{knob} {mine:g} is within a factor {NUM_SAME_RATIO:g} of {cid}'s {v:g}, moved the same way "
                f"(inconclusive, positive estimate): proposed as that change, so the new pair pools with its evidence")
        out.append(_continuing(diagnosis, c, change, cid, note))
        notes.append(note)
    return out, notes


def continue_inconclusive(diagnosis: Diagnosis, cands: list[Candidate]) -> tuple[list[Candidate], list[str]]:
    """A whole-mixture proposal within MIX_SAME_TV (total variation) of a mixture change from the same harness state
    whose test ended inconclusive with a positive estimate becomes that change, verbatim, so its new arm pair is
    pooled with the earlier evidence (`harness.decisions.pooled_evidence` pools by `change_key`). Why: a mixture is
    computed from the stage's target probe, whose per-slice rates move by a few points from stage to stage, so the same
    intent re-proposed is a slightly different change every stage and no test of it ever accumulates evidence (the
    too-hard run: 0.341/0.336/0.323, then 0.280/0.354/0.365, TV 0.06, each decided on one pair). Knob values an
    engineer sets by rule are the same each time and pool already. Returns the candidates and a note per change."""
    earlier: list[tuple[float, str, dict[str, float]]] = []
    for h in diagnosis.history:
        if (h.verdict != "inconclusive" or h.knob != MIXTURE or h.effect is None or h.effect <= 0
                or not isinstance(h.value, dict)
                or h.key != change_key(diagnosis.state, Change(kind="env", knob=MIXTURE, value=h.value))):
            continue  # not a mixture change from this harness state with a positive estimate
        try:
            earlier.append((h.ci[0] if h.ci else -1.0, h.candidate, canonical_mixture(h.value)))
        except ValueError:
            continue
    if not earlier:
        return continue_numbers(diagnosis, cands)
    out, notes = [], []
    for c in cands:
        if c.change.knob != MIXTURE or not isinstance(c.change.value, dict):
            out.append(c)
            continue
        try:
            mine = canonical_mixture(c.change.value)
        except ValueError:
            out.append(c)
            continue
        near = [(lo, cid, mix) for lo, cid, mix in earlier if _tv(mine, mix) <= MIX_SAME_TV]
        if not near or any(mine == mix for _, _, mix in near):
            out.append(c)
            continue
        _, cid, mix = max(near, key=lambda e: e[0])
        change = c.change.model_copy(update={"value": mix})
        note = (f"{MIXTURE} {json.dumps(mine)} is within total variation {_tv(mine, mix):.3f} of {cid}'s "
                f"{json.dumps(mix)} (inconclusive, positive estimate): proposed as that change, so the new pair pools "
                "with its evidence")
        out.append(_continuing(diagnosis, c, change, cid, note))
        notes.append(note)
    out, more = continue_numbers(diagnosis, out)
    return out, notes + more


def make_candidate(diagnosis: Diagnosis, change: Change, old_value: Any, rationale: str, expected: str,
                   target_metric: str, engineer: str, skill: str | None = None) -> Candidate:
    slug = re.sub(r"[^a-z0-9]+", "-", change.knob.lower()).strip("-")
    h = hashlib.sha1(change_key(diagnosis.state, change).encode()).hexdigest()[:6]
    return Candidate(id=f"s{diagnosis.stage}-{slug}-{h}", stage=diagnosis.stage, change=change, old_value=old_value,
                     rationale=rationale, expected=expected, target_metric=target_metric, skill=skill,
                     engineer=engineer)


# --- the vet step's own check, early ---------------------------------------------------------------------------------


def vet_error(diagnosis: Diagnosis, change: Change, task: Any = None) -> str | None:
    """Why `harness.vet.apply_change` would refuse this change on the diagnosis' harness (cross-field rules of the
    task's config model and the Recipe, e.g. batch_size vs num_generations), or None. Checked
    here so an engineer gets the reason while it can still retry. Needs the diagnosis' env config and recipe."""
    if not diagnosis.env_config:
        return None
    import yaml

    from harness.tasks import get_task
    from harness.vet import VetError, apply_change

    files = {"env.yaml": yaml.safe_dump(diagnosis.env_config), "recipe.yaml": yaml.safe_dump(diagnosis.recipe)}
    try:
        apply_change(files, change, task if task is not None else get_task(diagnosis.task))
    except VetError as exc:
        return str(exc)
    return None


# --- parsing a reply --------------------------------------------------------------------------------------------------

MULTI_KEYS = ("changes", "knobs", "values", "patch", "patches")


def extract_json(text: str) -> Any:
    """The JSON object holding `candidates` in `text`, else its first JSON object or array of objects (code fences
    and prose around it are ignored, so is JSON the prose quotes before the answer, e.g. the current mix; so is a
    leading `<think>...</think>` block, `harness.tasks.split_think`). Bounded: a reply over MAX_REPLY_CHARS, JSON
    nested too deeply or numbers too long to convert are ProposalErrors, never other exceptions."""
    if not isinstance(text, str):
        raise ProposalError(f"the reply is not text ({type(text).__name__})")
    if len(text) > MAX_REPLY_CHARS:
        raise ProposalError(f"reply too long ({len(text)} chars > {MAX_REPLY_CHARS}): reply with one short JSON object")
    from harness.tasks import split_think

    answer, think = split_think(text)  # a thinking model's draft JSON inside <think>...</think> is not its answer
    if think and not answer.strip():
        raise ProposalError(f"the reply is a <think> block ({think} chars) with no answer after it (never closed, or "
                            "nothing follows </think>): raise engineer.max_tokens, or reply with the JSON only")
    text = answer
    dec = json.JSONDecoder()
    first_error = None
    found: Any = None  # the first object or list of objects, when none holds `candidates`
    for n, m in enumerate(re.finditer(r"[\[{]", text)):
        if n >= MAX_JSON_STARTS:
            break
        try:
            obj, _ = dec.raw_decode(text, m.start())
        except json.JSONDecodeError as exc:
            first_error = first_error or exc
            continue
        except RecursionError:
            raise ProposalError("malformed JSON: nested too deeply; reply with one flat JSON object "
                                "{\"candidates\": [...]}") from None
        except (ValueError, OverflowError) as exc:  # e.g. an integer literal over Python's digit limit
            raise ProposalError(f"malformed JSON: {cut(exc, 200)}") from None
        if isinstance(obj, dict) and "candidates" in obj:
            return obj  # the answer itself, whatever JSON the prose quoted before it
        if found is None and (isinstance(obj, dict) or (isinstance(obj, list) and obj
                                                          and all(isinstance(o, dict) for o in obj))):
            found = obj
        if isinstance(found, dict) and "knob" not in found and _holds_knob(obj):
            found = obj  # a bare candidate (or list of them) after quoted JSON (the current mix) is the answer
    if found is not None:
        return found
    if first_error is not None:
        raise ProposalError(f"malformed JSON: {first_error.msg} at char {first_error.pos}; reply with one JSON "
                            "object {\"candidates\": [...]} and nothing else")
    raise ProposalError(f"malformed JSON: no JSON object found in the reply ({len(text)} chars); reply with one JSON "
                        "object {\"candidates\": [...]}")


def _holds_knob(obj: Any) -> bool:
    """A bare candidate, or a non-empty list of them: what a reply without `candidates` answers with."""
    if isinstance(obj, dict):
        return "knob" in obj
    return isinstance(obj, list) and bool(obj) and all(isinstance(o, dict) and "knob" in o for o in obj)


def _shape(obj: Any) -> list[Any]:
    if isinstance(obj, list):
        return obj
    if "candidates" in obj:
        if not isinstance(obj["candidates"], list):
            raise ProposalError("schema: 'candidates' must be a list of objects")
        extra = sorted(set(obj) - {"candidates"})
        if extra:
            raise ProposalError(f"schema: unknown top-level key(s) {extra}; only 'candidates' is allowed")
        return obj["candidates"]
    return [obj]  # a bare single candidate


def _check_single_factor(i: int, raw: Any) -> None:
    if not isinstance(raw, dict):
        raise ProposalError(f"schema: candidate #{i} must be an object, got {type(raw).__name__}")
    multi = [k for k in MULTI_KEYS if k in raw]
    knob, value = raw.get("knob"), raw.get("value")
    why = None
    if multi:
        why = f"it has {multi}"
    elif isinstance(knob, list):
        why = f"'knob' is a list of {len(knob)}"
    elif isinstance(value, list) or (isinstance(value, dict) and knob not in (MIXTURE, ENTRY, TARGET)):
        why = "'value' is a " + type(value).__name__ + (f" (only {MIXTURE}, {ENTRY} and {TARGET} take an object)"
                                                        if isinstance(value, dict) else "")
    elif isinstance(knob, str) and re.search(r"[,;+&]|\s(and)\s", knob):
        why = f"'knob' names several knobs: {cut(repr(knob), 80)}"
    if why:
        raise ProposalError(f"two factors in one candidate #{i}: {why}; propose each change as its own candidate "
                            "(single factor: one knob, one value)")


def _validate_mixture(i: int, pc: ProposedChange, diagnosis: Diagnosis) -> tuple[Change, Any]:
    cur = current_mixture(diagnosis)
    if cur is None:
        raise ProposalError(f"candidate #{i}: {MIXTURE} is not a knob of task {diagnosis.task} (its env config is no "
                            "weighted mixture); change one knob from the allowed list")
    if pc.code is not None:
        raise ProposalError(f"two factors in one candidate #{i}: a knob change with 'code'; drop 'code'")
    if not isinstance(pc.value, dict):
        raise ProposalError(f"candidate #{i}: {MIXTURE} needs an object value {{slice value: weight}}, e.g. "
                            f"{json.dumps(canonical_mixture(cur))}")
    try:
        value = canonical_mixture(pc.value)
    except ValueError as exc:
        raise ProposalError(f"candidate #{i}: {MIXTURE}: {exc}") from None
    if value == canonical_mixture(cur):
        raise ProposalError(f"candidate #{i}: {MIXTURE} = {json.dumps(value)} is the current mixture: no change")
    return Change(kind="env", knob=MIXTURE, value=value), cur


def _validate_entry(i: int, pc: ProposedChange, diagnosis: Diagnosis, space: dict[str, Knob]
                    ) -> tuple[Change, Any]:
    """`env.entry`: ONE entry made the target's, as one change (`entry_text` offers it only where the mix's entries
    differ from the target's). Its fields must be among those that differ and each set to the target's value: any
    other value is a bundle of free factors (three fields moved at will in one candidate), and a field's own value
    has its own knob. One field is that field's own knob, so it is keyed as it (a refuted change of that knob
    cannot come back as an entry)."""
    from harness.tasks import get_task
    from harness.tasks.knobs import keyed_list

    task = get_task(diagnosis.task)
    if not task.spec.entry_key or not diagnosis.env_config:
        raise ProposalError(f"candidate #{i}: {ENTRY} is not a knob of task {diagnosis.task} (no keyed entries); "
                            "change one knob from the allowed list")
    if pc.code is not None:
        raise ProposalError(f"two factors in one candidate #{i}: a knob change with 'code'; drop 'code'")
    view = diagnosis.target
    diffs = {s.value: s.entry_diff for s in (view.slices if view is not None else []) if s.entry_diff}
    if not diffs:
        raise ProposalError(f"candidate #{i}: {ENTRY} makes an entry the target's, and no entry of the mix differs "
                            "from the target's; change one field with its own knob")
    if isinstance(pc.value, dict) and len(pc.value) == 1:
        (key, fields), = pc.value.items()
        diff = diffs.get(str(key))
        if diff is None:
            raise ProposalError(f"candidate #{i}: {ENTRY} {key}: that entry is the target's already (entries that "
                                f"differ: {', '.join(diffs)}); change one field with its own knob")
        if isinstance(fields, dict):
            off = {f: v for f, v in fields.items() if f not in diff or not _same(v, diff[f][1])}
            if off:
                want = ", ".join(f"{f} {t}" for f, (_, t) in diff.items())
                raise ProposalError(f"candidate #{i}: {ENTRY} sets an entry's fields to the target's ({key}: {want}); "
                                    f"{cut(repr(off), 120)} is not that: change one field with its own knob")
            if len(fields) == 1:
                (f, v), = fields.items()
                lst = keyed_list(diagnosis.env_config, task.spec.entry_key)
                plain = f"env.{lst}.{key}.{f}"
                if plain in space:
                    return _validate_change(i, pc.model_copy(update={"knob": plain, "value": v}), space, diagnosis)
    try:
        _, old = with_entry(task.spec.config_model.model_validate(diagnosis.env_config), task.spec.entry_key, pc.value)
    except ValidationError as exc:
        raise ProposalError(f"candidate #{i}: {ENTRY} = {cut(repr(pc.value), 160)} is out of the generator's range: "
                            f"{cut(exc.errors()[0].get('msg', exc), 200)}") from None
    except ValueError as exc:
        raise ProposalError(f"candidate #{i}: {exc}") from None
    return Change(kind="env", knob=ENTRY, value=pc.value), old


def _same(a: Any, b: Any) -> bool:
    """One value written two ways (2 and 2.0; floats to 6 significant figures)."""
    return _norm(a) == _norm(b)


def _validate_target(i: int, pc: ProposedChange, diagnosis: Diagnosis) -> tuple[Change, Any]:
    """`env.target`: the value is the word "target" or "frontier" (`harness.engineer.aims.target_toward`; or the
    target's config itself); the change carries the config."""
    from harness.engineer.aims import TARGET_AIMS, target_change

    view = diagnosis.target
    if view is None or view.config is None:
        raise ProposalError(f"candidate #{i}: {TARGET} needs a run with a target (the judge's generator config); this "
                            "diagnosis has none")
    if pc.code is not None:
        raise ProposalError(f"two factors in one candidate #{i}: a knob change with 'code'; drop 'code'")
    aim = "target" if pc.value is None or pc.value == view.config else pc.value
    if aim not in TARGET_AIMS:
        raise ProposalError(f"candidate #{i}: {TARGET} takes the value \"target\" (the training env becomes the "
                            "target's config as a whole) or \"frontier\" (the target's entries weighted to what the "
                            f"policy partly solves), got {cut(repr(pc.value), 120)}")
    made = target_change(diagnosis, aim)
    if isinstance(made, str):
        raise ProposalError(f"candidate #{i}: {TARGET} = {aim!r}: {made}; no change")
    return made


def _validate_change(i: int, pc: ProposedChange, space: dict[str, Knob], diagnosis: Diagnosis | None = None
                     ) -> tuple[Change, Any]:
    if pc.knob.startswith("diagnostics/"):
        if not DIAGNOSTIC_PATH.match(pc.knob):
            raise ProposalError(f"unknown knob {pc.knob!r} in candidate #{i}: a diagnostic is diagnostics/<name>.py "
                                "with a lowercase snake_case name")
        if not pc.code or not pc.code.strip():
            raise ProposalError(f"candidate #{i} adds {pc.knob} but 'code' is empty: give the file's Python source")
        if pc.value is not None:
            raise ProposalError(f"two factors in one candidate #{i}: a diagnostic file with a 'value'; drop 'value'")
        try:
            compile(pc.code, pc.knob, "exec")
        except SyntaxError as exc:
            raise ProposalError(f"candidate #{i}: {pc.knob} does not compile: {exc.msg} (line {exc.lineno})") from None
        return Change(kind="diagnostic", knob=pc.knob, code=pc.code), None
    if pc.knob == MIXTURE and diagnosis is not None:
        return _validate_mixture(i, pc, diagnosis)
    if pc.knob == ENTRY and diagnosis is not None:
        return _validate_entry(i, pc, diagnosis, space)
    if pc.knob == TARGET and diagnosis is not None:
        return _validate_target(i, pc, diagnosis)
    if pc.knob not in space:
        names = [*space, *([MIXTURE] if diagnosis is not None and current_mixture(diagnosis) is not None else [])]
        near = difflib.get_close_matches(pc.knob, names, n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise ProposalError(f"unknown knob {cut(repr(pc.knob), 80)} in candidate #{i}{hint}; allowed knobs: "
                            f"{', '.join(sorted(names)) or '(none)'}")
    if pc.code is not None:
        raise ProposalError(f"two factors in one candidate #{i}: a knob change with 'code'; drop 'code'")
    k = space[pc.knob]
    v = pc.value
    if v is None or isinstance(v, bool | dict | str):
        raise ProposalError(f"candidate #{i}: {pc.knob} needs a numeric 'value' in [{k.lo:g}, {k.hi:g}]")
    if not k.lo <= v <= k.hi:
        raise ProposalError(f"out of range: {pc.knob} = {v:g} in candidate #{i}; allowed range [{k.lo:g}, {k.hi:g}] "
                            f"(current {k.current:g})")
    if k.integer:
        if float(v) != int(v):
            raise ProposalError(f"candidate #{i}: {pc.knob} takes an integer, got {v:g}")
        v = int(v)
    else:  # a float knob written as an int is that float (its file and its key alike)
        v = float(v)
    if v == k.current:
        raise ProposalError(f"candidate #{i}: {pc.knob} = {v:g} is its current value: no change")
    return Change(kind=k.kind, knob=pc.knob, value=v), k.current


def _dedupe_and_cap(raws: list[Any], max_candidates: int) -> tuple[list[Any], list[str]]:
    """Exact duplicates dropped and at most 3 x max_candidates kept, BEFORE any validation or vetting: work (and the
    vet step's offline checks) must not grow with the length of a reply."""
    keep, seen, dups = [], set(), 0
    limit = 3 * max_candidates
    for raw in raws:
        try:
            key = json.dumps(raw, sort_keys=True)
        except (TypeError, ValueError):
            key = repr(raw)
        if key in seen:
            dups += 1
            continue
        seen.add(key)
        keep.append(raw)
    notes = [f"{dups} duplicate candidate(s) dropped"] if dups else []
    if len(keep) > limit:
        notes.append(f"{len(keep) - limit} candidate(s) beyond the first {limit} ignored (max_candidates="
                     f"{max_candidates})")
        keep = keep[:limit]
    return keep, notes


def parse_reply(text: str, diagnosis: Diagnosis, space: dict[str, Knob], max_candidates: int, engineer: str,
                rejected_keys: set[str] | None = None) -> tuple[list[Candidate], list[str]]:
    """Validated candidates from a reply, plus notes on anything dropped (over the limit, duplicate knob, already
    rejected from this state). Raises `ProposalError` when the reply as a whole is unusable."""
    raws = _shape(extract_json(text))
    if not raws:
        raise ProposalError("schema: 'candidates' is empty; propose at least one change")
    raws, notes = _dedupe_and_cap(raws, max_candidates)
    for i, raw in enumerate(raws):
        _check_single_factor(i, raw)
    try:
        proposal = Proposal.model_validate({"candidates": raws})
    except ValidationError as exc:
        errs = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
        raise ProposalError(f"schema: {errs}") from None
    rejected = rejected_keys or set()
    out: list[Candidate] = []
    seen: set[str] = set()
    refused: list[str] = []  # why candidates failed validation: the reply's error if none is usable
    for i, pc in enumerate(proposal.candidates):
        if len(out) >= max_candidates:  # enough: what follows is neither validated nor vetted
            notes.append(f"{len(proposal.candidates) - i} candidate(s) from #{i} on dropped: over max_candidates="
                         f"{max_candidates}")
            break
        try:
            change, old = _validate_change(i, pc, space, diagnosis)
            if why := vet_error(diagnosis, change):
                raise ProposalError(f"candidate #{i} is refused by the vet step: {why}")
        except ProposalError as exc:  # one bad candidate costs itself, not the reply's good ones
            refused.append(str(exc))
            notes.append(cut(f"candidate #{i} dropped: {exc}"))
            continue
        if change.knob in seen:
            notes.append(f"candidate #{i} dropped: {change.knob} already proposed in this reply")
            continue
        if change_key(diagnosis.state, change) in rejected:
            notes.append(f"candidate #{i} dropped: {change.knob} -> {change.value} was already rejected from this state")
            continue
        if (was := _refuted_nearby(diagnosis, change, rejected)) is not None:
            notes.append(f"candidate #{i} dropped: {change.knob} -> {change.value} is {was} respelt (within "
                         f"{REFUTED_SAME:.0e} of it), already rejected from this state")
            continue
        seen.add(change.knob)
        out.append(make_candidate(diagnosis, change, old, pc.rationale, pc.expected, pc.target_metric, engineer))
    if not out and refused:
        raise ProposalError(refused[0] if len(refused) == 1 and len(proposal.candidates) == 1 else
                            cut(f"no usable candidate: {refused[0]}" + (f" (and {len(refused) - 1} more refused)"
                                                                       if len(refused) > 1 else "")
                                + ("; " + "; ".join(n for n in notes if "was already rejected" in n) if any(
                                    "was already rejected" in n for n in notes) else "")))
    if not out:
        raise ProposalError(cut("no usable candidate: " + "; ".join(notes)) + "; propose a different change")
    return out, notes
