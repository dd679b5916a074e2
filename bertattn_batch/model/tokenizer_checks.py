"""What a model's tokenizer must be for bertattn: loadable (with what it needs installed), fast (for
character offsets), matching the model's embeddings, and putting [CLS] first in one segment.

Shared by extraction and training, as model/checks.py is for the model itself.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import ModelError, first_line
from .encode import id_limit


def tokenizer_limit(tokenizer) -> int | None:
    """The tokenizer's own ``model_max_length``; None where it sets none (transformers' 1e30 stand-in)."""
    limit = getattr(tokenizer, "model_max_length", None)
    return int(limit) if limit and limit < 1e9 else None


def load_tokenizer(source: str, trust_remote_code: bool = False):
    """A model's tokenizer; a damaged tokenizer.json fails in many ways (KeyError, Rust errors...), all
    reported as one line naming the folder."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except Exception as e:
        error = e
    else:
        limit = getattr(tokenizer, "model_max_length", None)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int | float)):
            raise ModelError(  # a string failed as a TypeError in the first text it encoded
                f"{source}: tokenizer_config.json's model_max_length is {limit!r}, not a number"
            )
        return tokenizer
    _check_sentencepiece(source)  # what failed may be a package missing, not a file damaged
    raise ModelError(
        f"cannot load tokenizer from {source!r} (are its tokenizer files damaged?): "
        f"{type(error).__name__}: {first_line(error)}"
    )


def check_tokenizer(tokenizer, config, source: str) -> None:
    """What extraction and training both need of a model's tokenizer: character offsets (a fast
    tokenizer), ids the model embeds, [CLS] at position 0 and one segment."""
    if not getattr(tokenizer, "is_fast", False):
        raise ModelError(f"{source}: a fast tokenizer (tokenizer.json) is needed for character offsets")
    check_vocabulary(tokenizer, config, source)
    check_cls_first(tokenizer, source)


def check_vocabulary(tokenizer, config, source: str) -> None:
    """A folder without tokenizer files still loads, as an empty vocabulary that maps every token to
    [UNK] (transformers 5); a token id past the embeddings fails mid-run. Refuse both at load."""
    size, specials = len(tokenizer), len(set(tokenizer.all_special_tokens))
    if size <= specials:
        raise ModelError(
            f"{source}: its tokenizer holds only its {size} special tokens; are the tokenizer files "
            "(tokenizer.json or vocab.txt) missing?"
        )
    limit = id_limit(tokenizer)  # above size where the vocabulary leaves ids unused
    if limit > config.vocab_size:
        held = f"{size} tokens" if limit == size else f"{size} tokens with ids up to {limit - 1}"
        raise ModelError(
            f"{source}: the tokenizer has {held} but the model embeds only {config.vocab_size}; "
            "they do not belong together"
        )


def check_cls_first(tokenizer, source: str) -> None:
    """The product reads the attention of the token at position 0; make sure it is [CLS]. The model is
    fed token type 0 throughout, as BERT reads one text: a template that types it otherwise is refused."""
    cls_id = tokenizer.cls_token_id
    enc = tokenizer("a b", return_special_tokens_mask=True, return_token_type_ids=True)
    if any(types := enc.get("token_type_ids") or ()):
        raise ModelError(
            f"{source}: the tokenizer gives one text the token types {types}; only type 0 is fed"
        )
    specials = enc["special_tokens_mask"]
    if cls_id is None or enc["input_ids"][0] != cls_id or specials[0] != 1 or specials[-1] != 1:
        raise ModelError(
            f"{source}: the tokenizer does not put [CLS] at position 0 and [SEP] last "
            f"(tokens: {tokenizer.convert_ids_to_tokens(enc['input_ids'])}); only BERT-style inputs are supported"
        )
    if sum(specials) != 2:
        raise ModelError(f"{source}: expected exactly one special token at each end, got mask {specials}")


#: The files of a tokenizer that only the sentencepiece package reads (ALBERT, XLM-R, CamemBERT, T5).
SENTENCEPIECE_FILES = ("spiece.model", "sentencepiece.bpe.model", "tokenizer.model")


def _check_sentencepiece(source: str) -> None:
    """A folder whose tokenizer failed to load and is a SentencePiece model alone (no tokenizer.json)
    needs the package that reads it. Without it transformers falls back to another reader, whose error
    asked for tiktoken and, with tiktoken installed, called the file damaged."""
    folder = Path(source)
    if not folder.is_dir() or (folder / "tokenizer.json").is_file():
        return
    found = [name for name in SENTENCEPIECE_FILES if (folder / name).is_file()]
    if found and importlib.util.find_spec("sentencepiece") is None:
        raise ModelError(
            f"{source}: its tokenizer is a SentencePiece model alone ({found[0]}, no tokenizer.json), which "
            "needs the sentencepiece package: pip install sentencepiece (or save the model with a fast "
            "tokenizer's tokenizer.json)"
        )
