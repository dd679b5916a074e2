"""The training stage: the classifier a job reads reviews with, fine-tuned or trained from scratch."""

from .api import finetune, finetune_files
from .job import ensure_model, plan_training
from .loop import accuracy, macro_f1, split_indices
from .save import HELDOUT_FILE, METRICS_FILE

__all__ = [
    "HELDOUT_FILE",
    "METRICS_FILE",
    "accuracy",
    "ensure_model",
    "finetune",
    "finetune_files",
    "macro_f1",
    "plan_training",
    "split_indices",
]
