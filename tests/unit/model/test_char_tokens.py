"""The fast path of BERT tokenizers (model/char_tokens.py) gives the tokenizer's own ids, spans and
truncation flags. Oracle: the Rust tokenizer's ``encode_batch`` on the same texts, whole."""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import AddedToken, Tokenizer, normalizers
from transformers import AutoTokenizer

from bertattn_batch.model import char_tokens, encode, encode_texts
from bertattn_batch.model.char_tokens import CharTokens
from bertattn_batch.model.encode import text_backend

#: What a review may hold, weighted toward what could break a per-character shortcut: ideographs in and
#: out of the vocabulary, compatibility ideographs (NFD turns them into others), ASCII and CJK
#: punctuation, letters that lowercase or lose accents (Σ, İ, É), combining marks after an ideograph,
#: deleted control characters, spaces of several kinds, fullwidth letters, emoji, and the text of a
#: special token.
POOL = [
    *"好差吃的很服务不错酒店书价格便宜催豈諸﨑", *"，。！？、；：“”《》（）…",
    *"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", *"abcXYZ019ΣσİÉé", "\u0301", "\u0308", "\x00", "\x1f",
    "\u200b", "\ufeff", " ", "  ", "\t", "\n", "\xa0", "\u3000", *"ｗｉｆｉ１２", "😀", "👍🏽", "[SEP]",
    "[UNK]", "wifi", "unbelievable", "e\u0301",
]  # fmt: skip


def _oracle(backend, texts: list[str], max_length: int, side: str) -> list[tuple[list, list, bool]]:
    backend.enable_truncation(max_length, direction=side)
    backend.no_padding()
    return [
        (e.ids, [list(o) for o in e.offsets], bool(e.overflowing))
        for e in backend.encode_batch(texts, add_special_tokens=True)
    ]


def _fast(chars: CharTokens, texts: list[str], max_length: int, side: str) -> list[tuple[list, list, bool]]:
    got = chars.encode(texts, max_length, keep_start=side == "right")
    assert got is not None
    return [(ids.tolist(), offsets.tolist(), truncated) for ids, offsets, truncated in got]


def _assert_same(backend, texts: list[str], max_length: int, side: str) -> None:
    chars = CharTokens.for_backend(backend)
    assert chars is not None
    got, want = _fast(chars, texts, max_length, side), _oracle(backend, texts, max_length, side)
    for text, g, w in zip(texts, got, want, strict=True):
        assert g == w, (text, max_length, side)


@pytest.fixture(autouse=True)
def _every_block(monkeypatch):
    """Take the fast path on every block, however few of its characters the table holds."""
    monkeypatch.setattr(char_tokens, "_MIN_TABLE_SHARE", 0.0)


@pytest.mark.parametrize("which", ["minilm", "tiny_zh"])
def test_default_corpus_token_for_token(which, minilm_dir, tiny_zh_dir, zh_rows):
    """Every review of the default corpus, with a real pretrained vocabulary (MiniLM's holds a few
    thousand ideographs) and with a character vocabulary, cut long and short from either side."""
    backend = text_backend(AutoTokenizer.from_pretrained(minilm_dir if which == "minilm" else tiny_zh_dir))
    texts = [r["text"] for r in zh_rows]
    _assert_same(backend, texts, 256, "right")
    for max_length, side in [(24, "right"), (24, "left"), (3, "right")]:
        _assert_same(backend, texts[:2000], max_length, side)


def _normalizer_variants() -> list[dict]:
    return [
        dict(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True),
        dict(clean_text=False, handle_chinese_chars=True, strip_accents=None, lowercase=True),
        dict(clean_text=True, handle_chinese_chars=False, strip_accents=None, lowercase=True),
        dict(clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=True),
        dict(clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=False),
        dict(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=False),
    ]


@pytest.mark.parametrize("flags", _normalizer_variants(), ids=lambda f: "-".join(f"{v}" for v in f.values()))
def test_random_texts_under_every_normalizer_setting(flags, minilm_dir):
    """Random texts of the tricky characters of :data:`POOL`, under each setting of BERT's normalizer
    (cased BERTs, no Chinese handling, no cleaning): the table learns which characters stay words of
    their own under it, and the rest goes to the tokenizer."""
    backend = Tokenizer.from_str(text_backend(AutoTokenizer.from_pretrained(minilm_dir)).to_str())
    backend.normalizer = normalizers.BertNormalizer(**flags)
    backend.encode_special_tokens = True
    rng = random.Random(7)
    texts = ["", " ", "好"] + ["".join(rng.choices(POOL, k=rng.randint(1, 40))) for _ in range(600)]
    for max_length, side in [(512, "right"), (8, "right"), (8, "left")]:
        _assert_same(backend, texts, max_length, side)


def test_encode_texts_takes_the_fast_path_and_keeps_its_results(tiny_zh_dir, zh_rows):
    """encode_texts on Chinese reviews uses the table (it fills), with the same results as with the
    fast path turned off."""
    texts = [r["text"] for r in zh_rows[:500]]
    tok = AutoTokenizer.from_pretrained(tiny_zh_dir)
    fast = encode_texts(tok, texts, 64)
    chars = encode._prepared(tok)[1]
    assert chars is not None and (chars._table >= 0).sum() > 500
    encode.without_fast_path(tok)
    slow = encode_texts(tok, texts, 64)
    for a, b in zip(fast, slow, strict=True):
        assert a.ids.tolist() == b.ids.tolist() and a.offsets.tolist() == b.offsets.tolist()
        assert a.truncated == b.truncated


def test_not_taken_where_it_would_not_be_the_tokenizers_own(minilm_dir):
    """Another pre-tokenizer or model, an added token that is not special (it would match across
    characters), or texts it cannot hold: no fast path."""
    base = text_backend(AutoTokenizer.from_pretrained(minilm_dir))
    assert CharTokens.for_backend(base) is not None

    added = Tokenizer.from_str(base.to_str())
    added.add_tokens([AddedToken("好吃", special=False)])
    assert CharTokens.for_backend(added) is None

    state = json.loads(base.to_str())
    state["pre_tokenizer"] = {"type": "Whitespace"}
    assert CharTokens.for_backend(Tokenizer.from_str(json.dumps(state))) is None

    chars = CharTokens.for_backend(base)
    assert chars.encode(["好\ud800"], 16) is None  # a lone surrogate: left to the tokenizer's own path
    assert chars.encode(["好"], 2) is None  # no room for a content token


def test_english_blocks_stay_with_the_tokenizer(minilm_dir, drug_rows, monkeypatch):
    """At the real threshold, English reviews (few characters in the table) are not split into runs."""
    monkeypatch.undo()
    chars = CharTokens.for_backend(text_backend(AutoTokenizer.from_pretrained(minilm_dir)))
    assert chars.encode([r["text"] for r in drug_rows[:50]], 128) is None
    assert chars.encode(["好吃，不贵！wifi 也快"], 128) is not None
