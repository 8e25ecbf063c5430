"""The skill library on a real SQLite file in a tmp EVOTRAINER_HOME: seeds, retrieval, evidence, import/export, CLI.

    .venv/bin/pytest tests/test_skills_library.py
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from skills.library import (
    SEED_DIR,
    SkillError,
    SkillFileError,
    SkillLibrary,
    UnknownSkillError,
    condition_holds,
    copy_library,
    dump_skill,
    parse_skill,
)
from skills.model import Evidence, Intervention, Provenance, Skill, Trigger

ROOT = Path(__file__).resolve().parents[1]

SEEDS = {
    "raise-hole-ratio": """---
name: raise-hole-ratio
kind: env
trigger: {findings: [mapf.hole], condition: "rate >= 0.2"}
intervention: {knob: "env.sizes.{size}.hole_ratio", op: add, value: 0.1}
expected: "hole failures on that size drop; valid rate rises"
domains: [mapf]
---
When agents walk into holes on a map size, train on more holes there so the policy learns to route around them.
""",
    "more-wait-instances": """---
name: more-wait-instances
kind: env
trigger: {findings: [mapf.collision, mapf.swap]}
intervention: {knob: "env.sizes.{size}.wait_ratio", op: add, value: 0.1}
expected: "vertex and swap collisions drop"
domains: [mapf]
---
Agents collide because they never learned to wait a step; generate more instances whose optimal plan needs a wait.
""",
    "raise-temperature-on-dead-groups": """---
name: raise-temperature-on-dead-groups
kind: recipe
trigger: {findings: [grpo.dead_groups], condition: "rate >= 0.5"}
intervention: {knob: recipe.temperature, op: add, value: 0.2}
expected: "fewer GRPO groups with zero reward variance"
---
Sampling temperature too low: every completion in a group gets the same reward and the advantage is zero.
""",
    "math-format-hint": """---
name: math-format-hint
kind: reward
trigger: {findings: [math.format]}
intervention: {knob: reward.format_bonus, op: add, value: 0.1}
expected: "fewer unparseable answers"
domains: [math]
---
The policy forgets the answer format; a small format bonus brings it back.
""",
}


def _write_seeds(folder: Path, seeds: dict[str, str] = SEEDS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in seeds.items():
        (folder / f"{name}.md").write_text(text)
    return folder


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def seed_dir(tmp_path: Path) -> Path:
    return _write_seeds(tmp_path / "seed")


@pytest.fixture
def lib(home: Path, seed_dir: Path):
    library = SkillLibrary.open(seed_dir=seed_dir)
    yield library
    library.close()


def _skill(name: str, text: str, findings: list[str], domains: list[str], kind: str = "env") -> Skill:
    knob = {"env": "env.x", "recipe": "recipe.x", "reward": "reward.x", "diagnostic": "diagnostics/x.py"}[kind]
    return Skill(name=name, kind=kind, trigger=Trigger(findings=findings), intervention=Intervention(knob=knob),
                 expected="better", domains=domains, description=text)


def _try(lib: SkillLibrary, name: str, promoted: bool, family: str, run: str, candidate: str, effect: float = 0.05):
    return lib.record_try(name, promoted=promoted, effect=effect, interval=(effect - 0.03, effect + 0.03),
                          family=family, run=run, candidate=candidate, commit="abc1234")


# --- opening, seeds -----------------------------------------------------------------------------------------------------


def test_open_in_home_loads_seeds_once(home: Path, seed_dir: Path):
    with SkillLibrary.open(seed_dir=seed_dir) as lib:
        assert lib.path == home / "skills.db" and lib.path.exists()
        assert lib.names() == sorted(SEEDS)
        assert lib.get("raise-hole-ratio").provenance.source == "seed"
    with SkillLibrary.open(seed_dir=seed_dir) as lib:  # re-open: no duplicates, nothing re-added
        assert lib.db["skills"].count == len(SEEDS)
        assert lib.sync_seeds(seed_dir) == []


def test_seed_update_keeps_evidence_and_never_clobbers_a_run_skill(home: Path, seed_dir: Path):
    with SkillLibrary.open(seed_dir=seed_dir) as lib:
        assert _try(lib, "raise-hole-ratio", True, "mapf", "r1", "s1-c1")
        lib.add(_skill("from-a-run", "learned in r1", ["mapf.hole"], ["mapf"]))
    (seed_dir / "raise-hole-ratio.md").write_text(SEEDS["raise-hole-ratio"].replace("valid rate rises", "valid up"))
    (seed_dir / "from-a-run.md").write_text(SEEDS["math-format-hint"].replace("math-format-hint", "from-a-run"))
    with SkillLibrary.open(seed_dir=seed_dir) as lib:
        s = lib.get("raise-hole-ratio")
        assert s.expected == "hole failures on that size drop; valid up"
        assert (s.evidence.tries, s.evidence.promotions, s.evidence.families) == (1, 1, ["mapf"])
        assert lib.get("from-a-run").description == "learned in r1"  # a same-named seed does not overwrite it


def test_add_refuses_a_duplicate_and_unknown_names_get_a_hint(lib: SkillLibrary):
    with pytest.raises(SkillError, match="already exists; pick another name or pass replace=True"):
        lib.add(_skill("raise-hole-ratio", "x", ["mapf.hole"], ["mapf"]))
    with pytest.raises(UnknownSkillError, match="did you mean raise-hole-ratio"):
        lib.get("raise-hole")
    with pytest.raises(SkillError, match="trigger.condition.*uses Call; write comparisons"):
        lib.add(Skill(name="bad-cond", kind="env", trigger=Trigger(findings=["a.b"], condition="__import__('os')"),
                      intervention=Intervention(knob="env.x"), expected="e"))


# --- retrieval ----------------------------------------------------------------------------------------------------------


def test_search_ranks_the_relevant_skill_first(lib: SkillLibrary):
    assert lib.search("agents keep falling into holes on the big maps")[0].name == "raise-hole-ratio"
    assert lib.search("zero reward variance in every group, sampling too cold")[0].name == \
        "raise-temperature-on-dead-groups"
    assert lib.search("agents collided; they should wait")[0].name == "more-wait-instances"
    assert lib.search("grpo.dead_groups")[0].name == "raise-temperature-on-dead-groups"  # a finding code as query
    # task filter: a math run sees math skills and family-free (recipe) skills, never mapf-only ones
    names = {s.name for s in lib.search("holes format temperature", task="math")}
    assert names == {"math-format-hint", "raise-temperature-on-dead-groups"}


def test_search_breaks_relevance_ties_by_evidence(lib: SkillLibrary):
    lib.add(_skill("twin-a", "shrink the corridor width when agents deadlock", ["mapf.deadlock"], ["mapf"]))
    lib.add(_skill("twin-b", "shrink the corridor width when agents deadlock", ["mapf.deadlock"], ["mapf"]))
    for i in range(3):
        _try(lib, "twin-b", True, "mapf", "r1", f"c{i}")
        _try(lib, "twin-a", False, "mapf", "r1", f"c{i}")
    assert [s.name for s in lib.search("corridor deadlock")[:2]] == ["twin-b", "twin-a"]
    for i in range(3, 9):
        _try(lib, "twin-a", True, "mapf", "r2", f"c{i}")
        _try(lib, "twin-b", False, "mapf", "r2", f"c{i}")
    assert [s.name for s in lib.search("corridor deadlock")[:2]] == ["twin-a", "twin-b"]


def test_applicable_in_family_first_then_fallback(lib: SkillLibrary):
    hits = lib.applicable(["mapf.collision", "grpo.dead_groups", "mapf.hole"], task="mapf")
    assert [s.name for s in hits.in_family] == ["more-wait-instances", "raise-temperature-on-dead-groups",
                                                "raise-hole-ratio"]
    assert hits.fallback == []
    # a trigger condition filters when the finding's facts are given
    hits = lib.applicable(["mapf.hole"], task="mapf", facts={"mapf.hole": {"rate": 0.1, "count": 3}})
    assert hits.in_family == []
    # a math run with a format failure: the math skill in family; a mapf skill for the same kind of failure only as
    # fallback, and the general one first
    lib.add(_skill("mapf-format-retry", "x", ["mapf.format"], ["mapf"]))
    lib.add(_skill("code-format-fix", "y", ["code.format"], ["code"]))
    _try(lib, "code-format-fix", True, "code", "r1", "c1")
    _try(lib, "code-format-fix", True, "mapf", "r2", "c1")
    hits = lib.applicable(["math.format"], task="math")
    assert [s.name for s in hits.in_family] == ["math-format-hint"]
    assert [s.name for s in hits.fallback] == ["code-format-fix", "mapf-format-retry"]


def test_conditions_are_a_safe_small_language():
    assert condition_holds("rate >= 0.2 and count > 3", {"rate": 0.25, "count": 4})
    assert not condition_holds("rate >= 0.2 and not severity == 'info'", {"rate": 0.5, "severity": "info"})
    assert condition_holds("", {})
    for bad in ("open('x')", "rate.__class__", "[rate]", "x > 1"):
        with pytest.raises(SkillError):
            condition_holds(bad, {"rate": 1.0})


# --- evidence -----------------------------------------------------------------------------------------------------------


def test_record_try_is_idempotent_across_reopen(home: Path, seed_dir: Path):
    with SkillLibrary.open(seed_dir=seed_dir) as lib:
        assert _try(lib, "raise-hole-ratio", True, "mapf", "r1", "s1-c1", effect=0.10)
        assert not _try(lib, "raise-hole-ratio", True, "mapf", "r1", "s1-c1", effect=0.10)
    with SkillLibrary.open(seed_dir=seed_dir) as lib:  # the resumed run records the same try again
        assert not _try(lib, "raise-hole-ratio", True, "mapf", "r1", "s1-c1", effect=0.10)
        assert _try(lib, "raise-hole-ratio", False, "mapf", "r1", "s2-c1", effect=-0.02)
        ev = lib.get("raise-hole-ratio").evidence
        assert (ev.tries, ev.promotions) == (2, 1)
        assert ev.mean_effect == pytest.approx(0.04) and ev.last_interval == pytest.approx((-0.05, 0.01))
        assert len(lib.tries("raise-hole-ratio")) == 2
        with pytest.raises(UnknownSkillError):
            _try(lib, "no-such-skill", True, "mapf", "r1", "c")


def test_skill_becomes_general_after_promotions_in_two_families(lib: SkillLibrary):
    name = "raise-temperature-on-dead-groups"
    _try(lib, name, True, "mapf", "r1", "c1")
    _try(lib, name, True, "mapf", "r2", "c1")
    _try(lib, name, False, "math", "r3", "c1")  # a rejection in a second family does not count
    assert not lib.get(name).general and lib.get(name).evidence.families == ["mapf"]
    _try(lib, name, True, "math", "r4", "c1")
    assert lib.get(name).general and lib.get(name).evidence.families == ["mapf", "math"]
    # a general mapf-only skill shows up for another task family
    hole = "raise-hole-ratio"
    assert hole not in {s.name for s in lib.all("code")}
    _try(lib, hole, True, "mapf", "r1", "c2")
    _try(lib, hole, True, "math", "r5", "c2")
    assert hole in {s.name for s in lib.all("code")}


# --- import / export ----------------------------------------------------------------------------------------------------


def test_export_import_round_trip_is_exact(tmp_path: Path, lib: SkillLibrary):
    _try(lib, "raise-hole-ratio", True, "mapf", "r1", "c1", effect=0.125)
    _try(lib, "raise-hole-ratio", True, "math", "r2", "c1", effect=0.0625)
    lib.add(_skill("diag-from-run", "multi-line\n\nbody with `code` and: colons", ["evolved.x.y"], ["mapf"],
                   kind="diagnostic").model_copy(update={"provenance": Provenance(source="run", run="r1", commit="abc1234")}))
    first = lib.export(tmp_path / "out1")
    assert sorted(p.name for p in first) == sorted([f"{n}.md" for n in SEEDS] + ["diag-from-run.md"])
    with SkillLibrary.open(tmp_path / "other" / "skills.db", seed_dir=None) as other:
        assert sorted(other.import_dir(tmp_path / "out1")) == lib.names()
        # definitions travel exactly; evidence travels as a claim (`imported`), shown, re-earned before it ranks
        bare = {"evidence": Evidence(), "imported": None}
        assert [s.model_copy(update=bare) for s in other.all()] == [s.model_copy(update=bare) for s in lib.all()]
        assert {s.name: s.imported for s in other.all()} == \
            {s.name: (s.evidence if s.evidence != Evidence() else None) for s in lib.all()}
        assert not other.get("raise-hole-ratio").general  # general is earned in this library, not claimed
        second, other_all = other.export(tmp_path / "out2"), other.all()
    with SkillLibrary.open(tmp_path / "third" / "skills.db", seed_dir=None) as third:  # a second hop changes nothing
        assert sorted(third.import_dir(tmp_path / "out2")) == lib.names()
        assert third.all() == other_all
        third_files = third.export(tmp_path / "out3")
    assert {p.name: p.read_bytes() for p in second} == {p.name: p.read_bytes() for p in third_files}
    s = lib.get("raise-hole-ratio")
    assert parse_skill(dump_skill(s))[0] == s and s.general


def test_malformed_import_names_the_file_and_the_field(tmp_path: Path, lib: SkillLibrary):
    good = tmp_path / "in" / "good.md"
    _write_seeds(tmp_path / "in", {"good": SEEDS["math-format-hint"].replace("math-format-hint", "brand-new")})
    cases = {
        "not-a-list.md": ("findings: [mapf.hole]", "findings: mapf.hole",
                          "field 'trigger.findings': Input should be a valid list"),
        "typo.md": ("expected:", "expectd:", "field 'expectd': Extra inputs are not permitted"),
        "bad-kind.md": ("kind: env", "kind: environment", "field 'kind': Input should be"),
        "bad-cond.md": ('condition: "rate >= 0.2"', 'condition: "rate >= 0.2 or os.system(1)"',
                        "field 'trigger.condition'"),
        "bad-yaml.md": ("domains: [mapf]", "domains: [mapf", "front matter is not valid YAML"),
        "no-front.md": ("---\nname", "name", "starts with a '---' line"),
        "bomb.md": ("domains: [mapf]", "domains: [mapf]\nx0: &a [z, z, z, z, z, z, z, z, z, z]\n" + "".join(
            f"x{i}: &{chr(97 + i)} [*{chr(96 + i)}, *{chr(96 + i)}, *{chr(96 + i)}, *{chr(96 + i)}, *{chr(96 + i)}, "
            f"*{chr(96 + i)}, *{chr(96 + i)}, *{chr(96 + i)}, *{chr(96 + i)}, *{chr(96 + i)}]\n" for i in range(1, 9)),
                    "expands to more than"),  # an alias bomb (10^9 values) in an imported file: bounded, one line
        # an outside review (eighty-second session): each imported before, and then broke the library or a run
        "nan.md": ("domains: [mapf]", "domains: [mapf]\nevidence: {tries: 3, promotions: 1, mean_effect: .nan}",
                   "field 'evidence': not finite"),
        "claims.md": ("domains: [mapf]", "domains: [mapf]\nevidence: {tries: 3, promotions: 1000}",
                      "1000 promotions out of 3 tries"),
        "judge.md": ('knob: "env.sizes.{size}.hole_ratio"', 'knob: "judge.promote_above"', "is not a env knob"),
        "long.md": ("name: raise-hole-ratio", "name: " + "a" * 300, "skill name of 300 characters"),
        "essay.md": ('expected: "hole', 'expected: "' + "x" * 400 + ' hole', "field 'expected': one line of at most"),
    }
    for fname, (old, new, msg) in cases.items():
        bad = tmp_path / "in" / fname
        assert old in SEEDS["raise-hole-ratio"]
        bad.write_text(SEEDS["raise-hole-ratio"].replace(old, new, 1))
        with pytest.raises(SkillFileError) as exc:
            lib.import_files([good, bad])
        assert str(bad) in str(exc.value) and msg in str(exc.value), str(exc.value)
        bad.unlink()
    assert "brand-new" not in lib.names()  # nothing from a batch with a bad file was imported
    assert lib.import_files([good]) == ["brand-new"] and lib.get("brand-new").provenance.source == "import"
    with pytest.raises(SkillFileError, match="no such file or folder"):
        lib.import_files([tmp_path / "missing.md"])
    os.mkfifo(tmp_path / "fifo.md")  # hung the import
    with pytest.raises(SkillFileError, match="not a regular file"):
        lib.import_files([tmp_path / "fifo.md"])
    assert lib.import_files([good, good.parent]) == ["brand-new"]  # one file named twice: imported once


def test_an_import_of_an_edited_description_is_kept_with_what_the_skill_earned(tmp_path: Path, lib: SkillLibrary):
    """The same definition with other words: the description is the file's and the evidence stays (before, the
    import said "imported" and kept the old text)."""
    _try(lib, "raise-hole-ratio", True, "mapf", "r1", "c1")
    (path,) = lib.export(tmp_path / "out", names=["raise-hole-ratio"])
    path.write_text(path.read_text() + "\nA line added by hand.\n")
    lib.import_files([path])
    sk = lib.get("raise-hole-ratio")
    assert "A line added by hand." in sk.description and sk.evidence.tries == 1


def test_untried_imports_rank_after_what_this_library_has_tried(tmp_path: Path, lib: SkillLibrary):
    """Thirty imported skills with no try here each drew their own Beta(1, 1) and took the first slot from a seed
    with 5 of 5 promotions in 85% of stages; together they now draw once, as one untried hypothesis (the seed's
    Beta(6, 1) beats one uniform draw 6 times in 7)."""
    from harness.engineer.rule import thompson_scores, untried_import

    folder = tmp_path / "many"
    _write_seeds(folder, {f"imp-{i}": SEEDS["raise-hole-ratio"].replace("raise-hole-ratio", f"imp-{i}")
                          for i in range(30)})
    lib.import_files([folder])
    for i in range(5):
        _try(lib, "raise-hole-ratio", True, "mapf", f"r{i}", "c1")
    skills = [lib.get("raise-hole-ratio"), *(lib.get(f"imp-{i}") for i in range(30))]
    assert all(untried_import(s) for s in skills[1:]) and not untried_import(skills[0])
    rng = np.random.default_rng(0)
    firsts = [max(sc := thompson_scores(skills, rng), key=sc.get) for _ in range(400)]
    assert 0.78 < firsts.count("raise-hole-ratio") / 400 < 0.93, firsts.count("raise-hole-ratio")  # 6/7 = 0.857


# --- CLI ----------------------------------------------------------------------------------------------------------------


def test_cli_list_show_export_import(tmp_path: Path, home: Path, seed_dir: Path):
    from harness.cli import app

    _write_seeds(tmp_path / "in")
    runner = CliRunner()
    other = tmp_path / "other-home"
    # the test's seeds redefine a shipped seed skill of the same name: refused without --replace, nothing written
    r = runner.invoke(app, ["skills", "import", str(tmp_path / "in"), "--home", str(other)])
    assert r.exit_code == 1 and "already has skill(s) raise-temperature-on-dead-groups with another definition" \
        in str(r.exception)
    with SkillLibrary.open(other / "skills.db", seed_dir=None) as lib:
        assert "raise-hole-ratio" not in lib.names()
    r = runner.invoke(app, ["skills", "import", str(tmp_path / "in"), "--replace", "--home", str(other)])
    assert r.exit_code == 0 and r.output.startswith(f"imported: {len(SEEDS)} skills"), r.output
    assert "replaced: raise-temperature-on-dead-groups (another definition" in r.output
    assert "\ntrust: " in r.output and "not trusted: evidence" in r.output  # the import says what it trusts
    r = runner.invoke(app, ["skills", "list", "--task", "math", "--json", "--home", str(other)])
    assert r.exit_code == 0, r.output
    listed = {s["name"]: s for s in json.loads(r.output)}  # the shipped seed skills load too (general ones fit math)
    assert {"math-format-hint", "raise-temperature-on-dead-groups"} <= set(listed) and "raise-hole-ratio" not in listed
    assert all(not s["domains"] or "math" in s["domains"] for s in listed.values())
    r = runner.invoke(app, ["skills", "show", "raise-hole-ratio", "--home", str(other)])
    assert r.exit_code == 0 and "name: raise-hole-ratio\n" in r.output and "route around them" in r.output
    total = len(set(SEEDS) | {p.stem for p in SEED_DIR.glob("*.md")})  # imported + the shipped seeds
    r = runner.invoke(app, ["skills", "export", str(tmp_path / "out"), "--home", str(other)])
    assert r.exit_code == 0 and f"exported: {total} skills" in r.output
    assert (tmp_path / "out" / "raise-hole-ratio.md").read_text().startswith("---\nname: raise-hole-ratio\n")
    r = runner.invoke(app, ["skills", "list", "--home", str(other)])
    assert r.exit_code == 0 and f"skills: {total}" in r.output
    for cmd in ("list", "show", "export", "import"):
        assert runner.invoke(app, ["skills", cmd, "--help"]).exit_code == 0


def test_cli_malformed_import_is_a_clear_error_and_exit_2(tmp_path: Path, home: Path, monkeypatch, capsys):
    from harness.cli import main

    bad = tmp_path / "bad.md"
    bad.write_text(SEEDS["raise-hole-ratio"].replace("kind: env", "kind: nope"))
    monkeypatch.setattr(sys, "argv", ["evotrainer", "skills", "import", str(bad), "--home", str(tmp_path / "h")])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2
    flat = "".join(capsys.readouterr().err.split())  # rich wraps long lines at the console width
    assert flat.startswith("error:") and f"{bad}:field'kind':Inputshouldbe" in flat, flat


# --- hostile input: conditions and claimed evidence (issue 36) ---------------------------------------------------------

HOSTILE_CONDITIONS = {
    "type-error": ("severity > 1", "compares severity (a word) with 1 (a number)"),
    "recursion": ("not " * 1000 + "rate > 0", "characters long; at most 200"),
    "deep": ("not " * 20 + "rate > 0", "nests and/or/not deeper than 8 levels"),
    "big": ("rate > 0" + " and rate > 0" * 14, "syntax nodes; at most 64"),
    "word-vs-number": ("rate > 'critical'", "compares rate (a number) with 'critical' (a word)"),
    "typo-severity": ("severity == 'critcal'", "'critcal', which is no severity"),
    "ordered-words": ("severity < 'warn'", "severities compare with == or != only"),
    "bare-name": ("rate", "uses Name; write comparisons"),
    "none": ("count == None", "uses the constant None"),
    "membership": ("rate in [1]", "uses List"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_CONDITIONS))
def test_a_hostile_condition_is_refused_at_import_and_save_in_one_line(tmp_path: Path, lib: SkillLibrary, case: str):
    """Each condition here checked fine before (all are comparisons, names and constants) and then raised TypeError
    or RecursionError at every proposal of every run on the library."""
    cond, why = HOSTILE_CONDITIONS[case]
    f = tmp_path / "hostile.md"
    f.write_text(SEEDS["raise-hole-ratio"].replace("raise-hole-ratio", "hostile-skill")
                 .replace('condition: "rate >= 0.2"', f"condition: {json.dumps(cond)}"))
    with pytest.raises(SkillFileError) as exc:
        lib.import_files([f])
    msg = str(exc.value)
    assert "\n" not in msg and len(msg) < 400 and str(f) in msg and "'hostile-skill'" in msg, msg
    assert "trigger.condition" in msg and why in msg, msg
    assert "hostile-skill" not in lib.names()
    with pytest.raises(SkillError) as exc:  # saving (what a run does with a new skill) checks the same
        lib.add(Skill(name="hostile-skill", kind="env", trigger=Trigger(findings=["mapf.hole"], condition=cond),
                      intervention=Intervention(knob="env.x"), expected="e"))
    assert "\n" not in str(exc.value) and "'hostile-skill'" in str(exc.value) and why in str(exc.value)
    assert "hostile-skill" not in lib.names()


def test_typed_conditions_still_accept_what_the_seeds_and_docs_write(lib: SkillLibrary):
    fields = {"rate": 0.3, "count": 12, "severity": "critical"}
    for cond, want in [("rate >= 0.2", True), ("rate > 0.05 and rate < 0.9", True), ("0.1 < rate < 0.2", False),
                       ("severity == 'critical' or count > 100", True), ("not severity != 'critical'", True),
                       ("rate >= 0.2 and count > 3 and not severity == 'info'", True)]:
        assert condition_holds(cond, fields) is want, cond
    for p in SEED_DIR.glob("*.md"):  # every shipped seed's condition checks and evaluates
        assert isinstance(condition_holds(parse_skill(p.read_text(), str(p))[0].trigger.condition, fields), bool)
    with pytest.raises(SkillError, match="the finding's severity is 3, not a word"):
        condition_holds("severity == 'warn'", {"severity": 3})


def test_a_hostile_row_in_the_database_is_skipped_by_applicable_and_named(lib: SkillLibrary):
    """A library an older version wrote (or a hand edit) may hold rows no import would accept: `applicable` leaves
    each out with a line naming it, and the other skills still apply."""
    good = json.loads(lib.db["skills"].get("raise-hole-ratio")["definition"])
    for name, cond in [("bad-type", "severity > 1"), ("bad-depth", "not " * 1000 + "rate > 0")]:
        lib.db["skills"].insert({**lib.db["skills"].get("raise-hole-ratio"), "name": name, "definition": json.dumps(
            {**good, "name": name, "trigger": {"findings": ["mapf.hole"], "condition": cond}})})
    lib.db["skills"].insert({**lib.db["skills"].get("raise-hole-ratio"), "name": "bad-json", "definition": "{"})
    hits = lib.applicable(["mapf.hole"], task="mapf", facts={"mapf.hole": {"rate": 0.3, "count": 9,
                                                                           "severity": "warn"}})
    assert [s.name for s in hits.in_family] == ["raise-hole-ratio"]
    assert sorted(line.split()[1] for line in hits.skipped) == ["bad-depth", "bad-json", "bad-type"], hits.skipped
    assert all("\n" not in line and len(line) < 500 for line in hits.skipped)


def test_imported_evidence_is_shown_not_trusted(tmp_path: Path, lib: SkillLibrary):
    """A file claiming 10000 promotions in three families: kept as `imported`, ranked as an untried skill, not
    general; only tries recorded here count."""
    f = tmp_path / "boast.md"
    f.write_text(SEEDS["raise-hole-ratio"].replace("raise-hole-ratio", "boast").replace(
        "domains: [mapf]", "domains: [mapf]\nevidence: {tries: 10000, promotions: 10000, mean_effect: 0.9, "
                           "families: [mapf, math, code]}"))
    assert lib.import_files([f]) == ["boast"]
    s = lib.get("boast")
    assert (s.evidence.tries, s.evidence.promotions, s.evidence.families) == (0, 0, [])
    assert s.imported is not None and (s.imported.promotions, s.imported.families) == (10000, ["mapf", "math", "code"])
    assert not s.general and "boast" not in {x.name for x in lib.all("code")}
    hits = lib.applicable(["mapf.hole"], task="mapf")
    assert [x.name for x in hits.in_family] == ["boast", "raise-hole-ratio"]  # a tie broken by name, not by the claim
    _try(lib, "raise-hole-ratio", True, "mapf", "r1", "c1")
    assert [x.name for x in lib.applicable(["mapf.hole"], task="mapf").in_family] == ["raise-hole-ratio", "boast"]
    assert lib.search("holes")[0].name == "raise-hole-ratio"
    _try(lib, "boast", True, "mapf", "r1", "c2")  # evidence earned here counts; the claim stays as it was
    s = lib.get("boast")
    assert (s.evidence.tries, s.evidence.promotions, s.imported.promotions) == (1, 1, 10000)
    assert "imported:" in dump_skill(s) and "imported:" not in dump_skill(lib.get("raise-hole-ratio"))


def test_an_older_library_hands_its_imported_evidence_over_to_imported(tmp_path: Path):
    """A skill an older version imported carried the file's claim as its evidence: the migration moves the claim to
    `imported` and rebuilds the evidence from the tries this library recorded."""
    import sqlite3

    from sqlite_utils import Database

    from skills.library import m001_skills_and_tries

    path = tmp_path / "old.db"
    db = Database(sqlite3.connect(str(path)))
    db["_migrations"].create({"name": str, "applied_at": str}, pk="name")
    m001_skills_and_tries(db)
    db["_migrations"].insert({"name": "m001_skills_and_tries", "applied_at": "then"})
    skill, _ = parse_skill(SEEDS["raise-hole-ratio"].replace("raise-hole-ratio", "boast"))
    for name, source in [("boast", "import"), ("grown", "run")]:
        db["skills"].insert({"name": name, "kind": "env", "description": "", "expected": "e", "triggers": "mapf.hole",
                             "domains": "mapf", "definition": skill.model_copy(update={
                                 "name": name, "provenance": Provenance(source=source)}).model_dump_json(
                                 exclude={"evidence", "description"}),
                             "tries": 10000, "promotions": 10000, "mean_effect": 0.9, "families": '["mapf", "math"]'})
    db["skill_tries"].insert({"skill": "boast", "run": "r1", "candidate": "c1", "promoted": 0, "effect": -0.1,
                              "ci_low": -0.2, "ci_high": 0.0, "family": "mapf", "commit_sha": None, "ts": "t"})
    db.close()
    with SkillLibrary.open(path, seed_dir=None) as lib:
        boast, grown = lib.get("boast"), lib.get("grown")
    assert (boast.evidence.tries, boast.evidence.promotions, boast.evidence.mean_effect) == (1, 0, -0.1)
    assert boast.imported is not None and boast.imported.promotions == 10000 and not boast.general
    assert grown.evidence.promotions == 10000 and grown.imported is None  # a run's own skill keeps its evidence


def test_a_copy_learns_apart_and_merges_back_each_try_once(tmp_path: Path, lib: SkillLibrary):
    """An experiment's evolved run learns in a copy of the library and merges back at its end: the copy's new try on
    an existing skill and the skill it filed arrive with their evidence; a try both already had (inherited by the
    copy) counts once; merging again adds nothing; the original's own later tries are kept."""
    _try(lib, "raise-hole-ratio", True, "mapf", "before", "s1c1")
    copy_library(lib.path, tmp_path / "own.db")
    own = SkillLibrary.open(tmp_path / "own.db", seed_dir=None)
    try:
        assert own.get("raise-hole-ratio").evidence.tries == 1  # the copy starts where the library stood
        _try(own, "raise-hole-ratio", False, "mapf", "run-a", "s2c1", effect=-0.01)
        born = _skill("mapf-env-mixture-run-a", "re-weight toward the target", ["target.mix_far"], ["mapf"])
        own.add(born.model_copy(update={"evidence": Evidence(tries=1, promotions=1, mean_effect=0.07,
                                                             families=["mapf"])}))
        _try(own, "mapf-env-mixture-run-a", True, "mapf", "run-a", "s3c1", effect=0.05)
        _try(lib, "raise-hole-ratio", True, "math", "run-b", "s1c2")  # another run merged meanwhile
        added, tries = lib.merge_from(own)
        assert added == ["mapf-env-mixture-run-a"] and tries == 1, (added, tries)
        ev = lib.get("raise-hole-ratio").evidence
        assert (ev.tries, ev.promotions) == (3, 2), ev  # before + run-b + run-a's: the inherited one counted once
        assert {(t["run"], t["candidate"]) for t in lib.tries("raise-hole-ratio")} == {
            ("before", "s1c1"), ("run-b", "s1c2"), ("run-a", "s2c1")}
        born_ev = lib.get("mapf-env-mixture-run-a").evidence
        assert (born_ev.tries, born_ev.promotions) == (2, 2) and len(lib.tries("mapf-env-mixture-run-a")) == 1
        assert lib.search("re-weight toward the target")[0].name == "mapf-env-mixture-run-a"  # full-text index too
        assert lib.merge_from(own) == ([], 0)  # a resumed run merging again changes nothing
        assert lib.get("raise-hole-ratio").evidence.tries == 3
        # redefined here while the copy ran (`skills import --replace`): the copy's tries tried the old definition
        _try(own, "raise-hole-ratio", True, "mapf", "run-a", "s4c1", effect=0.3)
        old = lib.get("raise-hole-ratio")
        lib.add(old.model_copy(update={"expected": "a redefinition"}), replace=True)
        redefined: list[str] = []
        assert lib.merge_from(own, redefined) == ([], 0) and redefined == ["raise-hole-ratio"]
        assert (lib.get("raise-hole-ratio").evidence.tries, len(lib.tries("raise-hole-ratio"))) == (3, 3)
    finally:
        own.close()


def test_a_damaged_library_is_one_line_at_start_and_in_the_cli_and_a_bad_row_costs_itself(tmp_path, monkeypatch):
    """A skills.db that is not a database: `run` refuses before the run folder exists (before: it crashed at the
    first stage's proposal, after the warm start and the training), and `skills list` is one line naming the file and
    the fix. One row that does not read back: `list`/`export` name it and show the rest. Would catch a check that
    runs after training, a traceback, or one bad row hiding the library."""
    from harness.benchmarks.run import TINY
    from harness.cli import app
    from harness.config import parse_config
    from harness.lifecycle import RunError, start_run

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("EVOTRAINER_HOME", str(home))
    (home / "skills.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(RunError, match=r"the skill library .*skills.db cannot be used: .*move it aside"):
        start_run(parse_config(dict(TINY, name="x"), "t"), tmp_path / "runs", run_id="x")
    assert not (tmp_path / "runs" / "x").exists()
    r = CliRunner().invoke(app, ["skills", "list", "--home", str(home)])
    assert r.exit_code == 1 and "cannot be used" in str(r.exception) and "mv " in str(r.exception)
    (home / "skills.db").unlink()
    with SkillLibrary.open(home / "skills.db") as lib:
        n = len(lib.names())
        lib.db.execute("UPDATE skills SET definition = '{broken' WHERE name = ?", [lib.names()[0]])
        lib.db.conn.commit()
    r = CliRunner().invoke(app, ["skills", "list", "--json", "--home", str(home)])
    assert r.exit_code == 0 and len(json.loads(r.stdout)) == n - 1
    assert "skipped: skill" in r.stderr and "does not read back" in r.stderr
    r = CliRunner().invoke(app, ["skills", "export", str(tmp_path / "out"), "--home", str(home)])
    assert r.exit_code == 0 and f"exported: {n - 1} skills" in r.stdout and "1 that do not read back" in r.stdout


def test_an_import_cannot_take_over_a_skill_and_its_evidence(tmp_path: Path, lib: SkillLibrary):
    """A shared file named like a skill that earned 3 of 3 but doing something else: refused; with replace, the new
    definition starts from no evidence. The library's own export brought back changes nothing. Would catch the
    takeover (before: the definition was replaced silently and kept the 3/3 that ranked it first)."""
    for c in ("c1", "c2", "c3"):
        _try(lib, "raise-hole-ratio", True, "mapf", "r1", c)
    [own] = lib.export(tmp_path / "own", names=["raise-hole-ratio"])
    assert lib.import_files([own]) == ["raise-hole-ratio"]
    assert lib.get("raise-hole-ratio").evidence.promotions == 3  # the same definition: nothing changes
    evil = tmp_path / "evil.md"
    text = own.read_text()
    evil.write_text(text.replace("op: add", "op: mul").replace("value: 0.1", "value: 8.0"))
    assert evil.read_text() != own.read_text()
    with pytest.raises(SkillFileError, match="already has skill\\(s\\) raise-hole-ratio with another definition"):
        lib.import_files([evil])
    assert lib.get("raise-hole-ratio").evidence.promotions == 3
    replaced: list[str] = []
    lib.import_files([evil], replace=True, replaced=replaced)
    s = lib.get("raise-hole-ratio")
    assert replaced == ["raise-hole-ratio"] and (s.evidence.tries, s.evidence.promotions) == (0, 0)
    assert len(lib.tries("raise-hole-ratio")) == 3  # the history stays


def test_the_family_neutral_seed_skills_are_a_new_familys_own(home: Path):
    """A family added after the seeds were written ("sortd") met a regression and a frontier level with the seed rate
    cut and frontier skills counted as another family's (used only for slots its own could not fill): their
    domains named the three families of the day. A family-neutral seed names no family."""
    library = SkillLibrary.open(seed_dir=SEED_DIR)
    try:
        app = library.applicable(["grpo.policy_regressed", "sortd.frontier"], "sortd")
        own = [s.name for s in app.in_family]
        assert "lower-learning-rate-on-regression" in own and "data-ratio-toward-frontier" in own, own
        for name in ("lower-learning-rate-on-regression", "data-ratio-toward-frontier"):
            assert not library.get(name).domains
        # every seed that names no family triggers on family-neutral findings only (the temperature cut on parse
        # errors named MAPF's own codes, which skip `grpo.malformed`'s check that the start policy wrote them too)
        for skill in library.all():
            if skill.provenance.source == "seed" and not skill.domains:
                assert not any(t.split(".")[0] in {"mapf", "math", "code"} for t in skill.trigger.findings), skill
    finally:
        library.close()


def test_a_busy_library_is_named_busy_and_a_synced_one_is_read_under_anothers_lock(tmp_path, monkeypatch):
    """Another process holds a write lock on the home's library (a second run at remember, `skills import`, a
    person's sqlite3). Before: every open took a write lock to sync the seeds, so a live run crashed at propose with a
    traceback, and a start was refused with advice to move the library aside as damaged (which drops every run's
    evidence). Now an open with nothing to sync writes nothing, and a write that stays locked is named busy, with no
    such advice. Would catch the seed sync taking the lock again, or the damaged-file message for a busy one."""
    import sqlite3

    import skills.library as L

    monkeypatch.setattr(L, "BUSY_TIMEOUT_S", 0.5)
    path = tmp_path / "skills.db"
    with SkillLibrary.open(path) as lib:
        n = len(lib.all())
    holder = sqlite3.connect(str(path), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with SkillLibrary.open(path) as lib:  # the seeds are in: nothing to write, nothing waits
            assert len(lib.all()) == n
            with pytest.raises(L.SkillLibraryError, match=r"is busy: another process holds a write lock .* nothing is "
                                                          r"damaged") as exc:
                lib.record_try(lib.all()[0].name, promoted=True, effect=0.1, interval=None, family="mapf", run="r",
                               candidate="c")
            assert "move it aside" not in str(exc.value)
    finally:
        holder.rollback()
        holder.close()


def test_a_full_disk_is_not_called_a_damaged_library(tmp_path, monkeypatch):
    """SQLite in WAL mode says "disk I/O error" when the disk fills; with the library's file system nearly full the
    message says so and to free space, not that the library may be damaged and should be moved aside (an outside
    review: a full home read "if it is damaged, move it aside"). Would catch the words alone deciding it."""
    import shutil
    from collections import namedtuple

    import skills.library as L

    path = tmp_path / "skills.db"
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(1 << 30, (1 << 30) - (256 << 10), 256 << 10))
    msg = str(L.library_error(path, "disk I/O error"))
    assert "the disk is full" in msg and "free space" in msg and "move it aside" not in msg, msg
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(1 << 40, 1 << 39, 1 << 39))
    assert "move it aside" in str(L.library_error(path, "disk I/O error"))  # room left: it may be damaged
