"""Plan checking for MAPF-FrozenLake: the per-step Python reference (`simulate`) and the batched numpy validator
(`validate_arrays`), which must agree on validity and on the first violation (type, agent, step).

Semantics (shared by both): positions at t = 0 are the starts; at step t = 1..T every agent applies its t-th move
(U/D/L/R/W; after its plan ends it waits). The first violation is the earliest step with one; within a step the order
is: off_grid / hole (lowest agent first), then vertex_conflict (two agents on one cell; lowest pair), then
edge_conflict (two agents swap cells; lowest pair). With no violation, an agent not on its goal after T steps is
goal_not_reached. An agent's arrival is one past the last step it is off its goal; the makespan is the latest arrival.

    .venv/bin/python -c "from harness.tasks.mapf_validate import simulate; print(simulate(3, ['...']*3, [(0,0)], [(0,2)], ['RR']))"
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

DELTA = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1), "W": (0, 0)}
CODES = "UDLRW"  # move code = CODES.index(letter); W (4) pads
DR = np.array([-1, 1, 0, 0, 0], dtype=np.int64)
DC = np.array([0, 0, -1, 1, 0], dtype=np.int64)
CHUNK = 1 << 26  # occupancy-table cells per validate_arrays call (int8): larger batches are split
FAILURES = ("off_grid", "hole", "vertex_conflict", "edge_conflict", "goal_not_reached")


@dataclass
class Simulation:
    failure: str | None  # first violation (or goal_not_reached); None when the plan is valid
    agent: int = -1
    step: int = -1
    cell: tuple[int, int] | None = None
    other: int = -1  # the other agent of a conflict
    makespan: int = 0
    final: list[tuple[int, int]] = field(default_factory=list)
    clean_on_goal: int = 0  # agents on their goal at the end and never part of any violation


# --- the per-step Python reference -----------------------------------------------------------------------------------


def simulate(size: int, grid: list[str], starts, goals, moves: list[str]) -> Simulation:
    """Run the whole plan step by step (continuing after violations, an off-grid move leaves the agent in place) and
    report the first violation, the makespan and how many agents end on their goal untouched by any violation."""
    k = len(starts)
    pos = [tuple(s) for s in starts]
    goals = [tuple(g) for g in goals]
    T = max((len(m) for m in moves), default=0)
    arrival = [0 if pos[a] == goals[a] else 1 for a in range(k)]
    first: tuple | None = None
    bad: set[int] = set()
    for t in range(1, T + 1):
        new = []
        moved_bad = None
        for a in range(k):
            mv = moves[a][t - 1] if t - 1 < len(moves[a]) else "W"
            dr, dc = DELTA[mv]
            r, c = pos[a][0] + dr, pos[a][1] + dc
            if not (0 <= r < size and 0 <= c < size):
                bad.add(a)
                moved_bad = moved_bad or ("off_grid", a, t, (r, c), -1)
                r, c = pos[a]
            elif grid[r][c] == "#":
                bad.add(a)
                moved_bad = moved_bad or ("hole", a, t, (r, c), -1)
            new.append((r, c))
        at: dict[tuple[int, int], list[int]] = {}
        for a, cell in enumerate(new):
            at.setdefault(cell, []).append(a)
        vertex = [(ags[0], ags[1]) for ags in at.values() if len(ags) > 1]
        for ags in at.values():
            if len(ags) > 1:
                bad.update(ags)
        came = {(pos[a], new[a]): a for a in range(k) if new[a] != pos[a]}
        edge = []
        for a in range(k):
            b = came.get((new[a], pos[a]))
            if b is not None and a < b:
                edge.append((a, b))
                bad.update((a, b))
        if first is None:
            if moved_bad:
                first = moved_bad
            elif vertex:
                a, b = min(vertex)
                first = ("vertex_conflict", a, t, new[a], b)
            elif edge:
                a, b = min(edge)
                first = ("edge_conflict", a, t, new[a], b)
        pos = new
        for a in range(k):
            if pos[a] != goals[a]:
                arrival[a] = t + 1
    sim = Simulation(failure=None, final=list(pos), makespan=max(arrival, default=0))
    sim.clean_on_goal = sum(1 for a in range(k) if pos[a] == goals[a] and a not in bad)
    if first is not None:
        sim.failure, sim.agent, sim.step, sim.cell, sim.other = first
    else:
        missing = [a for a in range(k) if pos[a] != goals[a]]
        if missing:
            sim.failure, sim.agent, sim.step, sim.cell = "goal_not_reached", missing[0], T, pos[missing[0]]
    return sim


# --- the batched numpy validator -------------------------------------------------------------------------------------


def encode_moves(plans: list[list[str]], length: int | None = None) -> np.ndarray:
    """(B, k, L) int8 move codes, padded with W (4) to a common length: the stay semantics."""
    k = len(plans[0]) if plans else 0
    L = length if length is not None else max((len(m) for p in plans for m in p), default=0)
    out = np.full((len(plans), k, L), 4, dtype=np.int8)
    table = np.frombuffer(bytes(255 if ch not in CODES else CODES.index(ch) for ch in map(chr, range(256))),
                          dtype=np.uint8)
    for b, plan in enumerate(plans):
        for a, m in enumerate(plan):
            if m:
                out[b, a, :len(m)] = table[np.frombuffer(m.encode("ascii"), dtype=np.uint8)]
    return out


def validate_arrays(free: np.ndarray, starts: np.ndarray, goals: np.ndarray, moves: np.ndarray,
                    lengths: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Check B plans at once. free: (B, n, n) bool; starts, goals: (B, k, 2) int (row, col); moves: (B, k, L) codes;
    lengths: (B,) each plan's own length (step of goal_not_reached), default L.
    Returns arrays (B,): valid, failure (index into FAILURES, -1 when valid), agent, step, other, row, col, makespan."""
    B, k, L = moves.shape
    lengths = np.full(B, L) if lengths is None else np.asarray(lengths)
    if L == 0:  # all plans empty: one padded wait changes nothing
        moves, L = np.full((B, k, 1), 4, dtype=np.int8), 1
    n = free.shape[1]
    N = n * n
    if B > 1 and B * (L + 1) * N > CHUNK:  # bound the occupancy table's memory
        half = B // 2
        parts = [validate_arrays(free[sl], starts[sl], goals[sl], moves[sl], lengths[sl])
                 for sl in (slice(0, half), slice(half, B))]
        return {key: np.concatenate([parts[0][key], parts[1][key]]) for key in parts[0]}
    # positions by cumulative sums (exact up to the first violation, which is all that is reported), small dtypes
    R = np.empty((B, k, L + 1), dtype=np.int16)
    C = np.empty((B, k, L + 1), dtype=np.int16)
    R[:, :, 0], C[:, :, 0] = starts[:, :, 0], starts[:, :, 1]
    np.cumsum((moves == 1).astype(np.int16) - (moves == 0), axis=2, out=R[:, :, 1:])
    np.cumsum((moves == 3).astype(np.int16) - (moves == 2), axis=2, out=C[:, :, 1:])
    R[:, :, 1:] += R[:, :, :1]
    C[:, :, 1:] += C[:, :, :1]
    off = (R < 0) | (R >= n) | (C < 0) | (C >= n)
    cell = np.clip(R, 0, n - 1) * np.int16(n) + np.clip(C, 0, n - 1)  # (B, k, L+1)
    hole = ~free.reshape(-1)[np.arange(B)[:, None, None] * N + cell] & ~off
    bad_move = off | hole
    # Per (plan, t): is any cell held by two agents (vertex), is any undirected edge used by two agents (without an
    # earlier or same-step vertex conflict that can only be a swap)? Sorting the k ids of each (plan, t) and comparing
    # neighbours answers both; which agents, only at the first violating step, comes from a pairwise check below.
    def duplicated(ids: np.ndarray) -> np.ndarray:  # (B, k, T) -> (B, T)
        ordered = np.sort(ids.transpose(0, 2, 1), axis=2)
        return (ordered[:, :, 1:] == ordered[:, :, :-1]).any(axis=2)

    moved = cell[:, :, 1:] != cell[:, :, :-1]
    lo = np.minimum(cell[:, :, 1:], cell[:, :, :-1])
    vertical = np.abs(cell[:, :, 1:] - cell[:, :, :-1]) == n
    edge_id = np.where(moved, 2 * lo + vertical, -1 - np.arange(k, dtype=np.int16)[None, :, None])
    vert_t = duplicated(cell)  # (B, L+1)
    edge_t = np.zeros((B, L + 1), dtype=bool)
    edge_t[:, 1:] = duplicated(edge_id.astype(np.int16))
    any_t = bad_move.any(axis=1) | vert_t | edge_t  # (B, L+1)
    has = any_t.any(axis=1)
    t = any_t.argmax(axis=1)
    bi = np.arange(B)
    # details at the first violating step only: pairwise over agents there
    not_self = ~np.eye(k, dtype=bool)[None]
    now, before = cell[bi, :, t], cell[bi, :, np.maximum(t - 1, 0)]  # (B, k)
    same = (now[:, :, None] == now[:, None, :]) & not_self
    swap = (now[:, :, None] == before[:, None, :]) & (now[:, None, :] == before[:, :, None]) & not_self
    swap &= (now != before)[:, :, None] & (t > 0)[:, None, None]
    bm, vt, ed = bad_move[bi, :, t], same.any(2), swap.any(2)
    kind = np.where(bm.any(1), 0, np.where(vt.any(1), 2, 3))
    agent = np.where(kind == 0, bm.argmax(1), np.where(kind == 2, vt.argmax(1), ed.argmax(1)))
    kind = np.where((kind == 0) & ~off[bi, agent, t], 1, kind)
    other = np.where(kind == 2, same[bi, agent].argmax(1), np.where(kind == 3, swap[bi, agent].argmax(1), -1))
    goal_cell = goals[:, :, 0] * n + goals[:, :, 1]
    off_goal = cell != goal_cell[:, :, None]
    final_off = off_goal[:, :, -1]
    arrival = np.where(off_goal.any(2), (L + 1) - off_goal[:, :, ::-1].argmax(2), 0)
    missing = ~has & final_off.any(1)
    failure = np.where(has, kind, np.where(missing, 4, -1))
    agent = np.where(has, agent, np.where(missing, final_off.argmax(1), -1))
    step = np.where(has, t, np.where(missing, lengths, -1))
    row = np.where(has, R[bi, agent, t], np.where(missing, R[bi, agent, -1], -1)).astype(np.int64)
    col = np.where(has, C[bi, agent, t], np.where(missing, C[bi, agent, -1], -1)).astype(np.int64)
    return {"valid": failure < 0, "failure": failure, "agent": agent, "step": step, "other": other,
            "row": row, "col": col, "makespan": arrival.max(axis=1) if k else np.zeros(B, dtype=np.int64)}
