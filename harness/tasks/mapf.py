"""MAPF-FrozenLake: the reference testbed. Config, generator, prompts, the plan format, the scorer, slices, suites.

An instance is an n x n frozen lake (3..16; the paper uses 3..10) with holes (obstacles) and k agents, each with a
start and a goal (starts distinct, goals distinct, an agent's start is never its own goal). All agents move at once,
one of UP / DOWN / LEFT / RIGHT / WAIT per time step; after its plan ends an agent stays on its last cell and still
occupies it. A plan is valid when no agent leaves the grid, enters a hole, shares a cell with another (vertex conflict)
or swaps cells with another (edge conflict), and every agent ends on its goal. It is optimal when its makespan (the time
the last agent arrives for good) equals the optimum that makespan-optimal CBS (`mapf_cbs.py`) finds.

Coordinates are (row, col), row 0 at the top. Agents are labelled A, B, C, ... in order.

Prompt styles (`prompt(inst, style)`; trace is the default for char models, chat for chat LLMs):
- compact (char models): the grid, two characters per cell ('##' hole, else the start mark: label or '.', then the
  goal mark: lowercase label or '.'), one line per row; then one line per agent with its start and goal as
  `row,col`, `A 0,2>2,1` (A starts at (0, 2), its goal is (2, 1)), so a small model reads positions instead of
  counting characters; then `plan:`. A 3x3, 2-agent prompt and its expert completion:

      A..b..
      .aB...
      ..####
      A 0,0>1,0
      B 1,1>0,1
      plan:
      A:D
      B:U

- chat (chat LLMs): the map as '.'/'#' rows, the agents' coordinates and the rules in English.
- trace (char models, the strongest for tiny ones): no picture, only coordinates: the size, the holes, each agent's
  start>goal; the completion writes after each move the cell the agent lands on (a position trace, so the model reads
  where it is instead of summing moves). With the coordinate words of `words()` as single tokens, each cell is one
  token. The 3x3 instance above:

      size 3
      holes 2,1 2,2
      A 0,0>1,0
      B 1,1>0,1
      plan:
      A:D1,0
      B:U0,1

Plan format (what `expert` writes and `score` parses): one line per agent, `<label>: <moves>`.
- compact style: `A:RRDW` (single letters U/D/L/R/W, no spaces)
- chat style:    `Agent A: RIGHT RIGHT DOWN WAIT`
- trace style:   `A:R0,1R0,2D1,2W1,2` (each move, then the cell it lands on)
The parser takes any of them in any case and spacing; the cells of a trace are the model's scratchpad and are not
scored, only its moves are. It takes any case and spacing (`a: r, r d`, `**Agent B:** [up, up]`), ignores lines that do not start
with a label, and is strict about identity: every agent exactly once (else wrong_agent_count); no label lines or an
unknown move word is a parse_error. A plan longer than `max_steps(instance)` (2 n^2, or twice the optimum) is too_long.

Failure codes, first violation wins: parse_error, wrong_agent_count, too_long, then off_grid, hole, vertex_conflict,
edge_conflict (per time step, see `mapf_validate.py` for the order), goal_not_reached.

    .venv/bin/evotrainer env sample --task mapf --n 2 --style chat
    from harness.tasks.mapf import TASK
    inst = TASK.generate(TASK.default_config(), seed=4); print(TASK.prompt(inst), TASK.expert(inst))
"""

from __future__ import annotations

import logging
import re
import string
from collections import Counter
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harness.seeds import content_split, split_of
from harness.tasks import knobs
from harness.tasks.base import Instance, Outcome, SuiteEntry, TaskSpec
from harness.tasks.drawn import draw
from harness.tasks.knobs import KnobError
from harness.tasks.mapf_cbs import SolverBudgetExceeded, bfs_distances, solve
from harness.tasks.mapf_validate import FAILURES, encode_moves, simulate, validate_arrays

log = logging.getLogger(__name__)

FAILURE_TYPES = ("parse_error", "wrong_agent_count", "off_grid", "hole", "vertex_conflict", "edge_conflict",
                 "goal_not_reached", "too_long")
STYLES = ("trace", "compact", "chat")  # the first is the default for char-level models
LABELS = string.ascii_uppercase[:16]
WORDS = {"U": "UP", "D": "DOWN", "L": "LEFT", "R": "RIGHT", "W": "WAIT"}
MAX_ATTEMPTS = 300  # draws per instance before the generator gives up and names the knob
RARE_DRAW_COST = 0.1  # a solvable layout with the wrong wait need counts a tenth of a draw: the level exists and is
# rare (an open 3x3 with two agents needs a wait in about one layout in sixty; 300 whole draws missed it for about one
# seed in a hundred and fifty, a config that works failing on some seeds), so such a config gets up to 3000 layouts
APART_DRAWS = 3000  # layouts of another split's content skipped (unsolved, cheap) before a level too small to hold
# apart keeps any: at 64 a 3x3 level that needs a wait (a few layouts in a hundred qualify) ran out and kept a twin
WARN_ATTEMPTS = 50  # draws after which a resampling warning is logged

# --- config ----------------------------------------------------------------------------------------------------------


class UnsatisfiableConfigError(ValueError):
    """The generator could not draw an instance the config asks for; the message names the knob to change."""


def _in_range(name: str, value: float, lo: float, hi: float | None) -> float:
    if value < lo or (hi is not None and value > hi):
        rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"{name} must be in {rng}, got {value}")
    return value


def hole_count(size: int, hole_ratio: float) -> int:
    """Holes on a size x size lake: hole_ratio * size^2, rounded half up."""
    return int(hole_ratio * size * size + 0.5)


class SizeEntry(BaseModel):
    """One map size of the training mixture (knob paths `env.sizes.<size>.<field>`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)
    size: int = Field(..., description="side of the square lake, 3..16 (the paper uses 3..10)")
    data_ratio: float = Field(1.0, description="mixture weight of this size (>= 0; normalised over sizes; the "
                              "engineer moves it within 0..1)", json_schema_extra={"knob_range": [0.0, 1.0]})
    hole_ratio: float = Field(0.2, description="share of cells that are holes, 0.0..0.6",
                              json_schema_extra={"knob_range": [0.0, 0.6]})
    wait_ratio: float = Field(0.25, description="probability that a drawn instance must need a wait, 0.0..1.0 "
                              "(otherwise it must be solvable optimally without waits)",
                              json_schema_extra={"knob_range": [0.0, 1.0]})
    agents: int | tuple[int, int] = Field(2, description="agent count, or [min, max] drawn uniformly; 1..16",
                                          json_schema_extra={"knob_range": [1, 16]})

    @field_validator("size")
    @classmethod
    def _size(cls, v: int) -> int:
        return int(_in_range("size", v, 3, 16))

    @field_validator("data_ratio")
    @classmethod
    def _data(cls, v: float) -> float:
        return _in_range("data_ratio", v, 0.0, None)

    @field_validator("hole_ratio")
    @classmethod
    def _holes(cls, v: float) -> float:
        return _in_range("hole_ratio", v, 0.0, 0.6)

    @field_validator("wait_ratio")
    @classmethod
    def _wait(cls, v: float) -> float:
        return _in_range("wait_ratio", v, 0.0, 1.0)

    @field_validator("agents")
    @classmethod
    def _agents(cls, v: int | tuple[int, int]) -> int | tuple[int, int]:
        lo, hi = (v, v) if isinstance(v, int) else v
        _in_range("agents", lo, 1, 16)
        _in_range("agents", hi, 1, 16)
        if lo > hi:
            raise ValueError(f"agents range [min, max] needs min <= max, got [{lo}, {hi}]")
        return v

    @model_validator(mode="after")
    def _room(self) -> SizeEntry:
        cells = self.size * self.size
        free = cells - hole_count(self.size, self.hole_ratio)
        if free < self.max_agents + 1:
            raise ValueError(
                f"size {self.size}: {self.max_agents} agents need at least {self.max_agents + 1} free cells but "
                f"hole_ratio {self.hole_ratio} leaves {free} of {cells}; lower env.sizes.{self.size}.hole_ratio "
                f"or env.sizes.{self.size}.agents")
        if self.max_agents == 1 and self.wait_ratio > 0:
            raise ValueError(f"size {self.size}: a single agent never needs a wait; set env.sizes.{self.size}."
                             f"wait_ratio to 0 or raise env.sizes.{self.size}.agents")
        return self

    @property
    def agent_range(self) -> tuple[int, int]:
        return (self.agents, self.agents) if isinstance(self.agents, int) else tuple(self.agents)

    @property
    def max_agents(self) -> int:
        return self.agent_range[1]


class MAPFConfig(BaseModel):
    """The generator config: a mixture of per-size entries plus a global minimum start-goal distance."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)
    sizes: list[SizeEntry] = Field(..., description="per-size entries of the mixture; sizes unique")
    min_distance: int = Field(1, description="minimum shortest-path distance from an agent's start to its goal, >= 1",
                              json_schema_extra={"knob_range": [1, 30]})

    @field_validator("min_distance")
    @classmethod
    def _mind(cls, v: int) -> int:
        return int(_in_range("min_distance", v, 1, 30))

    @model_validator(mode="after")
    def _mixture(self) -> MAPFConfig:
        if not self.sizes:
            raise ValueError("sizes is empty; add at least one entry like {size: 5, data_ratio: 1.0}")
        seen = Counter(e.size for e in self.sizes)
        dup = [s for s, c in seen.items() if c > 1]
        if dup:
            raise ValueError(f"sizes must be unique; size {dup[0]} appears {seen[dup[0]]} times")
        if not any(e.data_ratio > 0 for e in self.sizes):
            raise ValueError("at least one entry needs data_ratio > 0 (all sizes have weight 0)")
        for e in self.sizes:
            if e.data_ratio > 0 and self.min_distance > 2 * (e.size - 1):
                raise ValueError(f"min_distance {self.min_distance} cannot fit on size {e.size} (at most "
                                 f"{2 * (e.size - 1)}); lower env.min_distance or set env.sizes.{e.size}.data_ratio 0")
        return self

    def entry(self, size: int) -> SizeEntry:
        for e in self.sizes:
            if e.size == size:
                return e
        raise KnobError(f"size {size} is not in the mixture (sizes: {', '.join(str(e.size) for e in self.sizes)})")


def get_knob(config: MAPFConfig, path: str) -> Any:
    """Value at `sizes.<n>.<field>` or `min_distance` (an `env.` prefix is accepted); the grammar of
    `harness.tasks.knobs`, lists keyed by `size`."""
    return knobs.read(config, path, ENTRY_KEY)


def apply_knob(config: MAPFConfig, path: str, value: Any) -> MAPFConfig:
    """A new, validated config with one knob changed. `sizes.<n>.<field>` for a size not in the mixture adds that size
    (other fields at their defaults). Raises KnobError for a bad path, pydantic ValidationError for a bad value."""
    parts = knobs.split(path, "env")
    if parts and parts[-1] == "size":
        raise KnobError(f"unknown knob {path!r}: a size entry's `size` is its key, not a knob")
    data = config.model_dump(mode="json")
    knobs.set_value(data, parts, value, ENTRY_KEY, knob=path, add_entry=True, new_fields=len(parts) == 3)
    if len(parts) == 3 and parts[2] not in SizeEntry.model_fields:
        raise KnobError(f"unknown knob {path!r}: the field must be one of data_ratio, hole_ratio, wait_ratio, agents")
    data["sizes"].sort(key=lambda e: e["size"])
    return MAPFConfig.model_validate(data)


def default_config() -> MAPFConfig:
    """Round 0: every paper size 3..10 equally, 2 agents, 20% holes, a quarter of instances needing a wait."""
    return MAPFConfig(sizes=[SizeEntry(size=s) for s in range(3, 11)], min_distance=1)


# what a new run's env.yaml holds (a run config's `env:` replaces it): small boards, two agents
ROUND0_ENV = """\
# Environment generator config (MAPF-FrozenLake). Round 0: a random-ish default, small boards, two agents.
# One entry per board size: data_ratio = share of training instances at this size; hole_ratio = share of cells that
# are holes; wait_ratio = share of instances whose optimal plan needs an agent to wait; agents = agents per board.
sizes:
  - {size: 3, data_ratio: 0.34, hole_ratio: 0.2, wait_ratio: 0.1, agents: 2}
  - {size: 4, data_ratio: 0.33, hole_ratio: 0.2, wait_ratio: 0.1, agents: 2}
  - {size: 5, data_ratio: 0.33, hole_ratio: 0.2, wait_ratio: 0.1, agents: 2}
min_distance: 1
"""


# --- instances and the generator -------------------------------------------------------------------------------------


class MAPFInstance(Instance):
    task: str = "mapf"
    size: int
    grid: list[str] = Field(..., description="rows, '.' ice and '#' hole")
    starts: list[tuple[int, int]]
    goals: list[tuple[int, int]]
    optimal_makespan: int
    sum_of_costs: int = Field(..., description="sum of arrival times of the expert plan")
    needs_wait: bool
    plan: list[str] = Field(..., description="the CBS expert plan, one U/D/L/R/W string per agent")
    attempts: int = Field(1, description="draws the generator needed (resampling count + 1)")

    @property
    def agents(self) -> int:
        return len(self.starts)

    @property
    def holes(self) -> int:
        return sum(row.count("#") for row in self.grid)


def _shortest_path(n: int, free: np.ndarray, s: int, g: int, dist_g: np.ndarray, rng) -> list[int]:
    """A random shortest path s -> g (cells), following decreasing distance to g."""
    path = [s]
    while path[-1] != g:
        r, c = divmod(path[-1], n)
        nxt = [rr * n + cc for rr, cc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1))
               if 0 <= rr < n and 0 <= cc < n and dist_g[rr * n + cc] == dist_g[path[-1]] - 1]
        path.append(int(rng.choice(nxt)))
    return path


def _draw_layout(rng: np.random.Generator, n: int, holes: int, k: int, min_distance: int, cross: bool):
    """Holes, starts, goals (cell ids) or None when this draw cannot place the agents. cross=True proposes agents whose
    shortest paths meet an earlier agent's path at the same time step (to make needs-wait instances likely)."""
    N = n * n
    free = np.ones(N, dtype=bool)
    free[rng.choice(N, holes, replace=False)] = False
    cells = np.flatnonzero(free)
    starts: list[int] = []
    goals: list[int] = []
    paths: list[list[int]] = []
    for i in range(k):
        placed = False
        if cross and paths:
            ref = paths[int(rng.integers(len(paths)))]
            if len(ref) > 2:
                t = int(rng.integers(1, len(ref) - 1))
                meet = ref[t]
                d_meet = bfs_distances(n, free, meet)
                s_cand = [int(c) for c in cells if d_meet[c] == t and c not in starts]
                if s_cand:
                    s = s_cand[int(rng.integers(len(s_cand)))]
                    d_s = bfs_distances(n, free, s)
                    g_cand = [int(c) for c in cells if c != meet and d_meet[c] > 0 and d_s[c] == t + d_meet[c]
                              and d_s[c] >= min_distance and c not in goals]
                    if g_cand:
                        starts.append(s)
                        goals.append(g_cand[int(rng.integers(len(g_cand)))])
                        placed = True
        if not placed:
            s_cand = [int(c) for c in cells if c not in starts]
            s = s_cand[int(rng.integers(len(s_cand)))]
            d_s = bfs_distances(n, free, s)
            g_cand = [int(c) for c in cells if d_s[c] >= min_distance and c not in goals]
            if not g_cand:
                return None
            starts.append(s)
            goals.append(g_cand[int(rng.integers(len(g_cand)))])
        if cross:
            paths.append(_shortest_path(n, free, starts[-1], goals[-1], bfs_distances(n, free, goals[-1]), rng))
    return free, starts, goals


def generate(config: MAPFConfig, seed: int) -> MAPFInstance:
    """The instance for (config, seed): deterministic, solvable, with its optimal makespan and wait need, and kept in
    its seed's split by content (`harness.seeds.held_apart`: a 3x3 board drawn by a training seed is never also a
    held-out one). Resamples layouts until one fits; raises UnsatisfiableConfigError naming the knob after
    MAX_ATTEMPTS draws (a solvable layout rejected only for its wait need counts a tenth: `RARE_DRAW_COST`)."""
    return _generate(config, seed, split_of(seed))


def _generate(config: MAPFConfig, seed: int, split: str | None = None) -> MAPFInstance:
    """`generate`'s draw. With `split`, a layout whose prompt belongs to another split by content
    (`harness.seeds.content_split`) is drawn again before it is solved (the solve is most of a draw's time: holding
    apart by whole redraws made generation 4.5x slower); after `APART_DRAWS` such draws (a level too small to hold
    apart) any layout is kept."""
    rng = np.random.default_rng(seed)
    weights = np.array([e.data_ratio for e in config.sizes], dtype=float)
    entry = config.sizes[int(rng.choice(len(weights), p=weights / weights.sum()))]
    lo, hi = entry.agent_range
    k = int(rng.integers(lo, hi + 1))
    want_wait = bool(rng.random() < entry.wait_ratio) and k > 1  # one agent never needs a wait (drawn all the same:
    n = entry.size  # every other seed's instance stays as it was)
    holes = hole_count(n, entry.hole_ratio)
    rejected: Counter[str] = Counter()
    apart = 0
    spent = 0.0  # the draws that count against MAX_ATTEMPTS: not another split's layouts, a tenth for a rare one
    limit = MAX_ATTEMPTS + APART_DRAWS + int(MAX_ATTEMPTS / RARE_DRAW_COST) + 2
    for attempt in range(1, limit):
        if spent >= MAX_ATTEMPTS:
            break
        spent += 1
        layout = _draw_layout(rng, n, holes, k, config.min_distance, cross=want_wait and bool(rng.random() < 0.8))
        if layout is None:
            rejected["no room for start/goal"] += 1
            continue
        free, starts, goals = layout
        if split is not None and apart < APART_DRAWS:
            # keyed on the puzzle, not on how its agents are labelled: A and B swapped is the same board to solve
            grid = ["".join("." if free[r * n + c] else "#" for c in range(n)) for r in range(n)]
            pairs = sorted(zip(starts, goals, strict=True))
            draft = MAPFInstance(seed=seed, size=n, grid=grid, starts=[divmod(s, n) for s, _ in pairs],
                                 goals=[divmod(g, n) for _, g in pairs], optimal_makespan=0, sum_of_costs=0,
                                 needs_wait=False, plan=[])
            if content_split(render_compact(draft)) != split:
                apart += 1
                spent -= 1
                continue
        try:
            sol = solve(n, free, starts, goals)
        except SolverBudgetExceeded:
            rejected["over the solver budget"] += 1
            continue
        if sol is None:
            rejected["unsolvable"] += 1
            continue
        if sol.needs_wait != want_wait:
            rejected["needs no wait" if want_wait else "needs a wait"] += 1
            spent -= 1 - RARE_DRAW_COST
            continue
        if attempt - apart > WARN_ATTEMPTS:
            log.warning("mapf generator: size %d, %d agents, seed %d took %d draws (%s)", n, k, seed, attempt - apart,
                        dict(rejected))
        grid = ["".join("." if free[r * n + c] else "#" for c in range(n)) for r in range(n)]
        return MAPFInstance(seed=seed, size=n, grid=grid, starts=[divmod(s, n) for s in starts],
                            goals=[divmod(g, n) for g in goals], optimal_makespan=sol.makespan,
                            sum_of_costs=sol.sum_of_costs, needs_wait=bool(sol.needs_wait), plan=sol.moves,
                            attempts=attempt - apart)
    top = rejected.most_common(1)[0][0] if rejected else "?"
    knob = {"needs no wait": f"env.sizes.{n}.wait_ratio (lower it) or env.sizes.{n}.agents (raise it)",
            "needs a wait": f"env.sizes.{n}.wait_ratio (raise it) or env.sizes.{n}.hole_ratio (lower it)",
            "no room for start/goal": f"env.min_distance or env.sizes.{n}.hole_ratio (lower them)"}.get(
        top, f"env.sizes.{n}.hole_ratio or env.sizes.{n}.agents (lower them)")
    raise UnsatisfiableConfigError(
        f"could not draw a size-{n} instance with {k} agents, hole_ratio {entry.hole_ratio}"
        f"{', needing a wait' if want_wait else ', solvable without waits'} in {attempt - 1 - apart} draws "
        f"(rejected: {dict(rejected)}); change {knob}")


# --- prompts and the plan format -------------------------------------------------------------------------------------

CHAT_TEMPLATE = """You are solving a multi-agent path finding puzzle on a frozen lake.
The lake is a {n}x{n} grid. Rows are numbered 0 to {last} from top to bottom, columns 0 to {last} from left to right.
'.' is safe ice and '#' is a hole.
Map:
{map}
Agents, as (row, col):
{agents}
Rules: all agents move at the same time, one step per time step. In each step an agent moves UP (row - 1), DOWN \
(row + 1), LEFT (col - 1), RIGHT (col + 1) or does WAIT. An agent must stay on the grid and never enter a hole. Two \
agents may never be on the same cell at the same time, and two agents may never swap cells in one step. When an \
agent's moves run out it stays where it is, so its moves must end on its goal, and it keeps occupying that cell. Use \
as few time steps as possible: the step at which the last agent reaches its goal must be minimal.
Answer with exactly one line per agent and nothing else, in this format:
Agent A: RIGHT DOWN WAIT DOWN
"""


def render_compact(inst: MAPFInstance) -> str:
    """Two characters per cell: '##' hole; otherwise the start mark (label or '.') then the goal mark (lowercase
    label or '.'). One row per line, then one line per agent `A 0,2>2,1` (start row,col > goal row,col), then
    `plan:`."""
    n = inst.size
    start_at = {tuple(s): LABELS[i] for i, s in enumerate(inst.starts)}
    goal_at = {tuple(g): LABELS[i].lower() for i, g in enumerate(inst.goals)}
    rows = []
    for r in range(n):
        row = []
        for c in range(n):
            if inst.grid[r][c] == "#":
                row.append("##")
            else:
                row.append(start_at.get((r, c), ".") + goal_at.get((r, c), "."))
        rows.append("".join(row))
    rows += [f"{LABELS[i]} {s[0]},{s[1]}>{g[0]},{g[1]}" for i, (s, g) in enumerate(zip(inst.starts, inst.goals))]
    return "\n".join(rows) + "\nplan:\n"


def render_trace(inst: MAPFInstance) -> str:
    """Coordinates only: `size n`, `holes r,c r,c ...` ('-' when none), one `A r,c>r,c` line per agent, `plan:`."""
    holes = [f"{r},{c}" for r, row in enumerate(inst.grid) for c, ch in enumerate(row) if ch == "#"]
    lines = [f"size {inst.size}", "holes " + (" ".join(holes) if holes else "-")]
    lines += [f"{LABELS[i]} {s[0]},{s[1]}>{g[0]},{g[1]}" for i, (s, g) in enumerate(zip(inst.starts, inst.goals))]
    return "\n".join(lines) + "\nplan:\n"


_STEP = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1), "W": (0, 0)}


def format_trace(moves: list[str], starts: list[tuple[int, int]]) -> str:
    """`A:R0,1R0,2`: each move followed by the cell it lands on (off-grid cells are written as they are)."""
    lines = []
    for i, (m, (r, c)) in enumerate(zip(moves, starts)):
        out = []
        for ch in m:
            dr, dc = _STEP[ch]
            r, c = r + dr, c + dc
            out.append(f"{ch}{r},{c}")
        lines.append(f"{LABELS[i]}:{''.join(out)}")
    return "\n".join(lines)


def prompt(inst: MAPFInstance, style: str = "compact") -> str:
    if style == "compact":
        return render_compact(inst)
    if style == "trace":
        return render_trace(inst)
    if style == "chat":
        agents = "\n".join(f"Agent {LABELS[i]}: start ({s[0]}, {s[1]}), goal ({g[0]}, {g[1]})"
                           for i, (s, g) in enumerate(zip(inst.starts, inst.goals)))
        return CHAT_TEMPLATE.format(n=inst.size, last=inst.size - 1, map="\n".join(inst.grid), agents=agents)
    raise ValueError(f"unknown prompt style {style!r}; choose one of {', '.join(STYLES)}")


def format_plan(moves: list[str], style: str = "compact", starts: list[tuple[int, int]] | None = None) -> str:
    """The plan text in a style; the trace style needs the agents' `starts`."""
    if style == "compact":
        return "\n".join(f"{LABELS[i]}:{m}" for i, m in enumerate(moves))
    if style == "trace":
        if starts is None:
            raise ValueError("format_plan: the trace style needs the agents' starts")
        return format_trace(moves, starts)
    if style == "chat":
        return "\n".join(f"Agent {LABELS[i]}: {' '.join(WORDS[ch] for ch in m)}" for i, m in enumerate(moves))
    raise ValueError(f"unknown prompt style {style!r}; choose one of {', '.join(STYLES)}")


def expert(inst: MAPFInstance, style: str = "compact") -> str:
    return format_plan(inst.plan, style, inst.starts)


def hole_blind(inst: MAPFInstance, style: str = "compact") -> str:
    """The imperfect teacher's plan (`ImperfectTeacher`): an optimal plan for the same starts and goals on the board
    WITHOUT its holes, a planner that ignores holes. Valid whenever the holes happen not to lie on its paths; where
    they do, the reward (validity) tells it from the expert's."""
    from harness.tasks.mapf_cbs import solve

    n = inst.size
    sol = solve(n, np.ones(n * n, dtype=bool), [r * n + c for r, c in inst.starts],
                [r * n + c for r, c in inst.goals], check_wait=False)
    return format_plan(sol.moves, style, inst.starts)


_LINE = re.compile(r"^(?:agent\b\s*)?([a-z])\s*[:=]\s*(.*)$", re.IGNORECASE | re.ASCII)  # `Agents:` is no agent S
# one way to split the spaces before a cell (`\s*\(?\s*` split a long run of them every way: quadratic)
_TRACE_CELL = re.compile(r"(?<=[UDLRW])\s*(?:\(\s*)?-?\d+\s*,\s*-?\d+\s*\)?", re.IGNORECASE)
_WORD = {"UP": "U", "DOWN": "D", "LEFT": "L", "RIGHT": "R", "WAIT": "W", "STAY": "W"}


def parse_plan(text: str, k: int) -> tuple[list[str] | None, str | None, str]:
    """(moves per agent, None, "") or (None, failure code, detail)."""
    plans: dict[int, str] = {}
    for raw in text.splitlines():
        line = raw.strip().lstrip("-*>#` ").replace("**", "").replace("`", "").strip()
        m = _LINE.match(line)
        if not m:
            continue
        label, rest = m.group(1).upper(), _TRACE_CELL.sub(" ", m.group(2))
        moves = []
        for tok in re.split(r"[\s,;]+", rest.strip()):
            tok = tok.strip(".[](){}'\"").upper()
            if not tok:
                continue
            if tok in _WORD:
                moves.append(_WORD[tok])
            elif set(tok) <= set("UDLRW"):
                moves.extend(tok)
            else:
                return None, "parse_error", f"agent {label}: unknown move {tok[:20]!r}"
        idx = LABELS.find(label) if label in LABELS else 99
        if idx >= k:
            return None, "wrong_agent_count", f"agent {label} is not in this instance ({k} agents: A-{LABELS[k - 1]})"
        if idx in plans:
            return None, "wrong_agent_count", f"agent {label} appears twice"
        plans[idx] = "".join(moves)
    if not plans:
        return None, "parse_error", "no plan lines found (expected lines like 'A: RRDD' or 'Agent A: RIGHT DOWN')"
    if len(plans) != k:
        missing = [LABELS[i] for i in range(k) if i not in plans]
        return None, "wrong_agent_count", f"plan for {len(plans)} of {k} agents; missing {', '.join(missing)}"
    return [plans[i] for i in range(k)], None, ""


def max_steps(inst: MAPFInstance) -> int:
    """Longest plan (per agent) scored as a plan rather than too_long."""
    return max(2 * inst.size * inst.size, 2 * inst.optimal_makespan)


def words() -> list[str]:
    """Multi-character units a char tokenizer should keep as one token: every cell `r,c` of the largest grid (16x16),
    so a coordinate is one token in compact and trace prompts and in trace plans."""
    return [f"{r},{c}" for r in range(16) for c in range(16)]


def alphabet() -> str:
    """Every character the compact, chat and trace prompts and completions can contain."""
    chars = set(CHAT_TEMPLATE) | set(string.ascii_letters) | set(string.digits) | set(".#:,()-> \n")
    chars -= set("{}")
    return "".join(sorted(chars))


# --- scoring ---------------------------------------------------------------------------------------------------------


class MAPFShaping(BaseModel):
    """The shaped training reward (knob paths `reward.<field>`). Valid and optimal themselves never change."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)
    valid_reward: float = Field(1.0, ge=0.0, le=2.0, description="reward of a valid plan")
    optimal_bonus: float = Field(0.5, description="added when the valid plan also has the optimal makespan (0..2: a "
                                 "negative one paid an optimal plan less than a malformed one; not a knob the engineer "
                                 "is offered, so its bounds are checked, not declared)")
    partial_credit: float = Field(0.5, ge=0.0, le=1.0, description="for an invalid but parsed plan: this times the "
                                  "share of agents "
                                  "ending on their goal without taking part in any violation")
    format_penalty: float = Field(-0.5, ge=-1.0, le=0.0, description="reward for parse_error, wrong_agent_count and "
                                  "too_long (at most 0: a positive one pays for answers that cannot be checked, and "
                                  "GRPO learns to write them)")
    length_cap: int = Field(4000, description="completions longer than this many characters get format_penalty")

    @field_validator("optimal_bonus")
    @classmethod
    def _bonus(cls, v: float) -> float:
        if not 0.0 <= v <= 2.0:
            raise ValueError(f"optimal_bonus must be in 0.0..2.0, got {v}")
        return v

    @field_validator("length_cap")
    @classmethod
    def _cap(cls, v: int) -> int:
        return int(_in_range("length_cap", v, 1, None))


def score(inst: MAPFInstance, completion: str, shaping: MAPFShaping | None = None) -> Outcome:
    """Score one completion. Never raises on any text: every failure is an Outcome."""
    sh = shaping or MAPFShaping()
    k = inst.agents
    metrics: dict[str, float] = {"optimal_makespan": float(inst.optimal_makespan), "agents": float(k)}
    moves, failure, detail = parse_plan(str(completion), k)
    if moves is None:
        metrics.update(parsed=0.0, agents_on_goal=0.0)
        return Outcome(reward=sh.format_penalty, failure=failure, detail=detail, metrics=metrics)
    cap = max_steps(inst)
    longest = max(len(m) for m in moves)
    metrics.update(parsed=1.0, plan_steps=float(longest))
    if longest > cap:
        a = max(range(k), key=lambda i: len(moves[i]))
        metrics["agents_on_goal"] = 0.0
        return Outcome(reward=sh.format_penalty, failure="too_long", where={"agent": LABELS[a], "step": cap + 1},
                       detail=f"agent {LABELS[a]} has {longest} moves; at most {cap} are scored", metrics=metrics)
    sim = simulate(inst.size, inst.grid, inst.starts, inst.goals, moves)
    metrics.update(makespan=float(sim.makespan), agents_on_goal=float(sim.clean_on_goal))
    too_long_text = len(completion) > sh.length_cap
    if sim.failure is None:
        optimal = sim.makespan == inst.optimal_makespan
        metrics["makespan_gap"] = float(sim.makespan - inst.optimal_makespan)
        reward = sh.valid_reward + (sh.optimal_bonus if optimal else 0.0)
        return Outcome(valid=True, optimal=optimal, reward=sh.format_penalty if too_long_text else reward,
                       metrics=metrics)
    where: dict[str, Any] = {"agent": LABELS[sim.agent], "step": sim.step, "cell": list(sim.cell)}
    if sim.other >= 0:
        where["other"] = LABELS[sim.other]
    detail = f"{sim.failure}: agent {LABELS[sim.agent]} at step {sim.step}, cell {tuple(sim.cell)}"
    if sim.other >= 0:
        detail += f" (with agent {LABELS[sim.other]})"
    reward = sh.format_penalty if too_long_text else sh.partial_credit * sim.clean_on_goal / k
    return Outcome(reward=reward, failure=sim.failure, where=where, detail=detail, metrics=metrics)


def validate_batch(instances: list[MAPFInstance], completions: list[str]) -> list[dict[str, Any]]:
    """Parse each completion and check all parsed plans at once with the numpy validator, grouped by (size, agents).
    Returns one dict per completion: valid, optimal, failure, agent, step, makespan (agrees with `score`)."""
    out: list[dict[str, Any]] = [{} for _ in instances]
    groups: dict[tuple[int, int], list[tuple[int, list[str]]]] = {}
    for i, (inst, text) in enumerate(zip(instances, completions)):
        moves, failure, _ = parse_plan(str(text), inst.agents)
        if moves is not None and max(len(m) for m in moves) > max_steps(inst):
            failure, moves = "too_long", None
        if moves is None:
            out[i] = {"valid": False, "optimal": False, "failure": failure, "agent": None, "step": None,
                      "makespan": None}
            continue
        groups.setdefault((inst.size, inst.agents), []).append((i, moves))
    for items in groups.values():
        idx = [i for i, _ in items]
        plans = [m for _, m in items]
        free = np.array([[[ch != "#" for ch in row] for row in instances[i].grid] for i in idx], dtype=bool)
        starts = np.array([instances[i].starts for i in idx], dtype=np.int64)
        goals = np.array([instances[i].goals for i in idx], dtype=np.int64)
        lengths = np.array([max(len(m) for m in p) for p in plans])
        res = validate_arrays(free, starts, goals, encode_moves(plans), lengths)
        for j, i in enumerate(idx):
            valid = bool(res["valid"][j])
            out[i] = {"valid": valid, "optimal": valid and int(res["makespan"][j]) == instances[i].optimal_makespan,
                      "failure": None if valid else FAILURES[int(res["failure"][j])],
                      "agent": None if valid else LABELS[int(res["agent"][j])],
                      "step": None if valid else int(res["step"][j]), "makespan": int(res["makespan"][j])}
    return out


def score_many(pairs: list[tuple[MAPFInstance, str]], shaping: MAPFShaping | None = None) -> list[Outcome]:
    """Score a batch (the reward, the evaluation and the vet step score through this, `harness.tasks.score_all`): the
    plans that parse are checked all at once by the batched numpy validator (`validate_batch`); a valid plan's Outcome
    is built from its result, an invalid one is re-run by the per-step reference (`score`) for where it failed and its
    partial credit. Equal to `[score(i, c, shaping) for i, c in pairs]` (tests/test_mapf.py)."""
    sh = shaping or MAPFShaping()
    if not pairs:
        return []
    checked = validate_batch([i for i, _ in pairs], [c for _, c in pairs])
    out = []
    for (inst, completion), res in zip(pairs, checked, strict=True):
        if not res["valid"]:
            out.append(score(inst, completion, sh))
            continue
        moves, _, _ = parse_plan(str(completion), inst.agents)
        optimal = bool(res["optimal"])
        reward = sh.valid_reward + (sh.optimal_bonus if optimal else 0.0)
        out.append(Outcome(valid=True, optimal=optimal,
                           reward=sh.format_penalty if len(completion) > sh.length_cap else reward,
                           metrics={"optimal_makespan": float(inst.optimal_makespan), "agents": float(inst.agents),
                                    "parsed": 1.0, "plan_steps": float(max(len(m) for m in moves or [""])),
                                    "makespan": float(res["makespan"]), "agents_on_goal": float(inst.agents),
                                    "makespan_gap": float(res["makespan"] - inst.optimal_makespan)}))
    return out


def slices(inst: MAPFInstance) -> dict[str, str]:
    tenths = int(10 * inst.holes / (inst.size * inst.size) + 0.5)  # the hole ratio to the nearest tenth
    return {"size": str(inst.size), "agents": str(inst.agents), "holes": f"{tenths / 10:.1f}",
            "wait": "yes" if inst.needs_wait else "no"}


# --- suites and stats ------------------------------------------------------------------------------------------------


def suite(name: str) -> list[SuiteEntry]:
    """Benchmark suites, defined here and never by a run.
    paper: sizes 3..10 x 3/4/5 agents x wait-ratio subsets 0.25/0.50/0.75, 20% holes, 5 instances per cell (360).
    small: sizes 3..6 x 2/3 agents, 20% holes, wait ratio 0.5, 16 per cell (128): CPU scale.
    duo: sizes 3..5 x 2 agents, 20% holes, wait ratio 0.5, 100 per size (300): the demo's target distribution, large
    enough that a stage-to-stage change of about 6 points is outside the paired noise."""
    if name == "paper":
        return [SuiteEntry(name=f"wait{w:.2f}/agents{k}/size{s}", n=5,
                           config=MAPFConfig(sizes=[SizeEntry(size=s, hole_ratio=0.2, wait_ratio=w, agents=k)]))
                for w in (0.25, 0.5, 0.75) for k in (3, 4, 5) for s in range(3, 11)]
    if name == "small":
        return [SuiteEntry(name=f"agents{k}/size{s}", n=16,
                           config=MAPFConfig(sizes=[SizeEntry(size=s, hole_ratio=0.2, wait_ratio=0.5, agents=k)]))
                for k in (2, 3) for s in range(3, 7)]
    if name == "duo":
        return [SuiteEntry(name=f"agents2/size{s}", n=100,
                           config=MAPFConfig(sizes=[SizeEntry(size=s, hole_ratio=0.2, wait_ratio=0.5, agents=2)]))
                for s in (3, 4, 5)]
    raise ValueError(f"unknown mapf suite {name!r}; choose one of: paper, small, duo")


def env_stats(config: MAPFConfig, n: int, seed_start: int = 0) -> dict[str, Any]:
    """Distribution of `n` instances from seeds seed_start.. : sizes, agents, holes, needs-wait share, makespans. The
    instances are read back from the drawn-instance cache where drawn before (`harness.tasks.drawn`), so how fast the
    generator draws is not among them (`evotrainer bench mapf` measures that)."""
    insts = draw(TASK, config, list(range(seed_start, seed_start + n)))
    by_size: dict[str, Any] = {}
    for size in sorted({i.size for i in insts}):
        group = [i for i in insts if i.size == size]
        by_size[str(size)] = {"n": len(group), "hole_ratio": round(float(np.mean([i.holes / size**2 for i in group])), 3),
                              "needs_wait": round(float(np.mean([i.needs_wait for i in group])), 3),
                              "makespan_mean": round(float(np.mean([i.optimal_makespan for i in group])), 2)}
    return {"n": n, "needs_wait": round(float(np.mean([i.needs_wait for i in insts])), 3),
            "agents": dict(sorted(Counter(str(i.agents) for i in insts).items())),
            "makespan_hist": dict(sorted(Counter(i.optimal_makespan for i in insts).items())),
            "attempts_mean": round(float(np.mean([i.attempts for i in insts])), 2),
            "sizes": by_size}


# --- the task object -------------------------------------------------------------------------------------------------


ENTRY_KEY = "size"  # knob paths index the `sizes` list by size: env.sizes.5.hole_ratio


def near_miss(metrics: dict[str, float]) -> bool:
    """An invalid plan that was one agent short of solving (2+ agents, all but one on its goal)."""
    on, agents = metrics.get("agents_on_goal"), metrics.get("agents")
    return on is not None and agents is not None and agents >= 2 and on == agents - 1


SPEC = TaskSpec(
    config_model=MAPFConfig, shaping_model=MAPFShaping, instance_model=MAPFInstance, styles=STYLES,
    alphabet=alphabet(), words=tuple(words()), failure_types=FAILURE_TYPES,
    format_failures=("parse_error", "wrong_agent_count"),
    round0_env=ROUND0_ENV,
    entry_key=ENTRY_KEY, slice_keys=("size", "agents", "wait"), difficulty_slice="size",
    # failure type -> knob templates it suggests, most preferred first ({size} is filled from the finding's slice)
    failure_knobs={
        "parse_error": ["recipe.temperature"],
        "wrong_agent_count": ["recipe.temperature"],
        "off_grid": ["env.sizes.{size}.data_ratio"],
        "hole": ["env.sizes.{size}.hole_ratio"],
        "vertex_conflict": ["env.sizes.{size}.wait_ratio"],
        "edge_conflict": ["env.sizes.{size}.wait_ratio"],
        "goal_not_reached": ["env.sizes.{size}.data_ratio"],
        "too_long": ["recipe.max_completion_length", "recipe.temperature"],
    },
    frontier_knob="env.sizes.{size}.data_ratio",  # the difficulty slice's share of the training mix
    gap_metric="makespan_gap",  # Outcome.metrics key: how far a valid answer is from optimal
    near_miss=near_miss, near_miss_text="all but one agent reached its goal",
    suboptimal_text="valid plan, makespan above optimal",
)


class MAPFTask:
    """The `Task` protocol for MAPF-FrozenLake (see harness/tasks/base.py), with the capabilities BatchScorer, EnvStats,
    VetConfigs and Mixture; plus validate_batch."""

    name = "mapf"
    spec = SPEC

    def mixture(self, config: MAPFConfig) -> dict[str, float]:
        return knobs.mixture_of(config, "sizes", ENTRY_KEY)

    def with_mixture(self, config: MAPFConfig, weights: dict[str, float]) -> MAPFConfig:
        return knobs.with_mixture(config, "sizes", ENTRY_KEY, weights)

    def vet_configs(self, config: MAPFConfig, knob: str) -> list[tuple[str, MAPFConfig]]:
        """Configs the vet step generates from to check a changed env: each size the knob touches alone (a per-size
        knob its size; a global knob every size with data)."""
        return knobs.entry_configs(config, "sizes", ENTRY_KEY, knob)

    def default_config(self) -> MAPFConfig:
        return default_config()

    def generate(self, config: MAPFConfig, seed: int) -> MAPFInstance:
        return generate(config, seed)

    def prompt(self, instance: MAPFInstance, style: str = "compact") -> str:
        return prompt(instance, style)

    def expert(self, instance: MAPFInstance, style: str = "compact") -> str:
        return expert(instance, style)

    def imperfect(self, instance: MAPFInstance, style: str = "compact") -> str:
        return hole_blind(instance, style)

    def score(self, instance: MAPFInstance, completion: str, shaping: MAPFShaping | None = None) -> Outcome:
        return score(instance, completion, shaping)

    def slices(self, instance: MAPFInstance) -> dict[str, str]:
        return slices(instance)

    def suite(self, name: str) -> list[SuiteEntry]:
        return suite(name)

    def env_stats(self, config: MAPFConfig, n: int, seed_start: int = 0) -> dict[str, Any]:
        return env_stats(config, n, seed_start)

    def score_many(self, pairs: list[tuple[MAPFInstance, str]], shaping: MAPFShaping | None = None) -> list[Outcome]:
        return score_many(pairs, shaping)

    def validate_batch(self, instances: list[MAPFInstance], completions: list[str]) -> list[dict[str, Any]]:
        return validate_batch(instances, completions)


TASK = MAPFTask()
