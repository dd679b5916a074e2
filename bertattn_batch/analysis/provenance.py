"""What ties a result to the run it came from: tables derived from a run (``aggregate``,
``faithfulness``) carry the run's job hash and their options in their metadata, so that a reader tells a
stale table from a current one; the run's model, loaded again, is checked to be the run's."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from .. import schema
from .._files import atomic_path
from ..errors import InputError, ModelError, SpecError, WriteError
from ..run import Manifest

if TYPE_CHECKING:
    from ..model import Classifier

log = logging.getLogger(__name__)

#: Metadata keys written as JSON.
JSON_KEYS = ("options", "parts")


def write_derived(
    path: Path, arrow: pa.Table, table: str, options: dict[str, Any], run_job_sha256: str, **meta: str
) -> None:
    """Write ``arrow`` (of the schema of ``table``) to ``path`` at once, with ``meta`` and its metadata."""
    metadata = {
        "table": table,
        "schema_version": str(schema.version(table)),
        "options": json.dumps(options),
        "run_job_sha256": run_job_sha256,
        **meta,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path, unique=True) as tmp:
            pq.write_table(arrow.replace_schema_metadata(metadata), tmp, compression="zstd")
    except OSError as e:
        raise WriteError(f"cannot write {path}: {e.strerror or e}") from None


def derived_meta(path: Path) -> dict[str, Any]:
    """The metadata :func:`write_derived` wrote, from the file's footer alone."""
    raw = pq.read_schema(path).metadata or {}
    meta = {k.decode(): v.decode() for k, v in raw.items() if not k.startswith(b"ARROW")}
    return {k: json.loads(v) if k in JSON_KEYS else v for k, v in meta.items()}


def load_run_model(manifest: Manifest, given: str | None, load: Callable[[str], Classifier]) -> Classifier:
    """``load`` the run's model from ``given`` (``--model``) or where the run recorded it, its files' hashes
    and label names checked; another tokenizer is only warned of (the run's token ids are scored)."""
    from ..model import other_model_files, tokenizer_hash

    source = given or manifest.model_source
    if not source:
        raise SpecError("this needs the run's model: pass --model")
    if other := other_model_files(source, manifest.model):
        raise InputError(
            f"the model at {source} is not the run's: it has {other} than the manifest records; pass the "
            "run's model with --model"
        )
    try:
        clf = load(source)
    except ModelError as e:
        if given or Path(source).exists():  # there, but it does not load: not a move
            raise
        raise ModelError(f"{e} (the model the run recorded; pass it with --model where it is now)") from None
    recorded = manifest.fingerprint  # what the run did not record is not compared
    if recorded.get("labels") not in (None, {str(k): v for k, v in clf.id2label.items()}):
        raise InputError(
            f"the model at {source} is not the run's: its label names differ from what the manifest "
            "records; pass the run's model with --model"
        )
    if recorded.get("tokenizer_sha256") not in (None, tokenizer_hash(clf.tokenizer)):
        log.warning(
            "the tokenizer of the model at %s does otherwise than the run's (edited since, or another "
            "tokenizers version): the run's own token ids are scored, between this tokenizer's [CLS] "
            "and [SEP]",
            source,
        )
    return clf
