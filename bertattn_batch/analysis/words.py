"""Words from a review's tokens: ``jieba`` segments the text (Chinese) and a token joins the word holding
its first character; ``wordpiece`` joins a token and its ``##`` continuations. A word's raw and norm-based
weights are its tokens' summed; its scaled weight is min-max over the review's words, per head."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ..config import WORDS
from ..errors import SpecError
from ..run import Manifest

log = logging.getLogger(__name__)

#: A review's number within its part, the key its rows are reduced by; and what identifies one head's row.
KEY = "review"
REVIEW = [KEY, "layer", "head"]
CONTINUATION = "##"
#: Runs whose manifest does not record ``model.word_continuation``: model types whose tokenizers mark
#: word starts rather than continuations.
NON_WORDPIECE_MODELS = frozenset({"roberta", "xlm-roberta", "camembert", "albert"})
#: A Chinese character: a review that holds one is segmented by jieba under the rule ``jieba``.
HAN = r"\p{Han}"
NO_WORDS = "this run has no words (--words none, or a tokenizer without ## pieces or Chinese characters)"


def check_words(words: str | None) -> None:
    """SpecError for a ``--words`` rule that is none of :data:`~bertattn_batch.config.WORDS`."""
    if words is not None and words not in WORDS:
        raise SpecError(f"--words must be one of {', '.join(WORDS)}; got {words!r}")


def word_continuation(manifest: Manifest) -> str | None:
    """The run's word-continuation mark; for runs that did not record it, told from the model type."""
    model = manifest.model
    if "word_continuation" in model:
        return model["word_continuation"] or None
    return None if model.get("model_type", "bert") in NON_WORDPIECE_MODELS else CONTINUATION


def run_words(
    manifest: Manifest, words: str | None = None, user_dict: str | None = None
) -> tuple[str | None, str | None]:
    """(rule, user dictionary) of a run's words: ``words`` or the run's own choice, ``auto`` resolved as
    the extraction found the tokenizer (else WordPiece where pieces carry ``##``); None: no words."""
    check_words(words)
    spec = manifest.spec
    choice = words or spec.get("words") or "auto"
    user_dict = user_dict or spec.get("user_dict")
    if choice == "auto":
        choice = manifest.model.get("words") or ("wordpiece" if word_continuation(manifest) else "none")
    if choice == "wordpiece" and word_continuation(manifest) is None:
        raise SpecError(
            "--words wordpiece: this run's tokenizer marks no '##' continuations; use jieba or none"
        )
    if choice == "jieba" and spec.get("store_text") is False:
        log.warning("jieba words need the reviews' texts, which this run did not store: no word units")
        return None, None
    return (None if choice == "none" else choice), user_dict


@functools.cache
def segmenter(user_dict: str | None = None) -> Any:
    """A jieba tokenizer with its own dictionary (and ``user_dict``), loaded once per process."""
    import jieba

    jieba.setLogLevel(logging.WARNING)  # its dictionary's loading is not news
    tokenizer = jieba.Tokenizer()
    tokenizer.initialize()
    if user_dict is not None:
        if not Path(user_dict).is_file():
            raise SpecError(f"user dictionary {user_dict} is not a file (--user-dict)")
        try:
            tokenizer.load_userdict(user_dict)
        except (ValueError, UnicodeDecodeError) as e:
            raise SpecError(f"user dictionary {user_dict} is not one jieba reads: {e}") from None
    return tokenizer


def jieba_words(tokens: pl.DataFrame, texts: pl.DataFrame, user_dict: str | None = None) -> pl.DataFrame:
    """Each token's word (``KEY``, position -> word, word_text): the jieba word of the review's text that
    holds the token's first character; ids unique across the frame, texts lower-cased."""
    cut = segmenter(user_dict).lcut
    chars = pl.col("text").str.len_chars()
    texts = texts.select(KEY, "text", base=chars.cum_sum() - chars)
    words = [w for text in texts["text"] for w in cut(text)]  # a review's words spell its whole text
    starts = np.cumsum([0, *map(len, words)])[:-1]  # on the reviews' texts laid end to end
    tokens = tokens.join(texts.select(KEY, "base"), on=KEY).sort(KEY, "position")
    word = np.searchsorted(starts, (tokens["base"] + tokens["start"]).to_numpy(), side="right") - 1
    text = pl.Series(words, dtype=pl.String).str.to_lowercase()
    return tokens.select(KEY, "position", word=pl.Series(word), word_text=text.gather(word))


def wordpiece_words(tokens: pl.LazyFrame | pl.DataFrame, continuation: str = CONTINUATION) -> pl.LazyFrame:
    """Each token's word (``KEY``, position -> word, word_text): a word starts at every token that is not
    a continuation (``##`` piece) of the token just before it; its text is its pieces joined."""
    token, position = pl.col("token"), pl.col("position")
    continues = token.str.starts_with(continuation) & (position == position.shift(1).over(KEY) + 1)
    pieces = (
        tokens.lazy()
        .select(KEY, "position", "token")
        .sort([KEY, "position"])
        .with_columns(continues=continues.fill_null(False))
        .with_columns(
            word=(~pl.col("continues")).cast(pl.Int64).cum_sum(),
            alone=~pl.col("continues").shift(-1, fill_value=False),
        )
    )
    joined = (  # the few words of several pieces
        pieces.filter(~(pl.col("alone") & ~pl.col("continues")))
        .group_by("word")
        .agg(joined=token.str.strip_prefix(continuation).sort_by(position).str.join(""))
    )
    text = pl.coalesce("joined", "token")
    return pieces.join(joined, on="word", how="left").select(KEY, "position", "word", word_text=text)


def word_map(
    tokens: pl.DataFrame, texts: pl.DataFrame | None, mode: str, user_dict: str | None = None
) -> pl.LazyFrame:
    """Each token's word by rule ``mode`` (``tokens``: ``KEY``, position, token, start): ``jieba`` for the
    reviews whose text (``texts``: ``KEY``, text) holds a Chinese character, WordPiece for the others."""
    if mode != "jieba":
        return wordpiece_words(tokens)
    if texts is None:
        raise SpecError("jieba words need the reviews' texts")
    chinese = texts.filter(pl.col("text").str.contains(HAN))
    if chinese.is_empty():  # no dictionary to load
        return wordpiece_words(tokens)
    ours = pl.col(KEY).is_in(chinese[KEY].implode())
    segmented = jieba_words(tokens.filter(ours), chinese, user_dict)
    after = segmented["word"].max() + 1 if segmented.height else 0  # word ids stay unique
    pieces = wordpiece_words(tokens.filter(~ours)).with_columns(pl.col("word") + after)
    return pl.concat([segmented.lazy(), pieces])


#: The layer and head number in a word's key of rows of no layer or head (ALTI's): the key stays in int64.
_NO_HEAD = 2**14 - 1


def word_rows(rows: pl.LazyFrame, words: pl.LazyFrame | None = None) -> pl.LazyFrame:
    """The attention rows of words (position: the first token's; token: the word's text), from each
    token's word (:func:`word_map`; None: WordPiece words of the rows' own tokens)."""
    if words is None:
        one_head = (pl.col("layer") == pl.col("layer").min()) & (pl.col("head") == pl.col("head").min())
        words = wordpiece_words(rows.filter(one_head))
    layer_code, head_code = (pl.col(c).cast(pl.Int64).fill_null(_NO_HEAD) for c in ("layer", "head"))
    head = layer_code * 2**16 + head_code
    key = pl.col("key")
    summed = (  # by one integer key, (layer, head, word): word ids are unique across reviews
        rows.select(*REVIEW, "position", "weight", "weight_norm")
        .join(words.select(KEY, "position", "word"), on=[KEY, "position"])
        .group_by(key=head * 2**32 + pl.col("word"))
        .agg(pl.col("weight", "weight_norm").sum(), pl.col("position").min())
        .with_columns(
            word=key % 2**32,
            layer=pl.when(key // 2**48 != _NO_HEAD).then(key // 2**48).cast(pl.Int16),
            head=pl.when(key // 2**32 % 2**16 != _NO_HEAD).then(key // 2**32 % 2**16).cast(pl.Int16),
        )
        .join(words.select("word", KEY, token="word_text").unique("word"), on="word")
    )
    review = pl.col(KEY).cast(pl.Int64) * 2**32 + key // 2**32
    lo, hi = pl.col("weight").min().over(review), pl.col("weight").max().over(review)
    return summed.with_columns(
        weight_scaled=pl.when(hi > lo).then((pl.col("weight") - lo) / (hi - lo)).otherwise(0.0)
    ).drop("word", "key")
