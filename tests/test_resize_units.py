"""Resume at another world size, the parts that need no process group: a vision epoch split over the old and the
new ranks, the reshaping rules on saved optimizer states, the seeds of the new streams."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from harness_util import cfg_with
from src.distributed.process_group import DistContext
from src.engine.tasks import make_task
from src.reliability.resize import Resize, ReshapeError, derived_seed, mean_of, reshape_optimizer_state

N, B = 48, 3  # training images, batch size


class _Indices(Dataset):
    """Image i is its own index (the sampler's choice is what the test looks at)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int):
        return torch.zeros(1), index


@pytest.fixture(scope="module")
def tiny_cifar(tmp_path_factory):
    from src.data import make_synthetic_cifar

    root = tmp_path_factory.mktemp("cifar")
    make_synthetic_cifar(root, num_classes=10, n_train=N, n_test=10, seed=0)
    return root


def vision_task(root, rank: int, world: int):
    """The vision task of rank `rank` of `world`, its loader yielding image indices as labels."""
    cfg = cfg_with("model=resnet18", "data=cifar100", "optim=vision", f"data.root={root}", "data.num_classes=10",
                   f"data.batch_size={B}", "data.num_workers=0", "train.epochs=3")
    task = make_task(cfg, DistContext(rank, rank, world, world, torch.device("cpu"), "gloo", "local"))
    task.open_data(None)
    task.loader = DataLoader(_Indices(), batch_size=B, sampler=task.sampler, drop_last=True)
    return task


def draw(task, batches: int) -> list[int]:
    return [i for _ in range(batches) for i in task.next_batch()[1].tolist()]


@pytest.mark.parametrize("old, new, done", [(4, 2, 2), (2, 4, 2), (2, 4, 3), (3, 2, 1)])
def test_a_vision_epoch_is_covered_once_across_the_change(tiny_cifar, old, new, done):
    """`done` batches of epoch 0 on `old` ranks, the rest of the epoch on `new` ranks: no image twice, and only the
    epoch's last images that cannot fill a step of the new size (as with drop_last) are left out."""
    before = [vision_task(tiny_cifar, r, old) for r in range(old)]
    seen = [i for task in before for i in draw(task, done)]
    state = before[0].data_state()
    after = [vision_task(tiny_cifar, r, new) for r in range(new)]
    for rank, task in enumerate(after):
        assert "continues from position" in task.load_resized_data_state(state, old, seed=rank)
    left = after[0].resized_steps(before[0].position(), done, epochs=1) - done
    seen += [i for task in after for i in draw(task, left)]
    assert len(seen) == len(set(seen)), "an image was seen twice"
    missed = set(range(N)) - set(seen)
    assert len(missed) < new * B
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(before[0].sampler.base.seed)).tolist()
    assert missed == set(perm[N - len(missed):])  # only the tail of the epoch's permutation
    assert all(task.epoch == 0 for task in after)
    draw(after[0], 1)  # the next batch starts epoch 1, an ordinary epoch of the new size
    assert after[0].epoch == 1 and after[0].sampler.offset == 0
    if (N - done * old * B) % (new * B) == 0:
        assert not missed


def test_a_resized_epoch_resumes_at_its_own_size_bitwise(tiny_cifar):
    """A checkpoint taken inside a taken-over epoch (offset > 0) continues it exactly at the same size."""
    tasks = [vision_task(tiny_cifar, r, 2) for r in range(2)]
    for task in tasks:
        task.load_resized_data_state({"epoch": 0, "batch": 2, "offset": 0, "samples": 24}, 4, seed=0)
        draw(task, 1)
    again = [vision_task(tiny_cifar, r, 2) for r in range(2)]
    for task, twin in zip(tasks, again):
        assert task.data_state()["offset"] == 24 and task.data_state()["samples"] == 30
        twin.load_data_state(task.data_state())
        assert draw(twin, 3) == draw(task, 3)


def _state(momenta: list[float], reducer: dict | None = None, step: float = 5.0) -> dict:
    state = {"state": {0: {"exp_avg": torch.tensor(momenta), "step": torch.tensor(step)}},
             "param_groups": [{"lr": 0.1, "params": [0]}]}
    if reducer is not None:
        state["reducer"] = reducer
    return state


def test_mean_is_one_rounding_of_a_float64_sum_and_exact_for_equal_momenta():
    x = torch.tensor([0.1, 1e-8, 3.0, -7.25], dtype=torch.float32)
    for world in (2, 3, 4, 8):
        assert torch.equal(mean_of([x] * world), x)
    a, b = torch.tensor([1.0, -3.0]), torch.tensor([2.0, 0.5])
    assert mean_of([a, b]).tolist() == [1.5, -1.25] and mean_of([a.bfloat16(), b.bfloat16()]).dtype == torch.bfloat16


def test_reshape_rules_and_refusals():
    saved = [_state([1.0, 2.0], {"seed": 0}), _state([3.0, 6.0], {"seed": 0})]
    state, rules = reshape_optimizer_state(lambda r: saved[r], 2, Resize(5, 2, 3, "mean"), "ckpt")
    assert state["state"][0]["exp_avg"].tolist() == [2.0, 4.0] and float(state["state"][0]["step"]) == 5.0
    assert state["reducer"] == {"seed": 0} and state["param_groups"] == saved[0]["param_groups"]
    state, _ = reshape_optimizer_state(lambda r: saved[r], 2, Resize(5, 2, 3, "map"), "ckpt")
    assert state["state"][0]["exp_avg"].tolist() == [1.0, 2.0]  # old rank 2 mod 2 = 0
    old_format = [_state([1.0], {"seed": 0, "generator_cpu": torch.zeros(5056, dtype=torch.uint8)})] * 2
    state, rules = reshape_optimizer_state(lambda r: old_format[r], 0, Resize(5, 2, 1, "mean"), "ckpt")
    assert "generator_cpu" not in state["reducer"] and "reducer_streams" in rules
    strange = [_state([1.0], {"residual": torch.ones(4)})] * 2
    with pytest.raises(ReshapeError, match="per-rank tensor 'residual' of shape \\(4,\\).*from 2 to 1 ranks"):
        reshape_optimizer_state(lambda r: strange[r], 0, Resize(5, 2, 1, "mean"), "ckpt")
    counts = [{"state": {0: {"hits": torch.ones(3, dtype=torch.int64)}}, "param_groups": []}] * 2
    with pytest.raises(ReshapeError, match="'hits' is a torch.int64 tensor"):
        reshape_optimizer_state(lambda r: counts[r], 0, Resize(5, 2, 1, "mean"), "ckpt")
    uneven = [_state([1.0]), {"state": {}, "param_groups": []}]  # rank 1 never stepped parameter 0
    with pytest.raises(ReshapeError, match="different state entries for parameter 0"):
        reshape_optimizer_state(lambda r: uneven[r], 0, Resize(5, 2, 1, "mean"), "ckpt")
    with pytest.raises(ValueError, match="resume_momenta='avg': choose one of mean, map"):
        Resize(5, 2, 1, "avg")


def test_1bit_adam_server_errors_are_re_split_exactly():
    numel = 10  # padded to 16 at 2 ranks (chunks of 8), to 32 at 4 ranks (chunks of 8), to 16 at 1 rank
    whole = torch.arange(1.0, numel + 1)
    server = [torch.cat([whole[:8]]), torch.cat([whole[8:], torch.zeros(6)])]
    saved = [_state([0.0], {"worker_error": torch.full((numel,), float(r)), "server_error": server[r]})
             for r in range(2)]
    for new, chunk in ((4, 8), (1, 16)):
        parts = [reshape_optimizer_state(lambda r: saved[r], j, Resize(3, 2, new, "map"), "ckpt")[0]["reducer"]
                 for j in range(new)]
        assert all(p["server_error"].numel() == chunk for p in parts)
        joined = torch.cat([p["server_error"] for p in parts])
        assert torch.equal(joined[:numel], whole) and not joined[numel:].any()
        assert all(torch.equal(p["worker_error"], torch.full((numel,), 0.5)) for p in parts)


def test_derived_seeds_differ_by_rank_step_size_and_stream():
    seeds = {derived_seed(1337, step, world, rank, stream)
             for step in (8, 9) for world in (2, 4) for rank in range(4) for stream in (0, 1)}
    assert len(seeds) == 32 and all(0 <= s < 2**63 for s in seeds)
