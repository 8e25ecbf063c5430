"""The skill library: `skills.db` shared by all runs, full-text retrieval ranked by evidence, evidence updates, and
import/export as one Markdown file per skill (YAML front matter = the Skill fields, body = the description).

The database lives in `$EVOTRAINER_HOME/skills.db` (default `~/.evotrainer/skills.db`). Every open syncs the seed
skills of `skills/seed/*.md` by name: new seeds are added, a changed seed file updates its skill's definition, and the
evidence a skill gathered is never wiped. Evidence comes from `record_try`, once per (skill, run, candidate), so a
resumed run cannot count a try twice; a skill promoted in two or more task families becomes general.

Untrusted input: an imported file's definition is checked (every field, and its trigger condition's grammar, types and
size, `check_condition`) before anything is written; the evidence it claims is kept as `imported` for display and
never ranks a skill (IMPORT_TRUST). A stored skill that still does not read back or check (an older version's
library, a hand edit) is skipped by `applicable` with a line naming it: one skill costs itself, never a run.

    from skills.library import SkillLibrary
    lib = SkillLibrary.open()                                  # or SkillLibrary.open(tmp / "skills.db")
    lib.search("holes on large maps", task="mapf")             # best evidence-weighted match first
    hits = lib.applicable(["mapf.hole"], task="mapf")          # hits.in_family, then hits.fallback
    lib.record_try("raise-hole-ratio", promoted=True, effect=0.08, interval=(0.02, 0.14), family="mapf",
                   run="r1", candidate="s2-c1", commit="ab12cd3")

CLI: `evotrainer skills list|show|export|import`. Tests: `.venv/bin/pytest tests/test_skills_library.py`.
"""

from __future__ import annotations

import ast
import contextlib
import fnmatch
import hashlib
import json
import math
import os
import re
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

import yaml
from pydantic import ValidationError
from sqlite_utils import Database

from sandbox.yamlload import YamlError, load_yaml_text
from skills.model import DIAGNOSTIC_PATH, KNOB_PREFIX, MAX_EXPECTED, MAX_NAME, Evidence, Skill

SEED_DIR = Path(__file__).resolve().parent / "seed"
MAX_SKILL_FILE_BYTES = 1 << 20  # a skill file's size at import (a 32 MB one made skills.db 50 MB)
BUSY_TIMEOUT_S = 30.0
IMPORT_TRUST = ("trusted: definitions, after checking every field and the trigger condition; not trusted: evidence "
                "(tries, promotions, effects, families), kept as `imported` for display and re-earned here before it "
                "ranks; provenance is shown as the file states it")


class SkillError(ValueError):
    """Bad use of the skill library; the message says what to do."""


class SkillFileError(SkillError):
    """A skill file that cannot be read: the message names the file and the field."""


class SkillLibraryError(SkillError):
    """The library's file cannot be opened, written or read (damaged, not a database, a read-only home)."""


def _nearly_full(path: Path) -> bool:
    """The file system holding `path` has under 64 MiB free."""
    import shutil

    for p in (path, *path.parents):
        if p.exists():
            try:
                return shutil.disk_usage(p).free < (64 << 20)
            except OSError:
                return False
    return False


def library_error(path: Path, why: object) -> SkillLibraryError:
    what = why.strerror if isinstance(why, OSError) and why.strerror else str(why)
    if "locked" in what or "busy" in what:  # busy, not damaged: moving it aside would drop every run's evidence
        return SkillLibraryError(
            f"the skill library {path} is busy: another process holds a write lock on it (a run at its propose or "
            f"remember step, `evotrainer skills import`, sqlite3 or Datasette with a transaction open) and it stayed "
            f"locked for {BUSY_TIMEOUT_S:g} s; nothing is damaged: close that, then retry (a run: `evotrainer resume`)")
    if "disk is full" in what.lower() or "no space" in what.lower() or _nearly_full(path):  # full, not damaged
        # (SQLite in WAL mode says "disk I/O error" when the disk fills: that read as "damaged, move it aside")
        return SkillLibraryError(f"the skill library {path} cannot be written: the disk is full ({what}); nothing is "
                                 "damaged: free space, then retry (a run: `evotrainer resume`)")
    return SkillLibraryError(
        f"the skill library {path} cannot be used: {what}; if it is damaged, move it aside (mv {path} {path}.bad) and "
        "an empty one (the seed skills) is made at the next start, then `evotrainer skills import` an export of it if "
        "you have one; if its folder is read-only, point EVOTRAINER_HOME at a writable one")


class UnknownSkillError(SkillError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def home() -> Path:
    """The evotrainer home folder: `$EVOTRAINER_HOME`, else `~/.evotrainer`."""
    env = os.environ.get("EVOTRAINER_HOME")
    return Path(env).expanduser() if env else Path.home() / ".evotrainer"


def default_path() -> Path:
    """`$EVOTRAINER_SKILLS` when set (a library of one run's own: an experiment gives each evolved run one, so its
    seeds are independent replicates), else `<home>/skills.db`."""
    own = os.environ.get("EVOTRAINER_SKILLS")
    return Path(own).expanduser() if own else home() / "skills.db"


def copy_library(src: str | Path, dst: str | Path) -> None:
    """A consistent copy of a library that may be open elsewhere (WAL mode: SQLite's backup API, not a file copy),
    written beside `dst` and renamed into place, so a copy killed half-way leaves no library."""
    dst = Path(dst)
    tmp = dst.with_name(dst.name + ".part")
    tmp.unlink(missing_ok=True)
    a, b = sqlite3.connect(str(src), timeout=BUSY_TIMEOUT_S), sqlite3.connect(str(tmp))
    try:
        a.backup(b)
    finally:
        a.close()
        b.close()
    tmp.replace(dst)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


# --- trigger conditions: a tiny, typed expression language over a finding's fields ---------------------------------------

# The names a condition may use and their types; severities are the words a finding's severity can be.
CONDITION_NAMES: dict[str, str] = {"rate": "number", "count": "number", "severity": "word"}
SEVERITIES = ("info", "warn", "critical")
MAX_CONDITION_CHARS = 200  # a condition is one short line ("rate >= 0.2 and count > 3")
MAX_CONDITION_DEPTH = 8  # nesting of and/or/not around the comparisons
MAX_CONDITION_NODES = 64  # syntax-tree nodes in all
_CMP = {ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b,
        ast.GtE: lambda a, b: a >= b, ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b}
_HOW = "write comparisons of rate/count with numbers or of severity with a quoted severity, joined by and/or/not"


def _shown(expr: str) -> str:
    return repr(expr if len(expr) <= 60 else expr[:60] + "...")


def _operand_type(node: ast.AST, expr: str) -> tuple[str, str]:
    """(type, how it reads) of one side of a comparison: a known name or a constant."""
    if isinstance(node, ast.Name):
        if node.id not in CONDITION_NAMES:
            raise SkillError(f"condition {_shown(expr)} uses {node.id!r}; only {', '.join(CONDITION_NAMES)} are known")
        return CONDITION_NAMES[node.id], node.id
    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return "number", repr(v)
        if isinstance(v, str):
            if v not in SEVERITIES:
                raise SkillError(f"condition {_shown(expr)} compares with {v!r}, which is no severity "
                                 f"({', '.join(SEVERITIES)})")
            return "word", repr(v)
        raise SkillError(f"condition {_shown(expr)} uses the constant {v!r}; {_HOW}")
    raise SkillError(f"condition {_shown(expr)} uses {type(node).__name__}; {_HOW}")


def _check_boolean(node: ast.AST, expr: str, depth: int) -> None:
    if depth > MAX_CONDITION_DEPTH:
        raise SkillError(f"condition {_shown(expr)} nests and/or/not deeper than {MAX_CONDITION_DEPTH} levels; "
                         "write it flat")
    if isinstance(node, ast.BoolOp):
        for v in node.values:
            _check_boolean(v, expr, depth + 1)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        _check_boolean(node.operand, expr, depth + 1)
    elif isinstance(node, ast.Compare):
        sides = [_operand_type(n, expr) for n in (node.left, *node.comparators)]
        for op, (ta, a), (tb, b) in zip(node.ops, sides, sides[1:]):
            if type(op) not in _CMP:
                raise SkillError(f"condition {_shown(expr)} uses {type(op).__name__}; {_HOW}")
            if ta != tb:
                raise SkillError(f"condition {_shown(expr)} compares {a} (a {ta}) with {b} (a {tb}); {_HOW}")
            if ta == "word" and not isinstance(op, (ast.Eq, ast.NotEq)):
                raise SkillError(f"condition {_shown(expr)} orders {a} and {b}; severities compare with == or != only")
    else:
        raise SkillError(f"condition {_shown(expr)} uses {type(node).__name__}; write comparisons joined by "
                         "and/or/not")


def check_condition(expr: str) -> None:
    """Raise SkillError unless `expr` is '' or comparisons joined by and/or/not, typed: rate and count (numbers) with
    numbers, severity (a word) with a quoted severity by == or != (e.g. "rate >= 0.2 and count >= 5",
    "severity == 'critical'"); at most MAX_CONDITION_CHARS characters, MAX_CONDITION_NODES nodes and
    MAX_CONDITION_DEPTH levels of and/or/not. A checked condition evaluates without error on any finding."""
    if not isinstance(expr, str):
        raise SkillError(f"condition must be a string, got {type(expr).__name__}")
    if not expr.strip():
        return
    if len(expr) > MAX_CONDITION_CHARS:
        raise SkillError(f"condition {_shown(expr)} is {len(expr)} characters long; at most {MAX_CONDITION_CHARS}")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        msg = exc.msg if isinstance(exc, SyntaxError) else f"{type(exc).__name__}: {exc}"
        raise SkillError(f"condition {_shown(expr)} is not an expression: {msg}") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_CONDITION_NODES:
        raise SkillError(f"condition {_shown(expr)} has {nodes} syntax nodes; at most {MAX_CONDITION_NODES}")
    _check_boolean(tree.body, expr, 1)


def condition_holds(expr: str, fields: Mapping[str, Any]) -> bool:
    """Evaluate a condition against a finding's fields ({'rate': 0.3, 'count': 12, 'severity': 'warn'}). Checks it
    first (`check_condition`), so a condition stored by an older version or edited by hand in the database raises
    SkillError here, never TypeError or RecursionError."""
    check_condition(expr)
    if not expr.strip():
        return True

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.BoolOp):
            vals = (ev(v) for v in node.values)
            return all(vals) if isinstance(node.op, ast.And) else any(vals)
        if isinstance(node, ast.UnaryOp):
            return not ev(node.operand)
        if isinstance(node, ast.Compare):
            left = ev(node.left)
            for op, right_node in zip(node.ops, node.comparators):
                right = ev(right_node)
                if not _CMP[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.Name):
            if node.id not in fields:
                raise SkillError(f"condition {_shown(expr)} needs {node.id!r}, which the finding does not give")
            value = fields[node.id]
            want = CONDITION_NAMES[node.id]
            ok = isinstance(value, str) if want == "word" else (isinstance(value, int | float)
                                                                  and not isinstance(value, bool))
            if not ok:
                raise SkillError(f"condition {_shown(expr)}: the finding's {node.id} is {value!r}, not a {want}")
            return value
        return node.value  # ast.Constant (check_condition allowed nothing else)

    return bool(ev(ast.parse(expr.strip(), mode="eval").body))


# --- skill files: YAML front matter + Markdown body ---------------------------------------------------------------------


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        parts.append(f"field {loc!r}: {e['msg']}")
    return "; ".join(parts)


def parse_skill(text: str, source: str = "<text>") -> tuple[Skill, dict[str, Any]]:
    """Parse one skill file's text; returns the Skill and the raw front matter. Errors name `source` and the field."""
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].rstrip("\r\n") != "---":
        raise SkillFileError(f"{source}: a skill file starts with a '---' line, then YAML front matter, then '---'")
    end = next((i for i in range(1, len(lines)) if lines[i].rstrip("\r\n") == "---"), None)
    if end is None:
        raise SkillFileError(f"{source}: the front matter is not closed; add a '---' line after it")
    try:  # bounded: an imported file's front matter may be an alias bomb
        meta = load_yaml_text("".join(lines[1:end]), source)
    except YamlError as exc:
        why = str(exc).removeprefix(f"{source}: ")
        raise SkillFileError(f"{source}: the front matter is {why}" if why.startswith("not valid YAML")
                             else f"{source}: the front matter: {why}") from None
    if not isinstance(meta, dict):
        raise SkillFileError(f"{source}: the front matter must be a mapping of Skill fields, got {type(meta).__name__}")
    if "description" in meta:
        raise SkillFileError(f"{source}: field 'description' belongs in the body below the front matter, not in it")
    try:
        skill = Skill.model_validate({**meta, "description": "".join(lines[end + 1:]).strip()})
    except ValidationError as exc:
        raise SkillFileError(f"{source}: {_validation_message(exc)}") from None
    try:
        check_condition(skill.trigger.condition)
    except SkillError as exc:
        raise SkillFileError(f"{source}: skill {skill.name!r}: field 'trigger.condition': {exc}") from None
    for what, ev in (("evidence", skill.evidence), ("imported", skill.imported)):
        if ev is not None and (why := evidence_error(ev)):  # a NaN claim imported, then made the skill unreadable
            raise SkillFileError(f"{source}: skill {skill.name!r}: field '{what}': {why}")
    if len(skill.name) > MAX_NAME:  # it names the exported file: 300 characters stopped `skills export` midway
        raise SkillFileError(f"{source}: skill name of {len(skill.name)} characters: at most {MAX_NAME}")
    if len(skill.expected) > MAX_EXPECTED or "\n" in skill.expected.strip():  # it goes into every LLM prompt
        raise SkillFileError(f"{source}: skill {skill.name!r}: field 'expected': one line of at most {MAX_EXPECTED} "
                             "characters (the outcome the skill predicts; the why goes in the body)")
    if why := knob_kind_error(skill):
        raise SkillFileError(f"{source}: skill {skill.name!r}: field 'intervention.knob': {why}")
    return skill, meta


def evidence_error(ev: Evidence) -> str | None:
    """Why a file's evidence claim cannot be a record (not finite, negative, more promotions than tries), or None.
    Checked on files only: a library's own rows are what `record_try` wrote."""
    nums = [ev.mean_effect, *(ev.last_interval or ())]
    if not all(math.isfinite(x) for x in nums):
        return "not finite (nan or inf)"
    if ev.tries < 0 or ev.promotions < 0:
        return "negative counts"
    if ev.promotions > ev.tries:
        return f"{ev.promotions} promotions out of {ev.tries} tries"
    return None


def knob_kind_error(skill: Skill) -> str | None:
    """Why a skill file's knob is not one of its kind's (the module docstring of `skills.model`), or None: a file
    naming `judge.*`, or `diagnostics/../x.py` (which became a candidate where the vet had no generator config to
    check it by), imported before (an outside review, eighty-second session). Checked on files (import, seeds), not
    on a library's rows, so a library written before keeps every skill readable."""
    knob = skill.intervention.knob
    if not knob.startswith(KNOB_PREFIX[skill.kind]):
        return f"{knob!r} is not a {skill.kind} knob (those start with {' or '.join(KNOB_PREFIX[skill.kind])})"
    if skill.kind == "diagnostic" and not re.match(DIAGNOSTIC_PATH, knob):
        return f"{knob!r}: a diagnostic is diagnostics/<name>.py (letters, digits, _)"
    return None


def load_skill_file(path: str | Path) -> Skill:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SkillFileError(f"{path}: cannot read it: {exc}") from None
    return parse_skill(text, str(path))[0]


def dump_skill(skill: Skill) -> str:
    """The file text of a skill: every field but the description as front matter, the description as the body
    (`imported` only when the skill has an imported claim)."""
    meta = skill.model_dump(mode="json", exclude={"description"} | ({"imported"} if skill.imported is None else set()))
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, default_flow_style=None, width=120)
    body = skill.description.strip()
    return f"---\n{front}---\n" + (f"{body}\n" if body else "")


# --- the database -------------------------------------------------------------------------------------------------------

MIGRATIONS: list[Any] = []


def migration(fn: Any) -> Any:
    MIGRATIONS.append(fn)
    return fn


@migration
def m001_skills_and_tries(db: Database) -> None:
    db["skills"].create(
        {
            "name": str, "kind": str, "definition": str, "description": str, "expected": str, "triggers": str,
            "domains": str, "tries": int, "promotions": int, "mean_effect": float, "last_interval": str,
            "families": str, "seed_hash": str, "created": str, "updated": str,
        },
        pk="name", not_null={"name", "kind", "definition"},
        defaults={"tries": 0, "promotions": 0, "mean_effect": 0.0, "families": "[]"},
    )
    db["skills"].enable_fts(["name", "description", "expected", "triggers", "domains"], create_triggers=True,
                            tokenize="porter unicode61")
    db["skill_tries"].create(
        {
            "skill": str, "run": str, "candidate": str, "promoted": int, "effect": float, "ci_low": float,
            "ci_high": float, "family": str, "commit_sha": str, "ts": str,
        },
        pk=("skill", "run", "candidate"),
    )


@migration
def m002_imported_evidence(db: Database) -> None:
    """Evidence an imported file claims is kept apart (`imported_evidence`, shown, never ranked). Skills an older
    version imported (provenance `import`) had the file's claim stored as their evidence: it moves to
    `imported_evidence`, and their evidence is rebuilt from the tries recorded in this library."""
    db["skills"].add_column("imported_evidence", str)
    for row in list(db["skills"].rows_where(select="name, definition, tries, promotions, mean_effect, last_interval, "
                                                   "families")):
        try:
            source = json.loads(row["definition"]).get("provenance", {}).get("source")
        except (ValueError, AttributeError):
            continue  # unreadable rows are skipped where they are used (`SkillLibrary.applicable`)
        if source != "import":
            continue
        claim = {"tries": row["tries"], "promotions": row["promotions"], "mean_effect": row["mean_effect"],
                 "last_interval": json.loads(row["last_interval"]) if row["last_interval"] else None,
                 "families": json.loads(row["families"] or "[]")}
        tries = list(db["skill_tries"].rows_where("skill = ?", [row["name"]], order_by="ts"))
        families = list(dict.fromkeys(t["family"] for t in tries if t["promoted"]))
        last = next(([t["ci_low"], t["ci_high"]] for t in reversed(tries) if t["ci_low"] is not None), None)
        db["skills"].update(row["name"], {
            "imported_evidence": json.dumps(claim), "tries": len(tries),
            "promotions": sum(t["promoted"] for t in tries),
            "mean_effect": sum(t["effect"] for t in tries) / len(tries) if tries else 0.0,
            "last_interval": json.dumps(last) if last else None, "families": json.dumps(families)})


def wal_mode(execute: Any, timeout_s: float) -> None:
    """`PRAGMA journal_mode=WAL` on a connection (its `execute`), asked again for up to `timeout_s` while the file is
    locked: SQLite answers a journal-mode change it cannot make now at once, without its busy handler, so of six
    processes opening one new file together (a bench's workers on a new home, two runs started at once) one in a
    few hundred failed with "database is locked". Shared by the run store and the instance cache."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if str(execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower() == "wal":
                return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
        if time.monotonic() > deadline:
            raise sqlite3.OperationalError("database is locked")
        time.sleep(0.05)


@contextlib.contextmanager
def _immediate(db: Database) -> Iterator[Database]:
    try:
        db.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:  # busy past the timeout: named, not a traceback out of a live run
        raise library_error(Path(db.conn.execute("PRAGMA database_list").fetchone()[2]), exc) from None
    try:
        yield db
    except BaseException:
        db.rollback()
        raise
    db.execute("COMMIT")


def _migrate(db: Database) -> list[str]:
    if not db["_migrations"].exists():  # under the write lock: two processes opening a fresh file at once
        with _immediate(db):  # raced here, the second failing at once ("database is locked", its timeout unused)
            db.execute("CREATE TABLE IF NOT EXISTS [_migrations] ([name] TEXT PRIMARY KEY, [applied_at] TEXT)")
    done = {r[0] for r in db.execute("SELECT name FROM _migrations").fetchall()}
    applied = []
    for fn in (f for f in MIGRATIONS if f.__name__ not in done):
        with _immediate(db):
            if db.execute("SELECT 1 FROM _migrations WHERE name = ?", [fn.__name__]).fetchone():
                continue
            fn(db)
            db["_migrations"].insert({"name": fn.__name__, "applied_at": _now()})
            applied.append(fn.__name__)
    return applied


def _trigger_text(skill: Skill) -> str:
    """Trigger codes for the full-text index: 'mapf.hole' is indexed as written and as its words."""
    return " ".join(skill.trigger.findings)


def _smoothed_rate(promotions: int, tries: int) -> float:
    """Promotion rate with a uniform prior: an untried skill scores 0.5, 3/3 scores 0.8, 0/3 scores 0.2."""
    return (promotions + 1) / (tries + 2)


@dataclass
class Applicable:
    """Skills whose trigger matches: first those of the task's family (or family-free), then, only as a fallback,
    skills proven elsewhere whose trigger matches the same kind of failure (general ones first)."""

    in_family: list[Skill] = field(default_factory=list)
    fallback: list[Skill] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # one line per stored skill that cannot be used, naming it


class SkillLibrary:
    def __init__(self, db: Database, path: Path):
        self.db, self.path = db, path

    @classmethod
    def open(cls, path: str | Path | None = None, *, seed_dir: Path | None = SEED_DIR) -> SkillLibrary:
        """Open (creating and migrating) the library at `path` (default `$EVOTRAINER_HOME/skills.db`) and sync the
        seed skills from `seed_dir` (None: no seeds)."""
        path = Path(path) if path is not None else default_path()
        db = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            db = Database(sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S))
            db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            wal_mode(db.execute, BUSY_TIMEOUT_S)
            _migrate(db)
            lib = cls(db, path)
            if seed_dir is not None and Path(seed_dir).is_dir():
                lib.sync_seeds(Path(seed_dir))
        except (sqlite3.Error, OSError) as exc:
            if db is not None:
                db.close()
            raise library_error(path, exc) from None
        except BaseException:  # a seed file that does not parse names itself (SkillFileError): the file is not left open
            if db is not None:
                db.close()
            raise
        return lib

    def check(self) -> None:
        """SQLite's quick check of the file (a damaged page raises `SkillLibraryError` naming the fix)."""
        try:
            rows = [r[0] for r in self.db.execute("PRAGMA quick_check").fetchall()]
        except sqlite3.Error as exc:
            raise library_error(self.path, exc) from None
        if rows != ["ok"]:
            raise library_error(self.path, "; ".join(map(str, rows[:3])))

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- rows <-> skills ------------------------------------------------------------------------------------------------

    @staticmethod
    def _definition_row(skill: Skill) -> dict[str, Any]:
        return {
            "name": skill.name, "kind": skill.kind,
            "definition": skill.model_dump_json(exclude={"evidence", "imported", "description"}),
            "description": skill.description.strip(), "expected": skill.expected, "triggers": _trigger_text(skill),
            "domains": " ".join(skill.domains), "updated": _now(),
        }

    @staticmethod
    def _evidence_row(ev: Evidence) -> dict[str, Any]:
        return {"tries": ev.tries, "promotions": ev.promotions, "mean_effect": ev.mean_effect,
                "last_interval": json.dumps(list(ev.last_interval)) if ev.last_interval else None,
                "families": json.dumps(ev.families)}

    @staticmethod
    def _skill(row: Mapping[str, Any]) -> Skill:
        """The Skill of a row; SkillError naming it when the row does not read back (a database written by hand)."""
        try:
            ev = Evidence(tries=row["tries"], promotions=row["promotions"], mean_effect=row["mean_effect"],
                          last_interval=tuple(json.loads(row["last_interval"])) if row["last_interval"] else None,
                          families=json.loads(row["families"]))
            claim = json.loads(row["imported_evidence"]) if row.get("imported_evidence") else None
            return Skill.model_validate({**json.loads(row["definition"]), "description": row["description"] or "",
                                         "evidence": ev.model_dump(), "imported": claim})
        except ValidationError as exc:
            raise SkillError(f"skill {row['name']!r} does not read back: {_validation_message(exc)[:300]}") from None
        except (ValueError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
            raise SkillError(f"skill {row['name']!r} does not read back: {type(exc).__name__}: "
                             f"{str(exc)[:300]}") from None

    def _row(self, name: str) -> dict[str, Any] | None:
        rows = list(self.db["skills"].rows_where("name = ?", [name]))
        return rows[0] if rows else None

    def _insert(self, skill: Skill, seed_hash: str | None = None) -> None:
        t = _now()
        self.db["skills"].insert({**self._definition_row(skill), **self._evidence_row(skill.evidence),
                                  "imported_evidence": skill.imported.model_dump_json() if skill.imported else None,
                                  "seed_hash": seed_hash, "created": t, "updated": t})

    # --- reading --------------------------------------------------------------------------------------------------------

    def get(self, name: str) -> Skill:
        row = self._row(name)
        if row is None:
            import difflib

            names = self.names()
            close = [n for n in names if name in n][:3] or difflib.get_close_matches(name, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else "; list them with `evotrainer skills list`"
            raise UnknownSkillError(f"no skill named {name!r} in {self.path}{hint}")
        return self._skill(row)

    def has_seeds(self) -> bool:
        """Does the library hold any seed skill (one synced from a seed file)?"""
        return self.db.execute("SELECT 1 FROM skills WHERE seed_hash IS NOT NULL LIMIT 1").fetchone() is not None

    def names(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT name FROM skills ORDER BY name").fetchall()]

    def all(self, task: str | None = None, skipped: list[str] | None = None) -> list[Skill]:
        """Every skill (that fits `task`: its domains include it, it has no domains, or it is general), by name.
        With a `skipped` list a stored skill that does not read back is named there and left out, instead of
        raising (a listing or an export of a library with one bad row still shows the rest)."""
        skills = []
        for r in self.db["skills"].rows_where(order_by="name"):
            try:
                skills.append(self._skill(r))
            except SkillError as exc:
                if skipped is None:
                    raise
                skipped.append(f"skill {r['name']} skipped: {exc}")
        return [s for s in skills if _fits(s, task)]

    def tries(self, name: str) -> list[dict[str, Any]]:
        return list(self.db["skill_tries"].rows_where("skill = ?", [name], order_by="ts"))

    # --- writing --------------------------------------------------------------------------------------------------------

    def add(self, skill: Skill, *, replace: bool = False) -> Skill:
        """Save a new skill (e.g. one a run distilled). An existing name is an error unless `replace`, which updates
        the definition and keeps the evidence gathered so far."""
        try:
            check_condition(skill.trigger.condition)
        except SkillError as exc:
            raise SkillError(f"skill {skill.name!r}: field 'trigger.condition': {exc}") from None
        with _immediate(self.db):
            if self._row(skill.name) is None:
                self._insert(skill)
            elif replace:
                self.db["skills"].update(skill.name, {**self._definition_row(skill), "seed_hash": None})
            else:
                raise SkillError(f"skill {skill.name!r} already exists; pick another name or pass replace=True")
        return self.get(skill.name)

    def sync_seeds(self, seed_dir: Path) -> list[str]:
        """Add new seed skills; update a seed skill's definition when its file changed; never touch evidence, and never
        overwrite a same-named skill that did not come from a seed file. Returns the names added or updated."""
        parsed = []
        for f in sorted(Path(seed_dir).glob("*.md")):
            text = f.read_text(encoding="utf-8")
            parsed.append((parse_skill(text, str(f))[0], hashlib.sha256(text.encode()).hexdigest()))
        changed = []
        stale = [(sk, d) for sk, d in parsed if (row := self._row(sk.name)) is None
                 or (row["seed_hash"] is not None and row["seed_hash"] != d)]
        if not stale:  # nothing to write: no write lock (a second run, or a person's sqlite3, may hold one)
            return changed
        with _immediate(self.db):
            for skill, digest in stale:
                row = self._row(skill.name)
                if row is None:
                    self._insert(skill, seed_hash=digest)
                elif row["seed_hash"] is not None and row["seed_hash"] != digest:
                    self.db["skills"].update(skill.name, {**self._definition_row(skill), "seed_hash": digest})
                else:
                    continue
                changed.append(skill.name)
        return changed

    def record_try(self, name: str, *, promoted: bool, effect: float, interval: tuple[float, float] | None,
                   family: str, run: str, candidate: str, commit: str | None = None) -> bool:
        """Add one backtested try of a skill to its evidence. Idempotent per (skill, run, candidate): returns False
        (and changes nothing) when that try was already recorded."""
        self.get(name)  # a clear error for an unknown skill
        with _immediate(self.db):
            cur = self.db.execute(
                "INSERT OR IGNORE INTO skill_tries (skill, run, candidate, promoted, effect, ci_low, ci_high, family, "
                "commit_sha, ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [name, run, candidate, int(promoted), float(effect), interval[0] if interval else None,
                 interval[1] if interval else None, family, commit, _now()])
            if cur.rowcount == 0:
                return False
            ev = self._skill(self._row(name)).evidence
            families = ev.families + ([family] if promoted and family not in ev.families else [])
            new = Evidence(tries=ev.tries + 1, promotions=ev.promotions + int(promoted),
                           mean_effect=(ev.mean_effect * ev.tries + effect) / (ev.tries + 1),
                           last_interval=tuple(interval) if interval else ev.last_interval, families=families)
            self.db["skills"].update(name, {**self._evidence_row(new), "updated": _now()})
        return True

    def merge_from(self, other: SkillLibrary, redefined: list[str] | None = None) -> tuple[list[str], int]:
        """Bring what another library learnt into this one (an experiment's evolved run learns in a private copy of
        the library and hands its learning back when it ends): each skill this library lacks (a run-born one) with
        the evidence the other holds for it and its tries; for a skill both have with the same definition, each try
        this one has not recorded (tries are keyed by skill, run and candidate, so a try the copy inherited from here,
        or one merged before, counts once). A skill redefined here meanwhile (`skills import --replace`, a changed
        seed file) keeps its evidence: the copy's tries tried the old definition; its name goes into `redefined`.
        Definitions of skills both have are left as they are here. Returns (skills added, tries added)."""
        added, tries = [], 0
        for row in other.db["skills"].rows:
            name = row["name"]
            if (mine := self._row(name)) is not None and mine["definition"] != row["definition"]:
                if redefined is not None and any(
                        not self.db.execute("SELECT 1 FROM skill_tries WHERE skill = ? AND run = ? AND candidate = ?",
                                            [name, t["run"], t["candidate"]]).fetchone()
                        for t in other.db["skill_tries"].rows_where("skill = ?", [name])):
                    redefined.append(name)
                continue
            if mine is None:
                with _immediate(self.db):
                    self.db["skills"].insert(row)
                    for t in other.db["skill_tries"].rows_where("skill = ?", [name]):
                        self.db["skill_tries"].insert(t, ignore=True)
                added.append(name)
                continue
            for t in other.db["skill_tries"].rows_where("skill = ?", [name], order_by="ts"):
                iv = (t["ci_low"], t["ci_high"]) if t["ci_low"] is not None else None
                tries += self.record_try(name, promoted=bool(t["promoted"]), effect=t["effect"], interval=iv,
                                         family=t["family"], run=t["run"], candidate=t["candidate"],
                                         commit=t["commit_sha"])
        return added, tries

    # --- retrieval ------------------------------------------------------------------------------------------------------

    def search(self, text: str, task: str | None = None, limit: int = 10) -> list[Skill]:
        """Full-text search over name, description, expected outcome, trigger findings and domains, ranked by BM25
        times an evidence weight (0.5 + smoothed promotion rate): of two equally relevant skills, the one that won
        more often comes first. With `task`, only skills that fit it (see `all`)."""
        words = re.findall(r"\w+", text.lower())
        if not words:
            return sorted(self.all(task), key=lambda s: -_smoothed_rate(s.evidence.promotions, s.evidence.tries))[:limit]
        query = " OR ".join(f'"{w}"' for w in dict.fromkeys(words))
        rows = self.db.execute(
            "SELECT skills.*, bm25(skills_fts, 3.0, 1.0, 1.0, 4.0, 2.0) AS bm25 FROM skills_fts "
            "JOIN skills ON skills.rowid = skills_fts.rowid WHERE skills_fts MATCH ?", [query])
        cols = [d[0] for d in rows.description]
        scored = []
        for values in rows.fetchall():
            row = dict(zip(cols, values))
            skill = self._skill(row)
            if _fits(skill, task):
                weight = 0.5 + _smoothed_rate(row["promotions"], row["tries"])
                scored.append((-row["bm25"] * weight, skill.name, skill))  # bm25 is negative: lower = better
        scored.sort(key=lambda t: (-t[0], t[1]))
        return [s for _, _, s in scored[:limit]]

    def applicable(self, finding_codes: Sequence[str], task: str, *,
                   facts: Mapping[str, Mapping[str, Any]] | None = None) -> Applicable:
        """Skills triggered by these findings (codes in priority order; a trigger may use fnmatch wildcards, e.g.
        'grpo.*'). In-family: the skill's domains include `task` or are empty; ordered by the first finding it matches,
        then by evidence. Fallback: skills of other families that match a code exactly or by its kind (the part after
        the family prefix: 'math.format' ~ 'mapf.format'), general ones first. `facts` (code -> {rate, count,
        severity}) lets trigger conditions filter; without facts for a code its conditions are not checked.
        A stored skill that does not read back or whose condition fails `check_condition` (a library written by an
        older version, a database edited by hand) is left out and named in `skipped`: it costs itself, never the
        caller."""
        codes = list(finding_codes)
        facts = facts or {}
        suffixes = {c.split(".", 1)[-1]: i for i, c in reversed(list(enumerate(codes)))}
        in_family: list[tuple[Any, ...]] = []
        fallback: list[tuple[Any, ...]] = []
        skipped: list[str] = []
        for row in self.db["skills"].rows_where(order_by="name"):
            try:
                skill = self._skill(row)
                check_condition(skill.trigger.condition)
            except SkillError as exc:
                skipped.append(f"skill {row['name']} skipped: {exc}")
                continue
            rate = _smoothed_rate(skill.evidence.promotions, skill.evidence.tries)
            own = not skill.domains or task in skill.domains
            first = self._first_match(skill, codes, facts)
            if own and first is not None:
                in_family.append((first, -rate, skill.name, skill))
            elif not own:
                if first is None:
                    kinds = [suffixes[t.split(".", 1)[-1]] for t in skill.trigger.findings
                             if t.split(".", 1)[-1] in suffixes]
                    first = min(kinds) if kinds else None
                if first is not None:
                    fallback.append((not skill.general, first, -rate, skill.name, skill))
        return Applicable([t[-1] for t in sorted(in_family, key=lambda t: t[:-1])],
                          [t[-1] for t in sorted(fallback, key=lambda t: t[:-1])], skipped)

    @staticmethod
    def _first_match(skill: Skill, codes: list[str], facts: Mapping[str, Mapping[str, Any]]) -> int | None:
        for i, code in enumerate(codes):
            if any(fnmatch.fnmatchcase(code, t) for t in skill.trigger.findings):
                if code in facts and not condition_holds(skill.trigger.condition, facts[code]):
                    continue
                return i
        return None

    # --- export / import ------------------------------------------------------------------------------------------------

    def export(self, out_dir: str | Path, names: Iterable[str] | None = None,
               skipped: list[str] | None = None, overwrite: bool = True) -> list[Path]:
        """Write `<name>.md` per skill (all, or `names`) into `out_dir`; returns the paths. `skipped`: as `all`.
        Without `overwrite`, a file there whose skill is defined or described otherwise (a hand edit, another
        library's skill of that name, a file that is not a skill) is a `SkillError` naming it, and nothing is
        written; an earlier export of the same definition is refreshed (its evidence may have grown since)."""
        out = Path(out_dir)
        skills = [self.get(n) for n in names] if names is not None else self.all(skipped=skipped)
        texts = {out / f"{s.name}.md": dump_skill(s) for s in skills}

        def same(path: Path, skill: Skill) -> bool:
            try:
                theirs, _ = parse_skill(path.read_text(encoding="utf-8"), str(path))
            except (OSError, UnicodeDecodeError, ValueError):
                return False
            a, b = self._definition_row(theirs), self._definition_row(skill)
            return (a["definition"], a["description"]) == (b["definition"], b["description"])

        if not overwrite:
            differ = [p.name for s in skills if (p := out / f"{s.name}.md").exists() and not same(p, s)]
            if differ:
                raise SkillError(f"{out} already holds {len(differ)} skill file(s) that say something else "
                                 f"({', '.join(differ[:5])}{', ...' if len(differ) > 5 else ''}); export into another "
                                 "folder, or pass --overwrite to replace them")
        try:
            out.mkdir(parents=True, exist_ok=True)
            for p, t in texts.items():
                p.write_text(t, encoding="utf-8")
        except OSError as exc:  # a name too long for the file system, a full or read-only disk: one line
            raise SkillError(f"{out}: cannot write the export: {exc.strerror or exc} ({exc.filename or out})") from None
        return list(texts)

    def import_files(self, paths: Iterable[str | Path], *, replace: bool = False,
                     replaced: list[str] | None = None) -> list[str]:
        """Import skill files (a folder means its *.md). All files are checked before anything is written (the
        Skill fields, the trigger condition's grammar, types and size), so a malformed file imports nothing.
        Evidence is not trusted (IMPORT_TRUST): a new skill starts with no evidence of its own and keeps the file's
        claim as `imported` (its `evidence`, else its own `imported`), shown but never ranked. A file naming a skill
        the library has with the same definition changes nothing (an export brought back keeps what was earned
        here); with another definition it is refused unless `replace`: then the definition is the file's and the
        evidence starts again from nothing (what the old definition earned does not rank the new one; its tries
        stay in the history), and the name is added to `replaced`. Returns the names imported."""
        files: list[Path] = []
        for p in map(Path, paths):
            if p.is_dir():
                found = sorted(p.glob("*.md"))
                if not found:  # an empty or wrong folder imported "0 skills" and exit 0: said, nothing written
                    raise SkillFileError(f"{p}: a folder with no *.md skill files (`evotrainer skills export DIR` "
                                         "writes one file per skill); nothing imported")
                files += found
            elif p.exists():
                files.append(p)
            else:
                raise SkillFileError(f"{p}: no such file or folder")
        files = list({f.resolve(): f for f in files}.values())  # a file named twice (by itself and by its folder)
        parsed = []
        for f in files:
            if not f.is_file():  # a FIFO hung the import; a device never ends
                raise SkillFileError(f"{f}: not a regular file; a skill is a <name>.md file")
            if f.stat().st_size > MAX_SKILL_FILE_BYTES:  # it is copied into every evolved run's library
                raise SkillFileError(f"{f}: {f.stat().st_size} bytes, more than a skill file's {MAX_SKILL_FILE_BYTES}")
            try:
                text = f.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise SkillFileError(f"{f}: cannot read it: {exc}") from None
            skill, meta = parse_skill(text, str(f))
            if "provenance" not in meta:
                skill = skill.model_copy(update={"provenance": skill.provenance.model_copy(update={"source": "import"})})
            claim = skill.evidence if skill.evidence != Evidence() else skill.imported
            parsed.append(skill.model_copy(update={"evidence": Evidence(), "imported": claim}))
        dupes = {s.name for s in parsed if [x.name for x in parsed].count(s.name) > 1}
        if dupes:
            raise SkillFileError(f"two files define skill {min(dupes)!r}; keep one")
        differ = [s.name for s in parsed if (row := self._row(s.name)) is not None
                  and row["definition"] != self._definition_row(s)["definition"]]
        if differ and not replace:
            raise SkillFileError(
                f"the library already has skill(s) {', '.join(differ[:5])} with another definition; importing would "
                "replace what they do while keeping the evidence they earned. Rename the file's skill, or pass "
                "--replace (the definition is replaced and its evidence starts again from nothing)")
        with _immediate(self.db):
            for skill in parsed:
                if self._row(skill.name) is None:
                    self._insert(skill)
                elif skill.name in differ:
                    self.db["skills"].update(skill.name, {
                        **self._definition_row(skill), **self._evidence_row(Evidence()), "seed_hash": None,
                        "imported_evidence": skill.imported.model_dump_json() if skill.imported else None})
                    if replaced is not None:
                        replaced.append(skill.name)
                elif self._row(skill.name)["description"] != skill.description.strip():
                    # the same behaviour, other words: the prose is the file's (before, an edited description was
                    # dropped while the import said "imported"); what the skill earned stays
                    self.db["skills"].update(skill.name, {"description": skill.description.strip(), "updated": _now()})
        return [s.name for s in parsed]

    def import_dir(self, folder: str | Path) -> list[str]:
        folder = Path(folder)
        if not folder.is_dir():
            raise SkillFileError(f"{folder}: not a folder; pass a folder of <name>.md skill files")
        return self.import_files([folder])


def _fits(skill: Skill, task: str | None) -> bool:
    return task is None or not skill.domains or task in skill.domains or skill.general
