"""A real-shaped Hugging Face chat checkpoint through the loop on CPU: a Qwen3-architecture model (random weights, ~0.2M
parameters) with a byte-level BPE tokenizer trained here on the task families' chat text, Qwen's special tokens and a
chat template (`policies.chat_fixture`), built once per session. Nothing is downloaded.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/test_chat_checkpoint.py

What each test pins is in its docstring; the checkpoint is shaped like a Qwen3 *base* model: EOS `<|endoftext|>`,
end of turn `<|im_end|>` (not the EOS, and not in the generation config), pad `<|pad|>`, `<think>` a plain added token.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.policy_glue import task_texts
from harness.tasks import TASKS, get_task, score_all, split_think
from policies.chat_fixture import END_THINK, EOS, IM_END, PAD, QWEN_CHAT_TEMPLATE, THINK, build_chat_fixture
from policies.model import (
    PolicyLoadError,
    end_of_turn_token,
    format_prompt,
    load_policy,
    load_tokenizer,
    stop_token_ids,
)
from policies.rollout import SamplingParams, generate, plain_generate

pytestmark = pytest.mark.usefixtures("one_torch_thread")
runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def chat_ckpt(tmp_path_factory) -> Path:
    return build_chat_fixture(tmp_path_factory.mktemp("chat") / "qwen3-tiny", task_texts(n=100))


def _always(model, token_id: int) -> None:
    """Make the model emit `token_id` at every step (an LM head whose bias picks it): a deterministic stand-in for a
    model that has learned to end its turn."""
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[token_id] = 50.0  # probability 1 - 1e-18 even when sampling
    model.lm_head = head


# --- the checkpoint ---------------------------------------------------------------------------------------------------


def test_the_fixture_is_shaped_like_a_qwen3_chat_checkpoint(chat_ckpt):
    """Architecture, byte-level BPE with merges, specials where Qwen3-Base has them. Catches a fixture that silently
    degrades to a char tokenizer or lets EOS, pad and end of turn coincide (the cases the loop must handle)."""
    cfg = json.loads((chat_ckpt / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    model, tok = load_policy(chat_ckpt)
    assert 1e5 < sum(p.numel() for p in model.parameters()) < 5e6
    assert tok.eos_token == EOS and tok.pad_token == PAD and tok.pad_token_id != tok.eos_token_id
    assert tok.convert_tokens_to_ids(IM_END) != tok.eos_token_id
    assert tok.padding_side == "left"  # load_policy pads on the left for generation (saved as right, like Qwen)
    words = tok.tokenize("Agent A: RIGHT RIGHT DOWN WAIT")
    assert len(words) < len("Agent A: RIGHT RIGHT DOWN WAIT") / 2, words  # merges learned: not one token per char
    assert tok.tokenize(THINK) == [THINK] and tok.tokenize(END_THINK) == [END_THINK]
    assert tok.decode(tok(f"{THINK}x{END_THINK}y")["input_ids"], skip_special_tokens=True) == f"{THINK}x{END_THINK}y"
    assert format_prompt(tok, "What is 2+3?").endswith("<|im_start|>assistant\n")
    # the end-of-turn token comes from the template; loading adds it to the generation config (TRL and vLLM read it)
    assert end_of_turn_token(tok) == IM_END
    on_disk = json.loads((chat_ckpt / "generation_config.json").read_text())["eos_token_id"]
    assert on_disk == tok.eos_token_id
    assert tok.convert_tokens_to_ids(IM_END) in model.generation_config.eos_token_id
    assert stop_token_ids(tok, model) == [tok.eos_token_id, tok.convert_tokens_to_ids(IM_END)]


# --- rollouts ---------------------------------------------------------------------------------------------------------


def test_rollouts_stop_at_the_end_of_turn_token_not_only_eos(chat_ckpt):
    """A model that ends its turn with `<|im_end|>` (not its EOS) stops there in both rollout paths: one token, not
    truncated. Before, our loop and the model.generate reference ran to max_new_tokens past the end of the turn."""
    model, tok = load_policy(chat_ckpt)
    _always(model, tok.convert_tokens_to_ids(IM_END))
    params = SamplingParams(temperature=1.0, max_new_tokens=12, n=2)
    for res in (generate(model, tok, ["What is 2+3?", "Agent A: go"], params),
                plain_generate(model, tok, ["What is 2+3?", "Agent A: go"], params)):
        assert res.tokens == [1, 1, 1, 1] and not any(res.truncated) and res.completions == ["", "", "", ""]


def test_the_vllm_path_sends_the_token_ids_the_policy_trained_on(chat_ckpt, monkeypatch):
    """vLLM tokenizes a text prompt with its special tokens, so a chat template that writes its own BOS (Llama 3,
    Gemma) got two, and every probe, judgement and test on `backend: vllm` read another input than training's (an
    outside review, seventy-ninth session). The vLLM path now sends token ids, the very ones the transformers path
    decodes from, here for a template given a BOS of its own. vLLM needs a GPU: a stand-in engine records what it is
    given. Would catch text sent to vLLM, or ids tokenized with special tokens after a chat template."""
    import types

    import policies.rollout as R

    _, tok = load_policy(chat_ckpt)
    tok.bos_token = EOS  # a BOS the template writes itself, as Llama 3's does
    tok.chat_template = "{{ bos_token }}" + tok.chat_template
    seen: list = []

    class Engine:
        def generate(self, prompts, sp, use_tqdm=False):
            seen.extend(prompts)
            done = types.SimpleNamespace(text="", token_ids=[], finish_reason="stop")
            return [types.SimpleNamespace(outputs=[done]) for _ in prompts]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=lambda **kw: kw))
    monkeypatch.setattr(R, "resolve_backend", lambda b: b)
    monkeypatch.setattr(R, "_vllm_engine", lambda path, seed: Engine())
    generate(str(chat_ckpt), tok, ["What is 2+3?"], SamplingParams(backend="vllm", max_new_tokens=4))
    [prompt] = seen
    want = tok(format_prompt(tok, "What is 2+3?"), add_special_tokens=False)["input_ids"]
    assert prompt == {"prompt_token_ids": want} and want.count(tok.bos_token_id) == 1


def test_chat_prompts_are_left_padded_so_a_batch_equals_each_prompt_alone(chat_ckpt):
    """Prompts of different lengths decoded together (left padding, positions from the mask) give the same greedy
    completions as each prompt alone, through the chat template. Catches right padding or positions that count pads."""
    model, tok = load_policy(chat_ckpt)
    prompts = ["What is 2+3?", "What is 12-7? Reply with the final answer only, as `= <integer>`.", "Hi"]
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    together = generate(model, tok, prompts, params).completions
    alone = [generate(model, tok, [p], params).completions[0] for p in prompts]
    assert together == alone
    assert len({len(tok(format_prompt(tok, p))["input_ids"]) for p in prompts}) == 3  # padding really happened


def test_a_think_block_is_stripped_before_scoring_and_its_length_reported():
    """The scorer sees the answer after `</think>`; the block's length becomes the `think_chars` metric. A wrong plan
    inside the block does not count, an unclosed block leaves no answer. Catches scoring the reasoning as the answer
    (the code family's parser takes the first code block, so a draft in the thinking would fail a right answer)."""
    task = get_task("mapf")
    inst = task.generate(task.default_config(), 3)
    good = task.expert(inst, "chat")
    block = f"{THINK}Agent A: UP UP UP\nno wait{END_THINK}"
    assert split_think(f"{block}\n\n{good}") == (good, len(block))
    assert split_think(good) == (good, 0)
    # a block the chat template opened in the prompt (R1 distills, QwQ): the completion only closes it
    opened = f"Agent A: UP UP UP\nno wait{END_THINK}"
    assert split_think(f"{opened}\n\n{good}") == (good, len(opened))
    # a plain-style code body keeps its indentation (stripped, it was a syntax error)
    assert split_think(f"{THINK}x{END_THINK}\n    return x\n") == ("    return x\n", len(f"{THINK}x{END_THINK}"))
    [ok, unclosed, plain] = score_all(task, [(inst, f"{block}\n\n{good}"), (inst, f"{THINK}Agent A: UP"),
                                             (inst, good)])
    assert ok.valid and ok.metrics["think_chars"] == len(block)
    assert not unclosed.valid and unclosed.metrics["think_chars"] == len(f"{THINK}Agent A: UP")
    assert plain.valid and "think_chars" not in plain.metrics
    # the code family reads the first ```python block: a draft inside the thinking would be scored without the strip
    code = get_task("code")
    inst = code.generate(code.default_config(), 3)
    draft = f"{THINK}Draft:\n```python\ndef f():\n    pass\n```\nNo, better:{END_THINK}\n"
    answer = code.expert(inst, "chat")
    assert not code.score(inst, draft + answer).valid
    assert score_all(code, [(inst, draft + answer)])[0].valid


def test_rung1_sampler_and_trainer_log_probs_agree_on_the_bpe_chat_tokenizer(chat_ckpt):
    """Rung 1 of the learning ladder on this tokenizer: the chat-templated prompt, byte-level BPE, the pad distinct from
    EOS and the end-of-turn stop give the trainer the same per-token log-probs as the sampler (to 1e-3)."""
    from policies.train import Recipe, check_logprobs, logprob_tolerance

    model, tok = load_policy(chat_ckpt)
    prompts = ["What is 2+3?", "What is 41-17?", "Hi there", "What is 7+8? Reply with the final answer only."]
    r = check_logprobs(model, tok, prompts, Recipe(batch_size=8, num_generations=4, max_completion_length=8,
                                                   temperature=0.7))
    assert r.completions == 8 and r.tokens >= 8
    assert r.max_abs_diff < logprob_tolerance() and r.max_ratio_dev < 1e-5, r  # 1e-3; bf16 on a GPU: 1/16


@pytest.mark.parametrize("family", sorted(TASKS))
def test_each_familys_chat_style_learns_stops_and_scores_on_the_chat_checkpoint(chat_ckpt, family):
    """Every task family's `chat` style, end to end on the BPE chat checkpoint: its expert chat answer survives the
    byte-level tokenizer (code's indentation and newlines, MAPF's move lines), the SFT through the chat template
    teaches the answer and the end of its turn (TRL renders the assistant turn with `<|im_end|>`), and a greedy
    rollout through the template reproduces it, stops (not truncated at the token budget) and is scored valid by the
    family's own scorer. Catches a family without a chat style, a tokenizer that loses bytes, an SFT whose
    completions carry no end token (the rollout would run to its budget), and a scorer that cannot read what a chat
    model writes."""
    from policies.train import Recipe, train_sft

    task = get_task(family)
    assert "chat" in task.spec.styles, task.spec.styles
    inst = task.generate(task.default_config(), 7)
    prompt, answer = task.prompt(inst, "chat"), task.expert(inst, "chat")
    model, tok = load_policy(chat_ckpt)
    ids = tok(answer, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == answer  # lossless byte-level round trip
    assert score_all(task, [(inst, tok.decode(ids + [tok.convert_tokens_to_ids(IM_END)],
                                              skip_special_tokens=True))])[0].valid
    train_sft(model, tok, [{"prompt": prompt, "completion": answer}] * 8,
              Recipe(sft_steps=60, sft_batch_size=8, sft_learning_rate=1e-2))
    res = generate(model, tok, [prompt], SamplingParams(temperature=0.0, max_new_tokens=len(ids) + 16))
    assert not res.truncated[0] and res.tokens[0] <= len(ids) + 4, (res.completions, res.tokens)
    [out] = score_all(task, [(inst, res.completions[0])])
    assert out.valid, (family, res.completions[0], out.failure)


def test_grpo_generation_stops_at_the_end_of_turn_token_too(chat_ckpt):
    """The GRPO trainer's own generation (TRL's, which chat models use) ends each completion at `<|im_end|>`: one
    token per completion in the loss mask, not max_completion_length. It reads the stop tokens from the generation
    config, which `load_policy` extends with the template's end of turn (Qwen3-Base's lists only its EOS)."""
    from policies.train import Recipe, check_logprobs

    model, tok = load_policy(chat_ckpt)
    _always(model, tok.convert_tokens_to_ids(IM_END))
    r = check_logprobs(model, tok, ["What is 2+3?", "Hi"], Recipe(batch_size=8, num_generations=4,
                                                                  max_completion_length=8))
    assert r.engine == "trl" and r.completions == 8 and r.tokens == 8, r


# --- the CLI and the loop ---------------------------------------------------------------------------------------------


def test_env_sample_shows_the_templated_prompt_the_checkpoint_sees(chat_ckpt):
    """`env sample --style chat --checkpoint DIR` prints the prompt through the checkpoint's chat template, generation
    prompt included: what the model sees, not the raw task text."""
    res = runner.invoke(app, ["env", "sample", "--task", "math", "--n", "1", "--style", "chat",
                              "--checkpoint", str(chat_ckpt)])
    assert res.exit_code == 0, res.output
    assert "<|im_start|>user\n" in res.output and "<|im_end|>\n<|im_start|>assistant\n" in res.output
    plain = runner.invoke(app, ["env", "sample", "--task", "math", "--n", "1", "--style", "chat"])
    assert "<|im_start|>" not in plain.output


def test_train_eval_and_run_on_the_chat_checkpoint(chat_ckpt, tmp_path):
    """`train --init` (SFT + GRPO on chat prompts), `eval`, and a one-stage `run` with `policy.checkpoint` all go
    through on the chat checkpoint, and the run's warm start keeps the chat style and the template. The run also
    checks retention in the loop (what is left in checkpoints/) and `status` showing the disk use."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"batch_size": 8, "num_generations": 4, "max_completion_length": 12,
                                      "sft_batch_size": 8, "sft_learning_rate": 3e-3}))
    out = tmp_path / "trained"
    res = runner.invoke(app, ["train", "--init", str(chat_ckpt), "--out", str(out), "--task", "math",
                              "--sft-examples", "32", "--sft-steps", "4", "--grpo-steps", "2",
                              "--recipe", str(recipe), "--threads", "1"])
    assert res.exit_code == 0, res.output
    assert "sft_loss:" in res.output and "grpo_reward:" in res.output
    assert json.loads((out / "evotrainer.json").read_text()) == {"task": "math", "style": "chat"}
    assert load_tokenizer(out).chat_template == QWEN_CHAT_TEMPLATE
    # without --task the checkpoint's own task (its evotrainer.json) is scored, not the mapf default
    res = runner.invoke(app, ["eval", str(out), "--suite", "small", "--max-new-tokens", "8", "--threads", "1"])
    assert res.exit_code == 0, res.output
    assert "math suite 'small' (chat prompts)" in res.output and "valid:" in res.output
    assert "was trained on task" not in res.output and "prompts (its evotrainer.json)" not in res.output
    # another style than the one it was trained on is said, and still scored as asked
    res = runner.invoke(app, ["eval", str(out), "--suite", "small", "--max-new-tokens", "8", "--threads", "1",
                              "--style", "plain"])
    assert res.exit_code == 0, res.output
    assert "was trained on chat prompts" in res.output and "scored here on plain prompts" in res.output
    assert "math suite 'small' (plain prompts)" in res.output

    cfg = {"task": "math", "name": "chat", "policy": {"checkpoint": str(chat_ckpt)},
           "warm_start": {"sft_examples": 16, "sft_steps": 2},
           "recipe": {"steps": 1, "batch_size": 8, "num_generations": 4, "max_completion_length": 8},
           "budget": {"stages": 1}, "stage": {"train_instances": 8, "probe_n": 4, "probe_samples": 2, "candidates": 1},
           "backtest": {"arm_steps": 1, "n": 8, "samples": 1, "carry_confirm": 16}, "engineer": {"kind": "rule"},
           "eval": {"suite": "small", "limit": 4}}
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    res = runner.invoke(app, ["run", str(cfg_path), "--runs-dir", str(tmp_path / "runs"), "--run-id", "chat"])
    assert res.exit_code == 0, res.output
    run_dir = tmp_path / "runs" / "chat"
    ws = run_dir / "checkpoints" / "warmstart"
    assert load_tokenizer(ws).chat_template == QWEN_CHAT_TEMPLATE
    from harness.store import RunStore

    store = RunStore.open(run_dir / "run.db")
    assert store.get_run("chat")["status"] == "finished"
    decide = store.node_result("chat", 1, "decide")
    store.close()
    # retention after the decision: the warm start, the incumbent and a promoted arm stay; the losing arms, the
    # stage's training checkpoint and the SFT's resumable checkpoints are gone
    kept = {p.name for p in (run_dir / "checkpoints").iterdir()}
    want = {"warmstart", Path(decide["next_policy"]).name} | ({f"s1-{decide['winner']}"} if decide["winner"] else set())
    assert kept == want, (kept, decide)
    res = runner.invoke(app, ["status", "chat", "--runs-dir", str(tmp_path / "runs")])
    assert res.exit_code == 0 and f"checkpoints: {len(want)} (" in res.output and "disk_mb: " in res.output


def test_an_experiment_arm_and_the_policy_as_its_own_engineer_on_the_chat_checkpoint(chat_ckpt, tmp_path,
                                                                                      monkeypatch):
    """`evotrainer experiment` on the chat checkpoint: a baseline arm and the evolved arm whose engineer is the policy
    itself (`engineer.model_path: policy`), both from the experiment's one warm start, at equal compute. The policy
    (random weights) writes no valid proposal, so every reply is a recorded rejection with its reason, the rule
    engineer steps in, and the stage goes on. Would catch: the experiment's shared warm start losing the chat
    template, the policy engineer unable to load a BPE chat checkpoint or prompt it, or a bad reply failing the run."""
    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    run = {"task": "math", "name": "chatx", "policy": {"checkpoint": str(chat_ckpt)},
           "warm_start": {"sft_examples": 16, "sft_steps": 2},
           "recipe": {"steps": 1, "batch_size": 8, "num_generations": 4, "max_completion_length": 8},
           "budget": {"stages": 1}, "stage": {"train_instances": 8, "probe_n": 4, "probe_samples": 2, "candidates": 1},
           "backtest": {"arm_steps": 1, "n": 8, "samples": 1, "carry_confirm": 16},
           "engineer": {"kind": "llm", "model_path": "policy", "max_tokens": 16, "max_retries": 0},
           "eval": {"suite": "small", "limit": 4}}
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({"run": run, "arms": ["fixed-template", "evolved-llm"], "seeds": 1}))
    out = tmp_path / "out"
    res = runner.invoke(app, ["experiment", str(exp), "--out", str(out)])
    assert res.exit_code == 0, res.output
    evo = json.loads((out / "evolved-llm" / "seed0" / "result.json").read_text())
    base = json.loads((out / "fixed-template" / "seed0" / "result.json").read_text())
    assert base["budget"] == round(evo["compute"]) and len(base["curve"]) == len(evo["curve"]) == 1
    from harness.store import RunStore

    run_dir = Path(evo["run_dir"])
    assert load_tokenizer(Path(run_dir) / "checkpoints" / "warmstart").chat_template == QWEN_CHAT_TEMPLATE
    store = RunStore.open(run_dir / "run.db")
    try:
        rid = store.runs()[0]
        propose = store.node_result(rid, 1, "propose")
        engineer = [r for r in store.ledger(rid) if r["kind"] == "engineer"]
        rejected = [e["message"] for e in store.events(rid, kind="reply_rejected")]
        said = [e["data"].get("reply") for e in store.events(rid, kind="reply_rejected")]
        notes = [e["message"] for e in store.events(rid, kind="engineer_note")]
    finally:
        store.close()
    assert propose["engineer"] == "rule" and propose["candidates"], propose
    assert len(rejected) == 1 and rejected[0].startswith(("malformed JSON", "schema", "unknown knob", "the reply"))
    assert any(n.startswith("llm engineer gave no valid proposal in 1 attempt") for n in notes), notes
    assert "rule engineer stepped in" in notes
    # the policy-as-engineer's own tokens are in the ledger (kind engineer) and beside the step-equivalents, not in
    # them: the baselines were matched on the policy's compute alone
    assert said[0] is not None  # what the engineer said is kept beside why it was refused
    [row] = engineer
    assert row["label"] == "local propose"  # run here: its seconds count toward budget.compute_s
    assert row["stage"] == 1 and row["tokens"] > 16 and evo["ledger"]["engineer_tokens"] == row["tokens"]
    assert evo["compute"] == pytest.approx(evo["ledger"]["steps"] + evo["ledger"]["judge_tokens"]
                                           / evo["ledger"]["tokens_per_step"])


# --- bad input: one line, before anything trains ----------------------------------------------------------------------


def _variant(src: Path, dst: Path, drop: tuple[str, ...] = (), tok_cfg: dict | None = None,
             cfg: dict | None = None) -> Path:
    """A copy of the checkpoint with files dropped or JSON keys changed (None deletes the key)."""
    import shutil

    shutil.copytree(src, dst)
    for name in drop:
        (dst / name).unlink()
    for name, update in (("tokenizer_config.json", tok_cfg), ("config.json", cfg)):
        if update:
            data = json.loads((dst / name).read_text())
            for k, v in update.items():
                data.pop(k, None) if v is None else data.__setitem__(k, v)
            (dst / name).write_text(json.dumps(data))
    return dst


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", "from harness.cli import main; main()", *args], capture_output=True,
                          text=True, env=env, timeout=300, check=False)


def test_a_checkpoint_without_a_chat_template_is_refused_for_the_chat_style(chat_ckpt, tmp_path):
    """`train --init`, `run` and `env sample` with style chat on a checkpoint that has no chat template stop with one
    line naming the problem and the fixes, before loading weights or creating a run. Before, the prompt silently fell
    back to raw text plus a newline: a chat model trained on prompts it was never formatted for."""
    from harness.config import parse_config
    from harness.lifecycle import RunError, start_run

    bare = _variant(chat_ckpt, tmp_path / "bare", drop=("chat_template.jinja",))
    r = _cli("train", "--init", str(bare), "--out", str(tmp_path / "out"), "--task", "math", "--style", "chat")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "has no chat template" in lines[0], r.stderr
    assert "chat_template" in lines[0] and not (tmp_path / "out").exists()
    cfg = parse_config({"task": "math", "policy": {"checkpoint": str(bare), "style": "chat"}}, "t")
    with pytest.raises(RunError, match="policy.checkpoint: .*has no chat template"):
        start_run(cfg, tmp_path / "runs", run_id="bare")
    assert not (tmp_path / "runs" / "bare").exists()
    res = runner.invoke(app, ["env", "sample", "--task", "math", "--style", "chat", "--checkpoint", str(bare)])
    assert res.exit_code == 2 and "has no chat template" in res.output
    # the same checkpoint with a plain style is fine: the template is needed only for chat prompts
    res = runner.invoke(app, ["env", "sample", "--task", "math", "--style", "plain", "--checkpoint", str(bare)])
    assert res.exit_code == 0, res.output


def test_a_tokenizer_without_a_pad_token_pads_with_eos_and_says_so(chat_ckpt, tmp_path):
    """Chosen behaviour (as TRL and most trainers): pad = EOS, with a warning naming the fix. Generation still works
    and still stops at the end of turn."""
    nopad = _variant(chat_ckpt, tmp_path / "nopad", tok_cfg={"pad_token": None})
    with pytest.warns(UserWarning, match="has no pad token: using its EOS '<\\|endoftext\\|>' as pad; set pad_token"):
        model, tok = load_policy(nopad)
    assert tok.pad_token_id == tok.eos_token_id
    with warnings.catch_warnings(record=True) as again:  # once per checkpoint and process, not at every load
        warnings.simplefilter("always")
        _, tok2 = load_policy(nopad)
    assert tok2.pad_token_id == tok2.eos_token_id and not [w for w in again if "no pad token" in str(w.message)]
    _always(model, tok.convert_tokens_to_ids(IM_END))
    res = generate(model, tok, ["What is 2+3?", "Hi"], SamplingParams(temperature=0.0, max_new_tokens=6))
    assert res.tokens == [1, 1]


def test_a_checkpoint_transformers_cannot_load_fails_in_one_line(chat_ckpt, tmp_path):
    """An unknown model_type (a newer architecture than this transformers) and a model that is not a causal LM each
    raise PolicyLoadError naming the checkpoint and the fix; the CLI prints one line and exits 2 (before: a multi-line
    transformers traceback from deep inside from_pretrained, or a model loaded with the wrong head)."""
    future = _variant(chat_ckpt, tmp_path / "future", cfg={"model_type": "qwen99",
                                                           "architectures": ["Qwen99ForCausalLM"]})
    with pytest.raises(PolicyLoadError, match="cannot load its architecture \\(model_type 'qwen99'.*upgrade"):
        load_policy(future)
    encoder = _variant(chat_ckpt, tmp_path / "encoder", cfg={"model_type": "t5", "architectures": ["T5Model"]})
    with pytest.raises(PolicyLoadError, match="'t5' model, which transformers cannot load as a causal language model"):
        load_policy(encoder)
    r = _cli("eval", str(future), "--task", "math")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "qwen99" in lines[0], r.stderr


def test_the_gpu_example_with_a_chat_checkpoint_fails_on_nothing_but_the_hardware(chat_ckpt, tmp_path):
    """examples/mapf_gpu.yaml with this chat checkpoint in place of its preset (as its comments suggest for a real
    one): the config loads, the checkpoint passes every check (architecture, tokenizer, pad, chat template), and on a
    machine without vLLM or a GPU the only error is the hardware's, in one line, before a run folder exists."""
    from harness.config import parse_config
    from harness.lifecycle import RunError, start_run
    from policies.rollout import vllm_available

    if vllm_available():
        pytest.skip("vLLM and a GPU are here: this test checks the CPU-side refusal (tests/test_gpu.py runs the GPU)")
    data = yaml.safe_load((ROOT / "examples" / "mapf_gpu.yaml").read_text())
    data["policy"] = {"checkpoint": str(chat_ckpt), "style": "chat", "backend": "vllm"}
    data["warm_start"] = {"sft_examples": 0}
    cfg = parse_config(data, "examples/mapf_gpu.yaml (chat checkpoint)")
    with pytest.raises(RunError) as err:
        start_run(cfg, tmp_path / "runs", run_id="gpu")
    msg = str(err.value)
    assert msg.startswith("policy.backend: rollout backend 'vllm' cannot run here") and "\n" not in msg, msg
    assert not (tmp_path / "runs" / "gpu").exists()


def test_missing_or_damaged_weights_and_no_eos_are_one_line_before_a_run_folder_exists(chat_ckpt, tmp_path):
    """A checkpoint folder without weights, with a truncated safetensors file, or whose tokenizer has no EOS (GRPO's
    generation needs it) is refused by `start_run` before the run folder exists. Before: the first two trained a warm
    start's folder and died in a 95-line traceback; the third trained the warm start and died at stage 1's first
    GRPO step, and every resume did it again."""
    from harness.config import parse_config
    from harness.lifecycle import RunError, start_run

    nowt = _variant(chat_ckpt, tmp_path / "nowt", drop=("model.safetensors",))
    cut = _variant(chat_ckpt, tmp_path / "cut")
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[: len(data) // 2])
    noeos = _variant(chat_ckpt, tmp_path / "noeos", tok_cfg={"eos_token": None})
    for ck, why in ((nowt, "holds no weights"), (cut, "model.safetensors cannot be read"),
                    (noeos, "its tokenizer has no EOS token")):
        cfg = parse_config({"task": "math", "policy": {"checkpoint": str(ck)}}, "t")
        with pytest.raises(RunError, match=f"policy.checkpoint: .*{why}"):
            start_run(cfg, tmp_path / "runs", run_id=ck.name)
        assert not (tmp_path / "runs" / ck.name).exists()


def test_no_tokenizer_a_tokenizer_past_the_vocabulary_and_a_quantized_model_are_refused_at_start(chat_ckpt, tmp_path):
    """Each passed the preflight, then: a folder without tokenizer files gave an empty tokenizer, refused as "no chat
    template" or "cannot write the answers"; a tokenizer larger than the model's vocab_size trained into an
    IndexError mid-warm-start; a quantized model died loading (`requires optimum`) after the run folder existed
    (an outside review, eighty-second session). Would catch a check that reads neither the files, the vocabulary
    nor the config's quantization."""
    from harness.config import parse_config
    from harness.lifecycle import RunError, start_run

    names = [n for n in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "vocab.json",
                         "merges.txt", "special_tokens_map.json") if (chat_ckpt / n).exists()]
    notok = _variant(chat_ckpt, tmp_path / "notok", drop=tuple(names))
    n = len(load_tokenizer(chat_ckpt))
    small = _variant(chat_ckpt, tmp_path / "small", cfg={"vocab_size": n - 10})
    quant = _variant(chat_ckpt, tmp_path / "quant", cfg={"quantization_config": {"quant_method": "gptq", "bits": 4}})
    for ck, why in ((notok, "its tokenizer files are missing"),
                    (small, f"its tokenizer has {n} token ids but the model's vocab_size is {n - 10}"),
                    (quant, r"is quantized \(gptq\)")):
        cfg = parse_config({"task": "math", "policy": {"checkpoint": str(ck), "style": "plain"}}, "t")
        with pytest.raises(RunError, match=f"policy.checkpoint: .*{why}"):
            start_run(cfg, tmp_path / "runs", run_id=ck.name)
        assert not (tmp_path / "runs" / ck.name).exists()
    from harness.engineer import EngineerConfig, preflight

    assert preflight(EngineerConfig(kind="llm", model_path=str(quant))) is None  # it only generates: quantized is fine


def test_the_context_check_counts_a_templates_system_prompt_in_every_style(chat_ckpt, tmp_path):
    """A chat template wraps every prompt, whatever the style (`format_prompt`): one that adds a long system prompt
    makes plain-style prompts longer than the model's positions. Before, the check measured non-chat styles without
    the template and passed them; the warm start then trained on prompts cut short (an outside review)."""
    from harness.config import parse_config
    from harness.lifecycle import _task_fits_checkpoint

    ck = _variant(chat_ckpt, tmp_path / "sys", cfg={"max_position_embeddings": 256})
    system = "You are a careful assistant. " * 40  # ~200 tokens before every prompt
    (ck / "chat_template.jinja").write_text(
        "{{- '<|im_start|>system\n" + system + "<|im_end|>\n' }}"
        + (chat_ckpt / "chat_template.jinja").read_text())
    cfg = parse_config({"task": "math", "policy": {"checkpoint": str(ck), "style": "plain"}}, "t")
    why = _task_fits_checkpoint(cfg)
    assert why is not None and "more than the model's 256 positions" in why, why
    (ck / "chat_template.jinja").write_text((chat_ckpt / "chat_template.jinja").read_text())
    assert _task_fits_checkpoint(cfg) is None  # the same prompts without the system prompt fit


def test_a_resume_before_the_warm_start_finished_names_a_checkpoint_that_moved(chat_ckpt, tmp_path):
    """Killed during the warm start, then the user's checkpoint moved: the resume names the path the run started
    from and to put it back (before: the load's own error, which advised `policy: {preset: tiny}`, a config edit a
    resume refuses). Would catch the check firing after the warm start (the run needs the folder no more then)."""
    import shutil

    from harness.config import parse_config
    from harness.lifecycle import RunError, open_run, resume_run

    ck = tmp_path / "mine"
    shutil.copytree(chat_ckpt, ck)
    run = open_run(tmp_path / "runs" / "r", parse_config({"task": "math", "policy": {"checkpoint": str(ck)}}, "t"))
    run.close()
    run.store.close()
    ck.rename(tmp_path / "moved")
    with pytest.raises(RunError, match=f"started from the checkpoint {ck}, which is no longer there.*put the"):
        resume_run(tmp_path / "runs" / "r")


def test_a_dated_chat_template_renders_the_same_prompt_all_night(chat_ckpt, tmp_path):
    """A template that dates its system prompt (Llama 3.x: `strftime_now` unless `date_string` is given) rendered a
    prompt differently before and after midnight; every rendering now passes the pinned date, ours (SFT, rollouts,
    the fit check) and TRL's (GRPOConfig.chat_template_kwargs). Would catch a rendering without it."""
    from policies.model import CHAT_TEMPLATE_KWARGS, format_prompt

    ck = _variant(chat_ckpt, tmp_path / "dated")
    (ck / "chat_template.jinja").write_text(
        "{%- if not date_string is defined %}{%- set date_string = strftime_now('%d %b %Y') %}{%- endif %}"
        "{{- '<|im_start|>system\nToday Date: ' + date_string + '<|im_end|>\n' }}"
        + (chat_ckpt / "chat_template.jinja").read_text())
    text = format_prompt(load_tokenizer(ck), "2+2=")
    assert f"Today Date: {CHAT_TEMPLATE_KWARGS['date_string']}" in text, text


def test_a_run_keeps_the_style_and_the_absolute_checkpoint_path_it_started_with(chat_ckpt, tmp_path, monkeypatch):
    """The prompt style of a checkpoint is read from its evotrainer.json; a run pins it (and makes relative paths
    absolute) in the config it keeps, so a checkpoint deleted or retrained after the start, or a resume from another
    folder, cannot switch the run's prompts halfway. Would catch: config.yaml saving `style: null` and `ck/base`."""
    import shutil

    from harness.config import parse_config
    from harness.lifecycle import _pinned
    from harness.policy_glue import write_policy_meta

    shutil.copytree(chat_ckpt, tmp_path / "ck")
    write_policy_meta(tmp_path / "ck", "math", "plain")
    monkeypatch.chdir(tmp_path)
    cfg = _pinned(parse_config({"task": "math", "policy": {"checkpoint": "ck"},
                                "engineer": {"kind": "llm", "model_path": "ck"}}, "t"))
    assert cfg.policy.style == "plain" and cfg.policy.checkpoint == str(tmp_path / "ck")
    assert cfg.engineer.model_path == str(tmp_path / "ck")
    shutil.rmtree(tmp_path / "ck")  # gone after the start: the kept config still says plain
    assert parse_config(cfg.model_dump(mode="json"), "config.yaml").style == "plain"


def test_a_checkpoint_too_short_for_the_task_or_unable_to_spell_its_answers_is_refused_at_start(chat_ckpt, tmp_path):
    """From the tokenizer and config alone, before the run folder exists: prompts plus the completions the run asks
    for beyond the model's positions (before: the warm start trained, then the first held-out reading died in an
    index error), and a tokenizer whose round trip breaks the expert's answers (before: a run trained all night at 0%
    valid). Would catch: a check that reads neither the positions nor a decoded answer."""
    from tokenizers import decoders

    from harness.config import parse_config
    from harness.lifecycle import RunError, start_run

    short = _variant(chat_ckpt, tmp_path / "short", cfg={"max_position_embeddings": 64})
    mute = _variant(chat_ckpt, tmp_path / "mute")
    tok = load_tokenizer(mute)
    tok.backend_tokenizer.decoder = decoders.BPEDecoder()  # a decoder that does not undo the byte-level encoding
    tok.save_pretrained(mute)
    for ck, why in ((short, r"mapf.s prompts take up to \d+ tokens .* more than the model's 64 positions"),
                    (mute, r"its tokenizer cannot write mapf's answers: the expert's answer .* no longer scores")):
        cfg = parse_config({"task": "mapf", "policy": {"checkpoint": str(ck)}}, "t")
        with pytest.raises(RunError, match=f"policy.checkpoint: {why}"):
            start_run(cfg, tmp_path / "runs", run_id=ck.name)
        assert not (tmp_path / "runs" / ck.name).exists()


def test_a_preset_trained_on_chat_prompts_is_evaluated_as_trained(tmp_path):
    """`train --style chat` on a preset (no template: its chat prompts are plain text plus its separator, as `run`
    trains them) wrote a checkpoint `eval` then refused ("has no chat template"). Eval reads a checkpoint in the style
    it was trained in; asking a template-less checkpoint for another style's chat prompts is still refused."""
    out = tmp_path / "preset-chat"
    res = runner.invoke(app, ["train", "--out", str(out), "--task", "math", "--style", "chat", "--sft-examples", "8",
                              "--sft-steps", "1", "--grpo-steps", "0", "--threads", "1"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "evotrainer.json").read_text())["style"] == "chat"
    res = runner.invoke(app, ["eval", str(out), "--suite", "small", "--max-new-tokens", "4", "--threads", "1"])
    assert res.exit_code == 0 and "(chat prompts)" in res.output, res.output
