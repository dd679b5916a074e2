"""The extraction stage: cut the input into windows, and turn each into a staged part of every table.
Names are imported on first use: a window's host side (encode, extract, write) imports no torch."""

from .._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["BatchPlan", "bucket_batches"], "batching"),
    **dict.fromkeys(["PartStats", "PassInfo", "StagedPart", "Window", "WindowJob"], "job"),
    **dict.fromkeys(["score_rows", "score_batches"], "score"),
    **dict.fromkeys(["Extractor", "ScoredRow", "TableOptions", "minmax_scale", "vocab_array"], "tables"),
    **dict.fromkeys(["WindowRows", "iter_windows", "select_rows"], "windows"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = sorted(_EXPORTS)
