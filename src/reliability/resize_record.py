"""The record of a world-size change (src.reliability.resize): one entry of `summary.json`'s `world_size_changes`
(also kept in every later checkpoint's manifest, so the list covers the whole run), and the line rank 0 prints at
start and W&B keeps as a note of the same run.

An entry: `step` (the checkpoint's), `from` and `to` (world sizes), `resume_momenta`, `rules` (what each part of the
state became: momenta, error feedback, reducer streams, RNG, data), `checkpoint` (its folder), and the values used in
place of the configured ones before and after (`config_adjusted`, as summary.json's: requested, used and why per
key; a field width widened or narrowed for the new world size, `reducer: auto`'s choice made again).
"""
from __future__ import annotations

from src.reliability.resize import Resize


def world_size_change(resize: Resize, rules: dict, checkpoint: str, adjusted_before: dict,
                      adjusted_now: dict) -> dict:
    return {"step": resize.step, "from": resize.old, "to": resize.new, "resume_momenta": resize.momenta,
            "rules": dict(rules), "checkpoint": checkpoint,
            "config_adjusted": {"before": dict(adjusted_before), "now": dict(adjusted_now)}}


def _used(side: dict, other: dict, key: str):
    """The value `key` had on `side` (an Adjustment.record() per key): the one used, else the one configured."""
    return side[key]["used"] if key in side else other[key]["requested"]


def _adjusted(change: dict) -> str:
    before, now = change["config_adjusted"]["before"], change["config_adjusted"]["now"]
    moved = [f"{key} {_used(before, now, key)} -> {_used(now, before, key)}" for key in sorted(set(before) | set(now))
             if _used(before, now, key) != _used(now, before, key)]
    return "; " + ", ".join(moved) if moved else ""


def change_line(change: dict) -> str:
    """One line: the sizes, the step and every rule used."""
    rules = "; ".join(f"{key.replace('_', ' ')}: {rule}" for key, rule in change["rules"].items())
    return (f"lioncub: world size {change['from']} -> {change['to']} at step {change['step']} (checkpoint "
            f"{change['checkpoint']}): {rules}{_adjusted(change)}")
