"""What notebooks/figures.ipynb calls: draw one figure or table of Lion Cub from a runs folder with its analysis
script, and show it with its checks (the notebook stays a list of `show("fig5")` cells with a few words each).

The runs of a figure are the finished runs of its manifest in the runs folder that `make figures` fills
(`<runs>/<run name>-<key>`, experiments/runner.py), or any sources given for it (run folders, folders of runs,
`wandb:ENTITY/PROJECT`). The figure is drawn by the analysis module's `make(runs, out)`, the same code as
`python -m analysis.figN`.
"""
from __future__ import annotations

import importlib
from pathlib import Path

from experiments.index import VERDICT, cell
from experiments.manifest import load_manifest
from experiments.runner import is_finished, run_folder


def manifest_sources(name: str, runs_root: str | Path, scale: str = "laptop") -> list[Path]:
    """The finished run folders of manifest `name` under `runs_root`."""
    manifest = load_manifest(name, scale)
    folders = [(spec, run_folder(spec, Path(runs_root))) for spec in manifest.runs]
    return [folder for spec, folder in folders if is_finished(spec, folder)]


def draw(name: str, runs_root: str | Path, out: str | Path, sources: list | None = None, scale: str = "laptop"):
    """(manifest, Result or None, message): figure `name` drawn into `out/<name>` from its runs."""
    from analysis.figure_cli import MissingRuns
    from src.runlog.runs import load_runs

    manifest = load_manifest(name, scale)
    sources = sources or manifest_sources(name, runs_root, scale)
    if not sources:
        return manifest, None, f"no finished runs of {manifest.figure} under {runs_root} (`make figures FIGS={name}`)"
    try:
        module = importlib.import_module(manifest.analysis)
    except ModuleNotFoundError as exc:
        return manifest, None, f"{manifest.analysis} is not in this checkout ({exc})"
    try:
        runs = getattr(module, "load", load_runs)(sources)
        return manifest, module.make(runs, Path(out) / name), ""
    except (MissingRuns, FileNotFoundError) as exc:
        return manifest, None, f"cannot draw {manifest.figure}: {exc}"


def show(name: str, runs_root: str | Path, out: str | Path, sources: list | None = None, scale: str = "laptop"):
    """Draw figure `name` and display it in the notebook: caption, images, tables and the computed checks."""
    from IPython.display import Image, Markdown, display

    manifest, result, message = draw(name, runs_root, out, sources, scale)
    display(Markdown(f"**{manifest.figure}: {manifest.figure_title}.** *Paper:* {manifest.caption}"))
    if result is None:
        display(Markdown(f"*Not drawn:* {message}"))
        return None
    for path in result.files:
        if path.suffix == ".png":
            display(Image(filename=str(path)))
        elif path.suffix == ".md":
            display(Markdown(path.read_text()))
    rows = [f"| {cell(c.claim)} | {cell(c.measured)} | {VERDICT[c.holds]} |" for c in result.checks]
    if rows:
        display(Markdown("| paper's finding | measured here | verdict |\n|---|---|---|\n" + "\n".join(rows)))
    return result
