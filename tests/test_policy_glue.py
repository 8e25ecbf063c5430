"""Task <-> policy glue on a toy task that satisfies the Task protocol (reverse a word): SFT pairs and GRPO rows only
from train seeds, the reward sees the instance, evaluation tables per slice, and a short train_policy stage.

    .venv/bin/pytest tests/test_policy_glue.py -q
"""

from __future__ import annotations

import random

import pytest
import torch
from pydantic import BaseModel, ConfigDict

from harness.policy_glue import (
    checkpoint_style,
    evaluate,
    grpo_rows,
    read_policy_meta,
    reward_fn,
    sft_pairs,
    suite_instances,
    train_policy,
)
from harness.seeds import SplitError, seeds, split_of
from harness.tasks.base import BatchScorer, EnvStats, Instance, Outcome, SuiteEntry, Task, TaskSpec, VetConfigs
from policies.model import load_policy
from policies.rollout import SamplingParams
from policies.train import Recipe


class RevConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    length: int = 3


class RevShaping(BaseModel):
    model_config = ConfigDict(extra="forbid")
    partial: float = 0.5


class RevInstance(Instance):
    word: str


class ReverseTask:
    """A family written against the Task protocol alone: a name, a spec and seven functions, no capability."""

    name = "rev"
    spec = TaskSpec(config_model=RevConfig, shaping_model=RevShaping, instance_model=RevInstance, styles=("plain",),
                    alphabet="abcd", round0_env="length: 3\n", failure_types=("wrong",))

    def default_config(self):
        return RevConfig()

    def generate(self, config, seed):
        rng = random.Random(seed)
        return RevInstance(task="rev", seed=seed, word="".join(rng.choice("abcd") for _ in range(config.length)))

    def prompt(self, instance, style="plain"):
        return instance.word

    def expert(self, instance, style="plain"):
        return instance.word[::-1]

    def score(self, instance, completion, shaping=None):
        shaping = shaping or RevShaping()
        ok = completion == instance.word[::-1]
        near = completion[:1] == instance.word[-1:]
        return Outcome(valid=ok, optimal=ok, reward=1.0 if ok else (shaping.partial if near else 0.0),
                       failure=None if ok else "wrong")

    def slices(self, instance):
        return {"length": str(len(instance.word)), "first": instance.word[0]}

    def suite(self, name):
        return [SuiteEntry(name="l3", config=RevConfig(length=3), n=6), SuiteEntry(name="l4", config=RevConfig(length=4), n=6)]


TASK = ReverseTask()


def test_the_small_protocol_is_enough():
    """What a newcomer writes for a family is the protocol and nothing the loop finds by `getattr`: the toy family has
    none of the optional capabilities and still satisfies `Task` (a required member added to the protocol fails this)."""
    assert isinstance(TASK, Task)
    assert not isinstance(TASK, (BatchScorer, EnvStats, VetConfigs))


def test_training_data_only_from_train_seeds_and_reward_sees_instance():
    cfg = TASK.default_config()
    pairs = sft_pairs(TASK, cfg, seeds("train", 5))
    assert all(p["completion"] == p["prompt"][::-1] for p in pairs)
    with pytest.raises(SplitError, match="held-out hygiene"):
        sft_pairs(TASK, cfg, seeds("test", 2))
    with pytest.raises(SplitError):
        grpo_rows(TASK, cfg, seeds("probe", 2))
    rows = grpo_rows(TASK, cfg, seeds("train", 3))
    r = reward_fn(TASK, RevShaping(partial=0.25))
    comps = [rows[0]["prompt"][::-1], rows[1]["prompt"][-1] + "zz", "zzz"]
    assert r([x["prompt"] for x in rows], comps, instance=[x["instance"] for x in rows]) == [1.0, 0.25, 0.0]


def test_an_imperfect_teacher_draws_its_share_of_demonstrations_reproducibly_and_a_family_without_one_refuses():
    """`sft_pairs(teacher_noise=p)` (a run's `warm_start.teacher_noise`): on MAPF each demonstration is the hole-blind
    plan with probability p, else the expert's; the same draws for the same seed, others for another; 0 is exactly the
    expert's list. Would catch noise ignored, applied to every pair, not seeded, or a family without an imperfect
    teacher silently trained on its expert alone."""
    from harness.tasks import get_task
    from harness.tasks.base import ImperfectTeacher
    from harness.tasks.mapf import hole_blind

    mapf = get_task("mapf")
    assert isinstance(mapf, ImperfectTeacher) and not isinstance(TASK, ImperfectTeacher)
    cfg = mapf.spec.config_model.model_validate({"sizes": [{"size": s, "agents": 2, "hole_ratio": 0.2}
                                                           for s in (3, 4, 5)]})
    sl = seeds("train", 240)
    insts = [mapf.generate(cfg, s) for s in sl]
    differ = [i for i, inst in enumerate(insts) if hole_blind(inst, "trace") != mapf.expert(inst, "trace")]
    assert len(differ) > 80  # enough boards where the two teachers disagree to count the share on
    clean = sft_pairs(mapf, cfg, sl, "trace")
    assert all(p["completion"] == mapf.expert(i, "trace") for p, i in zip(clean, insts))
    noisy = sft_pairs(mapf, cfg, sl, "trace", teacher_noise=0.6, noise_seed=3)
    assert [p["prompt"] for p in noisy] == [p["prompt"] for p in clean]
    blind = [i for i in differ if noisy[i]["completion"] == hole_blind(insts[i], "trace")]
    share = len(blind) / len(differ)
    assert 0.45 < share < 0.75, share  # 0.6 within about 3 standard errors at n > 80
    assert all(noisy[i]["completion"] in (mapf.expert(insts[i], "trace"), hole_blind(insts[i], "trace"))
               for i in range(len(sl)))
    assert noisy == sft_pairs(mapf, cfg, sl, "trace", teacher_noise=0.6, noise_seed=3)
    assert noisy != sft_pairs(mapf, cfg, sl, "trace", teacher_noise=0.6, noise_seed=4)
    with pytest.raises(ValueError, match="task 'rev' has no imperfect teacher"):
        sft_pairs(TASK, TASK.default_config(), seeds("train", 3), teacher_noise=0.5)
    with pytest.raises(ValueError, match=r"a share in \[0, 1\)"):
        sft_pairs(mapf, cfg, sl[:2], "trace", teacher_noise=1.0)


def test_suite_instances_are_test_split_and_distinct():
    insts = suite_instances(TASK, "small")
    assert len(insts) == 12 and all(split_of(i.seed) == "test" for i in insts)
    assert len({i.seed for i in insts}) == 12


def test_train_policy_then_evaluate_per_slice(tmp_path):
    torch.set_num_threads(2)
    recipe = Recipe(sft_steps=30, sft_batch_size=16, sft_learning_rate=3e-3, batch_size=8, num_generations=4,
                    max_completion_length=6, warmup_ratio=0.0)
    _, _, rep = train_policy(TASK, str(tmp_path / "ck"), preset="tiny", sft_examples=100, grpo_steps=2, recipe=recipe)
    assert rep.sft.loss[-1] < rep.sft.loss[0] and len(rep.grpo.steps) == 2 and rep.grpo_seeds == 4
    model, tok = load_policy(tmp_path / "ck")
    # the checkpoint records the task and style it was trained on; eval and --init pick the style up from there
    assert read_policy_meta(tmp_path / "ck") == {"task": "rev", "style": "plain"}
    assert checkpoint_style(TASK, tmp_path / "ck", tok) == "plain"
    report = evaluate(model, tok, TASK, suite_instances(TASK, "small"), params=SamplingParams(temperature=0,
                                                                                             max_new_tokens=6))
    assert report.n == 12 and set(report.by_slice) == {"length", "first"}
    assert report.by_slice["length"]["3"].n == 6 and report.by_slice["length"]["4"].n == 6
    assert sum(r.valid for r in report.rollouts) == round(report.valid * 12)
    assert report.failures.get("wrong", 0) == 12 - sum(r.valid for r in report.rollouts)
    assert all(r.slices and r.instance["word"] for r in report.rollouts)
