"""The baselines' optimizers on real gloo ranks against plain single-process references of their papers' equations.

Gradients are dyadic (k / 16, |k| <= 8) where a full-precision allreduce of 3 ranks is involved, so gloo's sums are
exact in any order and the comparisons can be bitwise:
- 1-bit Adam (arXiv:2102.02888, Eq. 1 without bias correction, Algorithm 1): Adam on the averaged gradient for
  adam_warmup_steps, then the variance frozen and the momentum through the error-compensated compressed allreduce,
  with its worker and server errors, over several steps;
- G-AdamW (Distributed Lion, Section 5): torch's AdamW on the averaged gradient;
- BitDP (Algorithm 1, Eq. 10): which tensors are compressed (linear weights only), then AdamW on the aggregate;
- PyTorch DDP + Lion against our flat-allreduce Lion: bitwise at 2 ranks (DDP divides each gradient by 2 before
  its sum and we after it; halving is exact and a two-term sum does not depend on order); at 3 ranks the averaged
  gradients differ by a few float32 ulps (a/3 + b/3 + c/3 is rounded differently from (a + b + c) / 3, and gloo's
  sum order differs between DDP's buckets and our flat buffer), so gradients are compared to 1e-6 relative and the
  parameters may differ only where Lion's sign flips on an update component within those ulps of 0 (by 2 lr).
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as tdist
from torch import nn

from baseline_reference import CompressedAllreduceReference
from src.comm.reducers.ultra_low_bit import channel_quantize
from src.optim.adamw_allreduce import GradAllreduceAdamW
from src.optim.bitdp import compressed_rows
from src.optim.factory import build_optimizer, parameter_groups, validate_variant
from src.optim.grad_allreduce import GradAllreduceLion
from src.optim.lion import Lion
from src.optim.onebit_adam import OneBitAdam

SHAPES = [(6, 5), (3, 4), (7,)]
LR, BETAS, WD, EPS = 1e-2, (0.9, 0.999), 0.1, 1e-8


def init_params() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=g) for shape in SHAPES]


def dyadic_grads(rank: int, step: int) -> list[torch.Tensor]:
    """k / 16 for |k| <= 8; the first bias element never has a gradient (its Adam variance stays 0)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    grads = [torch.randint(-8, 9, shape, generator=g).float() / 16 for shape in SHAPES]
    grads[2][0] = 0.0
    return grads


def param_groups(params):
    return [dict(params=params[:2], weight_decay=WD), dict(params=params[2:], weight_decay=0.0)]


def averaged(step: int, world_size: int) -> list[torch.Tensor]:
    per_rank = [dyadic_grads(r, step) for r in range(world_size)]
    return [sum(g[k] for g in per_rank) / world_size for k in range(len(SHAPES))]


# --- 1-bit Adam --------------------------------------------------------------------------------------------------
def _run_onebit_adam(steps: int, warmup: int):
    rank = tdist.get_rank()
    params = [nn.Parameter(t) for t in init_params()]
    opt = OneBitAdam(param_groups(params), lr=LR, betas=BETAS, weight_decay=WD, adam_warmup_steps=warmup)
    history = []
    for step in range(1, steps + 1):
        for p, g in zip(params, dyadic_grads(rank, step)):
            p.grad = g
        opt.step()
        state = [opt.state[p] for p in params]
        history.append(dict(params=[p.detach().clone() for p in params],
                            m=[s["exp_avg"].clone() for s in state], v=[s["exp_avg_sq"].clone() for s in state],
                            reducer={k: v.clone() for k, v in opt.state_dict()["reducer"].items()},
                            phases=opt.timer.pop()))
    return history


def onebit_adam_reference(world_size: int, steps: int, warmup: int) -> list[dict]:
    """Eq. (1) without bias correction for `warmup` steps, then Algorithm 1 with v frozen (decoupled decay)."""
    params = init_params()
    m, v = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    sizes = [p.numel() for p in params]
    allreduce = CompressedAllreduceReference(world_size, sum(sizes), sizes)  # one scale per tensor
    decay = [WD, WD, 0.0]
    out = []
    for step in range(1, steps + 1):
        if step <= warmup:
            g = averaged(step, world_size)
            m = [mk.mul(BETAS[0]).add(gk, alpha=1 - BETAS[0]) for mk, gk in zip(m, g)]
            v = [vk.mul(BETAS[1]).addcmul(gk, gk, value=1 - BETAS[1]) for vk, gk in zip(v, g)]
        else:
            local = [torch.cat([mk.mul(BETAS[0]).add(gk, alpha=1 - BETAS[0]).reshape(-1)
                                for mk, gk in zip(m, dyadic_grads(r, step))]) for r in range(world_size)]
            m = [c.view_as(p) * (vk > 0) for c, p, vk in zip(allreduce(local).split(sizes), params, v)]
        params = [p.mul(1 - LR * d) if d else p for p, d in zip(params, decay)]
        params = [p.addcdiv(mk, vk.sqrt().add(EPS), value=-LR) for p, mk, vk in zip(params, m, v)]
        out.append(dict(params=params, m=m, v=v, worker_err=[e.clone() for e in allreduce.worker_err],
                        server_err=[e.clone() for e in allreduce.server_err]))
    return out


def test_onebit_adam_warms_up_then_compresses_with_error_feedback(dist):
    world_size, steps, warmup = 3, 6, 2
    outs = dist(world_size, _run_onebit_adam, steps, warmup)
    reference = onebit_adam_reference(world_size, steps, warmup)
    for k, want in enumerate(reference):
        step = k + 1
        for rank, history in enumerate(outs):
            got = history[k]
            for name in ("params", "m", "v"):
                for a, b in zip(got[name], want[name]):
                    assert torch.equal(a, b), (step, rank, name)
            if step <= warmup:  # plain Adam: no compression state yet, a full-precision allreduce
                assert got["reducer"] == {}
            else:
                assert torch.equal(got["reducer"]["worker_error"], want["worker_err"][rank]), (step, rank)
                assert torch.equal(got["reducer"]["server_error"], want["server_err"][rank]), (step, rank)
                assert got["reducer"]["worker_error"].abs().sum() > 0
            assert got["phases"]["communicate"] > 0 and got["phases"]["update"] > 0
    for history in outs:  # a coordinate that never had a gradient keeps m = 0 and does not move (no decay there)
        assert all(h["m"][2][0] == 0 and h["params"][2][0] == init_params()[2][0] for h in history)
    v_at_switch = outs[0][warmup - 1]["v"]
    assert not all(torch.equal(a, b) for a, b in zip(outs[0][0]["v"], v_at_switch))  # v moves during warm-up
    for history in outs:
        for later in history[warmup:]:  # ... and is frozen after it
            assert all(torch.equal(a, b) for a, b in zip(later["v"], v_at_switch))


def test_onebit_adam_refuses_a_compression_stage_without_warmup():
    params = [nn.Parameter(torch.zeros(3))]
    for bad in (0, -2, None):
        with pytest.raises(ValueError, match=f"adam_warmup_steps={bad!r} puts the compression stage at step 1"):
            OneBitAdam(params, adam_warmup_steps=bad)


# --- G-AdamW ------------------------------------------------------------------------------------------------------
def _run_adamw(steps: int):
    rank = tdist.get_rank()
    params = [nn.Parameter(t) for t in init_params()]
    opt = GradAllreduceAdamW(param_groups(params), lr=LR, betas=BETAS, weight_decay=WD, comm_dtype="fp32")
    for step in range(1, steps + 1):
        for p, g in zip(params, dyadic_grads(rank, step)):
            p.grad = g
        opt.step()
    return [p.detach() for p in params]


def test_adamw_on_the_flat_allreduce_is_torch_adamw_on_the_average(dist):
    world_size, steps = 3, 3
    params = [nn.Parameter(t) for t in init_params()]
    reference = torch.optim.AdamW(param_groups(params), lr=LR, betas=BETAS, weight_decay=WD)
    for step in range(1, steps + 1):
        for p, g in zip(params, averaged(step, world_size)):
            p.grad = g
        reference.step()
    for got in dist(world_size, _run_adamw, steps):
        for a, b in zip(got, params):
            assert torch.equal(a, b.detach())


# --- BitDP --------------------------------------------------------------------------------------------------------
class Tiny(nn.Module):
    """An embedding tied to the head, an attention-like and an MLP-like linear layer, a norm, biases."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.attn = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.mlp = nn.Linear(8, 6, bias=False)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.embed.weight


BITDP2 = {"name": "bitdp2", "optimizer": "bitdp", "bits": 2, "threshold": 0.75, "layers": "all"}


def test_bitdp_compresses_linear_weights_only():
    model = Tiny()
    named = {id(p): n for n, p in model.named_parameters()}
    params = [p for g in parameter_groups(model, WD) for p in g["params"]]
    rows = {named[id(p)]: r for p, r in zip(params, compressed_rows(model, params, "all"))}
    assert rows == {"embed.weight": 0, "attn.weight": 8, "mlp.weight": 6, "attn.bias": 0, "norm.weight": 0,
                    "norm.bias": 0}  # the head is the embedding: full precision
    rows = dict(zip([named[id(p)] for p in params], compressed_rows(model, params, "mlp")))
    assert rows["mlp.weight"] == 6 and rows["attn.weight"] == 0
    with pytest.raises(ValueError, match="linear layers of class 'head', but this model .Tiny. has none among its 6 "
                                         r"trainable tensors \(216 values; linear weights in all: 2: attn.weight"):
        validate_variant(dict(BITDP2, layers="head"), world_size=2, model=model)
    convnet = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    with pytest.raises(ValueError, match="weights of linear layers, but this model .Sequential. has none among its "
                                         r"4 trainable tensors \(120 values; linear weights in all: 0\)"):
        validate_variant(BITDP2, world_size=2, model=convnet)


def tiny_grads(rank: int, step: int, model: nn.Module) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(500 * step + rank)
    return [torch.randn(p.shape, generator=g) * (1 + rank) for p in model.parameters()]


def _run_bitdp(steps: int):
    rank = tdist.get_rank()
    torch.manual_seed(0)
    model = Tiny()
    opt = build_optimizer(model, BITDP2, lr=LR, betas=BETAS, weight_decay=WD)
    for step in range(1, steps + 1):
        for p, g in zip(model.parameters(), tiny_grads(rank, step, model)):
            p.grad = g
        opt.step()
    return [p.detach() for p in model.parameters()], opt.timer.pop()


def bitdp_aggregate(model: nn.Module, per_rank: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """Eq. (10) per linear weight (2 bits), the plain average elsewhere; 2 ranks, so sums are order-free."""
    world_size, linear = len(per_rank), {"attn.weight", "mlp.weight"}
    out = []
    for k, (name, _) in enumerate(model.named_parameters()):
        grads = [g[k] for g in per_rank]
        if name in linear:
            (s0, q0), (s1, q1) = (channel_quantize(g, 2) for g in grads)
            s_bar = (s0 + s1) / world_size
            out.append(((q0.long() + q1.long()).float() * s_bar.unsqueeze(1)) / world_size)
        else:
            out.append((grads[0] + grads[1]) / world_size)
    return out


def test_bitdp_optimizer_is_adamw_on_the_ultra_low_bit_aggregate(dist):
    steps = 3
    torch.manual_seed(0)
    model = Tiny()
    reference = torch.optim.AdamW(parameter_groups(model, WD), lr=LR, betas=BETAS, weight_decay=WD)
    for step in range(1, steps + 1):
        aggregate = bitdp_aggregate(model, [tiny_grads(r, step, model) for r in range(2)])
        for p, g in zip(model.parameters(), aggregate):
            p.grad = g
        reference.step()
    for got, phases in dist(2, _run_bitdp, steps):
        for a, b in zip(got, model.parameters()):
            assert torch.equal(a, b.detach())
        assert {"quantize", "communicate", "update"} <= set(phases)


# --- PyTorch DDP against our flat-allreduce Lion -------------------------------------------------------------------
def _run_ddp_and_flat_lion(steps: int):
    rank = tdist.get_rank()

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 4))

    a, b = make(), make()
    ddp = nn.parallel.DistributedDataParallel(a)
    opt_a = Lion(a.parameters(), lr=LR, betas=(0.9, 0.99), weight_decay=WD)
    opt_b = GradAllreduceLion(b.parameters(), lr=LR, betas=(0.9, 0.99), weight_decay=WD, comm_dtype="fp32")
    out = []
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
        nn.functional.mse_loss(ddp(x), y).backward()
        nn.functional.mse_loss(b(x), y).backward()
        opt_b.allreduce_gradients()
        grads = [(pa.grad.clone(), pb.grad.clone()) for pa, pb in zip(a.parameters(), b.parameters())]
        opt_a.step()
        Lion.step(opt_b)  # the gradients are averaged already
        opt_a.zero_grad()
        opt_b.zero_grad()
        out.append((grads, [(pa.detach().clone(), pb.detach().clone()) for pa, pb in zip(a.parameters(),
                                                                                         b.parameters())]))
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_ddp_lion_and_flat_allreduce_lion_agree(dist, world_size):
    steps = 6
    for history in dist(world_size, _run_ddp_and_flat_lion, steps):
        for step, (grads, params) in enumerate(history):
            for ga, gb in grads:
                if world_size == 2:
                    assert torch.equal(ga, gb), step
                else:
                    torch.testing.assert_close(ga, gb, rtol=1e-6, atol=1e-8)
            for pa, pb in params:
                if world_size == 2:
                    assert torch.equal(pa, pb), step
                else:
                    differ = pa != pb
                    assert differ.float().mean() <= 1e-3, step
                    assert ((pa - pb).abs()[differ] <= 2 * LR * (step + 1) + 1e-6).all(), step
