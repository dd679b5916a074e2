"""The training stage: the classifier a job reads reviews with, fine-tuned or trained from scratch."""

from .api import finetune, finetune_files
from .job import TrainingPlan, ensure_model, plan_training, training_inputs
from .metrics import accuracy, macro_f1, split_indices
from .save import METRICS_FILE, check_saved

__all__ = [
    "METRICS_FILE",
    "TrainingPlan",
    "accuracy",
    "check_saved",
    "ensure_model",
    "finetune",
    "finetune_files",
    "macro_f1",
    "plan_training",
    "split_indices",
    "training_inputs",
]
