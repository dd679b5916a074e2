"""Storage: local disk and object stores (S3, GCS, HDFS, and what fsspec serves) behind one set of calls.

``uris`` turns a path or URI into a pyarrow filesystem; ``objects`` reads, writes, lists and deletes
through it; ``cache`` keeps local copies of what a store holds. Credentials come from the environment
only (docs/storage.md).
"""

from .cache import cache_folder, download, local_files, mirror, stamp
from .objects import (
    READ_BLOCK_BYTES,
    arrow_file,
    delete,
    delete_folder,
    glob_base,
    info,
    is_file,
    list_files,
    list_names,
    listing,
    open_input,
    open_stream,
    read_bytes,
    write_bytes,
)
from .uris import EXTRA_HINT, absolute, is_remote, join, name_path, normalize, resolve, split_uri, store_error

__all__ = [
    "EXTRA_HINT",
    "READ_BLOCK_BYTES",
    "absolute",
    "arrow_file",
    "cache_folder",
    "delete",
    "delete_folder",
    "download",
    "glob_base",
    "info",
    "is_file",
    "is_remote",
    "join",
    "list_files",
    "list_names",
    "listing",
    "local_files",
    "mirror",
    "name_path",
    "normalize",
    "open_input",
    "open_stream",
    "read_bytes",
    "resolve",
    "split_uri",
    "stamp",
    "store_error",
    "write_bytes",
]
