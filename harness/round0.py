"""The round-0 harness: the files a new run's harness repo starts from, how a harness tree reads as typed models, and
the judge a run fixes at its start.

    files = initial_files(config)                       # template + the run config's env / recipe / reward overrides
    env, recipe, shaping = harness_models(files, task)  # typed views of a harness tree (env.yaml, recipe.yaml)
    judge = make_judge(config, files)                   # backtest.env / samples / temperature / budget (round 0)

Used by the lifecycle (creating a run), the stage (`harness.graph`), the experiment and the calibration benchmark, so
they all start from the same round 0.
"""

from __future__ import annotations

from typing import Any

import yaml

from harness.config import RunConfig
from harness.tasks import get_task


def harness_models(files: dict[str, str], task) -> tuple[Any, Any, Any]:
    """(env config, Recipe, shaping) from the harness repo's env.yaml and recipe.yaml (its `reward:` section)."""
    from harness.backtest import read_harness

    return read_harness(files, task)


def make_judge(config: RunConfig, files: dict[str, str], notes: list[str] | None = None):
    """The backtest judge of a run from its config and its round-0 harness `files`: backtest.env (default the round-0
    env), backtest.samples, backtest.temperature and backtest.max_new_tokens (default the round-0 recipe's, fitted to
    the target's expert answers when it cuts them: `fit_budget`, whose warnings are appended to `notes`). Every path
    that judges (the live loop, the experiment's arms, the calibration) makes its judge here."""
    from harness.backtest import Judge

    env, recipe, _ = harness_models(files, get_task(config.task))
    judge = Judge(env=config.backtest.env or env.model_dump(mode="json"), samples=config.backtest.samples,
                  temperature=config.backtest.temperature or recipe.temperature,
                  max_new_tokens=config.backtest.max_new_tokens or recipe.max_completion_length)
    judge, said = fit_budget(config, judge, recipe.max_completion_length)
    if notes is not None:
        notes.extend(said)
    return judge


EXPERT_SAMPLE = 64  # target instances whose expert answers set the judge's completion budget at run start
BUDGET_MARGIN = 1.5  # the judge's budget when the round-0 one cuts expert answers: this times the longest (+ its end)
CUT_SHARE = 0.1  # a budget that cuts at least this share of the expert's answers is a defect worth a warning


def expert_tokens(config: RunConfig, env: Any) -> list[int] | None:
    """The expert's answers' lengths, in the policy's tokens plus one for the end, over EXPERT_SAMPLE instances of
    `env` (the judge's distribution; probe-split generator seeds: only these numbers leave the function) in the run's
    prompt style; None when the tokenizer cannot be had without loading a model (an endpoint, an unreadable
    checkpoint)."""
    task = get_task(config.task)
    try:
        if config.policy.checkpoint:
            from policies.model import load_tokenizer

            tok = load_tokenizer(config.policy.checkpoint)
        else:
            from policies.model import build_char_tokenizer

            tok = build_char_tokenizer(task.spec.alphabet, task.spec.words)
        from harness.seeds import seeds
        from harness.tasks.drawn import draw

        style = config.style
        return [1 + len(tok(task.expert(inst, style), add_special_tokens=False)["input_ids"])
                for inst in draw(task, env, seeds("probe", EXPERT_SAMPLE))]
    except Exception:  # noqa: BLE001 - a length check, never a reason to refuse a run
        return None


def fit_budget(config: RunConfig, judge: Any, budget: int) -> tuple[Any, list[str]]:
    """The judge's completion budget checked against the target's expert answers at run start: (judge, warnings).
    When the round-0 recipe's `max_completion_length` (`budget`) cuts at least CUT_SHARE of them off (and `backtest.
    max_new_tokens` is not set), the judge scores with BUDGET_MARGIN x the longest instead, so a harness whose budget
    is too short is measured on whole answers and a longer budget can be seen to help; training keeps the round-0
    budget (the engineer may change it: `grpo.truncated`). An explicit `backtest.max_new_tokens` is kept as given,
    with a warning when it cuts them. A budget that cuts only a few of the longest answers changes nothing."""
    lengths = expert_tokens(config, judge.config(get_task(config.task)))
    notes: list[str] = []
    if not lengths:
        return judge, notes
    longest = max(lengths)

    def cut(limit: int) -> float:
        return sum(n > limit for n in lengths) / len(lengths)

    if cut(budget) >= CUT_SHARE:
        notes.append(f"the round-0 recipe's max_completion_length ({budget}) cuts off {cut(budget):.0%} of the "
                     f"expert's answers on the target (up to {longest} tokens with the end): training will score them "
                     "unfinished (the diagnosis reports it as grpo.truncated)")
    if cut(judge.max_new_tokens) >= CUT_SHARE:
        if config.backtest.max_new_tokens:
            notes.append(f"backtest.max_new_tokens ({judge.max_new_tokens}) cuts off {cut(judge.max_new_tokens):.0%} "
                         f"of the expert's answers on the target (up to {longest} tokens): the judge and the test set "
                         "will score cut-off answers")
        else:
            fitted = int(BUDGET_MARGIN * longest + 0.999)
            notes.append(f"the judge scores the target and the test set with {fitted} tokens per completion (not "
                         f"the round-0 recipe's {judge.max_new_tokens}, which cuts expert answers off); set "
                         "backtest.max_new_tokens to choose")
            judge = judge.model_copy(update={"max_new_tokens": fitted})
    return judge, notes


def template_files() -> dict[str, str]:
    """The starting harness as {path: text} (what `Workspace.files('main')` returns for a fresh run)."""
    from sandbox.workspace import TEMPLATE_DIR

    return {str(p.relative_to(TEMPLATE_DIR)): p.read_text(encoding="utf-8") for p in sorted(TEMPLATE_DIR.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def round0_files(config: RunConfig) -> dict[str, str]:
    """A run config's whole round-0 harness as {path: text}: the template with the config's overrides written in."""
    return {**template_files(), **initial_files(config)}


def initial_files(config: RunConfig) -> dict[str, str]:
    """The round-0 harness: the template, with the run config's env / recipe / reward overrides written in."""
    from sandbox.workspace import TEMPLATE_DIR

    files: dict[str, str] = {}
    tmpl_recipe = yaml.safe_load((TEMPLATE_DIR / "recipe.yaml").read_text()) or {}
    if config.env is not None:
        files["env.yaml"] = "# Round-0 generator config (from the run config).\n" + yaml.safe_dump(
            config.env, sort_keys=False)
    else:  # the family's own round-0 env.yaml
        files["env.yaml"] = get_task(config.task).spec.round0_env
    if config.recipe or config.reward:  # edited into the template in place: its comments stay next to each knob
        from harness.yamledit import set_leaf_text

        rec = {**tmpl_recipe, **config.recipe, "reward": {**(tmpl_recipe.get("reward") or {}), **config.reward}}
        text = (TEMPLATE_DIR / "recipe.yaml").read_text()
        try:
            for key, value in config.recipe.items():
                text = set_leaf_text(text, [key], value)
            for key, value in config.reward.items():
                text = set_leaf_text(text, ["reward", key], value)
        except (KeyError, ValueError):
            text = ""
        if yaml.safe_load(text or "{}") != rec:  # a template the round-trip edit cannot express: write it whole
            text = "# Round-0 training recipe (template + run config overrides).\n" + yaml.safe_dump(rec, sort_keys=False)
        files["recipe.yaml"] = text
    return files
