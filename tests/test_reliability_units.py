"""Checkpoint files, the replica guard and the non-finite vote on real gloo ranks."""
from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as tdist

from src.reliability.checkpoint import CheckpointError, CheckpointManager, rank_file
from src.reliability.guard import ReplicaDivergenceError, bit_checksums, check_replicas
from src.reliability.nonfinite import all_ranks_finite, step_is_finite


def _save_steps(root: str, steps: list[int], keep: int):
    rank, world = tdist.get_rank(), tdist.get_world_size()
    mgr = CheckpointManager(root, rank, world, keep=keep)
    for step in steps:
        mgr.save(step, {"momentum": torch.full((3,), float(rank * 100 + step))},
                 model_state={"w": torch.full((2,), float(step))} if rank == 0 else None, meta={"wandb_id": "abc"})
    found = mgr.latest()
    model, mine = mgr.load(found)
    return found.step, model["w"].tolist(), mine["momentum"].tolist(), found.manifest["meta"]


def test_save_keeps_newest_k_and_every_rank_loads_its_own_state(dist, tmp_path):
    outs = dist(2, _save_steps, str(tmp_path), [1, 2, 3, 4, 5], 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000004", "step_00000005"]
    for rank, (step, model, mine, meta) in enumerate(outs):
        assert step == 5 and model == [5.0, 5.0] and mine == [rank * 100 + 5.0] * 3 and meta == {"wandb_id": "abc"}


def test_a_checkpoint_cut_short_is_ignored_for_the_previous_one(dist, tmp_path):
    dist(2, _save_steps, str(tmp_path), [1, 2], 5)
    newest = tmp_path / "step_00000002"
    data = (newest / rank_file(1)).read_bytes()
    (newest / rank_file(1)).write_bytes(data[: len(data) // 2])  # a crash/disk error while writing rank 1's file
    (tmp_path / "step_00000003").mkdir()  # a save that died before its manifest
    (tmp_path / "step_00000003" / rank_file(0)).write_bytes(b"partial")
    outs = dist(2, _latest_step, str(tmp_path))
    assert outs == [1, 1]


def _latest_step(root: str):
    return CheckpointManager(root, tdist.get_rank(), tdist.get_world_size()).latest().step


def test_world_size_mismatch_is_a_clear_error(dist, tmp_path):
    dist(2, _save_steps, str(tmp_path), [1], 1)
    with pytest.raises(CheckpointError, match="written by 2 ranks, but this run has world_size=4"):
        CheckpointManager(tmp_path, 0, 4).open(tmp_path / "step_00000001")
    manifest = json.loads((tmp_path / "step_00000001" / "manifest.json").read_text())
    assert set(manifest["files"]) == {"model.pt", rank_file(0), rank_file(1)}
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        CheckpointManager(tmp_path, 0, 2).open(tmp_path / "nope")


def _guarded(perturb_rank: int | None):
    params = [("a.weight", torch.arange(6.0).reshape(2, 3)), ("b.bias", torch.ones(4, dtype=torch.bfloat16))]
    if tdist.get_rank() == perturb_rank:
        params[1][1][2] = 1.0 + 2**-7  # the next bfloat16 after 1.0: one ulp
    check_replicas(params, step=42)


def test_replica_guard_names_the_parameter_step_and_ranks(dist):
    dist(3, _guarded, None)
    with pytest.raises(Exception) as info:
        dist(3, _guarded, 2)
    text = str(info.value)
    assert ReplicaDivergenceError.__name__ in text
    assert "step 42: parameter 'b.bias' differs between rank 0 and rank(s) [2]" in text


def test_bit_checksums_see_one_ulp():
    x = torch.randn(1000)
    y = x.clone()
    y[517] = torch.nextafter(y[517], torch.tensor(float("inf")))
    assert (bit_checksums([x]) != bit_checksums([y])).all()


def _vote(bad_rank: int):
    loss = torch.tensor(float("nan") if tdist.get_rank() == bad_rank else 1.0)
    return all_ranks_finite(step_is_finite(loss, torch.tensor(0.5)))


def test_one_rank_non_finite_is_seen_by_all(dist):
    assert dist(3, _vote, 1) == [False, False, False]
    assert dist(3, _vote, -1) == [True, True, True]


def test_step_is_finite_checks_gradients_without_a_norm():
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.tensor([0.0, float("inf"), 1.0])
    assert not step_is_finite(torch.tensor(1.0), None, [p])
    assert not step_is_finite(torch.tensor(1.0), torch.tensor(float("nan")))


def test_pbit_state_is_device_free():
    """The stochastic-rounding stream is re-seeded from (seed, rank, step): a reducer's state holds no generator
    state (whose size differs between CPU and CUDA), so a checkpoint loads on any device; older states load too."""
    from src.comm.reducers.pbit import PBitReducer

    a = PBitReducer(world_size=1, rank=0, quant="linf", levels=7, bits=8, seed=3)
    state = a.state_dict()
    assert not any(isinstance(v, torch.Tensor) for v in state.values())
    b = PBitReducer(world_size=1, rank=0, quant="linf", levels=7, bits=8, seed=3)
    b.load_state_dict(state)
    b.load_state_dict({"generator": torch.Generator().get_state()})  # a checkpoint of an older version
