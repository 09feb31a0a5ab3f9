"""Sign match and flip rates of quantized majority votes against standard Lion (Lion Cub, Fig. 5 for GPT, Fig.
C.1 for ResNet-18): the body of analysis/fig5.py and analysis/figC1.py.

For each quantizer Q that a run measured (`stats/match/<method>`, `stats/flip/<method>`: percent of all elements
whose sign(sum_i Q(c_i)) equals / opposes sign(sum_i c_i); elements mapped to zero are in neither), the top panel
draws match and the bottom panel flip against steps. With `layers`, a third panel shows each layer's match rate of
L1 and sign at the last statistics step. Checks (means over the logged steps): L1 matches more and flips less than
distributed Lion's sign; Q_inf stochastic maps most elements to zero (match + flip under 50%); "w/o zero" and log
match less than distributed Lion; distributed Lion matches 60-70% and flips about 10% (within 5 points).
"""
from __future__ import annotations

from pathlib import Path
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis.figure_cli import Check, Result, need, runs_with_key, save  # noqa: E402
from src.runlog.runs import Run  # noqa: E402
from analysis.stats_rows import last_row, mean_of, method_name, methods, per_layer, series  # noqa: E402


def rates(run: Run) -> dict[str, tuple[float, float]]:
    """{method: (mean match %, mean flip %)} over the logged steps."""
    out = {}
    for m in methods(run):
        match, flip = mean_of(run, f"stats/match/{m}"), mean_of(run, f"stats/flip/{m}")
        if match is not None and flip is not None:
            out[m] = (match, flip)
    return out


def _compare(r: dict, claim: str, a: str, b: str, index: int, less: bool) -> Check:
    if a not in r or b not in r:
        return Check(claim, f"needs both {a} and {b} (have {sorted(r)})", None)
    what = ("match", "flip")[index]
    va, vb = r[a][index], r[b][index]
    return Check(claim, f"mean {what}: {method_name(a)} {va:.2f}%, {method_name(b)} {vb:.2f}%",
                 va < vb if less else va > vb)


def checks(run: Run, where: str) -> list[Check]:
    r = rates(run)
    result = [_compare(r, f"{where}: L1 quantization matches standard Lion's sign more often than distributed "
                          "Lion", "l1", "sign", 0, less=False),
              _compare(r, f"{where}: L1 flips the update direction less often than distributed Lion",
                       "l1", "sign", 1, less=True)]
    claim = f"{where}: Q_inf stochastic quantization maps most elements to zero (match + flip under 50%)"
    result.append(Check(claim, f"match + flip {sum(r['linf']):.2f}%", sum(r["linf"]) < 50) if "linf" in r
                  else Check(claim, "no linf statistics", None))
    for m in ("linf_nozero", "log"):
        result.append(_compare(r, f"{where}: {method_name(m)} does not match distributed Lion", m, "sign", 0,
                               less=True))
    claim = f"{where}: distributed Lion's sign matches 60-70% and flips about 10% (within 5 points)"
    if "sign" in r:
        match, flip = r["sign"]
        result.append(Check(claim, f"match {match:.2f}%, flip {flip:.2f}%", 55 <= match <= 75 and 5 <= flip <= 15))
    else:
        result.append(Check(claim, "no sign statistics", None))
    return result


def _layer_panel(ax, run: Run) -> None:
    row = last_row(run, "stats/match/sign") or {}
    shown = [m for m in ("sign", "l1") if per_layer(row, f"stats/match/{m}")]
    layers = list(per_layer(row, f"stats/match/{shown[0]}")) if shown else []
    for i, m in enumerate(shown):
        values = per_layer(row, f"stats/match/{m}")
        ax.bar([x + 0.4 * i for x in range(len(layers))], [values.get(layer, 0.0) for layer in layers], width=0.4,
               label=method_name(m))
    ax.set_xticks([x + 0.2 for x in range(len(layers))], layers, rotation=90, fontsize=5)
    ax.set(ylabel="match (%)", title=f"per layer, step {row.get('step', '?')}")
    ax.legend(fontsize=7)


def make_figure(runs: list[Run], out: Path, figure: str, stem: str, layers: bool = False) -> Result:
    runs = runs_with_key(runs, "stats/match/sign", f"{figure}'s sign-match statistics: train with stats.every > 0")
    need(all(rates(r) for r in runs), f"{figure}: a run logs stats/match keys without stats/flip")
    fig, axes = plt.subplots(3 if layers else 2, len(runs), figsize=(6.5 * len(runs), 9 if layers else 6.5),
                             squeeze=False)
    checks_ = []
    for col, run in enumerate(runs):
        for row, kind in enumerate(("match", "flip")):
            ax = axes[row][col]
            for m in methods(run):
                steps, values = series(run, f"stats/{kind}/{m}")
                ax.plot(steps, values, marker=".", label=method_name(m))
            ax.set(xlabel="step", ylabel=f"{kind} (%)", title=f"{run.label} ({run.world_size} workers): {kind}")
            ax.grid(alpha=0.3)
        axes[0][col].legend(fontsize=7)
        if layers:
            _layer_panel(axes[2][col], run)
        checks_ += checks(run, run.label)
    fig.suptitle(f"{figure}: sign of sum_i Q(c_i) vs standard Lion (elements mapped to zero in neither)", fontsize=10)
    fig.tight_layout()
    notes = [f"{r.label}, means over {len(series(r, 'stats/match/sign')[0])} logged steps: " + ", ".join(
        f"{method_name(m)} match {a:.1f}% flip {b:.1f}%" for m, (a, b) in rates(r).items()) for r in runs]
    return Result(save(fig, out, stem), checks_, notes)
