"""Where a whole-mixture or whole-target change aims, from the diagnosis' target view: the mix's goal weights per aim
(`_goal`, for `env.mixture`) and the target's generator config as the training env (`target_toward`, for
`env.target`). Shared by the rule engineer and the reply parser (`harness.engineer.proposal`), which import it and not
each other.
"""

from __future__ import annotations

from typing import Any

from harness.records import Change, Diagnosis
from harness.tasks.knobs import TARGET, canonical_mixture

AIMS = ("target", "frontier", "mastered")
FLOOR = 0.1  # a target slice the aim does not favour keeps this fraction of its target share (never dropped)


def _goal(view, cur: dict[str, float], aim: str) -> dict[str, float] | str:
    """The mixture an aim points to, from the target view (`harness.records.TargetView`) and the current mix. A target
    value the probe did not draw (`view.unmeasured`) keeps the floor under the target and frontier aims: nothing says
    it is learnt or out of reach, and a zero weight would drop it from the mix, where no later probe of the mix sees
    it again."""
    goal = _aim(view, cur, aim)
    if isinstance(goal, dict) and aim in ("target", "frontier"):
        for v, share in getattr(view, "unmeasured", {}).items():
            goal.setdefault(v, share * FLOOR)
    return goal


def _aim(view, cur: dict[str, float], aim: str) -> dict[str, float] | str:
    from harness.diagnostics import MASTERED, TOO_HARD

    sl = {s.value: s for s in view.slices if s.target_share > 0}
    if aim == "target":  # every target slice at its target share, the failing ones up by how much they fail, among
        # those the policy can learn from: a slice it (almost) never solves gives all-fail groups, no GRPO signal
        # (SFL's learnability p(1 - p) is ~0 there), so it keeps the floor until it comes within reach; when no slice
        # is within reach, every failure is scaled up (nothing else to aim at)
        reach = {v for v, s in sl.items() if s.valid > TOO_HARD} or set(sl)
        return {v: s.target_share * ((1.0 - s.valid + FLOOR) if v in reach else FLOOR) for v, s in sl.items()}
    if aim == "frontier":  # the target slices the policy can learn from (partly solved) first
        front = {v for v, s in sl.items() if TOO_HARD < s.valid < MASTERED}
        reach = front or {v for v, s in sl.items() if s.valid > TOO_HARD}
        if not reach:  # nothing solved anywhere: the easiest target slice
            from harness.tasks.knobs import order_key

            reach = {min(sl, key=order_key)} if sl else set()
        return {v: s.target_share * (1.0 if v in reach else FLOOR) for v, s in sl.items()}
    if aim == "mastered":  # the mastered slices' shares halved (never to zero), the rest keeps its proportions
        done = {v for v, s in sl.items() if s.valid >= MASTERED}
        if not done & set(cur) or not set(cur) - done:
            return "no mastered slice to move away from (or nothing else in the mix)"
        return {v: w * (0.5 if v in done else 1.0) for v, w in cur.items()}
    return f"unknown mixture aim {aim!r}; one of {', '.join(AIMS)}"


TARGET_AIMS = ("target", "frontier")


def target_change(diagnosis: Diagnosis | None, aim: Any = "target") -> tuple[Change, Any] | str:
    """`env.target`'s change and the env it replaces (the training env made the target's generator config as a
    whole, `target_toward`), or why there is none: what the rule engineer's skill and an engineer's reply both make."""
    view = diagnosis.target if diagnosis is not None else None
    if view is not None and view.config is not None and not view.differs:
        return "the training env is the target already"
    made = target_toward(diagnosis, aim)
    if isinstance(made, str):
        return made
    return Change(kind="env", knob=TARGET, value=made), diagnosis.env_config


def target_toward(diagnosis: Diagnosis | None, aim: Any = "target") -> dict[str, Any] | str:
    """The target's generator config as the training env (`env.target`), or why it cannot be: `target` as the judge
    weighs it; `frontier` its entries weighted to the policy's competence frontier on it (`_goal`'s frontier aim over
    the target view: the slices it partly solves at their target shares, the rest at FLOOR of theirs), so a target
    slice out of reach does not fill the training groups with all-fail boards (SFL's learnability is ~0 there). When
    every target slice is at the frontier the two are the same config."""
    view = diagnosis.target if diagnosis is not None else None
    if view is None or view.config is None:
        return f"{TARGET} needs a diagnosis with the target's config"
    aim = "target" if aim is None else str(aim)
    if aim not in TARGET_AIMS:
        return f"unknown {TARGET} aim {aim!r}; one of {', '.join(TARGET_AIMS)}"
    config = view.config
    if aim == "frontier":
        from harness.tasks import Mixture, get_task

        task = get_task(diagnosis.task)
        if isinstance(task, Mixture):
            model = task.spec.config_model.model_validate(view.config)
            goal = _goal(view, canonical_mixture(task.mixture(model)), "frontier")
            if isinstance(goal, dict) and sum(goal.values()) > 0:
                config = task.with_mixture(model, canonical_mixture(goal)).model_dump(mode="json")
    if config == diagnosis.env_config:
        return "the training env is that config already"
    return config
