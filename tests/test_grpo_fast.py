"""The CPU fast path of GRPO against the reference path it replaces, on a real tiny model: compact decoding
(`policies.rollout.CompactLlama`) and the loss's shared-prompt log-probabilities (`policies.train.shared_prompt_logps`).

    .venv/bin/pytest tests/test_grpo_fast.py -q
"""

from __future__ import annotations

import copy
import math
from collections import Counter

import pytest
import torch

from policies.model import build_model, format_prompt
from policies.rollout import SamplingParams, _sample, compact_supported, generate, inverse_cdf
from policies.train import (
    LOGP_TOL_BF16,
    Recipe,
    check_logprobs,
    length_buckets,
    logprob_tolerance,
    shared_prompt_logps,
    train_sft,
)

ALPHABET = "abcd#\n"
WORDS = ["abc", "bcd", "cab", "dab", "abd", "bca", "cba", "dca", "ab\ncd", "dd#a"]


@pytest.fixture(scope="module", autouse=True)
def _threads():
    torch.set_num_threads(2)


@pytest.fixture(scope="module")
def warm():
    """A tiny model after a few SFT steps, so completions end at <eos> at varied lengths, as in real use. On the CPU
    whatever the host: these tests check the CPU path's exactness (fp32), which bf16 on a GPU cannot have (seen on an
    H200: a near-tie greedy token flips between two bf16 roundings); rung 1 on a GPU is checked at its own tolerance."""
    model, tok = build_model("tiny", ALPHABET, seed=4)
    pairs = [{"prompt": w, "completion": w[::-1]} for w in WORDS] * 3
    train_sft(model, tok, pairs, Recipe(sft_steps=20, sft_batch_size=8, warmup_ratio=0.0))
    return model.to("cpu"), tok


def _chi2_tail(chi2: float, dof: int) -> float:
    """P(X > chi2) for X chi-square with `dof` degrees of freedom (Wilson-Hilferty normal approximation)."""
    z = ((chi2 / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


# --- compact decoding -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature,top_p", [(0.0, 1.0), (0.7, 1.0), (1.0, 0.9)])
def test_compact_decoding_draws_exactly_what_the_reference_loop_draws(warm, temperature, top_p):
    """Same seed, same prompts (unequal lengths, 4 samples each): the same tokens, the same sampling log-probs to
    float rounding. Greedy is the issue's exactness check; sampled draws agree too, because both paths feed the
    same generator the same distributions in the same order of rows."""
    model, tok = warm
    assert compact_supported(model)
    kw = {"temperature": temperature, "top_p": top_p, "n": 4, "max_new_tokens": 24, "batch_size": 16, "seed": 7}
    ref = generate(model, tok, WORDS, SamplingParams(**kw, compact=False))
    fast = generate(model, tok, WORDS, SamplingParams(**kw, compact=True))
    assert fast.completion_ids == ref.completion_ids
    assert fast.truncated == ref.truncated
    assert len(set(ref.tokens)) > 1, "completions of one length would not exercise rows leaving the batch"
    worst = max(abs(a - b) for x, y in zip(ref.logprobs, fast.logprobs) for a, b in zip(x, y))
    assert worst < 1e-4


def test_compact_decoding_of_a_forward_under_autocast_draws_what_the_reference_loop_draws(warm):
    """Accelerate's mixed precision wraps the model's forward in autocast (how TRL trains bf16 on a CUDA GPU), so
    the prefill leaves a bf16 cache (values bf16, keys promoted back to fp32 by RoPE). The compact steps must decode
    under the same autocast: first seen on an H200, where they met the bf16 cache in fp32 and every GRPO step on a
    Llama model failed ("expected scalar type Float but found BFloat16"). Reproduced here with CPU autocast: greedy,
    the same tokens and log-probs as the reference loop through the wrapped forward."""
    import functools

    model, tok = warm
    forward = model.forward

    @functools.wraps(forward)
    def autocast_forward(*args, **kwargs):  # as accelerate's `convert_outputs_to_fp32(autocast(forward))`
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = forward(*args, **kwargs)
        out.logits = out.logits.float()
        return out

    model.forward = autocast_forward
    try:
        kw = {"temperature": 0.0, "n": 4, "max_new_tokens": 24, "batch_size": 16, "seed": 7}
        ref = generate(model, tok, WORDS, SamplingParams(**kw, compact=False))
        fast = generate(model, tok, WORDS, SamplingParams(**kw, compact=True))
    finally:
        del model.forward  # back to the class's forward
    # bf16 rounds a near-tie either way when the same sums are taken in another order: this CPU's bf16 kernels give the
    # reference loop's tokens exactly, the H200 host's (native bf16) differed in one completion of 64 by one step of a
    # repeated letter. A decode that met the cache wrongly (the crash above, or a cache read in the wrong precision or
    # place) changes most completions; so: nearly all the same, and the same ones within rung 1's bf16 bound.
    same = [i for i, (a, b) in enumerate(zip(ref.completion_ids, fast.completion_ids)) if a == b]
    assert len(same) >= 0.9 * len(ref.completion_ids), (len(same), len(ref.completion_ids))
    worst = max(abs(a - b) for i in same for a, b in zip(ref.logprobs[i], fast.logprobs[i]))
    assert worst < LOGP_TOL_BF16, worst


def test_compact_decoding_samples_the_same_distribution_at_temperature_1(warm):
    """A statistical check that could fail: 600 draws from each path with DIFFERENT seeds (the reference also with the
    reference sampler, torch.multinomial; the fast path with the default inverse-CDF one); the completion strings'
    frequencies pass a chi-square homogeneity test at p > 0.001 (rare strings pooled), and the mean log-probability
    the sampler reports agrees to within 4 standard errors."""
    model, tok = warm
    kw = {"temperature": 1.0, "n": 600, "max_new_tokens": 12, "batch_size": 600}
    a = generate(model, tok, ["cab"], SamplingParams(**kw, seed=1, compact=False, sampler="multinomial"))
    b = generate(model, tok, ["cab"], SamplingParams(**kw, seed=2, compact=True))  # and the inverse-CDF sampler
    ca, cb = Counter(a.completions), Counter(b.completions)
    common = [s for s in ca | cb if ca[s] + cb[s] >= 10]
    cells = [(ca[s], cb[s]) for s in common] + [(sum(ca[s] for s in ca if s not in common),
                                                 sum(cb[s] for s in cb if s not in common))]
    cells = [c for c in cells if sum(c) > 0]
    assert len(cells) >= 3, "too few distinct completions to test a distribution"
    na, nb = sum(x for x, _ in cells), sum(y for _, y in cells)
    chi2 = sum((x - (x + y) * na / (na + nb)) ** 2 / ((x + y) * na / (na + nb))
               + (y - (x + y) * nb / (na + nb)) ** 2 / ((x + y) * nb / (na + nb)) for x, y in cells)
    dof = len(cells) - 1
    assert _chi2_tail(chi2, dof) > 1e-3, (chi2, dof, cells)
    la = [sum(x) for x in a.logprobs]
    lb = [sum(x) for x in b.logprobs]
    mean = lambda v: sum(v) / len(v)
    var = lambda v: sum((x - mean(v)) ** 2 for x in v) / (len(v) - 1)
    assert abs(mean(la) - mean(lb)) < 4 * math.sqrt(var(la) / len(la) + var(lb) / len(lb))


def _chi2_p(observed: list[int], expected: list[float]) -> float:
    """Upper tail of Pearson's chi-square goodness of fit."""
    return _chi2_tail(sum((o - e) ** 2 / e for o, e in zip(observed, expected)), len(observed) - 1)


@pytest.mark.parametrize("sampler", ["inverse_cdf", "multinomial"])
@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_each_sampler_draws_each_token_with_its_probability(sampler, top_p):
    """20,000 draws of one distribution (probabilities 1/2 .. 1/16, one token at probability 0): frequencies fit the
    distribution (chi-square, p > 0.001) and the zero-probability token, or with top-p 0.8 every token outside the
    kept mass, is never drawn. An off-by-one in the inversion or a sampler that ignores top-p fails it."""
    p = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625, 0.0])
    logits = p.log().expand(20_000, -1).clone()
    nxt, lp = _sample(logits, 1.0, top_p, torch.Generator().manual_seed(3), sampler)
    kept = p if top_p == 1.0 else torch.tensor([0.5, 0.25, 0.125, 0.0, 0.0, 0.0]) / 0.875
    counts = torch.bincount(nxt, minlength=6)
    assert bool((counts[kept == 0] == 0).all()), counts
    live = kept > 0
    assert _chi2_p(counts[live].tolist(), (kept[live] * 20_000).tolist()) > 1e-3, counts
    assert torch.allclose(lp, kept[nxt].log())


def test_inverse_cdf_never_lands_on_a_token_of_probability_zero():
    """u = 0 takes the first token of positive probability; a u x total that rounds up to the total takes the last
    one, never the zero-probability tail; each u lands in its token's interval of the cumulative sum."""
    probs = torch.tensor([[0.0, 0.3, 0.0, 0.7, 0.0, 0.0]] * 5)
    u = torch.tensor([0.0, 0.29, 0.31, 1 - 2 ** -24, 1.0])  # 1.0: what a rounding u x total can reach
    assert inverse_cdf(probs, u).tolist() == [1, 1, 3, 3, 3]
    assert inverse_cdf(torch.tensor([[1.0]]), torch.tensor([0.999])).tolist() == [0]
    for bad in (float("nan"), float("inf")):  # a policy whose logits blew up fails loudly, as multinomial does
        with pytest.raises(RuntimeError, match="not finite"):
            _sample(torch.tensor([[0.0, bad, 1.0]]), 1.0, 1.0, torch.Generator().manual_seed(0))


# --- the loss's log-probabilities -------------------------------------------------------------------------------------


def _batch(model, tok, seed: int = 0):
    """A GRPO-shaped batch: 4 prompts of unequal length x 4 samples, rows shuffled as TRL shuffles them, prompts left-
    padded, completions right-padded."""
    prompts = ["abc", "ab\ncd", "dd#a", "ca"]
    res = generate(model, tok, prompts, SamplingParams(temperature=1.0, n=4, max_new_tokens=16, batch_size=16,
                                                       seed=seed))
    enc = tok([format_prompt(tok, p) for p in prompts], padding=True, return_tensors="pt")
    pid, pm = enc["input_ids"].repeat_interleave(4, 0), enc["attention_mask"].repeat_interleave(4, 0)
    width = max(res.tokens)
    cid = torch.full((16, width), tok.pad_token_id)
    cm = torch.zeros(16, width, dtype=torch.long)
    for i, ids in enumerate(res.completion_ids):
        cid[i, :len(ids)], cm[i, :len(ids)] = torch.tensor(ids), 1
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(seed))
    return pid[perm], pm[perm], cid[perm], cm[perm]


def _reference_logps(model, pid, pm, cid, cm, temperature):
    """What TRL's loss computes: one forward over prompt + completion, the completion positions scored."""
    c = cid.shape[1]
    logits = model(input_ids=torch.cat([pid, cid], 1), attention_mask=torch.cat([pm, cm], 1)).logits
    lp = (logits[:, -c - 1:-1].float() / temperature).log_softmax(-1)
    return lp.gather(-1, cid[..., None]).squeeze(-1) * cm


def test_shared_prompt_logps_equal_the_full_forward_and_so_do_their_gradients(warm):
    model, tok = warm
    model.train()
    try:
        pid, pm, cid, cm = _batch(model, tok)
        assert len(set(cm.sum(1).tolist())) > 1
        ref = _reference_logps(model, pid, pm, cid, cm, 0.7)
        fast, ent = shared_prompt_logps(model, pid, pm, cid, cm, temperature=0.7, compute_entropy=True)
        assert torch.allclose(fast, ref, atol=1e-4), (fast - ref).abs().max()
        assert bool((fast[cm == 0] == 0).all()) and bool((ent[cm == 0] == 0).all()) and bool((ent[cm == 1] > 0).all())
        params = [p for p in model.parameters()]
        weights = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1))
        g_ref = torch.autograd.grad((ref * weights).sum(), params)
        g_fast = torch.autograd.grad((fast * weights).sum(), params)
        for (name, _), a, b in zip(model.named_parameters(), g_ref, g_fast):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-3), (name, (a - b).abs().max())
    finally:
        model.eval()


def test_length_buckets_cover_every_row_once_and_split_only_when_it_pays():
    lengths = [3, 40, 4, 41, 5, 3, 39, 4]
    buckets = length_buckets(lengths, overhead=16)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
    assert [sorted(lengths[i] for i in b) for b in buckets] == [[3, 3, 4, 4, 5], [39, 40, 41]]
    assert length_buckets(lengths, overhead=10_000) == [sorted(range(8), key=lambda i: lengths[i])]
    assert length_buckets([7] * 5) == [[0, 1, 2, 3, 4]]


@pytest.mark.parametrize("fast", [True, False])
def test_rung1_holds_on_both_paths(warm, fast):
    """Rung 1 of the ladder through a real GRPOTrainer: sampler and loss log-probs agree to 1e-3 on the fast path
    (compact decoding + shared-prompt loss) and on the reference path."""
    model, tok = warm
    flags = {} if fast else {"compact_decode": False, "shared_prompt_loss": False}
    r = check_logprobs(model, tok, WORDS, Recipe(batch_size=16, num_generations=4, max_completion_length=10,
                                                 temperature=0.6, **flags))
    assert r.engine == "policies" and r.tokens > 16
    assert r.max_abs_diff < logprob_tolerance() and r.max_ratio_dev < 1e-5, r  # 1e-3; bf16 on a GPU: 1/16


# --- dead groups left out of the loss ---------------------------------------------------------------------------------


def _grads_of_one_step(model, tok, recipe: Recipe, rows, reward) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The gradient the optimiser is handed at each step of `train_grpo` (clipping off), and the logged losses."""
    import copy

    from transformers import TrainerCallback

    from policies.train import train_grpo

    grads: dict[str, torch.Tensor] = {}

    class Spy(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            for name, p in model.named_parameters():
                if p.grad is not None:
                    grads[f"{state.global_step}:{name}"] = p.grad.detach().clone()

    m = train_grpo(copy.deepcopy(model), tok, rows, reward, recipe, callbacks=[Spy()])
    return grads, [s.loss for s in m.steps]


@pytest.mark.parametrize("loss_type,engine", [("dapo", "policies"), ("grpo", "policies"), ("bnpo", "policies"),
                                               ("dr_grpo", "policies"), ("dapo", "trl")])
def test_pruning_dead_groups_hands_the_optimiser_the_whole_batchs_gradient(warm, loss_type, engine, monkeypatch):
    """Half the prompts always score 0 (their groups tie: zero advantage), the rest score by their completions. Two
    GRPO steps with `prune_dead_groups` (the loss forward and backward on the live groups only) and without: the same
    gradient at every step to float rounding, and the same logged loss, for every loss type a recipe can name (each
    normalises differently: over the generation batch's tokens, per row, per batch token, per row x max length), and
    with TRL's own generation (how chat checkpoints train) as well as ours.
    Would catch a pruned batch renormalised over its own rows or tokens (drop_dead_groups' objective: checked below
    to differ), a loss type's scale missing or wrong, or live rows lost with the dead ones."""
    model, tok = warm
    rows = [{"prompt": w} for w in WORDS[:8]]

    def reward(prompts, completions, **kw):
        return [0.0 if p in WORDS[:8:2] else float(c.count("a")) + 0.1 * len(c) for p, c in zip(prompts, completions)]

    base = {"steps": 2, "batch_size": 16, "num_generations": 4, "max_completion_length": 10, "learning_rate": 1e-3,
            "beta": 0.0, "warmup_ratio": 0.0, "temperature": 1.0, "loss_type": loss_type, "max_grad_norm": 1e9,
            "lr_schedule": "constant", "rollout_engine": engine}
    from policies import train

    full, full_loss = _grads_of_one_step(model, tok, Recipe(**base, prune_dead_groups=False), rows, reward)
    kept: list[tuple[int, int]] = []
    keep = train.keep_live_groups

    def spy(batch, group, k, renormalise=True):
        out, live = keep(batch, group, k, renormalise)
        kept.append((out["advantages"].shape[0], batch["advantages"].shape[0]))
        return out, live

    monkeypatch.setattr(train, "keep_live_groups", spy)
    pruned, pruned_loss = _grads_of_one_step(model, tok, Recipe(**base), rows, reward)
    monkeypatch.undo()
    assert len(kept) == 2 and all(k < n for k, n in kept), f"the loss did not leave the dead groups out: {kept}"
    assert full.keys() == pruned.keys() and len(full) > 0
    if engine == "trl":  # TRL's generate draws from torch's global generator, which TRL's shuffle of the (smaller)
        # pruned batch advances differently: from step 2 on the two runs sample other completions, as two seeds would
        full = {k: v for k, v in full.items() if k.startswith("0:")}
        full_loss, pruned_loss = full_loss[:1], pruned_loss[:1]
    scale = max(float(g.abs().max()) for g in full.values())
    assert scale > 0
    worst = max(float((full[k] - pruned[k]).abs().max()) for k in full)
    assert worst <= 1e-5 * scale, f"pruned gradient differs by {worst:.3g} (largest entry {scale:.3g})"
    assert pruned_loss == pytest.approx(full_loss, rel=1e-4, abs=1e-7)
    if loss_type == "dapo":  # the negative control: renormalising over the live rows is a different objective
        dropped, _ = _grads_of_one_step(model, tok, Recipe(**base, drop_dead_groups=True), rows, reward)
        assert max(float((full[k] - dropped[k]).abs().max()) for k in full) > 1e-3 * scale


def test_cispo_weighs_an_on_policy_token_as_dapo_does(warm):
    """CISPO's token weight is the importance ratio capped at epsilon_high (ScaleRL's epsilon_max, 5.0), and at the
    first step the ratio is 1: its gradient is DAPO's (both normalise over the batch's tokens). Before, the recipe
    left TRL's epsilon_high at epsilon (0.2), which for cispo caps the weight itself: min(1, 0.2), every token at a
    fifth, the ratio never read. Would catch: cispo without its own cap (the gradient 0.2x), a cap read as 1 + eps."""
    model, tok = warm
    rows = [{"prompt": w} for w in WORDS[:4]]

    def reward(prompts, completions, **kw):
        return [float(c.count("a")) + 0.1 * len(c) for c in completions]

    base = {"steps": 1, "batch_size": 16, "num_generations": 4, "max_completion_length": 10, "learning_rate": 1e-3,
            "beta": 0.0, "warmup_ratio": 0.0, "temperature": 1.0, "max_grad_norm": 1e9, "lr_schedule": "constant",
            "prune_dead_groups": False, "pipeline": False}
    dapo, _ = _grads_of_one_step(model, tok, Recipe(**base, loss_type="dapo"), rows, reward)
    cispo, _ = _grads_of_one_step(model, tok, Recipe(**base, loss_type="cispo"), rows, reward)
    assert dapo.keys() == cispo.keys() and len(dapo) > 0
    scale = max(float(g.abs().max()) for g in dapo.values())
    assert scale > 0
    assert max(float((dapo[k] - cispo[k]).abs().max()) for k in dapo) <= 1e-4 * scale
    from policies.train import epsilon_high

    assert epsilon_high(Recipe(loss_type="cispo")) == 5.0 and epsilon_high(Recipe()) == 0.2
    assert epsilon_high(Recipe(loss_type="dapo", epsilon_high=0.28)) == 0.28  # DAPO's clip-higher, when asked


def test_pruning_is_refused_where_it_would_not_be_exact(warm):
    """`prunable` names the reason a trainer's batches keep their dead groups: a KL term (beta > 0) is not zero on a
    tied row. Would catch pruning under beta > 0, where the step would lose the dead rows' KL gradient."""
    from policies.train import _grpo_trainer, _wrap_reward, prunable

    model, tok = warm
    rows = [{"prompt": w} for w in WORDS[:4]]
    reward = _wrap_reward(lambda p, c, **kw: [0.0] * len(c), 1.0, [0])
    ok = _grpo_trainer(model, tok, rows, reward, Recipe(steps=1, batch_size=8, num_generations=4, beta=0.0), None, [])
    assert prunable(ok) is None
    kl = _grpo_trainer(model, tok, rows, reward, Recipe(steps=1, batch_size=8, num_generations=4, beta=0.04), None, [])
    assert "beta" in prunable(kl)


def test_a_group_with_an_undefined_advantage_is_never_pruned():
    """A reward that came back NaN makes its group's advantages NaN; pruning must not hide it (the step then fails or
    trains on it exactly as the whole batch would), only groups whose advantages are all exactly 0 leave. Would catch
    a liveness test like `abs() > 0`, which is False for NaN and dropped the group without a word."""
    from policies.train import keep_live_groups

    adv = torch.tensor([0.0, 0.0, float("nan"), float("nan"), 0.5, -0.5, 0.0, 0.0])
    batch = {"advantages": adv, "completion_ids": torch.ones(8, 3, dtype=torch.long),
             "completion_mask": torch.ones(8, 3, dtype=torch.long), "num_items_in_batch": torch.tensor(24.0)}
    out, live = keep_live_groups(batch, 2, 4, renormalise=False)
    assert live == 2 and out["advantages"].shape[0] == 4 and bool(torch.isnan(out["advantages"][:2]).all())
    assert float(out["num_items_in_batch"]) == 24.0  # the whole batch's normaliser, kept


def test_a_reward_that_is_not_a_finite_number_stops_the_step_with_its_name(warm):
    """TRL sums a NaN reward away as 0 (its marker for "no reward"), so a scorer that divides by zero would train on
    silent zeros. Would catch the NaN passed through."""
    from policies.train import train_grpo

    model, tok = warm

    def broken_scorer(prompts, completions, **kw):
        return [float("nan") if i == 3 else 1.0 for i in range(len(completions))]

    recipe = Recipe(steps=1, batch_size=8, num_generations=4, max_completion_length=6, beta=0.0, warmup_ratio=0.0)
    with pytest.raises(ValueError, match=r"broken_scorer returned nan for completion 3 .*finite numbers"):
        train_grpo(model, tok, [{"prompt": w} for w in WORDS[:2]], broken_scorer, recipe)


def test_our_forwards_pass_the_kv_cache_by_the_name_the_installed_transformers_takes(recwarn):
    """Decoding (both loops), the shared-prompt loss and the thread probe hand the KV cache to the model under the name
    its forward declares (`policies.model.cache_kw`): `cache` on transformers 5.x, where `past_key_values` is
    deprecated and removed in 5.40 (the project allows any transformers >= 4.56), `past_key_values` before. Would
    catch a call site left on the deprecated name: it warns today and breaks decoding on 5.40."""
    import inspect

    from policies.model import build_model, cache_kw
    from policies.rollout import SamplingParams, generate
    from policies.threads import StepShape, time_step
    from policies.train import shared_prompt_logps

    model, tok = build_model("tiny", "ab#", words=[])
    name = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    assert list(cache_kw(model, None)) == [name] and list(cache_kw(model.model, None)) == [name]
    for compact in (True, False):
        generate(model, tok, ["ab#", "ba"], SamplingParams(n=2, max_new_tokens=4, compact=compact))
    ids = torch.tensor([[1, 2, 3], [1, 2, 3]])
    shared_prompt_logps(model, ids, torch.ones_like(ids), ids, torch.ones_like(ids))[0].sum().backward()
    time_step(model, [1], StepShape(prompts=1, rows=2, loss_rows=2, prompt_len=4, completion_len=2), reps=1)
    assert not [w for w in recwarn if "past_key_values" in str(w.message)]


# --- the pipeline: the next step's rollouts generated while a step trains ---------------------------------------------


def _pipeline_run(model, tok, recipe: Recipe, rows, spy_loss: list | None = None):
    """`train_grpo` on a copy of `model`, recording the completions each step's reward saw (in order) and, with
    `spy_loss`, per step the loss inputs' old and sampling log-probabilities and the policy's own at that step."""
    import copy

    from policies import train

    seen: list[list[str]] = []

    def reward(prompts, completions, **kw):
        seen.append(list(completions))
        return [float(c.count("a")) + 0.1 * len(c) for c in completions]

    cls_of = train._grpo_trainer

    def spying(*a, **kw):
        trainer = cls_of(*a, **kw)
        if spy_loss is not None:
            inner = trainer.compute_loss

            def compute_loss(model, inputs, *args, **kwargs):
                with torch.no_grad():
                    own = trainer._get_per_token_logps_and_entropies(
                        model, torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1),
                        torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1),
                        inputs["completion_ids"].shape[1])[0]
                spy_loss.append({"old": inputs.get("old_per_token_logps"), "mask": inputs["completion_mask"],
                                 "sampling": inputs.get("sampling_per_token_logps"), "own": own})
                return inner(model, inputs, *args, **kwargs)

            trainer.compute_loss = compute_loss
        return trainer

    train._grpo_trainer = spying
    try:
        m = train.train_grpo(copy.deepcopy(model), tok, rows, reward, recipe)
    finally:
        train._grpo_trainer = cls_of
    return m, seen


PIPE = {"steps": 4, "batch_size": 16, "num_generations": 4, "max_completion_length": 10, "beta": 0.0,
        "warmup_ratio": 0.0, "temperature": 1.0, "lr_schedule": "constant"}


def test_the_pipeline_draws_what_the_steps_in_turn_draw_when_the_weights_stay(warm):
    """With a learning rate too small to move a weight, a pipelined run's rollouts (each step's but the first drawn in
    the background during the step before, by the shadow policy, with that step's own seed) are exactly the
    sequential run's, step by step, and every step after the first trained on them. Would catch the background
    rollouts paired with another step's prompts, drawn under another step's seed, or never used."""
    model, tok = warm
    rows = [{"prompt": w} for w in WORDS[:8]] * 2
    seq, seq_seen = _pipeline_run(model, tok, Recipe(**PIPE, learning_rate=1e-12, pipeline=False), rows)
    pip, pip_seen = _pipeline_run(model, tok, Recipe(**PIPE, learning_rate=1e-12, pipeline=True), rows)
    assert [s.pipelined for s in pip.steps] == [0.0, 1.0, 1.0, 1.0]
    assert all(s.pipelined is None for s in seq.steps)
    assert len(seq_seen) == len(pip_seen) == 4 and pip_seen == seq_seen
    assert pip.tokens_generated == seq.tokens_generated


def test_the_shadow_policy_computes_with_its_own_weights_not_the_learners(warm):
    """The pipeline's shadow is copied from the trainer's model, which TRL has patched with a fused LM head whose
    forward is a closure over the live model: the copy must be unpatched, or its prefill (and every token, off the
    compact decoder) reads the weights the learner is updating in the other thread. Would catch the copy left patched
    (an outside review of the policy layer found it: the test above moves no weight, so it could not see it)."""
    from trl.trainer.utils import add_fused_lm_head

    from policies.train import _Pipeline

    model, tok = warm
    live = copy.deepcopy(model)
    add_fused_lm_head(live, temperature=1.0, outputs=("log_probs", "entropy"))  # what GRPOTrainer.__init__ does
    pipe = _Pipeline(copy.deepcopy(tok), Recipe(**PIPE))
    try:
        pipe.launch(live, [{"prompt": w} for w in WORDS[:4]], 0)
        assert pipe.take([w for w in WORDS[:4]]) is not None
        ids = torch.tensor([tok(format_prompt(tok, WORDS[0]))["input_ids"]])
        with torch.no_grad():
            before = pipe.shadow(input_ids=ids).logits
            for p in live.parameters():
                p.add_(torch.randn_like(p) * 0.5)  # the learner's update
            after = pipe.shadow(input_ids=ids).logits
        assert torch.equal(before, after)
    finally:
        pipe.close()


def test_a_pipelined_step_takes_its_ratio_against_the_policy_that_drew_its_batch(warm):
    """At a real learning rate, each pipelined step's batch was drawn before the last update: its loss is handed
    the sampling log-probabilities as the PPO ratio's denominator, and the policy has moved from them (ratio != 1),
    by about what one update moves it; the first step is on-policy (no old log-probabilities: ratio 1). Would catch
    a stale batch trained as if on-policy, or a batch drawn from the current weights (no staleness at all)."""
    model, tok = warm
    rows = [{"prompt": w} for w in WORDS[:8]] * 2
    spied: list[dict] = []
    m, _ = _pipeline_run(model, tok, Recipe(**PIPE, learning_rate=3e-3, pipeline=True), rows, spied)
    assert len(spied) == 4 and spied[0]["old"] is None
    for s in spied[1:]:
        assert s["old"] is not None and torch.equal(s["old"], s["sampling"])
        mask = s["mask"].bool()
        moved = (s["own"] - s["old"])[mask].abs()
        assert float(moved.max()) > 10 * logprob_tolerance(), "the batch was drawn by the current weights"
    assert [st.pipelined for st in m.steps] == [0.0, 1.0, 1.0, 1.0]


def test_the_pipeline_stands_down_where_its_ratio_would_not_be_the_policys(warm):
    """top_p < 1 samples from a truncated distribution whose log-probabilities are not the policy's: the steps run
    in turn, with a warning naming why."""
    model, tok = warm
    rows = [{"prompt": w} for w in WORDS[:8]] * 2
    with pytest.warns(UserWarning, match=r"recipe.pipeline: the steps run in turn \(top_p < 1\)"):
        m, _ = _pipeline_run(model, tok, Recipe(**{**PIPE, "steps": 2}, learning_rate=1e-3, pipeline=True, top_p=0.9),
                             rows)
    assert all(s.pipelined is None for s in m.steps)


def test_the_pipeline_stands_down_under_replay_whose_prompts_it_cannot_launch(warm):
    """A replay pool swaps its prompts into each step's, so a batch launched for the dataloader's next prompts is never
    the step's: it was decoded, thrown away and never charged (an outside review: 437 tokens decoded, 239 charged).
    Would catch the pipeline left on under replay."""
    model, tok = warm
    rows = [{"prompt": w} for w in WORDS[:8]] * 2
    with pytest.warns(UserWarning, match=r"recipe.pipeline: the steps run in turn \(replay mixes"):
        m, _ = _pipeline_run(model, tok, Recipe(**{**PIPE, "steps": 2}, learning_rate=1e-3, pipeline=True, replay=0.5,
                                                drop_dead_groups=True), rows)
    assert all(s.pipelined is None for s in m.steps)


def test_several_passes_over_a_batch_keep_the_stage_figures_finite(warm):
    """With num_iterations 2 TRL scores a batch every other step and the steps between log no reward: the stage's
    dead-group share is over the steps that generated (it was nan: a plain mean over every step)."""
    from policies.train import train_grpo

    model, tok = warm
    rows = [{"prompt": w} for w in WORDS[:8]] * 2
    m = train_grpo(copy.deepcopy(model), tok, rows, lambda prompts, completions, **kw: [float(c.count("a"))
                                                                                       for c in completions],
                   Recipe(**PIPE, learning_rate=1e-3, num_iterations=2, pipeline=False))
    assert len(m.steps) == 4 and sum(math.isfinite(s.reward_mean) for s in m.steps) == 2
    assert math.isfinite(m.dead_group_share) and 0 <= m.dead_group_share <= 1


def test_auto_overlaps_the_steps_only_where_the_process_has_a_core_to_spare(warm, monkeypatch):
    """`pipeline: auto` (the default) overlaps a call's steps when the process's cores leave its torch thread count
    idle (one thread on a two-core share: a run training alone), and runs them in turn where a scheduler gave the
    process one core (EVOTRAINER_CORES: the experiment's workers, Ray arms) or torch already uses every core. Would
    catch auto read as on (or off) everywhere, or a share the scheduler set being ignored."""
    from policies import cores, spare_cores
    from policies.train import pipeline_wanted

    model, tok = warm
    rows = [{"prompt": w} for w in WORDS[:8]] * 2
    assert Recipe().pipeline == "auto"
    was = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        monkeypatch.setenv("EVOTRAINER_CORES", "2")
        assert cores() == 2 and spare_cores() == 1 and pipeline_wanted(Recipe())
        m, _ = _pipeline_run(model, tok, Recipe(**PIPE, learning_rate=1e-3), rows)
        assert [s.pipelined for s in m.steps] == [0.0, 1.0, 1.0, 1.0]
        monkeypatch.setenv("EVOTRAINER_CORES", "1")  # a worker's share: no second loop
        assert not pipeline_wanted(Recipe()) and pipeline_wanted(Recipe(pipeline=True))
        m, _ = _pipeline_run(model, tok, Recipe(**PIPE, learning_rate=1e-3), rows)
        assert all(s.pipelined is None for s in m.steps)
        torch.set_num_threads(2)
        monkeypatch.setenv("EVOTRAINER_CORES", "2")  # every core already in torch's threads
        assert not pipeline_wanted(Recipe()) and not pipeline_wanted(Recipe(pipeline=False))
        monkeypatch.setenv("EVOTRAINER_CORES", "two")
        with pytest.raises(ValueError, match="EVOTRAINER_CORES='two': a whole number"):
            cores()
    finally:
        torch.set_num_threads(was)


@pytest.mark.skipif(torch.cuda.is_available(), reason="no pipeline on a GPU: the check would open none to close")
def test_the_logprob_check_closes_the_pipeline_it_opens(warm, monkeypatch):
    """`check_logprobs` builds its trainer as `train_grpo` does, pipeline included where a core is spare; before, it
    never closed it, so `pipeline_active()` stayed true for the rest of the process and the thread trial
    (`harness.threads.step_trial`, which stands down while a pipeline trains) never ran again. Would catch: the
    check's pipeline left open."""
    import policies.train as T

    opened = []

    class Seen(T._Pipeline):  # the check must open one, or the test would pass whatever it does
        def __init__(self, *a, **k):
            opened.append(1)
            super().__init__(*a, **k)

    monkeypatch.setattr(T, "_Pipeline", Seen)
    model, tok = warm
    was = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        monkeypatch.setenv("EVOTRAINER_CORES", "2")
        assert not T.pipeline_active()
        r = check_logprobs(model, tok, WORDS, Recipe(batch_size=16, num_generations=4, max_completion_length=10))
        assert opened and r.tokens > 0 and not T.pipeline_active()
    finally:
        torch.set_num_threads(was)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's fallback; a GPU trains in what the recipe asks")
def test_half_precision_asked_on_a_cpu_trains_in_fp32_and_says_so_once(monkeypatch):
    """A recipe asking bf16 (or fp16) on a machine without a CUDA GPU trains in fp32 with one warning line a process,
    not one per stage and arm, and not none."""
    import warnings as w

    from policies import train

    monkeypatch.setattr(train, "_SAID_CPU_PRECISION", set())
    with w.catch_warnings(record=True) as said:
        w.simplefilter("always")
        args = train._device_args("bf16")
        train._device_args("bf16")
    msgs = [str(x.message) for x in said if "recipe.precision" in str(x.message)]
    assert len(msgs) == 1 and msgs[0].startswith("recipe.precision bf16: no CUDA GPU, so training runs in fp32"), msgs
    assert args == {"use_cpu": True, "bf16": False, "fp16": False}
    with w.catch_warnings():
        w.simplefilter("error")
        train._device_args("auto")  # the default says nothing
