"""Four disjoint seed splits: train / probe / backtest / test, disjoint by construction.

Seed `i` of split `s` is `i * 4 + SPLITS.index(s)`, so a seed's split is `seed % 4` and no two splits ever share a seed.
Training draws only from `train`; diagnosis rolls out on `probe`; each backtest decision draws FRESH `backtest` seeds
(a cursor that only moves forward, persisted by the run store); `test` is for final reports and benchmark suites.
A run's cursors start at its seed's stretch (`harness.run.seed_stretch`), so runs that differ only in seed draw
different train, probe and backtest instances; the test suites are the same for every seed.

Disjoint seeds are not disjoint instances: a generator maps seeds into a finite space of instances, and two seeds of
different splits can draw the same one (before this was enforced, 5% to 63% of the shipped examples' backtest
instances had a training twin, most on their smallest levels: BENCHMARKS.md, fifty-fourth session). So every
family's `generate` keeps its instances apart by content (`held_apart`, or the same `content_split` test inside its
own draw): an instance belongs to the split its prompt hashes to, and a seed whose draw belongs elsewhere draws
again, so no prompt is ever both a training and a held-out one.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar

SPLITS: tuple[str, ...] = ("train", "probe", "backtest", "test")


class SplitError(ValueError):
    pass


def _index(split: str) -> int:
    try:
        return SPLITS.index(split)
    except ValueError:
        raise SplitError(f"unknown seed split {split!r}; choose one of {', '.join(SPLITS)}") from None


def seed_for(split: str, i: int) -> int:
    """The i-th seed (i >= 0) of `split`."""
    if i < 0:
        raise SplitError(f"seed index must be >= 0, got {i}")
    return i * len(SPLITS) + _index(split)


def seeds(split: str, n: int, start: int = 0) -> list[int]:
    """`n` consecutive seeds of `split`, starting at index `start`."""
    return [seed_for(split, i) for i in range(start, start + n)]


def split_of(seed: int) -> str:
    if seed < 0:
        raise SplitError(f"seeds are non-negative, got {seed}")
    return SPLITS[seed % len(SPLITS)]


def check_split(seed_list: list[int], split: str) -> None:
    """Raise if any seed is not from `split` (the held-out hygiene guard used by training and the gate)."""
    bad = [s for s in seed_list if split_of(s) != split]
    if bad:
        raise SplitError(f"{len(bad)} seed(s) not from the {split!r} split, e.g. {bad[:3]}: held-out hygiene violated")


T = TypeVar("T")
APART_TRIES = 64  # draws per seed before a level too small to hold apart is given up on: (3/4)^64 ~ 1e-8 otherwise


def content_split(key: str) -> str:
    """The split an instance belongs to, from its content (its prompt): a stable hash, the same on every machine."""
    return SPLITS[int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") % len(SPLITS)]


def draw_seed(seed: int, attempt: int) -> int:
    """The seed a family's generator draws with on `attempt` for `seed`: the seed itself first (so an instance that
    already belongs to its seed's split is the one it always was), then 32-bit seeds of their own."""
    if attempt == 0:
        return seed
    return int.from_bytes(hashlib.blake2b(f"apart/{seed}/{attempt}".encode(), digest_size=4).digest(), "big")


REPLACE_STRIDE = 1 << 40  # a replacement seed's distance from its seed, in seeds of its split (past the stretch of
# every run seed below about a million; a larger run seed may share a replacement with another run's own draws: the
# same instance twice, never another split's)


def replacement(seed: int, attempt: int) -> int:
    """The seed drawn in place of `seed` on `attempt` (1, 2, ...) when the generator cannot draw `seed` itself
    (`harness.tasks.drawn.draw_replacing`): a seed of the same split, far past the seeds a run draws as its own."""
    if attempt < 1:
        raise SplitError(f"a replacement attempt is >= 1, got {attempt}")
    return seed + len(SPLITS) * REPLACE_STRIDE * attempt


def held_apart(draw: Callable[[int], T], key: Callable[[T], str], seed: int) -> T:
    """The instance of `seed` kept in its seed's split by content: `draw(draw_seed(seed, a))` for a = 0, 1, ... until
    `content_split(key(instance))` is `split_of(seed)`, given back with its own seed (instances are frozen pydantic
    models with a `seed`). `draw` must not pick the level again on each call (a redraw that did weighed each level,
    in each split, by how its instances hash: a level weighed 0.50 read 0.42 on backtest seeds): pick it once from
    the seed and draw within it (`harness.tasks.knobs.one_entry`). A level with too few distinct instances to hold
    apart (a level of one instance) returns its last draw after `APART_TRIES`, with a warning. Every family's
    `generate` goes through it; a family of one's own should too (`harness/tasks/base.py`)."""
    want = split_of(seed)
    inst: Any = None
    for attempt in range(APART_TRIES):
        inst = draw(draw_seed(seed, attempt))
        if content_split(key(inst)) == want:
            return _restamp(inst, seed)
    logging.getLogger(__name__).warning(
        "seed %d (%s): no instance of its level belongs to the %s split in %d draws: a level with this few distinct "
        "instances cannot be held out, so this one may also be drawn by another split (widen the level)", seed, want,
        want, APART_TRIES)
    return _restamp(inst, seed)


def _restamp(inst: Any, seed: int) -> Any:
    """An instance (a frozen pydantic model with a `seed`) with its seed set back to the one asked for."""
    return inst if inst.seed == seed else inst.model_copy(update={"seed": seed})
