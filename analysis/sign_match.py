"""Sign match and flip rates of quantized majority votes against standard Lion (Lion Cub, Fig. 5 for GPT, Fig.
C.1 for ResNet-18): the body of analysis/fig5.py and analysis/figC1.py.

For each quantizer Q that a run measured (`stats/match/<method>`, `stats/flip/<method>`: percent of all elements
whose sign(sum_i Q(c_i)) equals / opposes sign(sum_i c_i); elements mapped to zero are in neither), the top panel
draws match and the bottom panel flip against steps, with the run's reading step marked: the first statistics step
past its initial transient, measured on its training loss (analysis/steady_point.py). The checks read the means
over the statistics steps from the reading step on (the paper reads its runs mid-training). Where the run wrote its
statistics arrays, the reading step is also shown per layer group (embedding, blocks, head;
`analysis.stats_rows.layer_group`; percent of the group's own elements) in `<stem>_groups.csv`, the notes and the
measured text of the distributed-Lion check. With `layers`, a third panel shows each layer's match rate of L1 and
sign at the reading step. Checks: L1 matches more and flips less than distributed Lion's sign; Q_inf stochastic
maps most elements to zero (match + flip under 50%); "w/o zero" and log match less than distributed Lion;
distributed Lion matches 60-70% and flips about 10% (within 5 points).
"""
from __future__ import annotations

import csv
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis.bands import curve  # noqa: E402
from analysis.figure_cli import need, runs_with_key, save  # noqa: E402
from analysis.verdicts import Check, Result  # noqa: E402
from src.runlog.runs import Run  # noqa: E402
from analysis.stats_rows import (group_numel, group_sums, layer_group, method_name, methods, per_layer,  # noqa: E402
                                 series)
from analysis.steady_point import Reading, reading_step  # noqa: E402

KEY = "stats/match/sign"


def reading(run: Run) -> Reading:
    """The run's first statistics step past its initial transient (else its last statistics step)."""
    return reading_step(run, series(run, KEY)[0])


def _mean_since(run: Run, key: str, since: int) -> float | None:
    values = [v for s, v in zip(*series(run, key)) if s >= since]
    return sum(values) / len(values) if values else None


def rates(run: Run, since: int = 0) -> dict[str, tuple[float, float]]:
    """{method: (mean match %, mean flip %)} over the logged steps from `since` on."""
    out = {}
    for m in methods(run):
        match, flip = _mean_since(run, f"stats/match/{m}", since), _mean_since(run, f"stats/flip/{m}", since)
        if match is not None and flip is not None:
            out[m] = (match, flip)
    return out


def group_rates(run: Run, step: int) -> dict[str, dict[str, tuple[float, float, float]]]:
    """{group: {method: (match %, flip %, share of the model %)}} at `step` from the arrays file (`model` first);
    empty when the run wrote none for that step."""
    if step not in run.stats_steps():
        return {}
    arrays = run.stats_arrays(step)
    match, flip, numel = group_sums(arrays, "match_counts"), group_sums(arrays, "flip_counts"), group_numel(arrays)
    names = [str(m) for m in arrays["methods"]]
    return {g: {m: (100.0 * float(match[g][q]) / n, 100.0 * float(flip[g][q]) / n, 100.0 * n / numel["model"])
                for q, m in enumerate(names)} for g, n in numel.items() if n and g in match}


def _groups_text(groups: dict, method: str) -> str:
    parts = [f"{g} match {v[method][0]:.1f}% flip {v[method][1]:.1f}% ({v[method][2]:.1f}% of the model)"
             for g, v in groups.items() if g != "model" and method in v]
    return "; by group: " + ", ".join(parts) if parts else ""


def _compare(r: dict, id: str, claim: str, a: str, b: str, index: int, less: bool) -> Check:
    if a not in r or b not in r:
        return Check(id, claim, f"needs both {a} and {b} (have {sorted(r)})", None)
    what = ("match", "flip")[index]
    va, vb = r[a][index], r[b][index]
    return Check(id, claim, f"mean {what}: {method_name(a)} {va:.2f}%, {method_name(b)} {vb:.2f}%",
                 va < vb if less else va > vb, value=va - vb)


def l1_checks(run: Run, where: str, read: Reading | None = None, groups: dict | None = None) -> list[Check]:
    """What Appendix C.1 says of ResNet-18: L1 matches standard Lion's sign more, and flips it less, than
    distributed Lion."""
    r = rates(run, (read or reading(run)).step)
    return [_compare(r, "l1_matches_more", f"{where}: L1 quantization matches standard Lion's sign more often than "
                        "distributed Lion", "l1", "sign", 0, less=False),
            _compare(r, "l1_flips_less", f"{where}: L1 flips the update direction less often than distributed Lion",
                     "l1", "sign", 1, less=True)]


def checks(run: Run, where: str, read: Reading | None = None, groups: dict | None = None) -> list[Check]:
    """What Section 4.2 says of Fig. 5 (GPT): `l1_checks`, then Q_inf, w/o zero and log against distributed Lion,
    and distributed Lion's own match and flip rates."""
    read = read or reading(run)
    r = rates(run, read.step)
    result = l1_checks(run, where, read, groups)
    claim = f"{where}: Q_inf stochastic quantization maps most elements to zero (match + flip under 50%)"
    tails = tails_text(run, read.step)
    zeros = "; mapped to zero by group: " + ", ".join(f"{g} {100 - v['linf'][0] - v['linf'][1]:.1f}%"
                                                      for g, v in (groups or {}).items() if "linf" in v)
    result.append(Check("linf_zeroes_most", claim,
                        f"match + flip {sum(r['linf']):.2f}%" + (zeros if groups else "") + tails, sum(r["linf"]) < 50,
                        value=sum(r["linf"]), paper="most elements to zero") if "linf" in r
                  else Check("linf_zeroes_most", claim, "no linf statistics", None))
    for m, id in (("linf_nozero", "linf_nozero_matches_less"), ("log", "log_matches_less")):
        check = _compare(r, id, f"{where}: {method_name(m)} does not match distributed Lion", m, "sign", 0, less=True)
        by = "; by group: " + ", ".join(f"{g} {v[m][0]:.1f}% vs {v['sign'][0]:.1f}%" for g, v in (groups or {}).items()
                                        if m in v and "sign" in v)
        check.measured += (by if groups else "") + tails
        result.append(check)
    claim = f"{where}: distributed Lion's sign matches 60-70% and flips about 10% (within 5 points)"
    if "sign" in r:
        match, flip = r["sign"]
        when = f"mean over the statistics steps from {read.step} on" + ("" if read.met else " (in the transient)")
        measured = f"match {match:.2f}%, flip {flip:.2f}% ({when})" + _groups_text(groups or {}, "sign")
        result.append(Check("sign_match_and_flip", claim, measured, 55 <= match <= 75 and 5 <= flip <= 15, value=match,
                            paper="match 60-70%, flip ~10%"))
    else:
        result.append(Check("sign_match_and_flip", claim, "no sign statistics", None))
    return result


def tails_text(run: Run, step: int, levels: int = 15) -> str:
    """How heavy the update's tails are at `step` (rank 0's c, from the arrays file), which decides what Q_inf, "w/o
    zero" and log keep: per layer group, the largest max|c| / mean|c| of its layers, and the share of elements below
    the log code's range (|c| < max|c| 2^-(levels + 0.5), from the log10|c| histograms: to a bin)."""
    if step not in run.stats_steps():
        return ""
    a = run.stats_arrays(step)
    if "hist_log10_abs_counts" not in a:
        return ""
    edges = a["hist_log10_abs_edges"]
    ratio: dict[str, float] = {}
    below: dict[str, list[float]] = {}
    for i, name in enumerate(a["layers"]):
        g = layer_group(str(name))
        top, mean = float(a["abs_max"][i]), float(a["abs_mean"][i])
        if mean > 0:
            ratio[g] = max(ratio.get(g, 0.0), top / mean)
        cut = (np.log10(top) if top > 0 else -np.inf) - (levels + 0.5) * np.log10(2)
        counted = below.setdefault(g, [0.0, 0.0])
        counted[0] += float(a["hist_log10_abs_counts"][i][edges[1:] <= cut].sum() + a["hist_log10_abs_below"][i]
                            + a["zeros"][i])
        counted[1] += float(a["numel"][i])
    return ("; tails at step " + str(step) + ": max|c|/mean|c| " + ", ".join(f"{g} {v:.0f}x" for g, v in ratio.items())
            + f"; below the log code's range (max 2^-{levels + 0.5:g}): "
            + ", ".join(f"{g} {100 * n / d:.1f}%" for g, (n, d) in below.items() if d))


def _layer_panel(ax, run: Run, step: int) -> None:
    row = next((r for r in run.rows if r.get("step") == step and r.get(KEY) is not None), {})
    shown = [m for m in ("sign", "l1") if per_layer(row, f"stats/match/{m}")]
    layers = list(per_layer(row, f"stats/match/{shown[0]}")) if shown else []
    for i, m in enumerate(shown):
        values = per_layer(row, f"stats/match/{m}")
        ax.bar([x + 0.4 * i for x in range(len(layers))], [values.get(layer, 0.0) for layer in layers], width=0.4,
               label=method_name(m))
    ax.set_xticks([x + 0.2 for x in range(len(layers))], layers, rotation=90, fontsize=5)
    ax.set(ylabel="match (%)", title=f"per layer, step {row.get('step', '?')}")
    ax.legend(fontsize=7)


def make_figure(runs: list[Run], out: Path, figure: str, stem: str, layers: bool = False, claims=checks) -> Result:
    runs = runs_with_key(runs, KEY, f"{figure}'s sign-match statistics: train with stats.every > 0")
    need(all(rates(r) for r in runs), f"{figure}: a run logs stats/match keys without stats/flip")
    fig, axes = plt.subplots(3 if layers else 2, len(runs), figsize=(6.5 * len(runs), 9 if layers else 6.5),
                             squeeze=False)
    checks_, notes, grouped = [], [], {}
    for col, run in enumerate(runs):
        read = reading(run)
        groups = grouped[run.label] = group_rates(run, read.step)
        for row, kind in enumerate(("match", "flip")):
            ax = axes[row][col]
            for m in methods(run):
                key = f"stats/{kind}/{m}"
                curve(ax, run, lambda r: {s: (s, v) for s, v in zip(*series(r, key))}, method_name(m), marker=".")
            ax.axvline(read.step, color="black", lw=0.8, ls="--",
                       label=f"reading step {read.step}" + ("" if read.met else " (transient)"))
            ax.set(xlabel="step", ylabel=f"{kind} (%)", title=f"{run.label} ({run.world_size} workers): {kind}")
            ax.grid(alpha=0.3)
        axes[0][col].legend(fontsize=7)
        if layers:
            _layer_panel(axes[2][col], run, read.step)
        checks_ += claims(run, run.label, read, groups)
        steps = [s for s in series(run, KEY)[0] if s >= read.step]
        notes.append(f"{run.label}: {read.text()}")
        notes.append(f"{run.label}, means over the {len(steps)} statistics steps from {read.step} on: " + ", ".join(
            f"{method_name(m)} match {a:.1f}% flip {b:.1f}%" for m, (a, b) in rates(run, read.step).items()))
        for g, values in groups.items():
            share = next(iter(values.values()))[2]
            notes.append(f"{run.label}, step {read.step}, {g} ({share:.1f}% of the model): " + ", ".join(
                f"{method_name(m)} match {a:.1f}% flip {b:.1f}%" for m, (a, b, _) in values.items()))
    fig.suptitle(f"{figure}: sign of sum_i Q(c_i) vs standard Lion (elements mapped to zero in neither)", fontsize=10)
    fig.tight_layout()
    files = save(fig, out, stem)
    if any(grouped.values()):
        files.append(_write_groups(grouped, runs, out / f"{stem}_groups.csv"))
    return Result(files, checks_, notes)


def _write_groups(grouped: dict, runs: list[Run], path: Path) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "workers", "step", "group", "share_percent", "method", "match_percent",
                         "flip_percent"])
        for run in runs:
            step = reading(run).step
            for g, values in grouped[run.label].items():
                writer.writerows([run.label, run.world_size, step, g, share, m, a, b]
                                 for m, (a, b, share) in values.items())
    return path
