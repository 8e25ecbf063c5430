"""The PBT baseline (`harness.pbt`): exploit/explore on known fitness values, and a population of 2 trained for 2 tiny
stages through the stage's machinery (real warm start, real GRPO, real probes and held-out report) at equal compute,
then resumed."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from harness.pbt import PBTConfig, Population, exploit_explore, perturb, run_pbt, truncation

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: faster for tiny models

TINY_RUN = {
    "task": "mapf", "name": "t", "seed": 0, "policy": {"preset": "tiny"},
    "env": {"min_distance": 1, "sizes": [{"size": s, "data_ratio": 0.5, "hole_ratio": 0.2, "wait_ratio": 0.5,
                                         "agents": 2} for s in (3, 4)]},
    "warm_start": {"sft_examples": 0},  # an untrained tiny policy: what is tested is the bookkeeping, not learning
    "recipe": {"steps": 1, "batch_size": 8, "num_generations": 4, "learning_rate": 1e-4, "temperature": 0.7,
               "beta": 0.0, "max_completion_length": 24},
    "budget": {"stages": 2}, "stage": {"train_instances": 16},
    "backtest": {"n": 8, "samples": 2, "max_new_tokens": 24}, "eval": {"suite": "small", "limit": 8},
}


def test_truncation_copies_a_fitter_top_member_into_the_bottom_and_perturbs_within_bounds():
    knobs = [{"learning_rate": 1e-4, "top_p": 0.9, "replay": 0.1}, {"learning_rate": 2e-4, "top_p": 0.95, "replay": 0.9},
             {"learning_rate": 3e-4, "top_p": 0.5, "replay": 0.5}, {"learning_rate": 4e-4, "top_p": 0.7, "replay": 0.2}]
    fitness = [0.1, 0.9, 0.5, 0.3]  # member 1 is the top quarter, member 0 the bottom one
    out = exploit_explore(fitness, knobs, 0.25, (0.8, 1.2), np.random.default_rng(0))
    assert [src for src, _ in out] == [1, 1, 2, 3]
    assert out[1:] == [(i, knobs[i]) for i in (1, 2, 3)]  # the others keep their weights and knobs
    new = out[0][1]
    assert new["learning_rate"] in (pytest.approx(1.6e-4), pytest.approx(2.4e-4))
    assert new["top_p"] in (pytest.approx(0.76), 1.0)  # 0.95 x 1.2 is clipped to top_p's inclusive bound 1
    assert new["replay"] in (pytest.approx(0.72), pytest.approx(0.95))  # replay < 1: halfway to the open bound
    assert exploit_explore(fitness, knobs, 0.25, (0.8, 1.2), np.random.default_rng(0)) == out  # seeded
    for s in range(40):  # every draw stays inside the Recipe's bounds
        p = perturb({"top_p": 0.95, "replay": 0.9, "temperature": 0.5}, (0.8, 1.2), np.random.default_rng(s))
        assert 0 < p["top_p"] <= 1 and 0 <= p["replay"] < 1 and p["temperature"] in (0.4, 0.6)
    # a tie copies too (Ray Tune's rule: a population that scored 0 everywhere, a collapse, still explores); the
    # truncation size is ceil(P x q), at most half the population
    tie = exploit_explore([0.0, 0.0], knobs[:2], 0.25, (0.8, 1.2), np.random.default_rng(0))
    assert tie[0] == (0, knobs[0]) and tie[1][0] == 0 and tie[1][1] != knobs[0], tie
    assert (truncation(2, 0.25), truncation(4, 0.25), truncation(5, 0.5), truncation(10, 0.25)) == (1, 1, 2, 3)


def test_the_prior_reaches_a_decade_either_side_and_explore_resamples_from_it():
    """An outside review (eighty-third session): the population started one 0.8 / 1.2 step from the round-0 recipe and
    never resampled, so in three stages no knob left x0.51..x1.73 of a broken value (a collapsing rate needs x0.25, a
    cold temperature x10): a strawman. Now the initial members and a resampled knob are drawn log-uniformly within
    `decades` decades of the round-0 value, inside the Recipe's bounds."""
    from harness.pbt import prior_range, sample_prior

    assert prior_range("learning_rate", 4e-4, 1.0) == (pytest.approx(4e-5), pytest.approx(4e-3))
    assert prior_range("temperature", 2.0, 1.0) == (pytest.approx(0.2), 10.0)  # temperature <= 10
    lo, hi = prior_range("replay", 0.9, 1.0)
    assert lo == pytest.approx(0.09) and hi < 1  # replay < 1: an open bound is kept inside
    prior = {"learning_rate": prior_range("learning_rate", 4e-4, 1.0), "temperature": prior_range("temperature",
                                                                                                   0.05, 1.0)}
    rng = np.random.default_rng(0)
    draws = [sample_prior(prior, rng) for _ in range(2000)]
    lrs = np.array([d["learning_rate"] for d in draws])
    temps = np.array([d["temperature"] for d in draws])
    assert lrs.min() >= 4e-5 * 0.999 and lrs.max() <= 4e-3 * 1.001 and temps.max() <= 0.5 * 1.001
    assert 0.2 < np.mean(lrs <= 1e-4) < 0.4  # log-uniform: x0.25 and below is 30% of the mass
    assert 0.1 < np.mean(temps >= 0.25) < 0.2  # and x5 and above 15%
    # explore with resample_probability 1: every copied knob is a prior draw, not a 0.8 / 1.2 step
    knobs = [{"learning_rate": 4e-4, "temperature": 0.05}] * 4
    out = exploit_explore([0.9, 0.5, 0.3, 0.1], knobs, 0.25, (0.8, 1.2), np.random.default_rng(1), prior, 1.0)
    assert out[3][0] == 0 and out[3][1]["learning_rate"] not in (pytest.approx(3.2e-4), pytest.approx(4.8e-4))
    assert PBTConfig().decades == 1.0 and PBTConfig().resample_probability == 0.25


def test_config_refuses_knobs_pbt_cannot_explore():
    with pytest.raises(ValidationError, match="cannot explore 'num_generations'.*learning_rate"):
        PBTConfig(knobs=["num_generations"])
    with pytest.raises(ValidationError, match="extra"):
        PBTConfig(populaton=3)
    with pytest.raises(ValidationError, match="positive"):
        PBTConfig(perturb=(0.0, 1.2))


def test_pbt_trains_and_probes_only_through_the_stage():
    """Like the experiment's baselines: no second training loop, evaluator or raw SQL in harness/pbt.py."""
    text = (Path(__file__).resolve().parents[1] / "harness" / "pbt.py").read_text()
    banned = {"sqlite3", "harness.backtest", "harness.policy_glue", "harness.warmstart", "policies.model",
              "policies.rollout", "ray"}
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    assert not found & banned and "execute(" not in text


def _lineage(run, ckpt, rows):
    """The checkpoints a PBT member's weights came through, newest first (each stage's `MemberStage.start`)."""
    out = [ckpt]
    for row in reversed(rows):
        t = next(t for t in run.result(row.stage, Population).trained if t.checkpoint == out[-1])
        out.append(t.start)
    return out


def test_a_population_of_two_shares_the_budget_reports_its_best_member_and_resumes(tmp_path, monkeypatch):
    from harness.config import parse_config
    from harness.lifecycle import open_run
    from harness.stagebook import compute_shares, step_equivalents

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    cfg, budget, said = PBTConfig(population=2, probe_n=2), 8, []
    run = open_run(tmp_path / "pbt", parse_config(TINY_RUN))
    try:
        rows = run_pbt(run, cfg, budget, "pbt", said.append)
        assert [r.stage for r in rows] == [1, 2]
        comp = step_equivalents(run.store, run.id)
        # the best member's lineage: its own steps and those of every member it continued, not the population's
        sh = compute_shares(run.store, run.id)
        assert sh["delivered"] == rows[-1].checkpoint and 0 < sh["lineage"] < comp["steps"]
        assert sh["lineage"] == sum(t.steps for row in rows for t in run.result(row.stage, Population).trained
                                    if t.checkpoint in _lineage(run, rows[-1].checkpoint, rows))
        # equal compute: the population's steps and fitness probes together meet the budget, within one
        # step-equivalent per member-stage
        assert abs(comp["compute"] - budget) <= 2 * 2, comp
        assert comp["judge_tokens"] > 0 and rows[-1].compute == pytest.approx(comp["compute"])
        probes = [r for r in run.store.ledger(run.id) if r["label"] == "pbt-probe"]
        assert sorted((r["stage"], r["arm"]) for r in probes) == [(1, "pbt-m0"), (1, "pbt-m1"), (2, "pbt-m0"),
                                                                  (2, "pbt-m1")]
        for row in rows:
            pop = run.result(row.stage, Population)
            assert [sorted(m.knobs) for m in pop.members] == [["learning_rate", "temperature"]] * 2
            assert [len(m.lineage) for m in pop.members] == [row.stage] * 2
            fit = {t.member: t.fitness for t in pop.trained}
            best = next(t for t in pop.trained if t.member == pop.best)
            assert best.fitness == max(fit.values()) and row.checkpoint == best.checkpoint
            assert sum(t.steps for t in pop.trained) == row.steps
            # truncation at 2 members: the top one (fitness, then the lower id) keeps its weights and knobs, the
            # other continues the top one's weights with explored knobs, whatever their fitness (Tune's rule)
            top, bottom = sorted(fit, key=lambda i: (-fit[i], i))
            assert pop.members[top].lineage[-1] == top and pop.members[top].knobs == pop.trained[top].knobs
            assert pop.members[bottom].lineage[-1] == top and pop.members[bottom].knobs != pop.trained[top].knobs
            for m in pop.members:
                assert m.checkpoint == pop.trained[m.lineage[-1]].checkpoint
            test = next(e for e in run.store.evaluations(run.id, stage=row.stage, arm="policy")
                        if e["split"] == "test" and not e["slice_key"])
            assert (row.valid, row.optimal) == (test["valid"], test["optimal"])
            report = json.loads((run.run_dir / "stages" / f"s{row.stage}" / "test.json").read_text())
            assert report["checkpoint"] == best.checkpoint  # the report judged the best member's weights
            assert len(report["problems"]) == len(report["valid"])  # each instance's problem: the curve's clusters
        p0 = run.result(0, Population)
        assert p0.members[0].knobs == {"learning_rate": 1e-4, "temperature": 0.7}  # member 0 at round 0
        assert p0.members[1].knobs != p0.members[0].knobs  # the other drawn from the prior
        assert not (run.run_dir / "pbt" / "s1").exists() and (run.run_dir / "pbt" / "s2").is_dir()  # superseded
        ledger = run.store.ledger(run.id)
    finally:
        run.close()
        run.store.close()

    said.clear()  # resume after the last stage: nothing is trained, probed or reported again
    run = open_run(tmp_path / "pbt", parse_config(TINY_RUN))
    try:
        again = run_pbt(run, cfg, budget, "pbt", said.append)
        assert [r.model_dump() for r in again] == [r.model_dump() for r in rows]
        assert run.store.ledger(run.id) == ledger
        assert said == ["pbt: resuming after stage 2"]

        # as a crash inside stage 2 leaves it, after member 0 trained and was probed: stage 1's checkpoints (copies
        # stand in for them), no member 1, no stage-2 population or row. Only member 1 trains again.
        d = run.run_dir
        run.store.db["nodes"].delete_where("run = ? AND stage = 2 AND node IN (?, ?, ?, ?, ?)",
                                           [run.id, "baseline", "pbt", "provide", "pbt:m1:train", "pbt:m1:fitness"])
        (d / "stage2.json").unlink()
        shutil.rmtree(d / "pbt" / "s2" / "m1")
        for m in ("m0", "m1"):
            shutil.copytree(d / "pbt" / "s2" / "m0", d / "pbt" / "s1" / m)
        said.clear()
        resumed = run_pbt(run, cfg, budget, "pbt", said.append)
        assert said[0] == "pbt: resuming after stage 1" and len(said) == 2 and said[1].startswith("pbt stage 2/2")
        assert [r.stage for r in resumed] == [1, 2] and not (d / "pbt" / "s1").exists()
        now = {(r["stage"], r["arm"], r["kind"]): r for r in run.store.ledger(run.id)}
        was = {(r["stage"], r["arm"], r["kind"]): r for r in ledger}
        assert now[2, "pbt-m0", "grpo"] == was[2, "pbt-m0", "grpo"]  # not re-run: the same measurement
        assert now[2, "pbt-m0", "rollout"] == was[2, "pbt-m0", "rollout"]
        assert now[2, "pbt-m1", "grpo"]["seconds"] != was[2, "pbt-m1", "grpo"]["seconds"]  # trained again
    finally:
        run.close()
        run.store.close()


def test_a_one_stage_population_pays_for_its_fitness_probes_out_of_its_own_training(tmp_path, monkeypatch):
    """One stage: no later stage repays what the fitness probes cost, so stage 1 trains that much less (their
    completions over a step's). Before, stage 1 expected no probes and a one-stage PBT arm ended over its budget by
    all of them (here 8 steps and 2 x 8 probe completions: 10 step-equivalents against 8). Would catch the estimate
    dropped, or counted in the wrong unit (tokens against steps)."""
    from harness.config import parse_config
    from harness.lifecycle import open_run
    from harness.stagebook import step_equivalents

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    cfg, budget = PBTConfig(population=2, probe_n=4), 8
    run = open_run(tmp_path / "pbt1", parse_config({**TINY_RUN, "budget": {"stages": 1}}))
    try:
        rows = run_pbt(run, cfg, budget, "pbt", lambda m: None)
        comp = step_equivalents(run.store, run.id)
        expected = 2 * 4 * run.judge.per_instance / 8  # members x probe instances x samples / completions per step
        assert expected >= 1 and rows[0].steps == budget - round(expected), (expected, rows[0].steps)
        assert abs(comp["compute"] - budget) < 1.0, comp["compute"]
    finally:
        run.close()
        run.store.close()
