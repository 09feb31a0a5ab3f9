"""`make gpu-check` and `make gpu-bench`: what only a real CUDA GPU can show about lioncub, in one command and one
report each.

    python -m src.bench.gpu_check --out DIR [--suite check|bench] [--only SECTION ...] [--budget-s S] [--reuse R]
    python -m src.bench.gpu_check.session --out OUT      # one call on a lent GPU: wheels, bench, check (docs/gpu.md)

On a machine with CUDA GPUs it runs the sections below, each in its own process under its own time budget (the
check within 10 minutes on one H100, the bench, `device` and `phases`, within 3), and writes DIR/report.md and
DIR/report.json: the sections, then the goals (each figure beside its reference, their ratio and a mark) and
Table A.1 projected (src/bench/gpu_check/goals.py, projected.py). Every figure names its measurement; the report
names the device it ran on (GPU, memory, driver, torch, CUDA, NCCL and Triton versions).

| section    | what it shows (Lion Cub paper section)                                                           |
|------------|--------------------------------------------------------------------------------------------------|
| device     | the device description; NCCL present                                                             |
| phases     | each variant's optimizer step on the 774M GPT (Table A.1's update column) with no-op collectives  |
|            | and with a one-rank NCCL group: GPU and host time, launches and collectives per step, beside the  |
|            | copy-bandwidth floor of its bytes; the peers (foreach Lion, lion-pytorch, fused AdamW) alike     |
| codecs     | every codec kernel (Section 6) on each GPU backend (torch, triton) against the CPU's torch        |
|            | reference, within a bound stated per output (src/bench/gpu_check/tolerance.py)                   |
| conformance| tests/test_conformance.py's properties, run by pytest with every rank on a GPU over NCCL: every  |
|            | registered reducer and quantizer, the Triton kernels compiled, syncs counted by CUDA, and each    |
|            | reducer's direction against the CPU's within the bound it states (src/bench/gpu_check/conformance.py) |
| training   | `python -m src.train` on CUDA + NCCL for every variant (overlap too): checkpoint and resume       |
|            | bitwise, a CPU checkpoint resumed on the GPU, the replica guard, the non-finite vote (skip, stop)  |
| syncs      | host synchronisations per steady-state step (after the warm-up, outside the injected fault),      |
|            | counted by CUDA (`torch.cuda.set_sync_debug_mode`) in those runs, against the budget of 1         |
| fwdbwd     | forward and backward of the 774M GPT at the paper's batch of 12, eager and `torch.compile`d,      |
|            | beside Table A.1                                                                                 |
| memory     | peak allocated and reserved bytes per parameter of each variant's step (Fig. A.1), 774M and 1558M |
| throughput | encode/decode GB/s of each codec beside the measured copy bandwidth (src.bench.core_throughput)  |

Exit status: 0 every section passed; 1 a check failed, or a section failed, raised or ran out of time (the report
says which; the other sections still ran; the goals are figures, never part of the status); 2 bad arguments, or a
torch older than src.compat.MIN_TORCH (one line naming both versions); 3 not run: no CUDA device (one line, nothing
written).

How to run it on a GPU machine without network (wheels built beforehand, `make gpu-wheels`): docs/gpu.md.
Deliberate differences from the paper's measurements: the paper timed 2 nodes of 4 H100s with the wire included;
the steps here exclude the wire (no-op collectives) or run it on one rank, so what the optimizer itself costs is
measured, on one GPU; Table A.1 projected adds the paper's own communication column back.
"""
EXIT_PASSED, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_RUN = 0, 1, 2, 3
