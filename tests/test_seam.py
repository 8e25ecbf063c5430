"""The seam between the loop and the task families: the loop names no family.

Everything family-specific reaches the loop through the Task protocol (`harness/tasks/base.py`): knobs and their ranges
(on the config fields), the one knob grammar (`harness/tasks/knobs.py`), slices and the difficulty slice, failure ->
knob hints, the near-miss rule, the gap metric, the configs the vet step generates from, the round-0 env.yaml.
This test reads the loop's modules and fails on any MAPF name in them (code, comments or docs), so a second family
never silently loses its hints because a module assumed the first one's fields.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOOP = ["harness/graph.py", "harness/diagnostics.py", "harness/vet.py", "harness/backtest.py",
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "harness" / "engineer").glob("*.py"))]
FAMILY_WORDS = re.compile(r"\b(mapf|sizes?|agents?|holes?|hole_ratio|wait_ratio|data_ratio|wait|makespan\w*|cbs)\b",
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
            set_path(data, split(path, "env"), new, path, task.entry_key)
            assert get_value(data, split(path, "env"), task.entry_key) == new


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
    for name, level, knob in (("mapf", "5", "env.sizes.5.data_ratio"), ("math", "2", "env.levels.2.data_ratio")):
        task = get_task(name)
        env = task.default_config().model_dump(mode="json")
        set_value(env, split(knob, "env"), 0.5, task.entry_key)  # room to move (MAPF's default is at the bound 1.0)
        d = Diagnosis(task=name, stage=1, env_config=env, recipe={})
        f = Finding(code=f"{name}.frontier", severity="warn", count=20, rate=0.4, slice={task.difficulty_slice: level},
                    message="frontier")
        change, old = instantiate(skill, f, knob_space(d, task), 1.0, name)
        assert change.knob == knob and change.value == pytest.approx(old + 0.1), (name, change, old)
    assert "has no knob" in instantiate(skill, f, {}, 1.0, "no-such-task")
