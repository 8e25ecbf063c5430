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
from harness.tasks import get_task
from sandbox.runner import Limits

FAST = Limits(cpu_s=1, wall_s=3.0, memory_mb=256, processes=4)
TEMPLATE = Path(__file__).resolve().parents[1] / "sandbox" / "template"
SEED_SKILLS = Path(__file__).resolve().parents[1] / "skills" / "seed"


def harness_files() -> dict[str, str]:
    """MAPF's round-0 harness: the template and MAPF's round-0 env.yaml."""
    return {**{str(p.relative_to(TEMPLATE)): p.read_text() for p in TEMPLATE.rglob("*") if p.is_file()
               and p.suffix in (".yaml", ".py")}, "env.yaml": get_task("mapf").spec.round0_env}


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


@pytest.mark.parametrize("kind,knob,value,path", [
    ("env", "env.sizes.5.hole_ratio", 0.3, "env.yaml"),
    ("env", "env.min_distance", 2, "env.yaml"),
    ("recipe", "recipe.temperature", 1.2, "recipe.yaml"),
    ("recipe", "recipe.learning_rate", 1e-4, "recipe.yaml"),
    # ruamel writes 1e-05, which PyYAML reads as a string: the recipe was rewritten whole, its comments gone, and an
    # env value went in as a string for plain readers (an outside review); now 1.0e-05, a float to both
    ("recipe", "recipe.learning_rate", 1e-5, "recipe.yaml"),
    ("env", "env.sizes.5.hole_ratio", 1e-5, "env.yaml"),
])
def test_a_one_knob_candidate_is_a_one_line_commit_and_comments_survive(tmp_path, kind, knob, value, path):
    import subprocess

    from sandbox.workspace import Workspace

    files = harness_files()
    res = V.vet(cand(kind, knob, value), files, get_task("mapf") if kind == "env" else None, CACHED)
    assert res.ok, res.reason
    old_lines, new_lines = files[path].splitlines(), res.files[path].splitlines()
    assert len(old_lines) == len(new_lines)
    changed = [(a, b) for a, b in zip(old_lines, new_lines) if a != b]
    assert len(changed) == 1, changed  # PyYAML re-dumped every line of env.yaml for one knob
    loaded, (*path_to, leaf) = yaml.safe_load(res.files[path]), knob.split(".")[1:]
    for part in path_to:  # `sizes.5`: the entry whose size is 5
        loaded = next(e for e in loaded if e["size"] == int(part)) if isinstance(loaded, list) else loaded[part]
    assert loaded[leaf] == value and type(loaded[leaf]) is type(value)  # a number to a YAML 1.1 reader (PyYAML)
    assert [x for x in old_lines if x.lstrip().startswith("#")] == [x for x in new_lines if x.lstrip().startswith("#")]
    if kind == "recipe":
        assert "#" in changed[0][1]  # the comment on the changed line itself stays
    ws = Workspace.create(tmp_path / "h", files_override={"env.yaml": files["env.yaml"]})  # MAPF's round 0
    ws.propose("c1", res.files, summary=f"{knob}: change", rationale="test", factor=knob, stage=1)
    numstat = subprocess.run(["git", "-C", str(tmp_path / "h"), "show", "--numstat", "--format=", "cand/c1"],
                             capture_output=True, text=True, check=True).stdout.split()
    assert numstat == ["1", "1", path]


@pytest.mark.parametrize("spelling", ["null", "~", ""])
def test_a_one_leaf_edit_keeps_the_files_spelling_of_null(spelling):
    """ruamel writes every null as an empty value: a file that spells them `null` (PyYAML's spelling, so every run's
    config.yaml) or `~` changed on every line holding one for a one-leaf edit (found when `resume --stages` rewrote
    20 lines of a run's config.yaml); a null spelled only in a comment does not count."""
    from harness.yamledit import set_leaf_text

    text = f"# a comment that says seed: null\ncheckpoint: {spelling}  # a comment\nbudget:\n  stages: 2\n  wall_clock: {spelling}\n"
    text = text.replace(" \n", "\n").replace(":   #", ":  #") + (f"sizes:\n- {spelling}\n" if spelling else "")
    new = set_leaf_text(text, ["budget", "stages"], 3)
    changed = [(a, b) for a, b in zip(text.splitlines(), new.splitlines()) if a != b]
    assert changed == [("  stages: 2", "  stages: 3")], new


def test_a_reward_knob_edits_only_the_reward_block():
    files = harness_files()
    changed = V.apply_change(files, Change(kind="reward", knob="reward.partial_credit", value=0.25), get_task("mapf"))
    old, new = files["recipe.yaml"], changed["recipe.yaml"]
    assert old.split("reward:")[0] == new.split("reward:")[0]  # everything above the block byte for byte
    assert yaml.safe_load(new)["reward"] == {"partial_credit": 0.25}


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
    # past the parser's own stack: MemoryError / RecursionError escaped and dropped the whole reply (outside review,
    # eighty-second session); an exit status past the last signal raised out of the runner
    ("X = " + "-" * 200_000 + "1\ndef diagnose(rollouts):\n    return {}\n", "does not compile"),
    ("X = x" + ".a" * 100_000 + "\ndef diagnose(rollouts):\n    return {}\n", "does not compile"),
    ("def diagnose(rollouts):\n    import os\n    os._exit(200)\n", "does not run on 16 cached rollouts"),
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


def test_an_existing_diagnostic_may_be_extended_not_silenced():
    files = {**harness_files(), "diagnostics/fails.py": SANE}
    noop = "def diagnose(rollouts):\n    return {'findings': [], 'metrics': {}}\n"
    res = V.vet(cand("diagnostic", "diagnostics/fails.py", code=noop), files, None, CACHED, limits=FAST)
    assert not res.ok and "no longer reports findings ['evolved.fails.fails']; metrics ['fail_share']" in res.reason
    # the template's own diagnostic is protected the same way
    template = files["diagnostics/failure_mix.py"]
    res = V.vet(cand("diagnostic", "diagnostics/failure_mix.py", code=noop), files, None, CACHED, limits=FAST)
    assert not res.ok and "no longer reports" in res.reason
    # a revision that keeps everything and adds a metric passes
    extended = SANE.replace('"metrics": {"fail_share": len(bad) / len(rollouts)}',
                            '"metrics": {"fail_share": len(bad) / len(rollouts), "n": len(rollouts)}')
    assert extended != SANE
    res = V.vet(cand("diagnostic", "diagnostics/fails.py", code=extended), files, None, CACHED, limits=FAST)
    assert res.ok, res.reason
    assert template  # and deleting one (empty source) stays refused
    res = V.vet(cand("diagnostic", "diagnostics/failure_mix.py", code="  \n"), files, None, CACHED, limits=FAST)
    assert not res.ok and "removing or emptying" in res.reason


def _neutered_veto() -> str:
    code = veto_skill_code()
    body = code[code.index("    d_reward = candidate"):]
    assert "def veto(control, candidate):" in code and body.strip().endswith("return None")
    return code.replace(body, "    return None\n")  # keeps `def veto(...)`, the names, the findings


ZERO_COUNTS = SANE.replace('"count": len(bad), "rate": len(bad) / len(rollouts)', '"count": 0, "rate": 0.0')
ZERO_ON_PLANTED = SANE.replace("if bad else []", "if bad and len(bad) < len(rollouts) else []")
TEMPLATE_ZERO = (TEMPLATE / "diagnostics" / "failure_mix.py").read_text().replace(
    '"count": count,\n                "rate": rate,', '"count": 0,\n                "rate": 0.0,')


@pytest.mark.parametrize("path,old,new,why", [
    ("diagnostics/reward_hacking_veto.py", "seed-veto", "neutered-veto",
     "no longer blocks a candidate arm paid more for failing (reward hacking)"),
    ("diagnostics/fails.py", SANE, ZERO_COUNTS,
     "no longer detects evolved.fails.fails (count 6, rate 0.38) on the cached rollouts"),
    ("diagnostics/fails.py", SANE, ZERO_ON_PLANTED,
     "no longer detects evolved.fails.fails (count 6, rate 1.00) on the failed cached rollouts"),
    ("diagnostics/failure_mix.py", "template", TEMPLATE_ZERO, "no longer detects evolved.failure_mix.dominant_failure"),
])
def test_a_revision_that_stops_detecting_is_rejected_by_behaviour(path, old, new, why):
    """Names are kept in each revision (the old name-only check let every one through): what is checked is whether
    it still fires where the current version fires, and still blocks where the current veto blocks."""
    old = {"seed-veto": veto_skill_code(), "template": harness_files()["diagnostics/failure_mix.py"]}.get(old, old)
    new = {"neutered-veto": _neutered_veto()}.get(new, new)
    assert new != old
    files = {**harness_files(), path: old}
    res = V.vet(cand("diagnostic", path, code=new), files, None, CACHED, limits=FAST)
    assert not res.ok and res.stage == "offline" and why in res.reason, res.reason
    assert "\n" not in res.reason


def test_an_honest_revision_that_keeps_firing_passes():
    """A revision that adds a finding (and keeps the old one firing), and a veto made stricter, both pass."""
    more = SANE + '''

_old = diagnose


def diagnose(rollouts):
    out = _old(rollouts)
    groups = {r["group"] for r in rollouts if not r["valid"]}
    if groups:
        out["findings"].append({"code": "failing_groups", "severity": "warn", "count": len(groups), "rate": 1.0})
    return out
'''
    files = {**harness_files(), "diagnostics/fails.py": SANE}
    res = V.vet(cand("diagnostic", "diagnostics/fails.py", code=more), files, None, CACHED, limits=FAST)
    assert res.ok, res.reason
    stricter = veto_skill_code().replace("d_reward > 0.02 and d_valid < -0.01", "d_reward > 0.01 and d_valid < -0.01")
    assert stricter != veto_skill_code()
    files = {**harness_files(), "diagnostics/reward_hacking_veto.py": veto_skill_code()}
    res = V.vet(cand("diagnostic", "diagnostics/reward_hacking_veto.py", code=stricter), files, None, CACHED,
                limits=FAST)
    assert res.ok, res.reason


def test_planted_cases_are_real_failures_built_from_the_cached_rollouts():
    sets = dict(V.planted_sets(CACHED))
    assert sets["the cached rollouts"] == CACHED
    assert all(not r.valid and r.failure == "hole" for r in sets["the cached rollouts all made failures"])
    hacked = sets["the cached rollouts all made failures paid more than any valid one"]
    assert min(r.reward for r in hacked) > max(r.reward for r in CACHED if r.valid)
    assert [(label, len(c), len(k)) for label, c, k in V.planted_arms(CACHED)] == [
        ("a candidate arm whose rollouts all fail", 16, 16),
        ("a candidate arm paid more for failing (reward hacking)", 16, 16),
        ("a candidate arm paid more for failing, against an all-valid control", 16, 16)]


# --- seed skills: triggers use emitted codes, interventions pass vet ------------------------------------------------

def _seed_skills(task: str | None = None):
    """The seed skills (of one family: its own and the family-free ones)."""
    from skills.library import load_skill_file

    skills = [load_skill_file(p) for p in sorted(SEED_SKILLS.glob("*.md"))]
    return [s for s in skills if task is None or not s.domains or task in s.domains]


def test_seed_skill_triggers_use_emitted_codes():
    """Every seed skill states its domains, and its trigger uses codes the built-ins emit for those families."""
    from harness.diagnostics import builtin_codes
    from harness.tasks import TASKS

    skills = _seed_skills()
    assert len(skills) >= 8
    for s in skills:
        assert set(s.domains) <= {*TASKS, "code"}, (s.name, s.domains)  # code: the family to come (issue #12)
        fams = [f for f in s.domains if f in TASKS] or sorted(TASKS)
        known = set().union(*(builtin_codes(f, get_task(f).spec.failure_types) for f in fams))
        assert s.trigger.findings, s.name
        for t in s.trigger.findings:  # a pattern (`*.frontier`) must match what every family it covers emits
            import fnmatch

            for f in fams:
                own = builtin_codes(f, get_task(f).spec.failure_types)
                assert t in known and "*" not in t or any(fnmatch.fnmatchcase(c, t) for c in own), (s.name, t, f)


def _family_files(task: str) -> dict[str, str]:
    files = harness_files()
    own = get_task(task).spec.round0_env
    return {**files, "env.yaml": own} if own is not None else files


def _instantiate(skill, files: dict[str, str], task: str) -> Change:
    iv = skill.intervention
    if skill.kind == "diagnostic":
        return Change(kind="diagnostic", knob=iv.knob, code=iv.code)
    from harness.engineer.rule import resolve_knob

    t = get_task(task)
    if iv.op == "mix":  # the whole mixture: its first entry's weight doubled (the rule engineer aims it at a target)
        cur = t.mixture(t.spec.config_model.model_validate(yaml.safe_load(files["env.yaml"])))
        first = next(iter(cur))
        return Change(kind="env", knob=iv.knob, value={**cur, first: 2 * cur[first]})
    if iv.op == "adopt" and iv.knob == "env.target":  # the env made a target config: here its own, first weight doubled
        cfg = t.spec.config_model.model_validate(yaml.safe_load(files["env.yaml"]))
        cur = t.mixture(cfg)
        first = next(iter(cur))
        return Change(kind="env", knob=iv.knob, value=t.with_mixture(cfg, {**cur, first: 2 * cur[first]}).model_dump(
            mode="json"))
    if iv.op == "adopt":  # one entry made like another config's: here its entry 5 / 2 with one field moved
        value = {"mapf": {"5": {"hole_ratio": 0.3, "agents": 3}}, "math": {"2": {"terms": 3}}}[task]
        return Change(kind="env", knob=iv.knob, value=value)
    knob = resolve_knob(iv.knob, task).format(**{t.spec.difficulty_slice: {"mapf": "5", "math": "2"}[task]})
    if skill.kind == "reward":
        field = knob.split(".")[1]
        shaping = (yaml.safe_load(files["recipe.yaml"]) or {}).get("reward") or {}
        old = t.spec.shaping_model.model_validate(shaping).model_dump()[field]
    elif skill.kind == "recipe":
        from policies.train import Recipe

        field = knob.split(".")[1]
        old = yaml.safe_load(files["recipe.yaml"]).get(field, Recipe.model_fields[field].default)
    else:
        from harness.tasks.knobs import get_value, split

        old = get_value(t.spec.config_model.model_validate(yaml.safe_load(files["env.yaml"])).model_dump(mode="json"),
                        split(knob, "env"), t.spec.entry_key)
    new = {"add": old + iv.value, "mul": old * iv.value, "set": iv.value}[iv.op]
    return Change(kind=skill.kind, knob=knob, value=type(old)(round(new, 6)))


@pytest.mark.parametrize("task", ["mapf", "math"])
def test_seed_skills_pass_vet(task):
    """Every seed skill that fits a family instantiates to a change its vet step accepts on that family's harness."""
    files = _family_files(task)
    kinds = set()
    for s in _seed_skills(task):
        f, cached = files, CACHED
        if s.kind == "reward":  # a harness the skill applies to (partial credit paid), rollouts its scorer re-scores
            rec = yaml.safe_load(files["recipe.yaml"]) or {}
            f = {**files, "recipe.yaml": yaml.safe_dump({**rec, "reward": {**(rec.get("reward") or {}),
                                                                            "partial_credit": 0.5}})}
            cached = ROLLOUTS if task == "mapf" else family_rollouts(task)
        res = V.vet(Candidate(id=s.name, stage=1, change=_instantiate(s, f, task), rationale=s.expected), f,
                    get_task(task), cached, limits=FAST)
        assert res.ok, (s.name, res.reason)
        kinds.add(s.kind)
    assert kinds == {"env", "recipe", "reward", "diagnostic"}


# --- env and reward knobs on the real MAPF task ---------------------------------------------------------------------

MAPF = get_task("mapf")


def family_rollouts(name: str, n: int = 8) -> list[Rollout]:
    """Real instances of a family (its round-0 env, probe seeds), each with its expert answer and the expert answer
    cut one character short, scored by the family's real scorer (a reward change re-scores cached completions)."""
    t = get_task(name)
    env = yaml.safe_load(t.spec.round0_env) if t.spec.round0_env else yaml.safe_load(harness_files()["env.yaml"])
    cfg = t.spec.config_model.model_validate(env)
    out = []
    for g in range(n):
        inst = t.generate(cfg, seed_for("probe", g))
        expert = t.expert(inst)
        for text in (expert, expert[:-1]):
            o = t.score(inst, text)
            out.append(Rollout(seed=inst.seed, group=g, instance=inst.model_dump(mode="json"), prompt=t.prompt(inst),
                               completion=text, valid=o.valid, optimal=o.optimal, reward=o.reward, failure=o.failure,
                               where=o.where, metrics=o.metrics, slices=t.slices(inst), tokens=len(text)))
    return out


def mapf_rollouts(n_groups: int = 8) -> list[Rollout]:
    """Real MAPF instances (probe seeds) and completions scored by the real scorer: per group, the expert plan (valid),
    the expert plan with agent A stopping one move short (goal_not_reached, 1 of 2 agents home: partial credit),
    a padded plan far over the step cap (too_long: long text), and garbage (parse_error)."""
    cfg = MAPF.spec.config_model.model_validate(yaml.safe_load(harness_files()["env.yaml"]))
    out = []
    for g in range(n_groups):
        inst = MAPF.generate(cfg, seed_for("probe", g))
        expert = MAPF.expert(inst).splitlines()
        short = [expert[0][:-1]] + expert[1:]
        padded = [expert[0] + "UD" * (2 * inst.size ** 2)] + expert[1:]
        for text in ("\n".join(expert), "\n".join(short), "\n".join(padded), "no plan here"):
            o = MAPF.score(inst, text)
            out.append(Rollout(seed=inst.seed, group=g, instance=inst.model_dump(mode="json"), prompt=MAPF.prompt(inst),
                               completion=text, valid=o.valid, optimal=o.optimal, reward=o.reward, failure=o.failure,
                               where=o.where, metrics=o.metrics, slices=MAPF.slices(inst), tokens=len(text)))
    return out


ROLLOUTS = mapf_rollouts()


def test_mapf_rollouts_cover_what_the_backtest_needs():
    kinds = {r.failure for r in ROLLOUTS}
    assert {None, "parse_error", "too_long"} <= kinds and len(kinds) >= 4, kinds


@pytest.mark.parametrize("knob,value", [("env.sizes.5.hole_ratio", 0.3), ("env.sizes.3.wait_ratio", 0.5),
                                        ("env.sizes.4.data_ratio", 0.5), ("env.min_distance", 2)])
def test_env_accepts_sane_changes(knob, value):
    files = harness_files()
    res = V.vet(cand("env", knob, value), files, MAPF, ROLLOUTS)
    assert res.ok and res.stage == "offline" and res.details["generated"] >= 4, res.reason
    new = MAPF.spec.config_model.model_validate(yaml.safe_load(res.files["env.yaml"]))
    old = MAPF.spec.config_model.model_validate(yaml.safe_load(files["env.yaml"]))
    from harness.tasks.mapf import apply_knob

    assert new == apply_knob(old, knob, value)  # exactly the one knob moved, as the task's own helper would
    assert res.files["env.yaml"].startswith("# Environment generator config")


@pytest.mark.parametrize("knob,value,why", [
    ("env.sizes.5.hole_ratio", 0.9, "out of the generator's range"),      # the model says 0.0..0.6
    ("env.sizes.5.hole_ratio", -0.1, "out of the generator's range"),
    ("env.sizes.5.hole_rate", 0.3, "'hole_rate' does not exist"),
    ("env.sizes.12.hole_ratio", 0.3, "no entry with size 12"),
    ("env.holes", 0.3, "'holes' does not exist"),
    ("env.sizes.5", 0.3, "names a whole entry"),
    ("env.sizes", 0.3, "not a single value"),
    ("env.sizes.5.hole_ratio", 0.2, "does nothing"),
    ("recipe.sizes.5.hole_ratio", 0.3, "needs a knob `env.<field>`"),
])
def test_env_rejections(knob, value, why):
    kind = "env"
    res = V.vet(cand(kind, knob, value), harness_files(), MAPF, ROLLOUTS)
    assert not res.ok and res.stage == "vet" and why in res.reason, res.reason


def test_two_factor_changes_are_rejected():
    two = {"hole_ratio": 0.3, "wait_ratio": 0.5}
    res = V.vet(cand("env", "env.sizes.5", two), harness_files(), MAPF, ROLLOUTS)
    assert not res.ok and ("whole entry" in res.reason or "one leaf" in res.reason), res.reason
    res = V.vet(cand("env", "env.sizes.5.hole_ratio", [0.3, 0.4]), harness_files(), MAPF, ROLLOUTS)
    assert not res.ok and "single factor" in res.reason, res.reason
    res = V.vet(cand("recipe", "recipe.temperature", 1.2, code="x = 1"), harness_files(), MAPF, ROLLOUTS)
    assert not res.ok and "carries a value, not code" in res.reason


def test_env_that_cannot_generate_is_rejected_offline():
    files = harness_files()
    env = yaml.safe_load(files["env.yaml"])
    env["sizes"][0]["hole_ratio"] = 0.6  # size 3 with 5 holes: a start-goal distance of 4 no longer fits
    files["env.yaml"] = yaml.safe_dump(env)
    res = V.vet(cand("env", "env.min_distance", 4), files, MAPF, ROLLOUTS)
    assert not res.ok and res.stage == "offline" and "does not generate size 3" in res.reason, res.reason


def test_reward_sane_change_passes_offline_backtest():
    for knob, value in (("reward.optimal_bonus", 1.0), ("reward.partial_credit", 0.3)):
        res = V.vet(cand("reward", knob, value), harness_files(), MAPF, ROLLOUTS)
        assert res.ok and res.stage == "offline", res.reason
        assert res.details["corr_after"] >= res.details["corr_before"] - V.CORR_DROP
        assert yaml.safe_load(res.files["recipe.yaml"])["reward"] == {knob.split(".")[1]: value}


def test_reward_that_pays_for_unparseable_answers_is_out_of_range():
    # format_penalty is what too_long (and unparseable) completions earn: positive, it pays for answers that cannot be
    # checked (a held-out scenario at +0.6 took the broken harness from 29% valid to 0% in ~300 steps); every family
    # bounds it at 0, so such a candidate (or a round-0 config) is refused by its range, naming the field
    res = V.vet(cand("reward", "reward.format_penalty", 2.0), harness_files(), MAPF, ROLLOUTS)
    assert not res.ok and res.stage != "offline" and "format_penalty" in res.reason, (res.stage, res.reason)


def test_reward_that_pays_invalid_plans_over_valid_ones_drops_the_correlation():
    res = V.vet(cand("reward", "reward.valid_reward", 0.0), harness_files(), MAPF, ROLLOUTS)
    assert not res.ok and res.stage == "offline", res.reason
    assert "corr(reward, valid) drops" in res.reason
    # a negative optimal bonus (an optimal plan paid less than a malformed one) is out of its range now
    res = V.vet(cand("reward", "reward.optimal_bonus", -2.0), harness_files(), MAPF, ROLLOUTS)
    assert not res.ok and res.stage != "offline" and "optimal_bonus" in res.reason, res.reason


def test_reward_that_pays_for_partial_moves_inverts_groups():
    files = harness_files()  # a binary reward (a valid plan 0.3, nothing else paid); then partial credit 1.0
    rec = yaml.safe_load(files["recipe.yaml"]) or {}
    files["recipe.yaml"] = yaml.safe_dump({**rec, "reward": {"valid_reward": 0.3, "optimal_bonus": 0.0,
                                                             "partial_credit": 0.0}})
    res = V.vet(cand("reward", "reward.partial_credit", 1.0), files, MAPF, ROLLOUTS)
    assert not res.ok and res.stage == "offline", res.reason
    assert res.details["inverted_groups_after"] > res.details["inverted_groups_before"] == 0
    res = V.vet(cand("reward", "reward.length_bonus", 0.1), harness_files(), MAPF, ROLLOUTS)
    assert not res.ok and res.stage == "vet" and "does not exist" in res.reason and "partial_credit" in res.reason


def test_env_that_misses_a_few_seeds_passes_and_one_that_misses_many_is_rejected(monkeypatch):
    """The run draws a seed its generator cannot draw from a replacement of its split, so the vet allows a config a
    miss or two in ENV_PROBE_INSTANCES draws and rejects one with ENV_PROBE_MISSES, naming the generator's message.
    Before, the vet drew 4 seeds and needed all of them: a config that failed 45% of its seeds passed one time in
    eleven and then stopped a later stage. Would catch a vet that draws too few seeds to see a failing config, or one
    that rejects any config whose generator misses once."""
    from harness.tasks import drawn

    monkeypatch.setenv(drawn.SWITCH, "0")
    first = V.seeds("train", V.ENV_PROBE_INSTANCES)
    for misses, ok in ((1, True), (V.ENV_PROBE_MISSES - 1, True), (V.ENV_PROBE_MISSES, False)):
        bad = set(first[-misses:])
        real = type(MAPF).generate

        def generate(self, c, s, bad=bad, real=real):
            if s in bad:
                raise ValueError(f"could not draw seed {s}; change env.sizes.3.hole_ratio")
            return real(self, c, s)

        with monkeypatch.context() as m:
            m.setattr(type(MAPF), "generate", generate)
            res = V.vet(cand("env", "env.min_distance", 2), harness_files(), MAPF, ROLLOUTS)
        assert res.ok is ok and res.stage == "offline", (misses, res.reason)
        if not ok:
            assert f"{misses} of {V.ENV_PROBE_INSTANCES} seeds failed" in res.reason and "hole_ratio" in res.reason
