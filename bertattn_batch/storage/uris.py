"""Paths and URIs to a pyarrow filesystem and a path on it, so every stage takes the same strings.

Usage::

    fs, path = resolve("s3://corpora/reviews/part-0.parquet")   # S3, endpoint and keys from the env
    fs, path = resolve("runs/r1")                                # local: the path, made absolute
    is_remote("gs://b/x")                                        # True: no rename, no local lock

``s3://``, ``gs://`` and ``hdfs://`` are served by pyarrow's own filesystems, any other scheme an
installed fsspec package serves (``az://`` with adlfs) through pyarrow's fsspec handler. Credentials and
endpoints come only from the standard environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_PROFILE``, ``GOOGLE_APPLICATION_CREDENTIALS``...), never from an option, so they land neither in
shell history nor in a manifest.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from ..errors import StorageError

if TYPE_CHECKING:  # pyarrow is imported where used: importing the package must not allocate (runtime.py)
    import pyarrow.fs as pafs

#: What to install where this pyarrow lacks a scheme's filesystem.
EXTRA_HINT = "pip install '.[s3]' in a checkout"
#: The environment a store's filesystem is made from: one filesystem per value of it (making one
#: resolves credentials, which can mean a network round trip).
_ENV = (
    "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE",
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "GOOGLE_APPLICATION_CREDENTIALS",
)  # fmt: skip


def split_uri(target: str | os.PathLike[str]) -> tuple[str | None, str]:
    """The scheme (lower case, None for a plain path) and the rest; Windows drive letters are paths."""
    text = os.fspath(target)
    scheme, sep, rest = text.partition("://")
    if not sep or len(scheme) < 2 or not scheme.replace("+", "").isalnum():
        return None, text
    return scheme.lower(), rest


def normalize(target: str | os.PathLike[str]) -> str:
    """A ``file://`` URI as the local path it names, and ``~`` as the home folder (a job file's
    ``out = "~/runs/x"`` made a folder named ``~`` here while Arrow wrote under the home folder); a
    store's URI as it is: local disk is one code path."""
    scheme, rest = split_uri(target)
    if scheme is not None and scheme != "file":
        return os.fspath(target)
    return os.path.expanduser(rest if scheme == "file" else os.fspath(target))


def is_remote(target: str | os.PathLike[str]) -> bool:
    """Whether ``target`` lives on an object store or cluster filesystem rather than this machine's disk:
    every scheme but ``file://`` is taken to have no rename and no locks."""
    return split_uri(target)[0] not in (None, "file")


def absolute(target: str) -> str:
    """A path as a run records an input, the same file from any directory however a relative path spells
    it: a local path absolute; a store's URI and ``-`` (standard input) as they are (made absolute,
    ``s3://corp/x.csv`` became ``./s3:/corp/x.csv``)."""
    return target if target == "-" or is_remote(target) else os.path.abspath(target)


def join(base: str | os.PathLike[str], *names: str) -> str:
    """``base`` with ``names`` appended by ``/``: a URI stays a URI (pathlib would fold ``s3://``)."""
    return "/".join([os.fspath(base).rstrip("/"), *names])


def name_path(target: str | os.PathLike[str]) -> PurePosixPath:
    """The path part of a path or URI, for its name and suffixes (``reviews.jsonl.gz``)."""
    return PurePosixPath(split_uri(target)[1])


def resolve(target: str | os.PathLike[str]) -> tuple[pafs.FileSystem, str]:
    """``(pyarrow.fs.FileSystem, path)`` for a path or URI; StorageError, naming what to install, where
    no filesystem serves its scheme."""
    import pyarrow.fs as pafs

    scheme, rest = split_uri(target)
    if scheme is None or scheme == "file":
        return pafs.LocalFileSystem(), str(Path(rest or "/").expanduser().absolute())
    env = tuple(os.environ.get(n) for n in _ENV)
    if scheme == "s3":
        bucket = rest.split("/", 1)[0]
        return _s3(bucket if not any(env[:4]) else "", env), rest.strip("/")
    if scheme in ("gs", "gcs"):
        return _filesystem(scheme, "", env), rest.strip("/")
    if scheme == "hdfs":
        authority, _, path = rest.partition("/")
        return _filesystem(scheme, authority, env), "/" + path.strip("/")
    return _fsspec(scheme, target)


@functools.lru_cache(maxsize=16)
def _s3(bucket: str, _env: tuple[str | None, ...]) -> pafs.FileSystem:
    """An S3 filesystem: the endpoint from ``AWS_ENDPOINT_URL(_S3)``, keys from the SDK's chain, the region
    from ``AWS_REGION`` or else the bucket's own (``bucket`` is given only then)."""
    import pyarrow.fs as pafs

    cls = _filesystem_class("S3FileSystem", "s3")
    # an object smaller than a multipart part (5 MB: a manifest, a lease, most parts) goes up in one
    # PutObject instead of three requests; a missing bucket is then found at the close, not the open
    kwargs: dict[str, object] = {"allow_delayed_open": True}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        scheme, rest = split_uri(endpoint)
        kwargs["endpoint_override"] = rest if scheme else endpoint
        kwargs["scheme"] = scheme or "https"
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region and bucket:  # a bucket outside the SDK's default region answers every call with 301
        try:
            region = pafs.resolve_s3_region(bucket)
        except OSError:
            region = None  # a missing bucket: its first request names it
    if region:
        kwargs["region"] = region
    return cls(**kwargs)


@functools.lru_cache(maxsize=16)
def _filesystem(scheme: str, authority: str, _env: tuple[str | None, ...]) -> pafs.FileSystem:
    """GCS (credentials from the environment) and HDFS (``host:port``) filesystems, one per value."""
    import pyarrow.fs as pafs

    if scheme == "hdfs":
        _filesystem_class("HadoopFileSystem", scheme)
        try:
            return pafs.FileSystem.from_uri(f"hdfs://{authority}/")[0]
        except (OSError, ValueError) as e:
            raise StorageError(f"cannot reach hdfs://{authority}: {one_line(e)}") from None
    return _filesystem_class("GcsFileSystem", scheme)()


def _fsspec(scheme: str, target: str | os.PathLike[str]) -> tuple[pafs.FileSystem, str]:
    """A scheme that pyarrow has no filesystem for, through fsspec (``pip install adlfs`` for ``az://``)."""
    import fsspec
    import pyarrow.fs as pafs

    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError as e:  # fsspec knows the scheme, and names the package that serves it
        raise StorageError(f"{os.fspath(target)}: {scheme}:// needs a package: {one_line(e)}") from None
    except ValueError:
        raise StorageError(
            f"{os.fspath(target)}: unsupported scheme {scheme}:// (use a path, file://, s3://, gs://, "
            "hdfs://, or a scheme an installed fsspec package serves)"
        ) from None
    try:
        fs, path = fsspec.core.url_to_fs(os.fspath(target))
    except (OSError, TypeError, ValueError) as e:
        raise StorageError(f"cannot reach {os.fspath(target)}: {one_line(e)}") from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


def _filesystem_class(name: str, scheme: str) -> type:
    """The pyarrow filesystem class, or a StorageError naming the extra when this build lacks it."""
    import pyarrow.fs as pafs

    cls = getattr(pafs, name, None)
    if cls is None:
        raise StorageError(f"{scheme}:// needs a pyarrow built with {name}: {EXTRA_HINT}")
    return cls


def one_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def no_bucket(bucket: str) -> str:
    """What is said of a bucket that does not exist, however that was found."""
    return f"bucket {bucket!r} does not exist (create it first)"


def store_error(e: BaseException, target: str | os.PathLike[str]) -> StorageError:
    """A store's refusal as one line that says what to fix: the AWS SDK's messages run over several
    lines and name the failing call, not the bucket or the keys."""
    code = str(e).upper().replace("_", "")  # the SDK spells its codes NO_SUCH_BUCKET or NoSuchBucket
    name = os.fspath(target)
    if "NOSUCHBUCKET" in code:
        scheme, rest = split_uri(name)
        bucket = rest.strip("/").split("/", 1)[0]  # named alone: the object asked for may be one of ours
        where = f"{scheme}://{bucket}" if scheme else name
        return StorageError(f"{where}: {no_bucket(bucket)}")
    refused = ("ACCESSDENIED", "INVALIDACCESSKEYID", "SIGNATUREDOESNOTMATCH", "EXPIREDTOKEN", "FORBIDDEN")
    if any(k in code for k in refused):
        return StorageError(
            f"{name}: the store refused the credentials (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
            "or AWS_PROFILE, and the endpoint AWS_ENDPOINT_URL)"
        )
    if "NETWORKCONNECTION" in code or "CURLCODE" in code:  # nothing answers at the endpoint
        var = "AWS_ENDPOINT_URL_S3" if os.environ.get("AWS_ENDPOINT_URL_S3") else "AWS_ENDPOINT_URL"
        endpoint = os.environ.get(var) if split_uri(name)[0] == "s3" else None
        at, check = (
            (f" at {endpoint}", f"the endpoint ({var}) and the network") if endpoint else ("", "the network")
        )
        return StorageError(f"{name}: the store cannot be reached{at} ({one_line(e)}); check {check}")
    return StorageError(f"{name}: {one_line(e)}")
