"""Which files a job reads: files, globs and folders resolved to an ordered list of sources.

Usage::

    sources = expand_inputs(["reviews/", "more/*.jsonl.gz"])   # [Source(path, format), ...]

A folder is read in path order, its hidden and temporary files (``_*``, ``.*``), run directories and
model folders passed over; a file named twice is read once.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..run.layout import is_run_dir
from .compressed import ARCHIVE_SUFFIXES, format_suffix

log = logging.getLogger(__name__)

#: Formats told by a file's name (under one compression suffix: ``reviews.jsonl.gz`` is JSON lines).
EXTENSIONS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".tsv": "tsv",
    ".txt": "text",
    ".text": "text",
}


@dataclass(frozen=True)
class Source:
    path: Path
    format: str


def expand_inputs(inputs: Iterable[str], input_format: str = "auto") -> list[Source]:
    """Resolve files, globs and folders to an ordered list of sources; raise when nothing matches."""
    sources: list[Source] = []
    for spec in inputs:
        globbed = glob.has_magic(spec) and not Path(spec).exists()  # a file named 'x[1].csv' is that file
        matches = sorted(glob.glob(spec, recursive=True)) if globbed else [spec]
        if not matches:
            raise InputError(f"no input matches {spec!r}")
        for m in matches:
            p = Path(m)
            if not p.exists():
                raise InputError(f"input not found: {p}")
            if p.is_dir() and input_format in ("auto", "datasets") and _is_saved_dataset(p):
                sources.append(Source(p, "datasets"))
            elif p.is_dir():
                if is_run_dir(p):
                    raise InputError(f"{p} is a bertattn run directory, not reviews")
                files = _review_files(p)
                if not files:
                    raise InputError(f"folder {p} holds no readable review files ({', '.join(EXTENSIONS)})")
                sources.extend(Source(f, _format_of(f, input_format)) for f in files)
            else:
                sources.append(Source(p, _format_of(p, input_format)))
    return _once_each(sources)


def _once_each(sources: list[Source]) -> list[Source]:
    """Each file once, where it is first named: ``a.parquet data/*.parquet`` would otherwise read
    ``a.parquet`` twice (its rows doubled, or every repeat a ``duplicate_id``)."""
    seen: set[Path] = set()
    kept = []
    for src in sources:
        key = src.path.resolve()
        if key in seen:
            if key not in _WARNED:  # once a process: the inputs are listed more than once
                _WARNED.add(key)
                log.warning("%s is named more than once in the inputs; it is read once", src.path)
            continue
        seen.add(key)
        kept.append(src)
    return kept


def _review_files(folder: Path) -> list[Path]:
    """Files below a folder with a review file's extension, in path order. Names starting with ``_`` or
    ``.`` (temporary and hidden files) are passed over below the folder, and so are run directories and
    model folders: a run or a model written inside its input folder must not be read as input next."""
    found, others = [], []
    for root, dirs, files in os.walk(folder):
        here = Path(root)
        dirs[:] = [
            d
            for d in dirs
            if not d.startswith(("_", ".")) and not is_run_dir(here / d) and not _is_model_dir(here / d)
        ]
        for f in (here / name for name in files if not name.startswith(("_", "."))):
            (found if format_suffix(f) in EXTENSIONS else others).append(f)
    packed = sorted(f for f in others if _is_packed_reviews(f))
    if packed:  # reviews that would otherwise be left out without a word
        raise InputError(
            f"folder {folder} holds archives of review files ({_some(packed)}); extract them first "
            "(a file compressed on its own, such as reviews.jsonl.gz, is read as it is)"
        )
    if others and folder not in _WARNED:  # once a process: the inputs are listed more than once
        _WARNED.add(folder)
        log.warning(
            "folder %s: passed over %d file(s) that are not review files (%s)",
            folder,
            len(others),
            _some(sorted(others)),
        )
    return sorted(found)


def _is_packed_reviews(path: Path) -> bool:
    """An archive of a review file, such as ``x.csv.zip`` (an archive of anything else is no review file)."""
    suffixes = [x.lower() for x in path.suffixes]
    return len(suffixes) > 1 and suffixes[-1] in ARCHIVE_SUFFIXES and suffixes[-2] in EXTENSIONS


def _some(paths: list[Path]) -> str:
    return ", ".join(p.name for p in paths[:3]) + (", ..." if len(paths) > 3 else "")


def _is_model_dir(p: Path) -> bool:
    """A model folder (its config.json is no JSON lines file), such as one finetune saved there."""
    return (p / "config.json").is_file() and any(
        (p / f).is_file() for f in ("model.safetensors", "pytorch_model.bin", "tokenizer.json")
    )


def _is_saved_dataset(p: Path) -> bool:
    return (p / "dataset_info.json").is_file() or (p / "dataset_dict.json").is_file()


def _format_of(path: Path, input_format: str) -> str:
    if input_format != "auto":
        return input_format
    fmt = EXTENSIONS.get(format_suffix(path))
    if fmt is None:
        raise InputError(
            f"cannot tell the format of {path} from its name; pass --input-format "
            f"(parquet, jsonl, csv, tsv, text, datasets)"
        )
    return fmt


_WARNED: set[Path] = set()  # folders whose other files, and files named twice, a warning named
