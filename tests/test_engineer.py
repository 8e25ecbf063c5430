"""Engineers: reply validation (malformed JSON, unknown knob, out of range, two factors), the scripted engineer with
retries and the rule fallback, and the rule engineer's choice (applicable skills, never a rejected change again,
Thompson sampling follows evidence, in-family before borrowed). Real skill library (sqlite in tmp), no LLM.

    .venv/bin/pytest tests/test_engineer.py -q
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from harness.engineer import EngineerConfig, propose
from harness.engineer.proposal import Knob, ProposalError, change_key, parse_reply
from harness.records import Change, Diagnosis, Finding, HistoryItem
from skills.library import SkillLibrary
from skills.model import Intervention, Skill, Trigger

SPACE = {
    "env.sizes.3.hole_ratio": Knob(path="env.sizes.3.hole_ratio", kind="env", lo=0.0, hi=0.6, current=0.2),
    "env.sizes.5.hole_ratio": Knob(path="env.sizes.5.hole_ratio", kind="env", lo=0.0, hi=0.6, current=0.2),
    "env.sizes.5.data_ratio": Knob(path="env.sizes.5.data_ratio", kind="env", lo=0.0, hi=1.0, current=0.3),
    "env.sizes.5.wait_ratio": Knob(path="env.sizes.5.wait_ratio", kind="env", lo=0.0, hi=1.0, current=0.5),
    "recipe.temperature": Knob(path="recipe.temperature", kind="recipe", lo=0.3, hi=2.0, current=1.0),
    "recipe.num_generations": Knob(path="recipe.num_generations", kind="recipe", lo=2, hi=32, integer=True, current=8),
}


def _diag(**kw) -> Diagnosis:
    findings = [Finding(code="mapf.hole", severity="warn", count=12, rate=0.35, slice={"size": "5"}),
                Finding(code="grpo.dead_groups", severity="critical", count=9, rate=0.6)]
    return Diagnosis(**{"task": "mapf", "stage": 1, "state": "abc123", "findings": findings, **kw})


def _skill(name, codes, knob, op="add", value=0.1, cond="", domains=("mapf",), kind="env"):
    return Skill(name=name, kind=kind, trigger=Trigger(findings=list(codes), condition=cond),
                 intervention=Intervention(knob=knob, op=op, value=value), expected=f"{name} helps",
                 domains=list(domains))


@pytest.fixture
def lib(tmp_path):
    with SkillLibrary.open(tmp_path / "skills.db", seed_dir=None) as lib:
        yield lib


def _one(knob="env.sizes.5.hole_ratio", value=0.3, **kw):
    return {"knob": knob, "value": value, "rationale": "hole failures on 5x5", "expected": "fewer holes", **kw}


# --- reply validation -------------------------------------------------------------------------------------------------


def test_valid_reply_in_prose_and_fences_becomes_candidates():
    text = "Sure! Here is my proposal:\n```json\n" + json.dumps({"candidates": [_one(), _one("recipe.temperature",
                                                                                         1.3)]}) + "\n```\nThanks"
    cands, notes = parse_reply(text, _diag(), SPACE, 3, "llm")
    assert [c.change.knob for c in cands] == ["env.sizes.5.hole_ratio", "recipe.temperature"]
    assert cands[0].change.kind == "env" and cands[0].change.value == 0.3 and cands[0].old_value == 0.2
    assert cands[1].change.kind == "recipe" and cands[0].engineer == "llm" and cands[0].id.startswith("s1-env-sizes-5")
    assert notes == []


@pytest.mark.parametrize("text, reason", [
    ('{"candidates": [{"knob": "env.sizes.5.hole_ratio", "value": 0.3,', "malformed JSON"),
    ("I think we should raise the hole ratio.", "malformed JSON: no JSON object"),
    (json.dumps(_one(value=0.9)), "out of range: env.sizes.5.hole_ratio = 0.9"),
    (json.dumps(_one("recipe.temperature", 0.1)), "allowed range [0.3, 2]"),
    (json.dumps(_one("env.sizes.5.holes", 0.3)), "unknown knob 'env.sizes.5.holes'"),
    (json.dumps(_one(["env.sizes.5.hole_ratio", "recipe.temperature"], 0.3)), "two factors in one candidate"),
    (json.dumps(_one(value={"env.sizes.5.hole_ratio": 0.3, "recipe.temperature": 1.2})), "two factors"),
    (json.dumps(_one("env.sizes.5.hole_ratio, recipe.temperature")), "two factors"),
    (json.dumps({"candidates": [{**_one(), "changes": [_one(), _one("recipe.temperature", 1.2)]}]}), "two factors"),
    (json.dumps(_one("recipe.num_generations", 6.5)), "takes an integer"),
    (json.dumps(_one(value=0.2)), "is its current value"),
    (json.dumps({"candidates": [{"knob": "recipe.temperature", "value": 1.2}]}), "schema: candidates.0.rationale"),
    (json.dumps({"candidates": [{**_one(), "why": "x"}]}), "schema: candidates.0.why: Extra inputs"),
    (json.dumps({"knob": "diagnostics/x.py", "code": "def diagnose(r:\n", "rationale": "r", "expected": "e"}),
     "does not compile"),
    (json.dumps(_one(value=True)), "true is not a knob value"),  # was read as 1.0 (an outside attack)
    (json.dumps(_one("env.mixture", {"3": True, "4": 0.5, "5": 0.5})), "a weight of the mix is true/false"),
])
def test_invalid_replies_are_rejected_with_the_reason(text, reason):
    with pytest.raises(ProposalError) as exc:
        parse_reply(text, _diag(), SPACE, 3, "llm")
    assert reason in str(exc.value)


def test_already_rejected_and_over_limit_are_dropped_with_notes():
    d = _diag()
    key = change_key("abc123", Change(kind="env", knob="env.sizes.5.hole_ratio", value=0.3))
    text = json.dumps([_one(), _one("recipe.temperature", 1.3), _one("env.sizes.5.wait_ratio", 0.7),
                       _one("env.sizes.3.hole_ratio", 0.3)])
    cands, notes = parse_reply(text, d, SPACE, 2, "scripted", rejected_keys={key})
    assert [c.change.knob for c in cands] == ["recipe.temperature", "env.sizes.5.wait_ratio"]
    assert any("already rejected" in n for n in notes) and any("over max_candidates=2" in n for n in notes)


def test_a_refuted_value_respelt_is_the_same_change():
    """2, 2.0 and 2.00000 set a float knob alike, so they are one change: a refuted one is not proposed again
    respelt, and a re-test finds its earlier evidence (before: `2` and `2.0` had two keys, and a hostile engineer got a
    fresh test of a refuted change by writing it as a float). Values apart beyond 6 significant digits stay apart."""
    d = _diag()
    for refuted, respelt in ((2, 2.0), (2.0, 2), (1.5, 1.50000)):
        key = change_key("abc123", Change(kind="recipe", knob="recipe.temperature", value=refuted))
        with pytest.raises(ProposalError, match=r"recipe.temperature -> \S+ was already rejected from this state"):
            parse_reply(json.dumps([_one("recipe.temperature", respelt)]), d, SPACE, 2, "llm", rejected_keys={key})
    cands, _ = parse_reply(json.dumps([_one("recipe.temperature", 2)]), d, SPACE, 2, "llm")
    assert cands[0].change.value == 2.0 and isinstance(cands[0].change.value, float)  # the file says 2.0 as well
    assert change_key("s", Change(kind="recipe", knob="recipe.temperature", value=1.2)) != \
        change_key("s", Change(kind="recipe", knob="recipe.temperature", value=1.21))


def test_a_refuted_number_respelt_within_a_thousandth_is_the_same_change():
    """0.700001 for a refuted 0.7 (apart at 6 significant digits, so another `change_key`) is dropped as the refuted
    change, not given a fresh test (an outside attack, seventieth session: a respelt value re-tested a refuted change,
    which raises the false-promotion rate); 0.71 (a real step) and another state's refusal still go through."""
    from harness.engineer.proposal import REFUTED_SAME

    state = _diag().state

    def hist(value=0.7, st=state, verdict="rejected"):
        return HistoryItem(stage=1, candidate="s1c1", knob="recipe.temperature", change="x", verdict=verdict,
                           effect=-0.05, ci=(-0.09, -0.01), value=value, old=1.0,
                           key=change_key(st, Change(kind="recipe", knob="recipe.temperature", value=value)))

    d = _diag(stage=2, history=[hist()])
    from harness.engineer.proposal import rejected_keys_from_history

    keys = rejected_keys_from_history(d)
    with pytest.raises(ProposalError, match=r"is 0.7 respelt .*already rejected from this state"):
        parse_reply(json.dumps([_one("recipe.temperature", 0.700001)]), d, SPACE, 2, "llm", rejected_keys=keys)
    assert 0.700001 / 0.7 - 1 < REFUTED_SAME < 0.71 / 0.7 - 1
    for h, v in ((hist(), 0.71), (hist(st="other"), 0.700001), (hist(verdict="inconclusive"), 0.700001)):
        dd = _diag(stage=2, history=[h])
        cands, _ = parse_reply(json.dumps([_one("recipe.temperature", v)]), dd, SPACE, 2, "llm",
                               rejected_keys=rejected_keys_from_history(dd))
        assert [c.change.value for c in cands] == [v], (h, v)


def test_a_refuted_mixture_respelt_is_the_same_change():
    """A refuted `env.mixture` that adds a size, proposed again with the size written " 7", "+7", "07", "7.0" or in
    another script's digits, draws the same env (pydantic reads each as 7): the same change, refused, not a fresh
    test. So is a mixture within a thousandth (total variation) of a refuted one, as `_refuted_nearby` already did
    for numbers. Before (an outside review): each spelling, and the 0.001 nudge, was a new candidate whose env.yaml
    was byte-identical, or all but, to the refuted one's, a fresh test at full alpha. A real step and another state's
    refusal still go through. Would catch: mixture keys taken as written, the nearby check skipping mixtures."""
    from harness.engineer.proposal import knob_space, rejected_keys_from_history
    from harness.round0 import template_files
    from harness.tasks import get_task
    from harness.tasks.knobs import canonical_mixture
    from harness.vet import apply_change

    task = get_task("mapf")
    files = {**template_files(), "env.yaml": task.spec.round0_env}
    base = {"task": "mapf", "stage": 2, "state": "s0", "env_config": yaml.safe_load(files["env.yaml"]),
            "recipe": yaml.safe_load(files["recipe.yaml"])}
    space = knob_space(Diagnosis(**base), task)

    def hist(value, st="s0"):
        return HistoryItem(stage=1, candidate="s1c1", knob="env.mixture", change="x", verdict="rejected",
                           effect=-0.05, ci=(-0.09, -0.01), value=canonical_mixture(value), old=None,
                           key=change_key(st, Change(kind="env", knob="env.mixture", value=canonical_mixture(value))))

    def ask(history, mix):
        d = Diagnosis(**base, history=history)
        text = json.dumps({"knob": "env.mixture", "value": mix, "rationale": "r", "expected": "e"})
        return parse_reply(text, d, space, 3, "llm", rejected_keys=rejected_keys_from_history(d))

    refuted = {"3": 0.4, "4": 0.3, "7": 0.3}
    env = apply_change(files, Change(kind="env", knob="env.mixture", value=canonical_mixture(refuted)), task)
    for k in ("07", " 7", "+7", "7.0", "\u0667"):
        assert canonical_mixture({"3": 0.4, "4": 0.3, k: 0.3}) == canonical_mixture(refuted), k
        with pytest.raises(ProposalError, match="already rejected from this state"):
            ask([hist(refuted)], {"3": 0.4, "4": 0.3, k: 0.3})
    near = {"3": 0.401, "4": 0.299, "7": 0.3}
    with pytest.raises(ProposalError, match="respelt .*already rejected from this state"):
        ask([hist(refuted)], near)
    step = {"3": 0.5, "4": 0.2, "7": 0.3}
    for history, mix in (([hist(refuted)], step), ([hist(refuted, st="other")], near)):
        cands, _ = ask(history, mix)
        assert cands[0].change.value == canonical_mixture(mix)
    same = apply_change(files, Change(kind="env", knob="env.mixture",
                                      value=canonical_mixture({"3": 0.4, "4": 0.3, "+7": 0.3})), task)
    assert same["env.yaml"] == env["env.yaml"]


def test_the_prompt_offers_env_entry_only_for_fields_it_can_write():
    """A target entry whose differing field is a range (agents [2, 3]) cannot be written as `env.entry`'s value (a
    number per field): before, the prompt offered it and every reply that followed the offer was refused (an outside
    review). Now such a field is named as `env.target`'s, and a scalar difference is still offered. Would catch: a
    list-valued difference offered again, or the scalar ones dropped with it."""
    from harness.engineer.proposal import entry_text
    from harness.records import TargetSlice, TargetView

    def prompt(diff):
        view = TargetView(slice_key="size", config={"sizes": []}, differs=["size=5"],
                          slices=[TargetSlice(value="5", n=8, valid=0.3, target_share=0.33, mix_share=0.33,
                                              entry_diff=diff)])
        return entry_text(Diagnosis(task="mapf", stage=1, state="s0", env_config={}, recipe={}, target=view))

    assert prompt({"agents": [2, [2, 3]]}) == ""
    both = prompt({"agents": [2, [2, 3]], "hole_ratio": [0.45, 0.2]})
    assert "hole_ratio 0.45 (target 0.2)" in both and "agents 2" not in both and "in agents, a range" in both
    assert "hole_ratio 0.45 (target 0.2)" in prompt({"hole_ratio": [0.45, 0.2]})


def test_a_mixture_keyed_by_floats_or_padded_text_is_set_in_place():
    """`canonical_mixture` spells numeric keys one way ("1" for 1.0 and "01"), so `with_mixture` must match a config's
    entries by that spelling too: before, a family of one's own keyed by floats got a duplicate entry (the real one
    left at 0) and one keyed by zero-padded text could not apply its own current mix (an outside review of this
    session's change). And under `loss_type: cispo` the knob space offers no `recipe.epsilon` (cispo reads only its
    own cap: a change of epsilon would train both arms alike). Would catch: entries matched as written."""
    from pydantic import ConfigDict, create_model

    from harness.engineer.proposal import knob_space
    from harness.tasks.knobs import canonical_mixture, mixture_of, with_mixture

    def family(key_type):  # a family of one's own: levels keyed by `key_type`
        strict = ConfigDict(extra="forbid")
        entry = create_model("E", __config__=strict, level=(key_type, ...), data_ratio=(float, 1.0))
        return entry, create_model("C", __config__=strict, levels=(list[entry], ...))

    E, C = family(float)
    cfg = C(levels=[E(level=1.0, data_ratio=0.3), E(level=0.5, data_ratio=0.7)])
    out = with_mixture(cfg, "levels", "level", {"1": 0.6, "0.5": 0.4})
    assert [(e.level, e.data_ratio) for e in out.levels] == [(1.0, 0.6), (0.5, 0.4)]
    assert with_mixture(cfg, "levels", "level", mixture_of(cfg, "levels", "level")) == cfg

    T, D = family(str)
    padded = D(levels=[T(level="01", data_ratio=0.5), T(level="02", data_ratio=0.5)])
    assert with_mixture(padded, "levels", "level", mixture_of(padded, "levels", "level")) == padded
    assert canonical_mixture(mixture_of(padded, "levels", "level")) == {"1": 0.5, "2": 0.5}
    d = _diag()
    cispo = d.model_copy(update={"recipe": {**d.recipe, "loss_type": "cispo"}})
    assert "recipe.epsilon" in knob_space(d, None) and "recipe.epsilon" not in knob_space(cispo, None)


def test_diagnostic_candidate_is_one_file():
    src = "def diagnose(rollouts):\n    return {'findings': [], 'metrics': {}}\n"
    cands, _ = parse_reply(json.dumps({"knob": "diagnostics/plan_len.py", "code": src, "rationale": "r",
                                       "expected": "e"}), _diag(), SPACE, 1, "llm")
    assert cands[0].change.kind == "diagnostic" and cands[0].change.code == src and cands[0].change.value is None


# --- scripted engineer: retries, then the rule engineer steps in ------------------------------------------------------


def test_scripted_bad_replies_are_recorded_and_the_rule_engineer_steps_in(tmp_path, lib):
    lib.add(_skill("raise-holes", ["mapf.hole"], "env.sizes.{size}.hole_ratio"))
    script = tmp_path / "replay.yaml"
    script.write_text(yaml.safe_dump([
        None,  # stage 0: no reply scripted
        ['{"candidates": [{"knob": ', json.dumps(_one(value=5.0)),
         json.dumps(_one(["env.sizes.5.hole_ratio", "recipe.temperature"]))],  # stage 1: three bad attempts
        ["prose only", {"candidates": [_one("recipe.temperature", 1.4)]}],  # stage 2: bad, then good
    ]))
    cfg = EngineerConfig(kind="scripted", script=str(script), max_retries=2)
    res = propose(cfg, _diag(), lib, 2, np.random.default_rng(0), space=SPACE)
    assert [r.reason.split(":")[0] for r in res.rejected_replies] == ["malformed JSON", "out of range",
                                                                       "two factors in one candidate #0"]
    assert res.engineer_used == "rule" and "rule engineer stepped in" in res.notes
    assert any("no valid proposal in 3 attempt(s)" in n for n in res.notes)
    assert [c.change.knob for c in res.candidates] == ["env.sizes.5.hole_ratio"]  # the caller carries on

    res2 = propose(cfg, _diag(stage=2), lib, 2, np.random.default_rng(0), space=SPACE)
    assert res2.engineer_used == "scripted" and len(res2.rejected_replies) == 1
    assert res2.candidates[0].change.knob == "recipe.temperature" and res2.candidates[0].engineer == "scripted"

    res0 = propose(cfg, _diag(stage=0), lib, 2, np.random.default_rng(0), space=SPACE)
    assert res0.engineer_used == "rule" and any("no reply for stage 0" in n for n in res0.notes)


def test_scripted_jsonl_and_missing_file(tmp_path, lib):
    f = tmp_path / "replay.jsonl"
    f.write_text(json.dumps({"candidates": [_one()]}) + "\n" + json.dumps(["x", _one("recipe.temperature", 0.8)]) + "\n")
    res = propose(EngineerConfig(kind="scripted", script=str(f)), _diag(stage=1), lib, 1, np.random.default_rng(0), space=SPACE)
    assert res.engineer_used == "scripted" and res.candidates[0].change.value == 0.8
    res = propose(EngineerConfig(kind="scripted", script=str(tmp_path / "nope.yaml")), _diag(), lib, 1,
                  np.random.default_rng(0), space=SPACE)
    assert res.engineer_used == "rule" and any("not found" in n for n in res.notes)
    with pytest.raises(ValueError, match="needs script"):
        EngineerConfig(kind="scripted")
    for name, line in (("deep", "[" * 100_000), ("digits", "9" * 5000)):  # past the stack; past int's digit limit
        bad = tmp_path / f"{name}.jsonl"
        bad.write_text(line + "\n")
        res = propose(EngineerConfig(kind="scripted", script=str(bad)), _diag(stage=0), lib, 1,
                      np.random.default_rng(0), space=SPACE)  # before: RecursionError / ValueError out of propose()
        assert res.engineer_used == "rule" and any("cannot hold" in n for n in res.notes), res.notes


# --- rule engineer ----------------------------------------------------------------------------------------------------


def test_rule_chooses_applicable_skills_and_builds_concrete_changes(lib):
    lib.add(_skill("raise-holes", ["mapf.hole"], "env.sizes.{size}.hole_ratio", cond="rate >= 0.2"))
    lib.add(_skill("more-generations", ["grpo.dead_groups"], "recipe.num_generations", value=4, domains=()))
    lib.add(_skill("holes-if-rare", ["mapf.hole"], "env.sizes.{size}.wait_ratio", cond="rate < 0.1"))
    lib.add(_skill("unrelated", ["mapf.parse_error"], "recipe.temperature", value=-0.2))
    res = propose(EngineerConfig(), _diag(step_scale=0.5), lib, 5, np.random.default_rng(0), space=SPACE)
    got = {c.change.knob: c for c in res.candidates}
    assert set(got) == {"env.sizes.5.hole_ratio", "recipe.num_generations"}
    assert got["env.sizes.5.hole_ratio"].change.value == pytest.approx(0.25)  # 0.2 + 0.1 * step_scale 0.5
    assert got["recipe.num_generations"].change.value == 10 and got["recipe.num_generations"].skill == "more-generations"
    assert "mapf.hole on size=5: rate 0.35" in got["env.sizes.5.hole_ratio"].rationale


def test_rule_clamps_to_range_and_skips_a_knob_at_its_bound(lib):
    lib.add(_skill("big-holes", ["mapf.hole"], "env.sizes.{size}.hole_ratio", value=0.9))
    res = propose(EngineerConfig(), _diag(), lib, 2, np.random.default_rng(0), space=SPACE)
    assert res.candidates[0].change.value == 0.6
    space = {**SPACE, "env.sizes.5.hole_ratio": SPACE["env.sizes.5.hole_ratio"].model_copy(update={"current": 0.6})}
    res = propose(EngineerConfig(), _diag(), lib, 2, np.random.default_rng(0), space=space)
    assert res.candidates == [] and any("at its bound" in n for n in res.notes)


def test_a_step_scaled_with_the_rate_grows_with_the_finding_within_its_bounds(lib):
    """`scale_with_rate`: the step is the skill's own at the reference rate, k times as large at k times the rate
    (at most SEVERITY_MAX times, never smaller below it), and a skill without it ignores the rate; the step_scale of
    a fallback still multiplies. Would catch the factor applied the wrong way round, uncapped, or shrinking a step."""
    from skills.model import SEVERITY_MAX

    skill = Skill(name="hotter", kind="recipe", trigger=Trigger(findings=["grpo.dead_groups"]),
                  intervention=Intervention(knob="recipe.temperature", op="add", value=0.2, scale_with_rate=0.3),
                  expected="live groups")
    lib.add(skill)
    cold = {**SPACE, "recipe.temperature": SPACE["recipe.temperature"].model_copy(update={"current": 0.3})}

    def proposed(rate, step_scale=1.0, space=cold):
        d = Diagnosis(task="mapf", stage=1, state="abc", step_scale=step_scale,
                      findings=[Finding(code="grpo.dead_groups", severity="critical", count=64, rate=rate)])
        [c] = propose(EngineerConfig(), d, lib, 1, np.random.default_rng(0), space=space).candidates
        return c.change.value

    assert proposed(0.3) == pytest.approx(0.5)  # at the reference rate: the skill's own +0.2
    assert proposed(0.1) == pytest.approx(0.5)  # never smaller than its own step
    assert proposed(0.6) == pytest.approx(0.7)  # twice the rate: twice the step
    assert proposed(1.0) == pytest.approx(0.3 + 0.2 * SEVERITY_MAX)  # capped at SEVERITY_MAX (1.0 / 0.3 = 3.33)
    assert proposed(1.0, step_scale=0.5) == pytest.approx(0.6)  # a fallback's smaller steps still apply
    lib.add(skill.model_copy(update={"intervention": skill.intervention.model_copy(update={"scale_with_rate": None})}),
            replace=True)
    assert proposed(1.0) == pytest.approx(0.5)  # without it: the rate does not matter
    with pytest.raises(ValueError):
        Intervention(knob="recipe.temperature", op="add", value=0.2, scale_with_rate=0.0)


def test_a_shrinking_step_scaled_with_the_rate_divides_and_never_reaches_zero(tmp_path):
    """A `mul` step under 1 scaled by the finding (the seed skill lower-learning-rate-on-regression: a fall of 5
    points halves the rate, 10 divides it by 3, 15 or more by 4) is the mirror of a growing one, a division by
    1 + (1 / v - 1) x scale, so it stays positive at every scale; a fallback's smaller step still shrinks it less.
    Would catch the growth formula applied to a factor under 1 (at twice the reference rate it proposed 0, and the
    knob's lower bound), a scale ignored for shrinks, or a seed skill that lost its scaled step."""
    lib = SkillLibrary.open(tmp_path / "skills.db")  # the shipped seed skills
    space = {"recipe.learning_rate": Knob(path="recipe.learning_rate", kind="recipe", lo=1e-7, hi=1e-2,
                                          current=2e-4)}

    def proposed(fall, step_scale=1.0):
        d = Diagnosis(task="mapf", stage=2, state="abc", step_scale=step_scale,
                      findings=[Finding(code="grpo.policy_regressed", severity="critical", count=64, rate=fall)])
        res = propose(EngineerConfig(), d, lib, 3, np.random.default_rng(0), space=space)
        return [c.change.value for c in res.candidates if c.skill == "lower-learning-rate-on-regression"]

    assert proposed(0.03) == [pytest.approx(1e-4)]  # a small fall: the skill's own halving
    assert proposed(0.05) == [pytest.approx(1e-4)]
    assert proposed(0.10) == [pytest.approx(2e-4 / 3, rel=1e-5)]  # twice the reference fall: divided by 3
    assert proposed(0.40) == [pytest.approx(5e-5)]  # capped at SEVERITY_MAX: divided by 4
    assert proposed(0.10, step_scale=0.5) == [pytest.approx(1e-4)]  # half the scaled step: divided by 2
    assert proposed(0.05, step_scale=0.5) == [pytest.approx(2e-4 / 1.5, rel=1e-5)]


def test_a_step_stops_at_the_skills_own_limit(lib):
    """`stop_at`: a scaled step down stops at the limit, a knob already at or past it proposes nothing, and a step
    up stops there too. Would catch the malformed-answer skill cooling a sampler into identical groups (0.5 -> 0.1
    was proposed on a held-out truncation scenario, where the answers failed to parse because they were cut off)."""
    skill = Skill(name="cooler", kind="recipe", trigger=Trigger(findings=["mapf.parse_error"]),
                  intervention=Intervention(knob="recipe.temperature", op="add", value=-0.2, scale_with_rate=0.2,
                                            stop_at=0.5), expected="fewer malformed")
    lib.add(skill)

    def proposed(temperature, rate=0.8, name="cooler"):
        space = {**SPACE, "recipe.temperature": SPACE["recipe.temperature"].model_copy(update={"current": temperature})}
        d = Diagnosis(task="mapf", stage=1, state="abc",
                      findings=[Finding(code="mapf.parse_error", severity="critical", count=64, rate=rate)])
        res = propose(EngineerConfig(), d, lib, 1, np.random.default_rng(0), space=space)
        return [c.change.value for c in res.candidates if c.skill == name]

    assert proposed(1.5) == [pytest.approx(0.9)]  # -0.6, above the stop
    assert proposed(0.7) == [pytest.approx(0.5)]  # -0.6 would be 0.1: stopped at 0.5
    assert proposed(0.5) == [] and proposed(0.3) == []  # at or past it: nothing
    lib.add(skill.model_copy(update={"name": "hotter", "intervention": Intervention(
        knob="recipe.temperature", op="add", value=0.2, scale_with_rate=0.2, stop_at=1.5)}))
    assert proposed(1.4, name="hotter") == [pytest.approx(1.5)] and proposed(1.6, name="hotter") == []


def test_rule_never_repeats_a_change_rejected_from_the_same_state(lib):
    lib.add(_skill("raise-holes", ["mapf.hole"], "env.sizes.{size}.hole_ratio"))
    lib.add(_skill("more-data", ["mapf.hole"], "env.sizes.{size}.data_ratio"))
    rejected = Change(kind="env", knob="env.sizes.5.hole_ratio", value=0.3)
    other = Change(kind="env", knob="env.sizes.5.data_ratio", value=0.4)
    hist = [HistoryItem(stage=0, candidate="s0-a", knob=rejected.knob, change="0.2 -> 0.3", verdict="rejected",
                        key=change_key("abc123", rejected))]
    picks = {propose(EngineerConfig(), _diag(history=hist), lib, 1, np.random.default_rng(s), space=SPACE)
             .candidates[0].change.knob for s in range(20)}
    assert picks == {"env.sizes.5.data_ratio"}
    both = propose(EngineerConfig(), _diag(history=hist), lib, 2, np.random.default_rng(0), space=SPACE,
                   rejected_keys={change_key("abc123", other)})
    assert both.candidates == [] and sum("already rejected" in n for n in both.notes) == 2
    # from a DIFFERENT harness state the same change is a new experiment
    fresh = propose(EngineerConfig(), _diag(history=hist, state="def456"), lib, 2, np.random.default_rng(0),
                    space=SPACE, rejected_keys={change_key("abc123", rejected), change_key("abc123", other)})
    assert {c.change.knob for c in fresh.candidates} == {"env.sizes.5.hole_ratio", "env.sizes.5.data_ratio"}


def test_thompson_choice_follows_evidence(lib):
    lib.add(_skill("proven", ["mapf.hole"], "env.sizes.{size}.hole_ratio"))
    lib.add(_skill("dud", ["mapf.hole"], "env.sizes.{size}.data_ratio"))
    lib.add(_skill("new", ["mapf.hole"], "env.sizes.{size}.wait_ratio"))
    for i in range(10):
        lib.record_try("proven", promoted=i < 8, effect=0.05, interval=None, family="mapf", run="r", candidate=f"p{i}")
        lib.record_try("dud", promoted=False, effect=-0.01, interval=None, family="mapf", run="r", candidate=f"d{i}")
    firsts = [propose(EngineerConfig(), _diag(), lib, 1, np.random.default_rng(s), space=SPACE).candidates[0].skill
              for s in range(200)]
    share = {k: firsts.count(k) / 200 for k in ("proven", "dud", "new")}
    assert share["proven"] > 0.6 and share["dud"] < 0.03 and share["new"] > 0.05, share  # untried ones still explored
    # the same seed gives the same choice
    assert propose(EngineerConfig(), _diag(), lib, 1, np.random.default_rng(7), space=SPACE).candidates[0].skill \
        == firsts[7]


def test_borrowed_skills_only_when_in_family_are_exhausted(lib):
    lib.add(_skill("mapf-holes", ["mapf.hole"], "env.sizes.{size}.hole_ratio"))
    lib.add(_skill("math-temp", ["math.dead_groups", "grpo.dead_groups"], "recipe.temperature", value=0.3,
                   domains=("math",)))
    for i in range(5):  # the borrowed skill has the better record; it must still come second
        lib.record_try("math-temp", promoted=True, effect=0.1, interval=None, family="math", run="r", candidate=str(i))
    one = propose(EngineerConfig(), _diag(), lib, 1, np.random.default_rng(0), space=SPACE)
    assert [c.skill for c in one.candidates] == ["mapf-holes"]
    two = propose(EngineerConfig(), _diag(), lib, 2, np.random.default_rng(0), space=SPACE)
    assert [c.skill for c in two.candidates] == ["mapf-holes", "math-temp"]
    assert "borrowed from math" in two.candidates[1].rationale


def test_knob_space_of_the_template_harness_agrees_with_the_vet_step():
    """Every knob offered to the engineer, moved to the middle of its range, is a change `harness.vet.apply_change`
    accepts on the template harness (one source of truth for ranges)."""
    from pathlib import Path

    from harness.engineer.proposal import knob_space, vet_error
    from harness.tasks import get_task
    from harness.vet import apply_change

    template = Path(__file__).resolve().parents[1] / "sandbox" / "template"
    files = {str(p.relative_to(template)): p.read_text() for p in template.rglob("*") if p.is_file()}
    files["env.yaml"] = get_task("mapf").spec.round0_env  # MAPF's round-0 harness
    d = Diagnosis(task="mapf", stage=1, env_config=yaml.safe_load(files["env.yaml"]),
                  recipe=yaml.safe_load(files["recipe.yaml"]))
    task = get_task("mapf")
    space = knob_space(d, task)
    assert {"env.sizes.5.hole_ratio", "env.sizes.3.data_ratio", "recipe.temperature"} <= set(space)
    assert "recipe.steps" not in space  # a fixed-budget backtest cannot judge it
    assert space["env.sizes.5.hole_ratio"].current == 0.2 and space["recipe.num_generations"].integer
    for k in space.values():  # one step inside the range from the current value
        step = 1 if k.integer else round((k.hi - k.lo) / 10, 4)
        value = k.current + step if k.current + step <= k.hi else k.current - step
        if k.path == "recipe.num_generations":
            value = 16  # the Recipe model's own cross-field rule: batch_size (32) divisible by num_generations
        assert vet_error(d, Change(kind=k.kind, knob=k.path, value=value), task) is None, k.path
        apply_change(files, Change(kind=k.kind, knob=k.path, value=value), task)
    # a value inside the box but against a cross-field rule is refused early, with the vet step's reason
    text = json.dumps(_one("env.sizes.3.agents", 8))
    with pytest.raises(ProposalError, match="refused by the vet step: .*free cells"):
        parse_reply(text, d, space, 1, "llm")


def test_rule_with_the_seed_skills_on_the_template_harness(tmp_path):
    """The shipped seed skills on a realistic diagnosis of the template harness: concrete changes the vet step
    accepts; the parse-error skill stays out (its condition, rate >= 0.2, does not hold)."""
    from pathlib import Path

    from harness.tasks import get_task
    from harness.vet import apply_change

    template = Path(__file__).resolve().parents[1] / "sandbox" / "template"
    files = {str(p.relative_to(template)): p.read_text() for p in template.rglob("*") if p.is_file()}
    files["env.yaml"] = get_task("mapf").spec.round0_env  # MAPF's round-0 harness
    d = _diag(env_config=yaml.safe_load(files["env.yaml"]), recipe=yaml.safe_load(files["recipe.yaml"]),
              findings=[Finding(code="mapf.hole", severity="critical", count=20, rate=0.55, slice={"size": "5"}),
                        Finding(code="grpo.dead_groups", severity="warn", count=10, rate=0.4),
                        Finding(code="grpo.dead_identical", severity="warn", count=10, rate=0.4),
                        Finding(code="mapf.parse_error", severity="info", count=2, rate=0.05, slice={"size": "3"})])
    with SkillLibrary.open(tmp_path / "skills.db") as lib:
        res = propose(EngineerConfig(), d, lib, 3, np.random.default_rng(0))
    got = {c.change.knob: c.change.value for c in res.candidates}
    assert len(got) == 3 and got.pop("env.sizes.5.hole_ratio") == pytest.approx(0.3)
    assert set(got) <= {"recipe.temperature", "recipe.num_generations"}  # dead (and identical) groups: two skills
    assert got.get("recipe.num_generations", 16) == 16 and got.get("recipe.temperature", 1.2) > 1.0
    assert all(c.engineer == "rule" and c.skill for c in res.candidates)
    for c in res.candidates:
        apply_change(files, c.change, get_task("mapf"))


@pytest.mark.parametrize("task", ["mapf", "math", "code"])
def test_truncated_completions_get_a_doubled_budget_from_the_seed_skills_on_every_family(tmp_path, task):
    """`grpo.truncated` (most completions cut off by max_completion_length) is answered by the seed library with the
    budget doubled, first, on every family, and the vet step accepts the change; a small clipped share proposes
    nothing for it. Would catch a truncation finding with no skill (it used to be filed as a length explosion, whose
    knobs include the temperature) or a skill scoped to one family."""
    from pathlib import Path

    from harness.tasks import get_task
    from harness.vet import apply_change

    template = Path(__file__).resolve().parents[1] / "sandbox" / "template"
    files = {str(p.relative_to(template)): p.read_text() for p in template.rglob("*") if p.is_file()}
    files["env.yaml"] = get_task(task).spec.round0_env
    recipe = {**yaml.safe_load(files["recipe.yaml"]), "max_completion_length": 18}
    files["recipe.yaml"] = yaml.safe_dump(recipe)

    def first(rate):
        d = _diag(task=task, env_config=yaml.safe_load(files["env.yaml"]), recipe=recipe,
                  findings=[Finding(code="grpo.truncated", severity="critical", count=30, rate=rate,
                                    knobs=["recipe.max_completion_length"])])
        with SkillLibrary.open(tmp_path / "skills.db") as lib:
            return propose(EngineerConfig(), d, lib, 1, np.random.default_rng(0)).candidates

    [c] = first(0.3)
    assert (c.change.knob, c.change.value, c.skill) == ("recipe.max_completion_length", 36,
                                                        "raise-completion-budget-on-truncation")
    apply_change(files, c.change, get_task(task))
    assert first(0.95)[0].change.value == 72  # nearly every answer cut off: x4 (the step scaled 3x)
    assert all(c.change.knob != "recipe.max_completion_length" for c in first(0.1))


def test_a_hot_sampler_is_cooled_in_proportion_and_never_heated_by_dead_diverse_groups(tmp_path):
    """Sampling at 1.5: most plans malformed, groups dead but diverse (so no `grpo.dead_identical`). The seed skills
    lower the temperature by a step sized to the malformed share (-0.6 at 80%) and no candidate raises it. Would catch
    the dead-groups skill heating a sampler that is already too hot (seen on a held-out scenario: 1.3 -> 1.72)."""
    from pathlib import Path

    from harness.tasks import get_task

    template = Path(__file__).resolve().parents[1] / "sandbox" / "template"
    recipe = {**yaml.safe_load((template / "recipe.yaml").read_text()), "temperature": 1.5}
    d = _diag(env_config=yaml.safe_load(get_task("mapf").spec.round0_env), recipe=recipe,
              findings=[Finding(code="mapf.parse_error", severity="critical", count=80, rate=0.8, slice={"size": "5"}),
                        Finding(code="grpo.malformed", severity="critical", count=80, rate=0.8,
                                knobs=["recipe.temperature"]),  # what the diagnosis says beside the family's codes
                        Finding(code="grpo.dead_groups", severity="critical", count=58, rate=0.9,
                                knobs=["recipe.num_generations"])])
    with SkillLibrary.open(tmp_path / "skills.db") as lib:
        res = propose(EngineerConfig(), d, lib, 3, np.random.default_rng(0))
    temps = [c.change.value for c in res.candidates if c.change.knob == "recipe.temperature"]
    assert temps == [pytest.approx(0.9)], [(c.change.knob, c.change.value) for c in res.candidates]


def _one_slot_beside_symptoms(tmp_path, task: str, recipe_update: dict, cause: Finding):
    """One proposal slot for round 0's harness of `task` (its recipe updated), with two critical symptoms (every
    target slice failing, dead groups) beside a root-cause finding: what the rule engineer puts first."""
    from pathlib import Path

    from harness.tasks import get_task

    template = Path(__file__).resolve().parents[1] / "sandbox" / "template"
    recipe = {**yaml.safe_load((template / "recipe.yaml").read_text()), **recipe_update}
    d = _diag(task=task, env_config=yaml.safe_load(get_task(task).spec.round0_env), recipe=recipe,
              findings=[Finding(code="target.slice_fails", severity="critical", count=80, rate=1.0,
                                knobs=["env.mixture"]),
                        Finding(code="grpo.dead_groups", severity="critical", count=56, rate=0.875,
                                knobs=["recipe.num_generations"]), cause])
    with SkillLibrary.open(tmp_path / "skills.db") as lib:
        return propose(EngineerConfig(), d, lib, 1, np.random.default_rng(0))


@pytest.mark.parametrize("task", ["mapf", "math", "code"])
def test_a_sampler_that_writes_malformed_answers_is_cooled_first_on_every_family(tmp_path, task):
    """`grpo.malformed` is a root cause: at 1.6 a third of the answers cannot be checked and every group fails, so
    the critical symptoms (all-fail groups, failing target slices) would otherwise take both slots. The seed skill
    lowers the temperature, its step scaled to the share (-0.6 from 30%: the rest of a hot sampler's answers are
    checkable and wrong), on every family. Would catch the cooling skill scoped to
    one family (a held-out math scenario at 1.6: the temperature never proposed, the mix and group size twice) or the
    finding ranked below its symptoms."""
    res = _one_slot_beside_symptoms(tmp_path, task, {"temperature": 1.6},
                                    Finding(code="grpo.malformed", severity="warn", count=73, rate=0.3,
                                            knobs=["recipe.temperature"]))
    temps = [(c.change.value, c.skill) for c in res.candidates if c.change.knob == "recipe.temperature"]
    assert temps == [(pytest.approx(1.0), "lower-temperature-on-parse-errors")], \
        [(c.change.knob, c.change.value) for c in res.candidates]


@pytest.mark.parametrize("task", ["math", "code"])
def test_a_diluting_partial_credit_is_turned_off_first(tmp_path, task):
    """`grpo.reward_diluted` is a root cause: the seed skill that turns partial credit off takes the one slot ahead of
    the critical symptoms. Would catch the finding left without a skill, or ranked below its symptoms (a held-out math
    scenario: partial credit never proposed in 3 seeds)."""
    res = _one_slot_beside_symptoms(tmp_path, task, {"reward": {"partial_credit": 1.0}},
                                    Finding(code="grpo.reward_diluted", severity="critical", count=40, rate=0.56,
                                            knobs=["reward.partial_credit"]))
    assert [(c.change.knob, c.change.value) for c in res.candidates] == [("reward.partial_credit", 0.0)], res.notes


@pytest.mark.parametrize("task", ["mapf", "math", "code"])
def test_a_budget_that_cuts_answers_off_is_raised_before_its_symptoms(tmp_path, task):
    """`grpo.truncated` is a root cause: answers cut off before their end score as unfinished, so every group fails
    and the critical symptoms (all-fail groups, failing target slices) would otherwise share the one slot with it on
    a Thompson draw. Over ten draws the budget comes first each time. Would catch the finding ranked beside its
    symptoms (the shipped cut-off scenario's second `--quick` pass, with the library the first left behind, tried the
    group size at stage 1 twice and never fixed the budget its first pass had fixed at stage 1)."""
    from pathlib import Path

    from harness.tasks import get_task

    template = Path(__file__).resolve().parents[1] / "sandbox" / "template"
    recipe = {**yaml.safe_load((template / "recipe.yaml").read_text()), "max_completion_length": 12}
    d = _diag(task=task, env_config=yaml.safe_load(get_task(task).spec.round0_env), recipe=recipe,
              findings=[Finding(code="target.slice_fails", severity="critical", count=80, rate=1.0,
                                knobs=["env.mixture"]),
                        Finding(code="grpo.dead_groups", severity="critical", count=56, rate=0.875,
                                knobs=["recipe.num_generations"]),
                        Finding(code="grpo.truncated", severity="critical", count=230, rate=0.9,
                                knobs=["recipe.max_completion_length"])])
    firsts = []
    with SkillLibrary.open(tmp_path / "skills.db") as lib:
        for seed in range(10):
            res = propose(EngineerConfig(), d, lib, 1, np.random.default_rng(seed))
            firsts.append(tuple((c.change.knob, c.skill) for c in res.candidates))
    assert set(firsts) == {(("recipe.max_completion_length", "raise-completion-budget-on-truncation"),)}, firsts


# --- hostile skills (issue 36) ----------------------------------------------------------------------------------------


def test_a_hostile_skill_in_the_library_costs_itself_not_the_proposal(tmp_path, lib):
    """Rows no import would accept (an older version, a hand-edited skills.db): a condition that raises TypeError,
    1,000 nested `not` (RecursionError), a NaN step on an integer knob. Before, each one killed propose for every run
    on the library; now each is skipped with a note naming it and the other skills still propose."""
    lib.add(_skill("raise-holes", ["mapf.hole"], "env.sizes.{size}.hole_ratio", cond="rate >= 0.2"))
    lib.add(_skill("more-generations", ["grpo.dead_groups"], "recipe.num_generations", value=4, domains=()))
    good = lib.db["skills"].get("raise-holes")
    hostile = {"type-error": {"condition": "severity > 1"}, "recursion": {"condition": "not " * 1000 + "rate > 0"}}
    for name, trig in hostile.items():
        d = json.loads(good["definition"])
        lib.db["skills"].insert({**good, "name": name, "definition": json.dumps(
            {**d, "name": name, "trigger": {"findings": ["mapf.hole", "grpo.dead_groups"], **trig}})})
    d = json.loads(good["definition"])
    lib.db["skills"].insert({**good, "name": "nan-step", "definition": json.dumps(
        {**d, "name": "nan-step", "trigger": {"findings": ["grpo.dead_groups"], "condition": ""},
         "intervention": {"knob": "recipe.num_generations", "op": "add", "value": float("nan")}})})
    script = tmp_path / "replay.yaml"
    script.write_text(yaml.safe_dump([None, ["prose only"]]))  # stage 1: a bad reply, then the rule engineer
    for kind in ("rule", "scripted"):  # the rule engineer, and the engineers' prompt that lists skills
        cfg = EngineerConfig(kind=kind, script=str(script), max_retries=0) if kind == "scripted" else EngineerConfig()
        res = propose(cfg, _diag(), lib, 5, np.random.default_rng(0), space=SPACE)
        assert {c.skill for c in res.candidates} == {"raise-holes", "more-generations"}, res.notes
        assert kind == "rule" or any(n.startswith("skills in the prompt: raise-holes") for n in res.notes), res.notes
        for name in ("type-error", "recursion", "nan-step"):
            assert any(n.startswith(f"skill {name} skipped: ") and "\n" not in n for n in res.notes), (name, res.notes)


def test_the_rule_engineer_survives_a_skill_that_fails_while_it_proposes():
    """The second layer: a skill object that fails inside the rule engineer itself (here a condition no check saw,
    handed straight to `propose_rule`) is skipped with a note naming it; the other skill still proposes."""
    from harness.engineer.rule import propose_rule

    bad = [_skill(f"bad-{i}", ["mapf.hole"], "env.sizes.{size}.data_ratio", cond=c)
           for i, c in enumerate(["severity > 1", "not " * 1000 + "rate > 0"])]
    fine = _skill("raise-holes", ["mapf.hole"], "env.sizes.{size}.hole_ratio")
    cands, notes = propose_rule(_diag(), [*bad, fine], [], 3, np.random.default_rng(0), SPACE)
    assert [c.skill for c in cands] == ["raise-holes"]
    assert [n.split()[1] for n in notes if " skipped: " in n] == ["bad-0", "bad-1"], notes


def test_claimed_promotions_do_not_outrank_a_seed_skill(tmp_path, lib):
    """An imported skill claiming 10000/10000 promotions competes with a seed skill as an untried skill: Thompson
    sampling picks each about half the time (before: the claim won every draw)."""
    from skills.library import dump_skill

    lib.add(_skill("seed-holes", ["mapf.hole"], "env.sizes.{size}.hole_ratio"))
    boast = _skill("boast", ["mapf.hole"], "env.sizes.{size}.data_ratio")
    text = dump_skill(boast).replace("evidence:\n  tries: 0\n  promotions: 0\n",
                                     "evidence:\n  tries: 10000\n  promotions: 10000\n")
    assert "promotions: 10000" in text
    (tmp_path / "boast.md").write_text(text)
    assert lib.import_files([tmp_path / "boast.md"]) == ["boast"]
    firsts = [propose(EngineerConfig(), _diag(), lib, 1, np.random.default_rng(s), space=SPACE).candidates[0].skill
              for s in range(200)]
    assert 0.3 < firsts.count("boast") / 200 < 0.7, firsts.count("boast")


def test_a_step_whose_test_was_spent_with_a_positive_lower_bound_is_doubled_not_dropped(lib):
    """The rule engineer's skill makes the same change from the same state every stage; once its test ended spent
    with a positive lower bound (better than the control, not shown above min_effect) it used to be skipped for good,
    leaving the knob broken. Now the skill's step doubles (the offset for `add`, the factor squared for `mul`), again
    if the doubled change was spent positive too; a refuted change, a negative lower bound or a bound stops it.
    Caught: dropping the knob (the old behaviour), re-proposing the spent change, extending a refuted one or one
    whose estimate was not positive with confidence."""
    lib.add(_skill("raise-temp", ["grpo.dead_groups"], "recipe.temperature", value=0.2, kind="recipe"))
    t = "recipe.temperature"

    def hist(*items):  # (value, ci, spent)
        return [HistoryItem(stage=1, candidate=f"s1-t{i}", knob=t, change=f"{t} -> {v}", verdict="rejected",
                            effect=(ci[0] + ci[1]) / 2, ci=ci, spent=spent,
                            key=change_key("abc123", Change(kind="recipe", knob=t, value=v)))
                for i, (v, ci, spent) in enumerate(items)]

    def temp(history):
        res = propose(EngineerConfig(), _diag(history=history), lib, 2, np.random.default_rng(0), space=SPACE)
        got = [c for c in res.candidates if c.change.knob == t]
        return (got[0].change.value if got else None), got, res.notes

    assert temp([])[0] == 1.2
    value, got, notes = temp(hist((1.2, (0.004, 0.091), True)))
    assert value == 1.4 and "s1-t0's recipe.temperature -> 1.2 ended spent" in got[0].rationale, got
    assert "the step x2" in got[0].rationale and any("the step x2" in n for n in notes)
    assert temp(hist((1.2, (0.004, 0.091), True), (1.4, (0.01, 0.1), True)))[0] == 1.8  # spent again: x4
    assert temp(hist((1.2, (0.004, 0.091), True), (1.4, (-0.05, 0.1), False)))[0] is None  # x2 refuted: stop
    assert temp(hist((1.2, (-0.01, 0.091), True)))[0] is None  # not better than the control with confidence
    assert temp(hist((1.2, (0.001, 0.015), False)))[0] is None  # refuted (below min_effect), not spent
    # `mul`: the factor squared, clipped to the knob's range
    lib.add(_skill("more-gens", ["grpo.dead_groups"], "recipe.num_generations", op="mul", value=2.0, kind="recipe"))
    g = "recipe.num_generations"
    spent16 = [HistoryItem(stage=1, candidate="s1-g", knob=g, change="8 -> 16", verdict="rejected", effect=0.05,
                           ci=(0.01, 0.09), spent=True, key=change_key("abc123", Change(kind="recipe", knob=g, value=16)))]
    res = propose(EngineerConfig(), _diag(history=spent16), lib, 2, np.random.default_rng(0), space=SPACE)
    assert [c.change.value for c in res.candidates if c.change.knob == g] == [32]


def test_a_knob_promoted_one_way_whose_regression_recurs_gets_a_larger_step_the_same_way(lib):
    """A collapsing learning rate halved and promoted, then the stage's training lowers the policy again
    (`grpo.policy_regressed` back): the skill's next step is the factor squared (x0.25), then to the fourth power
    after two such promotions, not another half per stage (code-lr-collapse: 1e-3 -> 5e-4 -> 2.5e-4 and nothing
    trained kept). Caught: the plain half again; pressing on without the recurring finding, after a promotion the
    other way, after a chain the current value does not continue (a value set in between), or onto a change
    already rejected from this state (the plain step is proposed then)."""
    lib.add(_skill("lower-lr", ["grpo.policy_regressed"], "recipe.learning_rate", op="mul", value=0.5, kind="recipe",
                   cond="rate > 0"))
    lib.add(_skill("lower-lr-other", ["grpo.other"], "recipe.learning_rate", op="mul", value=0.5, kind="recipe",
                   cond="rate > 0"))
    lr = "recipe.learning_rate"

    def space(cur):
        return {**SPACE, lr: Knob(path=lr, kind="recipe", lo=1e-7, hi=1e-2, current=cur)}

    def promoted(*steps):  # (stage, old, new)
        return [HistoryItem(stage=s, candidate=f"s{s}c1", knob=lr, change=f"{lr} -> {new}", verdict="promoted",
                            value=new, old=old, effect=0.3, ci=(0.1, 0.5),
                            key=change_key(f"state{s}", Change(kind="recipe", knob=lr, value=new)))
                for s, old, new in steps]

    def lr_of(history, cur, code="grpo.policy_regressed", rejected=()):
        findings = [Finding(code=code, severity="critical", count=64, rate=0.15)]
        d = Diagnosis(task="mapf", stage=3, state="abc123", findings=findings, history=[
            *history, *(HistoryItem(stage=2, candidate=f"r{i}", knob=lr, change="x", verdict="rejected", value=v,
                                    key=change_key("abc123", Change(kind="recipe", knob=lr, value=v)))
                        for i, v in enumerate(rejected))])
        res = propose(EngineerConfig(), d, lib, 2, np.random.default_rng(0), space=space(cur))
        got = [c for c in res.candidates if c.change.knob == lr]
        return (got[0].change.value if got else None), (got[0].rationale if got else "")

    assert lr_of([], 1e-3)[0] == 5e-4  # nothing promoted yet: the skill's own half
    value, why = lr_of(promoted((1, 1e-3, 5e-4)), 5e-4)
    assert value == 1.25e-4 and "the step x2" in why and "grpo.policy_regressed is back" in why, why
    assert lr_of(promoted((1, 1e-3, 5e-4), (2, 5e-4, 1.25e-4)), 1.25e-4)[0] == 1.25e-4 / 16  # x4
    assert lr_of(promoted((1, 1e-3, 5e-4)), 5e-4, code="grpo.other")[0] == 2.5e-4  # not a recurring regression
    assert lr_of(promoted((1, 2.5e-4, 5e-4)), 5e-4)[0] == 2.5e-4  # promoted the other way: the plain half
    assert lr_of(promoted((1, 1e-3, 5e-4)), 4e-4)[0] == 2e-4  # the chain does not end at today's value
    assert lr_of(promoted((1, 1e-3, 5e-4)), 5e-4, rejected=(1.25e-4,))[0] == 2.5e-4  # larger step refuted: the half


def test_a_number_near_an_inconclusive_one_continues_its_test_so_the_evidence_pools():
    """A skill that sizes its step to the symptom proposes a slightly different number each stage (a code-family run:
    temperature 0.1 -> 0.7, +0.039 on one pair; then 0.5948; then 0.6: three fresh changes, none with more than one
    pair). A number within NUM_SAME_RATIO of an inconclusive change of the same knob from the same state, moved the
    same way, with a positive estimate, becomes that change verbatim (same `change_key`, so the new pair pools).
    Fails if 0.5948 goes through as itself, or if a far number, the other direction, a negative estimate, a spent
    test, another state or another knob is continued, or if two candidates of a stage become one change."""
    from harness.engineer.proposal import NUM_SAME_RATIO, continue_inconclusive
    from harness.records import Candidate

    state = "abc123"
    temp = Change(kind="recipe", knob="recipe.temperature", value=0.7)

    def hist(verdict="inconclusive", effect=0.039, value=0.7, knob="recipe.temperature", st=state):
        return HistoryItem(stage=1, candidate="s1c1", knob=knob, change="x", verdict=verdict, effect=effect,
                           ci=(-0.046, 0.107), value=value, old=0.1,
                           key=change_key(st, Change(kind="recipe", knob=knob, value=value)))

    def cand(value, knob="recipe.temperature", old=0.1, cid="s2c1"):
        return Candidate(id=cid, stage=2, change=Change(kind="recipe", knob=knob, value=value), old_value=old,
                         rationale="raise-temperature-on-collapse", skill="raise-temperature-on-collapse")

    d = _diag(stage=2, history=[hist()])
    out, notes = continue_inconclusive(d, [cand(0.5948)])
    assert out[0].change.value == 0.7 and change_key(state, out[0].change) == change_key(state, temp), out
    assert "continues s1c1" in out[0].rationale and "pools with its evidence" in notes[0]
    assert out[0].id != "s2c1" and out[0].skill == "raise-temperature-on-collapse"
    assert 0.7 / 0.5948 <= NUM_SAME_RATIO < 0.7 / 0.4
    for h, c in [(hist(), cand(0.4)),  # far: another intent
                 (hist(), cand(0.5948, old=0.9)),  # from 0.9 it is a cut, the earlier one a raise
                 (hist(effect=-0.02), cand(0.5948)),  # a loser
                 (hist(verdict="rejected"), cand(0.5948)),  # spent or refuted: final from this state
                 (hist(st="other"), cand(0.5948)),  # another harness state
                 (hist(knob="recipe.learning_rate", value=0.7), cand(0.5948))]:  # another knob
        out, notes = continue_inconclusive(_diag(stage=2, history=[h]), [c])
        assert out == [c] and not notes, (h, c, out)
    # two candidates of one stage that would both become 0.7: only one does
    out, _ = continue_inconclusive(d, [cand(0.62, cid="a"), cand(0.65, cid="b")])
    assert [c.change.value for c in out] == [0.7, 0.65]  # the first takes it; the other stays itself


def test_a_larger_step_stops_where_the_skill_stops():
    """`extend_spent` and `press_on` double a skill's step in its own space; the doubled step stops at the skill's
    `stop_at` as its own step does (`instantiate`): a temperature lowered 0.8 -> 0.6 by a skill that stops at 0.5
    doubles to 0.5, not 0.4, and from 0.5 there is no larger step; a raise stopped at 1.5 goes 1.2 -> 1.4 -> 1.5, not
    1.6. Would catch the doubling walking a knob past where the skill says it stops helping."""
    from harness.engineer.rule import _larger

    temp = Knob(path="recipe.temperature", kind="recipe", lo=0.1, hi=2.0, current=0.8)
    assert _larger("add", 0.8, 0.6, 1, temp) == 0.4  # no stop: as before
    assert _larger("add", 0.8, 0.6, 1, temp, stop=0.5) == 0.5
    assert _larger("add", 0.8, 0.6, 2, temp, stop=0.5) == 0.5
    hot = Knob(path="recipe.temperature", kind="recipe", lo=0.1, hi=2.0, current=1.2)
    assert _larger("add", 1.2, 1.4, 1, hot, stop=1.5) == 1.5
    at_stop = Knob(path="recipe.temperature", kind="recipe", lo=0.1, hi=2.0, current=1.3)
    assert _larger("add", 1.3, 1.5, 1, at_stop, stop=1.5) is None  # the step already reached the stop


def test_a_diagnostic_already_merged_is_not_proposed_again():
    """A diagnostic skill whose file was promoted earlier in the run (its finding still fires: the veto it adds does
    not silence the finding) is skipped with a note, where it was proposed again at every stage, failed the vet as
    "unchanged" without a commit, and so took a candidate slot each time. Would catch the merged file re-proposed."""
    from harness.engineer.rule import propose_rule
    from harness.records import HistoryItem
    from skills.library import SEED_DIR, load_skill_file

    veto = load_skill_file(SEED_DIR / "veto-reward-hacking.md")
    hacking = Finding(code="grpo.reward_hacking", severity="critical", count=9, rate=0.6)
    fresh = _diag(findings=[hacking])
    cands, _ = propose_rule(fresh, [veto], [], 2, np.random.default_rng(0), SPACE)
    assert [c.change.knob for c in cands] == [veto.intervention.knob]
    merged = _diag(findings=[hacking], history=[HistoryItem(stage=1, candidate="s1c1", knob=veto.intervention.knob,
                                                            change="new file", verdict="promoted")])
    cands, notes = propose_rule(merged, [veto], [], 2, np.random.default_rng(0), SPACE)
    assert cands == [] and any("already in the harness (promoted at stage 1)" in n for n in notes), notes


def test_a_refuted_step_is_not_tested_again_as_a_near_number_when_the_rate_moves():
    """A step sized to a finding's rate (`scale_with_rate`) lands on another number when the rate moves: after 0.7 ->
    1.0 was refuted, the next stage's rate 0.47 proposed 1.013 and 0.50 proposed 1.033, each a fresh test of the same
    intent (more chances at a false promotion). Now it is the refuted change's, and goes as that one does (a larger
    step or nothing); a step the other way is another intent. Would catch near numbers of a refuted change re-tested
    (an outside review of the rule engineer)."""
    from harness.engineer.proposal import change_key, knob_space, rejected_keys_from_history
    from harness.engineer.rule import propose_rule
    from harness.records import HistoryItem
    from harness.tasks import get_task
    from skills.library import SEED_DIR, load_skill_file

    sk = load_skill_file(SEED_DIR / "raise-temperature-on-collapse.md")
    base = Diagnosis(task="math", stage=1, state="S0", env_config=get_task("math").default_config().model_dump(
        mode="json"), recipe={"temperature": 0.7})

    def values(d, rate):
        d = d.model_copy(update={"findings": [Finding(code="grpo.exploration_collapse", severity="warn", count=40,
                                                      rate=rate)]})
        out, _ = propose_rule(d, [sk], [], 1, np.random.default_rng(0), knob_space(d), rejected_keys_from_history(d))
        return [c.change.value for c in out], out

    (first,), (c,) = values(base, 0.45)
    assert first == pytest.approx(1.0)
    h = HistoryItem(stage=1, candidate=c.id, knob="recipe.temperature", change="", verdict="rejected", effect=-0.04,
                    ci=(-0.09, 0.01), key=change_key("S0", c.change), value=c.change.value, old=0.7)
    later = base.model_copy(update={"stage": 2, "history": [h]})
    for rate in (0.45, 0.47, 0.50):
        got, _ = values(later, rate)
        assert all(abs(v - 1.0) > 0.25 for v in got), (rate, got)  # nothing within the refuted intent
    moved = later.model_copy(update={"state": "S1"})  # another harness state: the refuted test says nothing there
    (v,) = values(moved, 0.47)[0]
    assert 1.0 < v < 1.1, v
