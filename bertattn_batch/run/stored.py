"""The run directory on an object store (``s3://``, ``gs://``, ``hdfs://``), which has no rename and no lock.

Usage: as :class:`RunDir` (``run_dir_class(out)`` picks this class for a URI)::

    with StoredRunDir("s3://bucket/runs/r1", header) as run:
        ...

Against local disk (run/rundir.py), four things change; what is committed, and how a resume goes on,
do not:
1. a part is uploaded under its final name, named by its window (``PartWriter``): a store makes an
   object visible only once its upload completes, and a retried window overwrites rather than adds;
2. the driver alone commits a part, by rewriting the manifest that lists it (one PUT a part: a store
   cannot append to a commit log). A part no manifest lists is not committed; readers never read it;
3. one process at a time writes the run, holding a lease with a stated expiry (run/lease.py) instead
   of a lock file that could outlive a killed process;
4. on reopening, and when a job stops on an error, objects under the table folders that the manifest
   does not list (the uploads of a killed run's workers) are deleted.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from .. import storage
from ..errors import RunDirError, StorageError
from .layout import DERIVED_DIRS, MANIFEST, REPORT_NAME, TABLES
from .lease import DEFAULT_TTL_S, SETTLE_S, Lease
from .manifest import PartEntry
from .rundir import RunDir


class StoredRunDir(RunDir):
    """One run on an object store, held by this process (a lease) from :meth:`open` to :meth:`close`."""

    #: seconds a lease lives unrenewed: how long a killed run keeps others from its --out
    lease_ttl_s = DEFAULT_TTL_S
    #: seconds between writing the lease and reading it back, when taking it (run/lease.py)
    lease_settle_s = SETTLE_S
    _lease: Lease | None = None  # held from open to close

    def _hold(self) -> None:
        """On a store: a lease, kept fresh until :meth:`close`, which every part's upload asks first."""
        self._lease = Lease.take(self.run_dir, self.lease_ttl_s, self.lease_settle_s)
        self.part_writer.lease = self._lease.guard()
        self._held.callback(self._lease.drop)
        self._held.callback(self._lease.keep_fresh())

    def commit(self, entry: PartEntry) -> None:
        """List the uploaded part in the manifest, and write the manifest: the commit point."""
        self._list(entry)
        self._save()

    def _save(self) -> None:
        if self._lease is not None:
            self._lease.check()
        super()._save()

    def fail(self, error: BaseException | None = None) -> None:
        """As on local disk, unless this run lost its lease: then another run owns the store's objects
        (its own uploads among them) and this one touches nothing. A store that fails now does not hide
        the error that stopped the job."""
        if self._lease is not None:
            try:
                self._lease.check()
            except RunDirError:
                return
        with contextlib.suppress(StorageError):
            super().fail(error)

    def _make_folders(self) -> None:
        """A store has no folders: a table's folder is the prefix of its parts' names."""

    def _drop_uncommitted(self) -> None:
        self._sweep()

    def _sweep(self) -> None:
        """Delete every object in a table folder that the manifest does not list."""
        listed = {p.name for p in self.parts}
        for table in TABLES:
            folder = storage.join(self.run_dir, table)
            for name in storage.list_names(folder, recursive=True):
                if name not in listed:
                    storage.delete(storage.join(folder, name))

    def _clear(self) -> None:
        """Remove what bertattn wrote into the run, its manifest last (as on local disk)."""
        for name in (*TABLES, *DERIVED_DIRS):
            storage.delete_folder(storage.join(self.run_dir, name))
        for name in (REPORT_NAME, MANIFEST):
            storage.delete(storage.join(self.run_dir, name))


def run_dir_class(out: str | Path) -> type[RunDir]:
    """The run directory class for ``--out``: a store's URI, or a local path (``file://`` included)."""
    return StoredRunDir if storage.is_remote(out) else RunDir
