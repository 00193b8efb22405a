"""The GPT-2 architecture (Radford et al. 2019), written to be read top to bottom.

Pre-LayerNorm transformer blocks, learned position embeddings, GELU with the tanh
approximation, biases everywhere, and an LM head tied to the token embedding: exactly GPT-2,
so Hugging Face GPT-2 checkpoints load here (`GPT.from_hf`) and ours load there (`to_hf`).

There is ONE forward, `GPT.hidden`, and everything speculative decoding needs from it is an
input rather than a second code path:

- `positions`: the absolute position of every input token. A token tree (`tree.py`) is fed as
  one sequence whose tokens sit at positions L + depth, not L, L + 1, ...;
- `cache`: anything with `update(layer, k, v)` and `advance(n)`: the `KVCache` appends the new
  keys and values at its length; the fixed-shape writer of `kernels/fastpath.py` writes them at slots
  given on the device, so that a CUDA graph can replay the step;
- `attn_mask` (T, keys): which keys each new token may see. `prefix_mask` builds the usual one:
  the whole cached prefix, then a (T, T) mask among the new tokens (causal, or a tree's). With
  several independent sequences in one batch, each row has its own cached length and so its own
  mask, (B, T, keys) (`kvcache.BatchKVCache.mask`).

It returns the final hidden states; `forward` adds the LM head. Medusa's heads and EAGLE's
draft head predict from those hidden states.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .files import atomic_save_tensors, atomic_write_json, read_tensors


@dataclass
class GPTConfig:
    vocab_size: int = 8192
    n_ctx: int = 512  # longest sequence (number of learned positions)
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384
    layer_norm_eps: float = 1e-5


# Model sizes by name. vocab_size is set from the tokenizer when a model is trained.
PRESETS = {
    "target": GPTConfig(n_layer=6, n_head=6, n_embd=384),  # 14.0M parameters; for a GPU
    "small": GPTConfig(n_layer=6, n_head=4, n_embd=256),  # 7.0M; trainable on a CPU in hours
    "draft": GPTConfig(n_layer=2, n_head=2, n_embd=128),  # 1.5M; two layers, so it can learn to copy from context
    "tiny": GPTConfig(n_ctx=64, n_layer=2, n_head=2, n_embd=32),  # for tests: trains in seconds
}


def causal_mask(T: int, device=None) -> torch.Tensor:
    """(T, T) bool: token i sees tokens 0..i."""
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


def prefix_mask(new_mask: torch.Tensor, L: int) -> torch.Tensor:
    """(T, L + T) bool: every new token sees all L cached tokens, and among the T new tokens
    what `new_mask` (T, T) allows (causal for a sequence, ancestors for a tree)."""
    T = new_mask.shape[0]
    return torch.cat([torch.ones(T, L, dtype=torch.bool, device=new_mask.device), new_mask], dim=1)


class SDPA:
    """The attention every forward uses unless told otherwise (`GPT.set_attention`): PyTorch's
    scaled_dot_product_attention with the dense (T, keys) mask, the reference. An attention is
    `prepare(attn_mask, T)`, run once per forward to put the mask in the form it reads, and a call
    on (q, k, v, prepared) per layer; `kernels/tree_attention.py` offers a Triton one."""

    def prepare(self, attn_mask: torch.Tensor | None, T: int):
        return attn_mask

    # On a GPU, SDPA may pick cuDNN's attention for bf16 and fp16, which builds a plan for every new
    # shape, and decoding makes a new shape every step (the cache grows by one or more keys): on an
    # H200, a masked bf16 call over a growing prefix took 60 ms the first time each length was seen
    # against 0.09 ms for the memory-efficient kernel, and bf16 `ar` ran at 219 tokens/s with it and
    # 401 without (docs/gpu/followup.json). So CUDA calls choose among the other backends.
    CUDA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

    def __call__(self, q, k, v, attn_mask):  # attn_mask None: causal over a sequence from slot 0 (training, prefill)
        causal = attn_mask is None and q.shape[2] > 1
        if q.is_cuda:
            with sdpa_kernel(self.CUDA_BACKENDS):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)  # q, k, v for all heads at once
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x, layer: int, cache, attend, mask):
        """Multi-head self-attention over x (B, T, C): one product gives every head's q, k and v
        (n_head heads of C / n_head), each (B, n_head, T, C / n_head); with a cache, this layer's k
        and v are written after the cached prefix (`cache.update(layer, k, v)`) and the queries
        attend over all of its keys. attend(q, k, v, mask) is the attention (`SDPA`): mask (T, keys),
        True where a query may look, None for causal. The heads' outputs, side by side, go through
        c_proj: (B, T, C)."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, H, keys, D): the cached prefix, then these T
        y = attend(q, k, v, mask)  # (B, H, T, D)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, layer, cache, attend, mask):
        x = x + self.attn(self.ln_1(x), layer, cache, attend, mask)  # pre-LN: normalise, then add back
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.n_ctx, config.n_embd),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as in GPT-2
        self.attention = SDPA()  # or another attention with the same interface (set_attention)
        self.tokenizer_fingerprint = ""  # the tokenizer it was trained with (tokenizer.fingerprint), if known
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: scale residual projections by 1/sqrt(2 n_layer)
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def set_attention(self, attention) -> "GPT":
        """Attend with `attention` (see `SDPA`), e.g. `kernels.tree_attention.TreeAttention()`."""
        self.attention = attention
        return self

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # the tied head is counted once

    def hidden(self, idx: torch.Tensor, positions: torch.Tensor | None = None, cache=None,
               attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states (B, T, C) of tokens `idx` (B, T).

        positions: (T,) or (B, T) absolute positions, on the device; default: the next T after
            the cache (an error if they pass the context window).
        cache: a `KVCache` (or anything with `update` and `advance`): the new tokens attend to
            the keys it returns, and it keeps theirs.
        attn_mask: (T, keys) bool, True where new token i may see key j, the same for every row,
            or (B, T, keys), one per row; default: causal (all of the cached prefix, then causal
            among the new tokens)."""
        B, T = idx.shape
        if positions is None:
            L = cache.length if cache is not None else 0
            if L + T > self.config.n_ctx:
                raise ValueError(f"{L + T} tokens exceed the model's context of {self.config.n_ctx}")
            positions = torch.arange(L, L + T, device=idx.device)
        if attn_mask is None and T > 1 and cache is not None and cache.length > 0:
            attn_mask = prefix_mask(causal_mask(T, idx.device), cache.length)
        if attn_mask is not None and attn_mask.dim() == 3:
            attn_mask = attn_mask[:, None]  # (B, 1, T, keys): each row its own, the same for every head
        mask = self.attention.prepare(attn_mask, T)  # once per forward, not per layer
        x = self.transformer.wte(idx) + self.transformer.wpe(positions)
        for layer, block in enumerate(self.transformer.h):
            x = block(x, layer, cache, self.attention, mask)
        if cache is not None:
            cache.advance(T)
        return self.transformer.ln_f(x)

    def forward(self, idx, positions=None, cache=None, attn_mask=None):
        """Returns (logits (B, T, vocab), hidden (B, T, C)); arguments as in `hidden`."""
        h = self.hidden(idx, positions, cache, attn_mask)
        return self.logits(h), h

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The LM head; a model that drafts with a reduced vocabulary (`DraftVocab`) scores only it."""
        vocab = getattr(self, "draft_vocab", None)
        return self.lm_head(h) if vocab is None else vocab(h)

    def fingerprint(self) -> str:
        """A short hash of the token embedding: what was trained for one model (heads, a draft
        distilled from it) is only valid on that model; the same shape is not enough. A model
        loaded in a lower precision than its file's keeps the file's hash: rounding to bf16
        changes the weights, not which model they are."""
        w = self.transformer.wte.weight
        if w.dtype != torch.float32 and getattr(self, "file_fingerprint", None):
            return self.file_fingerprint
        return embedding_hash(w)

    # ---- checkpoints: the Hugging Face GPT-2 layout, in safetensors -------------------------

    # HF's GPT-2 stores these as Conv1D, i.e. (in, out): the transpose of nn.Linear's weight.
    _CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Our weights under HF GPT-2 names; the tied lm_head is left out, as HF does."""
        sd = {}
        for name, t in self.state_dict().items():
            if name == "lm_head.weight":
                continue
            sd[name] = (t.t() if name.endswith(self._CONV1D) else t).contiguous()
        return sd

    def save(self, path: str | Path, dtype: torch.dtype | None = None) -> None:
        """One safetensors file (HF GPT-2 tensor names) with our config and the tokenizer's
        fingerprint in its metadata, written atomically. `GPT.from_hf(path)` loads it back."""
        sd = {k: v.to(dtype) if dtype else v for k, v in self.hf_state_dict().items()}
        meta = {"config": json.dumps(asdict(self.config))}
        if self.tokenizer_fingerprint:
            meta["tokenizer"] = self.tokenizer_fingerprint
        atomic_save_tensors(sd, path, meta)

    def to_hf(self, directory: str | Path, eos_token_id: int | None = None) -> None:
        """Write `config.json` + `model.safetensors` that transformers' GPT2LMHeadModel loads."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        c = self.config
        eos = c.vocab_size - 1 if eos_token_id is None else eos_token_id
        hf = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], vocab_size=c.vocab_size,
                  n_positions=c.n_ctx, n_embd=c.n_embd, n_layer=c.n_layer, n_head=c.n_head, n_inner=None,
                  layer_norm_epsilon=c.layer_norm_eps, activation_function="gelu_new",
                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
                  bos_token_id=eos, eos_token_id=eos)
        self.save(d / "model.safetensors")
        atomic_write_json(d / "config.json", hf)

    @classmethod
    def from_hf(cls, path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> "GPT":
        """Load a GPT-2 checkpoint in the HF layout: a directory with config.json and
        model.safetensors, or a .safetensors file whose metadata (ours) or sibling
        config.json gives the config. dtype: default is the stored dtype."""
        path = Path(path)
        file = path / "model.safetensors" if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"no checkpoint at {file}")
        meta, sd = read_tensors(file)
        if "config" in meta:
            config = GPTConfig(**json.loads(meta["config"]))
        elif (file.parent / "config.json").is_file():
            config = config_from_hf(json.loads((file.parent / "config.json").read_text()))
        else:
            raise ValueError(f"{file} has no config: put the model's config.json beside it")
        model = cls(config)
        ours = {}
        for name, t in sd.items():
            name = name if name.startswith(("transformer.", "lm_head.")) else "transformer." + name  # bare GPT2Model
            if name.endswith((".attn.bias", ".attn.masked_bias")):  # old HF causal-mask buffers
                continue
            ours[name] = t.t() if name.endswith(cls._CONV1D) else t
        head = ours.pop("lm_head.weight", None)
        if head is not None and not torch.equal(head, ours["transformer.wte.weight"]):
            raise ValueError(f"{file}: lm_head differs from the token embedding; tinyspec needs a tied head")
        missing, unexpected = model.load_state_dict(ours, strict=False)
        missing = [m for m in missing if m != "lm_head.weight"]
        if missing or unexpected:
            raise ValueError(f"{file} does not match the GPT-2 layout: missing {missing}, unexpected {unexpected}")
        model.tokenizer_fingerprint = meta.get("tokenizer", "")
        model.file_fingerprint = embedding_hash(ours["transformer.wte.weight"])
        return model.to(device=device, dtype=dtype or next(iter(sd.values())).dtype)


def embedding_hash(w: torch.Tensor) -> str:
    """`GPT.fingerprint`'s hash of a token embedding, computed in float32."""
    return hashlib.sha1(w.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def config_from_hf(hf: dict) -> GPTConfig:
    """GPTConfig from a transformers GPT2Config dict; refuses variants we do not implement."""
    if hf.get("model_type", "gpt2") != "gpt2":
        raise ValueError(f"model_type {hf.get('model_type')!r} is not gpt2")
    if hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"activation {hf['activation_function']!r} is not GPT-2's tanh GELU")
    if hf.get("n_inner") not in (None, 4 * hf["n_embd"]) or hf.get("scale_attn_by_inverse_layer_idx"):
        raise ValueError("this GPT-2 variant (n_inner or attention scaling) is not supported")
    return GPTConfig(vocab_size=hf["vocab_size"], n_ctx=hf.get("n_positions", hf.get("n_ctx", 1024)),
                     n_layer=hf["n_layer"], n_head=hf["n_head"], n_embd=hf["n_embd"],
                     layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5))


class DraftVocab:
    """An LM head that scores only `ids`, the V' most frequent tokens of the corpus (FR-Spec, Zhao
    et al. 2025; EAGLE-3's draft vocabulary): a drafter's LM-head product, often the largest it
    computes, costs V'/V of the full one. Every other token gets logit -inf, so the drafter's q is
    a distribution over V' tokens written over the whole vocabulary: the target still judges over
    all V tokens, and every exact rule, which holds for any q, stays exact. (A plain object, not a
    module: it keeps a gathered copy of the head's rows, never saved with the drafter.)"""

    def __init__(self, lm_head: nn.Linear, ids: torch.Tensor):
        self.vocab_size = lm_head.weight.shape[0]
        self.ids = ids.to(lm_head.weight.device)
        self.weight = lm_head.weight.detach()[self.ids].clone()  # (V', C): gathered once, not per call

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        out = h.new_full((*h.shape[:-1], self.vocab_size), float("-inf"))
        out[..., self.ids] = h @ self.weight.T
        return out
