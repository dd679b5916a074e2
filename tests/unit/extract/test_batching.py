"""Length buckets packed by a token budget: pure functions, no torch."""

from __future__ import annotations

import numpy as np
from helpers import padded_share

from bertattn_batch.extract.batching import batch_overhead, bucket_batches, chunks


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


def test_a_gpu_cuts_fewer_fuller_batches():
    """Beside a GPU one more batch costs its launch on the host, which bounded the model stage there:
    the same window is cut into fewer batches, each fuller, for some more padding."""
    assert batch_overhead(16384) == batch_overhead(16384, "mps") == 256
    assert batch_overhead(65536, "cuda") == 4096 and batch_overhead(100) == 32
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(4.0, 0.7, size=4096).astype(int), 3, 512).tolist()
    cpu = bucket_batches(lengths, 65536, 1024, batch_overhead(65536))
    gpu = bucket_batches(lengths, 65536, 1024, batch_overhead(65536, "cuda"))
    assert sorted(np.concatenate(gpu).tolist()) == list(range(4096))
    assert all(len(b) * max(lengths[i] for i in b) <= 65536 for b in gpu)
    assert len(gpu) < len(cpu)
    (real, slots), (_, slots_cpu) = padded_share(lengths, gpu), padded_share(lengths, cpu)
    assert slots_cpu < slots < 1.2 * real
