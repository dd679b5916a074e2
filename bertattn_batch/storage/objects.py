"""Files on local disk and objects on a store, read, written, listed and deleted through one set of calls.

Usage::

    with open_input("s3://b/in/reviews.jsonl") as f: ...        # blocks of 8 MiB, each a ranged GET
    with arrow_file("s3://b/run/predictions/part-0.parquet") as f:
        pq.read_metadata(f)                                       # only the ranges Parquet asks for
    write_bytes("s3://b/run/manifest.json", data)                 # visible whole, or not at all
    listing("s3://b/run", recursive=True)                         # {name below it: FileInfo}
    list_files("s3://b/corpus/**/*.parquet")                      # URIs; a glob as on local disk

A store's errors come out as one-line StorageErrors (``uris.store_error``).
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import io
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, BinaryIO

from ..errors import StorageError
from .uris import is_remote, join, no_bucket, normalize, resolve, split_uri, store_error

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs

#: Bytes read from a store per request while a file is streamed.
READ_BLOCK_BYTES = 8 << 20


def info(target: str | os.PathLike[str]) -> pafs.FileInfo:
    """``pyarrow.fs.FileInfo`` of a path or URI: type, size, modification time."""
    fs, path = resolve(target)
    try:
        return fs.get_file_info(path)
    except OSError as e:
        raise store_error(e, target) from None


def is_file(target: str | os.PathLike[str]) -> bool:
    """Whether a path or URI names a file (an object), not a folder, a prefix or nothing."""
    return info(target).type.name == "File"


def open_input(target: str | os.PathLike[str], buffered: bool = True) -> BinaryIO:
    """A file's bytes, random access: a local file as Python opens it; an object on a store as a pyarrow
    file whose reads are ranged requests, read in blocks of ``READ_BLOCK_BYTES`` (``buffered``) or as
    asked (Parquet's reader, which asks for the byte ranges it needs)."""
    if not is_remote(target):
        return open(normalize(target), "rb")
    fs, path = resolve(target)
    try:
        native = fs.open_input_file(path)
    except OSError as e:
        raise store_error(e, target) from None
    return io.BufferedReader(native, buffer_size=READ_BLOCK_BYTES) if buffered else native


@contextlib.contextmanager
def arrow_file(target: str | os.PathLike[str]) -> Iterator[Any]:
    """What pyarrow reads: a local path as it is (Arrow opens it itself), a store's object as a file
    of ranged reads, closed when the block ends."""
    if not is_remote(target):
        yield normalize(target)
        return
    with open_input(target, buffered=False) as f:
        yield f


def open_stream(target: str | os.PathLike[str], compression: str) -> pa.NativeFile:
    """A store's object read forward and decompressed (``gzip``, ``bz2``, ``zstd``, ``lz4``) in blocks."""
    import pyarrow as pa

    fs, path = resolve(target)
    try:
        # no compression by the file system: it would detect it from the name too and undo it twice
        return pa.CompressedInputStream(fs.open_input_stream(path, compression=None), compression)
    except OSError as e:
        raise store_error(e, target) from None


def read_bytes(target: str | os.PathLike[str]) -> bytes:
    """A whole (small) object: a manifest, a lease."""
    try:
        with open_input(target) as f:
            return f.read()
    except StorageError:
        raise
    except OSError as e:  # a read that fails after the open (a connection dropped)
        raise store_error(e, target) from None


def write_bytes(target: str | os.PathLike[str], data: bytes | pa.Buffer) -> None:
    """Put an object whole: a store makes it visible only once the upload completes, so a reader sees
    the old object or the new one, never a part of it (what a local rename gives)."""
    fs, path = resolve(target)
    try:
        with fs.open_output_stream(path, compression=None) as f:  # the bytes as given, whatever the name
            f.write(data)
    except OSError as e:
        raise store_error(e, target) from None


def delete(target: str | os.PathLike[str]) -> None:
    """Remove an object; one that is already gone is no error."""
    fs, path = resolve(target)
    try:
        fs.delete_file(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise store_error(e, target) from None


def delete_folder(target: str | os.PathLike[str]) -> None:
    """Remove every object under a folder or prefix; none there is no error."""
    fs, path = resolve(target)
    try:
        fs.delete_dir_contents(path, missing_dir_ok=True)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise store_error(e, target) from None


def listing(folder: str | os.PathLike[str], recursive: bool = False) -> dict[str, pafs.FileInfo]:
    """The objects under ``folder`` by their names below it (``/``-separated): directly under it, or at
    any depth; none where it does not exist."""
    import pyarrow.fs as pafs

    fs, path = resolve(folder)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True, recursive=recursive))
    except OSError as e:
        raise store_error(e, folder) from None
    root = path.strip("/")  # fsspec's filesystems answer "/bucket/key" for "bucket/key"
    return {i.path.strip("/")[len(root) :].lstrip("/"): i for i in infos if i.type == pafs.FileType.File}


def list_names(folder: str | os.PathLike[str], recursive: bool = False) -> list[str]:
    return sorted(listing(folder, recursive))


def glob_base(target: str) -> str:
    """The fixed folder a glob lists below (``s3://b/corpus`` of ``s3://b/corpus/*/day-*.parquet``);
    a URI without wildcards is its own base."""
    if not glob.has_magic(split_uri(target)[1]):
        return target.rstrip("/")
    return target[: min(target.index(c) for c in "*?[" if c in target)].rsplit("/", 1)[0]


def list_files(target: str) -> list[str]:
    """Every file a URI names, as URIs in sorted order: the file itself, a folder's files (at any depth),
    or a glob's matches, whose ``*`` stays within one folder and ``**`` spans any (as ``glob`` has
    them locally). Raises StorageError where nothing matches, so no input is silently empty."""
    target = target.rstrip("/")
    base = glob_base(target)
    if base != target:
        pattern = target[len(base) + 1 :].split("/")
        found = [join(base, n) for n in listing(base, recursive=True) if _matches(n.split("/"), pattern)]
    elif is_file(target):
        found = [target]
    else:
        found = [join(target, n) for n in listing(target, recursive=True)]
    if not found:
        raise StorageError(f"{target}: {_bucket_missing(target) or 'no such file, folder or match'}")
    return sorted(found)


def _bucket_missing(target: str) -> str | None:
    """What to say of a URI whose bucket does not exist (listing it finds nothing, as for an empty
    folder); None where it does, or the store has no buckets."""
    import pyarrow.fs as pafs

    scheme, rest = split_uri(target)
    if scheme not in ("s3", "gs", "gcs"):
        return None
    bucket = rest.strip("/").split("/", 1)[0]
    fs, _ = resolve(f"{scheme}://{bucket}")
    try:
        missing = fs.get_file_info(bucket).type == pafs.FileType.NotFound
    except OSError:  # not allowed to look: the listing's answer stands
        return None
    return no_bucket(bucket) if missing else None


def _matches(parts: list[str], pattern: list[str]) -> bool:
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_matches(parts[i:], pattern[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _matches(parts[1:], pattern[1:])
