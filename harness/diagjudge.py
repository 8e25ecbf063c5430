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
  as the live gate's (`_live_split`: both arms on the same backtest instances, each instance's samples dealt between
  them). A veto is code and can still tell a replay from a live pair by something no replay copies (half the
  samples per instance, say): the check bounds honest mistakes and the plain ways of gaming it, not every deception,
  and a veto can only ever block;
- a FINDING (warn or critical) that fires on the held-out rollouts must hold there. A finding on a slice claims that
  the slice fails more than the rest: with one rollout per instance (the first seen, so the units are independent
  draws) the slice's failure rate must exceed the rest's with one-sided Wilson score bounds (Wilson 1927; Brown, Cai
  and DasGupta 2001, "Interval estimation for a binomial proportion"), each at alpha / 2: lower(slice) > upper(rest).
  If the slice's true failure rate is not above the rest's, at least one of the two bounds must miss for the claim to
  pass, so a false claim passes with probability at most alpha (Bonferroni; Wilson's coverage is approximate at very
  small n, which only ever makes this check stricter or looser by a little, never unbounded). A finding without a
  slice, or on a slice that covers every held-out instance, names no rollouts it predicts fail; it is checked for
  silence on the solved rollouts only;
- it is promoted only when it exercised a claim (its veto passed both checks, or at least one finding fired on the
  held-out rollouts and held) and nothing failed. A diagnostic whose claim cannot be true for the run's reward (reward
  hacking under a reward that is validity) fires nowhere on real held-out rollouts and does not block the planted
  arm scored as this run scores it: it is rejected.

Every claim of a diagnostic must hold, so a diagnostic with several claims is never more likely to pass than its
weakest false one: the false promotion rate stays at most alpha per diagnostic. The A/A check is zero-tolerance over
a few splits (a veto that blocks a same-policy pair at rate p passes with probability (1 - p)^(2 x AA_SPLITS) or
less); it does not bound a tiny p. Without enough held-out rollouts (the first stage has none) the diagnostic is
rejected with that reason: nothing was shown. Tests: tests/test_diagjudge.py.
"""

from __future__ import annotations

import random
import re
import time
from pathlib import Path
from statistics import NormalDist
from typing import TYPE_CHECKING

from harness import diagnostics as D
from harness.records import Finding, Rollout, Verdict, cut, read_rollouts
from harness.seeds import check_split, split_of
from sandbox.runner import Limits

if TYPE_CHECKING:
    from harness.run import Run

MIN_HELDOUT_INSTANCES = 8  # fewer distinct held-out instances than this: nothing can be shown either way
MAX_HELDOUT_ROLLOUTS = 2048  # the most recent earlier stages first, up to this many rollouts (bounds the sandbox input)
AA_SPLITS = 3  # random instance splits of the held-out rollouts; each is tried in both orders
_FILE = re.compile(r"^s(\d+)-(probe|.+-backtest)\.jsonl\.gz$")


# --- held-out rollouts --------------------------------------------------------------------------------------------------


def heldout_rollouts(rollouts_dir: Path, stage: int, max_rollouts: int = MAX_HELDOUT_ROLLOUTS) -> list[Rollout]:
    """The cached rollouts of stages before `stage` (`s<j>-probe.jsonl.gz`, `s<j>-<arm>-backtest.jsonl.gz`), most
    recent stage first, at most `max_rollouts`. Each file's seeds are checked to be of its split (probe or backtest;
    never train or test), and its groups are renumbered so no two files share a group index."""
    files = []
    for p in Path(rollouts_dir).glob("s*-*.jsonl.gz"):
        m = _FILE.match(p.name)
        if m and int(m.group(1)) < stage:
            files.append((-int(m.group(1)), m.group(2) != "probe", p.name, p))
    out: list[Rollout] = []
    offset = 0
    for _, is_backtest, _, p in sorted(files):
        rs = read_rollouts(p)
        check_split([r.seed for r in rs], "backtest" if is_backtest else "probe")
        for r in rs:
            if len(out) >= max_rollouts:
                return out
            out.append(r.model_copy(update={"group": offset + r.group}))
        offset += 1 + max((r.group for r in rs), default=0)
    return out


def _units(rollouts: list[Rollout]) -> list[Rollout]:
    """One rollout per instance (the first seen): the independent units of the Wilson bounds."""
    seen: dict[int, Rollout] = {}
    for r in rollouts:
        seen.setdefault(r.seed, r)
    return list(seen.values())


# --- the statistics -----------------------------------------------------------------------------------------------------


def wilson_bound(k: int, n: int, alpha: float, upper: bool) -> float:
    """One-sided Wilson score bound of a binomial proportion k/n at level alpha (lower bound, or upper if `upper`)."""
    if n <= 0:
        return 1.0 if upper else 0.0
    z = NormalDist().inv_cdf(1.0 - alpha)
    p = k / n
    den = 1.0 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / den
    return min(1.0, mid + half) if upper else max(0.0, mid - half)


def _in_slice(r: Rollout, sl: dict[str, str]) -> bool:
    return all(r.slices.get(k) == v for k, v in sl.items())


def slice_claim(f: Finding, units: list[Rollout], alpha: float) -> tuple[bool | None, str]:
    """(True | False, why) for a finding on a slice: does the slice fail more than the rest on these units, by the
    one-sided Wilson bounds at alpha / 2 each? (None, why) when the finding names no slice to test (no slice, or
    one that covers every unit)."""
    inside = [r for r in units if _in_slice(r, f.slice)]
    rest = [r for r in units if not _in_slice(r, f.slice)]
    where = ",".join(f"{k}={v}" for k, v in f.slice.items()) or "all"
    if not f.slice or not rest:
        return None, f"{f.code} ({where}) names no slice apart from the rest"
    if not inside:  # its values are then the code's own text, not a slice of the held-out data: keys only
        return False, f"{f.code} claims a slice on {', '.join(sorted(f.slice))[:80]} that no held-out instance has"
    ki, kr = sum(not r.valid for r in inside), sum(not r.valid for r in rest)
    lo = wilson_bound(ki, len(inside), alpha / 2, upper=False)
    hi = wilson_bound(kr, len(rest), alpha / 2, upper=True)
    conf = f"{100 * (1 - alpha / 2):.1f}%"
    text = (f"{f.code} on {where}: held-out failure {ki}/{len(inside)} = {ki / len(inside):.2f} ({conf} Wilson lower "
            f"{lo:.3f}) vs the rest {kr}/{len(rest)} = {kr / len(rest):.2f} (upper {hi:.3f})")
    return lo > hi, text


# --- planted arms -------------------------------------------------------------------------------------------------------


def _split(rollouts: list[Rollout], rng: random.Random) -> tuple[list[Rollout], list[Rollout]]:
    """Two halves of the rollouts by instance (every rollout of a seed on the same side): an A/A pair whose two sides
    differ by which instances they hold, as two live arms differ by their training (noisier than sampling alone)."""
    seeds = sorted({r.seed for r in rollouts})
    rng.shuffle(seeds)
    first = set(seeds[: len(seeds) // 2])
    return [r for r in rollouts if r.seed in first], [r for r in rollouts if r.seed not in first]


def _live_split(rollouts: list[Rollout], rng: random.Random) -> tuple[list[Rollout], list[Rollout]] | None:
    """An A/A pair shaped as the live gate's pairs are: both sides on the SAME backtest instances, each group's samples
    (one arm's completions of one instance) dealt at random between them, so a veto sees backtest seeds only and one
    seed set in both arms, as at the gate. A veto that blocked only what looks live (no probe seed, one seed set)
    passed the instance halves, was promoted, and then blocked every live candidate. None while earlier stages have
    left fewer than MIN_HELDOUT_INSTANCES backtest instances with two or more samples."""
    groups: dict[int, list[Rollout]] = {}
    for r in rollouts:
        if split_of(r.seed) == "backtest":
            groups.setdefault(r.group, []).append(r)
    live = [g for _, g in sorted(groups.items()) if len(g) >= 2]
    if len({g[0].seed for g in live}) < MIN_HELDOUT_INSTANCES:
        return None
    a: list[Rollout] = []
    b: list[Rollout] = []
    for g in live:
        g = list(g)
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


def _kind(error: str) -> str:
    """What went wrong with a diagnostic run on held-out rollouts, without its words ("timeout", "error", "bad output"):
    the reason reaches the engineer, and the code's own text (an exception message, a repr of what it returned) may
    quote a held-out instance. The whole error goes to the run's events (`judge_diagnostic`'s `details`)."""
    return error.split(":", 1)[0].strip()[:40] + " (its message stays in the run's records: it ran on held-out rollouts)"


def _arm_text(rs: list[Rollout]) -> str:
    m = D.overall_stats(rs)
    return f"valid {m.get('valid', 0.0):.2f}, reward {m.get('reward', 0.0):.2f}"


# --- the verdict --------------------------------------------------------------------------------------------------------


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
        if flags := [f for f in on_solved.findings if f.severity != "info"]:
            return rejected(f"{flags[0].code} ({flags[0].severity}) fires on the {len(solved)} solved held-out "
                            "rollouts, where nothing fails")
    shown: list[str] = []
    fired = [f for f in res.findings if f.severity != "info" and (f.count > 0 or f.rate > 0)]
    for f in fired:
        ok, text = slice_claim(f, units, alpha)
        if ok is False:
            return rejected(f"its finding does not hold on {where}: {text}; alpha {alpha:g}")
        shown.append(text if ok else f"{text}; silent on solved rollouts")

    if D._defines(source, "veto"):  # the same parse the gate's `veto_one` uses to skip files without a veto
        rng = random.Random(seed)
        blocked = []
        pairs = [_split(heldout, rng) for _ in range(AA_SPLITS)]  # noisier than sampling: honest noise shows
        pairs += [p for _ in range(AA_SPLITS) if (p := _live_split(heldout, rng)) is not None]  # the gate's shape
        for a, b in pairs:
            for c, k in ((a, b), (b, a)):
                if why := D.veto_one(path, source, c, k, D.arm_metrics(c), D.arm_metrics(k), limits):
                    blocked.append(why)
        if blocked:
            details.append(blocked[0])
            return rejected(f"its veto blocks {len(blocked)} of {2 * len(pairs)} A/A pairs (from {where}, "
                            f"the same policies on both sides){' (it failed to run)' if 'veto failed' in blocked[0] else ''}")
        ctrl, cand, label = planted_invalid_arm(*pairs[0], heldout)
        why = D.veto_one(path, source, ctrl, cand, D.arm_metrics(ctrl), D.arm_metrics(cand), limits)
        if not why:
            return rejected(f"its veto lets a planted invalid arm through: control {_arm_text(ctrl)} -> candidate "
                            f"{_arm_text(cand)}, every candidate rollout a failure {label}")
        shown.insert(0, f"veto blocks the planted invalid arm ({_arm_text(ctrl)} -> {_arm_text(cand)}) and none of "
                        f"{2 * len(pairs)} A/A pairs")
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


def split_verdicts(run: Run, verdicts: list[Verdict]) -> tuple[list[Verdict], list[Verdict]]:
    """(verdicts of diagnostic candidates, the others): a promoted diagnostic is merged beside the stage's winner."""
    diag = [v for v in verdicts if is_diagnostic(run, v.candidate)]
    return diag, [v for v in verdicts if v not in diag]
