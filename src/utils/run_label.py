"""A run's overlap mode and the label it gives the run (Lion Cub, Section 6 and Appendix A.1; the overlaps are ours).

`variant.overlap` takes false, true (= forward: directions applied in the next forward pass, src/optim/overlap.py),
backward (buckets launched during backward, src/optim/speculation.py) or both. `overlap_mode` reads it,
`variant_label` names a run of it: the variant's name with `+overlap`, `+overlap_backward` or `+overlap_both`.
One rule read by the optimizer (which runs the mode), the run record (its folder and label, src/runlog) and the
figures (analysis/, through `Run.variant_label`); it imports nothing of src/, so every layer may read it.
"""
from __future__ import annotations

OVERLAP_MODES = (False, True, "forward", "backward", "both")  # what `variant.overlap` accepts
SUFFIX = {"false": "", "forward": "+overlap", "backward": "+overlap_backward", "both": "+overlap_both"}


def overlap_mode(value) -> tuple[bool, bool]:
    """(directions applied in the next forward pass, buckets launched during backward) for a `variant.overlap`."""
    if value is False or value is None or value == "false":
        return False, False
    if value is True or value == "forward":
        return True, False
    if value == "backward":
        return False, True
    if value == "both":
        return True, True
    raise ValueError(f"overlap={value!r}: choose one of false, true (= forward), forward, backward, both")


def mode_name(value) -> str:
    """The mode's name: false, forward, backward or both."""
    return {(False, False): "false", (True, False): "forward", (False, True): "backward", (True, True): "both"}[
        overlap_mode(value)]


def label_suffix(value) -> str:
    """What a run's label adds for its overlap: `+overlap` (forward), `+overlap_backward`, `+overlap_both`, or ''."""
    return SUFFIX[mode_name(value)]


def variant_label(name: str, overlap) -> str:
    """How a run of variant `name` with `variant.overlap` = `overlap` is named: `cub4`, `cub4+overlap`, ..."""
    return f"{name}{label_suffix(overlap)}"
