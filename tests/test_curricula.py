"""The curriculum baselines of `harness.baselines`: SFL's learnability sampler and the DUMP/SEC bandit over levels.

    PYTHONPATH=. python -m pytest -q tests/test_curricula.py --durations=5

Their weight rules are pure functions checked on known numbers; then each runs through the stage's machinery
(`run_baseline`) on a real tiny MAPF policy with real GRPO: the bandit learns from its own training rollouts (its
counts are checked against the instances the stage's train pool holds, regenerated here), the learnability sampler
pays for its probes. Both re-weight the TARGET's levels (the run config's `backtest.env`), not the round-0 env's.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import yaml

from harness.baselines import (
    Bandit,
    BanditConfig,
    BaselineError,
    BaselineStage,
    Learnability,
    LearnabilityConfig,
    Provided,
    first_tokens_per_step,
    group_advantages,
    learnability_weights,
    run_baseline,
    ucb_weights,
)
from harness.records import RewardBatch

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: faster for tiny models

# --- the weight rules -------------------------------------------------------------------------------------------------


def test_learnability_weights_are_proportional_to_the_score_within_the_top_k():
    w = learnability_weights([0.0, 0.25, 0.09], top_k=None, rho=0.0)
    assert np.allclose(w, [0.0, 0.25 / 0.34, 0.09 / 0.34])  # proportional to p(1 - p), not to its rank
    w = learnability_weights([0.0, 0.25, 0.09], top_k=None, rho=0.3)
    assert np.allclose(w, [0.1, 0.7 * 0.25 / 0.34 + 0.1, 0.7 * 0.09 / 0.34 + 0.1])  # rho spreads 30% uniformly
    w = learnability_weights([0.1, 0.25, 0.09, 0.2], top_k=2, rho=0.0)
    assert np.allclose(w, [0.0, 0.25 / 0.45, 0.0, 0.2 / 0.45])  # only the two most learnable levels train
    w = learnability_weights([0.1, 0.25, 0.09, 0.2], top_k=1, rho=0.2)
    assert np.allclose(w, [0.05, 0.85, 0.05, 0.05])
    assert learnability_weights([0.0, 0.0, 0.0], top_k=None, rho=0.0) == [1 / 3] * 3  # nothing learnable: uniform
    assert learnability_weights([0.0, 0.0], top_k=1, rho=0.5) == [0.5, 0.5]
    assert np.allclose(learnability_weights([0.2, 0.1], top_k=5, rho=0.0), [2 / 3, 1 / 3])  # k above the levels: all


def test_ucb_weights_favour_unvisited_levels_and_higher_advantage():
    assert ucb_weights([0.0, 0.0, 0.0], [0, 0, 0], c=1.0, tau=0.2) == [1 / 3] * 3  # no observations: uniform
    assert ucb_weights([0.9, 0.5, 0.0], [10, 10, 0], c=1.0, tau=0.2) == [0.0, 0.0, 1.0]  # unvisited: +inf
    w = ucb_weights([0.2, 0.6], [10, 10], c=1.0, tau=0.2)
    assert w[1] > w[0] and abs(sum(w) - 1) < 1e-12  # same visits: the higher |advantage| gets more
    w = ucb_weights([0.3, 0.3], [20, 5], c=1.0, tau=0.2)
    assert w[1] > w[0]  # same value: the less visited gets more (exploration)
    assert ucb_weights([0.3, 0.3], [20, 5], c=0.0, tau=0.2) == [0.5, 0.5]  # c = 0: values only
    values, counts, c, tau = [0.1, 0.4], [4, 12], 0.7, 0.5
    score = [v + c * math.sqrt(2 * math.log(16) / n) for v, n in zip(values, counts, strict=True)]
    z = [math.exp(s / tau) for s in score]
    assert np.allclose(ucb_weights(values, counts, c, tau), [x / sum(z) for x in z])


def test_group_advantages_are_grpo_advantages_per_group():
    b = RewardBatch(seeds=[1, 1, 1, 1, 2, 2, 2, 2], levels=["3"] * 4 + ["4"] * 4,
                    rewards=[1.0, 0.0, 1.0, 0.0, 0.3, 0.3, 0.3, 0.3])
    std = math.sqrt(4 * 0.25 / 3)  # Bessel-corrected, as TRL's
    got = group_advantages([b], 4, "group")
    assert got[0][0] == "3" and abs(got[0][1] - 0.5 / (std + 1e-4)) < 1e-12
    assert got[1] == ("4", 0.0)  # rewards that tie: no advantage
    assert [a for _, a in group_advantages([b], 4, "none", reward_scale=2.0)] == [1.0, 0.0]
    batch_std = float(np.std(b.rewards, ddof=1))
    assert abs(group_advantages([b], 4, "batch")[0][1] - 0.5 / (batch_std + 1e-4)) < 1e-12
    mixed = RewardBatch(seeds=[1, 1, 2, 2], levels=["3"] * 4, rewards=[0.0, 1.0, 0.0, 1.0])
    with pytest.raises(BaselineError, match="mixes instances"):
        group_advantages([mixed], 4, "group")


# --- through the stage: a real tiny policy, real GRPO -----------------------------------------------------------------

ENTRY = {"hole_ratio": 0.2, "wait_ratio": 0.5, "agents": 2}
RUN = {
    "task": "mapf", "name": "c", "seed": 0, "policy": {"preset": "tiny"},
    "env": {"min_distance": 1, "sizes": [{"size": 3, "data_ratio": 1.0, **ENTRY}]},  # round 0: one level
    "warm_start": {"sft_examples": 64, "sft_steps": 20},
    "recipe": {"steps": 1, "batch_size": 8, "num_generations": 4, "learning_rate": 1e-4, "temperature": 0.7,
               "beta": 0.0, "max_completion_length": 24},
    "budget": {"stages": 2}, "stage": {"train_instances": 16, "probe_n": 4, "probe_samples": 2},
    # the target: two levels, which the samplers re-weight (the round-0 env has only one)
    "backtest": {"arm_steps": 1, "n": 8, "samples": 2,
                 "env": {"min_distance": 1, "sizes": [{"size": s, "data_ratio": 0.5, **ENTRY} for s in (3, 4)]}},
    "engineer": {"kind": "rule"}, "eval": {"suite": "small", "limit": 8},
}


def _open(tmp_path, name: str, **over):
    from harness.config import parse_config
    from harness.lifecycle import open_run

    return open_run(tmp_path / name, parse_config({**RUN, **over}, "test run config"))


def _sizes(provided: Provided) -> dict[int, float]:
    return {e["size"]: e["data_ratio"] for e in yaml.safe_load(provided.files["env.yaml"])["sizes"]}


def test_bandit_learns_from_its_own_training_rollouts(tmp_path):
    from harness.results import Trained
    from harness.round0 import harness_models
    from harness.stagebook import step_equivalents

    run = _open(tmp_path, "bandit", warm_start={"sft_examples": 64, "sft_steps": 80})
    try:
        (run.run_dir / "s0").mkdir()  # a stage checkpoint a kill left behind (between a stage's row and its cleanup)
        rows = run_baseline(run, Bandit(BanditConfig()), budget=6, name="bandit", say=lambda m: None)
        # every superseded stage checkpoint goes, not only the previous stage's: disk stays one checkpoint
        assert sorted(p.name for p in run.run_dir.glob("s[0-9]*")) == [f"s{len(rows)}"]
        p1, p2 = run.result(1, Provided), run.result(2, Provided)
        assert p1.weights == [0.5, 0.5] and _sizes(p1) == {3: 0.5, 4: 0.5}  # stage 1: uniform over the target's
        assert p1.state == {"values": {}, "counts": {}}
        assert p1.probe_tokens == p2.probe_tokens == 0 and all(r.probe_tokens == 0 for r in rows)
        assert step_equivalents(run.store, run.id)["judge_tokens"] == 0  # nothing generated but training
        # the groups stage 1 trained, per level, independently of the recorded rewards: the instances of the prefix
        # of its keyed train pool that its steps consumed (TRL goes through that prefix once), regenerated here
        env, recipe, _ = harness_models(p1.files, run.task)
        steps = len(run.result(1, Trained).steps)
        seeds = run.draw_seeds("train", RUN["stage"]["train_instances"], key="s1/train")
        used = seeds[: steps * recipe.prompts_per_step]
        per_level = Counter(str(run.task.generate(env, s).size) for s in used)
        assert p2.state["counts"] == dict(per_level) and sum(per_level.values()) == 6  # 3 steps x 2 groups
        assert set(p2.state["values"]) == set(per_level) and all(v >= 0 for v in p2.state["values"].values())
        # the values are the levels' mean |advantage| in the rollouts stage 1 trained on, and some are not 0 (with
        # a policy that never parses, every group ties and a bandit that ignored its rollouts passed: a review's
        # mutation, seventy-ninth session)
        from pathlib import Path

        from harness.records import read_reward_batches
        adv = group_advantages(read_reward_batches(Path(run.result(1, Trained).rewards)), recipe.num_generations,
                               recipe.scale_rewards, recipe.reward_scale)
        want = {lv: float(np.mean([a for x, a in adv if x == lv])) for lv in per_level}
        assert p2.state["values"] == pytest.approx(want) and any(v > 0 for v in want.values()), (want, p2.state)
        # not uniform: the levels' groups differ in number (so in UCB bonus), whatever their advantages
        assert abs(sum(p2.weights) - 1) < 1e-9 and max(abs(w - 0.5) for w in p2.weights) > 1e-3
        assert np.allclose(p2.weights, ucb_weights([p2.state["values"].get(k, 0.0) for k in ("3", "4")],
                                                   [p2.state["counts"].get(k, 0) for k in ("3", "4")], 1.0, 0.2))
        assert list(_sizes(p2)) == [3, 4]  # stage 2 trains on the target's levels, re-weighted
    finally:
        run.close()
        run.store.close()


def test_a_levels_learnability_is_its_instances_not_its_pooled_rate():
    """SFL scores an instance by p(1 - p) over its own samples: GRPO learns from the spread inside one prompt's group.
    A level half always and half never solved has no such spread (every group ties) yet its pooled rate scored the
    maximum 0.25, above a level every instance of which is solved 1 time in 4 (0.1875), and PLR gave it 79% of the
    mix (an outside review, seventy-ninth session). Would catch the pooled rate back."""
    from types import SimpleNamespace

    from harness.baselines import learnability, plr_weights

    def level(per_instance: list[list[bool]]):
        return [SimpleNamespace(seed=i, valid=v) for i, vs in enumerate(per_instance) for v in vs]

    split = level([[True] * 4] * 8 + [[False] * 4] * 8)
    quarter = level([[True, False, False, False]] * 16)
    assert learnability(split) == 0.0 and learnability(quarter) == pytest.approx(0.1875)
    assert plr_weights([learnability(split), learnability(quarter)], 0.3, 0.3)[1] > 0.5


def test_learnability_probes_the_target_levels_and_pays_for_it(tmp_path):
    from harness.stagebook import step_equivalents

    run = _open(tmp_path, "learn", budget={"stages": 1})
    try:
        cfg = LearnabilityConfig(probe_n=2, samples=2)
        run_baseline(run, Learnability(cfg), budget=2, name="learnability", say=lambda m: None)
        p = run.result(1, Provided)
        assert p.probe_tokens > 0
        assert step_equivalents(run.store, run.id)["judge_tokens"] == p.probe_tokens  # charged to the ledger
        assert set(p.state["rates"]) == {"3", "4"} and list(_sizes(p)) == [3, 4]  # the target's levels
        scores = list(p.state["scores"].values())
        assert np.allclose(p.weights, learnability_weights(scores, None, cfg.rho))
        # one stage: its probes come out of its own training (before, stage 1 deducted nothing and a one-stage arm
        # ended over budget by its probes: here 2 steps + the probes)
        assert p.probe_completions == 2 * 2 * 2  # two levels, two instances, two samples
        est = p.probe_tokens / first_tokens_per_step(p, run.task)
        row = run.result(1, BaselineStage)
        assert est > 0.5 and row.steps == max(1, round(2 - est)) < 2, (est, row.steps)
        assert abs(row.compute - 2) < 1.0, row.compute  # on its budget within the estimate's error
    finally:
        run.close()
        run.store.close()
