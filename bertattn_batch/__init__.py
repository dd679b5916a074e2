"""bertattn-batch: a fine-tuned BERT classifier's [CLS] attention, per head, over whole review corpora.

The library entry points below (the CLI is a thin layer over them; README shows their use). Importing the
package sets nothing and imports neither torch nor polars: each entry point loads its stage when first used.
"""

from __future__ import annotations

from ._lazy import lazy_exports

__version__ = "0.1.0"

#: name -> module (or module:attribute): the public API, imported on first use.
_API = {
    "BertAttnError": "errors",
    "JobSpec": "config",
    "InputSpec": "config",
    "FinetuneSpec": "config",
    "load_job": "config",
    "tune_runtime": "runtime",
    "run_job": "engines",
    "RunSummary": "engines",
    "read_manifest": "run",
    "scan_run": "run",
    "part_paths": "run",
    "validate_run": "analysis.validate",
    "aggregate": "analysis.aggregate",
    "build_report": "render.report",
    "plot_review": "render.plot",
    "finetune": "train:finetune_files",
    "write_corpus": "inputs.corpora",
}
__getattr__, __dir__ = lazy_exports(__name__, _API)

__all__ = ["__version__", *_API]
