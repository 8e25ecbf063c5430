"""The reasoning family: any reasoning-gym dataset as a task. Generation is reasoning-gym's (offline), scoring is exact
match or the dataset's own verifier at full marks, never its partial credit. The tiny loop on it is in
tests/test_seam.py.

    pytest tests/test_reasoning.py -q
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'evotrainer[math]')")

from pathlib import Path

from harness.tasks import get_task, score_all
from harness.tasks.reasoning import DatasetEntry, ReasoningConfig, final_answer

TASK = get_task("reasoning")

ROOT = Path(__file__).resolve().parents[1]


def test_mix_generation_is_deterministic_and_weighted():
    cfg = ReasoningConfig(datasets=[DatasetEntry(name="leg_counting", data_ratio=0.9),
                                    DatasetEntry(name="basic_arithmetic", data_ratio=0.1)])
    a = [TASK.generate(cfg, s) for s in range(200)]
    assert a == [TASK.generate(cfg, s) for s in range(200)]
    share = sum(i.dataset == "leg_counting" for i in a) / 200
    assert 0.83 <= share <= 0.96, share
    assert all(TASK.score(i, TASK.expert(i, style)).valid for i in a[:40] for style in TASK.spec.styles)
    assert set(TASK.slices(a[0])) == set(TASK.spec.slice_keys)


def test_an_instance_is_the_same_in_every_process_whatever_its_hash_seed(tmp_path):
    """isomorphic_strings and knight_swap build their instances by iterating over sets of strings, so what they made
    for a seed followed the interpreter's hash seed: an experiment's worker, a Ray arm or a resumed run (each its own
    process, each its own random hash seed) drew another instance for the same seed (seen: seed 3 differed between
    PYTHONHASHSEED 1 and 2). Now every instance is made under PYTHONHASHSEED=0. Two processes with other hash seeds
    and this one must agree (`test_bad_names_and_params_are_one_clear_line` goes through the helper as well)."""
    import json
    import os
    import subprocess
    import sys

    names = ("isomorphic_strings", "knight_swap", "bf", "leg_counting")  # bf prints while it draws (a reviewer: on
    # the helper's stdout that shifted every later reply by one, so leg_counting came back as another instance)
    code = ("import json, sys; from harness.tasks import get_task; from harness.tasks.reasoning import ReasoningConfig;"
            "t = get_task('reasoning'); out = [t.generate(ReasoningConfig.model_validate({'datasets': [{'name': n}]}), "
            f"3).model_dump(mode='json') for n in {names!r}]; print(json.dumps(out))")
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                      env={**os.environ, "PYTHONHASHSEED": h}, cwd=ROOT).stdout)
            for h in ("1", "2", "0")]  # "0": made in that process itself, no helper
    here = [TASK.generate(ReasoningConfig(datasets=[DatasetEntry(name=n)]), 3).model_dump(mode="json") for n in names]
    assert runs[0] == runs[1] == runs[2] == here


def test_exact_match_or_full_marks_never_partial_credit():
    inst = TASK.generate(ReasoningConfig(datasets=[DatasetEntry(name="leg_counting")]), 7)
    ans = inst.answer
    assert TASK.score(inst, f"Answer: {ans}").valid and TASK.score(inst, f"let me think... answer:  {ans} ").valid
    # reasoning-gym's own scorer pays partial credit for these; here they are simply wrong, reward 0
    for text in (f"the answer is {ans} legs", f"{ans}0", f"Answer: {ans} or so"):
        out = TASK.score(inst, text)
        assert not out.valid and out.failure == "wrong" and out.reward == 0.0, (text, out)
    assert TASK.score(inst, "   ").failure == "no_answer"
    # a dataset with several right answers is verified by its own checker (full marks only)
    cd = TASK.generate(ReasoningConfig(datasets=[DatasetEntry(name="countdown")]), 3)
    nums = [int(x) for x in cd.question.split("numbers:")[1].split(".")[0].split(",")]
    assert TASK.score(cd, f"Answer: {cd.answer}").valid
    target = int(cd.question.split("make ")[1].split(" ")[0])
    other = " + ".join(map(str, nums))  # another expression: right exactly when it makes the target
    assert other != cd.answer and TASK.score(cd, f"Answer: {other}").valid == (sum(nums) == target)
    assert final_answer("x\nAnswer: `42`") == "42"
    # how chat models write it (an outside review, seventy-ninth session: each was "wrong")
    for text in (f"Answer: {ans}.", f"**Answer:** {ans}", f"**Answer: {ans}**", f"Answer: **{ans}**"):
        assert TASK.score(inst, text).valid, text


@pytest.mark.parametrize("name", ["graph_color", "propositional_logic", "rush_hour"])
def test_a_dataset_without_a_reference_answer_is_judged_by_its_checker_alone(name):
    """These datasets give no reference answer (many are right; their checker decides). The answer was stored as the
    text "None", so "Answer: None" scored valid and was the demonstration (an outside review, seventy-ninth
    session). Would catch either."""
    from harness.policy_glue import sft_pairs
    from harness.seeds import seeds

    cfg = ReasoningConfig(datasets=[DatasetEntry(name=name)])
    inst = TASK.generate(cfg, 3)
    assert not inst.has_reference and inst.answer == "" and TASK.expert(inst, "chat") == ""
    assert not TASK.score(inst, "Answer: None").valid
    with pytest.raises(ValueError, match="has a demonstration"):
        sft_pairs(TASK, cfg, seeds("train", 3), "chat")


def test_bad_names_and_params_are_one_clear_line():
    with pytest.raises(ValidationError, match="unknown reasoning-gym dataset 'leg_countin'"):
        DatasetEntry(name="leg_countin")
    with pytest.raises(ValidationError, match="unique names"):
        ReasoningConfig(datasets=[DatasetEntry(name="gcd"), DatasetEntry(name="gcd")])
    bad = ReasoningConfig(datasets=[DatasetEntry(name="leg_counting", params={"no_such_param": 3})])
    with pytest.raises(ValueError, match="leg_counting.*no_such_param.*env.datasets.leg_counting.params"):
        TASK.generate(bad, 1)
    from harness.tasks.knobs import read

    assert read(TASK.default_config(), "env.datasets.leg_counting.data_ratio", TASK.spec.entry_key) == 1.0


# --- hostile answers: a verifier that executes the answer runs it in the sandbox runner, one child per answer -------

HOSTILE = "Answer: __import__('os').system('id > pwned.txt')"  # the payload (it wrote uid=0(root) on the host)


def _one(name: str, seed: int = 5):
    return TASK.generate(ReasoningConfig(datasets=[DatasetEntry(name=name)]), seed)


@pytest.mark.parametrize("name", ["string_insertion", "polynomial_multiplication"])  # eval / sympy.parse_expr
def test_an_answer_the_verifier_executes_writes_nothing_on_the_host(name, tmp_path, monkeypatch):
    """Catches a verifier called in the training process: the payload would create pwned.txt / abs.txt here."""
    monkeypatch.chdir(tmp_path)
    inst = _one(name)
    mark = tmp_path / "abs.txt"
    pairs = [(inst, HOSTILE), (inst, f"Answer: open({str(mark)!r}, 'w').write('x')"), (inst, f"Answer: {inst.answer}")]
    assert [o.valid for o in score_all(TASK, pairs)] == [False, False, True]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_answer_cannot_patch_the_verifier_for_later_answers():
    """Catches verifiers sharing one process across answers: the patch would make every later wrong answer right."""
    inst = _one("string_insertion")
    patch = ("Answer: setattr(__import__('reasoning_gym').algorithmic.string_insertion.StringInsertionDataset, "
             "'score_answer', lambda *a: 1.0) or 'x'")
    outs = score_all(TASK, [(inst, patch), (inst, "Answer: wrong-after-the-patch")])
    assert [o.valid for o in outs] == [False, False], outs
    assert not TASK.score(inst, "Answer: wrong-in-a-later-batch").valid
    assert TASK.score(inst, f"Answer: {inst.answer}").valid


def test_an_answer_that_attacks_its_verifier_job_costs_only_itself():
    """Catches one answer deciding its batch-mates' verdicts: it forges a result on every descriptor of the job's
    parent (/proc/<ppid>/fd) and kills it; the right answer that needs the verifier stays right, the wrong one wrong."""
    cd = _one("countdown", 3)
    alt = f"Answer: ({cd.answer})"  # right, but not an exact match: only countdown's own verifier can say so
    forge = ("Answer: [[__import__('os').write(__import__('os').open(f'/proc/{__import__(\"os\").getppid()}/fd/{n}', 1),"
             " b'{\"status\": \"ok\", \"error\": null, \"value\": [true, true, true, true]}') for n in range(3, 40)"
             " if __import__('os').path.exists(f'/proc/{__import__(\"os\").getppid()}/fd/{n}')],"
             " __import__('os').kill(__import__('os').getppid(), 9)]")
    outs = score_all(TASK, [(cd, forge), (cd, alt), (cd, "Answer: 1 + 1"), (cd, HOSTILE)])
    assert [o.valid for o in outs] == [False, True, False, False], outs


def test_a_batch_is_one_verifier_job_and_exact_matches_need_none(monkeypatch):
    """Catches a job per answer (training would pay a reasoning-gym import per answer), a chunk that silently falls
    back to one job per answer (the job could not make itself non-dumpable), lost caching, and base-scorer datasets
    sent to the runner for nothing."""
    from harness.tasks import reasoning
    from sandbox import runner

    calls = []
    real = runner.run_many
    monkeypatch.setattr(runner, "run_many", lambda jobs, *a, **k: calls.append(len(jobs)) or real(jobs, *a, **k))
    reasoning._CACHE.clear()
    cd = _one("countdown", 3)
    pairs = [(cd, f"Answer: ({cd.answer})"), (cd, "Answer: 1 + 1"), (cd, f"Answer: {cd.answer}"),
             (cd, "Answer: 2 + 2"), (cd, "Answer: 1 + 1")]
    assert [o.valid for o in score_all(TASK, pairs)] == [True, False, True, False, False]
    assert calls == [1]  # one job for the three distinct answers exact match could not decide
    assert [o.valid for o in score_all(TASK, pairs)] == [True, False, True, False, False] and calls == [1]
    leg = _one("leg_counting")
    assert not TASK.score(leg, "Answer: 99999").valid and calls == [1]


def test_a_verifier_that_cannot_start_is_one_clear_error(monkeypatch, tmp_path):
    """Catches a sandbox that cannot import reasoning-gym silently scoring every answer that needs a verifier as
    wrong: its setup failure (before any answer runs) is one line naming it."""
    from types import SimpleNamespace

    from harness.tasks import reasoning

    cd = _one("countdown", 3)
    (tmp_path / "pkg").mkdir()
    monkeypatch.setattr(reasoning, "_rg", lambda: SimpleNamespace(__file__=str(tmp_path / "pkg" / "__init__.py")))
    reasoning._CACHE.clear()
    with pytest.raises(RuntimeError, match="cannot start in the sandbox: ModuleNotFoundError.*reasoning_gym"):
        TASK.score(cd, f"Answer: ({cd.answer})")


@pytest.mark.parametrize("name,junk", [("game_of_life_halting", ["z", "Answer: maybe", "Answer: x"]),
                                       ("complex_arithmetic", ["nan", "Answer: NaN"])])
def test_a_verifier_that_passes_junk_is_not_trusted_on_that_entry(name, junk):
    """reasoning-gym's game_of_life_halting passed any non-empty answer (`bool(answer) == bool(reference)`) and
    complex_arithmetic passed "nan" (`min(1, exp(-nan))` is 1.0): a policy learnt to answer junk at full marks. An
    entry whose verifier passes a canary is judged by exact match alone (an outside review, eighty-second session).
    Would catch the canaries dropped, or their verdict cached per answer instead of per entry."""
    for seed in range(4):
        inst = _one(name, seed)
        assert TASK.score(inst, TASK.expert(inst, "plain")).valid, seed
        assert not any(TASK.score(inst, j).valid for j in junk), seed


def test_an_instance_with_a_blank_reference_is_drawn_again():
    """`ab` reduces some programs to nothing: a blank reference no answer can score (the expert's "" is "no
    answer"; train seed 56 drew one, as the review found it). Such an entry is drawn again inside `generate`, so
    every caller (not only the instance cache's) gets an answerable instance, the same one each time."""
    cfg = TASK.spec.config_model.model_validate({"datasets": [{"name": "ab"}]})
    inst = TASK.generate(cfg, 56)
    assert inst.seed == 56 and inst.answer.strip() and TASK.score(inst, TASK.expert(inst, "plain")).valid
    assert TASK.generate(cfg, 56) == inst
