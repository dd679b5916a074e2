"""``run_job(spec)``: the one place that knows the order of the stages.

Usage::

    from bertattn_batch.spec import load_job
    from bertattn_batch.pipeline import run_job
    summary = run_job(load_job("jobs/default.toml"))

    read+encode (thread*) ──▶ bucket & model (this thread) ──▶ extract+write (thread)

    * ahead of the model, or in turn with it where torch's threads take every core: see feed_plan

Every input row leaves as exactly one predictions row: scored, or with the status that says why not.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import __version__, schema
from .batching import bucket_batches
from .encode import Encoded, Encoder
from .errors import ModelError, RunDirError
from .extract import Extractor, ScoredRow, vocab_array
from .heap import trim_heap
from .ids import IdSet
from .locks import take_lock
from .model import Classifier
from .read import RowBatch, Source, check_inputs, count_rows, read_sources, source_files
from .spec import FinetuneSpec, JobSpec
from .threads import Worker, prefetch
from .write import RunWriter, old_manifest, part_generation

log = logging.getLogger(__name__)


@dataclass
class Window:
    """A block of consecutive input rows, encoded; becomes one Parquet part of each table."""

    start_row: int
    end_row: int
    rows: list[ScoredRow]


@dataclass
class RunSummary:
    """What a run did; also stored in the manifest."""

    run_dir: str
    input_rows: int = 0
    # what earlier passes committed and this one does not redo: the rows a resume starts after, plus
    # the distinct ids an incremental pass skips (every input row with one of them is skipped)
    skipped_committed: int = 0
    scored: int = 0
    status_counts: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    padded_slots: int = 0
    truncated: int = 0
    bytes_written: int = 0
    parts_written: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def padding_share(self) -> float:
        return 1 - self.tokens / self.padded_slots if self.padded_slots else 0.0

    @property
    def reviews_per_s(self) -> float:
        """Reviews scored a second of the job, not counting the training of its model on first run."""
        wall = self.seconds.get("wall", 0.0) - self.seconds.get("train", 0.0)
        return self.scored / wall if wall > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.update(padding_share=round(self.padding_share, 4), reviews_per_s=round(self.reviews_per_s, 2))
        return d

    def line(self) -> str:
        skipped = sum(v for k, v in self.status_counts.items() if k != "ok")
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.status_counts.items()) if k != "ok")
        t = self.seconds
        train = f"train {t['train']:.1f}s, " if "train" in t else ""
        return (
            f"{self.input_rows} reviews ({self.scored} scored, {skipped} not scored"
            f"{': ' + reasons if reasons else ''}), {self.tokens} tokens, "
            f"padding {self.padding_share:.1%}, {self.reviews_per_s:.1f} reviews/s, "
            f"{_human_bytes(self.bytes_written)} written in {self.parts_written} parts; "
            f"time: {train}read+encode {t.get('read_encode', 0):.1f}s, model {t.get('model', 0):.1f}s, "
            f"extract {t.get('extract', 0):.1f}s, write {t.get('write', 0):.1f}s, wall {t.get('wall', 0):.1f}s"
        )


def ensure_model(spec: JobSpec, progress: bool = True) -> float:
    """Train the job's model on first run when the job has a [finetune] table and the folder is missing;
    returns the seconds that took (0 where the model was there), which a run's summary reports apart.

    One job trains it; a job started meanwhile waits for that and uses the same model. Why: each would
    otherwise train its own and replace the other's folder, and as training is capped by time its
    weights differ, so the first job's run would be refused as another job's on every resume.
    """
    if spec.finetune is None or (Path(spec.model) / "config.json").is_file():
        return 0.0
    t0 = time.perf_counter()
    old_manifest(Path(spec.out), spec.on_existing)  # an --out that would be refused: found before training
    with _training_lock(Path(spec.model)) as lock:
        if (Path(spec.model) / "config.json").is_file():
            log.warning("model %s was trained by another job meanwhile; using it", spec.model)
        else:
            _train_model(spec, progress)
        # with the model there, waiters find it and later jobs need no lock; the file is made even
        # where it could not be locked
        lock.unlink(missing_ok=True)
    return time.perf_counter() - t0


@contextlib.contextmanager
def _training_lock(model: Path) -> Iterator[Path]:
    """Hold a lock on ``.NAME.training.lock`` beside the model folder, waiting while another job holds
    it; yields the lock file (where the file system has no locks, unlocked: train unguarded)."""
    path = model.with_name(f".{model.name}.training.lock")
    try:
        model.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = take_lock(path)
        except BlockingIOError:
            log.warning("another job is training %s; waiting for it", model)
            fd = take_lock(path, wait=True)
    except OSError as e:
        raise ModelError(f"cannot write beside {model} to train it: {e.strerror or e}") from None
    try:
        yield path
    finally:
        if fd is not None:
            os.close(fd)


def training_inputs(spec: JobSpec, inputs: list[str] | None = None) -> tuple[list[str], str, str, str]:
    """What a job's model is trained on: (inputs, text column, label column, input format).

    ``[finetune]``'s own inputs and columns where it names them, else the job's; ``inputs`` given
    replace both. The job's ``input_format`` applies to the job's inputs only; other files are told by
    their names.
    """
    ft = spec.finetune or FinetuneSpec()
    own = not inputs and not ft.inputs
    return (
        inputs or ft.inputs or spec.inputs,
        ft.text_col or spec.text_col,
        ft.label_col or spec.label_col or "label",
        spec.input_format if own else "auto",
    )


def _train_model(spec: JobSpec, progress: bool) -> None:
    from .finetune import finetune_files

    assert spec.finetune is not None
    log.warning("model %s not found: training it now from the job's [finetune] table", spec.model)
    inputs, text_col, label_col, input_format = training_inputs(spec)
    metrics = finetune_files(
        inputs,
        text_col=text_col,
        label_col=label_col,
        out_dir=spec.model,
        spec=spec.finetune,
        input_format=input_format,
        progress=progress,
    )
    if metrics.get("accuracy") is None:  # eval_fraction = 0; an accuracy of 0.0 is still printed
        log.warning("trained %s: no held-out split", spec.model)
    else:
        log.warning(
            "trained %s: held-out accuracy %.4f, macro-F1 %.4f",
            spec.model,
            metrics["accuracy"],
            metrics["macro_f1"],
        )


def load_classifier(spec: JobSpec) -> Classifier:
    return Classifier.load(
        spec.model,
        layers=spec.layers,
        device=spec.device,
        dtype=spec.dtype,
        attention=spec.attention,
        max_length=spec.max_length,
        trust_remote_code=spec.trust_remote_code,
        allow_pickle=spec.allow_pickle,
        trim_last_layer=spec.trim_last_layer,
    )


def run_header(spec: JobSpec, clf: Classifier) -> dict[str, Any]:
    """Manifest fields fixed for the life of a run; ``fingerprint`` decides whether a resume may mix in."""
    dtype = str(clf.dtype).removeprefix("torch.")
    fingerprint = {
        "model_sha256": clf.weights_sha256,
        "inputs": [os.path.abspath(p) for p in spec.inputs],  # the same files, from any directory
        "columns": [spec.text_col, spec.id_col, spec.label_col],
        "input_format": spec.input_format,  # the same file read as another format has other rows
        "layers": clf.layers,
        "max_length": clf.max_length,
        "dtype": dtype,
        "attention": spec.attention,
    }
    fingerprint["job_sha256"] = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()
    import pyarrow
    import tokenizers
    import transformers

    return {
        "spec": spec.to_dict(),
        "fingerprint": fingerprint,
        "model": {
            "source": clf.source,
            "weights_sha256": clf.weights_sha256,
            "model_type": clf.model.config.model_type,
            "word_continuation": clf.word_continuation,
            "byte_level": clf.byte_level,
            "num_layers": clf.num_layers,
            "num_heads": clf.num_heads,
            "layers": clf.layers,
            "id2label": {str(k): v for k, v in clf.id2label.items()},
            "max_length": clf.max_length,
            "dtype": dtype,
            "device": str(clf.device),
            "attention": spec.attention,
        },
        "versions": {
            "bertattn_batch": __version__,
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "pyarrow": pyarrow.__version__,
        },
    }


def iter_windows(
    spec: JobSpec,
    encode: Callable[[Sequence[str]], list[Encoded]],
    sources: list[Source],
    skip_until: int = 0,
    skip_ids: IdSet | None = None,
    timings: Counter | None = None,
    seen_ids: IdSet | None = None,
) -> Iterator[Window]:
    """Read and encode the input (``sources``, as :func:`read.check_inputs` gave them) in windows of
    ``spec.window`` rows; rows already committed are skipped.

    ``seen_ids``: ids already taken by committed rows, so that a resumed run marks a later repeat of one
    ``duplicate_id`` just as an uninterrupted run would.
    """
    # ids are checked for repeats only where the job has an id column: no copy of them otherwise
    seen = (skip_ids or IdSet()) | (seen_ids or IdSet()) if spec.id_col else None
    timings = timings if timings is not None else Counter()
    t0 = time.perf_counter()
    for block in read_sources(
        sources,
        text_col=spec.text_col,
        id_col=spec.id_col,
        label_col=spec.label_col,
        limit=spec.limit,
        block_rows=spec.window,
    ):
        window = _encode_block(block, encode, skip_until, skip_ids, seen)
        timings["read_encode"] += time.perf_counter() - t0
        if window is not None:
            yield window
        t0 = time.perf_counter()


def _select_rows(
    block: RowBatch, skip_until: int, skip_ids: IdSet | None, seen_ids: IdSet | None
) -> list[ScoredRow]:
    """The block's rows still to do, in order; a repeated id (``seen_ids`` grows) becomes duplicate_id."""
    rows: list[ScoredRow] = []
    for i in range(len(block)):
        row, doc_id, status = block.row_index[i], block.doc_id[i], block.status[i]
        # a row without a source id has its row number as doc id, which is no committed source id (the
        # row is recorded again every pass) and no repeat of one
        has_id = status not in schema.ROW_NUMBER_STATUSES
        if row < skip_until or (skip_ids is not None and has_id and doc_id in skip_ids):
            continue
        if seen_ids is not None and has_id:
            repeated = not seen_ids.add(doc_id)
            if repeated and status == "ok":
                status = "duplicate_id"
        rows.append(ScoredRow(row, doc_id, block.label[i], status))
    return rows


def _encode_block(
    block: RowBatch,
    encode: Callable[[Sequence[str]], list[Encoded]],
    skip_until: int,
    skip_ids: IdSet | None,
    seen_ids: IdSet | None,
) -> Window | None:
    rows = _select_rows(block, skip_until, skip_ids, seen_ids)
    if not rows:
        return None
    todo = [r for r in rows if r.status == "ok"]
    by_row = dict(zip(block.row_index, block.text, strict=True))
    for r, enc in zip(todo, encode([by_row[r.row_index] for r in todo]), strict=True):
        r.encoded = enc
        if enc.n_tokens <= 2:
            r.status = "no_tokens"
    return Window(rows[0].row_index, rows[-1].row_index + 1, rows)


class ModelStage:
    """Scores windows: length buckets packed by a token budget, OOM answered by halving the batch."""

    def __init__(self, clf: Classifier, batch_tokens: int, max_batch_size: int) -> None:
        self.clf = clf
        self.batch_tokens = batch_tokens
        self.max_batch_size = max_batch_size

    def __call__(self, window: Window) -> tuple[int, int]:
        """Fill probs and cls_rows of the window's scorable rows; returns (real tokens, padded slots).

        Every row's outputs are views into two arrays made for the whole window before its first
        batch, and each batch's own outputs are copied there and freed. Kept alive by views instead,
        the batches' arrays would sit in the heap among the freed buffers of later batches, which the
        C library then cannot reuse whole: on the default model the stage's peak was 60 to 130 MB
        higher (three alternating runs each on 40k reviews), handed back only at the window's end.
        """
        todo = [r for r in window.rows if r.status == "ok"]
        lengths = [r.encoded.n_tokens for r in todo]
        per_token = len(self.clf.layers) * self.clf.num_heads
        cls_rows = np.empty(per_token * sum(lengths), dtype=np.float32)
        probs = np.empty((len(todo), len(self.clf.labels)), dtype=np.float32)
        at = 0
        for i, (r, n) in enumerate(zip(todo, lengths, strict=True)):
            r.probs = probs[i]  # (C,)
            r.cls_rows = cls_rows[at : at + per_token * n].reshape(-1, self.clf.num_heads, n)  # (L, H, n)
            at += per_token * n
        real = slots = 0
        for idx in bucket_batches(lengths, self.batch_tokens, self.max_batch_size):
            batch = [todo[i] for i in idx]
            slots += self._score(batch)
            real += sum(r.encoded.n_tokens for r in batch)
        return real, slots

    def _score(self, batch: list[ScoredRow]) -> int:
        """Score one padded batch (in halves after an out-of-memory error); returns its padded slots."""
        try:
            probs, rows = self.clf.forward([r.encoded.ids for r in batch])  # (B, C), (B, L, H, S)
        except torch.OutOfMemoryError:
            if len(batch) == 1:
                raise ModelError(
                    f"out of memory on a single review of {batch[0].encoded.n_tokens} tokens; "
                    "lower --max-length or use a device with more memory"
                ) from None
            _free_device_cache(self.clf.device)
            half = len(batch) // 2
            log.warning("out of memory on a batch of %d reviews; retrying in halves", len(batch))
            return self._score(batch[:half]) + self._score(batch[half:])
        for i, r in enumerate(batch):
            r.probs[:] = probs[i]
            r.cls_rows[:] = rows[i, :, :, : r.encoded.n_tokens]  # this review's own tokens, no padding
        return len(batch) * max(r.encoded.n_tokens for r in batch)


#: Each encode thread holds a copy of the tokenizer (made at the start of a run).
MAX_ENCODE_THREADS = 8


def feed_plan(device: torch.device) -> tuple[int, int]:
    """How the model is fed: (windows the reader thread makes ahead, threads that encode a window).

    On an accelerator, whose thread mostly waits for the device, the reader runs two windows ahead and
    encodes on every core but the model's and the writer's (at most 4; not yet measured on a GPU). On
    the CPU, when torch's threads take every core, a reader beside them would preempt them in the
    middle of their operations: there it makes a window only when the model asks for one, and encodes
    it on every core (at most ``MAX_ENCODE_THREADS``; measured on 2 cores, the default model end to
    end in bfloat16: 3.5 s against 4.2 s). With cores to spare, it runs ahead on those.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if device.type != "cpu":
        return 2, max(1, min(4, cores - 2))
    if torch.get_num_threads() >= cores:
        return 0, min(cores, MAX_ENCODE_THREADS)
    return 2, min(cores - torch.get_num_threads(), MAX_ENCODE_THREADS)


def _free_device_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_job(
    spec: JobSpec, progress: bool | None = None, writer_cls: type[RunWriter] = RunWriter
) -> RunSummary:
    """Run one extraction job end to end; returns its summary (also written to the manifest)."""
    if spec.engine == "ray":
        from .ray_engine import run_job_ray

        return run_job_ray(spec, progress=progress, writer_cls=writer_cls)
    show = spec.progress if progress is None else progress
    t_start = time.perf_counter()
    sources = check_inputs(
        spec.inputs, spec.text_col, spec.id_col, spec.label_col, spec.input_format, spec.out
    )
    trained = ensure_model(spec, progress=show)
    t_load = time.perf_counter()
    clf = load_classifier(spec)
    summary = RunSummary(run_dir=str(spec.out))
    timings: Counter = Counter(load=time.perf_counter() - t_load)
    if trained:
        timings["train"] = trained
    extractor = Extractor(vocab_array(clf.tokenizer), clf.layers, clf.num_heads, clf.labels)
    stage = ModelStage(clf, spec.batch_tokens, spec.max_batch_size)
    incremental = spec.on_existing == "incremental"
    on_existing = "resume" if incremental else spec.on_existing
    with writer_cls(spec.out, run_header(spec, clf), on_existing=on_existing) as sink:
        generation, skip_until, skip_ids, taken = resume_point(
            sink, incremental, spec.id_col is not None, source_files(sources)
        )
        summary.skipped_committed = skip_until + len(skip_ids or ())
        bar = _progress_bar(spec, show, skip_until, sources)

        def write(window: Window) -> None:
            t0 = time.perf_counter()
            tables = extractor.tables(window.rows)
            t1 = time.perf_counter()
            entry = sink.write_part(window.start_row, window.end_row, tables, generation=generation)
            timings["extract"] += t1 - t0
            timings["write"] += time.perf_counter() - t1
            summary.bytes_written += entry["bytes"]
            summary.parts_written += 1
            trim_heap()

        ahead, threads = feed_plan(clf.device)
        with Encoder(clf.tokenizer, clf.max_length, threads) as encoder:
            writer = Worker(write, depth=2, name="writer")
            try:
                windows = iter_windows(spec, encoder, sources, skip_until, skip_ids, timings, seen_ids=taken)
                for window in prefetch(windows, depth=ahead):
                    t0 = time.perf_counter()
                    real, slots = stage(window)
                    timings["model"] += time.perf_counter() - t0
                    trim_heap()
                    _count(summary, window, real, slots)
                    bar.update(len(window.rows))
                    bar.set_postfix_str(
                        f"{summary.tokens / max(bar.format_dict['elapsed'], 1e-9):,.0f} tok/s"
                    )
                    writer.put(window)
            finally:
                try:
                    writer.close()
                finally:
                    bar.close()
        summary.seconds = {k: round(v, 3) for k, v in timings.items()}
        summary.seconds["wall"] = round(time.perf_counter() - t_start, 3)
        totals = _totals(sink)
        sink.finalize({"last_run": summary.as_dict(), "counts": totals})
    return summary


def resume_point(
    sink: RunWriter, incremental: bool, by_id: bool, sources: list[dict[str, Any]] | None = None
) -> tuple[int, int, IdSet | None, IdSet | None]:
    """(generation, skip_until, skip_ids, taken_ids) for a reopened run: where new parts start, what
    they skip, and (``by_id``: the job has an id column) the source ids that committed rows already
    hold, so that a resumed run marks a repeat of one ``duplicate_id`` as an uninterrupted run would.

    An incremental job starts a new pass (generation) over a run whose last pass completed, skipping
    every committed id; over an interrupted pass it finishes that pass, as a plain resume does. The
    pass's generation is recorded in the manifest before its first part, so a pass interrupted before
    it commits anything is still known, and so are its input files (``sources``, see
    :func:`read.source_files`): a pass that continues by row number refuses inputs that changed.
    """
    parts = sink.parts
    passes = {part_generation(p) for p in parts}
    if not incremental:
        if passes - {0} or int(sink.manifest.get("generation", 0)):  # an incremental pass, even one
            # interrupted before its first part: its inputs are the grown ones, its row numbers not ours
            raise RunDirError(
                f"{sink.run_dir} was last run with --incremental (its passes go by id, not by row number); "
                "rerun it with --incremental (or --overwrite)"
            )
        skip_until = max((p["end_row"] for p in parts), default=0)
        if skip_until:
            _check_same_inputs(sink, sources, by_id)
        sink.begin_pass(0, sources)
        return 0, skip_until, None, sink.committed_ids() if by_id and skip_until else None
    if parts and (sink.reopened_status == "complete" or "generation" not in sink.manifest):
        generation = max(passes) + 1  # a new pass (also over a run from before passes were recorded)
        sink.begin_pass(generation, sources)
        return generation, 0, sink.committed_ids(), None
    # finish the interrupted pass where it stopped, by row number as any resume does (the input is
    # taken to be unchanged): a repeat of one of its ids is still duplicate_id, a null id is not redone
    generation = int(sink.manifest.get("generation", 0))
    current = [p for p in parts if part_generation(p) == generation]
    earlier = [p for p in parts if part_generation(p) < generation]
    skip_until = max((p["end_row"] for p in current), default=0)
    if skip_until:
        _check_same_inputs(sink, sources, by_id)
    sink.begin_pass(generation, sources)
    taken = sink.committed_ids(current) if by_id and current else None
    return generation, skip_until, sink.committed_ids(earlier) if earlier else None, taken


def _check_same_inputs(sink: RunWriter, sources: list[dict[str, Any]] | None, by_id: bool) -> None:
    """Refuse to continue a pass by row number over input files that changed since it began: a file
    sorted in front of the old ones would shift every row, so old reviews would be written again under
    new row numbers and the new ones skipped, all with exit status 0."""
    before = sink.manifest.get("sources")
    if sources is None or before is None:  # runs from before sources were kept
        return
    before = [{**s, "path": os.path.abspath(s["path"])} for s in before]  # older runs: relative paths
    if len(before) == len(sources) and all(map(_same_file, before, sources)):
        return
    old = {s["path"]: s for s in before}
    now = {s["path"] for s in sources}
    changes = [f"{s['path']} is new" for s in sources if s["path"] not in old]
    changes += [f"{p} is gone" for p in old if p not in now]
    for s in sources:
        was = old.get(s["path"])
        if was is not None and was["bytes"] != s["bytes"]:
            changes.append(f"{s['path']} changed size")
        elif was is not None and not _same_file(was, s):
            changes.append(f"{s['path']} was rewritten (same size, other bytes at its start or end)")
    changes = changes or ["the files are read in another order"]
    more = f" and {len(changes) - 3} more" if len(changes) > 3 else ""
    fix = "restore them, or pass --overwrite to start again"
    if by_id and sink.reopened_status == "complete" and sink.manifest.get("generation", 0) == 0:
        fix += ", or --incremental to add only the reviews whose ids are new"
    raise RunDirError(
        f"{sink.run_dir}: the inputs changed since this run began ({'; '.join(changes[:3])}{more}); "
        f"a resume goes on by row number and would mix old and new rows: {fix}"
    )


def _same_file(was: dict[str, Any], now: dict[str, Any]) -> bool:
    """The same input file as when the pass began, by what both records hold (older runs: the size
    alone): its size and time, or where only its time changed (a copy, a re-export of the same rows),
    the bytes at its start and end (:func:`read.source_files`)."""
    if was["path"] != now["path"] or was["bytes"] != now["bytes"]:
        return False
    if "mtime_ns" not in was or was["mtime_ns"] == now["mtime_ns"]:
        return True
    return was.get("ends_sha256") == now["ends_sha256"]


def _count(summary: RunSummary, window: Window, real: int, slots: int) -> None:
    summary.input_rows += len(window.rows)
    summary.tokens += real
    summary.padded_slots += slots
    for r in window.rows:
        summary.status_counts[r.status] = summary.status_counts.get(r.status, 0) + 1
        if r.status == "ok":
            summary.scored += 1
            summary.truncated += int(r.encoded.truncated)


def _totals(sink: RunWriter) -> dict[str, int]:
    """Row counts of every table over all committed parts (this run and earlier ones)."""
    totals = dict.fromkeys(schema.TABLES, 0)  # an empty input still counts its (empty) tables
    for p in sink.parts:
        for table, n in p["rows"].items():
            totals[table] = totals.get(table, 0) + n
    return totals


def _progress_bar(spec: JobSpec, show: bool, done: int, sources: list[Source]):
    from tqdm.auto import tqdm

    total = None
    if show:
        try:
            total = count_rows(sources)
        except Exception:  # a count is a nicety; the reader reports real problems
            total = None
        if total is not None and spec.limit is not None:
            total = min(total, spec.limit)
    return tqdm(
        total=total,
        initial=done if total else 0,
        unit="review",
        disable=not show,
        dynamic_ncols=True,
        smoothing=0.1,
    )


def _human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
