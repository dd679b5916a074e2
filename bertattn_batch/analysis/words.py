"""Word pieces joined into words, for aggregates by word as well as by token.

A token that does not start with the tokenizer's continuation mark (``##`` for WordPiece) and the
continuations right after it make one word. Tokenizers that mark the start of a word instead
(SentencePiece, byte-level BPE) have no continuation mark, and their runs aggregate by token alone.
"""

from __future__ import annotations

import polars as pl

from ..run import Manifest

#: Runs whose manifest predates ``model.word_continuation``: model types whose usual tokenizers mark
#: word starts (byte-level BPE, SentencePiece) rather than continuations.
NON_WORDPIECE_MODELS = frozenset({"roberta", "xlm-roberta", "camembert", "albert"})
CONTINUATION = "##"
#: A review's number within its part: the key the rows are reduced by, as a doc_id (repeated on every
#: attention row, and as long as the source's ids) would hold memory in proportion to its length.
KEY = "review"
#: The columns naming one review's head, and the classes a review is counted in.
REVIEW = [KEY, "layer", "head"]
CLASSES = ["pred_label", "label"]


def word_rows(rows: pl.LazyFrame, continuation: str = CONTINUATION) -> pl.LazyFrame:
    """Tokens joined into words, in the same columns as ``review_rows`` (position: the first piece's).

    A word starts at every token that is not a continuation (``##`` piece) of the token just before it.
    Raw and norm-based weight: the sums of the pieces'. Scaled: min-max over the review's words for
    that head.
    A review's words are the same at every (layer, head): they are found once, on one head's rows.
    """
    one_head = (pl.col("layer") == pl.col("layer").min()) & (pl.col("head") == pl.col("head").min())
    pieces = rows.filter(one_head).select(KEY, "position", "token").sort([KEY, "position"])
    continues = pl.col("token").str.starts_with(continuation) & (
        pl.col("position") == pl.col("position").shift(1).over(KEY) + 1
    )
    continues = continues.fill_null(False)
    pieces = pieces.with_columns(
        word=(~continues).cast(pl.Int32).cum_sum().over(KEY),
        piece=pl.when(continues).then(pl.col("token").str.strip_prefix(continuation)).otherwise("token"),
    )
    texts = pieces.group_by([KEY, "word"]).agg(
        token=pl.col("piece").sort_by("position").str.join(""),
        position=pl.col("position").min(),
    )
    words = (
        rows.select(*REVIEW, "position", "weight", "weight_norm", *CLASSES)
        .join(pieces.select(KEY, "position", "word"), on=[KEY, "position"])
        .group_by([*REVIEW, "word", *CLASSES])
        .agg(pl.col("weight").sum(), pl.col("weight_norm").sum())
        .join(texts, on=[KEY, "word"])
    )
    lo = pl.col("weight").min().over(REVIEW)
    hi = pl.col("weight").max().over(REVIEW)
    scaled = pl.when(hi > lo).then((pl.col("weight") - lo) / (hi - lo)).otherwise(0.0)
    return words.with_columns(weight_scaled=scaled).drop("word")


def word_continuation(manifest: Manifest) -> str | None:
    """The run's word-continuation mark, as its tokenizer had it; for runs from before it was recorded,
    guessed from the model type."""
    model = manifest.model
    if "word_continuation" in model:
        return model["word_continuation"] or None
    return None if model.get("model_type", "bert") in NON_WORDPIECE_MODELS else CONTINUATION
