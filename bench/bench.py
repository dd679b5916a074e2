"""Throughput and padding of bertattn against the seed's method, transformers' pipeline and plain inference,
on the same reviews in one process, as ratios to plain inference (the ceiling) and to the seed's loop.

Usage::

    make bench                                          # zh (8192 reviews) and minilm (512), and the rest
    .venv/bin/python bench/bench.py --models minilm --n 256 --rounds 3
    .venv/bin/python bench/bench.py --models bert-base --device cuda
    .venv/bin/python bench/bench.py --models minilm --n 200 --methods stage,stage-alti   # ALTI's cost

The methods, each on the same reviews, warmed up, then timed interleaved over ``--rounds`` (best round
and paired ratios: see ``harness.ratio``):

- ``seed``: one review at a time, eager attention, ``output_attentions=True``, then
  ``attentions[-2].squeeze(0)[:, 0, 1:-1]``, tokenizing inside the loop as the seed does;
- ``pipeline``: ``pipeline("text-classification", batch_size=32)``, predictions only;
- ``ceiling``: our length-bucketed batches through the model with SDPA, nothing captured;
- ``stage``: bertattn's model stage on the same batches ([CLS] rows captured, the last layer run for
  [CLS] alone); ``stage-full`` runs the whole last layer, ``stage-zeroing`` adds value zeroing,
  ``stage-alti`` ALTI's contributions;
- ``extract``: ``run_job`` end to end (read, encode, model, extract, write), less its model load.

Figures go to ``bench/results/<device>.json``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import harness
import numpy as np
import torch
from harness import Case, Counts, Figure, Method

from bertattn_batch.config import BATCH_DEFAULTS, InputSpec, JobSpec
from bertattn_batch.engines import load_classifier, run_job
from bertattn_batch.extract import ScoredRow, score_rows
from bertattn_batch.extract.batching import bucket_batches, chunks
from bertattn_batch.model import Classifier, alti, resolve_device
from bertattn_batch.model.encode import Encoded, encode_texts
from bertattn_batch.runtime import tune_runtime

#: Reviews per case when --n is not given: timed rounds of several seconds on a 2-core CPU, and two
#: windows of the small default model.
DEFAULT_N = {"zh": 8192, "minilm": 512, "bert-base": 512}
#: A job's batch sizes on the CPU: every batched method packs its batches with these.
BATCH_TOKENS, MAX_BATCH_SIZE = BATCH_DEFAULTS["cpu"]
PIPELINE_BATCH = 32
SEED_LAYER = -2


def _dtype(clf: Classifier) -> str:
    return str(clf.dtype).removeprefix("torch.")


def _shapes(lengths: Sequence[int]) -> list[tuple[int, int]]:
    """(batch size, longest) of the batches a job cuts from reviews of ``lengths`` tokens."""
    return [
        (len(b), max(lengths[i] for i in b)) for b in bucket_batches(lengths, BATCH_TOKENS, MAX_BATCH_SIZE)
    ]


def seed_method(case: Case, device: torch.device, max_length: int) -> Method:
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
            _ = int(out.logits.argmax(-1)), out.attentions[SEED_LAYER].squeeze(0)[:, 0, 1:-1].cpu().numpy()
            tokens += enc["input_ids"].shape[1]
        return Counts(len(case.texts), tokens, tokens)

    return Method("seed", "float32", run, harness.matmul_flops(model.config, [(1, n) for n in lengths]))


def pipeline_method(case: Case, clf: Classifier) -> Method:
    from transformers import pipeline

    pipe = pipeline(
        "text-classification",
        model=clf.model,
        tokenizer=clf.tokenizer,
        batch_size=PIPELINE_BATCH,
        device=clf.device,
    )
    lengths = [e.n_tokens for e in encode_texts(clf.tokenizer, case.texts, clf.max_length)]
    blocks = [(len(c), max(c)) for c in chunks(lengths, PIPELINE_BATCH)]  # corpus order

    def run() -> Counts:
        assert len(pipe(case.texts, truncation=True, max_length=clf.max_length)) == len(case.texts)
        return Counts(len(case.texts), sum(lengths), sum(b * s for b, s in blocks))

    return Method("pipeline", _dtype(clf), run, harness.matmul_flops(clf.model.config, blocks))


def ceiling_method(clf: Classifier, encoded: list[Encoded]) -> Method:
    lengths = [e.n_tokens for e in encoded]
    batches = bucket_batches(lengths, BATCH_TOKENS, MAX_BATCH_SIZE)
    shapes = _shapes(lengths)

    @torch.inference_mode()
    def run() -> Counts:
        for idx in batches:
            input_ids, mask = clf.pad([encoded[i].ids for i in idx])  # (B, S), (B, S)
            logits = clf.model(input_ids=input_ids, attention_mask=mask).logits  # (B, C)
            torch.softmax(logits.float(), dim=-1).cpu().numpy()
        return Counts(len(encoded), sum(lengths), sum(b * s for b, s in shapes))

    return Method("ceiling", _dtype(clf), run, harness.matmul_flops(clf.model.config, shapes))


def stage_method(clf: Classifier, encoded: list[Encoded], name: str) -> Method:
    """``stage``, ``stage-full`` (no last-layer trim), ``stage-zeroing`` (value zeroing too) or
    ``stage-alti`` (ALTI contributions too)."""
    rows = [ScoredRow(i, str(i), None, "ok", encoded=e) for i, e in enumerate(encoded)]
    shapes = _shapes([e.n_tokens for e in encoded])
    if name == "stage-alti":  # a corpus's steady state: ALTI's kernel compiled from the first batch (warm-up)
        alti.COMPILE_AFTER_S = 0.0

    def run() -> Counts:
        kept = clf.trim
        clf.trim = None if name == "stage-full" else kept
        clf.value_zeroing = name == "stage-zeroing"
        clf.alti = alti.AltiCapture(clf.model) if name == "stage-alti" else None
        try:
            real, slots = score_rows(clf, rows, BATCH_TOKENS, MAX_BATCH_SIZE)
        finally:
            clf.trim, clf.value_zeroing, clf.alti = kept, False, None
        return Counts(len(rows), real, slots)

    return Method(name, _dtype(clf), run, harness.matmul_flops(clf.model.config, shapes))


def extract_method(case: Case, clf: Classifier, out: Path) -> Method:
    spec = JobSpec(
        inputs=InputSpec([str(case.sample)], id_col=case.id_col, label_col=case.label_col),
        model=str(case.model_dir),
        out=str(out),
        max_length=case.max_length,
        device=str(clf.device),
        dtype=_dtype(clf),
        on_existing="overwrite",
        progress=False,
    )
    shapes = _shapes([e.n_tokens for e in encode_texts(clf.tokenizer, case.texts, clf.max_length)])

    def run() -> Counts:
        c0 = time.process_time()
        load_classifier(spec)  # a load of its own: the CPU seconds the run's load takes
        load_cpu = time.process_time() - c0
        summary = run_job(spec)
        seconds = max(summary.seconds["wall"] - summary.seconds.get("load", 0.0), 1e-6)
        return Counts(
            summary.scored, summary.tokens, summary.padded_slots, seconds, dict(summary.seconds), 2 * load_cpu
        )

    return Method("extract", _dtype(clf), run, harness.matmul_flops(clf.model.config, shapes))


def bench_case(
    case: Case,
    device: torch.device,
    dtypes: Sequence[str],
    rounds: int,
    warmup: int,
    tmp: Path,
    only: Sequence[str] = (),
) -> tuple[dict[str, Any], list[Figure]]:
    """Every method on one case (``only`` those named, where given): the figures as rows with their
    ratios, and the figures themselves."""
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
            *(
                stage_method(clf, encoded, name)
                for name in ("stage", "stage-full", "stage-zeroing", "stage-alti")
            ),
            extract_method(case, clf, tmp / f"run-{case.name}-{dt}"),
        ]
    methods = [m for m in methods if not only or m.name in only]
    figures = harness.measure(case.name, methods, rounds, warmup, device)
    ceiling = {f.dtype: f for f in figures if f.method == "ceiling"}
    seed = next((f for f in figures if f.method == "seed"), None)
    rows = []
    for f in figures:
        base = ceiling.get(f.dtype, ceiling.get("float32"))
        rows.append(
            f.as_dict()
            | {
                "vs_ceiling": round(harness.ratio(f, base), 3),
                "vs_ceiling_paired": round(harness.ratio(f, base, paired=True), 3),
                "vs_seed": round(harness.ratio(f, seed), 3),
                "vs_seed_paired": round(harness.ratio(f, seed, paired=True), 3),
            }
        )
    block = {
        "model_dir": str(case.model_dir),
        "note": case.note,
        "corpus": str(
            case.corpus.relative_to(harness.ROOT) if case.corpus.is_relative_to(harness.ROOT) else case.corpus
        ),
        "reviews": len(case.texts),
        "mean_tokens": round(figures[0].tokens / figures[0].reviews, 1),
        "max_length": case.max_length,
        "figures": rows,
    }
    return block, figures


def format_table(rows: Sequence[dict[str, Any]], peak_tflops: float | None = None) -> str:
    """One line per method; with a known bf16 peak, the TFLOP/s reached and its share of it."""
    head = (
        f"{'method':<15}{'dtype':<10}{'reviews/s':>10}{'tokens/s':>11}{'padding':>9}{'peak RSS MB':>13}"
        f"{'+MB':>8}{'x ceiling':>10}{'paired':>8}{'x seed':>8}{'paired':>8}{'spread':>8}"
    ) + (f"{'TFLOP/s':>9}{'of peak':>9}" if peak_tflops else "")
    lines = [head, "-" * len(head)]
    for r in rows:
        line = (
            f"{r['method']:<15}{r['dtype']:<10}{r['reviews_per_s']:>10.1f}{r['tokens_per_s']:>11.0f}"
            f"{r['padding_share']:>9.1%}{r['peak_rss_mb']:>13.0f}{r['rss_delta_mb']:>8.0f}{r['vs_ceiling']:>10.2f}"
            f"{r['vs_ceiling_paired']:>8.2f}{r['vs_seed']:>8.2f}{r['vs_seed_paired']:>8.2f}{r['spread']:>8.1%}"
        )
        if peak_tflops and r["tflops_per_s"] is not None:
            line += f"{r['tflops_per_s']:>9.1f}{r['tflops_per_s'] / peak_tflops:>9.1%}"
        lines.append(line)
    return "\n".join(lines)


def cpu_ratios(figures: Sequence[Figure]) -> str:
    """CPU seconds of each ``stage-*`` method over ``stage``'s, per dtype: the best rounds' and the median
    of the rounds' (interleaved, so a busy spell of the machine hits both)."""
    stage = {f.dtype: f for f in figures if f.method == "stage"}
    lines = []
    for f in figures:
        if f.method.startswith("stage-") and (base := stage.get(f.dtype)) is not None:
            paired = np.median([a / b for a, b in zip(f.cpu_seconds, base.cpu_seconds, strict=True)])
            best = min(f.cpu_seconds) / min(base.cpu_seconds)
            lines.append(f"   CPU time {f.method} / stage ({f.dtype}): {best:.2f} best, {paired:.2f} paired")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="zh,minilm", help=f"comma-separated: {', '.join(harness.CASES)}")
    ap.add_argument("--n", type=int, default=None, help=f"reviews of each case (default: {DEFAULT_N})")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per method")
    ap.add_argument("--warmup", type=int, default=1, help="untimed passes of every method first")
    ap.add_argument("--methods", default="", help="comma-separated methods to time (default: all)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda")
    ap.add_argument(
        "--dtypes", default="auto", help="auto: float32, and bfloat16 where the device computes it natively"
    )
    ap.add_argument("--out", type=Path, default=None, help="JSON file (default bench/results/<device>.json)")
    args = ap.parse_args(argv)
    tune_runtime()  # as every bertattn command does, before torch computes anything
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    import transformers

    transformers.logging.set_verbosity_error()  # no load reports of the seeded MiniLM head
    transformers.logging.disable_progress_bar()
    device = resolve_device(args.device)
    dtypes = [d for d in args.dtypes.split(",") if d]
    if dtypes == ["auto"]:
        dtypes = ["float32", "bfloat16"] if harness.native_bf16(device) else ["float32"]
    info = harness.machine(device)
    peak = info.get("bf16_peak_tflops")
    settings = {"n": args.n or DEFAULT_N, "rounds": args.rounds, "warmup": args.warmup, "dtypes": dtypes,
                "batch_tokens": BATCH_TOKENS, "max_batch_size": MAX_BATCH_SIZE}  # fmt: skip
    results: dict[str, Any] = {"machine": info, "settings": settings, "models": {}}
    print(f"bench on {info.get('device_name', device)}, {torch.get_num_threads()} torch threads, {dtypes}")
    with tempfile.TemporaryDirectory(prefix="bertattn-bench-") as tmp:
        for name in [m for m in args.models.split(",") if m]:
            n = args.n or DEFAULT_N.get(name, 512)
            print(f"\n== {name}: {n} reviews, {args.rounds} rounds after {args.warmup} warm-up", flush=True)
            case = harness.prepare_case(name, n, Path(tmp))
            only = [m for m in args.methods.split(",") if m]
            block, figures = bench_case(case, device, dtypes, args.rounds, args.warmup, Path(tmp), only)
            print(f"   {block['note']}; {block['corpus']}, mean {block['mean_tokens']} tokens a review")
            print(format_table(block["figures"], peak), flush=True)
            print(cpu_ratios(figures), flush=True)
            results["models"][name] = block
    slug = info.get("device_name") or f"cpu-{info['cpu_count']}core" + (
        "-bf16" if info["native_bf16"] else ""
    )
    out = args.out or harness.RESULTS / f"{''.join(c if c.isalnum() else '-' for c in slug).lower()}.json"
    harness.write_results(out, results)
    print(f"\nwrote {out}")
    return results


if __name__ == "__main__":
    main()
