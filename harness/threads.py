"""The run process's torch CPU threads (`scale.threads`): a number, `default` (leave torch's setting as it is), or
`auto` (the default), measured once per host and model shape and cached in `$EVOTRAINER_HOME/threads.json`. The
environment variable `EVOTRAINER_THREADS` (same values) overrides the config (the test suite sets `default`, so its
arithmetic does not depend on the host's measurement).

    n, why = apply_threads(run.config, run.task)     # at every start and resume of a run, before anything trains
    with sft_threads(run.config, run.task, tok, pairs, batch=32):   # the SFT warm start's own choice, then back

`auto` times the step's shapes (`policies.threads.time_threads`: a forward+backward and a decoding run over a
GRPO-sized batch) at 1, 2, 4, ... threads up to the cores this process may use, on a randomly initialised model of the
run's architecture (10-20 s for the tiny preset on 2 cores), and keeps the fewest threads that no larger count beats
by more than MARGIN (`pick`); a later run on the same host with the same model shape and torch version
reads the cache. Why: for the project's small models the best count depends on the host (one thread about twice as
fast as two on this AMD host for the tiny preset, two faster on the Intel host of earlier sessions), and torch's
default (every core) was the slow one here. Models above AUTO_MAX_PARAMS, and runs on a GPU, keep torch's default.
Arms on Ray use their own `arm_resources.num_cpus` threads, as before. The SFT warm start is measured apart
(`sft_threads`: its forward+backward at its batch and the demonstrations' length, no decoding) and runs at its own
choice, then the run's count is restored. The measurement is taken on the machine as it
is at that moment: one taken while other jobs held the cores sticks until `threads.json` is deleted.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

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


def cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


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


def _write_cache(data: dict[str, Any]) -> None:
    p = cache_path()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(p)
    except OSError:  # a read-only home: measure again next time
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
    """A model of the run's architecture with random weights (cheap at the sizes `auto` measures), or None with the
    reason when `auto` keeps torch's default."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from policies.model import build_model

    pol = run_config.policy
    if pol.checkpoint:
        try:
            cfg = AutoConfig.from_pretrained(pol.checkpoint)
        except Exception as exc:  # noqa: BLE001 - the policy's own load reports a bad checkpoint properly
            return None, f"its config could not be read ({type(exc).__name__})"
        sig, params = _shape(cfg)
        if params > AUTO_MAX_PARAMS:
            return None, f"a {params / 1e6:.0f}M-parameter model uses every core"
        return (sig, lambda: AutoModelForCausalLM.from_config(cfg)), None
    model, _ = build_model(pol.preset, task.spec.alphabet, words=list(task.spec.words))
    sig, params = _shape(model.config)
    if params > AUTO_MAX_PARAMS:
        return None, f"a {params / 1e6:.0f}M-parameter model uses every core"
    return (sig, lambda: model), None


def apply_threads(run_config: Any, task: Any) -> tuple[int, str]:
    """Set this process's torch threads from `scale.threads`; returns (threads, why) for the run's log."""
    import torch

    from policies import cpu_threads

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
    if torch.cuda.is_available():
        return torch.get_num_threads(), "a GPU trains: torch's default"
    n_cores = cores()
    if n_cores <= 1:
        cpu_threads(1)
        return 1, "one core"
    made, why = _measurement_model(run_config, task)
    if made is None:
        return torch.get_num_threads(), f"torch's default ({why})"
    sig, build = made
    best, why = _choice(f"{host_key()}|{sig}", lambda: time_threads_for(build(), options(n_cores)), "probe step",
                        "this model shape")
    cpu_threads(best)
    return best, why


def _choice(key: str, measure, what: str, shape: str) -> tuple[int, str]:
    """(threads, why) for the cache `key`: the cached choice when one is valid on this host, else `measure()`d now
    (seconds per thread count), `pick`ed and cached."""
    cache = _read_cache()
    hit = cache.get(key)
    if isinstance(hit, dict) and isinstance(hit.get("threads"), int) and 1 <= hit["threads"] <= cores():
        return hit["threads"], f"measured on this host for {shape} ({cache_path()})"
    secs = measure()
    best = pick(secs)
    cache[key] = {"threads": best, "seconds": {str(k): round(v, 5) for k, v in secs.items()},
                  "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
    _write_cache(cache)
    shown = ", ".join(f"{k}: {v * 1000:.0f} ms" for k, v in secs.items())
    return best, f"measured now, per {what} {shown}; cached in {cache_path()}"


def time_threads_for(model: Any, opts: list[int], **shape: int) -> dict[int, float]:
    from policies.threads import time_threads

    return time_threads(model, opts, **shape)


def _auto_wanted(run_config: Any) -> bool:
    env = os.environ.get(ENV, "").strip()
    return (env or run_config.scale.threads) == "auto"


def sft_threads(run_config: Any, task: Any, tok: Any, pairs: list[dict[str, str]], batch: int,
                say=lambda msg: None):
    """The SFT warm start's own thread count under `scale.threads: auto`, as a context manager that sets it for
    the SFT and restores the run's count after: the SFT's forward+backward over `batch` demonstrations of their
    median length is measured at 1, 2, ... threads (no decoding) and cached per host, model shape and that shape.
    Why a second choice: the GRPO probe's small decode-dominated shapes chose 1 thread on this AMD host, where the
    SFT's long fixed batches run faster on 2 (BENCHMARKS.md, "Threads chosen per host"). A number, `default`, a GPU,
    one core or a large model: nothing changes (a no-op context). `say(message)` is called once with the choice."""
    from contextlib import contextmanager, nullcontext

    import torch

    from policies import cpu_threads

    if not _auto_wanted(run_config) or torch.cuda.is_available() or cores() <= 1 or not pairs:
        return nullcontext()
    made, why = _measurement_model(run_config, task)
    if made is None:
        return nullcontext()
    sig, build = made
    lengths = sorted(len(tok(x["prompt"] + x["completion"], add_special_tokens=False)["input_ids"])
                     for x in pairs[:64])
    seq = max(8, -(-lengths[len(lengths) // 2] // 16) * 16)  # the median, rounded up to 16 (a stable cache key)
    best, why = _choice(f"{host_key()}|{sig}|sft:b{batch}:s{seq}",
                        lambda: time_threads_for(build(), options(cores()), batch=batch, seq=seq, decode_steps=0),
                        f"SFT step ({batch} x {seq} tokens)", "this model and SFT shape")
    was = torch.get_num_threads()
    say(f"torch threads for the SFT warm start: {best} ({why}); {was} again after it")

    @contextmanager
    def phase():
        cpu_threads(best)
        try:
            yield best
        finally:
            cpu_threads(was)

    return phase()
