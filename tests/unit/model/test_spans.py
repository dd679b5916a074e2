"""Every token's character span points at that token's characters in the original text."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import SEED_TEXT
from helpers import read_attention

from bertattn_batch.config import JobSpec
from bertattn_batch.engines import run_job
from bertattn_batch.model import Classifier
from bertattn_batch.model.encode import encode_texts


def _check_spans(text: str, tokens: list[str], starts: list[int], ends: list[int]) -> None:
    for tok, s, e in zip(tokens, starts, ends, strict=True):
        assert 0 <= s < e <= len(text)
        piece = text[s:e]
        if tok == "[UNK]":
            assert piece.strip(), "an [UNK] still maps to real characters"
        else:
            assert piece.lower() == tok.removeprefix("##"), (tok, piece)


def test_seed_review_spans(tiny_zh_dir, tmp_path):
    """The seed review is full of \\xa0, which BERT's Chinese tokenizer drops; spans must still line up."""
    src = tmp_path / "seed.parquet"
    pq.write_table(pa.table({"text": [SEED_TEXT]}), src)
    out = tmp_path / "run"
    run_job(JobSpec(inputs=[str(src)], model=str(tiny_zh_dir), out=str(out), progress=False))
    attn = read_attention(out)
    attn = attn.filter(pc.equal(attn.column("head"), 0))  # one head: each token once, in position order
    tokens = attn.column("token").to_pylist()
    _check_spans(SEED_TEXT, tokens, attn.column("start").to_pylist(), attn.column("end").to_pylist())
    assert "[UNK]" in tokens  # 催 is left out of this tokenizer's vocabulary on purpose
    assert [
        SEED_TEXT[s:e]
        for s, e in zip(attn.column("start").to_pylist(), attn.column("end").to_pylist(), strict=True)
    ] == [c for c in SEED_TEXT if not c.isspace()]


def test_english_wordpiece_spans(minilm_dir, drug_rows):
    clf = Classifier.load(str(minilm_dir))
    texts = [r["text"] for r in drug_rows[:50]]
    for text, enc in zip(texts, encode_texts(clf.tokenizer, texts, clf.max_length), strict=True):
        tokens = clf.tokenizer.convert_ids_to_tokens(enc.ids[1:-1].tolist())
        _check_spans(text, tokens, enc.offsets[1:-1, 0].tolist(), enc.offsets[1:-1, 1].tolist())


def test_truncation_is_recorded(minilm_dir):
    clf = Classifier.load(str(minilm_dir), max_length=16)
    long_text, short_text = "word " * 40, "two words"
    a, b = encode_texts(clf.tokenizer, [long_text, short_text], clf.max_length)
    assert a.truncated and a.n_tokens == 16
    assert not b.truncated and b.n_tokens == 4
    huge = "x " * 300_000  # far past the pre-cut: the flag and the length must not change
    (c,) = encode_texts(clf.tokenizer, [huge], clf.max_length)
    assert c.truncated and c.n_tokens == 16
    padded = " " * 10_000 + "tail"  # the pre-cut would drop the only word: it must not
    (d,) = encode_texts(clf.tokenizer, [padded], 4)
    assert not d.truncated and d.n_tokens == 3


def test_pre_cut_matches_the_tokenizer_on_the_whole_text(minilm_dir, tiny_zh_dir):
    """Long reviews are cut before tokenizing; the ids and the truncation flag must still be the
    tokenizer's own on the whole text (oracle: the library tokenizer, no cut), whatever the words, the
    length limit and the side truncation keeps."""
    from transformers import AutoTokenizer

    long_word = "a" * 101 + " " + "b" * 101 + " " + "c" * 150  # words over 100 letters are one [UNK]
    cases = [
        long_word,
        "x" * 400,  # one word, cut in its middle
        "word " * 200,
        "long" + "y" * 300 + " tail",
        "好" * 600,  # no whitespace at all
        "差评" * 100 + "a" * 200,
        "ok " + "z" * 90 + " " + "w" * 500,
        "abcdefghij" * 15,  # [UNK] whole (150 letters), WordPiece pieces when cut to 96
        "good " * 25 + "ok " + "terrible awful bad " * 10,  # left truncation keeps the end
        "e\u0301\u0301" * 120,  # 360 characters; 120 after stripping accents, but 86 when cut at 256
    ]
    for model_dir in (minilm_dir, tiny_zh_dir):
        for side in ("right", "left"):
            tok = AutoTokenizer.from_pretrained(model_dir, truncation_side=side)
            for max_length in (3, 4, 5, 6, 8, 16):
                got = encode_texts(tok, cases, max_length)
                for text, enc in zip(cases, got, strict=True):
                    full = tok(text, truncation=False)["input_ids"]
                    want = tok(text, truncation=True, max_length=max_length)["input_ids"]
                    assert enc.ids.tolist() == want, (text[:20], side, max_length)
                    assert enc.truncated == (len(full) > max_length), (text[:20], side, max_length)


def test_pre_cut_does_not_split_words_at_deleted_control_characters(minilm_dir):
    """Python's ``\\s`` matches \\x0b, \\x0c, \\x1c-\\x1f and \\x85, but BERT's normalizer deletes them as
    control characters, so "un\\x1fbelievable" is one word, "unbelievable"; the pre-cut must not take them
    for a word boundary and keep the pieces of the word as the cut text spells it."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(minilm_dir)
    for control in "\x0b\x0c\x1c\x1d\x1e\x1f\x85":
        text = " " * 90 + f"un{control}believable drug"  # longer than 3 * 32 characters: cut at 96
        (enc,) = encode_texts(tok, [text], 3)
        want = tok(text, truncation=True, max_length=3)["input_ids"]
        assert tok.convert_ids_to_tokens(want)[1] == "unbelievable"
        assert enc.ids.tolist() == want, repr(control)
        assert enc.truncated


def _sentencepiece_tokenizer():
    """An XLM-R-style tokenizer: Unigram pieces behind a Metaspace pre-tokenizer that prepends '▁'."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    pieces = ["<s>", "<pad>", "</s>", "<unk>", "\u2581", "好", "吃", "\u2581good", "\u2581ok", "é", "e"]
    backend = Tokenizer(models.Unigram([(p, -1.0 if len(p) > 1 else -3.0) for p in pieces], unk_id=3))
    backend.normalizer = normalizers.NFKC()
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, cls_token="<s>", sep_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def test_a_prepended_word_mark_spans_no_character():
    """Metaspace puts '▁' before the first word; alone as a token (before '好', which has no '▁好'
    piece) it stands for no character of the text, yet the tokenizer aligns it to the word's first
    character, which the next token also covers. A '▁' for a real space keeps that space."""
    tok = _sentencepiece_tokenizer()
    text = "好吃 好 good"
    (enc,) = encode_texts(tok, [text], 32)
    tokens = tok.convert_ids_to_tokens(enc.ids[1:-1].tolist())
    assert tokens == ["\u2581", "好", "吃", "\u2581", "好", "\u2581good"]
    spans = [text[s:e] for s, e in enc.offsets[1:-1].tolist()]
    assert spans == ["", "好", "吃", " ", "好", " good"]
    assert enc.offsets[1].tolist() == [0, 0]


def test_a_word_mark_left_last_by_truncation_spans_no_character():
    """Cut after a lone '▁', the mark had the span of the first character cut away (no next token
    told it was the word's); one for a real space still spans that space."""
    tok = _sentencepiece_tokenizer()
    text = "好吃 好 good"
    (first,) = encode_texts(tok, [text], 3)  # <s> ▁ </s>
    assert first.truncated and first.offsets[1].tolist() == [0, 0]
    (space,) = encode_texts(tok, [text], 6)  # <s> ▁ 好 吃 ▁ </s>
    assert space.truncated and [text[s:e] for s, e in space.offsets[1:-1].tolist()] == ["", "好", "吃", " "]


def _byte_level_tokenizer(add_prefix_space: bool):
    """A RoBERTa-style tokenizer: byte-level BPE whose post-processor trims spaces off the offsets."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(["good food bad service", "good good"] * 50, trainer)
    backend.post_processor = processors.RobertaProcessing(
        ("</s>", 2), ("<s>", 0), trim_offsets=True, add_prefix_space=add_prefix_space
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, cls_token="<s>", sep_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


@pytest.mark.parametrize("add_prefix_space", [False, True])
def test_a_space_token_spans_its_space(add_prefix_space):
    """Byte-level BPE spells a space that starts no word (a trailing one, one of two in a row) as the
    token 'Ġ' alone, and its offset trimming leaves that token an empty span: it gets its space."""
    tok = _byte_level_tokenizer(add_prefix_space)
    for text, want in [
        ("good ", ["good", " "]),
        ("good  bad", ["good", " ", "bad"]),
        ("good \t food  ", ["good", " ", "\t", "food", " ", " "]),
        ("good\n", ["good", "\n"]),
    ]:
        (enc,) = encode_texts(tok, [text], 32)
        spans = [text[s:e] for s, e in enc.offsets[1:-1].tolist()]
        assert spans == want, (text, spans, tok.convert_ids_to_tokens(enc.ids.tolist()))
    # a text that opens with its own space; a mark prepended to one that does not keeps no character
    # ('好' is three bytes, three tokens, each aligned with the character)
    prepended = [""] if add_prefix_space else []
    for text, want in [(" ", [" "]), ("好 ", [*prepended, "好", "好", "好", " "])]:
        (enc,) = encode_texts(tok, [text], 32)
        assert [text[s:e] for s, e in enc.offsets[1:-1].tolist()] == want, text


def test_spans_keep_the_combining_marks_a_token_was_made_with(minilm_dir):
    """A mark the normalizer folds into the token before it (NFKC: 'e' + U+0301 is 'é'; accent
    stripping drops it) belongs to that token's span: the tokenizer aligns the token with the base
    letter only, leaving the mark to no token."""
    from transformers import AutoTokenizer

    cases = [
        (_sentencepiece_tokenizer(), "ok e\u0301e\u0301 good", ["ok", " ", "e\u0301", "e\u0301", " good"]),
        (_sentencepiece_tokenizer(), "e\u0301", ["", "e\u0301"]),  # the last token reaches the text's end
        (AutoTokenizer.from_pretrained(minilm_dir), "cafe\u0301 ok", ["cafe\u0301", "ok"]),
        (AutoTokenizer.from_pretrained(minilm_dir), "नमस्ते", None),  # the virama U+094D is stripped
    ]
    for tok, text, want in cases:
        (enc,) = encode_texts(tok, [text], 32)
        spans = [text[s:e] for s, e in enc.offsets[1:-1].tolist()]
        if want is not None:
            assert spans == want, (text, spans)
        covered = {i for s, e in enc.offsets[1:-1].tolist() for i in range(s, e)}
        assert {i for i, c in enumerate(text) if not c.isspace()} <= covered, (text, spans)


def test_encoding_on_several_threads_gives_what_one_thread_gives(
    minilm_dir, tiny_zh_dir, drug_rows, zh_rows, monkeypatch
):
    """The parallel encoder splits the texts into one share per thread, each encoded on its own thread
    with its own tokenizer copy; put back together, every review's ids, spans and truncation flag are
    those of a single-thread encode, in input order, whatever the number of texts (fewer than two per
    thread: one thread) and whichever side the tokenizer truncates."""
    import threading

    from transformers import AutoTokenizer

    from bertattn_batch.model import encode as encode_module
    from bertattn_batch.model.encode import Encoder

    shares: list[tuple[str, int]] = []
    real = encode_module.encode_texts

    def recording(tok, texts, max_length):
        shares.append((threading.current_thread().name, len(texts)))
        return real(tok, texts, max_length)

    for model, rows, side in (
        (minilm_dir, drug_rows, "right"),
        (tiny_zh_dir, zh_rows, "right"),
        (minilm_dir, drug_rows, "left"),
    ):
        tok = AutoTokenizer.from_pretrained(str(model))
        tok.truncation_side = side
        texts = [r["text"] for r in rows[:101]] + ["", "  ", "x" * 5000]
        want = encode_texts(tok, texts, 48)
        assert any(e.truncated for e in want) and not all(e.truncated for e in want)
        for threads in (1, 2, 3, 4):
            with Encoder(tok, 48, threads) as encode:
                monkeypatch.setattr(encode_module, "encode_texts", recording)
                for n in (len(texts), 9, 5, 1, 0):
                    shares.clear()
                    got = encode(texts[-n:] if n else [])
                    assert len(got) == n
                    for g, w in zip(got, want[len(want) - n :], strict=True):
                        assert g.truncated == w.truncated
                        assert g.ids.tolist() == w.ids.tolist()
                        assert g.offsets.tolist() == w.offsets.tolist()
                    if threads > 1 and n >= 2 * threads:  # a share per thread, each on its own thread
                        assert len({name for name, _ in shares}) == len(shares) == threads
                        assert max(k for _, k in shares) - min(k for _, k in shares) <= 1
                    else:
                        assert len(shares) == 1
                monkeypatch.setattr(encode_module, "encode_texts", real)
