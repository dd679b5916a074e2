"""Property-based tests of slicing and scaling: random batch sizes, review lengths, paddings and weights.

Run: ``.venv/bin/python -m pytest -q tests/test_properties.py`` (a few seconds; tiny tensors only).
"""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
import torch
from helpers import tiny_bert_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import bertattn_batch.extract.tables as extract_tables
from bertattn_batch.extract import Extractor, ScoredRow, Window, score_rows
from bertattn_batch.extract.batching import bucket_batches
from bertattn_batch.extract.tables import minmax_scale
from bertattn_batch.model import Outputs
from bertattn_batch.model.capture import ClsRowCapture, eager_rows
from bertattn_batch.model.encode import Encoded

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TORCH = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
PAD_VALUE = -1.0  # what the fake model puts on padding: no real attention weight is negative
NORM_FACTOR = np.float32(3.0)  # the fake model's norm-based weights: its rows times this
CLS, SEP, PAD, FIRST_ID = 2, 3, 0, 5


def plain_minmax(row: list[float]) -> list[float]:
    """Min-max of one head's weights written out: (w - min) / (max - min), all 0 when max == min."""
    lo, hi = min(row), max(row)
    return [(w - lo) / (hi - lo) if hi > lo else 0.0 for w in row]


# -- (a) per-head min-max scaling ---------------------------------------------------------------------


@st.composite
def head_weights(draw) -> np.ndarray:
    """(L, H, m) float32 weights: softmax of random logits, with some heads flat (no range)."""
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 12)))
    logits = draw(arrays(np.float32, shape, elements=st.floats(-20, 20, width=32)))
    flat = draw(arrays(np.bool_, shape[:2]))
    logits[flat] = logits[flat][:, :1]  # a flat head: every weight equal
    w = np.exp(logits - logits.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)).astype(np.float32)


@FAST
@given(head_weights())
def test_minmax_scale_is_plain_per_head_minmax(w):
    n = w.shape[-1]
    scaled, lo, hi = minmax_scale(w.reshape(-1), np.full(w.size // n, n))
    scaled, lo, hi = scaled.reshape(w.shape), lo.reshape(w.shape[:-1]), hi.reshape(w.shape[:-1])
    assert scaled.shape == w.shape and scaled.dtype == np.float32
    assert ((scaled >= 0) & (scaled <= 1)).all()
    for idx in np.ndindex(*w.shape[:2]):
        row = w[idx].astype(np.float64).tolist()
        np.testing.assert_allclose(scaled[idx], plain_minmax(row), atol=1e-6, rtol=0)
        assert lo[idx] == min(row) and hi[idx] == max(row)
        if max(row) > min(row):
            assert scaled[idx][int(np.argmax(w[idx]))] == 1.0
            assert scaled[idx][int(np.argmin(w[idx]))] == 0.0
        else:
            assert (scaled[idx] == 0).all()


# -- (b) per-review slicing of padded [CLS] rows, through score_rows and Extractor --------------------


class PaddedRowsModel:
    """Stands in for Classifier: answers a batch with each review's known [CLS] rows, right-padded
    to one (B, L, H, S) array whose padding holds PAD_VALUE (and some extra width), as a real batch."""

    device = torch.device("cpu")
    device_type = "cpu"
    oom_tokens = None

    def __init__(
        self,
        truth: dict[int, np.ndarray],
        extra: int,
        labels: int,
        layers: int,
        heads: int,
        value_zeroing: bool = False,
    ) -> None:
        self.value_zeroing = value_zeroing
        self.contributions = None  # no whole-model contributions (extract --contributions)
        self.truth = truth  # review key (its ids[1]) -> (L, H, n) weights
        self.extra = extra
        self.labels = [f"label-{i}" for i in range(labels)]
        self.layers = list(range(layers))
        self.num_heads = heads

    def launch(self, ids: list[np.ndarray]) -> SimpleNamespace:
        """Classifier.launch's stand-in: the outputs at once, behind the same ``result()``."""
        outputs = self.forward(ids)
        return SimpleNamespace(result=lambda: outputs)

    def forward(self, ids: list[np.ndarray]) -> Outputs:
        rows = [self.truth[int(x[1])] for x in ids]
        L, H = rows[0].shape[:2]
        S = max(len(x) for x in ids) + self.extra
        padded = np.full((len(ids), L, H, S), PAD_VALUE, dtype=np.float32)  # (B, L, H, S)
        for i, r in enumerate(rows):
            padded[i, :, :, : r.shape[-1]] = r
        logits = np.stack([np.sin(np.arange(len(self.labels)) + int(x[1])) for x in ids])  # (B, C)
        probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        # norms and value zeroing: distinct from the rows, and the latter one value per (layer, token)
        zeroing = padded.sum(axis=2) if self.value_zeroing else None  # (B, L, S)
        return Outputs(probs.astype(np.float32), padded, padded * NORM_FACTOR, zeroing)


@st.composite
def padded_windows(draw):
    B = draw(st.integers(1, 6))
    H = draw(st.integers(1, 3))
    layers = draw(st.lists(st.integers(0, 5), min_size=1, max_size=2, unique=True))
    lengths = draw(st.lists(st.integers(2, 14), min_size=B, max_size=B))
    extra = draw(st.integers(0, 3))
    batch_tokens = draw(st.integers(2, 60))
    max_batch = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    chunk = draw(st.integers(1, 120))  # token rows the extractor builds at once
    return B, H, layers, lengths, extra, batch_tokens, max_batch, seed, chunk


@FAST
@given(padded_windows())
def test_extraction_keeps_exactly_each_reviews_content_positions(case):
    B, H, layers, lengths, extra, batch_tokens, max_batch, seed, chunk = case
    rng = np.random.default_rng(seed)
    vocab_size = FIRST_ID + B + 20
    rows, truth = [], {}
    for i, n in enumerate(lengths):
        ids = rng.integers(FIRST_ID + B, vocab_size, size=n).astype(np.int32)
        ids[0], ids[-1] = CLS, SEP
        if n > 2:
            ids[1] = FIRST_ID + i  # a content token that names the review, for the fake model
        starts = np.cumsum(rng.integers(0, 3, size=n)).astype(np.int32)
        offsets = np.stack([starts, starts + rng.integers(1, 3, size=n)], axis=1).astype(np.int32)
        offsets[0] = offsets[-1] = 0
        enc = Encoded(ids=ids, offsets=offsets, truncated=False)
        # [CLS] + [SEP] alone: the pipeline records no_tokens and never scores the review
        rows.append(ScoredRow(i, f"d{i}", None, "ok" if n > 2 else "no_tokens", encoded=enc))
        truth[int(ids[1])] = rng.uniform(1e-3, 1, size=(len(layers), H, n)).astype(np.float32)
    window = Window(0, B, rows)
    zeroing = seed % 2 == 0
    model = PaddedRowsModel(truth, extra, labels=3, layers=len(layers), heads=H, value_zeroing=zeroing)
    score_rows(model, window.rows, batch_tokens, max_batch)
    vocab = pa.array([f"t{i}" for i in range(vocab_size)])
    with mock.patch.object(extract_tables, "CHUNK_TOKEN_ROWS", chunk):  # chunk borders anywhere, or none
        tables = Extractor(vocab, layers, H, ["a", "b", "c"]).tables(rows)

    attn = {
        c: np.asarray(tables["cls_attention"].column(c).to_pylist())
        for c in tables["cls_attention"].column_names
    }
    summ, tokens = (
        {c: np.asarray(tables[t].column(c).to_pylist()) for c in tables[t].column_names}
        for t in ("head_summary", "tokens")
    )
    preds = tables["predictions"].to_pylist()
    assert [p["n_tokens"] for p in preds] == [n if n > 2 else 0 for n in lengths]
    assert (attn["weight"] != PAD_VALUE).all(), "a padded position leaked into the output"
    docs = [d for i, d in enumerate(attn["doc_id"]) if i == 0 or d != attn["doc_id"][i - 1]]
    assert docs == [r.doc_id for r in rows if r.cls_rows is not None], "token rows out of review order"
    for i, (r, n) in enumerate(zip(rows, lengths, strict=True)):
        sel = attn["doc_id"] == f"d{i}"
        if n == 2:
            assert not sel.any() and r.cls_rows is None
            continue
        real = truth[int(r.encoded.ids[1])]  # (L, H, n)
        assert r.cls_rows.shape == real.shape  # sliced to the review's own length, padding dropped
        order = np.lexsort((attn["position"][sel], attn["head"][sel], attn["layer"][sel]))
        got = {k: v[sel][order].reshape(len(layers), H, n - 2) for k, v in attn.items()}
        for li, layer in enumerate(sorted(layers)):
            k = layers.index(layer)
            for h in range(H):
                assert (got["layer"][li, h] == layer).all() and (got["head"][li, h] == h).all()
                assert got["position"][li, h].tolist() == list(range(1, n - 1))
                np.testing.assert_array_equal(got["weight"][li, h], real[k, h, 1 : n - 1])
                np.testing.assert_array_equal(got["weight_norm"][li, h], real[k, h, 1 : n - 1] * NORM_FACTOR)
                if zeroing:  # one value per (layer, token), the same in every head's rows
                    np.testing.assert_array_equal(got["value_zeroing"][li, h], real[k].sum(0)[1 : n - 1])
                else:
                    assert (got["value_zeroing"][li, h] == None).all()  # noqa: E711 (an object array)

                np.testing.assert_allclose(
                    got["weight_scaled"][li, h], plain_minmax(real[k, h, 1 : n - 1].tolist()), atol=1e-6
                )
        # the review's tokens once each, in position order, whatever its layers and heads
        t = tokens["doc_id"] == f"d{i}"
        assert tokens["position"][t].tolist() == list(range(1, n - 1))
        assert tokens["token_id"][t].tolist() == r.encoded.ids[1 : n - 1].tolist()
        assert tokens["token"][t].tolist() == [f"t{j}" for j in r.encoded.ids[1 : n - 1]]
        assert tokens["start"][t].tolist() == r.encoded.offsets[1 : n - 1, 0].tolist()
        assert tokens["end"][t].tolist() == r.encoded.offsets[1 : n - 1, 1].tolist()
        s = (summ["doc_id"] == f"d{i}") & np.isin(summ["layer"], layers)
        assert s.sum() == len(layers) * H
        for layer, h, n_content, w_cls, w_sep in zip(
            summ["layer"][s],
            summ["head"][s],
            summ["n_content"][s],
            summ["weight_cls"][s],
            summ["weight_sep"][s],
            strict=True,
        ):
            k = layers.index(int(layer))
            assert n_content == n - 2
            assert w_cls == real[k, h, 0] and w_sep == real[k, h, n - 1]


# -- (c) the [CLS]-row capture against transformers' eager attention ----------------------------------


def _tiny_pair(cls: type) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same tiny random BERT twice: under SDPA (captured) and eager (the reference)."""

    def config(impl: str):
        return tiny_bert_config(40, max_position_embeddings=32, attn_implementation=impl)

    torch.manual_seed(7)
    sdpa = cls(config("sdpa")).eval()
    eager = cls(config("eager")).eval()
    eager.load_state_dict(sdpa.state_dict())
    return sdpa, eager


@pytest.fixture(scope="module")
def tiny_models() -> dict[str, tuple[torch.nn.Module, torch.nn.Module]]:
    from transformers import BertForSequenceClassification, BertModel

    return {
        "BertModel": _tiny_pair(BertModel),
        "BertForSequenceClassification": _tiny_pair(BertForSequenceClassification),
    }


@st.composite
def padded_batches(draw):
    lengths = draw(st.lists(st.integers(2, 12), min_size=1, max_size=4))
    extra = draw(st.integers(0, 3))
    layers = draw(st.sampled_from([[0], [1], [0, 1], [1, 0]]))
    kind = draw(st.sampled_from(["BertModel", "BertForSequenceClassification"]))
    seed = draw(st.integers(0, 2**31 - 1))
    return lengths, extra, layers, kind, seed


@TORCH
@given(padded_batches())
def test_capture_equals_eager_cls_row_on_padded_batches(tiny_models, case):
    lengths, extra, layers, kind, seed = case
    sdpa, eager = tiny_models[kind]
    gen = torch.Generator().manual_seed(seed)
    S = max(lengths) + extra
    ids = torch.full((len(lengths), S), PAD, dtype=torch.long)  # (B, S)
    mask = torch.zeros((len(lengths), S), dtype=torch.long)  # (B, S)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(FIRST_ID, 40, (n,), generator=gen)
        ids[i, 0], ids[i, n - 1] = CLS, SEP
        mask[i, :n] = 1
    with torch.inference_mode():
        with ClsRowCapture(sdpa, layers) as capture:
            sdpa(input_ids=ids, attention_mask=mask)
        got = capture.rows(mask)  # (B, L, H, S)
        ref = eager_rows(eager(input_ids=ids, attention_mask=mask, output_attentions=True).attentions, layers)
    assert got.shape == ref.shape == (len(lengths), len(layers), 2, S)
    for i, n in enumerate(lengths):
        torch.testing.assert_close(got[i, :, :, :n], ref[i, :, :, :n], atol=1e-5, rtol=0)
        assert (got[i, :, :, n:] == 0).all(), "padding must get exactly no attention"
        torch.testing.assert_close(got[i].sum(-1), torch.ones(len(layers), 2), atol=1e-5, rtol=0)


# -- (d) token-budget batches -------------------------------------------------------------------------


@FAST
@given(
    st.lists(st.integers(1, 600), max_size=200),
    st.integers(1, 4096),
    st.integers(1, 64),
)
def test_bucket_batches_partition_within_budget(lengths, batch_tokens, max_batch_size):
    batches = bucket_batches(lengths, batch_tokens, max_batch_size)
    flat = sorted(int(i) for b in batches for i in b)
    assert flat == list(range(len(lengths)))  # every review once
    for b in batches:
        assert 1 <= len(b) <= max_batch_size
        longest = max(lengths[i] for i in b)
        assert len(b) == 1 or len(b) * longest <= batch_tokens
