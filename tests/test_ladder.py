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

    from harness.benchmarks.ladder import RUNG3_ENV
    from harness.policy_glue import sft_pairs
    from harness.seeds import seeds
    from harness.tasks import get_task, score_all
    from harness.tasks.mapf import hole_blind

    def hole_blind_plan(inst):
        return hole_blind(inst, "trace")

    def noisy_teacher_pairs(task, cfg, seed_list, blind_share):
        return sft_pairs(task, cfg, seed_list, "trace", teacher_noise=blind_share)

    task = get_task("mapf")
    cfg = task.spec.config_model.model_validate(RUNG3_ENV)
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


def test_the_learning_curve_reads_held_out_boards_with_the_clock_paused():
    """Rung 3's curve callback: nothing before `every_s` seconds of training, then one held-out reading whose seconds
    are added to the clock's start (so the budget and its annealing count training only), the model handed back in
    training mode, and the global RNG that training samples from left as it was. Caught: a reading that eats the
    training budget, leaves dropout-style eval mode on, or reseeds torch (the curve would change what it measures)."""
    import time

    import torch

    from harness.benchmarks.ladder import RUNG3_ENV, curve_callback, rung_eval
    from harness.seeds import seeds
    from harness.tasks import get_task
    from policies.model import build_model

    task = get_task("mapf")
    cfg = task.spec.config_model.model_validate(RUNG3_ENV)
    held = [task.generate(cfg, s) for s in seeds("test", 6)]
    model, tok = build_model("tiny", task.spec.alphabet, words=list(task.spec.words))
    before = rung_eval(model, tok, task, held)
    clock = type("Clock", (), {})()
    clock.t0 = time.perf_counter()
    curve = curve_callback(tok, task, held, before, every_s=30.0, clock=clock)
    state = type("State", (), {"global_step": 7})()
    model.train()
    curve.on_step_end(None, state, None, model=model)
    assert curve.points == [] and curve.paused == 0.0  # under 30 s of training: no reading
    clock.t0 -= 31.0  # 31 s of training have passed
    start, rng = clock.t0, torch.get_rng_state()
    curve.on_step_end(None, state, None, model=model)
    assert len(curve.points) == 1 and curve.points[0]["step"] == 7 and curve.points[0]["seconds"] >= 31.0
    assert curve.paused > 0 and clock.t0 == pytest.approx(start + curve.paused)
    assert model.training and torch.equal(torch.get_rng_state(), rng)
    assert curve.points[0]["valid"] == before["valid"] and curve.points[0]["effect"] == 0.0  # same weights, same read


def test_rung3_held_out_sets_per_family():
    """MAPF's rung keeps exactly the boards its measurements were taken on (100 2-agent boards of each size 3, 4, 5,
    20% holes, from test seeds 10,000, 11,000, 12,000 on); math's holds 200 two-term problems per digit count, from
    test seeds. Caught: a generalisation that silently moved MAPF's held-out boards (every earlier rung-3 figure would
    stop being comparable) or drew math's from another split."""
    import collections

    from harness.benchmarks.ladder import held_out
    from harness.seeds import seeds, split_of
    from harness.tasks import get_task

    mapf = get_task("mapf")
    boards = held_out(mapf, "mapf")
    assert [(b.seed, mapf.slices(b)["size"]) for b in boards] == [
        (s, str(size)) for i, size in enumerate((3, 4, 5)) for s in seeds("test", 100, start=10_000 + 1_000 * i)]
    assert {len(b.starts) for b in boards} == {2}
    math = get_task("math")
    held = held_out(math, "math")
    assert len(held) == 600 and len({i.seed for i in held}) == 600
    assert collections.Counter(math.slices(i)["digits"] for i in held) == {"1": 200, "2": 200, "3": 200}
    assert {math.slices(i)["terms"] for i in held} == {"2"} and {split_of(i.seed) for i in held} == {"test"}


@pytest.mark.parametrize("family,slices", [("math", {"1", "2", "3"}), ("code", {"2", "3"})])
def test_rung3_runs_on_the_other_families_end_to_end(tmp_path, monkeypatch, family, slices):
    """Rung 3 on math and code, shrunk (4 problems a level, a 20-step warm start, 2 GRPO steps): the family's recipe,
    reward, style and slices are the ones used (slices by digit count or depth, not MAPF's sizes), every figure the
    rung reports is there. Caught: a MAPF name left in the rung's path (a KeyError on `size`, RUNG3_ENV fed to another
    generator, MAPF's trace style asked of code) or a result missing its CPU seconds."""
    import dataclasses

    from harness.benchmarks import ladder

    fam = ladder.RUNGS[family]
    small = dataclasses.replace(fam, per_level=4, sft_steps={"tiny": 20}, recipe={**fam.recipe, "batch_size": 16})
    monkeypatch.setitem(ladder.RUNGS, family, small)
    res = ladder.rung3(tmp_path, budget_s=30, max_steps=2, family=family, sft_examples=64)
    assert res["task"] == family and res["boards"] == 4 * len(fam.levels) and res["steps"] == 2
    assert set(res["slices"]) == slices and all(s["n"] == 4 for s in res["slices"].values())
    assert res["recipe"]["batch_size"] == 16 and res["recipe"]["learning_rate"] == fam.recipe["learning_rate"]
    assert res["shaping"] == small.shaping and res["train_cpu_seconds"] > 0 and "passed" in res
    assert (tmp_path / f"warmstart-{family}-64-20" / "config.json").exists()


def test_the_ladders_task_option_refuses_what_a_family_does_not_have():
    from typer.testing import CliRunner

    from harness.cli import app

    runner = CliRunner()
    for args, says in [(["--rungs", "3", "--task", "reasoning"], "rung 3 is defined for mapf, math, code"),
                       (["--rungs", "3", "--task", "math", "--preset", "small"], "measured partial warm start for tiny"),
                       (["--rungs", "3", "--task", "math", "--warm", "noisy"], "drop --warm for --task math"),
                       (["--rungs", "1", "--task", "math"], "add 3 to --rungs or drop --task")]:
        out = runner.invoke(app, ["bench", "ladder", *args])
        assert out.exit_code != 0 and says in out.output, (args, out.output)
