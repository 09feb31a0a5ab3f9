"""Capture and restore every random number generator a rank uses, so a resumed run draws the same numbers.

Covers Python's `random`, NumPy's global generator, torch's CPU generator and, where present, the CUDA generator
of the current device. Generators owned by objects (the data loader's, a reducer's stochastic-rounding stream) are
saved by those objects' own `state_dict`.
"""
from __future__ import annotations

import random

import numpy as np
import torch


def capture_rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
