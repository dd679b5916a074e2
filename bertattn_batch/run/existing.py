"""What is at a job's --out before the job opens it: nothing, a run of ours (its manifest), or something
that is not ours to write into or delete, refused whatever the job asks for."""

from __future__ import annotations

from pathlib import Path

from .. import storage
from .._files import hidden_tmp
from ..errors import DamagedRunError, RunDirError, RunVersionError
from ..storage import is_remote
from .layout import LEASE_NAME, LOCK_NAME, MANIFEST, TABLES, is_run_dir
from .manifest import Manifest, read_manifest


def old_manifest(run_dir: str | Path, on_existing: str = "resume") -> Manifest | None:
    """The manifest of the run in ``run_dir`` (None where there is no run there yet); refuses a file and
    a folder that bertattn did not make, never to delete or write into it, even when asked to overwrite,
    and with ``on_existing="new"`` a run that committed parts. Also called before a job trains its
    model, so that an --out that would be refused is found first."""
    if is_remote(run_dir):
        if not storage.is_file(storage.join(run_dir, MANIFEST)):
            if any(name != LEASE_NAME for name in storage.list_names(run_dir, recursive=True)):
                raise RunDirError(f"{run_dir} is not empty and is not a run directory; choose another --out")
            return None
    else:
        run_dir = Path(storage.normalize(run_dir))
        if run_dir.exists() and not run_dir.is_dir():
            raise RunDirError(f"{run_dir} is a file, not a folder; choose another --out")
        if not run_dir.is_dir():
            return None
        if not (run_dir / MANIFEST).is_file():
            if any(not _left_by_a_start(p) for p in run_dir.iterdir()):
                raise RunDirError(f"{run_dir} is not empty and is not a run directory; choose another --out")
            return None
    try:
        old = read_manifest(run_dir)
    except RunVersionError:
        if on_existing == "overwrite":  # an older version's run, which this one can only redo
            return Manifest()
        raise
    except DamagedRunError as e:
        # a damaged manifest beside the run's tables is a run of ours to redo when asked (clearing takes
        # only what bertattn writes), else named with the way out
        if on_existing != "overwrite":
            raise RunDirError(
                f"{e}; pass --overwrite to start the run again, or choose another --out"
            ) from None
        if not is_remote(run_dir) and is_run_dir(Path(run_dir)):
            return Manifest()
        raise RunDirError(
            f"{e}; with no run's tables beside it, it is left as it is: choose another --out"
        ) from None
    except RunDirError as e:
        if "is not a bertattn run directory" in str(e):
            raise RunDirError(f"{run_dir} is not a bertattn run directory; choose another --out") from None
        raise
    if on_existing == "new" and old.parts:
        raise RunDirError(f"{run_dir} already holds a run; choose another --out or pass --overwrite")
    return old


def _left_by_a_start(path: Path) -> bool:
    """What a run that stopped before its first manifest was saved (a full disk, a kill) leaves: the
    lock, the manifest's temporary and empty table folders. Why: refusing such a folder as someone
    else's would stop every later run with this --out, --overwrite included."""
    if path.name in (LOCK_NAME, hidden_tmp(MANIFEST)):
        return path.is_file()
    return path.name in TABLES and path.is_dir() and not any(path.iterdir())
