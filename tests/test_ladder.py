"""Rung 2 of the learning ladder (harness/benchmarks/ladder.py) at full size: it runs in about a minute on 2 cores.

What it can catch: any break between sampler, reward and optimiser (a stale forward patch, a sign error in the
advantage, log-probs at the wrong temperature, prompts formatted differently for training and sampling) leaves the
copy rate near the warm start's 30-50%; the flipped-reward control catches a "pass" that comes from SFT momentum or
from the evaluation instead of from the reward.
"""

import pytest

from harness.benchmarks.ladder import rung2

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: faster for tiny models


def test_grpo_learns_the_copy_toy_and_unlearns_it_with_the_reward_flipped():
    # the bench's warm start and GRPO run, a shorter flipped control (unlearning is fast: 49% -> 20% in 30 steps). A
    # shorter warm start was tried and fails: from 300 SFT steps (37% or 47% sampled) 100 GRPO steps reach only 88%
    res = rung2(sft_steps=600, steps=100, flipped_steps=30)
    assert 0.3 <= res["start"]["sampled"] <= 0.5, res["start"]  # a partial warm start: room to learn
    assert res["grpo"]["sampled"] >= 0.9, res["grpo"]
    assert res["flipped"]["sampled"] < res["start"]["sampled"] - 0.1, res["flipped"]
    assert res["passed"]


def test_the_noisy_teacher_ignores_holes_and_nothing_else():
    """Rung 3's noisy teacher: the hole-blind plan is a well-formed plan for the same starts and goals that fails
    only by stepping into a hole (never a parse, conflict or goal failure), and `blind_share` of the demonstrations
    come from it. Caught: a blind planner that also broke conflicts or the format (a different habit to unlearn)."""
    import collections

    from harness.benchmarks.ladder import RUNG3_ENV, hole_blind_plan, noisy_teacher_pairs
    from harness.seeds import seeds
    from harness.tasks import get_task, score_all

    task = get_task("mapf")
    cfg = task.config_model.model_validate(RUNG3_ENV)
    insts = [task.generate(cfg, s) for s in seeds("train", 120)]
    outs = score_all(task, [(i, hole_blind_plan(i)) for i in insts], None)
    fails = collections.Counter(o.failure for o in outs if not o.valid)
    assert set(fails) == {"hole"}, fails
    assert 0.3 < sum(fails.values()) / len(insts) < 0.9  # it fails often, but not always
    pairs = noisy_teacher_pairs(task, cfg, seeds("train", 120), blind_share=0.6)
    blind = sum(p["completion"] == hole_blind_plan(i) != task.expert(i, "trace") for p, i in zip(pairs, insts))
    differ = sum(hole_blind_plan(i) != task.expert(i, "trace") for i in insts)
    assert 0.4 < blind / differ < 0.8  # about 60% of the demonstrations where the two teachers disagree
    assert pairs == noisy_teacher_pairs(task, cfg, seeds("train", 120), blind_share=0.6)  # reproducible
