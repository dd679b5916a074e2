"""Which files a job reads: files, globs, folders and object-store prefixes, resolved to an ordered list of
sources; a folder in path order, its hidden and temporary files, run directories, model folders and FIFOs
passed over with a warning; a file named twice read once."""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path, PurePath

from .. import storage
from ..config import InputSpec
from ..errors import InputError, StorageError
from ..run.manifest import is_run_dir
from .files import ARCHIVE_SUFFIXES, STDIN, Source, format_suffix, is_stream, spooled

log = logging.getLogger(__name__)

#: Formats told by a file's name (under one compression suffix: ``reviews.jsonl.gz`` is JSON lines).
EXTENSIONS = {
    ".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
    ".csv": "csv", ".tsv": "tsv", ".txt": "text", ".text": "text",
}  # fmt: skip
#: What a warning named already: once a process, as a job's inputs are expanded more than once.
_WARNED: set[object] = set()


def expand_inputs(spec: InputSpec) -> list[Source]:
    """Resolve files, globs and folders to an ordered list of sources; raise when nothing matches."""
    first: dict[object, str] = {}  # each file by what it is (a hard link is the file it links to): its label
    sources = []
    for path, fmt, name in _expand(spec.paths, spec.format, spec.delimiter, spec.limit):
        src = Source(path, fmt, name, spec.encoding, spec.delimiter)
        key: object = path
        if not storage.is_remote(path):
            try:
                st = Path(path).stat()
            except OSError as e:  # a link in a folder that points nowhere, a file gone since it was listed
                raise InputError(f"input {src.label} cannot be read: {e.strerror or e}") from None
            key = (st.st_dev, st.st_ino) if st.st_ino else Path(path).resolve()
        if key not in first:
            first[key] = src.label
            sources.append(src)
        elif key not in _WARNED:
            _WARNED.add(key)
            same = (
                "named more than once in the inputs"
                if src.label == first[key]
                else f"the same file as {first[key]}"
            )
            log.warning("%s is %s; it is read once", src.label, same)
    return sources


def _expand(
    inputs: Iterable[str], input_format: str, delimiter: str | None, limit: int | None
) -> Iterator[tuple[Path | str, str, str | None]]:
    """(path, format, the name a stream was given) of each input file in order."""
    for spec in inputs:
        if storage.is_remote(spec):
            yield from ((uri, _format_of(uri, input_format), None) for uri in _stored(spec, input_format))
            continue
        if spec == STDIN or is_stream(Path(spec)):
            fmt = _format_of(spec, input_format)
            yield spooled(spec, limit, fmt, delimiter), fmt, spec
            continue
        globbed = glob.has_magic(spec) and not Path(spec).exists()  # a file named 'x[1].csv' is that file
        matches = sorted(glob.glob(spec, recursive=True)) if globbed else [spec]
        if not matches:
            raise InputError(f"no input matches {spec!r}")
        found: list[Path] = []
        for p in map(Path, matches):
            if not p.exists():
                raise InputError(f"input not found: {p}")
            if globbed and is_stream(p):  # opening a FIFO with no writer would wait forever
                log.warning(
                    "%s: passed over %s, which is not a regular file (a FIFO, socket or device)", spec, p
                )
            elif _is_saved_dataset(p):
                if input_format not in ("auto", "datasets"):  # its metadata is no review file
                    raise InputError(
                        f"{p} is a saved datasets folder, not {input_format}: pass --input-format datasets, "
                        "or leave it out"
                    )
                found.append(p)
            elif not p.is_dir():
                found.append(p)
            elif is_run_dir(p):
                raise InputError(f"{p} is a bertattn run directory, not reviews")
            elif _is_model_dir(p):
                raise InputError(f"{p} is a model folder, not reviews (a model is given with --model)")
            elif files := _review_files(p, datasets=input_format in ("auto", "datasets")):
                found += files
            elif globbed:  # one match of several, such as an empty folder named x.csv
                log.warning("%s: passed over folder %s, which holds no review files", spec, p)
            else:
                raise InputError(f"folder {p} holds no readable review files ({', '.join(EXTENSIONS)})")
        if not found:
            raise InputError(f"{spec!r} matches no review files (only folders without any, or FIFOs)")
        yield from ((f, "datasets" if f.is_dir() else _format_of(f, input_format), None) for f in found)


def _review_files(folder: Path, datasets: bool) -> list[Path]:
    """Review files and saved datasets folders (unless another format is asked for) below a folder, in
    path order; hidden and temporary names, run directories and model folders passed over."""
    found, others, streams = [], [], []
    seen: set[Path] = set()  # folders walked, by their real path: a link back up is not walked again
    for root, dirs, files in os.walk(folder, followlinks=True):  # a linked subfolder's reviews count
        here = Path(root)
        if (real := here.resolve()) in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = [d for d in dirs if not d.startswith(("_", ".")) and not is_run_dir(here / d)]
        dirs[:] = [d for d in dirs if not _is_model_dir(here / d)]
        saved = [here / d for d in dirs if _is_saved_dataset(here / d)]
        (found if datasets else others).extend(saved)
        dirs[:] = [d for d in dirs if here / d not in saved]
        for f in (here / name for name in files if not name.startswith(("_", "."))):
            (streams if is_stream(f) else found if format_suffix(f) in EXTENSIONS else others).append(f)
    if streams and ("streams", folder) not in _WARNED:
        _WARNED.add(("streams", folder))
        log.warning(
            "folder %s: passed over %d file(s) that are not regular files (FIFOs, sockets or devices: %s)",
            folder, len(streams), _some(sorted(streams)),
        )  # fmt: skip
    _pass_over(f"folder {folder}", others, "file(s)")
    return sorted(found)


def _stored(spec: str, input_format: str) -> list[str]:
    """The review files a store holds under a URI (a file, a prefix or a glob), by a local folder's rules."""
    try:
        uris = storage.list_files(spec)
    except StorageError as e:
        raise InputError(str(e)) from None
    if uris == [spec.rstrip("/")]:  # one file, named: read whatever its name
        return uris
    base = storage.glob_base(spec) + "/"  # names below it: the rules apply to a glob's matches too
    below = {u: u[len(base) :] for u in uris}
    names = set(below.values())
    if "manifest.json" in names:
        raise InputError(f"{spec} is a bertattn run directory, not reviews")
    if _model_files("config.json", names):
        raise InputError(f"{spec} is a model folder, not reviews (a model is given with --model)")
    if names & {"dataset_info.json", "dataset_dict.json"}:
        raise InputError(
            f"{spec} is a saved datasets folder; copy it to local disk first (it is read memory-mapped)"
        )
    # run directories and model folders below the prefix are passed over, as in a local folder
    skipped = [n.removesuffix("manifest.json") for n in names if n.endswith("/manifest.json")]
    skipped += [
        n.removesuffix("config.json") for n in names if n.endswith("/config.json") and _model_files(n, names)
    ]
    kept, others = [], []
    for uri, name in below.items():
        if any(p.startswith(("_", ".")) for p in name.split("/")) or name.startswith(tuple(skipped)):
            continue
        (others if input_format == "auto" and format_suffix(name) not in EXTENSIONS else kept).append(uri)
    _pass_over(spec, others, "object(s)")
    if not kept:
        raise InputError(f"{spec} holds no readable review files ({', '.join(EXTENSIONS)})")
    return kept


def _pass_over(where: str, others: list[Path] | list[str], what: str) -> None:
    """Refuse archives of review files among the files passed over; name the others in a warning."""
    names = sorted(storage.name_path(o) for o in others)
    if packed := [n for n in names if _is_packed_reviews(n)]:
        raise InputError(
            f"{where} holds archives of review files ({_some(packed)}); extract them first "
            "(a file compressed on its own, such as reviews.jsonl.gz, is read as it is)"
        )
    if names and where not in _WARNED:
        _WARNED.add(where)
        log.warning(
            "%s: passed over %d %s that are not review files (%s)", where, len(names), what, _some(names)
        )


def _is_packed_reviews(path: PurePath) -> bool:
    """An archive of a review file, such as ``x.csv.zip``."""
    suffixes = [x.lower() for x in path.suffixes]
    return len(suffixes) > 1 and suffixes[-1] in ARCHIVE_SUFFIXES and suffixes[-2] in EXTENSIONS


def _some(paths: Sequence[PurePath]) -> str:
    return ", ".join(p.name for p in paths[:3]) + (", ..." if len(paths) > 3 else "")


#: Files beside a config.json that make its folder a model's (weights, sharded or not, or a tokenizer).
_MODEL_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
    "tokenizer.json", "vocab.txt",
)  # fmt: skip


def _model_files(config: str, names: set[str]) -> bool:
    """Whether the folder of ``config`` (a ``.../config.json`` among a store's ``names``) is a model's."""
    return any(config.removesuffix("config.json") + f in names for f in _MODEL_FILES)


def _is_model_dir(p: Path) -> bool:
    return (p / "config.json").is_file() and any((p / f).is_file() for f in _MODEL_FILES)


def _is_saved_dataset(p: Path) -> bool:
    return (p / "dataset_info.json").is_file() or (p / "dataset_dict.json").is_file()


def _format_of(path: Path | str, input_format: str) -> str:
    if input_format != "auto":
        return input_format
    choose = "pass --input-format (parquet, jsonl, csv, tsv, text, datasets)"
    if path == STDIN:
        raise InputError(f"cannot tell the format of standard input; {choose}")
    if (suffix := format_suffix(path)) in ARCHIVE_SUFFIXES:  # x.csv.zip, x.tar.gz
        raise InputError(f"{path} is an archive ({suffix}); extract its files first")
    if suffix not in EXTENSIONS:
        raise InputError(f"cannot tell the format of {path} from its name; {choose}")
    return EXTENSIONS[suffix]
