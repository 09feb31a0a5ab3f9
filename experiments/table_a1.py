"""The Table A.1 / Fig. 10 analogue on this machine (Lion Cub, Appendix A.1, Section 7.1).

    python -m experiments.table_a1 [--out results/table_a1] [--rates paper_ethernet paper_infiniband] [--steps 14]
                                   [-- extra overrides]
    python -m experiments.table_a1 --node [--out results/table_a1/node] [--splits gpt38m vocab1k] [--clips 0 1.0]
                                   [--seeds 1 2 3] [--rates ...] [--variants ...] [-- extra overrides]

Trains GPT-2++ (4 layers, 512 wide, 38.7M parameters: the largest that steps in a few seconds with 4 ranks on 2
cores) for a few steps on the emulated 2-host x 2-rank cluster (root needed) on each link: by default the
paper-equivalent links (`src.launch.paper_link`: the rates at which Lion 32-bit spends Table A.1's share of its step
communicating on this machine, 81 % as on the paper's Ethernet and 37 % as on its InfiniBand, calibrated once per
machine by src.launch.calibrate and recorded in each run's config), or any tc rate (`1gbit`, `none`), under
Lion (32bit) (one flat allreduce), DDP Lion (32bit) (which overlaps its allreduce with backward itself), Lion (16bit),
Lion Cub 8-, 4- and 1-bit, each Lion Cub also with `variant.overlap` forward (communication behind the next forward
pass), backward (buckets launched during backward, speculating that no rank clips) and both, then writes the
per-phase table with the speedup over Lion (32bit), its Amdahl and overlap limits, each overlapped row's step over
its synchronous twin's (`vs_sync`), the speculation's hit rate, the wire time behind backward and the redo cost, the
spread of the step times (12 timed steps per run), and the stacked bars of Fig. 10 (`analysis.fig10`). On a real
cluster, run the same training overrides with torchrun/srun instead of the emulator and feed the run folders to
`python -m analysis.fig10`.
`--node` runs the node hierarchy's rows instead (NODE_VARIANTS below; each emulated host is a node of 2 ranks): per
parameter split and clip it writes the table, Fig. 10's bars and findings.json with every comparison's 95 % interval
over the pooled timed steps of the seeds (`<out>/<split>-clip<clip>/`), and the cost model's predicted against
measured communication per run (`<out>/model_error.md`, src/bench/node_error.py).
Deliberate difference: CPU ranks and a small model, so compute is far slower and the model far smaller than the
paper's 350M-1558M on H100s; the links are chosen so that Lion 32-bit's communication share, not the absolute
times, carries over (both links reproduce the share of their paper row: Ethernet's 774M on 2 nodes, InfiniBand's
1558M on 2 nodes; the model here is the same for both).
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from analysis.fig10 import with_speedup, write
from experiments.emulated import train_emulated
from src.reliability.train_state import CHECKPOINT_DIR

# Rows that are a variant plus overrides: Lion Cub with its communication behind the next forward pass (forward),
# launched during backward (backward: src/optim/speculation.py), or both; `cub4_overlap` is the forward row's
# earlier name.
OVERLAPS = ("forward", "backward", "both")
ROWS = {f"{v}_{mode}": [f"variant={v}", f"variant.overlap={mode}", f"run.label={v} overlap {mode}"]
        for v in ("cub8", "cub4", "cub1") for mode in OVERLAPS}
VARIANTS = ("lion32", "ddp_lion", "lion16", "cub8", "cub4", "cub1", *ROWS)
ROWS["cub4_overlap"] = ROWS["cub4_forward"]
# The neighbouring systems, added by `--with-baselines` (`make table-a1-baselines`); 1-bit Adam is timed
# in its compression stage (its Adam warm-up is the adamw32 row), so it switches after the first step.
BASELINE_VARIANTS = ("ddp_lion_bf16", "adamw32", "ddp_adamw", "onebit_adam", "bitdp2", "dlion_mavo")
VARIANT_OVERRIDES = {"onebit_adam": ["variant.adam_warmup_steps=1"]}
MODEL = ["model=gpt_mini", "model.params.n_embd=512", "model.params.n_head=8"]
# The node hierarchy's rows (`--node`; variant.hierarchy: node, docs/node_mode.md): cub4 with nodes as voters beside
# flat cub4, and Lion 32-bit flat and on FSDP2's HSDP, on the same 2 hosts x 2 ranks (each host a node of 2 ranks),
# for two parameter splits of the model: GPT-2++ 38.7M with GPT-2's vocabulary (`gpt38m`: the tied embedding holds
# 66 % of the parameters) and with the compact vocabulary of the backward-overlap measurements (`vocab1k`: 13.5M,
# the embedding 4 %, as at the paper's 774M), at clip 0 and at the paper's 1.0, each configuration repeated at
# NODE_SEEDS and pooled as the verdicts pool repeats (analysis/verdicts.py).
NODE_VARIANTS = ("lion32", "cub4", "lion32_hsdp", "cub4_node")
NODE_SPLITS = {"gpt38m": [], "vocab1k": ["data=laptop_text", "model.params.vocab_size=1024"]}
NODE_CLIPS = ("0", "1.0")
NODE_SEEDS = (1, 2, 3)


def train_overrides(variant: str, steps: int, run_dir: Path, extra: list[str]) -> list[str]:
    return ["+exp=demo", *MODEL, *ROWS.get(variant, [f"variant={variant}"]), *VARIANT_OVERRIDES.get(variant, []),
            f"train.steps={steps}",
            "train.timing_skip=2", "train.eval_every=0", "train.eval_at_start=false", "train.eval_batches=1",
            "train.progress=false", "checkpoint.every=0", f"run.dir={run_dir}", *extra]


def run_one(rate: str, variant: str, steps: int, out: Path, extra: list[str], cores: str = "share",
            keep_checkpoints: bool = False, name: str | None = None) -> Path:
    """One timed run (in `out`/runs/`name`, by default `<rate>-<variant>`); its final checkpoint (about 740 MB for
    38.7M parameters and 4 ranks: 22 GB over the default 30 runs) is removed unless `keep_checkpoints`: the table
    reads metrics.jsonl and summary.json only."""
    name = name or f"{rate}-{variant}"
    run_dir = out / "runs" / name
    done = train_emulated(f"[table_a1] {name}", run_dir, train_overrides(variant, steps, run_dir, extra),
                          out / "logs" / f"{name}.log", rate=rate, cores=cores)
    if not keep_checkpoints:
        shutil.rmtree(done / CHECKPOINT_DIR, ignore_errors=True)
    return done


def node_runs(args, extra: list[str]) -> dict[tuple[str, str], list[Path]]:
    """Every run of the node rows, by (parameter split, clip): each variant on each link at each seed."""
    out = Path(args.out)
    found = {}
    for split in args.splits:
        for clip in args.clips:
            found[(split, clip)] = [
                run_one(rate, v, args.steps, out, [*NODE_SPLITS[split], f"optim.clip={clip}", f"seed={seed}", *extra],
                        args.cores, args.keep_checkpoints, name=f"{split}-clip{clip}-{rate}-{v}-seed{seed}")
                for seed in args.seeds for rate in args.rates for v in args.variants]
    return found


def node_tables(found: dict[tuple[str, str], list[Path]], out: Path, seeds: list[int]) -> int:
    """Per (split, clip) the Table A.1 rows and checks with the repeats pooled (analysis.fig10 over the seeds:
    analysis/verdicts.py), then the cost model's error on every run (src/bench/node_error.py)."""
    from analysis import fig10
    from src.bench.node_error import COLUMNS, error_rows
    from src.runlog.timing_table import write_table

    status = 0
    for (split, clip), dirs in found.items():
        print(f"[table_a1] node rows, {split}, clip {clip}:", flush=True)
        status |= fig10.main([*map(str, dirs), "--out", str(out / f"{split}-clip{clip}"),
                              *(["--seeds", ",".join(map(str, seeds))] if len(seeds) > 1 else [])])
    try:
        rows = error_rows([d for dirs in found.values() for d in dirs])
    except ValueError as exc:
        print(f"[table_a1] the cost model's error not computed: {exc}")
        return status
    md, _ = write_table([{k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()} for r in rows], out,
                        "model_error", COLUMNS)
    print(md.read_text())
    print(f"[table_a1] wrote {md} (the cost model's error on these runs: predicted vs measured)")
    return status


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/table_a1")
    parser.add_argument("--rates", nargs="+", default=["paper_ethernet", "paper_infiniband"],
                        help="links: paper_ethernet, paper_infiniband (calibrated) or tc rates such as 1gbit, none")
    parser.add_argument("--steps", type=int, default=14, help="steps per run; the first 2 are not timed")
    parser.add_argument("--variants", nargs="+", default=None, help="default: every row (with --node: the node rows)")
    parser.add_argument("--with-baselines", action="store_true", help=f"add {', '.join(BASELINE_VARIANTS)}")
    parser.add_argument("--keep-checkpoints", action="store_true",
                        help="keep each run's final checkpoint (by default removed: about 740 MB per run)")
    parser.add_argument("--cores", choices=("share", "all"), default="share",
                        help="the emulator's cores= (share: each host its own cores, one thread per rank here; all: "
                             "every host on every core, default threads); tc rates only")
    parser.add_argument("--node", action="store_true",
                        help=f"the node hierarchy's rows instead: {', '.join(NODE_VARIANTS)} (or --variants) per "
                             "parameter split, clip and seed, the repeats pooled")
    parser.add_argument("--splits", nargs="+", default=list(NODE_SPLITS), choices=list(NODE_SPLITS),
                        help="--node: the models (parameter splits)")
    parser.add_argument("--clips", nargs="+", default=list(NODE_CLIPS), help="--node: optim.clip values")
    parser.add_argument("--seeds", nargs="+", type=int, default=list(NODE_SEEDS), help="--node: the repeats")
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    out = Path(args.out)
    if args.node:
        args.variants = args.variants or list(NODE_VARIANTS)
        return node_tables(node_runs(args, extra), out, args.seeds)
    args.variants = args.variants or list(VARIANTS)
    variants = args.variants + [v for v in BASELINE_VARIANTS if args.with_baselines and v not in args.variants]
    run_dirs = [run_one(rate, v, args.steps, out, extra, args.cores, args.keep_checkpoints)
                for rate in args.rates for v in variants]
    paths = write(with_speedup(run_dirs), out)
    print((out / "table_a1.md").read_text())
    print(f"[table_a1] wrote {', '.join(str(p) for p in paths.values())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
