"""Shape-only copies of a model: built on the meta device without running its weight initializers.

A meta tensor has a shape and a dtype but no values, so an initializer has nothing to write. Yet the first random
fill of a meta tensor (`normal_`, as GPT-2's and nn.Embedding's init call it) goes through torch's Python
reference implementation, which imports torch._dynamo: about 2.5 s per process, on every rank of every run, for a
check that needs only shapes. `initializers_skipped()` makes the initializers and random fills return their meta
tensor untouched; operations on real tensors, and every other operation, run as usual.
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

_INIT = torch.nn.init
SKIPPED = frozenset({
    _INIT.normal_, _INIT.uniform_, _INIT.trunc_normal_, _INIT.constant_, _INIT.ones_, _INIT.zeros_, _INIT.eye_,
    _INIT.dirac_, _INIT.xavier_uniform_, _INIT.xavier_normal_, _INIT.kaiming_uniform_, _INIT.kaiming_normal_,
    _INIT.orthogonal_, _INIT.sparse_,
    torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.random_, torch.Tensor.bernoulli_,
    torch.Tensor.exponential_, torch.Tensor.log_normal_, torch.Tensor.cauchy_, torch.Tensor.geometric_,
    torch.Tensor.erfinv_,
})


def _target(args: tuple, kwargs: dict):
    """The tensor an initializer writes: its first argument, however it was passed."""
    if args:
        return args[0]
    return kwargs.get("tensor", kwargs.get("self"))


class initializers_skipped(TorchFunctionMode):
    """Within it, an initializer or random fill of a meta tensor returns the tensor and does nothing."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SKIPPED:
            target = _target(args, kwargs)
            if isinstance(target, torch.Tensor) and target.is_meta:
                return target
        return func(*args, **kwargs)
