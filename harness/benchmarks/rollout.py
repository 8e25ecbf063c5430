"""Rollout throughput of vLLM against transformers' `model.generate` on the same batch (`evotrainer bench rollout`).

The model is built offline from a preset (default `base`, ~86M parameters: nothing is downloaded) and saved, so vLLM
loads the same weights; prompts are MAPF suite boards in the trace style, `n` samples each at temperature 1. Reported:
new tokens per second of each backend on the whole batch (best of `repeats`; vLLM's engine start is timed apart), and
their ratio. vLLM needs a CUDA GPU and `pip install -e '.[gpu]'`; elsewhere `--backends transformers` measures only
the reference.

    evotrainer bench rollout                                   # on a GPU machine
    evotrainer bench rollout --preset tiny --backends transformers --prompts 16 --n 2   # the CPU half, quickly
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any


def run(preset: str = "base", prompts: int = 128, n: int = 8, max_new_tokens: int = 256,
        backends: tuple[str, ...] = ("transformers", "vllm"), repeats: int = 2, suite: str = "paper") -> dict[str, Any]:
    import torch

    from harness.policy_glue import suite_instances
    from harness.tasks import get_task
    from policies.model import build_model, count_parameters, save_policy
    from policies.rollout import SamplingParams, generate, plain_generate, resolve_backend

    if "vllm" in backends:
        resolve_backend("vllm")  # one clear line when vLLM cannot run here
    task = get_task("mapf")
    insts = suite_instances(task, suite, "test")
    texts = [task.prompt(i, "trace") for i in (insts * (prompts // max(1, len(insts)) + 1))[:prompts]]
    model, tok = build_model(preset, task.spec.alphabet, words=list(task.spec.words), seed=0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out: dict[str, Any] = {"preset": preset, "parameters": count_parameters(model), "prompts": len(texts), "n": n,
                           "max_new_tokens": max_new_tokens, "device": device}
    params = SamplingParams(temperature=1.0, n=n, max_new_tokens=max_new_tokens, seed=0,
                            batch_size=len(texts) * n)
    with tempfile.TemporaryDirectory(prefix="evotrainer-bench-rollout-") as d:
        ckpt = save_policy(model, tok, Path(d) / "model")
        if "transformers" in backends:
            m = model.to(device)
            best = max((plain_generate(m, tok, texts, params) for _ in range(repeats)), key=lambda r: r.tokens_per_s)
            out["transformers_tok_s"] = best.tokens_per_s
            out["transformers_new_tokens"] = best.new_tokens
            print(f"transformers generate ({device}): {best.tokens_per_s:,.0f} new tokens/s "
                  f"({best.new_tokens} tokens in {best.seconds:.1f} s)", flush=True)
            model = m.to("cpu")
        if "vllm" in backends:
            vp = params.model_copy(update={"backend": "vllm"})
            t0 = time.perf_counter()
            generate(str(ckpt), tok, texts[:1], vp.model_copy(update={"n": 1, "max_new_tokens": 1}))
            out["vllm_engine_start_s"] = time.perf_counter() - t0
            best = max((generate(str(ckpt), tok, texts, vp) for _ in range(repeats)), key=lambda r: r.tokens_per_s)
            out["vllm_tok_s"] = best.tokens_per_s
            out["vllm_new_tokens"] = best.new_tokens
            print(f"vllm: {best.tokens_per_s:,.0f} new tokens/s ({best.new_tokens} tokens in {best.seconds:.1f} s; "
                  f"engine start {out['vllm_engine_start_s']:.1f} s)", flush=True)
            from policies.rollout import release_vllm_engines

            release_vllm_engines()
    if "transformers_tok_s" in out and "vllm_tok_s" in out:
        out["speedup"] = out["vllm_tok_s"] / max(out["transformers_tok_s"], 1e-9)
        print(f"vllm_speedup_over_generate: {out['speedup']:.2f}   (target >= 5)", flush=True)
    print(f"model: {preset}, {out['parameters'] / 1e6:.1f}M parameters; batch {len(texts)} prompts x {n}", flush=True)
    return out
