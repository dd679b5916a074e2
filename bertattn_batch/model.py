"""Load a BERT-family sequence classifier once; run padded batches under ``inference_mode``.

Usage::

    clf = Classifier.load("models/zh-senti", layers=[-2])
    probs, rows = clf.forward([enc.ids for enc in encoded])   # (B, C), (B, L, H, S) float32

This module knows nothing of files or schemas: it turns token ids into probabilities and [CLS]
attention rows. In sdpa mode the last layer's attention and what follows it run for [CLS] only
(``trim.py``) where a probe on load shows that changes nothing. Weights load as safetensors unless
pickle is allowed explicitly; remote code never runs unless asked for.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import pickle
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError

from .attention import ClsRowCapture, eager_rows, find_self_attention
from .encode import id_limit
from .errors import ModelError, SpecError, first_line
from .trim import LastLayerTrim, verified

log = logging.getLogger(__name__)

#: Encoders whose [CLS] (or <s>) sits at position 0 and whose self-attention we can read.
SUPPORTED_MODEL_TYPES = frozenset(
    {
        "bert",
        "roberta",
        "xlm-roberta",
        "camembert",
        "distilbert",
        "electra",
        "albert",
        "ernie",
        "megatron-bert",
    }
)
#: Models whose position ids start after the padding index (at pad_token_id + 1), so pad_token_id + 1
#: positions are not usable.
_POSITION_OFFSET_TYPES = frozenset({"roberta", "xlm-roberta", "camembert"})


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecError(f"device {device!r} asked for, but no CUDA device is available; use --device cpu")
    if device.startswith("mps") and not torch.backends.mps.is_available():
        raise SpecError(
            f"device {device!r} asked for, but no Apple MPS device is available; use --device cpu"
        )
    try:
        return torch.device(device)
    except RuntimeError as e:
        raise SpecError(f"device {device!r} is not one torch knows: {first_line(e)}") from None


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on CUDA devices that support it, float16 on older ones, float32 on CPU."""
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def weights_hash(path: str) -> str:
    """sha256 over the weight files of a local model folder (or its hub cache), to tell models apart."""
    folder = Path(path)
    if not folder.is_dir():
        try:
            from transformers.utils import cached_file

            found = cached_file(path, "config.json")
            folder = Path(found).parent if found else folder
        except OSError:
            return "unknown"
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            while block := fh.read(1 << 23):
                h.update(block)
    return h.hexdigest() if files else "unknown"


@dataclass
class Classifier:
    """A loaded tokenizer + classifier, and what the job needs to know about them."""

    tokenizer: object
    model: torch.nn.Module
    device: torch.device
    dtype: torch.dtype
    layers: list[int]  # 0-based encoder layer indices
    max_length: int
    attention: str  # "sdpa" (captured rows) or "eager" (output_attentions)
    source: str
    weights_sha256: str
    num_layers: int
    num_heads: int
    id2label: dict[int, str] = field(default_factory=dict)
    trim: LastLayerTrim | None = field(default=None, repr=False)  # sdpa mode: last layer for [CLS] only
    _capture: ClsRowCapture | None = field(default=None, repr=False)

    @classmethod
    def load(
        cls,
        source: str,
        layers: list[int] | tuple[int, ...] = (-2,),
        device: str = "auto",
        dtype: str = "auto",
        attention: str = "sdpa",
        max_length: int | None = None,
        trust_remote_code: bool = False,
        allow_pickle: bool = False,
        trim_last_layer: bool = True,
    ) -> Classifier:
        from transformers import AutoModelForSequenceClassification

        dev = resolve_device(device)
        torch_dtype = resolve_dtype(dtype, dev)
        config = load_config(source, trust_remote_code=trust_remote_code, allow_pickle=allow_pickle)
        _check_single_label(config, source)
        id2label = _label_names(config, source)
        tokenizer = load_tokenizer(source, trust_remote_code)
        if not getattr(tokenizer, "is_fast", False):
            raise ModelError(f"{source}: a fast tokenizer (tokenizer.json) is needed for character offsets")
        _check_vocabulary(tokenizer, config, source)
        _check_cls_first(tokenizer, source)

        def from_pretrained(implementation: str):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return AutoModelForSequenceClassification.from_pretrained(
                    source,
                    dtype=torch_dtype,
                    attn_implementation=implementation,
                    use_safetensors=None if allow_pickle else True,
                    trust_remote_code=trust_remote_code,
                    output_loading_info=True,
                    return_dict=True,  # outputs as objects (.logits), whatever config.json says
                    output_attentions=False,  # eager mode asks per call; sdpa cannot return them
                )

        try:
            try:
                model, info = from_pretrained(attention)
            except ValueError as e:
                if attention != "sdpa" or "scaled_dot_product_attention" not in str(e):
                    raise
                # an architecture without SDPA (Megatron-BERT): its own attention, rows still captured
                log.info("%s has no SDPA attention; running its eager attention", source)
                model, info = from_pretrained("eager")
        except pickle.UnpicklingError as e:
            raise ModelError(
                f"cannot load model weights from {source!r} "
                f"(pickle refused by torch.load(weights_only=True): {_pickle_reason(e)})"
            ) from None
        except (OSError, ValueError, RuntimeError, SafetensorError) as e:
            raise ModelError(f"cannot load model weights from {source!r}: {first_line(e)}") from None
        check_positions(model, source)  # first: its dropped weights are what the next check names
        check_loaded_weights(model, info, source)
        model.eval().to(dev)  # eval: dropout off
        num_layers = int(getattr(config, "num_hidden_layers", None) or config.n_layers)
        resolved = resolve_layers(layers, num_layers)
        attn = find_self_attention(model)
        if not attn:
            raise ModelError(f"{source}: no self-attention query/key projections found")
        if all(v.startswith("LABEL_") for v in id2label.values()):
            log.warning("%s: labels are named LABEL_n; is the classification head trained?", source)
        limit = _max_length(max_length, tokenizer, config)
        trim = LastLayerTrim.find(model) if trim_last_layer and attention != "eager" else None
        if trim is not None and not verified(model, trim, len(tokenizer), dev, limit):  # within vocab_size
            trim = None
        return cls(
            tokenizer=tokenizer,
            model=model,
            device=dev,
            dtype=torch_dtype,
            layers=resolved,
            max_length=limit,
            attention=attention,
            source=source,
            weights_sha256=weights_hash(source),
            num_layers=num_layers,
            num_heads=int(getattr(config, "num_attention_heads", None) or config.n_heads),
            id2label=id2label,
            trim=trim,
        )

    @property
    def labels(self) -> list[str]:
        return [self.id2label[i] for i in range(len(self.id2label))]

    @property
    def byte_level(self) -> bool:
        """Whether tokens spell bytes (byte-level BPE: 'Ġgood'), which a reader needs decoded."""
        backend = self.tokenizer.backend_tokenizer
        parts = (backend.pre_tokenizer, backend.decoder)
        return any(b'"ByteLevel"' in part.__getstate__() for part in parts if part is not None)

    @property
    def word_continuation(self) -> str | None:
        """The mark of a piece that continues the word before it ("##" in WordPiece), or None where the
        tokenizer marks word starts instead (byte-level BPE, SentencePiece): how words are joined."""
        model = self.tokenizer.backend_tokenizer.model
        return model.continuing_subword_prefix if type(model).__name__ == "WordPiece" else None

    def pad(self, ids: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-pad a batch: (B, S) input ids and attention mask on the model's device."""
        longest = max(len(x) for x in ids)
        pad_id = self.tokenizer.pad_token_id or 0
        input_ids = np.full((len(ids), longest), pad_id, dtype=np.int64)  # (B, S)
        mask = np.zeros((len(ids), longest), dtype=np.int64)  # (B, S)
        for i, x in enumerate(ids):
            input_ids[i, : len(x)] = x
            mask[i, : len(x)] = 1
        t_ids, t_mask = torch.from_numpy(input_ids), torch.from_numpy(mask)
        if self.device.type == "cuda":
            t_ids, t_mask = t_ids.pin_memory(), t_mask.pin_memory()
        return t_ids.to(self.device, non_blocking=True), t_mask.to(self.device, non_blocking=True)

    @torch.inference_mode()
    def forward(self, ids: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Probabilities (B, C) and [CLS] rows (B, L, H, S) float32 for one padded batch."""
        input_ids, mask = self.pad(ids)
        if self.attention == "eager":
            out = self.model(input_ids=input_ids, attention_mask=mask, output_attentions=True)
            rows = eager_rows(out.attentions, self.layers)
        else:
            if self._capture is None:
                self._capture = ClsRowCapture(self.model, self.layers)
            with self._capture as capture, self.trim or contextlib.nullcontext():
                out = self.model(input_ids=input_ids, attention_mask=mask)
            rows = capture.rows(mask)
        probs = torch.softmax(out.logits.float(), dim=-1)
        if not (torch.isfinite(probs).all() and torch.isfinite(rows).all()):
            raise ModelError(
                f"{self.source} gives non-finite outputs (NaN or infinity) for this batch of {len(ids)} "
                "reviews: its weights are damaged or its training diverged"
                + ("; in float16, try --dtype bfloat16 or float32" if self.dtype == torch.float16 else "")
            )
        return probs.cpu().numpy(), rows.cpu().numpy()


def resolve_layers(layers: list[int] | tuple[int, ...], num_layers: int) -> list[int]:
    """Negative indices count from the end (-2 of 6 layers is 4); out-of-range ones are refused."""
    out = []
    for layer in layers:
        idx = layer + num_layers if layer < 0 else layer
        if not 0 <= idx < num_layers:
            raise SpecError(f"layer {layer} is out of range for a model with {num_layers} layers")
        out.append(idx)
    if len(set(out)) != len(out):
        raise SpecError(f"layers {list(layers)} name the same layer twice")
    return out


def length_limit(tokenizer, config) -> int:
    """The most tokens (specials included) the model has positions for and the tokenizer allows."""
    limit = int(getattr(config, "max_position_embeddings", 512))
    if config.model_type in _POSITION_OFFSET_TYPES:
        pad = config.pad_token_id
        limit -= (1 if pad is None else int(pad)) + 1
    tok_limit = getattr(tokenizer, "model_max_length", limit) or limit
    return min(limit, int(tok_limit)) if tok_limit < 1e9 else limit


def _max_length(asked: int | None, tokenizer, config) -> int:
    limit = length_limit(tokenizer, config)
    if asked is not None and asked > limit:
        raise SpecError(f"max_length {asked} exceeds the model's limit of {limit} tokens")
    return asked or limit


def load_config(source: str, trust_remote_code: bool = False, allow_pickle: bool | None = False):
    """A model's config, refused before any weights load when bertattn cannot read its [CLS] row.

    Shared by extract and finetune (its base), so both refuse the same models with the same words.
    ``allow_pickle`` None: the caller has no --allow-pickle option (pickle weights are never read).
    """
    from transformers import AutoConfig

    folder = Path(source)
    if folder.exists() and not (folder / "config.json").is_file():
        raise ModelError(f"{source} is not a model folder (no config.json)")
    if not folder.exists() and not _could_be_hub_id(source):
        raise ModelError(f"no model folder {source}")
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        if not folder.exists():  # most often a mistyped local path, not a hub id
            raise ModelError(
                f"no model folder {source}, and it could not be loaded from the hub: {first_line(e)}"
            ) from None
        raise ModelError(f"cannot load model config from {source!r}: {first_line(e)}") from None
    _check_architecture(config, source)
    _check_weights_format(source, allow_pickle)
    return config


def _could_be_hub_id(source: str) -> bool:
    """Whether a name that is no local folder may still name a hub model ("name" or "owner/name").
    Why: a missing path such as /data/models/x or ./x gets a plain "no model folder", not the hub's
    complaint about repo ids."""
    return not (source.startswith((".", "~", "/", "-")) or "\\" in source or source.count("/") > 1)


def load_tokenizer(source: str, trust_remote_code: bool = False):
    """A model's tokenizer; a damaged tokenizer.json fails in many ways (KeyError, Rust errors...), all
    reported as one line naming the folder."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except Exception as e:
        raise ModelError(
            f"cannot load tokenizer from {source!r}: {type(e).__name__}: {first_line(e)}"
        ) from None


def _check_architecture(config, source: str) -> None:
    """Only bidirectional encoders whose layers are counted the way ``--layers`` counts them."""
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelError(
            f"model type {config.model_type!r} is not supported: bertattn reads the [CLS] row at "
            f"position 0 of BERT-family encoders ({', '.join(sorted(SUPPORTED_MODEL_TYPES))})"
        )
    if getattr(config, "is_decoder", False):
        raise ModelError(
            f"{source} is built as a decoder (is_decoder=true): a causal model's [CLS] sees only itself; "
            "bertattn reads bidirectional encoders"
        )
    if getattr(config, "type_vocab_size", 1) == 0:
        raise ModelError(f"{source}: type_vocab_size=0 leaves its embeddings no token-type row to look up")
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


def _check_single_label(config, source: str) -> None:
    """Refuse heads whose outputs are not one softmax over two or more labels: probs would lie."""
    problem = getattr(config, "problem_type", None)
    if problem == "regression" or (problem is None and config.num_labels < 2):
        raise ModelError(
            f"{source} is a regression model ({config.num_labels} output); bertattn reads single-label "
            "classifiers (a softmax over two or more labels)"
        )
    if problem == "multi_label_classification":
        raise ModelError(
            f"{source} is a multi-label classifier (independent sigmoids); bertattn reads single-label "
            "classifiers (a softmax over two or more labels)"
        )


def _check_vocabulary(tokenizer, config, source: str) -> None:
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


def _check_cls_first(tokenizer, source: str) -> None:
    """The product reads the attention of the token at position 0; make sure it is [CLS]."""
    cls_id = tokenizer.cls_token_id
    enc = tokenizer("a b", return_special_tokens_mask=True)
    specials = enc["special_tokens_mask"]
    if cls_id is None or enc["input_ids"][0] != cls_id or specials[0] != 1 or specials[-1] != 1:
        raise ModelError(
            f"{source}: the tokenizer does not put [CLS] at position 0 and [SEP] last "
            f"(tokens: {tokenizer.convert_ids_to_tokens(enc['input_ids'])}); only BERT-style inputs are supported"
        )
    if sum(specials) != 2:
        raise ModelError(f"{source}: expected exactly one special token at each end, got mask {specials}")


def _label_names(config, source: str) -> dict[int, str]:
    """id2label with ids 0..n-1: the head's output i is label i, so a gap leaves an output unnamed."""
    id2label = {int(k): str(v) for k, v in config.id2label.items()}
    if sorted(id2label) != list(range(len(id2label))):
        raise ModelError(
            f"{source}: label ids {sorted(id2label)} in config.json (id2label) are not 0..{len(id2label) - 1}"
        )
    return id2label


def _pickle_reason(e: BaseException) -> str:
    """torch's refusal names the blocked global on a later line; its first line only says it failed."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return next((line for line in lines if "GLOBAL" in line), lines[0] if lines else type(e).__name__)
