"""Makespan-optimal Conflict-Based Search (CBS) for MAPF-FrozenLake: the expert and the source of optimal makespans.

Model: an n x n grid, cells numbered `r * n + c`, holes are obstacles; k agents move simultaneously with U/D/L/R/W;
after its plan ends an agent stays on its last cell (its goal) and still occupies it. Conflicts: two agents on one cell
at one time (vertex) and two agents swapping cells in one step (edge).

How it finds the optimal makespan: for T = max(individual shortest distances), T + 1, ... it runs a CBS *feasibility*
search bounded by T (every path has exactly T steps, padded with the stay-on-goal semantics). The first T whose search
finds a conflict-free node is the optimal makespan, because every smaller T was searched exhaustively (CBS branching on
a conflict covers every solution). The low level is a layered space-time dynamic programme over the whole grid in numpy
(one vectorised update per time step) that honours vertex and edge constraints and, among feasible paths, minimises
conflicts with the other agents' current paths, then time off-goal, then moves. A node budget bounds hard instances:
`SolverBudgetExceeded` is raised instead of hanging.

"Needs a wait": no plan reaches the optimal makespan without an agent waiting before its final arrival. Checked by the
same bounded search with the wait move forbidden except the final stay on the goal (`allow_wait=False`).

    from harness.tasks.mapf_cbs import solve
    sol = solve(n, free, starts, goals)   # free: bool array (n*n,), starts/goals: cell ids
    print(sol.makespan, sol.sum_of_costs, sol.moves, sol.needs_wait)
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

INF = 1 << 40
BIG = 1 << 16  # low-level cost of one conflict with another agent's current path (tie-breaking only)
OFF_GOAL = 4  # low-level cost of one time step spent off the goal
MOVE = 1  # extra low-level cost of a move (prefer waiting to wiggling back and forth)
MOVES = "UDLRW"  # direction index d: MOVES[d]
DELTAS = ((-1, 0), (1, 0), (0, -1), (0, 1), (0, 0))
NODE_BUDGET = 1500
FIRST_TRY = 100  # nodes spent at the individual lower bound before the pairwise bound is computed  # high-level CBS nodes per solve (all bounds T together)


class SolverBudgetExceeded(RuntimeError):
    """The CBS node budget ran out before the optimal makespan (or the wait question) was settled."""


@dataclass
class Solution:
    makespan: int
    sum_of_costs: int
    moves: list[str]  # one string of U/D/L/R/W per agent, trailing waits on the goal removed
    needs_wait: bool | None  # None when not asked (solve(..., check_wait=False))
    nodes: int  # high-level nodes expanded in total


# --- grid helpers --------------------------------------------------------------------------------------------------


@lru_cache(maxsize=32)
def source_table(n: int) -> np.ndarray:
    """(5, n*n+1) int: src[d, v] = the cell u from which direction d lands on v, or the sentinel n*n (off grid)."""
    N = n * n
    src = np.full((5, N + 1), N, dtype=np.int64)
    for d, (dr, dc) in enumerate(DELTAS):
        for v in range(N):
            r, c = divmod(v, n)
            ur, uc = r - dr, c - dc
            if 0 <= ur < n and 0 <= uc < n:
                src[d, v] = ur * n + uc
    return src


def direction(n: int, u: int, v: int) -> int:
    """Index of the move taking cell u to its neighbour v."""
    diff = v - u
    return {-n: 0, n: 1, -1: 2, 1: 3, 0: 4}[diff]


def bfs_distances(n: int, free: np.ndarray, source: int) -> np.ndarray:
    """Shortest-path distance (moves) from `source` to every cell through free cells; -1 where unreachable."""
    dist = np.full(n * n, -1, dtype=np.int64)
    dist[source] = 0
    queue = deque([source])
    while queue:
        u = queue.popleft()
        r, c = divmod(u, n)
        for dr, dc in DELTAS[:4]:
            rr, cc = r + dr, c + dc
            if 0 <= rr < n and 0 <= cc < n:
                v = rr * n + cc
                if free[v] and dist[v] < 0:
                    dist[v] = dist[u] + 1
                    queue.append(v)
    return dist


# --- low level: layered space-time DP --------------------------------------------------------------------------------


def low_level(n: int, free: np.ndarray, start: int, goal: int, T: int, vcons: dict, econs: dict,
              cat: np.ndarray | None, allow_wait: bool) -> np.ndarray | None:
    """A path of exactly T steps (positions 0..T, ending on `goal`) or None.

    vcons: {t: set(cells)} the agent may not occupy at time t. econs: {t: set((u, v))} moves u->v it may not make
    arriving at time t. cat: (T+1, n*n) counts of other agents per cell and time (conflict avoidance), or None.
    allow_wait=False: waiting is allowed only as the final stay on the goal."""
    N = n * n
    src = source_table(n)
    cols = np.arange(N)
    base = np.where(free, np.where(cols != goal, OFF_GOAL, 0), INF).astype(np.int64)
    sc = np.repeat(base[None, :], T + 1, axis=0)
    if cat is not None:
        sc += BIG * cat
    for t, cells in vcons.items():
        if t <= T:
            sc[t, list(cells)] = INF
    cost = np.full(N + 1, INF, dtype=np.int64)
    cost[start] = 0
    parents = np.zeros((T + 1, N), dtype=np.int8)
    commit = INF  # no-wait mode: best cost of "on the goal and staying" at the current time
    commit_from_free = np.zeros(T + 1, dtype=bool)
    for t in range(1, T + 1):
        cand = cost[src]
        cand[:4] += MOVE
        if not allow_wait:
            cand[4] = INF
        for (u, v) in econs.get(t, ()):
            cand[direction(n, u, v), v] = INF
        par = cand[:, :N].argmin(axis=0)
        best = cand[par, cols]
        if not allow_wait:
            from_free = cost[goal]
            commit_from_free[t] = from_free < commit
            commit = min(min(commit, from_free) + int(sc[t, goal]), INF)
        cost[:N] = np.minimum(best + sc[t], INF)
        parents[t] = par
    final_free = int(cost[goal])
    if min(final_free, commit) >= INF:
        return None
    path = np.empty(T + 1, dtype=np.int64)
    v, t = goal, T
    if not allow_wait and commit < final_free:
        while True:  # walk back the committed stay on the goal
            path[t] = goal
            if commit_from_free[t]:
                t -= 1
                break
            t -= 1
    while t > 0:
        path[t] = v
        v = int(src[parents[t, v], v])
        t -= 1
    path[0] = v
    return path


# --- high level: CBS feasibility within a makespan bound ------------------------------------------------------------


def first_conflict(paths: np.ndarray) -> tuple[int, tuple | None]:
    """(number of conflicts, the earliest one) for paths (k, T+1). A conflict is ("v", a, b, cell, t) or
    ("e", a, b, u, v, t): agent a moves u->v while b moves v->u, arriving at t. a < b."""
    k = paths.shape[0]
    upper = np.triu(np.ones((k, k), dtype=bool), 1)[:, :, None]
    vert = (paths[:, None, :] == paths[None, :, :]) & upper
    moved = (paths[:, 1:] != paths[:, :-1])[:, None, :]
    edge = (paths[:, None, :-1] == paths[None, :, 1:]) & (paths[:, None, 1:] == paths[None, :, :-1]) & upper & moved
    count = int(vert.sum() + edge.sum())
    if count == 0:
        return 0, None
    tv = vert.any(axis=(0, 1))
    te = edge.any(axis=(0, 1))
    t_v = int(tv.argmax()) if tv.any() else INF
    t_e = int(te.argmax()) + 1 if te.any() else INF
    if t_v <= t_e:
        a, b = np.argwhere(vert[:, :, t_v])[0]
        return count, ("v", int(a), int(b), int(paths[a, t_v]), t_v)
    a, b = np.argwhere(edge[:, :, t_e - 1])[0]
    return count, ("e", int(a), int(b), int(paths[a, t_e - 1]), int(paths[a, t_e]), t_e)


def _cat(paths: np.ndarray, skip: int, T: int, N: int) -> np.ndarray:
    cat = np.zeros((T + 1, N), dtype=np.int64)
    times = np.arange(T + 1)
    for j in range(paths.shape[0]):
        if j != skip:
            cat[times, paths[j]] += 1
    return cat


def cbs_bounded(n: int, free: np.ndarray, starts: list[int], goals: list[int], T: int, allow_wait: bool,
                budget: int) -> tuple[np.ndarray | None, int]:
    """Conflict-free paths with makespan <= T, or None when none exist (searched exhaustively). Returns (paths, nodes).
    Raises SolverBudgetExceeded after `budget` expanded nodes."""
    k, N = len(starts), n * n
    paths = np.empty((k, T + 1), dtype=np.int64)
    cat = np.zeros((T + 1, N), dtype=np.int64)
    times = np.arange(T + 1)
    for i in range(k):  # root: prioritised planning with conflict avoidance, constraints empty
        p = low_level(n, free, starts[i], goals[i], T, {}, {}, cat, allow_wait)
        if p is None:
            return None, 0
        paths[i] = p
        cat[times, p] += 1
    count, conflict = first_conflict(paths)
    tick = 0
    heap = [(count, tick, paths, [({}, {}) for _ in range(k)], conflict)]
    nodes = 0
    while heap:
        count, _, paths, cons, conflict = heapq.heappop(heap)
        if conflict is None:
            return paths, nodes
        nodes += 1
        if nodes > budget:
            raise SolverBudgetExceeded(f"CBS node budget {budget} exhausted at makespan bound {T}")
        if conflict[0] == "v":
            _, a, b, cell, t = conflict
            branches = [(a, "v", (t, cell)), (b, "v", (t, cell))]
        else:
            _, a, b, u, v, t = conflict
            branches = [(a, "e", (t, (u, v))), (b, "e", (t, (v, u)))]
        for agent, kind, (t, item) in branches:
            vc, ec = cons[agent]
            if kind == "v":
                vc = {**vc, t: vc.get(t, frozenset()) | {item}}
            else:
                ec = {**ec, t: ec.get(t, frozenset()) | {item}}
            p = low_level(n, free, starts[agent], goals[agent], T, vc, ec, _cat(paths, agent, T, N), allow_wait)
            if p is None:
                continue
            child = paths.copy()
            child[agent] = p
            child_cons = list(cons)
            child_cons[agent] = (vc, ec)
            c_count, c_conflict = first_conflict(child)
            tick += 1
            heapq.heappush(heap, (c_count, tick, child, child_cons, c_conflict))
    return None, nodes


# --- pairwise lower bound: joint two-agent search ---------------------------------------------------------------------


def pair_makespan(n: int, free: np.ndarray, a: tuple[int, int], b: tuple[int, int], t_max: int) -> int | None:
    """Optimal makespan of the two agents a=(start, goal) and b alone (vertex + swap constraints), or None when they
    cannot both arrive within t_max. Breadth-first search over joint states (cell_a, cell_b) on the free cells as
    boolean matrix products: R' = M R M^T minus the swap predecessor, M = adjacency + stay. Both agents may wait, so
    the reachable set only grows and a fixpoint proves the pair unsolvable."""
    cells = np.flatnonzero(free)
    index = {int(c): i for i, c in enumerate(cells)}
    m = len(cells)
    adj = np.zeros((m, m), dtype=np.float32)
    for i, c in enumerate(cells):
        r, col = divmod(int(c), n)
        for dr, dc in DELTAS[:4]:
            rr, cc = r + dr, col + dc
            if 0 <= rr < n and 0 <= cc < n and free[rr * n + cc]:
                adj[i, index[rr * n + cc]] = 1.0
    step = adj + np.eye(m, dtype=np.float32)
    ok = ~np.eye(m, dtype=bool)
    reach = np.zeros((m, m), dtype=np.float32)
    reach[index[a[0]], index[b[0]]] = 1.0
    ga, gb = index[a[1]], index[b[1]]
    for t in range(1, t_max + 1):
        new = ((step @ reach @ step.T) - adj * reach.T > 0.5) & ok
        if new[ga, gb]:
            return t
        new_f = new.astype(np.float32)
        if (new_f == reach).all():
            return None
        reach = new_f
    return None


# --- the solver ------------------------------------------------------------------------------------------------------


def paths_to_moves(n: int, paths: np.ndarray, goals: list[int]) -> list[str]:
    """Move strings per agent, trailing stays on the goal removed."""
    out = []
    for i, p in enumerate(paths):
        end = len(p) - 1
        while end > 0 and p[end - 1] == goals[i]:
            end -= 1
        out.append("".join(MOVES[direction(n, int(p[t]), int(p[t + 1]))] for t in range(end)))
    return out


def solve(n: int, free: np.ndarray, starts: list[int], goals: list[int], check_wait: bool = True,
          budget: int = NODE_BUDGET, max_extra: int | None = None) -> Solution | None:
    """Optimal-makespan plan, or None when no plan exists within makespan max(shortest) + max_extra (default 2n).
    Raises SolverBudgetExceeded when the node budget runs out first."""
    free = np.asarray(free, dtype=bool)
    dists = []
    for s, g in zip(starts, goals):
        d = int(bfs_distances(n, free, g)[s])
        if d < 0:
            return None
        dists.append(d)
    max_extra = 2 * n if max_extra is None else max_extra
    lower = max(dists)
    t_max = lower + max_extra
    nodes, paths = 0, None
    try:  # most instances are solved at the individual lower bound with a handful of nodes
        paths, nodes = cbs_bounded(n, free, starts, goals, lower, True, min(FIRST_TRY, budget))
        first_failed = paths is None
    except SolverBudgetExceeded:
        nodes, first_failed = min(FIRST_TRY, budget), False
    T = lower
    if paths is None:  # pairwise bound: proves unsolvable pairs and skips infeasible bounds cheaply
        for i in range(len(starts)):
            for j in range(i + 1, len(starts)):
                pm = pair_makespan(n, free, (starts[i], goals[i]), (starts[j], goals[j]), t_max)
                if pm is None:
                    return None
                lower = max(lower, pm)
        T = max(lower, T + 1) if first_failed else lower
    while paths is None and T <= t_max:
        paths, used = cbs_bounded(n, free, starts, goals, T, True, budget - nodes)
        nodes += used
        if paths is None:
            T += 1
    if paths is not None:
        moves = paths_to_moves(n, paths, goals)
        soc = sum(len(m) for m in moves)
        needs_wait = None
        if check_wait:
            needs_wait = False
            if any("W" in m for m in moves):
                nowait, used = cbs_bounded(n, free, starts, goals, T, False, budget - nodes)
                nodes += used
                if nowait is None:
                    needs_wait = True
                else:
                    moves = paths_to_moves(n, nowait, goals)  # prefer the optimal plan without waits
                    soc = sum(len(m) for m in moves)
        return Solution(makespan=T, sum_of_costs=soc, moves=moves, needs_wait=needs_wait, nodes=nodes)
    return None
