"""The lower layers import only downwards (docs/architecture.md): src/optim -> src/comm -> src/quant, and the cost
model imports without torch (analysis code reads it)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ABOVE = {  # package -> the packages above it, which it must never import
    "src.quant": ("src.comm", "src.optim", "src.engine", "src.stats", "src.reliability", "src.runlog", "src.train"),
    "src.comm": ("src.optim", "src.engine", "src.stats", "src.reliability", "src.runlog", "src.train"),
    "src.optim": ("src.engine", "src.stats", "src.reliability", "src.runlog", "src.train"),
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def imports_of(package: str, forbidden: tuple[str, ...]) -> list[str]:
    """Each import of a module of `forbidden` (or below it) by a file of `package`, one line each."""
    folder = REPO / package.replace(".", "/")
    return [f"{path.relative_to(REPO)} imports {module}" for path in sorted(folder.rglob("*.py"))
            for module in sorted(imported_modules(path))
            if any(module == up or module.startswith(up + ".") for up in forbidden)]


@pytest.mark.parametrize("package", sorted(ABOVE))
def test_a_layer_never_imports_the_layers_above_it(package):
    wrong = imports_of(package, ABOVE[package])
    assert not wrong, "\n".join(wrong)


def test_the_cost_model_imports_without_torch():
    code = "import sys, src.comm.cost.model, src.comm.cost.wire_bytes; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


INSIDE_COMM = {  # a sub-package of src.comm -> the sub-packages it must never import (docs/architecture.md)
    "src.comm.codecs": ("src.comm.reducers", "src.comm.transport", "src.comm.cost"),
    "src.comm.transport": ("src.comm.reducers",),
    "src.comm.cost": ("src.comm.codecs", "src.comm.reducers", "src.comm.transport"),
}


@pytest.mark.parametrize("package", sorted(INSIDE_COMM))
def test_the_wire_format_knows_no_reducer_and_the_cost_model_no_kernel(package):
    wrong = imports_of(package, INSIDE_COMM[package])
    assert not wrong, "\n".join(wrong)
