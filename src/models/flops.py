"""Model FLOPs per trained token of GPT-2++ (src/models/gpt.py), the numerator of model FLOPs utilisation (MFU).

The estimate of PaLM (Chowdhery et al., 2022, Appendix B), as nanoGPT's `GPT.estimate_mfu` computes it. What is
counted here, precisely:
- N: the parameters that multiply activations, i.e. every parameter except the position embedding `wpe` (as
  nanoGPT's `get_num_params(non_embedding=True)`) and, when the output head is not tied to it, the token embedding
  `wte` (a lookup does no multiply-add; a tied matrix is counted once, for the output head's product). For the
  tied models of the paper (Appendix D.1) this is nanoGPT's N. The RMSNorm scales are counted, as nanoGPT counts
  its LayerNorms (a few thousand of hundreds of millions).
- T: the trained sequence length (`data.block_size`), where nanoGPT takes the model's block size.
Causal attention is counted whole (nanoGPT and PaLM do too), and so is the backward of the input embedding.
"""
from __future__ import annotations

from src.models.gpt import GPT


def gpt_flops_per_token(n_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> int:
    """Training FLOPs (forward and backward) per token: 6 N + 12 L H Q T (PaLM, Chowdhery et al. 2022, Appendix B;
    nanoGPT `GPT.estimate_mfu`).

    6 N: each of N weights does a multiply-add (2 FLOPs) per token in the forward pass and two in the backward
    pass (the gradients of the input and of the weight). 12 L H Q T: the attention scores QK^T and their product
    with V, 2 * 2 * T * H Q FLOPs per token and layer forward, three times that with the backward, over L layers of
    H heads of width Q, for a sequence of T tokens."""
    return 6 * n_params + 12 * n_layer * n_head * head_dim * seq_len


def counted_parameters(model: GPT) -> int:
    """N of `gpt_flops_per_token` for `model` (see the module doc): without `wpe`, and without `wte` when untied."""
    skip = {id(model.transformer.wpe.weight)}
    if model.transformer.wte.weight is not model.lm_head.weight:
        skip.add(id(model.transformer.wte.weight))
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def model_flops_per_token(model: GPT, seq_len: int) -> int:
    """Training FLOPs per token of `model` trained on sequences of `seq_len` tokens."""
    c = model.config
    return gpt_flops_per_token(counted_parameters(model), c.n_layer, c.n_head, c.n_embd // c.n_head, seq_len)
