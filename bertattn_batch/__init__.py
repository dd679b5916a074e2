"""bertattn-batch: a fine-tuned BERT classifier's [CLS] attention, per head, over whole review corpora.

Library entry points (the CLI is a thin layer over these)::

    import bertattn_batch as ba
    ba.tune_runtime()                        # first, in a notebook: see runtime.py
    summary = ba.run_job(ba.JobSpec(inputs=["reviews.parquet"], model="models/zh-senti", out="runs/r1"))
    report = ba.validate_run("runs/r1")
    result = ba.aggregate("runs/r1")
    ba.build_report("runs/r1")

Importing the package sets nothing and imports neither torch nor polars: each entry point loads its
stage when first used.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: name -> (module, attribute): the public API, imported on first use.
_API = {
    "BertAttnError": ("errors", "BertAttnError"),
    "JobSpec": ("config", "JobSpec"),
    "FinetuneSpec": ("config", "FinetuneSpec"),
    "load_job": ("config", "load_job"),
    "tune_runtime": ("runtime", "tune_runtime"),
    "run_job": ("engines", "run_job"),
    "RunSummary": ("engines", "RunSummary"),
    "read_manifest": ("run", "read_manifest"),
    "validate_run": ("analysis.validate", "validate_run"),
    "aggregate": ("analysis.aggregate", "aggregate"),
    "build_report": ("render.report", "build_report"),
    "plot_review": ("render.plot", "plot"),
    "finetune": ("train", "finetune_files"),
    "write_corpus": ("inputs.corpora", "write_corpus"),
}


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _API[name]
    value = getattr(importlib.import_module(f".{module}", __name__), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])


__all__ = ["__version__", *_API]
