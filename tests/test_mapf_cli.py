"""The MAPF parts of the CLI: env sample / env stats (config YAML errors name the field), demo, bench mapf.

    .venv/bin/pytest tests/test_mapf_cli.py -q
"""

from __future__ import annotations

import re

from typer.testing import CliRunner

from harness.cli import app

runner = CliRunner()


def test_env_sample_prints_instances_expert_and_score(tmp_path):
    cfg = tmp_path / "env.yaml"
    cfg.write_text("sizes:\n  - {size: 4, agents: 3, hole_ratio: 0.25, wait_ratio: 1.0}\nmin_distance: 2\n")
    res = runner.invoke(app, ["env", "sample", "--config", str(cfg), "--n", "2", "--style", "chat", "--seed-start", "8"])
    assert res.exit_code == 0, res.output
    assert res.output.count("=== seed") == 2 and "seed 8" in res.output and "seed 9" in res.output
    assert res.output.count("Agent C: start") == 2 and "wait=yes" in res.output
    assert res.output.count("--- valid: True  optimal: True") == 2


def test_env_config_errors_name_the_field(tmp_path):
    typo = tmp_path / "typo.yaml"
    typo.write_text("sizes:\n  - {size: 4, hole_ration: 0.2}\n")
    res = runner.invoke(app, ["env", "sample", "--config", str(typo)])
    assert res.exit_code == 2 and "sizes.0.hole_ration" in res.output and "Extra inputs" in res.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("sizes:\n  - {size: 4, hole_ratio: 0.9}\n")
    res = runner.invoke(app, ["env", "stats", "--config", str(bad)])
    assert res.exit_code == 2 and "hole_ratio must be in 0.0..0.6" in res.output
    res = runner.invoke(app, ["env", "sample", "--config", str(tmp_path / "missing.yaml")])
    assert res.exit_code == 2 and "does not exist" in res.output
    res = runner.invoke(app, ["env", "sample", "--task", "chess"])
    assert res.exit_code == 2 and "unknown task" in res.output


def test_env_stats_prints_the_distribution():
    res = runner.invoke(app, ["env", "stats", "--n", "24"])
    assert res.exit_code == 0, res.output
    for key in ("n: 24", "needs_wait:", "makespan_hist:", "agents: {'2': 24}", "sizes.3:"):
        assert key in res.output


def test_demo_prints_valid_and_optimal():
    res = runner.invoke(app, ["demo", "--n", "3"])
    assert res.exit_code == 0, res.output
    assert "instances: 3" in res.output and "valid: 1.000" in res.output and "optimal: 1.000" in res.output


def test_bench_mapf_prints_grepable_lines():
    res = runner.invoke(app, ["bench", "mapf", "--plans", "40", "--reference-plans", "20", "--cbs", "3", "--generator-n", "16"])
    assert res.exit_code == 0, res.output
    for key in ("agent_steps_per_s", "speedup_vs_reference", "cbs_median_ms_hardest", "generator_instances_per_s_demo"):
        assert re.search(rf"^{key}: [0-9.]+$", res.output, re.MULTILINE), key
    assert "validator_agreement: 1.0" in res.output


def test_bench_ladder_rejects_option_mixes_before_any_work():
    """Each bad mix names the option and the fix, and exits before building a model (seconds, not minutes)."""
    for args, says in [(["--learner", "bogus"], "choose grpo (the rung) or sft"),
                       (["--learner", "sft", "--rungs", "1"], "add 3 to --rungs or drop --learner"),
                       (["--blind-share", "0.5"], "add --warm noisy or drop --blind-share"),
                       (["--rungs", "3", "--recipe", "replya=0.5"], "did you mean 'replay'?"),
                       (["--rungs", "3", "--recipe", "replay"], "write KEY=VALUE"),
                       (["--rungs", "3", "--recipe", "replay=0.5", "--recipe", "drop_dead_groups=false"],
                        "needs drop_dead_groups: true"),
                       (["--rungs", "3", "--recipe", "steps=5"], "use --max-steps"),
                       (["--rungs", "1", "--recipe", "replay=0.5"], "use it with --rungs 2 or 3"),
                       (["--rungs", "1,2", "--curve-every", "60"], "add 3 to --rungs or drop --curve-every"),
                       (["--rungs", "3", "--recipe", "seed=3"], "--seed for a replicate"),
                       (["--rungs", "1", "--seed", "1"], "add 2 or 3 to --rungs or drop --seed"),
                       (["--rungs", "1", "--no-anneal"], "add 3 to --rungs or drop them"),
                       (["--rungs", "1,2", "--sft-steps", "300"], "add 3 to --rungs or drop them")]:
        res = runner.invoke(app, ["bench", "ladder", *args])
        assert res.exit_code != 0 and says in res.output, (args, res.output)
    from harness.cli import _rung3_recipe

    assert _rung3_recipe(["replay=0.5", "oversample= 2", "temperature=1"]) == {
        "replay": 0.5, "oversample": 2, "temperature": 1}  # values typed as YAML reads them


def test_bench_grpo_refuses_a_checkpoint_or_config_it_cannot_use(tmp_path):
    """A folder that holds no saved policy, or a run config with a typo, is one line naming the option, before any
    model is built."""
    res = runner.invoke(app, ["bench", "grpo", "--checkpoint", str(tmp_path)])
    assert res.exit_code != 0 and "--checkpoint" in res.output and "not a saved policy" in res.output, res.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: math\nrecipe: {learning_rat: 1.0e-4}\n")
    res = runner.invoke(app, ["bench", "grpo", "--config", str(bad)])
    assert res.exit_code != 0 and "--config" in res.output and "learning_rat" in res.output, res.output


def test_bench_grpo_times_a_given_checkpoint_on_a_given_configs_problems(tmp_path):
    """`--checkpoint` and `--config`: a saved tiny math policy timed on `examples/math_quick.yaml`'s problems, both
    paths, one step each: the grep-able lines come out and grpo.json names the checkpoint and the task. Would catch
    the options being ignored (MAPF boards, the bench's own warm start) or a roofline shaped by the preset."""
    import json

    from harness.tasks import get_task
    from policies.model import build_model, save_policy

    spec = get_task("math").spec
    model, tok = build_model("tiny", spec.alphabet, words=list(spec.words), seed=0)
    save_policy(model, tok, tmp_path / "ckpt")
    res = runner.invoke(app, ["bench", "grpo", "--checkpoint", str(tmp_path / "ckpt"), "--config",
                              "examples/math_quick.yaml", "--steps", "1", "--repeats", "1", "--threads", "1",
                              "--pipeline", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    for key in ("reference_s_per_step", "fast_s_per_step", "speedup_vs_reference", "roofline_fp32_gflops",
                "pipelined_s_per_step", "pipelined_vs_fast", "pipelined_speedup_vs_reference"):
        assert re.search(rf"^{key}: [0-9.]+$", res.output, re.MULTILINE), key
    # the timed step after the warm-up one trained on rollouts generated while the warm-up step trained
    assert re.search(r"^pipelined_step_share: 1$", res.output, re.MULTILINE), res.output
    assert "pipelined_generation_gflops" not in res.output  # its generation seconds are a wait, not its work
    assert "task: math (examples/math_quick.yaml" in res.output
    out = json.loads((tmp_path / "out" / "grpo.json").read_text())
    assert out["task"] == "math" and out["checkpoint"] == str(tmp_path / "ckpt") and out["preset"] is None
    assert not (tmp_path / "out" / "warmstart-1500-300").exists()  # the bench's own warm start was not trained


def test_bench_ladder_noisy_warm_start_reaches_rung3_with_the_teachers_size_or_the_given_one(tmp_path, monkeypatch):
    """`--warm noisy` hands rung 3 the noisy teacher's demonstrations and SFT steps, and an explicit `--sft-steps` or
    `--sft-examples` wins over the teacher's. Caught: `--warm noisy` crashed with "got multiple values for keyword
    argument 'sft_steps'" once `--sft-steps` was passed through (every documented rung-3 command of BENCHMARKS.md)."""
    from harness.benchmarks import ladder

    seen: list[dict] = []
    monkeypatch.setattr(ladder, "rung3", lambda out, **kw: seen.append(kw) or {})
    for extra in ([], ["--sft-steps", "300"], ["--sft-examples", "500", "--blind-share", "0.4"]):
        res = runner.invoke(app, ["bench", "ladder", "--rungs", "3", "--warm", "noisy", "--out", str(tmp_path),
                                  "--threads", "1", *extra])
        assert res.exit_code == 0, res.output
    assert [(k["sft_examples"], k["sft_steps"], k["blind_share"]) for k in seen] == [
        (8000, 2400, 0.6), (8000, 300, 0.6), (500, 2400, 0.4)]
    res = runner.invoke(app, ["bench", "ladder", "--rungs", "3", "--out", str(tmp_path), "--threads", "1"])
    assert res.exit_code == 0 and not {"blind_share", "sft_steps", "sft_examples"} & set(seen[-1]), seen[-1]
    res = runner.invoke(app, ["bench", "ladder", "--rungs", "3", "--out", str(tmp_path), "--threads", "two"])
    assert res.exit_code == 2 and "--threads 'two': a number of threads (1 or more) or auto" in res.output
