"""Paths and URIs to a pyarrow filesystem and a path on it, so every stage takes the same strings.

Usage::

    fs, path = resolve("s3://corpora/reviews/part-0.parquet")   # S3, endpoint and keys from the env
    fs, path = resolve("runs/r1")                                # local: the path, made absolute
    is_remote("gs://b/x")                                        # True: no rename, no local lock

Credentials and endpoints come only from the standard environment (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ``GOOGLE_APPLICATION_CREDENTIALS``...), never from an option,
so they land neither in shell history nor in a manifest.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import glob
import hashlib
import io
import os
import shutil
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO

from .errors import StorageError

if TYPE_CHECKING:  # pyarrow is imported where used: importing the package must not allocate (runtime.py)
    import pyarrow as pa
    import pyarrow.fs as pafs

#: What to install where this pyarrow lacks a scheme's filesystem.
EXTRA_HINT = "pip install 'bertattn-batch[s3]'"


def split_uri(target: str | os.PathLike[str]) -> tuple[str | None, str]:
    """The scheme (lower case, None for a plain path) and the rest; Windows drive letters are paths."""
    text = os.fspath(target)
    scheme, sep, rest = text.partition("://")
    if not sep or len(scheme) < 2 or not scheme.replace("+", "").isalnum():
        return None, text
    return scheme.lower(), rest


def normalize(target: str | os.PathLike[str]) -> str:
    """A ``file://`` URI as the local path it names; anything else as it is: local disk is one code path."""
    scheme, rest = split_uri(target)
    return rest if scheme == "file" else os.fspath(target)


def is_remote(target: str | os.PathLike[str]) -> bool:
    """Whether ``target`` lives on an object store or cluster filesystem rather than this machine's disk:
    every scheme but ``file://`` is taken to have no rename and no locks."""
    return split_uri(target)[0] not in (None, "file")


def resolve(target: str | os.PathLike[str]) -> tuple[pafs.FileSystem, str]:
    """``(pyarrow.fs.FileSystem, path)`` for a local path, ``file://``, ``s3://``, ``gs://``, ``hdfs://``,
    or another scheme that an installed fsspec package serves.

    Raises StorageError naming what to install where no filesystem serves the scheme.
    """
    import pyarrow.fs as pafs

    scheme, rest = split_uri(target)
    if scheme is None:
        return pafs.LocalFileSystem(), str(Path(rest).expanduser().absolute())
    if scheme == "file":
        return pafs.LocalFileSystem(), str(Path(rest or "/").absolute())
    if scheme == "s3":
        return _s3(), rest.strip("/")
    if scheme in ("gs", "gcs"):
        cls = _filesystem_class("GcsFileSystem", scheme)
        return cls(), rest.strip("/")
    if scheme == "hdfs":
        _filesystem_class("HadoopFileSystem", scheme)
        try:
            fs, path = pafs.FileSystem.from_uri(os.fspath(target))
        except (OSError, ValueError) as e:
            raise StorageError(f"cannot reach {os.fspath(target)}: {_one_line(e)}") from e
        return fs, path
    return _fsspec(scheme, target)


def _fsspec(scheme: str, target: str | os.PathLike[str]) -> tuple[pafs.FileSystem, str]:
    """A scheme that pyarrow has no filesystem for, through fsspec (``pip install adlfs`` for ``az://``)."""
    import fsspec
    import pyarrow.fs as pafs

    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError as e:  # fsspec knows the scheme, and names the package that serves it
        raise StorageError(f"{os.fspath(target)}: {scheme}:// needs a package: {_one_line(e)}") from None
    except ValueError:
        raise StorageError(
            f"{os.fspath(target)}: unsupported scheme {scheme}:// (use a path, file://, s3://, gs://, "
            "hdfs://, or a scheme an installed fsspec package serves)"
        ) from None
    try:
        fs, path = fsspec.core.url_to_fs(os.fspath(target))
    except (OSError, TypeError, ValueError) as e:
        raise StorageError(f"cannot reach {os.fspath(target)}: {_one_line(e)}") from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


def _s3() -> pafs.FileSystem:
    """An S3 filesystem with the endpoint from ``AWS_ENDPOINT_URL(_S3)``; keys and region from the SDK's
    chain. One per environment: making one resolves credentials, which can mean a network round trip."""
    names = (
        "AWS_ENDPOINT_URL_S3",
        "AWS_ENDPOINT_URL",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_PROFILE",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    )
    return _s3_for(tuple(os.environ.get(n) for n in names))


@functools.lru_cache(maxsize=4)
def _s3_for(_env: tuple[str | None, ...]) -> pafs.FileSystem:

    cls = _filesystem_class("S3FileSystem", "s3")
    kwargs = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        scheme, rest = split_uri(endpoint)
        kwargs["endpoint_override"] = rest if scheme else endpoint
        kwargs["scheme"] = scheme or "https"
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        kwargs["region"] = region
    return cls(**kwargs)


def _filesystem_class(name: str, scheme: str) -> type:
    """The pyarrow filesystem class, or a StorageError naming the extra when this build lacks it."""
    import pyarrow.fs as pafs

    cls = getattr(pafs, name, None)
    if cls is None:
        raise StorageError(f"{scheme}:// needs a pyarrow built with {name}: {EXTRA_HINT}")
    return cls


def _one_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def store_error(e: BaseException, target: str | os.PathLike[str]) -> StorageError:
    """A store's refusal as one line that says what to fix: the AWS SDK's messages run over several
    lines and name the failing call, not the bucket or the keys."""
    code = str(e).upper().replace("_", "")  # the SDK spells its codes NO_SUCH_BUCKET or NoSuchBucket
    name = os.fspath(target)
    if "NOSUCHBUCKET" in code:
        bucket = split_uri(name)[1].split("/", 1)[0]
        return StorageError(f"{name}: bucket {bucket!r} does not exist (create it first)")
    if any(
        k in code for k in ("ACCESSDENIED", "INVALIDACCESSKEYID", "SIGNATUREDOESNOTMATCH", "EXPIREDTOKEN")
    ):
        return StorageError(
            f"{name}: the store refused the credentials (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
            "or AWS_PROFILE, and the endpoint AWS_ENDPOINT_URL)"
        )
    return StorageError(f"{name}: {_one_line(e)}")


def join(base: str | os.PathLike[str], *names: str) -> str:
    """``base`` with ``names`` appended by ``/``: a URI stays a URI (pathlib would fold ``s3://``)."""
    return "/".join([os.fspath(base).rstrip("/"), *names])


def name_path(target: str | os.PathLike[str]) -> PurePosixPath:
    """The path part of a path or URI, for its name and suffixes (``reviews.jsonl.gz``)."""
    return PurePosixPath(split_uri(target)[1])


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
    file whose reads are ranged requests, so Parquet footers and row groups are fetched as needed and
    a stream is read in blocks, never the whole object at once."""
    if not is_remote(target):
        return open(split_uri(target)[1] if split_uri(target)[0] == "file" else target, "rb")
    fs, path = resolve(target)
    try:
        native = fs.open_input_file(path)
        # unbuffered for Parquet, whose reader asks for the byte ranges it needs itself
        return io.BufferedReader(native, buffer_size=READ_BLOCK_BYTES) if buffered else native
    except OSError as e:
        raise store_error(e, target) from None


#: Bytes read from a store per request while a file is streamed.
READ_BLOCK_BYTES = 8 << 20


@contextlib.contextmanager
def arrow_file(target: str | os.PathLike[str]) -> Iterator[Any]:
    """What pyarrow reads: a local path as it is (Arrow opens it itself), a store's object as a file
    whose reads are ranged requests, closed when the block ends."""
    if not is_remote(target):
        yield target
        return
    with open_input(target, buffered=False) as f:
        yield f


def read_bytes(target: str | os.PathLike[str]) -> bytes:
    with open_input(target) as f:
        return f.read()


def write_bytes(target: str | os.PathLike[str], data: bytes | pa.Buffer) -> None:
    """Put an object whole: a store makes it visible only once the upload completes, so a reader sees
    the old object or the new one, never a part of it (what a local rename gives)."""
    fs, path = resolve(target)
    try:
        with fs.open_output_stream(path) as f:
            f.write(data)
    except OSError as e:
        raise store_error(e, target) from None


def delete(target: str | os.PathLike[str]) -> None:
    """Remove an object; one that is already gone is no error."""
    fs, path = resolve(target)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_file(path)


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


def list_files(target: str) -> list[str]:
    """Every file a URI names, as URIs in sorted order: the file itself, a folder's files (at any depth),
    or a glob's matches (a store lists keys, not folders: a glob is matched against the keys under its
    fixed prefix). Raises StorageError where nothing matches, so no input is silently empty."""
    target = target.rstrip("/")
    if glob.has_magic(split_uri(target)[1]):
        base = target[: min(target.index(c) for c in "*?[" if c in target)].rsplit("/", 1)[0]
        pattern = target[len(base) + 1 :]
        found = [join(base, n) for n in listing(base, recursive=True) if fnmatch.fnmatchcase(n, pattern)]
    elif is_file(target):
        found = [target]
    else:
        found = [join(target, n) for n in listing(target, recursive=True)]
    if not found:
        raise StorageError(f"{target}: no such file, folder or match")
    return sorted(found)


def open_stream(target: str | os.PathLike[str], compression: str) -> pa.NativeFile:
    """A store's object read forward and decompressed (``gzip``, ``bz2``, ``zstd``, ``lz4``) in blocks."""
    import pyarrow as pa

    fs, path = resolve(target)
    try:
        # wrapped here: given to the S3 filesystem itself, the compression was not undone
        return pa.CompressedInputStream(fs.open_input_stream(path), compression)
    except OSError as e:
        raise store_error(e, target) from None


def cache_folder(kind: str, uri: str) -> Path:
    """Where a store's ``kind`` of thing (``runs``, ``models``) is mirrored on this machine:
    ``$BERTATTN_CACHE``, else ``~/.cache/bertattn``, one folder a URI (named in its ``.source``)."""
    root = Path(os.environ.get("BERTATTN_CACHE") or Path.home() / ".cache" / "bertattn")
    folder = root / kind / hashlib.sha256(uri.encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".source").write_text(uri + "\n", encoding="utf-8")
    return folder


def mirror(uri: str, local: Path, skip: tuple[str, ...] = (), fresh: tuple[str, ...] = ()) -> None:
    """Bring ``local`` up to date with every object under ``uri`` (but ``skip``): an object whose size
    and time its copy records is not fetched again (but ``fresh``: a store's times are whole seconds,
    and a small object rewritten within one may keep its size); a copy whose object is gone is removed."""
    remote = {n: i for n, i in listing(uri, recursive=True).items() if n not in skip}
    if not remote:
        raise StorageError(f"{uri}: no such folder, or it is empty")
    have = {
        f.relative_to(local).as_posix()
        for f in local.rglob("*")
        if f.is_file() and not f.name.startswith(".")
    }
    for name in have - set(remote):
        (local / name).unlink()
    for name, found in remote.items():
        target = local / name
        if name not in fresh and target.is_file() and stamp(target) == (found.size, found.mtime_ns or 0):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.part")
        with open_input(join(uri, name), buffered=False) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, READ_BLOCK_BYTES)
        tmp.replace(target)
        stamp(target, found)


def stamp(path: Path, found: pafs.FileInfo | None = None) -> tuple[int, int]:
    """A copy's (size, time): with ``found``, first set its time to the object's, so that the copy itself
    records which version of the object it holds."""
    if found is not None:
        os.utime(path, ns=(found.mtime_ns or 0, found.mtime_ns or 0))
    st = path.stat()
    return (st.st_size, st.st_mtime_ns)
