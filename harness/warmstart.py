"""The SFT warm-start cache: a run (or a benchmark) whose warm start has the same settings and the same code version as
an earlier one loads that checkpoint instead of retraining it (a second `make demo` spends its time on the loop).

    from harness.warmstart import cache_key, lookup, store, warm_start
    key = cache_key(task="mapf", preset="tiny", style="trace", env=env.model_dump(mode="json"), sft_examples=3000,
                    sft_steps=700, sft_learning_rate=1e-3, sft_batch_size=32, seed=0, seeds=[...])
    hit = lookup(key)            # a checkpoint dir, or None
    store(key, checkpoint_dir, meta)

Location: `$EVOTRAINER_HOME/warmstart/<key>/` (default `~/.evotrainer/warmstart`). Clear it with
`evotrainer cache clear` or `rm -rf ~/.evotrainer/warmstart`; `EVOTRAINER_WARMSTART_CACHE=0` turns it off. Bounded:
past `EVOTRAINER_WARMSTART_CACHE_MB` (default 4 GiB) the least recently used entries are removed when one is stored
(`prune`; never one used within the hour).

The key hashes every setting that changes the trained weights (task, model preset, prompt style, generator config,
the demonstrations' seeds, SFT steps / learning rate / batch size, seed, and where it trains: the GPU or the number of
CPU threads and the instruction set torch's kernels use, `trained_on`) and the code version: the source of the
policy layer and of the task (tokeniser, model presets, trainer, generator, expert), plus the torch, transformers and
trl versions. Editing any of those files makes a new key, so a stale checkpoint is never reused. A checkpoint from a
local model (`policy.checkpoint`) is not cached: its bytes are the user's, not ours to key.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from harness.sources import WARM_START_CODE, source_digest

CODE = WARM_START_CODE


def cache_root() -> Path:
    from skills.library import home

    return home() / "warmstart"


def enabled() -> bool:
    from policies import env_switch

    return env_switch("EVOTRAINER_WARMSTART_CACHE")


def code_version() -> str:
    """Hash of the source files that shape a warm start (`harness.sources.source_digest`: as this process imported
    them), and of the versions of the libraries that train it."""
    import torch
    import transformers

    try:
        from importlib.metadata import version

        trl = version("trl")
    except Exception:  # noqa: BLE001
        trl = "?"
    from harness.tasks import drawn

    h = hashlib.sha256(f"{torch.__version__}|{transformers.__version__}|{trl}".encode())
    h.update(drawn.code_version().encode())  # the packages a family draws and scores with (reasoning-gym, ...)
    h.update(source_digest(CODE).encode())
    return h.hexdigest()[:16]


def trained_on(threads: int) -> str:
    """Where an SFT runs, as far as its weights go: the GPU, or this many CPU threads on this instruction set."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    # the kernels torch picks for this CPU (AVX2, AVX512, ...): another instruction set sums a matrix product in
    # another order, so a cache copied from another host (a shared $EVOTRAINER_HOME) was a different warm start
    return f"cpu x{threads} {torch.backends.cpu.get_cpu_capability()}"


def cache_key(**settings: Any) -> str:
    blob = json.dumps({"settings": settings, "code": code_version()}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def lookup(key: str) -> Path | None:
    """The cached checkpoint dir for `key`, or None (also when the cache is off or the entry is incomplete)."""
    if not enabled():
        return None
    d = cache_root() / key
    if not ((d / "DONE").is_file() and (d / "config.json").is_file()):
        return None
    with contextlib.suppress(OSError):
        os.utime(d / "DONE")  # "last used": what pruning keeps
    return d


MAX_BYTES_DEFAULT = 4 << 30  # the cache's size past which the least recently used entries go (`prune`)
IN_USE_S = 3600.0  # an entry used (stored or loaded) this recently is never pruned: another run may be loading it
MAX_MB_ENV = "EVOTRAINER_WARMSTART_CACHE_MB"


def max_bytes() -> int:
    """The cache's bound: `EVOTRAINER_WARMSTART_CACHE_MB` (megabytes) or MAX_BYTES_DEFAULT."""
    from policies import env_number

    mb = env_number(MAX_MB_ENV, "megabytes (the cache's bound)", f"{MAX_BYTES_DEFAULT >> 20}", float, 0)
    return MAX_BYTES_DEFAULT if mb is None else int(mb * (1 << 20))


def _size(d: Path) -> int:
    """Bytes under `d`; what another process removed while it was walked counts 0 (a concurrent prune, `cache clear`,
    a set-aside: the walk itself raised FileNotFoundError out of `store`, and the run's warm start failed)."""
    total = 0
    with contextlib.suppress(OSError):
        for f in d.rglob("*"):
            with contextlib.suppress(OSError):
                if f.is_file():
                    total += f.stat().st_size
    return total


def prune(keep: Path | None = None, now: float | None = None) -> list[Path]:
    """Remove the least recently used entries (by their `DONE` file's time, touched at each `lookup`) while the cache
    is larger than `max_bytes()`, and, whatever the bound, every folder nothing loads (set aside as not loading,
    `set_aside`, or left without DONE by a writer that died). Never
    `keep` (the entry just stored) nor one used within IN_USE_S. Returns what was removed. Why: every edit of the
    code a warm start depends on makes a new key, and the old entries were never removed (a few MB each for the
    built-in presets, hundreds for a larger one, over months of runs and benches)."""
    import time

    root = cache_root()
    now = time.time() if now is None else now
    dated = []
    for d in (root.iterdir() if root.is_dir() else []):
        if not d.is_dir() or d.name.startswith(".") or (keep is not None and d == keep):
            continue
        with contextlib.suppress(OSError):
            used = (d / "DONE").stat().st_mtime if (d / "DONE").is_file() else d.stat().st_mtime
            # set-aside and incomplete entries first (garbage: nothing loads them), then by last use
            dated.append((".bad-" not in d.name and (d / "DONE").is_file(), used, d))
    total = sum(_size(d) for *_, d in dated) + (_size(keep) if keep is not None and keep.is_dir() else 0)
    gone = []
    for entry, used, d in sorted(dated):
        if total <= max_bytes() and entry:  # garbage goes whatever the bound; an entry only past it
            break
        if now - used <= IN_USE_S:
            continue
        with contextlib.suppress(OSError):  # looked up since it was dated (a run loading it now): it stays
            if (d / "DONE").stat().st_mtime != used:
                continue
        size = _size(d)
        shutil.rmtree(d, ignore_errors=True)
        if not d.exists():
            total -= size
            gone.append(d)
    return gone


def _sweep(root: Path) -> None:
    """Remove the half-made copies of writers that died (`.<key>.<pid>.tmp` whose pid is gone): a kill -9 mid-copy
    left them for good, a checkpoint's size each (gigabytes for a real model). A live writer's copy is left alone; one
    untouched for `STALE_TMP_S` is a dead writer's whose pid another process has since taken (a copy takes minutes)."""
    from harness.store import _pid_alive

    for d in root.glob(".*.tmp"):
        pid = d.name.rsplit(".", 2)[-2] if d.name.count(".") >= 3 else ""
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            stale = time.time() - d.stat().st_mtime > STALE_TMP_S
        except OSError:
            continue
        if stale or not _pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


STALE_TMP_S = 24 * 3600


class CacheWriteError(OSError):
    """The warm start could not be cached (a full disk, a read-only home): the run goes on without the cache."""


def store(key: str, checkpoint: Path, meta: dict[str, Any]) -> Path | None:
    """Copy `checkpoint` into the cache (atomically: a half-written entry is never found). Returns the entry (None
    with the cache off); `CacheWriteError` naming the cause when it cannot be written, its half-made copy removed."""
    if not enabled():
        return None
    root = cache_root()
    try:
        max_bytes()
    except ValueError as exc:  # a typo in the bound: nothing cached, the run goes on and its warning names it
        raise CacheWriteError(f"the warm start was not cached: {exc}") from None
    final = root / key
    tmp = root / f".{key}.{os.getpid()}.tmp"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if (final / "DONE").is_file():
            return final
        shutil.rmtree(tmp, ignore_errors=True)
        _sweep(root)
        shutil.copytree(checkpoint, tmp)
        os.utime(tmp)  # copytree stamps the copy with the source's date: a day-old source read as a stale copy
        (tmp / "warmstart.json").write_text(json.dumps(meta, indent=1, default=str))
        (tmp / "DONE").write_text("ok\n")
        # another process may have stored the same key while this one copied, and a third may be loading it: an
        # entry there is never removed here (it was, under the loader, which then retrained; a check before removing
        # left a window): the rename fails onto a folder with files, and a complete one stands; one without DONE is
        # a writer's that died, which `prune` removes once it is an hour old
        try:
            os.replace(tmp, final)
        except OSError:
            if not (final / "DONE").is_file():
                raise
        if tmp.exists():  # the other writer's entry stands: this copy goes
            shutil.rmtree(tmp, ignore_errors=True)
    except (OSError, shutil.Error) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0][:200]
        raise CacheWriteError(f"the warm start could not be cached in {root}: {why}") from None
    with contextlib.suppress(OSError):  # pruning only saves disk: it never costs the run its warm start
        prune(keep=final)
    return final


def set_aside(entry: Path, why: str) -> Path | None:
    """Move a cached entry that does not load out of the way (`<key>.bad-<pid>`), so the next run retrains instead of
    failing on it again; returns where it went (None when it could not be moved: it is then removed if possible)."""
    dest = entry.with_name(f"{entry.name}.bad-{os.getpid()}")
    try:
        os.replace(entry, dest)
        (dest / "DONE").unlink(missing_ok=True)  # no longer an entry: `cache show` and lookups pass it by
        (dest / "WHY").write_text(why + "\n")
        return dest
    except OSError:
        shutil.rmtree(entry, ignore_errors=True)
        return None


def clear() -> tuple[Path, int]:
    """Delete every cached warm start; returns (the cache folder, entries removed)."""
    root = cache_root()
    n = sum(1 for p in root.iterdir() if p.is_dir()) if root.is_dir() else 0
    shutil.rmtree(root, ignore_errors=True)
    return root, n


RESUME_DIR = "warmstart-progress"  # under a run's checkpoints/: the SFT's own resumable checkpoints
SFT_SAVES = 20  # a warm start checkpoints itself about this many times (a kill loses at most ~5% of it) ...
MIN_SAVE_STEPS = 25  # ... but not more often than every this many steps (a short SFT saves once, at its end)


def save_every(sft_steps: int) -> int:
    """Steps between the SFT warm start's resumable checkpoints."""
    return max(MIN_SAVE_STEPS, sft_steps // SFT_SAVES)


def warm_start(task: Any, preset: str, style: str, env: Any, seeds: list[int], recipe: Any, seed: int = 0,
               progress=None, cacheable: bool = True, model_tok: tuple[Any, Any] | None = None,
               tensorboard_dir=None, resume_dir=None, threads=None, teacher_noise: float = 0.0):
    """The SFT warm start of a preset model on expert demonstrations of `seeds` (train split) under `env`: loaded from
    the cache when an entry with the same key exists, else trained. Returns (model, tok, cache_hit_dir or None,
    key or None, SFTMetrics or None). `model_tok` (a model already built or loaded) is trained instead of a fresh
    preset; it is never cached (its starting weights are not part of the key).

    `resume_dir`: the SFT checkpoints itself there every `save_every(sft_steps)` steps (atomically) and a call after
    a kill continues from the last checkpoint (`policies.train.train_sft`). The caller removes the folder once the
    warm start's result is saved (in a run, `harness.retention` does once setup is recorded).

    `threads`: the torch CPU thread count the SFT trains at (None: this process's count), set for the SFT only and
    restored after (`harness.threads.sft_threads`). It is part of the key (`trained_on`) with the device: a matrix
    product's sums split over another thread count, or run on a GPU, land differently, and 700 SFT steps grow that into
    another warm start, so a checkpoint is reused only where it would be trained the same.

    `teacher_noise`: the share of demonstrations from the task's imperfect teacher (`policy_glue.sft_pairs`, drawn
    with `seed`); part of the key when above 0 (a key without it is the same as before the field existed)."""
    import torch

    from harness.policy_glue import sft_pairs
    from policies import thread_count
    from policies.model import build_model, load_policy
    from policies.train import SFT_RECIPE_FIELDS, train_sft

    n_threads = threads or torch.get_num_threads()
    key = None
    if cacheable and model_tok is None:
        key = cache_key(task=task.name, preset=preset, style=style, seed=seed, env=env.model_dump(mode="json"),
                        seeds=list(seeds), recipe={f: getattr(recipe, f) for f in SFT_RECIPE_FIELDS},  # all it reads
                        trained_on=trained_on(n_threads), **({"teacher_noise": teacher_noise} if teacher_noise else {}))
        hit = lookup(key)
        if hit is not None:
            try:
                model, tok = load_policy(hit)
                return model, tok, hit, key, None
            except Exception as exc:  # noqa: BLE001 - a damaged entry (weights cut short, a bad file): trained again
                why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                moved = set_aside(hit, why)
                import warnings

                warnings.warn(f"the cached warm start {hit} does not load ({why}); "
                              + (f"moved to {moved}" if moved else "removed") + " and trained again", stacklevel=2)
    model, tok = model_tok or build_model(preset, task.spec.alphabet, words=list(task.spec.words), seed=seed)
    pairs = sft_pairs(task, env, list(seeds), style, teacher_noise=teacher_noise, noise_seed=seed)
    with thread_count(n_threads):
        m = train_sft(model, tok, pairs, recipe, progress=progress, tensorboard_dir=tensorboard_dir,
                      resume_dir=resume_dir, save_every=save_every(recipe.sft_steps) if resume_dir is not None else 0)
    return model, tok, None, key, m
