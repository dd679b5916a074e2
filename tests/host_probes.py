"""Part writers that a host process (engines/processes.py) unpickles: kept apart from the tests
that use them, so that importing them in that process imports no more than it would itself. They are
set through the environment, which a host process inherits (a class attribute set in a test is not)."""

from __future__ import annotations

import functools
import os
import sys
import time

from bertattn_batch.run import PartWriter


def _starts(path, row: str) -> bool:
    return path.name.startswith(f"_part-{int(os.environ[row]):012d}")


@functools.cache
def heap_kept() -> bool:
    """Whether this process keeps 100 MB it freed for its next use (glibc's malloc tuned so), rather
    than handing it back to the system; asked once a process."""
    import numpy as np

    def rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    before = rss_mb()
    array = np.ones(100 << 20, np.uint8)
    del array
    return rss_mb() - before > 90


class Probe(PartWriter):
    """Notes, per part, the process that wrote it, whether that process had imported torch, whether
    it keeps its heap and its parent, in the file ``$PROBE_NOTES``."""

    def _write_parquet(self, table, path):
        with open(os.environ["PROBE_NOTES"], "a") as f:
            f.write(f"{os.getpid()} {'torch' in sys.modules} {heap_kept()} {os.getppid()}\n")
        super()._write_parquet(table, path)


class SlowThenFull(PartWriter):
    """The part of the window at row ``$PROBE_SLOW`` is slow to write, and that at ``$PROBE_FULL``
    fails as a full disk would."""

    def _write_parquet(self, table, path):
        if _starts(path, "PROBE_SLOW"):
            time.sleep(1.0)
        if _starts(path, "PROBE_FULL"):
            raise OSError(28, "No space left on device")
        super()._write_parquet(table, path)


class Dies(PartWriter):
    """The process writing the part of the window at row ``$PROBE_DIE`` dies on the spot, as one the
    kernel killed for memory would."""

    def _write_parquet(self, table, path):
        if _starts(path, "PROBE_DIE"):
            os._exit(1)
        super()._write_parquet(table, path)


class Slow(PartWriter):
    """Every part takes ``$PROBE_SLEEP`` seconds longer to write: a job that is still running."""

    def _write_parquet(self, table, path):
        time.sleep(float(os.environ["PROBE_SLEEP"]))
        super()._write_parquet(table, path)
