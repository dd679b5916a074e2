"""Texts -> token ids and character offsets, with truncation recorded per review.

Usage::

    encoded = encode_texts(tokenizer, ["好吃", "slow service"], max_length=512)
    encoded[0].ids, encoded[0].offsets, encoded[0].truncated

Needs a fast (Rust-backed) tokenizer: only it gives offsets into the original text, which is how a
token is traced back to its characters (BERT's Chinese tokenizer drops whitespace such as ``\\xa0``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Reviews longer than this many characters per allowed token are cut before tokenizing (the cut is
#: kept only when the cut text still overflows, so the result is exact); keeps a 1 MB review cheap.
_CHARS_PER_TOKEN_CAP = 32


@dataclass(frozen=True)
class Encoded:
    """One review's model input: ``ids`` (n,) int32 with [CLS]/[SEP]; ``offsets`` (n, 2) int32."""

    ids: np.ndarray
    offsets: np.ndarray
    truncated: bool

    @property
    def n_tokens(self) -> int:
        return int(self.ids.shape[0])


def encode_texts(tokenizer, texts: Sequence[str], max_length: int) -> list[Encoded]:
    """Tokenize a block of texts; each result holds the special tokens and at most ``max_length`` ids."""
    if not texts:
        return []
    cap = max_length * _CHARS_PER_TOKEN_CAP
    cut = [t[:cap] if len(t) > cap else t for t in texts]
    batch = tokenizer(
        list(cut),
        truncation=True,
        max_length=max_length,
        return_offsets_mapping=True,
        return_attention_mask=False,
        return_token_type_ids=False,
    )
    out = []
    for i, enc in enumerate(batch.encodings):
        truncated = bool(enc.overflowing)
        if len(cut[i]) != len(texts[i]) and not truncated:
            # the cut text fit: tokenize the whole review (rare: mostly whitespace or dropped characters)
            enc = tokenizer(
                texts[i], truncation=True, max_length=max_length, return_offsets_mapping=True
            ).encodings[0]
            truncated = bool(enc.overflowing)
        elif len(cut[i]) != len(texts[i]):
            truncated = True
        out.append(
            Encoded(
                ids=np.asarray(enc.ids, dtype=np.int32),
                offsets=np.asarray(enc.offsets, dtype=np.int32).reshape(-1, 2),
                truncated=truncated,
            )
        )
    return out
