"""Train the classifier a job reads reviews with: fine-tune a pretrained BERT or train a small one.

The folder is renamed into place when complete; its ``finetune_metrics.json`` records held-out accuracy and
macro-F1, the split, the rows not trained on and why, the spec and the time taken.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import FinetuneSpec, InputSpec
from ..errors import InputError, ModelError
from ..inputs import check_inputs, class_label_order, read_sources, source_files
from ..model.checks import position_limit
from ..model.classifier import warn_above_tokenizer
from ..model.encode import encode_texts
from ..storage import is_remote
from . import loop
from .loop import accuracy, confusion, learning_rate, macro_f1
from .models import SPECIAL_TOKENS, start_model
from .save import HELDOUT_FILE, check_out_dir, out_dir_lock, save_model

log = logging.getLogger(__name__)


def finetune(texts: Sequence[str], labels: Sequence[str], out_dir: str | Path, spec: FinetuneSpec,
             progress: bool = True, skipped_rows: dict[str, int] | None = None,
             label_order: Sequence[str] = (), doc_ids: tuple[Sequence[str], str | None] | None = None,
             sources: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    """Train a classifier on (text, label) pairs, save it to ``out_dir`` atomically, return its metrics.

    Label ids follow ``spec.labels``, else ``label_order`` (a source's own), then numbers, then text.
    ``skipped_rows`` (why rows were not trained on) is saved with the metrics; ``doc_ids`` (each text's id,
    and their column or None) and ``sources`` name the held-out reviews for a run's report.
    """
    from transformers import set_seed

    if len(texts) != len(labels):
        raise InputError(f"{len(texts)} texts but {len(labels)} labels")
    names = _label_names(labels, spec.labels, label_order)
    out_dir = Path(os.path.abspath(out_dir))  # "." has no name to save beside
    replaces = check_out_dir(out_dir)
    with _training_settings(spec.threads, progress), out_dir_lock(out_dir):
        started = time.monotonic()
        set_seed(spec.seed)  # random, numpy and torch
        label_id = {n: i for i, n in enumerate(names)}
        y = np.array([label_id[lab] for lab in labels], dtype=np.int64)
        same: list[Sequence[str]] = [[t.strip() for t in texts]]
        if doc_ids is not None and doc_ids[1] is not None:  # an id column: a repeated id is one review
            same.append(doc_ids[0])
        train_idx, eval_idx = loop.split_indices(y, spec.eval_fraction, spec.seed, same)
        if untrained := [names[c] for c in sorted(set(range(len(names))) - set(y[train_idx].tolist()))]:
            raise InputError(
                f"label(s) {untrained} keep no training rows once {len(eval_idx)} reviews are held out: "
                "their rows repeat texts (or ids) of other labels' held-out reviews; give more rows of "
                "them, or a lower eval_fraction"
            )
        model, tokenizer, base_path = start_model(spec, names, [texts[i] for i in train_idx])
        hint = (
            f"the tokenizer of {base_path} does not fit the text"
            if base_path is not None
            else f"the character vocabulary keeps characters seen at least {spec.min_char_count} times in "
            "the training split; on a small corpus lower min_char_count (--min-char-count, or the job's "
            "[finetune] table)"
        )
        tok_size = len(tokenizer)
        if tok_size <= len(SPECIAL_TOKENS):
            raise ModelError(f"tokenizer has only {tok_size} tokens: {hint}")
        if replaces:  # said once the base has loaded: a base that fails replaces nothing
            log.warning(
                "%s holds a model trained before; it is replaced when this training ends (runs made with "
                "it can no longer be resumed, nor their token x token maps, faithfulness and held-out "
                "accuracy computed)",
                out_dir,
            )
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        max_length = _training_length(spec, tokenizer, model.config)
        train_ids = _encode_for_training(tokenizer, [texts[i] for i in train_idx], max_length)
        eval_ids = _encode_for_training(tokenizer, [texts[i] for i in eval_idx], max_length)
        content = [t for seq in train_ids for t in seq[1:-1]]
        unk = tokenizer.unk_token_id
        unk_share = sum(t == unk for t in content) / len(content) if content and unk is not None else 0.0
        if unk_share > 0.5:
            raise ModelError(f"{unk_share:.0%} of training tokens are [UNK]: {hint}")

        fit = loop.train_loop(model, train_ids, y[train_idx], pad_id, spec, progress)
        y_eval = y[eval_idx]
        preds = loop.predict(model, eval_ids, pad_id, max(64, 2 * spec.batch_size)) if len(eval_ids) else None
        scored = preds is not None
        metrics: dict[str, Any] = {
            "accuracy": accuracy(y_eval, preds) if scored else None,
            "macro_f1": macro_f1(y_eval, preds) if scored else None,
            "n_train": len(train_idx), "n_eval": len(eval_idx), "labels": names,
            "label_counts": {n: int(np.sum(y == i)) for i, n in enumerate(names)},
            "skipped_rows": dict(sorted((skipped_rows or {}).items())),
            "confusion": confusion(y_eval, preds, len(names)) if scored else None, "seconds": None, **fit,
            "vocab_size": tok_size, "unk_share": round(unk_share, 5), "max_length": max_length,
            "learning_rate": learning_rate(spec), "base": spec.base, "base_path": base_path,
            "spec": dataclasses.asdict(spec),
            "versions": {"torch": torch.__version__, "transformers": version("transformers")},
        }  # fmt: skip
        if fit["shortened"]:
            log.warning(
                "training stopped after %d of its %d steps (%.2f of %s epochs) at max_train_seconds=%s: "
                "this model is not the job's full schedule, and another machine would train another one. "
                "To train it in full: take max_train_seconds out of the job's [finetune] table, delete %s, "
                "and run the job again (bertattn run JOB.toml trains its model on first run)",
                fit["steps"], fit["planned_steps"], fit["epochs_done"], spec.epochs, spec.max_train_seconds,
                out_dir,
            )  # fmt: skip
        heldout = None
        if doc_ids is not None and len(eval_idx):
            ids, id_col = doc_ids
            heldout = {"id_col": id_col, "sources": sources, "doc_ids": [ids[i] for i in eval_idx]}
            metrics["heldout_ids"] = HELDOUT_FILE
        metrics["seconds"] = round(time.monotonic() - started, 2)  # all but the save
        save_model(model, tokenizer, metrics, out_dir, tok_size, names, heldout)
    return metrics


def _label_names(labels: Sequence[str], wanted: Sequence[str] | None, order: Sequence[str],
                 where: str = "the texts' labels", note: str = "") -> list[str]:  # fmt: skip
    """The class names in label-id order; refuses labels that cannot train a classifier. ``where`` and
    ``note`` say what was read, in the messages."""
    counts = Counter(labels)
    if len(counts) > max(100, len(labels) // 2):  # nearly one label per row: texts or ids, not classes
        raise InputError(
            f"{where} has {len(counts)} distinct labels among {len(labels)} rows "
            f"(e.g. {', '.join(repr(k[:40]) for k in list(counts)[:3])}): is it the label column?"
        )
    if wanted is not None:
        names = list(wanted)
        if unknown := sorted(set(counts) - set(names)):
            raise InputError(f"labels {unknown[:5]} are not among finetune.labels {names}")
    else:
        names = [n for n in dict.fromkeys(order) if n in counts]
        names += sorted(set(counts) - set(names), key=_label_order)
    seen: dict[float, str] = {}  # 1 and 1.0: one class written two ways (a CSV beside a Parquet)
    for name in names:
        with contextlib.suppress(ValueError):
            if (value := float(name)) in seen:
                raise InputError(
                    f"labels {seen[value]!r} and {name!r} are one number written two ways; write them "
                    "alike in every input"
                )
            seen[value] = name
    if len(counts) < 2:
        raise InputError(
            f"need at least 2 labels to train a classifier; {where} has {dict(counts) or 'no labelled rows'}"
            + note
        )
    if missing := [n for n in names if n not in counts]:
        raise InputError(f"finetune.labels {missing} have no rows in {where}{note}")
    if rare := [k for k, n in counts.items() if n < 2]:
        raise InputError(
            f"too few labelled rows to train: {where} has {len(rare)} label(s) with one row "
            f"(e.g. {', '.join(repr(k[:40]) for k in rare[:3])}); need at least 2 per label"
        )
    return names


def _label_order(label: str) -> tuple[int, float, str]:
    """Numbers in numeric order (1, 2, 10: star ratings), before other labels in text order."""
    try:
        value = float(label)
    except ValueError:
        return 1, 0.0, label
    return (0, value, label) if math.isfinite(value) else (1, 0.0, label)


@contextlib.contextmanager
def _training_settings(threads: int | None, progress: bool) -> Iterator[None]:
    """torch's threads and transformers' own progress bars for the training, restored after it."""
    from transformers.utils import logging as hf_logging

    old_threads, old_bars = torch.get_num_threads(), hf_logging.is_progress_bar_enabled()
    if threads:
        torch.set_num_threads(threads)
    (hf_logging.enable_progress_bar if progress else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        (hf_logging.enable_progress_bar if old_bars else hf_logging.disable_progress_bar)()


def _encode_for_training(tokenizer: Any, texts: list[str], max_length: int) -> list[list[int]]:
    """Token ids exactly as extract makes them."""
    return [enc.ids.tolist() for enc in encode_texts(tokenizer, texts, max_length)]


def _training_length(spec: FinetuneSpec, tokenizer: Any, config: Any) -> int:
    """The tokens a training review keeps, up to the base's positions as in extract; the saved tokenizer is
    set to it, so that extract scores as long as the model trained."""
    positions = position_limit(config)
    length = spec.max_length
    if length > positions:
        log.warning(
            "max_length %d is more than the %d tokens %s has positions for; training at %d tokens",
            length, positions, spec.base, positions,
        )  # fmt: skip
        length = positions
    else:
        warn_above_tokenizer(length, tokenizer, positions, spec.base or "the base")
    tokenizer.model_max_length = length
    return length


def finetune_files(
    inputs: InputSpec, out_dir: str | Path, spec: FinetuneSpec | None = None, progress: bool = True
) -> dict[str, Any]:
    """:func:`finetune` on the readable rows with a wanted label (column ``inputs.label_col``, else
    ``label``); held-out reviews are recorded by their doc ids, as a run of the same files spells them."""
    spec = spec or FinetuneSpec()
    if inputs.label_col is None:
        inputs = dataclasses.replace(inputs, label_col="label")
    label_col, id_col = inputs.label_col, inputs.id_col
    expanded = check_inputs(inputs)
    out_dir = Path(os.path.abspath(out_dir))
    for src in expanded:  # the old model folder is removed when the new one takes its place
        if not is_remote(src.path) and out_dir.resolve() in Path(src.path).resolve().parents:
            raise InputError(
                f"input {src.label} lies inside the model folder {out_dir}, which training replaces; move "
                "it or choose another --out"
            )
    wanted = set(spec.labels) if spec.labels is not None else None
    texts: list[str] = []  # of the rows trained on, with their labels and ids
    labels: list[str] = []
    doc_ids: list[str] = []
    seen: Counter[str] = Counter()  # labels read
    skipped: Counter[str] = Counter()  # why rows were not trained on
    for batch in read_sources(expanded, inputs):
        for doc_id, text, label, status in zip(
            batch.doc_id, batch.text, batch.label, batch.status, strict=True
        ):
            if status == "null_id" and text is not None:  # trained on, known by its row number
                status = "ok" if text.strip() else "empty_text"
            if status != "ok" or label is None or text is None:
                skipped[status if status != "ok" else "null_label"] += 1
                continue
            seen[label] += 1
            if wanted is None or label in wanted:
                texts.append(text)
                labels.append(label)
                doc_ids.append(doc_id)
            else:
                skipped["other_label"] += 1
    among = f" among finetune.labels {spec.labels}; labels there: {sorted(seen)[:10]}" if wanted else ""
    unused = f" (rows not used: {dict(sorted(skipped.items()))})" if skipped else ""
    order = class_label_order(expanded, label_col)
    _label_names(
        labels, spec.labels, order, f"{', '.join(inputs.paths)} (column {label_col!r})", among + unused
    )
    return finetune(texts, labels, out_dir, spec, progress, dict(skipped), order, (doc_ids, id_col),
                    source_files(expanded))  # fmt: skip
