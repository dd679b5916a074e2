"""Local disk and object stores (S3, GCS, HDFS, what fsspec serves) behind one set of calls. Every scheme
but ``file://`` is taken to have no rename and no locks. Credentials come only from the standard
environment, never from an option, so they land in no shell history and no manifest.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import glob
import hashlib
import io
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO

from .errors import StorageError, first_line

if TYPE_CHECKING:  # pyarrow is imported where used: a command's start does not wait for it
    import pyarrow as pa
    import pyarrow.fs as pafs

#: What to install where this pyarrow lacks a scheme's filesystem.
EXTRA_HINT = "pip install '.[s3]' in a checkout"
NO_BUCKET = "bucket {!r} does not exist (create it first)"
#: Bytes read from a store per request while a file is streamed.
READ_BLOCK_BYTES = 8 << 20
#: The environment a store's filesystem is made from: one filesystem is kept per value of it.
_ENV = (
    "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE",
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "GOOGLE_APPLICATION_CREDENTIALS",
)  # fmt: skip
#: A URI in a text, and in one the credentials: a ``user:password@`` and query values named as keys,
#: tokens, secrets or signatures (a presigned URL's ``X-Amz-*``).
_URI = re.compile(r"\b[a-z][a-z0-9+.-]+://[^\s'\"<>]*?(?=[:,;.)]?(?:[\s'\"<>]|$))", re.I)
_SECRET = re.compile(r"(?<=://)[^/?#@]*@|(?<=[?&])((?:x-amz-[^=&#]*|[^=&#]*(?:token|key|secret|signature|"
                     r"password|credential|sig)[^=&#]*)=)[^&#]*", re.I)  # fmt: skip


# -- paths and URIs ------------------------------------------------------------------------------------
def split_uri(target: str | os.PathLike[str]) -> tuple[str | None, str]:
    """The scheme (lower case, None for a plain path) and the rest; Windows drive letters are paths."""
    text = os.fspath(target)
    scheme, sep, rest = text.partition("://")
    if not sep or len(scheme) < 2 or not scheme.replace("+", "").isalnum():
        return None, text
    return scheme.lower(), rest


def redact(text: str | os.PathLike[str]) -> str:
    """``text`` with the credentials in each URI it holds replaced by ``***``."""
    return _URI.sub(lambda m: _SECRET.sub(lambda s: f"{s[1]}***" if s[1] else "***@", m[0]), os.fspath(text))


def normalize(target: str | os.PathLike[str]) -> str:
    """A ``file://`` URI as its local path, ``~`` as the home folder; a store's URI as it is (checked)."""
    scheme, rest = split_uri(target)
    if scheme is not None and scheme != "file":
        _check_bucket(scheme, rest)
        return os.fspath(target)
    return os.path.expanduser(rest if scheme == "file" else os.fspath(target))


def is_remote(target: str | os.PathLike[str]) -> bool:
    """Whether ``target`` is on an object store or cluster filesystem rather than this machine's disk."""
    return split_uri(target)[0] not in (None, "file")


def absolute(target: str) -> str:
    """A path as a run records an input: a local path absolute; ``-`` (stdin) as it is; a URI redacted."""
    return target if target == "-" else redact(target) if is_remote(target) else os.path.abspath(target)


def join(base: str | os.PathLike[str], *names: str) -> str:
    """``base`` with ``names`` appended by ``/``: a URI stays a URI (pathlib would fold ``s3://``)."""
    return "/".join([os.fspath(base).rstrip("/"), *names])


def name_path(target: str | os.PathLike[str]) -> PurePosixPath:
    """The path part of a path or URI, for its name and suffixes (``reviews.jsonl.gz``)."""
    return PurePosixPath(split_uri(_no_query(os.fspath(target)))[1])


def _no_query(target: str) -> str:
    """A web URL without its query (``?token=``), which is no part of its name and no glob."""
    return target.partition("?")[0] if split_uri(target)[0] in ("http", "https") else target


def resolve(target: str | os.PathLike[str]) -> tuple[pafs.FileSystem, str]:
    """``(pyarrow.fs.FileSystem, path)`` for a path or URI (s3, gs and hdfs by pyarrow, others by fsspec)."""
    import pyarrow.fs as pafs

    scheme, rest = split_uri(target)
    if scheme is None or scheme == "file":
        return pafs.LocalFileSystem(), str(Path(rest or "/").expanduser().absolute())
    _check_bucket(scheme, rest)
    env = tuple(os.environ.get(n) for n in _ENV)
    if scheme == "s3":  # the bucket, for its region where the environment names none
        return _filesystem(scheme, "" if any(env[:4]) else rest.split("/", 1)[0], env), rest.strip("/")
    if scheme in ("gs", "gcs"):
        return _filesystem(scheme, "", env), rest.strip("/")
    if scheme == "hdfs":
        authority, _, path = rest.partition("/")
        return _filesystem(scheme, authority, env), "/" + path.strip("/")
    import fsspec  # a scheme pyarrow has no filesystem for (``az://`` with adlfs)

    name = os.fspath(target)
    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError as e:  # fsspec knows the scheme, and names the package that serves it
        raise StorageError(f"{name}: {scheme}:// needs a package: {first_line(e)}") from None
    except ValueError:
        raise StorageError(
            f"{name}: unsupported scheme {scheme}:// (use a path, file://, s3://, gs://, "
            "hdfs://, or a scheme an installed fsspec package serves)"
        ) from None
    try:
        fs, path = fsspec.core.url_to_fs(name)
    except (OSError, TypeError, ValueError) as e:
        raise StorageError(f"cannot reach {name}: {first_line(e)}") from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


@functools.lru_cache(maxsize=16)
def _filesystem(scheme: str, authority: str, _env: tuple[str | None, ...]) -> pafs.FileSystem:
    """An S3 (``authority``: a bucket), GCS or HDFS (``host:port``) filesystem."""
    import pyarrow.fs as pafs

    name = {"hdfs": "HadoopFileSystem", "s3": "S3FileSystem"}.get(scheme, "GcsFileSystem")
    if (cls := getattr(pafs, name, None)) is None:
        raise StorageError(f"{scheme}:// needs a pyarrow built with {name}: {EXTRA_HINT}")
    if scheme == "hdfs":
        try:
            return pafs.FileSystem.from_uri(f"hdfs://{authority}/")[0]
        except (OSError, ValueError) as e:
            raise StorageError(f"cannot reach hdfs://{authority}: {first_line(e)}") from None
    if scheme != "s3":
        return cls()
    endpoint, region = _s3_place(authority)
    kwargs: dict[str, object] = {"allow_delayed_open": True}  # a small object goes up in one PutObject
    if endpoint:
        kwargs["scheme"], kwargs["endpoint_override"] = split_uri(endpoint)
    if region:
        kwargs["region"] = region
    return cls(**kwargs)


def _s3_place(bucket: str) -> tuple[str | None, str | None]:
    """(endpoint URL, region) of an S3 bucket: the environment's, else on AWS the bucket's own region."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint and split_uri(endpoint)[0] is None:
        endpoint = f"https://{endpoint}"
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region and not endpoint and bucket:
        import pyarrow.fs as pafs

        with contextlib.suppress(OSError):  # a missing bucket: its first request names it
            region = pafs.resolve_s3_region(bucket)
    return endpoint, region


def _check_bucket(scheme: str, rest: str) -> None:
    """Refuse a store's URI that names no bucket, or holds keys (which a run would record)."""
    bucket = rest.split("/", 1)[0]
    if scheme in ("s3", "gs", "gcs") and not bucket:
        raise StorageError(f"{scheme}:// names no bucket: give {scheme}://BUCKET/PATH")
    if scheme in ("s3", "gs", "gcs") and ("@" in bucket or ":" in bucket):
        raise StorageError(
            f"a {scheme}:// URI holds keys (KEY:SECRET@BUCKET): give them in the environment or a "
            "credentials file (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE), never in a URI"
        )


def store_error(e: BaseException, target: str | os.PathLike[str]) -> StorageError:
    """A store's refusal as one line that says what to fix."""
    code = str(e).upper().replace("_", "")  # the SDK spells its codes NO_SUCH_BUCKET or NoSuchBucket
    name = os.fspath(target)
    if "NOSUCHBUCKET" in code:
        scheme, rest = split_uri(name)
        bucket = rest.strip("/").split("/", 1)[0]
        return StorageError(f"{f'{scheme}://{bucket}' if scheme else name}: {NO_BUCKET.format(bucket)}")
    refused = ("ACCESSDENIED", "INVALIDACCESSKEYID", "SIGNATUREDOESNOTMATCH", "EXPIREDTOKEN", "FORBIDDEN")
    if any(k in code for k in refused):
        return StorageError(
            f"{name}: the store refused the credentials (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
            "or AWS_PROFILE, and the endpoint AWS_ENDPOINT_URL)"
        )
    if "NETWORKCONNECTION" in code or "CURLCODE" in code:  # nothing answers at the endpoint
        var = "AWS_ENDPOINT_URL_S3" if os.environ.get("AWS_ENDPOINT_URL_S3") else "AWS_ENDPOINT_URL"
        endpoint = os.environ.get(var) if split_uri(name)[0] == "s3" else None
        at, check = (f" at {endpoint}", f"the endpoint ({var}) and ") if endpoint else ("", "")
        return StorageError(
            f"{name}: the store cannot be reached{at} ({first_line(e)}); check {check}the network"
        )
    return StorageError(f"{name}: {first_line(e)}")


@contextlib.contextmanager
def _errors(target: str | os.PathLike[str]) -> Iterator[None]:
    """A store's OSError as a one-line StorageError."""
    try:
        yield
    except OSError as e:
        raise store_error(e, target) from None


# -- objects -------------------------------------------------------------------------------------------
def info(target: str | os.PathLike[str]) -> pafs.FileInfo:
    """``pyarrow.fs.FileInfo`` of a path or URI: type, size, modification time."""
    fs, path = resolve(target)
    with _errors(target):
        return fs.get_file_info(path)


def is_file(target: str | os.PathLike[str]) -> bool:
    """Whether a path or URI names a file (an object), not a folder, a prefix or nothing."""
    return info(target).type.name == "File"


def open_input(target: str | os.PathLike[str], buffered: bool = True) -> BinaryIO:
    """A file's bytes, random access: on a store, ranged reads of ``READ_BLOCK_BYTES`` (or unbuffered)."""
    if not is_remote(target):
        return open(normalize(target), "rb")
    fs, path = resolve(target)
    with _errors(target):
        native = fs.open_input_file(path)
    return io.BufferedReader(native, buffer_size=READ_BLOCK_BYTES) if buffered else native


def arrow_file(target: str | os.PathLike[str]) -> contextlib.AbstractContextManager[Any]:
    """What pyarrow reads: a local path, or a store's object as a file of ranged reads."""
    return (
        open_input(target, buffered=False) if is_remote(target) else contextlib.nullcontext(normalize(target))
    )


def read_bytes(target: str | os.PathLike[str]) -> bytes:
    """A whole (small) object: a manifest, a lease."""
    with _errors(target), open_input(target) as f:
        return f.read()


def write_bytes(target: str | os.PathLike[str], data: bytes | pa.Buffer) -> None:
    """Put an object whole: a reader sees the old object or the new one, never a part of it."""
    fs, path = resolve(target)
    with _errors(target), fs.open_output_stream(path, compression=None) as f:
        f.write(data)


class CommitRefused(StorageError):
    """A conditional write refused: the object is no longer the version the writer named."""


class NoConditionalWrites(StorageError):
    """A store that does not honour conditional writes (If-Match / If-None-Match on PUT)."""


def has_conditional_writes(target: str | os.PathLike[str]) -> bool:
    """Whether :func:`put_if` serves ``target``'s scheme: S3's API (AWS, MinIO, Ceph, R2...)."""
    return split_uri(target)[0] == "s3"


def etag(target: str | os.PathLike[str]) -> str | None:
    """An S3 object's version tag, what :func:`put_if` names (None where there is no object)."""
    head = _conditionally(target, "head_object")
    return None if head is None else str(head["ETag"])


def put_if(target: str | os.PathLike[str], data: bytes, version: str | None) -> str:
    """Put an S3 object whole only if it is still ``version`` (an ETag; None: only if there is none):
    its new ETag, or CommitRefused, or NoConditionalWrites where the store refuses the condition."""
    condition = {"IfMatch": version} if version is not None else {"IfNoneMatch": "*"}
    return str(_conditionally(target, "put_object", Body=data, **condition)["ETag"])


def delete_if(target: str | os.PathLike[str], version: str) -> None:
    """Delete an S3 object only if it is still ``version`` (an ETag): CommitRefused where another
    writer replaced it, NoConditionalWrites where the store refuses the condition."""
    _conditionally(target, "delete_object", IfMatch=version)


def _conditionally(target: str | os.PathLike[str], call: str, **args: Any) -> Any:
    """An S3 call (with a precondition), its refusals said as CommitRefused or NoConditionalWrites; None
    where a ``head_object`` finds no object."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, key = split_uri(target)[1].strip("/").partition("/")
    client = _s3_client(bucket, tuple(os.environ.get(n) for n in _ENV))
    try:
        return getattr(client, call)(Bucket=bucket, Key=key, **args)
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status == 404 and call == "head_object":
            return None
        # 409: a conditional write to the same key in flight at that moment; NoSuchKey: that version is gone
        if status in (409, 412) or code == "NoSuchKey":
            raise CommitRefused(f"{os.fspath(target)}: another writer replaced it") from None
        if status == 501 or code == "NotImplemented":
            raise NoConditionalWrites(f"{os.fspath(target)}: the store refuses conditional writes") from None
        raise store_error(e, target) from None
    except BotoCoreError as e:
        raise store_error(e, target) from None


@functools.lru_cache(maxsize=16)
def _s3_client(bucket: str, _env: tuple[str | None, ...]) -> Any:
    """A boto3 S3 client of the endpoint and region pyarrow's filesystem uses."""
    try:
        import boto3
    except ImportError:
        raise StorageError(f"writing a run to s3:// needs boto3: {EXTRA_HINT}") from None
    endpoint, region = _s3_place(bucket)
    return boto3.session.Session().client("s3", endpoint_url=endpoint, region_name=region)


def delete(target: str | os.PathLike[str]) -> None:
    """Remove an object; one that is already gone is no error."""
    fs, path = resolve(target)
    with _errors(target), contextlib.suppress(FileNotFoundError):
        fs.delete_file(path)


def listing(folder: str | os.PathLike[str], recursive: bool = False) -> dict[str, pafs.FileInfo]:
    """The objects under ``folder`` by their ``/``-separated names below it; none where it does not exist."""
    import pyarrow.fs as pafs

    fs, path = resolve(folder)
    with _errors(folder):
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True, recursive=recursive))
    root = path.strip("/")  # fsspec's filesystems answer "/bucket/key" for "bucket/key"
    return {i.path.strip("/")[len(root) :].lstrip("/"): i for i in infos if i.type == pafs.FileType.File}


def list_names(folder: str | os.PathLike[str], recursive: bool = False) -> list[str]:
    return sorted(listing(folder, recursive))


def glob_base(target: str) -> str:
    """The fixed folder a glob lists below (``s3://b/corpus`` of ``s3://b/corpus/*/day-*.parquet``)."""
    pattern = _no_query(target)
    if not glob.has_magic(split_uri(pattern)[1]):
        return target.rstrip("/")
    return pattern[: min(pattern.index(c) for c in "*?[" if c in pattern)].rsplit("/", 1)[0]


def list_files(target: str) -> list[str]:
    """Every file a URI names, sorted: the file, a folder's files at any depth, or a glob's matches
    (``**`` across folders); StorageError where nothing matches."""
    target = target.rstrip("/")
    base = glob_base(target)
    if base != target:
        pattern = target[len(base) + 1 :].split("/")
        found = [join(base, n) for n in listing(base, recursive=True) if _matches(n.split("/"), pattern)]
    elif is_file(target):
        found = [target]
    else:
        found = [join(target, n) for n in listing(target, recursive=True)]
    if found:
        return sorted(found)
    scheme, rest = split_uri(target)
    why = "no such file, folder or match"
    if scheme in ("s3", "gs", "gcs"):  # a missing bucket lists as empty as an empty folder
        bucket = rest.strip("/").split("/", 1)[0]
        with contextlib.suppress(OSError):  # not allowed to look: the listing's answer stands
            if resolve(f"{scheme}://{bucket}")[0].get_file_info(bucket).type.name == "NotFound":
                why = NO_BUCKET.format(bucket)
    raise StorageError(f"{target}: {why}")


def _matches(parts: list[str], pattern: list[str]) -> bool:
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_matches(parts[i:], pattern[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _matches(parts[1:], pattern[1:])


# -- local copies --------------------------------------------------------------------------------------
def cache_folder(kind: str, uri: str) -> Path:
    """The folder a store's ``kind`` of thing (runs, models) is copied to under ``$BERTATTN_CACHE``."""
    root = Path(os.environ.get("BERTATTN_CACHE") or Path.home() / ".cache" / "bertattn")
    folder = root / kind / hashlib.sha256(uri.encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".source").write_text(uri + "\n", encoding="utf-8")
    return folder


def local_files(local: Path) -> dict[str, tuple[int, int]]:
    """A folder's files by their names below it: (size, modification time); hidden ones left out."""
    found = {f.relative_to(local): f for f in local.rglob("*") if f.is_file()}
    return {n.as_posix(): stamp(f) for n, f in found.items() if not any(p.startswith(".") for p in n.parts)}


def mirror(uri: str, local: Path, skip: tuple[str, ...] = ()) -> None:
    """Bring ``local`` up to date with every object under ``uri`` but ``skip``, fetching changed ones only."""
    found = listing(uri, recursive=True)
    if not found:
        raise StorageError(f"{uri}: no such folder, or it is empty")
    remote = {n: i for n, i in found.items() if n not in skip}
    for name in set(local_files(local)) - set(remote) - set(skip):
        (local / name).unlink()
    for name, obj in remote.items():
        target = local / name
        if not (obj.mtime_ns and target.is_file() and stamp(target) == (obj.size, obj.mtime_ns)):
            download(join(uri, name), target, obj)  # (a store that gives no time: fetched every time)


def download(uri: str, target: Path, obj: pafs.FileInfo | None = None) -> None:
    """Copy one object to ``target`` through a temporary of this process's own, stamped with its time."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    try:
        with open_input(uri, buffered=False) as src, os.fdopen(fd, "wb") as dst:
            shutil.copyfileobj(src, dst, READ_BLOCK_BYTES)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if obj is not None:
        stamp(target, obj)


def stamp(path: Path, obj: pafs.FileInfo | None = None) -> tuple[int, int]:
    """A copy's (size, time); with ``obj``, its time first set to the object's version."""
    if obj is not None and obj.mtime_ns:
        os.utime(path, ns=(obj.mtime_ns, obj.mtime_ns))
    st = path.stat()
    return (st.st_size, st.st_mtime_ns)
