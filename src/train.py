"""Entry point: `python -m src.train [+exp=PRESET] [overrides]`, or under `torchrun` for several processes.

Trains one of Section 7's setups of the Lion Cub paper (GPT-2++ on OpenWebText, ResNet-18 / DeiT on CIFAR100) with
one of the optimizer variants (Lion 32/16-bit, Lion Cub 8/4/1-bit, distributed Lion). The configuration is Hydra's
(conf/config.yaml, groups model, data, variant, optim, network, logger, presets in conf/exp/ chosen with +exp=).
`-m` (Hydra multirun) sweeps, alone or under torchrun: the runs of a sweep go into one sweep folder, each labelled
by the overrides that differ between them (hydra_plugins/lioncub_sweeper). `python src/train.py` works too.

Exit status (rank 0 prints why; under torchrun, torchrun's report shows it as the worker's `exitcode`, and the line
as the root cause at the end of its report; `python -m src.launch.torchrun`, torchrun with the same arguments,
prints the line and exits with the status after torchrun's report, see src.launch.torchrun):
- 0: trained (or a resumed run had nothing left to do);
- 2: the configuration cannot train, or torch is older than src.compat.MIN_TORCH: every problem is printed once, by
  rank 0, before any process group, run folder or training step exists (other ranks wait a moment, then exit
  quietly unless rank 0 did not fail);
- 3: stopped by the replica guard or by a non-finite step under `nonfinite.policy=stop` (src.reliability);
- 75: interrupted by SIGTERM, SIGINT (Ctrl-C) or SIGUSR1 (Slurm's warning signal): every rank finished its step,
  a checkpoint of it was written, and rank 0 printed `interrupted at step N; resume with: <command>`
  (src.reliability.signals; 75 is EX_TEMPFAIL, "try again later");
- 130: Ctrl-C while not training (while starting, between the runs of a sweep): nothing to checkpoint;
- 1: anything else, e.g. a process group still alive after the run was written (src.distributed.lifetime: rank 0
  prints what holds it), or a rank that died (`python -m src.launch.torchrun` then says which, and what the run
  left).
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

EXIT_FAILED, EXIT_SETUP, EXIT_STOPPED, EXIT_CTRL_C = 1, 2, 3, 130


def _quit_before_training(signum, frame) -> None:
    if os.environ.get("RANK", "0") == "0":
        os.write(2, b"lioncub: interrupted while not training (nothing to checkpoint)\n")
        from src.errors import record_exit

        record_exit("lioncub: interrupted while not training (nothing to checkpoint)", EXIT_CTRL_C)
    raise SystemExit(EXIT_CTRL_C)


if __name__ == "__main__":  # a run starts: a Ctrl-C while importing or starting exits 130 without a traceback
    signal.signal(signal.SIGINT, _quit_before_training)  # (training installs its own: src.reliability.signals)
if __package__ in (None, ""):  # `python src/train.py`: import the repository as `src`, not the src folder's modules
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from src.compat import TorchTooOld, check_torch  # noqa: E402
from src.data.errors import DataError  # noqa: E402
from src.distributed.lifetime import GroupOutlived  # noqa: E402
from src.engine.run import execute, paper_size_note, preflight  # noqa: E402
from src.errors import SetupError, exit_with_setup_error, record_exit  # noqa: E402
from src.reliability.guard import ReplicaDivergenceError  # noqa: E402
from src.reliability.nonfinite import NonFiniteStepError  # noqa: E402
from src.reliability.signals import EXIT_INTERRUPTED, Interrupted  # noqa: E402
from src.runlog.command import resume_command, sweep_resume_command  # noqa: E402


def quiet_cuda_home_warning() -> None:
    """A CUDA build of torch on a machine without CUDA logs "No CUDA runtime is found, using CUDA_HOME=..." from
    every rank when torch.compile first loads its C++ toolchain; nothing here uses CUDA."""
    import logging

    import torch

    if not torch.cuda.is_available():
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


def skip_final_collection() -> None:
    """Move every live object to the collector's permanent generation, once the run is over: the interpreter's
    exit then skips a full collection over the millions of objects torch, sympy and Hydra have made (about 2 s a
    rank, 4 s of a 4-rank run on 2 cores). Objects are still freed by their reference counts; what the run wrote is
    closed by then."""
    import gc

    gc.freeze()


def task_overrides(hydra_cfg) -> list[str]:
    """This run's overrides (a sweep point's own, in a multirun), as a later command would repeat them."""
    return [*hydra_cfg.overrides.hydra, *hydra_cfg.overrides.task]


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    choices = dict(hydra_cfg.runtime.choices)
    overrides = list(hydra_cfg.overrides.task)
    try:
        check_torch()  # one line naming both versions where torch is older than src.compat.MIN_TORCH
        plan = preflight(cfg, choices)
    except (SetupError, DataError, TorchTooOld) as exc:
        exit_with_setup_error(f"cannot start training: {exc}", EXIT_SETUP)
    note = paper_size_note(cfg, plan.ctx.world_size, choices)
    if note and plan.ctx.is_main:
        print(f"lioncub: note: {note}", flush=True)

    def report_interrupt(exc: Interrupted) -> None:  # rank 0, before any rank leaves
        print(f"lioncub: {signal.Signals(exc.signum).name} received; checkpoint of step {exc.step} in "
              f"{exc.checkpoint}", flush=True)
        line = (f"lioncub: interrupted at step {exc.step}; resume with: "
                f"{resume_command(task_overrides(hydra_cfg), exc.checkpoint.parent.parent)}")
        print(line, flush=True)
        record_exit(line, EXIT_INTERRUPTED)
        if plan.job.run.sweep:
            print("lioncub: or run the whole sweep on (finished runs are skipped, the others resume): "
                  f"{sweep_resume_command(cfg.run.sweep)}", flush=True)

    def report_stop(exc: Exception) -> None:  # rank 0, before any rank leaves
        print(f"lioncub: training stopped: {exc}", file=sys.stderr, flush=True)
        record_exit(f"lioncub: training stopped: {exc}", EXIT_STOPPED)

    try:
        execute(cfg, plan, overrides, run_index=int(OmegaConf.select(hydra_cfg, "job.num", default=0) or 0),
                report_interrupt=report_interrupt, report_stop=report_stop)
    except (SetupError, DataError) as exc:  # e.g. a checkpoint whose data position belongs to another seed
        exit_with_setup_error(f"cannot continue: {exc}", EXIT_SETUP)
    except (ReplicaDivergenceError, NonFiniteStepError):  # reported by rank 0 in execute
        sys.exit(EXIT_STOPPED)
    except Interrupted:
        sys.exit(EXIT_INTERRUPTED)
    except GroupOutlived as exc:  # every rank; the run's outputs are complete
        if plan.ctx.is_main:
            print(f"lioncub: the run is written, but {exc}", file=sys.stderr, flush=True)
            record_exit(f"lioncub: the run is written, but {exc}", EXIT_FAILED)
        sys.exit(EXIT_FAILED)


def command_line(args: list[str]) -> list[str]:
    """`args` as Hydra is to read them (src.engine.overrides): SetupError naming every missing preset or option, in
    one line, and each plain override of an unknown key written `++key=value`, for the schema's "did you mean"."""
    from src.engine.overrides import group_problems, with_schema_keys

    problems = group_problems(args)
    if problems:
        raise SetupError("; ".join(problems))
    return with_schema_keys(args)


def check_command_line() -> None:
    """Before Hydra reads the command line: a missing preset or option is one line (exit 2), and a plain override
    of an unknown key goes on to the schema's "did you mean" (`command_line`; src.launch.torchrun checks the same
    command line before it starts any rank)."""
    try:
        sys.argv[1:] = command_line(sys.argv[1:])
    except SetupError as exc:
        exit_with_setup_error(f"cannot start training: {exc}", EXIT_SETUP)


if __name__ == "__main__":
    check_command_line()
    quiet_cuda_home_warning()
    try:
        main()
    finally:
        skip_final_collection()
