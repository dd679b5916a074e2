"""The extraction stage: cut the input into windows, and turn each into a staged part of every table."""

from .batching import bucket_batches
from .job import PartStats, PassInfo, StagedPart, Window, WindowJob
from .score import ModelStage
from .tables import Extractor, ScoredRow, minmax_scale, vocab_array
from .windows import Columns, WindowRows, iter_windows, select_rows

__all__ = [
    "Columns",
    "Extractor",
    "ModelStage",
    "PartStats",
    "PassInfo",
    "ScoredRow",
    "StagedPart",
    "Window",
    "WindowJob",
    "WindowRows",
    "bucket_batches",
    "iter_windows",
    "minmax_scale",
    "select_rows",
    "vocab_array",
]
