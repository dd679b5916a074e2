"""The report's accuracy section: the confusion matrix, and accuracy on reviews held out from the model's
training apart from accuracy on the reviews that trained it (where its training recorded which:
``train.save.HELDOUT_FILE``), since most of a job's labelled reviews train its model."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import polars as pl

from ..run import Manifest
from .html import data_table, esc, muted


def confusion(preds: pl.DataFrame, labels: list[str]) -> dict[str, Any] | None:
    """Accuracy over labelled reviews whose label the model knows, and the confusion counts. Rows: every
    true label seen (one the model cannot predict gets a row but stays out of the accuracy); columns:
    the model's labels."""
    ok = preds.filter((pl.col("status") == "ok") & pl.col("label").is_not_null())
    if ok.is_empty():
        return None
    counts = {(t, p): n for t, p, n in ok.group_by(["label", "pred_label"]).len().rows()}
    true_labels = sorted(
        {t for t, _ in counts}, key=lambda t: (t not in labels, labels.index(t) if t in labels else 0, t)
    )
    known = ok.filter(pl.col("label").is_in(labels))
    correct = known.filter(pl.col("label") == pl.col("pred_label")).height
    return {
        "rows": true_labels,
        "cols": labels,
        "counts": counts,
        "accuracy": correct / known.height if known.height else float("nan"),
        "n_known": known.height,
        "n_unknown": ok.height - known.height,
    }


def heldout_ids(manifest: Manifest) -> tuple[set[str], bool] | str:
    """The doc ids the run's model was not trained on, and whether the run read just the files it was
    trained on (so that its other reviews trained it); else why they are not known.

    Ids of an id column name the same reviews in any corpus; row numbers only where the run read the
    files the model was trained on, first and in the same order.
    """
    training = manifest.model.get("training") or {}
    path = training.get("heldout_ids")
    if not path:
        return "which of them trained the model is not recorded"
    try:
        raw = Path(path).read_bytes()
        recorded = json.loads(raw)
    except (OSError, ValueError):
        return f"which of them trained the model is not readable ({path})"
    if training.get("heldout_sha256") not in (None, hashlib.sha256(raw).hexdigest()):
        return "the model's folder was trained again since this run: which of them trained its model is not known"
    id_col = recorded.get("id_col")
    if id_col != manifest.spec.get("id_col"):
        if id_col is None:
            return "the model's held-out reviews are known by row number, and this run has ids"
        return "the model's held-out reviews are known by ids other than this run's"
    trained_on, run = recorded.get("sources"), manifest.sources
    known = bool(trained_on) and bool(run)  # not for a model or run from before files were recorded
    if id_col is None:
        if not known:
            return "the model's held-out reviews are known by row number, but not of which files"
        if not _same_first_files(trained_on, run):
            return "the model was trained on other files, whose row numbers name other reviews"
    same = not known or (len(trained_on) == len(run) and _same_first_files(trained_on, run))
    return set(recorded.get("doc_ids") or ()), same


def _same_first_files(trained: list[dict[str, Any]], run: list[dict[str, Any]]) -> bool:
    """The files the model was trained on are the run's first files, by size and end bytes."""
    if len(trained) > len(run):
        return False
    return all(
        (t.get("bytes"), t.get("ends_sha256")) == (r.get("bytes"), r.get("ends_sha256"))
        for t, r in zip(trained, run, strict=False)
    )


def mapped(preds: pl.DataFrame, label_map: dict[str, str]) -> pl.DataFrame:
    """``preds`` with each label as the model's where ``label_map`` names it (others as they are)."""
    return preds.with_columns(pl.col("label").replace(label_map)) if label_map and preds.height else preds


def accuracy_html(manifest: Manifest, preds: pl.DataFrame, labelled: bool, label_map: dict[str, str]) -> str:
    """The section. ``preds``: labels mapped by ``label_map`` already; ``labelled``: the run read labels,
    so a missing matrix means none was scored. Where no accuracy can be given, one sentence says why."""
    labels, training = manifest.labels, manifest.model.get("training") or {}
    parts = ["<h2>Accuracy</h2>"]
    if training.get("shortened"):
        steps = f"{training.get('steps')} of {training.get('planned_steps')} steps"
        cut = f"<b>The model's training was cut short</b> at {steps} (max_train_seconds): it is not the job's"
        parts.append(muted(f"{cut} full schedule."))
    every = confusion(preds, labels) if not preds.is_empty() else None
    if every is None:
        why = "No labelled review was scored" if labelled else "The source had no labels"
        return "\n".join([*parts, muted(f"{why}: there is no accuracy to give.")])
    if not every["n_known"]:
        theirs = ", ".join(every["rows"][:12]) + (" ..." if len(every["rows"]) > 12 else "")
        said = "after the label map" if label_map else "as the source gives them"
        why = (
            f"There is no accuracy to give: none of the {every['n_unknown']} labelled reviews has a label the "
            f"model predicts (theirs {said}: {theirs}; the model's: {', '.join(labels)}). Map them with "
            f"--label-map, e.g. '1,2={labels[0]}; 4,5={labels[-1]}', in the job or for this report."
        )
        return "\n".join([*parts, muted(esc(why)), _matrix(every, label_map)])
    heldout = heldout_ids(manifest)
    if isinstance(heldout, str):
        note = f"over every labelled review; {heldout}"
        return "\n".join([*parts, _line("accuracy", every, note), _matrix(every, label_map)])
    ids, training_files = heldout
    held = preds.filter(pl.col("doc_id").is_in(list(ids)))
    rest = preds.filter(~pl.col("doc_id").is_in(list(ids)))
    conf, trained = confusion(held, labels), confusion(rest, labels)
    if conf is None or not conf["n_known"]:
        parts.append(muted("No labelled review the model was held out from is in this run."))
    else:
        note = "reviews held out from the model's training"
        parts += [_line("held-out accuracy", conf, note), _matrix(conf, label_map)]
    if trained is not None and trained["n_known"] and training_files:
        parts.append(_line("accuracy on training data", trained, "reviews the model was trained on"))
    elif trained is not None and trained["n_known"]:  # the run read other files: not all of them trained it
        note = "reviews not held out, of files besides those the model was trained on"
        parts.append(_line("accuracy on the other reviews", trained, note))
    return "\n".join(parts)


def _line(what: str, conf: dict[str, Any], note: str) -> str:
    note = f"{conf['n_known']} {note}"
    if conf["n_unknown"]:
        others = ", ".join(t for t in conf["rows"] if t not in conf["cols"])
        note += (
            f"; {conf['n_unknown']} with other labels ({others}) are in the matrix but not in the accuracy"
        )
    return f'<p>{esc(what)} <b>{conf["accuracy"]:.4f}</b> <span class="meta">({esc(note)})</span></p>'


def _matrix(conf: dict[str, Any], label_map: dict[str, str]) -> str:
    """The confusion counts; a mapped label's row names the source's labels it holds."""
    held: dict[str, list[str]] = {}
    for source, target in label_map.items():
        held.setdefault(target, []).append(source)
    header = ["true \\ predicted", *conf["cols"], "total"]
    rows = []
    for t in conf["rows"]:
        counts = [conf["counts"].get((t, p), 0) for p in conf["cols"]]
        rows.append([f"{t} ({', '.join(held[t])})" if t in held else t, *counts, sum(counts)])
    return data_table(header, rows, [False] + [True] * (len(header) - 1))
