"""Fig. 12 of Lion Cub (Section 7.2): validation loss of GPT against steps and training time, Lion (32bit) vs
Lion Cub 8-bit (L1), 4-bit (sign), and 4-bit with the head's / all layers' momentum synchronized every 10 steps.

    python -m analysis.fig12 RUNS... --out DIR        (writes fig12.png/.pdf and findings.json)

One row of panels per `optim.beta2`. Runs are told apart by `variant.name` and `variant.momentum_sync.layers`
(`analysis.loss_panels.kind`). Checks: at the largest beta2 every Lion Cub run ends within 2% of Lion 32-bit's
final validation loss and reaches it in less training time; at the smallest beta2 8-bit does the same, 4-bit
ends worse than 8-bit, syncing the head recovers 4-bit, and syncing all layers takes longer than syncing the head.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from analysis import timing_checks
from analysis.figure_cli import cli, need
from analysis.verdicts import Check, Result
from analysis.seeds import replicas_of
from analysis.loss_panels import draw, end_time, final_eval, finals, kind, require_evals, speed_checks
from src.runlog.runs import Run


def head_share(run: Run) -> float | None:
    """The output head's share of a GPT run's parameters (vocab_size x n_embd over the model's count): what syncing
    the head synchronizes, against all layers. With tied embeddings on a tiny model it is nearly everything, and
    the two syncs then cost about the same."""
    vocab, width, total = run.get("model.params.vocab_size"), run.get("model.params.n_embd"), \
        run.summary.get("model_parameters")
    return vocab * width / total if vocab and width and total else None


def step_times(run: Run) -> list[np.ndarray]:
    """Every replica's step durations (s): the differences of its training time (`train_time`) between steps."""
    out = []
    for rep in replicas_of(run):
        t = [float(r["train_time"]) for r in rep.train_rows() if "train_time" in r]
        out.append(np.diff(np.asarray(t))[:, None] if len(t) > 1 else np.zeros((0, 1)))
    return out


def low_beta_checks(runs: list[Run], where: str) -> list[Check]:
    by = {kind(r): r for r in runs}
    val = {k: final_eval(r) for k, r in by.items()}
    checks = speed_checks([by[k] for k in ("lion32", "cub8") if k in by], f"{where}, 8-bit")
    pairs = [("cub4_worse_than_cub8", "cub4 ends worse than cub8 (4-bit declines, 8-bit L1 holds)", "cub4", "cub8",
              val),
             ("head_sync_recovers_cub4", "syncing the head's momentum every 10 steps recovers 4-bit", "cub4",
              "cub4+sync head", val)]
    for id, claim, worse, better, numbers in pairs:
        if worse in numbers and better in numbers and None not in (numbers[worse], numbers[better]):
            checks.append(Check(id, f"{where}: {claim}", f"final val loss {worse} {numbers[worse]:.4f}, "
                                f"{better} {numbers[better]:.4f}", numbers[worse] > numbers[better],
                                value=numbers[worse] - numbers[better]))
        else:
            checks.append(Check(id, f"{where}: {claim}", f"needs {worse} and {better} runs", None))
    claim = f"{where}: synchronizing all layers costs more training time than synchronizing the head"
    if "cub4+sync all" in by and "cub4+sync head" in by:
        t_all, t_head = end_time(by["cub4+sync all"]), end_time(by["cub4+sync head"])
        share = head_share(by["cub4+sync head"])
        context = f"training time sync all {t_all:.0f} s, sync head {t_head:.0f} s" + (
            f"; the head is {share:.0%} of the parameters" if share is not None else "")
        steps = timing_checks.ratio("sync all / sync head step", step_times(by["cub4+sync all"]),
                                    step_times(by["cub4+sync head"]), "above")
        checks.append(timing_checks.check("sync_all_costs_more", claim, [steps], context, paper="sync all slower"))
    else:
        checks.append(Check("sync_all_costs_more", claim, "needs cub4+sync all and cub4+sync head runs", None))
    return checks


def make(runs: list[Run], out: Path) -> Result:
    need(any(kind(r) == "lion32" for r in runs), "Fig. 12 needs a Lion (32bit) run (variant=lion32)")
    need(any(kind(r) != "lion32" for r in runs), "Fig. 12 needs Lion Cub runs besides Lion (32bit)")
    require_evals(runs, "val/loss", "Fig. 12")
    betas = sorted({r.get("optim.beta2") for r in runs})
    groups = {f"beta2={b}": [r for r in runs if r.get("optim.beta2") == b] for b in betas}
    files = draw(groups, "val/loss", "Fig. 12: GPT validation loss, Lion (32bit) vs Lion Cub", out, "fig12")
    checks = speed_checks(groups[f"beta2={betas[-1]}"], f"beta2={betas[-1]}")
    if len(betas) > 1:
        checks += low_beta_checks(groups[f"beta2={betas[0]}"], f"beta2={betas[0]}")
    return Result(files, checks, [f"{name}: {finals(g)}" for name, g in groups.items()])


def main(argv: list[str] | None = None) -> int:
    return cli(make, "Fig. 12", "analysis.fig12", __doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
