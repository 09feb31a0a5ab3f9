"""Reducer construction without a process group: option validation, overflow guard, wire bytes; the factory."""
from __future__ import annotations

import pytest
import torch

from src.comm import make_reducer
from src.optim.factory import build_optimizer, parameter_groups, validate_variant
from src.optim.momentum_sync import MomentumSync, classes_of, named_parameters_with_aliases

N = 100_000_000


def test_wire_bytes_per_algorithm():
    assert make_reducer("fp32", world_size=4).wire_bytes(N) == 2 * 3 * 4 * N // 4
    assert make_reducer("bf16", world_size=4).wire_bytes(N) == 2 * 3 * 2 * N // 4
    assert make_reducer("pbit", world_size=4, bits=4).wire_bytes(N) == 2 * 3 * (N // 2) // 4
    assert make_reducer("pbit", world_size=4, quant="l1", levels=15, bits=8).wire_bytes(N) == 2 * 3 * N // 4
    assert make_reducer("onebit", world_size=4).wire_bytes(N) == 2 * 3 * (N // 8) // 4
    assert make_reducer("ps_naive", world_size=4, rank=0, bits=8).wire_bytes(N) == 3 * N
    assert make_reducer("ps_naive", world_size=4, rank=2, bits=8).wire_bytes(N) == N
    # binomial trees over 4 ranks: rank 2 forwards rank 3's data in the gather and relays to rank 3 in the broadcast
    assert make_reducer("ps_tree", world_size=4, rank=2, bits=8).wire_bytes(N) == 2 * N + N
    assert make_reducer("ps_tree", world_size=4, rank=0, bits=8).wire_bytes(N) == 2 * N
    assert make_reducer("onebit", world_size=1).wire_bytes(N) == 0


def test_onebit_pads_to_whole_bytes_per_rank():
    assert make_reducer("onebit", world_size=3).padded_numel(25) == 48


def test_fields_widen_where_the_sums_would_overflow():
    """Section 6: the datatype follows p and the world size. 4-bit votes fit 15 ranks; 8-bit L1 (levels 15) fits
    8; beyond, the fields widen (to 16 bits at most) instead of the reducer refusing; wire bytes follow."""
    assert make_reducer("pbit", world_size=15, quant="sign", bits=4).bits == 4
    assert make_reducer("pbit", world_size=16, quant="sign", bits=4).bits == 8
    assert make_reducer("pbit", world_size=256, quant="sign", bits=4).bits == 16
    assert make_reducer("pbit", world_size=8, quant="l1", levels=15, bits=8).bits == 8
    wide = make_reducer("pbit", world_size=16, quant="l1", levels=15, bits=8)
    assert wide.bits == 16 and "widened from 8" in repr(wide)
    assert wide.wire_bytes(N) == 2 * 15 * (2 * N) // 16
    assert make_reducer("ps_tree", world_size=1, quant="l1", levels=3, bits=2).bits == 4
    assert make_reducer("pbit", world_size=1092, quant="l1", levels=15, bits=8).bits == 16
    with pytest.raises(ValueError) as info:  # 1093 ranks x 30 > 32767: nothing holds the sums
        make_reducer("pbit", world_size=1093, quant="l1", levels=15, bits=8)
    msg = str(info.value)
    assert "world_size=1093" in msg and "overflows even 16-bit fields" in msg and "at most 14" in msg


@pytest.mark.parametrize("name,options,match", [
    ("ring", {}, "unknown reducer 'ring'"),
    ("pbit", {"chunk": -1}, "chunk must be"),
    ("onebit", {"kernels": "yes"}, "kernels must be one of auto, torch, native, triton"),
    ("pbit", {"compile": True}, "does not take option.s. compile"),
    ("pbit", {"levles": 3}, "does not take option"),
    ("pbit", {"quant": "l2"}, "unknown quantization method"),
    ("pbit", {"bits": 3}, "bits=3 is not supported"),
    ("pbit", {"vote": "median"}, "unknown vote"),
    ("pbit", {"zeros": "random"}, "unknown zeros rule"),
    ("onebit", {"vote": "average"}, "majority' only"),
    ("onebit", {"quant": "l1", "levels": 3}, "1-bit signs only"),
    ("onebit", {"zeros": "keep"}, "unknown zeros rule"),
    ("fp32", {"vote": "average"}, "majority' only"),
    ("fp32", {"bits": 8}, "does not take option"),
])
def test_bad_options_are_named(name, options, match):
    with pytest.raises(ValueError, match=match):
        make_reducer(name, world_size=2, **options)


def test_no_process_group_and_no_world_size():
    with pytest.raises(ValueError, match="no process group is initialised"):
        make_reducer("pbit")
    with pytest.raises(RuntimeError, match="planning only"):
        make_reducer("pbit", world_size=2).reduce(torch.ones(3), 1)


class TinyGPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = torch.nn.ModuleDict(dict(
            wte=torch.nn.Embedding(10, 4),
            h=torch.nn.ModuleList([torch.nn.ModuleDict(dict(attn=torch.nn.Linear(4, 4), mlp=torch.nn.Linear(4, 4)))]),
            ln_f=torch.nn.LayerNorm(4)))
        self.lm_head = torch.nn.Linear(4, 10, bias=False)
        self.lm_head.weight = self.transformer.wte.weight


def test_layer_classes_from_names():
    assert classes_of("transformer.wte.weight") == {"embed"}
    assert classes_of("transformer.wte.weight,lm_head.weight") == {"embed", "head"}
    assert classes_of("transformer.h.3.mlp.up_proj.weight") == {"mlp"}
    assert classes_of("blocks.0.attn.qkv.weight") == {"attn"}
    assert classes_of("conv1.weight") == {"embed"} and classes_of("layer1.0.conv1.weight") == set()
    assert classes_of("fc.weight") == {"head"} and classes_of("blocks.0.mlp.fc1.weight") == {"mlp"}
    assert classes_of("patch_embed.proj.weight") == {"embed"} and classes_of("head.bias") == {"head"}


def test_tied_weights_carry_both_names():
    named = dict(named_parameters_with_aliases(TinyGPT()))
    assert "transformer.wte.weight,lm_head.weight" in named
    sync = MomentumSync(every=10, layers="head")
    assert sync.select(list(named)) == [n.startswith("transformer.wte") for n in named]


@pytest.mark.parametrize("cfg,match", [({"every": 0, "layers": "head"}, "inconsistent"),
                                       ({"every": 5, "layers": "none"}, "inconsistent"),
                                       ({"every": 5, "layers": "heads"}, "unknown momentum_sync layers"),
                                       ({"every": -1, "layers": "all"}, "every must be"),
                                       ({"period": 5}, "takes 'every' and 'layers'")])
def test_momentum_sync_config_errors(cfg, match):
    with pytest.raises(ValueError, match=match):
        MomentumSync.from_config(cfg)


def test_validate_variant_before_any_process_group():
    model = TinyGPT()
    cub4 = {"name": "cub4", "optimizer": "lion_cub", "reducer": {"name": "pbit", "quant": "sign", "bits": 4},
            "momentum_sync": {"every": 0, "layers": "none"}, "overlap": False, "kernels": "auto"}
    validate_variant(cub4, world_size=16, model=model)  # wider fields, no refusal
    with pytest.raises(ValueError, match="world_size=40000"):
        validate_variant(cub4, world_size=40000, model=model)
    sync_conv = dict(cub4, momentum_sync={"every": 10, "layers": "mlp"})
    validate_variant(sync_conv, world_size=2, model=model)
    resnet_like = torch.nn.Sequential()
    resnet_like.add_module("conv1", torch.nn.Conv2d(3, 4, 3))
    with pytest.raises(ValueError, match="no parameter of class mlp"):
        validate_variant(sync_conv, world_size=2, model=resnet_like)
    with pytest.raises(ValueError, match="unknown optimizer 'adam'"):
        validate_variant({"optimizer": "adam"}, world_size=2)
    with pytest.raises(ValueError, match="do not apply to optimizer 'lion_grad_allreduce'"):
        validate_variant({"optimizer": "lion_grad_allreduce", "reducer": {"name": "pbit"}}, world_size=2)
    with pytest.raises(ValueError, match="does not communicate"):
        validate_variant({"name": "lion", "optimizer": "lion"}, world_size=2)
    with pytest.raises(ValueError, match="missing key.s. comm_dtype; optimizer 'lion_grad_allreduce' takes"):
        validate_variant({"name": "lion32", "optimizer": "lion_grad_allreduce"}, world_size=2)
    with pytest.raises(ValueError, match="variant.comm_dtype='fp8': must be one of fp32, bf16, fp16"):
        validate_variant({"name": "lion8", "optimizer": "lion_grad_allreduce", "comm_dtype": "fp8", "kernels": "auto"},
                         world_size=2)


def test_build_single_process_lion_with_decay_groups():
    model = TinyGPT()
    groups = parameter_groups(model, 0.5)
    assert [g["weight_decay"] for g in groups] == [0.5, 0.0]
    assert all(p.dim() >= 2 for p in groups[0]["params"]) and all(p.dim() < 2 for p in groups[1]["params"])
    opt = build_optimizer(model, {"name": "lion", "optimizer": "lion"}, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.5)
    loss = model.lm_head(model.transformer.wte(torch.tensor([1, 2]))).sum()
    loss.backward()
    opt.step()
    assert "update" in opt.timer.pop()
