"""The vet step: cheap checks on a candidate BEFORE any training compute, ending in an offline backtest.

    from harness.vet import vet, apply_change
    res = vet(candidate, harness_files, task, cached_rollouts, shaping)
    res.ok, res.reason, res.stage, res.details     # res.files: the patched harness files when ok

What it checks, in order (the first failure rejects, with the reason):
1. schema (stage `vet`): the knob exists and is a leaf (or is `env.mixture`: the whole mixture's weights, one
   factor, through the task's `Mixture` capability; or `env.entry`: one keyed entry's fields set together, its
   weight kept), exactly one factor changes, the new value passes the typed
   model (the task's generator config for `env.*`, `policies.train.Recipe` plus the evolvable-knob ranges below for
   `recipe.*`, the task's shaping model for `reward.*`), a diagnostic compiles, defines `diagnose`, and keeps any
   `veto` the old file had (the gate only gets stricter).
2. offline backtest (stage `offline`) on the probe stage's cached rollouts:
   - diagnostic: runs in the sandbox runner within limits; must not flag solved trajectories (no warn/critical finding
     on the all-valid subset) and its veto must not block an unchanged arm nor an arm whose rollouts are all valid;
     a revision of an existing one must keep its finding codes and metrics and its behaviour: fire where the current
     version fires and block where its veto blocks, on the cached rollouts and on planted cases built from them;
   - reward shaping: every cached completion is re-scored under the old and the new shaping; rejected when the
     correlation between shaped reward and validity drops, or invalid rollouts outrank valid ones in more groups;
   - env: 16 instances are generated from each config the change touches (train seeds); a config that misses 3 of them
     fails here (fewer misses: the run draws those seeds from replacements, `harness.tasks.drawn.draw_replacing`).
"""

from __future__ import annotations

import ast
import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness import diagnostics as D
from harness.records import Candidate, Change, Rollout
from harness.seeds import seeds
from harness.tasks.base import Mixture, VetConfigs
from harness.tasks.knobs import ENTRY, MIXTURE, TARGET, WEIGHT, canonical_mixture, keyed_list, with_entry
from harness.yamledit import set_leaf_text
from sandbox.runner import Limits

# --- knobs a candidate may change ---------------------------------------------------------------------------------------

# Recipe knobs the loop may evolve, with sane ranges (stricter than policies.train.Recipe, which only says > 0).
# Anything else in the recipe (seed, SFT settings, engine) is not a factor a candidate may touch; nor is `steps`:
# an arm's length is the backtest budget, the same for both arms.
RECIPE_KNOBS: dict[str, tuple[float, float]] = {
    "learning_rate": (1e-7, 1e-2),
    "beta": (0.0, 1.0),
    "num_generations": (2, 64),
    "temperature": (0.1, 2.0),
    "top_p": (0.5, 1.0),
    "max_completion_length": (8, 4096),
    "epsilon": (0.01, 1.0),
    "num_iterations": (1, 8),
    "warmup_ratio": (0.0, 0.5),
    "weight_decay": (0.0, 0.5),
    "max_grad_norm": (0.01, 100.0),
    "reward_scale": (0.01, 100.0),
}
ENV_FILE, RECIPE_FILE = "env.yaml", "recipe.yaml"
CORR_DROP = 0.05  # a shaping change may lower corr(reward, valid) by at most this much
ENV_PROBE_INSTANCES = 16  # instances generated from each config a new env touches to prove it generates ...
ENV_PROBE_MISSES = 3  # ... failing on this many of them or more (at 4 instances and no misses allowed, a config that
# failed 45% of its seeds passed one time in eleven, then stopped a later stage at every resume)


class VetError(ValueError):
    """A change that cannot be applied (unknown knob, bad value, not one factor); `vet` turns it into a rejection."""


class VetResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ok: bool
    reason: str = Field(..., description="why it was rejected, or what it passed")
    stage: Literal["vet", "offline"] = Field("vet", description="the last stage reached: schema checks or offline")
    details: dict[str, Any] = Field(default_factory=dict, description="numbers behind the decision")
    files: dict[str, str] = Field(default_factory=dict, description="the changed harness files (path -> text), when ok")


# --- applying a change ---------------------------------------------------------------------------------------------


def _load_yaml(files: dict[str, str], path: str) -> dict[str, Any]:
    if path not in files:
        raise VetError(f"the harness has no {path}; a run's harness repo starts from sandbox/template")
    data = yaml.safe_load(files[path]) or {}
    if not isinstance(data, dict):
        raise VetError(f"{path} must be a YAML mapping, got {type(data).__name__}")
    return data


def _header(text: str) -> str:
    """Leading comment lines of a YAML file (kept when the file is rewritten)."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines) + ("\n" if lines else "")


def _dump_yaml(original: str, data: dict[str, Any]) -> str:
    return _header(original) + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)


def _edit_yaml(original: str, parts: list[str], value: Any, expect: dict[str, Any],
               same: Callable[[dict[str, Any]], bool] | None = None, entry_key: str | None = None) -> str:
    """`original` with one leaf changed in place (`harness.yamledit`: a one-line diff, comments kept), checked to load
    as `expect` (or to satisfy `same`); a file the round-trip edit cannot express is rewritten whole instead."""
    try:
        text = set_leaf_text(original, parts, value, entry_key)
        loaded = yaml.safe_load(text)
        if (same(loaded) if same is not None else loaded == expect):
            return text
    except (KeyError, ValueError, yaml.YAMLError):
        pass
    return _dump_yaml(original, expect)


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, bool | int | float | str)


def set_path(data: dict[str, Any], parts: list[str], value: Any, knob: str, entry_key: str | None = None) -> Any:
    """Set a leaf in nested dicts/lists with the one knob grammar (`harness.tasks.knobs`; lists are indexed by the
    task's `entry_key`). Returns the old value; raises VetError naming what is missing."""
    from harness.tasks.knobs import KnobError, set_value

    try:
        return set_value(data, parts, value, entry_key, knob=knob)
    except KnobError as exc:
        raise VetError(str(exc)) from None


def _check_value(knob: str, old: Any, value: Any) -> None:
    if not _is_scalar(value):
        raise VetError(f"knob {knob!r}: the new value must be one number or string, got {type(value).__name__} "
                       "(single factor: change one leaf at a time)")
    if value == old and type(value) is type(old):
        raise VetError(f"knob {knob!r} already is {old!r}: the change does nothing")
    if isinstance(value, float) and not math.isfinite(value):
        raise VetError(f"knob {knob!r}: {value} is not a finite number")


def _validation_msg(exc: ValidationError | ValueError) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors()[:3])
    return str(exc)


def _recipe_model() -> type[BaseModel]:
    from policies.train import Recipe  # the trainer's own model: recipe.yaml minus `reward` must validate

    return Recipe


def apply_change(files: dict[str, str], change: Change, task: Any) -> dict[str, str]:
    """Apply ONE change to the harness files and validate it; returns only the files it changed ({path: text}).
    Raises VetError with the reason (unknown knob, out of range, not a single factor, bad diagnostic)."""
    kind, knob = change.kind, change.knob
    if kind == "diagnostic":
        return _apply_diagnostic(files, change)
    if change.code is not None:
        raise VetError(f"a {kind} change carries a value, not code; put code only in a diagnostic change")
    prefix = f"{kind}."
    if not knob.startswith(prefix) or len(knob) == len(prefix):
        raise VetError(f"a {kind} change needs a knob `{kind}.<field>`, got {knob!r}")
    parts = knob[len(prefix):].split(".")
    if kind == "env":
        raw = _load_yaml(files, ENV_FILE)
        try:
            base = task.spec.config_model.model_validate(raw).model_dump(mode="json")
        except ValidationError as exc:
            raise VetError(f"{ENV_FILE} does not validate before the change: {_validation_msg(exc)}") from None
        if knob == MIXTURE:
            return {ENV_FILE: _apply_mixture(files[ENV_FILE], task.spec.config_model.model_validate(raw), change.value,
                                             task)}
        if knob == ENTRY:
            return {ENV_FILE: _apply_entry(files[ENV_FILE], task.spec.config_model.model_validate(raw), change.value,
                                           task)}
        if knob == TARGET:
            return {ENV_FILE: _apply_target(files[ENV_FILE], base, change.value, task)}
        old = set_path(base, parts, change.value, knob, task.spec.entry_key)
        _check_value(knob, old, change.value)
        try:
            task.spec.config_model.model_validate(base)
        except (ValidationError, ValueError) as exc:
            raise VetError(f"{knob} = {change.value!r} is out of the generator's range: {_validation_msg(exc)}") from None
        want = task.spec.config_model.model_validate(base).model_dump(mode="json")
        return {ENV_FILE: _edit_yaml(files[ENV_FILE], parts, change.value, base, same=lambda d: isinstance(d, dict) and
                                     task.spec.config_model.model_validate(d).model_dump(mode="json") == want,
                                     entry_key=task.spec.entry_key)}
    recipe = _load_yaml(files, RECIPE_FILE)
    if kind == "recipe":
        if len(parts) != 1 or parts[0] == "reward":
            raise VetError(f"knob {knob!r}: recipe knobs are flat, `recipe.<field>` (reward knobs are `reward.<field>`)")
        field = parts[0]
        model = _recipe_model()
        if field not in model.model_fields:
            raise VetError(f"knob {knob!r} does not exist; recipe knobs: {', '.join(sorted(RECIPE_KNOBS))}")
        if field not in RECIPE_KNOBS:
            raise VetError(f"knob {knob!r} is not an evolvable recipe knob; choose one of {', '.join(sorted(RECIPE_KNOBS))}")
        old = recipe.get(field, model.model_fields[field].default)
        _check_value(knob, old, change.value)
        lo, hi = RECIPE_KNOBS[field]
        if isinstance(change.value, bool) or not isinstance(change.value, int | float) or not lo <= change.value <= hi:
            raise VetError(f"{knob} = {change.value!r} is out of range: allowed {lo:g} .. {hi:g}")
        new = {**recipe, field: change.value}
        try:
            model.model_validate({k: v for k, v in new.items() if k != "reward"})
        except (ValidationError, ValueError) as exc:
            raise VetError(f"{knob} = {change.value!r} breaks the recipe: {_validation_msg(exc)}") from None
        return {RECIPE_FILE: _edit_yaml(files[RECIPE_FILE], [field], change.value, new)}
    if kind == "reward":
        if len(parts) != 1:
            raise VetError(f"knob {knob!r}: reward knobs are flat, `reward.<field>`")
        field = parts[0]
        shaping = dict(recipe.get("reward") or {})
        fields = task.spec.shaping_model.model_fields
        if field not in fields:
            raise VetError(f"knob {knob!r} does not exist; reward knobs of {task.name}: {', '.join(fields) or 'none'}")
        old = shaping.get(field, fields[field].default)
        _check_value(knob, old, change.value)
        shaping[field] = change.value
        try:
            task.spec.shaping_model.model_validate(shaping)
        except (ValidationError, ValueError) as exc:
            raise VetError(f"{knob} = {change.value!r} is out of range: {_validation_msg(exc)}") from None
        return {RECIPE_FILE: _edit_yaml(files[RECIPE_FILE], ["reward", field], change.value,
                                        {**recipe, "reward": shaping})}
    raise VetError(f"unknown change kind {kind!r}; one of env, recipe, reward, diagnostic")


def _apply_mixture(original: str, base: BaseModel, weights: Any, task: Any) -> str:
    """env.yaml re-weighted as a whole (`env.mixture`, the task's `Mixture` capability): each entry's weight edited in
    place where the file spells the entry (one line per changed weight, comments kept), else the file rewritten."""
    if not isinstance(task, Mixture):
        raise VetError(f"{MIXTURE}: task {task.name} has no weighted mixture to re-weight; change one knob instead")
    if not isinstance(weights, dict):
        raise VetError(f"{MIXTURE} takes a mapping {{<{task.spec.difficulty_slice}> value: weight}}, got "
                       f"{type(weights).__name__}")
    try:
        new = task.with_mixture(base, weights)
    except (ValidationError, ValueError) as exc:
        raise VetError(f"{MIXTURE} = {weights!r:.200} is not a valid mixture: {_validation_msg(exc)}") from None
    if canonical_mixture(task.mixture(new)) == canonical_mixture(task.mixture(base)):
        raise VetError(f"{MIXTURE} = {weights!r:.200} is the current mixture: the change does nothing")
    want = new.model_dump(mode="json")
    key = task.spec.entry_key
    lst = keyed_list(want, key)
    if lst is None:  # no keyed list to edit in place
        return _dump_yaml(original, want)
    old = {str(k): v for k, v in task.mixture(base).items()}
    return _edit_leaves(original, [([lst, str(e[key]), WEIGHT], e[WEIGHT]) for e in want[lst]
                                   if old.get(str(e[key])) != e[WEIGHT]], want, task)


def _edit_leaves(original: str, edits: list[tuple[list[str], Any]], want: dict[str, Any], task: Any) -> str:
    """env.yaml with each (path, value) edited in place (comments kept) when that yields exactly `want`, else the file
    rewritten to `want`."""
    text = original
    try:
        for parts, value in edits:
            text = set_leaf_text(text, parts, value, task.spec.entry_key)
        if task.spec.config_model.model_validate(yaml.safe_load(text)).model_dump(mode="json") == want:
            return text
    except (IndexError, KeyError, TypeError, ValueError, yaml.YAMLError):
        pass
    return _dump_yaml(original, want)


def _apply_entry(original: str, base: BaseModel, value: Any, task: Any) -> str:
    """env.yaml with one keyed entry's fields set together (`env.entry`, `harness.tasks.knobs.with_entry`): each field
    edited in place where the file spells it (comments kept), else the file rewritten."""
    key = task.spec.entry_key
    if not key:
        raise VetError(f"{ENTRY}: task {task.name}'s config has no keyed entries; change one knob instead")
    try:
        new, _ = with_entry(base, key, value)
    except ValidationError as exc:
        raise VetError(f"{ENTRY} = {value!r:.200} is out of the generator's range: {_validation_msg(exc)}") from None
    except ValueError as exc:
        raise VetError(str(exc)) from None
    want = new.model_dump(mode="json")
    lst = keyed_list(want, key)
    (slot, fields), = value.items()
    return _edit_leaves(original, [([lst, str(slot), f], v) for f, v in fields.items()], want, task)


def _apply_target(original: str, base: dict[str, Any], value: Any, task: Any) -> str:
    """env.yaml made the target's generator config as a whole (`env.target`): its header comments kept, the rest
    written from the validated config. The value is the config itself (the diagnosis' `TargetView.config`)."""
    if not isinstance(value, dict) or not value:
        raise VetError(f"{TARGET} takes the target's generator config (an object), got {value!r:.120}")
    try:
        want = task.spec.config_model.model_validate(value).model_dump(mode="json")
    except (ValidationError, ValueError) as exc:
        raise VetError(f"{TARGET}: the target config does not validate as {task.name}'s generator config: "
                       f"{_validation_msg(exc)}") from None
    if want == base:
        raise VetError(f"{TARGET}: the training env is the target already: the change does nothing")
    return _dump_yaml(original, want)


def _top_functions(tree: ast.Module) -> set[str]:
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


def _apply_diagnostic(files: dict[str, str], change: Change) -> dict[str, str]:
    path = change.knob
    try:
        D.diagnostic_name(path)
    except D.DiagnosticError as exc:
        raise VetError(str(exc)) from None
    if change.value is not None:
        raise VetError("a diagnostic change carries its source in `code`, not `value`")
    if not change.code or not change.code.strip():
        raise VetError(f"removing or emptying {path} is not allowed: diagnostics only add checks (the gate only gets "
                       "stricter); give the file's new source in `code`")
    try:
        tree = ast.parse(change.code, filename=path)
        compile(tree, path, "exec")  # compiles only; the code runs nowhere but the sandbox runner
    except SyntaxError as exc:
        raise VetError(f"{path} does not compile: line {exc.lineno}: {exc.msg}") from None
    except (ValueError, MemoryError, RecursionError) as exc:  # a null byte; nesting past the parser's stack (200k
        # unary minuses, 100k attribute lookups): before, these escaped and dropped the engineer's whole reply
        raise VetError(f"{path} does not compile: {type(exc).__name__}: {str(exc)[:120] or 'nested too deeply'}") \
            from None
    funcs = _top_functions(tree)
    if "diagnose" not in funcs:
        raise VetError(f"{path} must define a top-level `def diagnose(rollouts)` returning findings and metrics")
    if path in files:
        if files[path] == change.code:
            raise VetError(f"{path} is unchanged: the change does nothing")
        try:
            old_funcs = _top_functions(ast.parse(files[path]))
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            old_funcs = set()
        if "veto" in old_funcs and "veto" not in funcs:
            raise VetError(f"{path} drops its `veto`: vetoes may only be added (the gate only gets stricter)")
    return {path: change.code}


# --- the offline backtest ----------------------------------------------------------------------------------------------


def _corr(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 2 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return None
    return statistics.correlation(xs, ys)


def _inversions(rollouts: list[Rollout], rewards: list[float]) -> int:
    """Groups where some invalid rollout earns MORE than some valid one (it would get the higher advantage)."""
    by: dict[int, list[tuple[bool, float]]] = defaultdict(list)
    for r, x in zip(rollouts, rewards):
        by[r.group].append((r.valid, x))
    n = 0
    for g in by.values():
        valid = [x for ok, x in g if ok]
        invalid = [x for ok, x in g if not ok]
        if valid and invalid and max(invalid) > min(valid) + 1e-9:
            n += 1
    return n


def shaping_backtest(task: Any, rollouts: list[Rollout], old: BaseModel, new: BaseModel) -> VetResult:
    """Re-score every cached completion under the old and the new shaping and compare how reward tracks validity."""
    instances = [task.spec.instance_model.model_validate(r.instance) for r in rollouts]
    from harness.tasks import score_all

    pairs = [(i, r.completion) for i, r in zip(instances, rollouts, strict=True)]
    before, after = score_all(task, pairs, old), score_all(task, pairs, new)
    valid = [float(o.valid) for o in before]
    r0, r1 = [o.reward for o in before], [o.reward for o in after]
    c0, c1 = _corr(r0, valid), _corr(r1, valid)
    inv0, inv1 = _inversions(rollouts, r0), _inversions(rollouts, r1)

    def mean_where(rs: list[float], ok: bool) -> float | None:
        xs = [x for x, v in zip(rs, valid) if bool(v) == ok]
        return round(statistics.fmean(xs), 4) if xs else None

    details = {"n": len(rollouts), "valid_rate": round(statistics.fmean(valid), 4) if valid else 0.0,
               "corr_before": None if c0 is None else round(c0, 4), "corr_after": None if c1 is None else round(c1, 4),
               "inverted_groups_before": inv0, "inverted_groups_after": inv1,
               "reward_valid_before": mean_where(r0, True), "reward_valid_after": mean_where(r1, True),
               "reward_invalid_before": mean_where(r0, False), "reward_invalid_after": mean_where(r1, False),
               "rescored_mismatch": sum(o.valid != r.valid for o, r in zip(before, rollouts))}
    if c0 is not None and (c1 is None or c1 < c0 - CORR_DROP):
        return VetResult(ok=False, stage="offline", details=details, reason=(
            f"shaped reward tracks validity less: corr(reward, valid) drops from {c0:.3f} to "
            f"{'undefined (reward constant)' if c1 is None else f'{c1:.3f}'} on {len(rollouts)} cached rollouts "
            f"(invalid mean reward {details['reward_invalid_before']} -> {details['reward_invalid_after']}): it pays "
            "for something other than solving"))
    if inv1 > inv0:
        return VetResult(ok=False, stage="offline", details=details, reason=(
            f"invalid rollouts outrank valid ones in {inv1} groups (was {inv0}) under the new shaping: GRPO would "
            "push the policy toward failing plans"))
    if c0 is None:
        return VetResult(ok=True, stage="offline", details=details,
                         reason="offline backtest inconclusive (no mix of valid and invalid cached rollouts); passed")
    return VetResult(ok=True, stage="offline", details=details,
                     reason=f"re-scored {len(rollouts)} cached rollouts: corr(reward, valid) {c0:.3f} -> {c1:.3f}, "
                            f"inverted groups {inv0} -> {inv1}")


def planted_sets(rollouts: list[Rollout]) -> list[tuple[str, list[Rollout]]]:
    """Rollout sets where a diagnostic has something to find, built from the cached rollouts: the rollouts themselves,
    their failures alone, every rollout turned into a failure (reward kept), and every rollout turned into a failure
    paid more than any cached rollout (reward hacking). A planted failure takes the commonest cached failure type."""
    kinds = [r.failure for r in rollouts if not r.valid and r.failure]
    kind = max(sorted(set(kinds)), key=kinds.count) if kinds else "planted_failure"
    top = max((r.reward for r in rollouts), default=0.0)

    def failed(r: Rollout, reward: float) -> Rollout:
        return r.model_copy(update={"valid": False, "optimal": False, "reward": reward,
                                    "failure": r.failure if not r.valid and r.failure else kind})

    out = [("the cached rollouts", rollouts)]
    if any(not r.valid for r in rollouts):
        out.append(("the failed cached rollouts", [r for r in rollouts if not r.valid]))
    out.append(("the cached rollouts all made failures", [failed(r, r.reward) for r in rollouts]))
    out.append(("the cached rollouts all made failures paid more than any valid one",
                [failed(r, top + 1.0) for r in rollouts]))
    return out


def planted_arms(rollouts: list[Rollout]) -> list[tuple[str, list[Rollout], list[Rollout]]]:
    """(label, control, candidate) arms a veto exists to block, built from the cached rollouts: a candidate whose
    rollouts all fail, and one whose rollouts all fail yet earn more reward (against the cached control and against
    an all-valid one)."""
    sets = dict(planted_sets(rollouts))
    failed = sets["the cached rollouts all made failures"]
    hacked = sets["the cached rollouts all made failures paid more than any valid one"]
    solved = [r.model_copy(update={"valid": True, "optimal": True, "failure": None}) for r in rollouts]
    return [("a candidate arm whose rollouts all fail", rollouts, failed),
            ("a candidate arm paid more for failing (reward hacking)", rollouts, hacked),
            ("a candidate arm paid more for failing, against an all-valid control", solved, hacked)]


def _fired(res: D.DiagnosticResult) -> dict[str, tuple[int, float]]:
    """Finding code -> (largest count, largest rate) over the findings that fire (count or rate above zero)."""
    out: dict[str, tuple[int, float]] = {}
    for f in res.findings:
        if f.count > 0 or f.rate > 0:
            c, r = out.get(f.code, (0, 0.0))
            out[f.code] = (max(c, f.count), max(r, f.rate))
    return out


def revision_backtest(path: str, source: str, old_source: str, rollouts: list[Rollout],
                      limits: Limits | None = None) -> str | None:
    """Behaviour, not names: on the cached rollouts and on planted sets built from them (`planted_sets`), wherever
    the current version fires a finding (count or rate above zero) the revision must fire it too, with a count
    (rate) above zero where the current one had one; wherever the current veto blocks a planted arm
    (`planted_arms`), the revised veto must block it too. Returns why the revision is refused, naming what it stopped
    detecting, or None. Both versions run in the sandbox runner."""
    name = D.diagnostic_name(path)
    for label, rs in planted_sets(rollouts):
        old = D.run_evolved(path, old_source, rs, limits)
        fired = _fired(old) if old.error is None else {}
        if not fired:
            continue
        new = D.run_evolved(path, source, rs, limits)
        if new.error:
            return (f"{path} revises an existing diagnostic but fails on {label} ({len(rs)} rollouts), where the "
                    f"current version reports {sorted(fired)}: {new.error}")
        now = _fired(new)
        lost = [f"{code} (count {c}, rate {r:.2f})" for code, (c, r) in sorted(fired.items())
                if code not in now or (c > 0 and now[code][0] == 0) or (r > 0 and now[code][1] == 0)]
        if lost:
            return (f"{path} revises an existing diagnostic but no longer detects {', '.join(lost)} on {label} "
                    f"({len(rs)} rollouts): the current version fires there and the revision reports nothing or a "
                    "count of zero; existing checks may be extended, not silenced")
    for label, ctrl, cand in planted_arms(rollouts):
        mc, mk = D.arm_metrics(ctrl), D.arm_metrics(cand)
        was = D.veto_one(path, old_source, ctrl, cand, mc, mk, limits)
        if not was or was.startswith(f"{name}: veto failed"):  # a broken old veto blocks by failing: nothing to keep
            continue
        if not D.veto_one(path, source, ctrl, cand, mc, mk, limits):
            return (f"{path} revises an existing veto that no longer blocks {label}, built from the "
                    f"{len(rollouts)} cached rollouts; the current version blocks it ({was[:200]}): vetoes may be "
                    "tightened, not relaxed")
    return None


def diagnostic_backtest(path: str, source: str, rollouts: list[Rollout], limits: Limits | None = None,
                        old_source: str | None = None) -> VetResult:
    """Run the diagnostic on cached rollouts in the sandbox; reject one that errors, flags solved trajectories, or
    vetoes an unchanged arm or an all-valid arm. A revision of an existing diagnostic (`old_source`) must still report
    what the old one reports on the same rollouts (every finding code and metric name), and still detect what it
    detects (`revision_backtest`: findings that fire, vetoes that block, on the cached rollouts and planted cases):
    existing checks are protected like vetoes, so a revision cannot silently remove one (a no-op, a veto that returns
    None, the old codes re-emitted with a count of zero)."""
    res = D.run_evolved(path, source, rollouts, limits)
    details: dict[str, Any] = {"n": len(rollouts), "findings": [f.code for f in res.findings], "metrics": res.metrics}
    if res.error:
        return VetResult(ok=False, stage="offline", details=details,
                         reason=f"{path} does not run on {len(rollouts)} cached rollouts in the sandbox: {res.error}")
    solved = [r for r in rollouts if r.valid]
    details["solved"] = len(solved)
    if solved:
        on_solved = D.run_evolved(path, source, solved, limits)
        if on_solved.error:
            return VetResult(ok=False, stage="offline", details=details,
                             reason=f"{path} fails on the {len(solved)} solved cached rollouts: {on_solved.error}")
        flags = [f for f in on_solved.findings if f.severity != "info"]
        if flags:
            f = flags[0]
            return VetResult(ok=False, stage="offline", details=details, reason=(
                f"{path} flags solved trajectories: {f.code} ({f.severity}, count {f.count}) fires on "
                f"{len(solved)} cached rollouts that are all valid"))
    full = D.arm_metrics(rollouts)
    arms = [("an unchanged arm (candidate = control)", rollouts, rollouts, full, full)]
    if solved:
        arms.append(("an arm whose rollouts are all valid", rollouts, solved, full, D.arm_metrics(solved)))
    for label, ctrl, cand, mc, mk in arms:
        block = D.veto_one(path, source, ctrl, cand, mc, mk, limits)
        if block:
            return VetResult(ok=False, stage="offline", details=details,
                             reason=f"{path} vetoes {label} on cached rollouts: {block}")
    if old_source is not None:
        old = D.run_evolved(path, old_source, rollouts, limits)
        if old.error is None:  # a broken old version reports nothing to keep
            lost = sorted({f.code for f in old.findings} - {f.code for f in res.findings})
            lost_metrics = sorted(set(old.metrics) - set(res.metrics))
            details["kept_from_old"] = {"findings": sorted({f.code for f in old.findings}),
                                        "metrics": sorted(old.metrics)}
            if lost or lost_metrics:
                what = "; ".join(x for x in (f"findings {lost}" if lost else "",
                                              f"metrics {lost_metrics}" if lost_metrics else "") if x)
                return VetResult(ok=False, stage="offline", details=details, reason=(
                    f"{path} revises an existing diagnostic but no longer reports {what} that the current version "
                    f"reports on the same {len(rollouts)} cached rollouts: existing checks may be extended, not "
                    "removed; keep them and add yours (or add a new diagnostics/<name>.py)"))
    why = revision_backtest(path, source, old_source, rollouts, limits) if old_source is not None else None
    if why:
        return VetResult(ok=False, stage="offline", details=details, reason=why)
    return VetResult(ok=True, stage="offline", details=details,
                     reason=f"{path} runs on {len(rollouts)} cached rollouts; flags no solved trajectory; "
                            "its veto (if any) lets unchanged and all-valid arms through")


def env_backtest(task: Any, env_text: str, knob: str) -> VetResult:
    """A new generator config must generate: `ENV_PROBE_INSTANCES` instances (train seeds, never held-out ones) from
    each config the task says the knob touches (its `VetConfigs` capability; e.g. one per touched entry, alone), else
    from the whole config. A config may miss a few seeds (the run draws those from replacement seeds of their split,
    `harness.tasks.drawn.draw_replacing`), but not `ENV_PROBE_MISSES` or more of them: a config that fails a quarter of
    its draws passes one time in five, one that fails half of them one time in 500 (binomial tails)."""
    from harness.tasks.drawn import misses

    cfg_all = task.spec.config_model.model_validate(yaml.safe_load(env_text))
    configs: list[tuple[str, Any]] = (task.vet_configs(cfg_all, knob) if isinstance(task, VetConfigs) else []) \
        or [("config", cfg_all)]
    missed = 0
    for label, cfg in configs:
        tried, failed = misses(task, cfg, seeds("train", ENV_PROBE_INSTANCES), ENV_PROBE_MISSES)
        if len(failed) >= ENV_PROBE_MISSES:
            first = min(failed)
            return VetResult(ok=False, stage="offline", details={"where": label, "failed": len(failed)},
                             reason=f"the new env config does not generate {label} instances: {len(failed)} of "
                                    f"{tried} seeds failed "
                                    f"(seed {first}: {failed[first]})")
        missed += len(failed)
    n = ENV_PROBE_INSTANCES * len(configs)
    return VetResult(ok=True, stage="offline", details={"generated": n - missed, "failed": missed},
                     reason=f"generated {n - missed} of {n} instances from the new config "
                            f"({', '.join(c[0] for c in configs)})")


# --- vet ---------------------------------------------------------------------------------------------------------


def _shaping_of(files: dict[str, str], task: Any) -> BaseModel:
    recipe = yaml.safe_load(files.get(RECIPE_FILE, "") or "") or {}
    return task.spec.shaping_model.model_validate(recipe.get("reward") or {})


def vet(candidate: Candidate, harness_files: dict[str, str], task: Any, cached_rollouts: list[Rollout],
        shaping: BaseModel | dict[str, Any] | None = None, limits: Limits | None = None) -> VetResult:
    """Schema checks, then the offline backtest on the probe stage's cached rollouts. Never raises for a bad candidate:
    the result says exactly why it was rejected. `shaping` is the shaping the cached rollouts were scored with
    (default: recipe.yaml's `reward:` section)."""
    change = candidate.change
    try:
        changed = apply_change(harness_files, change, task)
    except VetError as exc:
        return VetResult(ok=False, stage="vet", reason=str(exc), details={"knob": change.knob})
    if change.kind == "diagnostic":
        res = diagnostic_backtest(change.knob, change.code or "", cached_rollouts, limits,
                                  old_source=harness_files.get(change.knob))
    elif change.kind == "reward":
        old = shaping if isinstance(shaping, BaseModel) else (
            task.spec.shaping_model.model_validate(shaping) if shaping is not None else _shaping_of(harness_files, task))
        new = _shaping_of({**harness_files, **changed}, task)
        res = shaping_backtest(task, cached_rollouts, old, new)
    elif change.kind == "env":
        res = env_backtest(task, changed[ENV_FILE], change.knob)
    else:  # recipe: nothing to re-score offline; the schema and ranges were the check
        res = VetResult(ok=True, stage="vet", reason=f"{change.knob} = {change.value!r} passes the recipe model and "
                                                     "the evolvable-knob range")
    res.details.setdefault("knob", change.knob)
    if res.ok:
        res.files = changed
    return res
