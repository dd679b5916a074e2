"""trim_heap hands freed C-heap pages back to the system, and keep_heap keeps them for the next window
until told otherwise (glibc only)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bertattn_batch import runtime
from bertattn_batch.runtime import keep_heap, trim_heap

glibc_only = pytest.mark.skipif(runtime._glibc("mallopt") is None, reason="the C library is not glibc")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@glibc_only
def test_trim_heap_returns_freed_fragments_to_the_system():
    # 200 MB in 64 KiB blocks (under glibc's mmap threshold: served from the heap), every page touched;
    # every block but the last is freed, which pins the heap's top, so free() alone keeps the pages
    blocks = [bytearray(b"x" * (64 << 10)) for _ in range(3200)]
    last = blocks[-1]
    del blocks[:-1]
    kept = _rss_mb()
    trim_heap()
    after = _rss_mb()
    assert kept - after > 0.5 * 200, (kept, after)
    assert last[:1] == b"x"  # the block still in use is intact


@glibc_only
def test_a_kept_heap_keeps_a_freed_array_until_it_is_given_back():
    keep_heap()
    try:
        before = _rss_mb()
        array = np.ones(100 << 20, np.uint8)  # 100 MB: mapped apart and unmapped once freed, unless kept
        del array
        trim_heap()  # a no-op while the heap is kept
        kept = _rss_mb()
        assert kept - before > 90, (before, kept)
    finally:
        keep_heap(False)
    assert not runtime._heap_kept
    assert kept - _rss_mb() > 90, (kept, _rss_mb())  # handed back, and glibc's defaults are back
    array = np.ones(100 << 20, np.uint8)
    del array
    assert kept - _rss_mb() > 90
