"""Diagnostics: built-ins on hand-made MAPF rollouts, sandboxed evolved diagnostics and vetoes, the Diagnosis bundle.

    .venv/bin/pytest tests/test_diagnostics.py -q
"""

from __future__ import annotations

import pytest

from harness import diagnostics as D
from harness.records import Diagnosis, HistoryItem, Rollout
from harness.seeds import SplitError, seed_for
from harness.tasks import get_task
from sandbox.runner import Limits

FAST = Limits(cpu_s=1, wall_s=3.0, memory_mb=256, processes=4)

# --- hand-made MAPF rollouts ------------------------------------------------------------------------------------------

_i = iter(range(10**6))


def mk(size: int = 5, failure: str | None = None, *, optimal: bool | None = None, reward: float | None = None,
       group: int | None = None, completion: str | None = None, split: str = "probe", agents: int = 2,
       on_goal: int | None = None, makespan: float = 6, opt_makespan: float = 6, tokens: int = 30) -> Rollout:
    i = next(_i)
    valid = failure is None
    optimal = valid and makespan == opt_makespan if optimal is None else optimal
    where = {"agent": 1, "step": 3, "cell": [2, 1]} if failure else {}
    return Rollout(
        seed=seed_for(split, i), group=i if group is None else group,
        instance={"task": "mapf", "seed": seed_for(split, i), "size": size},
        prompt=f"grid {size}x{size}", completion=completion or f"A1: RIGHT DOWN DOWN #{i}\nA2: LEFT UP WAIT",
        valid=valid, optimal=optimal, reward=(1.0 if valid else 0.0) if reward is None else reward, failure=failure,
        where=where, slices={"size": str(size), "agents": str(agents), "holes": "0.2-0.3", "wait": "no"},
        metrics={"makespan": makespan, "optimal_makespan": opt_makespan, "agents": agents,
                 "agents_on_goal": agents if valid else (on_goal if on_goal is not None else 0),
                 **({"makespan_gap": makespan - opt_makespan} if valid else {})},  # as the MAPF scorer writes it
        tokens=tokens,
    )


def codes(res) -> dict[tuple[str, str], object]:
    return {(f.code, f.slice.get("size", "")): f for f in res.findings}


# --- built-ins --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("failure,knob", [
    ("parse_error", "recipe.temperature"), ("wrong_agent_count", "recipe.temperature"),
    ("off_grid", "env.sizes.6.data_ratio"), ("hole", "env.sizes.6.hole_ratio"),
    ("vertex_conflict", "env.sizes.6.wait_ratio"), ("edge_conflict", "env.sizes.6.wait_ratio"),
    ("goal_not_reached", "env.sizes.6.data_ratio"), ("too_long", "recipe.max_completion_length"),
])
def test_failure_breakdown_each_type(failure, knob):
    rs = [mk(6, failure) for _ in range(3)] + [mk(6) for _ in range(5)] + [mk(3) for _ in range(8)]
    f = codes(D.failure_breakdown(rs))[(f"mapf.{failure}", "6")]
    assert (f.count, f.rate) == (3, 0.375)
    assert knob in f.knobs and f.severity == "warn"
    assert len(f.examples) == 3 and f"failure={failure}" in f.examples[0] and "seed=" in f.examples[0]
    assert not any(c[1] == "3" for c in codes(D.failure_breakdown(rs)))  # the all-valid size has no finding


def test_failure_breakdown_by_slice_and_threshold():
    rs = [mk(5, "hole") for _ in range(6)] + [mk(5, "vertex_conflict")] + [mk(5) for _ in range(13)]
    rs += [mk(8, "edge_conflict") for _ in range(9)] + [mk(8)]
    c = codes(D.failure_breakdown(rs))
    assert c[("mapf.hole", "5")].rate == 0.3 and c[("mapf.edge_conflict", "8")].severity == "critical"
    assert ("mapf.vertex_conflict", "5") not in c  # 1/20 = 5% < the 10% threshold, kept as a metric only
    assert D.failure_breakdown(rs).metrics["failure.vertex_conflict.size=5"] == 0.05


def test_near_misses_and_quality_gap():
    rs = [mk(5, "goal_not_reached", on_goal=1), mk(5, "goal_not_reached", on_goal=0), mk(5, makespan=8),
          mk(5, makespan=6), mk(7, makespan=9, opt_makespan=7)]
    c = codes(D.near_misses(rs))
    assert c[("mapf.near_miss", "5")].count == 1
    assert c[("mapf.suboptimal", "5")].count == 1 and c[("mapf.suboptimal", "7")].count == 1
    m = D.quality_gap(rs).metrics  # MAPF's gap metric is the makespan gap
    assert m["makespan_gap.size=5"] == 1.0 and m["makespan_gap.size=7"] == 2.0 and m["makespan_gap"] == pytest.approx(4 / 3, abs=1e-3)


def test_competence_frontier():
    rs = [mk(3) for _ in range(10)]  # mastered
    rs += [mk(5) for _ in range(5)] + [mk(5, "hole") for _ in range(5)]  # frontier
    rs += [mk(8, "goal_not_reached") for _ in range(10)]  # too hard
    rs += [mk(10)]  # too few to judge
    res = D.competence_frontier(rs)
    c = codes(res)
    assert set(c) == {("mapf.mastered", "3"), ("mapf.frontier", "5"), ("mapf.too_hard", "8")}
    assert c[("mapf.frontier", "5")].knobs == ["env.sizes.5.data_ratio"] and c[("mapf.frontier", "5")].rate == 0.5
    assert res.metrics["frontier_size"] == 5.0 and res.metrics["valid.size=10"] == 1.0


def test_dead_groups_and_duplicates():
    rs = []
    for g in range(4):  # 3 dead groups (2 all-invalid, 1 all-valid), 1 alive
        for j in range(4):
            ok = g == 2 or (g == 3 and j % 2 == 0)
            rs.append(mk(5, None if ok else "hole", group=g, completion="A1: RIGHT\nA2: UP" if g < 2 else f"x{g}{j}"))
    dg = D.dead_groups(rs)
    f = dg.findings[0]
    assert f.code == "grpo.dead_groups" and f.count == 3 and f.rate == 0.75 and f.severity == "critical"
    assert "recipe.temperature" in f.knobs and "recipe.num_generations" in f.knobs
    assert dg.metrics["dead_all_invalid"] == 0.5 and dg.metrics["dead_all_valid"] == 0.25
    ec = D.exploration_collapse(rs)
    assert ec.metrics["duplicate_rate"] == pytest.approx(0.375)  # 2 groups of 4 identical: (0.75 + 0.75) / 4
    assert ec.findings[0].code == "grpo.exploration_collapse"
    alive = [mk(5, None if j % 2 else "hole", group=9, completion=f"c{j}") for j in range(4)]
    assert D.dead_groups(alive).findings == [] and D.exploration_collapse(alive).findings == []


def test_dead_groups_of_one_repeated_completion_are_told_from_diverse_ones_that_all_fail(tmp_path):
    """Only groups dead because their samples repeat one completion (a cold sampler) give `grpo.dead_identical` and
    keep the temperature among the dead-groups knobs; groups of diverse completions that all fail (a sampler already
    too hot, or instances too hard) do not: there a higher temperature was proposed and made things worse (a held-out
    hot-temperature scenario: 1.5 -> 1.3 promoted, then 1.3 -> 1.72 proposed twice on dead, diverse groups)."""
    cold = [mk(5, "hole", group=g, completion="A1: RIGHT\nA2: UP") for g in range(4) for _ in range(4)]
    hot = [mk(5, "parse_error", group=g, completion=f"garbage {g} {j}") for g in range(4) for j in range(4)]
    c = D.dead_groups(cold)
    assert [(f.code, f.rate) for f in c.findings] == [("grpo.dead_groups", 1.0), ("grpo.dead_identical", 1.0)]
    assert "recipe.temperature" in c.findings[0].knobs and c.findings[1].knobs == ["recipe.temperature"]
    h = D.dead_groups(hot)
    assert [f.code for f in h.findings] == ["grpo.dead_groups"] and h.metrics["dead_identical"] == 0.0
    assert h.findings[0].knobs == ["recipe.num_generations"]
    # half the groups identical, half diverse: both findings at 0.5, the temperature still a dead-groups knob
    mixed = D.dead_groups(cold[:8] + [r.model_copy(update={"group": r.group + 10}) for r in hot[:8]])
    assert [(f.code, f.rate) for f in mixed.findings] == [("grpo.dead_groups", 1.0), ("grpo.dead_identical", 0.5)]
    assert "recipe.temperature" in mixed.findings[0].knobs
    from skills.library import SkillLibrary

    with SkillLibrary.open(tmp_path / "skills.db") as lib:  # the seed skill that raises the temperature listens to the identical ones
        (skill,) = [s for s in lib.all() if s.name == "raise-temperature-on-dead-groups"]
    assert skill.trigger.findings == ["grpo.dead_identical"]


def test_dead_groups_from_training_metrics_when_probe_has_no_groups():
    rs = [mk(5) for _ in range(4)]
    tm = [{"step": i, "reward_mean": 0.2, "dead_group_share": 0.7} for i in range(5)]
    f = D.dead_groups(rs, tm).findings[0]
    assert f.code == "grpo.dead_groups" and f.rate == 0.7


def test_reward_hacking_series():
    rising = [{"step": i, "reward_mean": 0.1 + 0.05 * i} for i in range(9)]
    hack = D.reward_hacking(rising, valid_history=[0.40, 0.38])
    assert hack.findings[0].code == "grpo.reward_hacking" and hack.findings[0].severity == "critical"
    assert hack.metrics["reward_rise"] == pytest.approx(0.3)  # thirds: 0.15 -> 0.45
    assert D.reward_hacking(rising, valid_history=[0.30, 0.45]).findings == []  # valid rises with reward: fine
    flat = [{"step": i, "reward_mean": 0.3} for i in range(9)]
    assert D.reward_hacking(flat, valid_history=[0.4, 0.3]).findings == []
    assert D.reward_hacking(rising[:2], valid_history=[0.4, 0.3]).findings == []  # too short to judge


def test_reward_hacking_reads_the_rewards_own_completions_when_the_steps_carry_their_validity():
    """The steps' own valid share (what `harness.backtest.train_arm` records from the reward's scoring calls) decides,
    not the probe valid rate between stages (other instances, other samples). Would catch: an honestly improving
    stage whose probe valid dipped by noise called a hacked reward (as in 36% of simulated stages), and a hacked one
    (the reward's own completions less often valid) passed because the probes rose."""
    honest = [{"step": i, "reward_mean": 0.1 + 0.05 * i, "valid": 0.30 + 0.02 * i} for i in range(9)]
    assert D.reward_hacking(honest, valid_history=[0.40, 0.38]).findings == []
    hacked = [{"step": i, "reward_mean": 0.1 + 0.05 * i, "valid": 0.30 - 0.01 * i} for i in range(9)]
    f = D.reward_hacking(hacked, valid_history=[0.30, 0.45]).findings[0]
    assert f.code == "grpo.reward_hacking" and "valid went 0.290 -> 0.230" in f.message


def test_reward_hacking_cannot_fire_when_the_reward_is_validity():
    """Under a binary reward (one value for valid, one for invalid) reward and validity cannot diverge: the finding
    would send the engineer after a veto that can never block anything (issue: fired at 0.05 under a 0/1 reward)."""
    rising = [{"step": i, "reward_mean": 0.1 + 0.05 * i} for i in range(9)]
    binary = [mk(5), mk(5, "hole"), mk(4), mk(3, "conflict")]
    quiet = D.reward_hacking(rising, valid_history=[0.40, 0.38], rollouts=binary)
    assert quiet.findings == [] and quiet.metrics == {"reward_is_validity": 1.0}
    shaped = [mk(5), mk(5, "hole", reward=0.25), mk(4, "hole", reward=0.5), mk(3, "conflict")]  # partial credit
    assert not D.reward_is_validity(shaped)
    assert D.reward_hacking(rising, valid_history=[0.40, 0.38], rollouts=shaped).findings[0].code == "grpo.reward_hacking"
    bonus = [mk(5, reward=1.5), mk(5, reward=1.0, optimal=False), mk(3, "conflict")]  # an optimal bonus: not validity
    assert not D.reward_is_validity(bonus)
    codes = {f.code for r in D.builtin_diagnostics(binary, rising, [0.40, 0.38]) for f in r.findings}
    assert "grpo.reward_hacking" not in codes  # the built-ins pass the rollouts through


def test_length_collapse_and_explosion():
    down = [{"completion_length": v} for v in (60, 58, 55, 30, 20, 18)]
    up = [{"completion_length": v} for v in (20, 22, 25, 50, 60, 64)]
    assert [f.code for f in D.length_health([], down).findings] == ["grpo.length_collapse"]
    assert [f.code for f in D.length_health([], up).findings] == ["grpo.length_explosion"]
    assert D.length_health([mk(5) for _ in range(4)], [{"completion_length": 30}] * 6).findings == []


def test_truncation_is_its_own_finding_and_not_a_task_failure_or_an_explosion():
    """A budget shorter than what the policy writes (most completions clipped, length steady) is `grpo.truncated`,
    pointing at the completion budget only; clipping while the length doubles is the explosion; a task's own
    "too long" failure (a plan over its step cap, which did end) is not truncation; a little clipping is nothing."""
    steady = [{"completion_length": 18.0, "clipped_ratio": c} for c in (0.7, 0.72, 0.68, 0.75, 0.7, 0.71)]
    (f,) = D.length_health([], steady).findings
    assert (f.code, f.knobs, f.severity, f.rate) == ("grpo.truncated", ["recipe.max_completion_length"], "critical",
                                                      0.705)  # critical from 0.3: the root cause of every group
    exploding = [{"completion_length": v, "clipped_ratio": 0.8} for v in (20, 22, 25, 50, 60, 64)]
    assert [f.code for f in D.length_health([], exploding).findings] == ["grpo.length_explosion"]
    plan_over_cap = [mk(5, "too_long") for _ in range(4)] + [mk(5)]
    assert D.length_health(plan_over_cap).findings == []
    few = [{"completion_length": 18.0, "clipped_ratio": 0.1}] * 6
    assert D.length_health([], few).findings == [] and D.length_health([], few).metrics["clipped_ratio"] == 0.1
    # cut-off completions repeat one another (a confident policy's first tokens agree): with truncation found, the
    # sampler findings are withheld, so the engineer raises the budget, not the temperature (held-out code scenario
    # at 6 tokens: 1.0 -> 1.5 promoted before the budget); without it they stand
    same = [mk(5, "hole", group=g, completion="A1: RIGHT") for g in range(4) for _ in range(4)]
    cut = {f.code for r in D.builtin_diagnostics(same, steady) for f in r.findings}
    assert "grpo.truncated" in cut and not cut & {"grpo.dead_identical", "grpo.exploration_collapse"}
    whole = {f.code for r in D.builtin_diagnostics(same, few) for f in r.findings}
    assert {"grpo.dead_identical", "grpo.exploration_collapse"} <= whole
    # the family's own format failures too: a plan cut short does not parse, and `mapf.parse_error` triggers the same
    # temperature cut (`lower-temperature-on-parse-errors`)
    unparsed = [mk(5, "parse_error", group=g, completion=f"A1: {g}") for g in range(4) for _ in range(4)]
    cut = {f.code for r in D.builtin_diagnostics(unparsed, steady) for f in r.findings}
    assert "grpo.truncated" in cut and "mapf.parse_error" not in cut
    assert "mapf.parse_error" in {f.code for r in D.builtin_diagnostics(unparsed, few) for f in r.findings}


def test_malformed_answers_blame_the_sampler_only_when_the_start_policy_writes_them_too():
    """`grpo.malformed`: the share of answers the task cannot check at all (its `format_failures`: MAPF's unparseable
    plans and wrong agent counts, math's empty or non-integer answers, code's empty or non-compiling programs), from the
    trained AND the stage's start policy (the lower of the two). Would catch a finding that names one family, one that
    fires on ordinary wrong answers, one that blames the sampler for a format the stage's training broke (a collapsing
    learning rate: the start policy's answers parse), or one raised under truncation (cut answers do not parse)."""
    hot = [mk(5, "parse_error") for _ in range(6)] + [mk(5, "wrong_agent_count") for _ in range(2)] + \
        [mk(5, "hole") for _ in range(8)]
    (f,) = D.malformed_answers(hot).findings
    assert (f.code, f.knobs, f.severity, f.rate, f.count) == ("grpo.malformed", ["recipe.temperature"], "critical",
                                                               0.5, 8)
    assert "parse_error 6" in f.message
    assert D.malformed_answers([mk(5, "hole") for _ in range(8)]).findings == []  # wrong, but checkable
    assert D.malformed_answers(hot, start=[mk(5) for _ in range(16)]).findings == []  # the start parses: training broke it
    (g,) = D.malformed_answers(hot, start=[mk(5, "parse_error") for _ in range(4)] + [mk(5) for _ in range(12)]).findings
    assert g.rate == 0.25 and g.severity == "warn"  # the lower of the two policies' shares
    # family-neutral: math's and code's own format failures, not their wrong answers
    for task, bad, ok in (("math", "parse_error", "wrong"), ("code", "syntax_error", "wrong_output")):
        rs = [mk(5, bad) for _ in range(5)] + [mk(5, ok) for _ in range(5)]
        for r in rs:
            r.instance["task"] = task
        (h,) = D.malformed_answers(rs).findings
        assert h.rate == 0.5, task
        assert D.malformed_answers([r for r in rs if r.failure == ok]).findings == [], task
    # cut-off answers do not parse either: under truncation it is withheld with the other sampler findings
    steady = [{"completion_length": 18.0, "clipped_ratio": 0.7}] * 6
    assert "grpo.malformed" not in {f.code for r in D.builtin_diagnostics(hot, steady) for f in r.findings}
    assert "grpo.malformed" in {f.code for r in D.builtin_diagnostics(hot, []) for f in r.findings}


def test_partial_credit_that_makes_most_of_grpos_signal_is_reward_diluted_and_binary_or_bonus_spread_is_not():
    """`grpo.reward_diluted`: per live group (GRPO weighs each alike), the share of the reward's spread among
    checkable wrong answers (partial credit) against the right/wrong contrast, averaged. Would catch a finding that
    fires on a binary reward, on a format penalty's spread (its own knob), on a quality bonus among valid answers, on
    too few live groups, or one that pools spreads across groups (small partial-credit spreads then vanish: the held-out
    math reward read 0.17-0.22 pooled, 0.51-0.62 per group)."""
    def grp(g, rewards, valid, failure="hole"):
        return [mk(5, None if v else failure, reward=r, group=g) for r, v in zip(rewards, valid, strict=True)]

    # 8 groups of wrong answers spread by partial credit, 4 with one right answer: most groups' signal is credit
    diluted = [r for g in range(8) for r in grp(g, [0.2, 0.5, 0.7, 0.1], [False] * 4)] + \
        [r for g in range(8, 12) for r in grp(g, [1.0, 0.0, 0.0, 0.0], [True, False, False, False])]
    (f,) = D.reward_diluted(diluted).findings
    assert (f.code, f.severity, f.knobs, f.count) == ("grpo.reward_diluted", "critical", ["reward.partial_credit"], 12)
    assert f.rate == pytest.approx(8 / 12, abs=1e-3)
    binary = [r for g in range(12) for r in grp(g, [1.0, 0.0, 0.0, 0.0], [True, False, False, False])]
    assert D.reward_diluted(binary).findings == [] and D.reward_diluted(binary).metrics["partial_credit_signal"] == 0
    fmt = [r for g in range(12) for r in grp(g, [0.0, -0.5, 0.0, -0.5], [False] * 4, "parse_error")]
    assert D.reward_diluted(fmt).findings == []  # a format penalty's spread is not partial credit
    bonus = [r for g in range(12) for r in grp(g, [1.5, 1.0, 0.0, 0.0], [True, True, False, False])]
    assert D.reward_diluted(bonus).findings == []  # an optimal bonus spreads valid answers: aligned with the judge
    assert D.reward_diluted(diluted[:6 * 4]).findings == []  # 6 live groups: too few to read
    assert "grpo.reward_diluted" in {f.code for r in D.builtin_diagnostics(diluted, []) for f in r.findings}


# --- evolved diagnostics in the sandbox --------------------------------------------------------------------------------

GOOD = '''
def diagnose(rollouts):
    bad = [r for r in rollouts if r["failure"] == "hole"]
    return {"findings": [{"code": "holes", "severity": "warn", "count": len(bad), "rate": len(bad) / len(rollouts),
                          "examples": ["seed=%d" % r["seed"] for r in bad][:3]}],
            "metrics": {"hole_share": len(bad) / len(rollouts)}}

def veto(control, candidate):
    if candidate["diagnostic"]["hole_share"] > control["diagnostic"]["hole_share"] + 0.2:
        return "hole failures up by more than 20 points"
    return None
'''
RAISES = "def diagnose(rollouts):\n    raise RuntimeError('boom')\n"
LOOPS = "def diagnose(rollouts):\n    while True:\n        pass\n"
EATS = "def diagnose(rollouts):\n    xs = []\n    while True:\n        xs.append(bytearray(1 << 26))\n"
BAD_OUTPUT = "def diagnose(rollouts):\n    return [1, 2]\n"


def test_evolved_diagnostic_runs_and_is_namespaced():
    rs = [mk(5, "hole"), mk(5), mk(5), mk(5)]
    res = D.run_evolved("diagnostics/holes.py", GOOD, rs, FAST)
    assert res.error is None and res.name == "evolved.holes"
    assert res.findings[0].code == "evolved.holes.holes" and res.findings[0].count == 1
    assert res.metrics == {"hole_share": 0.25}


@pytest.mark.parametrize("src,status", [(RAISES, "error"), (LOOPS, "timeout"), (EATS, "memory"),
                                        (BAD_OUTPUT, "bad output")])
def test_broken_evolved_diagnostic_gives_error_and_caller_goes_on(src, status):
    rs = [mk(5, "hole"), mk(5)]
    limits = FAST.model_copy(update={"cpu_s": 5, "wall_s": 8.0}) if status == "memory" else FAST  # memory, not CPU
    out = D.run_evolved_all({"diagnostics/broken.py": src, "diagnostics/holes.py": GOOD, "env.yaml": "x: 1"}, rs, limits)
    assert [r.name for r in out] == ["evolved.broken", "evolved.holes"]
    assert out[0].error and out[0].error.startswith(status) and out[0].findings == []
    assert out[1].error is None and out[1].metrics["hole_share"] == 0.5  # the next one still ran


def _returns(body: str) -> str:
    return f"def diagnose(rollouts):\n    return {body}\n"


@pytest.mark.parametrize("body,names", [
    ('{"findings": [], "metrics": [1]}', "`metrics` must be an object"),
    ('{"findings": 5}', "`findings` must be a list"),
    ('{"findings": [{"code": "x", "examples": 5}]}', "`examples` must be a list"),
    ('{"findings": [{"code": "x", "count": 10**30}]}', "count"),
    ('{"findings": [{"code": "x", "rate": float("nan")}]}', "rate"),
    ('{"findings": [{"code": "x", "rate": float("inf")}]}', "rate"),
    ('{"findings": [{"code": "x", "slice": {"a,b": "x"}}]}', "slice"),
    ('{"findings": [{"code": "x", "slice": {"a=b": "5"}}]}', "slice"),
    ('{"findings": [{"code": "x", "slice": {"size": "B....a.." * 20}}]}', "a slice key and value of at most"),
    ('{"findings": [{"code": "x", "slice": []}]}', "slice"),
    ('{"findings": [{"code": "two words\\nand a line"}]}', "must be an identifier"),
    ('{"findings": [{"code": "x", "count": True}]}', "count"),
])
def test_an_evolved_result_the_loop_could_not_store_or_reread_is_bad_output_naming_the_field(body, names):
    """Before, these passed into the loop and crashed it later: a list `metrics` raised AttributeError out of
    run_evolved (whose contract is never to raise), a 10**30 count overflowed SQLite in record_findings, a NaN rate broke
    the Diagnosis' JSON round trip in node_propose, a slice key with ',' broke every later store.findings()."""
    res = D.run_evolved("diagnostics/d.py", _returns(body), [mk(5, "hole"), mk(5)], FAST)
    assert res.error and res.error.startswith("bad output") and names in res.error, res.error
    assert res.findings == []


def test_a_long_message_is_cut_and_a_good_result_round_trips_through_the_store(tmp_path):
    from harness.store import RunStore

    res = D.run_evolved("diagnostics/d.py", _returns(
        '{"findings": [{"code": "slow", "count": 3, "rate": 0.5, "slice": {"size": "5"}, "message": "x" * 200000}]}'),
        [mk(5, "hole"), mk(5)], FAST)
    assert res.error is None and len(res.findings[0].message) == D.MESSAGE_CHARS
    store = RunStore.open(tmp_path / "run.db")
    store.create_run("r", {})
    store.record_findings("r", 1, res.findings)
    assert store.findings("r", stage=1) == res.findings
    ranged = [D.Finding(code="evolved.d.r", slice={"range": "<=5"})]  # an '=' in a value reads back at the first '='
    store.record_findings("r", 2, ranged)
    assert store.findings("r", stage=2) == ranged


def test_an_evolved_example_that_names_a_held_out_seed_is_that_diagnostics_error_not_the_diagnosis_crash():
    """Before, `build_diagnosis` raised SplitError for the whole stage (and again on every resume, the file being on
    main): any text with `seed=<n>` of a backtest or test seed did it."""
    seed = seed_for("backtest", 7)
    leak = _returns('{"findings": [{"code": "note", "severity": "info", "examples": ["retry with seed=' + str(seed)
                    + '"]}]}')
    d = D.build_diagnosis(MAPF, 2, _probe_set(), ENV, {}, [], stages_left=1, budget_left_s=None,
                          diagnostics_files={"diagnostics/leak.py": leak, "diagnostics/holes.py": GOOD})
    assert "backtest instance" in d.diagnostic_errors["evolved.leak"]
    assert not any(f.code.startswith("evolved.leak") for f in d.findings)
    assert any(f.code == "evolved.holes.holes" for f in d.findings)  # the other file still speaks


def test_a_veto_that_forges_the_drivers_answer_blocks_with_a_reason_instead_of_raising():
    forge = ("import sys\n_m = sys.modules['__main__']\n_orig = _m._dumps\n"
             "def _forge(v, _orig=_orig):\n"
             "    return '[\"not a dict\"]' if isinstance(v, dict) and 'has_veto' in v else _orig(v)\n"
             "_m._dumps = _forge\n"
             "def veto(control, candidate):\n    return None\n")
    rs = [mk(5, "hole"), mk(5)]
    why = D.veto_one("diagnostics/forge.py", forge, rs, rs, D.arm_metrics(rs), D.arm_metrics(rs), FAST)
    assert why is not None and why.startswith("forge: veto failed: bad output"), why


def test_without_bubblewrap_evolved_code_is_refused_unless_the_config_says_so(monkeypatch):
    from sandbox import runner

    monkeypatch.setattr(runner, "find_bwrap", lambda: None)
    rs = [mk(5, "hole"), mk(5)]
    res = D.run_evolved("diagnostics/holes.py", GOOD, rs, FAST)
    assert res.error and "refused" in res.error and "bubblewrap" in res.error and res.findings == []
    control = [mk(5)] * 4
    [block] = D.run_vetoes({"diagnostics/holes.py": GOOD}, control, rs, D.arm_metrics(control), D.arm_metrics(rs), FAST)
    assert "veto failed" in block and "refused" in block  # a check that cannot run blocks
    try:
        D.allow_unisolated(True)  # `sandbox: {allow_unisolated_diagnostics: true}` in the run config
        monkeypatch.setattr(runner, "_WARNED", False)
        with pytest.warns(RuntimeWarning):
            res = D.run_evolved("diagnostics/holes.py", GOOD, rs, FAST)
        assert res.error is None and res.metrics == {"hole_share": 0.5}
    finally:
        D.allow_unisolated(False)


def test_veto_fires_and_is_reported():
    control = [mk(5, "hole")] + [mk(5) for _ in range(9)]
    cand = [mk(5, "hole") for _ in range(5)] + [mk(5) for _ in range(5)]
    files = {"diagnostics/holes.py": GOOD, "diagnostics/no_veto.py": "def diagnose(r):\n    return {}\n"}
    blocks = D.run_vetoes(files, control, cand, D.arm_metrics(control), D.arm_metrics(cand), FAST)
    assert blocks == ["holes: hole failures up by more than 20 points"]
    assert D.run_vetoes(files, control, control, D.arm_metrics(control), D.arm_metrics(control), FAST) == []
    crash = {"diagnostics/crash.py": "def diagnose(r):\n    return {}\ndef veto(a, b):\n    return 1 / 0\n"}
    [reason] = D.run_vetoes(crash, control, cand, D.arm_metrics(control), D.arm_metrics(cand), FAST)
    assert reason.startswith("crash: veto failed: error") and "ZeroDivisionError" in reason


def test_arm_metrics_shape():
    m = D.arm_metrics([mk(5), mk(5, "hole"), mk(7)])
    assert m["valid"] == pytest.approx(0.6667) and m["by_slice"]["size=5"]["valid"] == 0.5 and m["n"] == 3


# --- the Diagnosis bundle ---------------------------------------------------------------------------------------------


MAPF = get_task("mapf")
ENV = MAPF.default_config()


def scored(n_groups: int = 6) -> list[Rollout]:
    """Real MAPF instances on probe seeds, completions scored by the real scorer: expert (valid), agent A one move
    short (goal_not_reached, a near miss), garbage (parse_error)."""
    out = []
    for g in range(n_groups):
        inst = MAPF.generate(ENV, seed_for("probe", 100 + g))
        expert = MAPF.expert(inst).splitlines()
        for text in ("\n".join(expert), "\n".join([expert[0][:-1]] + expert[1:]), "nothing"):
            o = MAPF.score(inst, text)
            out.append(Rollout(seed=inst.seed, group=g, instance=inst.model_dump(mode="json"), prompt=MAPF.prompt(inst),
                               completion=text, valid=o.valid, optimal=o.optimal, reward=o.reward, failure=o.failure,
                               where=o.where, metrics=o.metrics, slices=MAPF.slices(inst), tokens=len(text)))
    return out


def test_builtins_on_scored_mapf_rollouts():
    rs = scored()
    codes_seen = {f.code for res in D.builtin_diagnostics(rs) for f in res.findings}
    assert "mapf.parse_error" in codes_seen and "mapf.near_miss" in codes_seen, codes_seen
    assert codes_seen <= D.builtin_codes("mapf", MAPF.spec.failure_types)
    assert D.quality_gap(rs).metrics["makespan_gap"] == 0.0  # expert plans are optimal
    assert D.dead_groups(rs).metrics["dead_groups"] == 0.0  # every group mixes valid and failing plans


HISTORY = [
    HistoryItem(stage=0, candidate="default", knob="", change="round-0 random config", verdict="default"),
    HistoryItem(stage=1, candidate="s1.hole", knob="env.sizes.5.hole_ratio", change="0.1 -> 0.2", verdict="rejected",
                effect=-0.02, ci=(-0.06, 0.01), reason="lower bound below min effect"),
    HistoryItem(stage=2, candidate="s2.temp", knob="recipe.temperature", change="1.0 -> 1.2", verdict="rejected",
                effect=0.01, ci=(-0.03, 0.04), reason="no evidence"),
]


def _probe_set():
    return ([mk(3) for _ in range(8)] + [mk(5, "hole") for _ in range(4)] + [mk(5, "vertex_conflict") for _ in range(2)]
            + [mk(5) for _ in range(4)])


def test_diagnosis_roundtrip_and_text():
    d = D.build_diagnosis(MAPF, 3, _probe_set(), ENV, {"temperature": 1.0}, HISTORY, stages_left=2,
                          budget_left_s=600.0, diagnostics_files={"diagnostics/holes.py": GOOD},
                          shaping=MAPF.spec.shaping_model(), state="abc123", env_stats_n=8)
    assert Diagnosis.model_validate_json(d.model_dump_json()) == d
    assert [h.candidate for h in d.history] == ["s1.hole", "s2.temp"]  # no round-0 default
    assert d.consecutive_rejections == 2 and d.step_scale == 1.0  # no fallback yet (3 rejections in a row make one)
    # stage.rejections_before_fallback and stage.step_shrink set when and by how much the step shrinks
    for before, shrink, want in ((2, 0.5, 0.5), (1, 0.5, 0.25), (1, 0.8, 0.64), (3, 0.5, 1.0)):
        d2 = D.build_diagnosis(MAPF, 3, _probe_set(), ENV, {}, HISTORY, 2, 600.0, env_stats={},
                               rejections_before_fallback=before, step_shrink=shrink)
        assert d2.step_scale == pytest.approx(want), (before, shrink, d2.step_scale)
    assert d.overall["valid"] == pytest.approx(12 / 18, abs=1e-3) and d.by_slice["size=5"]["n"] == 10
    assert d.env_stats["n"] == 8 and d.recipe["reward"]["partial_credit"] == 0.5 and d.state == "abc123"
    assert d.env_config["sizes"][0]["size"] == 3 and d.metrics["evolved.holes.hole_share"] == pytest.approx(4 / 18, abs=1e-3)
    assert d.metrics["failure.hole.size=5"] == 0.4 and d.diagnostic_errors == {}
    text = D.diagnosis_text(d)
    assert "mapf.hole (size=5): count=4 rate=0.4" in text
    assert "evolved.holes.holes" in text
    assert "s1.hole: env.sizes.5.hole_ratio 0.1 -> 0.2 -> rejected" in text and "round-0" not in text
    assert "default" not in text
    assert "round=3 stages_left=2" in text and "budget_left_s: 600" in text
    assert "  sizes: size=5 data_ratio=1.0 hole_ratio=0.2 wait_ratio=0.25 agents=2" in text
    assert len(text) < 4000


def test_hygiene_guard():
    rs = _probe_set() + [mk(5, "hole", split="backtest")]
    with pytest.raises(SplitError, match="probe"):
        D.build_diagnosis(MAPF, 1, rs, ENV, {}, [], stages_left=1, budget_left_s=None)
    leaky = D.Finding(code="evolved.x.y", examples=[f"seed={seed_for('test', 3)} size=5"])
    with pytest.raises(SplitError, match="test instance"):
        D.check_examples([leaky])
    D.check_examples([D.Finding(code="ok", examples=[f"seed={seed_for('probe', 3)}"])])


def test_seed_reward_hacking_veto_blocks_invalid_high_scoring_arm():
    from pathlib import Path

    import yaml

    text = (Path(__file__).resolve().parents[1] / "skills" / "seed" / "veto-reward-hacking.md").read_text()
    code = yaml.safe_load(text.split("---")[1])["intervention"]["code"]
    files = {"diagnostics/reward_hacking_veto.py": code}
    control = [mk(5) for _ in range(6)] + [mk(5, "hole", reward=0.2) for _ in range(4)]
    hacked = [mk(5) for _ in range(4)] + [mk(5, "hole", reward=1.2) for _ in range(6)]  # valid down, reward up
    better = [mk(5) for _ in range(8)] + [mk(5, "hole", reward=0.2) for _ in range(2)]  # both up: fine
    [block] = D.run_vetoes(files, control, hacked, D.arm_metrics(control), D.arm_metrics(hacked), FAST)
    assert block.startswith("reward_hacking_veto: reward rose by +0.440 while valid fell by -0.200")  # 0.68 -> 1.12
    assert D.run_vetoes(files, control, better, D.arm_metrics(control), D.arm_metrics(better), FAST) == []
    res = D.run_evolved("diagnostics/reward_hacking_veto.py", code, hacked, FAST)
    assert [f.code for f in res.findings] == ["evolved.reward_hacking_veto.invalid_outearns_valid"]


def test_veto_runs_only_for_files_that_can_define_one(monkeypatch):
    """A diagnostic without `veto` costs no sandbox run at gate time; any way of binding `veto` still runs (and
    blocks when it says so); unparseable source still goes to the sandbox, fails there and blocks."""
    calls = []
    real = D.run_function

    def spy(*a, **kw):
        calls.append(a[1])
        return real(*a, **kw)

    monkeypatch.setattr(D, "run_function", spy)
    no_veto = "def diagnose(rollouts):\n    return {'findings': [], 'metrics': {}}\n"
    assert D.veto_one("diagnostics/a.py", no_veto, [], [], {}, {}) is None and calls == []
    bound = no_veto + "veto = lambda control, candidate: 'always blocks'\n"
    assert D.veto_one("diagnostics/b.py", bound, [], [], {}, {}) == "b: always blocks" and len(calls) == 1
    broken = D.veto_one("diagnostics/c.py", "def veto(:\n", [], [], {}, {})
    assert broken is not None and "veto failed" in broken and len(calls) == 2


def test_reward_misaligned_fires_when_invalid_rollouts_outearn_valid_ones():
    """One stage's scored rollouts, no series: invalid completions paid at least the valid ones' mean reward (a valid
    plan earns 0.3, partial credit pays an invalid one up to 1.0) is a root cause; a reward that pays validity, or one
    whose partial credit stays below a valid answer's, is silent; too few of either kind says nothing."""
    valid = [mk(5, reward=0.3) for _ in range(4)]
    gamed = valid + [mk(5, "hole", reward=r) for r in (1.0, 0.5, 0.3, 0.0, 0.0)]
    f = D.reward_misaligned(gamed).findings
    assert [x.code for x in f] == ["grpo.reward_misaligned"] and f[0].severity == "critical"
    assert f[0].count == 3 and f[0].rate == pytest.approx(0.6) and "reward.partial_credit" in f[0].knobs
    assert D.reward_misaligned(gamed).metrics["valid_reward_mean"] == pytest.approx(0.3)
    honest = [mk(5, reward=1.0) for _ in range(4)] + [mk(5, "hole", reward=r) for r in (0.5, 0.25, 0.0, 0.5)]
    assert D.reward_misaligned(honest).findings == []  # partial credit below a valid plan's reward: aligned
    binary = [mk(5) for _ in range(4)] + [mk(5, "hole") for _ in range(4)]
    assert D.reward_misaligned(binary).findings == []
    assert D.reward_misaligned(valid + [mk(5, "hole", reward=1.0)] * 3).findings == []  # 3 invalid: too few
    assert D.reward_misaligned(gamed[:3] + gamed[4:]).metrics == {}  # 3 valid: too few
    codes = {x.code for r in D.builtin_diagnostics(gamed) for x in r.findings}
    assert "grpo.reward_misaligned" in codes and "grpo.reward_misaligned" in D.builtin_codes("mapf", [])


def test_a_slice_verdict_needs_several_instances_not_several_samples_of_one():
    """Four samples of one instance are one draw of the slice: no `mastered`/`frontier` verdict on them (an outside
    review found `mapf.mastered` from one instance's four samples, with probe_samples 4, driving a mixture change);
    four instances with one sample each get one. Would catch the threshold counted over rollouts again."""
    one = [mk(3).model_copy(update={"seed": 7}) for _ in range(4)]  # one instance, four samples, all valid
    assert not [f for f in D.competence_frontier(one).findings if f.slice.get("size") == "3"]
    four = [mk(3) for _ in range(4)]  # four instances
    assert [(f.code, f.rate) for f in D.competence_frontier(four).findings] == [("mapf.mastered", 1.0)]
    assert D.slice_stats(one, "size")["size=3"]["instances"] == 1.0
