"""What the contrast and shrinkage measures are for: a rare token cannot top them by chance."""

from __future__ import annotations

import polars as pl

from bertattn_batch.analysis.aggregate import with_contrasts, with_shrunk_means


def _sums(rows: list[tuple[str, str, float, int, float, float]]) -> pl.LazyFrame:
    """(class_label, token, attention mass, reviews, scaled sum, scaled squares) of one head."""
    return pl.LazyFrame(
        {
            "unit": "token",
            "layer": 4,
            "head": 0,
            "split": "pred_label",
            "class_label": [r[0] for r in rows],
            "token": [r[1] for r in rows],
            "weight_sum": [r[2] for r in rows],
            "n_reviews": [r[3] for r in rows],
            "n_occurrences": [r[3] for r in rows],
            "scaled_sum": [r[4] for r in rows],
            "scaled_sq_sum": [r[5] for r in rows],
        }
    )


def test_the_same_ratio_on_more_mass_gives_a_larger_z():
    # 'rare' and 'common' both have 9 times the mass in 'negative' as in 'positive'
    rows = [
        ("negative", "rare", 0.9, 3, 0.0, 0.0),
        ("positive", "rare", 0.1, 1, 0.0, 0.0),
        ("negative", "common", 90.0, 300, 0.0, 0.0),
        ("positive", "common", 10.0, 100, 0.0, 0.0),
        ("negative", "filler", 500.0, 900, 0.0, 0.0),
        ("positive", "filler", 500.0, 900, 0.0, 0.0),
    ]
    got = with_contrasts(_sums(rows)).collect()
    z = {(c, t): v for c, t, v in got.select("class_label", "token", "log_odds_z").rows()}
    assert z[("negative", "common")] > z[("negative", "rare")] > 0
    assert z[("positive", "common")] < 0  # the other side of the same contrast
    assert abs(z[("negative", "common")] + z[("positive", "common")]) < 1e-9  # two classes: symmetric


def test_a_split_with_one_class_has_no_contrast():
    """Every review predicted 'negative': log_odds came out 0 for every token, as if measured."""
    got = with_contrasts(
        _sums([("negative", "good", 5.0, 3, 0.0, 0.0), ("negative", "bad", 9.0, 4, 0.0, 0.0)])
    )
    assert got.collect().select("log_odds", "log_odds_z").null_count().row(0) == (2, 2)


def test_a_token_seen_once_is_pulled_to_the_heads_mean_more_than_one_seen_often():
    # scaled weights: 'once' 1.0 in one review; 'often' 0.9 in 50 (variance 0.05); ten others around 0.2
    # (variance 0.08): sums of squares are n * (mean² + variance)
    rows = [("negative", "once", 0.0, 1, 1.0, 1.0), ("negative", "often", 0.0, 50, 45.0, 50 * (0.81 + 0.05))]
    for i in range(10):
        m = 0.15 + 0.01 * i
        rows.append(("negative", f"t{i}", 0.0, 20, 20 * m, 20 * (m * m + 0.08)))

    got = with_shrunk_means(_sums(rows)).collect()
    shrunk = dict(got.select("token", "mean_scaled_shrunk").rows())
    assert shrunk["often"] > shrunk["once"]  # the raw means rank them the other way
    assert 0.9 - shrunk["often"] < 1.0 - shrunk["once"]
