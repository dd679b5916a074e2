"""The words a command reads from a run: the run's own (stored by extraction in the ``tokens`` table), or
those of another rule or dictionary, made again (:mod:`bertattn_batch.extract.words`). A word's raw and
norm-based weights are its tokens' summed; its scaled weight is min-max over the review's words, per
head."""

from __future__ import annotations

import logging
from typing import NamedTuple

import polars as pl

from ..config import WORDS
from ..errors import SpecError
from ..extract.words import CONTINUATION, KEY, dictionary_sha256, word_rule
from ..run import Manifest

log = logging.getLogger(__name__)

#: What identifies one head's row of one review; the same as one integer (ALTI's row, of no head, too).
REVIEW = [KEY, "layer", "head"]
SEGMENT = (
    pl.col(KEY).cast(pl.Int64) * 2**32
    + pl.col("layer").cast(pl.Int64).fill_null(-1) * 2**16
    + pl.col("head").cast(pl.Int64).fill_null(-1)
)
NO_WORDS = "this run has no words (--words none; --words wordpiece or jieba makes them from its tokens)"


class Words(NamedTuple):
    """How a command makes a run's words: ``rule`` (None: no words), jieba's ``user_dict``, whether they
    are the ones the run's ``tokens`` table holds (``stored``), and the tokenizer's ``continuation`` mark
    (None: it has none)."""

    rule: str | None
    user_dict: str | None = None
    stored: bool = False
    continuation: str | None = CONTINUATION

    @property
    def need_texts(self) -> bool:
        """Whether making them again reads the reviews' texts: jieba's, and pieces of a tokenizer with no
        continuation mark (:func:`~bertattn_batch.extract.words.span_words`)."""
        return self.rule == "jieba" or (self.rule is not None and self.continuation is None)


def check_words(words: str | None) -> None:
    """SpecError for a ``--words`` rule that is none of :data:`~bertattn_batch.config.WORDS`."""
    if words is not None and words not in WORDS:
        raise SpecError(f"--words must be one of {', '.join(WORDS)}; got {words!r}")


def run_words(manifest: Manifest, words: str | None = None, user_dict: str | None = None) -> Words:
    """A run's words: by ``words`` or the run's own choice, ``auto`` resolved as the extraction found the
    tokenizer (else WordPiece where pieces carry ``##``); stored where the rule and the dictionary (its
    path, or its content) are the run's."""
    check_words(words)
    spec = manifest.spec
    model = manifest.model
    # a run recorded before the mark was: WordPiece's, the one tokenizer then given words
    continuation = model.get("word_continuation", CONTINUATION)
    rule = word_rule(words or spec.get("words"), model.get("words"), continuation)
    own = spec.get("user_dict") if rule == "jieba" else None
    user_dict = (user_dict or own) if rule == "jieba" else None
    recorded = manifest.fingerprint
    same_dictionary = user_dict == own or dictionary_sha256(user_dict) == recorded.get("user_dict_sha256")
    stored = rule is not None and recorded.get("words") == rule and same_dictionary
    words = Words(rule, user_dict, stored, continuation)
    if words.need_texts and not stored and spec.get("store_text") is False:
        log.warning("%s words need the reviews' texts, which this run did not store: no word units", rule)
        return Words(None)
    return words


def word_rows(rows: pl.LazyFrame, words: pl.LazyFrame) -> pl.LazyFrame:
    """The attention rows of words (position: the word's first token's; ``term``: the word's), from each
    token's word (``words``: ``KEY``, position -> word, the position of the word's first token, and its
    term); ``rows`` as :func:`bertattn_batch.analysis.aggregate.review_rows` makes them."""
    summed = (
        rows.select(*REVIEW, "position", "weight", "weight_norm", "cls")
        .join(words.select(KEY, "position", "word", "term"), on=[KEY, "position"])
        .group_by([*REVIEW, "word"])
        .agg(pl.col("weight", "weight_norm").sum(), pl.col("term", "cls").first())
        .rename({"word": "position"})
        .with_columns(segment=SEGMENT)
    )
    lo, hi = pl.col("weight").min().over("segment"), pl.col("weight").max().over("segment")
    scaled = pl.when(hi > lo).then((pl.col("weight") - lo) / (hi - lo)).otherwise(0.0)
    return summed.with_columns(weight_scaled=scaled).drop("segment")
