"""bertattn-batch: a fine-tuned BERT classifier's [CLS] attention, per head, over whole review corpora.

Library entry points (the CLI is a thin layer over these)::

    from bertattn_batch import JobSpec, run_job
    summary = run_job(JobSpec(inputs=["reviews.parquet"], model="models/zh-senti", out="runs/r1"))
"""

__version__ = "0.1.0"

from .errors import BertAttnError
from .spec import JobSpec, load_job


def run_job(spec: JobSpec, **kwargs):  # lazy: importing the package should not import torch
    from .pipeline import run_job as _run_job

    return _run_job(spec, **kwargs)


__all__ = ["BertAttnError", "JobSpec", "__version__", "load_job", "run_job"]
