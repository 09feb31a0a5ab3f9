"""What notebooks/figures.ipynb calls: draw one figure or table of Lion Cub from a runs folder with its analysis
script, and show it with its checks and their spread over seeds (the notebook stays a list of `show("fig5")` cells
with a few words each), after a first table of every figure's verdicts and of every check with its spread
(`verdicts`: the same table as the end of `make figures`' index).

The runs of a figure are the finished runs of its manifest in the runs folder that `make figures` fills
(`<runs>/<run name>-<key>`, experiments/runner.py), or any sources given for it (run folders, folders of runs,
`wandb:ENTITY/PROJECT`). The figure is drawn by `analysis.figure_cli.draw` over the analysis module's
`make(runs, out)` (each seed, then the seeds' mean and spread), the same code as `python -m analysis.figN`; each is
drawn once per notebook session (the verdict table draws them all, the cells below show them).

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

from analysis.verdicts import NOISE, NOT_SHOWN, SHOWN, UNDECIDED
from experiments.index import EVERY_CHECK, cell, check_rows, checks_table, seeds_line, text_label
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
    """(manifest, findings or None, message): figure `name` drawn into `out/<name>` from its runs over their seeds
    (once per session); findings is what findings.json holds (analysis/verdicts.py `Findings.payload`)."""
    key = (name, str(runs_root), str(out), tuple(map(str, sources or ())), scale)
    if key not in _drawn:
        _drawn[key] = _draw(name, runs_root, out, sources, scale)
    return _drawn[key]


def _draw(name: str, runs_root: str | Path, out: str | Path, sources: list | None, scale: str):
    from analysis.figure_cli import MissingRuns, draw as draw_figure
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
        drawn = draw_figure(module.make, runs, Path(out) / name, figure=manifest.figure)
        return manifest, drawn.payload(), ""
    except (MissingRuns, FileNotFoundError) as exc:
        return manifest, None, f"cannot draw {manifest.figure}: {exc}"


def show(name: str, runs_root: str | Path, out: str | Path, sources: list | None = None, scale: str = "laptop"):
    """Draw figure `name` and display it in the notebook: caption, images, tables and the computed checks."""
    from IPython.display import Image, Markdown, display

    manifest, findings, message = draw(name, runs_root, out, sources, scale)
    display(Markdown(f"**{manifest.figure}: {manifest.figure_title}.** *{text_label(manifest, 'caption')}:* "
                     f"{manifest.caption}"))
    if findings is None:
        display(Markdown(f"*Not drawn:* {message}"))
        return None
    for path in map(Path, findings["files"]):
        if path.suffix == ".png":
            display(Image(filename=str(path)))
        elif path.suffix == ".md":
            display(Markdown(path.read_text()))
    if findings["checks"]:
        display(Markdown("\n".join(checks_table(findings)) + f"\n\n{seeds_line(findings)} "
                         f"Machine: {'; '.join(findings.get('machines') or {}) or '-'}."))
    return findings


def tally(findings: dict) -> str:
    """`shown / within noise / not shown` over a figure's checks (and how many are undecided)."""
    n = {v: sum(c["verdict"] == v for c in findings["checks"]) for v in (SHOWN, NOISE, NOT_SHOWN, UNDECIDED)}
    return (f"{n[SHOWN]} shown, {n[NOISE]} within noise, {n[NOT_SHOWN]} not shown"
            + (f" ({n[UNDECIDED]} undecided)" if n[UNDECIDED] else ""))


def verdict_table(runs_root: str | Path, out: str | Path, sources: dict | None = None, scale: str = "laptop") -> str:
    """Markdown: every manifest's figure with its verdicts, seeds and runs (or why it was not drawn), then every
    check with the paper's number, the spread over seeds, k of n and the verdict (as `make figures`' index ends)."""
    lines = ["| figure | title | verdicts | seeds | runs |", "|---|---|---|---|---|"]
    every = ["", *EVERY_CHECK]
    for name in manifest_names():
        manifest, findings, message = draw(name, runs_root, out, (sources or {}).get(name), scale)
        verdict = tally(findings) if findings is not None else f"not drawn: {message}"
        runs = len(manifest_sources(name, runs_root, scale)) if not (sources or {}).get(name) else "given"
        seeds = len((findings or {}).get("seeds") or []) or "-"
        lines.append(f"| {manifest.figure} | {cell(manifest.figure_title)} | {cell(verdict)} | {seeds} | {runs} |")
        every += check_rows(manifest, findings) if findings is not None else []
    return "\n".join(lines + every)


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
