"""A pool of real gloo ranks for the tests: `DistPool(world_size).run(fn, *args)` runs `fn` on every rank (NCCL ranks,
one per GPU, where LIONCUB_TEST_DEVICE=cuda: the conformance suite on a GPU, src/bench/gpu_check/conformance.py).

Spawning processes and importing torch costs seconds, so each world size gets one pool of long-lived workers for
the whole session. `fn` must be a module-level (picklable) function; it receives its arguments and runs inside an
initialised gloo process group (`torch.distributed.get_rank()` tells the rank). `run` returns the per-rank return
values in rank order, or raises `RankError` with every failing rank's traceback. A pool whose ranks hang (one
raised while the others wait in a collective) is torn down; the fixture builds a fresh one on next use.
"""
from __future__ import annotations

import os
import queue
import tempfile
import traceback
from datetime import timedelta

import torch.multiprocessing as mp


class RankError(RuntimeError):
    def __init__(self, failures: dict[int, str]):
        self.failures = failures
        lines = [f"--- rank {r} ---\n{tb}" for r, tb in sorted(failures.items())]
        super().__init__("distributed task failed on rank(s) " + ", ".join(map(str, sorted(failures))) + "\n"
                         + "\n".join(lines))


def _worker(rank: int, world_size: int, init_file: str, tasks, results) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    backend = "gloo"
    if os.environ.get("LIONCUB_TEST_DEVICE") == "cuda":  # the suite on GPUs (make gpu-check): one per rank, NCCL
        torch.cuda.set_device(rank)
        backend = "nccl"
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    while True:
        item = tasks.get()
        if item is None:
            break
        fn, args, kwargs = item
        try:
            results.put((rank, True, fn(*args, **kwargs)))
        except BaseException:  # noqa: BLE001 - report everything to the parent
            results.put((rank, False, traceback.format_exc()))
    dist.destroy_process_group()


class DistPool:
    def __init__(self, world_size: int, timeout: float = 180.0):
        self.world_size, self.timeout, self.broken = world_size, timeout, False
        ctx = mp.get_context("spawn")
        fd, self.init_file = tempfile.mkstemp(prefix="lioncub_gloo_")
        os.close(fd)
        os.unlink(self.init_file)
        self.tasks = [ctx.Queue() for _ in range(world_size)]
        self.results = ctx.Queue()
        self.procs = [ctx.Process(target=_worker, args=(r, world_size, self.init_file, self.tasks[r], self.results),
                                  daemon=True) for r in range(world_size)]
        for p in self.procs:
            p.start()

    def run(self, fn, *args, **kwargs) -> list:
        if self.broken:
            raise RuntimeError("this pool is broken; build a new one")
        for q in self.tasks:
            q.put((fn, args, kwargs))
        values, failures, wait = {}, {}, self.timeout
        while len(values) + len(failures) < self.world_size:
            try:
                rank, ok, value = self.results.get(timeout=wait)
            except queue.Empty:
                self.close(force=True)
                missing = sorted(set(range(self.world_size)) - set(values) - set(failures))
                failures.update({r: "no answer (hung in a collective or died)" for r in missing})
                break
            (values if ok else failures)[rank] = value
            if failures:
                wait = 10.0  # the others are likely stuck in a collective with the failed rank
        if failures:
            raise RankError(failures)
        return [values[r] for r in range(self.world_size)]

    def close(self, force: bool = False) -> None:
        self.broken = True
        for q, p in zip(self.tasks, self.procs):
            if not force and p.is_alive():
                q.put(None)
        for p in self.procs:
            p.join(timeout=0 if force else 10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        if os.path.exists(self.init_file):
            os.unlink(self.init_file)
