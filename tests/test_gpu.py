"""GPU paths: vLLM rollouts inside the loop (probe, arms, held-out report) on checkpoints the loop just wrote, engines
released when their checkpoint is superseded, bf16 GRPO on CUDA. These run where a CUDA GPU (and, for vLLM, the
`evotrainer[gpu]` extra) exists and are skipped with the reason elsewhere; they never fail on a CPU host.
The CPU side of the same paths is tested everywhere: the GPU example config validates, and asking for vLLM where it
cannot run is one line naming the fix before anything trains.

    pytest tests/test_gpu.py -q -rs
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.benchmarks.run import TINY
from harness.config import load_config, parse_config
from policies.rollout import vllm_available

ROOT = Path(__file__).resolve().parents[1]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible here)")
needs_vllm = pytest.mark.skipif(not vllm_available(), reason="needs vllm and a CUDA GPU: pip install -e '.[gpu]' on a "
                                "GPU host (vllm is not installed or no GPU is visible here)")


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))


def test_the_gpu_example_validates_and_says_what_it_needs_on_a_cpu_host(tmp_path):
    cfg = load_config(ROOT / "examples" / "mapf_gpu.yaml")
    assert cfg.policy.preset == "base" and cfg.policy.backend == "vllm"
    from policies.model import PRESETS, build_model

    model, _ = build_model(cfg.policy.preset, "ab")
    n = sum(p.numel() for p in model.parameters())
    assert 50e6 <= n <= 100e6, n  # the 50-100M-parameter model of the GPU example, built offline
    del model
    if vllm_available():
        pytest.skip("vllm and a GPU are here: the example runs instead (test_the_loop_runs_with_vllm_rollouts)")
    p = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(ROOT / "examples" / "mapf_gpu.yaml"),
                        "--runs-dir", str(tmp_path / "runs")], capture_output=True, text=True, timeout=120,
                       check=False)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert "policy.backend" in lines[0] and "pip install 'evotrainer[gpu]'" in lines[0], lines[0]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    assert "base" in PRESETS


@needs_cuda
@pytest.mark.parametrize("precision", ["auto", "fp16"])
def test_bf16_grpo_on_cuda(precision):
    from policies.model import build_model
    from policies.train import Recipe, _device_args, train_grpo

    assert _device_args()["bf16"] == torch.cuda.is_bf16_supported() and not _device_args()["use_cpu"]
    assert _device_args("fp16") == {"use_cpu": False, "bf16": False, "fp16": True}
    model, tok = build_model("tiny", "ab")
    rows = [{"prompt": "ab" * (i % 3 + 1)} for i in range(16)]

    def reward(prompts, completions, **_):  # policies.train.RewardFn: (prompts, completions, **columns)
        return [float(c.count("a")) / max(1, len(c)) for c in completions]

    m = train_grpo(model, tok, rows, reward, Recipe(steps=2, batch_size=8, num_generations=4,
                                                   max_completion_length=8, learning_rate=1e-3,
                                                   precision=precision))
    assert len(m.steps) == 2 and all(s.loss == s.loss for s in m.steps)  # finite (not NaN)
    assert next(model.parameters()).device.type in ("cuda", "cpu")


@needs_vllm
def test_the_loop_runs_with_vllm_rollouts(tmp_path):
    """Two stages with vLLM rollouts for the probe, the arms and the report, on checkpoints the loop wrote; at the
    end, only the final policy's engine may still be alive (every superseded checkpoint's engine was released)."""
    import policies.rollout as R
    from harness.lifecycle import start_run
    from harness.store import RunStore

    cfg = parse_config({**TINY, "name": "gpu", "policy": {"preset": "tiny", "backend": "vllm"},
                        "stage": {**TINY["stage"], "candidates": 1}}, "test")
    run_dir = start_run(cfg, tmp_path / "runs", run_id="vllm")
    store = RunStore.open(run_dir / "run.db")
    try:
        assert store.get_run("vllm")["status"] == "finished"
        stages = store.stages("vllm")
        assert [s["stage"] for s in stages] == [1, 2]
        final = str(Path(stages[-1]["checkpoint"]).resolve())
        assert set(R._VLLM_ENGINES) <= {final}, list(R._VLLM_ENGINES)
        assert (run_dir / "rollouts" / "s1-probe.jsonl.gz").is_file()
        assert store.node_result("vllm", 1, "arm:control") is not None
    finally:
        store.close()
        R.release_vllm_engines()
