"""The typed configuration (src/engine/schema.py): every problem refused before training, one line each, exit 2.

In-process checks compose the real Hydra config; the CLI checks run `python -m src.train` (and once torchrun with
2 ranks, where the message must be printed once, by rank 0, before torchrun's own report; and src.launch.torchrun,
which ends with lioncub's line, and refuses a command line Hydra would refuse before it starts any rank) and check
the exit status, the message and that no run folder was made. Also: each model family brings its optimizer defaults.
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Annotated

import pytest
from harness_util import REPO, TORCHRUN_VARS, cfg_with

from src.engine.schema import config_problems
from src.utils.typecheck import Doc, OneOf, Range, describe

BAD = {  # out-of-range, misspelt and mistyped values, and the line that must name each
    "optim.clip=-1": "optim.clip=-1: must be a number >= 0 (0 or null: no clipping)",
    "+train.stepz=2": "train.stepz=2: unknown key; did you mean train.steps?",
    "optim.beta1=1.5": "optim.beta1=1.5: must be a number in [0, 1)",
    "optim.weight_decay=-1": "optim.weight_decay=-1: must be a number >= 0",
    "optim.lr=abc": "optim.lr='abc': must be a number > 0",
}


@pytest.mark.parametrize("override", BAD)
def test_each_bad_value_is_one_named_problem(override):
    found = config_problems(cfg_with(override))
    assert len(found) == 1 and found[0].startswith(BAD[override]), found


def test_every_problem_is_reported_at_once():
    found = config_problems(cfg_with(*BAD, "+foo=1", "model.params.n_layer=0", "+model.params.n_layers=3"))
    assert len(found) == 8
    for line in BAD.values():
        assert any(p.startswith(line) for p in found), (line, found)
    assert any(p.startswith("foo=1: unknown key (top-level keys:") for p in found)
    assert "model.params.n_layer=0: must be an integer >= 1, or null" in found
    assert any(p.startswith("model.params.n_layers=3: unknown key; did you mean model.params.n_layer?") for p in found)


def test_statistics_block_and_untied_embeddings_are_accepted():  # (every preset passes: tests/test_configs.py)
    cfg = cfg_with("stats.every=10", "stats.quantizers=[sign,l1]", "stats.levels={sign:1,l1:15}",
                   "model.params.tie_embeddings=false", "model.params.n_layer=null")
    assert config_problems(cfg) == []
    assert config_problems(cfg_with("model.params.tie_embeddings=3")) == [
        "model.params.tie_embeddings=3: must be true or false, or null"]


def test_model_paired_with_the_wrong_data_is_one_problem():
    found = config_problems(cfg_with("model=resnet18"))
    assert len(found) == 1 and "resnet18_cifar" in found[0] and "cifar100" in found[0]


def test_descriptions():
    assert describe(Annotated[int, Range(ge=1)] | None) == "an integer >= 1, or null"
    assert describe(Annotated[float, Range(gt=0, le=1)]) == "a number in (0, 1]"
    assert describe(Annotated[str, OneOf(("a", "b"))]) == "one of a, b"
    assert describe(Annotated[bool | str, Doc("yes or a path", replace=True)]) == "yes or a path"


@pytest.mark.parametrize("model, optim", [("resnet18", "vision"), ("deit_tiny", "vision"), ("gpt124m", "gpt"),
                                          ("gpt_tiny", "gpt")])
def test_each_model_family_brings_its_optimizer_defaults(model, optim):
    data = "synthetic_cifar" if optim == "vision" else "demo_text"
    expected = cfg_with(f"optim={optim}").optim
    assert cfg_with(f"model={model}", f"data={data}").optim == expected
    other = "gpt" if optim == "vision" else "vision"
    assert cfg_with(f"model={model}", f"data={data}", f"optim={other}").optim == cfg_with(f"optim={other}").optim
    assert cfg_with(f"model={model}", f"data={data}", "optim.lr=0.5").optim.lr == 0.5


def test_every_model_option_has_optimizer_defaults():
    models = {p.stem for p in (REPO / "conf" / "model").glob("*.yaml")}
    assert models == {p.stem for p in (REPO / "conf" / "optim" / "model").glob("*.yaml")}


def _env() -> dict:
    return {**{k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}, "OMP_NUM_THREADS": "1"}


def cli(*args: str, module: tuple[str, ...] = ("-m", "src.train")) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *module, *args], cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=600, check=False)


@pytest.mark.parametrize("override", BAD)
def test_cli_refuses_each_bad_value_with_status_2(override, tmp_path):
    proc = cli(override, f"run.root={tmp_path / 'runs'}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("lioncub: cannot start training: " + BAD[override]), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()


def test_script_path_works_and_refuses_too(tmp_path):
    """`python src/train.py` imports the repository (no module shadowing) and reaches the same checks."""
    proc = cli("optim.lr=abc", f"run.root={tmp_path / 'runs'}", module=("src/train.py",))
    assert proc.returncode == 2 and proc.stderr.startswith("lioncub: cannot start training: optim.lr='abc'")


def test_torchrun_prints_every_problem_once_first_and_the_worker_exits_2(tmp_path):
    """Plain torchrun: rank 0's message comes once before torchrun's report, and again as its root cause at the end."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "src.train",
           *BAD, f"run.root={tmp_path / 'runs'}"]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600, check=False)
    out = proc.stdout
    assert proc.returncode != 0 and "exitcode  : 2" in out, out[-3000:]
    first = out.index("lioncub: cannot start training: 5 problems in the configuration:")
    report = out.index("Root Cause (first observed failure)")
    assert out[:report].count("lioncub: cannot start training") == 1 and "Traceback" not in out[:first]
    for line in BAD.values():
        assert line in out[first:first + 2000]
    assert "traceback : lioncub: cannot start training: 5 problems" in out[report:]
    assert out.rstrip().splitlines()[-2].endswith("(exit 2: configuration)")
    assert not (tmp_path / "runs").exists()


def test_under_the_torchrun_launcher_the_last_line_is_lioncubs_and_the_status_2(tmp_path):
    """`python -m src.launch.torchrun` (torchrun's arguments): torchrun's report stays, lioncub's line ends it."""
    cmd = [sys.executable, "-m", "src.launch.torchrun", "--standalone", "--nproc_per_node=2", "-m", "src.train",
           "optim.lr=-1", f"run.root={tmp_path / 'runs'}"]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600, check=False)
    out = proc.stdout
    assert proc.returncode == 2, out[-3000:]
    assert "Root Cause (first observed failure)" in out and "Traceback" not in out
    assert out.rstrip().splitlines()[-1] == ("lioncub: cannot start training: optim.lr=-1: must be a number > 0 "
                                             "(exit 2: configuration)")
    assert not (tmp_path / "runs").exists()


HYDRA_REFUSES = {  # a command line Hydra would refuse on every rank, and the start of lioncub's line for it
    "variant=nope": "lioncub: cannot start training: variant=nope: no variant option 'nope' (no conf/variant/",
    "train.nokey=1": "lioncub: cannot start training: train.nokey=1: unknown key (keys of train: steps, epochs,",
    "optim.lr=[": "lioncub: cannot start training: optim.lr=[: no viable alternative at input '['",
}


@pytest.mark.parametrize("override", HYDRA_REFUSES)
def test_under_the_torchrun_launcher_hydras_refusal_is_lioncubs_one_line_and_status_2(override, tmp_path):
    """A command line Hydra refuses starts no rank: the launcher prints lioncub's line once, last, and exits 2."""
    cmd = [sys.executable, "-m", "src.launch.torchrun", "--standalone", "--nproc_per_node=2", "-m", "src.train",
           override, f"run.root={tmp_path / 'runs'}"]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300, check=False)
    out = proc.stdout
    lines = [line for line in out.splitlines() if line.strip()]
    assert proc.returncode == 2, out[-3000:]
    assert out.count("lioncub:") == 1 and lines[-1].startswith(HYDRA_REFUSES[override]), out[-3000:]
    assert lines[-1].endswith("(exit 2: configuration)"), out[-3000:]
    assert "Traceback" not in out and "FAILED" not in out and not (tmp_path / "runs").exists()


def test_a_typo_in_a_plain_override_gets_did_you_mean(tmp_path):
    """`optim.lrr=1` (no +): the schema's one line naming optim.lr, not Hydra's advice to append the key."""
    proc = cli("optim.lrr=1", f"run.root={tmp_path / 'runs'}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("lioncub: cannot start training: optim.lrr=1: unknown key; did you mean optim.lr?")
    assert len(proc.stderr.splitlines()) == 1 and "+optim.lrr" not in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_an_unknown_preset_is_one_line_with_the_near_ones(tmp_path):
    proc = cli("+exp=gpt774m_4bt", f"run.root={tmp_path / 'runs'}")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr[-3000:]
    assert proc.stderr.startswith("lioncub: cannot start training: +exp=gpt774m_4bt: no preset 'gpt774m_4bt'")
    assert "did you mean gpt774m_4bit" in proc.stderr
    proc = cli("+exp=nope", f"run.root={tmp_path / 'runs'}")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr[-3000:]
    assert "+exp=nope: no preset 'nope' (no conf/exp/nope.yaml)" in proc.stderr


def test_wandb_online_without_a_key_is_refused_before_the_run_folder(tmp_path):
    env = {k: v for k, v in _env().items() if not k.startswith("WANDB_") and k != "NETRC"}
    env["HOME"] = str(tmp_path / "home")  # no ~/.netrc, so no `wandb login` here
    proc = subprocess.run([sys.executable, "-m", "src.train", "logger=wandb", "logger.mode=online",
                           f"run.root={tmp_path / 'runs'}"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.startswith("lioncub: cannot start training: logger=wandb logger.mode=online, but W&B has no "
                                  "API key here") and len(proc.stderr.splitlines()) == 1
    assert "wandb login" in proc.stderr and "logger.mode=offline" in proc.stderr
    assert not (tmp_path / "runs").exists() and not (REPO / "wandb").exists()


def test_report_of_a_missing_folder_is_a_message(tmp_path):
    proc = cli(str(tmp_path / "nonexist"), "--out", str(tmp_path / "out"), module=("-m", "analysis.report"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"analysis.report: error: {tmp_path / 'nonexist'} does not exist")


def test_overrides_read_before_hydra():
    """Plain overrides of keys the schema knows are unknown, and of the reducer's keys (its owner checks them by name),
    become `++`; group options are checked by file."""
    from src.engine.overrides import group_problems, with_schema_keys

    args = ["optim.lrr=1", "optim.lr=1", "-m", "seed=1,2", "seedd=3", "+optim.lrr=2", "hydra.run.dir=x",
            "model=gpt_tiny", "variant.reducer.bits=3", "data.block_size=8", "data.nope=1"]
    assert with_schema_keys(args) == ["++optim.lrr=1", "optim.lr=1", "-m", "seed=1,2", "++seedd=3", "+optim.lrr=2",
                                      "hydra.run.dir=x", "model=gpt_tiny", "++variant.reducer.bits=3",
                                      "data.block_size=8", "++data.nope=1"]
    assert group_problems(["optim=model/gpt_tiny", "+exp=demo", "variant=cub4,lion32", "hydra/launcher=x"]) == []
    (problem,) = group_problems(["variant=cub4,cub5"])
    assert problem.startswith("variant=cub4,cub5: no variant option 'cub5' (no conf/variant/cub5.yaml); did you mean")
