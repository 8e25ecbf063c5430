"""The run's LangGraph checkpoints (graph.db), kept bounded: only the latest few per thread.

    from harness.graphstore import BoundedSqliteSaver, prune
    saver = BoundedSqliteSaver(sqlite3.connect(run_dir / "graph.db", check_same_thread=False))   # keep=2
    prune(conn, thread_id, keep=2)                                                              # an old run's file

LangGraph's `SqliteSaver` keeps every super-step's checkpoint (about ten a stage) and each one holds the whole state,
so an overnight run's graph.db grew without bound (the eighteenth session's soak: 150 KB a stage). A resume needs only
the latest checkpoint and the writes pending on it (`SqliteSaver.get_tuple` reads those); everything else the review
and the report show is in run.db, the harness repo and rollouts/. So after each `put` the saver deletes the thread's
older checkpoints and their writes beyond the latest `keep` (2: the latest and its parent). `SqliteSaver` implements no
`prune` (langgraph-checkpoint 4.x declares it on the base class only); the state has no `DeltaChannel`, so every kept
checkpoint is whole on its own (the base class's warning about pruning delta chains does not apply). Deleted pages are
reused by SQLite, so the file stops growing once it holds `keep` checkpoints (no VACUUM needed).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver

KEEP = 2


def _prune(cur: sqlite3.Cursor, thread_id: str, ns: str, keep: int) -> int:
    newest = ("SELECT checkpoint_id FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? "
              "ORDER BY checkpoint_id DESC LIMIT ?")
    args = (thread_id, ns, thread_id, ns, keep)
    cur.execute(f"DELETE FROM writes WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id NOT IN ({newest})",
                args)
    cur.execute(f"DELETE FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id NOT IN "
                f"({newest})", args)
    return cur.rowcount


def prune(conn: sqlite3.Connection, thread_id: str, keep: int = KEEP) -> int:
    """Delete `thread_id`'s checkpoints (every namespace) older than its latest `keep`, with their writes. Returns
    the number of checkpoints deleted. For a graph.db written before the saver bounded it."""
    if keep < 1:
        raise ValueError(f"keep={keep}: a resume needs at least the latest checkpoint")
    namespaces = [r[0] for r in conn.execute("SELECT DISTINCT checkpoint_ns FROM checkpoints WHERE thread_id = ?",
                                             (thread_id,))]
    cur = conn.cursor()
    try:
        deleted = sum(_prune(cur, thread_id, ns, keep) for ns in namespaces)
        conn.commit()
    finally:
        cur.close()
    return deleted


class BoundedSqliteSaver(SqliteSaver):
    """`SqliteSaver` that keeps only the latest `keep` checkpoints of each thread and namespace."""

    def __init__(self, conn: sqlite3.Connection, *args: Any, keep: int = KEEP, **kwargs: Any) -> None:
        if keep < 1:
            raise ValueError(f"keep={keep}: a resume needs at least the latest checkpoint")
        super().__init__(conn, *args, **kwargs)
        self.keep = keep

    def put(self, config, checkpoint, metadata, new_versions):  # type: ignore[no-untyped-def]
        out = super().put(config, checkpoint, metadata, new_versions)
        conf = out["configurable"]
        with self.cursor() as cur:
            _prune(cur, str(conf["thread_id"]), str(conf.get("checkpoint_ns", "")), self.keep)
        return out
