"""Part writers that a host process (engines/host_processes.py) unpickles: kept apart from the tests
that use them, so that importing them in that process imports no more than it would itself. They are
set through the environment, which a host process inherits (a class attribute set in a test is not)."""

from __future__ import annotations

import os
import sys
import time

from bertattn_batch.run import PartWriter


def _starts(path, row: str) -> bool:
    return path.name.startswith(f"_part-{int(os.environ[row]):012d}")


class Probe(PartWriter):
    """Notes, per part, the process that wrote it, whether that process had imported torch and whether
    it keeps its heap (runtime.keep_heap), in the file ``$PROBE_NOTES``."""

    def _write_parquet(self, table, path):
        from bertattn_batch import runtime

        with open(os.environ["PROBE_NOTES"], "a") as f:
            f.write(f"{os.getpid()} {'torch' in sys.modules} {runtime._heap_kept}\n")
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
