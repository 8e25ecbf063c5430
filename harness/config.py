"""RunConfig: one typed object for a whole autonomous run, loaded from YAML with unknown keys rejected.

    from harness.config import load_config
    cfg = load_config("examples/mapf_quick.yaml")

A typo is an error that names the field and the file; every field has help text (this file; the errors point here).
The gate lives here, not in the harness repo: nothing a run evolves can relax it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer, model_validator

from harness.tasks import DEFAULT_TASK


class ConfigError(ValueError):
    """A run config that cannot be used; the message names the field and the fix."""


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|hr|d)?\s*$")
_UNIT_S = {None: 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}


def parse_duration(value: str | float | None) -> float | None:
    """'90s', '15m', '8h', '1.5h' or a number of seconds -> seconds."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"cannot read duration {value!r}; write e.g. '90s', '15m' or '8h'")  # noqa: TRY004 - pydantic turns ValueError into a field error
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _DURATION.match(str(value))
        if not m:
            raise ValueError(f"cannot read duration {value!r}; write e.g. '90s', '15m' or '8h'")
        seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"duration {value!r} must be a finite time above 0, e.g. '90s', '15m' or '8h'")
    return seconds


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_numbers(cls, data):
        from policies.train import no_bool_numbers

        return no_bool_numbers(cls, data)


class PolicyConfig(_Strict):
    preset: Literal["tiny", "small", "base"] | None = Field(
        "tiny", description="build a model offline from a preset: tiny (~1M), small (~6M), base (~86M, for a GPU)")
    checkpoint: str | None = Field(None, description="start from a local Hugging Face checkpoint dir instead of a preset")
    style: str | None = Field(None, description="prompt style, one of the task's styles (chat for chat LLMs); "
                                                "default: the task's first style for presets; for a checkpoint, the "
                                                "style it was trained on, else chat")
    backend: Literal["transformers", "vllm", "auto"] = Field("transformers", description="rollout engine")

    @model_validator(mode="after")
    def _one_source(self) -> PolicyConfig:
        if self.checkpoint and self.preset:
            self.preset = None  # an explicit checkpoint wins over the default preset
        if not self.checkpoint and not self.preset:
            raise ValueError("policy: set preset (tiny|small|base) or checkpoint (a local Hugging Face model dir)")
        return self


class WarmStartConfig(_Strict):
    sft_examples: int = Field(2000, ge=0, le=10_000_000, description="expert demonstrations (train split) for the SFT warm start; 0 = skip")
    sft_steps: int | None = Field(None, ge=0, description="override recipe.sft_steps for the warm start")
    env: dict[str, Any] | None = Field(None, description="the distribution the SFT warm start's demonstrations come "
                                       "from (the task's config model); default: the round-0 env. The warm-start "
                                       "cache keys on it, so runs that warm-start on the same env share the cache")
    teacher_noise: float = Field(0.0, ge=0.0, lt=1.0, description="the share of the demonstrations drawn from the "
                                 "task's imperfect teacher instead of its expert (a plausible teacher that is "
                                 "sometimes wrong), seeded by the run's seed: a partial warm start that samples the "
                                 "right behaviour without preferring it, so GRPO has something to sharpen (0.6 tried "
                                 "as the demo's: BENCHMARKS.md, thirty-seventh session). Families without an "
                                 "imperfect teacher refuse a share above 0")


class BudgetConfig(_Strict):
    stages: int = Field(3, ge=1, le=10_000, description="stop after this many stages")
    wall_clock: str | float | None = Field(None, description="stop starting new stages after this long ('15m', '8h')")
    compute_s: float | None = Field(None, gt=0, description="stop when the compute ledger exceeds this many seconds")
    plateau: int = Field(0, ge=0, description="stop after this many stages in a row without a promotion (0 = never)")

    @field_validator("wall_clock")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        parse_duration(v)
        return v

    @property
    def wall_clock_s(self) -> float | None:
        return parse_duration(self.wall_clock)


class StageConfig(_Strict):
    train_instances: int = Field(256, ge=8, le=10_000_000, description="fresh train-split instances drawn for each stage's GRPO")
    probe_n: int = Field(48, ge=4, le=1_000_000, description="probe-split instances rolled out for the diagnosis")
    probe_samples: int = Field(4, ge=1, description="samples per probe instance (groups for GRPO-health diagnostics)")
    candidates: int = Field(1, ge=1, le=8, description="candidates the engineer may propose per stage")
    rejections_before_fallback: int = Field(3, ge=1, description="consecutive rejections before rolling back to the "
                                            "last promoted harness and shrinking the engineer's change steps")
    step_shrink: float = Field(0.5, gt=0, lt=1, description="multiplier on the engineer's change steps at each fallback")
    prefetch: bool = Field(True, description="generate the stage's probe, backtest and next train instances in a "
                                             "background process while the policy trains")
    exploit_after_promotion: int = Field(
        3, ge=0, description="at most this many stages in a row after a promotion EXPLOIT it: such a stage trains the "
        "policy under harness@main for the compute its arms would have used (`recipe.steps` + (`candidates` + 1) x "
        "`backtest.arm_steps` GRPO steps), proposes nothing and judges no arm; its checkpoint is read on fresh backtest "
        "instances (`backtest.carry_confirm`, `backtest.exploit_margin`; against the anchor under `keep_training`), "
        "and the first one whose checkpoint does not continue hands the next stage back to exploring "
        "(`harness.decisions.exploiting`); its diagnosis is kept for the stage after it. 0: every stage explores "
        "(the rule before). Why: after a fix was "
        "promoted, a stage of arms (each discarded unless it wins) trained the carried policy at most 60 of its ~160 "
        "step-equivalents, and on a warm start GRPO can raise, the loop lost the too-hard mix to a learnability "
        "sampler that trained all of its budget (BENCHMARKS.md, fortieth session)")
    exploit_after_gain: int = Field(
        1, ge=0, description="at most this many stages in a row EXPLOIT harness@main (as after a promotion: "
        "`exploit_after_promotion`) after an exploring stage that promoted nothing but whose own lineage confirmed a "
        "gain on fresh target instances (`harness.decisions.exploiting`): the incumbent harness trains the policy, so "
        "the next stage trains for its arms' compute too instead of judging changes; one whose checkpoint does not "
        "continue hands the next stage back to exploring, and a diagnosis that named a critical root cause (the mix "
        "misses the target, the reward pays invalid answers, ...) keeps it exploring: the harness is known to be "
        "wrong, so a gain under it does not mean the fix is not needed (`harness.decisions.exploit_held`). 0: such a "
        "stage explores (the rule before). Why: on a "
        "harness that needs no fix an exploring stage trains the carried policy at most 60 of its ~170 "
        "step-equivalents; measured at three stages on a held-out healthy code harness it gave the evolved arm +0.3 "
        "points (within noise; BENCHMARKS.md, sixty-sixth session), and it changes nothing where the broken harness "
        "confirms no gain")
    explore_backoff: int = Field(
        0, ge=0, description="after this many EXPLORING stages in a row found nothing (each promoted nothing, carried "
        "no candidate's arm and confirmed no gain, while its own lineage under harness@main trained on: kept, not sent "
        "back) the loop exploits harness@main for one stage before exploring again, and after each further such "
        "stage for twice as many plus one (1, 3, 7, ...); a diagnosis since the last exploring stage that names a "
        "critical finding none of them did, or a person's revision, ends the streak "
        "(`harness.decisions.backing_off`). Such a stage counts toward `budget.plateau` and "
        "`gate.human.after_failures` (it is there because nothing was promoted). Exploit stages are those of "
        "`exploit_after_promotion`: their checkpoints must continue or the next stage explores. 0: every "
        "such stage explores (the rule before). Why: a stage that explores trains what the run delivers with about "
        "40% of its compute on a harness whose changes all read within noise (BENCHMARKS.md, sixty-eighth session); "
        "exploring less often each time it finds nothing is the decaying exploration of a bandit (Auer, "
        "Cesa-Bianchi & Fischer, \"Finite-time analysis of the multiarmed bandit problem\", 2002: epsilon-greedy "
        "with epsilon_t ~ 1/t)")
    keep_training: bool = Field(
        True, description="keep training, keep the best: the run holds two checkpoints, the LINEAGE the next stage "
        "trains from and the ANCHOR, its best confirmed one (what each stage's report scores and what the run "
        "delivers). The stage's decided arm (the winner's, else the best arm above the start, else the control arm; "
        "none when the stage collapsed the policy beyond noise) is compared with the anchor on fresh instances "
        "(`backtest.carry_confirm`): above it by `backtest.carry_margin` standard errors, it becomes the anchor; "
        "not below it by as much, its lineage trains on and the anchor stays; below, the lineage goes back to the "
        "anchor (`harness.decisions.confirm_carry`); when the run stops, the lineage is delivered unless it reads below "
        "the anchor on fresh instances (`harness.decisions.final_pick`). false: one checkpoint, which moves only when "
        "a trained one "
        "confirms above the stage's start (the rule before). Why: a stage's real gain of 1-2 points reads below "
        "one standard error of a few hundred instances most of the time, so under the old rule the loop's policy "
        "stopped moving after its first carried checkpoint while arms that carry every stage went on climbing "
        "(BENCHMARKS.md, forty-third and forty-fourth sessions)")


class BacktestConfig(_Strict):
    arm_steps: int = Field(8, ge=1, description="GRPO steps per arm (candidate and control get the same budget)")
    n: int = Field(96, ge=8, le=1_000_000, description="fresh backtest-split instances per decision (both arms, paired)")
    samples: int = Field(4, ge=0, description="completions sampled per backtest instance at `temperature`: the "
                                              "per-instance outcome is a success rate (greedy is also reported). 0: a "
                                              "greedy judge: each instance's one greedy decode decides (as the "
                                              "held-out test suite scores), for a fifth of the decoding of 4 samples "
                                              "and a greedy one, so `n` can be five times as large at the same cost; "
                                              "probes still sample at `temperature` (BENCHMARKS.md, seventieth "
                                              "session)")
    temperature: float | None = Field(None, gt=0, description="sampling temperature of the backtest judge; default: "
                                      "the round-0 recipe's temperature. Fixed at run start (later recipe changes "
                                      "do not move it)")
    max_new_tokens: int | None = Field(None, ge=1, description="completion budget of the backtest judge and of the "
                                       "held-out test evaluation; default: the round-0 recipe's max_completion_length, or 1.5x the longest "
                                       "expert answer where that budget cuts off a tenth or more of them (said in a "
                                       "warning). "
                                       "Fixed at run start: a promoted recipe.max_completion_length changes what the "
                                       "policy trains on, never how the target and the test set are scored")
    env: dict[str, Any] | None = Field(None, description="instance distribution the backtests evaluate on (the "
                                       "target); default: the round-0 env. Fixed at run start, outside the sandbox: "
                                       "promotions that change env.yaml do not change it")
    second_pair: Literal["never", "backed"] = Field(
        "never", description="backed: a candidate whose skill was promoted in another run and whose first arm pair "
        "ends inconclusive with a positive estimate gets a second arm pair in the same stage (two more arms, "
        "charged), pooled with the first, so a change that worked elsewhere can be decided in one stage; never (the "
        "default): every further pair waits for a re-test in a later stage. Off by default: on the gameable-reward "
        "scenario's second pass (3 seeds) it cost 32% more compute and promoted the fix in none, where the first pass "
        "without it promoted it at stage 3 (BENCHMARKS.md, twenty-first session)")
    settle_pair: bool = Field(
        True, description="a candidate whose first arm pair of the stage already clears the promotion bar on the main "
        "metric (its lower bound above `gate.promote_above`) but ends `not yet clear` (a slice's lower bound past "
        "`gate.slice_tolerance`, or too few instances differing) while its plan has a pair left gets that pair now, "
        "in the same stage (two more arms, charged), pooled with the first under the same sequential plan "
        "(`harness.decisions.second_pairs`). The error bound is the plan's, as for a re-test a stage later; what "
        "changes is that a clear effect is settled before the stage ends instead of costing the run a stage without "
        "its fix. false: such a pair waits for a re-test in a later stage (the rule before). Why: the demo's planted "
        "fix read +0.163 [+0.063, +0.250] at its first pair and was held back by one slice's lower bound, -0.109 "
        "against a tolerance of 0.10, so its lineage was carried a stage late (BENCHMARKS.md, forty-ninth session)")
    signal_pair: bool = Field(
        True, description="a change the gate's learning-signal route reads (an env change, the sampling temperature, "
        "a longer completion budget: `harness.decisions.takes_signal_route`) whose first arm pair of the stage ends "
        "inconclusive with its target estimate not below the control's and its learning signal PROMISING (the arm's "
        "live-group share at least `gate.learning_signal` above the control's, or above `gate.learning_signal_ratio` "
        "times it, as point estimates, with the earlier pairs it pools) but not shown with confidence, while its plan "
        "has a pair left, gets that pair now, in the same stage (two more arms, charged); both readings pool it with "
        "the first (`harness.decisions.signal_pairs`). Each pair is still one look of the route at alpha / "
        "`gate.max_pairs`, so the error bound is unchanged; and a change whose latest test still ends so (promising, "
        "inconclusive, a pair left) is re-tested first in the next stage from the same harness "
        "(`harness.decisions.signal_retest`). false: neither; such a pair waits for the engineer to propose it again. "
        "Why: code's cold temperature read 7.5% live against 0.83% at its first pair (lower bound -0.005) and waited "
        "two stages for its re-test, too late to recover its gap (BENCHMARKS.md, sixty-second session)")
    carry_on: Literal["plan", "looks"] = Field(
        "plan", description="the instances which checkpoint continues is decided on (`harness.results.continues_from`:"
        " the decided arm against the stage's start on the target): plan (the default) = all `n` of them, the arms "
        "judged on the rest after the gate stopped at an earlier look (judging only, charged; the verdicts stand); "
        "looks = only those the verdicts used, so a winner stopped at the first look was carried on n/4 instances "
        "(the behaviour before; BENCHMARKS.md, thirty-fifth session)")
    carry_greedy: bool = Field(
        True, description="a checkpoint continues only when its GREEDY estimate on the same instances is not below "
        "the stage's start's either (the judge decodes each instance greedily once besides its samples; the test "
        "suite is greedy). false: the sampled estimate alone, as before. Added after the demo's carried arms held the "
        "sampled estimate while greedy test valid fell 2-6 points; on those ten seeds it changed no carry (their "
        "greedy estimate on the 160 judge instances held too: BENCHMARKS.md, thirty-sixth session). No effect when "
        "the judge does not decode greedily")
    carry_confirm: int = Field(
        288, ge=0, description="fresh backtest instances (never seen by the verdicts or by the choice of the arm) on "
        "which a checkpoint chosen to continue must confirm it: the chosen arm and the stage's start are decoded "
        "greedily on them, in batches of `n`, stopping early when the sign is clear (|z| >= 2.5), and the arm "
        "continues only when its greedy estimate there is above the start's by `carry_margin` standard errors "
        "(`harness.decisions.confirm_carry`; judging only, charged). Why: the arm is chosen on the instances that "
        "estimate it, so a chosen arm reads high (selection bias), and at n=96 a greedy difference has a standard "
        "error near 5 points; on the too-hard-mix scenario of the reference family every carried checkpoint that "
        "lowered held-out valid 6-9 points had read level or above on its 96 (one +10.4), and -3 to -9 on 384 fresh "
        "ones. 0: off (the rule before; only with stage.keep_training: false, whose anchor the readings decide)")
    carry_confirm_max: int | None = Field(
        None, ge=0, description="the most fresh instances a carry confirmation may judge: when its planned "
        "`carry_confirm` read the chosen checkpoint above the start but not clearly (0 < z < 2.5), it judges further "
        "batches of `n` until the sign is clear or this many are judged, and then applies `carry_margin` to all of "
        "them (`harness.decisions.confirm_carry`; judging only, charged). Default: three times `carry_confirm`; equal "
        "to it: never extend (the rule before). Why: at 288 instances a greedy difference has a standard error near "
        "2.2 points, so one stage's real gain of 1.5-3 points reads below one standard error 35-60% of the time and "
        "is thrown away with the stage's compute; simulated at the spread of the too-hard mix's confirmations, "
        "judging on to 864 carries a real +3 points 85% of the time instead of 65%, a true 0 13% instead of 17%, "
        "a true -1.5 1% instead of 5% (`tests/test_decisions.py`, BENCHMARKS.md forty-third session); each further "
        "batch of 96 costs about 3 GRPO step-equivalents. Under `stage.keep_training` a reading against the anchor "
        "judges on only while it would make the checkpoint the new anchor (carry_margin <= z < 2.5; "
        "`harness.decisions.anchor_extends`): below that the lineage trains on whatever more instances say")
    carry_margin: float = Field(
        1.0, ge=0, description="how far above the start, in standard errors of the confirmation's paired difference, "
        "the chosen checkpoint must read there to continue (the one-standard-error rule: keep the status quo unless "
        "the change is better by more than its own noise). 0: not below the start. Why not 0: on the too-hard-mix "
        "scenario of the reference family three confirmations of 288 instances read +0.000, +0.000 and +0.014 "
        "(se 0.025-0.029) for checkpoints 2-5 points below the start on 1,920 instances (BENCHMARKS.md, "
        "thirty-ninth session)")
    exploit_margin: float | None = Field(
        None, ge=0, description="`carry_margin` for the checkpoint of an exploit stage (`stage.exploit_after_promotion`"
        "): it continues when its greedy estimate on the fresh instances is above the start's by this many standard "
        "errors. Default: `carry_margin` (the one-standard-error rule every carry obeys). Without "
        "`stage.keep_training` only: under it the checkpoint is read against the run's anchor, where `carry_margin` "
        "decides both whether it becomes the anchor and whether the lineage goes back (a margin of its own there "
        "would let a checkpoint 0.1 se above replace the anchor, or keep one 1.5 se below). 0 (not below the start) "
        "lets more "
        "of a slow gain through: on the too-hard mix over a noisy-teacher warm start one exploit stage read +1.4 "
        "(se 1.8) and continued only with 0, and that seed ended 2.1 points higher; but the promoted harness only "
        "beat its control arm, which may itself be falling, and on the demo (whose promoted rate harms the warm start "
        "less rather than not at all) an exploit stage read +2.4 (se 2.6) on its 288 fresh instances, continued with "
        "0, and the test suite read it 4.0 points below the start (BENCHMARKS.md, forty-first session)")

    @model_validator(mode="after")
    def _confirm_max_not_below_planned(self) -> BacktestConfig:
        if self.carry_confirm_max is not None and self.carry_confirm_max < self.carry_confirm:
            raise ValueError(f"carry_confirm_max ({self.carry_confirm_max}) is below carry_confirm "
                             f"({self.carry_confirm}): a confirmation judges at least its planned instances; set it "
                             f"to {self.carry_confirm} to never extend, or drop it for three times carry_confirm")
        return self

    @property
    def confirm_most(self) -> int:
        """The most instances a carry confirmation may judge (`carry_confirm_max`, default 3 x `carry_confirm`)."""
        return 3 * self.carry_confirm if self.carry_confirm_max is None else self.carry_confirm_max


class SandboxConfig(_Strict):
    allow_unisolated_diagnostics: bool = Field(
        False, description="run evolved diagnostics as a plain subprocess when bubblewrap is missing. They then see "
        "the host's files and network as the run's user: leave false unless you trust every engineer reply. With "
        "false and no bubblewrap, candidates that add or change a diagnostic are rejected, and the run says so at start")


class ArmResources(_Strict):
    num_cpus: float = Field(1, gt=0, description="CPUs one arm reserves on the Ray cluster (its torch threads too)")
    num_gpus: float = Field(0, ge=0, description="GPUs one arm reserves (0: CPU training; 1 for vLLM / CUDA arms)")


class ScaleConfig(_Strict):
    backend: Literal["local", "ray"] = Field("local", description="where backtest arms run: local (one after another "
                                             "in the run process) or ray (as Ray tasks, side by side)")
    address: str | None = Field(None, description="Ray cluster to join: 'auto' (the one `ray start` runs here), "
                                "'host:port', 'ray://host:10001'; none: start a local cluster inside the run process")
    num_cpus: int | None = Field(None, ge=1, description="CPUs of the local cluster the run starts (default: all)")
    arm_resources: ArmResources = Field(default_factory=ArmResources)
    max_retries: int = Field(2, ge=0, le=10, description="times an arm is started again when its worker dies "
                             "(killed, out of memory); an arm that raises is not retried: its decision fails")
    threads: Literal["auto", "default"] | int = Field(
        "auto", description="torch CPU threads of the run process (its training, probes and judging; Ray arms use "
        "arm_resources.num_cpus): a number; 'default' leaves torch's; 'auto' times the run's GRPO step (its decoding "
        "and loss at the round-0 recipe's batch and the task's token lengths) at 1, 2, 4, ... threads once per host, "
        "model and step shape and keeps the fastest (cached in $EVOTRAINER_HOME/threads.json). The "
        "environment variable EVOTRAINER_THREADS overrides it")

    @field_validator("threads")
    @classmethod
    def _threads_positive(cls, v):
        if isinstance(v, int) and v < 1:
            raise ValueError("scale.threads must be auto, default or a number of threads >= 1")
        return v


class EvalConfig(_Strict):
    suite: str = Field("small", description="benchmark suite on the test split, reported per stage (never decides)")
    limit: int | None = Field(None, ge=1, description="evaluate only the first N suite instances (faster reports)")
    env: dict[str, Any] | None = Field(None, description="a generator config as the held-out test set instead of a "
                                       "named suite: `n` instances drawn from it on the test split (a scenario's "
                                       "target); each instance's block is its slices")
    n: int = Field(200, ge=1, le=1_000_000, description="test instances drawn from `env` (with env only)")

    @model_validator(mode="after")
    def _one_test_set(self) -> EvalConfig:
        if self.env is not None and self.suite and "suite" in self.model_fields_set:
            raise ValueError("eval: give suite (a named suite) or env (a generator config as the test set), not both")
        return self

    @model_serializer(mode="wrap")
    def _without_unused_suite(self, handler):
        """With `env` the suite is unused: it is not written (a run's config.yaml is read back on resume, where a
        suite beside env would be refused as both given)."""
        out = handler(self)
        if self.env is not None and isinstance(out, dict):
            out.pop("suite", None)
        return out

    @property
    def enabled(self) -> bool:
        """Whether stages are reported on a held-out test set at all (`suite: ''` and no env: no report)."""
        return self.env is not None or bool(self.suite)

    @property
    def name(self) -> str:
        """The test set's name in reports: the suite's, or `env:<hash>` of the generator config."""
        if self.env is None:
            return self.suite
        import hashlib
        import json

        return "env:" + hashlib.sha256(json.dumps(self.env, sort_keys=True).encode()).hexdigest()[:10]


class RetentionConfig(_Strict):
    keep_promoted: int | Literal["all"] = Field(
        "all", description="promoted checkpoints kept on disk: all, or the newest N (N >= 1). The warm start and the "
        "incumbent (the checkpoint the next stage starts from) are always kept")
    delete_superseded: bool = Field(
        True, description="once a stage's decision is recorded, delete its other checkpoints (losing candidate arms, "
        "the control arm, the stage's training checkpoint) and earlier incumbents that were never promoted; false "
        "keeps every checkpoint. Checkpoints of a stage still in progress are never deleted (a resume reads them)")

    @field_validator("keep_promoted")
    @classmethod
    def _keeps_the_incumbent(cls, v: Any) -> Any:
        from pydantic_core import PydanticCustomError

        if v != "all" and v < 1:
            raise PydanticCustomError(
                "retention", f"{v} would delete the newest promoted checkpoint, which is the incumbent a resume "
                "continues from; set 1 or more, or 'all'")
        return v


class HumanAfterFailures(BaseModel):
    """Turn the human gate on once this many stages in a row ended without a promotion."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)
    after_failures: int = Field(..., ge=1, description="consecutive stages without a promotion before a human decides")


class GateConfig(BaseModel):
    """The promotion rule. Fixed by the run's config; never part of the evolvable harness."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)
    min_effect: float = Field(0.02, ge=0.0, le=1.0,
                              description="the smallest main-metric effect worth having: a change confidently below "
                                          "it is refuted (never re-proposed from that state), and the evidence is "
                                          "sized to detect it (a warning at start when it cannot)")
    promote_above: float = Field(0.0, ge=0.0, le=1.0,
                                 description="a change is promoted when its effect is confidently above this: 0 (the "
                                             "default) = better than the control (with a sign test when few instances "
                                             "differ); min_effect = better by min_effect (the stricter gate of earlier "
                                             "versions, which left real +0.05 fixes inconclusive). At most min_effect")
    slice_tolerance: float = Field(0.05, ge=0.0, le=1.0,
                                   description="no slice's lower bound may fall below minus this (preserve what works)")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="one-sided confidence of the lower bounds")
    n_boot: int = Field(2000, ge=100, le=200_000, description="bootstrap resamples per comparison")
    min_slice_n: int = Field(20, ge=1, description="slices with fewer paired instances are reported but not checked")
    metric: str = Field("valid", description="the main metric the outcomes measure (for the record)")
    arm_noise_sd: float = Field(0.0, ge=0.0, le=1.0,
                                description="standard deviation of the effect between two arms that differ only in "
                                            "training randomness (measured by `evotrainer bench calibration --mode "
                                            "aa`); each arm pair's variance in the sequential test is arm_sd**2 + "
                                            "s**2 / n (`harness.sequential`: pooled over pairs by inverse variance), "
                                            "since the instances' own spread cannot see it; the bootstrap intervals of "
                                            "reports and of the regression check do not add it")

    max_pairs: int = Field(3, ge=1, le=20, description="arm pairs one change may be judged on: its first test and the "
                           "pooled re-tests of an inconclusive result (each later stage that proposes it again)")
    first_look: int | None = Field(None, ge=2, description="instances of a pair before its first look (default: "
                                   "a quarter of backtest.n, at least 20)")
    look_every: int | None = Field(None, ge=1, description="instances added between looks (default: first_look)")
    promote_gamma: float = Field(-2.0, ge=-10.0, le=5.0, description="Hwang-Shih-DeCani gamma of the promotion "
                                 "side's error spending (-4 ~ O'Brien-Fleming: most power at the end; 1 ~ Pocock: "
                                 "most early decisions)")
    futility: float = Field(0.0, ge=0.0, lt=1.0, description="before a re-test's new arm pair, stop a change whose "
                            "conditional power of promotion by the plan's end (under its current estimate) is below "
                            "this: inconclusive, evidence spent. Cheaper decisions for power (BENCHMARKS.md: 0.05 halves "
                            "a null change's arm pairs, 2.74 -> 1.33 over 81 live A/A decisions, and lost 1 of 10 "
                            "promotions on each planted defect, lr and env); 0 = never. A change the learning-signal "
                            "route reads whose signal is shown is not stopped while the chance its pooled target "
                            "estimate ends not below the control's is at least this (`harness.decisions.signal_lift`): "
                            "that route needs only the sign; nor is one whose signal is promising (what "
                            "`backtest.signal_pair` gives a second pair for) while its estimate is not below the "
                            "control's")

    learning_signal: float | None = Field(
        0.10, ge=0.0, le=1.0, description="an ENV change (the training distribution), a sampling-temperature change "
        "or a longer completion budget (`harness.decisions.takes_signal_route`) left inconclusive on the target is also "
        "promoted when its arm trained on more informative GRPO groups: its per-step share of live groups (some "
        "answers valid and some not; reward not the same for the whole group in curves recorded before validity was) "
        "above the control arm's by at least this, with confidence (Welch's one-sided test over steps), its target estimate not below the control's and no slice or veto against it. "
        "SFL's learnability: a mix the policy cannot learn from shows as dead groups long before a short arm moves "
        "the target. A longer budget is promoted too when the share of its arm's training completions that end within "
        "the budget is above the control's by at least this, with confidence (`harness.decisions.signal_shown`). "
        "None: off (the target A/B alone decides)")
    learning_signal_ratio: float | None = Field(
        2.0, ge=1.0, le=100.0, description="the same route's second reading, for policies that rarely train on a live "
        "group: also promoted when the arm's live-group share is at least this MULTIPLE of the control arm's, with "
        "confidence (`harness.backtest.learning_signal_ratio_bound`: Welch on the contrast candidate - ratio x "
        "control, each arm's noise scaled to its share), under the same guards. Why: GRPO learns only from live groups, "
        "so their share is the step's learning signal; at 1% live (the code family's cold temperature: 0.4-0.8% at "
        "0.1, 4.6-8.3% at 0.7) a tenfold rise never reaches the absolute margin of 0.10 that a mix at 5% -> 33% clears "
        "(BENCHMARKS.md, sixty-second session). None: off (the absolute margin alone)")
    learning_signal_arm_sd: float = Field(
        0.02, ge=0.0, le=0.5, description="arm-training noise of an arm's mean live-group share (two arms of the "
        "same harness differ by more than their steps' scatter says: live A/A pairs, BENCHMARKS.md), added in "
        "quadrature for each arm to the learning-signal route's Welch interval, as `arm_noise_sd` is to the target's. "
        "0.02: the one-sided 95% bootstrap upper bound over the first 102 live A/A pairs (point estimate 0.015; "
        "all 222: 0.013, bound 0.018), on the cautious side because this route promotes without target evidence")
    human: Literal["never", "always"] | HumanAfterFailures = Field(
        "never", description="a person at the gate after each backtest: never (autonomous), always, or "
        "{after_failures: N} (once N stages in a row ended without a promotion). The run pauses (the pause survives "
        "a restart) until `evotrainer approve|revise|abort RUN`")

    @model_validator(mode="after")
    def _bar_below_min_effect(self) -> GateConfig:
        if self.promote_above > self.min_effect:
            raise ValueError(f"gate.promote_above ({self.promote_above}) exceeds gate.min_effect ({self.min_effect}): "
                             "a change could be both promoted and refuted; set promote_above <= min_effect")
        return self

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence

    def plan(self, n: int, comparisons: int = 1):
        """The sequential plan (`harness.sequential.Plan`) of a decision whose pairs may use up to `n` instances."""
        from harness.sequential import Plan

        first = min(self.first_look or max(20, n // 4), n)
        return Plan(alpha=self.alpha, min_effect=self.min_effect, promote_above=self.promote_above,
                    slice_tolerance=self.slice_tolerance,
                    min_slice_n=self.min_slice_n, arm_noise_sd=self.arm_noise_sd, max_n=n, min_n=first,
                    batch=self.look_every or first, max_pairs=self.max_pairs, promote_gamma=self.promote_gamma,
                    futility=self.futility)

    def human_needed(self, stages_without_promotion: int) -> bool:
        if isinstance(self.human, HumanAfterFailures):
            return stages_without_promotion >= self.human.after_failures
        return self.human == "always"


class EngineerConfig(BaseModel):
    """Which engineer proposes changes, and how to reach it."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    kind: Literal["rule", "llm", "scripted"] = Field("rule", description="rule (no LLM), llm, or scripted (replays)")
    base_url: str | None = Field(None, pattern=r"^https?://\S+$",
                                 description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 (llm)")
    model: str | None = Field(None, description="model name at the endpoint (llm with base_url)")
    api_key_env: str | None = Field(None, description="NAME of the env var holding the API key; None = no auth")
    model_path: str | None = Field(None, description="local transformers checkpoint dir, or 'policy' for the current "
                                                     "policy checkpoint (llm without base_url)")
    script: str | None = Field(None, description="YAML/JSONL file of replies, one per stage (scripted)")
    max_retries: int = Field(2, ge=0, le=10, description="retries of an invalid reply, or of a call the endpoint "
                             "could not answer for now (unreachable, HTTP 429 or 5xx; a whole deadline spent is not "
                             "retried), before the rule engineer steps in")
    spread: bool = Field(True, description="rule engineer: a stage's root-cause slots go to distinct parts of the "
                                           "harness first (env, recipe, reward, diagnostic: two hypotheses side by "
                                           "side, not two variants of one); false: by rank alone, as before the "
                                           "seventy-first session")
    temperature: float = Field(0.7, ge=0, le=2, description="sampling temperature of the engineer")
    max_tokens: int = Field(1024, ge=16, description="reply budget in tokens")
    timeout_s: float = Field(120.0, gt=0, le=86_400, description="seconds allowed for one endpoint reply (at most a day)")
    proxy: str | None = Field(None, pattern=r"^(https?|socks5h?)://\S+$",
                              description="llm with base_url: the proxy its requests (and API key) go through, e.g. "
                              "http://proxy.corp:3128; none by default, and HTTPS_PROXY/HTTP_PROXY are not read (the "
                              "key goes only where this file says)")
    ca_bundle: str | None = Field(None, description="llm with an https base_url signed by your own CA: that CA's PEM "
                                  "file (SSL_CERT_FILE is not read, as no other environment setting is)")
    preflight: bool = Field(True, description="llm: before anything trains, check that the endpoint answers (one "
                                              "1-token completion) or the local checkpoint loads; false starts anyway "
                                              "(stages it cannot answer fall back to the rule engineer)")

    @model_validator(mode="after")
    def _check(self) -> EngineerConfig:
        if self.ca_bundle is not None and not Path(self.ca_bundle).expanduser().is_file():  # else a traceback from
            # the HTTP client at the start, and every stage falling back to the rule engineer
            raise ValueError(f"engineer.ca_bundle {self.ca_bundle!r} is not a file: give the PEM file of the CA that "
                             "signed the endpoint's certificate")
        if self.kind == "llm" and not ((self.base_url and self.model) or self.model_path):
            raise ValueError("engineer kind 'llm' needs base_url + model (an OpenAI-compatible endpoint) or "
                             "model_path (a local checkpoint, or 'policy')")
        if self.kind == "llm" and self.base_url and self.model_path:
            raise ValueError("engineer: give base_url + model OR model_path, not both")
        if self.kind == "scripted" and not self.script:
            raise ValueError("engineer kind 'scripted' needs script: a .yaml/.jsonl file of replies")
        return self

    ENDPOINT: ClassVar[tuple[str, ...]] = ("base_url", "model", "api_key_env", "model_path", "script")
    USES: ClassVar[dict[str, tuple[str, ...]]] = {"rule": (), "scripted": ("script",),
                                                  "llm": ("base_url", "model", "api_key_env", "model_path",
                                                          "ca_bundle")}

    def unused(self) -> list[str]:
        """Set fields this kind never reads (a base_url under kind: rule, the default): said once at a run's start,
        as a warning, not refused: a config may carry an endpoint it is not using yet. A kind switched on purpose
        (`run --engineer`, an experiment's evolved-rule arm) drops them (`switched`)."""
        return [f for f in self.ENDPOINT if getattr(self, f) and f not in self.USES[self.kind]]


def switched(engineer: Any, kind: str) -> Any:
    """A run config's engineer section with its kind set to `kind`, without the fields that kind never reads."""
    if engineer is not None and not isinstance(engineer, dict):
        return engineer  # not a section: the config's own check names it
    keep = EngineerConfig.USES.get(kind, ())
    return {**{k: v for k, v in (engineer or {}).items() if k not in EngineerConfig.ENDPOINT or k in keep},
            "kind": kind}


class RunConfig(_Strict):
    task: str = Field(DEFAULT_TASK, description="task family: a built-in one (harness.tasks.TASKS) or one registered through an `evotrainer.tasks` entry point or $EVOTRAINER_TASKS (harness.tasks.registry)")
    name: str = Field("run", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=80,
                      description="run id prefix (the id adds -YYYYmmdd-HHMMSS)")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="seed for the engineer's choices and model initialisation")
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    env: dict[str, Any] | None = Field(None, description="round-0 generator config (the task's config model); "
                                                         "default: the task's round-0 env.yaml")
    recipe: dict[str, Any] = Field(default_factory=dict, description="round-0 recipe overrides (policies.train.Recipe)")
    reward: dict[str, Any] = Field(default_factory=dict, description="round-0 reward shaping (the task's shaping model)")
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    stage: StageConfig = Field(default_factory=StageConfig)
    backtest: BacktestConfig = Field(default_factory=BacktestConfig)
    gate: GateConfig = Field(default_factory=GateConfig)
    engineer: EngineerConfig = Field(default_factory=EngineerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    scale: ScaleConfig = Field(default_factory=ScaleConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        from harness.tasks import UnknownTaskError, get_task
        from policies.train import Recipe

        try:
            task = get_task(self.task)
        except UnknownTaskError as exc:
            raise ValueError(f"task: {exc}") from None
        if self.env is not None:
            _nested("env", task.spec.config_model, self.env)
        if self.backtest.env is not None:
            _nested("backtest.env", task.spec.config_model, self.backtest.env)
        if self.warm_start.env is not None:
            _nested("warm_start.env", task.spec.config_model, self.warm_start.env)
        if self.warm_start.teacher_noise:
            from harness.tasks.base import ImperfectTeacher

            if not isinstance(task, ImperfectTeacher):
                raise ValueError(f"warm_start.teacher_noise: task {self.task} has no imperfect teacher to draw "
                                 f"{self.warm_start.teacher_noise:g} of the demonstrations from; remove the field or "
                                 "set it to 0")
        _nested("reward", task.spec.shaping_model, self.reward)
        _nested("recipe", Recipe, self.recipe)
        if self.eval.env is not None:
            _nested("eval.env", task.spec.config_model, self.eval.env)
        elif self.eval.suite:
            try:
                task.suite(self.eval.suite)  # raises with the list of suites
            except ValueError as exc:
                if "suite" in self.eval.model_fields_set:
                    raise
                raise ValueError(f"eval.suite: not set, so the default {self.eval.suite!r}, which task {self.task} "
                                 f"does not have ({exc}); set `eval: {{suite: <one of them>}}`") from None
        if self.policy.style is not None and self.policy.style not in task.spec.styles:
            raise ValueError(f"policy.style: unknown style {self.policy.style!r} for task {self.task}; choose one of "
                             f"{', '.join(task.spec.styles)}")
        if self.stage.keep_training and self.backtest.carry_confirm == 0:
            # keep training, keep the best moves its anchor only on a confirmation reading: with none, the anchor
            # stays the warm start, every stage reports it and the run delivers it, while the lineage carries unread
            raise ValueError("backtest.carry_confirm: 0 turns off the readings stage.keep_training moves its anchor by "
                             "(the run would deliver its warm start whatever it trained); set carry_confirm above 0, or "
                             "stage.keep_training: false to carry checkpoints without reading them")
        return self

    @property
    def style(self) -> str:
        """The prompt style: policy.style; else for a preset the task's first style; for a checkpoint the style it was
        trained on (its evotrainer.json, written by `evotrainer train` and by runs), else chat."""
        from harness.tasks import get_task

        if self.policy.style:
            return self.policy.style
        styles = get_task(self.task).spec.styles
        if self.policy.preset:
            return styles[0]
        from harness.policy_glue import read_policy_meta

        meta = read_policy_meta(self.policy.checkpoint or "")
        return meta["style"] if meta.get("task") == self.task and meta.get("style") in styles else "chat"


def _fields_at(model: Any, path: list[Any]) -> list[str]:
    """The field names of the model `path` leads to from `model` (list indices skipped, Optional and unions read
    through to their model), or [] where the path leaves the models."""
    import typing

    def model_in(annotation: Any) -> Any:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return annotation
        for arg in typing.get_args(annotation):
            if (found := model_in(arg)) is not None:
                return found
        return None

    for part in path:
        if isinstance(part, int) or (isinstance(part, str) and part.isdigit()):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None or (model := model_in(field.annotation)) is None:
            return []
    return list(getattr(model, "model_fields", {}))


def _unknown_key(model: Any, loc: tuple | list, tail: str = "") -> str:
    """`unknown key`, with the field it is likely a typo of (`recipe.stpes` -> steps) where one is close."""
    import difflib

    close = difflib.get_close_matches(str(loc[-1]), _fields_at(model, list(loc[:-1])), n=1) if loc else []
    return f"unknown key (did you mean {close[0]}?){tail}" if close else f"unknown key (typo?){tail}"


def _nested(prefix: str, model: type[BaseModel], data: Any) -> None:
    """Validate a section checked by another model (the task's generator config, its shaping, the Recipe); errors name
    the full path in the run config (`env.<list>.0.<field>`, not `<list>.0.<field>`)."""
    try:
        model.model_validate(data)
    except ValidationError as exc:
        lines = []
        for e in union_merged(exc.errors()):
            loc = ".".join([prefix, *(str(p) for p in e["loc"])])
            msg = e["msg"].removeprefix("Value error, ")
            if not e["loc"] and (m := _BOOL_NUMBER.match(msg)):  # `no_bool_numbers`: name its field
                loc, msg = f"{prefix}.{m.group(1)}", m.group(2)
            if prefix.endswith(".env"):  # a generator names its own knobs `env.<...>`: here they are `<prefix>.<...>`
                msg = re.sub(r"(?<![\w.])env\.", f"{prefix}.", msg)
            lines.append(f"{loc}: {_unknown_key(model, e['loc'])}" if e["type"] == "extra_forbidden" else f"{loc}: {msg}")
        raise ValueError("; ".join(lines)) from None


_BOOL_NUMBER = re.compile(r"(\w+): ((?:true|false) is not a value of this field.*)")
# how pydantic names the member of a union a value failed: `literal['never','always']`, `function-after[...]`,
# `tagged-union[...]` (brackets or hyphens: never a YAML key of a config) and, beside one of those at the same field,
# a model member's class name (`HumanAfterFailures`). A capitalised key alone is a user's key, never a union's tag.
_SURE_TAG = re.compile(r"^(literal|function-\w+|tagged-union|list|dict|set|tuple)\[.*\]$|^constrained-\w+$")
_CLASS_TAG = re.compile(r"^([A-Z]\w*|int|float|str|bool|none)$")
_PLAIN_TAGS = frozenset({"int", "float", "str", "bool", "none", "bytes"})


def union_merged(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic reports a value that fits no member of a union once per member, each under a location that ends in
    the member's internal name (`gate.human.literal['never','always']: Input should be 'never' or 'always'
    gate.human.HumanAfterFailures: Input should be a valid dictionary ...`). One reading per such field instead: when a
    member got as far as the value's own fields (a mapping with a typo or a bad number), only those errors, under
    the field's location; else the members' messages joined with "; or ". A field counts as a union only where one
    of its members has a name no key can have (`_SURE_TAG`), or where two or more plain-type members (`str`, `float`)
    fail at one location; every other error passes through unchanged."""
    sites = {tuple(e["loc"][:i]) for e in errors for i, p in enumerate(e["loc"])
             if isinstance(p, str) and _SURE_TAG.match(p)}
    # a union of plain types (`str | float | None`) names its members `str`, `float`: a key could be called that, so
    # such a field counts as a union only where two or more of those names end errors at one location
    plain: dict[tuple, set[str]] = {}
    for e in errors:
        if e["loc"] and isinstance(e["loc"][-1], str) and e["loc"][-1] in _PLAIN_TAGS:
            plain.setdefault(tuple(e["loc"][:-1]), set()).add(e["loc"][-1])
    sites |= {loc for loc, names in plain.items() if len(names) > 1}

    def split(loc: tuple) -> int | None:
        return next((i for i, p in enumerate(loc) if tuple(loc[:i]) in sites and isinstance(p, str)
                     and (_SURE_TAG.match(p) or _CLASS_TAG.match(p))), None)

    deep = {tuple(e["loc"][:i]) for e in errors if (i := split(tuple(e["loc"]))) is not None and len(e["loc"]) > i + 1}
    out: list[dict[str, Any]] = []
    at: dict[tuple, dict[str, Any]] = {}
    for e in errors:
        loc = tuple(e["loc"])
        i = split(loc)
        if i is None:
            out.append(e)
            continue
        field = loc[:i]
        if len(loc) > i + 1:  # inside the member's own fields: the error that says what is wrong
            out.append({**e, "loc": (*field, *loc[i + 1:])})
            continue
        if field in deep:  # the value was meant for another member, which said what is wrong with it
            continue
        msg = e["msg"].removeprefix("Value error, ")
        if "valid dictionary or instance of" in msg:  # the model member's: say what it takes, not its class
            msg = "a mapping of its fields (see harness/config.py, each field's description, and examples/*.yaml)"
        if field in at:
            if msg not in at[field]["msg"]:
                at[field]["msg"] += "; or " + msg
            continue
        at[field] = {**e, "loc": field, "msg": msg, "type": "union"}
        out.append(at[field])
    return out


def _format_error(exc: ValidationError, source: str) -> str:
    lines = []
    for e in union_merged(exc.errors()):
        loc = ".".join(str(p) for p in e["loc"])
        if not loc and e["type"] == "value_error":  # a whole-config check: its message names the field
            lines.append(e["msg"].removeprefix("Value error, "))
            continue
        loc = loc or "(top level)"
        if e["type"] == "extra_forbidden":
            lines.append(f"{loc}: " + _unknown_key(RunConfig, e["loc"], "; see harness/config.py (each field's "
                                                   "description) and examples/*.yaml"))
        elif e["type"] == "value_error" and (m := _BOOL_NUMBER.match(e["msg"].removeprefix("Value error, "))):
            lines.append(f"{loc}.{m.group(1)}: {m.group(2)}")  # `no_bool_numbers`, run by the section: its field
        else:
            lines.append(f"{loc}: {e['msg']}")
    return f"{source}: invalid run config:\n  " + "\n  ".join(lines)


def parse_config(data: dict[str, Any], source: str = "<config>") -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a run config is a YAML mapping, got {type(data).__name__}")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc, source)) from None


def load_config(path: str | Path) -> RunConfig:
    path = Path(path)
    if path.is_dir():  # `evotrainer run .`: a folder is never a config (the CLI says more for a run's folder)
        raise ConfigError(f"{path} is a folder, not a run config; pass a YAML file such as examples/mapf_quick.yaml")
    if not path.is_file():
        raise ConfigError(f"run config {path} not found; pass a YAML file such as examples/mapf_quick.yaml")
    from sandbox.yamlload import YamlError, load_yaml

    try:
        data = load_yaml(path)
    except YamlError as exc:
        raise ConfigError(str(exc)) from None
    if data is None:  # an empty file would train every default: almost certainly the wrong file or a failed write
        raise ConfigError(f"{path}: the run config is empty; write at least `task: <family>` (alone it runs on the "
                          "built-in defaults; the examples/ folder has full configs)")
    return parse_config(data, str(path))
