"""Faithfulness per head (ERASER: DeYoung et al., ACL 2020): on a seeded, stratified sample of scored
reviews, does deleting the content tokens a head (or random, gradient × input, ALTI) ranks highest move
the prediction (comprehensiveness, sufficiency; k null: means over k)? docs/measures.md has the method."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from .. import schema
from .._files import check_writable
from .._terminal import bar_size
from ..errors import RunDirError, SpecError
from ..extract.batching import bucket_batches
from ..model import Classifier, with_special_tokens
from ..run import (
    FAITHFULNESS_DIR,
    committed_files,
    display_path,
    layer_name,
    on_local_copy,
    read_manifest,
    scan_parts,
    status_now,
)
from .provenance import load_run_model, write_derived

log = logging.getLogger(__name__)

TABLE = "head_faithfulness"
#: Shares of a review's content tokens deleted (ERASER's bins: 1, 5, 10, 20 and 50%).
FRACTIONS = (0.01, 0.05, 0.10, 0.20, 0.50)
SAMPLE = 200
HEAD_SCORES = ("weight", "weight_norm", "value_zeroing")
#: Of those, the scores of a whole layer (head null in the table).
LAYER_SCORES = ("value_zeroing",)
REFERENCES = ("gradient_x_input", "random", "alti")
#: Padded tokens per model batch, and reviews per batch at most, of the reruns.
BATCH_TOKENS = 16384
MAX_BATCH_SIZE = 256


@dataclass
class Faithfulness:
    """What ``faithfulness`` wrote: the table and how it was made."""

    path: Path
    table: pl.DataFrame
    options: dict[str, Any]
    num_layers: int | None
    seconds: float

    def summary(self) -> str:
        """Per layer: each score's AOPC, best comprehensiveness first, the references among them."""
        aopc = self.table.filter(pl.col("k").is_null())
        refs = aopc.filter(pl.col("layer").is_null())
        heads = aopc.filter(pl.col("layer").is_not_null())
        ks = ", ".join(f"{k:.0%}" for k in FRACTIONS)
        blocks = []
        for (layer,), rows in heads.group_by("layer", maintain_order=True):
            lines = [
                f"{layer_name(layer, self.num_layers)} · {self.options.get('n_reviews')} reviews · mean over "
                f"k = {ks} (AOPC); comprehensiveness: higher is more faithful, sufficiency: lower",
                f"{'score':<18}{'head':>5}{'comprehensiveness':>19}{'sufficiency':>13}",
            ]
            ranked = pl.concat([rows, refs]).sort("comprehensiveness", descending=True)
            cells = ranked.select("score", "head", "comprehensiveness", "sufficiency").rows()
            lines += [f"{s:<18}{'-' if h is None else h:>5}{c:>19.3f}{u:>13.3f}" for s, h, c, u in cells]
            blocks.append("\n".join(lines))
        return "\n\n".join(blocks) + f"\nwrote {display_path(self.path)} in {self.seconds:.1f}s"


def faithfulness_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / FAITHFULNESS_DIR / f"{TABLE}.parquet"


@on_local_copy(write_back=True)
def faithfulness(
    run_dir: str | Path,
    sample: int = SAMPLE,
    seed: int = 0,
    device: str = "auto",
    progress: bool = False,
    model: str | None = None,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
) -> Faithfulness:
    """Measure every captured head's faithfulness on a sample of the run; write and return the table.
    ``model``: where the run's model is now, if moved; trust in its code is the caller's, not the run's."""
    t0 = time.perf_counter()
    if sample < 1:
        raise SpecError(f"--sample must be at least 1, got {sample}")
    if not 0 <= seed < 2**32:  # numpy's generators take no negative seed
        raise SpecError(f"--seed must be in [0, 2**32), got {seed}")
    run = Path(run_dir)
    manifest = read_manifest(run)
    if (status := status_now(run, manifest.status)) != "complete":
        log.warning("%s is %s: its committed parts alone are sampled", run, status)
    files = [p.files["predictions"] for p in committed_files(run, ("predictions",), verify=True)]
    columns = ["doc_id", "pred_id", "pred_label", "n_tokens"]
    preds = scan_parts(files).filter(pl.col("status") == "ok").select(columns).collect() if files else None
    if preds is None or preds.is_empty():
        raise RunDirError(f"{run} has no scored reviews to measure")
    path = faithfulness_path(run)
    check_writable(path.parent, "the faithfulness table")  # before minutes of measuring
    chosen = stratified_sample(preds, sample, seed)
    spec, info = manifest.spec, manifest.model  # the run's model, with the run's layers and length
    clf = load_run_model(manifest, model, lambda at: Classifier.load(
        at, layers=info.get("layers") or spec.get("layers", [-2]), device=device,
        dtype=spec.get("dtype", "auto"), max_length=info.get("max_length") or spec.get("max_length"),
        trust_remote_code=trust_remote_code, allow_pickle=allow_pickle,
    ))  # fmt: skip
    doc_ids = chosen["doc_id"].to_list()
    content = [n - 2 for n in chosen["n_tokens"].to_list()]
    ids = with_special_tokens(clf.tokenizer, content_values(run, "tokens", "token_id", doc_ids, content))
    pred = chosen["pred_id"].to_numpy()
    scores = head_scores(run, doc_ids, bool(manifest.spec.get("value_zeroing")))
    scores.update(reference_scores(clf, ids, pred, seed))
    if manifest.spec.get("contributions") == "alti":
        alti = content_values(run, "contributions", "alti", doc_ids, content)
        scores[("alti", None, None)] = [x.astype(np.float64) for x in alti]
    rows = erasure_table(clf, ids, pred, scores, progress)
    table = schema.cast(pl.DataFrame(rows).to_arrow(), TABLE) if rows else schema.arrow(TABLE).empty_table()
    options = {"sample": sample, "seed": seed, "n_reviews": len(ids), "fractions": list(FRACTIONS)}
    # the parts it sampled from: a later --incremental pass adds reviews it has not seen
    meta = {"doc_ids": json.dumps(doc_ids), "parts": json.dumps(sorted(p.name for p in manifest.parts))}
    write_derived(path, table, TABLE, options, manifest.job_sha256, run_id=manifest.run_id, **meta)
    return Faithfulness(path, pl.from_arrow(table), options, manifest.num_layers, time.perf_counter() - t0)


def stratified_sample(preds: pl.DataFrame, n: int, seed: int) -> pl.DataFrame:
    """``n`` reviews, each predicted label in proportion (largest remainders; each at least one where ``n``
    allows), drawn with ``seed`` in doc_id order, so the sample does not depend on how parts are cut."""
    preds = preds.sort("doc_id")
    if n >= preds.height:
        return preds
    groups = {label: frame for (label,), frame in preds.group_by("pred_label", maintain_order=True)}
    labels = sorted(groups, key=str)
    quota = {lab: n * groups[lab].height / preds.height for lab in labels}
    take = {lab: max(1 if n >= len(labels) else 0, math.floor(q)) for lab, q in quota.items()}
    for lab in sorted(labels, key=lambda lab: quota[lab] - math.floor(quota[lab]), reverse=True):
        if sum(take.values()) >= n:
            break
        take[lab] += 1
    while sum(take.values()) > n:  # the at-least-one rule overshot: take back from the largest
        take[max(take, key=take.get)] -= 1
    rng = np.random.default_rng(seed)
    parts = [groups[lab][np.sort(rng.choice(groups[lab].height, take[lab], replace=False))] for lab in labels]
    return pl.concat(parts).sort("doc_id")


def head_scores(
    run: Path, doc_ids: list[str], with_zeroing: bool
) -> dict[tuple[str, int | None, int | None], list]:
    """{(score, layer, head): [each review's (m,) content-token scores]} from the run's cls_attention."""
    names = [s for s in HEAD_SCORES if s != "value_zeroing" or with_zeroing]
    rows = _rows_of(run, "cls_attention", doc_ids, ["layer", "head", "position"], names)
    out: dict[tuple[str, int | None, int | None], list] = {}
    for (review, layer, head), group in rows.group_by("review", "layer", "head", maintain_order=True):
        for name in names:
            # value zeroing is one value per (layer, token), the same in every head's rows: one ranking
            key = (name, layer, None if name in LAYER_SCORES else head)
            slot = out.setdefault(key, [None] * len(doc_ids))
            slot[review] = group[name].to_numpy().astype(np.float64)
    for key, per_review in out.items():
        if any(x is None for x in per_review):
            raise RunDirError(f"{run}: cls_attention lacks {key[0]} rows of layer {key[1]}")
    return out


def mean_spearman(a: list[np.ndarray], b: list[np.ndarray]) -> float | None:
    """The mean over reviews of the Spearman correlation of ``a`` and ``b`` (ties ranked by their mean
    rank); a review with fewer than two tokens, or constant scores, has none. None: no review had one."""
    rho = pl.corr("x", "y", method="spearman")
    rhos = [pl.DataFrame({"x": x, "y": y}).select(rho).item() for x, y in zip(a, b, strict=True)]
    rhos = [r for r in rhos if r is not None and not math.isnan(r)]
    return float(np.mean(rhos)) if rhos else None


def content_values(run: Path, table: str, column: str, doc_ids: list[str], content: list[int]) -> list:
    """Each review's ``column`` of its content tokens (positions 1 to ``content[i]``) from the run's
    ``table``: the token ids the run scored (what is erased is what was scored), or its ALTI values."""
    rows = _rows_of(run, table, doc_ids, ["position"], [column])
    out: list[np.ndarray | None] = [None] * len(doc_ids)
    for (review,), group in rows.group_by("review", maintain_order=True):
        if np.array_equal(group["position"].to_numpy(), np.arange(1, content[review] + 1)):
            out[review] = group[column].to_numpy()
    for i, values in enumerate(out):
        if values is None:
            raise RunDirError(f"{run}: the {table} table does not hold positions 1 to {content[i]} of review "
                              f"{doc_ids[i]!r} (its content tokens in predictions)")  # fmt: skip
    return out


def _rows_of(run: Path, table: str, doc_ids: list[str], order: list[str], values: list[str]) -> pl.DataFrame:
    """The rows of ``table`` of the reviews ``doc_ids``, each named by its place in them (``review``: a
    doc_id on every row would take memory in proportion to its length), sorted by review and ``order``."""
    files = [p.files[table] for p in committed_files(run, (table,), verify=True)]
    places = pl.LazyFrame({"doc_id": doc_ids, "review": range(len(doc_ids))})
    rows = pl.scan_parquet(files, glob=False).join(places, on="doc_id").select("review", *order, *values)
    return rows.sort("review", *order).collect(engine="streaming")


def reference_scores(clf: Classifier, ids: list[np.ndarray], pred: np.ndarray, seed: int) -> dict:
    """The two rankings that depend on no head: gradient × input, and random (seeded)."""
    grads: list[np.ndarray | None] = [None] * len(ids)
    for batch in bucket_batches([len(x) for x in ids], BATCH_TOKENS, MAX_BATCH_SIZE):
        g = clf.gradient_x_input([ids[i] for i in batch], pred[batch])
        for row, i in enumerate(batch):
            grads[i] = g[row, 1 : len(ids[i]) - 1].astype(np.float64)
    rng = np.random.default_rng(seed)
    shuffled = [rng.random(len(x) - 2) for x in ids]
    return {("gradient_x_input", None, None): grads, ("random", None, None): shuffled}


def top_tokens(scores: np.ndarray, k: float) -> np.ndarray:
    """Indices (into the content tokens) of the ⌈k·m⌉ best, highest score first, ties by position."""
    m = len(scores)
    order = np.lexsort((np.arange(m), -scores))
    return order[: math.ceil(k * m)]


def erased(ids: np.ndarray, top: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the review without the ``top`` content tokens, those alone), [CLS] and [SEP] kept, in order."""
    content = ids[1:-1]
    chosen = np.zeros(len(content), dtype=bool)
    chosen[top] = True
    return tuple(np.concatenate([ids[:1], content[keep], ids[-1:]]) for keep in (~chosen, chosen))


def erasure_table(
    clf: Classifier, ids: list[np.ndarray], pred: np.ndarray, scores: dict, progress: bool = False
) -> list[dict[str, Any]]:
    """The table's rows: per (score, layer, head, k) the means over reviews, and their means over k."""
    sequences: dict[bytes, int] = {}  # every distinct input, run once

    def index(seq: np.ndarray) -> int:
        return sequences.setdefault(seq.astype(np.int64).tobytes(), len(sequences))

    full = [index(x) for x in ids]
    plan = {  # (score, layer, head) -> (reviews, k, 2) sequence indices
        key: np.array([[[index(s) for s in erased(x, top_tokens(sc, k))] for k in FRACTIONS]
                       for x, sc in zip(ids, per_review, strict=True)])
        for key, per_review in scores.items()
    }  # fmt: skip
    alti = scores.get(("alti", None, None))
    tracks = {key: mean_spearman(sc, alti) if alti is not None and key[0] != "alti" else None
              for key, sc in scores.items()}  # fmt: skip
    probs = _probabilities(clf, [np.frombuffer(s, dtype=np.int64) for s in sequences], progress)
    p_full = probs[full, pred]  # (reviews,)
    rows = []
    for (name, layer, head), where in plan.items():
        p = probs[where, pred[:, None, None]]  # (reviews, k, 2): without, alone
        comp, suff = p_full[:, None] - p[..., 0], p_full[:, None] - p[..., 1]
        for j, k in enumerate([*FRACTIONS, None]):
            c, s = (x.mean(axis=1) if k is None else x[:, j] for x in (comp, suff))
            rows.append(dict(layer=layer, head=head, score=name, k=k, comprehensiveness=float(c.mean()),
                             sufficiency=float(s.mean()), alti_spearman=tracks[(name, layer, head)],
                             n_reviews=len(ids)))  # fmt: skip
    return rows


def _probabilities(clf: Classifier, sequences: Sequence[np.ndarray], progress: bool) -> np.ndarray:
    """p (N, C) of every sequence, in length-bucketed batches."""
    from tqdm.auto import tqdm

    out = np.empty((len(sequences), len(clf.labels)), dtype=np.float64)
    lengths = [len(s) for s in sequences]
    with tqdm(total=len(sequences), desc="faithfulness", unit="input", disable=not progress, leave=False,
              **bar_size()) as bar:  # fmt: skip
        for batch in bucket_batches(lengths, BATCH_TOKENS, MAX_BATCH_SIZE):
            out[batch] = clf.probabilities([sequences[i] for i in batch])
            bar.update(len(batch))
    return out
