"""The policy side: small causal LMs (model.py), batched rollouts (rollout.py), SFT and GRPO stages (train.py).
Never imports `harness/`."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

# Idle OpenMP threads sleep instead of spinning. Set at package import, which precedes every torch import made through
# policies (model, rollout, train): on a shared 2-core machine spinning threads made training steps 10-20x slower.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def cpu_threads(n: int) -> None:
    """Use `n` torch CPU threads. Before torch is first imported, also make idle OpenMP threads sleep instead of spin
    (OMP_WAIT_POLICY=PASSIVE): on a shared 2-core machine spinning threads made a training step 10-20x slower."""
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    torch.set_num_threads(n)


@contextmanager
def thread_count(n: int):
    """`n` torch CPU threads inside (`cpu_threads`), the process's count again after."""
    import torch

    was = torch.get_num_threads()
    cpu_threads(n)
    try:
        yield n
    finally:
        cpu_threads(was)
