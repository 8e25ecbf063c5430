"""graph.db stays bounded: the run's LangGraph saver keeps only the latest checkpoints, and a resume (after a kill,
after a human-gate interrupt) still continues exactly where it stopped. Real LangGraph, real SQLite."""

from __future__ import annotations

import operator
import sqlite3
from typing import Annotated, TypedDict

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from harness.graph import LOG_LINES, recent
from harness.graphstore import BoundedSqliteSaver, prune


class S(TypedDict, total=False):
    i: int
    total: Annotated[int, operator.add]
    log: Annotated[list[str], recent]
    answer: str


def _graph(saver, steps: int, pause_at: int | None = None, crash_at: int | None = None):
    def step(state: S) -> dict:
        i = state.get("i", 0) + 1
        if crash_at is not None and i == crash_at:
            raise RuntimeError("killed")
        out: dict = {"i": i, "total": i, "log": [f"step {i} " + "x" * 200]}
        if pause_at is not None and i == pause_at:
            out["answer"] = interrupt(f"approve step {i}?")
        return out

    g = StateGraph(S)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: END if s["i"] >= steps else "step")
    return g.compile(checkpointer=saver)


def _rows(path) -> tuple[int, int]:
    con = sqlite3.connect(path)
    try:
        return (con.execute("SELECT count(*) FROM checkpoints").fetchone()[0],
                con.execute("SELECT count(*) FROM writes").fetchone()[0])
    finally:
        con.close()


def _run(path, steps, saver_cls=BoundedSqliteSaver, first=None, **kw):
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        return _graph(saver_cls(conn), steps, **kw).invoke(first, {"configurable": {"thread_id": "t"},
                                                                   "recursion_limit": 10_000})
    finally:
        conn.close()


def test_the_saver_keeps_the_latest_checkpoints_and_the_file_stops_growing(tmp_path):
    """200 super-steps leave 2 checkpoints, and a file no larger than after 100 (pages are reused): the unbounded
    saver keeps every one. The bounded log reducer keeps the last LOG_LINES lines. Would catch: a saver that prunes
    nothing, one that deletes the latest (the final state would be lost), a log that grows with the run."""
    out = _run(tmp_path / "a.db", 200, first={"i": 0})
    assert out["i"] == 200 and out["total"] == sum(range(1, 201))
    assert len(out["log"]) == LOG_LINES and out["log"][-1].startswith("step 200")
    assert _rows(tmp_path / "a.db")[0] == 2
    _run(tmp_path / "b.db", 100, first={"i": 0})
    size = {name: (tmp_path / f"{name}.db").stat().st_size for name in "ab"}
    assert size["a"] <= 1.1 * size["b"], size
    _run(tmp_path / "c.db", 200, saver_cls=SqliteSaver, first={"i": 0})
    assert _rows(tmp_path / "c.db")[0] > 200 and (tmp_path / "c.db").stat().st_size > 5 * size["a"]
    with pytest.raises(ValueError, match="at least the latest"):
        BoundedSqliteSaver(sqlite3.connect(":memory:"), keep=0)


def test_a_run_resumes_after_a_crash_and_after_an_interrupt(tmp_path):
    """A crash at step 30 and a resume (input None) continue from step 29's checkpoint; a human-gate interrupt at
    step 50 survives a process restart (the interrupt is a write pending on the latest checkpoint) and the answer
    reaches the node. Would catch a prune that deletes the latest checkpoint's pending writes."""
    db = tmp_path / "g.db"
    with pytest.raises(RuntimeError, match="killed"):
        _run(db, 80, first={"i": 0}, crash_at=30)
    assert _rows(db)[0] <= 2
    out = _run(db, 80, first=None, pause_at=50)  # resumed: runs 30..50, pauses
    assert out["i"] == 49 and "__interrupt__" in out
    out = _run(db, 80, first=Command(resume="yes"), pause_at=50)
    assert out["i"] == 80 and out["answer"] == "yes" and out["total"] == sum(range(1, 81))


def test_prune_bounds_a_file_written_by_the_unbounded_saver(tmp_path):
    """An older run's graph.db: `prune` keeps the latest `keep`, and the run still resumes from it."""
    db = tmp_path / "old.db"
    with pytest.raises(RuntimeError):
        _run(db, 60, saver_cls=SqliteSaver, first={"i": 0}, crash_at=40)
    con = sqlite3.connect(db)
    try:
        assert prune(con, "t", keep=1) > 30 and prune(con, "t", keep=1) == 0
    finally:
        con.close()
    assert _rows(db)[0] == 1
    out = _run(db, 60, first=None)
    assert out["i"] == 60 and out["total"] == sum(range(1, 61))
