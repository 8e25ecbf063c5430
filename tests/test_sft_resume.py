"""The SFT warm start checkpoints itself and a killed one resumes: model, optimizer, scheduler, RNG and data position.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/test_sft_resume.py

A kill is simulated by a callback that raises inside the trainer (the process state is then thrown away: the resumed
call builds a fresh model, as a restarted process would). Weights are compared with an uninterrupted run of the same
settings: anything the resume failed to restore (optimizer moments, the learning-rate schedule, the data order)
changes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from policies.model import build_model
from policies.train import STAGING, WALL_FILE, Recipe, latest_resume_checkpoint, train_sft

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ALPHABET = "abcdefgh"
PAIRS = [{"prompt": w, "completion": w[::-1]} for w in ("abc", "bad", "cafe", "deaf", "fade", "head", "bead", "gab")] * 4
RECIPE = Recipe(sft_steps=8, sft_batch_size=8, warmup_ratio=0.25)


class Killed(RuntimeError):
    pass


class KillAt(TrainerCallback):
    """Raise at the end of step `step` (before that step's checkpoint), or, with `in_save`, right after the trainer
    wrote step `step`'s checkpoint into the staging folder, after truncating its weights (a write cut short)."""

    def __init__(self, step: int, in_save: bool = False) -> None:
        self.step, self.in_save = step, in_save

    def on_step_end(self, args, state, control, **kw):
        if not self.in_save and state.global_step == self.step:
            raise Killed(f"killed after step {self.step}")

    def on_save(self, args, state, control, **kw):
        if self.in_save and state.global_step == self.step:
            staged = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            for f in staged.glob("*.safetensors"):
                f.write_bytes(f.read_bytes()[:100])
            raise Killed(f"killed while writing step {self.step}")


def _fresh():
    return build_model("tiny", ALPHABET, seed=3)


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    model, tok = _fresh()
    m = train_sft(model, tok, PAIRS, RECIPE)
    assert m.steps == 8
    return _state(model)


def _same(model, ref) -> bool:
    return all(torch.allclose(v, ref[k], atol=1e-6) for k, v in model.state_dict().items())


def test_a_killed_sft_resumes_from_its_last_checkpoint_and_ends_where_an_unbroken_run_ends(tmp_path, reference):
    """Killed after step 5 with checkpoints every 3 steps: step 3 is on disk; the resumed call trains steps 4..8 only
    (5 losses), reports 8 steps, and its weights equal the uninterrupted run's. Catches a resume that restarts from
    zero (8 losses), or that restores the weights but not the optimizer, scheduler or data position (weights differ)."""
    resume = tmp_path / "resume"
    model, tok = _fresh()
    with pytest.raises(Killed):
        train_sft(model, tok, PAIRS, RECIPE, resume_dir=resume, save_every=3, callbacks=[KillAt(5)])
    assert latest_resume_checkpoint(resume).name == "step-00000003"
    before = json.loads((latest_resume_checkpoint(resume) / WALL_FILE).read_text())["wall_s"]
    assert before > 0
    model, tok = _fresh()  # a restarted process: nothing survives but the disk
    m = train_sft(model, tok, PAIRS, RECIPE, resume_dir=resume, save_every=3)
    assert m.steps == 8 and len(m.loss) == 5 and m.resumed_from == 3  # what the run's `sft_resumed` event reports
    # the ledger's SFT seconds are the whole warm start's: the killed call's part up to its checkpoint included
    # (the last checkpoint holds the seconds up to it: the killed call's and this one's)
    assert json.loads((latest_resume_checkpoint(resume) / WALL_FILE).read_text())["wall_s"] <= m.wall_s + 0.05
    assert _same(model, reference)
    # the trainer also checkpoints its last step; older steps are deleted as newer ones land
    assert [p.name for p in resume.glob("step-*")] == ["step-00000008"]
    # without the checkpoint the same "resume" call trains from scratch: the comparison above can tell the two apart
    partial, tok = _fresh()
    with pytest.raises(Killed):
        train_sft(partial, tok, PAIRS, RECIPE, callbacks=[KillAt(5)])
    assert not _same(partial, reference)


def test_a_kill_during_the_checkpoint_write_leaves_the_previous_checkpoint_usable(tmp_path, reference):
    """The step-6 checkpoint is cut short while being written (weights truncated in the staging folder, then the
    process dies): step 3 stays the last complete checkpoint, the resume ignores (and clears) the broken write and
    ends with the uninterrupted run's step count and weights. Catches a checkpoint written in place, which a kill
    leaves half-written under the name a resume would load."""
    resume = tmp_path / "resume"
    model, tok = _fresh()
    with pytest.raises(Killed):
        train_sft(model, tok, PAIRS, RECIPE, resume_dir=resume, save_every=3, callbacks=[KillAt(6, in_save=True)])
    assert latest_resume_checkpoint(resume).name == "step-00000003"
    assert (resume / STAGING / "checkpoint-6").is_dir()  # the broken write is there, under the staging name
    model, tok = _fresh()
    m = train_sft(model, tok, PAIRS, RECIPE, resume_dir=resume, save_every=3)
    assert m.steps == 8 and len(m.loss) == 5 and _same(model, reference)
    assert not (resume / STAGING / "checkpoint-6").exists()


def test_a_run_killed_in_its_warm_start_continues_from_the_checkpoint_and_says_so(tmp_path, monkeypatch):
    """The run's setup (`harness.arms.warm_start`) finds the SFT's checkpoint a killed process left in
    `checkpoints/warmstart-progress` (step 3 of 8), continues from it, and records an `sft_resumed` event at that step:
    what `evotrainer bench run --sft-steps N` checks after every kill that lands in a warm start. Catches a setup that
    trains the warm start from zero again after a kill (no event; a fresh SFT is not cached for the run either)."""
    from harness.arms import warm_start
    from harness.benchmarks.run import TINY
    from harness.config import parse_config
    from harness.lifecycle import make_judge
    from harness.policy_glue import sft_pairs
    from harness.round0 import harness_models
    from harness.run import JUDGE_FILE, Run
    from harness.store import RunStore
    from harness.tasks import get_task
    from harness.warmstart import RESUME_DIR
    from sandbox.workspace import Workspace

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    task = get_task("mapf")
    cfg = parse_config({**TINY, "warm_start": {"sft_examples": 32, "sft_steps": 8}}, "test")
    run_dir = tmp_path / "runs" / "r"
    store = RunStore.open(run_dir / "run.db")
    store.create_run("r", {})
    ws = Workspace.create(run_dir / "harness", files_override={"env.yaml": task.spec.round0_env})
    (run_dir / JUDGE_FILE).write_text(make_judge(cfg, ws.files("main")).model_dump_json())
    run = Run(run_dir=run_dir, config=cfg, store=store)
    try:
        env, recipe, _ = harness_models(ws.files("main"), task)
        recipe = recipe.model_copy(update={"sft_steps": 8})
        model, tok = build_model("tiny", task.spec.alphabet, words=list(task.spec.words), seed=cfg.seed)
        pairs = sft_pairs(task, env, run.draw_seeds("train", 32, key="warmstart"), run.style)
        with pytest.raises(Killed):  # the process the kill ended: step 3's checkpoint is on disk
            train_sft(model, tok, pairs, recipe, resume_dir=run.path("checkpoints", RESUME_DIR), save_every=3,
                      callbacks=[KillAt(5)])
        path, n = warm_start(run)
        assert n == 32 and (path / "config.json").exists()
        [event] = store.events("r", kind="sft_resumed")
        assert event["data"]["step"] == 3 and "step 3 of 8" in event["message"]
    finally:
        store.close()
