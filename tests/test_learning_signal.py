"""The gate's second route for an env change (`gate.learning_signal`): more live GRPO groups in the arm's training,
with confidence, and the target not below the control. `harness.backtest.learning_signal_bound` is Welch's one-sided
interval over steps; `harness.decisions.on_learning_signal` converts an inconclusive env verdict."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from harness.backtest import learning_signal_bound, live_shares
from harness.config import GateConfig
from harness.decisions import on_learning_signal
from harness.records import Evidence, Verdict


def _steps(rng, p, n=30, groups=8):
    """Per-step live shares of an arm whose groups are live with probability p (binomial over the step's groups)."""
    return list(rng.binomial(groups, p, size=n) / groups)


def test_the_welch_bound_holds_its_level_on_equal_arms_and_sees_a_mix_that_leaves_most_groups_dead():
    """Equal arms clear a margin of 0 in about alpha of draws (not far more: the bound is not too narrow, not 0:
    it is not vacuous); the too-hard mix's control (5% live) against the corrected mix (33% live, the figures of
    mapf-too-hard's arms) clears 0.10 nearly always. Would catch a bound with the wrong variance or degrees of freedom,
    or one computed over groups as if they were independent."""
    rng = np.random.default_rng(0)
    alpha, trials = 0.05, 2000
    false = sum(learning_signal_bound(_steps(rng, 0.4), _steps(rng, 0.4), alpha)[1] > 0 for _ in range(trials))
    assert 0.02 < false / trials < 0.08
    seen = sum(learning_signal_bound(_steps(rng, 0.05), _steps(rng, 0.33), alpha)[1] >= 0.10 for _ in range(200))
    assert seen / 200 > 0.95
    gain, low = learning_signal_bound([0.5, 0.5], [0.5, 0.5], alpha)
    assert gain == low == 0.0  # no variance at all: the bound is the gain
    assert np.isnan(learning_signal_bound([0.5], [0.5, 0.6], alpha)[1])  # too few steps: no bound
    assert live_shares([{"dead_group_share": 0.75}, {"loss": 1.0}, {"dead_group_share": 0.0}]) == [0.25, 1.0]


def _arm_noise_trial(seed: int, true_sd: float, arm_sd: float, alpha: float = 0.05, trials: int = 2000
                     ) -> tuple[float, float, float]:
    """Arms whose mean live share is drawn around the harness's with sd `true_sd` (per-arm training noise): the share
    of equal-arm pairs (40% live) whose bound clears 0 steps-only and with `arm_sd` added, and the share of 200
    mix-defect pairs (5% against 33% live) whose bound with `arm_sd` clears the route's 0.10."""
    rng = np.random.default_rng(seed)

    def arm(p):
        return _steps(rng, float(np.clip(p + rng.normal(0, true_sd), 0, 1)))

    draws = [(arm(0.4), arm(0.4)) for _ in range(trials)]
    naive = sum(learning_signal_bound(c, x, alpha)[1] > 0 for c, x in draws) / trials
    with_term = sum(learning_signal_bound(c, x, alpha, arm_sd=arm_sd)[1] > 0 for c, x in draws) / trials
    power = sum(learning_signal_bound(arm(0.05), arm(0.33), alpha, arm_sd=arm_sd)[1] >= 0.10 for _ in range(200)) / 200
    return naive, with_term, power


def test_the_bound_counts_each_arms_training_noise_which_the_steps_scatter_cannot_see():
    """Two arms of one harness whose levels differ by training (a random effect per arm, sd 0.025, as live A/A
    pairs show) clear a margin of 0 far more often than alpha when the bound sees only the steps' scatter, and about
    alpha when each arm's noise is added in quadrature (`arm_sd`, `gate.learning_signal_arm_sd`); a real mix defect
    (5% against 33% live) still clears the route's 0.10 nearly always. Would catch the arm term dropped, added once
    instead of per arm, or added so that it swamps the route's power."""
    naive, known, power = _arm_noise_trial(seed=1, true_sd=0.025, arm_sd=0.025)
    assert naive > 0.09 and 0.02 < known < 0.08, (naive, known)
    assert power > 0.95


def test_the_default_arm_noise_holds_alpha_at_the_noise_live_pairs_show_and_keeps_the_routes_power():
    """The shipped `gate.learning_signal_arm_sd` (0.02, the upper bound of the estimate from 102 live A/A pairs) on
    equal arms whose training noise is the pairs' point estimate (0.015): the bound clears 0 at most about alpha, while
    the steps-only bound clears it more often; a mix defect's gain (5% against 33% live) still clears 0.10. Would catch
    a default set so low that the route's false clears return to the steps-only rate, or so high that it loses power."""
    naive, shipped, power = _arm_noise_trial(seed=2, true_sd=0.015, arm_sd=GateConfig().learning_signal_arm_sd)
    assert shipped < 0.06 and shipped < naive, (naive, shipped)
    assert power > 0.95


class _Store:
    def __init__(self, kinds):
        self.kinds = kinds

    def candidate(self, cid):
        if cid not in self.kinds:
            return None
        kind, knob, *values = self.kinds[cid]
        old, new = values or (None, None)
        return {"kind": kind, "knob": knob, "old_value": old, "patch": {"kind": kind, "knob": knob, "value": new}}


def _run(kinds, **gate):
    events = []
    run = SimpleNamespace(config=SimpleNamespace(gate=GateConfig(**gate)), store=_Store(kinds),
                          event=lambda *a, **k: events.append(a))
    return run, events


def _verdict(cid, decision="inconclusive", effect=0.02, vetoes=()):
    ev = Evidence(n=96, control=0.25, candidate=0.25 + effect, effect=effect, ci_low=effect - 0.08,
                  ci_high=effect + 0.08, vetoes=list(vetoes))
    return Verdict(candidate=cid, decision=decision, reason="the target test's reason", evidence=ev)


def test_an_inconclusive_env_change_that_revives_dead_groups_is_promoted_and_nothing_else_is():
    """Only an inconclusive ENV or sampling-temperature candidate, with its target estimate not below the control and
    its arm's live share confidently higher by the margin, is promoted; the reason names both. Another recipe change
    with the same curves (a larger group or another learning rate changes the share as a side effect), an env change
    whose target estimate is below the control, one with a veto, one whose live share is only a little higher, one
    already refuted, and the route switched off all keep their verdicts. Would catch the route applied to every kind
    or knob, ignoring the target, or promoting on the point estimate of the live share."""
    rng = np.random.default_rng(1)
    dead = [{"dead_group_share": 1 - s} for s in _steps(rng, 0.05)]
    live = [{"dead_group_share": 1 - s} for s in _steps(rng, 0.33)]
    near = [{"dead_group_share": 1 - s} for s in _steps(rng, 0.09)]
    arms = {"control": SimpleNamespace(curve=dead), "mix": SimpleNamespace(curve=live),
            "temp": SimpleNamespace(curve=live), "lr": SimpleNamespace(curve=live), "worse": SimpleNamespace(curve=live),
            "vetoed": SimpleNamespace(curve=live), "slight": SimpleNamespace(curve=near),
            "refuted": SimpleNamespace(curve=live), "longer": SimpleNamespace(curve=live),
            "shorter": SimpleNamespace(curve=live)}
    kinds = {"mix": ("env", "env.mixture"), "temp": ("recipe", "recipe.temperature"),
             "lr": ("recipe", "recipe.learning_rate"), "worse": ("env", "env.mixture"),
             "vetoed": ("env", "env.mixture"), "slight": ("env", "env.mixture"), "refuted": ("env", "env.mixture"),
             "longer": ("recipe", "recipe.max_completion_length", 12, 48),
             "shorter": ("recipe", "recipe.max_completion_length", 96, 24)}
    vs = [_verdict("mix"), _verdict("temp"), _verdict("lr"), _verdict("worse", effect=-0.01),
          _verdict("vetoed", vetoes=["v"]), _verdict("slight"), _verdict("refuted", decision="rejected", effect=0.0),
          _verdict("longer"), _verdict("shorter")]
    run, events = _run(kinds)
    got = {v.candidate: v for v in on_learning_signal(run, 1, vs, arms, comparisons=2)}
    assert got["mix"].decision == "promoted" and got["temp"].decision == "promoted"
    assert got["longer"].decision == "promoted"  # a longer completion budget: only a rise takes the route
    assert "learning signal" in got["mix"].reason and "target not below the control" in got["mix"].reason
    assert "the target test's reason" in got["mix"].reason
    assert {c: v.decision for c, v in got.items() if c not in ("mix", "temp", "longer")} == {
        "lr": "inconclusive", "worse": "inconclusive", "vetoed": "inconclusive", "slight": "inconclusive",
        "refuted": "rejected", "shorter": "inconclusive"}
    assert len(events) == 3 and {e[2] for e in events} == {"learning_signal"}
    off, _ = _run(kinds, learning_signal=None)
    assert [v.decision for v in on_learning_signal(off, 1, vs, arms, comparisons=2)] == [v.decision for v in vs]
    # a failed control arm (an exception) decides nothing on this route
    assert on_learning_signal(run, 1, vs, {**arms, "control": RuntimeError("x")}, comparisons=2) == vs


def test_the_route_is_part_of_the_gate_config_and_not_of_the_judge_fingerprint():
    """`gate.learning_signal` is validated at load (a typo'd value is refused) and leaves the judge fingerprint alone:
    it does not change how the target evidence is scored, so switching it does not stop earlier evidence pooling."""
    from harness.backtest import Judge, judge_fingerprint

    with pytest.raises(ValueError, match="learning_signal"):
        GateConfig(learning_signal=1.5)
    judge = Judge(env={"sizes": []}, samples=4, temperature=0.5)
    assert judge_fingerprint(judge, GateConfig(), "mapf") == judge_fingerprint(judge, GateConfig(learning_signal=None),
                                                                            "mapf")


def test_the_route_counts_groups_live_on_validity_not_on_a_shaped_rewards_spread():
    """Under partial credit, wrong answers earn different rewards, so a sampler can make groups "live" by reward
    without any valid answer among them (a held-out code scenario with partial credit 1.0: 79% live by reward against
    25%; on validity 56% against 10%); and a hotter sampler makes a valid answer's group "live" with a malformed one
    beside it (groups of two on code: 5% -> 21% live, 70% of it so). The route reads the validity-live share, a valid
    answer beside a wrong but checkable one, when every step has one, and the reward's otherwise (older curves).
    Would catch the route promoting on shaped-reward spread alone, or counting malformed answers as contrast."""
    from harness.records import RewardBatch, valid_live_share

    b = RewardBatch(seeds=[1] * 4 + [2] * 4, levels=[""] * 8, rewards=[0.2, 0.5, 0.7, 0.1, 1.0, 0.0, 0.0, 0.0],
                    valid=[False] * 4 + [True, False, False, False])
    assert valid_live_share(b, 4) == 0.5  # group 1: spread in reward, none valid (dead); group 2: live
    assert valid_live_share(b, 3) is None and valid_live_share(RewardBatch(seeds=[1], levels=[""], rewards=[1.0]),
                                                                  1) is None
    # a valid answer beside a malformed one is the sampler's contrast, not the task's: live only beside a wrong but
    # checkable answer (groups of two: valid + malformed, valid + wrong, valid + valid, malformed + wrong)
    pairs = RewardBatch(seeds=[1, 1, 2, 2, 3, 3, 4, 4], levels=[""] * 8, rewards=[1.0, -0.5, 1.0, 0.0, 1.0, 1.0, -0.5, 0.0],
                        valid=[True, False, True, False, True, True, False, False],
                        checkable=[True, False, True, True, True, True, False, True])
    assert valid_live_share(pairs, 2) == 0.25
    assert valid_live_share(pairs.model_copy(update={"checkable": []}), 2) == 0.5  # files from before: any invalid
    rng = np.random.default_rng(2)
    control = [{"dead_group_share": 1 - s, "valid_live_share": v} for s, v in zip(_steps(rng, 0.25), _steps(rng, 0.1))]
    hotter = [{"dead_group_share": 1 - s, "valid_live_share": v} for s, v in zip(_steps(rng, 0.8), _steps(rng, 0.1))]
    arms = {"control": SimpleNamespace(curve=control), "temp": SimpleNamespace(curve=hotter)}
    run, _ = _run({"temp": ("recipe", "recipe.temperature", 1.0, 1.46)})
    [v] = on_learning_signal(run, 1, [_verdict("temp")], arms, comparisons=1)
    assert v.decision == "inconclusive"
    older = {n: SimpleNamespace(curve=[{"dead_group_share": x["dead_group_share"]} for x in a.curve])
             for n, a in arms.items()}
    [w] = on_learning_signal(run, 1, [_verdict("temp")], older, comparisons=1)
    assert w.decision == "promoted"  # what the reward's spread alone says (and said before)
    # one arm recorded by older code: both are compared on the reward's count, never one on each
    mixed = {"control": older["control"], "temp": arms["temp"]}
    [x] = on_learning_signal(run, 1, [_verdict("temp")], mixed, comparisons=1)
    assert x.decision == "promoted"


def test_a_change_tested_on_the_route_at_each_of_its_pairs_passes_at_most_alpha_over_them_all():
    """A change whose live share is exactly the route's margin above the control's (0.30 against 0.20 live, margin
    0.10: not shown to clear it) is tried on the route at each of its `gate.max_pairs` (3) arm pairs, as a second pair
    and pooled re-tests do. Tested at alpha each time it passed 13.6% of 3000 changes over the three (5.2% at the first);
    at alpha / max_pairs, 4.5%. Would catch the route's test left uncorrected for the pairs a change may be judged on."""
    from harness.decisions import signal_verdict

    rng = np.random.default_rng(5)
    gate = GateConfig()
    assert gate.max_pairs == 3 and gate.learning_signal == pytest.approx(0.10)

    def arm(p):  # each arm's mean share drawn with the training noise the route assumes (gate.learning_signal_arm_sd)
        return _steps(rng, float(np.clip(p + rng.normal(0, gate.learning_signal_arm_sd), 0, 1)))

    changes, passed = 1500, 0
    for _ in range(changes):
        for _pair in range(gate.max_pairs):
            got = signal_verdict(_verdict("mix"), arm(0.20), arm(0.30), gate, comparisons=1)
            if got is not None:
                passed += 1
                break
    assert passed / changes <= gate.alpha + 0.015, passed / changes


def _scaled_arm(rng, p, arm_sd):
    """An arm whose mean live share is drawn around p with the noise the ratio reading assumes at that share
    (`2 * arm_sd * sqrt(p (1 - p))`), then 30 steps of 8 groups: the code scenarios' arms."""
    return _steps(rng, float(np.clip(p + rng.normal(0, 2 * arm_sd * np.sqrt(p * (1 - p))), 0, 1)))


def test_a_tenfold_rise_from_almost_no_live_groups_takes_the_ratio_reading_and_equal_arms_do_not():
    """Code's cold temperature: the control arm trains on 0.4-0.8% live groups, the arm at 0.7 on 4.6-8.3%
    (BENCHMARKS.md, sixty-second session), a tenfold rise that never reaches the absolute margin of 0.10. The ratio
    reading (`gate.learning_signal_ratio`, 2) takes it in most changes over their three pairs; equal arms at any low
    share, and a candidate at exactly twice the control's share, pass at most alpha over the three pairs; with the
    reading off the rise is never promoted. Would catch a ratio bound without the control's variance scaled by the
    ratio squared, without each arm's noise, with the two readings' alpha not split, or the reading ignored."""
    from harness.decisions import signal_verdict

    rng = np.random.default_rng(7)
    gate, off = GateConfig(), GateConfig(learning_signal_ratio=None)
    assert gate.learning_signal_ratio == pytest.approx(2.0)

    def changes(pc, px, g, n=600):
        passed = 0
        for _ in range(n):
            for _pair in range(g.max_pairs):
                got = signal_verdict(_verdict("temp"), _scaled_arm(rng, pc, g.learning_signal_arm_sd),
                                     _scaled_arm(rng, px, g.learning_signal_arm_sd), g, comparisons=2)
                if got is not None:
                    assert got.decision == "promoted" and ("times as many" in got.reason or px - pc >= 0.1)
                    passed += 1
                    break
        return passed / n

    for p in (0.003, 0.01, 0.03, 0.1, 0.4):
        assert changes(p, p, gate) <= gate.alpha, p
    # the reading's own null, exactly twice as many, which is the absolute margin's too (0.10 more): either may pass
    assert changes(0.1, 0.2, gate, n=1500) <= gate.alpha
    assert changes(0.008, 0.07, gate) > 0.6
    assert changes(0.008, 0.07, off, n=200) == 0.0


def test_a_re_test_pools_the_ratio_reading_over_the_changes_earlier_pairs():
    """A change re-tested in a later stage pools its target evidence; the ratio reading pools the live shares its
    earlier tests recorded (`Evidence.live`, read through `Evidence.pooled`) with its own pair. At 0.8% against 7%
    live (code's cold temperature) one pair clears twice the control's share in about four of ten, three pooled pairs
    in about nine; a candidate at exactly twice the control's share pooled over three pairs passes at most its look's
    share of alpha. `on_learning_signal` records each eligible pair's shares on its evidence
    and reads the earlier ones from run.db. Would catch the reading judging each pair alone (no power at 1% live over
    a stage's 30 steps), pooling as if the earlier pairs were this pair's steps, or not keeping the shares."""
    from harness.decisions import signal_verdict

    rng = np.random.default_rng(9)
    gate = GateConfig()
    sd = gate.learning_signal_arm_sd

    def pairs(pc, px, m):
        return [(_scaled_arm(rng, pc, sd), _scaled_arm(rng, px, sd)) for _ in range(m)]

    def passes(pc, px, m, n=400):
        return np.mean([signal_verdict(_verdict("temp"), *ps[-1], gate, 2, earlier=ps[:-1]) is not None
                        for ps in (pairs(pc, px, m) for _ in range(n))])

    alone, pooled = passes(0.008, 0.07, 1), passes(0.008, 0.07, 3)
    assert alone < 0.5 and pooled > 0.8, (alone, pooled)
    # the reading's null (exactly twice as many) at the third look, pooled: at most alpha / max_pairs, each look's share
    assert passes(0.05, 0.1, 3, n=1500) <= gate.alpha / gate.max_pairs + 0.01

    # through the loop's function: the stage's pair alone falls short, the earlier test's recorded shares complete it
    no, six = [0.0] * 30, [0.0] * 24 + [0.125] * 6  # no live group in 30 steps against one in six steps
    old_c, old_x = list(no), list(six)
    earlier = Evidence(n=96, control=0.25, candidate=0.26, effect=0.01, ci_low=-0.07, ci_high=0.09,
                       live={"control": old_c, "candidate": old_x})

    class Store(_Store):
        def candidate(self, cid):
            row = super().candidate(cid) if cid in self.kinds else {}
            return {**row, "evidence": earlier.model_dump()} if cid == "s1c1" else row

    run, _ = _run({"s2c1": ("recipe", "recipe.temperature", 0.1, 0.7)})
    run.store = Store(run.store.kinds)
    ctrl = [{"dead_group_share": 1 - s, "valid_live_share": s} for s in no]
    cand = [{"dead_group_share": 1 - s, "valid_live_share": s} for s in six]
    arms = {"control": SimpleNamespace(curve=ctrl), "s2c1": SimpleNamespace(curve=cand)}
    v = _verdict("s2c1")
    [alone] = on_learning_signal(run, 2, [v], arms, comparisons=1)
    assert alone.decision == "inconclusive" and alone.evidence.live["candidate"] == [0.0] * 24 + [0.125] * 6
    v = v.model_copy(update={"evidence": v.evidence.model_copy(update={"pooled": ["s1c1"]})})
    [both] = on_learning_signal(run, 2, [v], arms, comparisons=1)
    assert both.decision == "promoted" and "pooled over 2 arm pairs" in both.reason, both.reason


def _clipped_arm(rng, live, clipped, n=30, per_step=16):
    """An arm's curve: per-step validity-live shares at `live` (8 groups a step) and the share of its completions cut
    off by the budget around `clipped` (binomial over a step's completions), as the trainer logs them."""
    return [{"dead_group_share": 1 - s, "valid_live_share": s, "clipped_ratio": c}
            for s, c in zip(_steps(rng, live, n), rng.binomial(per_step, clipped, size=n) / per_step)]


def test_a_longer_budget_whose_arm_lets_the_cut_off_answers_end_is_promoted_on_that_and_nothing_else_is():
    """A held-out code scenario at a 6-token budget: the control arm's training completions were cut off 68-73% of
    the time, the arm at 19-20 tokens none, while live groups rose only from 2-3% to 8-10%, below what the live
    readings show at 8 groups a step (BENCHMARKS.md, seventy-sixth session). A longer budget is promoted on the share
    of completions that end (its reason says so) when its target estimate is not below the control's; not when it is
    below, not for a shorter budget or a temperature with the same curves, not when the control cut nothing off, and
    not with curves that never logged the clipped share. Equal arms with a third of their answers cut off pass at most
    alpha over a change's three pairs. Would catch the reading applied to other knobs or to a shorter budget, read the
    wrong way round, ignoring the target guard or promoting on a point estimate."""
    from harness.backtest import finished_shares
    from harness.decisions import signal_verdict

    rng = np.random.default_rng(11)
    control, longer = _clipped_arm(rng, 0.027, 0.70), _clipped_arm(rng, 0.09, 0.0)
    unclipped = _clipped_arm(rng, 0.027, 0.0)
    kinds = {"longer": ("recipe", "recipe.max_completion_length", 6, 20),
             "worse": ("recipe", "recipe.max_completion_length", 6, 20),
             "shorter": ("recipe", "recipe.max_completion_length", 40, 20),
             "temp": ("recipe", "recipe.temperature", 1.0, 0.7)}
    arms = {"control": SimpleNamespace(curve=control), **{c: SimpleNamespace(curve=longer) for c in kinds}}
    vs = [_verdict("longer", effect=0.0), _verdict("worse", effect=-0.01), _verdict("shorter"), _verdict("temp")]
    run, events = _run(kinds)
    got = {v.candidate: v for v in on_learning_signal(run, 1, vs, arms, comparisons=2)}
    assert got["longer"].decision == "promoted", got["longer"].reason
    assert "completions that end within the budget 100.0%" in got["longer"].reason
    assert {c: v.decision for c, v in got.items() if c != "longer"} == {
        "worse": "inconclusive", "shorter": "inconclusive", "temp": "inconclusive"}
    assert len(events) == 1
    # the live readings alone do not show it: without the clipped share the same change stays inconclusive
    bare = {n: SimpleNamespace(curve=[{k: x for k, x in s.items() if k != "clipped_ratio"} for s in a.curve])
            for n, a in arms.items()}
    [alone] = on_learning_signal(run, 1, [_verdict("longer", effect=0.0)], bare, comparisons=2)
    assert alone.decision == "inconclusive"
    # nothing was cut off in the control: a longer budget changes nothing there, so this reading cannot pass
    [same] = on_learning_signal(run, 1, [_verdict("longer", effect=0.0)],
                                {**arms, "control": SimpleNamespace(curve=unclipped)}, comparisons=2)
    assert same.decision == "inconclusive"

    gate = GateConfig()

    def arm(p):  # each arm's mean cut-off share drawn with the route's arm noise
        return _clipped_arm(rng, 0.2, float(np.clip(p + rng.normal(0, gate.learning_signal_arm_sd), 0, 1)))

    def passes(pc, px, n):
        hit = 0
        for _ in range(n):
            for _pair in range(gate.max_pairs):
                c, x = arm(pc), arm(px)
                fin = (finished_shares(c), finished_shares(x))
                lc, lx = live_shares(c), live_shares(x)
                if signal_verdict(_verdict("longer"), lc, lx, gate, 1, finished=fin) is not None:
                    hit += 1
                    break
        return hit / n

    assert passes(0.33, 0.33, 1500) <= gate.alpha  # equal arms
    assert passes(0.33, 0.23, 1500) <= gate.alpha  # exactly the margin (0.10) more finished: the reading's null
    assert passes(0.40, 0.05, 200) > 0.95  # most of what was cut off now ends


def test_a_longer_budget_whose_arms_did_not_record_the_cut_off_share_keeps_the_live_readings_alpha():
    """The finished-share reading takes a share of the route's alpha only where it can be made: arms whose curves
    never logged `clipped_ratio` (another backend, an older run) leave the live readings the alpha they have for any
    other route change, and the recorded evidence keeps the shares where they exist (a futility replay reads them).
    Would catch a reading counted in the Bonferroni split while it cannot fire (the live reading then judged at
    alpha / 3 per pair where it should be alpha / 2), or the shares not kept with the evidence."""
    rng = np.random.default_rng(5)
    live = {"control": _clipped_arm(rng, 0.05, 0.7), "longer": _clipped_arm(rng, 0.40, 0.0)}
    bare = {n: SimpleNamespace(curve=[{k: x for k, x in s.items() if k != "clipped_ratio"} for s in c])
            for n, c in live.items()}
    run, _ = _run({"longer": ("recipe", "recipe.max_completion_length", 6, 20)})
    gate = run.config.gate
    readings = 2 if gate.learning_signal_ratio is not None else 1
    [v] = on_learning_signal(run, 1, [_verdict("longer", effect=0.0)], bare, comparisons=1)
    assert v.decision == "promoted" and f"at alpha {gate.alpha / (gate.max_pairs * readings):.3g}" in v.reason, v.reason
    assert v.evidence.finished == {}
    [w] = on_learning_signal(run, 1, [_verdict("longer", effect=0.0)],
                             {n: SimpleNamespace(curve=c) for n, c in live.items()}, comparisons=1)
    assert w.decision == "promoted" and set(w.evidence.finished) == {"control", "candidate"}
    from harness.decisions import finished_reading

    assert finished_reading("recipe.max_completion_length", [0.3], [0.9, 1.0]) is None  # one step a side: no reading
    assert finished_reading("recipe.temperature", [0.3, 0.3], [0.9, 1.0]) is None


def test_a_re_test_on_the_route_keeps_the_share_of_alpha_its_pooled_evidence_was_judged_at():
    """A change first tested beside three others (its evidence judged at alpha / 4) and re-tested alone is read by
    the route at alpha / 4 still, as the target test keeps it (`Evidence.comparisons`); and an earlier pair that
    recorded one step a side is left out of the pooled ratio reading instead of making it nan. Would catch the route
    judging a re-test at the stage's own count (four times the alpha here, up to 3 x alpha over a family of such
    re-tests), or a one-step record poisoning every later reading."""
    from harness.backtest import learning_signal_ratio_bound
    from harness.decisions import live_of

    rng = np.random.default_rng(6)
    arms = {"control": SimpleNamespace(curve=_clipped_arm(rng, 0.05, 0.0)),
            "env": SimpleNamespace(curve=_clipped_arm(rng, 0.40, 0.0))}
    run, _ = _run({"env": ("env", "env.sizes", None, None)})
    gate = run.config.gate
    readings = 2 if gate.learning_signal_ratio is not None else 1
    v = _verdict("env", effect=0.0)
    v = v.model_copy(update={"evidence": v.evidence.model_copy(update={"comparisons": 4})})
    [got] = on_learning_signal(run, 2, [v], arms, comparisons=1)
    assert got.decision == "promoted" and f"at alpha {gate.alpha / (4 * gate.max_pairs * readings):.3g}" in got.reason, \
        got.reason
    pairs = live_of([{"live": {"control": [0.0], "candidate": [0.5]}}], [{"control": [0.0, 0.1], "candidate": [0.4, 0.5]}])
    assert pairs == [([0.0, 0.1], [0.4, 0.5])]
    assert np.isfinite(learning_signal_ratio_bound([0.0, 0.0, 0.1], [0.3, 0.4, 0.5], 2.0, 0.05, 0.01,
                                                   earlier=pairs)[1])
