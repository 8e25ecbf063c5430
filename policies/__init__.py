"""The policy side: small causal LMs (model.py), batched rollouts (rollout.py), SFT and GRPO stages (train.py).
Never imports `harness/`."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Any

# Idle OpenMP threads sleep instead of spinning. Set at package import, which precedes every torch import made through
# policies (model, rollout, train): on a shared 2-core machine spinning threads made training steps 10-20x slower.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


SWITCH_ON, SWITCH_OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def env_switch(name: str, default: bool = True) -> bool:
    """An on/off environment variable (`default` when unset or empty); ValueError naming it for any other word (a
    cache switch of "maybe" or "OFF" used to read as on)."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in SWITCH_ON or raw in SWITCH_OFF:
        return raw in SWITCH_ON
    raise ValueError(f"{name} must be one of {', '.join(SWITCH_ON + SWITCH_OFF)}, not {os.environ[name]!r}")


CORES_ENV = "EVOTRAINER_CORES"  # the cores this process's work may use, where a scheduler shares the machine


def machine_cores() -> int:
    """The CPUs this process may run on (its affinity), whatever share a scheduler gave it."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def env_count(name: str, what: str, unset: str) -> int | None:
    """A whole number of at least 1 from environment variable `name` (None when unset or empty); ValueError naming the
    variable, `what` it counts and what `unset` means otherwise."""
    return env_number(name, what, unset)


def env_number(name: str, what: str, unset: str, number: type = int, least: float = 1) -> Any:
    """`number(value)` of environment variable `name`, at least `least` (None when unset or empty); ValueError naming
    the variable, `what` it counts and what `unset` means otherwise."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        n = number(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: a {'whole ' if number is int else ''}number of {what}") from None
    if not n >= least:  # NaN too
        raise ValueError(f"{name}={raw!r}: at least {least:g} (unset it for {unset})")
    if n == float("inf"):
        raise ValueError(f"{name}={raw!r}: a finite number of {what} (unset it for {unset})")
    return n


def cores() -> int:
    """The CPUs this process's own work may use: `EVOTRAINER_CORES` where whatever started the process runs several
    jobs side by side and gave this one a share (`harness.experiment`'s workers, Ray arms), else `machine_cores()`."""
    n = env_count(CORES_ENV, "cores", "the machine's cores")
    return n if n is not None else machine_cores()


def spare_cores() -> int:
    """Cores of this process's share that its torch threads leave idle (`cores()` minus torch's thread count): what a
    second loop in the process, such as `policies.train`'s rollout pipeline, may run on without slowing the first."""
    import torch

    return max(0, cores() - torch.get_num_threads())


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
