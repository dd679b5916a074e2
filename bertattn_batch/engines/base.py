"""``run_job(spec)``: the data path, written once (docs/development.md draws it). Engines only decide
where a window's work runs: an engine is a context manager that loads the model, with ``header()``,
``executor(part_writer, pass_info, on_batch)`` (``submit(rows)``: the future of a staged part;
``in_flight``: the windows it takes at once), ``describe()`` and ``timings``. Every input row leaves as
exactly one predictions row: scored, or with the status that says why not.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .. import storage
from .._terminal import bar_size, human_bytes
from ..config import JobSpec
from ..errors import InputError
from ..extract import PartStats, PassInfo, StagedPart, iter_windows
from ..inputs import Source, check_inputs, count_rows, source_files, streams_as_recorded
from ..run import (
    PartWriter,
    check_read_unchanged,
    refuse_if_held,
    refuse_unsafe_store,
    resume_point,
    run_dir_class,
)
from ..runtime import tune_runtime
from ..train import ensure_model
from .scheduling import in_order

log = logging.getLogger(__name__)

#: A share of [UNK] among content tokens that says the tokenizer does not fit the texts, warned of once
#: the pass has read this many tokens (a fitting one leaves well under 1%).
UNKNOWN_WARNING, UNKNOWN_SAMPLE = 0.05, 2000


@dataclass
class RunSummary:
    """What a run's pass did; also stored in the manifest (``last_run``)."""

    run_dir: str
    # the rows a resume starts after, plus the distinct ids an incremental pass skips
    skipped_committed: int = 0
    stats: PartStats = field(default_factory=PartStats)
    bytes_written: int = 0
    parts_written: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)  # what the engine says of itself
    said_unknown: bool = field(default=False, init=False, repr=False)

    def add(self, part: StagedPart) -> None:
        self.stats.add(part.stats)
        self.bytes_written += part.entry.bytes
        self.parts_written += 1
        s = self.stats
        if not self.said_unknown and s.tokens >= UNKNOWN_SAMPLE and s.unknown_share > UNKNOWN_WARNING:
            self.said_unknown = True
            log.warning(  # as soon as it shows, so that a long job can be stopped
                "%.0f%% of the tokens so far are [UNK]: the model's tokenizer does not fit these texts "
                "(another language or script, a cased vocabulary lower-cased or the other way round, "
                "CJK characters not split?); its attention over [UNK] says little",
                100 * self.stats.unknown_share,
            )

    input_rows = property(lambda self: self.stats.input_rows)
    scored = property(lambda self: self.stats.scored)
    tokens = property(lambda self: self.stats.tokens)
    padded_slots = property(lambda self: self.stats.padded_slots)
    padding_share = property(lambda self: self.stats.padding_share)

    @property
    def reviews_per_s(self) -> float:
        """Reviews scored a second of the job, not counting the training of its model on first run."""
        wall = self.seconds.get("wall", 0.0) - self.seconds.get("train", 0.0)
        return self.scored / wall if wall > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        s = self.stats
        return {"run_dir": self.run_dir, "input_rows": s.input_rows,
                "skipped_committed": self.skipped_committed, "scored": s.scored,
                "status_counts": dict(sorted(s.status_counts.items())), "tokens": s.tokens,
                "unknown_tokens": s.unknown, "padded_slots": s.padded_slots, "truncated": s.truncated,
                "bytes_written": self.bytes_written, "parts_written": self.parts_written,
                "seconds": self.seconds, "padding_share": self.padding_share,
                "reviews_per_s": self.reviews_per_s, **self.engine}  # fmt: skip

    def line(self) -> str:
        s, t = self.stats, self.seconds
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(s.status_counts.items()) if k != "ok")
        train = f"train {t['train']:.1f}s, " if "train" in t else ""
        unknown = f" ({s.unknown_share:.1%} [UNK])" if s.unknown_share >= 0.01 else ""
        return (
            f"{s.input_rows} reviews ({s.scored} scored, {s.input_rows - s.scored} not scored"
            f"{': ' + reasons if reasons else ''}), {s.tokens} tokens{unknown}, "
            f"padding {self.padding_share:.1%}, {self.reviews_per_s:.1f} reviews/s, "
            f"{human_bytes(self.bytes_written)} written in {self.parts_written} "
            f"part{'s' * (self.parts_written != 1)} to {self.run_dir}; "
            f"time: {train}read+encode {t.get('read', 0) + t.get('encode', 0):.1f}s, model "
            f"{t.get('model', 0):.1f}s, extract {t.get('extract', 0):.1f}s, write {t.get('write', 0):.1f}s, "
            f"wall {t.get('wall', 0):.1f}s"
        )


def run_job(spec: JobSpec, progress: bool | None = None, part_writer: type[PartWriter] = PartWriter,
            engine: type | None = None) -> RunSummary:  # fmt: skip
    """Run one extraction job end to end; returns its summary (also written to the manifest).
    ``part_writer`` and ``engine`` replace the classes that write parts and run windows (tests)."""
    tune_runtime()
    show = spec.progress if progress is None else progress
    if engine is None:  # imports the model's code: not part of the job's time
        from .local import LocalEngine
        from .ray import RayEngine

        engine = RayEngine if spec.engine == "ray" else LocalEngine
    t_start = time.perf_counter()
    # refused now, not once a model is trained or loaded, or a cluster joined
    sources = check_inputs(spec.inputs, spec.out)  # of a stream, no more is copied than the job reads
    if storage.is_remote(spec.out):
        refuse_unsafe_store(spec.out, spec.unsafe_store_commits)
        refuse_if_held(os.fspath(spec.out))
    if spec.engine == "local":
        from .local import check_host_processes

        check_host_processes(spec)
    timings: Counter = Counter()
    if trained := ensure_model(spec, progress=show):
        timings["train"] = trained
    summary = RunSummary(run_dir=str(spec.out))
    incremental = spec.on_existing == "incremental"
    on_existing = "resume" if incremental else spec.on_existing
    with (
        engine(spec) as eng,
        run_dir_class(spec.out)(
            spec.out, eng.header(), on_existing, part_writer(spec.out), spec.unsafe_store_commits
        ) as run,
    ):
        fingerprint = source_files(sources)
        limited = run.manifest.limit is not None  # the recorded pass's: it may have read a stream's start
        compared = streams_as_recorded(sources, fingerprint, run.manifest.sources, limited)
        by_id = spec.inputs.id_col is not None
        point = resume_point(run, incremental, by_id, fingerprint, spec.inputs.limit, compared)
        summary.skipped_committed = point.skipped
        windows = iter_windows(sources, spec.inputs, spec.window, point, timings)
        with _progress_bar(spec, show, point.skip_until, sources) as (bar, advance):
            pass_info = PassInfo(point.generation, run.manifest.run_id)
            with (
                eng.executor(run.part_writer, pass_info, advance) as ex,
                contextlib.closing(in_order(windows, ex.submit, ex.in_flight)) as parts,
            ):
                for part in parts:
                    run.commit(part.entry)
                    summary.add(part)
                    advance(part.stats.input_rows - part.stats.scored)  # the scored ones: per batch
                    bar.set_postfix_str(_postfix(summary, bar.format_dict["elapsed"], spec.workers))
        if not incremental:  # a pass by id takes what it read; the next one reads what came since
            try:
                now = source_files(sources)
            except OSError as e:
                raise InputError(
                    f"{run.run_dir}: {e.filename or 'an input file'} went while this run read it "
                    f"({e.strerror or e}), so its tables may lack its rows; once the inputs are final, "
                    "rerun with --overwrite"
                ) from None
            check_read_unchanged(run, fingerprint, now)
        timings.update(summary.stats.seconds)
        timings.update(eng.timings)
        summary.seconds = {k: round(v, 3) for k, v in timings.items()}
        summary.seconds["wall"] = round(time.perf_counter() - t_start, 3)
        summary.engine = eng.describe()
        run.finalize(summary.as_dict())
    return summary


def _postfix(summary: RunSummary, elapsed: float, workers: int) -> str:
    """Tokens a second, and the share of the time so far the model's thread (each worker's, on Ray)
    spent scoring: on a GPU, how well the host side feeds it."""
    wall = max(elapsed, 1e-9)
    busy = summary.stats.seconds.get("model", 0.0) / (wall * max(workers, 1))
    return f"{summary.stats.tokens / wall:,.0f} tok/s, model busy {min(busy, 1.0):.0%}"


@contextlib.contextmanager
def _progress_bar(spec: JobSpec, show: bool, done: int, sources: list[Source]) -> Iterator[Any]:
    """The job's progress bar, redrawn every second so that its time moves while a window is scored,
    and a thread-safe ``advance(n)`` for the engine's threads."""
    from tqdm.auto import tqdm

    total = None
    with contextlib.suppress(Exception):  # a count is a nicety; the reader reports real problems
        total = count_rows(sources) if show else None
    if total is not None and spec.inputs.limit is not None:
        total = min(total, spec.inputs.limit)
    bar = tqdm(total=total, initial=done if total else 0, desc=f"extract {storage.name_path(spec.out).name}",
               unit="review", disable=not show, smoothing=0.1, **bar_size())  # fmt: skip
    lock, stop = threading.Lock(), threading.Event()

    def advance(n: int) -> None:
        with lock:
            bar.update(n)

    def tick() -> None:
        while not stop.wait(1.0):
            bar.refresh()

    ticker = threading.Thread(target=tick, name="progress", daemon=True)
    if show:
        ticker.start()
    try:
        yield bar, advance
    finally:
        stop.set()
        if show:
            ticker.join()
        bar.close()
