"""trim_heap hands freed C-heap pages back to the system (glibc only)."""

from __future__ import annotations

import os

import pytest

from bertattn_batch.runtime import _malloc_trim, trim_heap


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(_malloc_trim() is None, reason="the C library is not glibc")
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
