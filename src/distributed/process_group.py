"""All process-group setup in one place (Lion Cub, Section 7: data-parallel workers over NCCL or gloo).

`describe()` reads the launcher's environment (torchrun's RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE; without
them, Slurm's SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_NUM_TASKS, ... of a job step started by srun or Hydra's submitit
launcher, with the master address from the step's node list, see src.distributed.slurm_env; a plain
`python -m src.train` is one process), picks the device and backend, and checks every constraint up front with a
message that names the numbers (in the spirit of torchtitan's ParallelDims). It has no side effects, so a bad
launch fails before anything starts. `init_process_group()` then applies the `network` config's environment (e.g.
Section 7's Ethernet setting, NCCL_IB_DISABLE=1) and the rank's thread count (src.distributed.threads: the emulated
cluster's share of the cores, or a warning when local ranks would oversubscribe them) and starts the group.

Backend: NCCL on CUDA, gloo on CPU. `network=local` pins gloo to the loopback interface and CPU tensors (gloo's CUDA
path lacks the all-to-all the 1-bit allreduce needs). A single process whose optimizer communicates (Lion 32-bit,
Lion Cub) gets a one-rank group on an in-memory store, so the variant runs its real code path without a launcher.
Under torchrun, every group (one per sweep point of a multirun, one per restart attempt) gets keys of its own in
torchrun's store, and `shutdown()` destroys it, with every subgroup, at the end of each run, and checks that they
are gone (src.distributed.lifetime: a group that outlives its run keeps gloo's threads into the interpreter's exit,
where they can abort it); the run releases what holds its groups (DDP, reducers, hooks) before.
"""
from __future__ import annotations

import os
import socket
import weakref
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psutil
import torch
import torch.distributed as dist

from src.comm.transport.device import collective_device
from src.comm.cost.network import Network
from src.distributed.lifetime import check_ended, gloo_workers, import_before_any_group, release_dtensor_caches
from src.distributed.slurm_env import slurm_launch_env
from src.distributed.threads import apply_thread_share
from src.errors import SetupError


@dataclass(frozen=True)
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    backend: str  # "gloo" | "nccl"
    network: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def num_nodes(self) -> int:
        return max(1, -(-self.world_size // self.local_world_size))


def _int_env(environ: Mapping[str, str], key: str) -> int:
    try:
        return int(environ[key])
    except ValueError:
        raise SetupError(f"environment variable {key}={environ[key]!r} is not an integer") from None


def read_launch_env(environ: Mapping[str, str]) -> tuple[int, int, int, int]:
    """(rank, local_rank, world_size, local_world_size) from torchrun's variables, else from Slurm's inside a job
    step (src.distributed.slurm_env); one process when neither is there."""
    if "WORLD_SIZE" not in environ and "RANK" not in environ:
        environ = slurm_launch_env(environ)  # one srun task per rank (submitit), else one plain process
        if not environ:
            return 0, 0, 1, 1
    missing = [k for k in ("RANK", "WORLD_SIZE") if k not in environ]
    if missing:
        present = "RANK" if "RANK" in environ else "WORLD_SIZE"
        raise SetupError(f"{' and '.join(missing)} not set while {present} is: launch with torchrun, which sets "
                         "RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE")
    rank, world = _int_env(environ, "RANK"), _int_env(environ, "WORLD_SIZE")
    local_rank = _int_env(environ, "LOCAL_RANK") if "LOCAL_RANK" in environ else rank
    local_world = _int_env(environ, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in environ else world
    if world < 1 or not 0 <= rank < world:
        raise SetupError(f"RANK={rank} must lie in [0, WORLD_SIZE={world})")
    if not 1 <= local_world <= world or not 0 <= local_rank < local_world:
        raise SetupError(f"LOCAL_RANK={local_rank} must lie in [0, LOCAL_WORLD_SIZE={local_world}) and "
                         f"LOCAL_WORLD_SIZE must lie in [1, WORLD_SIZE={world}]")
    return rank, local_rank, world, local_world


def choose_device(requested: str, network: Network, local_rank: int, local_world: int,
                  cuda_devices: int | None = None) -> torch.device:
    """The device of this rank (`requested`: auto, cpu or cuda, as the schema typed it); every impossible
    combination is a SetupError naming the numbers. `cuda_devices`: the GPUs of the node the rank runs on (None:
    this machine's)."""
    backend, name = network.backend, network.name
    cuda_ok = torch.cuda.is_available() if cuda_devices is None else cuda_devices > 0
    if requested == "cuda" and not cuda_ok:
        raise SetupError("device=cuda but torch.cuda.is_available() is False; use device=cpu (or device=auto)")
    if requested == "cuda" and backend == "gloo":
        raise SetupError(f"network={name} uses gloo, which lioncub runs on CPU tensors only (gloo has no CUDA "
                         "all-to-all); use device=cpu, or network=ethernet/infiniband for NCCL on GPUs")
    if backend == "nccl" and (requested == "cpu" or not cuda_ok):
        raise SetupError(f"network={name} asks for NCCL, which needs CUDA, but the device is CPU "
                         f"(device={requested}, CUDA available: {cuda_ok}); use network=local on CPU")
    use_cuda = requested == "cuda" or (requested == "auto" and cuda_ok and backend != "gloo")
    if not use_cuda:
        return torch.device("cpu")
    count = torch.cuda.device_count() if cuda_devices is None else cuda_devices
    if local_world > count:
        raise SetupError(f"{local_world} processes on this node (LOCAL_WORLD_SIZE) but only {count} CUDA device(s) "
                         f"visible (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); launch "
                         f"torchrun --nproc_per_node {count} or fewer")
    return torch.device("cuda", local_rank)


def check_link(network: Network, environ: Mapping[str, str]) -> None:
    """A network with `emulated_link: true` (the paper-equivalent links) needs the link its launcher builds."""
    if network.emulated_link and not environ.get("LIONCUB_LINK_RATE"):
        name = network.name
        raise SetupError(f"network={name} is an emulated link that this launch did not build; start the run with "
                         f"python -m src.launch.paper_link network={name} nodes=2 nproc_per_node=2 -- <overrides> "
                         "(root: network namespaces), or use network=local")


def describe(device: str, network: Network, environ: Mapping[str, str] | None = None) -> DistContext:
    """Check the launch and return this rank's context; starts nothing."""
    environ = os.environ if environ is None else environ
    check_link(network, environ)
    rank, local_rank, world, local_world = read_launch_env(environ)
    dev = choose_device(device, network, local_rank, local_world)
    return DistContext(rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world,
                       device=dev, backend="nccl" if dev.type == "cuda" else "gloo",
                       network=network.name)


def job_context(device: str, network: Network, world_size: int, local_world_size: int,
                gpus_per_node: int) -> DistContext:
    """Rank 0's context in a job that will run elsewhere (a Slurm job: `world_size` ranks, `local_world_size` per
    node of `gpus_per_node` GPUs), checked as `describe` checks this machine's; starts nothing."""
    dev = choose_device(device, network, 0, local_world_size, cuda_devices=gpus_per_node)
    return DistContext(rank=0, local_rank=0, world_size=world_size, local_world_size=local_world_size, device=dev,
                       backend="nccl" if dev.type == "cuda" else "gloo", network=network.name)


def loopback_interface() -> str | None:
    """Name of the interface holding 127.0.0.1 (`lo` on Linux, `lo0` on macOS), or None."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addrs):
            return name
    return None


def apply_network_env(network: Network, environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set the network's environment variables (before the group starts); return what was set."""
    environ = os.environ if environ is None else environ
    applied = {str(k): str(v) for k, v in (network.env or {}).items()}
    if network.loopback and "GLOO_SOCKET_IFNAME" not in environ:
        iface = loopback_interface()
        if iface:
            applied["GLOO_SOCKET_IFNAME"] = iface
    for key, value in applied.items():
        if environ.get(key, value) != value:
            print(f"lioncub: network={network.name} sets {key}={value} (was {environ[key]})", flush=True)
        environ[key] = value
    return applied


_workers_at_start: int | None = None  # gloo worker threads of this process before its group started


def init_process_group(ctx: DistContext, network: Network, run_index: int = 0) -> dict[str, str]:
    """Apply the network environment and start the process group; returns the variables it set. `run_index`
    numbers the runs this process starts (a multirun's sweep points, the same on every rank): it names the group's
    keys in torchrun's store."""
    if "RANK" not in os.environ and "WORLD_SIZE" not in os.environ:
        os.environ.update(slurm_launch_env(os.environ))  # srun/submitit tasks: the rendezvous torchrun would give
    applied = apply_network_env(network)
    apply_thread_share()
    import_before_any_group()  # modules that would hold the group in their defaults (src.distributed.lifetime)
    global _workers_at_start
    _workers_at_start = gloo_workers()
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)
    timeout = timedelta(seconds=network.timeout_s)
    device_id = ctx.device if ctx.device.type == "cuda" else None
    if ctx.world_size == 1 and "MASTER_ADDR" not in os.environ:
        dist.init_process_group(ctx.backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout,
                                device_id=device_id)
    else:
        dist.init_process_group(ctx.backend, rank=ctx.rank, world_size=ctx.world_size, timeout=timeout,
                                device_id=device_id, store=_attempt_store(timeout, run_index))
    return applied


def launcher_store(timeout: timedelta = timedelta(seconds=600)):
    """torchrun's key-value store (a client of it), or None without torchrun; usable before any process group."""
    if os.environ.get("TORCHELASTIC_RESTART_COUNT") is None or "MASTER_ADDR" not in os.environ:
        return None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world, timeout=timeout))
    return store


def _attempt_store(timeout: timedelta, run_index: int):
    """Under torchrun, the launcher's store with a prefix of its own per attempt and per run (None elsewhere).

    torchrun keeps its store across `--max-restarts` restarts, and a Hydra multirun starts one group per sweep point
    in the same processes: a group that found the keys of an earlier one would read addresses whose sockets are
    closed (gloo: "Connection refused", or a hang). The prefix names the attempt (TORCHELASTIC_RESTART_COUNT) and
    the run (`run_index`, the same on every rank).
    """
    store = launcher_store(timeout)
    if store is None:
        return None
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    return dist.PrefixStore(f"lioncub/attempt_{attempt}/run_{run_index}", store)


def barrier() -> None:
    """Wait for every rank (nothing without a multi-rank group)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def shutdown() -> None:
    """Destroy every process group (the default one and its subgroups) and check that none is left alive
    (src.distributed.lifetime.check_ended raises GroupOutlived, naming what holds one). Call it once the objects
    that hold the groups (DDP, reducers, hooks) are released."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    release_dtensor_caches()  # FSDP2's DTensors cached the node's mesh, which holds its groups
    world = weakref.ref(dist.group.WORLD)
    dist.destroy_process_group()
    check_ended(world, _workers_at_start)


def broadcast_object(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (identity without a multi-rank group)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, device=collective_device())
    return box[0]


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (a one-element list without a multi-rank group)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
