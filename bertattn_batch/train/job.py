"""A job's own model: trained on first run from its ``[finetune]`` table, and by ``bertattn finetune``.

Usage::

    seconds = ensure_model(spec)              # train spec.model if it is missing; 0.0 if it is there
    plan = plan_training(job="jobs/default.toml", epochs=2.0)
    metrics = plan.run()
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from .._files import file_lock
from ..config import FinetuneSpec, JobSpec, check_delimiter, check_encoding, from_dict, load_job
from ..errors import ModelError, SpecError
from ..model.checks import load_config, position_limit, resolve_source
from ..model.classifier import layer_count, resolve_layers
from ..run import old_manifest
from ..storage import is_remote
from . import api

log = logging.getLogger(__name__)


def ensure_model(spec: JobSpec, progress: bool = True) -> float:
    """Train the job's model when the job has a [finetune] table and the folder is missing; the seconds
    that took (0 where the model was there), which a run's summary reports apart.

    One job trains it; a job started meanwhile waits and uses the same model (each training its own
    would replace the other's folder, and the first job's run would then be another model's).
    """
    if spec.finetune is None or is_remote(spec.model) or (Path(spec.model) / "config.json").is_file():
        return 0.0  # a model on a store is read as it is
    t0 = time.perf_counter()
    old_manifest(spec.out, spec.on_existing)  # an --out that would be refused: found before training
    if spec.finetune.base is not None:  # the job's layers and length against the base's config
        config = load_config(resolve_source(spec.finetune.base), allow_pickle=None)
        resolve_layers(spec.layers, layer_count(config))
        if spec.max_length is not None and spec.max_length > (positions := position_limit(config)):
            raise SpecError(
                f"max_length {spec.max_length} exceeds the {positions} tokens that finetune.base "
                f"{spec.finetune.base} has positions for"
            )
    model = Path(spec.model)
    try:
        model.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(
            model.with_name(f".{model.name}.training.lock"),
            waiting=f"another job is training {model}; waiting for it",
            remove=True,
        ):
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


def _train_model(spec: JobSpec, progress: bool) -> None:
    # on every row of its inputs: a model trained on a trial's few rows would score every later run
    every = " (on all its rows: --limit applies to the reviews scored)" if spec.limit is not None else ""
    log.warning("model %s not found: training it now from the job's [finetune] table%s", spec.model, every)
    metrics = plan_training(job=spec).run(progress)
    if metrics.get("accuracy") is None:
        log.warning("trained %s: no held-out split", spec.model)
    else:
        log.warning(
            "trained %s: held-out accuracy %.4f, macro-F1 %.4f",
            spec.model,
            metrics["accuracy"],
            metrics["macro_f1"],
        )


@dataclasses.dataclass(frozen=True)
class TrainingPlan:
    """What ``bertattn finetune`` trains: on which rows, into which folder, with which settings."""

    inputs: list[str]
    text_col: str
    label_col: str
    out_dir: str
    input_format: str
    spec: FinetuneSpec
    id_col: str | None = None  # the ids the held-out reviews are recorded by (else their row numbers)
    encoding: str = "utf-8"
    delimiter: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "delimiter", check_delimiter(self.delimiter))
        check_encoding(self.encoding)

    def run(self, progress: bool = True) -> dict[str, Any]:
        return api.finetune_files(
            self.inputs,
            self.text_col,
            self.label_col,
            self.out_dir,
            self.spec,
            self.input_format,
            progress,
            id_col=self.id_col,
            encoding=self.encoding,
            delimiter=self.delimiter,
        )


def plan_training(
    inputs: list[str] | None = None,
    out: str | None = None,
    job: str | Path | JobSpec | None = None,
    text_col: str | None = None,
    label_col: str | None = None,
    input_format: str | None = None,
    id_col: str | None = None,
    encoding: str | None = None,
    delimiter: str | None = None,
    **settings: Any,
) -> TrainingPlan:
    """A training from files and ``out``, or of a job's model with its ``[finetune]`` table.

    A job's training reads the table's inputs and columns where it names them, else the job's; ``inputs``
    given replace both. The job's input format, id column, encoding and delimiter apply to its own inputs
    only. ``settings``: keys of :class:`FinetuneSpec` (None: not given), which replace the table's.
    """
    given = {k: v for k, v in settings.items() if v is not None}
    if job is None:
        if not inputs or not out:
            raise SpecError("give INPUT... and --out, or --job JOB.toml")
        return TrainingPlan(
            list(inputs),
            text_col or "text",
            label_col or "label",
            out,
            input_format or "auto",
            from_dict(FinetuneSpec, given),
            id_col,
            encoding or "utf-8",
            delimiter,
        )
    spec = job if isinstance(job, JobSpec) else load_job(job)
    table = spec.finetune or FinetuneSpec()
    own = not inputs and not table.inputs  # the job's own rows
    return TrainingPlan(
        list(inputs or table.inputs or spec.inputs),
        text_col or table.text_col or spec.text_col,
        label_col or table.label_col or spec.label_col or "label",
        out or spec.model,
        input_format or (spec.input_format if own else "auto"),
        from_dict(FinetuneSpec, {**dataclasses.asdict(table), **given}),
        id_col or (spec.id_col if own else None),
        encoding or (spec.encoding if own else "utf-8"),
        delimiter or (spec.delimiter if own else None),
    )
