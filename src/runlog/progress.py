"""Rank 0's training progress: a tqdm bar on a terminal, a plain line per interval otherwise (Slurm logs).

A bar redrawn with carriage returns turns a batch log into one enormous line, so when stdout is not a terminal the
progress is a line every `train.log_every_s` seconds (and at the last step), e.g.
`step 1200/10000 (12.0%)  loss 3.2140  lr 6.00e-05  0.84 s/step  eta 2:03:12`, where s/step is measured since
the previous line. `train.progress=false` shows neither.
"""
from __future__ import annotations

import datetime
import sys
import time

from tqdm import tqdm


class StepProgress:
    def __init__(self, total: int, initial: int, enabled: bool, interval_s: float, stream=None):
        self.stream = stream or sys.stdout
        self.total, self.enabled, self.interval_s = total, enabled, float(interval_s)
        terminal = enabled and self.stream.isatty()
        self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True) if terminal else None
        self.last_step, self.last_time = initial, time.perf_counter()

    def update(self, step: int, row: dict) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{row['loss']:.4f}", lr=f"{row['lr']:.2e}", refresh=False)
            return
        now = time.perf_counter()
        if not self.enabled or (step < self.total and now - self.last_time < self.interval_s):
            return
        per_step = (now - self.last_time) / max(1, step - self.last_step)
        eta = datetime.timedelta(seconds=round(per_step * (self.total - step)))
        print(f"step {step}/{self.total} ({100 * step / self.total:.1f}%)  loss {row['loss']:.4f}  "
              f"lr {row['lr']:.2e}  {per_step:.3g} s/step  eta {eta}", file=self.stream, flush=True)
        self.last_step, self.last_time = step, now

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
