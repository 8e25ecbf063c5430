"""How many torch CPU threads make a small model fastest on this machine, measured.

    seconds = time_threads(model, options=[1, 2])       # {1: 0.041, 2: 0.083}: per forward+backward (+ decode proxy)
    n = min(seconds, key=seconds.get)

Why measure: for the project's small models the answer depends on the host. On the Intel host of earlier sessions two
threads were faster; on this AMD host one thread is about twice as fast as two for the tiny preset (BENCHMARKS.md,
"Two arms side by side on one thread each"), because per-op threading overhead exceeds the work of a 1M-parameter
matmul. The probe is what a GRPO step does, at the step's shapes: a forward+backward over a batch of sequences and a
run of single-token forwards over the same batch (the decoding loop's shape). About a second per probe for the tiny
preset on this 2-core host, four probes per option: 10-20 seconds, once per host and model shape.
"""

from __future__ import annotations

import time
from collections.abc import Sequence


def time_threads(model, options: Sequence[int], batch: int = 64, seq: int = 64, decode_steps: int = 8,
                 reps: int = 3) -> dict[int, float]:
    """Median seconds of one probe (forward+backward on `batch` x `seq` tokens, then `decode_steps` single-token
    forwards over `batch` rows) at each thread count in `options`. Leaves the model's gradients cleared and torch
    at the thread count it found."""
    import torch

    was = torch.get_num_threads()
    vocab = int(getattr(model.config, "vocab_size", 64))
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (batch, seq), generator=gen)
    step = torch.randint(0, vocab, (batch, 1), generator=gen)
    training = model.training

    def probe() -> float:
        t0 = time.perf_counter()
        model.train()
        out = model(input_ids=x)
        out.logits.float().mean().backward()
        model.zero_grad(set_to_none=True)
        model.eval()
        with torch.no_grad():
            for _ in range(decode_steps):
                model(input_ids=step)
        return time.perf_counter() - t0

    out: dict[int, float] = {}
    try:
        for n in options:
            torch.set_num_threads(int(n))
            probe()  # warm-up: allocator, kernels, thread pool
            times = sorted(probe() for _ in range(reps))
            out[int(n)] = times[len(times) // 2]
    finally:
        torch.set_num_threads(was)
        model.train(training)
    return out
