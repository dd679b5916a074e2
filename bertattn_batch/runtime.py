"""Process-wide tuning a job applies once at its start, and the C heap between windows: trimmed, or
kept for the next window in processes that do little else.

Usage::

    import bertattn_batch
    bertattn_batch.tune_runtime()    # first thing in a notebook, before torch computes anything

``run_job`` and every ``bertattn`` command call :func:`tune_runtime` themselves; importing the package
changes nothing. What it sets, and why, is in ``docs/performance.md`` (memory).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

#: Environment variables read by torch's and Arrow's native libraries when they first need them; a value
#: the user set is kept. The kernel caches (oneDNN's and, for bfloat16 matmuls, ideep's) keep a compiled
#: kernel per input shape, and length-bucketed batches have hundreds of shapes: small caches keep a long
#: run's memory flat at no cost in speed. jemalloc hands Arrow's freed memory back to the system as it goes.
RUNTIME_ENV = {
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "2",
    "LRU_CACHE_CAPACITY": "16",
    "TOKENIZERS_PARALLELISM": "false",  # a job runs its own encode threads
}
if sys.platform.startswith("linux"):  # where pyarrow's wheels include jemalloc
    RUNTIME_ENV["ARROW_DEFAULT_MEMORY_POOL"] = "jemalloc"


def tune_runtime() -> dict[str, str]:
    """Set :data:`RUNTIME_ENV` where the user has not; returns the values in force (a Ray worker gets
    the same). To take effect it must come before torch's first computation and pyarrow's first
    allocation in the process."""
    for key, value in RUNTIME_ENV.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in RUNTIME_ENV}


#: mallopt's parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: While the heap is kept (:func:`keep_heap`): arrays up to this size come from the heap, and this much
#: free memory may stay at its top. glibc's manual gives 32 MiB as the most the first may be; newer
#: glibc takes more, which a window's model outputs (about 30 MB) need.
KEPT_THRESHOLDS = (1 << 28, 1 << 25)
_heap_kept = False


@functools.cache
def _glibc(name: str):
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return getattr(libc, name)
    except (OSError, AttributeError):  # musl and others have no malloc_trim or mallopt
        return None


def trim_heap() -> None:
    """Hand the free memory of every glibc arena back to the system (a few ms; once per window).

    Each window's batches and tables are large, short-lived allocations of varying sizes, which glibc
    keeps in fragments once freed, so a long run's resident memory would drift up with the corpus.
    A no-op where the C library is not glibc, and while the heap is kept (:func:`keep_heap`).
    """
    trim = _glibc("malloc_trim")
    if trim is not None and not _heap_kept:
        trim(0)


def keep_heap() -> bool:
    """Keep freed memory for the next window, for the rest of this process's life: for a process that
    does nothing but windows (a host process), never for the caller's own. Returns whether it could.

    Each window allocates about what the one before it freed. By default glibc maps large arrays (over
    128 KiB, up to 32 MiB as it adapts) to fresh pages and unmaps them once freed, so each window pays
    a page fault per 4 KiB again: unpickling a window's model outputs spent more time on those than on
    copying. Kept, a host process takes less than half the page faults, and memory stays at about one
    window's peak (docs/performance.md). There is no way back: setting a threshold stops glibc from
    adapting it. A no-op where the C library is not glibc, or where the user set glibc's
    malloc settings (``MALLOC_*`` or ``GLIBC_TUNABLES``).
    """
    global _heap_kept
    mallopt = _glibc("mallopt")
    if mallopt is None or _malloc_settings_set():  # what the user chose is kept
        return False
    for threshold in KEPT_THRESHOLDS:
        if mallopt(_M_MMAP_THRESHOLD, threshold) and mallopt(_M_TRIM_THRESHOLD, threshold):
            _heap_kept = True
            break
    return _heap_kept


def _malloc_settings_set() -> bool:
    """Whether glibc's malloc was configured from the environment."""
    return any(k.startswith("MALLOC_") for k in os.environ) or "malloc" in os.environ.get(
        "GLIBC_TUNABLES", ""
    )
