"""The extraction stage: cut the input into windows, and turn each into a staged part of every table.

Names are imported on first use (``_lazy.lazy_exports``): the host side of a window (encode, extract,
write) does not import torch, which only the model stage (``score``) needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .batching import BatchPlan, bucket_batches  # noqa: F401
    from .job import PartStats, PassInfo, StagedPart, Window, WindowJob  # noqa: F401
    from .score import score_batches, score_rows  # noqa: F401
    from .tables import Extractor, ScoredRow, minmax_scale, vocab_array  # noqa: F401
    from .windows import WindowRows, iter_windows, select_rows  # noqa: F401

_EXPORTS = {
    **dict.fromkeys(["BatchPlan", "bucket_batches"], "batching"),
    **dict.fromkeys(["PartStats", "PassInfo", "StagedPart", "Window", "WindowJob"], "job"),
    **dict.fromkeys(["score_rows", "score_batches"], "score"),
    **dict.fromkeys(["Extractor", "ScoredRow", "minmax_scale", "vocab_array"], "tables"),
    **dict.fromkeys(["WindowRows", "iter_windows", "select_rows"], "windows"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = sorted(_EXPORTS)
