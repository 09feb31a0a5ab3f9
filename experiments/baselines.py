"""The laptop-scale comparison of Lion Cub with its neighbouring systems (1-bit Adam, BitDP, DDP; docs/baselines.md).

    python -m experiments.baselines [--out results/baselines] [--steps 200] [--rate 1gbit] [--nodes 2] [--nproc 2]
                                    [--variants lion32 cub4 onebit_adam bitdp2 ddp_adamw] [-- extra overrides]

Trains the demo model (`+exp=demo`: GPT-2++ tiny on the embedded demo corpus) on the emulated cluster
(`src.launch.emulate`, 2 hosts x 2 ranks joined by 1 Gbit/s links; root needed) under Lion 32-bit, Lion Cub
4-bit, 1-bit Adam, BitDP 2-bit and PyTorch DDP + AdamW, then `analysis.baselines` writes loss against step and
against training time (PNG and PDF), and a table of final losses, time per step and the bytes each rank sends per
step (from every run's summary.json, i.e. the optimizer's own `wire_bytes`). A run folder that already holds a
summary.json is reused, so an interrupted sweep continues where it stopped.

Hyperparameters. The Lion variants keep the demo's (lr 1e-3, betas (0.9, 0.99), weight decay 0.1). The Adam
variants get `ADAMW`: lr 3e-3 and weight decay 0.03, i.e. Lion's lr x 3 and weight decay / 3 (the Lion paper's
rule of thumb keeps lr x weight decay equal), betas (0.9, 0.95) (nanoGPT's for GPT-2). 1-bit Adam warms up for
20% of the steps (the paper's runs use 7% to 22%). Everything else (warm-up of the learning rate, cosine decay,
clipping, batch 4 x 32 tokens per rank) is the demo's.
Deliberate difference from the papers: a 3.3M-parameter model whose token embedding is 96% of its weights, so
BitDP (which keeps embeddings in fp32) sends almost as much as fp32 here; the table says so in bytes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis.baselines import write_report
from experiments.emulated import train_emulated

ADAMW = ["optim.lr=3e-3", "optim.beta1=0.9", "optim.beta2=0.95", "optim.weight_decay=0.03"]
RUNS = {
    "lion32": ["variant=lion32"],
    "cub4": ["variant=cub4"],
    "onebit_adam": ["variant=onebit_adam", *ADAMW],
    "bitdp2": ["variant=bitdp2", *ADAMW],
    "ddp_adamw": ["variant=ddp_adamw", *ADAMW],
}


def train_overrides(variant: str, steps: int, run_dir: Path, extra: list[str]) -> list[str]:
    warmup = [f"variant.adam_warmup_steps={max(1, steps // 5)}"] if variant == "onebit_adam" else []
    return ["+exp=demo", *RUNS[variant], *warmup, f"train.steps={steps}", f"train.eval_every={max(1, steps // 8)}",
            "train.progress=false", "checkpoint.every=0", f"run.dir={run_dir}", *extra]


def run_one(variant: str, args, extra: list[str]) -> Path:
    run_dir = args.out / "runs" / variant
    return train_emulated(f"[baselines] {variant}", run_dir, train_overrides(variant, args.steps, run_dir, extra),
                          args.out / "logs" / f"{variant}.log", args.nodes, args.nproc, args.rate)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/baselines"))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rate", default="1gbit", help="link rate of the emulated hosts (tc units, or none)")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--nproc", type=int, default=2, help="ranks per emulated host")
    parser.add_argument("--variants", nargs="+", default=list(RUNS), choices=list(RUNS))
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    run_dirs = [run_one(v, args, extra) for v in args.variants]
    outputs = write_report(run_dirs, args.out)
    print((args.out / "baselines.md").read_text())
    print(f"[baselines] wrote {', '.join(str(p) for p in outputs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
