"""The statistics of src/stats (Lion Cub, Table 2, Fig. 4, 5, 7, 8) against hand computations on real gloo ranks.

Every rank gets known update vectors c_i (integers, so every sum is exact) through Lion's state: beta1 = 0.75,
m_i = c_i + d_i and g_i = c_i - 3 d_i give c_i = 0.75 m_i + 0.25 g_i exactly (and anything else if the two were
mixed up); then known momenta after the step. The reference below recomputes every statistic
from the paper's definitions with numpy and scipy on all ranks' vectors at once: standard Lion's sign of the sum,
the majority vote with ties kept as zero, each quantizer's sign of the summed codes (Section 2, Section 4.2 and
Fig. 5's methods), the population std over ranks, and the Laplace/Gaussian fits. The test double of
tests/device_double.py checks that no collective receives a host tensor and that rank 0 syncs with the host only for
its one transfer.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
import torch
import yaml
import torch.distributed as dist
import torch.nn as nn
from device_double import HostMonitor, watch_collectives
from harness_util import REPO
from torch.overrides import TorchFunctionMode

from src.errors import SetupError
from src.optim.lion import Lion
from src.optim.momentum_sync import named_parameters_with_aliases
from src.stats import OFF, StatsConfig, check_stats_config, make_stats
from src.stats.hook import TrainingStats

METHODS = ("sign", "linf", "linf_nozero", "log", "l1")
LEVELS = 15
SHAPES = {"b": 6, "emb.weight,head.weight": 8}  # model order: a plain tensor and a tied one (two names)
SPANS = {"b": slice(0, 6), "emb.weight,head.weight": slice(6, 14)}
BINS = 5
RANGE = 2.1  # the value histogram spans +-RANGE * mean|c|
PARTS = ("update", "quantize", "describe", "communicate", "count", "spread", "report")


class Tied(nn.Module):
    """Two trainable tensors: `b` (6 elements) and `emb.weight` tied to `head.weight` (8)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(4, 2)
        self.head = nn.Linear(2, 4, bias=False)
        self.emb.weight = self.head.weight
        self.b = nn.Parameter(torch.zeros(2, 3))


def yaml_block(**kw) -> dict:
    """The stats: block of conf/config.yaml (the one home of its defaults), top-level keys replaced by `kw`."""
    block = yaml.safe_load((REPO / "conf/config.yaml").read_text())["stats"]
    return {**block, **kw}


def config(**kw) -> StatsConfig:
    base = dict(every=1, quantizers=METHODS, levels={m: (1 if m == "sign" else LEVELS) for m in METHODS}, bins=BINS,
                range=RANGE, log10_min=-3.5, log10_max=2.5, fit_samples=1000, layers=None,
                bucket_elements=yaml_block()["bucket_elements"])
    return StatsConfig(**{**base, **kw})


# ------------------------------------------------------------------ the reference (numpy, from the definitions)

def q_ref(x: np.ndarray, method: str) -> np.ndarray:
    """Quantize one layer of one rank (per-layer scale). Inputs are integers with max |x| = 15, so Q_inf's
    stochastic rounding has nothing to round (x * 15 / max|x| is an integer) and is exact."""
    a = np.abs(x)
    if method == "sign":
        return np.sign(x)
    if method == "l1":  # Section 4.2: round(x * (2^(n-1) - 1) / (2 ||x||_1 / M)), clamped
        return np.clip(np.round(x * LEVELS / (2 * a.mean())), -LEVELS, LEVELS)
    if method in ("linf", "linf_nozero"):
        y = x * LEVELS / a.max()
        assert np.all(y == np.round(y))
        return y
    with np.errstate(divide="ignore"):  # log: level k stands for max|x| * 2^(k - levels); 0 stays 0
        k = np.clip(np.round(np.log2(a / a.max())) + LEVELS, 0, LEVELS)
    return np.sign(x) * k


def counts_ref(c: np.ndarray) -> dict:
    """c: (ranks, elements) of one layer -> vote table, match and flip counts per method."""
    lion = np.sign(c.sum(0))
    vote = np.sign(np.sign(c).sum(0))
    index = {1: 0, -1: 1, 0: 2}
    table = np.zeros((3, 3), np.int64)
    for l, v in zip(lion, vote):
        table[index[l], index[v]] += 1
    out = {"vote": table}
    for method in METHODS:
        q = np.sign(np.stack([q_ref(ci, method) for ci in c]).sum(0))
        out[method] = (int(np.sum((q != 0) & (q == lion))), int(np.sum((q != 0) & (q == -lion))))
    return out


def fit_ref(x: np.ndarray) -> dict:
    loc = np.sort(x)[(x.size - 1) // 2]  # torch's median: the lower middle value
    b = np.abs(x - loc).mean()
    mean, std = x.mean(), x.std()
    return {"laplace_ll": scipy.stats.laplace.logpdf(x, loc, b).mean(), "gauss_ll": scipy.stats.norm.logpdf(
        x, mean, std).mean(), "laplace_ks": scipy.stats.kstest(x, scipy.stats.laplace(loc, b).cdf).statistic,
        "gauss_ks": scipy.stats.kstest(x, scipy.stats.norm(mean, std).cdf).statistic, "loc": loc, "b": b}


def vectors(world_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(ranks, 14) integer update vectors with max |c| = 15 per layer and rank, avoiding rounding boundaries
    (so float32 and float64 agree), and (ranks, 14) momenta after the step."""
    rng = np.random.default_rng(seed)
    while True:
        c = rng.integers(-15, 16, size=(world_size, 14)).astype(np.float64)
        c[:, 3] = 0  # an exact zero on every rank: lion and vote are zero there
        c[:, 0], c[:, 6] = 15 * rng.choice([-1, 1], world_size), -15
        ok = True
        for layer in SPANS.values():
            for ci in c[:, layer]:
                y = ci * LEVELS / (2 * np.abs(ci).mean())
                logs = np.log2(np.abs(ci[ci != 0]) / 15)
                ok &= np.all(np.abs(y - np.floor(y) - 0.5) > 1e-3) and np.all(np.abs(logs - np.floor(logs) - 0.5) > 1e-3)
            r = RANGE * np.abs(c[0, layer]).mean()  # rank 0's value histogram: no value on an edge
            ok &= np.abs(c[0, layer][:, None] - np.linspace(-r, r, BINS + 1)[None, 1:-1]).min() > 1e-3
        if ok:
            return c, rng.normal(0.0, 0.1, size=(world_size, 14))


# ------------------------------------------------------------------ what runs on every rank

def _measure(all_c, all_m_after, cfg: StatsConfig, run_dir):
    rank = dist.get_rank() if dist.is_initialized() else 0
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    torch.manual_seed(0)
    model = Tied()
    opt = Lion(model.parameters(), lr=0.1, betas=(0.75, 0.99))
    c = torch.tensor(all_c[rank], dtype=torch.float32)
    d = torch.arange(c.numel(), dtype=torch.float32).remainder(7).sub(3)  # -3..3
    after = torch.tensor(all_m_after[rank], dtype=torch.float32)
    params = [p for _, p in named_parameters_with_aliases(model)]
    assert [n for n, _ in named_parameters_with_aliases(model)] == list(SHAPES)
    for p, piece, dp in zip(params, c.split(list(SHAPES.values())), d.split(list(SHAPES.values()))):
        p.grad = (piece - 3 * dp).view_as(p).clone()
        opt.state[p]["exp_avg"] = (piece + dp).view_as(p).clone()
    stats = TrainingStats(cfg, model, opt, rank=rank, world_size=world_size, seed=0, run_dir=run_dir)
    monitor = HostMonitor()
    with watch_collectives(monitor):
        stats.begin(1)
        stats.before_step()
    for p, piece in zip(params, after.split(list(SHAPES.values()))):
        opt.state[p]["exp_avg"].copy_(piece.view_as(p))
    with watch_collectives(monitor):
        stats.after_step()
    row = stats.pop()
    arrays = None
    if rank == 0 and run_dir is not None:
        with np.load(f"{run_dir}/stats/step_00000001.npz") as f:
            arrays = {k: f[k] for k in f.files}
    return {"row": row, "seconds": stats.seconds, "arrays": arrays, "violations": monitor.violations,
            "syncs": monitor.syncs}


def check_against_reference(out: dict, c: np.ndarray, m_after: np.ndarray, layers=tuple(SHAPES)) -> None:
    row, total = out["row"], c.shape[1]
    spans = SPANS
    per_layer = {name: counts_ref(c[:, span]) for name, span in spans.items()}
    signs = ("pos", "neg", "zero")
    vote = sum(r["vote"] for r in per_layer.values())
    for i, lion in enumerate(signs):
        for j, v in enumerate(signs):
            assert row[f"stats/vote/{lion}_{v}"] == pytest.approx(100 * vote[i, j] / total), (lion, v)
    for method in METHODS:
        match = sum(r[method][0] for r in per_layer.values())
        flip = sum(r[method][1] for r in per_layer.values())
        assert row[f"stats/match/{method}"] == pytest.approx(100 * match / total), method
        assert row[f"stats/flip/{method}"] == pytest.approx(100 * flip / total), method
    std = m_after.std(axis=0)  # population std over ranks
    assert row["stats/momentum_std/max"] == pytest.approx(std.max(), rel=1e-5, abs=1e-7)
    assert row["stats/momentum_std/mean"] == pytest.approx(std.mean(), rel=1e-5, abs=1e-7)
    for name, span in spans.items():
        keys = [k for k in row if k.endswith("/" + name)]
        if name not in layers:
            assert keys == [], keys
            continue
        n = span.stop - span.start
        for method in METHODS:
            assert row[f"stats/match/{method}/{name}"] == pytest.approx(100 * per_layer[name][method][0] / n)
            assert row[f"stats/flip/{method}/{name}"] == pytest.approx(100 * per_layer[name][method][1] / n)
        assert row[f"stats/momentum_std/max/{name}"] == pytest.approx(std[span].max(), rel=1e-5, abs=1e-7)
        assert row[f"stats/momentum_std/mean/{name}"] == pytest.approx(std[span].mean(), rel=1e-5, abs=1e-7)
        mine = c[0, span]  # rank 0's own c
        assert row[f"stats/abs/max/{name}"] == np.abs(mine).max()
        assert row[f"stats/abs/mean/{name}"] == pytest.approx(np.abs(mine).mean())
        assert row[f"stats/abs/median/{name}"] == np.sort(np.abs(mine))[(n - 1) // 2]
        fit = fit_ref(mine)
        for key in ("laplace_ll", "gauss_ll", "laplace_ks", "gauss_ks"):
            assert row[f"stats/fit/{key}/{name}"] == pytest.approx(fit[key], rel=1e-5), key
    parts = {k: v for k, v in row.items() if k.startswith("time/stats/")}
    assert len(row) - len(parts) == 9 + 2 * len(METHODS) + 2 + len(layers) * (2 * len(METHODS) + 2 + 3 + 4) + 1
    assert row["time/stats"] == out["seconds"] > 0
    assert sorted(parts) == sorted(f"time/stats/{p}" for p in PARTS)  # rank 0 splits its time into these parts
    assert all(v >= 0 for v in parts.values()) and sum(parts.values()) <= row["time/stats"]


def check_arrays(a: dict, c: np.ndarray, layers=tuple(SHAPES)) -> None:
    L, M = len(layers), len(METHODS)
    shapes = {"layers": (L,), "numel": (L,), "methods": (M,), "vote_counts": (L, 3, 3), "method_counts": (L, M, 3, 3),
              "match_counts": (L, M), "momentum_std_max": (L,), "model_vote_counts": (3, 3), "abs_median": (L,),
              "hist_values_edges": (L, BINS + 1), "hist_values_counts": (L, BINS), "hist_log10_abs_edges": (BINS + 1,),
              "hist_log10_abs_counts": (L, BINS), "zeros": (L,), "fit_laplace_ks": (L,), "step": (), "format": ()}
    for name, shape in shapes.items():
        assert a[name].shape == shape, name
    assert a["hist_values_counts"].dtype == np.int64 and a["hist_values_edges"].dtype == np.float64
    assert list(a["layers"]) == list(layers) and list(a["methods"]) == list(METHODS) and int(a["step"]) == 1
    spans = SPANS
    for l, name in enumerate(layers):
        mine = c[0, spans[name]]
        r = RANGE * np.abs(mine).mean()
        np.testing.assert_allclose(a["hist_values_edges"][l], np.linspace(-r, r, BINS + 1))
        inside = mine[np.abs(mine) <= r]
        assert list(a["hist_values_counts"][l]) == list(np.histogram(inside, a["hist_values_edges"][l])[0])
        assert a["hist_values_outside"][l] == np.sum(np.abs(mine) > r)
        logs = np.log10(np.abs(mine[mine != 0]))
        assert list(a["hist_log10_abs_counts"][l]) == list(np.histogram(logs, a["hist_log10_abs_edges"])[0])
        assert a["zeros"][l] == np.sum(mine == 0)
        assert a["vote_counts"][l].sum() == mine.size and (a["method_counts"][l, 0] == a["vote_counts"][l]).all()


@pytest.mark.parametrize("world_size, bucket_elements", [(2, 1 << 24), (3, 1 << 24), (4, 1 << 24), (3, 1), (4, 1)])
def test_statistics_match_the_hand_computation(dist, world_size, bucket_elements, tmp_path):
    """Shards of 7/7, 5/5/4 and 4/4/4/2 elements cross the layer boundary; one bucket per layer (bucket_elements=1)
    gives shards of 3/3 and 4/4 at 3 ranks, and 2/2/2/0 (an empty shard) and 2/2/2/2 at 4."""
    c, m_after = vectors(world_size, seed=world_size)
    outs = dist(world_size, _measure, c, m_after, config(bucket_elements=bucket_elements), str(tmp_path))
    check_against_reference(outs[0], c, m_after)
    check_arrays(outs[0]["arrays"], c)
    if world_size % 2 == 0:  # with an even number of voters some majority votes are tied
        assert outs[0]["row"]["stats/vote/pos_zero"] + outs[0]["row"]["stats/vote/neg_zero"] > 0
    for rank, out in enumerate(outs):
        assert out["violations"] == []
        assert out["syncs"] <= (2 if rank == 0 else 0), (rank, out["syncs"])  # rank 0: one .cpu().numpy()
        if rank:  # only rank 0 reports; every rank leaves its own statistics time out of its step time
            assert list(out["row"]) == ["time/stats"] and out["seconds"] > 0


def test_one_process_without_a_process_group(tmp_path):
    c, m_after = vectors(1, seed=7)
    out = _measure(c, m_after, config(), str(tmp_path))
    check_against_reference(out, c, m_after)
    row = out["row"]
    assert row["stats/vote/pos_pos"] + row["stats/vote/neg_neg"] + row["stats/vote/zero_zero"] == pytest.approx(100)
    assert row["stats/momentum_std/max"] == 0 and row["stats/flip/sign"] == 0


def test_layers_select_the_per_layer_keys_by_any_alias(tmp_path):
    c, m_after = vectors(1, seed=8)
    out = _measure(c, m_after, config(layers=("head.weight",)), str(tmp_path))
    check_against_reference(out, c, m_after, layers=("emb.weight,head.weight",))
    check_arrays(out["arrays"], c, layers=("emb.weight,head.weight",))


def test_histogram_edges_and_overflow_bins():
    from src.stats.distribution import log10_histogram, value_histogram

    c = torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0, 2.0, -3.0])  # r = 1, 4 bins: edges -1, -0.5, 0, 0.5, 1
    assert value_histogram(c, torch.tensor(1.0), 4).tolist() == [1, 1, 1, 2, 2]  # last bin closed; 2 outside
    c = torch.tensor([0.0, 1e-20, -1e-3, 10.0, 100.0, 0.05])  # log10 over [-4, 1], 5 bins
    assert log10_histogram(c, -4.0, 1.0, 5).tolist() == [1, 0, 1, 1, 0, 1, 1, 1]  # below, 5 bins, above, zeros


def test_code_sums_do_not_wrap_past_int8():
    """3 ranks x 60 levels: a sum of 180 codes stays positive (int8 would wrap it to -76, a flip)."""
    from src.stats.agreement import Shards, shard_counts

    rows = [("sign", 1), ("l1", 60)]
    shards = Shards(2, 3, 0)  # shards of 1 element; rank 0 holds element 0 of the one layer
    received_codes = torch.tensor([[[1], [60]]] * 3, dtype=torch.int8)  # (ranks, rows, size)
    counts = shard_counts(torch.ones(3, 1), received_codes, shards, [2], rows)
    assert counts.shape == (1, 2, 3, 3) and counts.sum() == 2
    assert counts[0, 0, 0, 0] == 1 and counts[0, 1, 0, 0] == 1  # lion pos; the vote and l1 pos: matches


def test_no_per_layer_keys_with_an_empty_layer_list(tmp_path):
    c, m_after = vectors(1, seed=9)
    out = _measure(c, m_after, config(layers=()), str(tmp_path))
    check_against_reference(out, c, m_after, layers=())
    assert out["arrays"]["layers"].shape == (0,) and out["arrays"]["hist_values_edges"].shape == (0, BINS + 1)


def test_a_resumed_run_drops_the_arrays_after_its_checkpoint(tmp_path):
    from src.stats.report import drop_arrays_after

    folder = tmp_path / "stats"
    folder.mkdir()
    for name in ("step_00000002.npz", "step_00000004.npz", "step_00000006.npz", "step_00000008.npz.tmp"):
        (folder / name).write_bytes(b"x")
    drop_arrays_after(tmp_path, 4)
    assert sorted(p.name for p in folder.iterdir()) == ["step_00000002.npz", "step_00000004.npz"]


# ------------------------------------------------------------------ real optimizers: shared vs local momentum

def _optimizer_step_with_stats(variant: str):
    from src.models.gpt import build_gpt
    from src.optim.factory import build_optimizer

    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = build_gpt("tiny", n_layer=1, vocab_size=64, block_size=8)
    opt = build_optimizer(model, {"name": variant, **VARIANTS[variant]}, lr=1e-3, betas=(0.9, 0.99),
                          weight_decay=0.0)
    stats = TrainingStats(config(), model, opt, rank=rank, world_size=world_size, seed=0, run_dir=None)
    torch.manual_seed(100 + rank)  # every rank its own batch
    for step in (1, 2):
        x = torch.randint(0, 64, (2, 8))
        model(x, x)[1].backward()
        stats.begin(step)
        stats.before_step()
        opt.step()
        stats.after_step()
        opt.zero_grad()
    momenta = torch.cat([opt.state[p]["exp_avg"].reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(momenta) for _ in range(world_size)]
    dist.all_gather(gathered, momenta)
    return stats.pop(), torch.stack(gathered).numpy()


VARIANTS = {"lion32": {"optimizer": "lion_grad_allreduce", "comm_dtype": "fp32", "kernels": "auto"},
            "cub4": {"optimizer": "lion_cub", "reducer": {"name": "pbit", "quant": "sign", "levels": 1, "bits": 4,
                                                           "vote": "majority", "zeros": "alternate"},
                     "momentum_sync": {"every": 0, "layers": "none"}, "overlap": False, "kernels": "auto"}}


@pytest.mark.parametrize("variant, world_size", [("lion32", 2), ("lion32", 3), ("cub4", 2)])
def test_momentum_spread_is_zero_for_shared_momentum_only(dist, variant, world_size):
    """Exactly zero for a shared momentum at any world size, 3 included (where a mean over ranks does not round
    trip)."""
    row, momenta = dist(world_size, _optimizer_step_with_stats, variant)[0]
    std = (momenta.astype(np.float64) - momenta[0]).std(axis=0)  # float64: numpy's float32 mean does not round trip
    assert row["stats/momentum_std/max"] == pytest.approx(std.max(), rel=1e-5, abs=0)
    if variant == "lion32":  # the momentum is the same on every rank (averaged gradients)
        assert std.max() == 0 and row["stats/momentum_std/max"] == 0
    else:  # Lion Cub: local momenta drift apart
        assert std.max() > 0
    if world_size % 2 == 0:  # local gradients differ: tied votes (never among an odd number of voters)
        assert row["stats/vote/pos_zero"] + row["stats/vote/neg_zero"] > 0


# ------------------------------------------------------------------ off, and bad input

class _CountTorch(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def test_off_builds_nothing_and_does_nothing():
    model = Tied()
    opt = Lion(model.parameters(), lr=0.1)
    stats = make_stats(check_stats_config(yaml_block(every=0), model), model, opt, rank=0, world_size=1, seed=0,
                       run_dir=None)
    assert stats is OFF and vars(OFF) == {}
    with _CountTorch() as counter:
        for step in range(1, 4):
            stats.begin(step)
            stats.before_step()
            stats.after_step()
            assert stats.pop() == {} and stats.seconds == 0.0
    assert counter.calls == 0


@pytest.mark.parametrize("block, words", [
    ({"quantizers": ["sign", "l2"]}, ["l2", "l1", "linf"]),
    ({"levels": {"l3": 4}}, ["l3"]),
    ({"levels": {"sign": 3}}, ["stats.levels.sign", "one level"]),
    ({"layers": ["head.weight", "tail.weight"]}, ["tail.weight", "emb.weight,head.weight"]),
    ({"layers": "b"}, ["stats.layers"]),
    ({"every": -1}, ["stats.every=-1"]),
    ({"hist": {"bins": 1000, "range": 8.0, "log10_min": -16.0, "log10_max": 1.0}}, ["stats.hist.bins=1000", "512"]),
    ({"hist": {"bins": 8, "colour": 1}}, ["colour"]),
    ({"hist": {"bins": 8}}, ["stats.hist lacks", "log10_max", "range", "conf/config.yaml"]),
    ({"fit_sample": 10}, ["fit_sample"]),
    ({"hist": {"bins": 8, "range": 8.0, "log10_min": 2.0, "log10_max": 1.0}}, ["log10_min"]),
    ({"quantizers": ["sign", "l1"], "levels": {"sign": 1}}, ["stats.levels gives no levels for l1"]),
])
def test_bad_stats_config_names_what_is_wrong(block, words):
    with pytest.raises(SetupError) as err:
        check_stats_config(yaml_block(**block), Tied())
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_defaults_are_the_papers_five_quantizers():
    cfg = check_stats_config(yaml_block(), Tied())
    assert not cfg.on and cfg.quantizers == METHODS and cfg.levels["l1"] == 15 and cfg.layers is None
    assert math.isclose(cfg.range, 8.0)
