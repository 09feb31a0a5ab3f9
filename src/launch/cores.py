"""Each emulated host's share of this machine's cores, and each rank's thread count (Lion Cub, Section 7: every
node of the paper's cluster has its own CPUs).

`plan(nodes, nproc_per_node, cpus)` splits the usable cores (this process's affinity) into `nodes` disjoint,
equal, contiguous shares; cores left over by the division stay idle, so every host gets as many as the others.
Each rank runs `len(share) // nproc_per_node` threads (at least one). With more hosts than cores the hosts take
cores in turn and share them; with more ranks than cores the ranks of a host share its cores; `CoreShare.note`
then says so in one line. The emulator pins each host's torchrun (and so its ranks) to its share with `taskset`
and hands the thread count to the ranks (OMP_NUM_THREADS, and SHARE_VAR for `src.distributed.threads`).
Deliberate difference from a real cluster: the hosts still share the memory bandwidth and the last-level cache.
"""
from __future__ import annotations

from dataclasses import dataclass

from src.utils.machine import SHARE_VAR, usable_cpus  # noqa: F401  (SHARE_VAR: the variable the emulator sets)


@dataclass(frozen=True)
class CoreShare:
    hosts: tuple[tuple[int, ...], ...]   # each host's cores
    nproc_per_node: int
    usable: tuple[int, ...]              # the cores there were to share

    @property
    def threads_per_rank(self) -> int:
        return max(1, len(self.hosts[0]) // self.nproc_per_node)

    @property
    def shared(self) -> bool:
        """Whether ranks share cores (more ranks in all than usable cores)."""
        return len(self.hosts) * self.nproc_per_node > len(self.usable)

    @property
    def idle(self) -> tuple[int, ...]:
        used = {c for host in self.hosts for c in host}
        return tuple(c for c in self.usable if c not in used)

    def describe(self) -> str:
        hosts = ", ".join(f"h{i} {cpu_list(h)}" for i, h in enumerate(self.hosts))
        idle = f"; core(s) {cpu_list(self.idle)} left idle so the hosts' shares are equal" if self.idle else ""
        threads = self.threads_per_rank
        return f"each host's cores: {hosts}; {threads} thread{'s' if threads > 1 else ''} per rank{idle}"

    def note(self) -> str | None:
        """One line when ranks share cores, saying what that does to timings; None otherwise."""
        if not self.shared:
            return None
        ranks, cores = len(self.hosts) * self.nproc_per_node, len(self.usable)
        return (f"{len(self.hosts)} hosts x {self.nproc_per_node} ranks = {ranks} ranks on {cores} core(s): ranks "
                f"will share cores (one thread each), so their local work (model, quantize, pack) runs up to "
                f"{-(-ranks // cores)}x slower than on hosts with a core per rank, and the timings are not a real "
                "cluster's")


def plan(nodes: int, nproc_per_node: int, cpus: tuple[int, ...] | list[int] | None = None) -> CoreShare:
    cpus = tuple(sorted(cpus if cpus is not None else usable_cpus()))
    if nodes < 1 or nproc_per_node < 1 or not cpus:
        raise ValueError(f"nodes={nodes}, nproc_per_node={nproc_per_node} and the {len(cpus)} cores must be >= 1")
    if nodes <= len(cpus):
        per = len(cpus) // nodes
        hosts = tuple(cpus[i * per:(i + 1) * per] for i in range(nodes))
    else:
        hosts = tuple((cpus[i % len(cpus)],) for i in range(nodes))
    return CoreShare(hosts=hosts, nproc_per_node=nproc_per_node, usable=cpus)


def cpu_list(cpus) -> str:
    """`taskset -c` form: ranges joined by commas (0-3,8)."""
    cpus, parts, i = sorted(cpus), [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        parts.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(parts)
