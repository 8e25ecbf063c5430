"""The run process's torch threads (harness/threads.py, `scale.threads`): `auto` measures the run's model shape at
1, 2, ... threads on this host once, keeps the fastest and caches it; a number or `default` is applied as given; the
environment variable overrides the config; bad values name the field.

What these could catch: an `auto` that does not measure (no timings in the cache) or measures again on every start
(the second call must not time anything), a cache entry that is not keyed by the model shape (another preset must
measure again), a number that is not applied, a typo accepted silently.
"""

from __future__ import annotations

import json

import pytest
import torch

from harness.benchmarks.run import TINY
from harness.config import ConfigError, parse_config
from harness.tasks import get_task

MAPF = get_task("mapf")


@pytest.fixture
def restore_threads(monkeypatch, tmp_path):
    monkeypatch.delenv("EVOTRAINER_THREADS", raising=False)
    monkeypatch.delenv("EVOTRAINER_CORES", raising=False)  # these tests measure the host's cores, not a worker's share
    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    was = torch.get_num_threads()
    yield
    torch.set_num_threads(was)


def test_auto_measures_once_per_host_and_model_shape_and_keeps_the_fastest(restore_threads, monkeypatch):
    from harness import threads

    cfg = parse_config(TINY, "test")
    n, why = threads.apply_threads(cfg, MAPF)
    cache = json.loads(threads.cache_path().read_text())
    [(key, entry)] = cache.items()
    secs = {int(k): v for k, v in entry["seconds"].items()}
    assert sorted(secs) == threads.options(threads.cores()) and all(v > 0 for v in secs.values())
    assert n == entry["threads"] == threads.pick(secs) == torch.get_num_threads()
    assert "measured now" in why and "tiny" not in key and "h128" in key  # keyed by the shape, not the preset name

    def no_timing(*a, **k):
        raise AssertionError("measured again although the cache holds this host and shape")

    monkeypatch.setattr(threads, "time_threads_for", no_timing)
    torch.set_num_threads(max(1, 3 - n))
    assert threads.apply_threads(cfg, MAPF)[0] == n == torch.get_num_threads()
    small = parse_config({**TINY, "policy": {"preset": "small"}}, "test")
    with pytest.raises(AssertionError, match="measured again"):  # another shape is measured
        threads.apply_threads(small, MAPF)


def test_a_number_default_and_the_environment(restore_threads, monkeypatch):
    from harness.threads import apply_threads

    one = parse_config({**TINY, "scale": {"threads": 1}}, "test")
    assert apply_threads(one, MAPF) == (1, "scale.threads") and torch.get_num_threads() == 1
    torch.set_num_threads(2)
    keep = parse_config({**TINY, "scale": {"threads": "default"}}, "test")
    assert apply_threads(keep, MAPF)[0] == 2 == torch.get_num_threads()
    monkeypatch.setenv("EVOTRAINER_THREADS", "1")
    assert apply_threads(keep, MAPF) == (1, "EVOTRAINER_THREADS") and torch.get_num_threads() == 1
    monkeypatch.setenv("EVOTRAINER_THREADS", "lots")
    with pytest.raises(ValueError, match="EVOTRAINER_THREADS must be auto, default or a number"):
        apply_threads(keep, MAPF)
    from harness.threads import check_env

    monkeypatch.setenv("EVOTRAINER_THREADS", "1")
    monkeypatch.setenv("EVOTRAINER_CORES", "0")  # was read as 1 without a word
    with pytest.raises(ValueError, match="EVOTRAINER_CORES='0': at least 1 \\(unset it"):
        check_env()


@pytest.mark.parametrize("bad", [0, "fast"])
def test_a_bad_threads_value_names_the_field(bad):
    with pytest.raises(ConfigError, match="scale.threads"):
        parse_config({**TINY, "scale": {"threads": bad}}, "test")


def test_the_sft_warm_start_trains_on_a_fixed_count_under_auto_and_the_run_gets_its_own_back(restore_threads,
                                                                                              monkeypatch):
    """Under auto the SFT trains on SFT_AUTO_THREADS (at most the cores) without measuring anything: its weights depend
    on the count, and a measured choice flipped between fresh clones on one host (two warm starts, 31.0% and 35.0%).
    A number or `default` leaves the run's count. Would catch a measured (so host-noise-dependent) SFT count, or one
    that leaks into the stages."""
    from harness import threads

    if threads.cores() < 2:
        pytest.skip("one core: there is nothing to choose")

    def measured(*a, **kw):
        raise AssertionError("the SFT's count must not be measured")

    cfg = parse_config(TINY, "test")
    monkeypatch.setattr(threads, "time_threads_for", lambda model, opts, shape: {n: 0.01 * n for n in opts})
    assert threads.apply_threads(cfg, MAPF)[0] == 1 == torch.get_num_threads()
    monkeypatch.setattr(threads, "time_threads_for", measured)
    n, why = threads.sft_threads(cfg, MAPF)
    assert n == min(2, threads.cores()) and "fixed" in why
    assert torch.get_num_threads() == 1  # deciding changes nothing: the warm start sets it around its SFT only
    monkeypatch.setenv("EVOTRAINER_CORES", "1")  # trained in a worker of a side-by-side schedule: the same count
    assert threads.sft_threads(cfg, MAPF)[0] == n
    monkeypatch.delenv("EVOTRAINER_CORES")
    assert threads.sft_threads(parse_config({**TINY, "scale": {"threads": 1}}, "test"), MAPF)[0] is None
    monkeypatch.setenv("EVOTRAINER_THREADS", "default")
    assert threads.sft_threads(cfg, MAPF)[0] is None


def test_the_warm_start_trains_at_its_thread_count_and_keys_its_cache_on_it(tmp_path, monkeypatch, restore_threads):
    """`warmstart.warm_start(threads=n)` trains its SFT at n threads and restores the process's count; a cache hit
    trains nothing; a warm start trained on another count is another cache entry (two counts give two sets of
    weights: the sums are split differently). Would catch a cache that hands a 1-thread warm start to a 2-thread run
    (the demo's warm start then depends on which ran first on a machine), or the SFT's count leaking out."""
    from harness import warmstart
    from harness.seeds import seeds
    from policies.train import Recipe

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    seen: list[int] = []
    from policies import train

    real = train.train_sft

    def spy(*a, **kw):
        seen.append(torch.get_num_threads())
        return real(*a, **kw)

    monkeypatch.setattr(train, "train_sft", spy)
    torch.set_num_threads(1)
    env = MAPF.spec.config_model.model_validate({"sizes": [{"size": 3, "agents": 2}]})
    recipe = Recipe(sft_steps=1, sft_batch_size=4)
    args = (MAPF, "tiny", MAPF.spec.styles[0], env, seeds("train", 4), recipe)
    model, tok, hit, key, m = warmstart.warm_start(*args, threads=2)
    assert hit is None and m is not None and seen == [2] and torch.get_num_threads() == 1
    warmstart.store(key, _save(model, tok, tmp_path / "ws"), {})
    _, _, hit, key2, m = warmstart.warm_start(*args, threads=2)
    assert hit is not None and m is None and key2 == key and seen == [2]
    _, _, hit, key1, m = warmstart.warm_start(*args)  # the process's count, 1: not the 2-thread entry
    assert hit is None and m is not None and key1 != key and seen == [2, 1]
    # every recipe field the SFT reads is in the key: another weight decay (or seed, warm-up, clip, precision) is
    # another warm start, where it loaded the first one's weights (the training steps' own knobs are not)
    for field, value in (("weight_decay", 0.1), ("seed", 5), ("warmup_ratio", 0.3), ("max_grad_norm", 0.5)):
        other = (*args[:-1], recipe.model_copy(update={field: value}))
        assert warmstart.lookup(warmstart.warm_start(*other, threads=2)[3]) is None, field
    assert warmstart.warm_start(*args[:-1], recipe.model_copy(update={"learning_rate": 3e-4}), threads=2)[3] == key
    seen.clear()
    # a damaged entry (weights cut short, DONE still there) is set aside and trained again, not a crash every run
    entry = warmstart.lookup(key)
    weights = next(entry.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.warns(UserWarning, match="does not load .* moved to .*bad-.* and trained again"):
        _, _, hit, key3, m = warmstart.warm_start(*args, threads=2)
    assert hit is None and m is not None and key3 == key and warmstart.lookup(key) is None
    # a cache that cannot be written is an error the run turns into a warning, its half-made copy removed
    monkeypatch.setattr(warmstart.shutil, "copytree", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "No space "
                                                                                                       "left on device")))
    with pytest.raises(warmstart.CacheWriteError, match="could not be cached in .*No space left on device"):
        warmstart.store(key, _save(model, tok, tmp_path / "ws2"), {})
    assert not list(warmstart.cache_root().glob(".*.tmp"))


def _save(model, tok, path):
    from policies.model import save_policy

    save_policy(model, tok, path)
    return path


def test_more_threads_are_chosen_only_when_clearly_faster():
    """`pick`: the fewest threads unless more beat them by more than MARGIN (the stage probe's 12% win on 2 threads
    did not carry to the stages; the SFT's 34% did). Would catch a plain argmin, which took the demo's stages from
    91 s to 135 s on this host."""
    from harness.threads import pick

    assert pick({1: 0.754, 2: 0.665}) == 1  # 12% faster: not enough
    assert pick({1: 0.320, 2: 0.212}) == 2  # 34% faster
    assert pick({1: 0.5, 2: 0.6}) == 1 and pick({1: 1.0, 2: 0.7, 4: 0.65}) == 2 and pick({1: 1.0, 2: 0.7, 4: 0.5}) == 4


def test_the_probes_choice_is_checked_on_the_runs_own_grpo_steps(restore_threads, monkeypatch):
    """`step_trial`: the probe's choice is checked on real GRPO steps (after 2 warm-up steps, each count in ABBA
    order), the faster by the margin is kept for the rest of the run and cached as confirmed, so the next start
    checks nothing; a training call too short for the whole trial leaves the count and the cache as they were.
    The step clock is faked (2 threads twice as fast as 1, the probe saying 1) so the outcome does not depend on the
    machine; the steps are a real tiny GRPO run. A call whose rollouts are pipelined (auto, one thread on two cores)
    is not a trial: it says so once and confirms nothing. Would catch a trial that never switches threads (both
    counts would time alike and the fewer be kept), a result not applied or not cached, a trial run again, or one
    timed inside a pipelined call (where a higher count oversubscribes the cores)."""
    from harness import threads
    from policies.model import build_model
    from policies.train import Recipe, train_grpo

    if threads.cores() < 2:
        pytest.skip("one core: there is nothing to choose")
    monkeypatch.setattr(threads, "time_threads_for", lambda model, opts, shape: {n: 0.01 * n for n in opts})
    cfg = parse_config(TINY, "test")
    assert threads.apply_threads(cfg, MAPF)[0] == 1 == torch.get_num_threads()

    clock = [0.0]

    def now():  # each reading advances by a step's cost at the current thread count
        clock[0] += 1.0 if torch.get_num_threads() == 1 else 0.5
        return clock[0]

    monkeypatch.setattr(threads, "_now", now)
    model, tok = build_model("tiny", "ab", words=[])
    rows = [{"prompt": w} for w in ("ab", "ba", "aa", "bb")]

    def grpo(steps, trial):
        recipe = Recipe(steps=steps, batch_size=8, num_generations=4, max_completion_length=4, beta=0.0,
                        warmup_ratio=0.0, temperature=1.0, pipeline=pipeline[0])
        return train_grpo(model, tok, rows, lambda p, c, **kw: [float(x.count("a")) for x in c], recipe,
                          callbacks=[trial])

    said: list[str] = []
    pipeline = ["auto"]  # one thread on two cores: the steps are pipelined, and no trial times them
    monkeypatch.setattr(threads, "_SAID_PIPELINED", [False])
    n_trial = threads.TRIAL_WARMUP + 2 * threads.TRIAL_ROUNDS * len(threads.options(threads.cores())) + 1
    m = grpo(n_trial, threads.step_trial(said.append))
    assert any(s.pipelined == 1.0 for s in m.steps) and torch.get_num_threads() == 1  # (an epoch of 2 steps)
    assert len(said) == 1 and "not checked" in said[0], said
    assert "confirmed" not in next(iter(json.loads(threads.cache_path().read_text()).values()))
    said.clear()
    pipeline[0] = False  # steps in turn: the trial below
    grpo(5, threads.step_trial(said.append))  # 2 warm-up + 3 of the 8 trial steps: no decision
    assert said == [] and torch.get_num_threads() == 1
    assert "confirmed" not in next(iter(json.loads(threads.cache_path().read_text()).values()))
    grpo(n_trial, threads.step_trial(said.append))
    best = 2  # every count above 1 is twice as fast on this clock: the fewest of them
    assert torch.get_num_threads() == best and len(said) == 1 and "the probe said 1" in said[0], said
    entry = next(iter(json.loads(threads.cache_path().read_text()).values()))
    assert entry["threads"] == best and entry["confirmed"] and entry["step_seconds"]["1"] > entry["step_seconds"]["2"]
    assert threads.step_trial() is None  # confirmed in this process
    torch.set_num_threads(1)
    assert threads.apply_threads(cfg, MAPF)[0] == best and threads.step_trial() is None  # and at the next start


def test_a_warm_start_from_an_imperfect_teacher_trains_on_its_draws_and_is_its_own_cache_entry(tmp_path, monkeypatch,
                                                                                              restore_threads):
    """`warmstart.warm_start(teacher_noise=p)` trains on the noisy demonstrations drawn with the run's seed and keys
    the cache on p (a noiseless run must never load the noisy warm start, nor the reverse); p = 0 keeps the key it had
    before the field existed. Would catch the share dropped on its way to the SFT or left out of the key."""
    from harness import warmstart
    from harness.policy_glue import sft_pairs
    from harness.seeds import seeds
    from policies import train
    from policies.train import SFT_RECIPE_FIELDS, Recipe

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    seen: list[list[dict]] = []
    real = train.train_sft

    def spy(model, tok, pairs, *a, **kw):
        seen.append(pairs)
        return real(model, tok, pairs, *a, **kw)

    monkeypatch.setattr(train, "train_sft", spy)
    env = MAPF.spec.config_model.model_validate({"sizes": [{"size": 4, "agents": 2, "hole_ratio": 0.3}]})
    sl = seeds("train", 40)
    args = (MAPF, "tiny", "trace", env, sl, Recipe(sft_steps=1, sft_batch_size=4))
    *_, key0, _ = warmstart.warm_start(*args, seed=5, threads=1)
    *_, key6, _ = warmstart.warm_start(*args, seed=5, threads=1, teacher_noise=0.6)
    assert seen[0] == sft_pairs(MAPF, env, sl, "trace")
    assert seen[1] == sft_pairs(MAPF, env, sl, "trace", teacher_noise=0.6, noise_seed=5) != seen[0]
    assert key6 != key0
    assert key0 == warmstart.cache_key(task="mapf", preset="tiny", style="trace", seed=5,
                                       env=env.model_dump(mode="json"), seeds=list(sl),
                                       recipe={f: getattr(args[-1], f) for f in SFT_RECIPE_FIELDS},
                                       trained_on=warmstart.trained_on(1))


def test_a_bench_reads_and_writes_the_runs_choice_for_its_models_shape(restore_threads, monkeypatch):
    """`auto_for_model` (what `bench ladder --threads auto` uses) picks from the same cache entry a run of that model
    and step shape uses on this host, measured once, and sets it on the process. Would catch a bench that measures
    into another key (a run and the bench disagreeing on one host) or that leaves torch's count unset."""
    from harness import threads
    from policies.model import build_model

    cfg = parse_config(TINY, "test")
    n, _ = threads.apply_threads(cfg, MAPF)  # a run measures and caches its shape's count

    def no_timing(*a, **k):
        raise AssertionError("measured again although the cache holds this host and shape")

    monkeypatch.setattr(threads, "time_threads_for", no_timing)
    torch.set_num_threads(max(1, 3 - n))
    model, tok = build_model("tiny", MAPF.spec.alphabet, words=list(MAPF.spec.words))
    shape, _ = threads._run_step_shape(cfg, MAPF, tok)
    got, why = threads.auto_for_model(model, shape)
    assert got == n == torch.get_num_threads() and "measured on this host" in why
    small, _ = build_model("small", MAPF.spec.alphabet, words=list(MAPF.spec.words))
    with pytest.raises(AssertionError, match="measured again"):  # another model shape is its own entry
        threads.auto_for_model(small, shape)
    with pytest.raises(AssertionError, match="measured again"):  # and so is another step shape
        threads.auto_for_model(model, shape._replace(rows=2 * shape.rows))


def test_the_probe_is_shaped_like_the_runs_grpo_step(restore_threads, monkeypatch):
    """`auto` times the step the run will take: rows and groups from its round-0 recipe (oversampled rows decoded,
    batch_size trained), token lengths from its task's prompts and expert answers (completions capped at the recipe's
    budget), and the probe runs the step's own code at that shape: `completion_len` compact decode steps over every
    decoded row and the shared-prompt loss over the trained rows. A run with another batch measures again. Would catch
    the training-heavy probe this replaced (a 64 x 64 forward and backward, 8 decode steps whatever the run: it chose
    2 threads where the demo's steps were 1.7x slower on 2), a shape not read from the run, or a probe that does not
    decode through the compact loop."""
    from harness import threads
    from policies import rollout, train
    from policies.model import build_model

    recipe = {"batch_size": 16, "num_generations": 4, "oversample": 3, "drop_dead_groups": True,
              "max_completion_length": 96}
    cfg = parse_config({**TINY, "recipe": recipe}, "test")
    _, tok = build_model("tiny", MAPF.spec.alphabet, words=list(MAPF.spec.words))
    shape, note = threads._run_step_shape(cfg, MAPF, tok)
    assert note is None and (shape.prompts, shape.rows, shape.loss_rows) == (12, 48, 16)
    assert shape.prompt_len % 8 == 0 and shape.completion_len % 8 == 0 and 8 <= shape.completion_len <= 96
    big = parse_config({**TINY, "env": {"sizes": [{"size": 7, "agents": 3, "hole_ratio": 0.2}]},
                        "recipe": recipe}, "test")
    longer, _ = threads._run_step_shape(big, MAPF, tok)  # bigger boards: longer prompts and plans
    assert longer.prompt_len > shape.prompt_len and longer.completion_len > shape.completion_len
    capped, _ = threads._run_step_shape(parse_config({**TINY, "env": big.env, "recipe": {
        **recipe, "max_completion_length": 8}}, "test"), MAPF, tok)
    assert capped.completion_len == 8

    decoded, trained = [], []
    step, logps = rollout.CompactLlama.step, train.shared_prompt_logps

    def spy_step(self, tokens, positions):
        decoded.append(tokens.shape[0])
        return step(self, tokens, positions)

    def spy_loss(model, prompt_ids, prompt_mask, completion_ids, completion_mask, *a, **kw):
        trained.append((tuple(prompt_ids.shape), tuple(completion_ids.shape)))
        return logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, *a, **kw)

    monkeypatch.setattr(rollout.CompactLlama, "step", spy_step)
    monkeypatch.setattr(train, "shared_prompt_logps", spy_loss)
    secs = threads.time_threads_for(build_model("tiny", "ab", words=[])[0], [1], shape)
    probes = 4  # a warm-up and three timed
    assert set(secs) == {1} and secs[1] > 0
    assert decoded == [shape.rows] * shape.completion_len * probes
    assert trained == [((shape.loss_rows, shape.prompt_len), (shape.loss_rows, shape.completion_len))] * probes

    monkeypatch.setattr(threads, "time_threads_for", lambda model, opts, shape: {n: 0.01 * n for n in opts})
    threads.apply_threads(cfg, MAPF)

    def no_timing(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(threads, "time_threads_for", no_timing)
    threads.apply_threads(cfg, MAPF)  # the same run shape: cached
    with pytest.raises(AssertionError, match="measured again"):
        threads.apply_threads(parse_config({**TINY, "recipe": {**recipe, "batch_size": 32}}, "test"), MAPF)


def test_the_probe_runs_the_models_own_forward_where_the_compact_paths_do_not_apply():
    """A checkpoint of another architecture (GPT-2 here) is probed through its own forward, decoding and loss alike,
    instead of failing the run's start. Would catch a probe that assumes the Llama layout."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from policies.threads import StepShape, time_step

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40, n_positions=64))
    secs = time_step(model, [1], StepShape(prompts=2, rows=8, loss_rows=4, prompt_len=8, completion_len=8), reps=1)
    assert set(secs) == {1} and secs[1] > 0 and model.training and all(p.grad is None for p in model.parameters())


def test_a_task_whose_instances_fail_gives_the_default_lengths_and_says_so(restore_threads, monkeypatch):
    """The probe's token lengths come from the task's instances; when they cannot be generated the probe uses
    DEFAULT_LENGTHS and the run's threads event says so, rather than failing the run's start (its own generation
    reports a broken generator where it matters)."""
    from harness import policy_glue, threads

    def broken(*a, **kw):
        raise RuntimeError("no instance")

    monkeypatch.setattr(policy_glue, "sft_pairs", broken)
    monkeypatch.setattr(threads, "time_threads_for", lambda model, opts, shape: {n: 0.01 * n for n in opts})
    n, why = threads.apply_threads(parse_config(TINY, "test"), MAPF)
    assert n == 1 and f"token lengths a default {threads.DEFAULT_LENGTHS} (RuntimeError" in why


@pytest.mark.parametrize("var,value,said", [
    ("EVOTRAINER_VLLM_ENGINES", "abc", "EVOTRAINER_VLLM_ENGINES must be a whole number"),
    ("EVOTRAINER_VLLM_ENGINES", "0", "EVOTRAINER_VLLM_ENGINES must be at least 1"),
    ("EVOTRAINER_VLLM_GPU_MEMORY", "5", "EVOTRAINER_VLLM_GPU_MEMORY must be a share"),
    ("EVOTRAINER_VLLM_GPU_MEMORY", "nan", "EVOTRAINER_VLLM_GPU_MEMORY must be a share"),
    ("EVOTRAINER_WARMSTART_CACHE", "maybe", "EVOTRAINER_WARMSTART_CACHE must be one of"),
    ("EVOTRAINER_EVAL_CACHE", "maybe", "EVOTRAINER_EVAL_CACHE must be one of"),
    ("EVOTRAINER_HOME", " ", "EVOTRAINER_HOME is set but empty"),
])
def test_a_bad_environment_variable_is_named_at_start(monkeypatch, var, value, said):
    """`EVOTRAINER_VLLM_ENGINES=abc` was an int() error naming no variable, 15 s into a run; 0 engines or a GPU share
    of 5 were taken; a cache switch of "maybe" read as on. Each is refused before a run makes its folder."""
    from harness.threads import check_env

    monkeypatch.delenv("EVOTRAINER_THREADS", raising=False)
    monkeypatch.delenv("EVOTRAINER_CORES", raising=False)
    check_env()
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=said):
        check_env()
    monkeypatch.setenv(var, {"EVOTRAINER_VLLM_GPU_MEMORY": "0.5", "EVOTRAINER_HOME": "/tmp/evotrainer-home"}.get(
        var, "off" if "CACHE" in var else "3"))
    check_env()


def test_the_cache_switches_are_read_as_they_are_checked(monkeypatch):
    """The start check and the caches read a switch through one function: `OFF` was accepted at start and then read as
    on by the cache itself."""
    from harness import evalcache, warmstart

    for word, on in (("OFF", False), ("no", False), ("Yes", True), ("", True)):
        monkeypatch.setenv("EVOTRAINER_WARMSTART_CACHE", word)
        monkeypatch.setenv("EVOTRAINER_EVAL_CACHE", word)
        assert warmstart.enabled() is on and evalcache.enabled() is on, word


def test_a_warm_start_trained_on_another_instruction_set_is_another_cache_entry(monkeypatch):
    """A shared $EVOTRAINER_HOME (or one copied from another host) handed an AVX-512 host the warm start an AVX2 host
    had trained: torch's kernels for another instruction set sum in another order, so 700 SFT steps land elsewhere.
    Would catch a key that names only the thread count."""
    import torch

    from harness import warmstart

    if torch.cuda.is_available():
        pytest.skip("on a GPU the key names the device, not the CPU")
    here = warmstart.trained_on(1)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "OTHER_ISA")
    assert warmstart.trained_on(1) == "cpu x1 OTHER_ISA" != here


def test_two_measurements_at_once_each_keep_their_entry(restore_threads):
    """Two processes (here two threads, each opening the lock file on its own) measure different shapes at once: the
    first reads threads.json, measures, and writes while the second has written its own entry in between. Before,
    each read-modify-write wrote back the file as it had read it, so the later write dropped the other's entry (a
    bench's side-by-side units measured again run after run). Would catch: a write that does not re-read the file
    under a lock."""
    import threading

    from harness import threads

    first_measuring, second_written = threading.Event(), threading.Event()

    def slow():  # the first measurement: still timing when the second one finishes and writes
        first_measuring.set()
        assert second_written.wait(30)
        return {1: 0.5, 2: 0.6}

    def fast():
        assert first_measuring.wait(30)
        return {1: 0.9, 2: 0.3}

    a = threading.Thread(target=threads._choice, args=("shape-a", slow, "step", "a"))
    a.start()
    threads._choice("shape-b", fast, "step", "b")
    second_written.set()
    a.join(30)
    cache = json.loads(threads.cache_path().read_text())
    assert cache["shape-a"]["threads"] == 1 and cache["shape-b"]["threads"] == 2, cache


def test_a_measurement_finishing_after_another_process_confirmed_the_key_leaves_the_confirmation(restore_threads):
    """One process probes a shape while another, which probed it first, confirms it on its run's steps: the late
    probe's entry used to replace the confirmed one, so the next run repeated the trial. Would catch: a late
    measurement written over an entry already there."""
    import threading

    from harness import threads

    measuring, confirmed = threading.Event(), threading.Event()

    def slow():
        measuring.set()
        assert confirmed.wait(30)
        return {1: 0.9, 2: 0.3}

    late = threading.Thread(target=threads._choice, args=("shape", slow, "step", "s"))
    late.start()
    assert measuring.wait(30)
    threads._update_cache("shape", lambda e: {**e, "threads": 1, "confirmed": "now"})
    confirmed.set()
    late.join(30)
    assert json.loads(threads.cache_path().read_text())["shape"] == {"threads": 1, "confirmed": "now"}
