"""The model a finished run recorded, loaded again to recompute what the run measured
(``faithfulness``, ``plot --pairs``): refused if it is surely another model, and a load that fails
where the run's folder is gone says it moved."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError, ModelError, SpecError
from ..run import Manifest

if TYPE_CHECKING:
    from ..model import Classifier

log = logging.getLogger(__name__)


def load_run_model(manifest: Manifest, given: str | None, load: Callable[[str], Classifier]) -> Classifier:
    """``load`` the run's model: from ``given`` (``--model``), else from where the run recorded it.
    Its files' hashes are compared before loading, since a model retrained into the same folder may
    fail the run's settings and would be refused for those instead of for being another model; its
    label names once it has loaded. A tokenizer that does otherwise than the run's is warned of only:
    what reads the run again scores the token ids the run stored, and another ``tokenizers`` version
    may move an offset without making the model another."""
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
        raise ModelError(f"{e} ({manifest.MODEL_MOVED})") from None
    recorded = manifest.fingerprint  # (what the run did not record is not compared)
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
