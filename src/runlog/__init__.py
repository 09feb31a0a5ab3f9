"""Run outputs of lioncub: run folder, metrics.jsonl, W&B, provenance (what Section 7's figures are drawn from).

Named `runlog`, not `logging`, so that it never shadows Python's own `logging` module.
"""
