"""Deterministic fault injection for the reliability tests (docs/reliability.md).

Config keys under `fault` (all null = off, the default):
- `kill_rank`, `kill_at_step`: that rank sends itself SIGKILL at the start of that step, but only on the first
  attempt of the job (`TORCHELASTIC_RESTART_COUNT` unset or 0), so a job restarted by
  `torchrun --max-restarts=N` resumes and finishes instead of dying again at the same step;
- `perturb_rank`, `perturb_at_step`: after that step's update, that rank moves one element of its first parameter
  by one ulp (the smallest possible divergence of the replicas; the replica guard must see it);
- `nan_rank`, `nan_at_step`: after that step's backward, that rank sets one element of its first gradient to NaN.
"""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import torch

from src.errors import SetupError
from src.optim.shards import local
from src.reliability.config import Fault

def restart_count() -> int:
    """How often torchrun has restarted this job's workers (0 on the first attempt or without torchrun)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def _pair(fault: Fault, kind: str, world_size: int) -> tuple[int, int] | None:
    rank, step = getattr(fault, f"{kind}_rank"), getattr(fault, f"{kind}_at_step")
    if rank is None and step is None:
        return None
    if rank is None or step is None or not 0 <= rank < world_size or step < 1:
        raise SetupError(f"fault.{kind}_rank={rank!r} fault.{kind}_at_step={step!r}: give both, a rank in "
                         f"0..{world_size - 1} and a step >= 1 (or leave both null)")
    return rank, step


@dataclass(frozen=True)
class Faults:
    kill: tuple[int, int] | None = None
    perturb: tuple[int, int] | None = None
    nan: tuple[int, int] | None = None
    rank: int = 0

    @classmethod
    def from_config(cls, fault: Fault, rank: int, world_size: int) -> Faults:
        """The faults of the `fault` section (its keys typed by the schema) for `rank`; SetupError when a pair is
        half given or names a rank outside the world or a step before 1."""
        return cls(*(_pair(fault, k, world_size) for k in ("kill", "perturb", "nan")), rank=rank)

    def _due(self, fault: tuple[int, int] | None, step: int) -> bool:
        return fault is not None and fault == (self.rank, step)

    def maybe_kill(self, step: int) -> None:
        if self._due(self.kill, step) and restart_count() == 0:
            print(f"[rank {self.rank}] fault injection: SIGKILL at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    @torch.no_grad()
    def maybe_perturb(self, step: int, params: list[torch.Tensor]) -> None:
        if self._due(self.perturb, step):
            flat = local(params[0]).view(-1)  # an FSDP2 parameter: this rank's shard
            flat[0] = torch.nextafter(flat[0], torch.tensor(float("inf"), dtype=flat.dtype, device=flat.device))

    @torch.no_grad()
    def maybe_nan(self, step: int, params: list[torch.Tensor]) -> None:
        if self._due(self.nan, step):
            p = params[0]
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            local(p.grad).view(-1)[0] = float("nan")  # an FSDP2 gradient: this rank's shard
