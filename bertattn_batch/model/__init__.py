"""The model stage: load a BERT-family classifier, encode texts, capture [CLS] rows, trim the last layer."""

from .capture import ClsRowCapture, eager_rows, find_self_attention
from .checks import load_config, load_tokenizer, resolve_source
from .classifier import Classifier, Outputs, resolve_device, resolve_dtype
from .encode import Encoded, Encoder, encode_texts

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
    "resolve_device",
    "resolve_dtype",
    "resolve_source",
]
