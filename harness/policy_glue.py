"""Glue between a Task and the policy layer: expert SFT pairs, GRPO rows, the reward function, and evaluation of a
policy on instances (scored rollouts + a per-slice table). `policies/` knows nothing of tasks; this file does both.

    from harness.tasks import get_task
    from harness.policy_glue import sft_pairs, grpo_rows, reward_fn, suite_instances, evaluate
    task = get_task("mapf")
    pairs = sft_pairs(task, task.default_config(), seeds("train", 500))
    report = evaluate(model, tok, task, suite_instances(task, "small"))
    print(report.valid, report.optimal); report.by_slice["size"]["3x3"].valid

Held-out hygiene: `sft_pairs` and `grpo_rows` refuse seeds outside the `train` split.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from harness.records import RewardBatch, Rollout
from harness.seeds import check_split, seeds
from harness.tasks.base import Instance, Task
from harness.tasks.drawn import draw

# --- training data ----------------------------------------------------------------------------------------------------


def _style(task: Task, style: str | None) -> str:
    return style or task.spec.styles[0]


POLICY_META = "evotrainer.json"  # written next to a checkpoint: which task and prompt style it was trained on


def write_policy_meta(path: str | Path, task: str, style: str) -> None:
    Path(path, POLICY_META).write_text(json.dumps({"task": task, "style": style}) + "\n")


def read_policy_meta(path: str | Path) -> dict[str, Any]:
    f = Path(path, POLICY_META)
    try:
        return json.loads(f.read_text()) if f.is_file() else {}
    except (OSError, ValueError):
        return {}


def checkpoint_style(task: Task, path: str | Path, tok) -> str:
    """The prompt style to use with a checkpoint: the one it was trained on (its evotrainer.json), else chat for a
    model with a chat template, else the task's default char-model style."""
    from policies.model import has_chat_template

    meta = read_policy_meta(path)
    if meta.get("task") == task.name and meta.get("style") in task.spec.styles:
        return meta["style"]
    return "chat" if has_chat_template(tok) and "chat" in task.spec.styles else task.spec.styles[0]


def sft_pairs(task: Task, config: BaseModel, seed_list: list[int], style: str | None = None,
              teacher_noise: float = 0.0, noise_seed: int = 0) -> list[dict[str, str]]:
    """Expert demonstrations `{"prompt", "completion"}` on train-split seeds. `teacher_noise` > 0: each comes from
    the task's imperfect teacher (`harness.tasks.base.ImperfectTeacher`) with that probability instead, one uniform
    draw per seed in order from `numpy.random.default_rng(noise_seed)` (reproducible); a family without one raises.
    An instance whose expert answer is empty (no reference answer to demonstrate) is left out."""
    from harness.tasks.base import ImperfectTeacher

    check_split(seed_list, "train")
    style = _style(task, style)
    if not 0.0 <= teacher_noise < 1.0:
        raise ValueError(f"teacher_noise {teacher_noise}: a share in [0, 1)")
    if teacher_noise and not isinstance(task, ImperfectTeacher):
        raise ValueError(f"teacher_noise {teacher_noise}: task {task.name!r} has no imperfect teacher (a family "
                         "opts in with an `imperfect` method); use 0")
    rng = np.random.default_rng(noise_seed) if teacher_noise else None
    out = []
    for s, inst in zip(seed_list, draw(task, config, seed_list), strict=True):
        noisy = rng is not None and rng.random() < teacher_noise
        completion = task.imperfect(inst, style) if noisy else task.expert(inst, style)
        if completion:  # an instance with no demonstration (no reference answer): trained on by RL only
            out.append({"prompt": task.prompt(inst, style), "completion": completion})
    if seed_list and not out:
        raise ValueError(f"none of the {len(seed_list)} {task.name} instances drawn has a demonstration (their "
                         "datasets give no reference answer): warm-start on an env that has them (warm_start.env), or "
                         "start from a checkpoint (policy.checkpoint)")
    return out


def grpo_rows(task: Task, config: BaseModel, seed_list: list[int], style: str | None = None,
              instances: list[Instance] | None = None) -> list[dict[str, Any]]:
    """GRPO prompts on train-split seeds; the instance travels as JSON in the `instance` column to the reward.
    `instances` (already generated from `config` and `seed_list`, e.g. from a cache) skips the generation."""
    check_split(seed_list, "train")
    style = _style(task, style)
    if instances is None:
        instances = draw(task, config, seed_list)
    elif [i.seed for i in instances] != list(seed_list):
        raise ValueError("grpo_rows: instances do not match seed_list")
    return [{"prompt": task.prompt(inst, style), "instance": inst.model_dump_json()} for inst in instances]


def reward_fn(task: Task, shaping: BaseModel | None = None, record: list[RewardBatch] | None = None):
    """A TRL-style reward `(prompts, completions, instance, **kw) -> list[float]`: the task's shaped reward. With
    `record` (a list), every call appends a `RewardBatch`: each completion's instance seed, level (the instance's
    difficulty slice value), reward, validity and whether the task could check it, in the order scored."""

    def reward(prompts: list[str], completions: list[str], instance: list[str], **kw) -> list[float]:
        from harness.tasks import score_all

        cache: dict[str, Instance] = {}
        insts = [cache.get(raw) or cache.setdefault(raw, task.spec.instance_model.model_validate_json(raw))
                 for raw in instance]
        scored = score_all(task, list(zip(insts, completions, strict=True)), shaping)
        out = [o.reward for o in scored]
        if record is not None:
            key = task.spec.difficulty_slice
            fmt = set(task.spec.format_failures)
            record.append(RewardBatch(seeds=[i.seed for i in insts], rewards=out, valid=[o.valid for o in scored],
                                      checkable=[o.valid or o.failure not in fmt for o in scored],
                                      levels=[task.slices(i).get(key, "") if key else "" for i in insts]))
        return out

    reward.__name__ = f"{task.name}_reward"
    return reward


def task_texts(task_names: list[str] | None = None, n: int = 100, style: str = "chat") -> list[str]:
    """Prompts and expert completions of `n` train-split instances of each task family (default: all) in `style`
    (families without it use their first style): a corpus to train a tokenizer on, e.g. for
    `policies.chat_fixture.build_chat_fixture`."""
    from harness.tasks import TASKS, get_task

    out: list[str] = []
    for name in task_names or sorted(TASKS):
        task = get_task(name)
        st = style if style in task.spec.styles else task.spec.styles[0]
        cfg = task.default_config()
        for s in seeds("train", n):
            inst = task.generate(cfg, s)
            out += [task.prompt(inst, st), task.expert(inst, st)]
    return out


# --- evaluation -------------------------------------------------------------------------------------------------------


def suite_instances(task: Task, name: str, split: str = "test") -> list[Instance]:
    """The instances of a named benchmark suite (held-out `split` seeds, see `harness.tasks.suites.draw_suite`)."""
    from harness.tasks.suites import draw_suite

    return [inst for _, inst in draw_suite(task, name, split)]


def suite_blocks(task: Task, name: str, split: str = "test") -> list[str]:
    """The suite block name of each instance of `suite_instances` (same order), for a per-block slice."""
    from harness.tasks.suites import draw_suite

    return [block for block, _ in draw_suite(task, name, split)]


class SliceStat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int
    valid: float
    optimal: float


class EvalReport(BaseModel):
    """Scored rollouts of one policy on a list of instances, with overall and per-slice valid / optimal rates."""

    model_config = ConfigDict(extra="forbid")
    n: int
    valid: float
    optimal: float
    by_slice: dict[str, dict[str, SliceStat]] = Field(..., description="slice key -> slice value -> rates")
    failures: dict[str, int] = Field(default_factory=dict, description="failure code -> count")
    seconds: float
    new_tokens: int
    rollouts: list[Rollout] = Field(default_factory=list, repr=False)


def _stat(rs: list[Rollout]) -> SliceStat:
    n = len(rs)
    return SliceStat(n=n, valid=sum(r.valid for r in rs) / max(1, n), optimal=sum(r.optimal for r in rs) / max(1, n))


def summarize(rollouts: list[Rollout], seconds: float = 0.0, new_tokens: int = 0) -> EvalReport:
    by: dict[str, dict[str, list[Rollout]]] = {}
    fails: dict[str, int] = {}
    for r in rollouts:
        for k, v in r.slices.items():
            by.setdefault(k, {}).setdefault(v, []).append(r)
        if r.failure:
            fails[r.failure] = fails.get(r.failure, 0) + 1
    overall = _stat(rollouts)
    table = {k: {v: _stat(rs) for v, rs in sorted(vals.items())} for k, vals in sorted(by.items())}
    return EvalReport(n=overall.n, valid=overall.valid, optimal=overall.optimal, by_slice=table, failures=fails,
                      seconds=seconds, new_tokens=new_tokens, rollouts=rollouts)


def evaluate(model, tok, task: Task, instances: list[Instance], style: str | None = None, params=None,
             shaping: BaseModel | None = None, blocks: list[str] | None = None) -> EvalReport:
    """Roll the policy out on `instances` (greedy by default) and score every completion with the task's scorer.
    `blocks` (one name per instance, e.g. `suite_blocks`) adds a `block` slice to the table."""
    from policies.rollout import SamplingParams, generate

    style = _style(task, style)
    params = params or SamplingParams(temperature=0.0, max_new_tokens=256, batch_size=64)
    prompts = [task.prompt(inst, style) for inst in instances]
    from harness.tasks import score_all

    res = generate(model, tok, prompts, params)
    outcomes = score_all(task, [(instances[i], c) for i, c in zip(res.prompt_index, res.completions, strict=True)],
                         shaping)
    rollouts = []
    for k, comp in enumerate(res.completions):
        i = res.prompt_index[k]
        inst = instances[i]
        o = outcomes[k]
        rollouts.append(Rollout(
            seed=inst.seed, group=i, instance=json.loads(inst.model_dump_json()), prompt=prompts[i], completion=comp,
            valid=o.valid, optimal=o.optimal, reward=o.reward, failure=o.failure, where=o.where, metrics=o.metrics,
            slices={**task.slices(inst), **({"block": blocks[i]} if blocks else {})}, tokens=res.tokens[k],
        ))
    return summarize(rollouts, seconds=res.seconds, new_tokens=res.new_tokens)


def print_eval(report: EvalReport, title: str, console) -> None:
    """Per-slice valid/optimal table, then grep-able `valid:` and `optimal:` lines."""
    from rich.table import Table

    table = Table(title=f"{title}: {report.n} instances")
    for col in ("slice", "value", "n", "valid", "optimal"):
        table.add_column(col, justify="right" if col in ("n", "valid", "optimal") else "left")
    for key, vals in report.by_slice.items():
        for val, st in vals.items():
            table.add_row(key, val, str(st.n), f"{st.valid:.1%}", f"{st.optimal:.1%}")
    console.print(table)
    if report.failures:
        console.print("failures: " + ", ".join(f"{k}={v}" for k, v in sorted(report.failures.items())))
    console.print(f"valid: {report.valid:.4f}\noptimal: {report.optimal:.4f}\neval_s: {report.seconds:.1f}")


# --- a full policy stage: SFT warm start then GRPO ------------------------------------------------------------------


class TrainReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sft: Any = None  # policies.train.SFTMetrics
    grpo: Any = None  # policies.train.GRPOMetrics
    out_dir: str
    sft_seeds: int
    grpo_seeds: int


def train_policy(task: Task, out_dir: str, preset: str = "tiny", init: str | None = None,
                 config: BaseModel | None = None, sft_examples: int = 2000, grpo_steps: int = 40,
                 recipe=None, style: str | None = None, shaping: BaseModel | None = None,
                 progress=None) -> tuple[Any, Any, TrainReport]:
    """Build (or load `init`), SFT on expert demos of `sft_examples` train seeds, then GRPO for `grpo_steps` on fresh
    train seeds of `config`. Saves the final checkpoint to `out_dir`; returns `(model, tok, report)`."""
    from policies.model import build_model, check_checkpoint, load_policy, require_chat_template
    from policies.train import Recipe, train_grpo, train_sft

    recipe = recipe or Recipe()
    config = config or task.default_config()
    recipe = recipe.model_copy(update={"steps": grpo_steps}) if grpo_steps else recipe
    if init:
        check_checkpoint(init, style)  # architecture, tokenizer, template: one line before the weights load
        model, tok = load_policy(init)
        style = style or checkpoint_style(task, init, tok)
        require_chat_template(tok, str(init), style)
    else:
        model, tok = build_model(preset, task.spec.alphabet, words=list(task.spec.words), seed=recipe.seed)
        style = _style(task, style)
    sft = grpo = None
    if sft_examples > 0 and recipe.sft_steps > 0:
        pairs = sft_pairs(task, config, seeds("train", sft_examples), style)
        sft = train_sft(model, tok, pairs, recipe, progress=progress)
    n_rows = 0
    if grpo_steps > 0:
        n_rows = grpo_steps * recipe.prompts_per_step
        # GRPO prompts start after the SFT seeds: fresh train-split instances, never held-out ones
        rows = grpo_rows(task, config, seeds("train", n_rows, start=sft_examples), style)
        grpo = train_grpo(model, tok, rows, reward_fn(task, shaping), recipe, progress=progress)
    from policies.model import save_policy

    save_policy(model, tok, out_dir)
    write_policy_meta(out_dir, task.name, style)
    return model, tok, TrainReport(sft=sft, grpo=grpo, out_dir=str(out_dir), sft_seeds=sft_examples, grpo_seeds=n_rows)
