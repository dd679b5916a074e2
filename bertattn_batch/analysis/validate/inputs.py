"""The checks that read the run's inputs again, in one pass: every input row has its predictions row with
the id, label and text the inputs give it, and the run no review they lack (``inputs``); every token's
span lies within its review's text (``spans``; of a run that read a stream, the texts it stored)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import polars as pl

from ... import schema
from ...errors import BertAttnError, InputError
from ...ids import IdSet
from ...inputs import RowBatch, RowDigests, check_inputs, read_once, read_sources, rows_digest, source_files
from ...run import Manifest, input_changes
from .files import Part, RunView
from .report import KEPT, ValidationReport


def check_inputs_and_spans(rec: ValidationReport, run: RunView) -> None:
    """Read the inputs once, as the run read them, feeding both checks."""
    try:
        manifest = Manifest.from_dict({**run.manifest, "parts": []})
    except BertAttnError as e:  # the manifest check names what is wrong with it
        for check in ("inputs", "spans"):
            rec.skip(check, f"the manifest cannot say which inputs were read ({e})")
        return
    inputs = manifest.inputs
    if not inputs or (streams := [p for p in inputs if read_once(p)]):
        rec.skip("inputs", "the run read a stream (or names no inputs), which cannot be read again")
        if not inputs:
            rec.skip("spans", "the manifest names no inputs: end <= text length not checked")
        elif not _check_stored_spans(rec, run):
            rec.skip("spans", f"the run read {', '.join(streams)}: a stream, which cannot be read again")
        return
    # no limit (none recorded): spans of a pass whose limit a resume raised lie past the last pass's
    read_as = dataclasses.replace(manifest.read_options(), label_col=manifest.spec.get("label_col"))
    coverage, spans = _Coverage(rec, run, manifest), _Spans(rec, run, manifest.generation or 0)
    sources = None
    try:
        sources = check_inputs(read_as)
        if manifest.sources is not None:
            for change in input_changes(manifest.sources, source_files(sources))[:3]:
                rec.warn("inputs", f"the inputs changed since the run read them: {change}")
        for block in read_sources(sources, read_as):
            if coverage.done and spans.ends.done:
                break
            coverage.feed(block)
            spans.feed(block)
    except BertAttnError as e:
        if sources is not None and isinstance(e, InputError):  # found, but rows no job reads: damaged
            rec.fail("inputs", f"{e}; the run cannot hold these inputs' rows")
        else:
            rec.skip("inputs", f"inputs not readable here ({e}); not checked")
        rec.skip("spans", f"inputs not readable here ({e}); end <= text length not checked")
        if spans.checked:
            rec.note("spans", f"{spans.checked} reviews checked before that")
        return
    coverage.finish()
    spans.finish(inputs)


class _ByRow:
    """What ``load`` reads of each part, by input row, for the inputs fed in row order: a part is read when
    the inputs reach its first row and let go once they have passed it, so one part at a time is held."""

    def __init__(self, parts: list[Part], load: Callable[[Part], dict[int, Any]]) -> None:
        self.pending = sorted(parts, key=lambda p: (p.start_row, p.generation))
        self.load = load
        self.active: list[tuple[Part, dict[int, Any]]] = []

    @property
    def done(self) -> bool:
        return not self.pending and not self.active

    def hits(self, block: RowBatch) -> Iterator[tuple[int, Part, Any]]:
        """(position in ``block``, part, what it holds of that row) for each row of ``block`` a part holds."""
        if self.done or not len(block):
            return
        hi = block.row_index[-1] + 1
        while self.pending and self.pending[0].start_row < hi:
            part = self.pending.pop(0)
            self.active.append((part, self.load(part)))
        for j, row in enumerate(block.row_index):
            for part, held in self.active:
                if (hit := held.pop(row, None)) is not None:
                    yield j, part, hit
        self.active = [(p, held) for p, held in self.active if p.end_row > hi or held]

    def left(self) -> int:
        """How many rows of the parts the inputs never reached."""
        return sum(len(held) for _, held in self.active) + sum(len(self.load(p)) for p in self.pending)


class _Coverage:
    """The inputs check: by row number, as many rows as the run covers, each part's rows as they read when
    it was written (a digest) and as the run stored them; by id, every id of both sides on the other."""

    def __init__(self, rec: ValidationReport, run: RunView, manifest: Manifest) -> None:
        self.rec, self.run = rec, run
        spec = manifest.spec
        self.limit = manifest.limit if "limit" in run.manifest else spec.get("limit")  # of the last pass
        # a pass by id since the first, even one that wrote nothing (its inputs may be another file)
        self.by_id = bool(manifest.generation) or any(p.generation for p in run.parts)
        # a run made with --incremental keeps the text an id had when scored: not compared
        self.by_row = not self.by_id and spec.get("on_existing") != "incremental"
        self.digests = RowDigests(run.parts if self.by_row else [])
        self.stored = _ByRow([p for p in run.parts if "predictions" in p.readable], self._stored_rows)
        self.ids, self.input_ids = IdSet(), IdSet()
        if self.by_id:
            self.ids.update(self._run_ids(run.parts))
        self.last_pass = [p for p in run.parts if p.generation == (manifest.generation or 0)]
        self.n, self.changed, self.missing, self.first = 0, [], 0, []
        self.differ, self.differ_first = 0, []

    def _run_ids(self, parts: list[Part]) -> list[str]:
        files = [str(self.run.file(p, "predictions")) for p in parts if "predictions" in p.readable]
        if not files:
            return []
        found = pl.scan_parquet(files, glob=False).filter(~pl.col("status").is_in(schema.ROW_NUMBER_STATUSES))
        return found.select("doc_id").collect(engine="streaming")["doc_id"].to_list()

    def _stored_rows(self, part: Part) -> dict[int, tuple[str, str | None, str | None]]:
        """row -> (doc_id, label, text digest) as the run stored the part; none where the stored rows give
        the part's recorded digest (the digest check compares the inputs with it)."""
        columns = ["row_index", "doc_id", "text", "label", "status"]
        frame = pl.read_parquet(self.run.file(part, "predictions"), columns=columns, glob=False)
        rows = RowBatch(*(frame.sort("row_index")[c].to_list() for c in columns))
        if rows_digest(rows) == part.rows_digest:
            return {}
        digests = [None if t is None else rows_digest(rows, i, i + 1) for i, t in enumerate(rows.text)]
        return dict(zip(rows.row_index, zip(rows.doc_id, rows.label, digests, strict=True), strict=True))

    @property
    def done(self) -> bool:
        return self.limit is not None and self.n >= self.limit

    def feed(self, block: RowBatch) -> None:
        if self.limit is not None:  # rows past the last pass's limit were never asked for
            block = block.slice(0, max(0, self.limit - block.row_index[0]))
        self.n += len(block)
        if self.by_row:
            self.changed += self.digests.feed(block)
            for j, _, (doc_id, label, digest) in self.stored.hits(block):
                self._compare(block, j, doc_id, label, digest)
            return
        rows = zip(block.doc_id, block.status, strict=True)
        ids = [d for d, s in rows if s not in schema.ROW_NUMBER_STATUSES]
        self.input_ids.update(ids)
        missing = [d for d in ids if d not in self.ids] if self.by_id else []
        self.missing += len(missing)
        self.first += missing[: 3 - len(self.first)]

    def _compare(self, block: RowBatch, j: int, doc_id: str, label: str | None, digest: str | None) -> None:
        """Input row ``j`` of ``block`` against the id, label and text digest the run stored of it."""
        row, now = block.row_index[j], block.doc_id[j]
        if doc_id != now:
            say = f"input row {row} is review {now!r}, but the run's row {row} is {doc_id!r}"
        elif label != block.label[j]:
            say = f"input row {row} (review {now!r}) has a label other than the one the run stored"
        elif digest and digest != rows_digest(block, j, j + 1):
            say = f"input row {row} (review {now!r}) has a text other than the one the run stored"
        else:
            return
        self.differ += 1
        if len(self.differ_first) < 3:
            self.differ_first.append(say)

    def finish(self) -> None:
        rec, run, n = self.rec, self.run, self.n
        limited = f" (limit {self.limit})" if self.limit is not None else ""
        redo = "; rerun the extract with --overwrite to redo the run"
        rec.fail_many("inputs", self.differ, (m + redo for m in self.differ_first))
        if not self.by_row:
            ids = self._run_ids(self.last_pass)
            gone = [d for d, has in zip(ids, self.input_ids.contains_each(ids), strict=True) if not has]
            said = [f"the run holds review {d!r}, which no input row has{redo}" for d in gone[:3]]
            rec.fail_many("inputs", len(gone), said)
        if self.by_id:
            if self.missing and run.status == "complete":
                why = "has no predictions row; rerun the extract with --incremental"
                rec.fail_many("inputs", self.missing, [f"input review {d!r} {why}" for d in self.first])
            rec.note("inputs", f"{n} input rows, by id{limited}")
            return
        edited = [f"input rows {a}..{b - 1} read otherwise now than when {name} was written (the inputs "
                  f"edited since?){redo}" for name, a, b in self.changed[:3]]  # fmt: skip
        rec.fail_many("inputs", len(self.changed), edited)
        covered = max((p.end_row for p in run.parts if p.generation == 0), default=0)
        if n > covered and run.status == "complete":
            rec.fail(
                "inputs",
                f"input rows {covered}..{n - 1} have no predictions row (rows added to the inputs since, or "
                "a part removed?); rerun the extract with --incremental to add them, or with --overwrite to "
                "redo it",
            )
        elif n > covered:
            rec.note("inputs", f"rows {covered}..{n - 1} are still to do (the run is {run.status})")
        elif n < covered:
            rec.fail("inputs", f"the run holds rows {n}..{covered - 1}, which the inputs no longer have")
        rec.note("inputs", f"{n} input rows{limited}")


class _Spans:
    """The span check, fed the inputs in row order beside the parts, holding one part's reviews at a time;
    a review of an earlier pass by id whose row now holds another review or text is not checked."""

    def __init__(self, rec: ValidationReport, run: RunView, generation: int) -> None:
        self.rec, self.current = rec, generation
        parts = [p for p in run.parts if p.readable >= {"predictions", "tokens"}]
        self.ends = _ByRow(parts, lambda part: {r: (d, e) for d, e, r in _span_ends(run, part).iter_rows()})
        self.checked = self.replaced = 0

    def feed(self, block: RowBatch) -> None:
        for j, part, (doc_id, end) in self.ends.hits(block):
            self._check(part, block.row_index[j], doc_id, end, block.doc_id[j], block.text[j])

    def _check(self, part: Part, row: int, doc_id: str, end: int, now_id: str, text: str | None) -> None:
        earlier = part.generation < self.current  # a pass by id keeps its first scoring
        if text is None or now_id != doc_id:
            if earlier:
                self.replaced += 1
            else:
                self.rec.warn("spans", f"input row {row} is now {now_id!r}, the run has {doc_id!r}")
        elif end > len(text) and earlier:
            self.replaced += 1  # edited since
        else:
            self.checked += 1
            if end > len(text):
                self.rec.fail("spans", _past_end(part, doc_id, row, end, f"text's length {len(text)}"))

    def finish(self, inputs: list[str]) -> None:
        rec = self.rec
        if left := self.ends.left():
            rec.warn(
                "spans", f"the inputs end before {left} scored reviews of the run; those were not checked"
            )
        if self.replaced:
            rec.note(
                "spans",
                f"{self.replaced} reviews of earlier --incremental passes not checked: their input rows now "
                "hold other reviews or other texts (the inputs were replaced, reordered or edited since)",
            )
        rec.note("spans", f"{self.checked} reviews checked against {', '.join(map(str, inputs))}")


def _span_ends(run: RunView, part: Part, *more: pl.Expr) -> pl.DataFrame:
    """doc_id, its largest span end, row_index and ``more`` for the scored reviews of one part."""
    tokens = pl.scan_parquet(run.file(part, "tokens"), glob=False)
    ends = tokens.group_by("doc_id").agg(end=pl.col("end").max())
    scored = pl.scan_parquet(run.file(part, "predictions"), glob=False).filter(pl.col("status") == "ok")
    return ends.join(scored.select("doc_id", "row_index", *more), on="doc_id").collect(engine="streaming")


def _check_stored_spans(rec: ValidationReport, run: RunView) -> bool:
    """Span ends against the texts the run stored; False where it stored none (``--no-store-text``)."""
    checked = 0
    for part in (p for p in run.parts if p.readable >= {"predictions", "tokens"}):
        ends = _span_ends(run, part, pl.col("text").str.len_chars().alias("length"))
        if ends["length"].null_count():
            return False
        checked += ends.height
        past = ends.filter(pl.col("end") > pl.col("length")).select("doc_id", "row_index", "end", "length")
        for doc_id, row, end, length in past.head(KEPT).iter_rows():
            rec.fail("spans", _past_end(part, doc_id, row, end, f"stored text's length {length}"))
    rec.note("spans", f"{checked} reviews checked against the texts the run stored (it read a stream)")
    return True


def _past_end(part: Part, doc_id: str, row: int, end: int, length: str) -> str:
    return f"{part.files['tokens']} doc {doc_id!r} (row {row}): a token span ends at {end}, past the {length}"
