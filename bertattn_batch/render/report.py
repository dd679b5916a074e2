"""One self-contained HTML page about a run (``bertattn report``, ``build_report``): what it did, its
accuracy, the tokens each head attends to, how far to believe that, and example reviews."""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import polars as pl

from .. import schema
from .._files import atomic_path, writing
from ..analysis import aggregate as agg
from ..analysis.aggregate import run_layer, top_tokens
from ..analysis.faithfulness import FRACTIONS, faithfulness_path
from ..analysis.provenance import derived_meta
from ..analysis.spelling import readable_map
from ..config import parse_label_map
from ..errors import SpecError, WriteError
from ..run import (
    REPORT_NAME,
    Manifest,
    committed_files,
    display_path,
    layer_name,
    on_local_copy,
    part_rows,
    read_manifest,
    status_now,
)
from .figures import png_bytes, top_heatmap
from .html import data_table, esc, img, muted, page
from .plot import load_reviews, review_png

#: What each measure says and where it stops (docs/measures.md has the references).
NOTES = {
    "weight": "where the head's [CLS] query looks (the seed's view); a head can look hard at a token whose "
    "value it barely passes on.",
    "weight_norm": "how much the token actually adds to the head's output (Kobayashi et al., 2020): weight "
    "times the length of its transformed value; still one layer, residual and feed-forward left out.",
    "value_zeroing": "how far the layer's [CLS] output moves when the token's values are removed (Mohebbi et "
    "al., 2023); one layer at a time, the attention held fixed.",
    "alti": "each token's share of the [CLS] representation after the last layer, every layer's attention "
    "block decomposed and rolled out (Ferrando et al., 2022; extract --contributions alti); a head whose "
    "ranking tracks it (Spearman) can be read as whole-model influence.",
    "log-odds z": "what a head attends to more in one label than the others, rare tokens held back (Monroe "
    "et al., 2008); a difference in where it looks, not a cause.",
    "comprehensiveness / sufficiency": "how much the predicted label's probability drops when the score's "
    "top tokens are deleted, and how much of it they keep alone (ERASER, DeYoung et al., 2020); deleting "
    "tokens makes inputs the model never saw, so read them against random deletion.",
}
#: Random deletion's comprehensiveness below which no ratio to it is shown: it moved nothing but noise.
MIN_RANDOM = 0.01
#: Contrast tokens shown per head and predicted label.
CONTRAST_TOKENS = 3
#: Heads named as tracking whole-model influence: the best by mean Spearman with ALTI, at least this.
TRACKING_HEADS, MIN_TRACKING = 3, 0.3


# -- the run ------------------------------------------------------------------------------------------
def _summary_html(manifest: Manifest, preds: pl.DataFrame) -> str:
    """The run's settings, counts over every committed part, the speed of the last run that read reviews."""
    model, last = manifest.model, manifest.last_run or {}
    ok = preds.filter(pl.col("status") == "ok")
    shape = f"{model.get('model_type')}, {model.get('num_layers')} layers x {model.get('num_heads')} heads"
    inputs = f"inputs of its last pass (pass {manifest.generation + 1})" if manifest.generation else "inputs"
    rows: list[tuple[str, Any]] = [
        ("status", manifest.status),
        (inputs, ", ".join(manifest.inputs)),
        ("model", f"{model.get('source')} ({shape})"),
        ("layers stored (0-based)", ", ".join(map(str, model.get("layers", [])))),
        ("device, dtype, attention", ", ".join(str(model.get(k)) for k in ("device", "dtype", "attention"))),
    ]
    if not preds.is_empty():
        rows += [
            ("prediction rows", preds.height),  # an unreadable row is recorded again each pass
            ("reviews scored", ok.height),
            ("tokens", int(ok["n_tokens"].sum())),
            ("truncated reviews", int(ok["truncated"].sum())),
        ]
    if last:
        seconds = last.get("seconds", {})
        reading = seconds.get("wall", 0) - seconds.get("train", 0)  # the time the throughput is of
        rows += [
            (f"{k} (last run that read reviews)", v)
            for k, v in (
                ("ended", last.get("ended_at")),
                ("reviews read", last.get("input_rows")),
                ("padding share", f"{last.get('padding_share', 0):.1%}"),
                ("throughput", f"{last.get('reviews_per_s', 0):.1f} reviews/s"),
                ("wall time", f"{reading:.1f} s (model {seconds.get('model', 0):.1f} s)"),
                ("training the model first", f"{seconds['train']:.1f} s" if "train" in seconds else None),
            )
        ]
    counts = manifest.counts or part_rows(manifest)  # counted when complete, else what its parts hold
    rows += [
        ("parts committed", len(manifest.parts)),
        ("rows per table", ", ".join(f"{k} {v}" for k, v in counts.items())),
        ("created", manifest.created_at),
    ]
    parts = ["<h2>Run</h2>", data_table(["", ""], [(k, v) for k, v in rows if v is not None])]
    if not preds.is_empty():
        statuses = preds.group_by("status").len().sort(["len", "status"], descending=[True, False]).rows()
        parts += ["<h3>Reviews by status</h3>", data_table(["status", "reviews"], statuses, [False, True])]
    if not ok.is_empty():
        by_pred = ok.group_by("pred_label").len().sort("pred_label").rows()
        parts += ["<h3>Predicted labels</h3>", data_table(["predicted", "reviews"], by_pred, [False, True])]
    return "\n".join(parts)


# -- accuracy: on held-out reviews apart from those that trained the model, where its training recorded which
#: What a source's label that a label map leaves out is called where the model has a label of its name.
NOT_MAPPED = "{} (not in the map)"


def mapped_labels(label: pl.Expr, mapping: dict[str, str], labels: list[str]) -> pl.Expr:
    """``label`` as the model's where ``mapping`` names it; one the map leaves out keeps its name, out of
    the accuracy even where the model has a label so named (then called :data:`NOT_MAPPED`)."""
    if not mapping:
        return label
    left_out = pl.when(label.is_in(labels)).then(pl.format(NOT_MAPPED, label)).otherwise(label)
    return label.replace_strict(mapping, default=left_out, return_dtype=pl.String)


def confusion(preds: pl.DataFrame, labels: list[str]) -> dict[str, Any] | None:
    """Accuracy over labelled reviews whose label the model knows, and the confusion counts: a row per true
    label seen (one the model cannot predict stays out of the accuracy), a column per model label."""
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
    """The doc ids the run's model was not trained on, and whether the run read just its training files
    (so its other reviews trained it); else why they are not known (row numbers name other reviews)."""
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
        return (
            "the model's folder was trained again since this run: "
            "which of them trained its model is not known"
        )
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
    return len(trained) <= len(run) and all(
        (t.get("bytes"), t.get("ends_sha256")) == (r.get("bytes"), r.get("ends_sha256"))
        for t, r in zip(trained, run, strict=False)
    )


def accuracy_html(manifest: Manifest, preds: pl.DataFrame, labelled: bool, label_map: dict[str, str]) -> str:
    """The section. ``preds``: labels mapped by ``label_map`` already; ``labelled``: the run read labels,
    so a missing matrix means none was scored. Where no accuracy can be given, one sentence says why."""
    labels, training = manifest.labels, manifest.model.get("training") or {}
    parts = ["<h2>Accuracy</h2>"]
    if training.get("shortened"):
        steps = f"{training.get('steps')} of {training.get('planned_steps')} steps"
        cut = f"<b>The model's training was cut short</b> at {steps} (max_train_seconds): it is not the job's"
        parts.append(muted(f"{cut} full schedule."))
    every = confusion(preds, labels)
    if every is None:
        why = "No labelled review was scored" if labelled else "The source had no labels"
        return "\n".join([*parts, muted(f"{why}: there is no accuracy to give.")])
    if not every["n_known"]:
        theirs = ", ".join(every["rows"][:12]) + (" ..." if len(every["rows"]) > 12 else "")
        said = "after the label map" if label_map else "as the source gives them"
        why = (
            f"There is no accuracy to give: none of the {every['n_unknown']} labelled reviews has a label "
            f"the model predicts (theirs {said}: {theirs}; the model's: {', '.join(labels)}). Map them with "
            f"--label-map, e.g. '1,2={labels[0]}; 4,5={labels[-1]}', in the job or for this report."
        )
        return "\n".join([*parts, muted(esc(why)), _matrix(every, label_map)])
    heldout = heldout_ids(manifest)
    if isinstance(heldout, str):
        note = f"over every labelled review; {heldout}"
        return "\n".join([*parts, _line("accuracy", every, note), _matrix(every, label_map)])
    ids, training_files = heldout
    held = pl.col("doc_id").is_in(list(ids))
    conf, trained = confusion(preds.filter(held), labels), confusion(preds.filter(~held), labels)
    if conf is None or not conf["n_known"]:
        parts.append(muted("No labelled review the model was held out from is in this run."))
    else:
        note = "reviews held out from the model's training"
        parts += [_line("held-out accuracy", conf, note), _matrix(conf, label_map)]
    if trained is not None and trained["n_known"] and training_files:
        parts.append(_line("accuracy on training data", trained, "reviews the model was trained on"))
    elif trained is not None and trained["n_known"]:  # the run read other files: not all of them trained it
        note = (
            "reviews not held out; the run read files besides those the model was trained on, so not all "
            "of them trained it"
        )
        parts.append(_line("accuracy on the other reviews", trained, note))
    return "\n".join(parts)


def _line(what: str, conf: dict[str, Any], note: str) -> str:
    note = f"{conf['n_known']} {note}"
    if conf["n_unknown"]:
        rest = ", ".join(t for t in conf["rows"] if t not in conf["cols"])
        note += f"; {conf['n_unknown']} with other labels ({rest}) are left out of the accuracy"
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


# -- top tokens ---------------------------------------------------------------------------------------
def _top_table_html(top: pl.DataFrame, measure: str = "mean_scaled", byte_level: bool | None = None) -> str:
    """A row per head: its top tokens, each with its ``measure``."""
    shown = agg.shown_terms(top, byte_level)
    cells: dict[int, list[str]] = {}
    for row in top.iter_rows(named=True):
        cells.setdefault(row["head"], []).append(f"{shown[row['token']]} ({row[measure]:.2f})")
    width = max(map(len, cells.values()))  # the longest list, not k: few tokens may pass the filter
    rows = [[h, *cells[h], *[""] * (width - len(cells[h]))] for h in sorted(cells)]
    return data_table(["head", *(f"#{i}" for i in range(1, width + 1))], rows, [True])


def _tokens_html(
    table: pl.DataFrame,
    meta: dict[str, Any],
    layer: int,
    k: int,
    scored: bool = True,
    byte_level: bool | None = None,
    num_layers: int | None = None,
) -> str:
    """Each head's tokens (and words): what it attends to more in one predicted label than the others,
    then its top ones by mean scaled weight over all reviews. ``scored``: some review was scored."""
    opts = meta.get("options", {})
    units = opts.get("units", ["token"])
    parts = [
        f"<h2>Top tokens per head · {layer_name(layer, num_layers)}</h2>",
        muted(
            f"From {agg.AGGREGATES_DIR}/{agg.TABLE}.parquet: "
            f"tokens seen in at least {opts.get('min_reviews')} "
            f"reviews{', words made by ' + esc(opts['words']) if opts.get('words') else ''}."
        ),
    ]
    contrasts = {u: top_tokens(table, k, u, "pred_label", [layer], measure="log_odds_z") for u in units}
    lead = contrasts[units[0]]
    if lead.height and lead["log_odds_z"].is_null().all():  # one predicted label
        label = esc(lead["class_label"][0])
        parts.append(muted(f"Every scored review is predicted {label}: no label to contrast."))
    elif lead.height:
        parts.append(
            "<h3>What each head attends to more in one predicted label than in the others</h3>"
            + muted(
                "Cells give the token and its z-score: the log-odds of the head's attention mass on it in "
                "this label against the others, with the run's own totals as an informative Dirichlet prior "
                "(Monroe, Colaresi &amp; Quinn 2008). A large z needs both a large ratio and much attention "
                "mass, so a token seen in a few reviews cannot top it by chance. "
                "It says where the head looks differently, not that the token moves the prediction."
            )
        )
        for unit, top in contrasts.items():
            for (cls,), group in top.group_by("class_label", maintain_order=True):
                parts += [
                    f"<h3>{unit.capitalize()}s, reviews predicted {esc(cls)} "
                    f"({group['class_reviews'][0]})</h3>",
                    _top_table_html(group, "log_odds_z", byte_level),
                ]
    parts.append(
        "<h3>Each head's top tokens over all reviews, by mean scaled weight</h3>"
        + muted("Cells give the token and its mean scaled weight; rare tokens rank high here by chance.")
    )
    for unit in units:
        top = top_tokens(table, k, unit, "all", [layer], measure="mean_scaled")
        if top.is_empty():
            why = "passes the filter" if scored else "was counted: no review of this run was scored"
            parts.append(muted(f"No {unit} {why}."))
            continue
        parts += [f"<h3>{unit.capitalize()}s, all reviews</h3>", _top_table_html(top, byte_level=byte_level)]
        if unit == "token":
            by_mean = agg.ranked(table, "mean_scaled")
            picture = png_bytes(top_heatmap(by_mean, layer, k, unit, byte_level), tight=False)
            caption = f"Heads x top {unit}s: mean scaled weight over all reviews"
            parts.append(img(picture, alt=f"heatmap of the top {unit}s per head", caption=caption))
    return "\n".join(parts)


# -- what to believe ----------------------------------------------------------------------------------
def head_contrasts(
    aggregates: pl.DataFrame, layers: list[int], byte_level: bool | None = None
) -> dict[tuple[int, int], str]:
    """(layer, head) -> "negative: 差 不 太 · positive: 好 不错 很": each predicted label's tokens with the
    highest log-odds z-score against the other labels."""
    top = top_tokens(aggregates, CONTRAST_TOKENS, "token", "pred_label", layers, measure="log_odds_z")
    top = top.filter(pl.col("log_odds_z").is_not_null())  # one predicted label: nothing to contrast
    shown = readable_map(top["token"].to_list(), byte_level)
    out: dict[tuple[int, int], list[str]] = {}
    for (layer, head, label), rows in top.group_by("layer", "head", "class_label", maintain_order=True):
        tokens = " ".join(shown[t] for t in rows.sort("rank")["token"])
        out.setdefault((layer, head), []).append(f"{label}: {tokens}")
    return {key: " · ".join(labels) for key, labels in out.items()}


def _faithfulness_html(
    table: pl.DataFrame, num_layers: int | None, contrasts: dict[tuple[int, int], str]
) -> list[str]:
    """Each layer's heads and the reference scores, most comprehensive first."""
    aopc = table.filter(pl.col("k").is_null())
    refs = aopc.filter(pl.col("layer").is_null())
    random = refs.filter(pl.col("score") == "random")
    base = random["comprehensiveness"][0] if random.height else None
    n = int(aopc["n_reviews"][0]) if aopc.height else 0
    out = [
        muted(
            f"From faithfulness/head_faithfulness.parquet: {n} reviews, the top "
            f"{', '.join(f'{k:.0%}' for k in FRACTIONS)} of each review's tokens deleted (means over those "
            "shares). A head's ranking is worth reading where its comprehensiveness is well above random's "
            "and its sufficiency below."
        )
    ]
    tracked = "alti_spearman" in aopc.columns and aopc["alti_spearman"].is_not_null().any()
    if tracked:  # which heads track whole-model influence: rank a review's tokens most as ALTI does
        heads = aopc.filter(pl.col("head").is_not_null() & pl.col("alti_spearman").is_not_null())
        best = heads.sort("alti_spearman", descending=True, maintain_order=True).head(TRACKING_HEADS)
        named = [
            f"{esc(layer_name(r['layer'], num_layers))} head {r['head']} "
            f"({r['score']}, {r['alti_spearman']:.2f})"
            for r in best.filter(pl.col("alti_spearman") >= MIN_TRACKING).iter_rows(named=True)
        ]
        alti = aopc.filter(pl.col("score") == "alti").rows(named=True)
        said = "".join(f"ALTI's own comprehensiveness is {a['comprehensiveness']:.3f}, sufficiency "
                       f"{a['sufficiency']:.3f}. " for a in alti[:1])  # fmt: skip
        verdict = (
            f"Heads that track whole-model influence (mean Spearman with ALTI): {', '.join(named)}."
            if named
            else "No head tracks whole-model influence: "
            "none ranks a review's tokens as ALTI does with a mean "
            f"Spearman of {MIN_TRACKING} or more; read the heads as where they look, not as influence."
        )
        out.append(f"<p>{said}{verdict}</p>")
    header = ["score", "head", "comprehensiveness", "vs random", "sufficiency",
              *(["tracks ALTI (Spearman)"] if tracked else []), "attends to more, by prediction"]  # fmt: skip
    for (layer,), rows in aopc.filter(pl.col("layer").is_not_null()).group_by("layer", maintain_order=True):
        body = [  # a reference score's row has no head: its cells left empty
            [
                r["score"],
                r["head"],
                r["comprehensiveness"],
                f"{r['comprehensiveness'] / base:.1f}x" if base is not None and base >= MIN_RANDOM else "",
                r["sufficiency"],
                *([r["alti_spearman"]] if tracked else []),
                contrasts.get((layer, r["head"]), ""),
            ]
            for r in pl.concat([rows, refs]).sort("comprehensiveness", descending=True).iter_rows(named=True)
        ]
        out += [
            f"<h3>Heads of {esc(layer_name(layer, num_layers))}, most faithful first</h3>",
            data_table(header, body, [False, True, True, True, True, *([True] if tracked else []), False]),
        ]
    return out


def _believe_html(run: Path, manifest: Manifest, aggregates: pl.DataFrame) -> str:
    """The run's faithfulness table, or the command that measures it; what each measure means."""
    command = f"<code>bertattn faithfulness {esc(display_path(run))}</code>"
    parts = ["<h2>What to believe</h2>"]
    path = faithfulness_path(run)
    meta = derived_meta(path) if path.is_file() else None
    if meta is None:
        what = "ranks every head by how much deleting its top tokens moves the prediction"
        parts.append(muted(f"No faithfulness measured yet: {command} {what}."))
    elif meta.get("run_id") != manifest.run_id:
        where = "faithfulness/head_faithfulness.parquet was measured on an earlier run in this folder"
        parts.append(muted(f"{where}: run {command} again."))
    else:
        if meta.get("parts") not in (None, sorted(p.name for p in manifest.parts)):
            when = "Measured before the run's latest parts were committed (an <code>--incremental</code> pass"
            leaves = f"its sample leaves their reviews out. Run {command} again to sample them all."
            parts.append(muted(f"{when} or a resume): {leaves}"))
        contrasts = head_contrasts(aggregates, manifest.layers, manifest.byte_level)
        parts += _faithfulness_html(pl.read_parquet(path), manifest.num_layers, contrasts)
    parts.append("<ul>" + "".join(f"<li><b>{esc(m)}</b>: {esc(t)}</li>" for m, t in NOTES.items()) + "</ul>")
    return "\n".join(parts)


# -- example reviews: misclassified where the label is one the model predicts and not the prediction
#: How the example reviews are chosen: the largest margins tie where label smoothing caps the
#: probabilities, and the shortest reviews say nothing of what a head reads.
RULE = (
    "reviews of a typical length (tokens between the 25th and 75th percentile of the run's), not "
    "misclassified (correctly predicted first), whose margin between the two most probable labels is "
    "nearest the median margin of their predicted label; ties by the length nearest the median"
)
#: How the misclassified reviews are chosen: the model's confident mistakes.
MISTAKES = (
    "misclassified reviews of a typical length, largest margin between the two most probable labels "
    "first; ties by the length nearest the median"
)


class Example(NamedTuple):
    doc_id: str
    pred_label: str
    label: str | None
    margin: float
    misclassified: bool  # the label is one the model predicts, and not the prediction


def _typical(preds: pl.DataFrame, labels: list[str]) -> pl.DataFrame:
    """Scored reviews of typical length with their margin (``labels``: the model's)."""
    ok = preds.filter(pl.col("status") == "ok")
    lo, mid, hi = (ok["n_tokens"].quantile(q, "nearest") for q in (0.25, 0.5, 0.75))
    top2 = pl.col("probs").list.sort(descending=True)
    return ok.filter(pl.col("n_tokens").is_between(lo, hi)).with_columns(
        margin=(top2.list.get(0) - top2.list.get(1, null_on_oob=True).fill_null(0.0)).cast(pl.Float64),
        off_median=(pl.col("n_tokens") - mid).abs(),
        misclassified=pl.col("label").is_in(labels).fill_null(False)
        & (pl.col("label") != pl.col("pred_label")),
    )


def _examples(rows: pl.DataFrame) -> list[Example]:
    return [Example(*r) for r in rows.select(*Example._fields).rows()]


def pick(preds: pl.DataFrame, per_label: int, labels: list[str]) -> list[Example]:
    """``per_label`` examples of each predicted label by :data:`RULE`, labels in order."""
    rows = _typical(preds, labels).filter(~pl.col("misclassified"))
    off = (pl.col("margin") - pl.col("margin").median().over("pred_label")).abs()
    unknown = (pl.col("label") != pl.col("pred_label")).fill_null(True)  # the label is not the model's
    ranked = rows.with_columns(off_typical=off, unknown=unknown)
    ranked = ranked.sort(["unknown", "off_typical", "off_median", "doc_id"])
    return _examples(ranked.group_by("pred_label", maintain_order=True).head(per_label).sort("pred_label"))


def misclassified(preds: pl.DataFrame, k: int, labels: list[str]) -> list[Example]:
    """The ``k`` misclassified reviews by :data:`MISTAKES`."""
    rows = _typical(preds, labels).filter(pl.col("misclassified"))
    ranked = rows.sort(["margin", "off_median", "doc_id"], descending=[True, False, False])
    return _examples(ranked.head(k))


def _why_no_mistakes(preds: pl.DataFrame, labels: list[str]) -> str:
    ok = preds.filter(pl.col("status") == "ok")
    if ok["label"].is_null().all():
        return "The reviews have no labels: none can be called misclassified."
    if not ok["label"].is_in(labels).any():
        return "No review's label is one the model predicts (see Accuracy): none can be called misclassified."
    return "No review of a typical length is misclassified."


def examples_html(run: Path, preds: pl.DataFrame, layer: int, k: int, labels: list[str]) -> str:
    """``k`` reviews per predicted label by :data:`RULE`, ``k`` mistakes by :data:`MISTAKES`, or why none."""
    typical, mistakes = pick(preds, k, labels), misclassified(preds, k, labels)
    no_mistakes = "" if mistakes else _why_no_mistakes(preds, labels)
    sections = [
        ("Example reviews", RULE, typical, "Every scored review of a typical length is misclassified."),
        ("Most confidently misclassified reviews", MISTAKES, mistakes, no_mistakes),
    ]
    chosen = [e.doc_id for e in typical + mistakes]
    loaded = iter(load_reviews(run, chosen, layer) if chosen else [])
    parts, label = [], None
    for title, rule, picks, none in sections:
        parts += [f"<h2>{title}</h2>", muted(f"Chosen as {esc(rule)}." if picks else esc(none))]
        for example in picks:
            review = next(loaded)
            if not example.misclassified and example.pred_label != label:  # the examples, by label
                parts.append(f"<h3>Predicted {esc(example.pred_label)}</h3>")
                label = example.pred_label
            if example.label != review.label:  # a label the label map gives as the model's
                review.label = f"{review.label} → {example.label}"
            mark = " · misclassified" if example.misclassified else ""
            caption = f"{review.title()} · margin {example.margin:.3f}{mark}"
            alt = f"heads x tokens heatmap of {review.title()}"
            text = muted(esc(review.text)) if review.text else ""
            parts += [text, img(review_png(review, dpi=110), alt, caption)]
    return "\n".join(parts)


# -- the page -----------------------------------------------------------------------------------------
def _aggregates(run: Path, min_reviews: int | None) -> tuple[pl.DataFrame, dict[str, Any]]:
    """The run's aggregates, computed again when out of date with the options they were made with, so a
    report never swaps the table a user made for another; beside the report where the run is read-only."""
    path = agg.aggregates_path(run)
    made = derived_meta(path).get("options", {}) if path.is_file() else {}
    min_reviews = min_reviews if min_reviews is not None else made.get("min_reviews", agg.MIN_REVIEWS)
    if agg.is_current(run, min_reviews):
        return agg.read_aggregates(run)
    options = dict(
        min_reviews=min_reviews,
        rank_by=made.get("rank_by", agg.RANK_BY),
        units=made.get("units", agg.UNITS),
        words=made.get("words") or ("none" if "words" in made else None),
    )
    try:
        result = agg.aggregate(run, **options)
    except WriteError:
        with tempfile.TemporaryDirectory(prefix="bertattn-aggregates-") as scratch:
            result = agg.aggregate(run, **options, into=scratch)
    return result.table, {"options": result.options, "parts": result.parts}


@on_local_copy(write_back=True)
def build_report(
    run_dir: str | Path,
    out: str | Path | None = None,
    layer: int | None = None,
    examples: int = 3,
    top_k: int = 8,
    min_reviews: int | None = None,
    label_map: str | None = None,
) -> Path:
    """Write the run's report page (default ``RUN/report.html``), computing aggregates first where missing
    or out of date; ``label_map``: the source's labels as the model's (None: the run's job's)."""
    t0 = time.perf_counter()
    if examples < 0 or top_k < 1:
        raise SpecError(
            f"--examples must not be negative and --top-k must be at least 1; got {examples}, {top_k}"
        )
    if out is not None and Path(out).suffix.lower() not in (".html", ".htm"):
        raise SpecError(f"the report is an HTML page; name it .html, not {Path(out).name}")
    run = Path(run_dir)
    manifest = read_manifest(run)
    manifest.status = status_now(run, manifest.status)  # as the page says it
    idx = run_layer(manifest, layer)
    table, meta = _aggregates(run, min_reviews)
    files = [p.files["predictions"] for p in committed_files(run, ("predictions",), verify=True)]
    columns = ["doc_id", "status", "label", "pred_id", "pred_label", "probs", "n_tokens", "truncated"]
    none = pl.from_arrow(schema.arrow("predictions").empty_table()).lazy()  # a run without parts
    preds = (pl.scan_parquet(files, glob=False) if files else none).select(columns).collect()
    scored = (preds["status"] == "ok").any()
    labelled = bool(manifest.spec.get("label_col")) or preds["label"].is_not_null().any()
    labels = manifest.labels
    mapping = parse_label_map(manifest.spec.get("label_map") if label_map is None else label_map, labels)
    preds = preds.with_columns(label=mapped_labels(pl.col("label"), mapping, labels))
    body = [
        _summary_html(manifest, preds),
        accuracy_html(manifest, preds, labelled, mapping),
        _tokens_html(table, meta, idx, top_k, scored, manifest.byte_level, manifest.num_layers),
        _believe_html(run, manifest, table),
        examples_html(run, preds, idx, examples, labels) if examples > 0 and scored else "",
        muted(
            f"Written {time.strftime('%Y-%m-%d %H:%M')} by bertattn report "
            f"in {time.perf_counter() - t0:.1f}s."
        ),
    ]
    path = Path(out) if out is not None else run / REPORT_NAME
    name = display_path(run.resolve()).rstrip("/").rsplit("/", 1)[-1]
    with writing(path), atomic_path(path, unique=True) as tmp:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(page(f"bertattn run: {name}", "\n".join(body)), encoding="utf-8")
    return path
