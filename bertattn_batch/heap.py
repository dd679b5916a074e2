"""Hands the C heap's free pages back to the system between windows (glibc's ``malloc_trim``).

Why: each window's model batches and tables are large, short-lived allocations of varying sizes. glibc
serves them from its heaps and keeps what is freed, in fragments, so a long run's resident memory drifts
up with the corpus. Trimming once per window returns the free pages; the next window maps them again.
A no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys


@functools.cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # musl and others have no malloc_trim
        return None


def trim_heap() -> None:
    """Release the free memory of every glibc arena to the system (cheap: a few ms)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
