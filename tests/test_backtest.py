"""The backtest on real MAPF instances: a planted invalid high-scoring candidate (better on 3x3, worse on 5x5, as a
config that trains only on 3x3 would be) is rejected by the slice check or, where the slice is too small to check,
by an evolved veto; the online backtest trains two real tiny GRPO arms and counts their compute; held-out hygiene.

Arm outcomes for the planted candidate are built by scoring real expert plans (solved) and corrupted plans (failed)
with the task's own scorer, at per-size solve rates typical of a tiny policy, instead of training.

    .venv/bin/pytest tests/test_backtest.py -q
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.backtest import (
    ArmEval,
    GateConfig,
    Judge,
    arm_vetoes,
    one_look,
    read_harness,
)
from harness.benchmarks.calibration import decision
from harness.records import Rollout
from harness.seeds import SplitError, seeds
from harness.tasks import get_task

TEMPLATE = Path(__file__).resolve().parents[1] / "sandbox" / "template"
GATE = GateConfig(min_effect=0.0, slice_tolerance=0.05, confidence=0.95, n_boot=1000, min_slice_n=20)

VETO = '''
def diagnose(rollouts):
    return {"findings": [], "metrics": {}}


def veto(control, candidate):
    for key, c in control["by_slice"].items():
        k = candidate["by_slice"].get(key)
        if key.startswith("size=") and k and k["valid"] < c["valid"] - 0.15:
            return f"{key} valid fell {c['valid']:.2f} -> {k['valid']:.2f}"
    return None
'''


def template_files() -> dict[str, str]:
    """MAPF's round-0 harness: the template and MAPF's round-0 env.yaml."""
    return {**{str(p.relative_to(TEMPLATE)): p.read_text() for p in TEMPLATE.rglob("*") if p.is_file()},
            "env.yaml": get_task("mapf").spec.round0_env}


@pytest.fixture(scope="module")
def mapf():
    task = get_task("mapf")
    cfg = task.spec.config_model.model_validate({"sizes": [
        {"size": 3, "data_ratio": 0.5, "hole_ratio": 0.2, "wait_ratio": 0.1, "agents": 2},
        {"size": 5, "data_ratio": 0.5, "hole_ratio": 0.2, "wait_ratio": 0.1, "agents": 2}], "min_distance": 1})
    insts = [task.generate(cfg, s) for s in seeds("backtest", 240)]
    expert = [task.expert(i) for i in insts]
    broken = [e[: len(e) // 2] for e in expert]  # a plan cut in half: agents stop short of their goals
    assert all(task.score(i, e).valid for i, e in zip(insts, expert))
    assert sum(task.score(i, b).valid for i, b in zip(insts, broken)) < 0.1 * len(insts)
    return task, insts, expert, broken


def _arm(task, insts, expert, broken, solve: dict[str, float], rng) -> ArmEval:
    """One arm's per-instance outcomes: it produces the expert plan with its per-size solve rate, else a broken one,
    and every plan is scored by the task's scorer."""
    outcomes, slices, rollouts = [], [], []
    for g, (inst, e, b) in enumerate(zip(insts, expert, broken)):
        sl = task.slices(inst)
        comp = e if rng.random() < solve[_size(sl)] else b
        o = task.score(inst, comp)
        outcomes.append(float(o.valid))
        slices.append(sl)
        rollouts.append(Rollout(seed=inst.seed, group=g, instance=inst.model_dump(mode="json"), prompt="",
                                completion=comp, valid=o.valid, optimal=o.optimal, reward=o.reward,
                                failure=o.failure, slices=sl))
    return ArmEval(seeds=[i.seed for i in insts], outcomes=outcomes, slices=slices, rollouts=rollouts)


def _size(sl: dict[str, str]) -> str:
    return "3" if "3" in sl["size"] else "5"


def test_planted_3x3_only_candidate_is_rejected_by_the_slice_check(mapf):
    task, insts, expert, broken = mapf
    rng = np.random.default_rng(11)
    control = _arm(task, insts, expert, broken, {"3": 0.55, "5": 0.45}, rng)
    planted = _arm(task, insts, expert, broken, {"3": 0.97, "5": 0.25}, rng)
    v = one_look(control.outcomes, planted.outcomes, control.slices, GATE, candidate_id="only-3x3")
    assert v.evidence.effect > 0.05 and v.evidence.ci_low > 0, "it must look like a win overall"
    size5 = next(f"size={s['size']}" for s in control.slices if _size(s) == "5")
    assert v.decision != "promoted" and f"slice {size5}" in v.reason

    honest = _arm(task, insts, expert, broken, {"3": 0.8, "5": 0.6}, rng)
    ok = one_look(control.outcomes, honest.outcomes, control.slices, GATE, candidate_id="honest")
    assert ok.decision == "promoted", ok.reason


def test_small_slice_escapes_the_gate_but_not_an_evolved_veto(mapf):
    task, insts, expert, broken = mapf
    keep = [i for i, inst in enumerate(insts) if _size(task.slices(inst)) == "3"]
    keep += [i for i, inst in enumerate(insts) if _size(task.slices(inst)) == "5"][:12]  # below min_slice_n=20
    sub = [insts[i] for i in keep], [expert[i] for i in keep], [broken[i] for i in keep]
    rng = np.random.default_rng(12)
    control = _arm(task, *sub, {"3": 0.5, "5": 0.6}, rng)
    planted = _arm(task, *sub, {"3": 0.95, "5": 0.0}, rng)
    ungated = one_look(control.outcomes, planted.outcomes, control.slices, GATE)
    assert ungated.decision == "promoted", "without the veto the small slice's collapse slips through"
    files = {**template_files(), "diagnostics/slice_guard.py": VETO}
    vetoes = arm_vetoes(template_files(), files, control, planted)
    assert len(vetoes) == 1 and "slice_guard" in vetoes[0] and "valid fell" in vetoes[0]
    v = one_look(control.outcomes, planted.outcomes, control.slices, GATE, vetoes=vetoes)
    assert v.decision == "rejected" and v.reason.startswith("veto: ") and "slice_guard" in v.reason
    # deleting the veto file in the candidate tree does not remove the veto: the incumbent's copy still runs
    assert arm_vetoes(files, template_files(), control, planted) == vetoes


def test_read_harness_and_hygiene(tmp_path):
    task = get_task("mapf")
    env, recipe, _ = read_harness(template_files(), task)
    assert recipe.num_generations == 8 and env.sizes[0].size == 3
    with pytest.raises(SplitError, match="backtest"):
        decision(tmp_path, template_files(), template_files(), task, task.spec.styles[0], 1, seeds("train", 4),
                 seeds("test", 4), GATE, Judge(env=env.model_dump()), tmp_path / "arms", "c")


def test_online_backtest_trains_two_real_arms_and_counts_compute(tmp_path):
    """Two tiny GRPO arms (1 step each) from one start checkpoint, run as the calibration benchmark runs them (the
    loop's ArmJob and execute_arm, then `verdicts`); identical harness and arm seeds = identical arms, so the paired
    outcomes match exactly and nothing is promoted."""
    from policies.model import build_model, save_policy

    task = get_task("mapf")
    model, tok = build_model("tiny", task.spec.alphabet)
    save_policy(model, tok, tmp_path / "start")
    files = template_files()
    files["recipe.yaml"] += "\nbatch_size: 16\nnum_generations: 4\n"
    eval_seeds = seeds("backtest", 12, start=500)
    judge = Judge(env=read_harness(files, task)[0].model_dump(), samples=3, temperature=0.7, max_new_tokens=48)
    res = decision(tmp_path / "start", files, files, task, task.spec.styles[0], 1, seeds("train", 4), eval_seeds, GATE,
                   judge, tmp_path / "arms", candidate_id="aa")
    control, candidate = res.arms["control"], res.arms["candidate"]
    for arm in (control, candidate):
        assert len(arm.metrics.steps) == 1 and arm.metrics.tokens_generated > 0 and arm.train_s > 0
    for path in res.checkpoints.values():
        assert (path / "config.json").exists()
    assert res.checkpoints["control"] != res.checkpoints["candidate"]
    assert control.eval.seeds == candidate.eval.seeds == eval_seeds
    assert control.eval.outcomes == candidate.eval.outcomes
    assert [r.completion for r in control.eval.rollouts] == [r.completion for r in candidate.eval.rollouts]
    assert res.verdict.decision == "inconclusive" and res.verdict.evidence.effect == 0.0  # A/A at min_effect 0: never refuted, never promoted
    assert res.verdict.evidence.seeds == (eval_seeds[0], eval_seeds[-1])
    # the judge samples k=3 completions per instance (outcomes in thirds) and decodes greedily once (reported)
    assert len(control.eval.rollouts) == 3 * len(eval_seeds) and res.verdict.evidence.samples == 3
    assert all(abs(3 * o - round(3 * o)) < 1e-9 for o in control.eval.outcomes)
    assert len(control.eval.greedy) == len(eval_seeds) and res.verdict.evidence.greedy_control is not None
    c = res.compute
    assert c["steps"] == 2 and c["seconds"] > 0
    assert c["tokens"] >= control.metrics.tokens_generated + candidate.metrics.tokens_generated


def test_a_greedy_judge_decides_on_one_greedy_decode_per_instance(tmp_path):
    """`backtest.samples: 0`: each instance is decoded greedily once and that decode is the outcome, what is recorded
    and what a read-back rebuilds; nothing is sampled, and its evidence never pools with a sampled judge's. Would catch
    a greedy judge that still samples (completions differing from the greedy decode), decodes twice, or reports a
    sample count of 0 (a division by it)."""
    from harness.backtest import ArmEval, judge_arm, judge_fingerprint, judge_greedy
    from harness.config import BacktestConfig
    from policies.model import build_model

    assert BacktestConfig(samples=0).samples == 0
    with pytest.raises(ValueError):
        BacktestConfig(samples=-1)
    task = get_task("mapf")
    model, tok = build_model("tiny", task.spec.alphabet)
    env = read_harness(template_files(), task)[0].model_dump()
    insts = [task.generate(task.spec.config_model.model_validate(env), s) for s in seeds("backtest", 10, start=700)]
    greedy = Judge(env=env, samples=0, temperature=0.7, max_new_tokens=24)
    sampled = Judge(env=env, samples=3, temperature=0.7, max_new_tokens=24)
    assert greedy.decides_greedy and greedy.per_instance == 1 and sampled.per_instance == 3
    ev = judge_arm(model, tok, task, insts, greedy, sampling_seed=5, style=task.spec.styles[0])
    ref, _ = judge_greedy(model, tok, task, insts, greedy, task.spec.styles[0])
    assert len(ev.rollouts) == len(insts) and ev.samples == 1 and ev.temperature == 0.0
    assert ev.outcomes == ev.greedy == ref and set(ev.outcomes) <= {0.0, 1.0}
    again = judge_arm(model, tok, task, insts, greedy, sampling_seed=6, style=task.spec.styles[0])
    assert [r.completion for r in again.rollouts] == [r.completion for r in ev.rollouts]  # no sampling seed matters
    back = ArmEval.from_rollouts(ev.rollouts, ev.greedy, greedy.per_instance)
    assert back.outcomes == ev.outcomes and back.seeds == sorted(ev.seeds)
    s = judge_arm(model, tok, task, insts, sampled, sampling_seed=5, style=task.spec.styles[0])
    assert len(s.rollouts) == 3 * len(insts)
    assert judge_fingerprint(greedy, GATE, "mapf") != judge_fingerprint(sampled, GATE, "mapf")


def test_an_arms_steps_record_which_groups_were_live_on_validity(tmp_path):
    """A real tiny GRPO run through `train_arm` (the function every arm runs): one scoring call a step, each step's
    `valid_live_share` computed from that call's validity, and `live_shares` reads it. Would catch the share computed
    on the wrong batch (calls and steps out of step) or never reaching the curve the learning-signal route reads."""
    from harness.backtest import live_shares, train_arm
    from harness.records import valid_live_share
    from policies.model import build_model

    task = get_task("mapf")
    model, tok = build_model("tiny", task.spec.alphabet)
    files = template_files()
    files["recipe.yaml"] += "\nbatch_size: 16\nnum_generations: 4\n"
    record: list = []
    m = train_arm(model, tok, task, files, 2, seeds("train", 8), 0, record=record)
    assert len(record) == len(m.steps) == 2 and all(len(b.valid) == len(b.checkable) == 16 for b in record)
    # an untrained policy writes malformed plans: each scored with its own failure, not all counted checkable
    assert not all(c for b in record for c in b.checkable) and all(c for b in record for ok, c in
                                                                  zip(b.valid, b.checkable) if ok)
    assert [s.valid_live_share for s in m.steps] == [valid_live_share(b, 4) for b in record]
    assert [s.valid for s in m.steps] == [sum(b.valid) / len(b.valid) for b in record]  # what reward_hacking reads
    assert live_shares([s.model_dump() for s in m.steps]) == [s.valid_live_share for s in m.steps]
    # two optimiser passes per batch: one scoring call every other step, each step's shares those of its batch (they
    # were left unset: calls and steps no longer matched one to one)
    files["recipe.yaml"] += "num_iterations: 2\npipeline: false\n"
    record = []
    m = train_arm(model, tok, task, files, 4, seeds("train", 16), 0, record=record)
    assert len(record) == 2 and len(m.steps) == 4
    assert [s.valid for s in m.steps] == [sum(b.valid) / len(b.valid) for b in record for _ in (0, 1)]


def test_minimum_detectable_effect_shrinks_with_n():
    """The evidence's MDE (promote_above + (z_promote + z_0.8) x se) halves its noise part when n quadruples."""
    rng = np.random.default_rng(0)
    d = np.clip(0.5 + rng.normal(0.0, 0.15, size=400), 0, 1)
    gate = GateConfig(min_effect=0.02, confidence=0.95)
    small = one_look(list(d[:100]), [0.5] * 100, [{}] * 100, gate, samples=4)
    big = one_look(list(d), [0.5] * 400, [{}] * 400, gate, samples=4)
    bar = gate.promote_above
    assert small.evidence.mde - bar == pytest.approx(2 * (big.evidence.mde - bar), rel=0.15)
    assert small.evidence.samples == 4


def test_arm_noise_widens_the_bounds_and_the_detectable_effect():
    """Training randomness between arms is invisible to the instances' spread: gate.arm_noise_sd adds it to every
    pair's variance. A decision that the instance noise alone would promote is not promoted once arm noise of its size
    is declared, and the start warning then says no n will fix it."""
    from harness.sequential import max_evidence_warning

    rng = np.random.default_rng(3)
    control = rng.uniform(0.2, 0.4, size=400)
    candidate = np.clip(control + 0.06 + rng.normal(0, 0.05, size=400), 0, 1)
    slices = [{}] * 400
    plain = one_look(list(control), list(candidate), slices, GateConfig())
    noisy = one_look(list(control), list(candidate), slices, GateConfig(arm_noise_sd=0.04))
    assert plain.decision == "promoted" and noisy.decision != "promoted"
    assert noisy.evidence.ci_low < plain.evidence.ci_low - 0.03 and noisy.evidence.mde > plain.evidence.mde + 0.05
    warn = max_evidence_warning(GateConfig(arm_noise_sd=0.04, max_pairs=1).plan(400))
    assert warn and "at any n" in warn


def _pair(control: list[float], candidate: list[float], train_s: float = 10.0, judge_s: float = 4.0):
    """A calibration arm pair with given per-instance outcomes (no training: `walk` only reads them)."""
    from types import SimpleNamespace

    from harness.backtest import ArmEval
    from harness.benchmarks.calibration import Pair

    sd = [int(s) for s in seeds("backtest", len(control), start=9000)]
    ev = {name: SimpleNamespace(eval=ArmEval(seeds=sd, outcomes=list(xs), slices=[{}] * len(xs)))
          for name, xs in (("control", control), ("candidate", candidate))}
    return Pair(ev, {}, train_s, judge_s, 0.0, 0.0)


def test_calibration_walk_stops_a_clear_loser_early_and_pools_new_pairs_like_the_loop():
    """The calibration benchmark's sequential procedure (`walk`): a clear loser is refuted at the first look, judged
    on a quarter of the pair's instances and charged for those only; an A/A pair that stays inconclusive gets a new
    pair (trained on demand) whose evidence is pooled with the first (the looks' `pairs` grow) up to max_pairs.
    Would catch: charging the full pair's judging for an early stop, never asking for a second pair, or a second pair
    judged without the first's evidence."""
    from harness.benchmarks.calibration import walk

    gate = GateConfig(min_effect=0.02, arm_noise_sd=0.012, max_pairs=3)
    plan = gate.plan(160)
    rng = np.random.default_rng(5)
    base = rng.uniform(0.2, 0.6, size=160)
    loser = _pair(list(base), list(np.clip(base - 0.3, 0, 1)))
    w = walk([loser], lambda p: pytest.fail("a clear loser needs no second pair"), {}, {}, gate, plan, "j", 4, "c")
    assert w.verdict.decision == "rejected" and w.pairs == 1 and w.instances == plan.min_n == 40
    assert w.seconds == pytest.approx(10.0 + 4.0 * 40 / 160)

    def aa() -> object:
        c = rng.integers(0, 5, size=160) / 4
        return _pair(list(c), list(np.clip(c + rng.choice([-0.25, 0.0, 0.25], size=160), 0, 1)))

    trained = []
    w = walk([aa()], lambda p: trained.append(p) or aa(), {}, {}, gate, plan, "j", 4, "c")
    assert w.verdict.decision in ("inconclusive", "rejected")
    assert trained == list(range(1, w.pairs)) and w.pairs >= 2, "an undecided first pair gets a re-test pair"
    looks = w.verdict.evidence.looks
    assert max(x["pairs"] for x in looks) == w.pairs and looks[-1]["n"] == w.instances, "pairs pooled"
    assert w.seconds == pytest.approx(10.0 * w.pairs + 4.0 * w.instances / 160)


def test_calibration_walk_takes_the_loops_learning_signal_route_for_an_env_or_temperature_change_only():
    """The calibration's walk decides an env change as the loop does (`harness.decisions.signal_verdict`): a first pair
    inconclusive on the target (a small positive effect) whose candidate arm trained on far more live groups is
    promoted on learning signal without a second pair; the same arms under a recipe change (other files differ) are
    not; a longer budget on the share of its answers that end as well. Would catch the benchmark measuring a gate the
    loop no longer runs."""
    from types import SimpleNamespace

    from harness.benchmarks.calibration import walk

    gate = GateConfig(min_effect=0.02, arm_noise_sd=0.012, max_pairs=3)
    plan = gate.plan(160)
    rng = np.random.default_rng(3)
    c = rng.integers(0, 5, size=160) / 4

    def pair():
        p = _pair(list(c), list(np.clip(c + rng.choice([-0.25, 0.0, 0.0, 0.25, 0.25], size=160), 0, 1)))
        for name, live in (("control", 0.05), ("candidate", 0.4)):
            steps = [{"dead_group_share": 1 - x} for x in rng.binomial(8, live, size=30) / 8]
            p.arms[name].metrics = SimpleNamespace(steps=steps)
        return p

    env = ({"env.yaml": "a", "recipe.yaml": "r"}, {"env.yaml": "b", "recipe.yaml": "r"})
    w = walk([pair()], lambda p: pytest.fail("the route decides on the first pair"), *env, gate, plan, "j", 4, "c")
    assert w.verdict.decision == "promoted" and "learning signal" in w.verdict.reason and w.pairs == 1
    recipe = ({"env.yaml": "a", "recipe.yaml": "learning_rate: 1.0e-4\ntemperature: 0.1\n"},
              {"env.yaml": "a", "recipe.yaml": "learning_rate: 5.0e-5\ntemperature: 0.1\n"})
    w = walk([pair()], lambda p: pair(), *recipe, gate, plan, "j", 4, "c")
    assert "learning signal" not in w.verdict.reason
    # the sampling temperature alone takes the route, as in the loop (`harness.decisions.takes_signal_route`)
    hotter = (recipe[0], {"env.yaml": "a", "recipe.yaml": "learning_rate: 1.0e-4\ntemperature: 0.7\n"})
    w = walk([pair()], lambda p: pytest.fail("the route decides on the first pair"), *hotter, gate, plan, "j", 4, "c")
    assert w.verdict.decision == "promoted" and "learning signal" in w.verdict.reason
    # a longer completion budget takes it too, a shorter one does not
    budget = [{"env.yaml": "a", "recipe.yaml": f"max_completion_length: {n}\n"} for n in (12, 48)]
    w = walk([pair()], lambda p: pytest.fail("the route decides on the first pair"), *budget, gate, plan, "j", 4, "c")
    assert w.verdict.decision == "promoted" and "learning signal" in w.verdict.reason
    w = walk([pair()], lambda p: pair(), *budget[::-1], gate, plan, "j", 4, "c")
    assert "learning signal" not in w.verdict.reason

    # ... and on the share of its answers that end, as the loop reads a longer budget (`finished_reading`): arms as
    # live as each other, the control's completions cut off 70% of the time, the candidate's never
    def cut_pair():  # the target level between the arms (an estimate of 0: inconclusive, not below the control)
        p = _pair(list(c), list(c))
        for name, cut in (("control", 0.7), ("candidate", 0.0)):
            p.arms[name].metrics = SimpleNamespace(steps=[{"dead_group_share": 0.9, "clipped_ratio": x}
                                                          for x in rng.binomial(16, cut, size=30) / 16])
        return p

    w = walk([cut_pair()], lambda p: pytest.fail("the route decides on the first pair"), *budget, gate, plan, "j", 4,
             "c")
    assert w.verdict.decision == "promoted" and "end within the budget" in w.verdict.reason, w.verdict.reason


def test_a_futility_stop_weighs_the_learning_signal_route_an_env_change_is_on():
    """gate.futility stops a re-test whose chance of promotion on the TARGET is low; an env change whose live groups
    rose with confidence needs only a pooled target estimate not below the control's (the learning-signal route), so
    a first pair at a slightly negative estimate is not stopped while that chance (`sign_chance`) is at least the
    setting: it gets a second pair, and a second pair a little ahead promotes it on the pooled evidence. Stopped as
    before: the same arms with no live-share gain (a null change), a clearly negative estimate, and any change at
    futility 0 (the default judge: nothing here changes). Would catch the lift firing without the route's own test,
    on a hopeless estimate, or not reaching the walk (the planted-env power the greedy judge lost, 72nd session)."""
    from types import SimpleNamespace

    from harness.benchmarks.calibration import walk

    gate = GateConfig(min_effect=0.02, arm_noise_sd=0.025, max_pairs=3, futility=0.2)
    plan = gate.plan(160)
    rng = np.random.default_rng(5)
    c = list(rng.integers(0, 5, size=160) / 4)

    def pair(shift: list[float], live=(0.01, 0.4)):
        p = _pair(c, list(np.clip(np.array(c) + np.array(shift), 0, 1)))
        for name, x in zip(("control", "candidate"), live, strict=True):
            p.arms[name].metrics = SimpleNamespace(steps=[{"dead_group_share": 1 - v}
                                                          for v in rng.binomial(8, x, size=30) / 8])
        return p

    behind = [-0.25, 0.0, 0.0, 0.25] * 38 + [-0.25] * 8  # -0.0125: stopped for futility on the target
    ahead = [-0.25, 0.0, 0.25, 0.25] * 40  # +0.0625
    env = ({"env.yaml": "a"}, {"env.yaml": "b"})
    trained = []
    w = walk([pair(behind)], lambda p: trained.append(p) or pair(ahead), *env, gate, plan, "j", 4, "c")
    assert trained == [1] and w.pairs == 2, w.verdict.reason
    assert w.verdict.decision == "promoted" and "learning signal" in w.verdict.reason, w.verdict.reason
    first = [x for x in w.verdict.evidence.looks if x["pairs"] == 1][-1]  # the stop the route lifted
    assert first["effect"] < 0 and first["next_step"] == "stop", first
    for p0, g in ((pair(behind, live=(0.2, 0.2)), gate),  # no signal: a null env change stops as before
                  (pair([-0.25, -0.25, 0.0, 0.25] * 36 + [0.0] * 16), gate),  # -0.056: hopeless (or refuted)
                  (pair(behind), gate.model_copy(update={"futility": 0.0}))):
        w = walk([p0], lambda p: pair(ahead), *env, g, g.plan(160), "j", 4, "c")
        assert "futility stop lifted" not in w.verdict.reason, w.verdict.reason
        if g.futility:
            assert w.pairs == 1 and w.verdict.decision != "promoted", w.verdict.reason


def test_calibration_replay_judges_recorded_pairs_under_another_gate(tmp_path):
    """`replay` re-walks the recorded per-instance outcomes of a calibration run under another gate setting, no
    training: an A/A decision that took three pairs stops after one under futility 0.05 and is charged one pair; a
    row recorded without outcomes is counted as not replayable. Would catch a replay that trains, ignores the gate
    update, or charges pairs it did not use."""
    import json

    from harness.benchmarks.calibration import replay

    rng = np.random.default_rng(11)

    def pair():
        c = list(rng.integers(0, 5, size=160) / 4)
        k = list(np.clip(np.array(c) + rng.choice([-0.25, 0.0, 0.25], size=160), 0, 1))
        return {"outcomes": {"control": c, "candidate": k}, "slices": [{}] * 160, "train_seconds": 80.0,
                "judge_seconds": 20.0, "n": 160, "effect": float(np.mean(k) - np.mean(c)), "diff_var": 0.05}

    row = {"decision": 0, "fixed": {"decision": "inconclusive", "seconds": 100.0},
           "sequential": {"decision": "inconclusive", "pairs": 3, "instances": 480, "seconds": 300.0},
           "pairs": [pair(), pair(), pair()]}
    old = {**row, "decision": 1, "pairs": [{k: v for k, v in pair().items() if k not in ("outcomes", "slices")}]}
    f = tmp_path / "calibration-aa-0.json"
    f.write_text(json.dumps({"summary": {"mode": "aa"}, "decisions": [row, old]}))
    plain = replay([str(f)], futility=0.0)
    fut = replay([str(f)], futility=0.05)
    assert plain["not_replayable"] == fut["not_replayable"] == 1 and plain["decisions"] == 1
    assert plain["sequential_mean_pairs"] >= 2 and fut["sequential_mean_pairs"] == 1
    # one pair's training (80 s) and the judging of the instances its looks used (20 s per 160), no more
    assert 80.0 + 20.0 * 40 / 160 <= fut["sequential_seconds_per_decision"] <= 100.0


def test_calibration_replay_of_an_env_record_walks_the_learning_signal_route(tmp_path):
    """A recorded env-change run (planted env defect or the A/A's null env change) is replayed with the route live,
    from the per-step live shares it recorded: an inconclusive pair whose candidate trained on far more live groups is
    promoted at the default `learning_signal` and not with the route off (a bar of 1.0 and no ratio reading); a pair
    at 1% against 8% live only on the ratio reading (`learning_signal_ratio`); the same record marked as a plain A/A
    (no env change) is never promoted on signal. Would catch a replay that drops the recorded live shares,
    ignores the run's change, or cannot re-judge it under another threshold."""
    import json

    from harness.benchmarks.calibration import replay

    rng = np.random.default_rng(4)
    c = list(rng.integers(0, 5, size=160) / 4)
    k = list(np.clip(np.array(c) + rng.choice([-0.25, 0.0, 0.0, 0.25, 0.25], size=160), 0, 1))
    live = {"control": list(rng.binomial(8, 0.05, size=30) / 8), "candidate": list(rng.binomial(8, 0.4, size=30) / 8)}
    pair = {"outcomes": {"control": c, "candidate": k}, "slices": [{}] * 160, "train_seconds": 80.0,
            "judge_seconds": 20.0, "n": 160, "effect": float(np.mean(k) - np.mean(c)), "diff_var": 0.05, "live": live}
    row = {"decision": 0, "fixed": {"decision": "inconclusive", "seconds": 100.0},
           "sequential": {"decision": "inconclusive", "pairs": 1, "instances": 160, "seconds": 100.0},
           "pairs": [pair, pair, pair]}
    for planted, expect in (("env", 1), (None, 0)):
        f = tmp_path / f"calibration-{planted}.json"
        f.write_text(json.dumps({"summary": {"mode": "power", "planted": planted}, "decisions": [row]}))
        assert replay([str(f)])["sequential_promoted"] == expect, planted
        # a bar of 1.0 leaves the ratio reading (40% live is 8 times 5%); with it off too, nothing passes
        assert replay([str(f)], learning_signal=1.0)["sequential_promoted"] == expect, planted
        assert replay([str(f)], learning_signal=1.0, learning_signal_ratio=None)["sequential_promoted"] == 0
    # a policy that rarely meets a live group (code's cold temperature: 1% against 8%) passes only on the ratio
    low = {"control": list(rng.binomial(8, 0.005, size=30) / 8), "candidate": list(rng.binomial(8, 0.08, size=30) / 8)}
    f = tmp_path / "calibration-low.json"
    f.write_text(json.dumps({"summary": {"mode": "power", "planted": "env"}, "decisions": [
        {**row, "pairs": [{**pair, "live": low}] * 3}]}))
    assert replay([str(f)])["sequential_promoted"] == 1
    assert replay([str(f)], learning_signal_ratio=None)["sequential_promoted"] == 0


def test_the_judge_budget_is_fitted_to_the_targets_expert_answers_only_when_round_0_cuts_them():
    """At run start (`harness.round0.make_judge` through `fit_budget`): a round-0 completion budget shorter than the target's expert
    answers is kept for training and warned about, while the judge (and the test set) score with 1.5x the longest
    answer; an explicit backtest.max_new_tokens is kept as given (with a warning when it cuts); a budget that fits
    changes nothing and says nothing. Would catch a judge that inherits a budget too short to see a longer budget
    help (a held-out truncation scenario measured the judge at 12 tokens), or one that moves when nothing is wrong."""
    from harness.config import parse_config
    from harness.round0 import BUDGET_MARGIN, CUT_SHARE, expert_tokens, initial_files, make_judge

    def fitted(budget, judge_budget=None):
        data = {"task": "mapf", "name": "b", "policy": {"preset": "tiny"},
                "recipe": {"max_completion_length": budget},
                "backtest": {"max_new_tokens": judge_budget} if judge_budget else {}}
        cfg = parse_config(data, "b")
        files = initial_files(cfg)
        notes: list[str] = []
        judge = make_judge(cfg, files, notes)
        return cfg, judge.max_new_tokens, notes

    cfg, _, _ = fitted(96)
    lengths = sorted(expert_tokens(cfg, make_judge(cfg, initial_files(cfg)).config(get_task("mapf"))))
    longest = lengths[-1]
    assert 10 < longest < 96
    assert fitted(96)[1:] == (96, [])
    _, got, notes = fitted(8)
    assert got == int(BUDGET_MARGIN * longest + 0.999) and len(notes) == 2
    assert "max_completion_length (8) cuts off" in notes[0] and "set backtest.max_new_tokens" in notes[1]
    _, got, notes = fitted(8, judge_budget=9)
    assert got == 9 and len(notes) == 2 and "backtest.max_new_tokens (9)" in notes[1]
    assert fitted(longest)[1:] == (longest, [])  # exactly long enough: nothing moves
    few = lengths[-2] if lengths[-2] < longest else longest - 1  # cuts only the longest answer or two: nothing moves
    assert sum(n > few for n in lengths) / len(lengths) < CUT_SHARE and fitted(few)[1:] == (few, [])


def test_a_re_test_keeps_the_bonferroni_count_its_pooled_evidence_was_judged_at():
    """Evidence first judged among four candidates (alpha / 4) and re-tested alone later must not be judged at alpha
    on all its looks: that undid the split (a family error of 0.10 for a claimed 0.05 in a reviewer's simulation).
    The verdict records the count it used and uses the larger one. Would catch the count taken from the re-test's
    stage alone."""
    from harness.backtest import ArmEval, verdicts
    from harness.config import GateConfig

    rng = np.random.default_rng(0)
    ctrl_out = list(rng.uniform(0.2, 0.5, 160).round(2))
    arm_out = [min(1.0, x + 0.06) for x in ctrl_out]
    ctrl = ArmEval(seeds=list(range(160)), outcomes=ctrl_out, slices=[{}] * 160)
    arm = ArmEval(seeds=list(range(160)), outcomes=[round(x + float(e), 2) for x, e in
                                                    zip(arm_out, rng.normal(0, 0.3, 160).clip(-0.3, 0.3),
                                                        strict=True)], slices=[{}] * 160)
    arm = ArmEval(seeds=arm.seeds, outcomes=[min(1.0, max(0.0, x)) for x in arm.outcomes], slices=arm.slices)
    gate = GateConfig(arm_noise_sd=0.0)
    [alone] = verdicts(ctrl, {}, [("c", {}, arm)], gate, comparisons=1)
    [kept] = verdicts(ctrl, {}, [("c", {}, arm)], gate, comparisons=1, at_least={"c": 4})
    assert alone.evidence.comparisons == 1 and kept.evidence.comparisons == 4
    assert kept.evidence.ci_low < alone.evidence.ci_low  # the wider promotion bound of alpha / 4


def test_calibration_starts_from_the_configs_own_checkpoint_when_it_names_one(tmp_path):
    """`bench calibration --config` on a run config with `policy.checkpoint` (a scenario's warm start, a user's model)
    measures that checkpoint, with no SFT: it failed with "unknown preset None" before. Would catch the benchmark
    training a warm start of its own instead of the checkpoint it was given."""
    from harness.benchmarks.calibration import start_checkpoint
    from harness.config import RunConfig

    ckpt = tmp_path / "mine"
    ckpt.mkdir()
    cfg = RunConfig.model_validate({"task": "mapf", "policy": {"checkpoint": str(ckpt), "preset": None}})
    assert start_checkpoint(cfg, tmp_path / "out", {}) == (ckpt, False)
    assert not (tmp_path / "out").exists()


def test_the_gate_counts_copies_of_one_problem_once_and_a_re_test_keeps_the_labels():
    """A level with few distinct problems draws one again (the math test set: 336 instances of 56 problems). The
    verdict labels each instance by its prompt (`ArmEval.problems`), records the labels with the evidence, and a
    re-test pools them (`prior_pairs`); the same outcomes on copies read a wider interval than on distinct problems.
    Would catch the labels dropped on the way from the arms to the decision, or from the record to a re-test."""
    from harness.backtest import ArmEval, prior_pairs, verdicts
    from harness.config import GateConfig

    def arm(outcomes: list[float], prompts: list[str]) -> ArmEval:
        rolls = [Rollout(seed=4 * i + 2, group=i, instance={}, prompt=p, completion="", valid=x > 0.5, optimal=False,
                         reward=x) for i, (x, p) in enumerate(zip(outcomes, prompts, strict=True))]
        return ArmEval(seeds=[4 * i + 2 for i in range(len(outcomes))], outcomes=outcomes,
                       slices=[{}] * len(outcomes), rollouts=rolls)

    rng = np.random.default_rng(5)
    base = list(rng.uniform(0.2, 0.6, 24).round(2))
    gain = list((rng.uniform(0.0, 0.3, 24) * rng.choice([-1, 1, 1], 24)).round(2))
    ctrl = [x for x in base for _ in range(4)]  # 24 problems, four copies each, scored alike by each arm
    cand = [min(1.0, max(0.0, x + g)) for x, g in zip(base, gain, strict=True) for _ in range(4)]
    copies = [f"{i}+{i}=" for i in range(24) for _ in range(4)]
    distinct = [f"{i}+{j}=" for i in range(24) for j in range(4)]
    gate = GateConfig(arm_noise_sd=0.0)
    [c] = verdicts(arm(ctrl, copies), {}, [("c", {}, arm(cand, copies))], gate, comparisons=1)
    [d] = verdicts(arm(ctrl, distinct), {}, [("c", {}, arm(cand, distinct))], gate, comparisons=1)
    assert len(set(c.evidence.clusters)) == 24 and len(set(d.evidence.clusters)) == 96
    assert c.evidence.effect == pytest.approx(d.evidence.effect)
    assert c.evidence.ci_high - c.evidence.ci_low > 1.5 * (d.evidence.ci_high - d.evidence.ci_low)
    [pair], _, _ = prior_pairs([c.evidence], c.evidence.judge)
    assert pair.clusters == c.evidence.clusters
    assert ArmEval(seeds=[2], outcomes=[1.0], slices=[{}]).problems == []  # no rollout to read: unlabelled


def test_the_reports_stage_to_stage_change_resamples_problems_and_pairs_one_test_set_only(tmp_path):
    """`harness.report.curve` on stage records: a test set that draws each of 50 problems 6 times, the last stage
    solving 2 more problems (12 instances of 300). Over instances the change reads above noise; over problems (the
    record's `problems`) it is within noise. Two stages scored on different test sets (names or seeds) get no paired
    change. Would catch the copies of a problem resampled as independent instances, or two test sets paired (an
    outside statistics review found both in the run report)."""
    import json

    from harness.report import curve

    problems = [i // 6 for i in range(300)]
    first = [1.0 if p < 20 else 0.0 for p in problems]
    last = [1.0 if p < 22 else 0.0 for p in problems]

    def write(run, recs):
        for k, rec in recs.items():
            (run / "stages" / f"s{k}").mkdir(parents=True)
            (run / "stages" / f"s{k}" / "test.json").write_text(json.dumps(rec))

    same = {"suite": "env:abc", "seeds": list(range(300))}
    write(tmp_path / "a", {1: {**same, "valid": first, "problems": problems}, 2: {**same, "valid": last,
                                                                              "problems": problems}})
    write(tmp_path / "b", {1: {**same, "valid": first}, 2: {**same, "valid": last}})  # written before problems were
    clustered, flat = curve(tmp_path / "a")["first_to_last"], curve(tmp_path / "b")["first_to_last"]
    assert clustered["effect"] == flat["effect"] == pytest.approx(0.04)
    assert flat["above_noise"] and not clustered["above_noise"] and clustered["ci95"][0] <= 0 < flat["ci95"][0]
    write(tmp_path / "c", {1: {**same, "valid": first}, 2: {"suite": "env:other", "seeds": same["seeds"],
                                                            "valid": last}})
    write(tmp_path / "d", {1: {**same, "valid": first}, 2: {"suite": "env:abc", "seeds": list(range(300, 600)),
                                                            "valid": last}})
    assert "first_to_last" not in curve(tmp_path / "c") and "first_to_last" not in curve(tmp_path / "d")


def test_the_regression_check_counts_copies_of_one_problem_once():
    """Under no change, 96 greedy instances that are 4 copies each of 24 problems read "regressed" or "above" about
    half of the time together when every copy counted as an independent draw (an outside review measured 0.23 and
    0.24 against a nominal 0.05 each); with the problems as clusters the rate is near nominal. Would catch the labels
    dropped on the way in, or a bootstrap over instances."""
    from harness.backtest import GateConfig, regression

    gate = GateConfig()
    labels = [f"p{i}" for i in range(24) for _ in range(4)]
    flagged = {"clusters": 0, "instances": 0}
    for s in range(200):
        rng = np.random.default_rng(s)
        p = rng.uniform(0.2, 0.8, 24)  # each problem's chance, the same before and after: no change
        before = [float(rng.random() < p[i]) for i in range(24) for _ in range(4)][::4]
        after = [float(rng.random() < p[i]) for i in range(24)]
        before, after = [b for b in before for _ in range(4)], [a for a in after for _ in range(4)]  # greedy copies
        for key, cl in (("clusters", labels), ("instances", None)):
            r = regression(before, after, gate, np.random.default_rng([s, 1]), clusters=cl)
            flagged[key] += r.regressed or r.ci_low > 0
    assert flagged["clusters"] / 200 <= 0.16 and flagged["instances"] / 200 >= 0.25, flagged
