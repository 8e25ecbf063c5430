"""Faults of the machine, not of a change: a full disk, a read-only or failing file system.

A candidate whose arm, commit or vet step fails is rejected with the reason, and a rejected change is never proposed
again from that state (ARCHITECTURE.md, invariant 4). That is right when the change broke it (a config that cannot
generate, a size that does not fit), and wrong when the machine did: a run folder that filled up inside a backtest arm
(`SafetensorError ... os error 28`) recorded its candidates as refuted and finished with exit code 0 (BENCHMARKS.md,
fifty-fourth session). So the catch-alls that turn a failure into a verdict ask `machine_fault` first, and a fault of
the machine stops the run as interrupted (`MachineFault`), with nothing decided on it: once space is freed,
`evotrainer resume` re-enters the node and does the work again. Memory is not on the list: a candidate that asks for
more than the machine holds (a larger group, a longer completion) is that candidate's failure.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

FAULT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO}
FAULT_WORDS = ("no space left on device", "os error 28", "disk quota exceeded", "read-only file system",
               "input/output error", "disk is full", "disk i/o error", "attempt to write a readonly database",
               "outofdiskerror",
               # torch.save on a full disk: its stream writer's words, not the OS's (a checkpoint write that ran out of
               # room read as a traceback ending "unexpected pos 730176 vs 730068"; an outside review)
               "unexpected pos", "iostream error", "pytorchstreamwriter")


class MachineFault(RuntimeError):
    """The machine failed the run (a full disk, a read-only or failing file system): nothing is decided on it, the
    run stops interrupted, and a resume after the fix re-enters the interrupted node."""


def machine_fault(exc: BaseException, where: Path | None = None) -> str | None:
    """What in the machine failed, when `exc` (or an exception it was raised from) is a full disk, a read-only or
    failing file system; else None. An OSError's errno is the machine's word for it; the OS's words in an exception's
    text (a safetensors or Ray error carries no errno) count only when the file system at `where` (the run folder)
    bears them out: nearly full or not writable. Without that check a sandboxed program that filled its own small
    scratch (text from inside bubblewrap) would read as the machine, and every resume would fail the same way."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in FAULT_ERRNOS:
            return (e.strerror or str(e)).lower()
        text = str(e).lower()
        for w in FAULT_WORDS:
            if w in text and (where is None or _bears_out(where)):
                return w
        e = e.__cause__ or e.__context__
    return None


def _bears_out(where: Path) -> bool:
    """The file system at `where` is nearly full (under 1 GiB or 2% free) or cannot be written."""
    try:
        use = shutil.disk_usage(where)
    except OSError:
        return True
    return use.free < max(1 << 30, 0.02 * use.total) or not os.access(where, os.W_OK)


def stop_on_machine_fault(exc: BaseException, what: str, where: str) -> None:
    """Raise `MachineFault` (from `exc`) when `exc` is a fault of the machine: `what` failed (an arm, a commit), in
    `where` (the run folder), and nothing may be decided on it."""
    if (why := machine_fault(exc, Path(where))) is not None:
        raise MachineFault(f"{what} failed because the machine did: {why} (in or under {where}); nothing was decided "
                           f"on it. Free space (or fix the file system), then `evotrainer resume {where}` does it "
                           "again") from exc
