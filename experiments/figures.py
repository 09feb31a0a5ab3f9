"""`make figures`: run every laptop-scale manifest (the scale model of docs/scale_model.md; `--scale tiny`: the
quick GPT-2++ tiny runs) here and redraw every figure and table of Lion Cub
(arXiv:2411.16462) into results/figures/, with an index that sets each beside the paper's caption and says, from
the measured numbers, whether this run shows the paper's finding.

    python -m experiments.figures [--figs table2,fig5] [--scale laptop|tiny] [--seeds N] [--runs results/runs]
                                  [--out results/figures] [--override KEY=VALUE ...] [--no-run]

Steps: load the chosen manifests (all by default; `--figs` / FIGS= picks some); run each distinct run once
(experiments/runner.py: a finished run is not run again, runs shared by manifests run once), one progress line per
run (and a bar on a terminal; in a log file a plain `progress:` line after each run instead); call each
manifest's analysis module on its finished runs (`python -m analysis.figN RUN... --out <out>/<name>`; it writes
the figure and findings.json: with runs at several seeds, each seed's drawing into `<out>/<name>/seed<N>` and the
verdicts over the seeds, analysis/verdicts.py); write `<out>/index.md` (experiments/index.py), which lists
every manifest: those not drawn now keep what an earlier invocation drew, or say "not run".
`--seeds N` (`make figures SEEDS=1`: the quick pass) keeps each run's first N seeds of its manifest; the default
runs every seed the manifests list (the trustworthy pass). A run already finished at a seed is not run again, so
`SEEDS=1` then the default runs only the seeds added.
`--override` adds a Hydra override to every training run (they then get their own folders), e.g. a short smoke
test with `--override train.steps=6`; `--no-run` only redraws from the runs already there.
Exit status: 0 when every run and every analysis succeeded, 1 when some failed (the index says which), 2 for a
bad manifest name or manifest, 130 when interrupted (finished runs are kept; the same command goes on).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from experiments.index import FigureEntry, write_index
from experiments.manifest import REPO, SCALES, Manifest, ManifestError, load_manifest, manifest_names
from experiments.runner import Outcome, is_finished, recorded_seconds, run, run_folder


def select(figs: str | None, scale: str, overrides: list[str], seeds: int | None = None) -> list[Manifest]:
    """The chosen manifests (all when `figs` is empty) at their first `seeds` seeds, with `overrides` added to
    every training run."""
    names = manifest_names() if not figs else [f.strip() for f in figs.split(",") if f.strip()]
    manifests = [load_manifest(n, scale, seeds) for n in names]
    if overrides:
        for m in manifests:
            m.runs = [replace(r, overrides=[*r.overrides, *overrides]) if r.module == "src.train" else r
                      for r in m.runs]
    return manifests


def every_manifest(scale: str, seeds: int | None = None) -> list[Manifest]:
    """Every manifest of experiments/ at `scale` that loads (the index lists each, drawn or not)."""
    found = []
    for name in manifest_names():
        try:
            found.append(load_manifest(name, scale, seeds))
        except ManifestError:
            continue
    return found


# (module, flag, folder, the file whose presence means the folder is complete: the corpora write meta.json last)
DATASETS = (("src.data.laptop_corpus", "--out", "data/laptop_text", "meta.json"),
            ("src.data.demo_corpus", "--out", "data/demo_text", "meta.json"),
            ("src.data.synthetic_cifar", "--root", "data/synthetic_cifar", ""))


def prepare_data() -> None:
    """The embedded datasets the laptop and tiny runs train on, made once (no download): the laptop corpus and
    the demo corpus (GPT) and the synthetic CIFAR (vision)."""
    for module, flag, folder, done in DATASETS:
        if not (REPO / folder / done).exists():
            tqdm.write(f"[figures] preparing {folder}")
            subprocess.run([sys.executable, "-m", module, flag, folder], cwd=REPO, check=True,
                           stdout=subprocess.DEVNULL)


def run_all(manifests: list[Manifest], root: Path) -> dict[str, Outcome]:
    """Run every distinct run of the manifests (by folder); one line per run, a bar over all of them."""
    specs = {}
    for m in manifests:
        for spec in m.runs:
            specs.setdefault(run_folder(spec, root).name, (m.name, spec))
    todo = [(name, spec) for key, (name, spec) in specs.items() if not is_finished(spec, run_folder(spec, root))]
    outcomes = {key: Outcome(spec, run_folder(spec, root), "reused", recorded_seconds(spec, root))
                for key, (_, spec) in specs.items()}
    minutes = sum(spec.minutes or 0 for _, spec in todo)
    if any(spec.module == "src.train" for _, spec in todo):
        prepare_data()
    tqdm.write(f"[figures] {len(specs)} runs, {len(specs) - len(todo)} already finished; {len(todo)} to run "
               f"(estimated {minutes:.0f} min on 2 cores)")
    started = time.perf_counter()
    terminal = sys.stderr.isatty()  # in a log file a redrawn bar is garbage: one progress line per run instead
    with tqdm(total=len(todo), desc="runs", unit="run", file=sys.stderr, disable=not todo or not terminal) as bar:
        for i, (manifest, spec) in enumerate(todo, 1):
            est = f", est. {spec.minutes:g} min" if spec.minutes else ""
            tqdm.write(f"[figures] ({i}/{len(todo)}) {manifest}: {spec.name} ({spec.nodes}x{spec.nproc_per_node} "
                       f"{spec.launcher}{est}) ...")
            outcome = run(spec, root, say=lambda text: tqdm.write(f"[figures]   {text}"))
            outcomes[run_folder(spec, root).name] = outcome
            took = f" in {outcome.seconds:.0f} s" if outcome.seconds is not None else ""
            tqdm.write(f"[figures] ({i}/{len(todo)}) {manifest}: {spec.name} {outcome.status}{took}")
            bar.update(1)
            if not terminal:
                tqdm.write(progress_line(i, todo, time.perf_counter() - started))
    return outcomes


def decided_seeds(m: Manifest) -> list[int]:
    """The seeds that every run of `m` with several seeds lists: those its checks are decided over."""
    lists: dict[str, set[int]] = {}
    for spec in m.runs:
        if spec.seed is not None:
            lists.setdefault(spec.name.rsplit("-seed", 1)[0], set()).add(spec.seed)
    several = [s for s in lists.values() if len(s) > 1]
    return sorted(set.intersection(*several)) if several else []


def draw(m: Manifest, folders: list[Path], out: Path) -> tuple[int, str]:
    """Run `m`'s analysis module on `folders` into `out` (a subprocess, as a user would): exit status, message."""
    seeds = decided_seeds(m)
    cmd = [sys.executable, "-m", m.analysis, *map(str, folders), "--out", str(out)] + (
        ["--seeds", ",".join(map(str, seeds))] if seeds else [])
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    message = "" if proc.returncode == 0 else (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return proc.returncode, message


def progress_line(done: int, todo: list, seconds: float) -> str:
    """The plain progress line that stands for the bar when stderr is not a terminal (a log file, Slurm)."""
    left = sum(spec.minutes or 0 for _, spec in todo[done:])
    return (f"[figures] progress: {done}/{len(todo)} runs ({100 * done / len(todo):.0f}%), {seconds / 60:.1f} min "
            f"so far, about {left:.0f} min left by the manifests' estimates")


def analyse(m: Manifest, outcomes: dict[str, Outcome], root: Path, out: Path) -> FigureEntry:
    """Draw manifest `m` from its finished runs with its analysis module (which draws each seed and the verdicts
    over the seeds itself); a seed whose run failed is left to the analysis, which says that seed is missing."""
    mine = [outcomes[run_folder(spec, root).name] for spec in m.runs]
    finished = [o for o in mine if o.status in ("done", "reused") and is_finished(o.spec, o.folder)]
    entry = FigureEntry(m, out / m.name, mine)
    if not finished:
        entry.message = "no finished runs: nothing to draw"
        return entry
    started = time.perf_counter()
    entry.returncode, entry.message = draw(m, [o.folder for o in finished], out / m.name)
    entry.draw_seconds = time.perf_counter() - started
    tqdm.write(f"[figures] {m.name}: {m.analysis} " + (f"ok in {entry.draw_seconds:.0f} s" if entry.returncode == 0
                                                      else f"failed: {entry.message}"))
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.figures", description=__doc__.split("\n\n")[0])
    parser.add_argument("--figs", default=None, help="comma-separated manifest names (default: all)")
    parser.add_argument("--scale", default="laptop", choices=SCALES,
                        help="laptop: the scale model of the paper (default); tiny: the quick GPT-2++ tiny runs")
    parser.add_argument("--seeds", type=int, default=None,
                        help="each run's first N seeds of its manifest (default: all; 1 is the quick pass)")
    parser.add_argument("--runs", type=Path, default=Path("results/runs"))
    parser.add_argument("--out", type=Path, default=Path("results/figures"))
    parser.add_argument("--override", action="append", default=[], help="Hydra override for every training run")
    parser.add_argument("--no-run", action="store_true", help="only draw from runs already finished")
    args = parser.parse_args(argv)
    try:
        manifests = select(args.figs, args.scale, args.override, args.seeds)
    except ManifestError as exc:
        print(f"experiments.figures: {exc}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    root, out = args.runs.resolve(), args.out.resolve()
    root.mkdir(parents=True, exist_ok=True)
    if args.no_run:
        outcomes = {run_folder(s, root).name: Outcome(s, run_folder(s, root), "reused", recorded_seconds(s, root))
                    for m in manifests for s in m.runs}
    else:
        try:
            outcomes = run_all(manifests, root)
        except KeyboardInterrupt:
            print(f"\n[figures] interrupted; finished runs are kept in {root}: run the same command again to go on",
                  file=sys.stderr)
            return 130
    entries = [analyse(m, outcomes, root, out) for m in manifests]
    index = write_index(entries, out, time.perf_counter() - start, every_manifest(args.scale, args.seeds))
    failed = [o.spec.name for o in outcomes.values() if o.status == "failed"]
    broken = [e.manifest.name for e in entries if e.returncode != 0]
    print(f"[figures] index: {index}" + (f"; failed runs: {', '.join(failed)}" if failed else "") +
          (f"; figures not drawn: {', '.join(broken)}" if broken else ""))
    return 1 if failed or broken else 0


if __name__ == "__main__":
    sys.exit(main())
