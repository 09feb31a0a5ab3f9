"""The one exception type of the data layer (Lion Cub, Section 7 and Appendix D: the data the experiments train on).

Every problem a user can fix (a folder that was never prepared, a corrupt pickle, a missing tokenizer file, a
vocabulary that is too small) is raised as `DataError` with a message that says what is wrong and what to run.
It subclasses `RuntimeError` so callers that do not know about it still see an ordinary runtime failure.
"""
from __future__ import annotations


class DataError(RuntimeError):
    """A data file or folder is missing, corrupt or inconsistent; the message says how to fix it."""
