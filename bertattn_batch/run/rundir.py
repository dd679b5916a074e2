"""The run directory while a job writes it: open (or reopen), commit parts in row order, finalize.

Usage::

    with RunDir(run_dir, header, on_existing="resume") as run:   # header: spec, model, fingerprint...
        run.begin_pass(0, sources)              # engines.base.resume_point: which pass, which inputs
        entry = run.part_writer.stage(start_row, end_row, tables)
        run.commit(entry)
        run.finalize(last_run)

Life cycle of a part (the same for every table, committed together; compare Ray Data's ``Datasink``):
1. ``stage``: each table is written under a name readers skip (``_part-….parquet.tmp``) and fsynced,
   by whoever scored the window (this process, or a Ray worker);
2. ``commit``: the manifest (replaced atomically) lists the part: this is the commit point;
3. ``publish``: the files are renamed to ``part-….parquet``.
On reopening, parts the manifest lists are rolled forward (step 3), and files it does not list are
removed, so a run killed at any point resumes with neither duplicates nor gaps. ``fail`` (a job that
stops on an error or a signal) removes the temporaries of uncommitted parts and says "interrupted".
On an object store, which has no rename, ``StoredRunDir`` (run/stored.py) changes steps 1 to 3.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import schema, storage
from .._files import file_lock, hidden_tmp, remove_tree
from ..errors import InputsEditedError, RunDirError, WriteError
from ..ids import IdSet
from ..storage import is_remote
from .existing import old_manifest
from .layout import (
    COMMIT_LOG,
    DERIVED_DIRS,
    LOCK_NAME,
    MANIFEST,
    REPORT_NAME,
    TABLES,
    tmp_name,
)
from .manifest import (
    Manifest,
    PartEntry,
    log_commit,
    row_range_problems,
    save_manifest,
    upgrade,
)
from .parts import PartWriter, check_part_file, check_part_rows, run_file


class RunDir:
    """One run directory, held by this process (a lock) from :meth:`open` to :meth:`close`."""

    def __init__(
        self,
        run_dir: str | Path,
        header: dict[str, Any],
        on_existing: str = "resume",
        part_writer: PartWriter | None = None,
    ) -> None:
        run_dir = storage.normalize(run_dir)
        self.run_dir: Any = run_dir.rstrip("/") if is_remote(run_dir) else Path(run_dir)
        self.header = header
        self.on_existing = on_existing
        self.part_writer = part_writer or PartWriter(self.run_dir)
        self.manifest = Manifest()
        #: the status the run had when it was reopened (None for a new run): "complete" means its last
        #: pass ended, so an incremental job starts a new one rather than finishing it
        self.reopened_status: str | None = None
        #: the reopened run's inputs were named otherwise: what they hold decides (see _check_compatible)
        self.inputs_renamed = False
        self._began = False  # whether this process began (or went on with) a pass: see fail
        self._before_pass: Manifest | None = None  # the manifest as the run was reopened: see fail
        self._positions: dict[str, int] = {}  # part name -> its place in manifest.parts
        self._held = contextlib.ExitStack()

    # -- life cycle ---------------------------------------------------------------------------------
    def __enter__(self) -> RunDir:
        self.open()
        return self

    def __exit__(self, exc_type: type | None, error: BaseException | None, *_: object) -> None:
        try:
            if exc_type is not None:
                self.fail(error)
        finally:
            self.close()

    def open(self) -> None:
        """Create a run, or reopen one made by the same job (rolling its parts forward); holds the run's
        writer lock until :meth:`close`."""
        # before the lock: a folder that is not a run gets no lock file either
        old_manifest(self.run_dir, self.on_existing)
        self._hold()
        try:
            self._open_locked()
        except BaseException:
            self.close()
            raise

    def _hold(self) -> None:
        """Take the run for this process until :meth:`close`: on local disk, a lock on its folder."""
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._held.enter_context(file_lock(self.run_dir / LOCK_NAME, busy=self._busy))
        except OSError as e:
            if self.run_dir.is_symlink() and not self.run_dir.exists():
                where = os.readlink(self.run_dir)
                raise RunDirError(f"{self.run_dir} is a link to {where}, which does not exist") from None
            raise RunDirError(f"cannot write into {self.run_dir}: {e.strerror or e}") from None

    def _busy(self, holder: str) -> RunDirError:
        """Why: two scheduled runs with the same --out would commit parts of the same names over each
        other and each rewrite the manifest without the other's parts."""
        return RunDirError(
            f"another bertattn process{holder} is writing {self.run_dir}; wait for it to end or choose "
            "another --out"
        )

    def close(self) -> None:
        """Release the writer lock (the run itself is left as it is)."""
        self._held.close()

    def _open_locked(self) -> None:
        old = old_manifest(self.run_dir, self.on_existing)
        # a run that committed no part (its start failed, say on a mistyped input) holds nothing to
        # keep, so the corrected job may start afresh instead of being refused as another job
        if old is not None and (self.on_existing == "overwrite" or not old.parts):
            self._clear()
            old = None
        if old is not None:
            self.manifest = old
            self.reopened_status = old.status
            self._check_compatible(old)
            if "fingerprint" in self.header and not self.inputs_renamed:  # the same job, now spelt as
                self.manifest.fingerprint = self.header["fingerprint"]  # this version spells it
            self._recover()  # saved with the status it had: "running" is for begin_pass to say
        else:
            self.manifest = Manifest(
                run_id=f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}",
                **{
                    k: self.header[k]
                    for k in ("spec", "fingerprint", "model", "versions")
                    if k in self.header
                },
                schema_versions=schema.versions(),
                created_at=_now(),
            )
        self._make_folders()
        self._save()

    def _make_folders(self) -> None:
        for table in TABLES:
            (self.run_dir / table).mkdir(parents=True, exist_ok=True)

    def fail(self, error: BaseException | None = None) -> None:
        """Leave the run resumable: only temporary files of an uncommitted part are removed.

        A reopened run refused before its pass began (its inputs changed, say) keeps the status it had:
        marked "interrupted", a complete run would have its next --incremental job finish its last
        pass by row number instead of starting a new pass by id. One refused as its pass read the rows
        it committed before (edited since) keeps its whole manifest: the pass wrote nothing.
        """
        self._drop_uncommitted()
        if isinstance(error, InputsEditedError) and self._before_pass is not None:
            self.manifest = self._before_pass
            if self.manifest.status == "running":  # (a run that was killed) stopped, as it is
                self.manifest.status = "interrupted"
            with contextlib.suppress(OSError, WriteError):
                self._save()
            return
        if self.manifest.schema_versions:  # opened
            began = self._began or self.reopened_status is None
            self.manifest.status = "interrupted" if began else (self.reopened_status or "interrupted")
            with contextlib.suppress(OSError, WriteError):  # the first error counts
                self._save()

    def _drop_uncommitted(self) -> None:
        listed = {tmp_name(p.name) for p in self.manifest.parts}
        for table in TABLES:
            folder = self.run_dir / table
            for f in folder.glob("_*.tmp") if folder.is_dir() else []:
                if f.name not in listed:
                    f.unlink(missing_ok=True)

    def finalize(self, last_run: dict[str, Any]) -> Manifest:
        """Mark the run complete, with this pass's summary and the row counts of every table. A pass
        that read no rows (a rerun of a complete run, a nightly pass with nothing new) keeps the summary
        of the one before: its zeros replaced the run's speed and size figures in the report."""
        if not last_run.get("input_rows") and self.manifest.last_run:
            last_run = self.manifest.last_run
        else:
            last_run = {**last_run, "ended_at": _now()}  # which run the kept figures are of
        self.manifest.last_run = last_run
        self.manifest.counts = part_rows(self.manifest)
        self.manifest.status = "complete"
        self.manifest.completed_at = _now()
        self._save()
        return self.manifest

    def begin_pass(
        self, generation: int, sources: list[dict[str, Any]] | None = None, limit: int | None = None
    ) -> None:
        """Record which pass the parts to come belong to, before the first of them: a pass killed before
        it commits anything must still be told from the finished pass before it. ``sources``: the input
        files the pass reads, which a resume of it checks are unchanged; ``limit``: the rows it reads at
        most (a resume may raise the limit the run began with)."""
        if self.reopened_status is not None:
            self._before_pass = copy.deepcopy(self.manifest)  # before this pass changes it
            self.manifest.status = "running"
            self.manifest.resumed_at = _now()
            self.manifest.resumes += 1
        self.manifest.generation = generation
        self.manifest.limit = limit
        self._began = True
        if sources is not None:
            self.manifest.sources = sources
        if self.inputs_renamed:  # accepted: the run is of the inputs by their new names from now on
            self.manifest.fingerprint = self.header["fingerprint"]
        self._save()

    # -- parts --------------------------------------------------------------------------------------
    @property
    def parts(self) -> list[PartEntry]:
        return self.manifest.parts

    def committed_ids(self, parts: list[PartEntry] | None = None, claimed: bool = False) -> IdSet:
        """Source ids of every committed review (of ``parts``, by default all): rows without a source id
        (``schema.ROW_NUMBER_STATUSES``) are left out, as their doc id is only a row number (an
        incremental pass records them again, and a real id equal to that number is still new).
        ``claimed``: only the ids that rows with a text claimed (``schema.NO_TEXT_STATUSES`` left out
        too), the ids a pass resumed by row number has seen."""
        ids = IdSet()
        no_id = pa.array(schema.ROW_NUMBER_STATUSES + (schema.NO_TEXT_STATUSES if claimed else ()))
        for p in self.parts if parts is None else parts:
            with storage.arrow_file(run_file(self.run_dir, p.files["predictions"])) as f:
                t = pq.read_table(f, columns=["doc_id", "status"], page_checksum_verification=True)
            ids.update(t.filter(pc.invert(pc.is_in(t["status"], no_id))).column("doc_id").to_pylist())
        return ids

    def commit(self, entry: PartEntry) -> None:
        """Steps 2 and 3 for a staged part: append it to the commit log (replacing one of the same name),
        then publish it. The cost does not grow with the parts committed before."""
        log_commit(self.run_dir, entry)
        self._list(entry)
        self.part_writer.publish(entry)

    # -- internals ----------------------------------------------------------------------------------
    def _list(self, entry: PartEntry) -> None:
        """Put ``entry`` in the manifest's parts, in place of one of the same name (a retried window)."""
        at = self._positions.get(entry.name)
        if at is None:
            self._positions[entry.name] = len(self.manifest.parts)
            self.manifest.parts.append(entry)
        else:
            self.manifest.parts[at] = entry

    def _save(self) -> None:
        self.manifest.updated_at = _now()
        save_manifest(self.run_dir, self.manifest)
        self._positions = {p.name: i for i, p in enumerate(self.manifest.parts)}

    def _recover(self) -> None:
        """Roll listed parts forward; delete every file the manifest does not list; check what is left."""
        self._sweep()
        for p in self.parts:
            footers = {t: check_part_file(self.run_dir, run_file(self.run_dir, p.files[t])) for t in TABLES}
            check_part_rows(self.run_dir, p, footers)
        # resuming starts after the last committed row, so the row ranges must be whole: a gap or an
        # overlap means the manifest was edited or restored from an older copy
        for problem in row_range_problems((p.generation, p.start_row, p.end_row) for p in self.parts):
            raise RunDirError(
                f"{self.run_dir}: {problem} (was the manifest edited or restored?); "
                "pass --overwrite to start the run again"
            )

    def _sweep(self) -> None:
        listed = {p.name for p in self.parts}
        for table in TABLES:
            folder = self.run_dir / table
            for f in folder.iterdir() if folder.is_dir() else ():
                if f.name in listed and f.is_file():
                    continue
                if f.name.startswith("_") and f.name.endswith(".tmp") and f.name[1:-4] in listed:
                    final = folder / f.name[1:-4]
                    if final.exists():
                        f.unlink()
                    else:
                        f.replace(final)
                elif f.is_dir():  # a table folder holds parts only; a reader of the folder would read it
                    shutil.rmtree(f)
                else:
                    f.unlink()

    def _check_compatible(self, old: Manifest) -> None:
        # the job's fingerprint read as a manifest would be, so a key it leaves out means its default
        mine = upgrade({"fingerprint": self.header.get("fingerprint", {})})["fingerprint"]
        theirs = old.fingerprint
        # job_sha256 is a hash of the others (and of the inputs as an older version spelt them); a key
        # an older version did not record and upgrade() cannot fill in (tokenizer_sha256) is not compared,
        # nor a model hash the run could not take ("unknown": no local files)
        keys = {
            k for k in set(mine) | set(theirs) if k != "job_sha256" and theirs.get(k, "unknown") != "unknown"
        }
        diff = sorted(k for k in keys if mine.get(k) != theirs.get(k))
        if diff == ["inputs"] and old.sources is not None:
            # named otherwise (the project moved, a nightly file named by its date): the resume decides
            # by what the files hold (resume.resume_point), and the pass that goes on records the names
            self.inputs_renamed = True
            return
        if diff:
            detail = "; ".join(
                f"{k}: run has {_spelled(theirs.get(k))}, job has {_spelled(mine.get(k))}" for k in diff
            )
            raise RunDirError(
                f"{self.run_dir} was made by another job ({detail}); pass --overwrite or choose another --out"
            )

    def _clear(self) -> None:
        """Remove what bertattn wrote into the run directory, its manifest last: a clear cut short leaves
        a folder that is still recognisably a run, so the next --overwrite can finish it."""
        temporaries = [p.name for p in self.run_dir.glob(f".{REPORT_NAME}*.tmp")]  # a report's, a process's
        temporaries += [hidden_tmp(MANIFEST), COMMIT_LOG]
        for name in (*TABLES, *DERIVED_DIRS, REPORT_NAME, *temporaries, MANIFEST):
            child = self.run_dir / name
            if child.is_dir() and not child.is_symlink():
                remove_tree(child)
            else:
                child.unlink(missing_ok=True)


def part_rows(manifest: Manifest) -> dict[str, int]:
    """Rows of every table over the committed parts (an empty input still counts its empty tables):
    what ``counts`` says once the run is complete."""
    counts = dict.fromkeys(TABLES, 0)
    for p in manifest.parts:
        for table, n in p.rows.items():
            counts[table] = counts.get(table, 0) + n
    return counts


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _spelled(value: Any) -> str:
    """A fingerprint value as a job file or the command line spells it (JSON: null, not Python's None)."""
    return json.dumps(value, ensure_ascii=False)
