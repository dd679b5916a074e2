"""The model stage: load a BERT-family classifier, encode texts, capture [CLS] rows, trim the last layer.

Names are imported on first use, so that ``model.encode`` alone (as a host process needs it) imports
no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .capture import ClsRowCapture, eager_rows, find_self_attention
    from .checks import load_config, load_tokenizer, other_model_files, resolve_source, tokenizer_hash
    from .classifier import Classifier, resolve_device, resolve_dtype
    from .encode import Encoded, Encoder, encode_texts, with_special_tokens
    from .outputs import Outputs

_EXPORTS = {
    **dict.fromkeys(["ClsRowCapture", "eager_rows", "find_self_attention"], "capture"),
    **dict.fromkeys(
        ["load_config", "load_tokenizer", "other_model_files", "resolve_source", "tokenizer_hash"], "checks"
    ),
    **dict.fromkeys(["Classifier", "resolve_device", "resolve_dtype"], "classifier"),
    **dict.fromkeys(["Encoded", "Encoder", "encode_texts", "with_special_tokens"], "encode"),
    "Outputs": "outputs",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "Classifier",
    "ClsRowCapture",
    "Encoded",
    "Encoder",
    "Outputs",
    "eager_rows",
    "encode_texts",
    "find_self_attention",
    "load_config",
    "load_tokenizer",
    "other_model_files",
    "resolve_device",
    "resolve_dtype",
    "resolve_source",
    "tokenizer_hash",
    "with_special_tokens",
]
