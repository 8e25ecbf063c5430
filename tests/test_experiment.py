"""The headline experiment (`harness.experiment`, `evotrainer experiment`) at a tiny size: real warm start, real GRPO
stages for every arm, the real loop for the evolved arm, a real held-out suite evaluation, and the outputs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from harness.experiment import (
    ExperimentError,
    add_units,
    harder_half,
    load_experiment,
    plan,
    plr_weights,
    priorities,
    random_env,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: faster for tiny models

TINY_RUN = {
    "task": "mapf", "name": "t", "seed": 0, "policy": {"preset": "tiny"},
    "env": {"min_distance": 1, "sizes": [{"size": s, "data_ratio": 0.5, "hole_ratio": 0.2, "wait_ratio": 0.5,
                                         "agents": 2} for s in (3, 4)]},
    "warm_start": {"sft_examples": 64, "sft_steps": 20},
    "recipe": {"steps": 1, "batch_size": 8, "num_generations": 4, "learning_rate": 1e-4, "temperature": 0.7,
               "beta": 0.0, "max_completion_length": 24},  # short: an untrained policy rambles to the cap
    "budget": {"stages": 2}, "stage": {"train_instances": 16, "probe_n": 4, "probe_samples": 2},
    "backtest": {"arm_steps": 1, "n": 8, "samples": 2, "carry_confirm": 24},  # small: it is the baselines' budget
    "engineer": {"kind": "rule"}, "eval": {"suite": "small", "limit": 32},
}


def _cfg(tmp_path: Path, **kw) -> Path:
    data = {"run": TINY_RUN, "seeds": 1, "plr": {"probe_n": 2, "samples": 2}, **kw}
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_plr_weights_follow_learnability_with_a_uniform_floor():
    w = plr_weights([0.0, 0.25, 0.09], beta=0.3, rho=0.3)
    assert abs(sum(w) - 1) < 1e-9
    assert w[1] > w[2] > w[0]  # p(1-p) = 0.25 (p = 0.5) is the most learnable level
    assert min(w) >= 0.3 / 3 - 1e-12  # rho spreads 30% uniformly: no level starves
    assert plr_weights([0.1, 0.1], beta=0.3, rho=1.0) == [0.5, 0.5]
    # tied scores weigh alike (order gave the first of three levels all scoring 0 a weight of 0.72, and p = 0.25 and
    # 0.75, which tie, 0.69 against 0.14)
    assert np.allclose(plr_weights([0.0, 0.0, 0.0], beta=0.3, rho=0.3), [1 / 3] * 3)
    w = plr_weights([0.1875, 0.1875, 0.0, 0.0], beta=0.3, rho=0.3)
    assert np.isclose(w[0], w[1]) and np.isclose(w[2], w[3]) and w[0] > w[2]


def test_mean_ci_is_a_t_interval_over_seeds():
    from harness.experiment import mean_ci

    m, lo, hi = mean_ci([0.2, 0.3, 0.4])
    assert abs(m - 0.3) < 1e-12 and abs((hi - m) - 4.3027 * 0.1 / 3 ** 0.5) < 1e-5 and abs((m - lo) - (hi - m)) < 1e-12
    assert mean_ci([0.5]) == (0.5, 0.5, 0.5)
    # past ten degrees of freedom still Student's t (t_11 = 2.201), not the normal 1.96 (a statistics review found
    # the table stopped at 10: 92% coverage at 12 seeds)
    xs = [0.1 * k for k in range(12)]
    m, lo, hi = mean_ci(xs)
    sd = (sum((x - m) ** 2 for x in xs) / 11) ** 0.5
    assert abs((hi - m) - 2.2010 * sd / 12 ** 0.5) < 1e-4


def test_harder_half_is_where_the_warm_start_is_weakest():
    blocks = ["a", "a", "b", "b", "c", "c", "d", "d"]
    warm = [[1, 1, 0, 0, 1, 0, 0, 0]]  # a 1.0, b 0.0, c 0.5, d 0.0
    assert harder_half(blocks, warm) == ["b", "d"]
    assert harder_half(["x", "y", "z"], [[0.0, 0.0, 1.0]]) == ["x", "y"]  # rounded up


def test_random_env_is_a_reproducible_draw_the_generator_accepts():
    from harness.tasks import get_task

    task = get_task("mapf")
    env = task.spec.config_model.model_validate(TINY_RUN["env"])
    a = random_env(task, env, 0.25, 50, np.random.default_rng(3))
    b = random_env(task, env, 0.25, 50, np.random.default_rng(3))
    assert a == b and a != env
    task.generate(a, 0)
    for ea, e0 in zip(a.sizes, env.sizes, strict=True):  # integers move by at most one, floats within the spread
        assert abs(ea.agents - e0.agents) <= 1
        assert abs(ea.hole_ratio - e0.hole_ratio) <= 0.25 * 0.6 + 1e-9


def test_unequal_compute_and_bad_arms_are_refused_before_training(tmp_path):
    with pytest.raises(ExperimentError, match=r"arm plr: overrides\.plr\.batch_size = 16 changes what one GRPO step "
                                              r"costs.*equal compute"):
        plan(load_experiment(_cfg(tmp_path, overrides={"plr": {"batch_size": 16}})))
    with pytest.raises(ExperimentError, match="arms.*unknown arm 'evolved'"):
        load_experiment(_cfg(tmp_path, arms=["evolved"]))
    with pytest.raises(ExperimentError, match="set budget_steps"):
        plan(load_experiment(_cfg(tmp_path, arms=["plr", "fixed-template"])))
    with pytest.raises(Exception, match="learning_rat"):  # a typo in an override is the run config's error
        plan(load_experiment(_cfg(tmp_path, overrides={"plr": {"learning_rat": 1e-4}})))
    p = plan(load_experiment(_cfg(tmp_path)))
    assert "evolved-llm" not in p["arms"] and "base_url" in p["skipped"]["evolved-llm"]
    r = subprocess.run([sys.executable, "-m", "harness.cli", "experiment", str(_cfg(tmp_path, arms=["nope"])),
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2 and "unknown arm 'nope'" in r.stderr and not (tmp_path / "o").exists()


# the end-to-end run of every arm (equal compute, outputs, resume) is tests/test_scenarios.py's: a scenario runs the
# experiment, and one warm start and one evolved arm serve both (CI time)


def test_step_equivalents_count_steps_and_judging_tokens_but_not_the_warm_start_or_the_report(tmp_path):
    """The experiment's unit, read from a run's ledger: GRPO steps plus judging tokens at the run's tokens per step;
    the SFT warm start and the held-out report (label test) are every arm's alike and left out."""
    from harness.stagebook import step_equivalents
    from harness.store import RunStore

    store = RunStore.open(tmp_path / "run.db")
    store.create_run("r", {})
    store.charge("r", 0, "policy", "sft", seconds=1, tokens=0, steps=50)
    store.charge("r", 0, "policy", "eval", seconds=1, tokens=999, label="test")
    store.charge("r", 1, "policy", "grpo", seconds=1, tokens=400, steps=4)
    store.charge("r", 1, "policy", "rollout", seconds=1, tokens=50, label="probe")
    store.charge("r", 2, "policy", "grpo", seconds=1, tokens=400, steps=4)
    store.charge("r", 2, "control", "eval", seconds=1, tokens=150, label="backtest")
    store.charge("r", 2, "policy", "eval", seconds=1, tokens=999, label="test")
    c = step_equivalents(store, "r")
    assert c["steps"] == 8 and c["tokens_per_step"] == 100 and c["judge_tokens"] == 200
    assert c["compute"] == 10 and c["by_stage"] == {1: 4.5, 2: 5.5}
    assert step_equivalents(store, "r", before=2)["compute"] == 4.5  # what stage 2 finds spent before it
    store.close()


def test_compute_shares_walk_the_delivered_policy_back_through_the_stages(tmp_path):
    """`compute_shares`: the GRPO steps on the delivered checkpoint's lineage (a stage's training starts from the last
    stage's `next_policy`, its arms from `Probed.carried`), the rest of the training, and the judging by part. Stage
    1 explores (its control arm continues), stage 2 exploits 120 steps, stage 3's training lowered the probe (its arms
    start from the stage's start) and the anchor stays stage 2's. Caught: a lineage that counts every arm, follows the
    stage's training where the arms started from its start, counts a look's record as an arm, or reads the last
    `next_policy` instead of what the run delivers; judging filed under the wrong part."""
    from harness.results import ArmLook, ArmRecord, Decided, Probed, SetUp, Trained
    from harness.stagebook import compute_shares, shares_line
    from harness.store import RunStore

    store = RunStore.open(tmp_path / "run.db")
    store.create_run("r", {})
    ck = str(tmp_path / "checkpoints") + "/"

    def probe(carried):
        return Probed(rollouts="x", valid=0.5, start_valid=0.5, change=0.0, change_ci=[0.0, 0.0], regressed=False,
                      carried=carried)

    def arm(k, name, steps):
        store.charge("r", k, name, "grpo", seconds=1, tokens=100 * steps, steps=steps)
        store.save_result("r", k, ArmRecord(checkpoint=f"{ck}s{k}-{name}", rollouts="x", valid=0.5, steps=steps,
                                            curve=[{"step": i, "pipelined": None} for i in range(steps)]),
                          node=f"arm:{name}")
        store.save_result("r", k, ArmLook(rollouts="x", n=8), node=f"arm:{name}:look1")  # not an arm

    store.save_result("r", 0, SetUp(policy=ck + "warmstart"))
    store.end_stage("r", 0, checkpoint=ck + "warmstart")
    for k, steps, carried, arms, nxt, anchor in (
            (1, 30, "s1-train", {"control": 30, "s1c1": 30}, "s1-control", "s1-control"),
            (2, 120, None, {}, "s2-train", "s2-train"),
            (3, 30, "s2-train", {"control": 30, "s3c1": 30}, "s3-control", "s2-train")):
        store.charge("r", k, "policy", "grpo", seconds=1, tokens=100 * steps, steps=steps)
        store.save_result("r", k, Trained(checkpoint=f"{ck}s{k}-train", steps=[  # stage 2's call pipelined
            {"step": i, "pipelined": float(i > 0) if k == 2 else None} for i in range(steps)]))
        if carried:
            store.save_result("r", k, probe(ck + carried))
        for name, n in arms.items():
            arm(k, name, n)
        store.save_result("r", k, Decided(next_policy=ck + nxt, anchor=ck + anchor))
        store.end_stage("r", k, checkpoint=ck + anchor)
    store.charge("r", 1, "policy", "rollout", seconds=1, tokens=300, label="target-probe")
    store.charge("r", 1, "control", "eval", seconds=1, tokens=200, label="backtest look 1")
    store.charge("r", 3, "control", "eval", seconds=1, tokens=100, label="backtest")
    store.charge("r", 2, "policy", "eval", seconds=1, tokens=400, label="carry confirmation 1")
    store.charge("r", 3, "policy", "eval", seconds=1, tokens=9999, label="test")  # the report: nobody's compute
    s = compute_shares(store, "r")
    assert s["delivered"] == ck + "s2-train" and s["steps"] == 300
    assert s["lineage"] == 30 + 30 + 120 and s["other_training"] == 120  # s1-train, s1-control, s2-train
    assert s["judging"] == {"probes": 3.0, "arm evaluations": 3.0, "carry readings": 4.0, "other judging": 0.0}
    assert s["compute"] == 310
    assert s["pipelined"] == 119 / 300  # stage 2's 120 steps but its first (nothing was ready yet)
    line = shares_line(s)
    assert "180 (58%) trained the delivered policy (s2-train)" in line and "10 (3%) judged" in line
    store.end_stage("r", 3, checkpoint=ck + "s3-control")  # the lineage through a stage whose training fell
    assert compute_shares(store, "r")["lineage"] == 30 + 120 + 30 + 30  # s3-control from s2-train, not s3-train
    store.end_stage("r", 3, checkpoint=ck + "elsewhere")  # a checkpoint no record made: the lineage is unknown
    assert compute_shares(store, "r")["lineage"] is None and "unknown" in shares_line(compute_shares(store, "r"))
    store.close()


def test_arms_trained_with_and_without_the_rollout_pipeline_are_named():
    """`recipe.pipeline: auto` pipelines where a process has a spare core, so `--jobs` decides it on a small machine:
    arms from parts run at different `--jobs` trained with two GRPO loops, and the summary says which. Caught: parts
    mixed silently, or a warning where every arm agrees or an arm's result does not say."""
    from harness.experiment import mixed_trainers, pipelined_share

    assert pipelined_share([{"shares": {"pipelined": 0.9}}, {"shares": {"pipelined": 0.8}}]) == pytest.approx(0.85)
    assert pipelined_share([{"shares": {"pipelined": 0.9}}, {}]) is None  # a seed that does not say
    w = mixed_trainers({"fixed-template": {"pipelined": 0.0}, "oracle": {"pipelined": 0.0},
                        "evolved-rule": {"pipelined": 0.97}})
    assert w and "evolved-rule pipelined" in w and "fixed-template, oracle did not" in w and "--jobs" in w
    assert mixed_trainers({"fixed-template": {"pipelined": 0.97}, "evolved-rule": {"pipelined": 0.96}}) is None
    assert mixed_trainers({"fixed-template": {"pipelined": 0.0}, "evolved-rule": {"pipelined": None}}) is None
    assert mixed_trainers({"fixed-template": {}, "evolved-rule": {"pipelined": 0.9}}) is None


def test_the_experiment_trains_judges_and_counts_only_through_the_stage():
    """The experiment's arms run on the stage's rooms (`arms.train_policy`, `evaluation.report_eval`, `arms.warm_start`
    via `graph.node_setup`, the ledger); a second training loop, suite evaluation, warm start or raw SQL ledger read in
    the experiment or its baselines (what the experiment once had) fails here."""
    import ast

    root = Path(__file__).resolve().parents[1]
    banned = {"sqlite3", "harness.backtest.train_arm", "harness.policy_glue.evaluate", "harness.warmstart",
              "policies.model.load_policy", "policies.model.save_policy", "harness.round0.initial_files",
              "policies.rollout.SamplingParams"}
    for rel in ("harness/experiment.py", "harness/baselines.py"):
        found = set()
        for node in ast.walk(ast.parse((root / rel).read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        assert not found & banned, (rel, sorted(found & banned))
        assert "execute(" not in (root / rel).read_text(), f"{rel} reads run.db with raw SQL; use the store's methods"


def test_each_evolved_run_learns_in_its_own_copy_of_the_library_and_hands_it_back(tmp_path, monkeypatch):
    """Seeds are independent replicates: every evolved run starts from the library as it stood when the experiment
    began (seed 1 does not see what seed 0 learnt, whichever ran first or beside it), and what each learnt reaches
    the shared library when it ends; a run that fails hands nothing back; `skills: shared` keeps the one library."""
    from harness.experiment import ExperimentConfig, own_skills, snapshot_skills
    from skills.library import SkillLibrary, default_path

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("EVOTRAINER_SKILLS", raising=False)
    shared = tmp_path / "home" / "skills.db"
    with SkillLibrary.open() as lib:
        skill = lib.names()[0]
    cfg = ExperimentConfig.model_validate({"run": {}, "arms": ["evolved-rule", "fixed-template"]})
    exp = tmp_path / "exp"
    exp.mkdir()
    assert snapshot_skills(cfg, exp) == exp / "skills-start.db"

    def learn(seed: int) -> None:
        out = exp / "evolved-rule" / f"seed{seed}"
        out.mkdir(parents=True, exist_ok=True)
        with own_skills(cfg, out, exp, say=lambda m: None):
            assert default_path() == out / "skills.db"
            with SkillLibrary.open() as mine:  # as the loop opens it (`Run.skills`)
                assert mine.get(skill).evidence.tries == 0, seed  # the start library, not another seed's learning
                mine.record_try(skill, promoted=True, effect=0.1, interval=(0.05, 0.15), family="mapf",
                                run=f"uid{seed}", candidate="s1c1")
                if seed == 2:
                    raise RuntimeError("killed")
        assert default_path() == shared

    learn(0)
    learn(1)
    with pytest.raises(RuntimeError):
        learn(2)
    assert default_path() == shared  # restored after a failure too
    with SkillLibrary.open() as lib:
        assert {t["run"] for t in lib.tries(skill)} == {"uid0", "uid1"} and lib.get(skill).evidence.tries == 2
    # resumed, the failed run hands its try back once; its copy is kept, not made again
    with own_skills(cfg, exp / "evolved-rule" / "seed2", exp, say=lambda m: None):
        pass
    with own_skills(cfg, exp / "evolved-rule" / "seed2", exp, say=lambda m: None):
        pass
    with SkillLibrary.open() as lib:
        assert lib.get(skill).evidence.tries == 3
    assert snapshot_skills(cfg, exp) == exp / "skills-start.db"  # a resumed experiment keeps its start library
    with SkillLibrary.open(exp / "skills-start.db", seed_dir=None) as start:
        assert start.get(skill).evidence.tries == 0
    one = cfg.model_copy(update={"skills": "shared"})
    assert snapshot_skills(one, tmp_path) is None
    with own_skills(one, exp / "evolved-rule" / "seed9", exp, say=lambda m: None):
        assert default_path() == shared


def test_a_shared_warm_start_made_from_other_settings_is_refused(tmp_path):
    """`--quick` then the full size in one --out: the full call reopened the quick warm start and every arm started
    from it, while their records said the full one. Now the difference is named before anything trains. Would catch
    a warm start folder reopened without comparing what it was made from."""
    import yaml

    from harness.benchmarks.run import TINY
    from harness.config import parse_config
    from harness.experiment import ExperimentError, warm_start

    quick = parse_config({**TINY, "warm_start": {"sft_examples": 16, "sft_steps": 4}}, "t")
    full = parse_config({**TINY, "warm_start": {"sft_examples": 32, "sft_steps": 8}}, "t")
    folder = tmp_path / "out" / "warmstart"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(quick.model_dump(mode="json")))
    with pytest.raises(ExperimentError, match=r"made from other settings than this call's: warm_start.sft_examples"):
        warm_start(full, tmp_path / "out", print)


def test_level_samplers_on_a_family_without_a_mixture_are_refused_before_any_arm_trains(tmp_path, monkeypatch):
    """A family whose generator config has no weighted mixture ran the evolved, random and template arms first and
    then stopped at the first level sampler; now `plan` refuses, naming the arms to drop."""
    import dataclasses

    from harness.tasks import get_task

    task = get_task("mapf")
    cfg = load_experiment(_cfg(tmp_path, arms=["fixed-template", "plr", "bandit", "evolved-rule"]))
    assert "plr" in plan(cfg)["arms"]
    monkeypatch.setattr(task, "spec", dataclasses.replace(task.spec, entry_key=None))
    with pytest.raises(ExperimentError, match=r"arm\(s\) plr, bandit: task mapf's generator config has no weighted "
                                              r"mixture.*drop the level samplers"):
        plan(cfg)


def test_what_run_checks_at_start_the_experiment_checks_before_its_shared_warm_start(tmp_path):
    """`run.policy.backend: vllm` on a CPU machine, or an `eval.env` the generator cannot draw from, trained the
    shared warm start first and then failed (a traceback for the backend); `plan` now runs `run`'s own checks."""
    bad_backend = {**TINY_RUN, "policy": {"preset": "tiny", "backend": "vllm"}}
    with pytest.raises(ExperimentError, match=r"^run: policy.backend: "):
        plan(load_experiment(_cfg(tmp_path, run=bad_backend, arms=["evolved-rule"])))
    tight = {"min_distance": 4, "sizes": [{"size": 3, "data_ratio": 1.0, "hole_ratio": 0.6, "wait_ratio": 1.0,
                                           "agents": 2}]}  # a valid config the generator cannot draw from
    bad_eval = {**TINY_RUN, "eval": {"env": tight, "n": 8}}
    with pytest.raises(ExperimentError, match=r"^run: eval.env: .*eval.env.min_distance"):
        plan(load_experiment(_cfg(tmp_path, run=bad_eval, arms=["evolved-rule"])))


def test_an_override_for_an_arm_not_run_this_time_is_still_checked(tmp_path):
    """`overrides: {plr: {bogus: 1}}` with plr left out of `arms` trained anyway, the typo kept for a later call."""
    with pytest.raises(ExperimentError, match=r"overrides.plr.bogus: unknown key"):
        plan(load_experiment(_cfg(tmp_path, arms=["evolved-rule", "fixed-template"], overrides={"plr": {"bogus": 1}})))
    with pytest.raises(ExperimentError, match=r"overrides.bandit.learning_rate: "):
        plan(load_experiment(_cfg(tmp_path, arms=["evolved-rule"], overrides={"bandit": {"learning_rate": -1}})))


def _replay(units, order_key, secs, jobs=2):
    """A list schedule of `units` on `jobs` workers with known unit times, as `_schedule` runs it: whenever a worker
    is free, the first ready unit by `order_key`. Returns each unit's (start, end)."""
    import heapq

    done, when, running, t = set(), {}, [], 0.0
    pending = dict(units)
    while pending or running:
        ready = sorted((k for k, u in pending.items() if all(a in done for a in u.after)), key=order_key)
        for k in ready[:jobs - len(running)]:
            del pending[k]
            when[k] = (t, t + secs(k))
            heapq.heappush(running, (t + secs(k), k))
        t, k = heapq.heappop(running)
        done.add(k)
    return when


def test_the_schedule_runs_warm_starts_first_and_scenarios_whole():
    """A scenario set's shape (two code scenarios, ten MAPF, two math; four arms, one seed) with the unit times of a
    `--quick` set (BENCHMARKS.md, fifty-seventh session). Made in file order and run in that order, the math warm start
    was ready from the start and ran after every MAPF evolved arm, one core idle beside it; the schedule now runs the
    warm starts first (the one more units wait on first) and then the arms as made: each scenario's evolved arm, then
    its baselines, scenario by scenario."""
    units, first = {}, {}
    fams = ["code"] * 2 + ["mapf"] * 10 + ["math"] * 2
    for i, fam in enumerate(fams):
        add_units(units, first, i, fam, ["fixed-template", "oracle", "evolved-rule", "plr"], 1, True)
    assert len(units) == 14 * 5 and units[(3, "warm")].after == [(2, "warm")]
    assert units[(3, 0, "plr")].after == [(3, "warm"), (3, 0, "evolved-rule")]
    rank = priorities(units)
    order = sorted(units, key=rank.get)
    assert order[:3] == [(2, "warm"), (0, "warm"), (12, "warm")]  # most waited on first, then the order made
    assert [units[k].kind for k in order[:14]] == ["warm"] * 14
    arms = ["evolved-rule", "fixed-template", "oracle", "plr"]
    assert order[14:] == [(i, 0, a) for i in range(14) for a in arms]  # scenario by scenario, evolved arm first

    warm_s = {"code": 167.0, "mapf": 235.0, "math": 41.0}

    def secs(k):
        fam = fams[k[0]]
        if k[1] == "warm":
            return warm_s[fam] if first[fam] == k else 1.0
        return {"math": 7.0}.get(fam, 25.0 if k[2] == "evolved-rule" else 20.0)
    made = _replay(units, list(units).index, secs)
    now = _replay(units, rank.get, secs)
    end = lambda when: max(e for _, e in when.values())
    assert made[(12, "warm")][0] > max(made[(i, 0, "evolved-rule")][0] for i in range(12))  # as it was: near the end
    assert now[(12, "warm")][0] <= now[(0, 0, "fixed-template")][0]  # now: as soon as a core frees
    longest_arm = max(secs(k) for k in units if k[1] != "warm")
    assert end(now) < end(made) and end(now) <= sum(map(secs, units)) / 2 + longest_arm


def test_a_second_evolved_arm_off_the_baselines_budget_is_named_under_the_table():
    """The baselines train the first evolved arm's compute; a second evolved arm that spent 20% more is compared with
    them as if at equal compute unless the table says otherwise (an outside statistics review: `bench scenarios`
    named it, the experiment's table did not). Would catch the note missing, or the first arm named too."""
    from harness.experiment import summarize, table

    def row(arm, seed, compute, budget, v):
        return {"arm": arm, "seed": seed, "compute": compute, "budget": budget, "final_per_instance": v,
                "final": {"optimal": 0.0}, "promoted": []}

    blocks = ["a", "a", "b", "b"]
    results = {"fixed-template": [row("fixed-template", s, 300, 300, [1, 0, 0, 0]) for s in (0, 1)],
               "evolved-rule": [row("evolved-rule", s, 300, 300, [1, 1, 0, 0]) for s in (0, 1)],
               "evolved-llm": [row("evolved-llm", s, 360, 360, [1, 1, 1, 0]) for s in (0, 1)]}
    warm = [{"per_instance": [1, 0, 0, 0]}]
    s = summarize(results, blocks, warm, ["b"])
    s.update(suite="x", n_instances=4, seeds=2, stages=1)
    assert s["comparisons"]["evolved-rule vs fixed-template"]["unequal_compute_seeds"] == []
    assert s["comparisons"]["evolved-llm vs fixed-template"]["unequal_compute_seeds"] == [0, 1]
    text = table(s)
    assert "**Not at equal compute**" in text and "evolved-llm vs fixed-template, seed(s) 0, 1" in text
    assert "evolved-rule vs fixed-template, seed" not in text


def test_a_second_call_into_a_busy_experiment_folder_is_refused_and_a_new_run_folder_has_its_config_first(
        tmp_path, monkeypatch):
    """Two `evotrainer experiment` calls into one --out (an experiment run in parts, two parts started together)
    both trained its shared warm start, and any arm both named, into the same folders: checkpoints half written under
    each other. The second is refused now, naming the first's pid, before it plans or trains anything. And
    `open_run` (the experiment's warm start and baselines) writes config.yaml whole before its marker, as
    `start_run` does: a kill between them left a marker without a config, which passed a changed warm start by.
    Would catch: no lock on --out, the marker first (an outside review of shared state)."""
    import harness.lifecycle as L
    from harness.benchmarks.run import TINY
    from harness.config import parse_config
    from harness.experiment import run_experiments
    from harness.store import acquire_lock

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    cfg = load_experiment(_cfg(tmp_path))
    (tmp_path / "out").mkdir()
    held = acquire_lock(tmp_path / "out", "experiment")
    try:
        with pytest.raises(ExperimentError, match=r"--out .*out is in use by another experiment call \(pid \d+\); let it finish"):
            run_experiments([(cfg, tmp_path / "out")], say=lambda m: None)
    finally:
        held.release()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["lock"]  # nothing planned or written

    def killed(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(L, "_prepare", killed)  # the kill right after the folder's files are written
    with pytest.raises(KeyboardInterrupt):
        L.open_run(tmp_path / "warmstart", parse_config(TINY, "t"))
    assert (tmp_path / "warmstart" / "config.yaml").is_file() and (tmp_path / "warmstart" / L.RUN_MARKER).is_file()
    real_write = L.Path.write_text

    def dies_at_the_marker(self, text, *a, **k):
        if self.name == L.RUN_MARKER:
            raise KeyboardInterrupt
        return real_write(self, text, *a, **k)

    monkeypatch.setattr(L.Path, "write_text", dies_at_the_marker)
    with pytest.raises(KeyboardInterrupt):
        L.open_run(tmp_path / "baseline", parse_config(TINY, "t"))
    assert (tmp_path / "baseline" / "config.yaml").is_file()  # the config is there whatever the marker's fate
