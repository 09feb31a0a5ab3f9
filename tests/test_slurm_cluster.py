"""slurm/ against a real Slurm: the local 2-node cluster of slurm/local.py (Debian's slurmctld, slurmd, munge).

Node n1 and n2 are slurmds in two network namespaces of the emulated 1 Gbit/s Ethernet cluster; the cluster is
started once for this module and always stopped (its namespaces and processes are checked gone). The tests are
skipped, with the reason, only where it cannot start (not root, not Linux, packages not installable).

Not slow: a 2-run submission (a job array, one run per node) finishes with metrics in both run folders and a
status that says so, and a run without its data fails with a status that says why; bad input and an unknown partition leave the queue empty. Slow: a 2-node job of Lion Cub
4-bit (2 ranks per node) whose replicas end identical, with its traffic on the nodes' links; a job requeued by
`scontrol requeue` before its first checkpoint and later given Slurm's warning signal starts again, then resumes,
and ends bitwise equal to an uninterrupted run; a job of 1 to 2 nodes (`--min-nodes 1`) requeued while node n2 is
drained resumes on n1 at 2 ranks instead of 4; a `-m` sweep through Hydra's submitit launcher runs both points as
2-rank jobs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from slurm.local import LocalSlurm, LocalSlurmUnavailable, install
from src.launch.netns import list_namespaces
from src.reliability.checkpoint import rank_file
from test_train_reliability import assert_same_tensors

REPO = Path(__file__).resolve().parents[1]
TINY = ["train.progress=false", "train.eval_batches=2", "data.block_size=32", "data.batch_size=4"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """The local Slurm (2 nodes x 2 CPUs); its environment goes to every command of these tests."""
    try:
        install()
        cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"), nodes=2, cpus=2)
        cluster.up()
    except LocalSlurmUnavailable as exc:
        pytest.skip(f"no local Slurm: {exc}")
    names, pids = list(cluster.cluster.namespaces), dict(cluster.pids)
    yield cluster
    problems = cluster.down()
    assert not problems, problems
    assert not set(names) & set(list_namespaces()), "namespaces of the local Slurm survived"
    alive = [f"{k}={p}" for k, p in pids.items() if os.path.exists(f"/proc/{p}") and
             open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]
    assert not alive, f"processes of the local Slurm survived: {alive}"


def env_of(slurm: LocalSlurm) -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    return {**env, **slurm.env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def run(slurm: LocalSlurm, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), cwd=REPO, env=env_of(slurm), capture_output=True, text=True, timeout=timeout)


def submit(slurm: LocalSlurm, out: Path, *args: str) -> Path:
    proc = run(slurm, sys.executable, "-m", "slurm.submit", *args, "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return Path(proc.stdout.split("submission folder: ")[1].split()[0])


def job_ids(folder: Path) -> list[str]:
    sub = json.loads((folder / "submission.json").read_text())
    return [f"{j['job_id']}_{r['index']}" if j["array"] else j["job_id"] for j in sub["jobs"] for r in j["runs"]]


def queue(slurm: LocalSlurm) -> list[str]:
    return run(slurm, "squeue", "-h", "-r", "-o", "%i %T").stdout.split("\n")[:-1]


def wait_until_done(slurm: LocalSlurm, folder: Path, timeout_s: float = 400) -> None:
    deadline = time.monotonic() + timeout_s
    ids = {i.split("_")[0] for i in job_ids(folder)}
    while any(line.split()[0].split("_")[0] in ids for line in queue(slurm)):
        assert time.monotonic() < deadline, f"jobs of {folder} still queued after {timeout_s}s: {queue(slurm)}"
        time.sleep(1)


def status(slurm: LocalSlurm, folder: Path) -> subprocess.CompletedProcess:
    return run(slurm, sys.executable, "-m", "slurm.status", str(folder))


def rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


@pytest.mark.slow  # 33 s: make test's time
def test_two_runs_finish_on_the_two_nodes(slurm, demo_tokens, tmp_path):
    folder = submit(slurm, tmp_path, "+exp=demo", "seed=1,2", "train.steps=4", "train.eval_every=2",
                    f"data.dir={demo_tokens}", *TINY)
    broken = submit(slurm, tmp_path / "broken", "+exp=demo", f"data.dir={tmp_path / 'no_data'}", *TINY,
                    "--skip-data-check")  # data only the nodes would have: the job finds it missing
    wait_until_done(slurm, folder)
    wait_until_done(slurm, broken)
    proc = status(slurm, broken)  # which failed, and why: the job's exit status and lioncub's own message
    assert proc.returncode == 1 and "1 failed" in proc.stdout, proc.stdout + proc.stderr
    assert "last attempt exited with 1" in proc.stdout and "lioncub: cannot start training" in proc.stdout
    assert "no_data" in proc.stdout
    proc = status(slurm, folder)
    assert proc.returncode == 0 and "2 finished" in proc.stdout, proc.stdout + proc.stderr
    hosts = set()
    for run_id, name in zip(job_ids(folder), ("seed-1", "seed-2")):
        run_dir = folder / f"{name}-{run_id}"
        assert [r["step"] for r in rows(run_dir) if "loss" in r] == [1, 2, 3, 4], run_dir
        assert f"{name}  {run_id}  finished  4/4" in proc.stdout
        provenance = json.loads((run_dir / "provenance.json").read_text())
        assert provenance["world_size"] == 2
        hosts |= {r["host"] for r in provenance["ranks"]}
        config = (run_dir / "config.yaml").read_text()
        assert "name: emulated" in config and f"seed: {name[-1]}" in config
    assert hosts == {"n1", "n2"}  # the array's two runs ran side by side, one per node


@pytest.mark.slow
def test_a_laptop_manifest_of_two_runs_finishes(slurm, demo_tokens, tmp_path):
    """Table 2's tiny-scale manifest (experiments/table2.yaml: 4 and 8 workers), shortened, as 2 nodes x 2 ranks:
    both runs finish and their folders hold the statistics the figure reads."""
    folder = submit(slurm, tmp_path, "table2", "--scale", "tiny", "--nodes", "2", "--nproc-per-node", "2",
                    "train.steps=4", "stats.every=2", "train.eval_every=2", f"data.dir={demo_tokens}", *TINY)
    wait_until_done(slurm, folder)
    proc = status(slurm, folder)
    assert proc.returncode == 0 and "2 finished" in proc.stdout, proc.stdout + proc.stderr
    for run_id, name in zip(job_ids(folder), ("gpt_stats_4w", "gpt_stats_8w")):
        got = rows(folder / f"{name}-{run_id}")
        assert [r["step"] for r in got if "loss" in r] == [1, 2, 3, 4], name
        assert any("stats/vote/pos_pos" in r for r in got), name  # what analysis.table2 reads


def test_bad_input_and_an_unknown_partition_submit_nothing(slurm, demo_tokens, tmp_path):
    before = queue(slurm)
    proc = run(slurm, sys.executable, "-m", "slurm.submit", "+exp=demo", "--nproc-per-node", "4", "--out",
               str(tmp_path))
    assert proc.returncode == 2 and "asks for 4 processes per node" in proc.stderr
    profile = tmp_path / "gpu.yaml"
    profile.write_text((REPO / "slurm/profiles/local.yaml").read_text().replace("debug", "gpu"))
    proc = run(slurm, sys.executable, "-m", "slurm.submit", "+exp=demo", f"data.dir={demo_tokens}", "--profile",
               str(profile), "--out", str(tmp_path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "partition 'gpu' (profile local) does not exist on this cluster; sinfo lists debug" in proc.stderr
    assert queue(slurm) == before and not any(tmp_path.glob("demo-*"))


@pytest.mark.slow
def test_two_node_lion_cub_4bit_replicas_end_identical(slurm, demo_tokens, tmp_path):
    def sent_bytes() -> int:  # what node n1's link sent
        host = slurm.cluster.hosts[0]
        out = subprocess.run(["ip", "-n", host.netns, "-s", "-j", "link", "show", host.ifname], capture_output=True,
                             text=True, check=True).stdout
        return json.loads(out)[0]["stats64"]["tx"]["bytes"]

    before = sent_bytes()
    folder = submit(slurm, tmp_path, "+exp=demo", "variant=cub4", "train.steps=6", "train.eval_every=3",
                    "guard.every=2", f"data.dir={demo_tokens}", *TINY, "--nodes", "2", "--nproc-per-node", "2")
    wait_until_done(slurm, folder)
    (run_id,) = job_ids(folder)
    run_dir = folder / f"demo-{run_id}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["ranks_in_sync"] is True, summary
    provenance = json.loads((run_dir / "provenance.json").read_text())
    assert [r["host"] for r in provenance["ranks"]] == ["n1", "n1", "n2", "n2"]
    assert "name: cub4" in (run_dir / "config.yaml").read_text()
    # each step all-reduces 4-bit votes of every parameter across the link: at least N/2 bytes per step
    assert sent_bytes() - before > summary["model_parameters"] // 2 * 6


def interrupt_when(slurm: LocalSlurm, run_dir: Path, step: int, command: list[str], timeout_s: float = 300) -> int:
    """Run `command` once the run has logged `step`; returns the step it had reached."""
    deadline = time.monotonic() + timeout_s
    while max((r["step"] for r in rows(run_dir)), default=-1) < step:
        assert time.monotonic() < deadline, f"{run_dir} did not reach step {step}"
        job = run_dir.name.rsplit("-", 1)[1]
        assert any(line.split()[0] == job for line in queue(slurm)), \
            f"job {job} left the queue before step {step}: " + status(slurm, run_dir.parent).stdout
        time.sleep(0.3)
    reached = max(r["step"] for r in rows(run_dir))
    proc = run(slurm, *command)
    assert proc.returncode == 0, proc.stderr
    return reached


@pytest.mark.slow
def test_requeued_job_resumes_and_ends_bitwise_equal(slurm, demo_tokens, tmp_path):
    steps, every = 40, 20
    args = ["+exp=demo", "variant=cub4", f"train.steps={steps}", "train.eval_every=10", f"checkpoint.every={every}",
            f"data.dir={demo_tokens}", *TINY]
    reference = submit(slurm, tmp_path / "reference", *args)
    folder = submit(slurm, tmp_path / "requeued", *args)
    (job,) = job_ids(folder)
    run_dir = folder / f"demo-{job}"
    # 1: a requeue from outside (an admin, or a preemption with PreemptMode=REQUEUE) before the first checkpoint:
    # SIGTERM reaches the ranks, Slurm requeues the job
    first = interrupt_when(slurm, run_dir, 2, ["scontrol", "requeue", job])
    # 2: Slurm's warning signal (what --signal=B:USR1@N sends) after the step-20 checkpoint: the job passes it on
    # to the ranks, then requeues itself
    second = interrupt_when(slurm, run_dir, every + 2, ["scancel", "--signal=USR1", "--batch", job])
    wait_until_done(slurm, folder)
    wait_until_done(slurm, reference)
    log = next((folder / "logs").iterdir()).read_text()
    assert "lioncub: SIGTERM from Slurm" in log and "lioncub: SIGUSR1 from Slurm" in log
    assert "lioncub: requeueing job" in log
    resumed = [int(line.rsplit("step_", 1)[1][:8]) for line in log.splitlines() if "lioncub: resumed from" in line]
    # the ranks finish the step they are in when the signal reaches them and checkpoint it: both requeues resume
    # from a checkpoint of a step at or after the one seen when the signal was sent (none is lost)
    assert len(resumed) == 2 and first <= resumed[0] < every and second <= resumed[1] < steps, (resumed, first, second)
    assert not (folder / "incomplete").exists() and "no checkpoint from the previous attempt" not in log
    records = [json.loads(line) for line in (folder / "jobs" / f"demo-{job}.jsonl").read_text().splitlines()]
    assert [r["restart"] for r in records if r["event"] == "start"] == [0, 1, 2]
    assert [r.get("requeue") for r in records if r["event"] == "end"][1] == 1
    assert "1 finished" in status(slurm, folder).stdout
    (ref_id,) = job_ids(reference)
    ref_dir = reference / f"demo-{ref_id}"
    got, want = rows(run_dir), rows(ref_dir)
    assert [r["step"] for r in got] == list(range(steps + 1))
    for a, b in zip(got, want):
        assert (a.get("loss"), a.get("val/loss")) == (b.get("loss"), b.get("val/loss")), a["step"]
    last = f"checkpoints/step_{steps:08d}"
    for name in ("model.pt", rank_file(0), rank_file(1)):
        mine, theirs = (torch.load(d / last / name, weights_only=False) for d in (run_dir, ref_dir))
        mine, theirs = (x.get("optimizer", x) if name != "model.pt" else x for x in (mine, theirs))
        assert_same_tensors(mine, theirs, name)


@pytest.mark.slow
def test_submitit_sweep_runs_both_points_as_two_rank_jobs(slurm, demo_tokens, tmp_path):
    proc = run(slurm, sys.executable, "-m", "src.train", "-m", "hydra/launcher=lioncub_slurm", "+exp=demo",
               "variant=lion32,cub4", "train.steps=3", "train.eval_every=3", f"data.dir={demo_tokens}", *TINY,
               "network=emulated", f"run.root={tmp_path / 'runs'}", f"hydra.sweep.dir={tmp_path / 'multirun'}",
               "hydra.launcher.partition=debug", "hydra.launcher.tasks_per_node=2", "hydra.launcher.gpus_per_node=null",
               "hydra.launcher.cpus_per_task=1", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = sorted((tmp_path / "runs").glob("*-sweep-*/*/summary.json"))  # <root>/<sweep folder>/<n>-<point>/
    summaries = [json.loads(p.read_text()) for p in found]
    assert sorted(p.parent.name.rsplit("_", 1)[1] for p in found) == ["cub4", "lion32"]  # 0-variant_lion32, ...
    assert all(s["world_size"] == 2 and s["ranks_in_sync"] and s["steps"] == 3 for s in summaries), summaries


@pytest.mark.slow
def test_a_job_requeued_onto_one_node_resumes_at_two_ranks(slurm, demo_tokens, tmp_path):
    """`--nodes 2 --min-nodes 1`: the job starts on both nodes (4 ranks); node n2 is drained and the warning signal
    sent after the step-10 checkpoint: the ranks checkpoint the step they are in, the job requeues itself, Slurm
    starts it on n1 alone, and the run resumes there at 2 ranks (src.reliability.resize) and finishes."""
    steps, every = 60, 10
    folder = submit(slurm, tmp_path, "+exp=demo", "variant=cub4", f"train.steps={steps}", "train.eval_every=10",
                    f"checkpoint.every={every}", f"data.dir={demo_tokens}", *TINY, "--nodes", "2", "--min-nodes", "1")
    (job,) = job_ids(folder)
    run_dir = folder / f"demo-{job}"
    try:  # drained while the job runs on it: n2 takes no new job
        warned = interrupt_when(slurm, run_dir, every + 2,
                                ["scontrol", "update", "NodeName=n2", "State=DRAIN", "Reason=resize-test"])
        assert run(slurm, "scancel", "--signal=USR1", "--batch", job).returncode == 0
        wait_until_done(slurm, folder)
    finally:
        run(slurm, "scontrol", "update", "NodeName=n2", "State=RESUME")
    log = next((folder / "logs").iterdir()).read_text()
    assert "lioncub: requeueing job" in log and "on 1 node(s) n1" in log, log[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    [change] = summary["world_size_changes"]
    assert (change["from"], change["to"]) == (4, 2) and warned <= change["step"] < steps, (change, warned)
    assert f"lioncub: world size 4 -> 2 at step {change['step']}" in log
    assert summary["steps"] == steps and summary["world_size"] == 2 and summary["ranks_in_sync"] is True
    got = rows(run_dir)
    assert [r["step"] for r in got] == list(range(steps + 1))
    assert [r["world_size"] for r in got[1:]] == [4] * change["step"] + [2] * (steps - change["step"])
    records = [json.loads(line) for line in (folder / "jobs" / f"demo-{job}.jsonl").read_text().splitlines()]
    assert [r["nodes"] for r in records if r["event"] == "start"] == ["n[1-2]", "n1"]
    assert "1 finished" in status(slurm, folder).stdout
