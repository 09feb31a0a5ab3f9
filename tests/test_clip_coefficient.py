"""The clip coefficient the loop passes on (src/engine/loop.py `clip_gradients`) is the one torch's
`clip_grad_norm_` multiplied every gradient by, bit for bit, on both sides of the clip and at it.

A speculative step's `held` (src/optim/speculation.py) is "the coefficient is exactly 1": then torch multiplied
every gradient by 1.0 and no bit changed, so the collectives launched during backward are the step's own. Here:
gradients whose total norm lands within a few ulps of the clip (minus torch's 1e-6), the coefficient times the
unclipped gradients against what torch left in `.grad`, and coefficient == 1 exactly when no gradient changed.
"""
from __future__ import annotations

import torch

from src.engine.loop import CLIP_EPS, clip_gradients


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Linear(5, 3))
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 0.3
    return model


def _clips_around(norm: torch.Tensor) -> list[float]:
    """Clips from a few ulps under to a few over the norm plus torch's epsilon, and far on both sides."""
    edge, out = (norm + CLIP_EPS).item(), []
    for steps in range(-3, 4):
        value = torch.tensor(edge, dtype=torch.float32)
        toward = torch.tensor(float("inf") if steps > 0 else 0.0)
        for _ in range(abs(steps)):
            value = torch.nextafter(value, toward)
        out.append(value.item())
    return [edge / 2, *out, edge * 2]


def test_the_coefficient_is_the_one_torch_applied_bitwise():
    norm = torch.nn.utils.get_total_norm([p.grad for p in _model(0).parameters()])
    held = []
    for clip in _clips_around(norm):
        model = _model(0)
        before = [p.grad.clone() for p in model.parameters()]
        got_norm, coefficient = clip_gradients(model, clip)
        assert torch.equal(got_norm, norm)
        expected = torch._foreach_mul(before, coefficient)
        for want, p in zip(expected, model.parameters()):
            assert torch.equal(want, p.grad), clip
        held.append(bool(coefficient == 1.0))
        if held[-1]:  # the speculation's condition: not one bit changed
            assert all(torch.equal(b, p.grad) for b, p in zip(before, model.parameters())), clip
    assert held[0] is False and held[-1] is True and False in held[1:-1] and True in held[1:-1]  # both sides met


def test_no_clip_no_coefficient():
    model = _model(1)
    before = [p.grad.clone() for p in model.parameters()]
    assert clip_gradients(model, None) == (None, None) and clip_gradients(model, 0.0) == (None, None)
    assert all(torch.equal(b, p.grad) for b, p in zip(before, model.parameters()))
