"""One window's work, from its rows to a staged part: encode, score, extract, stage. Engines schedule it,
each step where they run it; ``prepare`` and ``finish`` wrap a model that runs in another process."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow.compute as pc

from ..model.encode import Encoder
from ..run import PartEntry, PartWriter
from .batching import BatchPlan
from .tables import Extractor, ScoredRow, TableOptions, vocab_array

if TYPE_CHECKING:
    from ..model import Classifier, Outputs
    from .windows import WindowRows


@dataclass
class PartStats:
    """What one window (or, summed, a whole pass) held and cost."""

    input_rows: int = 0
    scored: int = 0
    tokens: int = 0
    unknown: int = 0  # tokens that are the tokenizer's [UNK]
    padded_slots: int = 0
    truncated: int = 0
    status_counts: Counter = field(default_factory=Counter)
    # encode, model (of it: launch, device_wait), extract, write
    seconds: Counter = field(default_factory=Counter)

    def add(self, other: PartStats) -> None:
        for name in ("input_rows", "scored", "tokens", "unknown", "padded_slots", "truncated"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.status_counts.update(other.status_counts)
        self.seconds.update(other.seconds)  # an update, not +, which would drop a key of 0 seconds

    @property
    def padding_share(self) -> float:
        return 1 - self.tokens / self.padded_slots if self.padded_slots else 0.0

    @property
    def unknown_share(self) -> float:
        """[UNK] among the scored reviews' content tokens (not [CLS] and [SEP])."""
        content = self.tokens - 2 * self.scored
        return self.unknown / content if content > 0 else 0.0


@dataclass(frozen=True)
class PassInfo:
    """What every part of a pass shares: its generation (in part names) and the run's id (in predictions)."""

    generation: int = 0
    run_id: str = ""


@dataclass
class Window:
    """A window's rows after encoding (then scoring): becomes one part of each table."""

    start_row: int
    end_row: int
    rows: list[ScoredRow]
    digest: str = ""  # of its input rows as read (WindowRows.digest)
    stats: PartStats = field(default_factory=PartStats)
    plan: BatchPlan | None = None  # its batches, between prepare() and finish()


@dataclass
class StagedPart:
    """A window's part, written but not yet committed, with its stats: what an engine hands back."""

    entry: PartEntry
    stats: PartStats


class WindowJob:
    """The steps of one window, with the model loaded once; ``clf`` may be a stand-in with what the steps
    around the model ask of it (engines/processes.py)."""

    def __init__(self, clf: Classifier | Any, batch_tokens: int, max_batch_size: int, part_writer: PartWriter,
                 pass_info: PassInfo = PassInfo(), encode_threads: int = 1,
                 options: TableOptions = TableOptions()) -> None:  # fmt: skip
        self.clf = clf
        self.part_writer = part_writer
        self.generation = pass_info.generation
        self.batch_tokens, self.max_batch_size = batch_tokens, max_batch_size
        self.encoder = Encoder(clf.tokenizer, clf.max_length, encode_threads)
        self.unk_id = clf.tokenizer.unk_token_id  # None where a vocabulary has no unknown token
        self.extractor = Extractor(vocab_array(clf.tokenizer), clf.layers, clf.num_heads, clf.labels,
                                   pass_info.run_id, options, bool(clf.contributions))  # fmt: skip

    def __call__(self, rows: WindowRows) -> StagedPart:
        return self.stage(self.score(self.encode(rows)))

    def encode(self, rows: WindowRows) -> Window:
        """Tokenize the window's readable rows; a review with no content token becomes ``no_tokens``."""
        t0 = time.perf_counter()
        batch = rows.rows
        scored = [ScoredRow(batch.row_index[i], batch.doc_id[i], batch.label[i], batch.status[i],
                            text=batch.text[i]) for i in range(len(batch))]  # fmt: skip
        todo = [i for i, r in enumerate(scored) if r.status == "ok"]
        for i, enc in zip(todo, self.encoder([batch.text[i] for i in todo]), strict=True):
            scored[i].encoded = enc
            if enc.n_tokens <= 2:
                scored[i].status = "no_tokens"
        window = Window(rows.start_row, rows.end_row, scored, rows.digest)
        window.stats.seconds["encode"] += time.perf_counter() - t0
        return window

    def score(self, window: Window, on_batch: Callable[[int], None] | None = None) -> Window:
        """Run the model over the window's scorable rows; count what it held."""
        from .score import score_rows  # torch: here, as a host process never scores

        t0 = time.perf_counter()
        real, slots = score_rows(self.clf, window.rows, self.batch_tokens, self.max_batch_size, on_batch,
                                 window.stats.seconds)  # fmt: skip
        self._count(window, real, slots, time.perf_counter() - t0)
        return window

    def prepare(self, rows: WindowRows) -> tuple[Window, list[list[np.ndarray]]]:
        """The encoded window and its batches' token ids, for a model in another process."""
        window = self.encode(rows)
        window.plan = BatchPlan(window.rows, self.clf, self.batch_tokens, self.max_batch_size)
        return window, window.plan.batch_ids()

    def finish(self, window: Window, outputs: list[list[Outputs]], model_seconds: float) -> StagedPart:
        """Stage a prepared window with its batches' outputs (each one's, or its halves')."""
        plan = window.plan
        assert plan is not None, "finish() takes a window from prepare()"
        for k, out in enumerate(outputs):
            plan.fill(k, out)
        self._count(window, plan.real, plan.slots, model_seconds)
        window.plan = None
        return self.stage(window)

    @staticmethod
    def _count(window: Window, real: int, slots: int, model_seconds: float) -> None:
        s = window.stats
        s.seconds["model"] += model_seconds
        s.input_rows, s.tokens, s.padded_slots = len(window.rows), real, slots
        for r in window.rows:
            s.status_counts[r.status] += 1
            if r.status == "ok":
                s.scored += 1
                s.truncated += int(r.encoded.truncated)

    def stage(self, window: Window) -> StagedPart:
        """Build the window's tables and write them (not yet committed: see run/rundir.py)."""
        t0 = time.perf_counter()
        tables = self.extractor.tables(window.rows)
        if self.unk_id is not None:  # over the window's token ids at once
            unknown = pc.sum(pc.equal(tables["tokens"].column("token_id"), self.unk_id)).as_py()
            window.stats.unknown = unknown or 0
        t1 = time.perf_counter()
        entry = self.part_writer.stage(
            window.start_row, window.end_row, tables, self.generation, window.digest
        )
        window.stats.seconds["extract"] += t1 - t0
        window.stats.seconds["write"] += time.perf_counter() - t1
        return StagedPart(entry, window.stats)

    def close(self) -> None:
        self.encoder.close()
