"""The span check: every token's character span lies within its review's text, read again from the inputs
(or, for a run that read a stream, the texts it stored)."""

from __future__ import annotations

import polars as pl

from ...errors import BertAttnError
from ...inputs import read_once, read_rows
from ...run import Manifest
from .layout import Part, RunView
from .report import KEPT, Recorder


def _span_ends(run: RunView, part: Part, *more: pl.Expr) -> pl.DataFrame:
    """doc_id, its largest span end and row_index (and ``more`` of its predictions row) for the scored
    reviews of one part."""
    return (
        pl.scan_parquet(run.file(part, "tokens"), glob=False)
        .group_by("doc_id")
        .agg(end=pl.col("end").max())
        .join(
            pl.scan_parquet(run.file(part, "predictions"), glob=False)
            .filter(pl.col("status") == "ok")
            .select("doc_id", "row_index", *more),
            on="doc_id",
            how="inner",
        )
        .collect(engine="streaming")
    )


def _ends_by_row(run: RunView, part: Part) -> dict[int, tuple[str, int]]:
    """row_index -> (doc_id, largest span end) for the scored reviews of one part."""
    ends = _span_ends(run, part)
    return {r: (d, e) for d, e, r in ends.select("doc_id", "end", "row_index").iter_rows()}


def _check_stored_spans(rec: Recorder, run: RunView) -> bool:
    """Span ends against the texts the run stored, for a run that read a stream; False where it stored
    none (``--no-store-text``), so that nothing could be checked."""
    checked = 0
    for part in (p for p in run.parts if p.readable >= {"predictions", "tokens"}):
        ends = _span_ends(run, part, pl.col("text").str.len_chars().alias("length"))
        if ends["length"].null_count():
            return False
        checked += ends.height
        past = ends.filter(pl.col("end") > pl.col("length")).select("doc_id", "row_index", "end", "length")
        for doc_id, row, end, length in past.head(KEPT).iter_rows():
            rec.fail(
                "spans",
                f"{part.rel['tokens']} doc {doc_id!r} (row {row}): a token span ends at {end}, past the "
                f"stored text's length {length}",
            )
    rec.note("spans", f"{checked} reviews checked against the texts the run stored (it read a stream)")
    return True


def check_source_spans(rec: Recorder, run: RunView) -> None:
    """Stream the inputs once, beside the parts in row order, and compare span ends to text lengths."""
    try:
        manifest = Manifest.from_dict({**run.manifest, "parts": []})
    except BertAttnError as e:  # the manifest check names what is wrong with it
        rec.skip("spans", f"the manifest cannot say which inputs were read ({e})")
        return
    inputs = manifest.inputs
    streams = [p for p in inputs if read_once(p)]
    if streams:
        if not _check_stored_spans(rec, run):
            rec.skip("spans", f"the run read {', '.join(streams)}: a stream, which cannot be read again")
        return
    if not inputs:
        rec.skip("spans", "the manifest names no inputs: end <= text length not checked")
        return
    pending = sorted(
        (p for p in run.parts if p.readable >= {"predictions", "tokens"}),
        key=lambda p: (p.start_row, p.generation),
    )
    current = manifest.generation or 0  # an earlier pass's rows may be another file's by now
    active: list[tuple[Part, dict[int, tuple[str, int]]]] = []
    checked = changed = replaced = 0
    try:
        for block in read_rows(manifest.read_options()):  # no limit: a resume may have raised it
            if not pending and not active:
                break  # every part is checked: the rest of the inputs holds no reviews of the run
            hi = block.row_index[-1] + 1
            while pending and pending[0].start_row < hi:
                part = pending.pop(0)
                active.append((part, _ends_by_row(run, part)))
            for j, row in enumerate(block.row_index):
                for part, ends in active:
                    hit = ends.pop(row, None)
                    if hit is None:
                        continue
                    doc_id, end = hit
                    text = block.text[j]
                    if block.doc_id[j] != doc_id or text is None:
                        if part.generation < current:
                            replaced += 1
                            continue
                        changed += 1
                        if changed <= KEPT:
                            rec.warn(
                                "spans", f"input row {row} is now {block.doc_id[j]!r}, the run has {doc_id!r}"
                            )
                        continue
                    if end > len(text) and part.generation < current:
                        replaced += 1  # edited since: a pass by id kept its first scoring, as documented
                        continue
                    checked += 1
                    if end > len(text):
                        rec.fail(
                            "spans",
                            f"{part.rel['tokens']} doc {doc_id!r} (row {row}): a token span ends at "
                            f"{end}, past the text's length {len(text)}",
                        )
            active = [(p, e) for p, e in active if p.end_row > hi or e]
    except BertAttnError as e:
        rec.skip("spans", f"inputs not readable here ({e}); end <= text length not checked")
        if checked:
            rec.note("spans", f"{checked} reviews checked before that")
        return
    left = sum(len(e) for _, e in active) + sum(len(_ends_by_row(run, p)) for p in pending)
    if left:
        rec.warn("spans", f"the inputs end before {left} scored reviews of the run; those were not checked")
    if changed > KEPT:
        rec.checks["spans"].warnings += changed - KEPT
    if replaced:
        rec.note(
            "spans",
            f"{replaced} reviews of earlier --incremental passes not checked: their input rows now hold "
            "other reviews or other texts (the inputs were replaced, reordered or edited since)",
        )
    rec.note("spans", f"{checked} reviews checked against {', '.join(map(str, inputs))}")
