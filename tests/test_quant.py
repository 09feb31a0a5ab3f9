"""Quantizers against plain per-segment references written from the formulas of Sections 2 and 4.2."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from src.quant import METHODS, quantize


def laplace(numel: int, seed: int = 0, scale: float = 1e-3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(numel, generator=g, dtype=torch.float64) - 0.5
    return (-scale * torch.sign(u) * torch.log1p(-2 * u.abs())).float()


def split(x, segments):
    return [x] if segments is None else list(x.split(segments))


def ref_l1(x, levels, segments):
    out = []
    for seg in split(x, segments):
        s = seg.double().numpy()
        mean_abs = np.abs(s).mean() if s.size else 0.0
        q = np.zeros_like(s) if mean_abs == 0 else np.clip(np.round(s * levels / (2 * mean_abs)), -levels, levels)
        out.append(q)
    return np.concatenate(out)


def near_half(x, levels, segments, stat):
    """Elements whose scaled value sits within float error of a rounding boundary (either answer is right)."""
    flags = []
    for seg in split(x, segments):
        s = seg.double().numpy()
        m = (np.abs(s).mean() if stat == "mean" else np.abs(s).max()) if s.size else 0.0
        y = s * (levels / (2 * m) if stat == "mean" else levels / m) if m else s * 0
        flags.append(np.abs(np.abs(y - np.floor(y)) - 0.5) < 1e-4)
    return np.concatenate(flags)


@pytest.mark.parametrize("segments", [None, [100, 900, 7, 993]])
@pytest.mark.parametrize("levels", [1, 7, 15, 127])
def test_l1_matches_formula(levels, segments):
    x = laplace(2000, seed=levels)
    q = quantize(x, "l1", levels, segments=segments)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= levels
    ref = ref_l1(x, levels, segments)
    ok = (q.numpy() == ref) | near_half(x, levels, segments, "mean")
    assert ok.all()


def test_l1_scale_is_per_segment():
    small, big = laplace(500, 1, scale=1e-9), laplace(500, 2, scale=1.0)
    x = torch.cat([small, big])
    per_layer = quantize(x, "l1", 7, segments=[500, 500])
    whole = quantize(x, "l1", 7)
    assert (per_layer[:500] != 0).float().mean() > 0.5  # tiny layer keeps its information...
    assert (whole[:500] == 0).all()  # ...which one global scale rounds away


@pytest.mark.parametrize("method", ["linf", "linf_nozero"])
@pytest.mark.parametrize("segments", [None, [10, 1990]])
def test_linf_is_stochastic_rounding_of_max_scaled_values(method, segments):
    x = laplace(2000, 3)
    levels = 7
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    q = quantize(x, method, levels, generator=g1, segments=segments).numpy()
    u = torch.rand(2000, generator=g2).double().numpy()
    parts = []
    for seg in split(x, segments):
        s = seg.double().numpy()
        parts.append(s * levels / np.abs(s).max())
    y = np.concatenate(parts)
    ref = np.clip(np.floor(y) + (u < y - np.floor(y)), -levels, levels)
    if method == "linf_nozero":
        ref = np.where((ref == 0) & (y != 0), np.sign(y), ref)
        assert not ((q == 0) & (x.numpy() != 0)).any()
    boundary = np.abs(u - (y - np.floor(y))) < 1e-5
    assert ((q == ref) | boundary).all()


def test_linf_rounding_is_unbiased():
    x = torch.full((200_000,), 0.3)
    x[0] = 1.0  # max -> scale 1 for levels=1
    q = quantize(x, "linf", 1, generator=torch.Generator().manual_seed(0))
    assert abs(q[1:].float().mean().item() - 0.3) < 0.01


def test_linf_loses_the_bulk_of_a_heavy_tailed_vector_and_l1_does_not():
    """Section 4.1: with outliers, Q_inf sends most values to 0; L1 keeps their signs."""
    x = laplace(10_000, 4)
    x[0] = 1.0
    linf_zero = (quantize(x, "linf", 15, generator=torch.Generator().manual_seed(0)) == 0).float().mean()
    l1_zero = (quantize(x, "l1", 15) == 0).float().mean()
    assert linf_zero > 0.9 and l1_zero < 0.1


def test_log_levels_follow_powers_of_two():
    levels = 4
    x = torch.tensor([8.0, 4.0, 2.0, 1.0, 0.5, 0.26, 0.2, 0.0, -4.0, -1.1])
    q = quantize(x, "log", levels)
    # |x|/max = 1, 1/2, 1/4, 1/8, 1/16, ~1/32 (rounds to 2^-5 -> 0), ... ; k = round(log2(|x|/max)) + levels
    assert q.tolist() == [4, 3, 2, 1, 0, 0, 0, 0, -3, -1]
    y = laplace(1000, 9)
    qy = quantize(y, "log", 7)
    order = torch.argsort(y)
    assert (torch.diff(qy[order].int()) >= 0).all(), "log codes are monotone in x"


@pytest.mark.parametrize("method", METHODS)
def test_all_zero_input_quantizes_to_zeros(method):
    levels = 1 if method == "sign" else 7
    for segments in (None, [3, 5]):
        q = quantize(torch.zeros(8), method, levels, generator=torch.Generator(), segments=segments)
        assert torch.equal(q, torch.zeros(8, dtype=torch.int8))


@pytest.mark.parametrize("method", ["l1", "linf", "log"])
def test_an_all_zero_segment_stays_zero_beside_a_live_one(method):
    x = torch.cat([torch.zeros(5), laplace(20, 1)])
    q = quantize(x, method, 3, generator=torch.Generator().manual_seed(0), segments=[5, 20])
    assert (q[:5] == 0).all() and (q[5:] != 0).any()


def test_sign_keeps_exact_zeros():
    x = torch.tensor([-2.0, 0.0, 3.0, -0.0])
    assert quantize(x, "sign", 1).tolist() == [-1, 0, 1, 0]


def test_large_levels_use_int16():
    q = quantize(laplace(100), "l1", 1000)
    assert q.dtype == torch.int16 and int(q.abs().max()) <= 1000


@pytest.mark.parametrize("method,levels,match", [("nope", 1, "unknown quantization method"),
                                                 ("sign", 3, "exactly one level"),
                                                 ("l1", 0, "levels must be"), ("l1", 2.5, "levels must be")])
def test_bad_arguments_are_named(method, levels, match):
    with pytest.raises(ValueError, match=match):
        quantize(torch.ones(4), method, levels)


def test_segments_must_cover_the_vector():
    with pytest.raises(ValueError, match="segments sum to 5"):
        quantize(torch.ones(6), "l1", 3, segments=[2, 3])


def test_empty_input():
    assert quantize(torch.zeros(0), "l1", 3).numel() == 0


def test_every_scaled_method_quantizes_with_its_own_entry(monkeypatch):
    """A method's per-layer scale rule is its METHODS entry (statistic, scale, code) and nothing else: every scaled
    method registered quantizes with it, including one registered here from user code without src.comm imported
    (the entry is the only table, so what this test sees cannot depend on which modules other tests imported)."""
    from src.quant import MAX_ABS, Method, quantizers
    x = torch.randn(300, generator=torch.Generator().manual_seed(0))
    monkeypatch.setitem(quantizers.METHODS, "halfmax", Method(statistic=MAX_ABS, scale=lambda levels: levels / 2.0,
                                                              code=lambda x, y, levels, noise: y.round_().clamp_(
                                                                  -levels, levels)))
    for method, entry in quantizers.METHODS.items():
        if not entry.scaled:
            continue
        codes = quantizers.quantize(x, method, levels=3, generator=torch.Generator().manual_seed(0),
                                    segments=[100, 200])
        assert codes.abs().max() <= 3 and codes.ne(0).any(), method
    parts = x.split([100, 200])
    want = torch.cat([(p * (1.5 / p.abs().max())).round().clamp(-3, 3) for p in parts]).to(torch.int8)
    assert torch.equal(quantizers.quantize(x, "halfmax", 3, segments=[100, 200]), want)  # its statistic: the max


@pytest.mark.parametrize("parts,missing", [({"code": lambda x, y, levels, noise: y}, "statistic, scale"),
                                           ({"statistic": "sum"}, "scale, code")])
def test_a_method_without_its_whole_scale_rule_is_refused_when_built(parts, missing):
    """A scaled method gives its statistic, scale and code together; a part missing is refused at registration,
    naming it (never a silent fallback to another method's rule)."""
    from src.quant import Method
    with pytest.raises(ValueError, match=f"missing {missing}"):
        Method(**parts)
    with pytest.raises(ValueError, match="not both"):
        Method(lambda x, levels, generator, segments: x, code=lambda x, y, levels, noise: y)
