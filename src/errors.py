"""The error of a configuration that cannot train (Lion Cub, Section 7 setups checked before training starts).

It lives at the bottom of `src/`, below every layer that raises it (process-group setup, run outputs, reliability,
engine), and depends on nothing.

`SetupError` carries a message that says what is wrong, with the numbers, and what to change. `python -m src.train`
prints it without a traceback and exits with status 2, before any process group, run folder or training step exists.
"""
from __future__ import annotations


class SetupError(ValueError):
    """The requested run cannot start; the message names the offending values and the fix."""
