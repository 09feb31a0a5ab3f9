"""The largest world size a variant runs at (Lion Cub, Section 6: a packed field must hold the sum of every rank).

The p-bit reducers (`pbit`, `ps_naive`, `ps_tree`) widen their fields up to 16 bits, which hold sums up to
2**15 - 1 (src/comm/codecs/packing.py): votes run at up to 32767 ranks, L levels at up to 32767 // (2 L) (8-bit L1 with
L = 15: 1092). D-Lion's averaging sends counts back in at most 8 bits: 255 ranks. Every other variant has no such
bound (1-bit allreduce, gradient allreduces, the baselines). `reducer: auto` chooses among candidates of which one
(`onebit`) has none. Each reducer states its own bound (`Reducer.largest_world_size`), so a user's reducer states
its own. Used to name the limit where a launch or a resume asks for more ranks.
"""
from __future__ import annotations

from src.comm import make_reducer
from src.optim.variant import Variant


def largest_world_size(variant: Variant) -> int | None:
    """The largest number of ranks `variant` runs with; None when there is no bound (or the reducer is invalid,
    which its own check reports)."""
    if not variant.reducer:  # only lion_cub's variants have one (src/optim/variant.py)
        return None
    options = dict(variant.reducer)
    name = options.pop("name", None)
    try:
        reducer = make_reducer(name, world_size=1, rank=0, **options)
    except ValueError:
        return None
    return reducer.largest_world_size()
