"""The judge of diagnostic candidates: a diagnostic is judged as a diagnostic, never by an A/B effect it cannot have.

A diagnostic (`diagnostics/<name>.py`, `harness.diagnostics`) does not change training, so two arms that differ only
in it train the same policy and an A/B backtest measures +0.000 by construction. This module judges it on what it is
for, replayed in the sandbox runner on HELD-OUT cached rollouts (the rollouts of earlier stages: their probes and
their backtest arms, never the current stage's probe that the engineer saw in its diagnosis) and on cases planted
from them. It lives outside the sandbox, next to the gate (`harness.backtest`): nothing a run evolves can change it.

    from harness.diagjudge import judge_diagnostic, heldout_rollouts
    held = heldout_rollouts(run_dir / "rollouts", stage=3)        # stages 1-2: probes and backtest arms
    v = judge_diagnostic("s3c1", "diagnostics/slow_slice.py", source, held, alpha=0.05)
    v.decision, v.reason                                           # an ordinary harness.records.Verdict

The procedure, at the gate's alpha (`gate.confidence`):
- it runs without error on the held-out rollouts and on their solved subset, where it raises no warn/critical finding
  (a finding must stay silent where nothing fails);
- a VETO must block a planted invalid high-scoring arm (control: one side of an A/A pair; candidate: the other side,
  every rollout made a failure and scored as this run's reward can score it: paid more than any held-out rollout,
  or, when the reward is validity itself (`diagnostics.reward_is_validity`), paid the failure's reward, since then
  no failing arm can score high) and must block none of its A/A pairs, each in both orders, the same policies on
  both sides: `AA_SPLITS` halves of the held-out rollouts by instance (`_split`, noisier than sampling alone, as live
  arms differ by their training), and, once earlier stages left enough backtest rollouts, `AA_SPLITS` pairs shaped
  as the live gate's (`_live_split`: both arms on the same backtest instances, one group per instance numbered from
  0, as many samples per instance as a live arm holds, dealt from two earlier arms judged on that instance). It must
  also let a planted better arm through (`planted_better_arm`: the candidate's failures replaced by what the policy
  writes where it solves them): a promoted veto stays in the harness, and one that blocks improvements ("the plans
  got longer") would block every good change for the rest of the run. The first A/A pair
  it blocks decides (a slow veto is not run on the rest), and a veto that fails to run on the planted invalid arm
  has not blocked it. A veto is code and can tell a replay at its judgement from a live pair later by something no
  replay copies (the wall clock, say: a time bomb); so each block it makes at the gate is re-checked then
  (`recheck_veto`, `veto_stands`: these veto checks again, on every earlier stage's rollouts), and a block whose veto
  fails them is void, recorded beside the verdict (`Evidence.vetoes_void`), the candidate judged without it. What a
  veto can still tell apart is the live pair itself (its fresh instances): the checks bound honest mistakes and the
  plain ways of gaming them, not every deception, and a veto can only ever block;
- a FINDING (warn or critical) must predict what it says on held-out data it did not choose from: the diagnostic is
  run on every rollout of a random half of the held-out instances, and each finding it raises there is tested on the
  other half (`_halves`: the code may pick its slice from the data it reads, e.g. the worst of many, and a slice picked
  and tested on the same rollouts passed 13-23% of the time with every slice alike). A finding on a slice claims that
  the slice fails more than the rest: with one rollout per instance of the other half (the first seen, so the units
  are independent draws) the slice must hold more of the failures than chance would put there: Fisher's exact test,
  one-sided, at alpha (`fisher_greater`). It is exact at any n, so a false claim (the slice fails no more than the
  rest) passes with probability at most alpha whatever slice the code chose on the other half (simulated, a
  diagnostic naming the worst of 4-32 equal slices: 1.8-3.0% of 2000 draws; before the split and this test, 13-23%:
  BENCHMARKS.md, fifty-third session). A finding without a
  slice, or on a slice that covers every held-out instance, names no rollouts it predicts fail: it is checked for
  silence on the solved rollouts only, and it is no claim shown (a "the learning rate is too high" that fires on any
  failure at a random rate passed as one);
- it is promoted only when it exercised a claim (its veto passed every check, or at least one finding on a slice
  fired on one half and held on the other) and nothing failed. A diagnostic whose claim cannot be true for the run's reward (reward
  hacking under a reward that is validity) fires nowhere on real held-out rollouts and does not block the planted
  arm scored as this run scores it: it is rejected.

Every claim of a diagnostic must hold, so a diagnostic with several claims is never more likely to pass than its
weakest false one: the false promotion rate stays at most alpha per diagnostic. The A/A check is zero-tolerance over
a few splits (a veto that blocks a same-policy pair at rate p passes with probability (1 - p)^(2 x AA_SPLITS) or
less); it does not bound a tiny p. Without enough held-out rollouts (the first stage has none) the diagnostic is
rejected with that reason: nothing was shown. Tests: tests/test_diagjudge.py.
"""

from __future__ import annotations

import collections
import math
import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from harness import diagnostics as D
from harness.records import Finding, Rollout, Verdict, cut, read_rollouts
from harness.seeds import check_split, split_of
from sandbox.runner import Limits

if TYPE_CHECKING:
    from harness.run import Run

MIN_HELDOUT_INSTANCES = 8  # fewer distinct held-out instances than this: nothing can be shown either way
MAX_HELDOUT_ROLLOUTS = 2048  # older stages' files added while within this (the latest earlier stage's always whole)
AA_SPLITS = 3  # random instance splits of the held-out rollouts; each is tried in both orders
_FILE = re.compile(r"^s(\d+)-(probe|.+-backtest)\.jsonl\.gz$")


# --- held-out rollouts --------------------------------------------------------------------------------------------------


def heldout_rollouts(rollouts_dir: Path, stage: int, max_rollouts: int = MAX_HELDOUT_ROLLOUTS) -> list[Rollout]:
    """The cached rollouts of stages before `stage` (`s<j>-probe.jsonl.gz`, `s<j>-<arm>-backtest.jsonl.gz`), most
    recent stage first: that stage's files whole, however many rollouts they hold, then older stages' files while the total stays
    within `max_rollouts`; a file is never cut part-way. Why whole: an arm's file cut short made every replayed A/A
    pair smaller than a live arm, and a veto that blocked only arms of more instances than the replays held passed its
    judgement and its re-check and then blocked every live candidate (an outside review, seventy-ninth session, on a
    judge of 256 instances x 4). Each file's seeds are checked to be of its split (probe or backtest; never train or
    test), and its groups are renumbered so no two files share a group index."""
    files = []
    for p in Path(rollouts_dir).glob("s*-*.jsonl.gz"):
        m = _FILE.match(p.name)
        if m and int(m.group(1)) < stage:
            files.append((-int(m.group(1)), m.group(2) != "probe", p.name, p))
    out: list[Rollout] = []
    offset = 0
    latest = min((f[0] for f in files), default=None)
    for neg_stage, is_backtest, _, p in sorted(files):
        rs = read_rollouts(p)
        if neg_stage != latest and len(out) + len(rs) > max_rollouts:
            break
        check_split([r.seed for r in rs], "backtest" if is_backtest else "probe")
        out += [r.model_copy(update={"group": offset + r.group}) for r in rs]
        offset += 1 + max((r.group for r in rs), default=0)
    return out


def _units(rollouts: list[Rollout]) -> list[Rollout]:
    """One rollout per instance (the first seen): the independent units of a slice claim's test."""
    seen: dict[int, Rollout] = {}
    for r in rollouts:
        seen.setdefault(r.seed, r)
    return list(seen.values())


# --- the statistics -----------------------------------------------------------------------------------------------------


def _in_slice(r: Rollout, sl: dict[str, str]) -> bool:
    return all(r.slices.get(k) == v for k, v in sl.items())


def slice_claim(f: Finding, units: list[Rollout], alpha: float, label: str | None = None) -> tuple[bool | None, str]:
    """(True | False, why) for a finding on a slice: does the slice fail more than the rest on these units, by
    Fisher's exact test, one-sided, at alpha? (None, why) when the finding names no slice to test (no slice, or
    one that covers every unit). `label` names the finding in `why` (default its code). Only a slice the held-out
    rollouts have is quoted (their own slice values: aggregates); the code's own keys and values are not."""
    label = label or f.code
    inside = [r for r in units if _in_slice(r, f.slice)]
    rest = [r for r in units if not _in_slice(r, f.slice)]
    if not f.slice or not rest:
        return None, f"{label} names no slice apart from the rest"
    if not inside:  # its keys and values are then the code's own text, not a slice of the held-out data
        return False, f"{label} claims a slice that no held-out instance has"
    where = ",".join(f"{k}={v}" for k, v in f.slice.items())  # every key and value a held-out rollout's own
    ki, kr = sum(not r.valid for r in inside), sum(not r.valid for r in rest)
    pv = fisher_greater(ki, len(inside), kr, len(rest))
    text = (f"{label} on {where}: held-out failure {ki}/{len(inside)} = {ki / len(inside):.2f} vs the rest "
            f"{kr}/{len(rest)} = {kr / len(rest):.2f} (Fisher's exact one-sided p = {pv:.3g})")
    return pv <= alpha, text


def _label(f: Finding, i: int, details: list[str]) -> str:
    """How the judge's reason names a finding the code produced on held-out rollouts: by its severity only, never by
    its code (text the code chose there: it can spell a held-out board, problem or program, and the reason reaches the
    engineer) nor by its place in the list (padding with info findings would spell a number of the code's choosing).
    The code and its place go to the run's records."""
    details.append(f"finding {i + 1}: {f.code}")
    return f"a finding ({f.severity})"


def fisher_greater(k1: int, n1: int, k2: int, n2: int) -> float:
    """Fisher's exact test, one-sided: P(X >= k1) for X hypergeometric (k1 + k2 failures among n1 + n2 units, n1 of
    them drawn): the chance that group 1 holds at least k1 of the failures if both groups fail alike (Fisher 1935;
    Agresti, "Categorical Data Analysis", 3rd ed., 3.5.1). Exact at any n, so a false claim passes at most alpha."""
    n, k = n1 + n2, k1 + k2
    def logc(a: int, b: int) -> float:
        return math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)
    total = logc(n, n1)
    return min(1.0, sum(math.exp(logc(k, x) + logc(n - k, n1 - x) - total) for x in range(k1, min(n1, k) + 1)))


def _halves(rollouts: list[Rollout], rng: random.Random) -> tuple[list[Rollout], list[Rollout]]:
    """(every rollout of a random half of the instances, one unit per instance of the other half). A diagnostic picks
    the slice it reports from the rollouts it reads: tested on those same rollouts, "the worst of 16 slices of 16
    instances fails more than the rest" passed 13% of the time with every slice failing alike (23% over 32 slices),
    against the alpha its test claims. Chosen on one half and tested on the other, the slice is fixed before
    the data that test it are drawn, so the check's bound holds whatever the code's selection (sample splitting: Cox
    1975, "A note on data-splitting for the evaluation of significance levels", Biometrika 62)."""
    units = _units(rollouts)
    seeds = sorted(r.seed for r in units)
    rng.shuffle(seeds)
    first = set(seeds[: len(seeds) // 2])
    return [r for r in rollouts if r.seed in first], [r for r in units if r.seed not in first]


# --- planted arms -------------------------------------------------------------------------------------------------------


def _split(rollouts: list[Rollout], rng: random.Random) -> tuple[list[Rollout], list[Rollout]]:
    """Two halves of the rollouts by instance (every rollout of a seed on the same side): an A/A pair whose two sides
    differ by which instances they hold, as two live arms differ by their training (noisier than sampling alone)."""
    seeds = sorted({r.seed for r in rollouts})
    rng.shuffle(seeds)
    first = set(seeds[: len(seeds) // 2])
    return [r for r in rollouts if r.seed in first], [r for r in rollouts if r.seed not in first]


def _live_split(rollouts: list[Rollout], rng: random.Random) -> tuple[list[Rollout], list[Rollout]] | None:
    """An A/A pair shaped as the live gate's pairs are: both sides on the SAME backtest instances, one group per
    instance on each side, numbered from 0, each group as many samples as a live arm holds of an instance (`k`: the
    commonest group length of the earlier backtest arms, the judge's `samples`, 1 for a greedy judge). Each instance's
    side groups are dealt at random from the pooled samples of two earlier arms judged on it (an earlier decision's
    control and candidate arms), so the two sides are the same mixture of policies: an A/A pair, indistinguishable by
    shape from a live one. Where earlier stages left fewer than MIN_HELDOUT_INSTANCES instances judged by two arms,
    the samples of one group are dealt in halves (the shape before: half a live arm's samples per instance, which a
    veto could tell from a live pair; an outside attack, seventieth session, promoted one that blocked only arms with
    four samples per instance, and every later candidate with it). A veto that blocked only what looks live (no
    probe seed, one seed set; then also: no instance in two groups) passed the replayed pairs, was promoted, and
    then blocked every live candidate. None while fewer than MIN_HELDOUT_INSTANCES backtest instances have two or
    more samples."""
    groups: dict[int, list[Rollout]] = {}
    for r in rollouts:
        if split_of(r.seed) == "backtest":
            groups.setdefault(r.group, []).append(r)
    if not groups:
        return None
    lengths = collections.Counter(len(g) for g in groups.values())
    k = max(lengths, key=lambda n: (lengths[n], n))
    by_seed: dict[int, list[list[Rollout]]] = {}
    for _, g in sorted(groups.items()):
        if len(g) == k:
            by_seed.setdefault(g[0].seed, []).append(g)
    two = {seed: gs[:2] for seed, gs in by_seed.items() if len(gs) >= 2}
    a: list[Rollout] = []
    b: list[Rollout] = []
    if len(two) >= MIN_HELDOUT_INSTANCES:
        for i, gs in enumerate(two.values()):  # groups numbered from 0 on both sides, as a live arm's are
            pool = [r.model_copy(update={"group": i}) for g in gs for r in g]
            rng.shuffle(pool)
            a += pool[:k]
            b += pool[k:]
        return a, b
    one: dict[int, list[Rollout]] = {}  # one group per instance: an earlier stage's two arms share their instances,
    for _, g in sorted(groups.items()):  # and a live arm holds each instance once
        if len(g) >= 2:
            one.setdefault(g[0].seed, g)
    if len(one) < MIN_HELDOUT_INSTANCES:
        return None
    for i, g in enumerate(one.values()):
        g = [r.model_copy(update={"group": i}) for r in g]
        rng.shuffle(g)
        a += g[: len(g) // 2]
        b += g[len(g) // 2:]
    return a, b


def planted_invalid_arm(control: list[Rollout], candidate: list[Rollout], heldout: list[Rollout]
                        ) -> tuple[list[Rollout], list[Rollout], str]:
    """(control, planted candidate, label): the candidate's rollouts all made failures (the commonest held-out failure
    type) and scored as this run's reward can score a failure: paid more than any held-out rollout, or, when the
    reward is validity (`diagnostics.reward_is_validity`), paid what a failure is paid. A control without a valid
    rollout is made all valid, so the planted arm always loses validity."""
    kinds = [r.failure for r in heldout if not r.valid and r.failure]
    kind = max(sorted(set(kinds)), key=kinds.count) if kinds else "planted_failure"
    bad_rewards = {r.reward for r in heldout if not r.valid}
    good_rewards = {r.reward for r in heldout if r.valid}
    if D.reward_is_validity(heldout):
        paid = bad_rewards.pop() if bad_rewards else min(min(good_rewards, default=1.0), 0.0)
        label = "scored as this run scores a failure (reward is validity, so a failing arm cannot score high)"
    else:
        paid = max(r.reward for r in heldout) + 1.0
        label = f"paid {paid:.3f}, more than any held-out rollout"
    cand = [r.model_copy(update={"valid": False, "optimal": False, "reward": paid,
                                 "failure": r.failure if not r.valid and r.failure else kind}) for r in candidate]
    if not any(r.valid for r in control):
        good = good_rewards.pop() if len(good_rewards) == 1 else max(r.reward for r in heldout)
        control = [r.model_copy(update={"valid": True, "optimal": True, "failure": None, "reward": good})
                   for r in control]
    return control, cand, label


def planted_better_arm(control: list[Rollout], candidate: list[Rollout]) -> list[Rollout]:
    """The candidate side of an A/A pair made plainly better: each failing rollout replaced by a valid rollout of the
    same instance from the pair (what the policy writes when it solves that instance: its completion, length, reward
    and metrics), or, where the pair has none, made valid and paid what the pair's best valid rollout is paid. A veto
    exists to stop a change that games the judge, and nothing here games anything: a veto that blocks it would block
    real improvements for the rest of the run (a promoted veto stays in the harness)."""
    solved: dict[int, Rollout] = {}
    for r in control + candidate:
        if r.valid:
            solved.setdefault(r.seed, r)
    paid = max((r.reward for r in solved.values()), default=1.0)
    out = []
    for r in candidate:
        if r.valid:
            out.append(r)
        elif (s := solved.get(r.seed)) is not None:
            out.append(s.model_copy(update={"group": r.group}))
        else:
            out.append(r.model_copy(update={"valid": True, "failure": None, "where": None, "reward": paid}))
    return out


def _kind(error: str) -> str:
    """What went wrong with a diagnostic run on held-out rollouts, without its words ("timeout", "error", "bad output"):
    the reason reaches the engineer, and the code's own text (an exception message, a repr of what it returned) may
    quote a held-out instance. The whole error goes to the run's events (`judge_diagnostic`'s `details`)."""
    return error.split(":", 1)[0].strip()[:40] + " (its message stays in the run's records: it ran on held-out rollouts)"


def _arm_text(rs: list[Rollout]) -> str:
    m = D.overall_stats(rs)
    return f"valid {m.get('valid', 0.0):.2f}, reward {m.get('reward', 0.0):.2f}"


# --- the verdict --------------------------------------------------------------------------------------------------------


def veto_checks(path: str, source: str, heldout: list[Rollout], where: str, limits: Limits | None, seed: int,
                details: list[str]) -> tuple[str | None, str]:
    """The veto part of the diagnostic judge, on `heldout` (described by `where`): (why it fails, None when it passes;
    what it showed). It must block none of its A/A pairs (both orders), let a planted better arm through and block a
    planted invalid arm. What the code said is appended to `details`, never to the reason."""
    rng = random.Random(seed)
    pairs = [_split(heldout, rng) for _ in range(AA_SPLITS)]  # noisier than sampling: honest noise shows
    pairs += [p for _ in range(AA_SPLITS) if (p := _live_split(heldout, rng)) is not None]  # the gate's shape
    tried = 0
    for a, b in pairs:
        for c, k in ((a, b), (b, a)):
            tried += 1
            if why := D.veto_one(path, source, c, k, D.arm_metrics(c), D.arm_metrics(k), limits):
                details.append(why)  # the first block decides: a slow veto is not run on the rest
                return (f"its veto blocks one of its {2 * len(pairs)} A/A pairs (pair {tried}, from {where}, the same "
                        f"policies on both sides){' (it failed to run)' if 'veto failed' in why else ''}"), ""
    base = pairs[-1]  # the live-shaped pair when there is one: what the veto will meet at the gate
    ctrl, better = base[0], planted_better_arm(*base)
    if why := D.veto_one(path, source, ctrl, better, D.arm_metrics(ctrl), D.arm_metrics(better), limits):
        details.append(why)
        return (f"its veto blocks a planted better arm (control {_arm_text(ctrl)} -> candidate {_arm_text(better)}: "
                "its failures replaced by valid rollouts of the same instances)"
                f"{' (it failed to run)' if 'veto failed' in why else ''}"), ""
    ctrl, cand, label = planted_invalid_arm(*base, heldout)
    why = D.veto_one(path, source, ctrl, cand, D.arm_metrics(ctrl), D.arm_metrics(cand), limits)
    if not why or "veto failed" in why:
        details += [why] if why else []
        return (f"its veto {'fails to run on a planted invalid arm' if why else 'lets a planted invalid arm through'}: "
                f"control {_arm_text(ctrl)} -> candidate {_arm_text(cand)}, every candidate rollout a failure "
                f"{label}"), ""
    return None, (f"veto blocks the planted invalid arm ({_arm_text(ctrl)} -> {_arm_text(cand)}), lets a planted "
                  f"better arm through and blocks none of {2 * len(pairs)} A/A pairs")


def recheck_veto(path: str, source: str, heldout: list[Rollout], limits: Limits | None = None, seed: int = 0,
                 details: list[str] | None = None) -> str | None:
    """Why a veto's block of a live candidate does not stand, or None when it stands: `veto_checks` run again, at the
    block, on the held-out rollouts of now (every earlier stage's). A promoted veto passed them once, on the rollouts
    of its own stage; a veto whose code tells then from now (a wall-clock time bomb: blocks everything after a given
    minute, an outside attack of the seventieth session) or whose blocks drift with what it has seen blocks an A/A
    pair or the planted better arm now, and its block is void. Too few held-out instances to check: it stands."""
    units = _units(heldout)
    if len(units) < MIN_HELDOUT_INSTANCES:
        return None
    failed, _ = veto_checks(path, source, heldout, f"{len(heldout)} held-out rollouts ({len(units)} instances)",
                            limits, seed, details if details is not None else [])
    return failed


def judge_diagnostic(candidate: str, path: str, source: str, heldout: list[Rollout], alpha: float,
                     limits: Limits | None = None, seed: int = 0, details: list[str] | None = None) -> Verdict:
    """Promote or reject one diagnostic candidate on held-out rollouts (see the module docstring for the procedure).
    The reason names the numbers of the first check that failed, or of every check that passed; it reaches the
    engineer, so what the code itself said on held-out rollouts (an error's text, a veto's words) is appended to
    `details` for the run's records instead."""
    details = details if details is not None else []
    def rejected(why: str) -> Verdict:
        return Verdict(candidate=candidate, decision="rejected", stage_reached="backtest",
                       reason=cut(f"diagnostic judge: {why}"))

    units = _units(heldout)
    if len(units) < MIN_HELDOUT_INSTANCES:
        return Verdict(candidate=candidate, decision="inconclusive", stage_reached="backtest", reason=cut(
            f"diagnostic judge: {len(units)} held-out instances from earlier stages (needs {MIN_HELDOUT_INSTANCES}): "
            "nothing it claims can be checked yet; inconclusive, so it may be proposed again later"))
    where = f"{len(heldout)} held-out rollouts ({len(units)} instances)"
    res = D.run_evolved(path, source, heldout, limits)
    if res.error:
        details.append(res.error)
        return rejected(f"{path} does not run on {where}: {_kind(res.error)}")
    solved = [r for r in heldout if r.valid]
    if solved:
        on_solved = D.run_evolved(path, source, solved, limits)
        if on_solved.error:
            details.append(on_solved.error)
            return rejected(f"{path} fails on the {len(solved)} solved held-out rollouts: {_kind(on_solved.error)}")
        if flags := [(i, f) for i, f in enumerate(on_solved.findings) if f.severity != "info"]:
            return rejected(f"{_label(flags[0][1], flags[0][0], details)} fires on the {len(solved)} solved "
                            "held-out rollouts, where nothing fails")
    shown: list[str] = []
    choose, confirm = _halves(heldout, random.Random(seed))  # a slice it chose on `choose` is tested on `confirm`
    chose = D.run_evolved(path, source, choose, limits)
    if chose.error:
        details.append(chose.error)
        return rejected(f"{path} fails on half of the {where}: {_kind(chose.error)}")
    fired = [(i, f) for i, f in enumerate(chose.findings) if f.severity != "info" and (f.count > 0 or f.rate > 0)]
    other = f"the other {len(confirm)} held-out instances"
    for i, f in fired:
        ok, text = slice_claim(f, confirm, alpha, _label(f, i, details))
        if ok is False:
            return rejected(f"a finding fired on {len(_units(choose))} held-out instances does not hold on {other}: "
                            f"{text}; alpha {alpha:g}")
        if ok:  # a finding that names no slice apart from the rest predicts nothing: it is no claim shown
            shown.append(f"fired on {len(_units(choose))} held-out instances, on {other}: {text}")

    if D._defines(source, "veto"):  # the same parse the gate's `veto_one` uses to skip files without a veto
        failed, did = veto_checks(path, source, heldout, where, limits, seed, details)
        if failed:
            return rejected(failed)
        shown.insert(0, did)
    if not shown:
        return rejected(f"no warn/critical finding fires on {where} and it has no veto: it showed nothing it claims"
                        + (" (the reward is validity here, so reward and validity cannot diverge)"
                           if D.reward_is_validity(heldout) else ""))
    return Verdict(candidate=candidate, decision="promoted", stage_reached="backtest",
                   reason=cut(f"diagnostic judge on {where}, alpha {alpha:g}: " + "; ".join(shown)))


# --- the loop's call ----------------------------------------------------------------------------------------------------


def is_diagnostic(run: Run, cid: str) -> bool:
    return (run.store.candidate(cid)["patch"] or {}).get("kind") == "diagnostic"


def judge_diagnostics(run: Run, k: int, vetted: list[str]) -> tuple[list[Verdict], list[str]]:
    """(verdicts of the diagnostic candidates among `vetted`, judged here on stages < k's rollouts; the other ids,
    whose arms the backtest trains). Each verdict is also an event; the sandbox time is charged to the candidate."""
    from harness.memory import candidate_from_row

    diag = [c for c in vetted if is_diagnostic(run, c)]
    if not diag:
        return [], list(vetted)
    held = heldout_rollouts(run.run_dir / "rollouts", k)
    out = []
    for i, cid in enumerate(diag):
        t0 = time.perf_counter()
        change = candidate_from_row(run.store.candidate(cid)).change
        details: list[str] = []
        v = judge_diagnostic(cid, change.knob, change.code or "", held, run.config.gate.alpha, seed=k * 1000 + i,
                             details=details)
        run.charge(k, cid, "eval", seconds=time.perf_counter() - t0, label="diagnostic judge")
        run.store.set_candidate_status(cid, "backtested")
        run.event(k, "backtest", "verdict", f"{cid}: {v.decision}: {v.reason}"
                  + "".join(f" | what it said on held-out rollouts: {d[:300]}" for d in details), key=f"{k}/verdict/{cid}")
        out.append(v)
    return out, [c for c in vetted if c not in diag]


def veto_stands(run: Run, k: int, pair: int = 1) -> Callable[[str, str], str | None]:
    """The gate's re-check of a veto that blocks a live candidate at stage k (`harness.backtest.arm_vetoes`): why its
    block is void (`recheck_veto` on the held-out rollouts of stages < k), or None when it stands. Each veto file is
    re-checked once per decision (its path and source), the sandbox time charged to the compute ledger and the outcome
    an event. A veto of the round-0 harness, as a person wrote it, is theirs and always stands."""
    import hashlib

    held: list[Rollout] | None = None
    round0: dict[str, str] | None = None
    seen: dict[tuple[str, str], str | None] = {}
    spent = [0.0]  # seconds of the re-checks run (charged under `veto-recheck`; the gate's own row leaves them out)

    def stands(path: str, source: str) -> str | None:
        nonlocal held, round0
        if round0 is None:  # the round-0 harness: main's first commit (read only once a veto blocks)
            ws = run.workspace()
            round0 = ws.files(next(ws.repo.iter_commits("main", max_parents=0)).hexsha)
        if round0.get(path) == source:
            return None
        key = (path, hashlib.sha256(source.encode()).hexdigest())
        if key not in seen:
            held = held if held is not None else heldout_rollouts(run.run_dir / "rollouts", k)
            t0 = time.perf_counter()
            details: list[str] = []
            why = recheck_veto(path, source, held, seed=k * 1000 + 900 + pair, details=details)
            spent[0] += time.perf_counter() - t0
            run.charge(k, "veto-recheck", "eval", seconds=time.perf_counter() - t0, label=f"veto re-check {path}"
                       + (f" pair {pair}" if pair > 1 else ""))
            run.event(k, "backtest", "veto_recheck", f"{path} blocked a candidate{f' (arm pair {pair})' if pair > 1 else ''}"
                      f" and was re-checked on {len(held)} held-out rollouts: " + (
                          "its block stands" if why is None else f"its block is void, {why}")
                      + "".join(f" | what it said: {d[:300]}" for d in details),
                      key=f"{k}/vetorecheck/{pair}/{path}/{key[1][:12]}")
            seen[key] = why
        return seen[key]

    stands.spent = spent  # type: ignore[attr-defined]
    return stands


def split_verdicts(run: Run, verdicts: list[Verdict]) -> tuple[list[Verdict], list[Verdict]]:
    """(verdicts of diagnostic candidates, the others): a promoted diagnostic is merged beside the stage's winner."""
    diag = [v for v in verdicts if is_diagnostic(run, v.candidate)]
    return diag, [v for v in verdicts if v not in diag]
