"""slurm.submit without a cluster: the scripts of --dry-run, and bad input refused before anything is submitted.

The scripts are checked for what makes the multi-node launch work (one srun task per node, torchrun with a c10d
rendezvous on the first node, the network, the run folder per job, the warning signal and the requeue) and with
`bash -n`. Each refusal names its numbers and leaves no submission folder behind.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from slurm.profile import SubmitError, load_profile, parse_time
from slurm.runs import RunSet, RunSpec, from_overrides
from slurm.submit import parse_args, plan_jobs

REPO = Path(__file__).resolve().parents[1]


def submit(*args: str, out: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(out.parent)}  # no sbatch: a dry run or a refusal needs none
    return subprocess.run([sys.executable, "-m", "slurm.submit", *args, "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)  # generous: a loaded 2-core machine


def scripts(stdout: str) -> list[str]:
    return [part.split("\n", 1)[1] for part in stdout.split("# sbatch ")[1:]]


def test_dry_run_of_a_paper_run_on_2_nodes_x_4_gpus(tmp_path):
    proc = submit("+exp=gpt774m_4bit", "checkpoint.every=0", "--profile", "example", "--dry-run",
                  "--skip-data-check", out=tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    (script,) = scripts(proc.stdout)
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --partition=gpu", "#SBATCH --time=24:00:00", "#SBATCH --signal=B:USR1@300",
                 "#SBATCH --requeue", "srun --ntasks-per-node=1", "--nproc_per_node=4",
                 '--rdzv_backend=c10d --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT"',
                 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                 "--signals_to_handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1", "OVERRIDES=(+exp=gpt774m_4bit checkpoint.every=0)",
                 'run.dir="$RUN_DIR" resume=auto', 'scontrol requeue "$SLURM_JOB_ID"'):
        assert line in script, line
    assert "network=" not in script  # the preset chose network=ethernet itself
    assert "--array" not in script
    assert "checkpoint.every=0 in gpt774m_4bit" in proc.stderr  # the note on what a requeue would lose
    assert "nothing was submitted" in proc.stdout and not (tmp_path / "out").exists()
    syntax = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr


def test_a_sweep_is_one_job_array_and_gets_the_profiles_network(tmp_path):
    proc = submit("+exp=demo", "seed=1,2,3", "--profile", "local", "--nodes", "2", "--dry-run", "--skip-data-check",
                  out=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (script,) = scripts(proc.stdout)
    assert "#SBATCH --array=0-2" in script and "--gpus-per-node" not in script
    assert "RUNS=(seed-1 seed-2 seed-3)" in script
    assert ("  2) OVERRIDES=(+exp=demo seed=3 'run.label=\"seed=3\"' network=emulated network.nodes=2 "
            "network.nproc_per_node=2) ;;") in script  # each run of the sweep is labelled by what differs
    assert "export OMP_NUM_THREADS=1" in script


def test_a_node_range_lets_the_job_start_and_requeue_on_fewer_nodes(tmp_path):
    """`--min-nodes 1 --nodes 2`: `#SBATCH --nodes=1-2`; torchrun starts $SLURM_NNODES x 2 ranks, and the checks ran
    at both 1 and 2 nodes (a variant that cannot run at the larger size is refused with the numbers)."""
    proc = submit("+exp=demo", "--profile", "local", "--nodes", "2", "--min-nodes", "1", "--dry-run",
                  "--skip-data-check", out=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (script,) = scripts(proc.stdout)
    assert "#SBATCH --nodes=1-2" in script and '--nnodes="$SLURM_NNODES" --nproc_per_node=2' in script
    assert "#SBATCH --ntasks-per-node" not in script  # with it, Slurm would start the job on 1 node of 2 free
    assert "resume=auto" in script and "on $SLURM_NNODES node(s)" in script
    proc = submit("+exp=demo", "variant=cub8", "variant.reducer.levels=4096", "--profile", "local", "--nodes", "2",
                  "--min-nodes", "1", "--dry-run", "--skip-data-check", out=tmp_path)
    assert proc.returncode == 2 and "with 4 process(es)" in proc.stderr, proc.stderr
    assert "runs with at most 3 processes" in proc.stderr


def test_runs_of_different_shapes_go_to_separate_jobs():
    swept = from_overrides(["+exp=demo", "seed=1,2"])
    assert [r.name for r in swept.runs] == ["seed-1", "seed-2"]
    assert [r.overrides[-1] for r in swept.runs] == ['run.label="seed=1"', 'run.label="seed=2"']
    assert from_overrides(["+exp=demo", "seed=1,2", "run.label=mine"]).runs[0].overrides[-1] == "run.label=mine"
    first, second = swept.runs  # as a manifest would give them: the second run on 2 nodes
    runset = RunSet("fig", (first, RunSpec("big", second.overrides, nodes=2)), "test")
    jobs = plan_jobs(runset, parse_args(["x=1", "--profile", "local", "--skip-data-check"]), load_profile("local"))
    assert [(j.nodes, j.nproc_per_node, [r.name for r in j.runs]) for j in jobs] == [(1, 2, ["seed-1"]),
                                                                                   (2, 2, ["big"])]
    assert [j.name for j in jobs] == ["lc-fig-1x2", "lc-fig-2x2"]


@pytest.mark.parametrize("args, words", [
    (["+exp=gpt774m_4bit", "--profile", "example", "--nproc-per-node", "8"],
     ["asks for 8 processes per node", "partition gpu have 4 GPUs", "--nproc-per-node 4 or fewer"]),
    (["+exp=demo", "--profile", "local", "--nproc-per-node", "3"],
     ["asks for 3 processes per node", "have 2 CPUs (CPU nodes)"]),
    (["+exp=gpt774m_4bit", "--profile", "example", "--nodes", "20"], ["asks for 20 nodes", "allows 16"]),
    (["+exp=gpt774m_4bit", "--profile", "example", "--partition", "gpu-h200"],
     ["partition 'gpu-h200' is not in profile example", "gpu (4 GPUs, 64 CPUs per node)", "debug"]),
    (["+exp=demo", "expect_world_size=8", "--profile", "local"],
     ["pins expect_world_size=8", "1 node(s) x 2 process(es) = 2"]),
    (["+exp=demo", "train.stepz=3", "--profile", "local"], ["train.stepz"]),
    (["+exp=demo", "run.dir=/tmp/x", "--profile", "local"], ["run.dir=/tmp/x is set by the submission"]),
    (["+exp=demo", "--profile", "local", "--scale", "paper"], ["--scale paper selects the runs of a manifest"]),
    (["+exp=demo", "--profile", "nowhere"], ["profile 'nowhere'", "example, local"]),
    (["+exp=demo", "--profile", "local", "--time", "00:00:30"], ["signal_warning_s=60", "30 s"]),
    (["+exp=demo", "--profile", "local", "--nodes", "2", "--min-nodes", "3"], ["--min-nodes 3 must lie in [1, 2]"]),
    (["+exp=demo", "expect_world_size=4", "--profile", "local", "--nodes", "2", "--min-nodes", "1"],
     ["pins expect_world_size=4, so it cannot run on 1 to 2 nodes", "drop --min-nodes"]),
])
def test_bad_input_is_refused_before_anything_is_submitted(args, words, tmp_path):
    proc = submit(*args, out=tmp_path / "out")  # not a dry run: only the checks stand between it and sbatch
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("slurm.submit: cannot submit: ") and "Traceback" not in proc.stderr
    for word in words:
        assert word in proc.stderr, (word, proc.stderr)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("override, words", [
    ("train.steps=abc", ["train.steps='abc': must be an integer >= 1"]),
    ("optim.lr=-1", ["optim.lr=-1: must be a number > 0"]),
    ("+optim.lrr=1", ["optim.lrr=1: unknown key; did you mean optim.lr?"]),
    ("optim.lrr=1", ["optim.lrr=1: unknown key; did you mean optim.lr?"]),
    ("variant.reducer.bits=3", ["variant=cub4 with 8 process(es)", "bits=3"]),
    ("+exp=nope", ["+exp=nope: no preset 'nope'"]),
])
def test_a_job_that_would_fail_is_refused_with_src_trains_message(override, words, tmp_path):
    """src.train's own checks, for rank 0 of the job on 2 nodes x 4 GPUs: a dry run writes no script either."""
    proc = submit("+exp=gpt774m_4bit", override, "--profile", "example", "--dry-run", "--skip-data-check",
                  out=tmp_path / "out")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("slurm.submit: cannot submit: run ") and len(proc.stderr.splitlines()) == 1
    for word in words:
        assert word in proc.stderr, (word, proc.stderr)
    assert not (tmp_path / "out").exists()


def test_missing_data_is_refused_where_this_machine_sees_it(tmp_path):
    """Data under the repository (the job runs there) is checked here; a path this machine lacks is the job's."""
    proc = submit("+exp=resnet18_4bit", f"data.root={tmp_path / 'nothing'}", "--profile", "example", "--dry-run",
                  out=tmp_path / "out")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert "no CIFAR-100 data at" in proc.stderr and "--skip-data-check" in proc.stderr
    proc = submit("+exp=resnet18_4bit", "data.root=/no-such-mount/cifar100", "--profile", "example", "--dry-run",
                  out=tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert "data /no-such-mount/cifar100 is on a path this machine does not have" in proc.stderr
    assert "the job checks it where it runs" in proc.stderr


def test_manifest_source_at_both_scales(tmp_path):
    """A figure's manifest (experiments/<name>.yaml) as the source: a shape the profile's nodes cannot hold is refused
    naming the run and the way out; its laptop runs (Fig. 4: the 4-worker statistics run at its 5 seeds) fit 2
    local nodes of 2 processes, one array task per seed."""
    proc = submit("fig5", "--profile", "local", out=tmp_path / "out")
    assert proc.returncode == 2 and "gpt774m_stats_8w" in proc.stderr and "--nproc-per-node" in proc.stderr
    proc = submit("fig4", "--scale", "laptop", "--profile", "local", "--nodes", "2", "--nproc-per-node", "2",
                  "--dry-run", "--skip-data-check", out=tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert "RUNS=(" + " ".join(f"gpt_stats_4w-seed{s}" for s in range(1, 6)) + ")" in proc.stdout
    assert "stats.every=20" in proc.stdout and "seed=5" in proc.stdout
    assert "nothing was submitted" in proc.stdout and not (tmp_path / "out").exists()


def test_profile_times_and_overrides():
    assert [parse_time(t) for t in ("30", "10:00", "24:00:00", "2-00:00:00", "1-12")] == [1800, 600, 86400,
                                                                                           172800, 129600]
    with pytest.raises(SubmitError, match="not a Slurm time"):
        parse_time("1h")
    profile = load_profile("example", {"partition": "debug", "qos": "high", "account": None})
    assert (profile.partition, profile.qos, profile.account, profile.partition_spec().max_nodes) == ("debug", "high",
                                                                                                     None, 2)


def test_readme_shows_the_current_dry_run(tmp_path):
    """The README's script is what `--dry-run` prints today (paths and time stamp aside)."""
    proc = submit("+exp=gpt774m_4bit", "checkpoint.every=500", "--profile", "example", "--dry-run",
                  "--skip-data-check", out=REPO / "runs" / "slurm")
    assert proc.returncode == 0, proc.stderr

    def normal(text: str) -> str:
        text = text.replace(str(REPO), "~/lioncub")
        return re.sub(r"gpt774m_4bit-\d{8}-\d{6}", "gpt774m_4bit-<time>", text).strip()

    readme = (REPO / "README.md").read_text()
    start = readme.index("# sbatch ~/lioncub/runs/slurm/gpt774m_4bit-")
    assert normal(readme[start:readme.index("```", start)]) == normal(proc.stdout)


def test_manifest_runs_go_through_the_manifest_loader(monkeypatch, capsys, tmp_path):
    """The adapter over `experiments.manifest.load_manifest`, with its own `Manifest` and `RunSpec`
    and a stand-in manifest: names, overrides, nodes and processes of the manifest's runs reach the scripts."""
    import experiments.manifest as manifests
    from experiments.manifest import Manifest, ManifestError, RunSpec as Run

    from slurm.submit import main

    def load_manifest(name_or_path, scale):
        if name_or_path != "fig5":
            raise ManifestError(f"no experiments/{name_or_path}.yaml")
        return Manifest("fig5", "Fig. 5", scale, "analysis.fig5",
                        [Run("cub4", ["+exp=demo", "variant=cub4"], nproc_per_node=2),
                         Run("lion32", ["+exp=demo", "variant=lion32"], nproc_per_node=2),
                         Run("cub4_2n", ["+exp=demo", "variant=cub4"], nodes=2, nproc_per_node=2)])

    monkeypatch.setattr(manifests, "load_manifest", load_manifest)
    assert main(["fig5", "--scale", "laptop", "train.steps=7", "--profile", "local", "--dry-run", "--skip-data-check",
                 "--out", str(tmp_path)]) == 0  # the stand-in's data need not exist here
    out = capsys.readouterr().out
    one_node, two_nodes = scripts(out)
    assert "#SBATCH --array=0-1" in one_node and "RUNS=(cub4 lion32)" in one_node
    assert "1) OVERRIDES=(+exp=demo variant=lion32 train.steps=7 network=emulated" in one_node
    assert "#SBATCH --nodes=2" in two_nodes and "RUNS=(cub4_2n)" in two_nodes
    assert main(["fig6", "--profile", "local", "--dry-run"]) == 2
    assert "manifest 'fig6': no experiments/fig6.yaml" in capsys.readouterr().err
