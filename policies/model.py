"""Policy models: build a small causal LM with a character-level tokenizer offline, or load any local Hugging Face
causal-LM checkpoint. Nothing here downloads anything unless a hub id is passed deliberately with `allow_hub=True`.

    from policies.model import build_model, load_policy, format_prompt
    model, tok = build_model("tiny", alphabet="ab.#\\n")        # ~1M parameters, Llama-style, random init
    model.save_pretrained("ckpt"); tok.save_pretrained("ckpt")
    model, tok = load_policy("ckpt")
    ids = tok(format_prompt(tok, "ab#"))["input_ids"]

A char tokenizer maps each character of the task's alphabet to one token, adds <pad> <bos> <eos> <unk> and a <sep>
token that ends every prompt (the prompt/completion boundary). Models with a chat template (real HF checkpoints) get
their prompts rendered through it instead.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field

# --- presets ----------------------------------------------------------------------------------------------------------

PAD, BOS, EOS, UNK, SEP = "<pad>", "<bos>", "<eos>", "<unk>", "<sep>"
SPECIALS = (PAD, BOS, EOS, UNK, SEP)


class Preset(BaseModel):
    """Shape of a from-scratch Llama-style model. Width, depth and heads; the rest is derived."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    hidden: int = Field(..., description="model width (hidden size)")
    layers: int = Field(..., description="number of transformer blocks")
    heads: int = Field(..., description="attention heads (head_dim = hidden / heads)")
    kv_heads: int = Field(..., description="key/value heads (grouped-query attention)")
    mlp: int = Field(..., description="MLP intermediate size")
    max_len: int = Field(1024, description="maximum sequence length (prompt + completion) in tokens")


PRESETS: dict[str, Preset] = {
    "tiny": Preset(hidden=128, layers=5, heads=4, kv_heads=4, mlp=384),  # ~1.0M parameters
    "small": Preset(hidden=256, layers=6, heads=8, kv_heads=8, mlp=1024),  # ~6.3M parameters
    # ~86M parameters: the GPU example's model (built offline like the others; a GPU for training, vLLM for rollouts)
    "base": Preset(hidden=768, layers=12, heads=12, kv_heads=12, mlp=2304),
}


class PolicyLoadError(FileNotFoundError):
    """A checkpoint path that does not exist or does not hold a model + tokenizer."""


class PresetError(ValueError):
    pass


# --- tokenizer --------------------------------------------------------------------------------------------------------


def build_char_tokenizer(alphabet: str, words: Sequence[str] = ()):
    """A `PreTrainedTokenizerFast` with one token per character of `alphabet` plus the special tokens, plus one token
    per entry of `words` (multi-character units such as grid coordinates `3,4`, matched leftmost-longest first).

    Encoding prepends <bos>; decoding fuses characters without spaces. Unknown characters map to <unk>.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(alphabet))
    if not chars:
        raise PresetError("alphabet is empty: pass every character prompts and completions can contain (task.spec.alphabet)")
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in chars:
        vocab.setdefault(ch, len(vocab))
    # BPE without merges = one token per character, whitespace and newlines included (no pre-tokenizer).
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    core.add_special_tokens(list(SPECIALS))
    multi = [w for w in dict.fromkeys(words) if len(w) > 1]
    bad = [w for w in multi if set(w) - set(chars)]
    if bad:
        raise PresetError(f"words {bad[:3]} use characters outside the alphabet; add them to the alphabet")
    if multi:
        core.add_tokens([AddedToken(w, single_word=False, lstrip=False, rstrip=False, normalized=False)
                         for w in multi])
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK, sep_token=SEP,
        padding_side="left", model_max_length=max(p.max_len for p in PRESETS.values()),
    )


# --- model ------------------------------------------------------------------------------------------------------------


def build_model(preset: str, alphabet: str, seed: int = 0, words: Sequence[str] = ()):
    """A randomly initialised Llama-style causal LM of the given preset and its char tokenizer: `(model, tokenizer)`.
    `words`: multi-character units that get one token each (see `build_char_tokenizer`)."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    if preset not in PRESETS:
        raise PresetError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    p = PRESETS[preset]
    tok = build_char_tokenizer(alphabet, words)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=p.hidden, intermediate_size=p.mlp, num_hidden_layers=p.layers,
        num_attention_heads=p.heads, num_key_value_heads=p.kv_heads, head_dim=p.hidden // p.heads,
        max_position_embeddings=p.max_len, tie_word_embeddings=True, rms_norm_eps=1e-5,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    model.generation_config = GenerationConfig(
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id
    )
    return model, tok


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def load_policy(path_or_hf_id: str | Path, allow_hub: bool = False, dtype: torch.dtype | None = None):
    """Load `(model, tokenizer)` from a local `save_pretrained` directory (ours or any HF causal LM).

    Hub ids are refused unless `allow_hub=True` (this project never downloads weights by accident). The tokenizer pads
    on the left (generation) and has a pad token (see `ensure_pad_token`); the model's generation config stops at the
    chat template's end-of-turn token too (see `stop_token_ids`), so TRL's and vLLM's generation end a turn where ours
    does. A checkpoint whose architecture this transformers cannot build as a causal LM raises `PolicyLoadError`.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = Path(path_or_hf_id).expanduser()
    if not path.exists():
        if allow_hub:
            src, local = str(path_or_hf_id), False
        else:
            raise PolicyLoadError(
                f"policy checkpoint {str(path_or_hf_id)!r} does not exist; pass a directory written by save_pretrained "
                "(e.g. one from `evotrainer train --out DIR`), or build a fresh model from a preset (`evotrainer train --preset tiny`; `policy: {preset: tiny}` in a "
                "run config)"
            )
    else:
        if not (path / "config.json").exists():
            raise PolicyLoadError(
                f"{str(path)!r} has no config.json, so it is not a save_pretrained checkpoint; point at the directory "
                "that holds config.json, the weights and the tokenizer files"
            )
        src, local = str(path), True
        check_architecture(path)
    tok = AutoTokenizer.from_pretrained(src, local_files_only=local)
    model = AutoModelForCausalLM.from_pretrained(src, local_files_only=local, dtype=dtype or torch.float32)
    tok.padding_side = "left"
    ensure_pad_token(tok, src)
    stops = stop_token_ids(tok, model)
    if model.generation_config is not None and stops:
        model.generation_config.eos_token_id = stops if len(stops) > 1 else stops[0]
    return model, tok


def check_architecture(path: str | Path) -> None:
    """Raise `PolicyLoadError` (one line) when transformers cannot build the checkpoint at `path` as a causal LM:
    an unknown `model_type` (newer than this transformers) or an architecture that is not a causal LM."""
    import json

    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        cfg = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (ValueError, KeyError, OSError) as exc:
        try:
            kind = json.loads((Path(path) / "config.json").read_text()).get("model_type")
        except (OSError, ValueError):
            kind = None
        why = " ".join(str(exc).split())[:160]
        raise PolicyLoadError(
            f"checkpoint {str(path)!r}: transformers {transformers.__version__} cannot load its architecture "
            f"(model_type {kind!r}: {why}); upgrade transformers or convert the checkpoint to an architecture this "
            "version supports") from None
    if type(cfg) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise PolicyLoadError(
            f"checkpoint {str(path)!r} is a {cfg.model_type!r} model, which transformers cannot load as a causal "
            "language model; pass a decoder-only (causal LM) checkpoint such as a Qwen3 or Llama model")


def ensure_pad_token(tok, source: str = "the checkpoint") -> None:
    """A tokenizer without a pad token gets its EOS as pad (what TRL and most trainers do), with a warning naming the
    fix. Safe here: generation pads on the left under an attention mask, and the SFT/GRPO losses mask padding by
    position, so a pad equal to EOS never hides a real EOS from the loss."""
    if tok.pad_token is not None:
        return
    if tok.eos_token is None:
        raise PolicyLoadError(f"tokenizer of {source} has neither a pad nor an EOS token; set pad_token and eos_token "
                              "in its tokenizer_config.json")
    tok.pad_token = tok.eos_token
    if source in _PAD_WARNED:  # once a process per checkpoint: a run loads it for the SFT, the probe and every arm
        return
    _PAD_WARNED.add(source)
    import warnings

    warnings.warn(f"tokenizer of {source} has no pad token: using its EOS {tok.eos_token!r} as pad; set pad_token in "
                  "its tokenizer_config.json to a distinct token to silence this", stacklevel=2)


_PAD_WARNED: set[str] = set()


_MARKER = "\u2581evotrainer-turn\u2581"


def end_of_turn_token(tok) -> str | None:
    """The token a chat template writes right after an assistant message (`<|im_end|>` for Qwen, `<|eot_id|>` for
    Llama 3), or None without a template. Many checkpoints' EOS is another token (`<|endoftext|>`), and base models'
    generation configs list only that one, so generation that stops at EOS alone runs past the end of the turn."""
    if not has_chat_template(tok):
        return None
    try:
        text = tok.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": _MARKER}],
                                       tokenize=False)
    except Exception:  # noqa: BLE001 - a template that refuses this exchange tells us nothing; EOS still stops
        return None
    after = text.split(_MARKER, 1)[1] if _MARKER in text else ""
    ids = tok(after, add_special_tokens=False)["input_ids"] if after else []
    if not ids:
        return None
    first = tok.convert_ids_to_tokens(ids[0])
    added = set(tok.all_special_tokens) | set(getattr(tok, "added_tokens_encoder", {}))
    return first if first in added and after.startswith(first) else None


def stop_token_ids(tok, model=None) -> list[int]:
    """Token ids that end a completion: the tokenizer's EOS, the model's generation-config EOS ids, and the chat
    template's end-of-turn token. Order kept, duplicates dropped."""
    ids: list[int] = []
    if tok.eos_token_id is not None:
        ids.append(tok.eos_token_id)
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += [extra] if isinstance(extra, int) else list(extra or [])
    eot = end_of_turn_token(tok)
    if eot is not None:
        ids.append(tok.convert_tokens_to_ids(eot))
    return list(dict.fromkeys(ids))


def require_chat_template(tok, source: str, style: str) -> None:
    """The `chat` prompt style needs a chat template: raise `PolicyLoadError` (one line) when `tok` has none."""
    if style == "chat" and not has_chat_template(tok):
        raise PolicyLoadError(
            f"checkpoint {source!r} has no chat template but the prompt style is 'chat'; use an instruct/chat "
            "checkpoint, add a chat_template to its tokenizer_config.json, or choose another prompt style (--style / "
            "policy.style)")


def check_not_quantized(path: Path) -> None:
    """`PolicyLoadError` for a checkpoint whose config.json names a `quantization_config` (GPTQ, AWQ, bitsandbytes,
    ...): RL here fine-tunes every weight, which a quantized one is not (it died loading, after the run folder
    existed). A checkpoint that only generates (a local LLM engineer) may be quantized."""
    quant = _config_value(path, "quantization_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        raise PolicyLoadError(
            f"checkpoint {str(path)!r} is quantized ({method}): RL here fine-tunes every weight in full or bf16 "
            "precision; pass the unquantized checkpoint (a quantized one can serve as the engineer)")


def check_checkpoint(path: str | Path, style: str | None = None, training: bool = True):
    """Everything about a local checkpoint that can be wrong before any training, cheaply (the tokenizer and config are
    read, not the weights): a save_pretrained folder, an architecture transformers can build as a causal LM, a pad
    token (`ensure_pad_token`), and a chat template when `style` is `chat`; `training`: not quantized (the policy is
    trained; an engineer's checkpoint only generates). Raises `PolicyLoadError` with one line; returns the tokenizer."""
    path = Path(path).expanduser()
    if not (path / "config.json").is_file():
        raise PolicyLoadError(f"checkpoint {str(path)!r} has no config.json, so it is not a save_pretrained checkpoint; "
                              "point at the directory that holds config.json, the weights and the tokenizer files")
    check_architecture(path)
    if training:
        check_not_quantized(path)
    check_weights(path)
    try:
        tok = load_tokenizer(path)
    except PolicyLoadError:  # its own fix (no pad and no EOS), not "save the tokenizer"
        raise
    except (OSError, ValueError) as exc:
        raise PolicyLoadError(f"checkpoint {str(path)!r}: its tokenizer does not load ({' '.join(str(exc).split())[:160]}"
                              "); save the tokenizer next to the model (tokenizer.save_pretrained(DIR))") from None
    if len(tok) < 2 or not (any((path / n).is_file() for n in TOKENIZER_FILES) or any(path.glob("*.tiktoken"))):
        # transformers builds an empty tokenizer (every text encodes to []) from a folder with none of these files
        raise PolicyLoadError(f"checkpoint {str(path)!r}: its tokenizer files are missing ({', '.join(TOKENIZER_FILES)}"
                              "); save the tokenizer next to the model (tokenizer.save_pretrained(DIR))")
    if tok.eos_token_id is None:  # GRPO's generation needs the tokenizer's EOS (generation_config's is not read there)
        raise PolicyLoadError(f"checkpoint {str(path)!r}: its tokenizer has no EOS token; set eos_token in its "
                              "tokenizer_config.json (the token its completions end with)")
    vocab = _config_value(path, "vocab_size")
    top = max(tok.get_vocab().values(), default=-1) + 1  # ids the tokenizer can emit (its size, where contiguous)
    if isinstance(vocab, int) and top > vocab:  # a token id past the embedding: IndexError mid-warm-start
        raise PolicyLoadError(f"checkpoint {str(path)!r}: its tokenizer has {top} token ids but the model's "
                              f"vocab_size is {vocab}; use the tokenizer the model was trained with (or resize the "
                              "model's embeddings to it and save again)")
    if style is not None:
        require_chat_template(tok, str(path), style)
    return tok


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model", "sentencepiece.bpe.model")


def _config_value(path: Path, key: str):
    """A top-level value of the checkpoint's config.json, or of its text config (a multimodal config nests it)."""
    import json

    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    return cfg.get(key, (cfg.get("text_config") or {}).get(key) if isinstance(cfg.get("text_config"), dict) else None)


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def check_weights(path: str | Path) -> None:
    """`PolicyLoadError` (one line) when a checkpoint folder holds no weights transformers would load, or a
    safetensors file whose header cannot be read (truncated by a copy, say): cheap, before anything trains, where
    loading found it after the warm start's run folder existed, as a long traceback."""
    path = Path(path)
    found = [n for n in WEIGHT_FILES if (path / n).is_file()]
    if not found:
        raise PolicyLoadError(f"checkpoint {str(path)!r} holds no weights ({', '.join(WEIGHT_FILES[::2])}); copy the "
                              "model's weight files next to its config.json (model.save_pretrained(DIR))")
    files = [path / "model.safetensors"] if found[0] == "model.safetensors" else []
    if found[0] == "model.safetensors.index.json":
        import json

        try:
            shards = sorted(set(json.loads((path / found[0]).read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise PolicyLoadError(f"checkpoint {str(path)!r}: {found[0]} does not read ({exc})") from None
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise PolicyLoadError(f"checkpoint {str(path)!r}: {found[0]} names {len(missing)} weight file(s) that are "
                                  f"not there ({missing[0]}, ...); copy every shard")
        files = [path / s for s in shards]
    from safetensors import safe_open

    for f in files:
        try:
            with safe_open(str(f), framework="pt") as fh:
                fh.keys()
        except Exception as exc:  # noqa: BLE001 - SafetensorError and friends: the file, and why, in one line
            raise PolicyLoadError(f"checkpoint {str(path)!r}: {f.name} cannot be read "
                                  f"({' '.join(str(exc).split())[:160]}); copy it again") from None


def load_tokenizer(path: str | Path):
    """The tokenizer of a local checkpoint alone (what a vLLM rollout needs: vLLM loads the weights itself)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    tok.padding_side = "left"
    ensure_pad_token(tok, str(path))
    return tok


def save_policy(model, tok, out_dir: str | Path) -> Path:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


# --- prompts ----------------------------------------------------------------------------------------------------------


# passed to every chat template rendering (ours and TRL's): a template that dates its system prompt (Llama 3.x calls
# `strftime_now` unless given `date_string`) would render the same prompt differently before and after midnight of
# an overnight run; this is the date those templates fall back to themselves. A template without it ignores it.
CHAT_TEMPLATE_KWARGS = {"date_string": "26 Jul 2024"}


def format_prompt(tok, text: str) -> str:
    """The string the model sees before its completion.

    A tokenizer with a chat template renders `text` as one user turn plus the generation prompt; a char tokenizer
    appends its <sep> token; a plain tokenizer without either appends a newline.
    """
    if getattr(tok, "chat_template", None):
        return tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True,
                                       **CHAT_TEMPLATE_KWARGS)
    return text + (tok.sep_token if tok.sep_token else "\n")


def has_chat_template(tok) -> bool:
    return bool(getattr(tok, "chat_template", None))


def cache_kw(model, cache) -> dict:
    """`{name: cache}` for a forward of `model` (a causal LM or its backbone) that reads and extends a KV cache. The
    name follows the installed transformers: `cache` where the forward takes it (5.x, where `past_key_values` is
    deprecated and goes in 5.40), `past_key_values` before (the project allows transformers >= 4.56)."""
    return {_cache_name(type(model)): cache}


@functools.cache
def _cache_name(cls) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"
