"""The statistics hook of the training loop: `make_stats(...)` returns `OFF` or a `TrainingStats`.

The loop calls, per step: `begin(step)`; `before_step()` after clipping and the finite-vote, right before
`optimizer.step()` (p.grad is this rank's clipped local gradient, the optimizer's `exp_avg` the momentum the step
will use); `after_step()` right after it (the momentum after the step); then reads `seconds` (left out of the
step's time) and `pop()` (the row's `stats/...` keys and `time/stats`). On a statistics step:

before_step, per bucket of consecutive parameters (at most `stats.bucket_elements` elements, a larger parameter
alone), with the bucket's c_i = beta1 * m_i + (1 - beta1) * g_i in one zero-padded float32 buffer on the process
group's device: every rank quantizes its c with every method and starts one all-to-all of c and one of the codes
(src/stats/agreement.py: rank j receives every rank's shard j); while they travel, rank 0 describes its own c per
selected layer (src/stats/distribution.py); then every rank counts the sign agreements of its shard per layer.
after_step: one all-to-all of the momenta per bucket for the spread, then one all-gather of every rank's small
per-layer tables, and rank 0 moves everything it kept on the device to the host in one transfer and writes the row,
the arrays file and the W&B histograms.
The row's `time/stats` is split into `time/stats/<part>` (rank 0): `update` (building c), `quantize`, `describe`,
`communicate` (waiting for the all-to-alls of c and the codes, and the all-gather), `count`, `spread` (the
momenta's all-to-all and their std), `report` (host transfer, arrays file, histograms).
Peak extra memory is about 35 bytes per element of the largest bucket on rank 0, 30 on the others (measured with
2 CPU ranks and a 16M-element bucket), e.g. 2.3 GB for GPT 774M's untied 50257 x 1280 embedding.

`OFF` (stats.every = 0) allocates nothing and runs no tensor operation. Works with every optimizer that keeps
Lion's state: `exp_avg` per parameter (absent = zero) and `betas` per param group (Lion, Lion 32/16-bit, LionCub).
Lion 32/16-bit share the momentum, so their c_i differ only by the local gradients and their spread is 0.
Stochastic quantizers draw from a generator per rank seeded with `stats_seed(seed, rank)` (not checkpointed: a
resumed run draws other noise for the statistics, never for training).

Nodes as voters (`variant.hierarchy: node`, src/engine/sharding.py): a voter is a node, whose update vector c is
sharded over its ranks (each holds `local(p)`'s part of the node's momentum and of the node's mean gradient). The
hook is then built with `group` = the vote group (one rank per node, this rank's local index), `rank` = the node's
index, `world_size` = the nodes, and `node_group` = the node's ranks. Everything above runs unchanged on each
rank's shards over the vote group (buckets are cut by whole-layer sizes, so every rank has the same buckets; the
shards of one local index have equal sizes on every node), and node 0's ranks then sum their per-layer tables to
its first rank (`gather_tables` over `node_group`: counts summed, spread maxima and sums), which reports whole
layers. Node 0's c is described whole: its ranks gather each bucket's shards to its first rank (the whole bucket
on that rank, as flat rank 0 holds it), so medians, fits and histograms are those of whole layers, not combined from
shards. Quantizer scales are per shard, as the node run's reducers scale; the stochastic generator is seeded by the
global rank. With one rank per node every number is bitwise the flat run's.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from src.comm.transport.collectives import all_gather_flat
from src.comm.transport.device import collective_device
from src.optim.lion import update_vector
from src.optim.momentum_sync import named_parameters_with_aliases
from src.optim.shards import local
from src.stats import report
from src.stats.agreement import Shards, code_rows, encode, exchange, gather_tables, shard_counts, shard_spread
from src.stats.config import StatsConfig, selected
from src.stats.distribution import layer_distribution, layout
from src.utils.timing import PhaseTimer


PART = "stats/"  # the timer's sub-phases of "stats", logged as time/stats/<part>


def stats_seed(seed: int, rank: int) -> int:
    return 1_000_003 * (int(seed) + 1) + rank


def buckets(sizes: list[int], limit: int) -> list[list[int]]:
    """Consecutive parameter indices grouped into runs of at most `limit` elements (a larger one alone)."""
    out, current, filled = [], [], 0
    for i, size in enumerate(sizes):
        if current and filled + size > limit:
            out.append(current)
            current, filled = [], 0
        current.append(i)
        filled += size
    return out + ([current] if current else [])


class _Off:
    """stats.every = 0: every call returns at once; no tensor, no file, no collective."""

    seconds = 0.0

    def begin(self, step: int) -> None:
        pass

    def before_step(self) -> None:
        pass

    def after_step(self) -> None:
        pass

    def pop(self) -> dict:
        return {}


OFF = _Off()


class TrainingStats:
    """The statistics of one rank (see the module docstring). `group` is the voters' process group (the
    optimizer's), `rank` and `world_size` this voter's index in it and the voters; `node_group` the ranks that
    share this rank's voter, each holding a shard (None: a voter is one rank with whole parameters)."""

    def __init__(self, config: StatsConfig, model: torch.nn.Module, optimizer, *, rank: int, world_size: int,
                 seed: int, run_dir: Path | None, group=None, node_group=None, wandb_run=None, start_step: int = 0):
        named = named_parameters_with_aliases(model)
        self.config, self.optimizer, self.rank, self.world_size, self.group = config, optimizer, rank, world_size, group
        self.names, self.params = [n for n, _ in named], [p for _, p in named]
        self.numel = [p.numel() for p in self.params]  # whole layers
        self.sizes = [local(p).numel() for p in self.params]  # this rank's elements: its shard in a node
        self.beta1 = {id(p): float(g["betas"][0]) for g in optimizer.param_groups for p in g["params"]}
        self.selected = [i for i, n in enumerate(self.names) if selected(n, config.layers)]
        self.buckets = buckets(self.numel, config.bucket_elements)  # by whole layers: the same on every rank
        self.rows = code_rows(config.quantizers, config.levels)
        row_of = {method: r for r, (method, _) in enumerate(self.rows)}
        self.method_rows = [row_of[m] for m in config.quantizers]
        grouped = world_size > 1 or (dist.is_available() and dist.is_initialized())
        device = self.params[0].device
        self.device = collective_device(group, prefer=device) if grouped else device
        self._join_node(node_group)
        global_rank = rank * self.node_size + self.local_rank  # node-major, as the launchers number ranks
        self.generator = torch.Generator(device=self.device).manual_seed(stats_seed(seed, global_rank))
        self.run_dir, self.wandb_run = run_dir, wandb_run
        self.timer = PhaseTimer(device=self.device)
        self.is_main = rank == 0 and self.local_rank == 0
        if self.is_main and run_dir is not None:
            report.drop_arrays_after(run_dir, start_step)
        self.step, self.due, self.seconds, self._row = 0, False, 0.0, {}
        self._counts: list[torch.Tensor] = []  # per bucket: this rank's shard of the sign counts
        self._local: dict[int, torch.Tensor] = {}  # rank 0: per selected layer, layer_distribution

    def _join_node(self, node_group) -> None:
        """This rank's place in its voter: index and size of `node_group`, and every node rank's shard sizes
        (`node_sizes[local rank][parameter]`, one all-gather); a voter of one rank without it."""
        self.node_group, self.local_rank, self.node_size = node_group, 0, 1
        if node_group is None:
            return
        self.local_rank, self.node_size = dist.get_rank(node_group), dist.get_world_size(node_group)
        mine = torch.tensor(self.sizes, dtype=torch.int64, device=self.device)
        every = torch.empty(self.node_size * mine.numel(), dtype=torch.int64, device=self.device)
        all_gather_flat(every, mine, group=node_group)
        self.node_sizes = every.view(self.node_size, -1).tolist()

    # --- the loop's calls ---------------------------------------------------------------------------------------
    def begin(self, step: int) -> None:
        self.step, self.due, self.seconds, self._row = step, self.config.due(step), 0.0, {}

    @torch.no_grad()
    def before_step(self) -> None:
        if self.due:
            with self.timer.phase("stats"):
                self._measure_updates()

    @torch.no_grad()
    def after_step(self) -> None:
        if not self.due:
            return
        with self.timer.phase("stats"):
            with self.timer.phase(PART + "spread"):
                spread = self._measure_spread()
            with self.timer.phase(PART + "communicate"):
                tables = gather_tables(torch.cat(self._counts), torch.cat(spread), self.group, self.world_size,
                                       dst=self.rank == 0)
                if self.node_group is not None and self.rank == 0:  # node 0's shards: whole layers on its first rank
                    tables = gather_tables(*tables, self.node_group, self.node_size, dst=self.is_main)
            if self.is_main:
                with self.timer.phase(PART + "report"):
                    self._report(*tables)
        self._counts, self._local = [], {}
        times = self.timer.pop()
        self.seconds = times.pop("stats")
        self._row["time/stats"] = self.seconds
        if self.is_main:
            self._row.update({f"time/{name}": seconds for name, seconds in sorted(times.items())})

    def pop(self) -> dict:
        row, self._row = self._row, {}
        return row

    # --- measuring ----------------------------------------------------------------------------------------------
    def _flat(self, bucket: list[int], tensors: list[torch.Tensor | None], length: int) -> torch.Tensor:
        """The bucket's tensors one after another in a float32 vector of `length` elements (zeros after them)."""
        sizes = [self.sizes[i] for i in bucket]
        out = torch.zeros(length, dtype=torch.float32, device=self.device)
        for view, t in zip(out[: sum(sizes)].split(sizes), tensors):
            if t is not None:
                view.copy_(t.reshape(-1))
        return out

    def _momenta(self, bucket: list[int]) -> list[torch.Tensor | None]:
        return [local(self.optimizer.state.get(self.params[i], {}).get("exp_avg")) for i in bucket]

    def _update_vector(self, bucket: list[int], length: int) -> torch.Tensor:
        """c = beta1 * m + (1 - beta1) * g of the bucket's parameters (float32, flat, zero padded to `length`)."""
        c = self._flat(bucket, self._momenta(bucket), length)  # m (zero where absent), then c in place
        sizes = [self.sizes[i] for i in bucket]
        for i, view in zip(bucket, c[: sum(sizes)].split(sizes)):
            grad = local(self.params[i].grad)
            grad = torch.zeros_like(view) if grad is None else grad.reshape(-1).to(device=self.device,
                                                                                    dtype=torch.float32)
            update_vector([view], [grad], self.beta1[id(self.params[i])], out=[view])
        return c

    def _shards(self, bucket: list[int]) -> tuple[list[int], Shards]:
        sizes = [self.sizes[i] for i in bucket]
        return sizes, Shards(sum(sizes), self.world_size, self.rank)

    def _whole(self, bucket: list[int], c: torch.Tensor) -> list[torch.Tensor] | None:
        """Node 0's ranks: the bucket's c per layer, whole, on its first rank (None on the others): each rank's
        shards, padded to the longest, gathered there and joined in local-rank order (FSDP2's dim-0 shards)."""
        sizes = [[of_rank[i] for i in bucket] for of_rank in self.node_sizes]
        longest = max(sum(s) for s in sizes)
        send = torch.zeros(longest, dtype=c.dtype, device=c.device)
        send[: c.numel()].copy_(c)
        parts = [torch.empty_like(send) for _ in range(self.node_size)] if self.is_main else None
        dist.gather(send, parts, group=self.node_group, group_dst=0)
        if not self.is_main:
            return None
        pieces = [part[: sum(s)].split(s) for part, s in zip(parts, sizes)]
        return [torch.cat([p[k] for p in pieces]) for k in range(len(bucket))]

    def _describe(self, bucket: list[int], c: torch.Tensor) -> None:
        """Rank 0 (node 0's ranks with nodes as voters): the distribution of its c for each selected layer of the
        bucket."""
        cfg, keep = self.config, set(self.selected)
        if not keep.intersection(bucket):
            return
        views = c.split([self.sizes[i] for i in bucket]) if self.node_group is None else self._whole(bucket, c)
        for i, view in zip(bucket, views or []):
            if i in keep:
                self._local[i] = layer_distribution(view, bins=cfg.bins, range_=cfg.range, log10_min=cfg.log10_min,
                                                    log10_max=cfg.log10_max, fit_samples=cfg.fit_samples,
                                                    generator=self.generator)

    def _measure_updates(self) -> None:
        self._counts, self._local = [], {}
        phase = self.timer.phase
        for bucket in self.buckets:
            sizes, shards = self._shards(bucket)
            with phase(PART + "update"):
                c = self._update_vector(bucket, shards.padded)
            with phase(PART + "quantize"):
                codes = encode(c[: shards.numel], self.rows, sizes, shards, self.generator)
            received_c, work_c = exchange(c.view(self.world_size, shards.size), self.group, self.world_size)
            received_codes, work_codes = exchange(codes, self.group, self.world_size)
            if self.rank == 0:
                with phase(PART + "describe"):
                    self._describe(bucket, c[: shards.numel])
            with phase(PART + "communicate"):
                for work in (work_c, work_codes):
                    if work is not None:
                        work.wait()
            with phase(PART + "count"):
                self._counts.append(shard_counts(received_c, received_codes, shards, sizes, self.rows))

    def _measure_spread(self) -> list[torch.Tensor]:
        """Per bucket, this rank's shard of (layers, 2): [max, sum] over elements of the momentum std across
        ranks."""
        spread = []
        for bucket in self.buckets:
            sizes, shards = self._shards(bucket)
            momenta = self._flat(bucket, self._momenta(bucket), shards.padded)
            received, work = exchange(momenta.view(self.world_size, shards.size), self.group, self.world_size)
            if work is not None:
                work.wait()
            spread.append(shard_spread(received, shards, sizes))
        return spread

    def _report(self, agreement: torch.Tensor, spread: torch.Tensor) -> None:
        """One device-to-host transfer, then the row, the arrays file and the W&B histograms (rank 0)."""
        n_all, n_sel = len(self.params), len(self.selected)
        parts = [agreement.double().reshape(-1), spread.reshape(-1)] + [self._local[i] for i in self.selected]
        host = torch.cat(parts).cpu().numpy()
        a_size, s_size = agreement.numel(), 2 * n_all
        width = layout(self.config.bins)["log10_abs"].stop
        measured = report.Measured(
            step=self.step, world_size=self.world_size, names=self.names, numel=np.array(self.numel, np.int64),
            selected=self.selected, methods=list(self.config.quantizers), method_rows=self.method_rows,
            agreement=host[:a_size].reshape(agreement.shape), spread=host[a_size:a_size + s_size].reshape(n_all, 2),
            local=host[a_size + s_size:].reshape(n_sel, width))
        arrays = report.arrays(measured, self.config)
        self._row = report.row(arrays)
        if self.run_dir is not None:
            report.write_arrays(self.run_dir, arrays)
        if self.wandb_run is not None:
            report.log_histograms(self.wandb_run, arrays)


def make_stats(config: StatsConfig, model: torch.nn.Module, optimizer, **kwargs) -> TrainingStats | _Off:
    """`OFF` when statistics are off (nothing is built), else the hook (keyword arguments of TrainingStats)."""
    return TrainingStats(config, model, optimizer, **kwargs) if config.on else OFF
