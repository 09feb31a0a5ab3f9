"""Capture and restore every random number generator a rank uses, so a resumed run draws the same numbers.

Covers Python's `random`, NumPy's global generator, torch's CPU generator and, where present, the CUDA generator
of the current device. Generators owned by objects (the data loader's, a reducer's stochastic-rounding stream) are
saved by those objects' own `state_dict`.

Across devices (a checkpoint written on GPUs resumed on CPUs, or back) a generator's state belongs to its device
type: a CPU generator (Mersenne Twister) has a 5056-byte state, a CUDA generator (Philox) a 16-byte one, and
`set_state` refuses the other's. The rule: a generator state that does not fit the generator it would go into
(`fits_generator`) is not restored; that generator keeps the seed this run gave it, and a note says so. Such a
resume continues training exactly, but not bitwise like the interrupted run (it could not be: the kernels differ).
"""
from __future__ import annotations

import random

import numpy as np
import torch


def seed_host_rngs(seed: int) -> None:
    """Seed Python's and NumPy's generators, whose states a checkpoint records beside torch's: two runs of one
    config then write equal checkpoints (no training code draws from them today)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)


def capture_rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def generator_state_size(device: torch.device | str) -> int:
    """Bytes of the state of a `torch.Generator` on `device` (5056 on CPU, 16 on CUDA)."""
    return torch.Generator(device=device).get_state().numel()


def fits_generator(state: torch.Tensor, device: torch.device | str) -> bool:
    """Whether a saved generator `state` can be loaded into a generator on `device`."""
    return state.dtype == torch.uint8 and state.numel() == generator_state_size(device)


def restore_rng_state(state: dict) -> list[str]:
    """Restore what fits this process; returns a note for each generator left at its seed (see the docstring)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = torch.cuda.is_available()
    if "cuda" in state and cuda and fits_generator(state["cuda"], "cuda"):
        torch.cuda.set_rng_state(state["cuda"])
    elif "cuda" in state:
        return ["the checkpoint's CUDA generator state fits no CUDA generator here (none, or another kind); "
                "it is not restored"]
    elif cuda and torch.cuda.is_initialized():
        return ["the checkpoint has no CUDA generator state (written without CUDA): the CUDA generator keeps its seed"]
    return []
