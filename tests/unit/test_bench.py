"""bench/ on a handful of reviews with a tiny model: figures are produced and sane (not fast)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import load_bench
from transformers import AutoTokenizer

bench = load_bench()
drift = load_bench("drift")
harness = bench.harness


@pytest.mark.xdist_group("compile")  # stage-alti compiles ALTI's kernel, as the ALTI tests do
def test_every_method_sees_the_same_reviews_and_tokens(tiny_en_dir, drug_sample, tmp_path, capsys):
    sample = tmp_path / "sample.parquet"
    texts = harness.sample_corpus(Path(drug_sample), 12, sample)
    case = harness.Case("tiny", Path(tiny_en_dir), Path(drug_sample), sample, texts, max_length=128)
    block, figures = bench.bench_case(
        case, torch.device("cpu"), ["float32", "bfloat16"], rounds=2, warmup=0, tmp=tmp_path
    )
    json.dumps(block)  # what main writes

    tok = AutoTokenizer.from_pretrained(case.model_dir)
    lengths = [len(x) for x in tok(case.texts, truncation=True, max_length=128)["input_ids"]]
    by = {(f["method"], f["dtype"]): f for f in block["figures"]}
    assert len(by) == 1 + 7 * 2  # the seed, then seven batched methods per dtype
    for f in block["figures"]:
        assert f["reviews"] == 12
        assert f["tokens"] == sum(lengths), f["method"]
        assert f["padded_slots"] >= f["tokens"]
        assert 0 < f["best_s"] <= f["median_s"] and len(f["rounds_s"]) == 2
        assert math.isfinite(f["reviews_per_s"]) and f["reviews_per_s"] > 0
        assert f["tokens_per_s"] == pytest.approx(f["reviews_per_s"] * sum(lengths) / 12, rel=1e-3)
        assert f["peak_rss_mb"] > 10 and f["rss_delta_mb"] >= 0
    assert by[("seed", "float32")]["padding_share"] == 0
    assert by[("seed", "float32")]["vs_seed"] == 1
    # the pipeline pads batches of 32 in corpus order: here one batch of all 12 reviews
    assert by[("pipeline", "float32")]["padded_slots"] == 12 * max(lengths)
    for dt in ("float32", "bfloat16"):
        assert by[("ceiling", dt)]["vs_ceiling"] == 1
        slots = {
            by[(m, dt)]["padded_slots"] for m in ("ceiling", "stage", "stage-full", "stage-alti", "extract")
        }
        assert len(slots) == 1  # the same batches
        assert by[("extract", dt)]["detail"]["model"] > 0
    # the ratios printed agree with the figures
    for f in figures:
        assert f.reviews_per_s == pytest.approx(f.reviews / min(f.seconds))
    assert "stage-zeroing  bfloat16" in bench.format_table(block["figures"])


def test_flops_of_bert_base_match_the_parameter_count():
    from transformers import BertConfig

    config = BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
    # encoder matmul weights of bert-base: 12 x (4 x 768^2 + 2 x 768 x 3072) = 84.9M
    per_token = 2 * 84_934_656
    assert harness.matmul_flops(config, [(1, 1)]) == per_token + 4 * 12 * 768
    assert harness.matmul_flops(config, [(8, 100)]) == 800 * (per_token + 4 * 12 * 100 * 768)
    assert harness.bf16_peak("NVIDIA H100 80GB HBM3") == 989.0
    assert harness.bf16_peak("NVIDIA H100 PCIe") == 756.0
    assert harness.bf16_peak("NVIDIA A100-SXM4-80GB") == 312.0
    assert harness.bf16_peak("NVIDIA H200 NVL") == 835.0 and harness.bf16_peak("NVIDIA H100 NVL") == 835.0
    assert harness.bf16_peak("NVIDIA GB200") == 2500.0 and harness.bf16_peak("NVIDIA B200") == 2250.0
    assert harness.bf16_peak("Some Unknown GPU") is None


def test_drift_is_zero_against_itself_and_small_in_bf16(tiny_en_dir, drug_sample, tmp_path):
    same = drift.precision_drift(
        Path(tiny_en_dir), Path(drug_sample), tmp_path / "a", "cpu", 128, low="float32"
    )
    n = pq.read_table(drug_sample).num_rows
    assert same["reviews"] == n and same["flipped"] == 0
    assert same["weight_max_abs_diff"] == 0 and same["prob_max_abs_diff"] == 0
    # 3 layers: layer -2 only; 4 heads; content tokens of every review
    tok = AutoTokenizer.from_pretrained(tiny_en_dir)
    texts = pq.read_table(drug_sample).column("text").to_pylist()
    assert same["weights"] == sum(
        4 * (len(x) - 2) for x in tok(texts, truncation=True, max_length=128)["input_ids"]
    )

    low = drift.precision_drift(Path(tiny_en_dir), Path(drug_sample), tmp_path / "b", "cpu", 128)
    assert low["reviews"] == n and 0 <= low["flipped"] <= n
    assert 0 < low["weight_mean_abs_diff"] <= low["weight_max_abs_diff"] < 0.5
    assert low["runs"]["bfloat16"]["scored"] == n


def test_repeated_corpus_has_no_ids_and_cycles(drug_sample, tmp_path):
    out = harness.repeated_corpus(Path(drug_sample), 60, tmp_path / "rep.parquet")
    table = pq.read_table(out)
    src = pq.read_table(drug_sample)
    assert table.column_names == ["text", "label"] and table.num_rows == 60
    texts = table.column("text").to_pylist()
    assert texts[: src.num_rows] == src.column("text").to_pylist()
    assert texts[src.num_rows : 2 * src.num_rows] == src.column("text").to_pylist()
    with_ids = pq.read_table(
        harness.repeated_corpus(Path(drug_sample), 60, tmp_path / "ids.parquet", ids=True)
    )
    assert with_ids.column("doc_id").to_pylist() == [str(i) for i in range(60)]


# -- the batching the bench measures: cuts that minimise padding plus a per-batch cost ----------------


def _best_cut_cost(lengths: list[int], overhead: int) -> int:
    """Brute force: the cheapest split of the sorted lengths into runs (padded slots + overhead each)."""
    s = sorted(lengths)
    best = {0: 0}
    for j in range(1, len(s) + 1):
        best[j] = min(best[i] + (j - i) * s[j - 1] + overhead for i in range(j))
    return best[len(s)]


@pytest.mark.parametrize("seed", range(20))
def test_bucket_batches_finds_the_cheapest_cut_when_the_budget_does_not_bind(seed):
    from bertattn_batch.extract.batching import bucket_batches

    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 60, size=int(rng.integers(1, 12))).tolist()
    overhead = int(rng.integers(0, 40))
    batches = bucket_batches(lengths, batch_tokens=10**6, max_batch_size=100, overhead_tokens=overhead)
    cost = sum(len(b) * max(lengths[i] for i in b) + overhead for b in batches)
    assert cost == _best_cut_cost(lengths, overhead)
    assert sorted(int(i) for b in batches for i in b) == list(range(len(lengths)))
    longest = [max(lengths[i] for i in b) for b in batches]
    assert longest == sorted(longest, reverse=True)  # longest batches first


def test_default_corpus_pads_under_ten_percent(zh_rows):
    """Windows of 4096 reviews of the default corpus (lengths: characters + [CLS]/[SEP], at most 256)."""
    from helpers import padded_share

    from bertattn_batch.extract.batching import bucket_batches

    lengths = [min(len(r["text"]) + 2, 256) for r in zh_rows]
    real = slots = 0
    for start in range(0, len(lengths), 4096):
        window = lengths[start : start + 4096]
        r, s = padded_share(window, bucket_batches(window, 16384, 256))
        real, slots = real + r, slots + s
    assert real == sum(lengths)
    assert 1 - real / slots < 0.05


def test_paired_ratios_compare_rounds_with_their_own_round():
    # the ceiling had one lucky round (1 s) that the other method never met: best against best says
    # 0.5, while within each round the two ran alike (ratios 0.5, 1, 1: median 1)
    ceiling = harness.Figure("m", "ceiling", "float32", reviews=10, seconds=[1.0, 3.0, 2.0])
    other = harness.Figure("m", "extract", "float32", reviews=10, seconds=[2.0, 3.0, 2.0])
    assert harness.ratio(other, ceiling) == pytest.approx(0.5)
    assert harness.ratio(other, ceiling, paired=True) == pytest.approx(1.0)
    assert math.isnan(harness.ratio(other, None))  # no baseline measured


def test_words_times_aggregate_and_extraction_with_and_without_words(
    tiny_zh_dir, zh_rows, tmp_path, monkeypatch
):
    """bench/words.py on 40 Chinese reviews: every pair timed, and the shares it prints are its figures'."""
    words = load_bench("words")
    corpus = tmp_path / "zh.parquet"
    pq.write_table(pa.Table.from_pylist([dict(r) for r in zh_rows[:40]]), corpus)
    monkeypatch.setattr(words.harness, "zh_model", lambda: (Path(tiny_zh_dir), 128))
    monkeypatch.setattr(words.harness, "ZH_CORPUS", corpus)
    out = words.main(["--rounds", "2", "--out", str(tmp_path / "words.json")])
    assert (
        json.loads((tmp_path / "words.json").read_text())["aggregate_words_add"] == out["aggregate_words_add"]
    )
    for block, pair in (("aggregate", ("none", "auto")), ("extract", ("none", "jieba"))):
        for name in pair:
            assert len(out[block][name]["wall"]) == 2 and min(out[block][name]["cpu"]) > 0
    none, auto = (min(out["aggregate"][k]["wall"]) for k in ("none", "auto"))
    assert out["aggregate_words_add"]["wall"] == pytest.approx(auto / none - 1, abs=1e-3)
