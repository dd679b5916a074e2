"""Length buckets packed by a token budget: pure functions, no torch."""

from __future__ import annotations

import numpy as np

from bertattn_batch.batching import bucket_batches, chunks, padded_share


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


def test_ramp_up_splits_only_the_first_block_and_keeps_every_row():
    from bertattn_batch.pipeline import MIN_FIRST_WINDOW, ramp_up
    from bertattn_batch.read import RowBatch

    def block(lo: int, hi: int) -> RowBatch:
        rows = list(range(lo, hi))
        return RowBatch(
            rows, [str(r) for r in rows], ["t"] * len(rows), [None] * len(rows), ["ok"] * len(rows)
        )

    head = MIN_FIRST_WINDOW
    blocks = list(ramp_up(iter([block(0, 8 * head), block(8 * head, 9 * head)]), head))
    assert [(b.row_index[0], b.row_index[-1] + 1) for b in blocks] == [
        (0, head),
        (head, 8 * head),
        (8 * head, 9 * head),
    ]
    assert blocks[0].doc_id == [str(r) for r in range(head)] and blocks[1].text == ["t"] * (7 * head)
    small = list(ramp_up(iter([block(0, 40)]), 5))  # below MIN_FIRST_WINDOW: left whole
    assert [len(b) for b in small] == [40]
    assert [len(b) for b in ramp_up(iter([block(0, head)]), head)] == [head]  # nothing to split off
