"""Reliability: exact checkpoint and resume, replica guard, non-finite step policy (docs/reliability.md)."""
