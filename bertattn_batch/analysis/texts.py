"""Reviews' texts for what reads a finished run: as the run stored them, or (a run made with
--no-store-text) read again from its inputs, in one pass over them."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ..errors import InputError
from ..run import committed_files, read_manifest, scan_parts


def scored_predictions(run_dir: str | Path, columns: list[str], verify: bool = False) -> pl.DataFrame:
    """The committed predictions of scored reviews (``status == 'ok'``), in ``columns`` (``verify``:
    every page's checksum checked first, for a reader of whole runs)."""
    files = [p.files["predictions"] for p in committed_files(run_dir, ("predictions",), verify)]
    if not files:
        return pl.DataFrame()
    return scan_parts(files).filter(pl.col("status") == "ok").select(columns).collect()


def review_texts(run_dir: str | Path, reviews: pl.DataFrame) -> list[str]:
    """The texts of ``reviews`` (columns doc_id, row_index, text), in their order: the stored text, else
    the input row of that row_index (its doc_id checked)."""
    texts = reviews["text"].to_list()
    missing = {int(r): i for i, r in enumerate(reviews["row_index"]) if texts[i] is None}
    if missing:
        from ..inputs import STDIN, read_once, read_rows

        manifest = read_manifest(run_dir)
        streams = [s for s in manifest.inputs if read_once(s)]
        if streams:
            where = "standard input" if streams[0] == STDIN else streams[0]
            raise InputError(
                f"this run read its reviews from {where}, which cannot be read again, and stored no text "
                "(--no-store-text); rerun the extract from a file, or without --no-store-text"
            )
        ids = reviews["doc_id"].to_list()
        last = max(missing)
        try:
            for batch in read_rows(manifest.inputs, **manifest.read_options()):
                for row, doc_id, text in zip(batch.row_index, batch.doc_id, batch.text, strict=True):
                    i = missing.get(row)
                    if i is not None and doc_id == ids[i] and text is not None:
                        texts[i] = text
                if batch.row_index and batch.row_index[-1] >= last:
                    break
        except InputError as e:
            raise InputError(f"cannot read the run's input again ({e})") from None
        lost = [ids[i] for i in missing.values() if texts[i] is None]
        if lost:
            raise InputError(
                f"{len(lost)} reviews (first {lost[0]!r}) were not found in the run's inputs as they were read"
            )
    return texts
