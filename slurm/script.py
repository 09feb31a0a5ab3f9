"""The sbatch script of one job, or of a job array whose tasks share nodes and processes (Lion Cub, Section 7).

Inside the job, one `srun` task per node starts `torchrun` with a c10d rendezvous on the first node of the job's
node list; torchrun starts `nproc_per_node` ranks of `python -m src.train` with the run's overrides, the network
config, `run.dir=<submission>/<run>-<job id>` and `resume=auto`. A job array selects its run by
SLURM_ARRAY_TASK_ID; the job id of an array task is `<array id>_<index>`, which stays the same when it is requeued.

Preemption and time limits: `#SBATCH --signal=B:USR1@<warning>` makes Slurm signal the batch shell that long before
the end. The shell passes USR1 once to srun, which passes it to each node's torchrun (started with
`--signals_to_handle ...,SIGUSR1`), which passes it to its ranks and waits for them up to `--shutdown_timeout`;
the ranks finish their step, checkpoint it and exit 75 (src.reliability.signals). The shell then runs `scontrol
requeue` on its own job, unless the run finished (`summary.json` without `interrupted_at`) or it was requeued
`max_requeues` times already. The requeued job gets the same job id, hence the same run folder, and `resume=auto` continues from the newest checkpoint, the W&B
run included (its id is in the run folder and in the checkpoint). torchrun starts `$SLURM_NNODES` x
`nproc_per_node` ranks: a job that Slurm starts on fewer or more nodes than its last attempt (`--nodes=M-N`, or
`scontrol update JobId=<id> NumNodes=<n>` while it waits requeued) resumes at that world size
(src.reliability.resize: the change is in the run's summary.json). SIGTERM (scancel, Slurm's own requeue or
preemption, the time limit itself) is passed to the ranks the same way but does not requeue by itself.

Every start and end of an attempt appends a JSON line to `<submission>/jobs/<run>-<job id>.jsonl` (exit status,
whether it requeued), which `python -m slurm.status` reads next to squeue, sacct and the run folder.

Deliberate differences from the paper's setup: none in what runs (the same torchrun ranks); the requeue loop is
ours (the paper does not discuss preemption).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from slurm.profile import Profile
from slurm.runs import RunSpec

# src.train's `resume=auto` starts again in its own run folder when that folder has no checkpoint yet (a requeued job
# killed before its first one); set False for a src.train that refuses it: the job then moves such a folder to
# <submission>/incomplete/ first.
RESUME_AUTO_ACCEPTS_OWN_FOLDER = True
SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"


@dataclass(frozen=True)
class JobSpec:
    """One sbatch submission: `runs` (a job array when there are several) on `nodes` x `nproc_per_node`."""
    name: str
    runs: tuple[RunSpec, ...]
    overrides: tuple[tuple[str, ...], ...]  # per run, with the network chosen for it
    nodes: int
    min_nodes: int  # Slurm may start (and requeue) the job on min_nodes..nodes nodes
    nproc_per_node: int
    gpus_per_node: int
    cpus_per_task: int

    @property
    def is_array(self) -> bool:
        return len(self.runs) > 1

    def log_pattern(self) -> str:
        return f"{self.name}-%A_%a.out" if self.is_array else f"{self.runs[0].name}-%j.out"


def _q(text: str) -> str:
    return shlex.quote(str(text))


def sbatch_header(job: JobSpec, profile: Profile, submission: Path) -> list[str]:
    if job.min_nodes < job.nodes:  # a range; Slurm (22.05) gives --ntasks-per-node=1 jobs the fewest nodes of it
        shape = [f"--nodes={job.min_nodes}-{job.nodes}"]  # as many as are free (srun asks one task per node)
    else:
        shape = [f"--nodes={job.nodes}", "--ntasks-per-node=1"]
    lines = [f"--job-name={job.name}", *shape,
             f"--cpus-per-task={job.cpus_per_task}", f"--time={profile.time}", f"--partition={profile.partition}"]
    if job.gpus_per_node:
        lines.append(profile.gpu_request.format(gpus=job.gpus_per_node))
    lines += [f"--{key}={value}" for key, value in (("account", profile.account), ("qos", profile.qos),
                                                      ("mem", profile.mem)) if value]
    lines += [f"--signal=B:USR1@{profile.signal_warning_s}", "--requeue", "--open-mode=append",
              f"--output={submission / 'logs' / job.log_pattern()}"]
    if job.is_array:
        lines.append(f"--array=0-{len(job.runs) - 1}")
    lines += list(profile.extra_sbatch)
    return [f"#SBATCH {line}" for line in lines]


def _run_table(job: JobSpec) -> list[str]:
    names = " ".join(_q(r.name) for r in job.runs)
    lines = [f"RUNS=({names})", 'case "${SLURM_ARRAY_TASK_ID:-0}" in']
    for index, overrides in enumerate(job.overrides):
        lines.append(f"  {index}) OVERRIDES=({' '.join(_q(o) for o in overrides)}) ;;")
    lines += ["esac", 'RUN=${RUNS[${SLURM_ARRAY_TASK_ID:-0}]}']
    return lines


def launch_command(job: JobSpec, profile: Profile) -> list[str]:
    """The srun + torchrun lines (each node: one torchrun, c10d rendezvous on the first node)."""
    grace = max(10, profile.signal_warning_s - 30)  # what the ranks get to checkpoint before torchrun kills them
    return [
        # the step's CPUs: since Slurm 22.05 srun no longer inherits --cpus-per-task from the job
        'srun --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_PER_TASK" --kill-on-bad-exit=1 \\',
        f"  {_q(profile.python)} -m torch.distributed.run --nnodes=\"$SLURM_NNODES\" "
        f"--nproc_per_node={job.nproc_per_node} \\",
        '    --rdzv_backend=c10d --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv_id="$JOB" --max_restarts=0 \\',
        f"    --signals_to_handle={SIGNALS} --shutdown_timeout={grace} \\",
        '    -m src.train "${OVERRIDES[@]}" run.dir="$RUN_DIR" resume=auto &',
    ]


def _move_aside_block() -> list[str]:
    if RESUME_AUTO_ACCEPTS_OWN_FOLDER:
        return []
    return [
        "# resume=auto needs a checkpoint in a non-empty run folder: an attempt that never wrote one is moved aside",
        'if [ "$RESTART" -gt 0 ] && [ -d "$RUN_DIR" ] && '
        '! compgen -G "$RUN_DIR/checkpoints/step_*/manifest.json" >/dev/null; then',
        '  mkdir -p "$SUBMISSION/incomplete" && mv "$RUN_DIR" "$SUBMISSION/incomplete/$RUN-$JOB.attempt$RESTART"',
        '  echo "lioncub: no checkpoint from the previous attempt; it was moved to $SUBMISSION/incomplete/"',
        "fi",
    ]


def _signal_handlers() -> list[str]:
    """The script's shell functions: `record` (one JSON line per event of the attempt, read by python -m
    slurm.status), `warned` (Slurm's --signal: checkpoint, stop, then requeue), `finished`, and the traps."""
    return [
        'record() {  # one JSON line per event of this attempt, read by python -m slurm.status',
        '  printf \'{"run": "%s", "job": "%s", "restart": %s, "event": "%s", "time": "%s"%s}\\n\' \\',
        '    "$RUN" "$JOB" "$RESTART" "$1" "$(date +%FT%T%z)" "${2:-}" >> "$SUBMISSION/jobs/$RUN-$JOB.jsonl"',
        '}',
        'requeue=0 srun_pid=""',
        'warned() {  # --signal: the time limit (or a preemption) is near',
        '  requeue=1',
        '  echo "lioncub: SIG$1 from Slurm: the ranks checkpoint and stop, then the job requeues itself"',
        '  kill -"$1" "$srun_pid" 2>/dev/null',
        '}',
        "finished() {  # summary.json is also written when the ranks stop on a signal: interrupted_at says so",
        '  [ -f "$RUN_DIR/summary.json" ] && ! grep -q \'"interrupted_at": [0-9]\' "$RUN_DIR/summary.json"',
        "}",
        "trap 'warned USR1' USR1",
        "trap 'echo \"lioncub: SIGTERM from Slurm; passing it to the ranks\"; "
        "kill -TERM \"$srun_pid\" 2>/dev/null' TERM",
    ]


def render(job: JobSpec, profile: Profile, submission: Path, repo: Path) -> str:
    """The whole sbatch script."""
    kind = f"a job array of {len(job.runs)} runs" if job.is_array else f"run {job.runs[0].name}"
    lines = ["#!/bin/bash",
             f"# lioncub on Slurm: {kind}, {job.nodes} node(s) x {job.nproc_per_node} process(es); written by "
             "python -m slurm.submit (slurm/script.py), profile " + profile.name,
             *sbatch_header(job, profile, submission), "",
             "set -uo pipefail",
             f"SUBMISSION={_q(submission)}",
             f"cd {_q(repo)}",
             *profile.setup,
             *[f"export {key}={_q(value)}" for key, value in profile.env.items()],
             *_run_table(job),
             'JOB=${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}${SLURM_ARRAY_TASK_ID:+_$SLURM_ARRAY_TASK_ID}',
             'RUN_DIR=$SUBMISSION/$RUN-$JOB',
             'RESTART=${SLURM_RESTART_COUNT:-0}',
             'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
             'MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))',
             *_signal_handlers(),
             *_move_aside_block(),
             'record start ", \\"nodes\\": \\"$SLURM_JOB_NODELIST\\", \\"run_dir\\": \\"$RUN_DIR\\""',
             'echo "lioncub: run $RUN, job $JOB (attempt $((RESTART + 1))) on $SLURM_NNODES node(s)'
             ' $SLURM_JOB_NODELIST -> $RUN_DIR"',
             *launch_command(job, profile),
             'srun_pid=$!',
             'while true; do wait "$srun_pid"; status=$?; kill -0 "$srun_pid" 2>/dev/null || break; done',
             'record end ", \\"status\\": $status, \\"requeue\\": $requeue"',
             'if [ "$requeue" = 1 ] && ! finished; then',
             f'  if [ "$RESTART" -lt {profile.max_requeues} ]; then',
             '    echo "lioncub: requeueing job $JOB; it resumes from the newest checkpoint in $RUN_DIR"',
             '    scontrol requeue "$SLURM_JOB_ID" && exit 0',
             '  else',
             f'    echo "lioncub: not requeued: job $JOB was requeued {profile.max_requeues} times already '
             '(max_requeues)"',
             '  fi',
             'fi',
             'exit "$status"', ""]
    return "\n".join(lines)
