"""A character vocabulary for a classifier trained from scratch (BERT's Chinese tokenizer splits CJK
text into characters), and the WordPiece tokenizer over it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..errors import ModelError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def _is_cjk(ch: str) -> bool:
    """The code-point ranges BERT's tokenizer splits into single characters."""
    cp = ord(ch)
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


def char_tokenizer(vocab: dict[str, int], max_length: int = 512) -> Any:
    """A BERT WordPiece tokenizer over ``vocab`` (lowercasing, CJK split into characters).

    In transformers 5 ``BertTokenizer`` is the fast, Rust-backed class and takes the vocabulary itself;
    ``BertTokenizerFast(vocab_file=...)`` would silently ignore the file, hence the size check.
    """
    from transformers import BertTokenizer

    tok = BertTokenizer(
        vocab=dict(vocab),
        do_lower_case=True,
        tokenize_chinese_chars=True,
        model_max_length=max_length,
    )
    if len(tok) != len(vocab):
        raise ModelError(f"tokenizer holds {len(tok)} tokens, the vocabulary {len(vocab)}: it was ignored")
    return tok


def build_char_vocab(texts: Sequence[str], min_count: int = 2) -> dict[str, int]:
    """Special tokens, then every character seen ``min_count`` times, then ``##c`` continuations.

    Characters are counted after the tokenizer's own normalisation and pre-splitting (lowercase, accents
    stripped, CJK split, punctuation split), so the vocabulary holds exactly what WordPiece will look up.
    A non-CJK character also gets ``##c`` when it occurs inside a word, so WordPiece can spell any Latin
    word made of known characters instead of turning the whole word into ``[UNK]``.
    """
    base = char_tokenizer({t: i for i, t in enumerate(SPECIAL_TOKENS)}).backend_tokenizer
    counts: Counter[str] = Counter()
    inner: set[str] = set()
    for text in texts:
        normed = base.normalizer.normalize_str(text)
        for word, _ in base.pre_tokenizer.pre_tokenize_str(normed):
            counts.update(word)
            inner.update(ch for ch in word[1:] if not _is_cjk(ch))
    kept = sorted((c for c, n in counts.items() if n >= min_count), key=lambda c: (-counts[c], c))
    tokens = [*SPECIAL_TOKENS, *kept, *(f"##{c}" for c in kept if c in inner)]
    return {t: i for i, t in enumerate(tokens)}
