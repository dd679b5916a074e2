"""The run directory while a job writes it: open (or reopen), commit parts in row order, finalize; and a
reopened run's resume point (which pass goes on, which rows and ids it skips). On local disk a part is
staged under a name readers skip, committed by a line of the commit log, then renamed; on an object store
(``StoredRunDir``) it is uploaded under its final name and committed by a compare-and-swap of the
manifest, under a lease (run/lease.py). docs/reliability.md and docs/storage.md tell why.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import schema, storage
from .._files import file_lock, hidden_tmp, remove_tree
from ..errors import (
    DamagedRunError,
    InputError,
    InputsEditedError,
    RunDirError,
    RunVersionError,
    StorageError,
    WriteError,
)
from ..ids import IdSet
from ..storage import is_remote
from .lease import DEFAULT_TTL_S, SETTLE_S, Lease, LeaseGuard
from .manifest import (
    ALL_TABLES,
    COMMIT_LOG,
    DERIVED_DIRS,
    FORMAT,
    LEASE_NAME,
    LOCK_NAME,
    MANIFEST,
    REPORT_NAME,
    TABLES,
    Manifest,
    PartEntry,
    log_commit,
    manifest_text,
    read_manifest,
    save_manifest,
    tmp_name,
)
from .parts import PartWriter, check_part, check_row_ranges, run_file

log = logging.getLogger(__name__)


def old_manifest(run_dir: str | Path, on_existing: str = "resume") -> Manifest | None:
    """The manifest of the run at a job's --out (None where there is none yet); refuses a file, a folder
    bertattn did not make, and with ``on_existing="new"`` a run that committed parts."""
    local = not is_remote(run_dir)
    run_dir = Path(storage.normalize(run_dir)) if local else run_dir
    if local and run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is a file, not a folder; choose another --out")
    if not storage.is_file(storage.join(run_dir, MANIFEST)):
        if local:
            foreign = run_dir.is_dir() and any(not _left_by_a_start(p) for p in run_dir.iterdir())
        else:
            foreign = any(name != LEASE_NAME for name in storage.list_names(run_dir, recursive=True))
        if foreign:
            raise RunDirError(f"{run_dir} is not empty and is not a run directory; choose another --out")
        return None
    redo = on_existing == "overwrite"
    try:
        old = read_manifest(run_dir)
    except RunVersionError:
        if redo:  # an older version's run, which this one can only redo
            return Manifest()
        raise
    except DamagedRunError as e:  # a run of ours (it names our format) to redo when asked
        ours = rb'"format"\s*:\s*' + json.dumps(FORMAT).encode()
        if not re.search(ours, storage.read_bytes(storage.join(run_dir, MANIFEST))):
            raise RunDirError(
                f"{e}; bertattn did not write it, so it is left as it is: choose another --out"
            ) from None
        if not redo:
            raise RunDirError(
                f"{e}; pass --overwrite to start the run again, or choose another --out"
            ) from None
        return Manifest()
    except RunDirError as e:
        if "is not a bertattn run directory" in str(e):
            raise RunDirError(f"{run_dir} is not a bertattn run directory; choose another --out") from None
        raise
    if on_existing == "new" and old.parts:
        raise RunDirError(f"{run_dir} already holds a run; choose another --out or pass --overwrite")
    return old


def _left_by_a_start(path: Path) -> bool:
    """What a run stopped before its first manifest leaves: lock, manifest temporary, empty table folders."""
    if path.name in (LOCK_NAME, hidden_tmp(MANIFEST)):
        return path.is_file()
    return path.name in ALL_TABLES and path.is_dir() and not any(path.iterdir())


class RunDir:
    """One run directory on local disk, held by this process (a lock) from :meth:`open` to :meth:`close`."""

    def __init__(self, run_dir: str | Path, header: dict[str, Any], on_existing: str = "resume",
                 part_writer: PartWriter | None = None, unsafe_store_commits: bool = False,
                 ) -> None:  # fmt: skip
        run_dir = storage.normalize(run_dir)
        self.run_dir: Any = run_dir.rstrip("/") if is_remote(run_dir) else Path(run_dir)
        self.header, self.on_existing, self.unsafe_store_commits = header, on_existing, unsafe_store_commits
        self.part_writer = part_writer or PartWriter(self.run_dir)
        self.manifest = Manifest()
        #: the status of the reopened run (None for a new run)
        self.reopened_status: str | None = None
        #: the reopened run's inputs are named otherwise: what they hold decides (resume_point)
        self.inputs_renamed = False
        self._before_pass: Manifest | None = None  # set by begin_pass: the manifest as the run was reopened
        self._began = False  # whether this process began (or went on with) a pass: see fail
        self._positions: dict[str, int] = {}  # part name -> its place in manifest.parts
        self._held = contextlib.ExitStack()

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
        """Create a run, or reopen one of the same job (rolling its parts forward), and hold it."""
        old_manifest(self.run_dir, self.on_existing)  # before the lock: a folder not ours gets no lock file
        try:
            self._hold()
            old = old_manifest(self.run_dir, self.on_existing)
            # a run that committed no part holds nothing to keep: the corrected job may start afresh
            if old is not None and (self.on_existing == "overwrite" or not old.parts):
                self._clear()
                old = None
            if old is None:
                header = {
                    k: v for k, v in self.header.items() if k in ("spec", "fingerprint", "model", "versions")
                }
                run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
                self.manifest = Manifest(
                    run_id, **header, schema_versions=schema.versions(), created_at=_now()
                )
            else:
                self.manifest, self.reopened_status = old, old.status
                self._check_compatible(old)
                if "fingerprint" in self.header and not self.inputs_renamed:  # the same job, as this
                    self.manifest.fingerprint = self.header["fingerprint"]  # version spells it
                self._recover()  # saved with the status it had: "running" is for begin_pass to say
            for table in TABLES if isinstance(self.run_dir, Path) else ():  # a store has no folders
                (self.run_dir / table).mkdir(exist_ok=True)
            self._save()
        except BaseException:
            self.close()
            raise

    def _hold(self) -> None:
        """Take the run for this process until :meth:`close`: on local disk, a lock on its folder."""

        def busy(holder: str) -> RunDirError:
            return RunDirError(
                f"another bertattn process{holder} is writing {self.run_dir}; wait for it to end or choose "
                "another --out"
            )

        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._held.enter_context(file_lock(self.run_dir / LOCK_NAME, busy=busy))
        except OSError as e:
            if self.run_dir.is_symlink() and not self.run_dir.exists():
                where = os.readlink(self.run_dir)
                raise RunDirError(f"{self.run_dir} is a link to {where}, which does not exist") from None
            raise RunDirError(f"cannot write into {self.run_dir}: {e.strerror or e}") from None

    def close(self) -> None:
        """Release the run (it is left as it is)."""
        self._held.close()

    def fail(self, error: BaseException | None = None) -> None:
        """Leave the run resumable and "interrupted", files of uncommitted parts removed; a run refused
        before its pass began keeps its status, and one whose committed inputs were edited its manifest."""
        self._sweep()
        if not self.manifest.schema_versions:  # never opened
            return
        if isinstance(error, InputsEditedError) and self._before_pass is not None:
            self.manifest = self._before_pass
            if self.manifest.status == "running":  # (a run that was killed) stopped, as it is
                self.manifest.status = "interrupted"
        elif self._began or self.reopened_status is None:
            self.manifest.status = "interrupted"
        with contextlib.suppress(OSError, WriteError):  # the first error counts
            self._save()

    def finalize(self, last_run: dict[str, Any]) -> Manifest:
        """Mark the run complete with this pass's summary (or the last, where it read no rows) and counts."""
        m = self.manifest
        if last_run.get("input_rows") or not m.last_run:
            m.last_run = {**last_run, "ended_at": _now()}
        m.counts, m.status, m.completed_at = part_rows(m), "complete", _now()
        self._save()
        return m

    def begin_pass(
        self, generation: int, sources: list[dict[str, Any]] | None = None, limit: int | None = None
    ) -> None:
        """Record, before its first part, the pass, its input files and the rows it reads at most."""
        m = self.manifest
        if self.reopened_status is not None:
            self._before_pass = copy.deepcopy(m)
            m.status, m.resumed_at, m.resumes = "running", _now(), m.resumes + 1
        m.generation, m.limit, self._began = generation, limit, True
        if sources is not None:
            m.sources = sources
        if self.inputs_renamed:  # accepted: the run is of the inputs by their new names from now on
            m.fingerprint = self.header["fingerprint"]
        self._save()

    @property
    def parts(self) -> list[PartEntry]:
        return self.manifest.parts

    def committed_ids(self, parts: list[PartEntry] | None = None, claimed: bool = False) -> IdSet:
        """Source ids of the committed reviews (of ``parts``; ``claimed``: only those with a text)."""
        ids = IdSet()
        no_id = pa.array(schema.ROW_NUMBER_STATUSES + (schema.NO_TEXT_STATUSES if claimed else ()))
        for p in self.parts if parts is None else parts:
            with storage.arrow_file(run_file(self.run_dir, p.files["predictions"])) as f:
                t = pq.read_table(f, columns=["doc_id", "status"], page_checksum_verification=True)
            ids.update(t.filter(pc.invert(pc.is_in(t["status"], no_id))).column("doc_id").to_pylist())
        return ids

    def commit(self, entry: PartEntry) -> None:
        """Commit a staged part (a line of the commit log, replacing one of the same name), publish it."""
        log_commit(self.run_dir, entry)
        self._list(entry)
        self.part_writer.publish(entry)

    def _list(self, entry: PartEntry) -> None:
        """Put ``entry`` in the manifest's parts, in place of one of the same name (a retried window)."""
        at = self._positions.setdefault(entry.name, len(self.manifest.parts))
        if at == len(self.manifest.parts):
            self.manifest.parts.append(entry)
        else:
            self.manifest.parts[at] = entry

    def _save(self) -> None:
        self.manifest.updated_at = _now()
        self._write_manifest()
        self._positions = {p.name: i for i, p in enumerate(self.manifest.parts)}

    def _write_manifest(self) -> None:
        save_manifest(self.run_dir, self.manifest)

    def _recover(self) -> None:
        """Sweep, then check that the committed parts' files are sound and their row ranges whole."""
        self._sweep()
        for p in self.parts:
            check_part(self.run_dir, p, tuple(p.files))
        check_row_ranges(self.run_dir, self.parts, then="pass --overwrite to start the run again")

    def _sweep(self) -> None:
        """Roll committed parts forward; remove every file in a table folder the manifest does not list."""
        listed = {p.name for p in self.parts}
        for table in ALL_TABLES:
            folder = self.run_dir / table
            for f in folder.iterdir() if folder.is_dir() else ():
                final = folder / f.name[1:-4]  # of a part's temporary
                if f.name in listed and f.is_file():
                    continue
                if f.name == tmp_name(final.name) and final.name in listed and not final.exists():
                    f.replace(final)
                elif f.is_dir() and not f.is_symlink():  # a table folder holds parts only
                    shutil.rmtree(f)
                else:  # a file, or a link (not what it links to)
                    f.unlink()

    def _check_compatible(self, old: Manifest) -> None:
        """Refuse a run of another job: every fingerprint key the run recorded is compared, but their hash."""
        mine = self.header.get("fingerprint", {})
        theirs = old.fingerprint
        recorded = (k for k in set(mine) | set(theirs) if theirs.get(k, "unknown") != "unknown")
        diff = sorted(k for k in recorded if k != "job_sha256" and mine.get(k) != theirs.get(k))
        if diff == ["inputs"] and old.sources is not None:
            self.inputs_renamed = True  # a resume decides by what the files hold (resume_point)
        elif diff:
            spelled = "; ".join(
                f"{k}: run has {json.dumps(theirs.get(k), ensure_ascii=False)}, job has "
                f"{json.dumps(mine.get(k), ensure_ascii=False)}"
                for k in diff
            )
            same_words = (  # a run made before its tokenizer had words, or with others
                f", or --words {theirs.get('words') or 'none'} (the job key words) to go on with its words"
                if "words" in diff
                else ""
            )
            raise RunDirError(
                f"{self.run_dir} was made by another job ({spelled}); pass --overwrite or choose "
                f"another --out{same_words}"
            )

    def _clear(self) -> None:
        """Remove what bertattn wrote into the run, its manifest last (a clear cut short is still a run)."""
        tmps = [p.name for p in self.run_dir.glob(f".{REPORT_NAME}*.tmp")] + [hidden_tmp(MANIFEST)]
        for name in (*ALL_TABLES, *DERIVED_DIRS, REPORT_NAME, *tmps, COMMIT_LOG, MANIFEST):
            child = self.run_dir / name
            if child.is_dir() and not child.is_symlink():
                remove_tree(child)
            else:
                child.unlink(missing_ok=True)


class StoredRunDir(RunDir):
    """One run on an object store, held by this process (a lease) from :meth:`open` to :meth:`close`."""

    #: seconds a lease lives unrenewed: how long a killed run keeps others from its --out
    lease_ttl_s = DEFAULT_TTL_S
    #: seconds between writing the lease and reading it back, when taking it
    lease_settle_s = SETTLE_S
    _lease: Lease
    _conditional = False  # whether manifest writes are compare-and-swaps
    _etag: str | None = None  # the manifest's version this writer last read or wrote
    _refused = False  # a manifest write was refused: the run is another writer's now
    _strays: tuple[str, ...] = ()  # uploads no manifest lists, deleted after the next manifest write

    def open(self) -> None:
        refuse_unsafe_store(self.run_dir, self.unsafe_store_commits)
        self._conditional = storage.has_conditional_writes(self.run_dir)
        super().open()

    def _hold(self) -> None:
        self._lease = Lease.take(self.run_dir, self.lease_ttl_s, self.lease_settle_s)
        self.part_writer.lease = LeaseGuard(self._lease.uri, self._lease.holder)
        self._held.callback(self._lease.drop)
        self._held.callback(self._lease.keep_fresh())
        if self._conditional:  # looked up before the manifest is read: a commit between is refused
            self._etag = storage.etag(storage.join(self.run_dir, MANIFEST))

    def commit(self, entry: PartEntry) -> None:
        """List the uploaded part and write the manifest, the commit point (a store cannot append)."""
        self._list(entry)
        self._save()

    def _save(self) -> None:
        self._lease.check()
        super()._save()
        for uri in self._strays:
            storage.delete(uri)
        self._strays = ()

    def _write_manifest(self) -> None:
        """One PUT, conditional on the manifest being the version this writer last read or wrote."""
        path = storage.join(self.run_dir, MANIFEST)
        data = manifest_text(self.manifest).encode("utf-8")
        try:
            if self._conditional:
                try:
                    self._etag = storage.put_if(path, data, self._etag)
                    return
                except storage.NoConditionalWrites:
                    if not self.unsafe_store_commits:
                        raise RunDirError(_unsafe_store(self.run_dir, "refuses conditional writes")) from None
                    self._conditional = False
            storage.write_bytes(path, data)
        except storage.CommitRefused:
            self._refused = True
            raise RunDirError(
                f"{self.run_dir}: another bertattn process committed to this run since this one last did "
                "(this one was paused past its lease); the run is the other's: this one stops without "
                "writing more"
            ) from None
        except StorageError as e:
            raise WriteError(f"writing {path} failed: {e}") from e

    def fail(self, error: BaseException | None = None) -> None:
        """As on local disk, unless the run is another's now; a store's error here hides no job's error."""
        with contextlib.suppress(StorageError, RunDirError):
            if not self._refused:
                self._lease.check()
                super().fail(error)

    def _sweep(self) -> None:
        """Note every object in a table folder that the manifest does not list, for :meth:`_save`."""
        self._strays = self._unlisted(ALL_TABLES)

    def _clear(self) -> None:
        """Note what bertattn wrote into the run, for :meth:`_save` to delete once a new manifest is in."""
        self._strays = (*self._unlisted((*TABLES, *DERIVED_DIRS)), storage.join(self.run_dir, REPORT_NAME))

    def _unlisted(self, folders: tuple[str, ...]) -> tuple[str, ...]:
        listed = {p.name for p in self.parts}
        return tuple(
            storage.join(self.run_dir, folder, name)
            for folder in folders
            for name in storage.list_names(storage.join(self.run_dir, folder), recursive=True)
            if name not in listed
        )


def refuse_unsafe_store(out: str | Path, unsafe_store_commits: bool = False) -> None:
    """RunDirError where ``out`` is on a store without compare-and-swaps, unless ``unsafe_store_commits``."""
    if is_remote(out) and not unsafe_store_commits and not storage.has_conditional_writes(out):
        raise RunDirError(_unsafe_store(out, "has no conditional writes"))


def _unsafe_store(out: str | Path, why: str) -> str:
    return (
        f"{out}: this store {why}, so a writer paused past its lease could overwrite the run another "
        "took over; pass --unsafe-store-commits (unsafe_store_commits = true in a job) to write there "
        "anyway, or choose an s3:// or local --out"
    )


def run_dir_class(out: str | Path) -> type[RunDir]:
    """The run directory class for ``--out``: a store's URI, or a local path (``file://`` included)."""
    return StoredRunDir if is_remote(out) else RunDir


def part_rows(manifest: Manifest) -> dict[str, int]:
    """Rows of every table over the committed parts: the run's ``counts``."""
    counts = Counter(dict.fromkeys(TABLES, 0))
    for p in manifest.parts:
        counts.update(p.rows)
    return dict(counts)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


@dataclass(frozen=True)
class ResumePoint:
    """Which pass the parts to come are of, and what they skip: the rows before ``skip_until`` and rows
    with ``skip_ids``. ``taken_ids``: ids this pass's committed rows claimed (a repeat is a duplicate)."""

    generation: int = 0
    skip_until: int = 0
    skip_ids: IdSet | None = None
    taken_ids: IdSet | None = None
    #: the committed parts a pass by row number reads again: rows whose digest changed are refused
    digested: list[PartEntry] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        """Input rows committed before that this pass does not redo (for the summary)."""
        return self.skip_until + len(self.skip_ids or ())


def resume_point(run: RunDir, incremental: bool, by_id: bool, sources: list[dict[str, Any]] | None = None,
                 limit: int | None = None, compared: list[dict[str, Any]] | None = None,
                 ) -> ResumePoint:  # fmt: skip
    """The resume point of a reopened run (``by_id``: the job has an id column), its pass begun. An
    incremental job starts a new pass over a complete run, and finishes an interrupted one by row number
    unless its inputs changed or a lower limit stops before its rows. ``sources``: the pass's input
    files; ``compared``: those checked against the recorded pass's, where they differ."""
    m, parts, generation = run.manifest, run.parts, run.manifest.generation or 0
    checked = compared if compared is not None else sources
    if sources is not None and m.sources is not None and len(m.sources) == len(sources):
        # the files the run recorded under other names (size and end bytes, in the same order: the
        # project moved)
        renamed = [{**b, "path": s["path"]} for b, s in zip(m.sources, sources, strict=True)]
        if all(map(_same_file, renamed, sources)):
            m.sources = renamed
    if not incremental and (m.passes - {0} or generation):  # its row numbers are not ours
        raise RunDirError(
            f"{run.run_dir} was last run with --incremental (its passes go by id, not by row number); "
            "rerun it with --incremental (or --overwrite)"
        )
    current = [p for p in parts if p.generation == generation]
    skip_until = max((p.end_row for p in current), default=0)
    changes = input_changes(m.sources, checked) if checked is not None and m.sources is not None else []
    short = limit is not None and limit < skip_until  # a limit that stops before the committed rows
    new_pass = incremental and bool(parts) and (run.reopened_status == "complete" or m.generation is None)
    if incremental and not new_pass and skip_until and by_id and (changes or short):
        why = (
            f"the inputs changed ({_listed(changes)})"
            if changes
            else f"--limit {limit:,} stops before the {skip_until:,} input rows it read"
        )
        log.warning("%s: %s since its interrupted pass began; a new pass adds the reviews whose ids are "
                    "not in the run yet", run.run_dir, why)  # fmt: skip
        new_pass = True
    if new_pass:
        generation = max(m.passes) + 1
        run.begin_pass(generation, sources, limit)
        return ResumePoint(generation, 0, run.committed_ids(), None)
    if skip_until and changes:  # a file sorted before the old ones would shift every row
        fix = "restore them, or pass --overwrite to start again"
        if by_id and run.reopened_status == "complete" and not m.generation:
            fix += ", or --incremental to add only the reviews whose ids are new"
        raise RunDirError(
            f"{run.run_dir}: the inputs changed since this run began ({_listed(changes)}); "
            f"a resume goes on by row number and would mix old and new rows: {fix}"
        )
    if skip_until and short:
        raise RunDirError(
            f"{run.run_dir}: the run already holds {skip_until:,} input rows, more than --limit {limit:,} "
            f"(a job's limit); resume with a limit of {skip_until:,} or more (or none), or pass --overwrite "
            "to start again"
        )
    run.begin_pass(generation, sources, limit)
    earlier = [p for p in parts if p.generation < generation]
    taken = run.committed_ids(current, claimed=True) if by_id and skip_until else None
    skip_ids = run.committed_ids(earlier) if earlier else None
    # digests are compared only by row number: a pass by id keeps the text an id had when scored
    return ResumePoint(generation, skip_until, skip_ids, taken, [] if incremental else parts)


def check_read_unchanged(run: RunDir, before: list[dict[str, Any]], now: list[dict[str, Any]]) -> None:
    """Refuse to finish a pass whose input files changed while it read them: it stays interrupted."""
    if changes := input_changes(before, now):
        raise InputError(
            f"{run.run_dir}: the inputs changed while this run read them ({_listed(changes)}), so its "
            "tables may hold rows of two versions of them; once they are final, rerun with --overwrite"
        )


def _listed(changes: list[str]) -> str:
    more = f" and {len(changes) - 3} more" if len(changes) > 3 else ""
    return "; ".join(changes[:3]) + more


def input_changes(before: list[dict[str, Any]], now: list[dict[str, Any]]) -> list[str]:
    """How the input files ``now`` differ from those a pass recorded, a phrase each."""
    if len(before) == len(now) and all(map(_same_file, before, now)):
        return []
    old = {s["path"]: s for s in before}
    paths = {s["path"] for s in now}
    changes = [f"{s['path']} is new" for s in now if s["path"] not in old]
    changes += [f"{p} is gone" for p in old if p not in paths]
    for s in now:
        was = old.get(s["path"])
        if was is not None and was["bytes"] != s["bytes"]:
            changes.append(f"{s['path']} changed size")
        elif was is not None and not _same_file(was, s):
            changes.append(f"{s['path']} was rewritten (same size, other bytes at its start or end)")
    return changes or ["the files are read in another order"]


def _same_file(was: dict[str, Any], now: dict[str, Any]) -> bool:
    """The same input file as when the pass began: its size and the bytes at its start and end, whatever
    its time says."""
    return all(was[k] == now[k] for k in ("path", "bytes", "ends_sha256"))
