"""Run ``bertattn`` in this process and SIGKILL it at a chosen point; used by test_resume.py.

    python tests/killer.py POINT N -- extract ARGS...

POINT is where the N-th event kills the process: ``read`` (the N-th row read), ``forward`` (inside the
N-th model batch), ``write`` (half-way through writing the N-th Parquet file), ``commit`` (right after
the N-th part is appended to the commit log, before its files are renamed), ``part`` (right after the
N-th part).
With ``KILLER_SIGNAL=TERM`` in the environment the process is sent SIGTERM instead, as a scheduler
stopping a job would.
"""

from __future__ import annotations

import os
import signal
import sys

from bertattn_batch.inputs import read
from bertattn_batch.model import Classifier
from bertattn_batch.run import PartWriter, RunDir, rundir


def main() -> None:
    point, n = sys.argv[1], int(sys.argv[2])
    args = sys.argv[sys.argv.index("--") + 1 :]
    calls = {"n": 0}

    def tick() -> bool:
        calls["n"] += 1
        return calls["n"] == n

    def die() -> None:
        os.kill(os.getpid(), getattr(signal, "SIG" + os.environ.get("KILLER_SIGNAL", "KILL")))

    if point == "read":
        original = read._as_text

        def as_text(value):
            if tick():
                die()
            return original(value)

        read._as_text = as_text
    elif point == "forward":
        original_launch = Classifier.launch

        def launch(self, ids):
            if tick():
                self.model(*self.pad(ids))  # really mid-batch: the forward pass runs, then the kill
                die()
            return original_launch(self, ids)

        Classifier.launch = launch
    elif point == "write":
        original_write = PartWriter._write_parquet

        def write_parquet(self, table, path):
            if tick():
                original_write(self, table, path)
                if not isinstance(path, os.PathLike):  # an upload to a store: killed before it completes
                    die()
                data = path.read_bytes()
                path.write_bytes(data[: len(data) // 2])  # a torn file, as a kill mid-write leaves
                die()
            original_write(self, table, path)

        PartWriter._write_parquet = write_parquet
    elif point in ("commit", "part"):
        original_log = rundir.log_commit
        original_commit = RunDir.commit

        def log_commit(run_dir, entry):
            original_log(run_dir, entry)
            if point == "commit" and tick():
                die()

        def commit(self, entry):
            original_commit(self, entry)
            if point == "part" and tick():
                die()

        rundir.log_commit = log_commit
        RunDir.commit = commit
    else:
        raise SystemExit(f"unknown point {point}")
    from bertattn_batch.__main__ import main as bertattn

    sys.argv = ["bertattn", *args]
    bertattn()


if __name__ == "__main__":
    main()
