"""Saved ``datasets`` folders (``Dataset.save_to_disk``): memory-mapped, read in blocks, ``ClassLabel``
ids turned into their names."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InputError, first_line
from .files import Source
from .rows import column_values


def load_dataset(path: Path | str) -> Any:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as e:
        raise InputError(f"{path}: not a saved datasets dataset: {first_line(e)}") from None
    if isinstance(ds, datasets.DatasetDict):
        raise InputError(f"{path} holds several splits; name one: {', '.join(f'{path}/{s}' for s in ds)}")
    return ds


def class_label_names(ds: Any) -> dict[str, list[str]]:
    """The names of a dataset's ``ClassLabel`` columns, whose integers are ids, not labels."""
    import datasets

    return {c: list(f.names) for c, f in ds.features.items() if isinstance(f, datasets.ClassLabel)}


def class_label_order(sources: Iterable[Source], column: str) -> list[str]:
    """The names of ``column``'s ``ClassLabel`` in id order where every source is a saved dataset with
    that same ``ClassLabel`` (a classifier trained on them keeps the dataset's ids), else none."""
    orders = {
        tuple(class_label_names(load_dataset(src.path)).get(column, ())) if src.format == "datasets" else ()
        for src in sources
    }
    return [name.strip() for name in orders.pop()] if len(orders) == 1 else []  # as labels are read


def read_datasets(src: Source, wanted: list[str], block_rows: int) -> Iterator[dict[str, list[Any]]]:
    ds = load_dataset(src.path).select_columns(wanted)
    names = class_label_names(ds)
    for table in ds.with_format("arrow").iter(batch_size=block_rows):
        yield {c: _named(table.column(c), names.get(c)) for c in wanted}


def _named(ids: pa.ChunkedArray, labels: list[str] | None) -> list[Any]:
    """A column's values; a ``ClassLabel``'s ids as their names (-1 and other ids out of range: null),
    so that ``label`` compares with ``pred_label`` and a classifier trains on the real names."""
    if labels is not None:
        valid = pc.and_(pc.greater_equal(ids, 0), pc.less(ids, len(labels)))
        ids = pc.take(pa.array(labels, pa.string()), pc.if_else(valid, ids, None))
    return column_values(ids)


def datasets_columns(src: Source) -> list[str]:
    return list(load_dataset(src.path).column_names)


def datasets_rows(src: Source) -> int:
    return int(load_dataset(src.path).num_rows)
