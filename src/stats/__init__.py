"""Statistics of the update vectors measured inside the training loop (Lion Cub, arXiv:2411.16462: Section 3.2 /
Table 2, Section 4.1 / Fig. 4, Section 4.2 / Fig. 5 and C.1, Section 5.1 / Fig. 7, 8 and B.1).

Every `stats.every` steps (conf/config.yaml's `stats:` block; 0 = off, which builds nothing and costs nothing), on
the update vectors c_i = beta1 * m_i + (1 - beta1) * g_i of that step (g_i: rank i's clipped local gradient, m_i:
the momentum the optimizer is about to use; shared for Lion 32/16-bit, local for Lion Cub), before the optimizer
uses them, and on the momentum after the step. Sums over ranks are sharded, one bucket of parameters at a time:
an all-to-all of c (float32), of the quantized codes (int8) and of the momentum (float32) gives rank j every rank's
values of shard j, which it sums and counts; the per-layer tables then meet on rank 0. No rank gathers another's whole
vector. Rank 0 logs. Its time is `time/stats`, outside `time/total`, `train_time` and the phases of Table A.1.
The voters are the ranks, or the nodes with `variant.hierarchy: node` (i runs over nodes: c_i is node i's, sharded
over its ranks; the sums run over the nodes, each rank on its shards, and node 0's ranks combine them into whole
layers: src/stats/hook.py).

Modules: `config` (the `stats:` block, checked before training), `agreement` (across-rank sums and sign counts),
`distribution` (rank 0's per-layer histograms and Laplace/Gaussian fits), `report` (keys, arrays file, W&B
histograms), `hook` (what the loop calls: `make_stats`, `OFF`).

Keys (metrics.jsonl and W&B; percentages are of elements, in [0, 100]):
- `stats/vote/<lion>_<vote>`, `<lion>`, `<vote>` in pos/neg/zero: lion = sign(sum_i c_i), vote =
  sign(sum_i sign(c_i)), exact ties zero (Table 2: rows lion, columns vote; the 9 keys sum to 100).
- `stats/match/<method>`, `stats/flip/<method>`, `stats/match/<method>/<layer>`, `stats/flip/<method>/<layer>`
  for every method of `stats.quantizers` (src.quant names: sign = distributed Lion, linf = Q_inf stochastic,
  linf_nozero = "w/o zero", log, l1, or any other method of src.quant.METHODS: its entry there is all the statistics
  read; levels in `stats.levels`): q = sign(sum_i Q(c_i)); match = q != 0 and q == lion,
  flip = q != 0 and q == -lion. Denominator: ALL elements of the model / layer. Fig. 5's caption "excludes elements
  mapped to 0" is read as: an element with q == 0 counts as neither a match nor a flip (it stays in the
  denominator), so 100 - match - flip is the percent mapped to zero. This is the only reading under which the
  paper's numbers agree: distributed Lion's 60-70 % match and ~10 % flip leave the ~20-30 % of majority-vote ties
  of Table 2, and Q_inf's "low match and flip rate" comes from most values going to zero.
- `stats/momentum_std/max`, `stats/momentum_std/mean`, `stats/momentum_std/max/<layer>`,
  `stats/momentum_std/mean/<layer>`: per element the population std over ranks of the momentum after the step;
  max and mean over the elements of the model / layer.
- `stats/abs/max/<layer>`, `stats/abs/mean/<layer>`, `stats/abs/median/<layer>`: of rank 0's |c|.
- `stats/fit/laplace_ll/<layer>`, `stats/fit/gauss_ll/<layer>` (mean log-likelihood per element of the MLE fit,
  nats, higher is better) and `stats/fit/laplace_ks/<layer>`, `stats/fit/gauss_ks/<layer>` (Kolmogorov-Smirnov
  distance on at most `stats.fit_samples` sampled elements, lower is better), of rank 0's c.
- `time/stats`: seconds of the statistics on this step (rank 0), and its parts `time/stats/<part>` (src/stats/hook.py):
  `update`, `quantize`, `describe`, `communicate`, `count`, `spread`, `report`.
- W&B only: `stats/hist/values/<layer>`, `stats/hist/log10_abs/<layer>` (wandb.Histogram).
`<layer>` is the name from `model.named_parameters()`; a tied tensor is named by all its names joined by commas
(`transformer.wte.weight,lm_head.weight` for the tied GPT), as momentum synchronization names it
(`src.optim.momentum_sync.named_parameters_with_aliases`), so the key says the tensor is both layers. Per-layer keys
and arrays cover `stats.layers` (null = every trainable parameter; any alias selects a tied tensor); model-wide keys
always cover every trainable parameter.

Arrays: rank 0 writes `<run>/stats/step_<step:08d>.npz` (numpy.savez_compressed, no pickles) per statistics step.
L = selected layers in model order, M = methods, B = `stats.hist.bins`; sign index 0 = pos, 1 = neg, 2 = zero.
`format` () int64 = 1; `step`, `world_size` (the voters: ranks, or nodes) () int64; `layers` (L,) str; `numel` (L,) int64; `methods` (M,) str;
`levels` (M,) int64; `vote_counts` (L, 3, 3) int64 [layer, lion, vote]; `method_counts` (L, M, 3, 3) int64
[layer, method, lion, sign(sum_i Q(c_i))]; `match_counts`, `flip_counts` (L, M) int64; `momentum_std_max`,
`momentum_std_mean` (L,) float64; `model_numel` () int64; `model_vote_counts` (3, 3), `model_method_counts`
(M, 3, 3), `model_match_counts`, `model_flip_counts` (M,) int64; `model_momentum_std_max`, `model_momentum_std_mean` ()
float64; `abs_max`, `abs_mean`, `abs_median` (L,) float64; `hist_values_edges` (L, B+1) float64 (uniform on
[-r, r], r = `stats.hist.range` * abs_mean, 1 for an all-zero layer); `hist_values_counts` (L, B) int64 (edges[k] <=
c < edges[k+1], the last bin closed); `hist_values_outside` (L,) int64 (|c| > r); `hist_log10_abs_edges` (B+1,)
float64 (uniform on [`stats.hist.log10_min`, `stats.hist.log10_max`], shared by all layers); `hist_log10_abs_counts`
(L, B) int64 (non-zero |c| by log10, same rule); `hist_log10_abs_below`, `hist_log10_abs_above`, `zeros` (L,) int64;
`fit_laplace_loc`, `fit_laplace_scale` (median, mean |c - median|), `fit_gauss_mean`, `fit_gauss_std` (population),
`fit_laplace_ll`, `fit_gauss_ll`, `fit_laplace_ks`, `fit_gauss_ks` (L,) float64 (NaN where the scale is 0);
`fit_samples` (L,) int64. The analysis side reads this format (analysis/stats_*: keep both in step).

Deliberate differences from the paper: it does not say how it measured; ours is per parameter tensor (the paper's
"layer"), quantizer scales are per tensor (as LionCub's reducers), and the fits' measures (KS, log-likelihood) are
ours, the paper shows histograms.
"""
from src.stats.config import StatsConfig, check_stats_config
from src.stats.hook import OFF, TrainingStats, make_stats

__all__ = ["OFF", "StatsConfig", "TrainingStats", "check_stats_config", "make_stats"]
