"""run.db for Datasette: every table and column described, and canned queries for the morning review.

    datasette runs/<id>/run.db --metadata runs/<id>/datasette.json     # pip install datasette (optional)

The loop writes `datasette.json` next to run.db when a run is prepared (`write_metadata`). The format is Datasette's
metadata file (0.6x: descriptions per table and column, canned queries under the database). Datasette is not a
dependency: the file is plain JSON and the queries are plain SQLite, tested against a real run.db
(tests/test_run.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TABLES: dict[str, tuple[str, dict[str, str]]] = {
    "runs": ("One row per run: its config and status.", {
        "id": "run id (the runs/<id> folder name)", "config": "the run config as JSON", "status":
        "created | running | interrupted | finished", "budget": "the run's budget (stages, wall time) as JSON",
        "created": "UTC timestamp", "updated": "UTC timestamp"}),
    "stages": ("One row per training stage: its checkpoint and held-out metrics.", {
        "run": "run id", "stage": "stage number (1-based; 0 is the warm start)", "status": "running | done",
        "checkpoint": "the policy checkpoint the stage ended with", "metrics":
        "JSON: held-out valid/optimal on the test suite, wall and compute seconds, overhead share",
        "started": "UTC timestamp", "ended": "UTC timestamp"}),
    "candidates": ("Every proposed harness change, one factor each, with its verdict and evidence.", {
        "id": "candidate id, s<stage>c<i> (its branch is cand/<id> in the harness repo)", "run": "run id",
        "stage": "stage that proposed it", "kind": "env | recipe | reward | diagnostic", "knob": "the one knob "
        "(or diagnostics/<name>.py) it changes", "patch": "JSON of the change (knob, value or code)", "old_value":
        "the knob's value before", "rationale": "why the engineer proposed it", "expected": "the expected effect",
        "engineer": "rule | llm | scripted", "skill": "the skill it came from, if any", "commit_sha":
        "its commit in the harness repo", "tag": "promoted/<stage>-<id>, rejected/<id> or inconclusive/<id>", "status":
        "proposed | vetted | backtested | promoted | rejected | rejected_vet", "reason": "the verdict's reason",
        "effect": "paired effect on backtest valid (candidate - control)", "ci_low": "lower bound of its interval",
        "ci_high": "upper bound", "n": "backtest instances (paired)", "evidence":
        "JSON: per-slice effects, minimum detectable effect (mde), samples, greedy rates, vetoes",
        "created": "UTC timestamp", "updated": "UTC timestamp"}),
    "evaluations": ("Every evaluation cell: an arm on a split, overall (slice_key '') or per slice.", {
        "run": "run id", "stage": "stage", "arm": "policy | control | a candidate id", "split":
        "probe | backtest | test", "slice_key": "'' for overall, else size | agents | holes | wait | block",
        "slice_value": "the slice's value", "n": "instances", "valid": "valid rate", "optimal": "optimal rate",
        "created": "UTC timestamp"}),
    "findings": ("What the diagnose step found per stage (built-in and evolved diagnostics).", {
        "run": "run id", "stage": "stage", "code": "finding code (e.g. mapf.hole, grpo.dead_groups)", "slice":
        "the slice it is about, as JSON", "severity": "info | warn | critical", "count": "rollouts affected",
        "rate": "share of rollouts affected", "examples": "a few example rollouts (JSON)", "knobs":
        "knobs that usually address it (JSON)", "message": "one line", "created": "UTC timestamp"}),
    "events": ("The run's log: node starts and ends, engineer notes, verdicts, warnings.", {
        "id": "event id (order)", "run": "run id", "stage": "stage (null: run level)", "node":
        "the graph node (setup, train, probe, diagnose, propose, vet, backtest, decide, remember)", "kind":
        "event kind (node, verdict, warning, engineer_note, reply_rejected, ...)", "message": "one line", "data":
        "JSON details", "key": "dedup key of events written once", "ts": "UTC timestamp"}),
    "compute": ("The compute ledger: seconds, tokens and steps per stage, arm and kind.", {
        "run": "run id", "stage": "stage", "arm": "policy | control | a candidate id", "kind":
        "sft | grpo | rollout | eval", "label": "what it was for (probe, backtest, test, ...)", "seconds":
        "wall seconds", "tokens": "tokens generated", "steps": "optimiser steps", "updated": "UTC timestamp"}),
    "seed_cursor": ("Next unused seed per split: held-out hygiene (no seed is drawn twice).", {
        "run": "run id", "split": "train | probe | backtest | test", "next": "next unused index"}),
    "seed_draws": ("Every block of seeds drawn, by purpose.", {
        "run": "run id", "split": "split", "key": "what the draw was for", "start": "first index", "n": "count",
        "ts": "UTC timestamp"}),
    "nodes": ("Results of finished graph nodes (what resume replays instead of recomputing).", {
        "run": "run id", "stage": "stage", "node": "node name (or arm:<id>, judge:start)", "result": "JSON result",
        "ts": "UTC timestamp"}),
    "_migrations": ("Schema migrations applied to this file.", {"name": "migration", "applied_at": "UTC timestamp"}),
}

QUERIES: dict[str, dict[str, str]] = {
    "decision_timeline": {
        "title": "Decision timeline",
        "description": "Every candidate in order: the change, its verdict, paired effect with interval, minimum "
                       "detectable effect and the reason.",
        "sql": "SELECT stage, id, kind, knob, old_value, json_extract(patch, '$.value') AS new_value, status, "
               "round(effect, 4) AS effect, round(ci_low, 4) AS ci_low, round(ci_high, 4) AS ci_high, n, "
               "round(json_extract(evidence, '$.mde'), 4) AS mde, engineer, skill, tag, reason, rationale "
               "FROM candidates ORDER BY stage, created, id",
    },
    "heldout_by_stage": {
        "title": "Held-out test suite by stage and slice",
        "description": "Valid and optimal rate of the policy on the test suite after each stage, overall and per "
                       "slice (stage 0 is the warm start).",
        "sql": "SELECT slice_key, slice_value, stage, n, round(valid, 4) AS valid, round(optimal, 4) AS optimal "
               "FROM evaluations WHERE split = 'test' AND arm = 'policy' ORDER BY slice_key, slice_value, stage",
    },
    "compute_by_stage": {
        "title": "Compute by stage",
        "description": "Seconds, tokens and steps per stage and kind: what the loop paid for training and judging.",
        "sql": "SELECT stage, kind, round(sum(seconds), 1) AS seconds, sum(tokens) AS tokens, sum(steps) AS steps "
               "FROM compute GROUP BY stage, kind ORDER BY stage, kind",
    },
    "warnings": {
        "title": "Warnings and rejected engineer replies",
        "description": "What the run flagged: detectability warnings, regressions, rejected replies, fallbacks.",
        "sql": "SELECT id, stage, node, kind, message, ts FROM events WHERE kind IN ('warning', 'regression', "
               "'reply_rejected', 'fallback', 'engineer_note') ORDER BY id",
    },
}


def metadata(db_name: str = "run") -> dict[str, Any]:
    """Datasette metadata for a run.db opened as `db_name` (Datasette names a database after its file stem)."""
    return {
        "title": "evotrainer run",
        "description": "What an autonomous run measured and decided. Start with the canned queries below.",
        "databases": {db_name: {
            "tables": {t: {"description": d, "columns": cols} for t, (d, cols) in TABLES.items()},
            "queries": QUERIES,
        }},
    }


def write_metadata(run_dir: Path) -> Path:
    """Write runs/<id>/datasette.json (idempotent)."""
    out = Path(run_dir) / "datasette.json"
    text = json.dumps(metadata(), indent=1) + "\n"
    if not out.exists() or out.read_text() != text:
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(text)
        tmp.replace(out)
    return out
