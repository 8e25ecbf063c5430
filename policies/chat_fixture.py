"""A real-shaped chat checkpoint built offline: a small model of a real chat family's architecture (Qwen3, random
weights), a byte-level BPE tokenizer trained here with `tokenizers` on the caller's text, the family's special tokens
and a Qwen-style chat template, saved with `save_pretrained`. Nothing is downloaded. It stands in for a Hugging Face
chat checkpoint in tests (and in `--dry-run` checks of GPU configs), so the paths a real checkpoint takes (template,
end-of-turn token, pad token, `<think>` blocks, byte-level BPE) run on CPU in seconds.

    from policies.chat_fixture import build_chat_fixture
    path = build_chat_fixture("ckpt", texts=["What is 2+3?", "Agent A: RIGHT DOWN"])
    model, tok = policies.model.load_policy(path)

What it shares with a Qwen3 *base* checkpoint (the harder case for a trainer):
- `<|endoftext|>` is the tokenizer's EOS; `<|im_end|>` ends a chat turn and is NOT the EOS, and the generation config
  lists only the EOS (as Qwen3-Base ships): a trainer must find the end-of-turn token through the chat template.
- the pad token (`<|pad|>`) differs from the EOS; no BOS token; padding side right on disk (loaders set left).
- `<think>` / `</think>` are added tokens that are not special (decoding keeps them), as in Qwen3.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

EOS, PAD, IM_START, IM_END, THINK, END_THINK = "<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>", "<think>", \
    "</think>"

# Qwen-style: each turn is <|im_start|>role\n...<|im_end|>\n; the generation prompt opens the assistant turn.
# `enable_thinking=False` pre-fills an empty think block, as Qwen3's template does.
QWEN_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

FAMILIES = ("qwen3",)


class ChatFixtureError(ValueError):
    pass


def build_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 1024):
    """A byte-level BPE `PreTrainedTokenizerFast` trained on `texts`, with the Qwen chat specials and template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    specials = [EOS, PAD, IM_START, IM_END]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = list(texts)
    if not texts:
        raise ChatFixtureError("build_bpe_tokenizer got no text; pass the prompts and completions it should encode")
    core.train_from_iterator(texts, trainer)
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in (THINK, END_THINK)])
    return PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=EOS, pad_token=PAD, additional_special_tokens=[IM_START, IM_END],
        chat_template=QWEN_CHAT_TEMPLATE, padding_side="right", model_max_length=2048, clean_up_tokenization_spaces=False,
    )


def build_chat_fixture(out_dir: str | Path, texts: Iterable[str], family: str = "qwen3", hidden: int = 64,
                       layers: int = 2, vocab_size: int = 1024, seed: int = 0) -> Path:
    """Build and save (`save_pretrained`) a randomly initialised chat model of `family` with a BPE tokenizer trained on
    `texts` (the task prompts and completions it will see). Returns `out_dir`. `hidden=64, layers=2` is ~0.2M
    parameters: sized for CPU tests, not for learning anything."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if family not in FAMILIES:
        raise ChatFixtureError(f"unknown chat family {family!r}; choose one of: {', '.join(FAMILIES)}")
    texts = list(texts)
    # the chat markup itself is part of what the tokenizer sees in use
    tok = build_bpe_tokenizer(texts + [f"{IM_START}user\n{t}{IM_END}\n{IM_START}assistant\n" for t in texts[:200]],
                              vocab_size)
    heads = max(1, hidden // 16)
    cfg = Qwen3Config(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=hidden // heads,
        max_position_embeddings=2048, tie_word_embeddings=True, rms_norm_eps=1e-6,
        bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
