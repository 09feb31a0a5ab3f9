"""What every reducer shares (Lion Cub, Sections 3.1 and 3.2; Distributed Lion, Algorithm 1).

A reducer takes this rank's flat float update vector c_i = beta1 * m_i + (1 - beta1) * g_i and returns the
aggregated direction, identical on every rank:
- `vote="majority"`: sign(S) with S = sum_i Q(c_i) (Distributed Lion MaVo, Lion Cub);
- `vote="average"`:  S / (world_size * levels), in [-1, 1] (Distributed Lion Avg).

The tie rule of Section 3.2 (`zeros`): where a value must fit 1 bit, a zero becomes +1 (`plus`), -1 (`minus`),
or alternates, +1 on odd steps and -1 on even steps (`alternate`; steps count from 1). `keep` keeps zeros exact by
spending one more level on the wire (the paper's "2-bit allreduce which transmits exact zeros", Fig. 3).

Non-finite input: the training loop votes on finite losses and gradients before the optimizer steps
(src/reliability/nonfinite.py), so by default a reducer does not look (that look is a host synchronisation per
step). Unchecked, non-finite values still give well-defined codes (a NaN votes -1 and quantizes to 0; an infinity
votes by its sign and makes its layer's scaled codes 0), so every rank receives the same finite direction and the
replicas stay identical; the rank's own momentum keeps the NaN. With `check_finite=True` (a direct user of LionCub
without the loop may want it), a non-finite value is rejected on the rank that holds it with `NonFiniteUpdateError`
before it is quantized or sent (the other ranks then fail in their collective, and torchrun tears the job down). A world
size of 1 is allowed: the collectives are no-ops and the result is the local quantized direction.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from src.comm.codecs import backend
from src.comm.transport.pipeline import Chunk, ChunkPlan, Done
from src.comm.transport.workspace import Workspace
from src.utils.adjustment import Adjustment
from src.utils.timing import PhaseTimer

VOTES = ("majority", "average")
ZERO_RULES = ("alternate", "plus", "minus", "keep")


class NonFiniteUpdateError(ValueError):
    """The update vector handed to a reducer holds NaN or Inf."""


def tie_value(step: int, zeros: str) -> int:
    """The value (+1 or -1) a zero or a tied vote takes at `step` under the tie rule `zeros`."""
    if zeros == "plus":
        return 1
    if zeros == "minus":
        return -1
    if zeros == "alternate":
        if step < 1:
            raise ValueError(f"steps count from 1 for the alternating tie rule, got step={step}")
        return 1 if step % 2 == 1 else -1
    raise ValueError(f"tie rule {zeros!r} does not resolve zeros; choose one of alternate, plus, minus")


def votes_into(update: torch.Tensor, step: int, zeros: str, out: torch.Tensor) -> torch.Tensor:
    """1-bit votes (True = +1) of sign(update) with zeros resolved by the tie rule, written into a bool `out`.

    sign(x) with a zero turned into +1 is x >= 0, and into -1 is x > 0: one comparison, no quantizer pass.
    """
    compare = torch.ge if tie_value(step, zeros) > 0 else torch.gt
    return compare(update, 0, out=out)


def check_choice(what: str, value, choices: Sequence) -> None:
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(map(str, choices))}")


def resolve_group(group, world_size: int | None, rank: int | None) -> tuple[int, int, bool]:
    """(world_size, rank, live): from the process group when one is initialised, else from the arguments.

    Without a process group a reducer can still be built with explicit `world_size` and `rank`, to validate a
    configuration or compute `wire_bytes` before any process group exists; `reduce` then refuses to run.
    """
    if dist.is_available() and dist.is_initialized():
        ws, rk = dist.get_world_size(group), dist.get_rank(group)
        if world_size is not None and world_size != ws:
            raise ValueError(f"world_size={world_size} was given but the process group has {ws} ranks")
        return ws, rk, True
    if world_size is None:
        raise ValueError("no process group is initialised: call torch.distributed.init_process_group first, "
                         "or pass world_size= (and rank=) to build a reducer for planning only")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    rank = 0 if rank is None else rank
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is outside [0, world_size={world_size})")
    return world_size, rank, False


class Reducer:
    """Base class: owns the process group, the timer and the checks; subclasses implement `_reduce`.

    The per-chunk operations a caller strings together (src/comm/reducers/chunked.py: `plan`, `begin`,
    `statistics_wanted`, `observe`, `encode`, `exchange`, `decode`) are given here for a reducer that reduces the
    whole vector in one call: its plan is one chunk, `encode` hands the values on, `exchange` runs `reduce` (the
    collectives run there, synchronously) and `decode` hands its direction on. So a caller has one path for every
    reducer; only `pipelined` reducers (`ChunkedReducer`) overlap chunks with the wire.
    """

    name = "base"
    pipelined = False

    def __init__(self, group=None, *, world_size: int | None = None, rank: int | None = None,
                 segments: Sequence[int] | None = None, check_finite: bool = False, timer: PhaseTimer | None = None):
        self.group = group
        self.world_size, self.rank, self.live = resolve_group(group, world_size, rank)
        self.segments = None if segments is None else [int(s) for s in segments]
        self.check_finite = check_finite
        self.timer = timer if timer is not None else PhaseTimer()
        self.workspace = Workspace()

    def global_rank(self, group_rank: int) -> int:
        """The global rank of `group_rank` in this reducer's group (for point-to-point and rooted collectives)."""
        if self.group is None:
            return group_rank
        return dist.get_global_rank(self.group, group_rank)

    def reduce(self, update: torch.Tensor, step: int) -> torch.Tensor:
        """Aggregate this rank's flat update vector at `step` (counted from 1); same result on every rank.

        The result lives in the reducer's workspace: it stays valid until the next `reduce` call (clone it to keep).
        """
        if not self.live:
            raise RuntimeError(f"{self.name}: this reducer was built without a process group (planning only)")
        if update.dim() != 1 or not update.is_floating_point():
            raise ValueError(f"{self.name}: expects a flat floating-point vector, got shape {tuple(update.shape)} "
                             f"dtype {update.dtype}")
        if self.segments is not None and sum(self.segments) != update.numel():
            raise ValueError(f"{self.name}: segments cover {sum(self.segments)} elements, update has {update.numel()}")
        if self.check_finite and not torch.isfinite(update.sum()):  # opt-in: a host synchronisation
            bad = (~torch.isfinite(update)).sum().item()
            if bad:
                raise NonFiniteUpdateError(
                    f"{self.name}: update vector on rank {self.rank} holds {bad} non-finite value(s) at step {step}; "
                    "nothing was sent. Check the loss and gradients (gradient clipping does not remove NaN).")
        return self._reduce(update, int(step))

    def _reduce(self, update: torch.Tensor, step: int) -> torch.Tensor:
        raise NotImplementedError

    # --- the per-chunk operations, for a reducer that reduces the whole vector in one call ----------------------
    def chunk_plan(self, sizes: Sequence[int]) -> ChunkPlan:
        """The chunks of a vector of segments `sizes` end to end: here one chunk, the whole vector, unpadded."""
        return ChunkPlan(list(sizes), 0, align=1)

    def begin(self, sizes: Sequence[int], step: int, device: torch.device, checked: bool = False) -> "Reduction":
        """Start a reduction at `step` (counted from 1) on `device` of a vector of segments `sizes` end to end (the
        caller's layers; per-layer scales follow them)."""
        return Reduction(self, self.chunk_plan(sizes), int(step), torch.device(device), checked)

    def statistics_wanted(self, reduction, chunk: Chunk) -> Sequence[Chunk]:
        """The chunks whose values `observe` must see, in order, before `chunk` is encoded (per-layer scales)."""
        return ()

    def observe(self, reduction, chunk: Chunk, values: torch.Tensor) -> None:
        """Take the statistics the scales need from a chunk's values (nothing to take here)."""

    def encode(self, reduction, chunk: Chunk, values: torch.Tensor, slot: int) -> torch.Tensor:
        return values

    def exchange(self, reduction, chunk: Chunk, wire: torch.Tensor, slot: int):
        """`reduce` on the whole vector; its collectives have run when it returns."""
        direction = self.reduce(wire, reduction.step)
        yield Done()
        return direction

    def decode(self, reduction, chunk: Chunk, received: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The direction `reduce` returned, as it is (`out` is not written)."""
        return received

    def buffer_bytes(self) -> int:
        """Bytes of the buffers this reducer keeps between calls."""
        return self.workspace.nbytes()

    def adjustments(self) -> list[Adjustment]:
        """Options this reducer runs with in place of the ones it was given (none here)."""
        return []

    def largest_world_size(self) -> int | None:
        """The most ranks this reducer's sums fit (None: no bound)."""
        return None

    def device_bound(self) -> tuple[str, float, str]:
        """How far its direction on a GPU may be from the CPU's for the same inputs, as (rule, value, why) of
        src/bench/gpu_check/tolerance.py (the conformance suite's `devices` property, run by `make gpu-check`):
        here integer sums divided by a host scalar, within 2 ulps."""
        return ("ulps", 2, "integer signs, votes and level sums divided by a host scalar (the world size, the "
                           "levels): torch's CUDA division multiplies by the reciprocal")

    def incomparable_across_devices(self) -> str | None:
        """Why its result on one device cannot be compared with another's (None: it can, within `device_bound`)."""
        return None

    def wire_bytes(self, numel: int) -> int:
        """Bytes this rank sends to reduce an update of `numel` elements (the algorithms of Table 1)."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}(world_size={self.world_size}, rank={self.rank})"



class Reduction:
    """One reduction of a flat vector at one step: its plan, step, device, the float32 `scratch` chunk its caller
    computes values and directions in, and what its chunks share (a reducer adds per-layer scales or a stream)."""

    def __init__(self, reducer: Reducer, plan: ChunkPlan, step: int, device: torch.device, checked: bool = False,
                 backend: str = "torch"):
        self.reducer, self.plan, self.step, self.device = reducer, plan, step, device
        self.checked = checked  # the whole vector was checked for non-finite values up front (`reduce`)
        self.backend = backend  # which kernels run the codecs (src/comm/codecs/backend.py)

    @property
    def scratch(self) -> torch.Tensor:
        """The float32 chunk the caller computes values and directions in (made on first use)."""
        return self.reducer.workspace.get("scratch", self.plan.chunk, torch.float32, self.device)

    def codec(self, fn):
        """The reference codec `fn` as this reduction's backend runs it."""
        return backend.codec(fn, self.backend)
