"""The seam between the loop and the task families: the loop names no family.

Everything family-specific reaches the loop through the Task protocol (`harness/tasks/base.py`): knobs and their ranges
(on the config fields), the one knob grammar (`harness/tasks/knobs.py`), slices and the difficulty slice, failure ->
knob hints, the near-miss rule, the gap metric, the configs the vet step generates from, the round-0 env.yaml.
This test reads the loop's modules and fails on any family's name or field in them (code, comments or docs), so a second family
never silently loses its hints because a module assumed the first one's fields.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOOP = ["harness/graph.py", "harness/run.py", "harness/lifecycle.py", "harness/diagnostics.py", "harness/vet.py", "harness/backtest.py",
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "harness" / "engineer").glob("*.py"))]
FAMILY_WORDS = re.compile(r"\b(mapf|sizes?|agents?|holes?|hole_ratio|wait_ratio|data_ratio|wait|makespan\w*|cbs"
                          r"|arith|digits|sub_ratio|mul_ratio"  # math
                          r"|depth|vocab|list_len|str_ratio|humaneval)\b",  # code
                          re.IGNORECASE)


@pytest.mark.parametrize("path", LOOP)
def test_the_loop_names_no_task_family(path):
    hits = [f"{path}:{i}: {line.strip()}" for i, line in enumerate((ROOT / path).read_text().splitlines(), 1)
            if FAMILY_WORDS.search(line)]
    assert not hits, "family names in the loop (move them behind the Task protocol):\n" + "\n".join(hits)


def test_the_knob_grammar_is_the_tasks():
    """vet, the engineers and the task agree on one grammar: what `knob_space` offers, the vet step can set and the
    task's own helper reads back, for every env knob of the round-0 config."""
    import yaml

    from harness.engineer.proposal import knob_space
    from harness.records import Diagnosis
    from harness.tasks import TASKS, get_task
    from harness.tasks.knobs import get_value, split
    from harness.vet import set_path

    for name in TASKS:
        task = get_task(name)
        env = task.default_config().model_dump(mode="json")
        d = Diagnosis(task=name, stage=1, env_config=env, recipe={})
        space = {k: v for k, v in knob_space(d, task).items() if v.kind == "env"}
        assert space, f"{name}: no env knob offered"
        for path, k in space.items():
            assert k.lo <= k.current <= k.hi, (path, k)
            data = yaml.safe_load(yaml.safe_dump(env))
            new = k.hi if k.current != k.hi else k.lo
            new = int(new) if k.integer else new
            set_path(data, split(path, "env"), new, path, task.spec.entry_key)
            assert get_value(data, split(path, "env"), task.spec.entry_key) == new


def test_one_frontier_skill_speaks_every_familys_knob():
    """`@frontier` in a skill resolves to the run's task's own frontier knob, so the seed skill
    data-ratio-toward-frontier moves MAPF's board-size mix and math's digit mix alike (before, its MAPF-only template
    could not be instantiated on math: 'needs slice key(s) [size]')."""
    from harness.engineer.proposal import knob_space
    from harness.engineer.rule import instantiate
    from harness.records import Diagnosis, Finding
    from harness.tasks import get_task
    from harness.tasks.knobs import set_value, split
    from skills.library import SEED_DIR, load_skill_file

    skill = load_skill_file(SEED_DIR / "data-ratio-toward-frontier.md")
    for name, level, knob in (("mapf", "5", "env.sizes.5.data_ratio"), ("math", "2", "env.levels.2.data_ratio"),
                              ("code", "2", "env.levels.2.data_ratio")):
        task = get_task(name)
        env = task.default_config().model_dump(mode="json")
        set_value(env, split(knob, "env"), 0.5, task.spec.entry_key)  # room to move (MAPF's default is at the bound 1.0)
        d = Diagnosis(task=name, stage=1, env_config=env, recipe={})
        f = Finding(code=f"{name}.frontier", severity="warn", count=20, rate=0.4, slice={task.spec.difficulty_slice: level},
                    message="frontier")
        change, old = instantiate(skill, f, knob_space(d, task), 1.0, name)
        assert change.knob == knob and change.value == pytest.approx(old + 0.1), (name, change, old)
    assert "has no knob" in instantiate(skill, f, {}, 1.0, "no-such-task")


# one stage of the whole loop per family: its round-0 harness, a barely trained tiny model, the rule engineer
LOOP_SETTINGS = {
    "mapf": {"warm_start": {"sft_examples": 64, "sft_steps": 8}, "max_completion_length": 24},
    "math": {"warm_start": {"sft_examples": 256, "sft_steps": 60}, "max_completion_length": 8},
    "code": {"warm_start": {"sft_examples": 256, "sft_steps": 60}, "max_completion_length": 24},
    "reasoning": {"warm_start": {"sft_examples": 64, "sft_steps": 10}, "max_completion_length": 8},
}


@pytest.mark.usefixtures("one_torch_thread")  # conftest: faster for tiny models
@pytest.mark.parametrize("family", ["mapf", "math", "code", "reasoning"])
def test_the_tiny_loop_runs_on_every_family(family, tmp_path, monkeypatch):
    """What a loop shaped for one family would get wrong on another: the env.yaml would be the other family's, the
    diagnosis would carry none of this family's findings or slices, and the engineer could not offer its knobs."""
    from harness.tasks import TASKS, get_task

    assert set(LOOP_SETTINGS) == set(TASKS), "a new family needs its tiny-loop settings here"
    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    import yaml

    from harness.config import parse_config
    from harness.engineer.proposal import knob_space
    from harness.lifecycle import start_run
    from harness.records import Diagnosis
    from harness.store import RunStore
    from sandbox.runner import find_bwrap

    if family == "code" and not find_bwrap():
        monkeypatch.setenv("EVOTRAINER_CODE_ISOLATION", "process")  # CI installs bubblewrap; say so when it is not
    task, s = get_task(family), LOOP_SETTINGS[family]
    cfg = parse_config({
        "task": family, "name": family, "policy": {"preset": "tiny"}, "warm_start": s["warm_start"],
        "recipe": {"steps": 2, "batch_size": 8, "num_generations": 4, "max_completion_length": s["max_completion_length"],
                   "temperature": 1.0},
        "budget": {"stages": 1}, "stage": {"train_instances": 16, "probe_n": 16, "probe_samples": 2, "candidates": 2},
        "backtest": {"arm_steps": 1, "n": 16}, "engineer": {"kind": "rule"}, "eval": {"suite": "small", "limit": 12},
    }, "test")
    run_dir = start_run(cfg, tmp_path / "runs", run_id=family)
    env = yaml.safe_load((run_dir / "harness" / "env.yaml").read_text())
    assert set(env) == set(task.default_config().model_dump()) - {"source"}, env
    store = RunStore.open(run_dir / "run.db")
    try:
        assert store.get_run(family)["status"] == "finished"
        d = Diagnosis.model_validate_json((run_dir / "stages" / "s1" / "diagnosis.json").read_text())
        assert any(k.startswith(f"{task.spec.difficulty_slice}=") for k in d.by_slice), d.by_slice
        codes = {f.code for f in d.findings}
        assert any(c.startswith(f"{family}.") for c in codes), codes
        cands = store.candidates(family)
        assert cands and all(c["reason"] for c in cands)
        space = knob_space(d, task)
        for c in cands:  # every knob the engineer proposed exists in this family's grammar
            assert c["knob"] in space or c["knob"].startswith(("recipe.", "reward.", "diagnostics/")), c["knob"]
    finally:
        store.close()
