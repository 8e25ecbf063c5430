"""Scenarios (`harness.scenarios`, `evotrainer bench scenarios`): a broken harness as data, refused before anything
trains when it cannot run, and run end to end through every arm at equal compute with a real tiny model."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from harness.config import parse_config
from harness.experiment import key_values
from harness.scenarios import (
    QUICK_CONFIRM,
    QUICK_TEST_N,
    ScenarioError,
    check,
    harness_of,
    load_scenario,
    run_dict,
    scenario_files,
    summarize,
    summary_md,
    table,
)

ROOT = Path(__file__).resolve().parents[1]
MARK = "DEFECT-7f3a91"  # in the scenario's comment only: no arm may ever see it

ENV = {"min_distance": 1, "sizes": [{"size": s, "data_ratio": 0.5, "hole_ratio": 0.2, "wait_ratio": 0.5, "agents": 2}
                                    for s in (3, 4)]}
TINY = {
    "task": "mapf", "seed": 0, "policy": {"preset": "tiny"},
    "warm_start": {"sft_examples": 64, "sft_steps": 20},
    "recipe": {"steps": 1, "batch_size": 8, "num_generations": 4, "learning_rate": 1e-4, "temperature": 0.7,
               "beta": 0.0, "max_completion_length": 24},
    "budget": {"stages": 2}, "stage": {"train_instances": 16, "probe_n": 4, "probe_samples": 2},
    # carry confirmations of one batch of 8, never extended (not 288 to 864): every token they decode is the
    # baselines' budget (`stage.keep_training` reads one every stage, and a final pick): at 288 the arms trained 20x
    # longer and the test took 814 s in CI; at 24 (judged on to 72) they were half the evolved arm's compute
    "backtest": {"arm_steps": 1, "n": 8, "samples": 2, "carry_confirm": 8, "carry_confirm_max": 8},
    "engineer": {"kind": "rule"},
}


def _write(tmp_path: Path, name: str = "tiny", **over) -> Path:
    sc = {"scenario": name, "run": TINY, "target": ENV, "test_n": 16,
          "round0": {"env": ENV, "recipe": {"learning_rate": 4e-4}},
          "oracle": {"env": ENV, "recipe": {"learning_rate": 1e-4, "lr_schedule": "cosine"}}, **over}
    p = tmp_path / f"{name}.yaml"
    p.write_text(f"# Defect ({MARK}): the learning rate is four times too high.\n" + yaml.safe_dump(sc))
    return p


def _error(path: Path) -> str:
    with pytest.raises(ScenarioError) as exc:
        check(load_scenario(path), path)
    return str(exc.value)


def test_every_shipped_scenario_loads_and_passes_its_checks():
    files = scenario_files([ROOT / "examples" / "scenarios"])
    names = [load_scenario(f).scenario for f in files]
    assert len(names) >= 8 and len(set(names)) == len(names)
    families = {load_scenario(f).task for f in files}
    assert {"mapf", "math", "code"} <= families
    controls = [f for f in files if load_scenario(f).control]
    assert len(controls) >= 1
    for f in files:
        sc = load_scenario(f)
        check(sc, f)
        if "steps" in (sc.quick.get("recipe") or {}):  # --quick's sizing reaches both harnesses, not only the run's
            steps = sc.quick["recipe"]["steps"]
            assert run_dict(sc, True)["recipe"]["steps"] == steps == harness_of(sc, "oracle", True)["recipe"]["steps"]
        assert "defect" in f.read_text().split("scenario:")[0].lower() or load_scenario(f).control  # a comment
        # --quick confirms carries on a smoke's few instances (the set must run in 30 minutes), the full size on 288
        assert run_dict(sc, True)["backtest"]["carry_confirm"] <= QUICK_CONFIRM
        assert parse_config(run_dict(sc), "x").backtest.carry_confirm == 288
        # ... and tests on the first QUICK_TEST_N of the target's test instances, the full size on all of them
        assert parse_config(run_dict(sc, True), "x").eval.n == min(sc.test_n, QUICK_TEST_N) < sc.test_n
        assert parse_config(run_dict(sc), "x").eval.n == sc.test_n
    low = load_scenario(files[0])  # a run already sized below the quick size keeps its own
    low.run["backtest"] = {**(low.run.get("backtest") or {}), "carry_confirm": 24}
    assert run_dict(low, True)["backtest"]["carry_confirm"] == 24


def test_a_typo_is_one_line_naming_the_field(tmp_path):
    p = _write(tmp_path)
    for good, bad, where in (("test_n:", "test_nn:", "test_nn: unknown key"),
                             ("learning_rate: 0.0004", "learnig_rate: 0.0004", "round0.recipe.learnig_rate: unknown"),
                             ("hole_ratio: 0.2", "hole_ratoi: 0.2", "target.sizes.0.hole_ratoi: unknown"),
                             ("arm_steps: 1", "arm_step: 1", "run.backtest.arm_step: unknown"),
                             # a misspelt required section: the typo, not "oracle: Field required"
                             ("\noracle:", "\noracel:", "oracel: unknown key (did you mean oracle?)")):
        q = tmp_path / "typo.yaml"
        q.write_text(p.read_text().replace(good, bad, 1))
        msg = _error(q)
        assert "\n" not in msg and where in msg, msg


def test_a_reward_that_pays_for_unparseable_answers_is_refused_in_one_line(tmp_path):
    """Every family bounds format_penalty at 0 (a held-out MAPF scenario paying +0.6 for unparseable plans took the
    broken harness from 29% valid to 0%, and the loop had no finding for it): refused before anything trains."""
    p = _write(tmp_path, round0={"env": ENV, "recipe": {"learning_rate": 4e-4}, "reward": {"format_penalty": 0.6}})
    msg = _error(p)
    assert "\n" not in msg and "round0.reward.format_penalty: Input should be less than or equal to 0" in msg, msg


def test_scenarios_that_cannot_run_are_refused_with_the_fix(tmp_path):
    same = {"env": ENV, "recipe": {"learning_rate": 1e-4}}
    assert "identical to round0" in _error(_write(tmp_path, "same", round0=same, oracle=same))
    assert "control: true, but oracle differs" in _error(_write(tmp_path, "ctl", control=True))
    load_scenario(_write(tmp_path, "ok", round0=same, oracle=same, control=True))  # the healthy control is fine
    bad_target = {"min_distance": 1, "sizes": [{"size": 3, "data_ratio": 1.0, "hole_ratio": 0.0, "wait_ratio": 0.5,
                                                "agents": 12}]}  # twelve agents cannot fit a 3x3 board
    msg = _error(_write(tmp_path, "tgt", target=bad_target))  # the generator's own check, naming the scenario field
    assert "tgt.yaml: target.sizes.0: " in msg and "agents need at least" in msg and "\n" not in msg
    missing = {**TINY, "policy": {"checkpoint": str(tmp_path / "nowhere")}, "warm_start": {"sft_examples": 0}}
    assert "run.policy.checkpoint" in _error(_write(tmp_path, "ck", run=missing))
    dup = {**TINY, "eval": {"suite": "small"}}
    assert "run.eval: set by the scenario" in _error(_write(tmp_path, "ev", run=dup))
    # a harness whose GRPO step samples more completions than the run's would train more compute per counted step
    big = {"env": ENV, "recipe": {"learning_rate": 1e-4, "batch_size": 32}}
    msg = _error(_write(tmp_path, "bs", oracle=big))
    assert "oracle.recipe.batch_size: 32 changes how many completions" in msg and "the run's recipe: 8" in msg, msg
    over = {"env": ENV, "recipe": {"learning_rate": 4e-4, "oversample": 2, "drop_dead_groups": True}}
    assert "round0.recipe.oversample: 2" in _error(_write(tmp_path, "os", round0=over))
    load_scenario(_write(tmp_path, "bs-same", oracle={"env": ENV, "recipe": {"learning_rate": 1e-4,
                                                                             "batch_size": 8}}))
    check(load_scenario(tmp_path / "bs-same.yaml"), tmp_path / "bs-same.yaml")  # the run's own batch is fine
    with pytest.raises(ScenarioError, match="unknown scenario 'nope'"):
        scenario_files([tmp_path], ["nope"])


def test_a_quick_block_typo_and_an_oracle_equal_to_round0_as_trained_are_refused_by_name(tmp_path):
    """Before: a typo in `quick:` passed the checks and surfaced mid-call as "oracle: invalid run config: bugdet"
    (and never without --quick); an oracle whose rate was written `4e-4` (YAML text, the same float once validated) or
    that spelt out a default (`drop_dead_groups: false`) passed as a defect, so every arm would have trained one
    harness."""
    p = _write(tmp_path, quick={"bugdet": {"stages": 1}})
    assert "quick.bugdet: unknown key" in _error(p)
    assert "quick.stage.prob_n: unknown key" in _error(_write(tmp_path, quick={"stage": {"prob_n": 4}}))
    text = _write(tmp_path, "txt").read_text()
    q = tmp_path / "txt.yaml"
    q.write_text(text.replace("learning_rate: 0.0001", "learning_rate: 4e-4", 1).replace("    lr_schedule: cosine\n", ""))
    assert isinstance(yaml.safe_load(q.read_text())["oracle"]["recipe"]["learning_rate"], str)  # YAML's text "4e-4"
    assert "identical to round0" in _error(q)
    default = _write(tmp_path, "dflt", oracle={"env": ENV, "recipe": {"learning_rate": 4e-4, "drop_dead_groups": False}})
    assert "identical to round0" in _error(default)
    far = _write(tmp_path, "far", target={**ENV, "min_distance": 10})  # the generator's fix names the scenario's field
    msg = _error(far)
    assert "lower target.min_distance" in msg and " env." not in msg, msg


def test_selecting_by_name_skips_another_broken_file(tmp_path):
    _write(tmp_path, "good")
    (tmp_path / "broken.yaml").write_bytes(b"scenario: \xff\xfe\n")
    (tmp_path / "bomb.yaml").write_text("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
                                        "c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nscenario: [*c, *c, *c, *c, *c, *c]\n")
    assert [f.name for f in scenario_files([tmp_path], ["good"])] == ["good.yaml"]


def test_recovery_is_the_share_of_the_oracles_gap():
    def r(seed, per, comp=10.0):
        return {"seed": seed, "final_per_instance": per, "compute": comp}
    rows = {"s": {"fixed-template": [r(0, [0, 0, 0, 0] * 8)], "oracle": [r(0, [1, 1, 0, 0] * 8)],
                  "evolved-rule": [r(0, [1, 0, 0, 0] * 8)]}}
    s = summarize(rows)["s"]
    assert abs(s["gap"][0] - 0.5) < 1e-9 and s["gap"][1] > 0
    assert abs(s["arms"]["evolved-rule"]["recovery"] - 0.5) < 1e-9
    lo, hi = s["arms"]["evolved-rule"]["recovery_ci"]  # Fieller's interval over the same resampling
    assert lo < 0.5 < hi and hi - lo < 1.5
    assert "50% [" in table({"s": s}, ["evolved-rule"])
    rows["s"]["oracle"] = [r(0, [0, 0, 0, 0] * 8)]  # no gap: no recovery is claimed
    assert "recovery" not in summarize(rows)["s"]["arms"]["evolved-rule"]
    noisy = {"s": {**rows["s"], "fixed-template": [r(0, [0, 1, 0, 0, 0, 1, 0, 0] * 4)],
                   "oracle": [r(0, [1, 0, 0, 0, 1, 0, 1, 0] * 4)]}}  # a gap of +0.125 whose interval covers 0
    ns = summarize(noisy)["s"]
    assert ns["gap"][0] > 0 > ns["gap"][1] and "recovery" not in ns["arms"]["evolved-rule"], ns["gap"]
    # the loop's bar on curricula and PBT: the best automatic arm by mean valid, the evolved arm paired against it
    rows["s"]["plr"] = [r(0, [1, 1, 1, 0] * 8)]
    rows["s"]["pbt"] = [r(0, [1, 1, 0, 0] * 8)]
    s = summarize(rows)["s"]
    assert s["best_automatic"] == "plr" and "vs_best_automatic" not in s["arms"]["plr"]
    m = s["arms"]["evolved-rule"]["vs_best_automatic"]
    assert abs(m[0] + 0.5) < 1e-9 and m[2] < 0
    assert "| s | evolved-rule | plr | -50.0 [" in summary_md(summarize(rows), ["fixed-template", "evolved-rule", "plr"])


def test_recovery_reads_one_set_of_seeds_and_survives_ragged_test_sets():
    """The share of the gap and its interval come from the seeds all three arms share: an evolved arm missing a seed
    the baselines have gave a point estimate over other seeds than its interval's, here outside it (1.2 against an
    interval around 0.75); a seed judged on another test size crashed `summarize` with numpy's ValueError on a
    ragged array, and now gives the ratio without an interval."""
    def r(seed, per):
        return {"seed": seed, "final_per_instance": per, "compute": 10.0}
    rows = {"s": {"fixed-template": [r(s, [0] * 32) for s in range(4)],  # gaps 1.0, 0.5, 0.5, 0.5: 0.625 over all
                  "oracle": [r(0, [1, 1, 1, 1] * 8)] + [r(s, [1, 1, 0, 0] * 8) for s in (1, 2, 3)],
                  "evolved-rule": [r(0, [1, 1, 1, 0] * 8)]}}  # seeds 1-3 missing: 0.75 of seed 0's gap
    a = summarize(rows)["s"]["arms"]["evolved-rule"]
    lo, hi = a["recovery_ci"]
    assert abs(a["recovery"] - 0.75) < 1e-9 and lo <= a["recovery"] <= hi < 1.2  # not 0.75 / 0.625
    rows = {"s": {"fixed-template": [r(0, [0] * 32), r(1, [0] * 40)],  # seed 1 judged on 40 instances, seed 0 on 32
                  "oracle": [r(0, [1, 1, 1, 1] * 8), r(1, [1, 1, 1, 1] * 10)],
                  "evolved-rule": [r(0, [1, 0, 0, 0] * 8), r(1, [1, 0] * 20)]}}
    a = summarize(rows)["s"]["arms"]["evolved-rule"]
    assert "recovery" in a and "recovery_ci" not in a


def test_an_arm_off_its_seeds_budget_is_named_under_the_table():
    """Baselines follow the first evolved arm's compute; a second evolved arm (evolved-llm beside evolved-rule) or a
    baseline whose probes overran trains at another compute, and the table's comparisons then are not at equal
    compute: the summary names each such run. Would catch a table that claims equal compute whatever was spent."""
    def r(seed, comp, budget=None):
        return {"seed": seed, "final_per_instance": [1, 0] * 8, "compute": comp,
                **({"budget": budget} if budget is not None else {})}
    rows = {"s": {"fixed-template": [r(0, 571.0, 571)], "oracle": [r(0, 571.0, 571)], "plr": [r(0, 590.0, 571)],
                  "evolved-rule": [r(0, 570.8, 570.8)], "evolved-llm": [r(0, 702.0, 702.0)]}}
    s = summarize(rows)
    assert {arm for arm, a in s["s"]["arms"].items() if a.get("off_budget")} == {"plr", "evolved-llm"}
    md = summary_md(s, list(rows["s"]))
    assert "**Not at equal compute**" in md and "s evolved-llm (seed 0: 702 against 571)" in md and "plr" in md


def test_intervals_resample_problems_when_the_test_set_repeats_them():
    """With the test set's problem labels (`harness.experiment.suite_clusters`: copies of one problem share one), every
    interval of the table resamples problems: 8 problems drawn 4 times each read wider than 32 independent instances,
    with the same estimate; labels of another length (another test set) are not applied. Would catch the labels
    never reaching the intervals."""
    def r(seed, per):
        return {"seed": seed, "final_per_instance": per, "compute": 10.0}
    labels = [i % 8 for i in range(32)]
    rows = {"s": {"fixed-template": [r(0, [0.0] * 32)], "oracle": [r(0, [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0] * 4)],
                  "evolved-rule": [r(0, [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0] * 4)]}}
    flat, grouped = summarize(rows)["s"], summarize(rows, clusters={"s": labels})["s"]
    for arm in ("oracle", "evolved-rule"):
        (e1, lo1, hi1), (e2, lo2, hi2) = flat["arms"][arm]["vs_fixed"], grouped["arms"][arm]["vs_fixed"]
        assert e1 == e2 and hi2 - lo2 > 1.5 * (hi1 - lo1), (arm, flat["arms"][arm], grouped["arms"][arm])
    assert summarize(rows, clusters={"s": labels[:16]})["s"]["gap"] == flat["gap"]


def test_the_test_sets_problems_are_labelled_by_prompt():
    """`suite_clusters`: one label per test instance, shared by every copy of a problem (the first copy's index). On
    a math target of one-digit sums (a small space) 200 instances hold far fewer problems; each label's copies are
    one prompt. Would catch labels by seed (every instance its own problem) or by block."""
    from types import SimpleNamespace

    from harness.config import EvalConfig
    from harness.experiment import suite_clusters
    from harness.tasks import get_task
    from harness.tasks.suites import draw_test

    ev = EvalConfig(env={"levels": [{"digits": 1, "data_ratio": 1.0, "terms": 2, "sub_ratio": 0.5}]}, n=200)
    labels = suite_clusters(SimpleNamespace(task="math", eval=ev))
    task, insts = get_task("math"), [i for _, i in draw_test(get_task("math"), ev)]
    assert len(labels) == 200 and 5 < len(set(labels)) < 100
    assert all(task.prompt(insts[i]) == task.prompt(insts[c]) for i, c in enumerate(labels))
    assert len({task.prompt(insts[c]) for c in set(labels)}) == len(set(labels))


def test_an_oracle_that_does_not_train_above_the_warm_start_is_named():
    """The gap is oracle - fixed-template; when the oracle only holds its warm start, the gap is harm avoided, and an
    arm that keeps the warm start "recovers" all of it: the table says so (issue 33: "measure that each oracle is good
    before it anchors anything")."""
    def r(seed, per):
        return {"seed": seed, "final_per_instance": per, "compute": 10.0}
    warm = [1, 1, 0, 0] * 8
    rows = {"harm": {"fixed-template": [r(0, [1, 0, 0, 0] * 8), r(1, [0, 1, 0, 0] * 8)],
                     "oracle": [r(0, warm), r(1, warm)], "evolved-rule": [r(0, warm), r(1, warm)]},
            "learns": {"fixed-template": [r(0, warm), r(1, warm)],
                       # the same gain in both seeds: two seeds that disagree would leave the sign open (Student's
                       # t on one degree of freedom, the floor of the interval over seeds)
                       "oracle": [r(0, [1, 1, 1, 0] * 8), r(1, [1, 1, 0, 1] * 8)],
                       "evolved-rule": [r(0, warm), r(1, warm)]}}
    s = summarize(rows, {"harm": warm, "learns": warm})
    assert s["harm"]["oracle_learns"] is False and s["learns"]["oracle_learns"] is True
    assert abs(s["harm"]["warm"] - 0.5) < 1e-9 and s["harm"]["arms"]["evolved-rule"]["vs_warm"][0] == 0
    assert abs(s["learns"]["arms"]["oracle"]["vs_warm"][0] - 0.25) < 1e-9
    assert abs(s["harm"]["arms"]["evolved-rule"]["recovery"] - 1.0) < 1e-9  # all of a gap that is only harm
    md = table(s, ["fixed-template", "oracle", "evolved-rule"])
    assert "| harm | " in md and "| 50.0 | " in md and "vs warm start)" in md
    assert md.rstrip().endswith("adds; keeping the warm start recovers all of it): harm."), md
    # without the warm start (outputs written before it was kept) nothing is claimed either way
    assert "oracle_learns" not in summarize(rows)["harm"] and "Oracle not above" not in table(summarize(rows), ["oracle"])


def _texts(root: Path):
    for p in root.rglob("*"):
        if p.is_file() and p.suffix in (".yaml", ".json", ".md", ".txt", ".jsonl", ".py", ".html", ".log"):
            yield p, p.read_text(errors="replace")
        elif p.is_file() and p.suffix == ".db":
            con = sqlite3.connect(p)
            try:
                for (name,) in con.execute("select name from sqlite_master where type='table'").fetchall():
                    yield p, json.dumps(con.execute(f"select * from {name}").fetchall(), default=str)
            finally:
                con.close()


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_a_fix_is_a_promoted_change_that_touches_what_the_oracle_changed(tmp_path):
    """`defect_knobs`: where round 0 differs from the oracle (the env as a whole; recipe and reward knob by knob);
    `is_fix`: a promoted knob touching it. A learning-rate scenario is not fixed by a temperature change, a mix
    scenario by any env knob, and the healthy control has nothing to fix."""
    from harness.scenarios import defect_knobs, is_fix, promotions_table

    lr = load_scenario(_write(tmp_path))
    # the oracle's `lr_schedule: cosine` is the Recipe's default, which round 0 trains under too: not a defect knob
    # (compared as trained; a raw comparison of the YAML counted it)
    assert defect_knobs(lr) == {"recipe.learning_rate"}
    assert is_fix("recipe.learning_rate", defect_knobs(lr)) and not is_fix("recipe.temperature", defect_knobs(lr))
    assert not is_fix("env.sizes.3.hole_ratio", defect_knobs(lr))
    hard = dict(ENV, sizes=[dict(ENV["sizes"][0], hole_ratio=0.45, agents=3), ENV["sizes"][1]])
    mix = load_scenario(_write(tmp_path, "mix", round0={"env": hard}, oracle={"env": ENV}))
    assert defect_knobs(mix) == {"env"} and is_fix("env.mixture", {"env"}) and is_fix("env.sizes.3.agents", {"env"})
    healthy = load_scenario(_write(tmp_path, "ok", round0={"env": ENV}, oracle={"env": ENV}, control=True))
    assert defect_knobs(healthy) == set()
    summary = {"s": {"arms": {"evolved-rule": {"promotions": {0: {"promoted": [
        {"stage": 1, "candidate": "s1c2", "knob": "recipe.temperature", "fix": False},
        {"stage": 3, "candidate": "s3c1", "knob": "recipe.learning_rate", "fix": True}], "first_fix": 3}}}}}}
    assert "| s | evolved-rule | 0 | 1: recipe.temperature; 3: recipe.learning_rate* | 3 |" in promotions_table(summary)
    assert promotions_table({"s": {"arms": {"oracle": {}}}}) == ""


@pytest.mark.timeout(900)  # every arm end to end: 300-440 s in CI on 2 shared cores, beside the rest of the suite
def test_a_tiny_scenario_runs_every_arm_at_equal_compute_no_arm_reads_the_defect_and_it_resumes(tmp_path, monkeypatch):
    """The experiment's and the bench's end to end test in one (one warm start, one evolved arm: CI time)."""
    from harness.baselines import Provided
    from harness.experiment import ARMS
    from harness.scenarios import run_scenarios
    from harness.store import RunStore

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    f = _write(tmp_path, baselines={"plr": {"probe_n": 2, "samples": 2}, "learnability": {"probe_n": 2, "samples": 2},
                                   "pbt": {"population": 2, "probe_n": 2}})
    arms = [a for a in ARMS if a != "evolved-llm"]
    out = tmp_path / "out"
    said: list[str] = []
    doc = run_scenarios([f], out, arms, 1, False, say=said.append)
    sc, exp = doc["scenarios"]["tiny"], out / "tiny"
    assert set(sc["arms"]) == set(arms)
    evo = json.loads((exp / "evolved-rule" / "seed0" / "result.json").read_text())
    assert evo["ledger"]["steps"] >= 2 * TINY["recipe"]["steps"]  # its own steps are counted...
    assert evo["compute"] > evo["ledger"]["steps"]  # ...and so are its probes' and backtests' tokens
    labels = json.loads((exp / "results.json").read_text())["test_clusters"]  # the test set's problems, in order
    assert len(labels) == 16 and all(labels[i] <= i for i in range(16))
    for arm in arms:
        r = json.loads((exp / arm / "seed0" / "result.json").read_text())
        assert len(r["final_per_instance"]) == 16  # the target's test_n instances
        if arm != "evolved-rule":  # equal compute: the evolved arm's measured compute is every arm's budget
            assert r["budget"] == round(evo["compute"])
            # within one step-equivalent per stage of the evolved arm's (a curriculum pays its probes)
            assert abs(r["compute"] - evo["compute"]) <= 2 + 1e-9, (arm, r["compute"], evo["compute"])
            assert len(r["curve"]) == 2
    # the shared warm start is read on the test set once: every arm's stage-0 reading is that one, reused from the
    # held-out reading cache (no arm pays a second pass over the same weights and instances)
    warm = json.loads((exp / "warmstart" / "stages" / "s0" / "test.json").read_text())["valid"]
    # its SFT's resumable checkpoints are gone once setup is recorded (a loop's retention never runs there)
    assert (exp / "warmstart" / "checkpoints" / "warmstart").is_dir()
    assert not (exp / "warmstart" / "checkpoints" / "warmstart-progress").exists()
    for arm in arms:
        d = Path(json.loads((exp / arm / "seed0" / "result.json").read_text()).get("run_dir", exp / arm / "seed0"))
        assert json.loads((d / "stages" / "s0" / "test.json").read_text())["valid"] == warm, arm
        store = RunStore.open(d / "run.db")
        try:
            rid = store.runs()[0]
            assert not [r for r in store.ledger(rid) if r["stage"] == 0 and r["label"] == "test"], arm
            assert any("held-out reading" in e["message"] for e in store.events(rid, stage=0, kind="cache")), arm
        finally:
            store.close()

    def stage_recipe(arm):
        store = RunStore.open(exp / arm / "seed0" / "run.db")
        try:
            return yaml.safe_load(store.result(store.runs()[0], 1, Provided).files["recipe.yaml"])
        finally:
            store.close()
    # the oracle arm trained under the oracle's harness, the fixed arm under round 0's
    assert stage_recipe("oracle")["learning_rate"] == 1e-4 and stage_recipe("oracle")["lr_schedule"] == "cosine"
    assert stage_recipe("fixed-template")["learning_rate"] == 4e-4
    plr = json.loads((exp / "plr" / "seed0" / "result.json").read_text())
    assert all(c["probe_tokens"] > 0 and abs(sum(c["weights"]) - 1) < 1e-3 for c in plr["curve"])
    # no arm can read the defect: the comment's marker is nowhere in anything the arms wrote
    for p, text in _texts(out):
        assert MARK not in text, p
    # the experiment's outputs per scenario, and the bench's across scenarios
    assert (exp / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (exp / "experiment.html").read_text() and "| evolved-rule |" in (exp / "summary.md").read_text()
    # where each arm's compute went: a fixed harness trains its one policy with all of it, the loop judges too
    for arm in ("fixed-template", "oracle"):
        sh = json.loads((exp / arm / "seed0" / "result.json").read_text())["shares"]
        assert sh["lineage"] == sh["steps"] > 0 and not sum(sh["judging"].values()), arm
    assert evo["shares"]["lineage"] + evo["shares"]["other_training"] == evo["ledger"]["steps"]
    assert sum(evo["shares"]["judging"].values()) > 0
    summary = (exp / "summary.md").read_text()
    assert "trained the delivered policy, % of compute" in summary and "| 100.0 [100.0, 100.0] |" in summary
    assert f"| tiny | evolved-rule | {100 * evo['shares']['lineage'] / evo['compute']:.0f}% |" in (
        out / "scenarios.md").read_text()
    # one process, one core layout: every arm trained with the same GRPO loop, and nothing warns
    piped = {arm: json.loads((exp / arm / "seed0" / "result.json").read_text())["shares"]["pipelined"] for arm in arms}
    assert None not in piped.values() and len({x > 0 for x in piped.values()}) == 1, piped
    assert "Warning" not in summary and "Warning" not in (out / "scenarios.md").read_text()
    assert "experiment_fixed_template_lineage_share: 1.000" in key_values(json.loads((exp / "results.json").read_text()))
    assert (out / "scenarios.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (out / "scenarios.html").read_text() and "| tiny |" in (out / "scenarios.md").read_text()
    # the evolved arm's promotions are read from its own run.db (whatever it promoted, the table says it)
    store = RunStore.open(Path(evo["run_dir"]) / "run.db")
    try:
        promoted = sorted(c["id"] for c in store.candidates(store.runs()[0], status="promoted"))
    finally:
        store.close()
    got = sc["arms"]["evolved-rule"]["promotions"]["0"] if "0" in sc["arms"]["evolved-rule"]["promotions"] \
        else sc["arms"]["evolved-rule"]["promotions"][0]
    assert sorted(g["candidate"] for g in got["promoted"]) == promoted
    assert "| tiny | evolved-rule | 0 |" in (out / "scenarios.md").read_text()
    # the evolved run learnt in a skill library of its own, and every try it recorded reached the home library
    from skills.library import SkillLibrary

    with SkillLibrary.open(exp / "evolved-rule" / "seed0" / "skills.db", seed_dir=None) as own, \
            SkillLibrary.open(tmp_path / "home" / "skills.db", seed_dir=None) as home:
        assert {(n, t["run"], t["candidate"]) for n in own.names() for t in own.tries(n)} == \
            {(n, t["run"], t["candidate"]) for n in home.names() for t in home.tries(n)}

    # resume: nothing finished is re-run; an interrupted baseline restarts at its last finished stage
    d = exp / "plr" / "seed0"  # as a crash inside stage 2 leaves it: stage 1's record and checkpoint, no stage 2
    (d / "result.json").unlink()
    (d / "stage2.json").unlink()
    (d / "s2").rename(d / "s1")
    said.clear()
    doc2 = run_scenarios([f], out, arms, 1, False, say=said.append)
    assert any("evolved-rule seed 0: done earlier" in m for m in said)
    assert any("plr seed 0: resuming after stage 1" in m for m in said)
    assert sum("stage 2/2" in m for m in said) == 1 and not any("stage 1/2" in m for m in said)
    assert doc2["scenarios"]["tiny"]["arms"]["oracle"] == sc["arms"]["oracle"]
    r = json.loads((d / "result.json").read_text())
    assert [c["stage"] for c in r["curve"]] == [1, 2]  # the resumed arm's curve keeps its first stage
    (d / "result.json").unlink()  # a crash after the last stage, before the result: nothing is trained again
    # the CLI: trains nothing more, prints the table and grep-able lines
    cli = [sys.executable, "-c", "from harness.cli import main; main()", "bench", "scenarios", str(f), "--arms",
           ",".join(arms), "--seeds", "1", "--out", str(out)]
    res = subprocess.run(cli, capture_output=True, text=True, check=False, timeout=300,
                         env={**os.environ, "EVOTRAINER_HOME": str(tmp_path / "home")})
    assert res.returncode == 0, res.stderr[-2000:]
    assert "done earlier" in res.stdout and "scenario_tiny_gap:" in res.stdout and "/2:" not in res.stdout
    assert not (d / "s1").exists()
    assert [c["stage"] for c in json.loads((d / "result.json").read_text())["curve"]] == [1, 2]
    # in parts: a call with one arm reports every arm an earlier call finished (same settings, same budget) ...
    doc3 = run_scenarios([f], out, ["oracle"], 1, False, say=said.append)
    assert set(doc3["scenarios"]["tiny"]["arms"]) == set(arms) and doc3["arms"] == arms
    # ... and a `--scenarios` subset keeps the scenarios an earlier call measured in the table, and says so (before,
    # the table was rewritten with the subset's alone); a scenario whose folder is gone is dropped
    earlier = json.loads((out / "scenarios.json").read_text())
    earlier["scenarios"]["other"] = earlier["scenarios"]["tiny"]
    earlier["scenarios"]["gone"] = earlier["scenarios"]["tiny"]
    (out / "scenarios.json").write_text(json.dumps(earlier))
    (out / "other").mkdir()
    said.clear()
    doc4 = run_scenarios([f], out, ["oracle"], 1, False, say=said.append)
    assert list(doc4["scenarios"]) == ["other", "tiny"] and "| other |" in (out / "scenarios.md").read_text()
    assert any("keeps 1 scenario(s) an earlier call" in m and "other" in m for m in said), said
    # ... and an arm made from other settings (the oracle edited between parts) is refused, never pooled or resumed
    text = f.read_text()
    f.write_text(text.replace("lr_schedule: cosine", "lr_schedule: linear"))
    from harness.experiment import ExperimentError

    with pytest.raises(ExperimentError, match=r"oracle/seed0: made from other settings than this call's: "
                                              r"(run|experiment)\..*lr_schedule.*remove that folder"):
        run_scenarios([f], out, ["oracle"], 1, False, say=said.append)
    f.write_text(text)
    # the warm start is a column of the table, every arm is paired against it, and the oracle is checked against it
    assert "warm" in sc and all("vs_warm" in a for a in sc["arms"].values()) and isinstance(sc["oracle_learns"], bool)
    assert "| warm start |" in (out / "scenarios.md").read_text()
    # a changed test set: an arm tested on the old one is refused by name, never paired instance by instance with the
    # new one, and before the warm start is scored again on the new set (before: minutes of scoring, then the refusal)
    f.write_text(f.read_text().replace("test_n: 16", "test_n: 24"))
    scored = (exp / "warmstart" / "stages" / "s0" / "test.json").stat().st_mtime_ns
    with pytest.raises(ExperimentError, match=r"seed0: made from other settings than this call's: run\.eval\.n "
                       r"\(16 then, 24 now\)"):
        run_scenarios([f], out, arms, 1, False, say=said.append)
    assert (exp / "warmstart" / "stages" / "s0" / "test.json").stat().st_mtime_ns == scored
    assert len(json.loads((exp / "warmstart" / "stages" / "s0" / "test.json").read_text())["valid"]) == 16
    # a target edited in place with the same test_n: the shared warm start learnt on the old target, so it is refused
    # by name before any arm is read (before: it was reused, and only the arms' test set told the edit apart)
    head, body = f.read_text().split("\n", 1)
    data = yaml.safe_load(body)
    data["test_n"] = 16
    data["target"]["sizes"][0]["hole_ratio"] = 0.3
    f.write_text(head + "\n" + yaml.safe_dump(data))
    with pytest.raises(ExperimentError, match=r"warmstart: the shared warm start was made from other settings than "
                       r"this call's: env.sizes .*hole_ratio.: 0.2.*then.*hole_ratio.: 0.3.*now"):
        run_scenarios([f], out, arms, 1, False, say=said.append)


@pytest.mark.slow
def test_scenarios_run_side_by_side_in_workers_one_warm_start_and_resume(tmp_path, monkeypatch):
    """`jobs=2`: the arms of two scenarios run in two worker processes; the shared warm start is trained once (the
    second scenario waits for it, not trains it beside it), each scenario's baselines start after its evolved arm
    (whose compute is their budget), and a re-run reads everything back."""
    from harness.scenarios import run_scenarios

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    one_stage = {**TINY, "budget": {"stages": 1}}
    files = [_write(tmp_path, name, run=one_stage) for name in ("tiny-a", "tiny-b")]
    out = tmp_path / "out"
    said: list[str] = []
    doc = run_scenarios(files, out, ["fixed-template", "evolved-rule"], 1, False, say=said.append, jobs=2)
    assert any("side by side" in m for m in said)
    assert len([p for p in (tmp_path / "home" / "warmstart").iterdir() if (p / "DONE").exists()]) == 1
    pids = set()
    for name in ("tiny-a", "tiny-b"):
        evo = json.loads((out / name / "evolved-rule" / "seed0" / "result.json").read_text())
        fixed = json.loads((out / name / "fixed-template" / "seed0" / "result.json").read_text())
        assert fixed["budget"] == round(evo["compute"]) and fixed["t_start"] >= evo["t_end"] - 1e-6
        assert evo["cpu_s"] > 0 and len(fixed["final_per_instance"]) == 16
        assert evo["cores"] == fixed["cores"] == max(1, (os.cpu_count() or 1) // 2)  # each worker's share
        pids |= {evo["pid"], fixed["pid"]}
        assert doc["scenarios"][name]["gap"] is None  # no oracle arm: no gap, no recovery
    assert os.getpid() not in pids and len(pids) >= 2  # in workers, more than one
    said.clear()
    run_scenarios(files, out, ["fixed-template", "evolved-rule"], 1, False, say=said.append, jobs=2)
    assert sum("done earlier" in m for m in said) == 4


def test_a_scenario_runs_config_reads_back_so_a_killed_arm_resumes(tmp_path):
    """Regression: a run whose test set is a generator config (every scenario arm) wrote `eval.suite: small` (the
    unused default) beside `eval.env` in its config.yaml, and `resume` then refused it as "both given": a killed
    evolved arm could not resume. Now the unused suite is not written, a file written before still reads, and a
    person who writes both is still told to choose."""
    from harness.config import parse_config
    from harness.lifecycle import load_run_config

    cfg = parse_config(run_dict(load_scenario(_write(tmp_path))), "x")
    dumped = cfg.model_dump(mode="json")
    assert "suite" not in dumped["eval"] and dumped["eval"]["env"] == ENV
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(dumped, sort_keys=False))
    back = load_run_config(tmp_path)
    assert back.eval.env == ENV and back.eval.name == cfg.eval.name
    dumped["eval"]["suite"] = "small"  # as runs made before this fix wrote it
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(dumped, sort_keys=False))
    assert load_run_config(tmp_path).eval.env == ENV
    with pytest.raises(ValueError, match="not both"):
        parse_config({**run_dict(load_scenario(_write(tmp_path))), "eval": {"suite": "small", "env": ENV}}, "y")


def test_one_name_twice_a_fixed_budget_a_missing_quick_checkpoint_and_a_busy_out_are_refused(tmp_path):
    """Each before anything trains, in one line. Would catch: two files named `dup` pooled into one row, a
    `baselines.budget_steps` that quietly replaced equal compute, `--quick`'s own checkpoint first found missing after
    other scenarios trained, and two calls into one --out training the same baselines side by side."""
    from harness.scenarios import run_scenarios
    from harness.store import acquire_lock

    a = _write(tmp_path, "dup")
    (tmp_path / "other").mkdir()
    b = _write(tmp_path / "other", "dup", round0={"env": ENV, "recipe": {"learning_rate": 8e-4}})
    with pytest.raises(ScenarioError, match=r"other/dup.yaml: scenario 'dup' is also the name of .*dup.yaml.*rename"):
        run_scenarios([a, b], tmp_path / "out", ["fixed-template"], 1, False, say=lambda m: None)
    assert not (tmp_path / "out").exists()  # refused before its --out is made: no empty folder left behind
    assert "baselines.budget_steps: every arm's budget is the evolved arm's" in _error(
        _write(tmp_path, "fixed", baselines={"budget_steps": 5}))
    assert "quick.policy.checkpoint: /nonexistent/ckpt is not a checkpoint" in _error(_write(
        tmp_path, "qck", quick={"policy": {"checkpoint": "/nonexistent/ckpt", "preset": None},
                                "warm_start": {"sft_examples": 0}}))
    (tmp_path / "busy").mkdir()
    held = acquire_lock(tmp_path / "busy", "bench")
    try:
        with pytest.raises(ScenarioError, match=r"--out .*busy is in use by another bench call \(pid \d+\)"):
            run_scenarios([a], tmp_path / "busy", ["fixed-template"], 1, False, say=lambda m: None)
    finally:
        held.release()


def test_the_plot_labels_a_measured_zero_and_leaves_an_arm_that_did_not_run_empty(tmp_path, monkeypatch):
    """A 0.0 bar has no height: without a label it reads as an arm that did not run. Would catch: the label lost, or
    put on a missing arm too."""
    import harness.report_page as rp
    from harness import scenarios

    figs = []
    monkeypatch.setattr(rp, "plot_page", lambda fig, *a, **k: figs.append(fig) or "<html></html>")
    summary = {"a": {"arms": {"fixed-template": {"valid": 0.0}, "oracle": {"valid": 0.3}}},
               "b": {"arms": {"oracle": {"valid": 0.2}}}}
    monkeypatch.setattr(scenarios, "summary_md", lambda s, a: "")
    scenarios.write_plot(summary, ["fixed-template", "oracle"], tmp_path)
    labels = [t for t in figs[0].axes[0].texts if t.get_text() == "0"]
    assert len(labels) == 1 and labels[0].xy == (0.0, 0)


def test_an_arms_env_the_generator_cannot_draw_from_is_refused_before_anything_trains(tmp_path):
    """A round-0 or oracle env the generator refuses passed the checks and failed after the shared warm start and the
    whole evolved arm had trained (68 s at tiny sizes, tens of minutes at real ones): named by its field now."""
    bad = {"min_distance": 4, "sizes": [{"size": 3, "data_ratio": 1.0, "hole_ratio": 0.6, "wait_ratio": 1.0,
                                         "agents": 2}]}  # valid as a config; no board of it keeps agents 4 apart
    msg = _error(_write(tmp_path, "o", oracle={"env": bad, "recipe": {"learning_rate": 1e-4}}))
    assert "o.yaml: oracle.env: the mapf generator cannot draw" in msg and "oracle.env.min_distance" in msg, msg
    msg = _error(_write(tmp_path, "r", round0={"env": bad, "recipe": {"learning_rate": 4e-4}}))
    assert "r.yaml: round0.env: the mapf generator cannot draw" in msg and "\n" not in msg, msg


def test_a_setting_added_or_dropped_between_parts_is_not_pooled(tmp_path):
    """An outside review (seventy-ninth session): a part's record kept the run config's free-form sections (recipe,
    reward, env, the target) as written, and a key only one side had was no difference; so a round-0 recipe that
    dropped `drop_dead_groups: true`, or a target that gained `min_distance`, between two parts pooled the arm made
    before the edit as "done earlier". Would catch either read back; a mere respelling still is not a difference."""
    from harness.experiment import ExperimentError, _record_made_from, check_made_from, made_from
    from harness.scenarios import experiment_config, load_scenario

    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "mapf.yaml").write_text((ROOT / "examples/scenarios/base/mapf.yaml").read_text())
    v1 = (ROOT / "examples/scenarios/mapf-cold-temperature.yaml").read_text()
    assert v1.count("drop_dead_groups: true") >= 1 and "min_distance: 1\n" in v1

    def rec(text: str, arm: str = "fixed-template") -> dict:
        (tmp_path / "s.yaml").write_text(text)
        return made_from(experiment_config(load_scenario(tmp_path / "s.yaml"), ["evolved-rule", arm], 1), arm, 0, 300)

    no_min = v1.replace("  min_distance: 1\n", "", 1)  # the target's, at its default
    edits = {"round0 drop_dead_groups dropped": (v1.replace(", drop_dead_groups: true", "", 1), v1),
             "target min_distance added": (no_min, v1.replace("  min_distance: 1\n", "  min_distance: 2\n", 1))}
    for what, (then, now) in edits.items():
        assert then != now, what
        folder = tmp_path / what.replace(" ", "_") / "seed0"
        _record_made_from(folder, rec(then))
        with pytest.raises(ExperimentError, match="made from other settings"):
            check_made_from(folder, rec(now))
    same = tmp_path / "same" / "seed0"
    _record_made_from(same, rec(no_min.replace("1.0e-4", "0.0001")))
    check_made_from(same, rec(v1))  # the same harness spelt otherwise, a default left out
    # a typed run setting added since a part was written: that part ran it at its default, so this call's default
    # pools with it and another value does not (a key one record lacked was no difference: an outside review)
    import copy

    older = copy.deepcopy(rec(v1))
    del older["run"]["stage"]["rejections_before_fallback"]
    folder = tmp_path / "older" / "seed0"
    _record_made_from(folder, older)
    check_made_from(folder, rec(v1))
    changed = copy.deepcopy(rec(v1))
    changed["run"]["stage"]["rejections_before_fallback"] = 5
    with pytest.raises(ExperimentError, match="rejections_before_fallback"):
        check_made_from(folder, changed)
    # made by other code: pooled, and said (a bench runs in parts across sessions; an outside review found a part
    # made before a fix pooled in silence)
    assert rec(v1)["code"] and check_made_from(same, rec(v1)) is None
    other = {**rec(v1), "code": "0123456789abcdef"}
    assert "made by other code" in check_made_from(same, other)
    # a PBT arm made before its prior existed (no `decades` in its record) ran without one: refused, not pooled with
    # today's PBT nor resumed under it (an outside review: the missing key was no difference)
    pbt_now = rec(v1, "pbt")
    assert pbt_now["experiment"]["own"]["decades"] == 1.0
    old_pbt = copy.deepcopy(pbt_now)
    for k in ("decades", "resample_probability"):
        del old_pbt["experiment"]["own"][k]
    folder = tmp_path / "old-pbt" / "seed0"
    _record_made_from(folder, old_pbt)
    with pytest.raises(ExperimentError, match=r"experiment\.own\.decades \(0\.0 then, 1\.0 now\)"):
        check_made_from(folder, pbt_now)
    fresh = tmp_path / "new-pbt" / "seed0"
    _record_made_from(fresh, pbt_now)
    assert check_made_from(fresh, pbt_now) is None


def test_an_oracle_that_only_rescales_the_mix_a_warm_start_env_and_a_quick_eval_are_refused(tmp_path):
    """An outside review (seventy-ninth session) would each have caught: an oracle whose mix weights are the round-0
    ones doubled (the generator draws in proportion: one harness) passed as a defect; a warm-start env the generator
    cannot draw from failed only when its unit ran, naming `env.` fields the scenario may not set; `quick:` could set
    the scenario's test set or judge env and was silently overwritten; the generator's named fix was cut mid-word."""
    doubled = {**ENV, "sizes": [{**e, "data_ratio": 2 * e["data_ratio"]} for e in ENV["sizes"]]}
    same = {"env": ENV, "recipe": {"learning_rate": 1e-4}}
    assert "identical to round0" in _error(_write(tmp_path, "dbl", round0=same, oracle={**same, "env": doubled}))
    cramped = {"min_distance": 6, "sizes": [{"size": 6, "data_ratio": 1.0, "hole_ratio": 0.6, "wait_ratio": 0.0,
                                             "agents": 3}]}  # a valid config no instance can be drawn from
    msg = _error(_write(tmp_path, "warm", run={**TINY, "warm_start": {**TINY["warm_start"], "env": cramped}}))
    assert "run.warm_start.env: the mapf generator cannot draw" in msg, msg
    assert "run.warm_start.env.sizes.6.hole_ratio (lower them); fix the run.warm_start config" in msg, msg
    assert "quick.eval: set by the scenario" in _error(_write(tmp_path, "qe", quick={"eval": {"n": 64}}))
    assert "quick.backtest.env: set by" in _error(_write(tmp_path, "qb", quick={"backtest": {"env": ENV}}))


def test_a_folder_with_its_shared_run_config_a_reserved_name_and_a_typo_in_the_shared_file(tmp_path):
    """An outside review (seventy-ninth session): a run config beside the scenarios that share it was read as a
    broken scenario (`task: unknown key`) and broke the folder; `.yml` files were not seen; a file given twice ran
    twice; a scenario named `scenarios.json` failed after every arm had trained; a typo in the shared run config was
    blamed on each scenario file, never naming the file that holds it."""
    d = tmp_path / "flat"
    d.mkdir()
    (d / "run-base.yaml").write_text(yaml.safe_dump(TINY))
    p = _write(d, "one", run="run-base.yaml")
    (d / "two.yml").write_text(p.read_text().replace("scenario: one", "scenario: two"))
    assert [f.name for f in scenario_files([d])] == ["one.yaml", "two.yml"]
    assert [f.name for f in scenario_files([d, p])] == ["one.yaml", "two.yml"]
    with pytest.raises(ScenarioError, match="name of a file the bench writes"):
        load_scenario(_write(tmp_path, "scenarios.json"))
    (d / "run-base.yaml").write_text(yaml.safe_dump({**TINY, "stage": {**TINY["stage"], "train_instance": 4}}))
    with pytest.raises(ScenarioError, match=r"train_instance.*\(in run-base.yaml, the run config this scenario shares\)"):
        load_scenario(p)


def test_an_llm_arm_without_an_engineer_measures_no_budget(tmp_path):
    """`--arms evolved-llm,oracle` on scenarios without an endpoint: evolved-llm is skipped, so evolved-rule is added
    to measure the budget (before: refused, naming `budget_steps`, which a scenario may not set)."""
    from harness.scenarios import measures_budget

    plain = load_scenario(_write(tmp_path))
    asked = load_scenario(_write(tmp_path, "llm", run={**TINY, "engineer": {"kind": "llm", "base_url": "http://x/v1",
                                                                            "model": "m"}}))
    assert not measures_budget([plain], ["evolved-llm", "oracle"])
    assert measures_budget([asked], ["evolved-llm", "oracle"]) and measures_budget([plain], ["evolved-rule"])
    assert not measures_budget([asked, plain], ["evolved-llm"])


def test_arms_judged_on_unequal_test_sets_per_seed_are_not_paired_out_of_step():
    """Seed test sets of 3 and 2 instances against 2 and 3: concatenated, the five pairs were compared position by
    position across seeds (an outside statistics review). Now nothing pairs (None, shown as no comparison); seeds of
    different sizes with each seed's two arms alike still pair over every (seed, instance)."""
    from harness.scenarios import paired

    assert paired([[1, 1, 1], [0, 0]], [[0, 0], [1, 1, 1]]) is None
    eff, lo, hi = paired([[1, 1, 1], [1, 0]], [[0, 0, 0], [0, 0]])
    assert eff == pytest.approx(0.8) and lo <= eff <= hi


def test_the_bench_page_scales_its_chart_and_renders_its_notes():
    """The bench page's chart was a fixed-width SVG wider than the page (the legend and last scenarios off-screen),
    and its notes showed raw markdown (`**Not at equal compute**`, backticks); the run report's held-out panels sat
    in one row (six shrank to unreadable text). An outside review with screenshots, eighty-second session."""
    import re

    from harness.report_page import CSS, _plt, heldout_chart, md_tables_html, plot_page

    html = md_tables_html("**Not at equal compute** (see `evotrainer status RUN`) <b>\n| a | **b** |\n|---|---|\n| 1 | 2 |")
    assert "<b>Not at equal compute</b>" in html and "<code>evotrainer status RUN</code>" in html
    assert "&lt;b&gt;" in html and "**" not in html  # still escaped first
    plt = _plt()
    fig, ax = plt.subplots(figsize=(16, 3))
    ax.bar([0, 1], [1, 2], label="arm")
    page = plot_page(fig, Path(tempfile.mkdtemp()) / "p.png", "t", "an **intro**", "")
    assert "name=viewport" in page and "figure.chart svg{max-width:100%" in CSS and CSS in page
    evals = [{"slice_key": k, "slice_value": v, "stage": s, "valid": 0.5} for k, v in
             [("", ""), *((f"k{i}", "a") for i in range(5))] for s in (0, 1)]
    svg = heldout_chart(evals, ("",))
    w, h = (float(x) for x in re.search(r'width="([\d.]+)pt" height="([\d.]+)pt"', svg).groups())
    assert w < 3.7 * 3 * 72 and h > 2 * 2.5 * 72, (w, h)  # six panels: two rows of three
