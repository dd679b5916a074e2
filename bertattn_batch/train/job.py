"""A job's own model: trained on first run from its ``[finetune]`` table, and by ``bertattn finetune``."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from .._files import file_lock
from ..config import FinetuneSpec, InputSpec, JobSpec, keys, load_job
from ..errors import ModelError, SpecError
from ..model.checks import load_config, position_limit, resolve_source
from ..model.classifier import layer_count, resolve_layers
from ..run import old_manifest
from ..storage import is_remote
from . import api

log = logging.getLogger(__name__)


def ensure_model(spec: JobSpec, progress: bool = True) -> float:
    """Train the job's model where its [finetune] table says and the folder is missing; the seconds it took.
    A job started meanwhile waits and uses the same model (a time-capped training differs each time, and a
    run of the other model would be refused on resume)."""
    if spec.finetune is None or is_remote(spec.model) or (Path(spec.model) / "config.json").is_file():
        return 0.0  # a model on a store is read as it is: a job trains into a local folder only
    t0 = time.perf_counter()
    old_manifest(spec.out, spec.on_existing)  # an --out that would be refused: found before training
    if (base := spec.finetune.base) is not None:  # the job's layers and length, before a vain training
        config = load_config(resolve_source(base), allow_pickle=None)
        resolve_layers(spec.layers, layer_count(config))
        if spec.max_length is not None and spec.max_length > (positions := position_limit(config)):
            raise SpecError(
                f"max_length {spec.max_length} exceeds the {positions} tokens that finetune.base {base} has "
                "positions for"
            )
    model = Path(spec.model)
    try:
        model.parent.mkdir(parents=True, exist_ok=True)
        # with the model there, waiters find it and later jobs need no lock
        waiting = f"another job is training {model}; waiting for it"
        with file_lock(model.with_name(f".{model.name}.training.lock"), waiting=waiting, remove=True):
            if (model / "config.json").is_file():
                log.warning("model %s was trained by another job meanwhile; using it", spec.model)
            else:
                try:
                    _train_model(spec, progress)
                except KeyboardInterrupt as e:  # (SIGTERM too) said on the "interrupted" line
                    e.args = (f"the training of {spec.model} starts over when the same command is rerun",)
                    raise
    except OSError as e:
        raise ModelError(f"cannot write beside {model} to train it: {e.strerror or e}") from None
    return time.perf_counter() - t0


def training_inputs(spec: JobSpec, paths: list[str] | None = None) -> InputSpec:
    """What a job's model is trained on: ``[finetune]``'s inputs, else all the job's rows; ``paths`` replace
    the files, with the same columns."""
    own = spec.finetune.inputs if spec.finetune and spec.finetune.inputs else spec.inputs
    label_col = own.label_col or "label"
    if paths:
        return InputSpec(paths, text_col=own.text_col, label_col=label_col)
    return dataclasses.replace(own, label_col=label_col, limit=None)


def _train_model(spec: JobSpec, progress: bool) -> None:
    # on every row, --limit or not: a model trained on a trial's few rows would score every later run
    every = (
        " (on all its rows: --limit applies to the reviews scored)" if spec.inputs.limit is not None else ""
    )
    log.warning("model %s not found: training it now from the job's [finetune] table%s", spec.model, every)
    metrics = api.finetune_files(training_inputs(spec), spec.model, spec.finetune, progress)
    if metrics.get("accuracy") is None:  # eval_fraction = 0; an accuracy of 0.0 is still printed
        log.warning("trained %s: no held-out split", spec.model)
    else:
        log.warning("trained %s: held-out accuracy %.4f, macro-F1 %.4f", spec.model, metrics["accuracy"],
                    metrics["macro_f1"])  # fmt: skip


@dataclasses.dataclass(frozen=True)
class TrainingPlan:
    """What ``bertattn finetune`` trains: on which rows, into which folder, with which settings."""

    inputs: InputSpec
    out_dir: str
    spec: FinetuneSpec

    def run(self, progress: bool = True) -> dict[str, Any]:
        return api.finetune_files(self.inputs, self.out_dir, self.spec, progress)


def plan_training(inputs: list[str] | None = None, out: str | None = None,
                  job: str | Path | JobSpec | None = None, **given: Any) -> TrainingPlan:  # fmt: skip
    """A training from files and ``--out``, or from a job's model and ``[finetune]`` table; ``given``: keys
    of :class:`InputSpec` and :class:`FinetuneSpec` as a job file names them (None: not given)."""
    given = {k: v for k, v in given.items() if v is not None}
    reading = {keys(InputSpec)[k][1].name: given.pop(k) for k in list(given) if k in keys(InputSpec)}
    if job is not None:
        spec = job if isinstance(job, JobSpec) else load_job(job)
        settings = dataclasses.replace(spec.finetune or FinetuneSpec(), **given)
        return TrainingPlan(
            dataclasses.replace(training_inputs(spec, inputs), **reading), out or spec.model, settings
        )
    if not inputs or not out:
        raise SpecError("give INPUT... and --out, or --job JOB.toml")
    return TrainingPlan(InputSpec(inputs, **reading), out, FinetuneSpec(**given))
