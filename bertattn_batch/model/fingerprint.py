"""Tell models apart: a run records hashes of the weights, the config and the tokenizer it scored
with, and a resume, ``faithfulness`` or ``plot --pairs`` refuses a folder that now holds another
model (trained again, or a config.json edited beside the same weights)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .checks import resolve_source

#: weights_hash's results, by the files' paths, sizes and modification times
_HASHES: dict[tuple, str] = {}

#: config.json keys that leave the outputs of inference as they are: names and versions, settings that
#: a load chooses (dtype, attention kernel, what is returned), dropout and initialisation (training
#: only). Labels are compared by their names. Every other key changes what the model computes: heads,
#: activation, layer-norm epsilon, positions, pruned heads, and pad_token_id too (RoBERTa numbers its
#: positions from it).
_INERT_CONFIG_KEYS = frozenset(
    {
        "transformers_version", "architectures", "id2label", "label2id", "torch_dtype", "dtype",
        "attn_implementation", "output_attentions", "output_hidden_states", "return_dict", "torchscript",
        "use_cache", "chunk_size_feed_forward", "classifier_dropout", "hidden_dropout_prob",
        "attention_probs_dropout_prob", "dropout", "attention_dropout", "initializer_range",
        "gradient_checkpointing", "finetuning_task", "task_specific_params", "tokenizer_class",
        "classifier_dropout_prob", "seq_classif_dropout", "qa_dropout", "summary_last_dropout",
        "problem_type",
    }
)  # fmt: skip

#: Text that tells tokenizers apart by what they do: case, accents, width, CJK, digits, emoji, spaces.
_PROBE = "Hello WORLD! Ünïcödé café naïve 123,456.7 好吃不贵 ＡＢＣ１ 😀 don't re-do it\tnow\nthen"


def _folder(path: str) -> Path | None:
    """The local folder of a model (a hub name: its cache), or None where there is none."""
    folder = Path(path)
    if folder.is_dir():
        return folder
    try:
        from transformers.utils import cached_file

        found = cached_file(path, "config.json")
    except OSError:
        return None
    return Path(found).parent if found else None


def weights_hash(path: str) -> str:
    """sha256 over the weight files of a local model folder (or its hub cache), to tell models apart."""
    folder = _folder(path)
    files = (sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))) if folder else []
    if not files:
        return "unknown"
    key = tuple((str(f.resolve()), st.st_size, st.st_mtime_ns) for f, st in ((f, f.stat()) for f in files))
    if key not in _HASHES:  # a check before loading, then the load: a 1 GB model is read once
        h = hashlib.sha256()
        for f in files:
            h.update(f.name.encode())
            with open(f, "rb") as fh:
                while block := fh.read(1 << 23):
                    h.update(block)
        _HASHES[key] = h.hexdigest()
    return _HASHES[key]


def config_hash(path: str) -> str:
    """sha256 of the model's config.json without the keys that do not change its outputs (nor those of
    the loader's own, starting with ``_``). The file, not the loaded config: a library upgrade that adds
    settings with their defaults does not make a nightly run's model another."""
    folder = _folder(path)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8")) if folder else None
    except (OSError, ValueError):
        config = None
    if not isinstance(config, dict):
        return "unknown"
    kept = {k: v for k, v in config.items() if k not in _INERT_CONFIG_KEYS and not k.startswith("_")}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def tokenizer_hash(tokenizer: Any) -> str:
    """sha256 of what the tokenizer does: its vocabulary, the ids and spans it gives a probe text, and the
    side it truncates. Behaviour, not its saved form, so that a library upgrade that spells the same
    tokenizer otherwise does not stop a nightly run from resuming."""
    enc = tokenizer(_PROBE, return_offsets_mapping=True, verbose=False)  # verbose: of a length limit
    state = [sorted(tokenizer.get_vocab().items()), enc["input_ids"], enc["offset_mapping"]]
    state.append(getattr(tokenizer, "truncation_side", "right"))
    return hashlib.sha256(json.dumps(state, ensure_ascii=False).encode()).hexdigest()


def other_model_files(source: str, recorded: Mapping[str, Any]) -> str | None:
    """What of the model at ``source`` surely differs from what a run ``recorded`` (its manifest's
    model): "other weights" or "another config.json", else None. Checked before the model loads, since
    a model retrained into the same folder may fail the run's settings (its length, its layers) and be
    refused for that instead of for being another model. A hash the run did not record (or recorded as
    "unknown") is not compared."""
    path = resolve_source(source)
    for what, key, now in (
        ("other weights", "weights_sha256", weights_hash),
        ("another config.json", "config_sha256", config_hash),
    ):
        theirs = recorded.get(key)
        if theirs not in (None, "", "unknown") and (mine := now(path)) != "unknown" and mine != theirs:
            return what
    return None
