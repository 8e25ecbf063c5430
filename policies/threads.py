"""How many torch CPU threads make a small model's GRPO step fastest on this machine, measured.

    shape = StepShape(prompts=8, rows=64, loss_rows=64, prompt_len=48, completion_len=24)
    seconds = time_step(model, [1, 2], shape)            # {1: 0.21, 2: 0.33}: per probe step
    n = min(seconds, key=seconds.get)

Why measure: for the project's small models the answer depends on the host. On the Intel host of earlier sessions two
threads were faster; on an AMD host one thread was about twice as fast as two for the tiny preset (BENCHMARKS.md,
"Two arms side by side on one thread each"), because per-op threading overhead exceeds the work of a 1M-parameter
matmul.

Why the probe is shaped like the step (`time_step`): a GRPO step is mostly decoding, a few dozen single-token steps
of the compact loop over the whole batch, then one loss forward and backward over the trained rows with each prompt
computed once (`policies.train.shared_prompt_logps`). The probe before (`time_threads`: a forward and backward over a
64 x 64 batch, then 8 single-token forwards of the model's own) was training-heavy: on the Intel host of the
thirty-third and thirty-seventh sessions it chose 2 threads (333 against 494 ms; 400 against 538 ms) where the
demo's real steps ran 785 ms on 2 threads against 474 on 1, and rung 3's were 2.2x slower on 2. `time_step` runs the
step's own code at the run's shapes: the prefill of `prompts` random prompts, `completion_len` compact decode steps
over `rows` rows with the loop's own sampler, and the shared-prompt loss forward and backward over `loss_rows` rows
(the model's own forward where the compact paths do not apply).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import NamedTuple


class StepShape(NamedTuple):
    """What one GRPO step computes, for `time_step`: `rows` completions of `completion_len` tokens decoded from
    `prompts` distinct prompts of `prompt_len` tokens (rows / prompts samples each), then the loss over `loss_rows` of
    them (the trained groups: batch_size; with oversampling more rows are decoded than trained)."""

    prompts: int
    rows: int
    loss_rows: int
    prompt_len: int
    completion_len: int

    def key(self) -> str:
        return (f"step:{self.prompts}x{self.rows // max(1, self.prompts)}:loss{self.loss_rows}:p{self.prompt_len}"
                f":c{self.completion_len}")


def time_step(model, options: Sequence[int], shape: StepShape, reps: int = 3) -> dict[int, float]:
    """Median seconds of one step-shaped probe (`StepShape`) at each thread count in `options`, after one warm-up
    probe per count. Random weights are fine: the work is the shapes'. Leaves the model's gradients cleared, its
    train/eval mode and torch's thread count as it found them."""
    import torch
    from transformers import DynamicCache

    from policies.model import cache_kw
    from policies.rollout import CompactLlama, _sample, compact_supported
    from policies.train import shared_prompt_logps, shared_prompt_supported

    was, training = torch.get_num_threads(), model.training
    vocab = int(getattr(model.config, "vocab_size", 64))
    n = max(1, shape.rows // max(1, shape.prompts))
    p, c = max(1, shape.prompt_len), max(1, shape.completion_len)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, vocab, (shape.prompts, p), generator=gen)
    loss_groups = max(1, shape.loss_rows // n)
    loss_prompts = prompts[torch.arange(loss_groups) % shape.prompts].repeat_interleave(n, dim=0)
    completions = torch.randint(0, vocab, (loss_prompts.shape[0], c), generator=gen)
    compact, shared = compact_supported(model), shared_prompt_supported(model)

    def decode() -> None:
        attn = torch.ones_like(prompts)
        cache = DynamicCache(config=model.config)
        logits = model(input_ids=prompts, attention_mask=attn, **cache_kw(model, cache), use_cache=True,
                       logits_to_keep=1).logits[:, -1].repeat_interleave(n, dim=0)
        pos = torch.full((logits.shape[0],), p - 1)
        fast = CompactLlama(model, cache, attn, n, c) if compact else None
        if fast is None:
            cache.batch_repeat_interleave(n)
            attn = attn.repeat_interleave(n, dim=0)
        for _ in range(c):
            nxt, _ = _sample(logits, 1.0, 1.0, gen)
            pos = pos + 1
            if fast is not None:
                logits = fast.step(nxt, pos)
            else:
                attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=1)
                logits = model(input_ids=nxt[:, None], attention_mask=attn, position_ids=pos[:, None],
                               **cache_kw(model, cache), use_cache=True).logits[:, -1]

    def loss() -> None:
        if shared:
            logps, _ = shared_prompt_logps(model, loss_prompts, torch.ones_like(loss_prompts), completions,
                                           torch.ones_like(completions))
        else:
            ids = torch.cat([loss_prompts, completions], dim=1)
            logits = model(input_ids=ids).logits[:, p - 1:-1].float()
            logps = logits.log_softmax(-1).gather(-1, completions[..., None])
        logps.sum().backward()
        model.zero_grad(set_to_none=True)

    def probe() -> float:
        t0 = time.perf_counter()
        model.eval()
        with torch.inference_mode():
            decode()
        model.train()
        loss()
        return time.perf_counter() - t0

    out: dict[int, float] = {}
    try:
        for k in options:
            torch.set_num_threads(int(k))
            probe()  # warm-up: allocator, kernels, thread pool
            times = sorted(probe() for _ in range(reps))
            out[int(k)] = times[len(times) // 2]
    finally:
        torch.set_num_threads(was)
        model.train(training)
    return out
