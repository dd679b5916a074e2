"""The n-gram teacher: features and regression against scikit-learn's, and no row taught by itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bertattn_batch.finetune import finetune
from bertattn_batch.spec import FinetuneSpec
from bertattn_batch.teacher import LogisticRegression, NgramFeatures, char_ngrams, cross_fitted_probs

sklearn = pytest.importorskip("sklearn")
from sklearn.feature_extraction.text import TfidfVectorizer  # noqa: E402
from sklearn.linear_model import LogisticRegression as SkLogisticRegression  # noqa: E402


def _sample(zh_rows, drug_rows, n: int) -> tuple[list[str], np.ndarray]:
    """n real reviews in three classes: Chinese positive, Chinese negative, English."""
    zh_pos = [r["text"] for r in zh_rows if r["label"] == "pos"][: n // 3]
    zh_neg = [r["text"] for r in zh_rows if r["label"] == "neg"][: n // 3]
    en = [r["text"] for r in drug_rows][: n - 2 * (n // 3)]
    texts = zh_pos + zh_neg + en
    return texts, np.repeat([0, 1, 2], [len(zh_pos), len(zh_neg), len(en)])


def test_char_ngrams() -> None:
    assert char_ngrams("Ab  c", 2) == ["a", "b", " ", "c", "ab", "b ", " c"]
    assert char_ngrams("好", 3) == ["好"]


def test_features_equal_scikit_learns_tfidf(zh_rows, drug_rows) -> None:
    texts, _ = _sample(zh_rows, drug_rows, 300)
    features = NgramFeatures.fit(texts, 3, min_df=2)
    ours = features.transform(texts).to_dense().numpy()
    ref = TfidfVectorizer(analyzer="char", ngram_range=(1, 3), min_df=2, sublinear_tf=True)
    theirs = ref.fit_transform(texts).toarray()
    order = [features.vocab[g] for g in ref.get_feature_names_out()]
    assert sorted(order) == list(range(len(features.vocab)))  # the same n-grams
    np.testing.assert_allclose(ours[:, order], theirs, atol=1e-6)
    # unseen texts: n-grams outside the vocabulary are dropped, as there
    new = ["全新的句子 never seen", ""]
    np.testing.assert_allclose(
        features.transform(new).to_dense().numpy()[:, order], ref.transform(new).toarray(), atol=1e-6
    )


def test_regression_equals_scikit_learns(zh_rows, drug_rows) -> None:
    texts, y = _sample(zh_rows, drug_rows, 300)
    x = NgramFeatures.fit(texts, 2, min_df=1).transform(texts)
    ours = LogisticRegression.fit(x, y, 3, c=10.0, max_iter=500).predict_proba(x)
    ref = TfidfVectorizer(analyzer="char", ngram_range=(1, 2), min_df=1, sublinear_tf=True).fit_transform(
        texts
    )
    theirs = SkLogisticRegression(C=10.0, tol=1e-8, max_iter=5000).fit(ref, y).predict_proba(ref)
    np.testing.assert_allclose(ours, theirs, atol=2e-3)


def test_no_row_is_taught_by_a_regression_that_saw_it() -> None:
    # Labels drawn at random: a regression fits its own rows' labels, but cannot predict another's.
    rng = np.random.default_rng(0)
    texts = ["".join(rng.choice(list("甲乙丙丁戊己庚辛壬癸"), size=12)) for _ in range(400)]
    y = rng.integers(0, 2, size=len(texts))
    x = NgramFeatures.fit(texts, 3, min_df=1).transform(texts)
    in_sample = LogisticRegression.fit(x, y, 2).predict_proba(x).argmax(1)
    assert (in_sample == y).mean() > 0.95
    crossed = cross_fitted_probs(texts, y, 2, n=3, seed=1)
    assert crossed.shape == (400, 2)
    np.testing.assert_allclose(crossed.sum(1), 1.0, atol=1e-5)
    assert abs((crossed.argmax(1) == y).mean() - 0.5) < 0.1


TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64, "max_length": 64}


def test_finetune_learns_from_the_teacher(zh_rows, tmp_path: Path) -> None:
    rows = [r for r in zh_rows if r["label"] == "pos"][:150] + [r for r in zh_rows if r["label"] == "neg"][
        :150
    ]
    texts, labels = [r["text"] for r in rows], [r["label"] for r in rows]
    spec = FinetuneSpec(**TINY, min_char_count=1, epochs=1.0, eval_fraction=0.2, teacher_ngrams=2)
    metrics = finetune(texts, labels, tmp_path / "m", spec, progress=False)
    teacher = metrics["teacher"]
    assert teacher["ngrams"] == 2 and teacher["weight"] == 0.5
    assert 0.5 < teacher["cross_fitted_accuracy"] <= 1.0  # real reviews: better than chance
    assert metrics["n_train"] == 240 and 0.0 <= metrics["accuracy"] <= 1.0
    plain = finetune(texts, labels, tmp_path / "n", FinetuneSpec(**TINY, min_char_count=1), progress=False)
    assert plain["teacher"] is None
