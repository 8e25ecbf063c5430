"""Training stages through TRL: an SFT warm start on (prompt, completion) pairs and a GRPO stage with a plain reward
function. Both return typed metrics and, given `out_dir`, save the model + tokenizer there (save_pretrained).

    from policies.model import build_model
    from policies.train import Recipe, train_sft, train_grpo
    model, tok = build_model("tiny", "ab#")
    recipe = Recipe(sft_steps=50, steps=20)
    train_sft(model, tok, [{"prompt": "ab", "completion": "#"}] * 64, recipe)
    def reward(prompts, completions, **cols): return [float(c.startswith("#")) for c in completions]
    m = train_grpo(model, tok, [{"prompt": "ab", "seed": 1}] * 8, reward, recipe)
    m.steps[-1].reward_mean, m.dead_group_share, m.wall_s

A reward function is `(prompts, completions, **columns) -> list[float]`: prompts and completions are the raw task text
(chat formatting is undone), and every extra dataset column (e.g. the instance JSON) arrives as a keyword list aligned
with the completions. `progress(stage, step, total, logs)` is called after every optimiser step.

CPU defaults: fp32, no gradient checkpointing, no checkpoints mid-stage, no reporting; learning rates raised for models
trained from scratch. On a CUDA GPU bf16 is used when supported. `import trl` is slow, so it happens inside the stages.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from policies.model import CHAT_TEMPLATE_KWARGS, cache_kw, format_prompt, has_chat_template, save_policy

Progress = Callable[[str, int, int, dict], None]
RewardFn = Callable[..., list[float]]

# --- recipe -----------------------------------------------------------------------------------------------------------


class RecipeError(ValueError):
    """A recipe whose settings cannot work together; raised when the recipe is built, before any training."""


def _takes_bool(annotation) -> bool:
    import typing

    if annotation is bool or annotation is typing.Any or annotation is object:
        return True
    return any(_takes_bool(a) for a in typing.get_args(annotation))


def no_bool_numbers(model: type[BaseModel], data):
    """A `mode="before"` check for a config model: a YAML `true`/`false` given to a field that takes no bool is refused
    by name (pydantic's lax mode read `steps: true` as one step and `wall_clock: true` as one second)."""
    if isinstance(data, dict):
        for name, value in data.items():
            field = model.model_fields.get(name) if isinstance(name, str) else None
            if isinstance(value, bool) and field is not None and not _takes_bool(field.annotation):
                raise ValueError(f"{name}: {str(value).lower()} is not a value of this field (a number or a word; "
                                 "true/false only switch a flag)")
    return data


class Recipe(BaseModel):
    """The training recipe: every knob of the SFT warm start and the GRPO stage. Defaults work on CPU and GPU."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_numbers(cls, data):
        return no_bool_numbers(cls, data)
    # SFT warm start
    sft_learning_rate: float = Field(1e-3, gt=0, le=1.0, description="SFT peak learning rate (1e-3 suits tiny from-scratch models)")
    sft_steps: int = Field(300, ge=0, le=10_000_000, description="SFT optimiser steps (0 = skip the warm start)")
    sft_batch_size: int = Field(32, ge=1, le=65_536, description="SFT sequences per optimiser step")
    # GRPO
    learning_rate: float = Field(1e-4, gt=0, le=1.0, description="GRPO learning rate (measured on the tiny MAPF policy: 1e-4 "
                                 "learns, 2e-4 collapses it within 100 steps; 1e-6..1e-5 for pretrained LMs)")
    beta: float = Field(0.01, ge=0, description="KL coefficient against the stage's starting policy (0 = no reference)")
    num_generations: int = Field(8, ge=2, le=4096, description="completions sampled per prompt (the GRPO group size)")
    temperature: float = Field(1.0, gt=0, le=10.0, description="sampling temperature during GRPO rollouts")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass during GRPO rollouts")
    max_completion_length: int = Field(96, ge=1, le=1_048_576, description="completion budget in tokens; longer ones are truncated")
    steps: int = Field(40, ge=1, le=10_000_000, description="GRPO optimiser steps")
    batch_size: int = Field(32, ge=2, le=1_048_576, description="completions per GRPO step (prompts per step = batch_size / "
                            "num_generations); must be a multiple of num_generations")
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo"] = Field(
        "dapo", description="TRL loss aggregation (dapo = token-normalised over the batch, no length bias)")
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="advantage normalisation: by group std, batch std, or none (Dr. GRPO)")
    reward_scale: float = Field(1.0, gt=0, description="multiplier applied to every reward before advantages")
    epsilon: float = Field(0.2, gt=0, description="PPO clip range")
    epsilon_high: float | None = Field(
        None, gt=0, description="upper clip (DAPO's clip-higher; for cispo the cap on the importance weight itself, "
        "ScaleRL's epsilon_max); unset: epsilon for the PPO losses, CISPO_EPSILON_HIGH for cispo")
    num_iterations: int = Field(1, ge=1, description="optimiser passes per generated batch (mu)")
    drop_dead_groups: bool = Field(False, description="drop groups whose rewards all tie (zero advantage, no policy "
                                   "gradient with beta 0) before the backward pass: the same gradient direction for "
                                   "about half the compute when most groups are dead; the token-normalised loss is "
                                   "then averaged over informative tokens only, and beta's KL term over those only")
    oversample: int = Field(1, ge=1, description="dynamic sampling (DAPO): sample this many times batch_size "
                            "completions per step and train on the first batch_size / num_generations groups whose "
                            "rewards differ; needs drop_dead_groups. Use when most groups are dead (all fail or all "
                            "succeed)")
    replay: float = Field(0.0, ge=0, lt=1, description="share of each step's sampled groups drawn from a pool of "
                          "prompts whose groups were live (rewards differ) in recent steps instead of fresh prompts: "
                          "more live groups per sampled group, at the cost of revisiting boards; needs "
                          "drop_dead_groups. 0 = off")
    replay_pool: int = Field(64, ge=1, description="prompts the replay pool holds (most recently live first)")
    mask_truncated_completions: bool = Field(False, description="drop completions that hit the length cap from the loss")
    warmup_ratio: float = Field(0.05, ge=0, lt=1, description="linear warm-up share of each stage")
    lr_schedule: Literal["cosine", "constant", "linear"] = Field(
        "cosine", description="GRPO learning-rate schedule after warm-up (SFT is always cosine): cosine/linear decay "
                              "to 0 at the end of each stage; constant keeps the peak (short stages and arms)")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping norm")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="seed for data order, sampling and initialisation")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="arithmetic of GRPO and SFT on a CUDA GPU (a CPU always trains in fp32): auto = bf16 "
        "autocast where supported, fp16 = autocast with loss scaling, fp32 = none (twice the activation memory). "
        "Measured on an H200 (BENCHMARKS.md, GPU paths): the toy copy task learns less per step under bf16 or fp16 "
        "than fp32 (100 steps: 66-90% vs 96-97%, 3 seeds); try fp32 on small models or when a run stalls")
    rollout_engine: Literal["policies", "trl"] = Field(
        "policies", description="GRPO generation: our batched loop (policies.rollout, faster on CPU) or TRL's "
        "model.generate; models with a chat template always use trl")

    shared_prompt_loss: bool = Field(True, description="the loss's log-probabilities compute each group's prompt "
                                     "once and skip completion padding (`shared_prompt_logps`; Llama-architecture "
                                     "models, else TRL's own forward): same values, a fraction of the positions")
    compact_decode: bool = Field(True, description="GRPO rollouts of Llama-architecture models decode with the "
                                 "compact loop (`policies.rollout.CompactLlama`); false = the model's own forward "
                                 "every token (the reference path)")
    prune_dead_groups: bool = Field(True, description="leave groups whose rewards all tie out of the loss's forward "
                                    "and backward while the loss keeps the whole batch's normaliser: the same "
                                    "gradient (a tied group's advantages are zero), less work when groups are dead. "
                                    "Only where that is exact (beta 0, no entropy mask or bonus; `prunable`); TRL's "
                                    "logged entropy and clip ratios then cover the live groups. Unlike "
                                    "drop_dead_groups it changes nothing a step learns from its batch (with TRL's "
                                    "own generation, later batches are drawn as under another seed: its shuffle of "
                                    "a smaller batch advances torch's global generator differently)")
    sampler: Literal["inverse_cdf", "multinomial"] = Field(
        "inverse_cdf", description="how our rollout loop draws each token (`policies.rollout.SamplingParams."
        "sampler`): inverse_cdf = one uniform per row (exact); multinomial = torch.multinomial, one random number "
        "per vocabulary entry (the reference path)")
    pipeline: bool | Literal["auto"] = Field(
        "auto", description="generate the next step's rollouts in a second thread, from the weights before this "
        "step's update, while this step scores and trains (`_Pipeline`): each batch but the first is one update "
        "off-policy, and the loss's PPO ratio is then taken against its sampling log-probabilities (clipped at "
        "epsilon). The two loops each run at the process's torch thread count. auto (the default): on when the "
        "process's cores leave that many idle (`policies.spare_cores`: one torch thread on two cores, a run or "
        "benchmark training alone), off where jobs share the machine side by side (the experiment's workers and Ray "
        "arms get their share in EVOTRAINER_CORES) or torch already uses every core (models above the thread probe's "
        "size). Only with our rollout engine on a CPU, top_p 1 and one optimiser pass per batch; elsewhere the steps "
        "run in turn (true warns once where it cannot, auto stands down silently)")

    @model_validator(mode="after")
    def _check(self) -> Recipe:
        if self.batch_size % self.num_generations:
            lo = self.batch_size - self.batch_size % self.num_generations
            hint = f"{lo} or {lo + self.num_generations}" if lo else str(self.num_generations)
            raise RecipeError(
                f"batch_size ({self.batch_size}) must be divisible by num_generations ({self.num_generations}): "
                f"each step holds whole groups; set batch_size to a multiple of num_generations, e.g. {hint}"
            )
        if self.oversample > 1 and not self.drop_dead_groups:
            raise RecipeError(f"oversample={self.oversample} samples extra groups to replace dead ones, which needs "
                              "drop_dead_groups: true; set drop_dead_groups: true or oversample: 1")
        if self.replay > 0 and not self.drop_dead_groups:
            raise RecipeError(f"replay={self.replay} replaces fresh prompts with recently live ones, which needs "
                              "drop_dead_groups: true (it is how a group is known to be live); set drop_dead_groups: "
                              "true or replay: 0")
        return self

    @property
    def prompts_per_step(self) -> int:
        """Distinct prompts consumed by one GRPO optimiser step (oversampling included)."""
        return self.batch_size // self.num_generations * self.oversample


# --- metrics ----------------------------------------------------------------------------------------------------------


class SFTMetrics(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps: int
    examples: int
    loss: list[float] = Field(..., description="training loss per step")
    token_accuracy: list[float] = Field(default_factory=list, description="completion-token accuracy per step")
    wall_s: float
    out_dir: str | None = None
    resumed_from: int = Field(0, description="the step of the resumable checkpoint this call continued from (0: none)")
    # wall_s: the whole SFT's seconds, a resumed one's included up to the checkpoint it continued from (what a kill
    # lost after that checkpoint is retrained, and counted, once more)


class GRPOStep(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step: int
    reward_mean: float = Field(..., description="the step's mean reward in the task's own units (before "
                               "`reward_scale`, as `RewardBatch` records it)")
    reward_std: float
    dead_group_share: float = Field(..., description="share of groups whose rewards all tie (no learning signal)")
    completion_length: float
    kl: float | None = None
    loss: float | None = None
    seconds: float = Field(..., description="wall time of this step")
    tokens_generated: int
    live_groups: float | None = Field(None, description="groups whose rows the loss trained on this step "
                                      "(drop_dead_groups or prune_dead_groups; None when every group was)")
    replayed_groups: float | None = Field(None, description="groups of this step drawn from the replay pool (replay)")
    generation_seconds: float | None = Field(None, description="of `seconds`, the rollouts' decoding (our engine; "
                                             "with `pipeline`, the wait for the rollouts generated in the background)")
    pipelined: float | None = Field(None, description="1 when this step trained on rollouts generated in the "
                                    "background during the step before (`pipeline`), 0 when it generated its own")
    clipped_ratio: float | None = Field(None, description="share of this step's completions that hit "
                                        "max_completion_length before their end (truncated)")
    valid_live_share: float | None = Field(None, description="share of this step's groups with valid and invalid "
                                           "completions both (set by the harness, which knows validity)")
    valid: float | None = Field(None, description="share of this step's completions that are valid (set by the "
                                "harness: the reward's own completions, what `grpo.reward_hacking` sets the reward "
                                "against)")


class GRPOMetrics(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps: list[GRPOStep]
    wall_s: float
    tokens_generated: int
    out_dir: str | None = None

    @property
    def seconds_per_step(self) -> float:
        return self.wall_s / max(1, len(self.steps))

    @property
    def dead_group_share(self) -> float:  # over the steps that generated (with num_iterations > 1 the rest log none)
        made = [s.dead_group_share for s in self.steps if math.isfinite(s.dead_group_share)]
        return sum(made) / len(made) if made else float("nan")


# --- shared plumbing --------------------------------------------------------------------------------------------------


def quiet() -> None:
    """Silence the progress bars and advisory warnings of transformers / TRL / datasets (errors still surface)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import datasets
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.utils.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    for name in ("trl", "accelerate", "datasets", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"(trl|transformers|accelerate|torch)\.")
    warnings.filterwarnings("ignore", category=FutureWarning)


def _precision(precision: str = "auto") -> str:
    """The arithmetic training runs in: fp32 on a CPU whatever was asked (CPU autocast is slower there, and every CPU
    path is checked exactly); on a CUDA GPU what the recipe asks, `auto` being bf16 where the GPU supports it."""
    if not torch.cuda.is_available():
        return "fp32"
    if precision == "auto":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return precision


_SAID_CPU_PRECISION: set[str] = set()


def _device_args(precision: str = "auto") -> dict[str, Any]:
    p = _precision(precision)
    if precision in ("bf16", "fp16") and p == "fp32" and precision not in _SAID_CPU_PRECISION:
        _SAID_CPU_PRECISION.add(precision)  # once a process: every stage and arm would repeat it
        warnings.warn(f"recipe.precision {precision}: no CUDA GPU, so training runs in fp32 (CPU autocast was "
                      "slower and less exact than fp32 at these models' shapes, even with AMX: BENCHMARKS.md)",
                      stacklevel=2)
    return {"use_cpu": not torch.cuda.is_available(), "bf16": p == "bf16", "fp16": p == "fp16"}


LOGP_TOL_FP32 = 1e-3
LOGP_TOL_BF16 = 2 ** -4  # fp16 autocast too (see logprob_tolerance)


def logprob_tolerance(precision: str = "auto") -> float:
    """Rung 1's bound on |log p_sampler - log p_trainer| per token: 1e-3 where the trainer computes in fp32 (every CPU
    path); 1/16 where it runs under bf16 autocast (a CUDA GPU with bf16, `_device_args`). There the logits come out of
    a bf16 matmul: bf16 keeps 8 bits of mantissa, so logits between 8 and 16 in magnitude are spaced 1/16 apart, and a
    decode that reads a cache rounds in another order than the trainer's one forward over the whole sequence, so the
    two can differ by one such step. Measured on an H200 (BENCHMARKS.md, "GPU paths"): 0.0027 at most on the chat
    checkpoint, 0.037 on the toy warm start at temperature 1 (its logits are larger); the importance ratios agreed
    exactly. Under fp16 autocast (10 bits of mantissa) the same argument would give 1/128, but the H200 measured 0.018
    on the toy warm start at temperature 1 (0.0012 at 0.5): the disagreement is not only the logits' rounding, so fp16
    keeps bf16's 1/16. The fp32 bound is what catches formatting, masking and temperature bugs, on every CPU host and
    in CI."""
    return LOGP_TOL_FP32 if _precision(precision) == "fp32" else LOGP_TOL_BF16


def _common_args(out_dir: str, recipe: Recipe, schedule: str = "cosine") -> dict[str, Any]:
    return dict(
        output_dir=out_dir, report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True,
        gradient_checkpointing=False, seed=recipe.seed, data_seed=recipe.seed, warmup_steps=recipe.warmup_ratio,
        weight_decay=recipe.weight_decay, max_grad_norm=recipe.max_grad_norm,
        lr_scheduler_type="constant_with_warmup" if schedule == "constant" else schedule,
        dataloader_num_workers=0, **_device_args(recipe.precision),
    )


def _callback(stage: str, total: int, progress: Progress | None, sink: list[dict]):
    from transformers import TrainerCallback

    class _Log(TrainerCallback):
        def __init__(self) -> None:
            self.t = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs is None or "train_runtime" in logs:
                return
            now = time.perf_counter()
            sink.append({**logs, "_step": state.global_step, "_seconds": now - self.t})
            self.t = now
            if progress is not None:
                progress(stage, state.global_step, total, logs)

    return _Log()


def _train(trainer, model, tok, out_dir: str | Path | None, resume_from: Path | None = None) -> float:
    """Run a trainer with our progress callback only, leave the model in eval mode, save it when asked; returns the
    wall seconds of `trainer.train()`. `resume_from`: a trainer checkpoint to continue from."""
    _drop_printer(trainer)
    t0 = time.perf_counter()
    try:
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    finally:
        unpatch_forward(model)
        _drop_scratch()
    wall = time.perf_counter() - t0
    model.eval()
    if out_dir:
        save_policy(model, tok, out_dir)
    return wall


def unpatch_forward(model) -> bool:
    """Remove the fused LM head TRL's trainers install on the model instance (`trl.trainer.utils.add_fused_lm_head`
    sets `model.forward` to a closure over the forward it replaced, i.e. over THIS object). Left in place, a
    `copy.deepcopy` of the model keeps calling the original object's forward: the copy generates and evaluates with
    the weights of the model it was copied from, whatever training does to the copy afterwards. Returns whether a
    patch was removed."""
    fwd = model.__dict__.get("forward")
    if fwd is not None and getattr(getattr(fwd, "__func__", None), "__code__", None) is not None \
            and fwd.__func__.__code__.co_name == "_fused_forward":
        del model.__dict__["forward"]
        return True
    return False


def tensorboard_callbacks(log_dir: str | Path | None) -> list:
    """transformers' own TensorBoardCallback writing to `log_dir` (every logged metric, prefixed train/), or nothing.
    Passed explicitly rather than through report_to, whose directory comes from a process-wide environment variable
    in transformers 5."""
    if log_dir is None:
        return []
    from torch.utils.tensorboard import SummaryWriter
    from transformers.integrations import TensorBoardCallback

    Path(log_dir).mkdir(parents=True, exist_ok=True)
    return [TensorBoardCallback(tb_writer=SummaryWriter(log_dir=str(log_dir)))]


def time_budget(seconds: float, anneal: bool = True, start: float | None = None):
    """A TrainerCallback for training bounded by wall time instead of steps: stops after `seconds` (counted from
    `start`, a `time.perf_counter()` value, default the start of training) and, with `anneal`, scales the learning
    rate by a cosine of the elapsed share of the budget (1 at the start, 0 at the end) on top of the recipe's own
    schedule, which should then be `lr_schedule: constant` (its warm-up still applies). A step-based schedule laid out
    for a guessed number of steps anneals too early or never when seconds per step vary (0.6 to 0.9 s for the same
    rung-3 recipe on the same machine). Logged `learning_rate` values are the recipe schedule's, before the factor."""
    import math

    from transformers import TrainerCallback

    class TimeBudget(TrainerCallback):
        t0 = start

        def on_train_begin(self, args, state, control, **kw):
            if self.t0 is None:
                self.t0 = time.perf_counter()

        def share(self) -> float:
            return min(1.0, (time.perf_counter() - self.t0) / seconds) if self.t0 is not None else 0.0

        def on_pre_optimizer_step(self, args, state, control, optimizer=None, lr_scheduler=None, **kw):
            if anneal and optimizer is not None and lr_scheduler is not None:
                factor = 0.5 * (1 + math.cos(math.pi * self.share()))
                for group, base in zip(optimizer.param_groups, lr_scheduler.get_last_lr()):
                    group["lr"] = base * factor

        def on_step_end(self, args, state, control, **kw):
            if self.share() >= 1.0:
                control.should_training_stop = True

    return TimeBudget()


def _drop_printer(trainer) -> None:
    """With tqdm disabled, transformers prints every log dict; our callback reports progress instead."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)


_SCRATCH: list[str] = []  # temporary folders of the training call in progress, removed when it ends


SCRATCH_PREFIX = "evotrainer-trl-"


def _scratch_dir(out_dir: str | Path | None) -> str:
    """`out_dir`, or a fresh temporary folder (TRL's output_dir, the KL reference's weights) that `_drop_scratch`
    removes when the call that made it ends: one is made per stage, so keeping them would fill /tmp on a long run.
    Its name carries the process id; a process that was killed cannot remove its own, so the next one removes the
    folders of processes no longer alive (`_sweep_orphans`): an overnight run killed and resumed N times would
    otherwise leave N copies of a reference model's weights in /tmp."""
    import tempfile

    if out_dir:
        return str(out_dir)
    _sweep_orphans(Path(tempfile.gettempdir()))
    path = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")
    _SCRATCH.append(path)
    return path


def _sweep_orphans(tmp: Path) -> int:
    """Remove scratch folders whose process (the pid in the name) is gone; folders of live processes and older
    unnamed ones are left. Returns how many were removed."""
    import shutil

    gone = 0
    for p in tmp.glob(f"{SCRATCH_PREFIX}*-*"):
        pid = p.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # alive (or another user's: not ours to remove)
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(p, ignore_errors=True)
        gone += 1
    return gone


def _drop_scratch() -> None:
    import shutil

    while _SCRATCH:
        shutil.rmtree(_SCRATCH.pop(), ignore_errors=True)


# --- SFT warm start ---------------------------------------------------------------------------------------------------

# the recipe fields `train_sft` reads (its own and, through `_common_args`, the trainer's seed, warm-up, weight decay,
# gradient clip and precision): what a cached warm start is keyed by (`harness.warmstart`)
SFT_RECIPE_FIELDS = ("sft_steps", "sft_learning_rate", "sft_batch_size", "seed", "warmup_ratio", "weight_decay",
                     "max_grad_norm", "precision")


def train_sft(model, tok, pairs: list[dict[str, str]], recipe: Recipe, out_dir: str | Path | None = None,
              progress: Progress | None = None, tensorboard_dir: str | Path | None = None,
              callbacks: list | None = None, schedule: str = "cosine", resume_dir: str | Path | None = None,
              save_every: int = 0) -> SFTMetrics:
    """Supervised warm start on `{"prompt", "completion"}` pairs (raw task text); loss on completion tokens only.
    `tensorboard_dir`: write TensorBoard event files there (loss, token accuracy, learning rate per step).
    `callbacks`: extra transformers TrainerCallbacks (e.g. `time_budget`, then with `schedule="constant"`).

    Resumable: with `resume_dir` and `save_every` > 0 the trainer checkpoints itself every `save_every` steps into
    `resume_dir` (model, optimizer, scheduler, RNG states, step and data position; written to a staging folder, then
    renamed, so a kill mid-write leaves the previous checkpoint whole), and a call that finds a checkpoint there
    continues from it: same data order, same final step count, same weights as an uninterrupted run. The metrics' loss
    list then holds the steps trained by this call only. The caller removes `resume_dir` once it has the final model
    saved (`clear_resume`)."""
    if not pairs:
        raise RecipeError("train_sft got no (prompt, completion) pairs; generate expert demonstrations first")
    bad = [p for p in pairs[:50] if set(p) != {"prompt", "completion"}]
    if bad:
        raise RecipeError(f"SFT pairs must be dicts with exactly 'prompt' and 'completion', got keys {sorted(bad[0])}")
    quiet()
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    if has_chat_template(tok):  # TRL renders these itself, with a row's own `chat_template_kwargs`: the pinned date
        rows = [{"prompt": [{"role": "user", "content": p["prompt"]}],
                 "completion": [{"role": "assistant", "content": p["completion"]}],
                 "chat_template_kwargs": dict(CHAT_TEMPLATE_KWARGS)} for p in pairs]
    else:
        rows = [{"prompt": format_prompt(tok, p["prompt"]), "completion": p["completion"]} for p in pairs]
    sink: list[dict] = []
    common = _common_args(_scratch_dir(out_dir), recipe, schedule)
    resume_from, saver, earlier = None, [], 0.0
    if resume_dir is not None and save_every > 0:
        resume_dir = Path(resume_dir)
        resume_from = latest_resume_checkpoint(resume_dir)
        staging = resume_dir / STAGING
        import shutil

        shutil.rmtree(staging, ignore_errors=True)  # a write a kill interrupted: never complete, never read
        common.update(output_dir=str(staging), save_strategy="steps", save_steps=save_every)
        earlier = _earlier_wall(resume_from)  # read now: the saver deletes this checkpoint once a newer one lands
        saver = [_atomic_saver(resume_dir, earlier)]
    args = SFTConfig(
        **common, learning_rate=recipe.sft_learning_rate,
        max_steps=recipe.sft_steps, per_device_train_batch_size=recipe.sft_batch_size, completion_only_loss=True,
        packing=False, max_length=None, dataset_num_proc=None,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                         callbacks=[_callback("sft", recipe.sft_steps, progress, sink), *(callbacks or []),
                                    *tensorboard_callbacks(tensorboard_dir), *saver])
    for cb in saver:
        cb.start = time.perf_counter()  # the saver's clock starts with the training, as `_train`'s does
    wall = _train(trainer, model, tok, out_dir, resume_from=resume_from) + earlier
    return SFTMetrics(steps=trainer.state.global_step, examples=len(pairs), wall_s=wall, out_dir=str(out_dir) if out_dir else None,
                      loss=[r["loss"] for r in sink if "loss" in r],
                      token_accuracy=[r["mean_token_accuracy"] for r in sink if "mean_token_accuracy" in r],
                      resumed_from=resume_step(resume_from) if resume_from is not None else 0)


# --- resumable SFT: atomic trainer checkpoints ------------------------------------------------------------------------

STAGING = ".staging"  # inside resume_dir: where the trainer writes a checkpoint before it is renamed into place
_STEP = "step-"


def latest_resume_checkpoint(resume_dir: str | Path) -> Path | None:
    """The newest complete SFT checkpoint in `resume_dir` (`step-NNNNNNNN`, renamed into place only once whole), or
    None. The staging folder and anything else are ignored."""
    d = Path(resume_dir)
    done = sorted(p for p in d.glob(f"{_STEP}*") if p.is_dir() and p.name[len(_STEP):].isdigit()) \
        if d.is_dir() else []
    return done[-1] if done else None


def resume_step(checkpoint: str | Path) -> int:
    """The SFT step a resumable checkpoint (`step-NNNNNNNN`) holds."""
    return int(Path(checkpoint).name[len(_STEP):])


def clear_resume(resume_dir: str | Path) -> None:
    """Remove an SFT's resume checkpoints (once its final model is saved elsewhere)."""
    import shutil

    shutil.rmtree(resume_dir, ignore_errors=True)


WALL_FILE = "evotrainer_wall.json"  # in an SFT resume checkpoint: the training seconds spent up to it, every call's


def _earlier_wall(checkpoint: Path | None) -> float:
    """The training seconds that led to a resume checkpoint (0 without one, or one an older version wrote)."""
    if checkpoint is None:
        return 0.0
    try:
        return max(0.0, float(json.loads((Path(checkpoint) / WALL_FILE).read_text())["wall_s"]))
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def _atomic_saver(resume_dir: Path, earlier_s: float = 0.0):
    """A TrainerCallback that, after the trainer has written `checkpoint-N` into the staging folder, records the
    training seconds so far in it (`earlier_s`, what the calls before this one spent, plus this call's since its
    `start`: a resumed SFT is charged its whole time, not only the part after the kill), renames it to
    `resume_dir/step-N` (one rename on one filesystem: atomic) and then deletes older steps."""
    import shutil

    from transformers import TrainerCallback

    class AtomicCheckpoint(TrainerCallback):
        start = time.perf_counter()

        def on_save(self, args, state, control, **kw):
            staged = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if not staged.is_dir():
                return
            (staged / WALL_FILE).write_text(json.dumps({"wall_s": earlier_s + time.perf_counter() - self.start}))
            dest = resume_dir / f"{_STEP}{state.global_step:08d}"
            shutil.rmtree(dest, ignore_errors=True)
            os.replace(staged, dest)
            for old in resume_dir.glob(f"{_STEP}*"):
                if old != dest:
                    shutil.rmtree(old, ignore_errors=True)

    return AtomicCheckpoint()


# --- GRPO -------------------------------------------------------------------------------------------------------------

_TRL_KWARGS = ("completion_ids", "trainer_state", "log_extra", "log_metric", "environments")


def _wrap_reward(reward_fn: RewardFn, scale: float, counter: list[int]):
    """TRL-facing reward: hands the user's function raw prompt/completion text and the dataset's extra columns."""

    def reward(prompts, completions, **kw):
        ids = kw.get("completion_ids")
        if ids is not None:
            counter[0] += sum(len(x) for x in ids)
        columns = {k: v for k, v in kw.items() if k not in _TRL_KWARGS}
        raw_prompts = columns.pop("prompt_text")
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        out = reward_fn(raw_prompts, texts, **columns)
        if len(out) != len(texts):
            raise ValueError(f"reward function returned {len(out)} rewards for {len(texts)} completions")
        values = [float(r) * scale for r in out]
        bad = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
        if bad is not None:  # TRL would sum a NaN away as 0 (its "no reward" marker) and train on it silently
            raise ValueError(f"reward function {getattr(reward_fn, '__name__', 'reward')} returned {out[bad]!r} for "
                             f"completion {bad} ({texts[bad][:60]!r}); rewards must be finite numbers")
        return values

    reward.__name__ = getattr(reward_fn, "__name__", "reward")
    return reward


def _rollout_func(tok, recipe: Recipe):
    """TRL `rollout_func` backed by policies.rollout's decoding loop (same sampling, batch shrinks at <eos>). TRL hands
    over each prompt `num_generations` times in a row: each distinct prompt is prefilled once and its KV cache fanned
    out to the group. Returns the sampling log-probabilities too (TRL keeps them as `sampling_per_token_logps`)."""
    from policies.rollout import _generate_loop

    def rollout(prompts: list[str], trainer) -> dict[str, Any]:
        mode = "train" if trainer.model.training else "eval"
        ready = getattr(trainer, "_ready", None)
        if ready is not None and ready.prompts == prompts:  # generated in the background during the step before
            ids, res = ready.ids, ready.result
            trainer._metrics[mode]["generation_seconds"].append(ready.waited)
        else:
            ids, params = rollout_plan(tok, recipe, prompts, trainer.state.global_step)
            res = _generate_loop(trainer.accelerator.unwrap_model(trainer.model_wrapped), tok, ids, params)
            trainer._metrics[mode]["generation_seconds"].append(res.seconds)
        prompt_ids = [ids[i] for i in res.prompt_index]
        return {"prompt_ids": prompt_ids, "completion_ids": res.completion_ids, "logprobs": res.logprobs}

    return rollout


def rollout_plan(tok, recipe: Recipe, prompts: list[str], step: int):
    """The token ids of a step's distinct prompts and its sampling parameters (the step's seed): TRL hands each
    prompt over `num_generations` times in a row, and each distinct one is prefilled once."""
    from policies.rollout import SamplingParams

    g = recipe.num_generations
    grouped = len(prompts) % g == 0 and all(prompts[i] == prompts[i - i % g] for i in range(len(prompts)))
    unique = prompts[::g] if grouped else prompts
    ids = [tok(p)["input_ids"] for p in unique]
    return ids, SamplingParams(temperature=recipe.temperature, top_p=recipe.top_p, n=g if grouped else 1,
                               batch_size=len(prompts), max_new_tokens=recipe.max_completion_length,
                               seed=recipe.seed * 1_000_003 + step, compact=recipe.compact_decode,
                               sampler=recipe.sampler)


# --- the pipeline: the next step's rollouts generated while this step trains ------------------------------------------


class _Peeking:
    """The trainer's dataloader, fetched one batch ahead: while batch t is being trained, batch t+1 (or None at the
    end) is in `holder.peek`, so its rollouts can start. Everything else is the wrapped loader's."""

    def __init__(self, loader, holder) -> None:
        self._loader, self._holder = loader, holder

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str):
        return getattr(self._loader, name)

    def __iter__(self):
        it = iter(self._loader)
        try:
            cur = next(it)
        except StopIteration:
            return
        while True:
            nxt = next(it, None)
            self._holder.peek = nxt
            yield cur
            if nxt is None:
                return
            cur = nxt


class _Pending(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    prompts: list[Any]
    ids: list[list[int]]
    future: Any


class _Ready(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    prompts: list[Any]
    ids: list[list[int]]
    result: Any
    waited: float


class _Pipeline:
    """One step's rollouts generated in a background thread while the step before scores and trains: asynchronous
    RL with a staleness of one update (the actor/learner split of IMPALA, Espeholt et al. 2018, with the PPO ratio
    against the behaviour policy's log-probabilities as the off-policy correction, as PipelineRL and AReaL do for LLM
    GRPO). The thread decodes with a shadow copy of the policy whose weights are copied in before each launch (the
    learner never writes what the actor reads). torch releases the GIL inside its kernels, so the two loops run on
    two cores. A step whose prompts are not the ones launched for it (a replay pool's mix, the epoch's end) generates
    its own, on-policy, as without the pipeline."""

    def __init__(self, tok, recipe: Recipe) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.tok, self.recipe = tok, recipe
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="grpo-rollouts")
        self.shadow = None
        self.pending: _Pending | None = None

    def take(self, prompts: list[Any]) -> _Ready | None:
        """The rollouts launched for `prompts` (waiting for them), or None when none were."""
        p, self.pending = self.pending, None
        if p is None:
            return None
        t0 = time.perf_counter()
        res = p.future.result()
        return _Ready(prompts=p.prompts, ids=p.ids, result=res, waited=time.perf_counter() - t0) \
            if p.prompts == prompts else None

    def launch(self, model, rows: list[dict[str, Any]] | None, step: int) -> None:
        """Start step `step`'s rollouts for `rows` from `model`'s weights as they are now."""
        from policies.rollout import _generate_loop

        if rows is None:
            return
        prompts = [r["prompt"] for r in rows]
        ids, params = rollout_plan(self.tok, self.recipe, prompts, step)
        with torch.no_grad():
            if self.shadow is None:  # a copy of the trainer's model carries TRL's fused head, a closure over the
                # live model's forward: unpatched, the copy computes with its own weights (`unpatch_forward`)
                self.shadow = copy.deepcopy(model).requires_grad_(False)
                unpatch_forward(self.shadow)
            else:
                for mine, theirs in zip(self.shadow.parameters(), model.parameters(), strict=True):
                    mine.copy_(theirs)
        self.pending = _Pending(prompts=prompts, ids=ids,
                                future=self.pool.submit(_generate_loop, self.shadow, self.tok, ids, params))

    def close(self) -> None:
        self.pending = None
        self.pool.shutdown(wait=True)


def pipelinable(trainer, recipe: Recipe) -> str | None:
    """Why this trainer's steps cannot overlap (None: they can): the pipeline needs our rollout engine, a CPU (a GPU
    overlaps within itself), top_p 1 (the sampling log-probability is then the policy's own, which the ratio needs),
    and one optimiser pass per generated batch."""
    if trainer.rollout_func is None:
        return "TRL's own generation (rollout_engine trl, or a chat template)"
    if torch.cuda.is_available():
        return "a CUDA device"
    if recipe.top_p < 1.0:
        return "top_p < 1"
    if trainer.args.steps_per_generation != 1 or trainer.num_iterations != 1:
        return "several optimiser passes per generated batch"
    if recipe.replay > 0:  # the pool swaps its prompts into each step's: a launched batch would never be the step's
        return "replay mixes pooled prompts into each step"
    return None


_PIPELINES_OPEN = [0]  # pipelined GRPO calls training in this process now (`pipeline_active`)


def pipeline_active() -> bool:
    """Whether a GRPO call in this process is training with its rollouts in a background thread right now: a
    callback that times steps at other thread counts (`harness.threads.step_trial`) would time both loops."""
    return _PIPELINES_OPEN[0] > 0


def pipeline_wanted(recipe: Recipe) -> bool:
    """Whether a GRPO call overlaps its steps (before `pipelinable`'s check of the trainer): `recipe.pipeline` when it
    says so; under auto, when this process's cores leave its torch thread count idle for the rollout loop
    (`policies.spare_cores`). Decided once per call, when the trainer is built."""
    if recipe.pipeline != "auto":
        return bool(recipe.pipeline)
    from policies import spare_cores

    return spare_cores() >= torch.get_num_threads()


def _pipelined_trainer(base, tok, recipe: Recipe):
    """GRPOTrainer whose next step's rollouts are generated while a step trains (`Recipe.pipeline`, `_Pipeline`).
    Innermost of the trainer's wrappers: it sees the prompts a step really scores (after a replay pool's mix)."""

    class PipelinedGRPOTrainer(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.peek = None
            self._ready = None
            why = pipelinable(self, recipe)
            self._pipe = _Pipeline(copy.deepcopy(tok), recipe) if why is None else None
            if self._pipe is not None:
                _PIPELINES_OPEN[0] += 1
            if why is not None and recipe.pipeline is True:
                warnings.warn(f"recipe.pipeline: the steps run in turn ({why})", stacklevel=2)

        def get_train_dataloader(self):
            loader = super().get_train_dataloader()
            return _Peeking(loader, self) if self._pipe is not None else loader

        def _generate_and_score_completions(self, inputs):
            if self._pipe is None or not self.model.training:
                return super()._generate_and_score_completions(inputs)
            ready = self._pipe.take([r["prompt"] for r in inputs])
            step = self.state.global_step
            if step + 1 < self.state.max_steps:  # the next step's rollouts, from the weights before this update
                self._pipe.launch(self.accelerator.unwrap_model(self.model_wrapped), self.peek, step + 1)
            self._ready = ready
            try:
                batch = super()._generate_and_score_completions(inputs)
            finally:
                self._ready = None
            if ready is not None:  # one update off-policy: the ratio is taken against the sampling policy
                batch["old_per_token_logps"] = batch["sampling_per_token_logps"]
            self._metrics["train"]["pipelined"].append(float(ready is not None))
            return batch

        def close_pipeline(self) -> None:
            if self._pipe is not None:
                self._pipe.close()
                self._pipe = None
                _PIPELINES_OPEN[0] -= 1

    return PipelinedGRPOTrainer


def _check_rows(rows: list[dict[str, Any]]) -> None:
    if not rows:
        raise RecipeError("train_grpo got no prompts; pass rows like {'prompt': ..., 'instance': ...}")
    if any("prompt" not in r for r in rows[:50]):
        raise RecipeError("every GRPO row needs a 'prompt' key (raw task text)")
    if "prompt_text" in rows[0]:
        raise RecipeError("'prompt_text' is reserved by train_grpo; rename that column")


CISPO_EPSILON_HIGH = 5.0  # CISPO's cap on the importance weight (ScaleRL's epsilon_max; TRL's recommended value)


def epsilon_high(recipe: Recipe) -> float:
    """TRL's `epsilon_high` for the recipe. Unset, TRL takes `epsilon` (0.2), which for cispo caps the importance
    weight itself at 0.2, not at 1.2: every token's weight min(ratio, 0.2) = 0.2, the gradient a fifth of the loss's
    and the ratio never read. So cispo's default is its own cap."""
    if recipe.epsilon_high is not None:
        return recipe.epsilon_high
    return CISPO_EPSILON_HIGH if recipe.loss_type == "cispo" else recipe.epsilon


def _grpo_trainer(model, tok, rows: list[dict[str, Any]], reward, recipe: Recipe, out_dir: str | Path | None,
                  callbacks: list) -> Any:
    """The GRPOTrainer of a stage: our recipe mapped onto GRPOConfig, the KL reference pointed at the stage's start,
    and our rollout engine plugged in (unless the recipe or a chat template asks for TRL's own generation)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    chat = has_chat_template(tok)
    data = [{**r, "prompt_text": r["prompt"],
             "prompt": [{"role": "user", "content": r["prompt"]}] if chat else format_prompt(tok, r["prompt"])}
            for r in rows]
    args = GRPOConfig(
        **_common_args(_scratch_dir(out_dir), recipe, recipe.lr_schedule), learning_rate=recipe.learning_rate,
        beta=recipe.beta,
        num_generations=recipe.num_generations, temperature=recipe.temperature, top_p=recipe.top_p,
        max_completion_length=recipe.max_completion_length, max_steps=recipe.steps,
        per_device_train_batch_size=recipe.batch_size * recipe.oversample, loss_type=recipe.loss_type, scale_rewards=recipe.scale_rewards,
        epsilon=recipe.epsilon, epsilon_high=epsilon_high(recipe), num_iterations=recipe.num_iterations,
        mask_truncated_completions=recipe.mask_truncated_completions, log_completions=False,
        remove_unused_columns=False, chat_template_kwargs=dict(CHAT_TEMPLATE_KWARGS),
    )
    if recipe.beta > 0:  # TRL builds the KL reference from config._name_or_path: point it at this stage's start
        ref_dir = Path(_scratch_dir(None)) / "reference"
        save_policy(model, tok, ref_dir)
        model.config._name_or_path = str(ref_dir)
    use_ours = recipe.rollout_engine == "policies" and not chat
    cls = _shared_prompt_trainer(GRPOTrainer) if recipe.shared_prompt_loss else GRPOTrainer
    if pipeline_wanted(recipe):
        cls = _pipelined_trainer(cls, tok, recipe)
    if recipe.drop_dead_groups:
        cls = _live_groups_trainer(cls, recipe)
    elif recipe.prune_dead_groups:
        cls = _pruned_trainer(cls, recipe)
    return cls(model=model, reward_funcs=[reward], args=args, train_dataset=Dataset.from_list(data),
               processing_class=tok, callbacks=callbacks,
               rollout_func=_rollout_func(tok, recipe) if use_ours else None)


# --- the loss's log-probabilities, each prompt once and no padding -----------------------------------------------------


def length_buckets(lengths: list[int], overhead: int = 64) -> list[list[int]]:
    """Rows grouped into micro-batches of similar length: rows sorted by length, split where it minimises
    sum(rows x longest) + `overhead` per micro-batch (the fixed cost of a forward and backward, in row-positions),
    by dynamic programming over the sorted order. Returns lists of row indices, shortest first."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    ls = [max(1, lengths[i]) for i in order]
    n = len(ls)
    best, cut = [0] + [None] * n, [0] * (n + 1)
    for j in range(1, n + 1):  # best[j]: cost of the first j sorted rows; the last bucket is rows i..j-1
        best[j], cut[j] = min((best[i] + (j - i) * ls[j - 1] + overhead, i) for i in range(j))
    out, j = [], n
    while j > 0:
        out.append(order[cut[j]:j])
        j = cut[j]
    return out[::-1]


def shared_prompt_supported(model) -> bool:
    """The loss's shared-prompt forward needs a decoder whose backbone takes a KV cache and whose logits are a plain
    projection of the last hidden state: the Llama architecture (our presets and Llama checkpoints)."""
    cfg = model.config
    return getattr(cfg, "model_type", None) == "llama" and not getattr(cfg, "final_logit_softcapping", None)


def shared_prompt_logps(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                        completion_mask: torch.Tensor, temperature: float = 1.0,
                        compute_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probabilities of the completions (B x C, 0 at padding), the values TRL's GRPO loss computes with
    one forward over every prompt + padded completion, but with each distinct prompt computed once: the distinct
    prompts go through the model with a KV cache (gradients flow through it), then the completions, bucketed by
    length (`length_buckets`), attend to their prompt's cached keys and values. A GRPO batch of 8 groups of 8 with
    40-token prompts and 20-token completions under a 70-token longest one runs ~4x fewer positions. Rows may come
    in any order (TRL shuffles a generation batch before the loss); rows whose prompts are equal share one.
    Entropies (no gradient) when asked."""
    from transformers import DynamicCache

    b, c = completion_ids.shape
    core, head = model.model, model.get_output_embeddings()
    uniq, owner = torch.unique(torch.cat([prompt_ids, prompt_mask], dim=1), dim=0, return_inverse=True)
    p = prompt_ids.shape[1]
    cache = DynamicCache(config=model.config)
    hidden = core(input_ids=uniq[:, :p], attention_mask=uniq[:, p:], **cache_kw(core, cache), use_cache=True
                  ).last_hidden_state[:, -1]  # predicts each completion's first token
    lengths = [int(x) for x in completion_mask.sum(1).tolist()]
    logps = completion_ids.new_zeros((b, c), dtype=torch.float32)
    entropies = logps.new_zeros((b, c)) if compute_entropy else None
    for rows in length_buckets(lengths):
        width = max(1, max(lengths[i] for i in rows))
        idx = torch.tensor(rows, device=prompt_ids.device)
        src = owner[idx]
        sub = DynamicCache(config=model.config)
        for i, layer in enumerate(cache.layers):
            sub.layers[i].update(layer.keys[src], layer.values[src])
        ids, cmask = completion_ids[idx, :width], completion_mask[idx, :width]
        out = core(input_ids=ids, attention_mask=torch.cat([prompt_mask[idx], cmask], dim=1), **cache_kw(core, sub),
                   use_cache=True, position_ids=torch.arange(p, p + width, device=ids.device).expand(len(rows), -1)
                   ).last_hidden_state
        h = torch.cat([hidden[src][:, None], out[:, :-1]], dim=1)  # the state before each completion token
        lp = (head(h).float() / temperature).log_softmax(-1)
        piece = lp.gather(-1, ids[..., None]).squeeze(-1) * cmask
        logps = logps.index_put((idx[:, None], torch.arange(width, device=idx.device)[None]), piece)
        if compute_entropy:
            with torch.no_grad():
                entropies[idx, :width] = -(lp.exp() * lp).sum(-1) * cmask
    return logps, entropies


def _shared_prompt_trainer(base):
    """GRPOTrainer whose loss log-probabilities come from `shared_prompt_logps` (each distinct prompt once, no
    completion padding) for Llama-architecture text models; anything else goes through TRL's own forward."""

    class SharedPromptGRPOTrainer(base):
        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                               batch_size=None, compute_entropy=False, compute_aux_loss=False,
                                               **extra):
            core = self.accelerator.unwrap_model(model)
            if compute_aux_loss or any(v is not None for v in extra.values()) or not shared_prompt_supported(core) \
                    or getattr(core, "is_gradient_checkpointing", False):  # checkpointing turns the KV cache off
                return super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                    compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **extra)
            k = logits_to_keep
            with self.accelerator.autocast():  # as TRL's forward runs (bf16 on a GPU that supports it)
                logps, ent = shared_prompt_logps(core, input_ids[:, :-k], attention_mask[:, :-k], input_ids[:, -k:],
                                                 attention_mask[:, -k:], self.temperature, compute_entropy)
            return logps, ent, None

    return SharedPromptGRPOTrainer


def live_group_mask(advantages: torch.Tensor, group: int, exact: bool = True) -> torch.Tensor:
    """Per group (rows contiguous, `group` each): whether it is live; a NaN counts as live, so a bad reward is never
    dropped out of sight. `exact`: live when any advantage is nonzero, the loss's own terms (`prune_dead_groups`
    drops only rows that add exactly nothing). Else live when its advantages are not all equal: the rewards of a tied
    group are equal, so are its advantages, but their float32 mean can miss them by a unit in the last place, which
    the std's epsilon turns into a small advantage shared by every member (all-valid groups at reward 1/6 or at
    `reward_scale` 0.3: +1.5e-4 to +3e-4 each), and such a group is no live group for `drop_dead_groups` or the
    replay pool to keep in place of one whose rewards differ."""
    v = advantages.view(-1, group)
    if exact:
        return (v != 0).any(dim=1)
    return (v.amax(dim=1) != v.amin(dim=1)) | torch.isnan(v).any(dim=1)


def _loss_mask(batch: dict[str, Any]) -> torch.Tensor:
    """The tokens the GRPO loss counts: completion tokens, less tool-call tokens when there are any."""
    tool = batch.get("tool_mask")
    return batch["completion_mask"] if tool is None else batch["completion_mask"] * tool


def keep_live_groups(batch: dict[str, Any], group: int, keep: int,
                     renormalise: bool = True) -> tuple[dict[str, Any], int]:
    """Rows of the first `keep` groups of `batch` (a scored GRPO generation batch, groups contiguous) whose advantages
    are not all zero; a group whose rewards tie has zero advantage for every member, so it adds nothing to the policy
    gradient. Every per-row tensor or list is sliced and, with `renormalise`, the token count behind the loss
    normaliser recomputed over the kept rows (`drop_dead_groups`); without it the whole batch's count is kept, so a
    token-normalised loss is the whole batch's exactly (`prune_dead_groups`). When no group is live one group is kept,
    so the step still runs (with a zero policy gradient). Returns (batch, live)."""
    adv = batch["advantages"]
    n = adv.shape[0]
    live = live_group_mask(adv, group, exact=not renormalise).nonzero().flatten()[:keep]
    chosen = live if live.numel() else torch.zeros(1, dtype=torch.long)
    rows = (chosen[:, None] * group + torch.arange(group)).flatten()
    out: dict[str, Any] = {}
    for k, v in batch.items():
        if isinstance(v, torch.Tensor) and v.ndim > 0 and v.shape[0] == n:
            out[k] = v[rows]
        elif isinstance(v, list) and len(v) == n:
            out[k] = [v[i] for i in rows.tolist()]
        else:
            out[k] = v
    mask = _loss_mask(out)
    width = int(mask.sum(0).nonzero().max()) + 1 if mask.any() else 1  # drop all-padding columns
    for k in ("completion_ids", "completion_mask", "old_per_token_logps", "sampling_per_token_logps",
              "ref_per_token_logps", "tool_mask", "importance_sampling_ratio"):
        v = out.get(k)
        if isinstance(v, torch.Tensor) and v.ndim == 2 and v.shape[1] > width:
            out[k] = v[:, :width]
    if renormalise:
        out["num_items_in_batch"] = mask[:, :width].sum().to(batch["num_items_in_batch"].dtype) \
            if isinstance(batch.get("num_items_in_batch"), torch.Tensor) else mask.sum()
    return out, int(live.numel())


# what a pruned batch's loss is scaled by to equal the whole batch's, per TRL 1.x loss type (`GRPOTrainer.
# _compute_loss`): None for the types normalised by the generation batch's token count (`num_items_in_batch`, which
# a pruned batch keeps); "rows" for those averaging over the rows they are given (grpo: a mean of per-row means;
# dr_grpo: sum / (rows x max length)); "tokens" for bnpo (sum / the given batch's tokens)
_PRUNED_SCALE: dict[str, str | None] = {"dapo": None, "cispo": None, "grpo": "rows", "dr_grpo": "rows",
                                        "bnpo": "tokens"}


def prunable(trainer) -> str | None:
    """Why the dead groups of this trainer's batches cannot leave its loss exactly (None: they can). A tied group's
    rows have zero advantage, so their policy-gradient terms vanish; what else a row adds must vanish too or be
    independent of the row: no KL term (beta 0), no entropy mask or bonus over the batch, no vLLM importance
    correction, one optimiser pass per generation batch and a loss type whose normaliser `_PRUNED_SCALE` restores."""
    args = trainer.args
    if trainer.beta != 0.0:
        return "beta > 0 (a tied row's KL term is not zero)"
    if getattr(trainer, "top_entropy_quantile", 1.0) < 1.0 or getattr(trainer, "_entropy_bonus_enabled", False):
        return "an entropy mask or bonus over the batch"
    if getattr(trainer, "use_vllm", False):
        return "vLLM importance correction"
    if trainer.loss_type not in _PRUNED_SCALE:
        return f"loss_type {trainer.loss_type}"
    if args.steps_per_generation != 1 or args.gradient_accumulation_steps != 1:
        return "a generation batch split over several optimiser micro-steps"
    return None


def _pruned_trainer(base, recipe: Recipe):
    """GRPOTrainer whose loss forward and backward skip the groups whose rewards all tie (`keep_live_groups` without
    renormalising, the loss rescaled per `_PRUNED_SCALE`): the gradient of the whole batch, computed on its live rows.
    Falls back to the whole batch where `prunable` says it would not be exact."""
    group = recipe.num_generations

    class PrunedGRPOTrainer(base):
        def _generate_and_score_completions(self, inputs):
            batch = super()._generate_and_score_completions(inputs)
            if not self.model.training or prunable(self) is not None:
                return batch
            n = batch["advantages"].shape[0]
            out, live = keep_live_groups(batch, group, n // group, renormalise=False)
            self._metrics["train"]["live_groups"].append(float(live))
            by = _PRUNED_SCALE[self.loss_type]
            scale = 1.0 if by is None else out["advantages"].shape[0] / n if by == "rows" \
                else float(_loss_mask(out).sum()) / float(_loss_mask(batch).sum().clamp(min=1))
            out["_loss_scale"] = torch.tensor(scale)  # 0-dim: TRL's shuffle and split of a batch pass it through whole
            return out

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
            scale = inputs.get("_loss_scale") if isinstance(inputs, dict) else None
            return loss if scale is None or float(scale) == 1.0 else loss * float(scale)

    return PrunedGRPOTrainer


class ReplayPool:
    """Prompts whose GRPO groups were live (rewards differ) in recent steps, most recent first, at most `size`.
    `mix` replaces the last groups of a step's sampled inputs (groups contiguous, `group` rows each) with pool
    prompts, drawn without replacement by a seeded generator; `add` records the live groups of a scored batch (a
    prompt live again moves to the front; the oldest fall off)."""

    def __init__(self, size: int, share: float, group: int, seed: int) -> None:
        import random

        self.size, self.share, self.group = size, share, group
        self.rng = random.Random(seed)
        self.items: list[dict[str, Any]] = []

    @staticmethod
    def _key(row: dict[str, Any]) -> str:
        return str(row.get("prompt_text", row.get("prompt")))

    def mix(self, inputs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
        groups = len(inputs) // self.group
        fresh = {self._key(inputs[g * self.group]) for g in range(groups)}
        pool = [r for r in self.items if self._key(r) not in fresh]
        k = min(round(self.share * groups), len(pool))
        if k == 0:
            return inputs, 0
        picked = self.rng.sample(pool, k)
        head = inputs[: (groups - k) * self.group]
        return head + [dict(r) for r in picked for _ in range(self.group)], k

    def add(self, inputs: list[dict[str, Any]], live: list[int]) -> None:
        rows = [inputs[g * self.group] for g in live]
        keys = {self._key(r) for r in rows}
        self.items = (rows + [r for r in self.items if self._key(r) not in keys])[: self.size]


def _live_groups_trainer(base, recipe: Recipe):
    """GRPOTrainer that trains on informative groups only (`keep_live_groups`), logging `live_groups` per step; with
    `recipe.replay` a share of each step's groups are prompts that were live recently (`ReplayPool`)."""
    group, keep = recipe.num_generations, recipe.batch_size // recipe.num_generations
    pool = ReplayPool(recipe.replay_pool, recipe.replay, group, recipe.seed) if recipe.replay > 0 else None

    class LiveGroupsGRPOTrainer(base):
        def _generate_and_score_completions(self, inputs):
            split = "train" if self.model.training else "eval"
            replayed = 0
            if pool is not None and self.model.training:
                inputs, replayed = pool.mix(list(inputs))
            batch = super()._generate_and_score_completions(inputs)
            if pool is not None and self.model.training:
                adv = batch["advantages"]
                pool.add(inputs, live_group_mask(adv, group, exact=False).nonzero().flatten().tolist())
                self._metrics[split]["replayed_groups"].append(float(replayed))
            out, live = keep_live_groups(batch, group, keep)
            self._metrics[split]["live_groups"].append(float(live))
            return out

    return LiveGroupsGRPOTrainer


def train_grpo(model, tok, rows: list[dict[str, Any]], reward_fn: RewardFn, recipe: Recipe,
               out_dir: str | Path | None = None, progress: Progress | None = None,
               callbacks: list | None = None, tensorboard_dir: str | Path | None = None) -> GRPOMetrics:
    """GRPO on `rows` (each a dict with a raw-text "prompt" plus any extra columns for the reward function).
    `callbacks`: extra transformers TrainerCallbacks (e.g. one that stops at a time budget). `tensorboard_dir`: write
    TensorBoard event files there (reward, dead-group share, KL, completion length, loss, learning rate per step)."""
    _check_rows(rows)
    quiet()
    counter = [0]
    sink: list[dict] = []
    steps: list[GRPOStep] = []
    seen = [0]  # tokens counted up to the previous step

    unscale = 1.0 / recipe.reward_scale  # TRL logs the rewards `_wrap_reward` scaled; a step records the task's own

    def _record(stage, step, total, logs):
        steps.append(GRPOStep(
            step=step, reward_mean=logs.get("reward", float("nan")) * unscale,
            reward_std=logs.get("reward_std", float("nan")) * unscale,
            dead_group_share=logs.get("frac_reward_zero_std", float("nan")),
            completion_length=logs.get("completions/mean_length", float("nan")), kl=logs.get("kl"),
            loss=logs.get("loss"), seconds=sink[-1]["_seconds"], tokens_generated=counter[0] - seen[0],
            live_groups=logs.get("live_groups"), replayed_groups=logs.get("replayed_groups"),
            generation_seconds=logs.get("generation_seconds"), clipped_ratio=logs.get("completions/clipped_ratio"),
            pipelined=logs.get("pipelined"),
        ))
        seen[0] = counter[0]
        if progress is not None:
            progress(stage, step, total, logs)

    trainer = _grpo_trainer(model, tok, rows, _wrap_reward(reward_fn, recipe.reward_scale, counter), recipe, out_dir,
                            [_callback("grpo", recipe.steps, _record, sink), *(callbacks or []),
                             *tensorboard_callbacks(tensorboard_dir)])
    try:
        wall = _train(trainer, model, tok, out_dir)
    finally:
        if hasattr(trainer, "close_pipeline"):
            trainer.close_pipeline()
    return GRPOMetrics(steps=steps, wall_s=wall, tokens_generated=counter[0],
                       out_dir=str(out_dir) if out_dir else None)


# --- plumbing check: does the trainer score what the sampler drew? ----------------------------------------------------


class LogprobCheck(BaseModel):
    """Agreement of one GRPO batch's sampling distribution with the trainer's log-probabilities of the same tokens."""

    model_config = ConfigDict(extra="forbid")
    engine: str = Field(..., description="the rollout engine that sampled the batch (policies or trl)")
    completions: int
    tokens: int = Field(..., description="completion tokens compared (eos included, padding excluded)")
    max_abs_diff: float = Field(..., description="max over tokens of |log p_sampler - log p_trainer|")
    mean_abs_diff: float
    max_ratio_dev: float = Field(..., description="max |importance ratio - 1| at the first optimiser iteration")


def check_logprobs(model, tok, prompts: list[str], recipe: Recipe) -> LogprobCheck:
    """Sample one GRPO batch inside a real GRPOTrainer built exactly as `train_grpo` builds it, then compare, token by
    token, the log-probability under the distribution the rollout engine sampled from (temperature and top-p applied)
    with the one the trainer computes for the loss, and the importance ratio of the first optimiser iteration.

    Catches prompt formatting, BOS/EOS, padding, mask and temperature disagreements between sampler and trainer (any
    of them makes GRPO optimise a different distribution from the one it samples). `recipe.rollout_engine` picks the
    engine; for TRL's own `model.generate` the processed scores of the draw are captured. Nothing is trained."""
    quiet()
    g = recipe.num_generations
    n_prompts = recipe.batch_size // g
    if len(prompts) < n_prompts:
        raise RecipeError(f"check_logprobs needs {n_prompts} prompts (batch_size / num_generations), got {len(prompts)}")
    rows = [{"prompt": p} for p in prompts[:n_prompts]]
    trainer = _grpo_trainer(model, tok, rows, _wrap_reward(lambda p, c, **kw: [0.0] * len(c), 1.0, [0]),
                            recipe.model_copy(update={"steps": 1, "drop_dead_groups": False, "oversample": 1}), None, [])
    engine = "policies" if trainer.rollout_func is not None else "trl"
    captured: list[torch.Tensor] = []
    if engine == "trl":  # record the processed scores (the sampling distribution) of TRL's own generate call
        plain = model.generate

        def generate(*args, generation_config, **kw):
            cfg = copy_config(generation_config, output_scores=True, return_dict_in_generate=True)
            out = plain(*args, generation_config=cfg, **kw)
            captured.append(torch.stack(out.scores, dim=1).float().log_softmax(-1))
            return out.sequences

        model.generate = generate
    try:
        trainer.model.train()
        inputs = [dict(trainer.train_dataset[i]) for i in range(n_prompts) for _ in range(g)]
        out = trainer._generate_and_score_completions(inputs)
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        attn = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        keep = out["completion_ids"].size(1)
        with torch.no_grad():
            old = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attn, keep)[0]
        new = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attn, keep)[0].detach()
    finally:
        if hasattr(trainer, "close_pipeline"):  # as `train_grpo` does: else `pipeline_active` stays true for good
            trainer.close_pipeline()
        model.__dict__.pop("generate", None)
        unpatch_forward(model)
        _drop_scratch()
        model.eval()
    old = out.get("old_per_token_logps", old)
    mask = out["completion_mask"].bool()
    if engine == "policies":
        sampled = out["sampling_per_token_logps"]
    else:
        scores = captured[0][:, :keep]
        sampled = scores.gather(-1, out["completion_ids"][:, : scores.size(1), None]).squeeze(-1)
    diff = (sampled - old).abs()[mask]
    ratio_dev = ((new - old).exp() - 1).abs()[mask]
    return LogprobCheck(engine=engine, completions=int(mask.size(0)), tokens=int(mask.sum()),
                        max_abs_diff=float(diff.max()), mean_abs_diff=float(diff.mean()),
                        max_ratio_dev=float(ratio_dev.max()))


def copy_config(config, **update):
    import copy

    out = copy.deepcopy(config)
    for k, v in update.items():
        setattr(out, k, v)
    return out
