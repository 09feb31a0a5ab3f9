"""A quantization method of one's own gets the in-loop statistics (src/stats: sign match and flip, Lion Cub Fig. 5)
and the Fig. 5 figure from its one registration, `src.quant.METHODS[name] = Method(rule)`, with no other table.

The throw-away method `quarter` (codes round(x / 4) clamped to [-levels, levels], one scale for the whole vector)
is registered at test time only: monkeypatch in this process, and a registering context on each gloo rank of the
distributed test; both are restored afterwards. Update vectors are integers (c_i = m_i = g_i, so
c_i = beta1 m_i + (1 - beta1) g_i exactly), and the reference recomputes match and flip from the definitions
with numpy: q = sign(sum_i Q(c_i)); match = q != 0 and q == sign(sum_i c_i), flip = q != 0 and q == -sign(...).
"""
from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
import torch
import torch.distributed as torch_dist
import torch.nn as nn
import yaml
from harness_util import REPO

from analysis import fig5
from fake_runs import gpt_config, write_run
from src.errors import SetupError
from src.optim.lion import Lion
from src.quant import METHODS, Method, check_method, quantize
from src.stats import StatsConfig, check_stats_config
from src.stats.hook import TrainingStats

NAME, LEVELS = "quarter", 2
BUILT_IN = ("sign", "linf", "linf_nozero", "log", "l1")
SIZES = {"a": 6, "b": 10}


def quarter(x: torch.Tensor, levels: int, generator, segments) -> torch.Tensor:
    """The throw-away rule: round(x / 4) clamped to [-levels, levels] (float codes; `quantize` checks them)."""
    return torch.round(x / 4).clamp(-levels, levels)


def q_ref(c: np.ndarray, method: str) -> np.ndarray:
    if method == NAME:
        return np.clip(np.round(c / 4), -LEVELS, LEVELS)  # numpy rounds half to even, as torch does
    if method == "sign":
        return np.sign(c)
    raise ValueError(f"no reference for {method!r}")


@contextlib.contextmanager
def registered():
    """`quarter` in src.quant.METHODS for the block, then METHODS as it was (on a gloo rank, where the test's
    monkeypatch does not reach)."""
    assert NAME not in METHODS
    METHODS[NAME] = Method(quarter)
    try:
        yield
    finally:
        del METHODS[NAME]


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.zeros(SIZES["a"]))
        self.b = nn.Parameter(torch.zeros(SIZES["b"]))


def stats_block(quantizers=("sign", NAME)) -> dict:
    """conf/config.yaml's stats: block with `quantizers`, each at its levels (the built-ins at the block's own)."""
    block = yaml.safe_load((REPO / "conf/config.yaml").read_text())["stats"]
    levels = {**block["levels"], NAME: LEVELS}
    return {**block, "every": 1, "quantizers": list(quantizers), "levels": {m: levels[m] for m in quantizers},
            "layers": None}


def vectors(world_size: int, seed: int) -> np.ndarray:
    """(ranks, 16) integer update vectors in [-15, 15]; at 3 ranks, one element whose clamped codes flip the sign
    (c = 15, -6, -6: sum 3, codes 2, -2, -2) and one in each layer that matches."""
    c = np.random.default_rng(seed).integers(-15, 16, size=(world_size, sum(SIZES.values()))).astype(np.float64)
    if world_size == 3:
        c[:, 0], c[:, 1], c[:, SIZES["a"]] = (15, -6, -6), (15, 1, 1), (-15, 2, -1)
    return c


def measure(all_c: np.ndarray, cfg: StatsConfig) -> dict:
    """One statistics step of this rank on update vector all_c[rank]; rank 0's row."""
    rank = torch_dist.get_rank() if torch_dist.is_initialized() else 0
    world_size = torch_dist.get_world_size() if torch_dist.is_initialized() else 1
    model = Two()
    opt = Lion(model.parameters(), lr=0.1, betas=(0.75, 0.99))
    c = torch.tensor(all_c[rank], dtype=torch.float32)
    for p, piece in zip(model.parameters(), c.split(list(SIZES.values()))):
        p.grad = piece.clone()
        opt.state[p]["exp_avg"] = piece.clone()  # c = 0.75 c + 0.25 c, exactly
    stats = TrainingStats(cfg, model, opt, rank=rank, world_size=world_size, seed=0, run_dir=None)
    stats.begin(1)
    stats.before_step()
    stats.after_step()
    return stats.pop()


def measure_registered(all_c: np.ndarray, block: dict) -> dict:
    """`measure` on a gloo rank, with `quarter` registered only while it runs."""
    with registered():
        return measure(all_c, check_stats_config(block, Two()))


def expected(c: np.ndarray, method: str) -> dict[str, float]:
    """Match and flip percentages of `method`, model-wide and per layer, from the definitions."""
    lion = np.sign(c.sum(0))
    q = np.sign(np.stack([q_ref(ci, method) for ci in c]).sum(0))
    out, spans, at = {}, {"": slice(0, c.shape[1])}, 0
    for name, n in SIZES.items():
        spans[f"/{name}"] = slice(at, at + n)
        at += n
    for suffix, span in spans.items():
        n = span.stop - span.start
        out[f"stats/match/{method}{suffix}"] = 100 * np.sum((q[span] != 0) & (q[span] == lion[span])) / n
        out[f"stats/flip/{method}{suffix}"] = 100 * np.sum((q[span] != 0) & (q[span] == -lion[span])) / n
    return out


# ------------------------------------------------------------------ the registration is the only one


def test_a_method_registered_only_in_METHODS_is_quantized_and_checked(monkeypatch):
    with pytest.raises(ValueError, match="unknown quantization method 'quarter'"):
        check_method(NAME, LEVELS)
    monkeypatch.setitem(METHODS, NAME, Method(quarter))
    x = torch.tensor([-9.0, -6.0, -2.0, 0.0, 2.0, 3.0, 6.0, 30.0])
    codes = quantize(x, NAME, LEVELS)
    assert codes.dtype == torch.int8 and codes.tolist() == [-2, -2, 0, 0, 0, 1, 2, 2]
    with pytest.raises(ValueError, match="segments sum to 5"):
        quantize(x, NAME, LEVELS, segments=[2, 3])
    monkeypatch.setitem(METHODS, NAME, Method(lambda x, levels, generator, segments: x / 4))  # unclamped, fractional
    with pytest.raises(ValueError, match="'quarter' returned codes that are not integers in \\[-2, 2\\]"):
        quantize(x, NAME, LEVELS)
    monkeypatch.setitem(METHODS, NAME, Method(lambda x, levels, generator, segments: x[:2]))
    with pytest.raises(ValueError, match="returned \\(2,\\), not codes of the input's shape \\(8,\\)"):
        quantize(x, NAME, LEVELS)
    monkeypatch.setitem(METHODS, NAME, Method(quarter, fixed_levels=1))
    with pytest.raises(ValueError, match="'quarter' has exactly one level per side; got levels=2"):
        check_method(NAME, LEVELS)


def test_the_stats_config_takes_a_method_registered_only_in_METHODS(monkeypatch):
    with pytest.raises(SetupError, match="unknown quantizer\\(s\\) quarter"):
        check_stats_config(stats_block(), Two())
    monkeypatch.setitem(METHODS, NAME, Method(quarter))
    cfg = check_stats_config(stats_block(), Two())
    assert cfg.quantizers == ("sign", NAME) and cfg.levels == {"sign": 1, NAME: LEVELS}
    monkeypatch.setitem(METHODS, NAME, Method(quarter, fixed_levels=1))
    with pytest.raises(SetupError, match="stats.levels.quarter=2: .*exactly one level"):
        check_stats_config(stats_block(), Two())
    assert NAME not in check_stats_config(stats_block(BUILT_IN), Two()).quantizers


def test_statistics_of_a_method_registered_only_in_METHODS(monkeypatch):
    """One process: the row and its keys for the new method beside the built-in ones, from the definitions."""
    monkeypatch.setitem(METHODS, NAME, Method(quarter))
    c = vectors(1, seed=0)
    row = measure(c, check_stats_config(stats_block(("sign", NAME, "l1")), Two()))
    for method in ("sign", NAME):
        for key, value in expected(c, method).items():
            assert row[key] == pytest.approx(value), key
    assert {"stats/match/l1", "stats/flip/l1/b"} <= set(row)


def test_statistics_of_a_method_registered_only_in_METHODS_on_three_ranks(dist):
    """Three gloo ranks (each registers `quarter` for the call only): the sums over ranks give flips as well."""
    c = vectors(3, seed=1)
    row = dist(3, measure_registered, c, stats_block())[0]
    want = expected(c, NAME)
    assert want[f"stats/flip/{NAME}"] > 0 and want[f"stats/match/{NAME}"] > 0
    for method in ("sign", NAME):
        for key, value in expected(c, method).items():
            assert row[key] == pytest.approx(value), key
    assert NAME not in METHODS  # every rank restored METHODS; so was this process's (never registered here)


def test_fig5_draws_a_method_registered_only_in_METHODS(monkeypatch, tmp_path):
    """The statistics row of the new method, beside the five built-in ones, drawn by Fig. 5's analysis: its match and
    flip curves are in the figure's data, named by the method's registered name."""
    monkeypatch.setitem(METHODS, NAME, Method(quarter))
    row = measure(vectors(1, seed=2), check_stats_config(stats_block((*BUILT_IN, NAME)), Two()))
    stats = {k: v for k, v in row.items() if k.startswith("stats/")}
    rows = [{"step": s, "loss": 6.0 - s / 100, **stats} for s in (20, 40, 60)]
    write_run(tmp_path / "runs" / "mine", gpt_config(label="mine"), rows, world_size=1)
    out = tmp_path / "out"
    assert fig5.main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    series = json.loads((out / "fig5.data.json").read_text())["series"]
    mine = [s["mean"] for s in series if s["label"] == NAME]  # the match panel's curve, then the flip panel's
    assert mine == [[pytest.approx(row[f"stats/{kind}/{NAME}"])] * 3 for kind in ("match", "flip")]
    notes = " ".join(json.loads((out / "findings.json").read_text()).get("notes", []))
    assert f"{NAME} match {row[f'stats/match/{NAME}']:.1f}% flip {row[f'stats/flip/{NAME}']:.1f}%" in notes
