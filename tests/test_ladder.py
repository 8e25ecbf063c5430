"""Rung 2 of the learning ladder (harness/benchmarks/ladder.py) at full size: it runs in about a minute on 2 cores.

What it can catch: any break between sampler, reward and optimiser (a stale forward patch, a sign error in the
advantage, log-probs at the wrong temperature, prompts formatted differently for training and sampling) leaves the
copy rate near the warm start's 30-50%; the flipped-reward control catches a "pass" that comes from SFT momentum or
from the evaluation instead of from the reward.
"""

from harness.benchmarks.ladder import rung2


def test_grpo_learns_the_copy_toy_and_unlearns_it_with_the_reward_flipped():
    res = rung2(sft_steps=600, steps=100)
    assert 0.3 <= res["start"]["sampled"] <= 0.5, res["start"]  # a partial warm start: room to learn
    assert res["grpo"]["sampled"] >= 0.9, res["grpo"]
    assert res["flipped"]["sampled"] < res["start"]["sampled"] - 0.1, res["flipped"]
    assert res["passed"]
