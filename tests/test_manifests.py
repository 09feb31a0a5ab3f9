"""Experiment manifests (experiments/): every manifest loads at every scale (paper, laptop, tiny), each run it names
composes with the real Hydra config (so every preset exists and every override applies), world sizes and periodic
checkpoints are consistent, runs shared between manifests share one folder, every laptop run's tokens fit inside
the laptop corpus (no training token twice) in its model's vocabulary, and a bad manifest is a message, exit
status 2."""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from experiments.manifest import CPU_SCALES, SCALES, ManifestError, RunSpec, load_manifest, manifest_names
from experiments.runner import command, run_folder

REPO = Path(__file__).resolve().parents[1]
EXPECTED = {"table1", "fig2", "table2", "fig3", "fig4", "fig5", "fig6", "fig7", "fig8", "fig9", "fig10", "tableA1",
            "fig11", "fig12", "fig13", "figA1", "figA2", "figA3", "figB1", "figC1", "figC2", "node_mode"}

def composable(spec: RunSpec) -> list[str]:
    overrides = list(spec.overrides)
    if spec.launcher == "emulate" and (spec.rate or "").startswith("paper_"):  # what src.launch.paper_link adds
        overrides += [f"network={spec.rate}", "network.calibration=results/calibration/x.json",
                      "network.calibrated_share=0.8", "network.beta=1e-8"]
    elif spec.launcher == "emulate":   # what src.launch.emulate adds
        overrides += ["network=emulated", f"network.nodes={spec.nodes}",
                      f"network.nproc_per_node={spec.nproc_per_node}", f"network.rate={spec.rate or '1gbit'}"]
    return overrides + ["run.dir=/tmp/never"]


def test_one_manifest_per_figure_and_table():
    assert set(manifest_names()) == EXPECTED


@pytest.mark.parametrize("scale", [pytest.param(s, marks=pytest.mark.slow) if s != "laptop" else s for s in SCALES])
def test_every_run_composes(scale):
    composed: dict[tuple, object] = {}
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        for name in manifest_names():
            manifest = load_manifest(name, scale)
            assert manifest.analysis.startswith("analysis.") and manifest.caption and manifest.finding
            assert len({r.name for r in manifest.runs}) == len(manifest.runs)
            for spec in manifest.runs:
                if spec.module != "src.train":
                    assert spec.module == "src.bench.comm_bench" and "--out" not in spec.args
                    continue
                key = tuple(composable(spec))
                if key not in composed:
                    composed[key] = compose(config_name="config", overrides=list(key))
                cfg = composed[key]
                if cfg.get("expect_world_size") is not None:
                    assert cfg.expect_world_size == spec.world_size, (name, spec.name)
                if scale in CPU_SCALES:
                    assert spec.minutes, (name, spec.name)
                    assert spec.launcher == "emulate" or spec.nodes == 1, (name, spec.name)
                assert "'" not in (cfg.run.get("label") or ""), (name, spec.name)
    assert len(composed) > 40


@pytest.mark.parametrize("scale", CPU_SCALES)
def test_laptop_cost_and_sharing(scale):
    shared = {name: [run_folder(s, Path("r")).name for s in load_manifest(name, scale).runs]
              for name in ("table2", "fig4", "fig5", "fig8", "figC2", "fig10", "tableA1", "fig6", "fig9")}
    workers4 = shared["table2"][:len(shared["table2"]) // 2]
    assert shared["fig4"] == shared["fig8"] == shared["figC2"] == workers4
    assert shared["fig5"] == shared["table2"][len(workers4):]          # Fig. 5 reads the 8-worker runs
    synced = {n for n in shared["fig9"] if n.startswith("sync_b095")}
    assert shared["fig10"] == shared["tableA1"] and synced and synced <= set(shared["fig6"])
    limits = ((None, 120), (1, 50)) if scale == "laptop" else ((None, 60),)  # default seeds, and SEEDS=1
    for seeds, limit in limits:
        distinct = {run_folder(s, Path("r")).name: s for n in manifest_names()
                    for s in load_manifest(n, scale, seeds).runs}
        assert sum(s.minutes for s in distinct.values()) < limit, (seeds, limit)


@pytest.mark.slow  # a whole training run (or several): over 30 s on 2 cores
def test_laptop_token_budget_fits_inside_the_corpus():
    """Every laptop GPT run draws at most as many training tokens (steps x ranks x batch x block, from its resolved
    config) as the laptop corpus guarantees, in the corpus's compact vocabulary: no token is seen twice in
    expectation, as in the paper's runs (3 % of an OpenWebText epoch at Table 2's iteration 3000)."""
    from src.data.laptop_corpus import LAPTOP_MIN_TRAIN_TOKENS, LAPTOP_VOCAB_SIZE

    budgets = {}
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        for name in manifest_names():
            for spec in load_manifest(name, "laptop").runs:
                if spec.module != "src.train" or run_folder(spec, Path("r")).name in budgets:
                    continue
                cfg = compose(config_name="config", overrides=composable(spec))
                if cfg.data.kind != "tokens":
                    continue
                assert cfg.data.dir == "data/laptop_text" and cfg.model.params.vocab_size == LAPTOP_VOCAB_SIZE, \
                    (name, spec.name)
                tokens = cfg.train.steps * spec.world_size * cfg.data.batch_size * cfg.data.block_size
                assert tokens <= LAPTOP_MIN_TRAIN_TOKENS, (name, spec.name, tokens)
                budgets[run_folder(spec, Path("r")).name] = tokens
    assert len(budgets) > 20


def test_commands():
    spec = load_manifest("fig12", "laptop").runs[0]
    cmd = command(spec, Path("/x"))
    assert cmd[1:8] == ["-m", "src.launch.emulate", "nodes=2", "nproc_per_node=2", "rate=1gbit", "--", "+exp=laptop"]
    assert cmd[-1] == "run.dir=/x" and "++run.label='Lion 32bit'" in cmd
    bench = load_manifest("table1", "laptop").runs[0]
    assert command(bench, Path("/x"))[-2:] == ["--out", "/x/comm.csv"]
    assert command(bench, Path("/x"))[6:9] == ["--module", "src.bench.comm_bench", "--"]
    local = load_manifest("fig3", "laptop").runs[0]
    assert command(local, Path("/x"))[1:6] == ["-m", "src.launch.torchrun", "--standalone", "--nproc_per_node=4",
                                               "-m"]


def test_the_paper_command_of_a_2x4_run_starts_8_ranks_on_2_nodes():
    """What `python -m experiments.manifest fig12 --scale paper` prints: the multi-node torchrun, plain `python`."""
    proc = subprocess.run([sys.executable, "-m", "experiments.manifest", "fig12", "--scale", "paper"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    runs = [line for line in proc.stdout.splitlines() if "[2x4, torchrun]" in line]
    assert len(runs) == 8
    for line in runs:
        cmd = shlex.split(line.split(": ", 1)[1])
        assert cmd[:3] == ["python", "-m", "src.launch.torchrun"] and "--nnodes=2" in cmd
        assert "--nproc_per_node=4" in cmd and "--standalone" not in cmd and "--rdzv_backend=c10d" in cmd
    assert "python -m slurm.submit fig12 --scale paper" in proc.stdout


def write_manifest(tmp_path, runs, scale="laptop", **top):
    data = {"name": "mine", "figure": "Fig. 99", "analysis": "analysis.fig3", "scales": {scale: {"runs": runs}},
            **top}
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("runs, scale, message", [
    ([{"name": "a", "overrides": ["+exp=gpt774m_4bitt"]}], "laptop", "preset 'gpt774m_4bitt' does not exist"),
    ([{"name": "a", "overrides": ["+exp=demo"]}, {"name": "a", "overrides": ["+exp=demo"]}], "laptop",
     "run name 'a' appears twice"),
    ([{"name": "a", "overrides": ["+exp=demo"], "launcher": "srun"}], "laptop", "launcher 'srun'"),
    ([{"name": "a", "overrides": ["+exp=gpt774m_4bit", "checkpoint.every=0"], "nodes": 2, "nproc_per_node": 4}],
     "paper", "remove checkpoint.every=0"),
    ([{"name": "a", "overrides": ["+exp=demo", "expect_world_size=8"], "nproc_per_node": 4}], "laptop",
     "expect_world_size=8"),
    ([{"use": "no_such_template"}], "laptop", "run template 'no_such_template'"),
    ([{"name": "a", "overrides": ["variant=cub4"]}], "laptop", "start from a preset"),
    ([{"name": "a", "overrides": ["+exp=demo"], "colour": "red"}], "laptop", "unknown keys ['colour']"),
])
def test_bad_manifests(tmp_path, runs, scale, message):
    with pytest.raises(ManifestError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_manifest(write_manifest(tmp_path, runs, scale), scale)


def test_bad_names_and_scales(tmp_path):
    with pytest.raises(ManifestError, match="no manifest 'fig99'; known: table1, fig2"):
        load_manifest("fig99", "laptop")
    with pytest.raises(ManifestError, match="unknown scale 'cluster'"):
        load_manifest("fig5", "cluster")
    with pytest.raises(ManifestError, match="lacks analysis"):
        load_manifest(write_manifest(tmp_path, [{"name": "a", "overrides": ["+exp=demo"]}], analysis=""), "laptop")


def test_command_line_missing_preset_exits_2(tmp_path):
    path = write_manifest(tmp_path, [{"name": "a", "overrides": ["+exp=gpt9000m_4bit"]}])
    proc = subprocess.run([sys.executable, "-m", "experiments.manifest", str(path)], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "preset 'gpt9000m_4bit' does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "experiments.manifest", "fig5", "--scale", "paper"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "+exp=gpt774m_4bit" in proc.stdout
