"""Checkpoint retention: which of a run's policy checkpoints may be deleted, and deleting them once a stage's decision
is recorded, so a run that goes all night keeps a bounded number of checkpoints on disk.

    from harness.retention import deletable, apply_retention, disk_usage
    deletable(["warmstart", "s1-train", "s1-control", "s1-c1"], decided={1}, incumbent="s1-c1", promoted=["s1-c1"],
              keep_promoted="all", delete_superseded=True, setup_done=True)   # -> ["s1-control", "s1-train"]

What is always kept: the warm start (`warmstart`, the curve's starting point), the incumbent (the checkpoint the next
stage trains from: a resume continues from it), the promoted checkpoints (all, or the last `keep_promoted`), every
checkpoint of a stage whose decision is not recorded yet (a resumed stage re-enters its nodes and reads them), and
anything in `checkpoints/` this module does not recognise. What goes, once the stage's decision is recorded: the
stage's other checkpoints (losing candidate arms, the control arm, the stage's training checkpoint) unless one of them
is the incumbent, older promoted checkpoints beyond `keep_promoted`, earlier incumbents that were never promoted, and
the SFT warm start's resumable checkpoints (`warmstart-progress`) once setup is recorded. The review and the report
read run.db, rollouts/ and the harness repo, never a checkpoint's weights, so nothing they show is lost.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

WARM_START = "warmstart"
_STAGE_CKPT = re.compile(r"^s(\d+)-(.+)$")


def _resume_dir() -> str:
    from harness.warmstart import RESUME_DIR

    return RESUME_DIR


# --- the policy: a pure function --------------------------------------------------------------------------------------


def deletable(names: list[str], *, decided: set[int], incumbent: str, promoted: list[str], keep_promoted: int | str,
              delete_superseded: bool, setup_done: bool, anchor: str | None = None) -> list[str]:
    """The checkpoint folder names among `names` that may be deleted (sorted).

    `decided`: stages whose decision is recorded. `incumbent`: the checkpoint the next stage starts from. `promoted`:
    the promoted checkpoints, oldest first. `keep_promoted`: "all" or how many of the newest promoted ones to keep
    (>= 1: the incumbent is often the newest). `delete_superseded`: delete the other checkpoints of decided stages.
    `setup_done`: the warm start's result is recorded (its resumable SFT checkpoints are no longer needed). `anchor`:
    the run's best confirmed checkpoint when it is not the incumbent (`stage.keep_training`), kept like it."""
    if keep_promoted != "all" and int(keep_promoted) < 1:
        raise ValueError("keep_promoted must be 'all' or at least 1")
    kept_promoted = set(promoted if keep_promoted == "all" else promoted[-int(keep_promoted):])
    out = []
    for name in names:
        if name in (WARM_START, incumbent, anchor) or name in kept_promoted:
            continue
        if name == _resume_dir():
            if setup_done:
                out.append(name)
            continue
        m = _STAGE_CKPT.match(name)
        if m is None or int(m.group(1)) not in decided:
            continue  # unknown, or a stage still in progress: a resume reads it
        if name in promoted or delete_superseded:  # an old promoted one past keep_promoted, or a superseded one
            out.append(name)
    return sorted(out)


# --- applying it to a run ---------------------------------------------------------------------------------------------


def run_checkpoints(run: Any, upto: int) -> dict[str, Any]:
    """What `deletable` needs, read from a run's store: decided stages up to `upto`, the incumbent, promoted ones."""
    decided: dict[int, dict[str, Any]] = {}
    for j in range(1, upto + 1):
        r = run.store.node_result(run.id, j, "decide")
        if r is not None:
            decided[j] = r
    promoted = []
    for j, r in sorted(decided.items()):
        if r.get("winner"):
            arm = run.store.node_result(run.id, j, f"arm:{r['winner']}") or {}
            promoted.append(Path(arm.get("checkpoint") or f"s{j}-{r['winner']}").name)
    incumbent = Path(decided[max(decided)]["next_policy"]).name if decided else WARM_START
    anchor = Path(decided[max(decided)].get("anchor") or incumbent).name if decided else WARM_START
    return {"decided": set(decided), "incumbent": incumbent, "anchor": anchor, "promoted": promoted,
            "setup_done": run.store.node_result(run.id, 0, "setup") is not None}


def apply_retention(run: Any, stage: int) -> list[str]:
    """Delete the checkpoints the run's retention policy lets go, after stage `stage`'s decision is recorded.
    Idempotent (a re-entered node deletes nothing twice). Returns the deleted folder names."""
    cfg = run.config.retention
    root = run.run_dir / "checkpoints"
    if not root.is_dir():
        return []
    names = sorted(p.name for p in root.iterdir() if p.is_dir())
    gone = deletable(names, keep_promoted=cfg.keep_promoted, delete_superseded=cfg.delete_superseded,
                     **run_checkpoints(run, stage))
    freed = 0
    for name in gone:
        freed += folder_bytes(root / name)
        shutil.rmtree(root / name, ignore_errors=True)
    if gone:
        run.event(stage, "remember", "retention", f"deleted {len(gone)} checkpoint(s), {freed / 1e6:.1f} MB: "
                  + ", ".join(gone), key=f"{stage}/retention", deleted=gone, bytes=freed)
    return gone


# --- disk use ---------------------------------------------------------------------------------------------------------


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def weight_bytes(path: Path) -> int:
    """Bytes of the weight files directly in a checkpoint folder (0 where it cannot be read)."""
    try:
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file() and f.suffix in WEIGHT_SUFFIXES)
    except OSError:
        return 0


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) \
        if path.is_dir() else 0


def disk_usage(run_dir: Path) -> dict[str, Any]:
    """Bytes the run's folder holds, and its checkpoints (count and bytes)."""
    root = Path(run_dir) / "checkpoints"
    ckpts = [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
    return {"bytes": folder_bytes(Path(run_dir)), "checkpoints": len(ckpts),
            "checkpoint_bytes": sum(folder_bytes(p) for p in ckpts)}
