"""The held-out reading cache: a checkpoint scored once on a test set is not scored again.

    from harness.evalcache import key_of, lookup, store
    key = key_of(ckpt, task="mapf", style="trace", suite=run.config.eval.name, seeds=[...], max_new_tokens=48,
                 backend="transformers")
    rep, per = lookup(key) or (None, None)     # an EvalReport (no rollouts) and the per-instance valid
    store(key, rep, per)

A greedy reading is a function of the weights, the test set, the completion budget, the prompt style, the rollout
engine and the code that decodes and scores, and every one of those is in the key: the checkpoint's bytes (not its
path), the test set's name and seeds, the code version of `harness.warmstart.code_version` (policy layer, tasks, glue,
library versions) and the device (a GPU's sums land differently from a CPU's). The CPU thread count is not: a greedy
reading at another count can differ on an instance whose two likeliest tokens tie within rounding, and a reused
reading is one such reading, the same for every arm that starts from those weights. So the same weights read twice are
read once: every arm of an experiment starts from the shared warm start and its stage-0 reading (a pass over 1,000
scenario instances per arm), and a keep-training stage whose anchor did not move reads that same anchor again.

Location: `$EVOTRAINER_HOME/evalcache/<key>.json` (beside the warm-start cache); `evotrainer cache clear` clears it
too; `EVOTRAINER_EVAL_CACHE=0` turns it off. A checkpoint larger than `MAX_HASH_BYTES` is not keyed (hashing it would
cost what a reading saves on a small model, and a user's large model rarely reads the same weights twice).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

MAX_HASH_BYTES = 2 << 30
SKIP = frozenset({"warmstart.json", "DONE"})  # the warm-start cache's own files beside a checkpoint's
VOLATILE = frozenset({"is_local", "local_files_only", "name_or_path", "_name_or_path", "_commit_hash"})


def cache_root() -> Path:
    from skills.library import home

    return home() / "evalcache"


def enabled() -> bool:
    from policies import env_switch

    return env_switch("EVOTRAINER_EVAL_CACHE")


def weights_digest(ckpt: str | Path) -> str | None:
    """A hash of the checkpoint folder's files (names and bytes, not their paths or times); None when it is not a
    folder or is larger than MAX_HASH_BYTES."""
    d = Path(ckpt)
    if not d.is_dir():
        return None
    files = sorted((p for p in d.iterdir() if p.is_file() and p.name not in SKIP), key=lambda p: p.name)
    if not files or sum(p.stat().st_size for p in files) > MAX_HASH_BYTES:
        return None
    h = hashlib.blake2b(digest_size=20)
    for p in files:
        h.update(p.name.encode() + b"\0")
        h.update(_json_digest(p) if p.suffix == ".json" else _file_digest(p))
    return h.hexdigest()


def _file_digest(p: Path) -> bytes:
    with p.open("rb") as f:
        return hashlib.file_digest(f, "blake2b").digest()


def _json_digest(p: Path) -> bytes:
    """A JSON file's content without the keys transformers writes about where it was loaded from (a checkpoint loaded
    and saved again gains `is_local` / `local_files_only` in tokenizer_config.json: the same tokenizer)."""
    try:
        doc = json.loads(p.read_text())
    except (ValueError, UnicodeDecodeError):
        return _file_digest(p)
    if isinstance(doc, dict):
        doc = {k: v for k, v in doc.items() if k not in VOLATILE}
    return hashlib.blake2b(json.dumps(doc, sort_keys=True).encode()).digest()


def key_of(ckpt: str | Path, **reading: Any) -> str | None:
    """The cache key of `ckpt` read under `reading` (test set, budget, style, engine: whatever shapes the result), or
    None when the cache is off or the checkpoint is not keyed."""
    if not enabled():
        return None
    digest = weights_digest(ckpt)
    if digest is None:
        return None
    import torch

    from harness.sources import READING_CODE, source_digest
    from harness.warmstart import code_version

    blob = json.dumps({"weights": digest, "reading": reading, "code": code_version(),
                       "scoring": source_digest(READING_CODE),  # how a reading decodes and scores (sandbox, too)
                       "isolation": os.environ.get("EVOTRAINER_CODE_ISOLATION"),  # bubblewrap or a plain process
                       "device": "cuda" if torch.cuda.is_available() else "cpu"}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def lookup(key: str | None):
    """(EvalReport without rollouts, per-instance valid) stored under `key`, or None (no key, none stored, or an entry
    this code cannot read: it is read again)."""
    if key is None:
        return None
    path = cache_root() / f"{key}.json"
    try:
        doc = json.loads(path.read_text())
        from harness.policy_glue import EvalReport

        return EvalReport.model_validate(doc["report"]), [float(v) for v in doc["per_instance"]]
    except Exception:  # noqa: BLE001  none stored, or a torn or older entry: scored again and overwritten
        return None


def store(key: str | None, report, per_instance: list[float], meta: dict[str, Any] | None = None) -> Path | None:
    """Store a reading (atomically: a half-written entry is never read). Returns the entry's path, or None when it
    cannot be written (a full disk, a read-only home): the cache only saves a later reading, so a run goes on."""
    if key is None:
        return None
    root = cache_root()
    final = root / f"{key}.json"
    tmp = root / f".{key}.{os.getpid()}.tmp"
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"report": report.model_dump(mode="json", exclude={"rollouts"}),
                                   "per_instance": per_instance, "meta": meta or {}}))
        os.replace(tmp, final)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        return None
    return final


def entries() -> list[Path]:
    """The stored readings (a half-written one, `.<key>.<pid>.tmp`, is not one)."""
    root = cache_root()
    return sorted(root.glob("*.json")) if root.is_dir() else []


def clear() -> tuple[Path, int]:
    """Delete every cached reading (and any half-written one); returns (the cache folder, readings removed)."""
    root, n = cache_root(), len(entries())
    for p in root.glob("*") if root.is_dir() else []:
        p.unlink(missing_ok=True)
    return root, n
