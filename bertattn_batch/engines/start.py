"""What every engine does as it starts: load the job's classifier where the windows run, and describe
it (with the job and the library versions) for the run's header."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from typing import Any

from .. import __version__, storage
from ..config import PACKAGE_PREFIX, JobSpec, parse_label_map
from ..errors import ModelError, RunDirError, SpecError, first_line
from ..extract import TableOptions
from ..extract.words import dictionary_sha256
from ..model.checks import other_model_files, resolve_source, tokenizer_hash
from ..model.classifier import Classifier
from ..run import read_manifest
from ..train.save import training_record


def run_header(spec: JobSpec, clf: Any) -> dict[str, Any]:
    """Manifest fields fixed for the life of a run; ``fingerprint`` decides whether a resume may mix in."""
    import pyarrow
    import tokenizers
    import torch
    import transformers

    dtype, inputs = str(clf.dtype).removeprefix("torch."), spec.inputs
    words = TableOptions.of(spec, clf)  # the words its tokens table holds
    labels = {str(k): v for k, v in clf.id2label.items()}
    fingerprint = {
        "model_sha256": clf.weights_sha256,
        # heads, activation, epsilon or the folder's code edited beside them
        "model_config_sha256": clf.config_sha256,
        "labels": labels,  # the model folder's other files: labels or a tokenizer changed beside the weights
        "tokenizer_sha256": tokenizer_hash(clf.tokenizer),
        "inputs": [storage.absolute(p) for p in inputs.paths],  # the same files, from any directory
        "columns": [inputs.text_col, inputs.id_col, inputs.label_col],
        "input_format": inputs.format,  # the same file read as another format has other rows
        "encoding": inputs.encoding, "delimiter": inputs.delimiter, "layers": clf.layers,
        "max_length": clf.max_length, "dtype": dtype, "attention": spec.attention,
        "store_text": spec.store_text, "value_zeroing": spec.value_zeroing,
        "contributions": spec.contributions, "words": words.words,
        "user_dict_sha256": dictionary_sha256(words.user_dict),
    }  # fmt: skip
    fingerprint["job_sha256"] = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()
    source = located(clf.source)
    model = {
        "source": source, "weights_sha256": clf.weights_sha256, "config_sha256": clf.config_sha256,
        "model_type": clf.model.config.model_type, "word_continuation": clf.word_continuation,
        "words": clf.words, "byte_level": clf.byte_level, "num_layers": clf.num_layers,
        "num_heads": clf.num_heads, "layers": clf.layers, "id2label": labels, "max_length": clf.max_length,
        "dtype": dtype,
        "device": str(clf.device), "attention": spec.attention,
        "training": training_record(resolve_source(source)),
    }  # fmt: skip
    versions = {
        "bertattn_batch": __version__, "python": sys.version.split()[0], "platform": platform.platform(),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__, "pyarrow": pyarrow.__version__,
    }  # fmt: skip
    spec_dict = {
        **spec.to_dict(),
        "inputs": list(map(storage.redact, inputs.paths)),
        "model": located(spec.model),
    }
    return {"spec": spec_dict, "fingerprint": fingerprint, "model": model, "versions": versions}


def located(model: str) -> str:
    """A model as a run records it for the commands that load it again: a local folder by its absolute
    path (they may run in another directory); a hub name, ``package:NAME`` or a store's URI as it is,
    its credentials redacted."""
    local = not storage.is_remote(model) and not model.startswith(PACKAGE_PREFIX)
    return os.path.abspath(model) if local and os.path.exists(model) else storage.redact(model)


def load_classifier(spec: JobSpec) -> Any:
    """The job's classifier, as every engine loads it. Where a model that the job's settings do not fit
    has other weights than the run it continues (a folder trained again since), that is what is said."""
    try:
        clf = Classifier.load(
            spec.model, layers=spec.layers, device=spec.device, dtype=spec.dtype, attention=spec.attention,
            max_length=spec.max_length, trust_remote_code=spec.trust_remote_code,
            allow_pickle=spec.allow_pickle, trim_last_layer=spec.trim_last_layer,
            value_zeroing=spec.value_zeroing, contributions=spec.contributions, compile=spec.compile,
        )  # fmt: skip
    except (SpecError, ModelError) as e:
        if spec.on_existing not in ("resume", "incremental"):
            raise
        try:
            recorded = read_manifest(spec.out).model
        except (RunDirError, OSError):
            recorded = {}
        if other := other_model_files(spec.model, recorded):
            raise RunDirError(
                f"{spec.out} was made with {other} than the model at {spec.model} now has (trained "
                f"again since?), which does not load with the run's settings ({first_line(e)}); pass "
                "--overwrite or choose another --out"
            ) from None
        raise
    parse_label_map(spec.label_map, clf.labels)  # before any review is read
    return clf
