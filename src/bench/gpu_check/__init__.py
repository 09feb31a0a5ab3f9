"""`make gpu-check`: what only a real CUDA GPU can show about lioncub, in one command and one report.

    python -m src.bench.gpu_check --out DIR [--only SECTION ...] [--budget-s 570]

On a machine with CUDA GPUs it runs the sections below, each in its own process under its own time budget (the
whole, within 10 minutes on one H100), and writes DIR/report.md and DIR/report.json. Every figure names its
measurement; the report names the device it ran on (GPU, memory, driver, torch, CUDA, NCCL and Triton versions).

| section    | what it shows (Lion Cub paper section)                                                           |
|------------|--------------------------------------------------------------------------------------------------|
| device     | the device description; NCCL present                                                             |
| codecs     | every codec kernel (Section 6), compiled (Triton) and eager on CUDA, bitwise equal to CPU eager   |
| reducers   | every `make_reducer` name on an NCCL group (world size 1; 2 and 4 where there are GPUs) against   |
|            | the gloo/CPU result of the same inputs                                                           |
| training   | `python -m src.train` on CUDA + NCCL for every variant (overlap too): checkpoint and resume       |
|            | bitwise, a CPU checkpoint resumed on the GPU, the replica guard, the non-finite vote (skip, stop)  |
| syncs      | host synchronisations per steady-state step, counted by CUDA (`torch.cuda.set_sync_debug_mode`)   |
|            | in those runs, against the budget of 1 the CPU double enforces; each one with its stack          |
| memory     | peak allocated and reserved bytes per parameter of each variant's step (Fig. A.1), beside         |
|            | src.bench.memory's accounting of the same step                                                    |
| phases     | the optimizer's own phases on the 774M GPT with no-op collectives, CUDA events, median of 20      |
|            | steps, beside Table A.1's update column and the copy-bandwidth limit of the bytes they move       |
| fwdbwd     | forward and backward of the 774M GPT at the paper's batch of 12, beside Table A.1                |
| throughput | encode/decode GB/s of each codec beside the measured copy bandwidth (src.bench.core_throughput)  |

Exit status: 0 every section passed; 1 a check failed, or a section failed, raised or ran out of time (the report
says which; the other sections still ran); 2 bad arguments, or a torch older than src.compat.MIN_TORCH (one
line naming both versions); 3 not run: no CUDA device (one line, nothing written).

How to run it on a GPU machine without network (wheels built beforehand, `make gpu-wheels`): docs/gpu.md.
Deliberate differences from the paper's measurements: the paper timed 2 nodes of 4 H100s with the wire included;
the phases here exclude the wire (no-op collectives) so what the optimizer itself costs is measured, on one GPU.
"""
EXIT_PASSED, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_RUN = 0, 1, 2, 3
