"""`make demo`: a laptop-sized rerun of the Lion Cub comparison (Section 7, Fig. 10 and 12 in miniature).

Prepares the laptop corpus (src/data/laptop_corpus.py), trains the laptop scale model of the paper's GPT
(`+exp=laptop`, docs/scale_model.md) with 2 CPU processes under Lion 32-bit and Lion Cub 8/4/1-bit, then writes loss-vs-step and loss-vs-time figures and the timing breakdown (Table A.1's
columns, Markdown + CSV) with src/runlog/report.py (`python -m analysis.report` on any runs), the measured speedups (`speedup.md`), and prints the folder.

The link (`--link`): where the machine allows it (root, `ip` and `tc`: network namespaces), the processes are 2
emulated hosts on the paper-equivalent Ethernet link (`network=paper_ethernet`, src.launch.paper_link): its rate is
calibrated on this machine so that Lion 32-bit spends the paper's share of a step communicating (81 %, Table A.1),
which is the setting where the paper's speedups appear. Otherwise one line says why the demo falls back to
loopback (torchrun --standalone, gloo over `lo`), where communication is a small share of the step, so the
compressed variants' quantization overhead stands out instead of their savings.

Time: the loss-vs-time axis and the speedups count the training steps after the warm-up (`train.timing_skip`
steps, where the reducers' kernels compile; src/engine/loop.py), so compile time does not pass for training time.
The speedup of a variant is Lion 32-bit's training time over its own, for the same number of steps; launch to exit
(start-up, compile, evaluations) is reported beside it.

Length on the paper link: Lion 32-bit's step there is about five times its compute, by construction. The demo
trains the preset's steps unless the calibration's measured Lion 32-bit step says that the four variants would not
fit `--budget-min` (9.25 minutes, so that `make demo` with its corpus check stays under 10; `OVERHEAD_S` per
variant for start-up, compile and evaluation); then it trains as many steps as fit and says so. A `train.steps=`
override is always kept. A variant's communication there is Lion 32-bit's times the ratio of their bytes per step,
each from the variant's own optimizer (its wire plan, src.optim.wire_plan), so any variant is costed as it sends.
`--preset demo` runs the tiny scale (GPT-2++ tiny on the demo corpus) instead.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from src.runlog.report import make_report
from src.runlog.timing_table import table_rows, to_markdown
from src.data import prepare_demo_text
from src.data.laptop_corpus import prepare_laptop_text
from src.launch.calibrate import CalibrationError, cached_or_calibrate
from src.launch.netns import EmulatorUnavailable, check_prerequisites

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("lion32", "cub8", "cub4", "cub1")
PRESETS = {"laptop": ("data/laptop_text", prepare_laptop_text), "demo": ("data/demo_text", prepare_demo_text)}
PAPER_LINK = "paper_ethernet"
LINKS = ("auto", PAPER_LINK, "loopback")
OVERHEAD_S = 40.0     # per variant: start-up, compile, evaluations (measured 25-53 s on the paper link, 2 cores)
MIN_STEPS = 20
FALLBACK = ("demo: on loopback, not the paper-equivalent link ({reason}); there Lion 32-bit spends a small share of "
            "its step communicating, so Lion Cub has little to save and its quantization cost shows instead of the "
            "paper's speedups")


def choose_link(requested: str, nproc: int) -> tuple[str, str | None]:
    """(`paper_ethernet` or `loopback`, the one-line reason when `auto` falls back to loopback)."""
    if requested == "loopback":
        return "loopback", None
    try:
        check_prerequisites()
        if nproc < 2 or nproc % 2:
            raise EmulatorUnavailable(f"--nproc {nproc} cannot be split over 2 emulated hosts")
    except EmulatorUnavailable as exc:
        if requested == PAPER_LINK:
            raise
        return "loopback", FALLBACK.format(reason=exc)
    return PAPER_LINK, None


def launcher(link: str, nproc: int) -> list[str]:
    if link == "loopback":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                "-m", "src.train"]
    return [sys.executable, "-m", "src.launch.paper_link", f"network={link}", "nodes=2",
            f"nproc_per_node={nproc // 2}", "--"]


def job(variant: str, run_dir: Path, data_dir: Path, extra: list[str], preset: str = "laptop") -> list[str]:
    return [f"+exp={preset}", f"variant={variant}", f"data.dir={data_dir}", f"run.dir={run_dir}", "train.progress=false",
            *extra]


def train_variant(variant: str, run_dir: Path, data_dir: Path, nproc: int, extra: list[str],
                  link: str = "loopback", preset: str = "laptop") -> float:
    """Train one variant on `link`; returns its wall time in seconds, launch to exit (raises on failure)."""
    cmd = [*launcher(link, nproc), *job(variant, run_dir, data_dir, extra, preset)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}  # as set by main
    start = time.perf_counter()
    print(f"\n=== {variant}: {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, env=env, check=True)
    return time.perf_counter() - start


def preset_steps(preset: str = "laptop") -> int:
    from omegaconf import OmegaConf

    return int(OmegaConf.load(REPO / "conf" / "exp" / f"{preset}.yaml").train.steps)


def wire_bytes(variants: list[str], overrides: list[str], nproc: int, preset: str = "laptop") -> dict[str, int]:
    """Bytes a rank sends per step under each of `variants` and Lion 32-bit, on the preset's model at `nproc` ranks:
    its optimizer's wire plan (src.optim.wire_plan; 1-bit Adam's largest stage, its warm-up)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from src.models import build_model
    from src.optim.wire_plan import planned_wire_plan

    plans, model = {}, None
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        for variant in dict.fromkeys(["lion32", *variants]):
            cfg = compose(config_name="config", overrides=[f"+exp={preset}", f"variant={variant}", *overrides])
            if model is None:
                params = OmegaConf.to_container(cfg.model.params, resolve=True)
                model = build_model(cfg.model.kind, **{k: v for k, v in params.items() if v is not None})
            plan = planned_wire_plan(model, OmegaConf.to_container(cfg.variant, resolve=True), nproc, cfg.network)
            plans[variant] = max(plan.values())
    return plans


def fit_steps(record: dict, variants: list[str], wire: dict[str, int], budget_s: float,
              preset: str = "laptop") -> tuple[int, str]:
    """Steps that fit the budget on the calibrated link, from the calibration's Lion 32-bit step: each variant's step
    estimated as its compute plus Lion 32-bit's communication times the ratio of their bytes per step (`wire`, by
    variant, Lion 32-bit's included; quantization not counted)."""
    verify = next(r for r in record["runs"] if r["rate"] == record["rate"])
    communicate, compute = verify["communicate_ms"] / 1000, (verify["total_ms"] - verify["communicate_ms"]) / 1000
    per_step = sum(compute + communicate * wire[v] / wire["lion32"] for v in variants)
    fits = int((budget_s - OVERHEAD_S * len(variants)) / per_step)
    if fits >= preset_steps(preset):
        return preset_steps(preset), ""
    steps = max(MIN_STEPS, fits)
    preset = preset_steps(preset)
    return steps, (f"demo: {steps} steps per variant instead of the preset's {preset}: on this link Lion 32-bit's "
                   f"step took {verify['total_ms'] / 1000:.1f} s when calibrated, so the preset's would take about "
                   f"{per_step * preset / 60:.0f} min for the {len(variants)} variants (budget "
                   f"{budget_s / 60:.0f} min; pass train.steps= to choose)")


def speedups(run_dirs: list[Path], launch_s: dict[str, float]) -> list[dict]:
    """Per variant: training time after the warm-up, its speedup over Lion 32-bit, warm-up, launch to exit."""
    import json

    rows = []
    for run_dir in run_dirs:
        summary = json.loads((run_dir / "summary.json").read_text())
        rows.append({"variant": run_dir.name, "steps": summary["steps"], "train_s": summary["train_time"],
                     "warmup_s": summary.get("warmup_time"), "launch_s": launch_s[run_dir.name]})
    base = next((r for r in rows if r["variant"] == "lion32"), None)
    for r in rows:
        r["speedup"] = base["train_s"] / r["train_s"] if base and r["train_s"] > 0 else None
        r["launch_speedup"] = base["launch_s"] / r["launch_s"] if base else None
    return rows


def speedup_markdown(rows: list[dict], link: str, share: str) -> str:
    def num(v, fmt):
        return "" if v is None else format(v, fmt)

    lines = [f"Link: {link}. {share}", "",
             "| variant | steps | training time after warm-up (s) | speedup over Lion 32-bit | warm-up (s) | "
             "launch to exit (s) | speedup, launch to exit |", "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['variant']} | {r['steps']} | {r['train_s']:.1f} | {num(r['speedup'], '.2f')} | "
              f"{num(r['warmup_s'], '.1f')} | {r['launch_s']:.0f} | {num(r['launch_speedup'], '.2f')} |" for r in rows]
    return "\n".join(lines) + "\n"


def prepare_link(args, start: float) -> tuple[str, dict, str | None]:
    """The link, its calibration record (empty on loopback) and a line to print (a fallback or a shortened run);
    on the paper link, `args.overrides` gets the steps that fit the budget."""
    link, why = choose_link(args.link, args.nproc)
    if link == "loopback":
        return link, {}, why
    try:  # calibrated once per machine and setting, before the clock of any variant starts
        _, record = cached_or_calibrate(link, job("lion32", Path(args.out or "."), Path(args.data), args.overrides,
                                                  args.preset), 2, args.nproc // 2)
    except CalibrationError as exc:
        if args.link != "auto":
            raise
        return "loopback", {}, FALLBACK.format(reason=f"its calibration failed: {exc}")
    if any(o.lstrip("+").startswith("train.steps=") for o in args.overrides):
        return link, record, None
    wire = wire_bytes(args.variants, args.overrides, args.nproc, args.preset)
    steps, why = fit_steps(record, args.variants, wire, 60 * args.budget_min - (time.perf_counter() - start),
                           args.preset)
    if why:
        args.overrides = [*args.overrides, f"train.steps={steps}"]
    return link, record, why or None


def share_note(timing: list[dict], link: str, record: dict, nproc: int, preset: str = "laptop") -> str:
    """Lion 32-bit's measured communication share beside the paper's, and a hint when it is off the calibration."""
    lion32 = next((r for r in timing if r["variant"] == "lion32"), None)
    if lion32 is None:
        return ""
    share = lion32["communicate_ms"] / lion32["total_ms"]
    note = f"Lion 32-bit communicates {100 * share:.0f} % of its step (the paper's Table A.1: 81 % on Ethernet)."
    if link != "loopback" and abs(share - record["target_share"]) > 0.10:
        note += (f" That is off the calibrated {100 * record['verified_share']:.0f} %: the machine is busier or "
                 "quieter than when the link was calibrated; rerun python -m src.launch.calibrate "
                 f"network={link} nodes=2 nproc_per_node={nproc // 2} --force -- +exp={preset}")
    return note


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m src.demo", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="results folder (default: results/demo-<timestamp>)")
    p.add_argument("--preset", choices=tuple(PRESETS), default="laptop",
                   help="laptop: the scale model (default); demo: the old tiny GPT on the demo corpus")
    p.add_argument("--data", default=None, help="corpus folder (prepared if missing; default: the preset's)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    p.add_argument("--nproc", type=int, default=2, help="processes per run (on the paper link: split over 2 hosts)")
    p.add_argument("--link", choices=LINKS, default="auto",
                   help="auto: the paper-equivalent Ethernet link when root allows it, else loopback")
    p.add_argument("--budget-min", type=float, default=9.25,
                   help="on the paper link, train fewer steps than the preset's when they would not fit")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run, e.g. train.steps=100")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    unknown = [v for v in args.variants if not (REPO / "conf" / "variant" / f"{v}.yaml").is_file()]
    if unknown:  # e.g. an override after --variants, which nargs="+" takes for a variant
        print(f"demo: error: no variant {', '.join(map(repr, unknown))} in conf/variant/ (the variants: "
              f"{', '.join(sorted(f.stem for f in (REPO / 'conf' / 'variant').glob('*.yaml')))}); put Hydra "
              "overrides before --variants", file=sys.stderr)
        return 2
    start = time.perf_counter()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the calibration's runs and the variants' alike
    out = Path(args.out or f"results/demo-{time.strftime('%Y%m%d-%H%M%S')}")
    folder, prepare = PRESETS[args.preset]
    args.data = args.data or folder
    meta = prepare(args.data)
    print(f"corpus {args.data}: {meta['train_tokens']:,} train / {meta['val_tokens']:,} val tokens")
    try:
        link, record, why = prepare_link(args, start)
    except (EmulatorUnavailable, CalibrationError) as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 2
    if why:
        print(why, flush=True)
    run_dirs, times = [], {}
    for variant in args.variants:
        run_dir = out / "runs" / variant
        times[variant] = train_variant(variant, run_dir, Path(args.data), args.nproc, args.overrides, link,
                                       args.preset)
        run_dirs.append(run_dir)
    outputs = make_report(run_dirs, out)
    timing = table_rows(run_dirs)
    print("\n" + to_markdown(timing))
    note = share_note(timing, link, record, args.nproc, args.preset)
    table = speedup_markdown(speedups(run_dirs, times), link, note)
    (out / "speedup.md").write_text(table)
    print("\n" + table)
    for path in [*outputs.values(), out / "speedup.md"]:
        print(f"wrote {path}")
    print(f"\ndemo finished in {time.perf_counter() - start:.0f} s; results in {out.resolve()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
