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

import os
from pathlib import Path

from bertattn_batch.errors import StorageError

#: Schemes served by an object store or a cluster filesystem: no atomic rename, no advisory locks.
REMOTE_SCHEMES = ("s3", "gs", "gcs", "hdfs")
#: What to install where this pyarrow lacks a scheme's filesystem.
EXTRA_HINT = "pip install 'bertattn-batch[s3]'"


def split_uri(target: str | os.PathLike[str]) -> tuple[str | None, str]:
    """The scheme (lower case, None for a plain path) and the rest; Windows drive letters are paths."""
    text = os.fspath(target)
    scheme, sep, rest = text.partition("://")
    if not sep or len(scheme) < 2 or not scheme.replace("+", "").isalnum():
        return None, text
    return scheme.lower(), rest


def is_remote(target: str | os.PathLike[str]) -> bool:
    """Whether ``target`` lives on an object store or cluster filesystem rather than this machine's disk."""
    return split_uri(target)[0] in REMOTE_SCHEMES


def resolve(target: str | os.PathLike[str]):
    """``(pyarrow.fs.FileSystem, path)`` for a local path, ``file://``, ``s3://``, ``gs://`` or ``hdfs://``.

    Raises StorageError naming the extra to install when this pyarrow has no filesystem for the
    scheme, and for a scheme nobody serves.
    """
    import pyarrow.fs as pafs

    scheme, rest = split_uri(target)
    if scheme is None:
        return pafs.LocalFileSystem(), str(Path(rest).expanduser().absolute())
    if scheme == "file":
        return pafs.LocalFileSystem(), str(Path(rest or "/").absolute())
    if scheme == "s3":
        return _s3(pafs), rest.strip("/")
    if scheme in ("gs", "gcs"):
        cls = _filesystem_class(pafs, "GcsFileSystem", scheme)
        return cls(), rest.strip("/")
    if scheme == "hdfs":
        _filesystem_class(pafs, "HadoopFileSystem", scheme)
        try:
            fs, path = pafs.FileSystem.from_uri(os.fspath(target))
        except (OSError, ValueError) as e:
            raise StorageError(f"cannot reach {os.fspath(target)}: {_one_line(e)}") from e
        return fs, path
    raise StorageError(
        f"{os.fspath(target)}: unsupported scheme {scheme}:// (use a path, file://, s3://, gs:// or hdfs://)"
    )


def _s3(pafs):
    """An S3 filesystem with the endpoint from ``AWS_ENDPOINT_URL(_S3)``; keys and region from the SDK's chain."""
    cls = _filesystem_class(pafs, "S3FileSystem", "s3")
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


def _filesystem_class(pafs, name: str, scheme: str):
    """The pyarrow filesystem class, or a StorageError naming the extra when this build lacks it."""
    cls = getattr(pafs, name, None)
    if cls is None:
        raise StorageError(f"{scheme}:// needs a pyarrow built with {name}: {EXTRA_HINT}")
    return cls


def _one_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def list_files(target: str) -> list[str]:
    """Every file a URI names, as URIs in sorted order: the file itself, a folder's files (recursive), or a glob's matches.

    A store lists keys, not folders, so a glob is matched against the keys under its fixed prefix.
    Raises StorageError where nothing matches, so no input is silently empty.
    """
    import fnmatch
    import glob

    import pyarrow.fs as pafs

    scheme, _ = split_uri(target)
    fs, path = resolve(target)
    prefix = f"{scheme}://" if scheme else ""
    if glob.has_magic(path):
        fixed = path[: min(path.index(c) for c in "*?[" if c in path)].rsplit("/", 1)[0]
        infos = fs.get_file_info(pafs.FileSelector(fixed, recursive=True, allow_not_found=True))
        found = [i.path for i in infos if i.type == pafs.FileType.File and fnmatch.fnmatchcase(i.path, path)]
    else:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            found = [path]
        elif info.type == pafs.FileType.Directory:
            infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
            found = [i.path for i in infos if i.type == pafs.FileType.File]
        else:
            found = []
    if not found:
        raise StorageError(f"{target}: no such file, folder or match")
    return sorted(prefix + p for p in found)


def open_stream(target: str):
    """A forward-only stream of a file's bytes, gzip/bz2/zstd undone by the name's suffix: bounded memory."""
    fs, path = resolve(target)
    return fs.open_input_stream(path, compression="detect")
