"""LionCub and the gradient-allreduce baseline on real gloo ranks, against single-process Lion."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as tdist

from src.comm import Reducer, make_reducer
from src.optim import GradAllreduceLion, Lion, LionCub

NAMES = ("transformer.wte.weight", "transformer.h.0.mlp.up_proj.weight", "transformer.h.0.attn.c_attn.weight",
         "lm_head.weight", "transformer.ln_f.weight")
SHAPES = ((11, 4), (4, 6), (6, 4), (3, 4), (4,))


def make_params() -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(*s, generator=g) * 0.5) for s in SHAPES]


def loss_fn(params, rank: int, step: int) -> torch.Tensor:
    """A small nonlinear regression whose data differ per rank and step."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    idx = torch.randint(0, SHAPES[0][0], (8,), generator=g)
    target = torch.randn(8, 3, generator=g)
    h = torch.tanh(params[0][idx] @ params[1]) @ params[2] * params[4]
    return ((h @ params[3].T - target) ** 2).mean()


def set_grads(params, rank: int, step: int) -> None:
    for p in params:
        p.grad = None
    loss_fn(params, rank, step).backward()


def _train_cub(reducer, momentum_sync, steps, lr=1e-2, betas=(0.9, 0.99), wd=0.1, resume_at=None):
    rank = tdist.get_rank()
    params = make_params()

    def build(ps):
        return LionCub(list(zip(NAMES, ps)), lr=lr, betas=betas, weight_decay=wd, reducer=reducer,
                       momentum_sync=momentum_sync)

    opt = build(params)
    for step in range(1, steps + 1):
        if resume_at is not None and step == resume_at:
            saved = opt.state_dict()
            params = [torch.nn.Parameter(p.detach().clone()) for p in params]
            opt = build(params)
            opt.load_state_dict(saved)
        set_grads(params, rank, step)
        opt.step()
    phases = opt.timer.pop()
    return [p.detach().clone() for p in params], [opt.state[p]["exp_avg"].clone() for p in params], phases


def reference_lion_on_average_gradient(world_size, steps, lr=1e-2, betas=(0.9, 0.99), wd=0.1):
    params = make_params()
    opt = Lion(params, lr=lr, betas=betas, weight_decay=wd)
    for step in range(1, steps + 1):
        grads = []
        for rank in range(world_size):
            set_grads(params, rank, step)
            grads.append([p.grad.clone() for p in params])
        for i, p in enumerate(params):
            p.grad = torch.stack([g[i] for g in grads]).mean(0)
        opt.step()
    return [p.detach() for p in params]


@pytest.mark.parametrize("world_size", [2, 3])
def test_synced_momentum_with_fp32_reducer_follows_lion_on_averaged_gradient(dist, world_size):
    outs = dist(world_size, _train_cub, "fp32", {"every": 1, "layers": "all"}, 50)
    expected = reference_lion_on_average_gradient(world_size, 50)
    for params, _, _ in outs:
        for p, e in zip(params, expected):
            torch.testing.assert_close(p, e, rtol=1e-5, atol=1e-5)


REDUCERS = [
    "fp32", "bf16",
    {"name": "pbit", "quant": "sign", "bits": 4, "chunk": 16},
    {"name": "pbit", "quant": "l1", "levels": 15, "bits": 8, "vote": "average"},
    {"name": "pbit", "quant": "linf", "levels": 7, "bits": 8, "seed": 2},
    {"name": "onebit", "zeros": "alternate", "chunk": 24},
    {"name": "ps_naive", "quant": "sign", "bits": 8},
    {"name": "ps_tree", "quant": "sign", "bits": 8, "vote": "average"},
]


# 4 ranks in make test-all (make test's time; tests/test_conformance.py runs every registered reducer at 2 ranks)
@pytest.mark.parametrize("world_size", [3, pytest.param(4, marks=pytest.mark.slow)])
@pytest.mark.parametrize("reducer", range(len(REDUCERS)))
def test_parameters_stay_bitwise_identical_across_ranks(dist, world_size, reducer):
    sync = {"every": 10, "layers": "embed_head"} if reducer % 2 else None
    outs = dist(world_size, _train_cub, REDUCERS[reducer], sync, 100)
    first, _, phases = outs[0]
    assert {"quantize", "communicate", "update"} <= set(phases)
    moved = any(not torch.equal(p, q) for p, q in zip(first, make_params()))
    assert moved, "training should have changed the parameters"
    for params, _, _ in outs[1:]:
        for p, q in zip(first, params):
            assert torch.equal(p, q)


class ReduceOnly(Reducer):
    """A reducer with only the contract's `reduce(update, step)`: LionCub's step runs it as one chunk, the whole
    update vector through `reduce`."""

    name = "reduce_only"

    def __init__(self, inner: Reducer):
        super().__init__()
        self.inner = inner

    def _reduce(self, update, step):
        return self.inner.reduce(update, step)


def _train_both_paths(reducer: dict, steps: int):
    """LionCub's fused chunked step and its one-chunk step (around the same reducer's `reduce`), side by side."""
    sizes = [p.numel() for p in make_params()]
    options = {k: v for k, v in reducer.items() if k != "name"}
    flat = ReduceOnly(make_reducer(reducer["name"], segments=sizes, **options))
    return [_train_cub(r, {"every": 4, "layers": "all"}, steps)[:2] for r in (reducer, flat)]


@pytest.mark.parametrize("reducer", [{"name": "pbit", "quant": "l1", "levels": 15, "bits": 8, "chunk": 128},
                                     {"name": "pbit", "quant": "sign", "bits": 4, "chunk": 16},
                                     {"name": "onebit", "chunk": 24},
                                     {"name": "pbit", "quant": "linf", "levels": 7, "bits": 16, "seed": 3,
                                      "vote": "average", "chunk": 128}])
def test_fused_chunked_step_equals_the_flat_step_bitwise(dist, reducer):
    """Update vector, momentum step and direction applied chunk by chunk (no flat vectors) change nothing."""
    for (chunked_params, chunked_momenta), (flat_params, flat_momenta) in dist(3, _train_both_paths, reducer, 12):
        assert all(torch.equal(a, b) for a, b in zip(chunked_params, flat_params))
        assert all(torch.equal(a, b) for a, b in zip(chunked_momenta, flat_momenta))


def _train_whole_vector(name: str, steps: int):
    """LionCub with a whole-vector reducer by name, and around the same reducer's `reduce` (ReduceOnly)."""
    sizes = [p.numel() for p in make_params()]
    wrapped = ReduceOnly(make_reducer(name, segments=sizes))
    return [_train_cub(r, {"every": 4, "layers": "all"}, steps)[:2] for r in ({"name": name}, wrapped)]


@pytest.mark.parametrize("name", ["dlion_naive", "dlion_allgather", "compressed_allreduce"])
def test_a_whole_vector_reducer_steps_exactly_as_its_reduce(dist, name):
    """The neighbours' reducers take LionCub's one path as one chunk: the same as calling their `reduce`."""
    for (params, momenta), (ref_params, ref_momenta) in dist(2, _train_whole_vector, name, 6):
        assert all(torch.equal(a, b) for a, b in zip(params, ref_params))
        assert all(torch.equal(a, b) for a, b in zip(momenta, ref_momenta))


def test_momentum_sync_averages_only_the_chosen_layers(dist):
    outs = dist(2, _train_cub, {"name": "pbit", "bits": 4}, {"every": 5, "layers": "embed_head"}, 5)
    (_, m0, _), (_, m1, _) = outs
    synced = {0, 3}  # wte and lm_head
    for i, (a, b) in enumerate(zip(m0, m1)):
        assert torch.equal(a, b) == (i in synced), NAMES[i]


def test_momentum_sync_for_a_missing_layer_class_is_an_error(dist):
    with pytest.raises(Exception, match="no parameter of class mlp"):
        dist(2, _build_resnet_like_with_mlp_sync)


def _build_resnet_like_with_mlp_sync():
    params = [("conv1.weight", torch.nn.Parameter(torch.zeros(3))), ("fc.weight", torch.nn.Parameter(torch.zeros(3)))]
    LionCub(params, lr=1e-3, reducer="onebit", momentum_sync={"every": 2, "layers": "mlp"})


@pytest.mark.parametrize("reducer", [{"name": "pbit", "quant": "linf", "levels": 7, "bits": 8, "seed": 4},
                                     {"name": "onebit"}])
def test_resume_from_state_dict_is_bitwise_identical(dist, reducer):
    straight = dist(2, _train_cub, reducer, {"every": 3, "layers": "all"}, 12)
    resumed = dist(2, _train_cub, reducer, {"every": 3, "layers": "all"}, 12, resume_at=7)
    for (a, ma, _), (b, mb, _) in zip(straight, resumed):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        assert all(torch.equal(x, y) for x, y in zip(ma, mb))


def _train_grad_allreduce(comm_dtype, steps):
    rank = tdist.get_rank()
    params = make_params()
    opt = GradAllreduceLion(params, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, comm_dtype=comm_dtype)
    for step in range(1, steps + 1):
        set_grads(params, rank, step)
        opt.step()
    return [p.detach().clone() for p in params], opt.timer.pop()


def test_gradient_allreduce_lion_is_lion_on_the_averaged_gradient(dist):
    outs = dist(3, _train_grad_allreduce, "fp32", 30)
    expected = reference_lion_on_average_gradient(3, 30)
    for params, phases in outs:
        assert {"quantize", "communicate", "update"} <= set(phases)
        for p, e in zip(params, expected):
            torch.testing.assert_close(p, e, rtol=1e-5, atol=1e-5)


def test_bf16_gradient_allreduce_keeps_ranks_identical(dist):
    outs = dist(2, _train_grad_allreduce, "bf16", 20)
    for p, q in zip(outs[0][0], outs[1][0]):
        assert torch.equal(p, q)


def test_lioncub_input_errors():
    with pytest.raises(ValueError, match="no process group"):
        LionCub(make_params(), lr=1e-3, reducer="pbit")
    with pytest.raises(ValueError, match="unknown reducer 'nope'"):
        LionCub(make_params(), lr=1e-3, reducer={"name": "nope", "world_size": 2})
    with pytest.raises(ValueError, match="empty parameter list"):
        LionCub([], lr=1e-3, reducer={"name": "pbit", "world_size": 2})


def _phases(kernels: str, reducer: dict) -> dict:
    import warnings
    optimizer = LionCub(make_params(), lr=1e-2, reducer=reducer, kernels=kernels)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the torch path of a method without C code is said once (tested elsewhere)
        return {"backend": optimizer.kernels, **optimizer.kernels_record()["phases"]}


def test_the_kernels_record_says_which_code_ran_each_phase(dist):
    """summary.json's `kernels.phases`: with kernels=native, l1 runs its encode and block statistics in the C loops;
    log has no C code, so its encode and block statistics run torch while the decode runs native; the update is
    torch's foreach ops; a full-precision reducer's cast and sign are torch code on every backend."""
    from src.comm.codecs import native
    if native.library() is None:
        pytest.skip("no C compiler here: kernels=native runs torch")
    pbit = {"name": "pbit", "levels": 7, "bits": 8}
    l1 = dist(1, _phases, "native", {**pbit, "quant": "l1"})[0]
    log = dist(1, _phases, "native", {**pbit, "quant": "log"})[0]
    fp32 = dist(1, _phases, "native", {"name": "fp32"})[0]
    assert l1 == {"backend": "native", "encode": "native", "statistics": "native", "decode": "native",
                  "update": "torch"}
    assert log == {"backend": "native", "encode": "torch", "statistics": "torch", "decode": "native",
                   "update": "torch"}
    assert fp32 == {"backend": "native", "encode": "torch", "decode": "torch", "update": "torch"}
