"""The step's agreement: every value the ranks must agree on before the optimizer step, by name, in ONE collective.

Before `optimizer.step()` every rank must take the same decisions: skip a non-finite step or not, stop on a signal
or not, keep the collectives a speculative step launched during backward or not (Lion Cub, Section 6: the ranks run
their collectives in lockstep, so a rank that decides alone leaves the others waiting). Each of those decisions is a
field with one owner, who registers it once, before training, with its reduction over the ranks:

| field       | reduction | owner                                                       |
|-------------|-----------|-------------------------------------------------------------|
| `nonfinite` | any       | src/reliability/nonfinite.py: a rank's loss or gradient     |
| `stop`      | max       | src/reliability/signals.py: the largest stop signal number  |
| `held`      | all       | src/optim/speculation.py: no rank clipped or re-ran backward |
| `launched`  | max       | src/optim/speculation.py: the most chunks a rank launched   |

Per step each owner `propose`s this rank's value (a 0-dim device tensor, a Python int or bool; a field nobody
proposed takes its reduction's identity: false for any, true for all, 0 for max and sum) and may `carry` local
values the host needs (the loss and gradient norm the loop logs). `reach()` then packs the fields by name (sorted,
so registration order does not matter), reduces them over the group with one collective and brings the result and
the carried values to the host in ONE transfer (on a GPU, the step's one host synchronisation); every rank reads the
same `Agreed` by name.

The collective: one all-reduce (MAX) of one int32 per field when every reduction has a MAX form (any and max as they
are, all as 1 - x: today's four fields, 16 bytes); one all-gather of the fields, reduced on each rank, when a `sum`
field joins a `max` one (no single all-reduce computes both). Values are int32: flags and counts. Fields reduced
with `max` or `sum` hold non-negative integers (the identity is 0). The group may be any process group, a subgroup
included; without a process group (or with one rank) the values are this rank's own.
Deliberate difference from the paper: the paper's step has no such agreement (it neither clips nor skips per rank).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

import torch
import torch.distributed as dist

from src.comm.transport.collectives import all_gather_flat
from src.comm.transport.device import collective_device, on_collective_device


@dataclass(frozen=True)
class Reduction:
    """How a field combines over the ranks: its identity, its form in a MAX all-reduce (`flip`: sent as 1 - x and
    read back as 1 - r; None: it has none) and its combination of the gathered values (the all-gather path)."""
    identity: int
    flip: bool | None
    combine: Callable[[torch.Tensor], torch.Tensor]
    flag: bool  # read back as a bool (any, all) or an int (max, sum)


REDUCTIONS = {
    "any": Reduction(identity=0, flip=False, combine=lambda x: x.amax(0), flag=True),
    "all": Reduction(identity=1, flip=True, combine=lambda x: x.amin(0), flag=True),
    "max": Reduction(identity=0, flip=False, combine=lambda x: x.amax(0), flag=False),
    "sum": Reduction(identity=0, flip=None, combine=lambda x: x.sum(0, dtype=torch.int32), flag=False),
}


@dataclass(frozen=True)
class Field:
    name: str
    reduction: str
    owner: str  # the module that registered it (named in errors)


def own_group():
    """A process group of its own for the agreement (every rank calls this, once, before training), or None without
    one: an optimizer that launches its collectives during backward has them queued on the default group, and an
    agreement behind them would wait for the wire that the step means to hide."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        return dist.new_group()
    return None


class Agreed(Mapping[str, int]):
    """The fields every rank agreed on, by name (bool for any/all, int for max/sum), and this rank's `carried`
    values (floats)."""

    def __init__(self, values: dict[str, int | bool], carried: dict[str, float]):
        self._values, self.carried = values, carried

    def __getitem__(self, name: str) -> int | bool:
        if name not in self._values:
            raise KeyError(f"no agreed field {name!r}; the fields are {sorted(self._values)}")
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


class Agreement:
    """One step's agreement over `group` (None: the default group); see the module doc."""

    def __init__(self, group=None):
        self.group = group
        self.fields: dict[str, Field] = {}
        self._proposed: dict[str, torch.Tensor | int] = {}
        self._carried: dict[str, torch.Tensor] = {}
        self._frozen = False  # after the first reach, the fields are fixed (every rank packs the same ones)

    def register(self, name: str, reduction: str, owner: str) -> None:
        """Add field `name`, reduced with `reduction` (any, all, max, sum); registering the same field again is a
        no-op, a different one under a taken name is refused, as is any new field after the first `reach`."""
        if reduction not in REDUCTIONS:
            raise ValueError(f"agreement field {name!r}: reduction {reduction!r}; choose one of "
                             f"{', '.join(REDUCTIONS)}")
        field, known = Field(name, reduction, owner), self.fields.get(name)
        if known == field:
            return
        if known is not None:
            raise ValueError(f"agreement field {name!r} is registered by {known.owner} ({known.reduction}); "
                             f"{owner} cannot register it ({reduction})")
        if self._frozen:
            raise RuntimeError(f"agreement field {name!r} ({owner}): fields are registered before the first step")
        self.fields[name] = field

    def propose(self, name: str, value: torch.Tensor | int | bool) -> None:
        """This rank's value of field `name` for this step (a 0-dim tensor stays on its device: no host sync)."""
        if name not in self.fields:
            raise KeyError(f"no agreement field {name!r} is registered; the fields are {sorted(self.fields)}")
        if name in self._proposed:
            raise ValueError(f"agreement field {name!r} was already proposed this step")
        if not isinstance(value, torch.Tensor) and int(value) < 0 and not REDUCTIONS[self.fields[name].reduction].flag:
            raise ValueError(f"agreement field {name!r}: {value} < 0 (max and sum fields hold non-negative integers)")
        self._proposed[name] = value

    def carry(self, name: str, value: torch.Tensor) -> None:
        """A local 0-dim value the host needs after the step's agreement, brought in the same transfer."""
        self._carried[name] = value

    def reach(self) -> Agreed:
        """Every rank's fields reduced (one collective) and brought to the host with the carried values (one
        transfer); the proposals and carried values are cleared for the next step."""
        self._frozen = True
        fields = [self.fields[name] for name in sorted(self.fields)]
        proposed, carried, self._proposed, self._carried = self._proposed, self._carried, {}, {}
        device = next((v.device for v in [*proposed.values(), *carried.values()] if isinstance(v, torch.Tensor)),
                      None) or self._device()
        by_max = all(REDUCTIONS[f.reduction].flip is not None for f in fields)
        local = [_sent(proposed, f, device, by_max) for f in fields]
        reduced = self._reduce(torch.stack(local), fields, by_max) if local else torch.zeros(0, device=device)
        parts = [reduced.to(torch.float64)] + [v.detach().reshape(1).to(reduced.device, torch.float64)
                                               for v in carried.values()]
        values = torch.cat(parts).tolist()  # the one transfer
        agreed = {f.name: _read(f, v, by_max) for f, v in zip(fields, values)}
        return Agreed(agreed, dict(zip(carried, values[len(fields):])))

    def _device(self) -> torch.device:
        """Where the fields are made when no proposal is a tensor: the group's device (no copy before the
        collective)."""
        return collective_device(self.group) if dist.is_initialized() else torch.device("cpu")

    def _reduce(self, local: torch.Tensor, fields: list[Field], by_max: bool) -> torch.Tensor:
        """The fields combined over the group: one all-reduce (MAX) of the values as sent (`_sent`), or one
        all-gather combined here (a `sum` beside a `max`)."""
        ranks = dist.get_world_size(self.group) if dist.is_initialized() else 1
        if ranks == 1:
            return local
        local = on_collective_device(local, self.group)
        if by_max:
            dist.all_reduce(local, op=dist.ReduceOp.MAX, group=self.group)
            return local
        gathered = torch.empty(ranks * len(fields), dtype=local.dtype, device=local.device)
        all_gather_flat(gathered, local, group=self.group)
        rows = gathered.view(ranks, len(fields))
        return torch.stack([REDUCTIONS[f.reduction].combine(rows[:, i]) for i, f in enumerate(fields)])


def _sent(proposed: dict, field: Field, device: torch.device, by_max: bool) -> torch.Tensor:
    """This rank's int32 value of `field` on `device` (its reduction's identity when nobody proposed one), as the
    collective sends it: 1 - x for a flipped field in the MAX all-reduce (a device op: no host transfer)."""
    reduction = REDUCTIONS[field.reduction]
    value = proposed[field.name] if field.name in proposed else reduction.identity
    if isinstance(value, torch.Tensor):
        value = value.detach().reshape(()).to(device)
        value = (value != 0 if reduction.flag else value).to(torch.int32)
    else:
        value = torch.full((), int(value != 0) if reduction.flag else int(value), dtype=torch.int32, device=device)
    return 1 - value if by_max and reduction.flip else value


def _read(field: Field, value: float, by_max: bool) -> int | bool:
    """The agreed value of `field` from what the collective returned."""
    reduction = REDUCTIONS[field.reduction]
    value = 1 - value if by_max and reduction.flip else value
    return bool(value) if reduction.flag else int(value)
