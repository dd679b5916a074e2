"""Length buckets packed by a token budget: pure functions, no torch."""

from __future__ import annotations

import numpy as np

from bertattn_batch.extract.batching import bucket_batches, chunks, padded_share


def test_chunks():
    assert list(chunks(range(7), 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(chunks([], 3)) == []


def test_buckets_cut_padding_against_corpus_order():
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(4.0, 0.7, size=2000).astype(int), 3, 512).tolist()
    batches = bucket_batches(lengths, batch_tokens=4096, max_batch_size=64)
    assert sorted(np.concatenate(batches).tolist()) == list(range(2000))
    for b in batches:
        assert len(b) <= 64
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 4096
    real, slots = padded_share(lengths, batches)
    naive = [np.arange(i, min(i + 32, 2000)) for i in range(0, 2000, 32)]
    real_n, slots_n = padded_share(lengths, naive)
    assert real == real_n == sum(lengths)
    assert 1 - real / slots < 0.05 < 1 - real_n / slots_n


def test_oversized_review_gets_its_own_batch():
    batches = bucket_batches([10, 900, 12], batch_tokens=100, max_batch_size=8)
    assert [b.tolist() for b in batches] == [[1], [0, 2]]
    assert bucket_batches([], 100, 8) == []
