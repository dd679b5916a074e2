"""bench/storage.py's lossy layouts: the bit rounding they weigh does what its docstring says."""

from __future__ import annotations

import numpy as np
from helpers import load_bench

storage = load_bench("storage")


def test_bit_rounding_keeps_the_asked_precision_and_zeroes_the_rest():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.random(10_000), rng.random(1000) * 1e-6, [0.0, 1.0]]).astype(np.float32)
    for keep in (7, 10, 16):
        rounded = storage.bit_rounded(values, keep)
        assert rounded.dtype == np.float32
        low = rounded.view(np.uint32) & np.uint32((1 << (23 - keep)) - 1)
        assert not low.any()
        nonzero = values > 0
        relative = np.abs(rounded[nonzero] - values[nonzero]) / values[nonzero]
        assert relative.max() <= 2.0 ** -(keep + 1)
        # to nearest: never further than the neighbour on the other side of the value
        step = np.spacing(rounded[nonzero]) * 2 ** (23 - keep)
        assert (np.abs(rounded[nonzero] - values[nonzero]) <= step / 2).all()


def test_bit_rounding_breaks_ties_to_even():
    # 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 at 7 bits: the even mantissa (1) wins;
    # 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: the even one is 1 + 2^-6
    ties = np.array([1 + 2**-8, 1 + 3 * 2**-8], dtype=np.float32)
    assert storage.bit_rounded(ties, 7).tolist() == [1.0, 1 + 2**-6]
