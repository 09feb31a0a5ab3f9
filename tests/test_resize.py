"""Resume at another world size (src.reliability.resize) on real gloo ranks: a tiny GPT trained on 4 (or 2) ranks
through the real task, optimizer and checkpoint code, resumed on 2 (or 4), for cub4, cub1, lion32, 1-bit Adam and
D-Lion (tests/resize_ranks.py runs on the ranks).

- The momenta after the resume equal the policy applied to the saved momenta, bit for bit (`mean`: float64 sum in
  rank order, one rounding, written out here independently; `map`: old rank j mod P's); 1-bit Adam's error
  feedback follows its rule (worker errors averaged, server errors re-split).
- The run trains on: its loss is within the spread of uninterrupted runs at the new size started from the same
  averaged state. Spread: the mean training loss (all new ranks, `STEPS_AFTER` steps) of `K` such runs whose data
  streams are those of fresh runs of seeds 1..K; the resumed run's must lie within their mean +- 4 standard
  deviations (K = 4 fixed seeds: the outcome is deterministic). Measured (2 CPU cores, torch 2.14.1): the resumed
  runs lay 0.2 to 1.9 standard deviations from the mean (sd 0.02 to 0.03 for the Lion variants, 0.05 and 0.27 for
  1-bit Adam), and the same statistic from the untrained model lies 52 to 70 standard deviations away for the Lion
  variants; for 1-bit Adam (Adam's lr, 4 warm-up steps: longer runs at larger lr diverge here) the loss hardly moves
  in these steps, so its spread tells little and its bitwise state check carries the test.
- The new ranks' data streams are distinct from each other, from the old ranks' streams (their start and where
  they were) and from a fresh run's ranks at the new size.
"""
from __future__ import annotations

import statistics

import pytest
import torch

import resize_ranks
from src.data import TokenWindows

STEPS_BEFORE, STEPS_AFTER, K = 6, 6, 4
SEED = 1337  # conf/config.yaml's
QUICK = {("cub4", (4, 2))}  # per-rank momenta: in `make test` (error feedback, onebit_adam: make test-all)
CASES = [pytest.param(v, sizes, id=f"{v}-{sizes[0]}to{sizes[1]}",
                      marks=() if (v, sizes) in QUICK else pytest.mark.slow)  # 5 to 15 s each on 2 busy cores
         for v in resize_ranks.VARIANTS if v != "cub4_2bit" for sizes in ((4, 2), (2, 4))]


def saved_optimizers(folder, world: int) -> list[dict]:
    return [torch.load(folder / f"rank{r:05d}.pt", weights_only=False)["optimizer"] for r in range(world)]


def expected_state(saved: list[dict], policy: str, rank: int, new_world: int) -> dict:
    """Every tensor of new `rank`'s optimizer state by the policy, computed here from the saved states."""
    old = len(saved)
    sources = saved if policy == "mean" else [saved[rank % old]]
    state = {k: {n: resize_ranks.mean([s["state"][k][n] for s in sources]) for n, v in entries.items()
                 if isinstance(v, torch.Tensor) and v.dim() > 0}
             for k, entries in saved[0]["state"].items()}
    return {"state": state, "reducer": resize_ranks.expected_reducer(saved, new_world, rank)}


def assert_bitwise(got: dict, want: dict, where: str) -> None:
    for k, entries in want["state"].items():
        for name, tensor in entries.items():
            assert torch.equal(got["state"][k][name], tensor), f"{where}: state[{k}][{name}]"
    assert set(got["reducer"]) == {k for k, v in want["reducer"].items() if isinstance(v, torch.Tensor)}, where
    for key, tensor in want["reducer"].items():
        if isinstance(tensor, torch.Tensor):
            assert torch.equal(got["reducer"][key], tensor), f"{where}: reducer[{key}]"


def first_batch(demo_tokens, rank: int, world: int, seed: int = SEED) -> torch.Tensor:
    return TokenWindows(demo_tokens, "train", 32, 4, rank=rank, world_size=world, seed=seed).next_batch()[0]


def mean_loss(per_rank: list[list[float]]) -> float:
    return statistics.fmean(v for losses in per_rank for v in losses)


@pytest.mark.parametrize("variant, sizes", CASES)
def test_resume_at_another_world_size(variant, sizes, dist, demo_tokens, tmp_path_factory):
    old, new = sizes
    folder, old_nexts = resize_ranks.checkpoint(dist, variant, old, demo_tokens, tmp_path_factory, STEPS_BEFORE)
    outs = dist(new, resize_ranks.resume_resized, variant, str(demo_tokens), str(folder), "mean", STEPS_AFTER)
    saved = saved_optimizers(folder, old)
    for rank, out in enumerate(outs):
        assert_bitwise(out["optimizer"], expected_state(saved, "mean", rank, new), f"{variant} rank {rank}")
        assert out["progress"].step == STEPS_BEFORE
    rules = outs[0]["rules"]
    assert rules["momenta"].startswith(f"the mean of the {old} ranks'")
    assert ("error_feedback" in rules) == (variant == "onebit_adam")

    # data: every new rank's stream is its own, and none is an old rank's or a fresh run's
    firsts = [out["first_batch"] for out in outs]
    others = [*old_nexts, *(first_batch(demo_tokens, r, old) for r in range(old)),
              *(first_batch(demo_tokens, r, new) for r in range(new))]
    for i, x in enumerate(firsts):
        assert not any(torch.equal(x, y) for y in firsts[:i] + firsts[i + 1:] + others), f"rank {i}'s first batch"

    # training goes on within the spread of uninterrupted runs at the new size from the same averaged state
    resumed = mean_loss([out["losses"] for out in outs])
    references = [mean_loss(dist(new, resize_ranks.reference_run, variant, str(demo_tokens), str(folder), seed,
                                 STEPS_AFTER)) for seed in range(1, K + 1)]
    centre, spread = statistics.fmean(references), statistics.stdev(references)
    assert abs(resumed - centre) <= 4 * spread, (resumed, references)


@pytest.mark.parametrize("variant", ["cub4", "onebit_adam"])
@pytest.mark.parametrize("sizes", [(4, 2), (2, 4)], ids=["4to2", "2to4"])
def test_map_policy_continues_old_rank_j_mod_p(variant, sizes, dist, demo_tokens, tmp_path_factory):
    old, new = sizes
    folder, _ = resize_ranks.checkpoint(dist, variant, old, demo_tokens, tmp_path_factory, STEPS_BEFORE)
    outs = dist(new, resize_ranks.resume_resized, variant, str(demo_tokens), str(folder), "map", 1)
    saved = saved_optimizers(folder, old)
    for rank, out in enumerate(outs):
        assert_bitwise(out["optimizer"], expected_state(saved, "map", rank, new), f"{variant} rank {rank}")
    assert outs[0]["rules"]["momenta"] == f"old rank j mod {old}'s (resume_momenta=map)"
    if variant == "cub4":  # Lion Cub's momenta are the ranks' own: map and mean differ
        m = [s["state"][0]["exp_avg"] for s in saved]
        assert not torch.equal(m[0], m[1])
