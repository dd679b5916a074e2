"""Saving a trained classifier into a temporary folder, checked, then renamed; what a run records of it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._files import atomic_dir, file_lock, json_text
from ..errors import ModelError, WriteError, first_line

METRICS_FILE = "finetune_metrics.json"
#: The doc ids of the reviews held out from training, by which a run's report tells held-out accuracy.
HELDOUT_FILE = "heldout_ids.json"


def check_out_dir(out_dir: Path) -> bool:
    """Refuse a place that holds something else or cannot be written; whether a trained model is there."""
    trained = out_dir.is_dir() and (out_dir / METRICS_FILE).is_file()
    if out_dir.exists() and not trained and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ModelError(f"{out_dir} exists and is not a model trained here; remove it or choose another")
    try:  # the model is written beside its folder first
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryDirectory(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent).cleanup()
    except OSError as e:
        raise ModelError(f"cannot save a model to {out_dir}: {e.strerror or e}") from None
    return trained


@contextlib.contextmanager
def out_dir_lock(out_dir: Path) -> Iterator[None]:
    """One training per output folder at a time; the lock file beside the folder goes when it ends."""
    busy = f"another finetune is training into {out_dir}; wait for it or choose another --out"
    try:
        with file_lock(out_dir.with_name(f".{out_dir.name}.finetune.lock"), busy=lambda _: ModelError(busy),
                       remove=True):  # fmt: skip
            yield
    except OSError as e:
        raise ModelError(f"cannot write beside {out_dir}: {e.strerror or e}") from None


def save_model(model: Any, tokenizer: Any, metrics: dict[str, Any], out_dir: Path, tok_size: int,
               names: list[str], heldout: dict[str, Any] | None = None) -> None:  # fmt: skip
    """Write beside ``out_dir``, check that it reloads, rename it into place; a failed save keeps the old."""
    from safetensors import SafetensorError

    try:
        with atomic_dir(out_dir) as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            backend = getattr(tokenizer, "backend_tokenizer", None)
            if backend is not None:  # truncation is chosen per call, not saved
                backend.no_truncation()
                backend.no_padding()
            tokenizer.save_pretrained(tmp)
            (tmp / METRICS_FILE).write_text(json_text(metrics, indent=2) + "\n", encoding="utf-8")
            if heldout is not None:
                (tmp / HELDOUT_FILE).write_text(json_text(heldout) + "\n", encoding="utf-8")
            umask = os.umask(0)  # the temporary folder's 0700 and its files' modes made the umask's usual
            os.umask(umask)
            for f in [tmp, *tmp.rglob("*")]:
                f.chmod((0o777 if f.is_dir() else 0o666) & ~umask)
            check_saved(tmp, tok_size, names)
    except (OSError, SafetensorError) as e:  # safetensors says a full disk in its own words
        why = "no space left on the device" if "No space left" in str(e) else first_line(e)
        raise WriteError(
            f"cannot save the trained model to {out_dir}: {why}; any model there is kept"
        ) from None


def check_saved(folder: str | Path, tok_size: int, names: list[str]) -> None:
    """Reload a saved folder and check what goes wrong silently: vocabulary, labels, weights format."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = Path(folder)
    if not list(folder.glob("*.safetensors")):
        raise ModelError(f"{folder}: no .safetensors weights were written")
    tok = AutoTokenizer.from_pretrained(folder)
    if len(tok) != tok_size:
        raise ModelError(f"{folder}: reloaded tokenizer has {len(tok)} tokens, trained with {tok_size}")
    model = AutoModelForSequenceClassification.from_pretrained(folder, use_safetensors=True)
    got = [model.config.id2label[i] for i in range(model.config.num_labels)]
    if got != names:
        raise ModelError(f"{folder}: reloaded labels {got}, trained with {names}")
    if model.config.vocab_size < tok_size:
        raise ModelError(f"{folder}: model vocabulary {model.config.vocab_size} < tokenizer's {tok_size}")


def training_record(folder: str | Path) -> dict[str, Any] | None:
    """What a run records of how its model was trained (None for a model not trained here)."""
    path = Path(folder) / METRICS_FILE
    try:
        metrics = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    heldout, spec = Path(folder) / HELDOUT_FILE, metrics.get("spec") or {}
    return {
        **{k: metrics.get(k) for k in ("accuracy", "macro_f1", "n_train", "n_eval")},
        **{k: spec.get(k) for k in ("seed", "epochs")},
        **{k: metrics.get(k) for k in ("steps", "planned_steps")},
        "shortened": bool(metrics.get("shortened")),
        "heldout_ids": str(heldout.resolve()) if heldout.is_file() else None,
        # the report reads the ids later: a model trained into the folder since has other ids
        "heldout_sha256": hashlib.sha256(heldout.read_bytes()).hexdigest() if heldout.is_file() else None,
    }
