"""Measures over the per-token sums that weigh rarity: contrasts between labels (which rare tokens
cannot win) and means shrunk toward their head's mean (by as much as the spread between tokens allows).

Both work on the unfiltered per-(unit, layer, head, split, class_label, token) sums of
:func:`~bertattn_batch.analysis.aggregate.combine`, before ``min_reviews`` drops rows, so that a
head's totals and variances count every token it attended to.

- ``log_odds``/``log_odds_z``: the weighted log-odds ratio with an informative Dirichlet prior (Monroe,
  Colaresi & Quinn 2008, "Fightin' Words", eq. 16 to 22) of a token between the group's class and the
  rest of the split, counting each head's raw attention mass (``weight_sum``) as the token's count and
  the split's own totals as the prior (``α_w`` = the token's mass over every class, ``α_0`` = the
  head's total mass). The z-score divides by the estimate's standard deviation, which is large for a
  token with little mass: a token seen in three reviews cannot reach the z of one seen in three
  hundred with the same ratio. Null for the split 'all', and for a split whose scored reviews all
  have one class: neither has another class to contrast with.
- ``mean_scaled_shrunk``: the mean scaled weight shrunk toward the head's mean over the group by the
  token's review count, an empirical-Bayes (normal-normal) estimate with method-of-moments variances:
  ``(n·m + κ·μ) / (n + κ)``, with ``κ = s² / τ²``, ``s²`` the pooled within-token variance of the
  scaled weights and ``τ²`` the variance of the token means less their mean sampling variance
  ``s²/n``.
"""

from __future__ import annotations

import polars as pl

#: Groups of one head's tokens within one class, and of one head's tokens over a whole split.
GROUP = ["unit", "layer", "head", "split", "class_label"]
_SPLIT = ["unit", "layer", "head", "split"]
_TOKEN = ["unit", "layer", "head", "split", "token"]

#: Floor of τ² (the spread of the true token means), so that a head whose token means differ by no
#: more than chance shrinks every token to the head's mean instead of dividing by zero.
MIN_BETWEEN_VARIANCE = 1e-12


def with_contrasts(sums: pl.LazyFrame) -> pl.LazyFrame:
    """``sums`` with ``log_odds`` and ``log_odds_z`` of each token in its class against the rest."""
    y = pl.col("weight_sum")
    prior = y.sum().over(_TOKEN)  # α_w: the token's mass in every class of the split
    prior_total = y.sum().over(_SPLIT)  # α_0: the head's mass over the split
    n_class = y.sum().over(GROUP)
    y_rest, n_rest = prior - y, prior_total - n_class
    odds_class = (y + prior) / (n_class + prior_total - y - prior)
    odds_rest = (y_rest + prior) / (n_rest + prior_total - y_rest - prior)
    delta = odds_class.log() - odds_rest.log()
    sd = (1 / (y + prior) + 1 / (y_rest + prior)).sqrt()
    contrast = (pl.col("split") != "all") & (n_rest > 0)
    return sums.with_columns(
        log_odds=pl.when(contrast).then(delta),
        log_odds_z=pl.when(contrast).then(delta / sd),
    )


def with_shrunk_means(sums: pl.LazyFrame) -> pl.LazyFrame:
    """``sums`` with ``mean_scaled_shrunk``: each token's mean scaled weight pulled toward its head's mean
    in the group, the more so the fewer reviews it was seen in."""
    n_occ, n_rev = pl.col("n_occurrences"), pl.col("n_reviews")
    mean = pl.col("scaled_sum") / n_occ
    head_mean = pl.col("scaled_sum").sum().over(GROUP) / n_occ.sum().over(GROUP)
    within = (pl.col("scaled_sq_sum") - n_occ * mean**2).clip(lower_bound=0)
    pooled = within.sum().over(GROUP) / n_occ.sum().over(GROUP)  # s²
    between = (mean.var(ddof=0).over(GROUP) - (pooled / n_rev).mean().over(GROUP)).fill_null(0)
    kappa = pooled / pl.max_horizontal(between, pl.lit(MIN_BETWEEN_VARIANCE))
    return sums.with_columns(mean_scaled_shrunk=(n_rev * mean + kappa * head_mean) / (n_rev + kappa))
