"""What notebooks/figures.ipynb calls: draw one figure or table of Lion Cub from a runs folder with its analysis
script, and show it with its checks (the notebook stays a list of `show("fig5")` cells with a few words each), after
a first table of every figure's verdict (`verdicts`).

The runs of a figure are the finished runs of its manifest in the runs folder that `make figures` fills
(`<runs>/<run name>-<key>`, experiments/runner.py), or any sources given for it (run folders, folders of runs,
`wandb:ENTITY/PROJECT`). The figure is drawn by the analysis module's `make(runs, out)`, the same code as
`python -m analysis.figN`; each is drawn once per notebook session (the verdict table draws them all, the cells below
show them).

    python -m experiments.notebook [--out results/notebook/figures.ipynb] [--runs results/runs]   (`make notebook`)

executes notebooks/figures.ipynb top to bottom (nbclient) and saves the executed copy at `--out`, never over the
tracked notebook.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from experiments.index import VERDICT, cell
from experiments.manifest import REPO, load_manifest, manifest_names
from experiments.runner import is_finished, run_folder

NOTEBOOK = REPO / "notebooks" / "figures.ipynb"
_drawn: dict[tuple, tuple] = {}  # (name, runs, out, sources, scale) -> what `draw` returned, once per session


def manifest_sources(name: str, runs_root: str | Path, scale: str = "laptop") -> list[Path]:
    """The finished run folders of manifest `name` under `runs_root`."""
    manifest = load_manifest(name, scale)
    folders = [(spec, run_folder(spec, Path(runs_root))) for spec in manifest.runs]
    return [folder for spec, folder in folders if is_finished(spec, folder)]


def draw(name: str, runs_root: str | Path, out: str | Path, sources: list | None = None, scale: str = "laptop"):
    """(manifest, Result or None, message): figure `name` drawn into `out/<name>` from its runs (once per session)."""
    key = (name, str(runs_root), str(out), tuple(map(str, sources or ())), scale)
    if key not in _drawn:
        _drawn[key] = _draw(name, runs_root, out, sources, scale)
    return _drawn[key]


def _draw(name: str, runs_root: str | Path, out: str | Path, sources: list | None, scale: str):
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


def tally(result) -> str:
    """`k of n shown` over a figure's decided checks (and how many are undecided)."""
    decided = [c for c in result.checks if c.holds is not None]
    shown = sum(c.holds is True for c in decided)
    undecided = len(result.checks) - len(decided)
    return f"{shown} of {len(decided)} shown" + (f" ({undecided} undecided)" if undecided else "")


def verdict_table(runs_root: str | Path, out: str | Path, sources: dict | None = None, scale: str = "laptop") -> str:
    """A Markdown table of every manifest's figure: its title, its verdict (or why it was not drawn) and its runs."""
    lines = ["| figure | title | verdict | runs |", "|---|---|---|---|"]
    for name in manifest_names():
        manifest, result, message = draw(name, runs_root, out, (sources or {}).get(name), scale)
        verdict = tally(result) if result is not None else f"not drawn: {message}"
        runs = len(manifest_sources(name, runs_root, scale)) if not (sources or {}).get(name) else "given"
        lines.append(f"| {manifest.figure} | {cell(manifest.figure_title)} | {cell(verdict)} | {runs} |")
    return "\n".join(lines)


def verdicts(runs_root: str | Path, out: str | Path, sources: dict | None = None, scale: str = "laptop") -> None:
    """Display `verdict_table` in the notebook."""
    from IPython.display import Markdown, display

    display(Markdown(verdict_table(runs_root, out, sources, scale)))


def execute(out: str | Path, runs_root: str | Path | None = None, figures: str | Path | None = None,
            scale: str = "laptop", timeout: int = 1800) -> Path:
    """Run notebooks/figures.ipynb top to bottom and write the executed copy to `out` (the tracked file is left
    as it is); `runs_root`, `figures` and `scale` become its LIONCUB_RUNS, LIONCUB_FIGURES and LIONCUB_SCALE."""
    import nbformat
    from nbclient import NotebookClient

    out = Path(out).resolve()
    if out == NOTEBOOK.resolve():
        raise ValueError(f"{out} is the tracked notebook; write the executed copy elsewhere")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    settings = {"LIONCUB_RUNS": runs_root, "LIONCUB_FIGURES": figures, "LIONCUB_SCALE": scale}
    saved = {key: os.environ.get(key) for key in settings}
    os.environ.update({key: str(value) for key, value in settings.items() if value is not None})
    try:
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(REPO)}})
        client.execute()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.notebook",
                                     description="execute notebooks/figures.ipynb and save the executed copy")
    parser.add_argument("--out", type=Path, default=Path("results/notebook/figures.ipynb"))
    parser.add_argument("--runs", type=Path, default=None, help="runs folder (default: results/runs)")
    parser.add_argument("--figures", type=Path, default=None, help="where the figures are drawn "
                        "(default: results/notebook_figures)")
    parser.add_argument("--scale", default="laptop", choices=("laptop", "paper"))
    args = parser.parse_args(argv)
    try:
        path = execute(args.out, args.runs, args.figures, args.scale)
    except ValueError as exc:
        print(f"experiments.notebook: {exc}", file=sys.stderr)
        return 2
    print(f"executed notebook: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
