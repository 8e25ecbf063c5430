"""Batched rollouts: sample `n` completions per prompt with temperature / top-p, reproducibly from a seed.

    from policies.model import build_model
    from policies.rollout import SamplingParams, generate
    model, tok = build_model("tiny", "ab#")
    res = generate(model, tok, ["ab#", "ba"], SamplingParams(n=4, max_new_tokens=16, seed=1))
    res.completions[:4]   # the 4 samples of prompt 0 (prompt-major order), res.tokens, res.seconds

Two backends, chosen by `SamplingParams.backend`:
- `transformers`: our own decoding loop over a HF causal LM on CPU or GPU. Faster than `model.generate` on small models
  because it sorts prompts by length (less padding), prefills each prompt once and repeats its KV cache for the n samples,
  drops finished rows from the batch (so the batch shrinks as sequences hit <eos> or the chat template's end-of-turn
  token, see `policies.model.stop_token_ids`), and skips generate()'s per-step
  machinery. `torch.inference_mode`, KV cache always on.
- `vllm`: vLLM's offline engine on a checkpoint directory; needs `pip install 'evotrainer[gpu]'` and a CUDA GPU.
`auto` picks vllm when it is installed and a GPU is present, else transformers.

Prompts are raw task text: they go through `format_prompt` (chat template, or text + <sep> for char models).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from policies.model import cache_kw, format_prompt, has_chat_template, stop_token_ids

log = logging.getLogger(__name__)

# --- config and result ------------------------------------------------------------------------------------------------


class RolloutBackendError(ValueError):
    """The chosen rollout backend cannot run here (vllm missing, no GPU, model not on disk)."""


class SamplingParams(BaseModel):
    """How to sample completions."""

    model_config = ConfigDict(extra="forbid")
    temperature: float = Field(1.0, ge=0.0, description="softmax temperature; 0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass (1.0 = off)")
    max_new_tokens: int = Field(128, ge=1, description="completion budget in tokens; longer completions are truncated")
    n: int = Field(1, ge=1, description="completions per prompt")
    seed: int = Field(0, description="same seed, same prompts, same model -> same completions")
    batch_size: int = Field(64, ge=1, description="rows (prompt x sample) decoded together")
    compact: bool = Field(True, description="decode Llama-architecture models with the compact loop (`CompactLlama`: "
                          "a preallocated KV cache and one fused step over the weights, no per-token framework "
                          "machinery); other architectures, or False, use the model's own forward every token")
    backend: Literal["auto", "transformers", "vllm"] = Field(
        "transformers", description="rollout engine: transformers (CPU/GPU), vllm (GPU + vllm installed), auto"
    )
    sampler: Literal["inverse_cdf", "multinomial"] = Field(
        "inverse_cdf", description="how our loop draws each token: inverse_cdf = one uniform per row against the "
        "cumulative probabilities (exact); multinomial = torch.multinomial, one exponential random number per "
        "vocabulary entry (~15 ns each on a CPU: 0.5 ms a step at 64 rows x 335 tokens, ~250 ms at 64 x 152k), "
        "the path before, kept as the reference. Same distribution, different draws for a seed")


class RolloutResult(BaseModel):
    """Completions in prompt-major order: completions[i * n + j] is sample j of prompt i."""

    model_config = ConfigDict(extra="forbid")
    completions: list[str]
    prompt_index: list[int] = Field(..., description="which prompt each completion answers")
    tokens: list[int] = Field(..., description="new tokens per completion (eos included)")
    truncated: list[bool] = Field(..., description="completion hit max_new_tokens before <eos>")
    seconds: float
    new_tokens: int
    completion_ids: list[list[int]] = Field(default_factory=list, repr=False,
                                            description="generated token ids (eos included when reached)")
    logprobs: list[list[float]] = Field(default_factory=list, repr=False,
                                        description="log-probability of each generated token under the sampling "
                                                    "distribution (temperature and top-p applied); 0.0 when greedy")

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


def resolve_backend(backend: str) -> str:
    if backend == "auto":
        return "vllm" if vllm_available() else "transformers"
    if backend == "vllm" and not vllm_available():
        why = "vllm is not installed" if importlib.util.find_spec("vllm") is None else "no CUDA GPU is visible"
        raise RolloutBackendError(
            f"rollout backend 'vllm' cannot run here: {why}; set backend='transformers' (or 'auto'), "
            "or install `pip install 'evotrainer[gpu]'` on a machine with a CUDA GPU"
        )
    return backend


# --- entry point ------------------------------------------------------------------------------------------------------


def generate(model, tok, prompts: list[str], params: SamplingParams | None = None) -> RolloutResult:
    """Sample `params.n` completions for each raw prompt. `model` is a loaded HF causal LM, or (vllm) a checkpoint dir."""
    params = params or SamplingParams()
    backend = resolve_backend(params.backend)
    texts = [format_prompt(tok, p) for p in prompts]
    add_special = not has_chat_template(tok)  # a chat template already renders its own BOS
    ids = [tok(t, add_special_tokens=add_special)["input_ids"] for t in texts]
    if backend == "vllm":  # the same token ids: vLLM tokenizing the text would add a second BOS after the template's
        return _generate_vllm(model, ids, params)
    return _generate_loop(model, tok, ids, params)


def plain_generate(model, tok, prompts: list[str], params: SamplingParams) -> RolloutResult:
    """Reference: the same batch through `model.generate` (one left-padded batch, n via num_return_sequences)."""
    texts = [format_prompt(tok, p) for p in prompts]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=not has_chat_template(tok)).to(model.device)
    torch.manual_seed(params.seed)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            **enc, do_sample=params.temperature > 0, temperature=params.temperature or None, top_p=params.top_p,
            max_new_tokens=params.max_new_tokens, num_return_sequences=params.n,
            pad_token_id=tok.pad_token_id, eos_token_id=stop_token_ids(tok, model),
        )
    seconds = time.perf_counter() - t0
    new = out[:, enc["input_ids"].shape[1]:].tolist()
    stops = set(stop_token_ids(tok, model))
    comps, counts, trunc = [], [], []
    for row in new:
        hit = next((i for i, t in enumerate(row) if t in stops), None)
        cut = hit + 1 if hit is not None else len(row)
        counts.append(cut)
        trunc.append(hit is None)
        comps.append(tok.decode(row[:cut], skip_special_tokens=True))
    return RolloutResult(completions=comps, prompt_index=[i for i in range(len(prompts)) for _ in range(params.n)],
                         tokens=counts, truncated=trunc, seconds=seconds, new_tokens=sum(counts))


# --- transformers backend: our decoding loop --------------------------------------------------------------------------


def _sample(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator,
            sampler: str = "inverse_cdf") -> tuple[torch.Tensor, torch.Tensor]:
    """(next tokens, their log-probabilities under the distribution they were drawn from). Greedy reports 0.0 (the
    argmax has probability 1 there); with top-p the kept mass is renormalised, as the draw itself does.

    `inverse_cdf` draws by the inversion method (Devroye, *Non-Uniform Random Variate Generation*, 1986): one
    uniform u per row from `gen` (on the CPU, so a seed means the same draws on any device), then the first token
    whose cumulative probability exceeds u x total (`inverse_cdf`). `multinomial` is torch.multinomial, the
    reference; both refuse a distribution that is not finite."""
    if temperature == 0:
        nxt = logits.argmax(-1)
        return nxt, torch.zeros(nxt.shape, dtype=torch.float32, device=logits.device)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # always keeps the top token
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    if sampler == "multinomial":
        nxt = torch.multinomial(probs.cpu(), 1, generator=gen).squeeze(-1).to(logits.device)
    else:
        nxt = inverse_cdf(probs, torch.rand(probs.shape[0], generator=gen).to(probs.device))
    return nxt, probs.gather(-1, nxt[:, None]).squeeze(-1).log()


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row of `probs` (rows x vocabulary, each summing to ~1), the first token whose cumulative probability
    exceeds u x the row's total, for `u` in [0, 1) one per row. A token of probability 0 adds nothing to the sum, so
    no u lands on it; where u x total rounds up to the total itself, the last token of positive probability."""
    cdf = probs.cumsum(-1)
    total = cdf[:, -1:]
    if not bool((torch.isfinite(total) & (total > 0)).all()):  # as torch.multinomial refuses them
        raise RuntimeError("probability tensor contains inf, nan or a row without mass: the policy's logits are not "
                           "finite")
    nxt = torch.searchsorted(cdf, u[:, None] * total, right=True).squeeze(-1)
    over = nxt >= probs.shape[-1]
    if bool(over.any()):
        last = probs.shape[-1] - 1 - (probs.flip(-1) > 0).int().argmax(-1)
        nxt = torch.where(over, last, nxt)
    return nxt


# --- compact decoding: one fused step over the Llama weights -----------------------------------------------------------


def compact_supported(model) -> bool:
    """Whether `CompactLlama` can decode `model`: a plain Llama architecture (our presets, Llama checkpoints) with SiLU
    MLPs and default RoPE; anything else decodes through the model's own forward."""
    cfg = model.config
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    return (getattr(cfg, "model_type", None) == "llama" and getattr(cfg, "hidden_act", None) == "silu"
            and rope.get("rope_type", "default") == "default" and not getattr(cfg, "pretraining_tp", 1) > 1)


class CompactLlama:
    """Decode steps of a Llama model without the per-token machinery of its forward (masks rebuilt every call, a
    cache grown by concatenation, a dozen module dispatches per layer), and with each prompt's keys and values held
    once for all its samples: the prefill's cache (one row per distinct prompt) stays as it is, the generated tokens'
    keys and values go to one preallocated buffer per layer (one row per sample), and attention takes a joint softmax
    over both parts (the prompt part as one batched matmul per prompt over its samples laid out in a grid, which
    reads the shared cache once instead of once per sample). q/k/v and gate/up weights are fused once per batch, with
    each RMSNorm's weight and q's 1/sqrt(head_dim) folded into them. The same arithmetic as `LlamaForCausalLM` up to
    that order of multiplication (RMSNorm in fp32, RoPE from the model's own rotary module), so logits agree with it
    to float rounding (tests/test_grpo_fast.py).

    Rows live in a physical batch; `select` keeps some of them (finished rows leave: a copy of the generated part
    only)."""

    def __init__(self, model, cache, attn: torch.Tensor, n: int, max_new: int) -> None:
        core = model.model
        cfg = model.config
        self.embed, self.rotary, self.eps = core.embed_tokens.weight, core.rotary_emb, cfg.rms_norm_eps
        self.norm, self.head = core.norm.weight, model.get_output_embeddings().weight
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scale = self.dim ** -0.5
        self.layers = []
        nq, d = self.heads, self.dim
        for layer in core.layers:  # norm weights folded into the next projection, 1/sqrt(d) into q's rows
            a, m = layer.self_attn, layer.mlp
            w_qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]) * layer.input_layernorm.weight
            w_qkv[: nq * d] *= self.scale
            qkv_b = None if a.q_proj.bias is None else torch.cat([a.q_proj.bias * self.scale, a.k_proj.bias,
                                                                   a.v_proj.bias])
            w_gu = torch.cat([m.gate_proj.weight, m.up_proj.weight]) * layer.post_attention_layernorm.weight
            self.layers.append((w_qkv, qkv_b, a.o_proj.weight, a.o_proj.bias, w_gu,
                                None if m.gate_proj.bias is None else torch.cat([m.gate_proj.bias, m.up_proj.bias]),
                                m.down_proj.weight, m.down_proj.bias))
        self.head = self.head * self.norm
        u, width = attn.shape
        nkv, d = self.kv_heads, self.dim
        # the prompt part, one batch entry per (prompt, kv head): keys [u * kv_heads, dim, width], values
        # [u * kv_heads, width, dim]
        self.prompt_k = [cache.layers[i].keys.transpose(-1, -2).reshape(u * nkv, d, width)
                         for i in range(len(self.layers))]
        self.prompt_v = [cache.layers[i].values.reshape(u * nkv, width, d) for i in range(len(self.layers))]
        # a forward wrapped in autocast (accelerate's mixed precision, as TRL runs bf16 on a GPU) left a lower-precision
        # cache: decode under the same autocast, so a step's arithmetic is the forward's and its dtypes meet
        # (RoPE's fp32 cos/sin promote the keys back to fp32 there: the values keep the autocast dtype)
        low = {cache.layers[0].keys.dtype, cache.layers[0].values.dtype} - {self.embed.dtype}
        self.amp = low.pop() if low else None
        self.device_type = attn.device.type
        self.prompt_bias = torch.zeros(u, width, dtype=self.embed.dtype, device=attn.device).masked_fill_(
            ~attn.bool(), float("-inf"))  # prompt padding
        self.owner = torch.arange(u, device=attn.device).repeat_interleave(n)  # each row's prompt
        self._slots()
        self.length = 0  # generated positions filled so far
        b = u * n
        k0 = self.prompt_k[0]
        # the generated part, one row per sample: [rows, kv_heads, max_new, dim]
        self.keys = [k0.new_empty(b, nkv, max_new, d) for _ in self.layers]
        self.values = [k0.new_empty(b, nkv, max_new, d) for _ in self.layers]

    @property
    def rows(self) -> int:
        return self.owner.shape[0]

    def select(self, rows: torch.Tensor) -> None:
        t = self.length

        def keep(buf: torch.Tensor) -> torch.Tensor:  # the filled columns only
            out = buf.new_empty(rows.numel(), *buf.shape[1:])
            out[:, :, :t] = buf[rows, :, :t]
            return out

        self.keys = [keep(k) for k in self.keys]
        self.values = [keep(v) for v in self.values]
        self.owner = self.owner[rows]
        self._slots()

    def _slots(self) -> None:
        """Each row's place in a (prompt, sample slot) grid, so the prompt part is one batched matmul per prompt:
        rows stay ordered by prompt (selections keep the order), `slot` counts within a prompt."""
        u = self.prompt_bias.shape[0]
        counts = torch.bincount(self.owner, minlength=u)
        starts = counts.cumsum(0) - counts
        self.slot = torch.arange(self.rows, device=self.owner.device) - starts[self.owner]
        self.slots = int(counts.max())
        self.full = bool((counts == self.slots).all())  # every prompt has all its rows: the grid is a reshape
        self.row_bias = self.prompt_bias[self.owner][:, None, None]  # [rows, 1, 1, width]

    def _grid(self, x: torch.Tensor) -> torch.Tensor:
        """[rows, kv_heads, g, k] -> [u * kv_heads, slots * g, k], empty slots zero."""
        _, nkv, g, k = x.shape
        u = self.prompt_bias.shape[0]
        if self.full:
            grid = x.view(u, self.slots, nkv, g, k)
        else:
            grid = x.new_zeros(u, self.slots, nkv, g, k)
            grid[self.owner, self.slot] = x
        return grid.permute(0, 2, 1, 3, 4).reshape(u * nkv, self.slots * g, k)

    def _rows(self, y: torch.Tensor, g: int) -> torch.Tensor:
        """[u * kv_heads, slots * g, k] -> [rows, kv_heads, g, k]."""
        u = self.prompt_bias.shape[0]
        y = y.view(u, -1, self.slots, g, y.shape[-1])
        if self.full:
            return y.transpose(1, 2).reshape(self.rows, -1, g, y.shape[-1])
        return y[self.owner, :, self.slot]

    def _rms(self, x: torch.Tensor) -> torch.Tensor:
        """RMSNorm without its weight (folded into the projection that follows)."""
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits (fp32) after feeding `tokens` (one per physical row) at `positions`; the step's keys and values are
        written at the next free column of the generated part's cache."""
        with torch.autocast(self.device_type, dtype=self.amp or torch.bfloat16, enabled=self.amp is not None):
            return self._step(tokens, positions).float()

    def _step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        b, t = tokens.shape[0], self.length
        nq, nkv, d = self.heads, self.kv_heads, self.dim
        g = nq // nkv
        h = F.embedding(tokens, self.embed)  # [b, hidden]
        cos, sin = self.rotary(h[:, None], positions[:, None])
        cos, sin = cos[:, 0, None], sin[:, 0, None]  # [b, 1, dim]
        for i, (w_qkv, b_qkv, w_o, b_o, w_gu, b_gu, w_down, b_down) in enumerate(self.layers):
            qkv = F.linear(self._rms(h), w_qkv, b_qkv).view(b, nq + 2 * nkv, d)
            qk = self._rope(qkv[:, :nq + nkv], cos, sin)  # q (already scaled by 1/sqrt(d)) and k in one pass
            self.keys[i][:, :, t] = qk[:, nq:]
            self.values[i][:, :, t] = qkv[:, nq + nkv:]
            q = qk[:, :nq].view(b, nkv, g, d)
            s_prompt = self._rows(torch.bmm(self._grid(q), self.prompt_k[i]), g) + self.row_bias  # [b,nkv,g,width]
            keys, values = self.keys[i][:, :, : t + 1], self.values[i][:, :, : t + 1]  # [b, nkv, t+1, d]
            w = torch.cat([s_prompt, torch.matmul(q, keys.transpose(-1, -2))], dim=-1).softmax(-1)
            width = s_prompt.shape[-1]
            a = self._rows(torch.bmm(self._grid(w[..., :width]), self.prompt_v[i]), g) \
                + torch.matmul(w[..., width:], values)
            h = h + F.linear(a.reshape(b, nq * d), w_o, b_o)
            gate, up = F.linear(self._rms(h), w_gu, b_gu).chunk(2, dim=-1)
            h = h + F.linear(F.silu(gate) * up, w_down, b_down)
        self.length = t + 1
        return F.linear(self._rms(h), self.head)


@torch.inference_mode()
def _generate_loop(model, tok, prompt_ids: list[list[int]], params: SamplingParams) -> RolloutResult:
    from transformers import DynamicCache

    was_training = model.training
    model.eval()
    device = model.device
    n, pad = params.n, tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    stops = torch.tensor(stop_token_ids(tok, model), device=device)  # EOS and the chat template's end of turn
    compact = params.compact and compact_supported(model)
    gen = torch.Generator().manual_seed(params.seed)
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    per_chunk = max(1, params.batch_size // n)  # unique prompts per chunk
    out_ids: dict[int, list[int]] = {}  # row key = prompt_index * n + sample
    out_lp: dict[int, list[float]] = {}  # the sampling log-probability of each generated token
    finished: dict[int, bool] = {}
    t0 = time.perf_counter()
    for c in range(0, len(order), per_chunk):
        chunk = order[c:c + per_chunk]
        width = max(len(prompt_ids[i]) for i in chunk)
        input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        attn = torch.zeros((len(chunk), width), dtype=torch.long)
        for r, i in enumerate(chunk):
            L = len(prompt_ids[i])
            input_ids[r, width - L:] = torch.tensor(prompt_ids[i])
            attn[r, width - L:] = 1
        input_ids, attn = input_ids.to(device), attn.to(device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=model.config)
        logits = model(input_ids=input_ids, attention_mask=attn, position_ids=pos, **cache_kw(model, cache),
                       use_cache=True, logits_to_keep=1).logits[:, -1]
        fast = CompactLlama(model, cache, attn, n, params.max_new_tokens) if compact else None
        if n > 1:  # prefill once per prompt, then fan the cache out to the n samples (the compact loop shares it)
            if fast is None:
                cache.batch_repeat_interleave(n)
            logits, attn, pos = (x.repeat_interleave(n, dim=0) for x in (logits, attn, pos))
        keys = [i * n + j for i in chunk for j in range(n)]
        for k in keys:
            out_ids[k], out_lp[k], finished[k] = [], [], False
        last_pos = pos[:, -1]
        rows = torch.arange(len(keys), device=device)  # the live rows' places in the compact loop's batch
        for step in range(params.max_new_tokens):
            nxt, lp = _sample(logits, params.temperature, params.top_p, gen, params.sampler)
            done = torch.isin(nxt, stops)
            for k, t, x in zip(keys, nxt.tolist(), lp.tolist()):
                out_ids[k].append(t)
                out_lp[k].append(x)
            for k, d in zip(keys, done.tolist()):
                finished[k] = finished[k] or d
            if step == params.max_new_tokens - 1:
                break
            if done.any():  # shrink the batch: finished rows leave the cache
                keep = (~done).nonzero().squeeze(-1)
                if keep.numel() == 0:
                    break
                keys = [keys[i] for i in keep.tolist()]
                nxt, attn, last_pos = nxt[keep], attn[keep], last_pos[keep]
                if fast is None:
                    cache.batch_select_indices(keep)
                else:  # finished rows idle in the compact batch until half of it has finished, then leave
                    rows = rows[keep]
                    if 4 * rows.numel() <= 3 * fast.rows:
                        fast.select(rows)
                        rows = torch.arange(rows.numel(), device=device)
            last_pos = last_pos + 1
            if fast is not None:
                width = fast.rows
                if rows.numel() == width:
                    logits = fast.step(nxt, last_pos)
                else:
                    toks, at = nxt.new_full((width,), pad), last_pos.new_zeros(width)
                    toks[rows], at[rows] = nxt, last_pos
                    logits = fast.step(toks, at)[rows]
                continue
            attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=1)
            logits = model(input_ids=nxt[:, None], attention_mask=attn, position_ids=last_pos[:, None],
                           **cache_kw(model, cache), use_cache=True).logits[:, -1]
    seconds = time.perf_counter() - t0
    if was_training:
        model.train()
    total = len(prompt_ids) * n
    comps, counts, trunc = [], [], []
    for k in range(total):
        ids = out_ids[k]
        counts.append(len(ids))
        trunc.append(not finished[k])
        comps.append(tok.decode(ids[:-1] if finished[k] else ids, skip_special_tokens=True))
    return RolloutResult(completions=comps, prompt_index=[k // n for k in range(total)], tokens=counts,
                         truncated=trunc, seconds=seconds, new_tokens=sum(counts),
                         completion_ids=[out_ids[k] for k in range(total)],
                         logprobs=[out_lp[k] for k in range(total)])


# --- vLLM backend -----------------------------------------------------------------------------------------------------

_VLLM_ENGINES: dict[str, object] = {}  # checkpoint dir -> vllm.LLM, least recently used first


def vllm_settings() -> tuple[int, float]:
    """(engines kept at once, GPU memory share per engine) from `EVOTRAINER_VLLM_ENGINES` (default 2: a stage
    alternates two checkpoints at most) and `EVOTRAINER_VLLM_GPU_MEMORY` (default 0.3; training needs the rest); a bad
    value is a ValueError naming the variable (it was an int() error 15 s into a run, and 0 or 5 were taken)."""
    raw_n = os.environ.get("EVOTRAINER_VLLM_ENGINES", "2").strip()
    raw_m = os.environ.get("EVOTRAINER_VLLM_GPU_MEMORY", "0.3").strip()
    try:
        n = int(raw_n)
    except ValueError:
        raise ValueError(f"EVOTRAINER_VLLM_ENGINES must be a whole number of engines (>= 1), not {raw_n!r}") from None
    try:
        m = float(raw_m)
    except ValueError:
        m = float("nan")
    if n < 1:
        raise ValueError(f"EVOTRAINER_VLLM_ENGINES must be at least 1, not {n}")
    if not 0 < m < 1:
        raise ValueError(f"EVOTRAINER_VLLM_GPU_MEMORY must be a share of the GPU's memory between 0 and 1, not {raw_m!r}")
    return n, m


try:
    VLLM_MAX_ENGINES, VLLM_GPU_MEMORY = vllm_settings()
except ValueError:  # the defaults; a run refuses the bad value at start (`harness.threads.check_env`)
    VLLM_MAX_ENGINES, VLLM_GPU_MEMORY = 2, 0.3


def _vllm_engine(path: str, seed: int, factory=None):
    """The engine of checkpoint `path` (created on first use). Past `VLLM_MAX_ENGINES` the least recently used one is
    released first: a run writes a new checkpoint every stage and per arm, and engines never freed exhaust the GPU."""
    if path in _VLLM_ENGINES:
        _VLLM_ENGINES[path] = _VLLM_ENGINES.pop(path)  # most recently used last
        return _VLLM_ENGINES[path]
    while len(_VLLM_ENGINES) >= max(1, VLLM_MAX_ENGINES):
        _release(next(iter(_VLLM_ENGINES)))
    if factory is None:
        import vllm

        def factory(p: str, s: int):
            return vllm.LLM(model=p, seed=s, gpu_memory_utilization=VLLM_GPU_MEMORY)
    _VLLM_ENGINES[path] = factory(path, seed)
    return _VLLM_ENGINES[path]


def _release(path: str) -> None:
    llm = _VLLM_ENGINES.pop(path, None)
    if llm is None:
        return
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    for obj in (core, llm):  # vLLM's V1 engine runs a core process: stop it (older engines have no shutdown)
        fn = getattr(obj, "shutdown", None)
        if callable(fn):
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - freeing is best effort; the memory check below tells
                log.warning("vLLM engine of %s did not shut down cleanly: %s", path, exc)
    del llm
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def release_vllm_engines(keep: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Release every cached vLLM engine except those of the checkpoints in `keep`; returns the released paths."""
    keep_keys = {str(Path(k).resolve()) for k in keep}
    gone = [p for p in list(_VLLM_ENGINES) if p not in keep_keys]
    for p in gone:
        _release(p)
    return gone


def _generate_vllm(model, ids: list[list[int]], params: SamplingParams) -> RolloutResult:
    """vLLM offline engine on prompts already tokenized as the transformers path and TRL's training tokenize them
    (`{"prompt_token_ids": ...}`: given text, vLLM adds special tokens, so a chat template that writes its own BOS,
    Llama 3's or Gemma's, got two, and every probe and judgement read another input than the policy trained on; an
    outside review, seventy-ninth session). `model` must be a checkpoint directory (vLLM loads weights itself)."""
    if not isinstance(model, (str, Path)) or not Path(model).exists():
        raise RolloutBackendError(
            "rollout backend 'vllm' needs the policy as a checkpoint directory (save_pretrained); "
            "save the model first or use backend='transformers' for an in-memory model"
        )
    import vllm

    llm = _vllm_engine(str(Path(model).resolve()), params.seed)
    sp = vllm.SamplingParams(n=params.n, temperature=params.temperature, top_p=params.top_p,
                             max_tokens=params.max_new_tokens, seed=params.seed)
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": list(i)} for i in ids], sp, use_tqdm=False)
    seconds = time.perf_counter() - t0
    comps, counts, trunc, index = [], [], [], []
    for i, o in enumerate(outs):
        for c in o.outputs:
            comps.append(c.text)
            counts.append(len(c.token_ids))
            trunc.append(c.finish_reason == "length")
            index.append(i)
    return RolloutResult(completions=comps, prompt_index=index, tokens=counts, truncated=trunc, seconds=seconds,
                         new_tokens=sum(counts))
