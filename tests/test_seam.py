"""The seam between the loop and the task families: the loop names no family.

Everything family-specific reaches the loop through the Task protocol (`harness/tasks/base.py`): the family's
`TaskSpec` (models, slices and the difficulty slice, failure -> knob hints, the near-miss rule, the gap metric, the
round-0 env.yaml) and its declared capabilities (the configs the vet step generates from, env statistics, a batch
scorer); knobs and their ranges sit on the config fields, read through one knob grammar (`harness/tasks/knobs.py`).
These tests read the loop's modules, the report, the experiment and the config, and fail on any family's name or field
in them (code, comments or docs) -- for every registered family, its words drawn from its own config and instance
models and slices -- so a second family never silently loses its hints because a module assumed the first one's fields.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from harness.tasks import TASKS, get_task
from harness.tasks.base import Instance, Task, TaskSpec
from harness.tasks.knobs import MIXTURE

ROOT = Path(__file__).resolve().parents[1]
LOOP = ["harness/graph.py", "harness/run.py", "harness/lifecycle.py", "harness/diagnostics.py", "harness/vet.py", "harness/backtest.py",
        "harness/arms.py", "harness/results.py", "harness/round0.py", "harness/evaluation.py", "harness/memory.py",
        "harness/stagebook.py", "harness/diagjudge.py",
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "harness" / "engineer").glob("*.py")),
        "harness/report.py", "harness/report_page.py", "harness/experiment.py", "harness/baselines.py", "harness/config.py"]
FAMILY_WORDS = re.compile(r"\b(mapf|sizes?|agents?|holes?|hole_ratio|wait_ratio|data_ratio|wait|makespan\w*|cbs"
                          r"|arith|digits|sub_ratio|mul_ratio"  # math
                          r"|depth|vocab|list_len|str_ratio|humaneval)\b",  # code
                          re.IGNORECASE)
# matplotlib's and CSS's font size; the chat-completions API's `reasoning_content` and `reasoning` message fields
# (vllm serve --reasoning-parser: older servers name it the first way, newer ones the second)
NOT_FAMILY = re.compile(r"font[-.]size|reasoning[-_](content|parser)|\.get\(\"reasoning\"\)", re.IGNORECASE)
# words a family's models use that every module also uses in their plain sense (a finding's code, a function's name)
COMMON = {"answer", "attempts", "carries", "code", "examples", "expected", "expr", "header", "inputs", "levels", "math",
          "name", "op", "output", "params", "plan", "solution", "source", "starts", "steps", "test"}


def _fields(model: type[BaseModel]) -> set[str]:
    """A model's field names, nested models' included (a config's list of entries)."""
    out = set()
    for name, f in model.model_fields.items():
        out.add(name)
        for a in (f.annotation, *typing.get_args(f.annotation)):
            for b in (a, *typing.get_args(a)):
                if isinstance(b, type) and issubclass(b, BaseModel):
                    out |= _fields(b)
    return out


def family_words(name: str) -> set[str]:
    """What names a family: its name and module, its generator config's and instance's fields, its slice keys."""
    spec = get_task(name).spec
    return ({name, TASKS[name].rpartition(".")[2]} | _fields(spec.config_model) | set(spec.slice_keys)
            | (_fields(spec.instance_model) - set(Instance.model_fields))) - COMMON


def _hits(path: str, words: re.Pattern) -> list[str]:
    return [f"{path}:{i}: {line.strip()}" for i, line in enumerate((ROOT / path).read_text().splitlines(), 1)
            if words.search(NOT_FAMILY.sub("", line))]


@pytest.mark.parametrize("path", LOOP)
def test_the_loop_names_no_task_family(path):
    hits = _hits(path, FAMILY_WORDS)
    assert not hits, "family names in the loop (move them behind the Task protocol):\n" + "\n".join(hits)


@pytest.mark.parametrize("family", sorted(TASKS))
def test_the_loop_names_none_of_this_familys_words(family):
    """Every registered family, its words read from its own models: a family added tomorrow is checked too."""
    task = get_task(family)
    assert isinstance(task, Task) and isinstance(task.spec, TaskSpec), f"{family} does not satisfy the Task protocol"
    words = re.compile(r"\b(" + "|".join(sorted(map(re.escape, family_words(family)))) + r")\b", re.IGNORECASE)
    hits = [h for path in LOOP for h in _hits(path, words)]
    assert not hits, f"{family}'s words in the loop (move them behind the Task protocol):\n" + "\n".join(hits)


def test_the_family_words_are_the_familys():
    """What the check above would miss if it read no model: MAPF's board fields and math's digit fields."""
    assert {"mapf", "hole_ratio", "wait_ratio", "agents", "size"} <= family_words("mapf")
    assert {"arith", "digits", "sub_ratio", "carries"} - COMMON <= family_words("math")


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
        "backtest": {"arm_steps": 1, "n": 16, "carry_confirm": 32},  # not 288-864 greedy decodes of two checkpoints
        "engineer": {"kind": "rule"}, "eval": {"suite": "small", "limit": 12},
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
            assert (c["knob"] in space or c["knob"] == MIXTURE
                    or c["knob"].startswith(("recipe.", "reward.", "diagnostics/"))), c["knob"]
    finally:
        store.close()


@pytest.mark.parametrize("family", sorted(TASKS))
def test_every_family_brings_its_own_round0_env(family):
    """The workspace template holds what every family shares (recipe, README, the example diagnostic); the round-0
    env.yaml is the family's. What this catches: a template env.yaml (one family's boards in every family's repo), or a
    family whose round-0 env its own generator config rejects."""
    import yaml

    from sandbox.workspace import TEMPLATE_DIR

    assert not (TEMPLATE_DIR / "env.yaml").exists(), "the template's env.yaml would be one family's: move it to its task"
    spec = get_task(family).spec
    spec.config_model.model_validate(yaml.safe_load(spec.round0_env))


CAPABILITY_LOOKUP = re.compile(r"\b(getattr|hasattr)\([^)]*[\"'](score_many|env_stats|vet_configs)[\"']")
STILL_LOOKS_UP: set[str] = set()


def test_capabilities_are_declared_not_looked_up():
    """A family's optional capability is a Protocol in harness/tasks/base.py, checked with isinstance: what this catches
    is a module asking `getattr(task, "score_many", None)`, which no type checker or reader can follow."""
    found = {str(p.relative_to(ROOT)) for p in (ROOT / "harness").rglob("*.py")
             if CAPABILITY_LOOKUP.search(p.read_text())}
    assert found <= STILL_LOOKS_UP, sorted(found - STILL_LOOKS_UP)


def test_a_family_of_ones_own_registers_without_editing_the_package(tmp_path, monkeypatch):
    """Registering a family meant editing `harness/tasks/__init__.py`'s TASKS. Now an installed package's
    `evotrainer.tasks` entry point, or $EVOTRAINER_TASKS (inherited by the workers), names it; a wrong one is one line."""
    from harness.config import RunConfig
    from harness.tasks import UnknownTaskError, known_task

    site = tmp_path / "site"
    (site / "myfam").mkdir(parents=True)
    # a user's module holding their families (here the math family under other names)
    (site / "myfam" / "__init__.py").write_text(
        "import copy\nfrom harness.tasks.arith import TASK as MATH\n"
        "SORTD = copy.copy(MATH)\nSORTD.name = 'sortd'\nREVW = copy.copy(MATH)\nREVW.name = 'revw'\n")
    dist = site / "myfam-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myfam\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[evotrainer.tasks]\nsortd = myfam:SORTD\nmath = harness.tasks.mapf:TASK\n")
    monkeypatch.syspath_prepend(str(site))
    assert get_task("sortd").name == "sortd" and known_task("sortd")  # an installed package's entry point
    assert RunConfig.model_validate({"task": "sortd"}).task == "sortd"
    assert get_task("math").name == "math"  # a built-in name is not taken over by a package
    assert not known_task("revw")
    monkeypatch.setenv("EVOTRAINER_TASKS", "revw=myfam:REVW")  # no install: the variable, which workers inherit
    assert get_task("revw").name == "revw"
    monkeypatch.setenv("EVOTRAINER_TASKS", "other=myfam:REVW")
    with pytest.raises(UnknownTaskError, match="is named 'revw'; register it under that name"):
        get_task("other")
    monkeypatch.setenv("EVOTRAINER_TASKS", "revw=myfam:REVW; broken")
    with pytest.raises(UnknownTaskError, match="not name=module:ATTRIBUTE"):
        get_task("revw")
    monkeypatch.setenv("EVOTRAINER_TASKS", "gone=myfam.nothere:TASK")
    with pytest.raises(ValueError, match="task 'gone': cannot load"):
        RunConfig.model_validate({"task": "gone"})


def test_a_preset_run_refuses_a_family_whose_alphabet_misses_characters_of_its_task(tmp_path, monkeypatch):
    """A family whose `spec.alphabet` lacked two letters its prompts use trained and scored 27% valid without a word
    (the preset's char tokenizer read them as <unk>): now one line before the run folder exists."""
    import dataclasses

    from harness.config import RunConfig
    from harness.lifecycle import RunError, start_run

    task = get_task("math")
    cfg = RunConfig.model_validate({"task": "math", "name": "alpha"})
    assert start_run.__module__ == "harness.lifecycle"
    from harness import lifecycle

    assert lifecycle._task_fits_alphabet(cfg) is None
    monkeypatch.setattr(task, "spec", dataclasses.replace(task.spec, alphabet=task.spec.alphabet.replace("=", "")))
    with pytest.raises(RunError, match=r"1 character\(s\) its spec.alphabet lacks: '='"):
        start_run(cfg, tmp_path / "runs", run_id="alpha")
    assert not (tmp_path / "runs" / "alpha").exists()


def test_a_family_without_a_small_suite_is_told_what_the_default_is(monkeypatch):
    """`eval.suite` defaults to `small`; a family without one read "unknown suite 'small'" with no word of where that
    name came from."""
    from harness.config import RunConfig

    task = get_task("math")
    real = task.suite

    def suite(name):
        if name == "small":
            raise ValueError("unknown suite 'small'; choose one of tiny")
        return real("easy")

    monkeypatch.setattr(task, "suite", suite)
    with pytest.raises(ValueError, match=r"eval.suite: not set, so the default 'small'.*set `eval: \{suite: <one of "
                                         r"them>\}`"):
        RunConfig.model_validate({"task": "math"})
    assert RunConfig.model_validate({"task": "math", "eval": {"suite": "tiny"}}).eval.suite == "tiny"
    with pytest.raises(ValueError, match="unknown suite 'small'; choose one of tiny") as exc:
        RunConfig.model_validate({"task": "math", "eval": {"suite": "small"}})
    assert "not set" not in str(exc.value)


@pytest.mark.parametrize("family", sorted(TASKS))
def test_no_held_out_instance_is_a_training_instance(family):
    """Disjoint seeds are not disjoint instances: a generator maps seeds into a finite space, and before, 63% of the
    math example's backtest instances, 31% of code's and 5% of MAPF's (mostly 3x3 boards) had a training twin, so
    decisions and test reports partly measured recall. Every family's instances are kept in their seed's split by
    content (`harness.seeds.held_apart`): here the default generator's small levels, drawn from every split, share no
    prompt across splits, and each instance keeps the seed it was asked for."""
    from harness.seeds import SPLITS, seeds

    task = get_task(family)
    cfg = task.default_config()
    if family == "math":  # single-digit sums: a space of about 200, where twins were the rule
        cfg = cfg.model_validate({"levels": [{"digits": 1, "terms": 2}]})
    prompts: dict[str, set[str]] = {}
    for split in SPLITS:
        insts = [task.generate(cfg, s) for s in seeds(split, 160 if split == "train" else 60)]
        assert [i.seed for i in insts] == seeds(split, len(insts))
        prompts[split] = {task.prompt(i) for i in insts}
    for a in SPLITS:
        for b in SPLITS:
            assert a == b or not prompts[a] & prompts[b], (a, b, sorted(prompts[a] & prompts[b])[:3])


def test_holding_instances_apart_keeps_each_splits_mix():
    """A redraw that picked its level again weighed each level, in each split, by the share of its instances that hash
    there: the default math mix (digits 1 and 2 at 0.50 each) read 0.42 one-digit on backtest seeds and 0.54 on
    probe seeds, so the judge's distribution was not the configured one. The level is picked once from the seed."""
    from collections import Counter

    from harness.seeds import SPLITS, seeds

    task = get_task("math")
    cfg = task.default_config()
    want = {lv.digits: lv.data_ratio / sum(x.data_ratio for x in cfg.levels) for lv in cfg.levels}
    for split in SPLITS:
        got = Counter(task.generate(cfg, s).digits for s in seeds(split, 2000))
        for d, share in want.items():
            assert abs(got[d] / 2000 - share) < 0.04, (split, d, got)  # binomial sd 0.011


def test_a_family_of_ones_own_that_does_not_hold_its_splits_apart_is_named_at_the_first_start(tmp_path, monkeypatch):
    """A user's `generate` that does not wrap its draw in `harness.seeds.held_apart` draws test instances that are
    training instances, and every held-out reading then scores what the policy trained on; nothing said so. Now a run
    folder's first start compares its test set with 64 training instances of its round-0 env and warns with the count
    and the fix. Would catch a check that never draws or is not called (no warning), one that flags a family that
    holds apart (the same subclass, `generate` inherited), or one that crashes the start on a generator that will not
    draw the test split (advice must not stop a run)."""
    from harness import lifecycle
    from harness.config import RunConfig

    site = tmp_path / "site"
    (site / "myfam2").mkdir(parents=True)
    (site / "myfam2" / "__init__.py").write_text(
        "from harness.seeds import split_of\n"
        "from harness.tasks.arith import MathTask\n"
        "class Apart(MathTask):\n    name = 'apartfam'\n"
        "class Leaky(MathTask):\n    name = 'leakyfam'\n"
        "    def generate(self, config, seed):  # one draw for thirty seeds, whatever their split\n"
        "        return super().generate(config, 3 * (seed // 30))\n"
        "class TrainOnly(MathTask):\n    name = 'trainonly'\n"
        "    def generate(self, config, seed):\n"
        "        if split_of(seed) == 'test':\n            raise ValueError('a training bank: no test split')\n"
        "        return super().generate(config, seed)\n"
        "APART, LEAKY, TRAIN_ONLY = Apart(), Leaky(), TrainOnly()\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("EVOTRAINER_TASKS", "apartfam=myfam2:APART; leakyfam=myfam2:LEAKY; trainonly=myfam2:TRAIN_ONLY")
    env = get_task("math").default_config().model_dump(mode="json")  # every family here draws math's instances

    def warnings(task: str) -> list[str]:
        cfg = RunConfig.model_validate({"task": task, "eval": {"env": env, "n": 40}})
        run = lifecycle.open_run(tmp_path / "runs" / task, cfg)
        try:
            return [e["message"] for e in run.store.events(run.id, kind="warning") if "held_apart" in e["message"]]
        finally:
            run.close()
            run.store.close()

    [leak] = warnings("leakyfam")
    assert leak.startswith("task leakyfam: ") and " of the 40 test instances " in leak
    assert int(leak.split()[2]) > 20
    assert warnings("apartfam") == [] and warnings("trainonly") == []

    from harness.experiment import ExperimentConfig, plan  # an experiment says it once, before its warm start

    exp = {"seeds": 1, "arms": ["fixed-template"], "budget_steps": 8,
           "run": {"task": "leakyfam", "eval": {"env": env, "n": 40}}}
    assert plan(ExperimentConfig.model_validate(exp))["notes"] == [leak]
    exp["run"]["task"] = "apartfam"
    assert plan(ExperimentConfig.model_validate(exp))["notes"] == []
