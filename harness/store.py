"""The run store: `runs/<id>/run.db`, everything a run measured and decided, in SQLite through sqlite-utils.

Tables (created by the named, ordered migrations below; open the file with sqlite-utils or Datasette to browse):
runs, stages, candidates, evaluations (per slice), findings, events, compute (the ledger), seed_cursor + seed_draws
(fresh held-out seeds for every backtest), nodes (graph-node completion, for idempotent resume), _migrations.

Every writer commits on its own (a SIGKILL loses at most the write in flight) and the ones the loop may repeat when it
re-enters an interrupted node are upserts keyed by natural keys, so a resumed run never duplicates rows. WAL mode and
a busy timeout let `evotrainer status` read while a run writes. `acquire_lock` keeps two processes from driving one run.

    from harness.store import RunStore
    store = RunStore.open("runs/r1/run.db")
    store.create_run("r1", config={"task": "mapf"})
    seeds = store.draw_seeds("r1", "backtest", 64)      # never the same seeds twice, across reopen too
    print(store.summary("r1"))

Run its tests: `.venv/bin/pytest tests/test_store.py`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import sqlite3
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Self, TypeVar

from sqlite_utils import Database

from harness import seeds as seedlib
from harness.records import Candidate, Finding, Verdict
from harness.results import NodeResult

R = TypeVar("R", bound=NodeResult)

BUSY_TIMEOUT_S = 30.0

CandidateStatus = Literal["proposed", "vetted", "rejected_vet", "backtested", "promoted", "rejected"]
CANDIDATE_STATUSES: tuple[str, ...] = ("proposed", "vetted", "rejected_vet", "backtested", "promoted", "rejected")
ComputeKind = Literal["sft", "grpo", "eval", "rollout", "engineer"]
COMPUTE_KINDS: tuple[str, ...] = ("sft", "grpo", "eval", "rollout", "engineer")  # engineer: an LLM engineer's calls


class StoreError(ValueError):
    """Bad use of the run store (unknown run or candidate, bad status, bad value); the message says the fix."""


class RunLockedError(StoreError):
    """Another live process is driving this run."""


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _slice_key(slice_: dict[str, str]) -> str:
    """A finding's slice as a canonical string (the natural key): '' for all, else 'k=v,k2=v2' sorted by key."""
    return ",".join(f"{k}={slice_[k]}" for k in sorted(slice_))


# --- migrations (simonw/llm style: each a named function, applied once, in order) ---------------------------------------

MIGRATIONS: list[Callable[[Database], None]] = []


def migration(fn: Callable[[Database], None]) -> Callable[[Database], None]:
    MIGRATIONS.append(fn)
    return fn


@migration
def m001_runs_and_stages(db: Database) -> None:
    db["runs"].create(
        {"id": str, "config": str, "status": str, "budget": str, "created": str, "updated": str},
        pk="id", not_null={"id", "status", "created", "updated"}, defaults={"status": "created", "config": "{}"},
    )
    db["stages"].create(
        {"run": str, "stage": int, "status": str, "checkpoint": str, "metrics": str, "started": str, "ended": str},
        pk=("run", "stage"), not_null={"run", "stage", "status"}, defaults={"status": "running", "metrics": "{}"},
    )


@migration
def m002_candidates(db: Database) -> None:
    db["candidates"].create(
        {
            "id": str, "run": str, "stage": int, "kind": str, "knob": str, "patch": str, "old_value": str,
            "rationale": str, "expected": str, "engineer": str, "skill": str, "commit_sha": str, "tag": str,
            "status": str, "reason": str, "effect": float, "ci_low": float, "ci_high": float, "n": int,
            "evidence": str, "created": str, "updated": str,
        },
        pk="id", not_null={"id", "run", "stage", "kind", "knob", "status"}, defaults={"status": "proposed"},
    )
    db["candidates"].create_index(["run", "stage"])


@migration
def m003_evaluations_and_findings(db: Database) -> None:
    db["evaluations"].create(
        {
            "run": str, "stage": int, "arm": str, "split": str, "slice_key": str, "slice_value": str,
            "n": int, "valid": float, "optimal": float, "created": str,
        },
        pk=("run", "stage", "arm", "split", "slice_key", "slice_value"),
        not_null={"run", "stage", "arm", "split", "slice_key", "slice_value", "n"},
    )
    db["findings"].create(
        {
            "run": str, "stage": int, "code": str, "slice": str, "severity": str, "count": int, "rate": float,
            "examples": str, "knobs": str, "message": str, "created": str,
        },
        pk=("run", "stage", "code", "slice"), not_null={"run", "stage", "code", "slice"},
    )


@migration
def m004_events_and_compute(db: Database) -> None:
    db["events"].create(
        {
            "id": int, "run": str, "stage": int, "node": str, "kind": str, "message": str, "data": str,
            "key": str, "ts": str,
        },
        pk="id", not_null={"run", "kind", "ts"},
    )
    db["events"].create_index(["run", "id"])
    # A keyed event is written once even when its node is re-entered; unkeyed events are a plain log.
    db.execute("CREATE UNIQUE INDEX idx_events_run_key ON events(run, key) WHERE key IS NOT NULL")
    db["compute"].create(
        {
            "run": str, "stage": int, "arm": str, "kind": str, "label": str, "seconds": float, "tokens": int,
            "steps": int, "updated": str,
        },
        pk=("run", "stage", "arm", "kind", "label"), not_null={"run", "stage", "arm", "kind", "label"},
    )


@migration
def m005_seed_cursor_and_nodes(db: Database) -> None:
    db["seed_cursor"].create({"run": str, "split": str, "next": int}, pk=("run", "split"), not_null={"next"})
    db["seed_draws"].create(
        {"run": str, "split": str, "key": str, "start": int, "n": int, "ts": str}, pk=("run", "split", "key"),
        not_null={"start", "n"},
    )
    db["nodes"].create(
        {"run": str, "stage": int, "node": str, "result": str, "ts": str}, pk=("run", "stage", "node"),
    )


@contextlib.contextmanager
def _immediate(db: Database) -> Iterator[Database]:
    """A write transaction taken up front (BEGIN IMMEDIATE): read-then-write stays atomic across processes."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.rollback()
        raise
    db.execute("COMMIT")


def migrate(db: Database) -> list[str]:
    """Apply the migrations not yet applied, each in its own transaction; returns the names applied now."""
    if not db["_migrations"].exists():  # under the write lock: two processes opening a fresh file at once
        with _immediate(db):  # raced here, the second failing at once ("database is locked", its timeout unused)
            db.execute("CREATE TABLE IF NOT EXISTS [_migrations] ([name] TEXT PRIMARY KEY, [applied_at] TEXT)")
    done = {r[0] for r in db.execute("SELECT name FROM _migrations").fetchall()}
    applied_now = []
    for fn in (f for f in MIGRATIONS if f.__name__ not in done):  # an up-to-date db (a status reader) takes no lock
        with _immediate(db):  # re-check inside the lock: two processes opening a fresh db race here
            if db.execute("SELECT 1 FROM _migrations WHERE name = ?", [fn.__name__]).fetchone():
                continue
            fn(db)
            db["_migrations"].insert({"name": fn.__name__, "applied_at": now()})
            applied_now.append(fn.__name__)
    return applied_now


def open_db(path: Path) -> Database:
    """A sqlite-utils Database in WAL mode with a busy timeout (so readers and the writer do not fail on contention)."""
    conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S)
    db = Database(conn)
    db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    from skills.library import wal_mode

    wal_mode(db.execute, BUSY_TIMEOUT_S)
    db.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: durable across a process kill (not a power cut)
    return db


def _pending_migrations(db: Database) -> bool:
    if not db["_migrations"].exists():
        return True
    done = {r[0] for r in db.execute("SELECT name FROM _migrations").fetchall()}
    return any(f.__name__ not in done for f in MIGRATIONS)


def _open_read_only(path: Path) -> tuple[Database, Path | None]:
    """run.db for a reader, written by nothing: SQLite's read-only mode (`mode=ro`), so closing the connection does not
    checkpoint a killed driver's WAL into the file and delete it (only the -shm index may be rebuilt). On a read-only
    file system, where a WAL database cannot be opened without its -shm file, a private copy of run.db and its WAL in
    a temporary folder is read instead (returned second, for `close` to remove). A database written by an older
    version (a schema migration pending) is migrated once by a writable open when the folder allows it, as before;
    else read as it is. A file that is not a readable database is a StoreError naming it."""
    import shutil
    import tempfile
    from urllib.parse import quote

    def connect(target: Path, flags: str) -> Database:
        conn = sqlite3.connect(f"file:{quote(str(target.resolve()))}?{flags}", uri=True, timeout=BUSY_TIMEOUT_S)
        db = Database(conn)
        db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()  # fails here on a file that is no database
        return db

    db, tmp = None, None
    try:
        try:
            db = connect(path, "mode=ro")
        except sqlite3.OperationalError:  # a read-only file system: no -shm can be made for the WAL
            tmp = Path(tempfile.mkdtemp(prefix="evotrainer-read-"))
            for suffix in ("", "-wal"):
                if (src := path.with_name(path.name + suffix)).is_file():
                    shutil.copyfile(src, tmp / ("run.db" + suffix))
            db = connect(tmp / "run.db", "mode=rw")
        if tmp is None and _pending_migrations(db) and os.access(path, os.W_OK) and os.access(path.parent, os.W_OK):
            db.close()
            db = open_db(path)
            migrate(db)
    except (sqlite3.DatabaseError, OSError) as exc:
        if db is not None:
            db.close()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise StoreError(f"{path} is not a readable run database ({exc}); restore it from a backup") from None
    return db, tmp


RUN_MARKER = ".evotrainer-run"  # written into a new run folder once its config.yaml is whole: what makes a folder one of ours
_RUN_ID_TEXT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def created_as(run_dir: Path) -> str | None:
    """The id a run folder was created with (its marker, `harness.lifecycle.start_run`), or None (an older run)."""
    try:
        text = (Path(run_dir) / RUN_MARKER).read_text().strip()
    except OSError:
        return None
    return text if _RUN_ID_TEXT.fullmatch(text) else None


# --- the run lock -------------------------------------------------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """An exclusive fcntl.flock on `runs/<id>/lock`, which holds the driver's PID. Release with `.release()` or `with`.

    The kernel drops a flock when its holder dies, so a lock left by a killed driver is simply taken over
    (`stale_pid` then names the dead driver)."""

    def __init__(self, path: Path, run: str, fd: int, stale_pid: int | None):
        self.path, self.run, self._fd, self.stale_pid = path, run, fd, stale_pid

    def release(self, untouched: bool = False) -> None:
        """Unlock. `untouched`: this process changed nothing (a refused command), so a dead driver's PID goes back
        into the file; emptied, the run read as cleanly stopped ("running" for ever) instead of interrupted."""
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        if untouched and self.stale_pid is not None:
            os.pwrite(self._fd, f"{self.stale_pid}\n".encode(), 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def acquire_lock(run_dir: Path, run: str) -> RunLock:
    """Take `run_dir/lock` for this process or raise RunLockedError naming the live holder's PID."""
    path = Path(run_dir) / "lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_pid(fd)
        os.close(fd)
        if holder is not None and not _pid_alive(holder):
            raise RunLockedError(
                f"run {run} is locked by a process that inherited the lock of dead pid {holder} (a leftover child?); "
                f"find it with `fuser {path}` and kill it") from None
        raise RunLockedError(f"run {run} is already being driven by pid {holder}; wait or kill it") from None
    old = _read_pid(fd)
    stale = old if old is not None and old != os.getpid() else None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    os.fsync(fd)
    return RunLock(path, run, fd, stale)


def _read_pid(fd: int) -> int | None:
    raw = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return int(raw) if raw.isdigit() else None


def _has_open(pid: int, path: Path) -> bool | None:
    """Whether process `pid` holds `path` open (its /proc/<pid>/fd links), without touching the file; None where that
    cannot be read (not Linux, another user's process). Paths, not device numbers: right on overlay file systems too."""
    try:
        target = str(path.resolve())
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                return True
        except OSError:
            continue
    return False


def driver_dead(run_dir: Path) -> int | None:
    """The PID of a driver that was killed while it held `run_dir/lock` (its PID is left in the file; a clean release
    empties it), or None when the lock is free and empty or its holder lives. Read-only: a status reader must not
    take the lock a starting driver needs. A live process of that PID is the driver only if it holds the lock file
    open: after a reboot, or in a run folder copied from another machine, the PID left in the file may name some
    other live process, which a PID check alone took for the driver ("running" for ever)."""
    path = Path(run_dir) / "lock"
    try:
        raw = path.read_text(errors="replace").strip()
    except OSError:
        return None
    pid = int(raw) if raw.isdigit() else None
    if pid is None or pid == os.getpid():
        return None
    if not _pid_alive(pid):
        return pid
    return pid if _has_open(pid, path) is False else None  # alive, but not the driver: the PID was reused


# --- the store ----------------------------------------------------------------------------------------------------------


class RunStore:
    """Typed access to run.db. Small methods; every write commits; repeatable writes are upserts."""

    def __init__(self, db: Database, path: Path):
        self.db, self.path = db, path
        self._copy: Path | None = None  # a read-only open's private copy (a read-only file system), removed on close

    @classmethod
    def open(cls, path: str | Path, create: bool = True, read_only: bool = False) -> RunStore:
        """Open (creating folders and the file when missing, unless `create` is false: a reader such as `status` must
        not leave an empty database in a folder whose own was lost) and migrate to the latest schema. A file that is
        not a readable SQLite database is a StoreError naming it, not a traceback. `read_only` (the readers: `status`,
        `review`, `report`, `runs`) never writes the file or its WAL (`_open_read_only`); it implies `create=False`."""
        path = Path(path)
        if (read_only or not create) and not path.is_file():
            raise StoreError(f"{path} not found: {path.parent} is not a run folder, or its database was deleted "
                             "(restore run.db from a backup; the checkpoints and harness/ alone cannot be read as a run)")
        if read_only:
            db, tmp = _open_read_only(path)
            store = cls(db, path)
            store._copy = tmp
            return store
        path.parent.mkdir(parents=True, exist_ok=True)
        db = None
        try:
            db = open_db(path)
            migrate(db)
        except sqlite3.DatabaseError as exc:
            if type(exc) is not sqlite3.DatabaseError:  # locked, a migration's integrity error: not a damaged file
                raise
            if db is not None:
                db.close()
            raise StoreError(f"{path} is not a readable run database ({exc}); restore it from a backup, or move it "
                             "aside to start the run afresh") from None
        return cls(db, path)

    def close(self) -> None:
        self.db.close()
        if self._copy is not None:
            import shutil

            shutil.rmtree(self._copy, ignore_errors=True)
            self._copy = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def acquire_lock(self, run: str) -> RunLock:
        """Lock `<folder of run.db>/lock` (i.e. `runs/<id>/lock`) for this process; see `acquire_lock`."""
        return acquire_lock(self.path.parent, run)

    # --- runs -----------------------------------------------------------------------------------------------------------

    def create_run(self, run: str, config: dict[str, Any], budget: dict[str, Any] | None = None) -> None:
        """Insert the run once; a second call (resume) leaves the stored config untouched."""
        t = now()
        self.db.execute(
            "INSERT OR IGNORE INTO runs (id, config, status, budget, created, updated) VALUES (?, ?, 'created', ?, ?, ?)",
            [run, _json(config), _json(budget or {}), t, t],
        )

    def started_at(self, run: str) -> float:
        """When the run was created, as a Unix time (the wall-clock budget counts from here, across resumes)."""
        return datetime.fromisoformat(self.get_run(run)["created"]).timestamp()

    def set_run_budget(self, run: str, budget: dict[str, Any]) -> None:
        """The run's budget as raised later (`evotrainer resume RUN --stages N`); the config recorded at start stays."""
        self._need_run(run)
        self.db["runs"].update(run, {"budget": _json(budget), "updated": now()})

    def set_run_status(self, run: str, status: str) -> None:
        self._need_run(run)
        self.db["runs"].update(run, {"status": status, "updated": now()})

    def get_run(self, run: str) -> dict[str, Any]:
        row = self._need_run(run)
        return {**row, "config": json.loads(row["config"] or "{}"), "budget": json.loads(row["budget"] or "{}")}

    def runs(self) -> list[str]:
        return [r["id"] for r in self.db.query("SELECT id FROM runs ORDER BY created")]

    def _need_run(self, run: str) -> dict[str, Any]:
        rows = list(self.db["runs"].rows_where("id = ?", [run]))
        if not rows:
            known = ", ".join(self.runs())
            if not known:  # a going run's rows live in its -wal file until SQLite checkpoints them into run.db
                raise StoreError(f"no run {run!r} in {self.path}: it holds no run at all. A run.db copied while its "
                                 f"run was going on, without the {Path(self.path).name}-wal file beside it, has not "
                                 "yet received the run's rows: copy the -wal file with it, or copy the folder again "
                                 "after the run ends; else this is not a run's database")
            raise StoreError(f"no run {run!r} in {self.path} (known: {known}); start it with `evotrainer run`")
        return rows[0]

    def _touch(self, run: str) -> None:
        self.db.execute("UPDATE runs SET updated = ? WHERE id = ?", [now(), run])

    # --- stages ---------------------------------------------------------------------------------------------------------

    def start_stage(self, run: str, stage: int) -> None:
        """Mark a stage running; re-entering keeps its original start time."""
        self._need_run(run)
        self.db.execute(
            "INSERT INTO stages (run, stage, status, started) VALUES (?, ?, 'running', ?) "
            "ON CONFLICT(run, stage) DO UPDATE SET status = 'running' WHERE ended IS NULL",
            [run, stage, now()],
        )
        self._touch(run)

    def end_stage(self, run: str, stage: int, *, status: str = "done", checkpoint: str | None = None,
                  metrics: dict[str, Any] | None = None) -> None:
        """Close a stage with its policy checkpoint and held-out metrics (overwrites on a re-entered node)."""
        self._need_run(run)
        self.db["stages"].upsert(
            {"run": run, "stage": stage, "status": status, "checkpoint": checkpoint, "metrics": _json(metrics or {}),
             "ended": now()}, pk=("run", "stage"))
        self._touch(run)

    def stages(self, run: str) -> list[dict[str, Any]]:
        return [{**r, "metrics": json.loads(r["metrics"] or "{}")}
                for r in self.db.query("SELECT * FROM stages WHERE run = ? ORDER BY stage", [run])]

    # --- candidates -----------------------------------------------------------------------------------------------------

    def upsert_candidate(self, run: str, candidate: Candidate, *, commit: str | None = None,
                         tag: str | None = None) -> None:
        """Insert or refresh a proposed candidate by id. Its status and verdict are left as they are (a re-entered
        propose node must not undo a verdict); commit/tag are written only when given."""
        self._need_run(run)
        ch = candidate.change
        row: dict[str, Any] = {
            "id": candidate.id, "run": run, "stage": candidate.stage, "kind": ch.kind, "knob": ch.knob,
            "patch": ch.model_dump_json(), "old_value": _json(candidate.old_value), "rationale": candidate.rationale,
            "expected": candidate.expected, "engineer": candidate.engineer, "skill": candidate.skill, "updated": now(),
        }
        if commit is not None:
            row["commit_sha"] = commit
        if tag is not None:
            row["tag"] = tag
        with self.db.atomic():
            other = self.db.execute("SELECT run FROM candidates WHERE id = ?", [candidate.id]).fetchone()
            if other is not None and other[0] != run:
                raise StoreError(f"candidate id {candidate.id!r} already belongs to run {other[0]!r}; ids are unique")
            if other is None:
                row["created"] = row["updated"]
            self.db["candidates"].upsert(row, pk="id")

    def record_proposal(self, run: str, stage: int, candidates: list[Candidate], asked: NodeResult) -> None:
        """`upsert_candidate` for each and the engineer's answer (`harness.results.Asked`) as the stage's node row,
        in one transaction: a reader (or a resumed propose node) sees all of it or none."""
        with self.db.atomic():
            for c in candidates:
                self.upsert_candidate(run, c)
            self.save_result(run, stage, asked)

    def set_candidate_status(self, candidate_id: str, status: CandidateStatus, *, reason: str | None = None,
                             commit: str | None = None, tag: str | None = None) -> None:
        if status not in CANDIDATE_STATUSES:
            raise StoreError(f"unknown candidate status {status!r}; choose one of {', '.join(CANDIDATE_STATUSES)}")
        self._need_candidate(candidate_id)
        row: dict[str, Any] = {"status": status, "updated": now()}
        for col, val in (("reason", reason), ("commit_sha", commit), ("tag", tag)):
            if val is not None:
                row[col] = val
        self.db["candidates"].update(candidate_id, row)

    def set_candidate_verdict(self, verdict: Verdict, *, tag: str | None = None) -> None:
        """Record the decision, its reason and the paired evidence (effect, CI, n) on the candidate's row."""
        self._need_candidate(verdict.candidate)
        status = verdict.decision
        if verdict.decision == "rejected" and verdict.stage_reached in ("vet", "offline"):  # before any training
            status = "rejected_vet"
        row: dict[str, Any] = {"status": status, "reason": verdict.reason, "updated": now()}
        if verdict.evidence is not None:
            ev = verdict.evidence
            row.update(effect=ev.effect, ci_low=ev.ci_low, ci_high=ev.ci_high, n=ev.pooled_n, evidence=ev.model_dump_json())
        if tag is not None:
            row["tag"] = tag
        self.db["candidates"].update(verdict.candidate, row)

    def candidate(self, candidate_id: str) -> dict[str, Any]:
        return self._decode_candidate(self._need_candidate(candidate_id))

    def candidates(self, run: str, stage: int | None = None, status: str | None = None) -> list[dict[str, Any]]:
        where, args = "run = ?", [run]
        if stage is not None:
            where, args = where + " AND stage = ?", [*args, stage]
        if status is not None:
            where, args = where + " AND status = ?", [*args, status]
        return [self._decode_candidate(r) for r in self.db["candidates"].rows_where(where, args, order_by="rowid")]

    def _need_candidate(self, candidate_id: str) -> dict[str, Any]:
        rows = list(self.db["candidates"].rows_where("id = ?", [candidate_id]))
        if not rows:
            raise StoreError(f"no candidate {candidate_id!r}; write it with upsert_candidate first")
        return rows[0]

    @staticmethod
    def _decode_candidate(row: dict[str, Any]) -> dict[str, Any]:
        out = dict(row)
        out["patch"] = json.loads(row["patch"]) if row["patch"] else None
        out["old_value"] = json.loads(row["old_value"]) if row["old_value"] else None
        out["evidence"] = json.loads(row["evidence"]) if row["evidence"] else None
        return out

    # --- evaluations and findings ---------------------------------------------------------------------------------------

    def record_eval(self, run: str, stage: int, arm: str, split: str, *, n: int, valid: float, optimal: float,
                    slice_key: str = "", slice_value: str = "") -> None:
        """One evaluation cell: `arm` (a candidate id, 'control', 'policy') on `split`, overall (slice_key '') or
        one slice (e.g. slice_key 'size', slice_value '5'). `valid`/`optimal` are rates in [0, 1] over `n` instances."""
        if split not in seedlib.SPLITS:
            raise StoreError(f"unknown split {split!r}; choose one of {', '.join(seedlib.SPLITS)}")
        for name, v in (("valid", valid), ("optimal", optimal)):
            if not 0.0 <= v <= 1.0:
                raise StoreError(f"{name}={v} is not a rate in [0, 1]; pass the fraction, not the count")
        if n < 0:
            raise StoreError(f"n={n} must be >= 0")
        self.db["evaluations"].upsert(
            {"run": run, "stage": stage, "arm": arm, "split": split, "slice_key": slice_key,
             "slice_value": str(slice_value), "n": n, "valid": float(valid), "optimal": float(optimal),
             "created": now()},
            pk=("run", "stage", "arm", "split", "slice_key", "slice_value"))

    def evaluations(self, run: str, stage: int | None = None, arm: str | None = None) -> list[dict[str, Any]]:
        where, args = "run = ?", [run]
        if stage is not None:
            where, args = where + " AND stage = ?", [*args, stage]
        if arm is not None:
            where, args = where + " AND arm = ?", [*args, arm]
        return list(self.db["evaluations"].rows_where(
            where, args, order_by="stage, arm, split, slice_key, slice_value"))

    def record_findings(self, run: str, stage: int, findings: list[Finding]) -> None:
        """The stage's findings, replacing any it had (a re-entered diagnosis writes its own set, not a union with the
        first attempt's), keyed by (run, stage, code, slice), all in one transaction."""
        t = now()
        with self.db.atomic():
            self.db.execute("DELETE FROM findings WHERE run = ? AND stage = ?", [run, stage])
            for f in findings:
                self.db["findings"].upsert(
                    {"run": run, "stage": stage, "code": f.code, "slice": _slice_key(f.slice), "severity": f.severity,
                     "count": f.count, "rate": f.rate, "examples": _json(f.examples), "knobs": _json(f.knobs),
                     "message": f.message, "created": t},
                    pk=("run", "stage", "code", "slice"))

    def findings(self, run: str, stage: int | None = None) -> list[Finding]:
        where, args = "run = ?", [run]
        if stage is not None:
            where, args = where + " AND stage = ?", [*args, stage]
        out = []
        for r in self.db["findings"].rows_where(where, args, order_by="stage, rate DESC, code"):
            slice_ = dict(kv.split("=", 1) for kv in r["slice"].split(",")) if r["slice"] else {}
            out.append(Finding(code=r["code"], severity=r["severity"], count=r["count"], rate=r["rate"], slice=slice_,
                               examples=json.loads(r["examples"]), knobs=json.loads(r["knobs"]),
                               message=r["message"] or ""))
        return out

    # --- events ---------------------------------------------------------------------------------------------------------

    def add_event(self, run: str, kind: str, message: str = "", *, stage: int | None = None, node: str | None = None,
                  data: dict[str, Any] | None = None, key: str | None = None) -> bool:
        """Append to the run's log. With `key`, the event is written once per (run, key) however often its node is
        re-entered. Returns False when a keyed event was already there."""
        cur = self.db.execute(
            "INSERT OR IGNORE INTO events (run, stage, node, kind, message, data, key, ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [run, stage, node, kind, message, _json(data or {}), key, now()],
        )
        return cur.rowcount == 1

    def events(self, run: str, stage: int | None = None, kind: str | None = None,
               limit: int | None = None) -> list[dict[str, Any]]:
        where, args = "run = ?", [run]
        if stage is not None:
            where, args = where + " AND stage = ?", [*args, stage]
        if kind is not None:
            where, args = where + " AND kind = ?", [*args, kind]
        rows = self.db["events"].rows_where(where, args, order_by="id", limit=limit)
        return [{**r, "data": json.loads(r["data"] or "{}")} for r in rows]

    # --- the compute ledger ---------------------------------------------------------------------------------------------

    def charge(self, run: str, stage: int, arm: str, kind: ComputeKind, *, seconds: float, tokens: int = 0,
               steps: int = 0, label: str = "") -> None:
        """Record the compute one piece of work took. One row per (run, stage, arm, kind, label): charging the same
        key again REPLACES it (a re-entered node re-measures its work; it does not add to it). Use `label` to keep
        two pieces of work of the same kind apart (e.g. 'backtest' and 'test' evals)."""
        if kind not in COMPUTE_KINDS:
            raise StoreError(f"unknown compute kind {kind!r}; choose one of {', '.join(COMPUTE_KINDS)}")
        if seconds < 0 or tokens < 0 or steps < 0:
            raise StoreError(f"compute must be non-negative, got seconds={seconds} tokens={tokens} steps={steps}")
        self.db["compute"].upsert(
            {"run": run, "stage": stage, "arm": arm, "kind": kind, "label": label, "seconds": float(seconds),
             "tokens": int(tokens), "steps": int(steps), "updated": now()},
            pk=("run", "stage", "arm", "kind", "label"))

    def compute(self, run: str) -> dict[str, dict[str, float]]:
        """Totals per kind: {'grpo': {'seconds': .., 'tokens': .., 'steps': ..}, ...}."""
        rows = self.db.execute(
            "SELECT kind, SUM(seconds), SUM(tokens), SUM(steps) FROM compute WHERE run = ? GROUP BY kind ORDER BY kind",
            [run]).fetchall()
        return {k: {"seconds": s, "tokens": t, "steps": n} for k, s, t, n in rows}

    def ledger(self, run: str) -> list[dict[str, Any]]:
        """Every row of the run's compute ledger (stage, arm, kind, label, seconds, tokens, steps), in stage order."""
        return list(self.db["compute"].rows_where("run = ?", [run], order_by="stage, arm, kind, label",
                                                  select="stage, arm, kind, label, seconds, tokens, steps"))

    def seconds_spent(self, run: str, stage: int | None = None) -> float:
        """Compute seconds charged to the run (or to one of its stages): this machine's work, so not the calls to an
        LLM engineer's endpoint (kind `engineer`, label `endpoint ...`: another machine's; `budget.wall_clock_s`
        bounds the wait for them). A local checkpoint as engineer runs here and counts."""
        where, args = ("AND stage = ?", [run, stage]) if stage is not None else ("", [run])
        return float(self.db.execute(f"SELECT COALESCE(SUM(seconds), 0) FROM compute WHERE run = ? AND NOT (kind = "
                                     f"'engineer' AND label LIKE 'endpoint%') {where}", args).fetchone()[0])

    # --- seeds: a forward-only cursor per split -------------------------------------------------------------------------

    def draw_seeds(self, run: str, split: str, n: int, *, key: str | None = None, first: int = 0) -> list[int]:
        """`n` seeds of `split` never drawn before in this run (the cursor only moves forward, atomically, and is
        persisted). With `key` (e.g. 'stage3/cand-2'), a repeated call returns the SAME seeds it drew the first time,
        so a re-entered backtest node evaluates on what it already drew instead of burning fresh seeds. `first`: the
        index a split's cursor starts at in this run (read once, when the run first draws from the split)."""
        if n <= 0:
            raise StoreError(f"draw at least one seed, got n={n}")
        seedlib.seed_for(split, 0)  # raises SplitError for an unknown split
        with _immediate(self.db):
            if key is not None:
                prior = self.db.execute("SELECT start, n FROM seed_draws WHERE run = ? AND split = ? AND key = ?",
                                        [run, split, key]).fetchone()
                if prior is not None:
                    if prior[1] != n:
                        raise StoreError(f"seed draw {key!r} on {split} already drew {prior[1]} seeds, not {n}; "
                                         "use a new key for a different draw")
                    return seedlib.seeds(split, prior[1], start=prior[0])
            self.db.execute("INSERT OR IGNORE INTO seed_cursor (run, split, next) VALUES (?, ?, ?)",
                            [run, split, int(first)])
            start = self.db.execute("UPDATE seed_cursor SET next = next + ? WHERE run = ? AND split = ? "
                                    "RETURNING next", [n, run, split]).fetchone()[0] - n
            if key is not None:
                self.db.execute("INSERT INTO seed_draws (run, split, key, start, n, ts) VALUES (?, ?, ?, ?, ?, ?)",
                                [run, split, key, start, n, now()])
        return seedlib.seeds(split, n, start=start)

    def seed_cursors(self, run: str) -> dict[str, int]:
        return dict(self.db.execute("SELECT split, next FROM seed_cursor WHERE run = ? ORDER BY split", [run]).fetchall())

    # --- node completion (idempotent resume) ----------------------------------------------------------------------------

    def node_done(self, run: str, stage: int, node: str) -> bool:
        return self.db.execute("SELECT 1 FROM nodes WHERE run = ? AND stage = ? AND node = ?",
                               [run, stage, node]).fetchone() is not None

    def mark_node_done(self, run: str, stage: int, node: str, result: dict[str, Any] | None = None) -> None:
        self.db["nodes"].upsert({"run": run, "stage": stage, "node": node, "result": _json(result or {}), "ts": now()},
                                pk=("run", "stage", "node"))

    def node_result(self, run: str, stage: int, node: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT result FROM nodes WHERE run = ? AND stage = ? AND node = ?",
                              [run, stage, node]).fetchone()
        return None if row is None else json.loads(row[0] or "{}")

    def save_result(self, run: str, stage: int, result: NodeResult, *, node: str | None = None,
                    timing: dict[str, Any] | None = None) -> None:
        """Write a node's typed result (`harness.results`) as its row (`node` defaults to the model's NODE), with the
        node's timing keys (`_wall_s`, ...) alongside."""
        self.mark_node_done(run, stage, node or result.NODE, {**result.model_dump(mode="json"), **(timing or {})})

    def result(self, run: str, stage: int, model: type[R], *, node: str | None = None) -> R | None:
        """A node's result read back as `model` (None until the node finished)."""
        raw = self.node_result(run, stage, node or model.NODE)
        return None if raw is None else model.model_validate(raw)

    def arm_nodes(self, run: str, stage: int | None = None) -> list[str]:
        """Names of the finished backtest arms (`arm:<name>` rows), in name order."""
        where, args = ("AND stage = ?", [run, stage]) if stage is not None else ("", [run])
        return [r[0].removeprefix("arm:") for r in self.db.execute(
            f"SELECT node FROM nodes WHERE run = ? {where} AND node LIKE 'arm:%' ORDER BY node", args)]

    # --- summary (`evotrainer status --json`) ---------------------------------------------------------------------------

    def summary(self, run: str) -> dict[str, Any]:
        """A JSON-ready snapshot of a run: status, stages with metrics, candidates by status, compute, seed cursors."""
        r = self.get_run(run)
        stages = self.stages(run)
        by_status = dict(self.db.execute(
            "SELECT status, COUNT(*) FROM candidates WHERE run = ? GROUP BY status ORDER BY status", [run]).fetchall())
        promoted = [{"id": c["id"], "stage": c["stage"], "knob": c["knob"], "effect": c["effect"],
                     "ci": [c["ci_low"], c["ci_high"]], "tag": c["tag"]}
                    for c in self.candidates(run, status="promoted")]
        last = list(self.db["events"].rows_where("run = ?", [run], order_by="id DESC", limit=1))
        return {
            "run": run, "status": r["status"], "created": r["created"], "updated": r["updated"], "budget": r["budget"],
            "stages": [{k: s[k] for k in ("stage", "status", "checkpoint", "metrics", "started", "ended")}
                       for s in stages],
            "stage": stages[-1]["stage"] if stages else None,
            "candidates": by_status, "promoted": promoted,
            "compute": self.compute(run), "seconds_spent": self.seconds_spent(run),
            "seed_cursors": self.seed_cursors(run),
            "last_event": ({k: last[0][k] for k in ("ts", "stage", "node", "kind", "message")} if last else None),
        }
