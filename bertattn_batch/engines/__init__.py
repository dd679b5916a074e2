"""The engines: ``run_job`` (the data path, base.py) and where a window's steps run (local, ray).

Names are imported on first use (``_lazy.lazy_exports``): a host process imports ``engines.processes``
without the model's code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .base import RunSummary, run_job
    from .start import load_classifier, run_header

_EXPORTS = {
    **dict.fromkeys(["RunSummary", "run_job"], "base"),
    **dict.fromkeys(["load_classifier", "run_header"], "start"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["RunSummary", "load_classifier", "run_header", "run_job"]
