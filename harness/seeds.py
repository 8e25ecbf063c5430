"""Four disjoint seed splits: train / probe / backtest / test, disjoint by construction.

Seed `i` of split `s` is `i * 4 + SPLITS.index(s)`, so a seed's split is `seed % 4` and no two splits ever share a seed.
Training draws only from `train`; diagnosis rolls out on `probe`; each backtest decision draws FRESH `backtest` seeds
(a cursor that only moves forward, persisted by the run store); `test` is for final reports and benchmark suites.
A run's cursors start at its seed's stretch (`harness.run.seed_stretch`), so runs that differ only in seed draw
different train, probe and backtest instances; the test suites are the same for every seed.
"""

from __future__ import annotations

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
