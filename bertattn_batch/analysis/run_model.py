"""The model a finished run recorded, loaded again to recompute what the run measured
(``faithfulness``, ``plot --pairs``): refused if it is surely another model, and a load that fails
where the run's folder is gone says it moved."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..errors import InputError, ModelError, SpecError
from ..run import Manifest

T = TypeVar("T")


def load_run_model(manifest: Manifest, given: str | None, load: Callable[[str], T]) -> T:
    """``load`` the run's model: from ``given`` (``--model``), else from where the run recorded it.
    The weights' hash is compared before loading, since a model retrained into the same folder may fail
    the run's settings and would be refused for those instead of for being another model."""
    from ..model import is_other_model

    source = given or manifest.model_source
    if not source:
        raise SpecError("this needs the run's model: pass --model")
    if is_other_model(source, manifest.model.get("weights_sha256")):
        raise InputError(
            f"the model at {source} is not the run's: its weights' hash differs from the one the "
            "manifest records; pass the run's model with --model"
        )
    try:
        return load(source)
    except ModelError as e:
        if given or Path(source).exists():  # there, but it does not load: not a move
            raise
        raise ModelError(f"{e} ({manifest.MODEL_MOVED})") from None
