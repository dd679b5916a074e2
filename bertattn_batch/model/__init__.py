"""The model stage: load a BERT-family classifier, encode texts, capture [CLS] rows, trim the last layer.
Names are imported on first use, so that ``model.encode`` alone (a host process's) imports no torch."""

from .._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["ClsRowCapture", "eager_rows", "self_attentions"], "capture"),
    **dict.fromkeys(
        ["load_config", "load_tokenizer", "other_model_files", "resolve_source", "tokenizer_hash"], "checks"
    ),
    **dict.fromkeys(["Classifier", "resolve_device", "resolve_dtype"], "classifier"),
    **dict.fromkeys(["Encoded", "Encoder", "Outputs", "encode_texts", "with_special_tokens"], "encode"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = sorted(_EXPORTS)
