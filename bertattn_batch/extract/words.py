"""Words from a review's tokens: ``jieba`` segments the text (Chinese) and a token joins the word holding
its first character; ``wordpiece`` joins a tokenizer's pieces into its words: a piece and its ``##``
continuations (WordPiece), or, for tokenizers that mark where words start instead (byte-level BPE's
``Ġ``, SentencePiece's ``▁``), the pieces that meet inside a word of the text (:func:`span_words`).
Extraction stores each token's word in the ``tokens`` table, so that the commands after it read words
without segmenting again; they segment only under a rule or dictionary other than the run's."""

from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from ..errors import SpecError

#: A review's number within a frame, the key its rows are reduced by.
KEY = "review"
#: WordPiece's mark of a piece that continues a word (BERT's), where a tokenizer has no mark of its own.
CONTINUATION = "##"
#: A Chinese character: a review that holds one is segmented by jieba under the rule ``jieba``.
HAN = r"\p{Han}"
#: A character inside a word, where two pieces that meet there join (a Chinese character is a word alone).
WORD_CHARACTER = r"^[\w--\p{Han}]$"


def word_rule(choice: str | None, auto: str | None, continuation: str | None) -> str | None:
    """The rule a ``--words`` choice names (None for ``none``): ``auto`` is ``auto``'s finding for the
    model (None in a run recorded before every tokenizer had words: WordPiece's where it has ``##``
    pieces, ``continuation``, else none)."""
    if choice in (None, "auto"):
        choice = auto or ("wordpiece" if continuation else "none")
    return None if choice == "none" else choice


def dictionary_file(user_dict: str) -> Path:
    """The user dictionary's path; SpecError where it is not a file."""
    if not Path(user_dict).is_file():
        raise SpecError(f"user dictionary {user_dict} is not a file (--user-dict)")
    return Path(user_dict)


def dictionary_sha256(user_dict: str | None) -> str | None:
    """The user dictionary's content hash, which decides whether a resumed run may keep its words."""
    return None if user_dict is None else hashlib.sha256(dictionary_file(user_dict).read_bytes()).hexdigest()


@functools.cache
def segmenter(user_dict: str | None = None) -> Any:
    """A jieba tokenizer with its own dictionary (and ``user_dict``), loaded once per process."""
    import jieba

    jieba.setLogLevel(logging.WARNING)  # its dictionary's loading is not news
    tokenizer = jieba.Tokenizer()
    tokenizer.initialize()
    if user_dict is not None:
        try:
            tokenizer.load_userdict(str(dictionary_file(user_dict)))
        except (ValueError, UnicodeDecodeError) as e:
            raise SpecError(f"user dictionary {user_dict} is not one jieba reads: {e}") from None
    return tokenizer


def spanned(tokens: pl.DataFrame | pl.LazyFrame, texts: pl.DataFrame) -> pl.LazyFrame:
    """``tokens`` (``KEY``, position, start, end) in order, each with its review's ``text`` cut after the
    last token's span (a long text is not copied whole to every token), whether its span is ``blank`` (a
    byte-level ``Ġ`` or ``Ċ``, a SentencePiece ``▁``), whether it is ``trailing``, blank and followed by
    blank tokens alone, and ``text_end``: where the last token not blank up to it ends."""
    start, end, text = pl.col("start"), pl.col("end"), pl.col("text")
    tokens = tokens.lazy().select(KEY, "position", "start", "end")
    covered = tokens.group_by(KEY).agg(stop=end.max())
    texts = texts.lazy().join(covered, on=KEY).select(KEY, text=text.str.slice(0, pl.col("stop")))
    return (
        tokens.join(texts, on=KEY)
        .sort([KEY, "position"])
        .with_columns(blank=text.str.slice(start, end - start).str.strip_chars() == "")
        .with_columns(
            trailing=(~pl.col("blank")).cum_sum(reverse=True).over(KEY) == 0,
            text_end=pl.when(~pl.col("blank")).then(end).forward_fill().over(KEY),
        )
    )


def jieba_words(tokens: pl.DataFrame, texts: pl.DataFrame, user_dict: str | None = None) -> pl.DataFrame:
    """Each token's word (``KEY``, position -> word, word_text): the jieba word of the review's text that
    holds the token's first character (a token of blank text: the character after it, or at the review's
    end the last one before it); ids unique across the frame, texts lower-cased."""
    cut = segmenter(user_dict).lcut
    chars = pl.col("text").str.len_chars()
    texts = texts.select(KEY, "text", base=chars.cum_sum() - chars)
    words = [w for text in texts["text"] for w in cut(text)]  # a review's words spell its whole text
    starts = np.cumsum([0, *map(len, words)])[:-1]  # on the reviews' texts laid end to end
    blank, text_end = pl.col("blank"), pl.col("text_end")
    at = pl.when(blank & ~pl.col("trailing")).then("end").when(blank & text_end.is_not_null())
    at = at.then(text_end - 1).otherwise("start")
    tokens = spanned(tokens, texts).join(texts.lazy().select(KEY, "base"), on=KEY)
    tokens = tokens.select(KEY, "position", at=pl.col("base") + at).collect()
    word = np.searchsorted(starts, tokens["at"].to_numpy(), side="right") - 1
    text = pl.Series(words, dtype=pl.String).str.to_lowercase()
    return tokens.select(KEY, "position", word=pl.Series(word), word_text=text.gather(word))


def wordpiece_words(tokens: pl.LazyFrame | pl.DataFrame, continuation: str = CONTINUATION) -> pl.LazyFrame:
    """Each token's word (``KEY``, position -> word, word_text): a word starts at every token that is not
    a continuation (a piece that starts with the tokenizer's ``continuation`` mark) of the token just
    before it; its text is its pieces joined."""
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


def span_words(tokens: pl.DataFrame, texts: pl.DataFrame) -> pl.LazyFrame:
    """Each token's word (``KEY``, position -> word, word_text) for a tokenizer that marks no continued
    piece: a token continues the word before it where their spans overlap (bytes of one character),
    where the token before spans no text (a lone ``Ġ`` or ``▁``) or this one does at the review's end,
    or where they meet between two word characters (:data:`WORD_CHARACTER`); the word's text is the
    review's over its tokens, stripped and lower-cased."""
    start, end, text, position = pl.col("start"), pl.col("end"), pl.col("text"), pl.col("position")
    inside = [text.str.slice(at, 1).str.contains(WORD_CHARACTER) for at in ((start - 1).clip(0), start)]
    before_end = end.shift(1).over(KEY)
    meets = (start < before_end) | ((start == before_end) & inside[0] & inside[1])
    joins = meets | pl.col("blank").shift(1).over(KEY) | pl.col("trailing")
    continues = (position == position.shift(1).over(KEY) + 1) & joins
    pieces = spanned(tokens, texts).with_columns(word=(~continues.fill_null(False)).cast(pl.Int64).cum_sum())
    first, last = start.min().over("word"), end.max().over("word")
    spelled = text.str.slice(first, last - first).str.strip_chars().str.to_lowercase()
    return pieces.select(KEY, "position", "word", word_text=spelled)


def word_map(
    tokens: pl.DataFrame,
    texts: pl.DataFrame | None,
    mode: str,
    user_dict: str | None = None,
    continuation: str | None = CONTINUATION,
) -> pl.LazyFrame:
    """Each token's word by rule ``mode`` (``tokens``: ``KEY``, position, token, start, end): ``jieba`` for
    the reviews whose text (``texts``: ``KEY``, text) holds a Chinese character, the tokenizer's pieces
    for the others: WordPiece's, marked by ``continuation``, or where it marks none, :func:`span_words`
    (which reads the texts too)."""
    if (mode == "jieba" or continuation is None) and texts is None:
        raise SpecError(f"{mode} words of this tokenizer need the reviews' texts")

    def pieces(tokens: pl.DataFrame) -> pl.LazyFrame:
        if continuation is None:
            return span_words(tokens, texts)
        return wordpiece_words(tokens, continuation)

    if mode != "jieba":
        return pieces(tokens)
    chinese = texts.filter(pl.col("text").str.contains(HAN))
    if chinese.is_empty():  # no dictionary to load
        return pieces(tokens)
    ours = pl.col(KEY).is_in(chinese[KEY].implode())
    segmented = jieba_words(tokens.filter(ours), chinese, user_dict)
    after = segmented["word"].max() + 1 if segmented.height else 0  # word ids stay unique
    rest = pieces(tokens.filter(~ours)).with_columns(pl.col("word") + after)
    return pl.concat([segmented.lazy(), rest])


def token_words(
    tokens: dict[str, Any],
    texts: list[str],
    mode: str,
    user_dict: str | None = None,
    continuation: str | None = CONTINUATION,
) -> tuple[pa.Array, pa.Array]:
    """The ``word`` and ``word_text`` columns of a ``tokens`` table: for each of ``tokens``' rows (``KEY``:
    its review's index in ``texts``; position, token, start and end; in review and position order), the
    position of its word's first token and the word's text, as :func:`word_map` makes them."""
    frame = pl.DataFrame({c: pl.Series(tokens[c]) for c in (KEY, "position", "token", "start", "end")})
    text = pl.DataFrame({KEY: np.arange(len(texts)), "text": pl.Series(texts, dtype=pl.String)})
    words = first_positions(word_map(frame, text, mode, user_dict, continuation))
    words = words.collect().sort(KEY, "position")
    return words["word"].cast(pl.Int32).to_arrow(), words["word_text"].to_arrow()


def first_positions(words: pl.LazyFrame) -> pl.LazyFrame:
    """:func:`word_map`'s words (ids unique across the frame) as the ``tokens`` table stores them: each
    token's word as the position of its first token."""
    return words.select(KEY, "position", "word_text", word=pl.col("position").min().over("word"))
