"""MAPF-FrozenLake: solver optimality against a brute-force oracle, FrozenLake agreement, the scorer's failure taxonomy,
the generator's determinism and constraints, the parser's robustness, the batched validator's agreement, config errors.

    .venv/bin/pytest tests/test_mapf.py -q
"""

from __future__ import annotations

import itertools
import time
from collections import deque

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from harness.seeds import split_of
from harness.tasks import get_task
from harness.tasks.base import Outcome, Task
from harness.tasks.mapf import (
    MAX_ATTEMPTS,
    KnobError,
    MAPFConfig,
    MAPFInstance,
    MAPFShaping,
    SizeEntry,
    UnsatisfiableConfigError,
    apply_knob,
    format_plan,
    get_knob,
    hole_count,
)
from harness.tasks.mapf_cbs import solve
from harness.tasks.mapf_validate import simulate
from harness.tasks.suites import draw_suite

TASK = get_task("mapf")
DELTA = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1), "W": (0, 0)}
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def cfg(size=4, agents=2, hole_ratio=0.2, wait_ratio=0.5, min_distance=1) -> MAPFConfig:
    return MAPFConfig(sizes=[SizeEntry(size=size, agents=agents, hole_ratio=hole_ratio, wait_ratio=wait_ratio)],
                      min_distance=min_distance)


# --- an independent oracle: breadth-first search over joint states --------------------------------------------------


def joint_bfs(inst: MAPFInstance, waits: bool = True) -> int | None:
    """Optimal makespan by brute force. waits=False: an agent may wait only by stopping on its goal for good."""
    n, k = inst.size, inst.agents
    goals = tuple(map(tuple, inst.goals))

    def moves_of(p, done):
        out = []
        for m, (dr, dc) in DELTA.items():
            q = (p[0] + dr, p[1] + dc)
            if not (0 <= q[0] < n and 0 <= q[1] < n) or inst.grid[q[0]][q[1]] == "#":
                continue
            if done and m != "W":
                continue
            out.append((q, done or (m == "W")))
        return out

    start = (tuple(map(tuple, inst.starts)), (False,) * k)
    seen, queue = {start}, deque([(start, 0)])
    while queue:
        (pos, done), d = queue.popleft()
        if pos == goals:
            return d
        options = []
        for a in range(k):
            opts = moves_of(pos[a], done[a])
            if not waits:
                opts = [(q, dn) for q, dn in opts if q != pos[a] or pos[a] == goals[a]]
            else:
                opts = [(q, False) for q, _ in opts]
            options.append(opts)
        for combo in itertools.product(*options):
            new = tuple(q for q, _ in combo)
            if len(set(new)) < k:
                continue
            if any(new[a] == pos[b] and new[b] == pos[a] and a != b for a in range(k) for b in range(k)):
                continue
            state = (new, tuple(dn for _, dn in combo))
            if state not in seen:
                seen.add(state)
                queue.append((state, d + 1))
    return None


def test_task_protocol_and_failure_codes():
    assert isinstance(TASK, Task)
    assert set(TASK.spec.failure_types) == {"parse_error", "wrong_agent_count", "off_grid", "hole", "vertex_conflict",
                                       "edge_conflict", "goal_not_reached", "too_long"}
    assert TASK.spec.styles[0] == "trace" and set(TASK.spec.styles) == {"trace", "compact", "chat"}


def test_cbs_makespan_and_wait_need_match_brute_force():
    checked = waits = 0
    for size, agents, holes in [(3, 2, 0.2), (3, 3, 0.1), (4, 2, 0.3), (3, (2, 3), 0.0)]:
        config = cfg(size=size, agents=agents, hole_ratio=holes, wait_ratio=0.5)
        for seed in range(12):
            inst = TASK.generate(config, seed)
            assert inst.optimal_makespan == joint_bfs(inst), (size, agents, seed)
            nowait = joint_bfs(inst, waits=False)
            assert inst.needs_wait == (nowait is None or nowait > inst.optimal_makespan), (size, agents, seed)
            checked += 1
            waits += inst.needs_wait
    assert checked == 48 and 8 <= waits <= 40  # both kinds were exercised


def test_expert_plans_score_valid_and_optimal_in_both_styles():
    config = MAPFConfig(sizes=[SizeEntry(size=s, agents=(2, 4), hole_ratio=0.3, wait_ratio=0.5) for s in (3, 5, 8, 10)])
    for seed in range(30):
        inst = TASK.generate(config, seed)
        for style in TASK.spec.styles:
            out = TASK.score(inst, TASK.expert(inst, style))
            assert out.valid and out.optimal, (seed, style, out)
            assert out.metrics["makespan"] == inst.optimal_makespan
            assert out.reward == MAPFShaping().valid_reward + MAPFShaping().optimal_bonus
        assert sum(map(len, inst.plan)) == inst.sum_of_costs


def test_cbs_returns_none_for_unsolvable_swap_corridor():
    # a 3x3 lake whose only free cells are the top row: two agents must swap ends
    free = np.array([1, 1, 1, 0, 0, 0, 0, 0, 0], dtype=bool)
    assert solve(3, free, [0, 2], [2, 0]) is None
    sol = solve(3, free, [0, 1], [1, 2])  # following is fine
    assert sol.makespan == 1 and sol.moves == ["R", "R"] and not sol.needs_wait


# --- single-agent moves agree with gymnasium's FrozenLake -----------------------------------------------------------


def test_single_agent_moves_agree_with_frozenlake():
    import gymnasium as gym

    rng = np.random.default_rng(0)
    action = {"L": 0, "D": 1, "R": 2, "U": 3}
    compared = off_seen = 0
    for _ in range(60):
        n = int(rng.integers(3, 9))
        grid = [["#" if rng.random() < 0.25 else "." for _ in range(n)] for _ in range(n)]
        grid[0][0] = "."
        goal = (n - 1, n - 1)
        grid[goal[0]][goal[1]] = "."
        desc = ["".join("H" if ch == "#" else "F" for ch in row) for row in grid]
        desc[0] = "S" + desc[0][1:]
        desc[-1] = desc[-1][:-1] + "G"
        env = gym.make("FrozenLake-v1", desc=desc, is_slippery=False)
        state, _ = env.reset(seed=0)
        moves = "".join(rng.choice(list("UDLR"), size=int(rng.integers(1, 15))))
        rows = ["".join(r) for r in grid]
        for t in range(1, len(moves) + 1):
            state, _, terminated, _, _ = env.step(action[moves[t - 1]])
            sim = simulate(n, rows, [(0, 0)], [goal], [moves[:t]])
            # both keep an agent in place on an off-grid move; ours also reports the first one as off_grid
            assert divmod(state, n) == sim.final[0]
            if sim.failure == "off_grid" and sim.step == t:
                off_seen += 1
            compared += 1
            if terminated:  # a hole or the goal ends the episode
                r, c = sim.final[0]
                assert rows[r][c] == "#" or (r, c) == goal
                assert sim.failure in ("hole", "off_grid") or (r, c) == goal
                break
        env.close()
    assert compared > 150 and off_seen > 10


# --- the scorer's failure taxonomy -------------------------------------------------------------------------------------


def _inst(grid, starts, goals, plan, opt=None) -> MAPFInstance:
    opt = opt if opt is not None else max(len(m) for m in plan)
    return MAPFInstance(seed=0, size=len(grid), grid=grid, starts=starts, goals=goals, optimal_makespan=opt,
                        sum_of_costs=sum(map(len, plan)), needs_wait=False, plan=plan)


LAKE = _inst(["....", ".#..", "....", "...."], [(0, 0), (0, 3)], [(0, 2), (2, 3)], ["RR", "DD"])


@pytest.mark.parametrize("completion, failure, where", [
    ("nothing here", "parse_error", {}),
    ("A: RR\nB: DX", "parse_error", {}),
    ("A: RR", "wrong_agent_count", {}),
    ("A: RR\nA: RR\nB: DD", "wrong_agent_count", {}),
    ("A: RR\nB: DD\nC: UU", "wrong_agent_count", {}),
    ("A: " + "RL" * 40 + "\nB: DD", "too_long", {"agent": "A"}),
    ("A: U\nB: DD", "off_grid", {"agent": "A", "step": 1, "cell": [-1, 0]}),
    ("A: DR\nB: DD", "hole", {"agent": "A", "step": 2, "cell": [1, 1]}),
    ("A: RRR\nB: WL", "vertex_conflict", {"agent": "A", "step": 2, "cell": [0, 2], "other": "B"}),
    ("A: RRR\nB: LL", "edge_conflict", {"agent": "A", "step": 2, "cell": [0, 2], "other": "B"}),
    ("A: R\nB: DD", "goal_not_reached", {"agent": "A", "step": 2, "cell": [0, 1]}),
])
def test_crafted_plans_produce_each_failure(completion, failure, where):
    out = TASK.score(LAKE, completion)
    assert not out.valid and not out.optimal and out.failure == failure, out
    for key, value in where.items():
        assert out.where[key] == value, out.where
    batch = TASK.validate_batch([LAKE], [completion])[0]
    assert batch["failure"] == failure and not batch["valid"]


def test_scorer_rewards_and_formats():
    ok = TASK.score(LAKE, "Sure.\nAgent A: right RIGHT\n**Agent B:** [down, 'down'].")
    assert ok.valid and ok.optimal and ok.reward == 1.5 and ok.failure is None
    slow = TASK.score(LAKE, "a: w r r\nb: dd")  # valid, makespan 3 > 2
    assert slow.valid and not slow.optimal and slow.reward == 1.0 and slow.metrics["makespan"] == 3
    half = TASK.score(LAKE, "A: RR\nB: D")  # B stops short; A clean on goal
    assert half.failure == "goal_not_reached" and half.reward == pytest.approx(0.25)
    assert TASK.score(LAKE, "junk").reward == -0.5
    custom = TASK.score(LAKE, "A: RR\nB: D", MAPFShaping(partial_credit=1.0))
    assert custom.reward == pytest.approx(0.5)
    capped = TASK.score(LAKE, "A:RR\nB:DD" + " " * 50, MAPFShaping(length_cap=20))
    assert capped.valid and capped.reward == -0.5
    with pytest.raises(ValidationError, match="extra"):
        MAPFShaping(bonus=1.0)


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ABCabc:UDLRWupdownleftrightwait ,\n*-x9#")), max_size=80) | st.text())
def test_parser_never_raises(text):
    out = TASK.score(LAKE, text)
    assert isinstance(out, Outcome)
    assert out.valid == (out.failure is None)
    if out.failure:
        assert out.failure in TASK.spec.failure_types


# --- the batched validator agrees with the per-plan scorer ---------------------------------------------------------

_POOL = [TASK.generate(cfg(size=s, agents=k, hole_ratio=0.25, wait_ratio=0.5), seed)
         for s, k, seed in [(3, 2, 1), (4, 3, 2), (5, 3, 3), (6, 4, 4), (5, 2, 5)]]


@FAST
@given(st.lists(st.tuples(st.integers(0, len(_POOL) - 1), st.integers(0, 3),
                          st.lists(st.text(alphabet="UDLRW", max_size=9), min_size=4, max_size=4)),
                min_size=1, max_size=12))
def test_batched_validator_agrees_with_scorer(cases):
    insts, texts = [], []
    for which, mode, plans in cases:
        inst = _POOL[which]
        moves = list(inst.plan) if mode == 0 else plans[:inst.agents]  # mode 0: the expert plan
        if mode == 1:  # perturb the expert plan in one place
            moves = list(inst.plan)
            moves[0] = moves[0][:2] + plans[0][:2] + moves[0][2:]
        insts.append(inst)
        texts.append("\n".join(f"{'ABCD'[a]}:{m}" for a, m in enumerate(moves)))
    batch = TASK.validate_batch(insts, texts)
    for inst, text, got in zip(insts, texts, batch):
        want = TASK.score(inst, text)
        assert got["valid"] == want.valid and got["failure"] == want.failure, (text, got, want)
        assert got["optimal"] == want.optimal
        if want.failure and want.where:
            assert got["agent"] == want.where["agent"] and got["step"] == want.where["step"], (text, got, want)
    # the batch scorer (reward, evaluation, vet) runs the batched validator and equals the one-by-one scorer exactly
    pairs = list(zip(insts, texts))
    assert TASK.score_many(pairs) == [TASK.score(i, t) for i, t in pairs]
    capped = TASK.spec.shaping_model(length_cap=12, optimal_bonus=0.25)
    assert TASK.score_many(pairs, capped) == [TASK.score(i, t, capped) for i, t in pairs]


# --- the generator -----------------------------------------------------------------------------------------------------


def test_generator_is_deterministic_and_seed_sensitive():
    config = TASK.default_config()
    a = [TASK.generate(config, s) for s in range(10)]
    b = [TASK.generate(config, s) for s in range(10)]
    assert a == b
    assert len({(i.size, tuple(i.grid), tuple(i.starts)) for i in a}) == 10
    assert MAPFInstance.model_validate_json(a[3].model_dump_json()) == a[3]


@settings(max_examples=6, deadline=None)
@given(size=st.integers(3, 7), hole_ratio=st.sampled_from([0.0, 0.1, 0.3]), wait_ratio=st.sampled_from([0.0, 0.5, 1.0]),
       agents=st.sampled_from([2, 3, (2, 3)]))
def test_generator_constraints(size, hole_ratio, wait_ratio, agents):
    config = MAPFConfig(sizes=[SizeEntry(size=size, hole_ratio=hole_ratio, wait_ratio=wait_ratio, agents=agents)],
                        min_distance=2)
    insts = [TASK.generate(config, s) for s in range(30)]
    lo, hi = (agents, agents) if isinstance(agents, int) else agents
    for inst in insts:
        assert inst.size == size and inst.holes == hole_count(size, hole_ratio)
        assert lo <= inst.agents <= hi
        assert len(set(inst.starts)) == inst.agents == len(set(inst.goals))
        for s, g in zip(inst.starts, inst.goals):
            assert inst.grid[s[0]][s[1]] == "." and inst.grid[g[0]][g[1]] == "."
            assert abs(s[0] - g[0]) + abs(s[1] - g[1]) >= 2
    share = np.mean([i.needs_wait for i in insts])
    assert abs(share - wait_ratio) <= 0.3  # 30 Bernoulli draws: 3.3 standard deviations at p=0.5


def test_one_agent_of_a_range_never_asks_for_a_wait():
    """`agents: [1, 2]` with waits asked for: a seed that drew one agent and a wait could never be satisfied and
    raised after ~2,500 solves (an outside review, seventy-ninth session). One agent never needs a wait."""
    from harness.tasks.mapf import MAPFConfig, SizeEntry

    cfg = MAPFConfig(sizes=[SizeEntry(size=4, hole_ratio=0.2, wait_ratio=0.5, agents=(1, 2))])
    insts = [TASK.generate(cfg, s) for s in range(12)]
    assert {len(i.starts) for i in insts} == {1, 2}


def test_rare_but_satisfiable_level_is_drawn_on_every_seed():
    # an open 3x3 with two agents needs a wait in about one layout in sixty: 300 whole draws missed it on one seed
    # of these forty (and seed 20 of hypothesis' draw with wait_ratio 0.5), so a config that works failed on some seeds
    config = cfg(size=3, agents=2, hole_ratio=0.0, wait_ratio=1.0, min_distance=2)
    insts = [TASK.generate(config, seed) for seed in range(40)]
    assert all(i.needs_wait for i in insts) and max(i.attempts for i in insts) > MAX_ATTEMPTS


def test_mixture_follows_data_ratio():
    config = MAPFConfig(sizes=[SizeEntry(size=3, data_ratio=3.0), SizeEntry(size=5, data_ratio=1.0),
                               SizeEntry(size=7, data_ratio=0.0)])
    sizes = [TASK.generate(config, s).size for s in range(200)]
    assert 7 not in sizes and 0.65 <= sizes.count(3) / 200 <= 0.85


def test_unsatisfiable_config_errors_quickly_naming_the_knob():
    with pytest.raises(ValidationError, match=r"hole_ratio.*env\.sizes\.3\.hole_ratio"):
        MAPFConfig(sizes=[SizeEntry(size=3, agents=5, hole_ratio=0.5)])
    # four free cells in a line, two agents end to end: they must swap, never solvable
    config = cfg(size=3, agents=2, hole_ratio=0.6, wait_ratio=1.0, min_distance=3)
    t0 = time.perf_counter()
    with pytest.raises(UnsatisfiableConfigError, match=r"env\.sizes\.3\."):
        for seed in range(5):
            TASK.generate(config, seed)
    assert time.perf_counter() - t0 < 15


@pytest.mark.parametrize("path, value, field, allowed", [
    ("sizes.5.hole_ratio", 0.9, "hole_ratio", "0.0..0.6"),
    ("env.sizes.5.wait_ratio", 1.5, "wait_ratio", "0.0..1.0"),
    ("sizes.5.agents", 17, "agents", "1..16"),
    ("sizes.20.data_ratio", 1.0, "size", "3..16"),
    ("min_distance", 0, "min_distance", "1..30"),
])
def test_out_of_range_knob_names_field_and_range(path, value, field, allowed):
    config = MAPFConfig(sizes=[SizeEntry(size=5)])
    with pytest.raises(ValidationError) as exc:
        apply_knob(config, path, value)
    assert field in str(exc.value) and allowed in str(exc.value)


def test_knob_helpers():
    config = TASK.default_config()
    new = apply_knob(config, "env.sizes.5.hole_ratio", 0.4)
    assert get_knob(new, "sizes.5.hole_ratio") == 0.4 and get_knob(config, "sizes.5.hole_ratio") == 0.2
    assert new.entry(6) == config.entry(6)
    added = apply_knob(config, "sizes.12.data_ratio", 2.0)
    assert added.entry(12).data_ratio == 2.0 and [e.size for e in added.sizes][-1] == 12
    assert get_knob(apply_knob(config, "min_distance", 3), "env.min_distance") == 3
    with pytest.raises(KnobError, match="data_ratio, hole_ratio"):
        apply_knob(config, "sizes.5.holes", 0.1)
    with pytest.raises(KnobError):
        get_knob(config, "recipe.lr")
    with pytest.raises(ValidationError, match="unique"):
        MAPFConfig(sizes=[SizeEntry(size=4), SizeEntry(size=4)])
    with pytest.raises(ValidationError, match="data_ratio > 0"):
        MAPFConfig(sizes=[SizeEntry(size=4, data_ratio=0.0)])
    with pytest.raises(ValidationError, match="extra"):
        MAPFConfig.model_validate({"sizes": [{"size": 4, "hole_ration": 0.1}]})


# --- prompts, alphabet, slices, suites ---------------------------------------------------------------------------------


def test_prompts_alphabet_and_slices():
    alphabet = set(TASK.spec.alphabet)
    config = MAPFConfig(sizes=[SizeEntry(size=s, agents=(2, 5), hole_ratio=0.2) for s in (3, 6, 10)])
    for seed in range(15):
        inst = TASK.generate(config, seed)
        for style in TASK.spec.styles:
            text = TASK.prompt(inst, style) + TASK.expert(inst, style)
            assert set(text) <= alphabet, set(text) - alphabet
        compact = TASK.prompt(inst, "compact").splitlines()
        assert len(compact) == inst.size + inst.agents + 1 and compact[-1] == "plan:"
        assert all(len(r) == 2 * inst.size for r in compact[:inst.size])
        # the agent lines give back every start and goal, and agree with the marks in the grid
        for i, line in enumerate(compact[inst.size:-1]):
            label, coords = line.split(" ")
            start, goal = (tuple(int(x) for x in half.split(",")) for half in coords.split(">"))
            assert label == "ABCDEFGH"[i] and start == tuple(inst.starts[i]) and goal == tuple(inst.goals[i])
            assert compact[start[0]][2 * start[1]] == label and compact[goal[0]][2 * goal[1] + 1] == label.lower()
        s = TASK.slices(inst)
        assert s["size"] == str(inst.size) and s["agents"] == str(inst.agents)
        assert s["wait"] == ("yes" if inst.needs_wait else "no") and s["holes"] == "0.2"
    with pytest.raises(ValueError, match="style"):
        TASK.prompt(inst, "verbose")


def test_compact_prompt_exact_text_and_plan_round_trip():
    inst = MAPFInstance(seed=0, size=3, grid=["...", "...", ".##"], starts=[(0, 0), (1, 1)], goals=[(1, 0), (0, 1)],
                        optimal_makespan=1, sum_of_costs=2, needs_wait=False, plan=["D", "U"])
    assert TASK.prompt(inst, "compact") == "A..b..\n.aB...\n..####\nA 0,0>1,0\nB 1,1>0,1\nplan:\n"
    assert TASK.expert(inst, "compact") == "A:D\nB:U"
    out = TASK.score(inst, TASK.expert(inst, "compact"))
    assert out.valid and out.optimal
    # echoing the agent lines before the plan does not confuse the parser (they carry no ':' after the label)
    assert TASK.score(inst, "A 0,0>1,0\nB 1,1>0,1\nA:D\nB:U").valid


def test_trace_prompt_exact_text_and_cells_are_not_scored():
    inst = MAPFInstance(seed=0, size=3, grid=["...", "...", ".##"], starts=[(0, 0), (1, 1)], goals=[(1, 0), (0, 1)],
                        optimal_makespan=1, sum_of_costs=2, needs_wait=False, plan=["D", "U"])
    assert TASK.prompt(inst, "trace") == "size 3\nholes 2,1 2,2\nA 0,0>1,0\nB 1,1>0,1\nplan:\n"
    assert TASK.expert(inst, "trace") == "A:D1,0\nB:U0,1"
    assert TASK.score(inst, TASK.expert(inst, "trace")).optimal
    assert format_plan(["DW", "UR"], "trace", inst.starts) == "A:D1,0W1,0\nB:U0,1R0,2"
    # the cells are scratchpad: only the moves count, so a wrong cell does not change the verdict
    assert TASK.score(inst, "A:D9,9\nB:U0,1").valid
    assert TASK.score(inst, "A:D1,0W1,0\nB:U0,1R0,2").failure == "goal_not_reached"  # B ends on (0,2)
    assert TASK.score(inst, "A:D(1, 0)\nB:U 0,1").valid
    assert TASK.score(inst, "A:D1,0\nB:L1,0").failure == "vertex_conflict"
    assert TASK.score(inst, "A:U-1,0\nB:U0,1").failure == "off_grid"
    assert TASK.score(inst, "A:D1\nB:U0,1").failure == "parse_error"  # a bare number is not a cell
    no_holes = inst.model_copy(update={"grid": ["...", "...", "..."]})
    assert "holes -\n" in TASK.prompt(no_holes, "trace")
    # an outside review (seventy-ninth session): a header `Agents:` was read as agent S (a right plan labelled
    # wrong_agent_count), and a long run of spaces after a move made the cell pattern quadratic (~5 s at 20,000
    # spaces; milliseconds now: measured, not asserted here)
    assert TASK.score(inst, "Agents:\nAgent A: DOWN\nAgent B: UP").valid
    assert not TASK.score(inst, "A:R" + " " * 20_000 + "x\nB:U0,1").valid


def test_words_are_single_tokens_and_round_trip():
    from policies.model import build_char_tokenizer

    tok = build_char_tokenizer(TASK.spec.alphabet, list(TASK.spec.words))
    text = "size 12\nholes 11,12 1,10\nA:R0,1R10,1"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    pieces = tok.convert_ids_to_tokens(ids)
    assert "11,12" in pieces and "1,10" in pieces and "10,1" in pieces and "0,1" in pieces
    assert tok.decode(ids) == text
    assert len(tok) == len(set(TASK.spec.alphabet)) + 5 + 256


@given(size=st.integers(3, 12), agents=st.integers(1, 4), seed=st.integers(0, 10**6))
@FAST
def test_alphabet_covers_every_prompt_and_completion_character(size, agents, seed):
    alphabet = set(TASK.spec.alphabet)
    wait = 0.0 if agents == 1 else 0.5
    inst = TASK.generate(cfg(size=size, agents=agents, hole_ratio=0.2, wait_ratio=wait), seed)
    for style in TASK.spec.styles:
        text = TASK.prompt(inst, style) + TASK.expert(inst, style)
        assert set(text) <= alphabet, (style, set(text) - alphabet)


def test_suites_come_from_the_test_split():
    paper = TASK.suite("paper")
    assert {e.config.sizes[0].size for e in paper} == set(range(3, 11))
    assert {e.config.sizes[0].agents for e in paper} == {3, 4, 5}
    assert {e.config.sizes[0].wait_ratio for e in paper} == {0.25, 0.5, 0.75}
    small = TASK.suite("small")
    assert 100 <= sum(e.n for e in small) <= 200
    drawn = draw_suite(TASK, "small")
    assert len(drawn) == sum(e.n for e in small)
    assert all(split_of(inst.seed) == "test" for _, inst in drawn)
    assert len({inst.seed for _, inst in drawn}) == len(drawn)
    first = small[0]
    assert [i for _, i in drawn[:5]] == [TASK.generate(first.config, i.seed) for _, i in drawn[:5]]
    assert all(name == first.name for name, _ in drawn[:first.n])
    probe = draw_suite(TASK, "small", split="probe", start=7, per_entry=2)
    assert len(probe) == 2 * len(small) and all(split_of(i.seed) == "probe" for _, i in probe)
    assert draw_suite(TASK, "small", per_entry=2)[2:4] == drawn[first.n:first.n + 2]
    with pytest.raises(ValueError, match="small"):
        TASK.suite("huge")


def test_a_test_set_is_drawn_once_per_process_and_each_eval_section_is_its_own(monkeypatch):
    """`draw_test` generates an eval section's instances once per process (each experiment arm's setup used to draw
    the same 1,000 boards again): the second call returns the same instances without generating, and another `n`,
    limit or generator config is a draw of its own. Would catch a memo keyed by the config's name alone (`env:<hash>`
    leaves `n` out) handing a 500-instance run a 1,000-instance test set."""
    from harness.config import EvalConfig
    from harness.tasks import suites

    monkeypatch.setattr(suites, "_DRAWN", {})
    monkeypatch.setenv("EVOTRAINER_INSTANCE_CACHE", "0")  # the per-process memo alone (the disk cache: test_drawn.py)
    made = []
    real = TASK.generate
    monkeypatch.setattr(type(TASK), "generate", lambda self, c, s: made.append(s) or real(c, s))
    env = {"min_distance": 1, "sizes": [{"size": 3, "data_ratio": 1.0, "hole_ratio": 0.2, "agents": 2}]}
    a = suites.draw_test(TASK, EvalConfig(env=env, n=12))
    assert len(a) == 12 and len(made) == 12
    b = suites.draw_test(TASK, EvalConfig(env=env, n=12))
    assert b == a and b is not a and len(made) == 12  # the memo's list is not handed out to be mutated
    assert len(suites.draw_test(TASK, EvalConfig(env=env, n=6))) == 6 and len(made) == 18
    assert len(suites.draw_test(TASK, EvalConfig(env=env, n=12, limit=4))) == 4
    other = {**env, "sizes": [{**env["sizes"][0], "hole_ratio": 0.3}]}
    assert suites.draw_test(TASK, EvalConfig(env=other, n=12)) != a
