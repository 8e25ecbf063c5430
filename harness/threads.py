"""The run process's torch CPU threads (`scale.threads`): a number, `default` (leave torch's setting as it is), or
`auto` (the default), measured once per host, model and step shape and cached in `$EVOTRAINER_HOME/threads.json`. The
environment variable `EVOTRAINER_THREADS` (same values) overrides the config (the test suite sets `default`, so its
arithmetic does not depend on the host's measurement).

    n, why = apply_threads(run.config, run.task)     # at every start and resume of a run, before anything trains
    n, why = sft_threads(run.config, run.task)      # the SFT warm start's own count (None: the run's), fixed

`auto` times the run's GRPO step (`policies.threads.time_step`: the prefill, compact decoding and shared-prompt loss
forward and backward the step runs, at its shapes: `step_shape`, from the round-0 recipe's batch and the expert
answers' token lengths on a few round-0 instances) at 1, 2, 4, ... threads up to the cores this process may use, on a
randomly initialised model of the run's architecture (about 10 s for the tiny preset on 2 cores), and keeps the fewest
threads that no larger count beats by more than MARGIN (`pick`); a later run on the same host with the same model
shape, step shape and torch version reads the cache. Why: for the project's small models the best count depends on the
host (one thread about twice as fast as two on an AMD host for the tiny preset, two faster on the Intel host of
earlier sessions), and torch's default (every core) was the slow one there. Models above AUTO_MAX_PARAMS, and runs on
a GPU, keep torch's default. Arms on Ray use their own `arm_resources.num_cpus` threads, as before. The SFT warm start
is not measured: under auto it trains on SFT_AUTO_THREADS (at most the cores; `sft_threads`), because its weights,
which the warm-start cache keeps across runs, depend on the thread count; then the run's count is restored. The
probe's choice is then checked on the run's first GRPO steps (`step_trial`: each count for a few real steps, under the
run's own other work on the cores) and the entry is marked confirmed with the step times; a confirmed choice is not
checked again. A measurement taken while other jobs held the cores sticks until `threads.json` is deleted.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from policies import cores, machine_cores  # this process's share of the cores; its machine's

AUTO_MAX_PARAMS = 50_000_000  # above this, matmuls are large enough to use every core: no measurement
ENV = "EVOTRAINER_THREADS"


MARGIN = 0.2  # more threads must beat fewer by this share of the probe's time to be chosen


def pick(secs: dict[int, float]) -> int:
    """The fewest threads whose probe time no larger count beats by more than MARGIN. Why a margin: on the 2-core AMD
    host the stage probe once measured 2 threads 12% faster (754 vs 665 ms) while the demo's stages then ran 135 s
    each on 2 threads against 91 s on 1 (BENCHMARKS.md); the SFT's probe, 34% faster on 2, matched its steps (1.87x).
    A small probe win does not survive the run's other work (the prefetch worker, Ray arms) on the same cores."""
    best = min(secs)
    for n in sorted(secs):
        if secs[n] < secs[best] * (1.0 - MARGIN):
            best = n
    return best


def options(n_cores: int) -> list[int]:
    """1, 2, 4, ... up to the cores, and the cores themselves."""
    out, n = [], 1
    while n < n_cores:
        out.append(n)
        n *= 2
    return [*out, n_cores]


def host_key() -> str:
    """This machine as far as thread speed goes: CPU model, usable cores, torch version."""
    import torch

    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model or 'unknown-cpu'}|{cores()} cores|torch {torch.__version__}"


def cache_path() -> Path:
    from skills.library import home

    return home() / "threads.json"


def _read_cache() -> dict[str, Any]:
    try:
        return json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}


def _update_cache(key: str, entry: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Set `threads.json`'s `key` to `entry(its entry now)`, the file read and written under an exclusive lock
    (`threads.json.lock`), so two processes measuring at once (a bench's side-by-side units, two runs) each keep their
    entry: without it, each read the file, added its own and wrote it back, and the later write dropped the earlier
    one's entry (a measurement lost, taken again by the next run). A home that cannot be written: measure again next
    time."""
    p = cache_path()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p.with_name(p.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            data = _read_cache()
            old = data.get(key)
            data[key] = entry(old if isinstance(old, dict) else {})
            tmp = p.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            tmp.replace(p)
    except OSError:
        pass


def _shape(config: Any) -> tuple[str, int]:
    """(a signature of the model's shape, an estimate of its parameters) from a transformers config."""
    h = int(getattr(config, "hidden_size", 0))
    layers = int(getattr(config, "num_hidden_layers", 0))
    mlp = int(getattr(config, "intermediate_size", 4 * h))
    vocab = int(getattr(config, "vocab_size", 0))
    params = layers * (4 * h * h + 3 * h * mlp) + vocab * h
    return f"{type(config).__name__}:h{h}:l{layers}:m{mlp}:v{vocab}", params


def _measurement_model(run_config: Any, task: Any):
    """((a signature of the model's shape, a builder of a model of the run's architecture with random weights: cheap
    at the sizes `auto` measures), the run's tokenizer), or (None, the reason `auto` keeps torch's default)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from policies.model import build_model, load_tokenizer

    pol = run_config.policy
    if pol.checkpoint:
        try:
            cfg = AutoConfig.from_pretrained(pol.checkpoint, local_files_only=True)  # never the Hub: a local run
        except Exception as exc:  # noqa: BLE001 - the policy's own load reports a bad checkpoint properly
            return None, f"its config could not be read ({type(exc).__name__})"
        sig, params = _shape(cfg)
        if params > AUTO_MAX_PARAMS:
            return None, f"a {params / 1e6:.0f}M-parameter model uses every core"
        try:
            tok = load_tokenizer(pol.checkpoint)
        except Exception as exc:  # noqa: BLE001 - as above
            return None, f"its tokenizer could not be read ({type(exc).__name__})"
        return (sig, lambda: AutoModelForCausalLM.from_config(cfg), tok), None
    model, tok = build_model(pol.preset, task.spec.alphabet, words=list(task.spec.words))
    sig, params = _shape(model.config)
    if params > AUTO_MAX_PARAMS:
        return None, f"a {params / 1e6:.0f}M-parameter model uses every core"
    return (sig, lambda: model, tok), None


SHAPE_INSTANCES = 16  # round-0 instances whose prompts and expert answers give the probe's token lengths
DEFAULT_LENGTHS = (64, 32)  # (prompt, completion) tokens when the task cannot say (its instances failed to generate)


def _round8(x: float) -> int:
    return max(8, 8 * round(x / 8))


def step_shape(task: Any, env: Any, recipe: Any, tok: Any, style: str) -> tuple[Any, str | None]:
    """(the `policies.threads.StepShape` of a GRPO step under `recipe` on `env`'s instances, a note when the lengths
    are a default). Rows from the recipe (prompts_per_step x num_generations decoded, batch_size trained); token
    lengths from the prompts and expert answers of SHAPE_INSTANCES train-split instances (a warm-started policy
    answers about as long as its teacher), completions capped at the recipe's budget, both rounded to a multiple of 8
    so a small change of board or problem mix reads the same cache entry."""
    from harness.policy_glue import sft_pairs
    from harness.seeds import seeds
    from policies.model import format_prompt
    from policies.threads import StepShape

    note = None
    try:
        pairs = sft_pairs(task, env, seeds("train", SHAPE_INSTANCES), style)
        prompt = sum(len(tok(format_prompt(tok, x["prompt"]))["input_ids"]) for x in pairs) / len(pairs)
        answer = sum(len(tok(x["completion"])["input_ids"]) + 1 for x in pairs) / len(pairs)  # + its end token
    except Exception as exc:  # noqa: BLE001 - the run's own generation reports a broken generator where it matters
        prompt, answer = DEFAULT_LENGTHS
        note = f"token lengths a default {DEFAULT_LENGTHS} ({type(exc).__name__} on the round-0 instances)"
    rows = recipe.prompts_per_step * recipe.num_generations
    return StepShape(prompts=recipe.prompts_per_step, rows=rows, loss_rows=recipe.batch_size,
                     prompt_len=_round8(prompt),
                     completion_len=min(_round8(answer), recipe.max_completion_length)), note


def _run_step_shape(run_config: Any, task: Any, tok: Any) -> tuple[Any, str | None]:
    """`step_shape` of the run's round-0 harness (its env and recipe, as the first stage trains on them)."""
    from harness.round0 import harness_models, round0_files

    env, recipe, _ = harness_models(round0_files(run_config), task)
    return step_shape(task, env, recipe, tok, run_config.style)


def _cache_key(sig: str, shape: Any) -> str:
    """`threads.json`'s key for a model shape and a step shape on this host: runs and benches read the same entry."""
    return f"{host_key()}|{sig}|{shape.key()}"


def _nothing_to_measure() -> tuple[int, str] | None:
    """(threads, why) where `auto` has nothing to measure: a GPU trains (torch's default) or one core (1, set)."""
    import torch

    from policies import cpu_threads

    if torch.cuda.is_available():
        return torch.get_num_threads(), "a GPU trains: torch's default"
    if cores() <= 1:
        cpu_threads(1)
        return 1, "one core"
    return None


def check_env() -> None:
    """Refuse a bad `EVOTRAINER_THREADS` or `EVOTRAINER_CORES` before a run makes its folder (`harness.lifecycle.
    start_run`): the same checks `apply_threads` and `policies.cores` make later, said before anything is written."""
    from policies import cores

    env = os.environ.get(ENV, "").strip()
    if env and env not in ("auto", "default"):
        try:
            n = int(env)
        except ValueError:
            raise ValueError(f"{ENV} must be auto, default or a number of threads, not {env!r}") from None
        if n < 1:
            raise ValueError(f"{ENV} must be at least 1, not {n}")
    cores()
    if any(os.environ.get(v) is not None for v in ("EVOTRAINER_VLLM_ENGINES", "EVOTRAINER_VLLM_GPU_MEMORY")):
        from policies.rollout import vllm_settings

        vllm_settings()
    if (h := os.environ.get("EVOTRAINER_HOME")) is not None and not h.strip():  # silently meant ~/.evotrainer
        raise ValueError("EVOTRAINER_HOME is set but empty; unset it to use ~/.evotrainer, or name a folder")
    from harness import evalcache, warmstart

    warmstart.enabled(), evalcache.enabled()  # the cache switches: a word that is neither on nor off is refused


def apply_threads(run_config: Any, task: Any) -> tuple[int, str]:
    """Set this process's torch threads from `scale.threads`; returns (threads, why) for the run's log."""
    import torch

    from policies import cpu_threads

    global _UNCONFIRMED
    _UNCONFIRMED = None
    env = os.environ.get(ENV, "").strip()
    want = env or run_config.scale.threads
    source = ENV if env else "scale.threads"
    if want == "default":
        return torch.get_num_threads(), f"{source}: default (as torch has it)"
    if want != "auto":
        try:
            n = int(want)
        except (TypeError, ValueError):
            raise ValueError(f"{source} must be auto, default or a number of threads, not {want!r}") from None
        if n < 1:
            raise ValueError(f"{source} must be at least 1, not {n}")
        cpu_threads(n)
        return n, source
    if (fixed := _nothing_to_measure()) is not None:
        return fixed
    n_cores = cores()
    made, why = _measurement_model(run_config, task)
    if made is None:
        return torch.get_num_threads(), f"torch's default ({why})"
    sig, build, tok = made
    shape, note = _run_step_shape(run_config, task, tok)
    key = _cache_key(sig, shape)
    best, why = _choice(key, lambda: time_threads_for(build(), options(n_cores), shape), "probe step",
                        "this model and step shape")
    if note:
        why = f"{why}; {note}"
    cpu_threads(best)
    _UNCONFIRMED = None if _read_cache().get(key, {}).get("confirmed") else key
    return best, why


def auto_for_model(model: Any, shape: Any) -> tuple[int, str]:
    """`auto` for a model already built outside a run (the benches: `bench ladder --threads auto`): the count a run of
    this model's shape and this step shape (`step_shape`) uses on this host (the same cache entry and measurement as
    `apply_threads`), set on this process; (threads, why)."""
    import torch

    from policies import cpu_threads

    if (fixed := _nothing_to_measure()) is not None:
        return fixed
    n_cores = cores()
    sig, params = _shape(model.config)
    if params > AUTO_MAX_PARAMS:
        return torch.get_num_threads(), f"torch's default (a {params / 1e6:.0f}M-parameter model uses every core)"
    best, why = _choice(_cache_key(sig, shape), lambda: time_threads_for(model, options(n_cores), shape),
                        "probe step", "this model and step shape")
    cpu_threads(best)
    return best, why


# --- the choice checked on the run's own GRPO steps ------------------------------------------------------------------

_UNCONFIRMED: str | None = None  # the cache key of this process's probe-based choice, until real steps confirm it
_SAID_PIPELINED = [False]  # step_trial said once that a pipelined run's steps are not a trial's to time
TRIAL_WARMUP = 2  # GRPO steps at the probe's choice before the trial (the first step pays one-off setup)
TRIAL_ROUNDS = 2  # each count runs 2 x TRIAL_ROUNDS steps, in ABBA order (a drift in step cost cancels)


def _now() -> float:
    return time.perf_counter()


def step_trial(say=lambda msg: None):
    """A transformers TrainerCallback that checks this process's probe-based thread choice on the GRPO steps it is
    about to run, or None when there is nothing to check (a number, `default`, a choice already confirmed, or this
    is not the process that made it: a Ray arm). Why: the probe times a step's shapes alone, and the run's steps share
    the cores with its own other work (the instance prefetch worker, Ray arms): on the 2-core AMD host the probe once
    said 2 threads were 12% faster while the demo's stages ran 48% slower on 2 (BENCHMARKS.md). After TRIAL_WARMUP
    steps, each thread count runs 2 x TRIAL_ROUNDS steps in ABBA order (at 2 counts, 8 steps: ~4 at the slower
    count), the median step times are `pick`ed (the same margin), the count is set for the rest of the run and the
    cache entry is marked confirmed with the step times, so later runs on this host skip the trial. A training call
    too short to finish the trial leaves the count and the cache as they were (the next call tries again). A call
    whose rollouts run in a background thread (`recipe.pipeline` auto on the core the probe's count leaves idle) is
    not a trial: at a higher count both loops would share the cores, and the comparison that matters, one thread
    pipelined against two in turn, is not one a trial can make within a call (on the demo's warm start, `bench grpo`:
    0.328 s a step pipelined at one thread, 0.435 in turn at two; a trial inside a pipelined call once chose two,
    BENCHMARKS.md forty-seventh session). `say(message)` is called once with the outcome."""
    if _UNCONFIRMED is None or cores() <= 1:
        return None
    import statistics

    import torch
    from transformers import TrainerCallback

    from policies import cpu_threads

    key, counts = _UNCONFIRMED, options(cores())
    order = [c for r in range(TRIAL_ROUNDS) for c in (counts if r % 2 == 0 else counts[::-1]) for _ in (0, 1)]
    was = torch.get_num_threads()

    class ThreadTrial(TrainerCallback):
        def __init__(self) -> None:
            self.times: dict[int, list[float]] = {c: [] for c in counts}
            self.t0: float | None = None
            self.done = False

        def on_train_begin(self, args, state, control, **kw):
            from policies.train import pipeline_active

            if pipeline_active():  # its steps time two loops: not the layouts the choice is between
                self.done = True
                if not _SAID_PIPELINED[0]:
                    _SAID_PIPELINED[0] = True
                    say(f"torch threads not checked on this run's GRPO steps: at {was} thread(s) they generate "
                        "the next step's rollouts on the core left idle (recipe.pipeline auto), which a trial at "
                        "other counts would share; the probe's choice stands")

        def _slot(self, step: int) -> int | None:
            i = step - TRIAL_WARMUP
            return order[i] if 0 <= i < len(order) and not self.done else None

        def on_step_begin(self, args, state, control, **kw):
            n = self._slot(state.global_step)
            if n is not None:
                cpu_threads(n)
                self.t0 = _now()

        def on_step_end(self, args, state, control, **kw):
            n = self._slot(state.global_step - 1)  # global_step counts the step that just ended
            if n is None or self.t0 is None:
                return
            self.times[n].append(_now() - self.t0)
            self.t0 = None
            if state.global_step - TRIAL_WARMUP == len(order):
                self._decide()

        def on_train_end(self, args, state, control, **kw):
            if not self.done:  # too few steps for the whole trial: as it was
                cpu_threads(was)

        def _decide(self) -> None:
            global _UNCONFIRMED
            self.done = True
            med = {c: statistics.median(t) for c, t in self.times.items() if t}
            best = pick(med)
            cpu_threads(best)
            _update_cache(key, lambda entry: {**entry, "threads": best,
                                              "confirmed": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                              "step_seconds": {str(c): round(v, 5) for c, v in med.items()}})
            _UNCONFIRMED = None
            shown = ", ".join(f"{c}: {v * 1000:.0f} ms" for c, v in med.items())
            say(f"torch threads checked on this run's GRPO steps (median per step {shown}): {best}"
                + (f" (the probe said {was})" if best != was else ", as the probe said") + f"; cached in {cache_path()}")

    return ThreadTrial()


def _choice(key: str, measure, what: str, shape: str) -> tuple[int, str]:
    """(threads, why) for the cache `key`: the cached choice when one is valid on this host, else `measure()`d now
    (seconds per thread count), `pick`ed and cached."""
    hit = _read_cache().get(key)
    if isinstance(hit, dict) and isinstance(hit.get("threads"), int) and 1 <= hit["threads"] <= cores():
        return hit["threads"], f"measured on this host for {shape} ({cache_path()})"
    secs = measure()
    best = pick(secs)
    mine = {"threads": best, "seconds": {str(k): round(v, 5) for k, v in secs.items()},
            "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
    # another process that measured (or confirmed) this key while this one timed keeps its entry: the first stands
    _update_cache(key, lambda entry: entry if isinstance(entry.get("threads"), int) else mine)
    shown = ", ".join(f"{k}: {v * 1000:.0f} ms" for k, v in secs.items())
    return best, f"measured now, per {what} {shown}; cached in {cache_path()}"


def time_threads_for(model: Any, opts: list[int], shape: Any) -> dict[int, float]:
    from policies.threads import time_step

    return time_step(model, opts, shape)


def _auto_wanted(run_config: Any) -> bool:
    env = os.environ.get(ENV, "").strip()
    return (env or run_config.scale.threads) == "auto"


SFT_AUTO_THREADS = 2  # the SFT warm start's thread count under auto (at most the cores): fixed, not measured


def sft_threads(run_config: Any, task: Any) -> tuple[int | None, str]:
    """(the torch thread count the SFT warm start trains at, why); None: the process's own count, unchanged.

    Under `scale.threads: auto` on a CPU with two or more cores the SFT trains on SFT_AUTO_THREADS (at most the cores),
    fixed rather than measured: the warm start's weights depend on the thread count (a matrix product's sums are split
    differently over 1 and 2 threads: differences of ~1e-6 a step that 700 steps grow into another warm start, 31.0%
    against 35.0% greedy on the demo's suite from two fresh clones on one host whose timing probe chose 1 and then 2,
    BENCHMARKS.md), and a measured choice flips where two counts time alike. Two was also the faster count for the
    SFT on every host measured (34% on the AMD host, 19-23% on the Intel one), and `harness.warmstart` keys its cache
    on the count, so a warm start is reused only where it would be trained the same. A number, `default`, a GPU, one
    core or a model above AUTO_MAX_PARAMS: the process's count. The machine's cores, not a worker's share
    (`EVOTRAINER_CORES`): a warm start trained in an experiment's worker at `--jobs 2` once took one thread and came
    out another checkpoint (23.2% against 22.8% greedy on the too-hard target, BENCHMARKS.md forty-seventh session)."""
    import torch

    if not _auto_wanted(run_config):
        return None, "scale.threads is not auto: the run's own count"
    if torch.cuda.is_available():
        return None, "a GPU trains"
    if machine_cores() <= 1:
        return None, "one core"
    made, why = _measurement_model(run_config, task)
    if made is None:
        return None, f"torch's default ({why})"
    n = min(SFT_AUTO_THREADS, machine_cores())  # not the worker's share: one warm start whatever the schedule
    return n, ("fixed under auto, not measured: the warm start's weights depend on the thread count, and its cache "
               "is keyed on it")
