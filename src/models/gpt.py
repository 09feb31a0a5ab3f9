"""GPT-2++: the GPT model of the Lion Cub experiments (Section 7, Appendix D.1).

Section 7: "GPT-2-style models (Radford et al., 2019) incorporating modern
training techniques from LLaMA (Touvron et al., 2023), such as Gated Linear
Unit activations for the MLP and RMSNorm", trained with sequence length 1024
and no dropout (Appendix D.1). The sizes are the four of Appendix D.1:

    124m: n_layer=12, n_head=12, n_embd=768
    350m: n_layer=24, n_head=16, n_embd=1024
    774m: n_layer=36, n_head=20, n_embd=1280
    1558m: n_layer=48, n_head=25, n_embd=1600

Everything else follows GPT-2 / nanoGPT: learned absolute position
embeddings (wpe), pre-norm residual blocks, causal self-attention, the
output head tied to the token embedding (`tie_embeddings=True`; False gives
`lm_head` its own matrix, so the input embedding and the output head are
separate tensors, as Fig. 4 and 8 need), normal(0, 0.02) init with residual
projections scaled by 1/sqrt(2 * n_layer).

A run's config states every architecture number (conf/model/gpt*.yaml; the
resolved config is the record of the run): `check_stated` refuses a config
that leaves one out, and `build_gpt` refuses numbers that contradict the
Appendix D.1 size a config names (`size: 774m` with `n_layer: 12`), so no run
is labelled with a size it does not have. `tiny`, `mini` and `laptop` are our
own CPU shapes and may be resized freely.

Choices the paper does not state (deliberate, documented here):
- The MLP is SwiGLU, down(silu(gate(x)) * up(x)), with hidden width chosen so
  that its three matrices hold as many weights as GPT-2's 4x MLP
  (3 * n_embd * h = 8 * n_embd^2, i.e. h = 8/3 * n_embd), rounded up to a
  multiple of 64. This keeps the parameter counts at the nominal sizes.
- No biases anywhere (LLaMA style); RMSNorm has a learnable scale only.
- vocab_size defaults to GPT-2's 50257 (not padded to 50304 as nanoGPT does).
- Small sizes, `tiny` and `mini`, exist for CPU tests and smoke runs; `laptop` is the laptop scale model of the
  774M run (docs/scale_model.md): 4 x 256 on a compact vocabulary of 1024 ids (src/data/compact_vocab.py), so
  that vocabulary-sized weights are about as large a share of the model as in the paper.
"""

import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 50257
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    mlp_hidden: int | None = None  # None: match GPT-2's 4x MLP, rounded up to 64
    tie_embeddings: bool = True  # lm_head shares the token embedding's matrix (GPT-2)

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {value!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"GPTConfig.n_embd={self.n_embd} must be divisible by n_head={self.n_head}"
            )
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(f"GPTConfig.tie_embeddings must be true or false, got {self.tie_embeddings!r}")
        if self.mlp_hidden is not None and (
            not isinstance(self.mlp_hidden, int) or isinstance(self.mlp_hidden, bool) or self.mlp_hidden <= 0
        ):
            raise ValueError(
                f"GPTConfig.mlp_hidden must be a positive int or None, got {self.mlp_hidden!r}"
            )

    @property
    def hidden(self) -> int:
        """Width of the SwiGLU MLP (see module docstring)."""
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        return 64 * math.ceil(8 * self.n_embd / 3 / 64)


# Appendix D.1 sizes, plus three CPU-sized ones (block_size overridable).
GPT_SIZES: dict[str, dict] = {
    "tiny": dict(n_layer=2, n_head=2, n_embd=64, block_size=256),
    "mini": dict(n_layer=4, n_head=4, n_embd=128, block_size=256),
    "laptop": dict(n_layer=4, n_head=4, n_embd=256, block_size=64, vocab_size=1024),
    "124m": dict(n_layer=12, n_head=12, n_embd=768),
    "350m": dict(n_layer=24, n_head=16, n_embd=1024),
    "774m": dict(n_layer=36, n_head=20, n_embd=1280),
    "1558m": dict(n_layer=48, n_head=25, n_embd=1600),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, n_head, T, head_dim)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class SwiGLU(nn.Module):
    """Gated Linear Unit MLP: down_proj(silu(gate_proj(x)) * up_proj(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.hidden, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.hidden, bias=False)
        self.down_proj = nn.Linear(config.hidden, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.RMSNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.RMSNorm(config.n_embd)
        self.mlp = SwiGLU(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


# Parameter names of the projections that write into the residual stream;
# GPT-2 scales their init std by 1/sqrt(2 * n_layer).
RESIDUAL_PROJECTIONS = ("attn.c_proj.weight", "mlp.down_proj.weight")


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        # `transformer` is registered before `lm_head`, so a tied tensor is
        # reported by named_parameters() as `transformer.wte.weight`.
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.RMSNorm(config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2 init: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L))."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, param in self.named_parameters():
            if name.endswith(RESIDUAL_PROJECTIONS):
                nn.init.normal_(param, mean=0.0, std=residual_std)

    def _check_input(self, idx: torch.Tensor) -> None:
        if idx.dim() != 2:
            raise ValueError(f"GPT expects token ids of shape (batch, seq_len), got {tuple(idx.shape)}")
        T = idx.size(1)
        if T > self.config.block_size:
            raise ValueError(
                f"sequence length {T} exceeds block_size {self.config.block_size}"
            )
        if idx.numel() == 0:
            return
        # Checked where the ids are, without a host synchronisation: on CPU `_assert_async` raises here; on CUDA
        # it is a device-side assertion (as an out-of-range embedding lookup would be). Training data is checked
        # against vocab_size once, when it is opened (src.data.text_loader.validate_token_folder).
        in_range = ((idx >= 0) & (idx < self.config.vocab_size)).all()
        try:
            torch._assert_async(in_range, "token ids out of range")
        except RuntimeError:
            lo, hi = (int(v) for v in torch.aminmax(idx))
            raise ValueError(
                f"token ids must lie in [0, vocab_size={self.config.vocab_size}), "
                f"got min {lo}, max {hi}"
            ) from None

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """idx, targets: (B, T) int64. Returns logits (B, T, vocab) and the
        mean cross-entropy over all B*T positions (None without targets)."""
        self._check_input(idx)
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


PAPER_SIZES = ("124m", "350m", "774m", "1558m")
SHAPE = ("n_layer", "n_head", "n_embd")
STATED = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")


def build_gpt(size: str | None = "tiny", **overrides) -> GPT:
    """GPT of a named size (GPT_SIZES) with any GPTConfig field overridden, or of the given fields (size=None).

    An Appendix D.1 size keeps its shape: n_layer, n_head or n_embd different from the size's raise ValueError.
    """
    if size is not None and size not in GPT_SIZES:
        raise ValueError(f"unknown GPT size {size!r}; valid sizes: {sorted(GPT_SIZES)} (or null for a custom shape)")
    valid = [f.name for f in fields(GPTConfig)]
    unknown = sorted(set(overrides) - set(valid))
    if unknown:
        raise ValueError(f"unknown GPT parameter(s) {unknown}; valid: {valid}")
    config = GPTConfig(**{**GPT_SIZES.get(size, {}), **overrides})
    if size in PAPER_SIZES:
        wrong = [f"{k}={overrides[k]}" for k in SHAPE if k in overrides and overrides[k] != GPT_SIZES[size][k]]
        if wrong:
            paper = ", ".join(f"{k}={GPT_SIZES[size][k]}" for k in SHAPE)
            raise ValueError(f"size={size} is the Appendix D.1 shape {paper}, but {', '.join(wrong)} was given; "
                             "set size to null for a custom shape (or leave the shape as it is)")
    return GPT(config)


def check_stated(params: dict, config: GPTConfig) -> None:
    """Raise ValueError unless a run config's `model.params` states every architecture number of the model it
    builds (so `--cfg job`, the run folder's config.yaml and W&B show the model's real numbers)."""
    missing = [k for k in STATED if params.get(k) is None]
    if missing:
        raise ValueError(f"model.params must state {', '.join(missing)} (the run's config is its record; this "
                         f"model has {', '.join(f'{k}={getattr(config, k)}' for k in missing)})")
