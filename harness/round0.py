"""The round-0 harness: the files a new run's harness repo starts from, how a harness tree reads as typed models, and
the judge a run fixes at its start.

    files = initial_files(config)                       # template + the run config's env / recipe / reward overrides
    env, recipe, shaping = harness_models(files, task)  # typed views of a harness tree (env.yaml, recipe.yaml)
    judge = make_judge(config, files)                   # backtest.env / samples / temperature (round-0 defaults)

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


def make_judge(config: RunConfig, files: dict[str, str]):
    """The backtest judge of a run from its config and its round-0 harness `files`: backtest.env (default the round-0
    env), backtest.samples, backtest.temperature and backtest.max_new_tokens (default the round-0 recipe's)."""
    from harness.backtest import Judge

    env, recipe, _ = harness_models(files, get_task(config.task))
    return Judge(env=config.backtest.env or env.model_dump(mode="json"), samples=config.backtest.samples,
                 temperature=config.backtest.temperature or recipe.temperature,
                 max_new_tokens=config.backtest.max_new_tokens or recipe.max_completion_length)


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
