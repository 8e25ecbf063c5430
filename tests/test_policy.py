"""Policy layer on a real tiny model: tokenizer, rollouts, save/load, SFT and GRPO through TRL, bad-input errors.

    .venv/bin/pytest tests/test_policy.py -q
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time

import pytest
import torch
from pydantic import ValidationError

from policies.model import build_model, count_parameters, format_prompt, load_policy, save_policy
from policies.rollout import RolloutBackendError, SamplingParams, generate, plain_generate, vllm_available
from policies.train import Recipe, check_logprobs, logprob_tolerance, train_grpo, train_sft

ALPHABET = "abcd#\n"
WORDS = ["abc", "bcd", "cab", "dab", "abd", "bca", "cba", "dca", "ab\ncd", "dd#a"]


@pytest.fixture(scope="module", autouse=True)
def _threads():
    torch.set_num_threads(2)


def _snapshot(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _assert_all_changed(before, model) -> None:
    same = [n for n, p in model.named_parameters() if torch.equal(before[n], p.detach())]
    assert not same, f"parameters not updated: {same}"


# --- model and tokenizer ----------------------------------------------------------------------------------------------


def test_presets_sizes_and_char_tokenizer_roundtrip(tmp_path):
    tiny, tok = build_model("tiny", ALPHABET)
    small, _ = build_model("small", ALPHABET)
    assert 0.8e6 < count_parameters(tiny) < 1.3e6
    assert 5e6 < count_parameters(small) < 7.5e6
    text = format_prompt(tok, "ab\ncd#") + "dc" + tok.eos_token
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    assert len(ids) == 1 + 6 + 1 + 2 + 1  # bos, 6 chars, sep, 2 chars, eos: one token per character
    assert tok.decode(ids, skip_special_tokens=True) == "ab\ncd#dc"
    assert tok.decode(tok("z")["input_ids"], skip_special_tokens=False) == "<bos><unk>"
    save_policy(tiny, tok, tmp_path / "ck")
    _, tok2 = load_policy(tmp_path / "ck")
    assert tok2(text)["input_ids"] == ids and tok2.padding_side == "left"


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist.*save_pretrained"):
        load_policy(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_policy(tmp_path / "empty")


# --- rollouts ---------------------------------------------------------------------------------------------------------


def test_rollouts_reproducible_and_greedy_matches_generate():
    model, tok = build_model("tiny", ALPHABET, seed=1)
    p = SamplingParams(n=3, temperature=1.0, top_p=0.9, max_new_tokens=12, seed=7, batch_size=8)
    a, b = generate(model, tok, WORDS, p), generate(model, tok, WORDS, p)
    assert a.completions == b.completions and len(a.completions) == 3 * len(WORDS)
    assert a.prompt_index == [i for i in range(len(WORDS)) for _ in range(3)]
    c = generate(model, tok, WORDS, p.model_copy(update={"seed": 8}))
    assert c.completions != a.completions
    assert all(0 < t <= 12 for t in a.tokens) and a.new_tokens == sum(a.tokens) and a.seconds > 0
    # the custom loop (sorted, shrinking batch, shared prefill) is exactly model.generate under greedy decoding
    g = SamplingParams(temperature=0, max_new_tokens=10, batch_size=4)
    assert generate(model, tok, WORDS, g).completions == plain_generate(model, tok, WORDS, g).completions


@pytest.mark.skipif(vllm_available(), reason="vllm and a GPU are here: this test is about hosts without them "
                    "(tests/test_gpu.py runs the vLLM path instead)")
def test_vllm_backend_without_vllm_or_gpu_is_a_clear_error():
    model, tok = build_model("tiny", ALPHABET)
    with pytest.raises(RolloutBackendError, match="backend='transformers'"):
        generate(model, tok, WORDS[:2], SamplingParams(backend="vllm"))
    assert generate(model, tok, WORDS[:1], SamplingParams(backend="auto", max_new_tokens=2)).completions


def test_vllm_engines_are_released_when_superseded(tmp_path, monkeypatch):
    """The engine cache's bookkeeping, with a recording factory in place of vllm.LLM (vLLM itself needs a GPU: its
    real engines are exercised by tests/test_gpu.py). At most VLLM_MAX_ENGINES live; the least recently used one is
    shut down first; release_vllm_engines(keep=...) frees everything else. A cache that never released (the old
    behaviour) fails the first assertion on `closed`."""
    import policies.rollout as R

    closed: list[str] = []

    class Engine:
        def __init__(self, path: str, seed: int) -> None:
            self.path = path

        def shutdown(self) -> None:
            closed.append(self.path)

    monkeypatch.setattr(R, "_VLLM_ENGINES", {})
    monkeypatch.setattr(R, "VLLM_MAX_ENGINES", 2)
    a, b, c = (str((tmp_path / n).resolve()) for n in "abc")
    ea = R._vllm_engine(a, 0, Engine)
    R._vllm_engine(b, 0, Engine)
    assert R._vllm_engine(a, 0, Engine) is ea and not closed  # cached, and now the most recently used
    R._vllm_engine(c, 0, Engine)  # a third checkpoint: b (least recently used) goes
    assert closed == [b] and list(R._VLLM_ENGINES) == [a, c]
    assert R.release_vllm_engines(keep=[tmp_path / "c"]) == [a]
    assert closed == [b, a] and list(R._VLLM_ENGINES) == [c]
    assert R.release_vllm_engines() == [c] and not R._VLLM_ENGINES


# --- training ---------------------------------------------------------------------------------------------------------


def test_batch_not_divisible_by_num_generations_fails_at_recipe_time():
    with pytest.raises(ValidationError, match=r"batch_size \(30\).*num_generations \(8\).*e\.g\. 24 or 32"):
        Recipe(batch_size=30, num_generations=8)
    with pytest.raises(ValidationError, match="extra"):
        Recipe(learning_rte=1e-3)


def test_sft_updates_every_parameter_and_saves(tmp_path):
    model, tok = build_model("tiny", ALPHABET)
    before = _snapshot(model)
    pairs = [{"prompt": w, "completion": w[::-1]} for w in WORDS] * 2
    m = train_sft(model, tok, pairs, Recipe(sft_steps=3, sft_batch_size=8, warmup_ratio=0.0), out_dir=tmp_path / "sft")
    _assert_all_changed(before, model)
    assert len(m.loss) == 3 and m.examples == len(pairs) and m.wall_s > 0
    # save -> load -> generate gives identical outputs
    p = SamplingParams(n=2, max_new_tokens=8, seed=3)
    loaded, tok2 = load_policy(tmp_path / "sft")
    assert generate(model, tok, WORDS, p).completions == generate(loaded, tok2, WORDS, p).completions


@pytest.mark.parametrize("engine,beta", [("policies", 0.05), ("trl", 0.0)])
def test_grpo_updates_every_parameter_and_reward_sees_columns(tmp_path, engine, beta, monkeypatch):
    import tempfile

    scratch = tmp_path / "scratch"  # TRL's output dir and the KL reference's weights go to temporary folders
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    made: list[str] = []
    real_mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **k: made.append(real_mkdtemp(*a, **k)) or made[-1])
    model, tok = build_model("tiny", ALPHABET, seed=2)
    before = _snapshot(model)
    seen: list[tuple[str, str]] = []
    steps_seen: list[int] = []

    def reward(prompts, completions, instance, **kw):
        assert len(prompts) == len(completions) == len(instance)
        seen.extend((p, json.loads(i)["word"]) for p, i in zip(prompts, instance))
        return [float(c.count("a")) + 0.1 * len(c) for c in completions]

    rows = [{"prompt": w, "instance": json.dumps({"word": w})} for w in WORDS[:4]]
    recipe = Recipe(steps=2, batch_size=8, num_generations=4, max_completion_length=8, learning_rate=1e-3, beta=beta,
                    warmup_ratio=0.0, rollout_engine=engine)
    m = train_grpo(model, tok, rows, reward, recipe, out_dir=tmp_path / "grpo",
                   progress=lambda stage, step, total, logs: steps_seen.append(step))
    _assert_all_changed(before, model)
    assert seen and all(p == w for p, w in seen)  # raw prompt text and its own instance column arrive together
    assert steps_seen == [1, 2] and [s.step for s in m.steps] == [1, 2]
    s = m.steps[0]
    assert 0 <= s.dead_group_share <= 1 and s.completion_length > 0 and s.tokens_generated > 0
    # an untrained model under an 8-token budget: some completions are cut off (the diagnosis's grpo.truncated)
    assert all(x.clipped_ratio is not None and 0 < x.clipped_ratio <= 1 for x in m.steps), m.steps
    assert m.tokens_generated == sum(x.tokens_generated for x in m.steps)
    assert (s.kl is not None) == (beta > 0)
    assert (tmp_path / "grpo" / "config.json").exists()
    assert bool(made) == (beta > 0)  # the KL reference was saved to a temporary folder...
    assert not [d for d in made if os.path.exists(d)]  # ...that does not outlive the call (one per stage filled /tmp)


# --- dynamic sampling: dead groups dropped, extra groups sampled ------------------------------------------------------


def test_keep_live_groups_slices_rows_and_recounts_tokens():
    from policies.train import keep_live_groups

    adv = torch.tensor([0, 0, 0, 0, 1.0, -1, 0, 0, 0, 0, 0, 0, 0.5, -0.5, 0, 0])
    mask = torch.zeros(16, 6, dtype=torch.long)
    mask[:, :3] = 1
    mask[13, :5] = 1  # one long completion in the last live group
    batch = {"advantages": adv, "completion_mask": mask, "completion_ids": torch.arange(96).view(16, 6),
             "prompt_ids": torch.arange(16)[:, None].repeat(1, 2), "num_items_in_batch": mask.sum(),
             "sampling_per_token_logps": torch.randn(16, 6), "extra": [f"r{i}" for i in range(16)], "scalar": 7}
    out, live = keep_live_groups(batch, group=4, keep=1)
    assert live == 1 and out["advantages"].tolist() == [1.0, -1, 0, 0] and out["extra"] == ["r4", "r5", "r6", "r7"]
    assert out["completion_ids"].shape == (4, 3) and out["num_items_in_batch"] == 12 and out["scalar"] == 7
    out, live = keep_live_groups(batch, group=4, keep=8)
    assert live == 2 and out["prompt_ids"][:, 0].tolist() == [4, 5, 6, 7, 12, 13, 14, 15]
    assert out["completion_ids"].shape == (8, 5) and out["num_items_in_batch"] == 3 * 7 + 5
    dead = {**batch, "advantages": torch.zeros(16)}
    out, live = keep_live_groups(dead, group=4, keep=2)
    assert live == 0 and out["advantages"].shape == (4,)  # one (zero-gradient) group keeps the step running


def test_a_tied_group_whose_float_mean_missed_its_rewards_is_dead_for_dropping_and_for_the_pool():
    """All-valid groups rewarded 1/6 (partial credit) or 0.3 (`reward_scale`): TRL's float32 mean misses the rewards by
    a unit in the last place and its std's epsilon turns that into a small advantage every member shares. Such a group
    is dead for `drop_dead_groups` and the replay pool (its advantages all equal) while pruning, which keeps the
    loss's own terms, still reads any nonzero advantage. Would catch a tied group kept in place of one whose rewards
    differ."""
    from policies.train import keep_live_groups, live_group_mask

    rewards = torch.tensor([[1 / 6] * 8, [0.3] * 8, [1.0, 0, 0, 1, 0, 0, 0, 0]], dtype=torch.float32)
    mean, std = rewards.mean(dim=1, keepdim=True), rewards.std(dim=1, keepdim=True)
    adv = ((rewards - mean) / (std + 1e-4)).flatten()  # TRL's group advantages
    assert (adv[:16] != 0).any()  # the float noise this is about (else the test would pass whatever the mask did)
    assert live_group_mask(adv, 8, exact=False).tolist() == [False, False, True]
    assert live_group_mask(adv, 8).tolist()[2] and live_group_mask(torch.tensor([float("nan")] * 8), 8, exact=False)[0]
    mask = torch.ones(24, 3, dtype=torch.long)
    out, live = keep_live_groups({"advantages": adv, "completion_mask": mask, "num_items_in_batch": mask.sum()},
                                 group=8, keep=1)
    assert live == 1 and torch.equal(out["advantages"], adv[16:])


def test_dropping_dead_groups_leaves_the_gradient_direction_unchanged():
    """Dead groups have zero advantage, so with beta 0 they add nothing to the policy gradient: the gradient over the
    live rows has the same direction (only the token normaliser differs). A mis-sliced batch (advantages paired with
    other rows' completions) would turn it."""
    from policies.train import _grpo_trainer, _wrap_reward, keep_live_groups

    model, tok = _warm()

    def reward(prompts, completions, **kw):  # prompts starting with 'a' always tie (dead), others vary
        return [0.0 if p.startswith("a") else float(c.count("a")) for p, c in zip(prompts, completions)]

    recipe = Recipe(steps=1, batch_size=32, num_generations=4, max_completion_length=8, beta=0.0, warmup_ratio=0.0,
                    drop_dead_groups=False, temperature=1.0)
    trainer = _grpo_trainer(model, tok, [{"prompt": w} for w in WORDS[:8]], _wrap_reward(reward, 1.0, [0]), recipe,
                            None, [])
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train(), which this test does not run
    inputs = [dict(trainer.train_dataset[i]) for i in range(8) for _ in range(4)]
    batch = trainer._generate_and_score_completions(inputs)
    grads = []
    for b in (batch, keep_live_groups(batch, 4, 8)[0]):
        model.zero_grad()
        trainer.compute_loss(trainer.model, b).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    live = keep_live_groups(batch, 4, 8)[1]
    assert 0 < live < 8
    cos = torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0)
    assert cos > 0.9999, float(cos)
    ratio = float(grads[1].norm() / grads[0].norm())
    assert ratio == pytest.approx(float(batch["num_items_in_batch"]) /
                                  float(keep_live_groups(batch, 4, 8)[0]["num_items_in_batch"]), rel=1e-3)


def test_oversampling_trains_on_live_groups_and_needs_dropping():
    with pytest.raises(ValidationError, match="oversample=2 samples extra groups"):
        Recipe(oversample=2, drop_dead_groups=False)
    assert Recipe(batch_size=32, num_generations=8, oversample=3, drop_dead_groups=True).prompts_per_step == 12
    assert Recipe().drop_dead_groups is False  # off by default: TRL's exact objective unless asked
    model, tok = _warm()
    rows = [{"prompt": w} for w in WORDS]
    recipe = Recipe(steps=2, batch_size=8, num_generations=4, max_completion_length=8, oversample=2, beta=0.0,
                    warmup_ratio=0.0, temperature=1.0, drop_dead_groups=True)
    m = train_grpo(model, tok, rows, lambda p, c, **kw: [float(x.count("a")) for x in c], recipe)
    assert [s.step for s in m.steps] == [1, 2]
    assert all(s.live_groups is not None and 0 <= s.live_groups <= 2 for s in m.steps)


def test_replay_pool_swaps_the_last_groups_for_recently_live_prompts():
    from policies.train import ReplayPool

    def step(names):
        return [{"prompt_text": n, "prompt": "<" + n, "i": j} for n in names for j in range(2)]

    pool = ReplayPool(size=3, share=0.5, group=2, seed=0)
    first = step(["p0", "p1", "p2", "p3"])
    assert pool.mix(first) == (first, 0)  # nothing live yet
    pool.add(first, [1, 3])
    mixed, k = pool.mix(step(["q0", "q1", "q2", "q3"]))
    assert k == 2
    names = [r["prompt_text"] for r in mixed]
    assert names[:4] == ["q0", "q0", "q1", "q1"]  # fresh groups first, whole
    assert sorted(names[4:]) == ["p1", "p1", "p3", "p3"] and names[4] == names[5] and names[6] == names[7]
    # a prompt already sampled fresh this step is not drawn again
    mixed, k = pool.mix(step(["p1", "q1", "q2", "q3"]))
    assert k == 1 and [r["prompt_text"] for r in mixed][6:] == ["p3", "p3"]
    # live again moves to the front; the oldest falls off
    pool.add(step(["p4", "p5", "p3"]), [0, 1, 2])
    assert [r["prompt_text"] for r in pool.items] == ["p4", "p5", "p3"]
    with pytest.raises(ValidationError, match="replay=0.5 replaces fresh prompts"):
        Recipe(replay=0.5)


def test_grpo_replays_only_prompts_whose_groups_were_live():
    """With `replay`, prompts come back only after a step in which their group's rewards differed. Every prompt of the
    data is distinct and the run is shorter than one pass, so a prompt seen twice is a replay: a pool that replayed
    dead groups, or none, or broke a group apart, fails here."""
    model, tok = _warm()
    words = ["".join(p) for p in itertools.product("abcd", repeat=4)]  # 256 distinct prompts
    calls: list[list[tuple[str, float]]] = []

    def reward(prompts, completions, **kw):  # prompts starting with 'b' always score 0: their groups are dead
        out = [0.0 if p.startswith("b") else float(c.count("a")) for p, c in zip(prompts, completions)]
        calls.append(list(zip(prompts, out)))
        return out

    recipe = Recipe(steps=6, batch_size=8, num_generations=4, max_completion_length=8, oversample=2, beta=0.0,
                    warmup_ratio=0.0, temperature=1.0, drop_dead_groups=True, replay=0.5)
    m = train_grpo(model, tok, [{"prompt": w} for w in words], reward, recipe)
    assert [s.step for s in m.steps] == list(range(1, 7)) and len(calls) == 6
    assert m.steps[0].replayed_groups == 0 and sum(s.replayed_groups for s in m.steps) > 0
    seen: set[str] = set()
    live: set[str] = set()
    replays = 0
    for call in calls:
        groups = [call[i:i + 4] for i in range(0, len(call), 4)]
        assert all(len({p for p, _ in g}) == 1 for g in groups)  # groups stay whole
        for g in groups:
            word = g[0][0]
            if word in seen:
                replays += 1
                assert word in live, f"{word} replayed without ever being live"
        seen |= {g[0][0] for g in groups}
        live |= {g[0][0] for g in groups if len({r for _, r in g}) > 1}
    assert replays == sum(s.replayed_groups for s in m.steps)
    assert not any(w.startswith("b") for w in live)


def test_time_budget_stops_training_and_anneals_the_rate_to_zero():
    from transformers import TrainerCallback

    from policies.train import time_budget

    model, tok = _warm()
    seen: list[float] = []
    shares: list[float] = []
    budget, peak = 3.0, 1e-3

    class Spy(TrainerCallback):  # runs right after the budget's callback: its clock is the budget's to a few ms
        def on_train_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kw):
            shares.append((time.perf_counter() - self.t0) / budget)

        def on_optimizer_step(self, args, state, control, optimizer=None, **kw):
            seen.append(optimizer.param_groups[0]["lr"])

    recipe = Recipe(steps=10_000, batch_size=8, num_generations=4, max_completion_length=8, beta=0.0,
                    warmup_ratio=0.0, lr_schedule="constant", learning_rate=peak, temperature=1.0)
    m = train_grpo(model, tok, [{"prompt": w} for w in WORDS], lambda p, c, **kw: [float(x.count("a")) for x in c],
                   recipe, callbacks=[time_budget(budget), Spy()])
    assert 3 <= len(m.steps) < 10_000  # stopped by the clock, not by the step count
    # the rate is a cosine of the elapsed share of the budget at each step, whatever the machine's load (a check of
    # the first and last values alone failed on a loaded machine whose first step came late)
    for lr, share in zip(seen, shares, strict=True):
        assert abs(lr / peak - 0.5 * (1 + math.cos(math.pi * min(1.0, share)))) < 0.03, (lr, share)
    assert shares[-1] > 0.5 and seen[-1] < 0.5 * seen[0]  # it did anneal, and ran well into the budget
    assert all(a >= b for a, b in itertools.pairwise(seen))


def test_sft_under_a_time_budget_reports_the_steps_it_took():
    """The supervised reference of ladder rung 3 trains by the clock: a constant schedule with `time_budget` on top
    stops long before the nominal step count, anneals to near zero, and `SFTMetrics.steps` is what ran, not the
    recipe's nominal count (it was `recipe.sft_steps` before, which would report 10,000 here)."""
    from transformers import TrainerCallback

    from policies.train import time_budget

    model, tok = build_model("tiny", ALPHABET)
    seen: list[float] = []

    class Spy(TrainerCallback):
        def on_optimizer_step(self, args, state, control, optimizer=None, **kw):
            seen.append(optimizer.param_groups[0]["lr"])

    pairs = [{"prompt": w, "completion": w[::-1]} for w in WORDS] * 50
    m = train_sft(model, tok, pairs, Recipe(sft_steps=10_000, sft_batch_size=8, warmup_ratio=0.0,
                                            sft_learning_rate=1e-3),
                  callbacks=[time_budget(2.0), Spy()], schedule="constant")
    assert 2 <= m.steps < 10_000 and m.steps == len(seen) == len(m.loss)
    assert seen[0] > 0.9e-3 and seen[-1] < 0.25e-3
    assert all(a >= b for a, b in itertools.pairwise(seen))


# --- plumbing: the trainer scores what the sampler drew ---------------------------------------------------------------


def _warm(seed: int = 4):
    """A tiny model after a few SFT steps, so completions end at <eos> as in real use."""
    model, tok = build_model("tiny", ALPHABET, seed=seed)
    pairs = [{"prompt": w, "completion": w[::-1]} for w in WORDS] * 3
    train_sft(model, tok, pairs, Recipe(sft_steps=20, sft_batch_size=8, warmup_ratio=0.0))
    return model, tok


@pytest.mark.parametrize("engine,temperature,top_p", [("policies", 0.6, 1.0), ("policies", 1.0, 0.95),
                                                      ("trl", 0.6, 1.0)])
def test_sampler_and_trainer_log_probs_agree(engine, temperature, top_p):
    """Rung 1 of the learning ladder: per-token log-probs of the sampling distribution equal the trainer's to 1e-3
    (prompt formatting, BOS/EOS, padding, masks and temperature all agree), and the first iteration's ratio is 1.
    With top-p < 1 TRL's loss scores the untruncated distribution while the draw renormalised the kept mass, so the
    two differ by the log of the kept mass, at most -log(top_p): a known, bounded off-policy gap."""
    model, tok = _warm()
    recipe = Recipe(batch_size=16, num_generations=4, max_completion_length=10, temperature=temperature, top_p=top_p,
                    rollout_engine=engine)
    r = check_logprobs(model, tok, WORDS, recipe)
    assert r.engine == engine and r.completions == 16 and r.tokens > 16
    assert r.max_ratio_dev < 1e-5
    if top_p == 1.0:
        assert r.max_abs_diff < logprob_tolerance(), r  # 1e-3 (1/16 under bf16 on a GPU)
    else:  # the sampler renormalises the kept mass (>= top_p), TRL's loss does not: off by at most -log(top_p)
        assert r.max_abs_diff <= -math.log(top_p) + logprob_tolerance(), r


def test_a_copy_of_a_trained_model_runs_its_own_weights():
    """TRL installs a fused LM head as an instance attribute whose closure holds the ORIGINAL object's forward; the
    run's in-memory checkpoint cache deep-copies models, so without `unpatch_forward` every copy generated and was
    evaluated with the weights of the model it was copied from (the loop's arms tied at +0.000 for that reason).
    The check_logprobs negative control: reintroduce the stale patch and the sampler/trainer mismatch is caught."""
    import copy

    model, tok = _warm()
    assert "forward" not in model.__dict__, "training must leave no patched forward behind"
    x = torch.tensor([tok(format_prompt(tok, "abc"))["input_ids"]])

    def perturbed(m):
        c = copy.deepcopy(m)
        with torch.no_grad():
            for p in c.parameters():
                p.add_(0.05 * torch.randn_like(p))
        return c

    with torch.no_grad():
        assert not torch.allclose(model(input_ids=x).logits, perturbed(model)(input_ids=x).logits)
    # the bug, reintroduced by hand: a copy of a still-patched model generates with the original's weights
    from trl.trainer.utils import add_fused_lm_head

    add_fused_lm_head(model)
    stale = perturbed(model)
    with torch.no_grad():
        assert torch.allclose(model(input_ids=x).logits, stale(input_ids=x).logits)
    bad = check_logprobs(stale, tok, WORDS, Recipe(batch_size=16, num_generations=4, max_completion_length=10))
    assert bad.max_abs_diff > 1e-2, bad


def test_a_killed_processs_scratch_folders_are_removed_by_the_next_one(tmp_path):
    """TRL's output_dir and the KL reference's weights go to a scratch folder named with its process id, removed
    when the training call ends; a SIGKILLed process cannot remove its own, so the next call sweeps the folders of
    processes that are gone (the kill trials left 63 in /tmp). Would catch a sweep that removes a live process's
    folder, or none."""
    import subprocess
    import sys

    from policies.train import SCRATCH_PREFIX, _sweep_orphans

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        for pid in (dead.pid, live.pid, os.getpid()):
            (tmp_path / f"{SCRATCH_PREFIX}{pid}-abc" / "reference").mkdir(parents=True)
        (tmp_path / f"{SCRATCH_PREFIX}oldstyle").mkdir()
        assert _sweep_orphans(tmp_path) == 1
        left = sorted(p.name for p in tmp_path.iterdir())
        assert left == sorted([f"{SCRATCH_PREFIX}{live.pid}-abc", f"{SCRATCH_PREFIX}{os.getpid()}-abc",
                               f"{SCRATCH_PREFIX}oldstyle"])
    finally:
        live.kill()
        live.wait()


def test_a_steps_reward_is_recorded_in_the_tasks_units_whatever_the_reward_scale():
    """`reward_scale` multiplies every reward before the advantages; the step's recorded reward is the task's own (as
    `RewardBatch` records it), so a diagnostic reading a rise in reward (reward hacking: an absolute 0.05) reads the
    same rise whatever scale an arm trains at. Would catch the scaled mean recorded (4.0 here for a reward of 1)."""
    model, tok = _warm()
    recipe = Recipe(steps=1, batch_size=8, num_generations=4, max_completion_length=6, beta=0.0, warmup_ratio=0.0,
                    temperature=1.0, reward_scale=4.0)
    m = train_grpo(model, tok, [{"prompt": w} for w in WORDS], lambda p, c, **kw: [1.0] * len(c), recipe)
    assert [round(s.reward_mean, 6) for s in m.steps] == [1.0] and m.steps[0].reward_std == 0.0
