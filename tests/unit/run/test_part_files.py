"""Part files as written (run.parts.write_table): the extractor hands doc ids over dictionary-encoded,
and the files must still read back, in every reader, as the plain strings the schemas declare."""

from __future__ import annotations

from unittest import mock

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import bertattn_batch.extract.tables as extract_tables
from bertattn_batch import schema
from bertattn_batch.extract import Extractor, ScoredRow
from bertattn_batch.model.encode import Encoded
from bertattn_batch.run import parts
from bertattn_batch.run.manifest import TABLES

LAYERS, HEADS = [4], 3


def scored_rows(n_reviews: int, seed: int = 0) -> list[ScoredRow]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_reviews):
        n = int(rng.integers(3, 40))
        enc = Encoded(rng.integers(5, 50, n).astype(np.int32), np.zeros((n, 2), np.int32), False)
        weights = rng.random((len(LAYERS), HEADS, n)).astype(np.float32)
        # ids that do not sort in review order, one of them empty: statistics must come from the values
        doc_id = "" if i == 7 else f"review-{(i * 7919) % 1000:04d}-{i}"
        probs = np.array([0.25, 0.75], np.float32)
        rows.append(ScoredRow(i, doc_id, None, "ok", enc, probs, weights, weights * 2))
    return rows


@pytest.fixture
def tables() -> dict[str, pa.Table]:
    vocab = pa.array([f"t{i}" for i in range(50)])
    with mock.patch.object(extract_tables, "CHUNK_TOKEN_ROWS", 500):  # several chunks a window
        return Extractor(vocab, LAYERS, HEADS, ["neg", "pos"]).tables(scored_rows(120))


def test_the_per_token_tables_share_one_dictionary_of_the_windows_ids(tables):
    for name in ("cls_attention", "head_summary", "tokens"):
        column = tables[name].column("doc_id")
        assert column.num_chunks > 1 and pa.types.is_dictionary(column.type)
        dictionaries = {chunk.dictionary.buffers()[2].address for chunk in column.chunks}
        assert len(dictionaries) == 1, f"{name}: each chunk has a dictionary of its own"


@pytest.mark.parametrize("name", TABLES)
def test_a_part_file_reads_back_as_the_declared_table(name, tables, tmp_path):
    table = tables[name]
    plain = table.cast(schema.declared(table.schema))
    assert plain.schema == schema.arrow(name)
    path = tmp_path / f"{name}.parquet"
    with mock.patch.object(parts, "ROW_GROUP_ROWS", 700):  # several row groups
        parts.write_table(table, path)

    # read back as pyarrow reads the plain table written its own way: the same schema (descriptions
    # and version included), rows and footer metadata
    reference = tmp_path / "reference.parquet"
    pq.write_table(plain, reference, row_group_size=700, **parts.write_options(plain.schema))
    back, expected = pq.read_table(path), pq.read_table(reference)
    assert back.schema.equals(expected.schema, check_metadata=True)
    assert back.equals(expected) and back.column("doc_id").equals(plain.column("doc_id"))
    assert pq.read_metadata(path).metadata == pq.read_metadata(reference).metadata
    frame = pl.read_parquet(path)
    assert frame.schema["doc_id"] == pl.String
    assert frame["doc_id"].to_list() == plain.column("doc_id").to_pylist()

    meta = pq.read_metadata(path)
    assert meta.num_row_groups > 1 or table.num_rows <= 700
    doc_id = plain.schema.get_field_index("doc_id")
    offset = 0
    for g in range(meta.num_row_groups):
        chunk = meta.row_group(g).column(doc_id)
        assert "RLE_DICTIONARY" in chunk.encodings
        ids = plain.column("doc_id").slice(offset, meta.row_group(g).num_rows).to_pylist()
        offset += len(ids)
        stats = chunk.statistics  # a reader skips row groups by these
        assert (stats.min, stats.max, stats.null_count) == (min(ids), max(ids), 0)
    # and each row group's dictionary lists its own ids only, not the whole window's
    stored = pq.ParquetFile(path, read_dictionary=["doc_id"])
    offset = 0
    for g in range(meta.num_row_groups):
        group = stored.read_row_group(g, columns=["doc_id"]).column("doc_id")
        ids = plain.column("doc_id").slice(offset, len(group)).to_pylist()
        offset += len(group)
        assert sorted(set(group.combine_chunks().dictionary.to_pylist())) == sorted(set(ids))


def test_a_table_without_dictionaries_is_written_as_pyarrow_writes_it(tmp_path):
    plain = schema.arrow("predictions").empty_table()
    parts.write_table(plain, tmp_path / "a.parquet")
    pq.write_table(plain, tmp_path / "b.parquet", **parts.write_options(plain.schema))
    assert (
        pq.read_metadata(tmp_path / "a.parquet").metadata == pq.read_metadata(tmp_path / "b.parquet").metadata
    )
    assert pq.read_table(tmp_path / "a.parquet").equals(plain)


def test_cast_keeps_dictionary_strings_and_refuses_nulls_in_them():
    ids = pa.DictionaryArray.from_arrays(pa.array([0, 0, 1], pa.int32()), pa.array(["a", "b"]))
    table = pa.table({c: pa.array([1, 2, 3]) for c in schema.columns("head_summary")})
    table = table.set_column(0, "doc_id", ids).set_column(1, "layer", pa.array([4, 4, 4], pa.int8()))
    assert schema.cast(table, "head_summary").schema == schema.arrow("head_summary")  # decoded unless asked
    out = schema.cast(table, "head_summary", keep_dictionaries=True)
    assert pa.types.is_dictionary(out.schema.field("doc_id").type)
    assert out.schema.field("layer").type == pa.int16()  # other columns cast as before
    assert schema.declared(out.schema) == schema.arrow("head_summary")

    null_index = pa.DictionaryArray.from_arrays(pa.array([0, None, 1], pa.int32()), pa.array(["a", "b"]))
    null_value = pa.DictionaryArray.from_arrays(pa.array([0, 1, 1], pa.int32()), pa.array(["a", None]))
    for ids in (null_index, null_value):
        with pytest.raises(Exception, match="doc_id"):
            schema.cast(table.set_column(0, "doc_id", ids), "head_summary", keep_dictionaries=True)


def test_a_write_that_fails_leaves_no_file(tables, tmp_path, monkeypatch):
    def full_disk(self, table, row_group_size=None):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full_disk)
    path = tmp_path / "cls_attention.parquet"
    with pytest.raises(OSError, match="No space left"):
        parts.write_table(tables["cls_attention"], path)
    assert not path.exists()


@pytest.mark.parametrize("name", TABLES)
def test_statistics_are_kept_where_a_reader_skips_by_them(name, tables, tmp_path):
    """Every column of predictions (a row a review, in row order); elsewhere only doc_id, by which a
    reader of one review skips row groups: the others' ranges span everything in every row group."""
    path = tmp_path / f"{name}.parquet"
    parts.write_table(tables[name], path)
    group = pq.read_metadata(path).row_group(0)
    columns = [group.column(i) for i in range(group.num_columns)]
    with_stats = {c.path_in_schema.split(".")[0] for c in columns if c.is_stats_set}  # probs.list.element
    expected = set(schema.columns(name)) if name == "predictions" else {"doc_id"}
    assert with_stats == expected
