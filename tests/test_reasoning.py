"""The reasoning family: any reasoning-gym dataset as a task. Generation is reasoning-gym's (offline), scoring is exact
match or the dataset's own verifier at full marks, never its partial credit. The tiny loop on it is in
tests/test_seam.py.

    pytest tests/test_reasoning.py -q
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'evotrainer[math]')")

from harness.tasks import get_task
from harness.tasks.reasoning import DatasetEntry, ReasoningConfig, final_answer

TASK = get_task("reasoning")


def test_mix_generation_is_deterministic_and_weighted():
    cfg = ReasoningConfig(datasets=[DatasetEntry(name="leg_counting", data_ratio=0.9),
                                    DatasetEntry(name="basic_arithmetic", data_ratio=0.1)])
    a = [TASK.generate(cfg, s) for s in range(200)]
    assert a == [TASK.generate(cfg, s) for s in range(200)]
    share = sum(i.dataset == "leg_counting" for i in a) / 200
    assert 0.83 <= share <= 0.96, share
    assert all(TASK.score(i, TASK.expert(i, style)).valid for i in a[:40] for style in TASK.spec.styles)
    assert set(TASK.slices(a[0])) == set(TASK.spec.slice_keys)


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
