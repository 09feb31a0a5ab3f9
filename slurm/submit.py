"""Submit an experiment to Slurm: `python -m slurm.submit [options] (MANIFEST [overrides] | OVERRIDES...)`.

    python -m slurm.submit +exp=gpt774m_4bit seed=1,2,3 --profile mycluster        # a job array of 3 runs
    python -m slurm.submit +exp=gpt774m_4bit --nodes 2 --nproc-per-node 4 --dry-run  # print, submit nothing
    python -m slurm.submit fig5 --scale paper                                       # an experiment manifest
    python -m slurm.status runs/slurm/<submission>                                  # what finished, what failed

The runs come from an experiment manifest (experiments/<name>.yaml) or from a preset with overrides,
where comma-separated values sweep like Hydra's multirun (every combination is one run). Runs with the same nodes
and processes per node go into one job array, the others into one job each; each job gets a script from
slurm/script.py (srun + torchrun per node, c10d rendezvous, checkpoint and requeue before the time limit). The
cluster profile (slurm/profiles/<name>.yaml, --profile or $LIONCUB_SLURM_PROFILE, default `example`) gives the
partition, account, QoS, time, nodes, processes per node and network; options override it. A run's own nodes and
processes (manifest) beat the profile; options beat both. A run that chooses no network (the laptop default
`local`) gets the profile's `network`.

Everything is checked before anything is submitted; each problem exits with status 2 and a message naming the
numbers: a run asking for more processes per node than the partition's nodes have GPUs (CPUs on CPU nodes), more
nodes than it allows, a partition the profile (or `sinfo`) does not know, a preset that pins another world size
(`expect_world_size`), overrides that do not compose, `run.dir`/`resume` set by hand (the job sets them), and
every check `python -m src.train` makes before training, for rank 0 of the job on its nodes (slurm.runs.preflight:
the same messages; the data where this machine can see it, see there). `--min-nodes M` lets Slurm start, and
requeue, the job on M to `--nodes` nodes (`#SBATCH --nodes=M-N`); an attempt on another node count than the last
resumes the run at that world size (`resume=auto`; src.reliability.resize), and the checks run at both ends.
Each submission gets `<runs_root>/<name>-<YYYYmmdd-HHMMSS>/` with the scripts, `submission.json` (runs and job
ids), `logs/`, `jobs/` (one line per attempt) and one run folder `<run>-<job id>` per run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from slurm.profile import Profile, SubmitError, load_profile
from slurm.runs import REPO, RunSet, RunSpec, check_config, from_manifest, from_overrides, preflight
from slurm.script import JobSpec, render

DEFAULT_PROFILE = "example"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m slurm.submit", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="+", metavar="MANIFEST|OVERRIDE",
                        help="an experiment manifest (name or path) then overrides for every run, or overrides only")
    parser.add_argument("--scale", choices=["paper", "laptop", "tiny"], default=None,
                        help="a manifest's scale (paper)")
    parser.add_argument("--dry-run", action="store_true", help="print the scripts and sbatch commands, submit nothing")
    parser.add_argument("--profile", default=os.environ.get("LIONCUB_SLURM_PROFILE", DEFAULT_PROFILE),
                        help="cluster profile name (slurm/profiles/) or YAML path")
    parser.add_argument("--name", help="submission name (default: the manifest's or the preset's)")
    parser.add_argument("--out", type=Path, help="where the submission folder goes (default: the profile's runs_root)")
    for flag in ("--partition", "--account", "--qos", "--time", "--network"):
        parser.add_argument(flag)
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--min-nodes", type=int, dest="min_nodes",
                        help="let Slurm start (and requeue) the job on --min-nodes to --nodes nodes; the run resumes "
                             "at the world size it gets (src.reliability.resize)")
    parser.add_argument("--nproc-per-node", type=int, dest="nproc_per_node")
    parser.add_argument("--skip-data-check", action="store_true",
                        help="leave the data folders to the job (e.g. data staged to the nodes' local disks)")
    return parser.parse_intermixed_args(argv)


def load_runs(args: argparse.Namespace) -> RunSet:
    head, rest = args.what[0], args.what[1:]
    if "=" not in head:
        runset = from_manifest(head, args.scale or "paper")
        extra = tuple(rest)
        runs = tuple(replace(r, overrides=tuple(r.overrides) + extra) for r in runset.runs)
        return replace(runset, runs=runs)
    if args.scale:
        raise SubmitError(f"--scale {args.scale} selects the runs of a manifest; with overrides ({head} ...) the "
                          "preset and the overrides fix the scale")
    stray = [w for w in args.what if "=" not in w and not w.startswith("~")]
    if stray:
        raise SubmitError(f"{' '.join(stray)}: not an override (key=value); a manifest name goes first")
    return from_overrides(list(args.what))


def node_range(run: RunSpec, nodes: int, args: argparse.Namespace, pinned: int | None) -> int:
    """The fewest nodes the job may run on (`--min-nodes`, else `nodes`), checked."""
    least = getattr(args, "min_nodes", None) or nodes
    if not 1 <= least <= nodes:
        raise SubmitError(f"--min-nodes {least} must lie in [1, {nodes}] (the job's --nodes)")
    if least < nodes and pinned is not None:
        raise SubmitError(f"run {run.name!r} pins expect_world_size={pinned}, so it cannot run on {least} to {nodes} "
                          "nodes; drop --min-nodes, or override expect_world_size=null")
    return least


def plan_job(run: RunSpec, args: argparse.Namespace,
             profile: Profile) -> tuple[int, int, tuple[str, ...], int, int]:
    """(nodes, processes per node, overrides, checkpoint.every, fewest nodes) of one run, checked against the
    profile and its configuration (at both ends of a node range)."""
    if run.launcher != "torchrun":
        raise SubmitError(f"run {run.name!r} uses launcher={run.launcher}, the emulated cluster on one machine, not a "
                          "Slurm launch; run it with python -m src.launch.emulate (or make a torchrun run of it)")
    nodes = args.nodes or run.nodes or profile.nodes
    nproc = args.nproc_per_node or run.nproc_per_node or profile.nproc_per_node
    part = profile.partition_spec()
    unit = f"{part.gpus_per_node} GPUs" if part.gpus_per_node else f"{part.cpus_per_node} CPUs (CPU nodes)"
    if nproc > part.max_procs():
        raise SubmitError(f"run {run.name!r} asks for {nproc} processes per node but the nodes of partition "
                          f"{profile.partition} have {unit} (profile {profile.name}, {profile.path}); use "
                          f"--nproc-per-node {part.max_procs()} or fewer, with more --nodes")
    if part.max_nodes is not None and nodes > part.max_nodes:
        raise SubmitError(f"run {run.name!r} asks for {nodes} nodes but partition {profile.partition} allows "
                          f"{part.max_nodes} (profile {profile.name}); use --nodes {part.max_nodes} or another "
                          "partition")
    config = check_config(run)
    least = node_range(run, nodes, args, config.expect_world_size)
    world = nodes * nproc
    if config.expect_world_size is not None and config.expect_world_size != world:
        raise SubmitError(f"run {run.name!r} pins expect_world_size={config.expect_world_size} (its preset or "
                          f"overrides) but would run {nodes} node(s) x {nproc} process(es) = {world}; choose --nodes "
                          f"and --nproc-per-node with that product, or override expect_world_size=null")
    overrides = tuple(run.overrides)
    if config.network == "local":  # the laptop default binds gloo to loopback: never right across nodes
        network = args.network or profile.network
        if not network:
            raise SubmitError(f"run {run.name!r} chooses no network and profile {profile.name} has network: null; "
                              "give --network ethernet|infiniband or network=... in the overrides")
        overrides += (f"network={network}",)
        config = replace(config, network=network)
    if config.network == "emulated":
        overrides += (f"network.nodes={nodes}", f"network.nproc_per_node={nproc}")
    notes = []
    for count in sorted({least, nodes}):  # the world-size checks bind at one end (field widths, images per step)
        notes += [n for n in preflight(run, overrides, count, nproc, nproc if part.gpus_per_node else 0,
                                       check_data=not getattr(args, "skip_data_check", False)) if n not in notes]
    for note in notes:
        print(f"slurm.submit: note: {note}", file=sys.stderr)
    return nodes, nproc, overrides, config.checkpoint_every, least


def plan_jobs(runset: RunSet, args: argparse.Namespace, profile: Profile) -> list[JobSpec]:
    """One job per distinct (nodes, processes per node): a job array when it holds several runs."""
    names = [r.name for r in runset.runs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SubmitError(f"run names must be unique, but {', '.join(dupes)} appear more than once")
    part = profile.partition_spec()
    groups: dict[tuple[int, int, int], list[tuple[RunSpec, tuple[str, ...]]]] = {}
    never = []
    for run in runset.runs:
        nodes, nproc, overrides, every, least = plan_job(run, args, profile)
        groups.setdefault((nodes, nproc, least), []).append((run, overrides))
        never += [run.name] if every == 0 else []
    if never:
        print(f"slurm.submit: note: checkpoint.every=0 in {', '.join(never)}: a requeued job restarts from step 0 "
              "unless its ranks checkpoint on the warning signal (add checkpoint.every=N)", file=sys.stderr)
    jobs = []
    for (nodes, nproc, least), members in groups.items():
        suffix = f"-{nodes}x{nproc}" if len(groups) > 1 else ""
        jobs.append(JobSpec(name=f"lc-{runset.name}{suffix}", runs=tuple(r for r, _ in members),
                            overrides=tuple(o for _, o in members), nodes=nodes, min_nodes=least, nproc_per_node=nproc,
                            gpus_per_node=nproc if part.gpus_per_node else 0,
                            cpus_per_task=profile.cpus_per_task or part.cpus_per_node))
    return jobs


def check_partition_exists(profile: Profile) -> None:
    """With a reachable Slurm, the partition must exist there too (sinfo's list in the message)."""
    if shutil.which("sinfo") is None:
        return
    proc = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True)
    names = sorted(set(proc.stdout.split()))
    if proc.returncode == 0 and names and profile.partition not in names:
        raise SubmitError(f"partition {profile.partition!r} (profile {profile.name}) does not exist on this cluster; "
                          f"sinfo lists {', '.join(names)}; use --partition or fix the profile")


def submission_dir(profile: Profile, name: str, out: Path | None = None) -> Path:
    root = Path(out or profile.runs_root)
    root = root.resolve() if out or root.is_absolute() else REPO / root
    return root / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def record(runset: RunSet, profile: Profile, jobs: list[JobSpec], ids: list[str | None]) -> dict:
    return {"name": runset.name, "source": runset.source, "analysis": runset.analysis,
            "profile": {"name": profile.name, "path": str(profile.path), "partition": profile.partition,
                        "time": profile.time},
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "jobs": [{"script": f"{job.name}.sbatch", "job_id": job_id, "nodes": job.nodes, "min_nodes": job.min_nodes,
                      "nproc_per_node": job.nproc_per_node, "array": job.is_array, "log": job.log_pattern(),
                      "runs": [{"name": r.name, "index": i, "overrides": list(o)}
                               for i, (r, o) in enumerate(zip(job.runs, job.overrides))]}
                     for job, job_id in zip(jobs, ids)]}


def submit(jobs: list[JobSpec], runset: RunSet, profile: Profile, folder: Path) -> list[str | None]:
    if shutil.which("sbatch") is None:
        raise SubmitError("sbatch not found on PATH: run this on a Slurm login node (or make slurm-up and source "
                          "its env.sh), or use --dry-run to see the scripts")
    check_partition_exists(profile)
    for sub in ("logs", "jobs"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    ids: list[str | None] = [None] * len(jobs)
    for job in jobs:
        (folder / f"{job.name}.sbatch").write_text(render(job, profile, folder, REPO))
    for i, job in enumerate(jobs):
        proc = subprocess.run(["sbatch", "--parsable", str(folder / f"{job.name}.sbatch")], capture_output=True,
                              text=True, cwd=REPO)
        if proc.returncode != 0:
            (folder / "submission.json").write_text(json.dumps(record(runset, profile, jobs, ids), indent=2) + "\n")
            raise RuntimeError(f"sbatch {job.name}.sbatch failed ({proc.returncode}): {proc.stderr.strip()}"
                               + (f"; {i} job(s) were submitted before it, see {folder}" if i else ""))
        ids[i] = proc.stdout.strip().split(";")[0]
        shape = f"{job.min_nodes}-{job.nodes}" if job.min_nodes < job.nodes else f"{job.nodes}"
        print(f"submitted {job.name}: job {ids[i]} ({len(job.runs)} run(s), {shape} node(s) x "
              f"{job.nproc_per_node})")
    (folder / "submission.json").write_text(json.dumps(record(runset, profile, jobs, ids), indent=2) + "\n")
    return ids


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        profile = load_profile(args.profile, {"partition": args.partition, "account": args.account,
                                              "qos": args.qos, "time": args.time})
        runset = load_runs(args)
        if args.name:
            runset = replace(runset, name=args.name)
        jobs = plan_jobs(runset, args, profile)
        folder = submission_dir(profile, runset.name, args.out)
        if args.dry_run:
            for job in jobs:
                print(f"# sbatch {folder / (job.name + '.sbatch')}\n{render(job, profile, folder, REPO)}")
            print(f"# dry run: {len(jobs)} job(s), {len(runset.runs)} run(s); nothing was submitted or written")
            return 0
        submit(jobs, runset, profile, folder)
    except SubmitError as exc:
        print(f"slurm.submit: cannot submit: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"slurm.submit: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. --dry-run | head
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    print(f"submission folder: {folder}\nstatus: python -m slurm.status {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
