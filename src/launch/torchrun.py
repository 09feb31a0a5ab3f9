"""`python -m src.launch.torchrun [torchrun's arguments]`: torchrun that ends with lioncub's line and exit status.

    python -m src.launch.torchrun --standalone --nproc_per_node 2 -m src.train +exp=demo

When a run cannot start (exit 2: configuration), is interrupted (75: a stop signal, checkpoint written), stops on a
guard (3) or is interrupted while not training (130), plain torchrun ends with its own report of about 40 lines
(`ChildFailedError` or `SignalException`, a traceback, every worker's exit code) and exits 1. This launcher runs
the same torchrun in this process (`torch.distributed.run.run`, the same arguments, the same agent, the workers
its children), prints torchrun's report without the launcher's traceback, and then, last, the line rank 0 left for
it (src.errors.record_exit, through the file named by LIONCUB_EXIT_FILE) with the exit status and its meaning, and
exits with that status (2, 3, 75, 130). A rank that ended otherwise, without a line (a signal, a crash, an abort at
interpreter exit after the run was written), makes the job a failure (exit 1) whatever the run wrote, and the last
line says what finished and what did not (src.launch.exit_report: which rank ended how, whether the run folder
rank 0 opened last is complete, its last checkpoint). Once the status is known it goes into the summary.json of
every run the job wrote (`ended`, src.runlog.ended). A run that ends otherwise exits as torchrun would (0).

A command line of src.train that Hydra would refuse on every rank starts no rank: a preset or group option that
does not exist (`variant=nope`), an override of a key the configuration does not have (`train.nokey=1`) or one
Hydra cannot read (`optim.lr=[`). The launcher reads and composes it first as src.train does (`refused_by_hydra`:
src.train.command_line, Hydra's compose of conf/config.yaml, the schema check of a key it rewrote), prints
lioncub's line once, e.g. `lioncub: cannot start training: variant=nope: no variant option 'nope' ... (exit 2:
configuration)`, with no torchrun report and no traceback, and exits 2. Of a sweep (-m) it reads the overrides
(the runs are composed by the ranks); a command line with another flag (--cfg, -cn, ...) is left to the ranks, and
so is every problem of a configuration Hydra composes (e.g. `optim.lr=-1`: torchrun's report, then the line).

Plain `torchrun ... -m src.train` also ends with the line: rank 0 writes it to torchrun's error file, which
torchrun prints as the root cause in the last lines of its report (after it, one line of `=`); its exit status
stays 1. The resume command that an interrupted run prints names this launcher when it started the run.
Signals: a Ctrl-C reaches torchrun's workers from the terminal; SIGTERM, SIGINT, SIGHUP and SIGQUIT sent to this
process are torchrun's own (it forwards them to the workers, which checkpoint and exit 75).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from src.errors import EXIT_FILE_ENV, SetupError, exit_line
from src.launch.exit_report import died_line, failed_ranks, record_end

EXIT_SETUP = 2
HYDRA_FLAGS = ("-m", "--multirun", "-r", "--run")  # the only flags of src.train a command line checked here has


def _left_by_rank0(path: Path) -> dict:
    """What rank 0 left in the exit file: `line` and `status` (a run that ended with a line), `runs` (the run
    folders it opened); {} when nothing was left."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(record, dict):
        return {}
    if not (isinstance(record.get("line"), str) and isinstance(record.get("status"), int)):
        record.pop("line", None)
        record.pop("status", None)
    return record


def ending(record: dict, status: int, failures: dict) -> tuple[str | None, int]:
    """The job's last line (None: none to add) and exit status, from what rank 0 left (`record`), torchrun's
    `status` and its `failures` (rank -> ProcessFailure); records the status in the runs' summary.json."""
    said = record.get("status")
    failed = failed_ranks(failures, said) if failures else {}
    runs = [str(r) for r in record.get("runs", [])]
    line = None
    if failed:
        line, status = died_line(failed, runs), 1
        if said is not None:
            line += f"; the run had said: {record['line'].removeprefix('lioncub: ')}"
    elif status != 0 and said is not None:
        line, status = record["line"], said
    record_end(runs, status, failed, line)
    return line, status


def _runs_src_train(args) -> bool:
    """Do torchrun's workers run src.train (`-m src.train`, or the file src/train.py)?"""
    script = str(args.training_script)
    if getattr(args, "no_python", False):
        return False
    if getattr(args, "module", False):
        return script == "src.train"
    return Path(script).resolve() == Path(__file__).resolve().parents[1] / "train.py"


def _hydra_line(exc: Exception) -> str:
    """Hydra's message in one line, naming the override it could not read."""
    text = "; ".join(line.strip().rstrip(".") for line in str(exc).splitlines() if line.strip())
    override = getattr(exc, "override", None)
    if override and override not in text:
        text = f"{override}: {text}"
    return text


def refused_by_hydra(args) -> str | None:
    """lioncub's line (without the exit status) for a command line of src.train that Hydra would refuse on every
    rank, or None: the line `python -m src.train` prints for it (src.train.command_line, then the schema check of
    the config composed as src.train composes it), or Hydra's own message. None also for a command line with any
    flag besides -m/-r (left to the ranks), and for one Hydra composes as typed (the ranks check the rest)."""
    if not _runs_src_train(args):
        return None
    typed = list(args.training_script_args)
    flags = [a for a in typed if a.startswith("-")]
    if any(flag not in HYDRA_FLAGS for flag in flags):
        return None
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import open_dict
    from omegaconf.errors import OmegaConfBaseException

    from src.engine.overrides import CONF
    from src.engine.schema import check_config
    from src.train import command_line

    try:
        read = command_line(typed)
    except SetupError as exc:
        return f"lioncub: cannot start training: {exc}"
    overrides = [a for a in read if not a.startswith("-")]
    try:
        if any(flag in ("-m", "--multirun") for flag in flags):  # a sweep: its runs are composed by the ranks
            OverridesParser.create().parse_overrides(overrides)
            return None
        with initialize_config_dir(config_dir=str(CONF), version_base=None):  # as src.train's @hydra.main
            cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as exc:
        return f"lioncub: cannot start training: {_hydra_line(exc)}"
    except Exception:  # noqa: BLE001 (not a configuration error: the ranks meet it and report it as before)
        return None
    if read == typed:
        return None
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    try:  # an override of a key the configuration does not have: the schema's line, as preflight gives it
        check_config(cfg, choices)
    except SetupError as exc:
        return f"lioncub: cannot start training: {exc}"
    return None


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(sys.argv[1:] if argv is None else argv)
    refused = refused_by_hydra(args)
    if refused is not None:
        print(exit_line(refused, EXIT_SETUP), file=sys.stderr, flush=True)
        return EXIT_SETUP
    with tempfile.TemporaryDirectory(prefix="lioncub-exit-") as folder:
        exit_file = Path(folder) / "exit.json"
        os.environ[EXIT_FILE_ENV] = str(exit_file)
        status, failures = 0, {}
        try:
            run(args)
        except ChildFailedError as exc:
            print(exc, file=sys.stderr, flush=True)
            status, failures = 1, exc.failures
        except SignalException as exc:
            print(f"torchrun: stopped by {exc.sigval.name}; its workers were asked to stop", file=sys.stderr,
                  flush=True)
            status = 128 + int(exc.sigval)
        line, status = ending(_left_by_rank0(exit_file), status, failures)
    if line is not None:
        print(exit_line(line, status), file=sys.stderr, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
