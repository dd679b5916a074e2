"""The model a finished run recorded, loaded again to recompute what the run measured
(``faithfulness``, ``plot --pairs``): refused if it is surely another model, and a load that fails
where the run's folder is gone says it moved."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError, ModelError, SpecError
from ..run import Manifest

if TYPE_CHECKING:
    from ..model import Classifier


def load_run_model(manifest: Manifest, given: str | None, load: Callable[[str], Classifier]) -> Classifier:
    """``load`` the run's model: from ``given`` (``--model``), else from where the run recorded it.
    Its files' hashes are compared before loading, since a model retrained into the same folder may
    fail the run's settings and would be refused for those instead of for being another model; its
    tokenizer and label names, once it has loaded."""
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
    recorded, differs = manifest.fingerprint, None  # (a hash the run did not record is not compared)
    if recorded.get("tokenizer_sha256") not in (None, tokenizer_hash(clf.tokenizer)):
        differs = "tokenizer differs"
    elif recorded.get("labels") not in (None, {str(k): v for k, v in clf.id2label.items()}):
        differs = "label names differ"
    if differs:
        raise InputError(
            f"the model at {source} is not the run's: its {differs} from what the manifest records; "
            "pass the run's model with --model"
        )
    return clf
