"""The vet step: schema and range checks, single factor, diagnostics in the sandbox, the offline backtest.

    .venv/bin/pytest tests/test_vet.py -q
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness import vet as V
from harness.records import Candidate, Change, Rollout
from harness.seeds import seed_for
from sandbox.runner import Limits

FAST = Limits(cpu_s=1, wall_s=3.0, memory_mb=256, processes=4)
TEMPLATE = Path(__file__).resolve().parents[1] / "sandbox" / "template"
SEED_SKILLS = Path(__file__).resolve().parents[1] / "skills" / "seed"


def harness_files() -> dict[str, str]:
    return {str(p.relative_to(TEMPLATE)): p.read_text() for p in TEMPLATE.rglob("*") if p.is_file()
            and p.suffix in (".yaml", ".py")}


def cand(kind: str, knob: str, value=None, code: str | None = None) -> Candidate:
    return Candidate(id="c1", stage=1, change=Change(kind=kind, knob=knob, value=value, code=code), rationale="test")


def mk(i: int, valid: bool, group: int = 0, reward: float | None = None) -> Rollout:
    s = seed_for("probe", i)
    return Rollout(seed=s, group=group, instance={"task": "mapf", "seed": s}, prompt="p", completion=f"c{i}",
                   valid=valid, optimal=valid, reward=float(valid) if reward is None else reward,
                   failure=None if valid else "hole", slices={"size": "5"})


CACHED = [mk(i, i % 3 != 0, group=i // 4) for i in range(16)]

# --- recipe knobs -------------------------------------------------------------------------------------------------


def test_recipe_accepts_a_sane_change_and_rewrites_one_line():
    files = harness_files()
    res = V.vet(cand("recipe", "recipe.temperature", 1.2), files, None, CACHED)
    assert res.ok, res.reason
    new = yaml.safe_load(res.files["recipe.yaml"])
    old = yaml.safe_load(files["recipe.yaml"])
    assert new == {**old, "temperature": 1.2}
    assert res.files["recipe.yaml"].startswith("# Training recipe")  # the header comment survives


@pytest.mark.parametrize("knob,value,why", [
    ("recipe.temperature", 9.0, "out of range"),
    ("recipe.temperature", -1.0, "out of range"),
    ("recipe.num_generations", 6, "divisible"),           # the Recipe model's own cross-field check
    ("recipe.seed", 3, "not an evolvable recipe knob"),
    ("recipe.steps", 80, "not an evolvable recipe knob"),
    ("recipe.temprature", 1.0, "does not exist"),
    ("recipe.temperature", 1.0, "does nothing"),
    ("recipe.temperature", [1.0, 1.2], "one number"),
    ("recipe", 1.0, "needs a knob"),
])
def test_recipe_rejections(knob, value, why):
    res = V.vet(cand("recipe", knob, value), harness_files(), None, CACHED)
    assert not res.ok and res.stage == "vet" and why in res.reason, res.reason
    assert res.files == {}


# --- diagnostics ----------------------------------------------------------------------------------------------------

SANE = '''
def diagnose(rollouts):
    bad = [r for r in rollouts if not r["valid"]]
    return {"findings": [{"code": "fails", "severity": "warn", "count": len(bad), "rate": len(bad) / len(rollouts)}]
            if bad else [], "metrics": {"fail_share": len(bad) / len(rollouts)}}
'''
FLAGS_SOLVED = '''
def diagnose(rollouts):
    long = [r for r in rollouts if len(r["completion"]) > 1]
    return {"findings": [{"code": "long", "severity": "warn", "count": len(long), "rate": 1.0}], "metrics": {}}
'''
VETO_ALWAYS = '''
def diagnose(rollouts):
    return {"findings": [], "metrics": {}}

def veto(control, candidate):
    return "I never trust anyone"
'''


def veto_skill_code() -> str:
    text = (SEED_SKILLS / "veto-reward-hacking.md").read_text()
    return yaml.safe_load(text.split("---")[1])["intervention"]["code"]


def test_diagnostic_accepts_sane_and_seed_veto():
    for path, code in (("diagnostics/fails.py", SANE), ("diagnostics/reward_hacking_veto.py", veto_skill_code())):
        res = V.vet(cand("diagnostic", path, code=code), harness_files(), None, CACHED, limits=FAST)
        assert res.ok and res.stage == "offline", res.reason
        assert res.files == {path: code}


@pytest.mark.parametrize("code,why", [
    (FLAGS_SOLVED, "flags solved trajectories: evolved.flags.long"),
    (VETO_ALWAYS, "vetoes an unchanged arm"),
    ("def diagnose(rollouts):\n    return 1 / 0\n", "does not run on 16 cached rollouts"),
    ("def diagnose(rollouts):\n    while True: pass\n", "timeout"),
    ("def diagnose(rollouts)\n    return {}\n", "does not compile"),
    ("def check(rollouts):\n    return {}\n", "must define a top-level `def diagnose"),
    ("", "not allowed"),
])
def test_diagnostic_rejections(code, why):
    res = V.vet(cand("diagnostic", "diagnostics/flags.py", code=code), harness_files(), None, CACHED, limits=FAST)
    assert not res.ok and why in res.reason, res.reason


def test_diagnostic_may_not_drop_a_veto_or_use_a_bad_path():
    files = {**harness_files(), "diagnostics/guard.py": VETO_ALWAYS}
    res = V.vet(cand("diagnostic", "diagnostics/guard.py", code=SANE), files, None, CACHED, limits=FAST)
    assert not res.ok and "drops its `veto`" in res.reason
    res = V.vet(cand("diagnostic", "../evil.py", code=SANE), files, None, CACHED, limits=FAST)
    assert not res.ok and "diagnostics/<snake_case_name>.py" in res.reason


# --- seed skills: triggers use emitted codes, interventions pass vet ------------------------------------------------

MAPF_FAILURES = ("parse_error", "wrong_agent_count", "off_grid", "hole", "vertex_conflict", "edge_conflict",
                 "goal_not_reached", "too_long")


def _seed_skills():
    from skills.library import load_skill_file

    return [load_skill_file(p) for p in sorted(SEED_SKILLS.glob("*.md"))]


def test_seed_skill_triggers_use_emitted_codes():
    from harness.diagnostics import builtin_codes

    known = builtin_codes("mapf", MAPF_FAILURES)
    skills = _seed_skills()
    assert len(skills) >= 8
    for s in skills:
        assert s.trigger.findings and set(s.trigger.findings) <= known, (s.name, s.trigger.findings)


def _instantiate(skill, files: dict[str, str], size: str = "5") -> Change:
    iv = skill.intervention
    if skill.kind == "diagnostic":
        return Change(kind="diagnostic", knob=iv.knob, code=iv.code)
    knob = iv.knob.format(size=size)
    recipe = yaml.safe_load(files["recipe.yaml"])
    if skill.kind == "recipe":
        from policies.train import Recipe

        old = recipe.get(knob.split(".")[1], Recipe.model_fields[knob.split(".")[1]].default)
    else:
        raise AssertionError(f"{skill.name}: env skills need the task's config; see the MAPF test")
    new = {"add": old + iv.value, "mul": old * iv.value, "set": iv.value}[iv.op]
    return Change(kind=skill.kind, knob=knob, value=type(old)(round(new, 6)))


def test_seed_recipe_and_diagnostic_skills_pass_vet():
    files = harness_files()
    for s in _seed_skills():
        if s.kind in ("recipe", "diagnostic"):
            res = V.vet(Candidate(id=s.name, stage=1, change=_instantiate(s, files), rationale=s.expected), files,
                        None, CACHED, limits=FAST)
            assert res.ok, (s.name, res.reason)
