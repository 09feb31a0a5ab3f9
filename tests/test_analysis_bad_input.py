"""Bad input to every figure and table script (analysis/figure_cli.py): a folder without the runs a figure needs,
an empty folder or a path that does not exist gives a message naming what is missing and exit status 2, no traceback."""
from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from fake_runs import gpt_config, write_run

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = ("table1", "fig2", "table2", "fig3", "fig4", "fig5", "fig6", "fig7", "fig8", "fig9", "fig10", "tableA1",
           "fig11", "fig12", "fig13", "figA2", "figA3", "figB1", "figC1", "figC2", "node_mode")
BENCH = ("table1", "fig2")
# What each message must name when the folder holds one run with nothing but a training loss.
NAMES = {"table2": "stats/vote/pos_pos", "fig3": "zeros", "fig4": "stats/vote/pos_pos", "fig5": "stats/match/sign",
         "fig6": "val/loss", "fig7": "stats/momentum_std/max", "fig8": "stats/momentum_std/max",
         "fig9": "variant.reducer.quant=l1", "fig10": "time/total", "tableA1": "time/total", "fig11": "time/total",
         "fig12": "Lion (32bit)", "fig13": "val/acc", "figA2": "Lion (32bit)", "figA3": "Lion (32bit)",
         "figB1": "stats/momentum_std/max", "figC1": "stats/match/sign", "figC2": "stats/vote/pos_pos",
         "table1": "comm.csv", "fig2": "comm.csv", "node_mode": "cub4_node"}


@pytest.fixture(scope="module")
def plain_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("plain")
    write_run(root / "run", gpt_config("cub4", zeros=None), [{"step": s, "loss": 5.0} for s in range(1, 4)])
    return root


@pytest.mark.parametrize("name", SCRIPTS)
def test_missing_runs_exit_2_naming_what_is_missing(name, plain_runs, tmp_path, capsys):
    module = importlib.import_module(f"analysis.{name}")
    assert module.main([str(plain_runs), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert NAMES[name] in err and "cannot draw" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "findings.json").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert module.main([str(empty), "--out", str(tmp_path / "out")]) == 2
    assert ("no comm.csv" if name in BENCH else "no run folders") in capsys.readouterr().err
    assert module.main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")]) == 2
    assert "nowhere" in capsys.readouterr().err


def test_command_line_exit_status(plain_runs, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "analysis.fig5", str(plain_runs), "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and "stats/match/sign" in proc.stderr and "Traceback" not in proc.stderr
