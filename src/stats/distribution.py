"""The distribution of one rank's update vector, per layer (Lion Cub, Section 4.1 / Fig. 4, Appendix C.2).

Fig. 4: the values of c = beta1 * m + (1 - beta1) * g before quantization are far from uniform, close to a Laplace
and not a Gaussian distribution, and |c| is heavy-tailed (the maximum far above the mean and the mode). For one
layer of rank 0's c this module computes, all on the device and without a host sync:
- max, mean and median of |c|;
- a histogram of c on `bins` uniform bins over [-r, r], r = range * mean|c| (r = 1 for an all-zero layer), with the
  count of elements outside; a histogram of log10|c| on `bins` uniform bins over [log10_min, log10_max] with the
  counts below, above and of exact zeros (these edges are shared by every layer);
- the maximum-likelihood Laplace (loc = median, b = mean|c - loc|) and Gaussian (mean, population std) fits, and
  their Kolmogorov-Smirnov distance to at most `fit_samples` elements drawn uniformly with replacement (all of them
  for a smaller layer). The mean log-likelihoods of the fits follow on the host from the scales:
  -log(2 e b) and -0.5 log(2 pi e std^2).

Deliberate differences: the paper shows histograms and names no goodness-of-fit measure; KS and log-likelihood are
ours. The median is torch's (the lower of the two middle values for an even count).
"""
from __future__ import annotations

import math

import torch

from src.stats.agreement import count_bins

FIELDS = ("abs_max", "abs_mean", "abs_median", "fit_laplace_loc", "fit_laplace_scale", "fit_gauss_mean",
          "fit_gauss_std", "fit_laplace_ks", "fit_gauss_ks", "fit_samples", "hist_r")


def layout(bins: int) -> dict[str, slice]:
    """Where each part sits in the flat vector `layer_distribution` returns."""
    k, parts, start = len(FIELDS), {}, 0
    for name, size in (("fields", k), ("values", bins + 1), ("log10_abs", bins + 3)):
        parts[name] = slice(start, start + size)
        start += size
    return parts


def value_histogram(c: torch.Tensor, r: torch.Tensor, bins: int) -> torch.Tensor:
    """bins counts of c on uniform bins over [-r, r] (c == r in the last), then the count outside."""
    index = torch.floor((c + r) * (bins / (2 * r))).long().clamp_(0, bins - 1)
    index = torch.where(c.abs() <= r, index, bins)
    return count_bins(index, bins + 1)


def log10_histogram(c: torch.Tensor, low: float, high: float, bins: int) -> torch.Tensor:
    """Counts of log10|c|: [below low, bins uniform bins over [low, high], above high, exact zeros]."""
    exponent = torch.log10(c.abs())
    position = torch.floor((exponent - low) * (bins / (high - low)))
    position = torch.where(exponent == high, bins - 1, position).clamp_(-1, bins).long() + 1
    index = torch.where(c == 0, bins + 2, position)
    return count_bins(index, bins + 3)


def _laplace_cdf(x: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    z = (x - loc) / scale
    return torch.where(z < 0, 0.5 * torch.exp(z), 1 - 0.5 * torch.exp(-z))


def _gauss_cdf(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    return 0.5 * (1 + torch.erf((x - mean) / (std * math.sqrt(2.0))))


def ks_distance(sorted_x: torch.Tensor, cdf: torch.Tensor) -> torch.Tensor:
    """sup |F_n - F| of the sample `sorted_x` (ascending) against the model CDF values `cdf` at those points."""
    n = sorted_x.numel()
    i = torch.arange(1, n + 1, dtype=cdf.dtype, device=cdf.device)
    return torch.maximum((i / n - cdf).max(), (cdf - (i - 1) / n).max())


def _sample(c: torch.Tensor, size: int, generator: torch.Generator) -> torch.Tensor:
    if c.numel() <= size:
        return c
    return c[torch.randint(c.numel(), (size,), generator=generator, device=c.device)]


def layer_distribution(c: torch.Tensor, *, bins: int, range_: float, log10_min: float, log10_max: float,
                       fit_samples: int, generator: torch.Generator) -> torch.Tensor:
    """Everything above for one layer's c, as one flat float64 vector laid out by `layout(bins)`."""
    c = c.reshape(-1).float()
    a = c.abs()
    a_mean = a.mean()
    r = torch.where(a_mean > 0, range_ * a_mean, torch.ones_like(a_mean))
    loc = c.median()
    b = (c - loc).abs().mean()
    std, mean = torch.std_mean(c, correction=0)
    x = torch.sort(_sample(c, fit_samples, generator)).values.double()
    nan = torch.full((), float("nan"), dtype=torch.float64, device=c.device)
    ks_laplace = torch.where(b > 0, ks_distance(x, _laplace_cdf(x, loc.double(), b.double())), nan)
    ks_gauss = torch.where(std > 0, ks_distance(x, _gauss_cdf(x, mean.double(), std.double())), nan)
    samples = torch.full((), float(x.numel()), dtype=torch.float64, device=c.device)
    fields = torch.stack([a.max().double(), a_mean.double(), a.median().double(), loc.double(), b.double(),
                          mean.double(), std.double(), ks_laplace, ks_gauss, samples, r.double()])
    return torch.cat([fields, value_histogram(c, r, bins).double(),
                      log10_histogram(c, log10_min, log10_max, bins).double()])
