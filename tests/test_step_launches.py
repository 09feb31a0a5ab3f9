"""The fused GPU steps launch a number of kernels and collectives that does not grow with the model's depth.

Counted on the CPU by src/bench/step_launches.py: the project's Triton kernels under Triton's interpreter (every
launch goes through `triton_kernels.launch`), torch's kernels as the ATen operators the step dispatches (a foreach
operator counted as CUDA's multi-tensor apply launches it), and the collectives, in one optimizer step of a GPT-2++
of 12 and of 36 narrow blocks (87 and 255 parameter tensors). The fused step of every variant launches the same at
both depths, a few per bucket; the chunked torch step, counted by the same code as a control, grows with depth
(so the counter sees growth where there is some).
"""
from __future__ import annotations

import os

import pytest
import torch.distributed as dist

from src.bench.step_launches import count_step, narrow_gpt


@pytest.fixture(scope="module", autouse=True)
def one_rank():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()  # the other tests of this process expect none


# per variant: (Triton launches, torch kernels, collectives) of one fused step of one bucket
FUSED = {"cub4": (2, 0, 1), "cub1": (3, 0, 2), "cub8": (3, 13, 1), "lion32": (1, 0, 1), "lion16": (1, 1, 1)}


@pytest.mark.parametrize("variant", list(FUSED))
def test_a_fused_step_launches_the_same_at_12_and_36_layers(variant):
    shallow, buckets = count_step(narrow_gpt(12), variant, "triton")
    deep, deep_buckets = count_step(narrow_gpt(36), variant, "triton")
    assert buckets == deep_buckets == 1
    assert (deep.triton, deep.torch, deep.collectives) == (shallow.triton, shallow.torch, shallow.collectives), \
        f"36 layers: {deep.operators}; 12 layers: {shallow.operators}"
    assert (deep.triton, deep.torch, deep.collectives) == FUSED[variant], deep.operators


def test_a_fused_step_launches_a_few_kernels_per_bucket():
    """With the vector cut into 5 buckets: 2 kernels and 1 collective per bucket (cub4), whatever the depth."""
    for layers in (12, 36):
        model = narrow_gpt(layers)
        counts, buckets = count_step(model, "cub4", "triton", chunks=5)
        assert buckets >= 5 and counts.triton == 2 * buckets and counts.collectives == buckets and counts.torch == 0


def test_the_chunked_step_grows_with_depth_and_the_counter_sees_it():
    """The control: the chunked torch step's foreach operators launch one kernel per 48 to 110 tensors on CUDA, so
    36 layers launch more than 12 at the same number of chunks."""
    shallow, _ = count_step(narrow_gpt(12), "lion32", "torch")
    deep, _ = count_step(narrow_gpt(36), "lion32", "torch")
    assert deep.torch > shallow.torch and deep.triton == shallow.triton == 0
