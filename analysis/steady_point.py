"""Where a run has left its initial transient: the statistics step that Table 2 and Fig. 5 read (Lion Cub, Section
3.2 / Table 2 and Section 4.2 / Fig. 5, which the paper reads mid-training, at iteration 3000 of its GPT 730M run).

The criterion is measured in the run's own training loss, never in the statistics it selects:

    drop(s) = 1 - L(s) / L(s / 2),     L(t) = mean training loss of the steps in (3t/4, t]

the fraction by which the loss fell while the steps doubled from s/2 to s (both ends averaged over a window
proportional to t, so they are smoothed alike). The initial transient is the learning-rate warm-up's plateau near
ln(vocabulary), then the fast fall toward the unigram entropy, where drop(s) peaks at tens of percent; afterwards the
curve flattens. The reading step is the first statistics step s after drop's peak (over every training step) with
drop(s) < `DROP` (10 %: doubling the steps no longer lowers the loss by a tenth). A run that never meets it is read
at its last statistics step, and the reading says that the run is still in its transient.

Deliberate difference: the paper reads a fixed iteration (3000) and states no criterion; a fixed step would mean
different things in runs of different length and learning rate.

`end_reading` is the other reading, Table 2's: the run's last statistics step, where the laptop runs that measure
Table 2 end (docs/scale_model.md sizes them to the paper's iteration 3000: the same fraction of an epoch), with the
transient criterion said beside it. A point reading at the first step past the transient read Table 2 at 0.2-0.3 of
that point (step 40 of 200 at 4 workers on one machine, later on another), where the tie rate is still climbing
and embedding rows that no worker has met yet still give exact-zero directions.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean

from src.runlog.runs import Run

DROP = 0.10  # transient over: the loss falls by less than this fraction while the steps double


@dataclass(frozen=True)
class Reading:
    """The step whose statistics a table reads, and why: `drop` is drop(step) (None where it cannot be measured),
    `met` whether the step is past drop's peak (at `peak`) and drop(step) < `threshold`."""

    step: int
    drop: float | None
    met: bool
    peak: int | None = None
    threshold: float = DROP
    at_end: bool = False  # `end_reading`: the run's last statistics step, whatever the criterion says

    def text(self) -> str:
        value = "not measurable (too few training rows)" if self.drop is None else f"{100 * self.drop:.1f}%"
        rule = (f"drop(s) = 1 - L(s)/L(s/2) of the mean training loss L over (3s/4, s]; the transient is over "
                f"after drop's peak" + (f" (step {self.peak})" if self.peak is not None else "") +
                f", once drop < {100 * self.threshold:.0f}%")
        if self.at_end:
            return (f"statistics read at the run's last statistics step, {self.step} (the scale model's counterpart "
                    f"of the paper's iteration 3000), " + ("past" if self.met else "still in") +
                    f" the loss transient there: drop = {value} ({rule})")
        if self.met:
            return f"statistics read at step {self.step}, the first statistics step past the transient: " \
                   f"drop = {value} ({rule})"
        return f"statistics read at the last statistics step, {self.step}, still in the transient: " \
               f"drop = {value} ({rule})"


def window_loss(losses: dict[int, float], t: float) -> float | None:
    """Mean training loss of the steps in (3t/4, t]; None when no step falls there."""
    values = [v for s, v in losses.items() if 0.75 * t < s <= t]
    return fmean(values) if values else None


def loss_drop(losses: dict[int, float], step: int) -> float | None:
    """drop(step) = 1 - L(step) / L(step / 2) from {step: training loss}; None when a window is empty."""
    late, early = window_loss(losses, step), window_loss(losses, step / 2)
    if late is None or early is None or early <= 0:
        return None
    return 1.0 - late / early


def training_losses(run: Run) -> dict[int, float]:
    """{step: training loss} of the run's optimizer steps (finite values only)."""
    out = {}
    for row in run.train_rows():
        value = row.get("loss")
        if value is not None and value == value and abs(value) != float("inf"):
            out[int(row["step"])] = float(value)
    return out


def peak_step(losses: dict[int, float]) -> int | None:
    """The training step where drop is largest (the fast fall of the transient); None without a measurable drop."""
    drops = {s: loss_drop(losses, s) for s in losses}
    drops = {s: d for s, d in drops.items() if d is not None}
    return max(drops, key=lambda s: (drops[s], -s)) if drops else None


def end_reading(run: Run, steps: list[int], threshold: float = DROP) -> Reading:
    """The last of `steps` (the run's statistics steps), with whether it lies past the transient."""
    if not steps:
        raise ValueError(f"{run.path}: no statistics steps to choose from")
    losses, last = training_losses(run), max(steps)
    peak, drop = peak_step(losses), loss_drop(losses, last)
    met = peak is not None and last > peak and drop is not None and drop < threshold
    return Reading(last, drop, met, peak, threshold, at_end=True)


def reading_step(run: Run, steps: list[int], threshold: float = DROP) -> Reading:
    """The first of `steps` (the run's statistics steps) past the transient, else the last of them."""
    if not steps:
        raise ValueError(f"{run.path}: no statistics steps to choose from")
    losses = training_losses(run)
    peak = peak_step(losses)
    for step in sorted(steps):
        drop = loss_drop(losses, step)
        if peak is not None and step > peak and drop is not None and drop < threshold:
            return Reading(step, drop, True, peak, threshold)
    last = max(steps)
    return Reading(last, loss_drop(losses, last), False, peak, threshold)
