"""Tell models apart by their weights: a run records the hash of the weights it scored with, and a
resume, ``faithfulness`` or ``plot --pairs`` refuses a folder that now holds other weights."""

from __future__ import annotations

import hashlib
from pathlib import Path

from .checks import resolve_source

#: weights_hash's results, by the files' paths, sizes and modification times
_HASHES: dict[tuple, str] = {}


def weights_hash(path: str) -> str:
    """sha256 over the weight files of a local model folder (or its hub cache), to tell models apart."""
    folder = Path(path)
    if not folder.is_dir():
        try:
            from transformers.utils import cached_file

            found = cached_file(path, "config.json")
            folder = Path(found).parent if found else folder
        except OSError:
            return "unknown"
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
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


def is_other_model(source: str, weights_sha256: str | None) -> bool:
    """Whether the model at ``source`` surely has other weights than those a run recorded: checked
    before it is loaded, since a model retrained into the same folder may fail the run's settings (its
    length, its layers) and be refused for that instead of for being another model."""
    if not weights_sha256:
        return False
    now = weights_hash(resolve_source(source))
    return now != "unknown" and now != weights_sha256
