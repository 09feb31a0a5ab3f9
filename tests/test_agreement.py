"""The step's agreement (src/comm/agreement.py): named fields registered by their owners, one collective per step.

On 3 real gloo ranks, every reduction (any, all, max, sum) against the same reduction computed here from every
rank's values, with tensors and Python ints as proposals and fields nobody proposed taking their identity: one
all-reduce when every reduction has a MAX form (the loop's four fields), one all-gather when a `sum` joins a `max`;
either way one collective and one host transfer per `reach`, with the carried values. A subgroup agrees among its
members only. Registration: the order does not matter, a name has one owner, no field joins after the first step.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as tdist
from device_double import HostMonitor, watch_collectives

from src.comm.agreement import REDUCTIONS, Agreement

# per field: its reduction and each rank's value (None: the rank proposes nothing)
LOOP_FIELDS = {"nonfinite": ("any", [False, True, False]), "stop": ("max", [0, 15, 2]),
               "held": ("all", [True, None, True]), "launched": ("max", [3, 0, None])}
MIXED = {"clipped": ("sum", [1, 0, 1]), "most": ("max", [4, 9, None]), "ok": ("all", [True, True, False]),
         "seen": ("any", [None, None, None])}


def _expected(fields: dict, ranks: list[int]) -> dict:
    """Each field reduced over `ranks` here, from the table (identity where a rank proposes nothing)."""
    out = {}
    for name, (reduction, values) in fields.items():
        taken = [REDUCTIONS[reduction].identity if values[r] is None else int(values[r]) for r in ranks]
        out[name] = {"any": lambda v: any(v), "all": lambda v: all(v), "max": max, "sum": sum}[reduction](taken)
    return out


def _agree(fields: dict, as_tensors: bool, reverse: bool, subgroup: list[int] | None):
    rank = tdist.get_rank()
    group = tdist.new_group(subgroup) if subgroup is not None else None
    if subgroup is not None and rank not in subgroup:
        return None
    agreement = Agreement(group)
    for name in sorted(fields, reverse=reverse and rank % 2 == 1):  # registration order differs between ranks
        agreement.register(name, fields[name][0], owner="tests")
    proposals = {name: torch.tensor(values[rank]) if as_tensors else values[rank]
                 for name, (_, values) in fields.items() if values[rank] is not None}
    loss, counts = torch.tensor(2.5 + rank), {}  # made before the monitor: device tensors, as a GPU run's are
    with watch_collectives(HostMonitor(), counts) as monitor:
        for name, value in proposals.items():
            agreement.propose(name, value)
        agreement.carry("loss", loss)
        agreed = agreement.reach()
    return dict(agreed), agreed.carried, counts, monitor.syncs, monitor.violations


@pytest.mark.parametrize("fields, collective", [(LOOP_FIELDS, "all_reduce"), (MIXED, "all_gather")])
def test_every_reduction_in_one_collective_and_one_transfer(dist, fields, collective):
    for as_tensors, reverse in ((False, False), (True, True)):
        for rank, (agreed, carried, counts, syncs, violations) in enumerate(dist(3, _agree, fields, as_tensors,
                                                                                 reverse, None)):
            assert agreed == _expected(fields, [0, 1, 2]), (rank, agreed)
            assert carried == {"loss": 2.5 + rank}
            (name, tensors), = counts.items()  # one collective: an all-reduce of one tensor, or an all-gather of
            assert collective in name and tensors == (1 if collective == "all_reduce" else 2), counts  # two
            assert syncs == 1 and violations == []
    types = {name: type(value) for name, value in agreed.items()}
    assert all(types[n] is (bool if r in ("any", "all") else int) for n, (r, _) in fields.items()), types


def test_a_subgroup_agrees_among_its_members(dist):
    results = dist(3, _agree, MIXED, True, False, [0, 2])
    assert results[1] is None
    for result in (results[0], results[2]):
        assert result[0] == _expected(MIXED, [0, 2])


def test_one_rank_reads_its_own_values_without_a_group():
    agreement = Agreement()
    agreement.register("held", "all", owner="tests")
    agreement.register("launched", "max", owner="tests")
    agreement.propose("launched", 7)
    assert dict(agreement.reach()) == {"held": True, "launched": 7}
    agreement.propose("held", torch.tensor(False))
    assert dict(agreement.reach()) == {"held": False, "launched": 0}  # proposals last one step


def test_registration_has_one_owner_per_name_and_ends_at_the_first_step():
    agreement = Agreement()
    agreement.register("stop", "max", owner="src.reliability.signals")
    agreement.register("stop", "max", owner="src.reliability.signals")  # the same field again: a no-op
    with pytest.raises(ValueError, match="'stop' is registered by src.reliability.signals"):
        agreement.register("stop", "sum", owner="elsewhere")
    with pytest.raises(ValueError, match="choose one of any, all, max, sum"):
        agreement.register("x", "min", owner="tests")
    with pytest.raises(KeyError, match="no agreement field 'held'"):
        agreement.propose("held", True)
    with pytest.raises(ValueError, match="non-negative"):
        agreement.propose("stop", -1)
    agreement.propose("stop", 2)
    with pytest.raises(ValueError, match="already proposed"):
        agreement.propose("stop", 3)
    assert agreement.reach()["stop"] == 2
    with pytest.raises(RuntimeError, match="before the first step"):
        agreement.register("late", "any", owner="tests")
    with pytest.raises(KeyError, match="the fields are \\['stop'\\]"):
        agreement.reach()["held"]
