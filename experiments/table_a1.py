"""The Table A.1 / Fig. 10 analogue on this machine (Lion Cub, Appendix A.1, Section 7.1).

    python -m experiments.table_a1 [--out results/table_a1] [--rates paper_ethernet paper_infiniband] [--steps 14]
                                   [-- extra overrides]

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


def train_overrides(variant: str, steps: int, run_dir: Path, extra: list[str]) -> list[str]:
    return ["+exp=demo", *MODEL, *ROWS.get(variant, [f"variant={variant}"]), *VARIANT_OVERRIDES.get(variant, []),
            f"train.steps={steps}",
            "train.timing_skip=2", "train.eval_every=0", "train.eval_at_start=false", "train.eval_batches=1",
            "train.progress=false", "checkpoint.every=0", f"run.dir={run_dir}", *extra]


def run_one(rate: str, variant: str, steps: int, out: Path, extra: list[str], cores: str = "share",
            keep_checkpoints: bool = False) -> Path:
    """One timed run; its final checkpoint (about 740 MB for 38.7M parameters and 4 ranks: 22 GB over the default
    30 runs) is removed unless `keep_checkpoints`: the table reads metrics.jsonl and summary.json only."""
    run_dir = out / "runs" / f"{rate}-{variant}"
    done = train_emulated(f"[table_a1] {rate} {variant}", run_dir, train_overrides(variant, steps, run_dir, extra),
                          out / "logs" / f"{rate}-{variant}.log", rate=rate, cores=cores)
    if not keep_checkpoints:
        shutil.rmtree(done / CHECKPOINT_DIR, ignore_errors=True)
    return done


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/table_a1")
    parser.add_argument("--rates", nargs="+", default=["paper_ethernet", "paper_infiniband"],
                        help="links: paper_ethernet, paper_infiniband (calibrated) or tc rates such as 1gbit, none")
    parser.add_argument("--steps", type=int, default=14, help="steps per run; the first 2 are not timed")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--with-baselines", action="store_true", help=f"add {', '.join(BASELINE_VARIANTS)}")
    parser.add_argument("--keep-checkpoints", action="store_true",
                        help="keep each run's final checkpoint (by default removed: about 740 MB per run)")
    parser.add_argument("--cores", choices=("share", "all"), default="share",
                        help="the emulator's cores= (share: each host its own cores, one thread per rank here; all: "
                             "every host on every core, default threads); tc rates only")
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    out = Path(args.out)
    variants = args.variants + [v for v in BASELINE_VARIANTS if args.with_baselines and v not in args.variants]
    run_dirs = [run_one(rate, v, args.steps, out, extra, args.cores, args.keep_checkpoints)
                for rate in args.rates for v in variants]
    paths = write(with_speedup(run_dirs), out)
    print((out / "table_a1.md").read_text())
    print(f"[table_a1] wrote {', '.join(str(p) for p in paths.values())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
