"""bertattn-batch: a fine-tuned BERT classifier's [CLS] attention, per head, over whole review corpora.

Library entry points (the CLI is a thin layer over these)::

    from bertattn_batch import JobSpec, run_job
    summary = run_job(JobSpec(inputs=["reviews.parquet"], model="models/zh-senti", out="runs/r1"))
"""

__version__ = "0.1.0"

import os
import sys

# torch's CPU kernels cache a compiled kernel, with its buffers, for every input shape they meet: oneDNN
# (ONEDNN_PRIMITIVE_CACHE_CAPACITY, 1024 by default) and, for bfloat16 matmuls, ideep
# (LRU_CACHE_CAPACITY, 1024). Length-bucketed batches have hundreds of shapes, so a long run's memory grew
# with the corpus (measured from 20k to 200k reviews: +49% in float32 with both at 1024, +12% with oneDNN's
# at 8, +64% in bfloat16 from ideep's). Caches this small keep it flat, and extraction no slower: the
# shapes repeat within one batch, where two entries serve, not across batches (training, with more
# shapes per batch, is about 7% slower). Set here, before torch computes anything; a value the user set
# is kept.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "2")
os.environ.setdefault("LRU_CACHE_CAPACITY", "16")
# Arrow's tables (one part of every table per window) are allocated from jemalloc rather than mimalloc,
# pyarrow's default on Linux: jemalloc hands freed memory back to the system as it goes. Measured peak of
# a 200k-review run, six runs each: 1,119 to 1,155 MB (mean 1,132) against 1,137 to 1,186 MB (mean
# 1,165); 20k-review runs and speed alike. Read once, when pyarrow first needs its default pool; a value
# the user set is kept.
if sys.platform.startswith("linux"):  # where pyarrow's wheels include jemalloc
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")

from .errors import BertAttnError
from .spec import JobSpec, load_job


def run_job(spec: JobSpec, **kwargs):  # lazy: importing the package should not import torch
    from .pipeline import run_job as _run_job

    return _run_job(spec, **kwargs)


__all__ = ["BertAttnError", "JobSpec", "__version__", "load_job", "run_job"]
