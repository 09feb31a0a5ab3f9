"""Sweeps and concurrent runs lose nothing: a Hydra multirun under torchrun, atomic run folders, sweep labels.

- `torchrun --nproc_per_node 2 -m src.train -m variant=lion32,cub4 ...` finishes both points, each in its own
  labelled folder of one sweep folder, made by rank 0 alone (no `multirun/` folder anywhere), in one W&B group;
- 4 runs started at once in one root get 4 folders and keep every metrics row (plus a deterministic race of 4
  processes claiming the same folder name);
- the sweep's figures and tables name runs by their labels.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from harness_util import REPO, TORCHRUN_VARS

from src.runlog.report import make_report
from src.runlog.runs import find_runs, load_run
from src.runlog.timing_table import table_rows
from src.engine.sweep import differing, folder, label
from src.runlog.metrics import MetricsWriter, read_metrics
from src.runlog.run_dir import claim_run_dir
from src.runlog.wandb_offline import find_run_file, read_records

TINY = ["data.block_size=16", "data.batch_size=2", "train.eval_every=0", "train.eval_batches=1",
        "train.timing_skip=0", "train.progress=false", "guard.every=0"]


def _env() -> dict:
    return {**{k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}, "OMP_NUM_THREADS": "1",
            "WANDB_SILENT": "true"}


def test_labels_are_the_overrides_that_differ():
    points = [["variant=lion32", "optim.lr=1e-3", "+exp=demo"], ["variant=cub4", "optim.lr=1e-3", "+exp=demo"],
              ["variant=lion32", "optim.lr=3e-3", "+exp=demo"], ["variant=cub4", "optim.lr=3e-3", "+exp=demo"]]
    diffs = differing(points)
    assert [label(d) for d in diffs] == ["variant=lion32, optim.lr=1e-3", "variant=cub4, optim.lr=1e-3",
                                         "variant=lion32, optim.lr=3e-3", "variant=cub4, optim.lr=3e-3"]
    assert folder(3, 4, diffs[3]) == "3-variant_cub4+optim.lr_3e-3"
    assert folder(3, 12, diffs[3]).startswith("03-") and differing([points[0]]) == [[]]


def test_two_point_multirun_under_torchrun(demo_tokens, tmp_path):
    root = tmp_path / "runs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "src.train",
           "-m", "variant=lion32,cub4", "+exp=demo", "train.steps=3", f"data.dir={demo_tokens}", f"run.root={root}",
           "logger=wandb", *TINY]
    env = {**_env(), "PYTHONPATH": str(REPO)}  # started from another folder, so any folder Hydra made would show
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # Hydra made no multirun/ or outputs/ folder
    (sweep,) = root.iterdir()
    assert sorted(p.name for p in sweep.iterdir()) == ["0-variant_lion32", "1-variant_cub4", "multirun.yaml",
                                                       "sweep.yaml"]
    plan = yaml.safe_load((sweep / "sweep.yaml").read_text())
    assert [r["label"] for r in plan["runs"]] == ["variant=lion32", "variant=cub4"]
    runs = [load_run(p) for p in find_runs([sweep])]
    groups = set()
    for run, variant in zip(runs, ("lion32", "cub4")):
        assert [r["step"] for r in run.rows] == [0, 1, 2, 3] and run.summary["world_size"] == 2
        assert run.label == f"variant={variant}" and run.config["run"]["sweep"] == str(sweep.resolve())
        records = list(read_records(find_run_file(run.path / "wandb")))
        groups |= {r.run.run_group for r in records if r.WhichOneof("record_type") == "run"}
    assert groups == {sweep.name}  # the runs of a sweep share one W&B group
    assert proc.stdout.count(f"lioncub: sweep of 2 runs in {sweep.resolve()}") == 1  # rank 0 alone
    assert [r["label"] for r in table_rows([r.path for r in runs])] == ["variant=lion32", "variant=cub4"]


def _claim_and_log(path: str, start, out) -> None:
    start.wait()
    run_dir = claim_run_dir(Path(path), explicit=False)
    writer = MetricsWriter(run_dir / "metrics.jsonl")
    for step in range(50):
        writer.log({"step": step, "pid": os.getpid()})
    writer.close()
    out.put(str(run_dir))


def test_four_claims_of_one_name_get_four_folders(tmp_path):
    ctx = mp.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_claim_and_log, args=(str(tmp_path / "20260101-000000-race"), start, out))
             for _ in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
    dirs = sorted(out.get(timeout=5) for _ in procs)
    assert [Path(d).name for d in dirs] == ["20260101-000000-race", *(f"20260101-000000-race-{n}" for n in (2, 3, 4))]
    for d in dirs:  # every run kept its own 50 rows, none mixed with another's
        rows = list(read_metrics(Path(d) / "metrics.jsonl"))
        assert [r["step"] for r in rows] == list(range(50)) and len({r["pid"] for r in rows}) == 1


@pytest.mark.slow  # make test's time: the two-point multirun above starts runs together too
def test_four_runs_started_at_once_get_four_folders(demo_tokens, tmp_path):
    root = tmp_path / "race"
    cmd = [sys.executable, "-m", "src.train", "variant=lion", "train.steps=3", f"data.dir={demo_tokens}",
           f"run.root={root}", "run.name=race", *TINY]
    procs = [subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(4)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outs
    folders = sorted(root.iterdir())
    assert len(folders) == 4
    for run in folders:
        assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [0, 1, 2, 3]
        assert [a["kind"] for a in map(json.loads, (run / "attempts.jsonl").read_text().splitlines())] == ["start"]
    printed = {line.split("run folder ", 1)[1] for out in outs for line in out.splitlines()
               if line.startswith("lioncub: run folder ")}
    assert printed == {str(f.resolve()) for f in folders}


def test_figures_and_tables_name_runs_by_label(tmp_path):
    from test_train_units import fake_run

    runs = []
    for lr in ("1e-3", "3e-3"):
        run = fake_run(tmp_path / lr, "cub4", {"forward": 10.0, "communicate": 5.0})
        config = yaml.safe_load((run / "config.yaml").read_text())
        (run / "config.yaml").write_text(yaml.safe_dump({**config, "run": {"label": f"optim.lr={lr}"}}))
        runs.append(run)
    rows = table_rows(runs)
    assert [(r["label"], r["variant"]) for r in rows] == [("optim.lr=1e-3", "cub4"), ("optim.lr=3e-3", "cub4")]
    make_report(find_runs([tmp_path]), tmp_path / "report")
    assert "optim.lr=3e-3" in (tmp_path / "report" / "timing.md").read_text()


@pytest.mark.parametrize("path", ["missing", "empty"])
def test_find_runs_names_what_is_missing(path, tmp_path):
    from src.runlog.runs import NotARunError

    (tmp_path / "empty").mkdir()
    with pytest.raises(NotARunError, match=str(tmp_path / path)):
        find_runs([tmp_path / path])
