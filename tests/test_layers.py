"""The layer rule: analysis/, experiments/ and slurm/ may import light modules of src/, and src/ never imports them
(one way down; run folders are read by src/runlog, which also writes them). Checked on every file of src/ by
walking its syntax tree, so an import inside a function or behind a try counts as well."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ABOVE = ("analysis", "experiments", "slurm")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in `path`: `import m`, `from m import n` (as m and m.n), import_module("m")."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            found.append((node.lineno, str(node.args[0].value)))
    return found


def upward_imports(root: Path) -> list[str]:
    """`file:line imports module` for every import of analysis/, experiments/ or slurm/ below `root`."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        modules = dict.fromkeys((line, tuple(m.split(".")[:2])) for line, m in imported_modules(path)
                                if m.split(".")[0] in ABOVE)
        bad += [f"{path.relative_to(root)}:{line} imports {'.'.join(m)}" for line, m in modules]
    return bad


def test_src_never_imports_analysis_experiments_or_slurm():
    assert upward_imports(REPO / "src") == []


def test_the_check_finds_an_upward_import(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "ok.py").write_text("import json\nfrom src.runlog.runs import load_runs\n")
    (tmp_path / "src" / "bad.py").write_text("def f():\n    from analysis.report import main\n    return main\n")
    (tmp_path / "src" / "dyn.py").write_text("import importlib\nm = importlib.import_module('slurm.submit')\n")
    assert upward_imports(tmp_path / "src") == ["bad.py:2 imports analysis.report", "dyn.py:2 imports slurm.submit"]


@pytest.mark.parametrize("figure", sorted(p.stem for p in (REPO / "analysis").glob("fig*.py")))
def test_figure_scripts_do_not_import_each_other(figure):
    """What figures share lives in the modules figures share (loss_panels, stats_rows, ...), not in another
    figure's script."""
    parts = [m.split(".") for _, m in imported_modules(REPO / "analysis" / f"{figure}.py")]
    others = [".".join(p) for p in parts if p[0] == "analysis" and len(p) > 1 and p[1].startswith(("fig", "table"))
              and p[1] != "figure_cli"]
    assert others == []
