"""The readers stream: what one block costs does not grow with the file's row groups."""

from __future__ import annotations

import bz2
import codecs
import csv
import gzip
import json
import logging
import lzma
import random
import tarfile
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertattn_batch import inputs
from bertattn_batch.config import InputSpec
from bertattn_batch.errors import InputError
from bertattn_batch.inputs import formats
from bertattn_batch.inputs.files import compression_of


def test_a_large_parquet_row_group_is_read_a_block_at_a_time(tmp_path):
    # 16 MB of text that does not compress, in one row group: by default Arrow reads (pre-buffers) a
    # row group's whole column chunk, so the first block alone would hold all of it.
    rng = random.Random(0)
    texts = ["".join(chr(rng.randrange(0x4E00, 0x9FA5)) for _ in range(340)) for _ in range(16_000)]
    path = tmp_path / "one-row-group.parquet"
    pq.write_table(pa.table({"text": texts}), path, compression="none", use_dictionary=False)
    assert pq.ParquetFile(path).metadata.num_row_groups == 1

    rows = inputs.read_rows(InputSpec([str(path)]), block_rows=256)
    before = pa.total_allocated_bytes()
    first = next(rows)
    held = pa.total_allocated_bytes() - before
    assert first.text == texts[:256]
    assert held < 4 * 2**20, f"the first block holds {held / 2**20:.1f} MB of Arrow memory"
    assert sum(len(b.text) for b in rows) == len(texts) - 256


# -- files compressed on their own ------------------------------------------------------------------
def _compress(data: bytes, kind: str) -> bytes:
    if kind == "xz":
        return lzma.compress(data, preset=1)
    out = pa.BufferOutputStream()
    with pa.CompressedOutputStream(out, kind) as f:
        f.write(data)
    return out.getvalue().to_pybytes()


#: One file of each line-based format, with what the readers must keep: a byte-order mark, a row of
#: invalid UTF-8, an empty line, Chinese text, CRLF line ends.
_PLAIN = {
    "jsonl": b'{"id": "a", "text": "\xe5\xa5\xbd\xe5\x90\x83"}\n\n{"id": "b", "text": "\xff bad"}\n'
    b'{"id": "c", "text": "fine"}\n',
    "csv": b"\xef\xbb\xbfid,text\r\na,\xe5\xa5\xbd\xe5\x90\x83\r\nb,\xff bad\r\nc,fine\r\n",
    "txt": b"\xef\xbb\xbf\xe5\xa5\xbd\xe5\x90\x83\r\n\xff bad\n\nfine\n",
}


def _rows(path, fmt: str, **kw) -> list[tuple]:
    out = []
    for b in inputs.read_rows(
        InputSpec([str(path)], id_col=None if fmt == "txt" else "id", **kw), block_rows=2
    ):
        out += zip(b.row_index, b.doc_id, b.text, b.status, strict=True)
    return out


@pytest.mark.parametrize(
    "kind, suffix", [("gzip", ".gz"), ("bz2", ".bz2"), ("zstd", ".zst"), ("lz4", ".lz4"), ("xz", ".xz")]
)
@pytest.mark.parametrize("fmt", sorted(_PLAIN))
def test_a_compressed_file_reads_as_its_plain_self(tmp_path, fmt, kind, suffix):
    plain = tmp_path / f"r.{fmt}"
    plain.write_bytes(_PLAIN[fmt])
    packed = tmp_path / f"r.{fmt}{suffix}"
    packed.write_bytes(_compress(_PLAIN[fmt], kind))
    assert compression_of(packed) == kind and compression_of(plain) is None
    expected = _rows(plain, fmt)
    assert [r[-1] for r in expected].count("invalid_utf8") == 1 and expected[0][2] == "好吃"
    assert _rows(packed, fmt) == expected


def test_the_leading_bytes_decide_not_the_name(tmp_path):
    """A gzip file named .csv is read as gzip; a file named as compressed whose bytes are no stream the
    readers know (plain text, lz4's legacy format) is refused, not read as garbage rows."""
    (tmp_path / "packed.csv").write_bytes(gzip.compress(_PLAIN["csv"]))
    assert _rows(tmp_path / "packed.csv", "csv") == _rows(_write(tmp_path / "r.csv", _PLAIN["csv"]), "csv")
    for name, data in [("plain.csv.gz", _PLAIN["csv"]), ("legacy.csv.lz4", b"\x02\x21\x4c\x18" + b"\0" * 12)]:
        with pytest.raises(InputError, match=r"is named as compressed \(\.(gz|lz4)\), but its first bytes"):
            inputs.check_inputs(InputSpec([str(_write(tmp_path / name, data))], id_col="id"))


def test_stream_variants_that_tools_write(tmp_path):
    """pzstd starts with a skippable frame; an empty bzip2 stream ends at once (``bz2.compress(b"")``),
    alone or first in a concatenation."""
    zstd = _compress(b"one\ntwo\n", "zstd")
    skippable = b"\x50\x2a\x4d\x18" + (4).to_bytes(4, "little") + b"\0" * 4
    cases = {
        "pzstd.txt.zst": (skippable + zstd, ["one", "two"]),
        "empty.txt.bz2": (bz2.compress(b""), []),
        "then.txt.bz2": (bz2.compress(b"") + bz2.compress(b"one\n"), ["one"]),
    }
    for name, (data, want) in cases.items():
        path = _write(tmp_path / name, data)
        assert [t for b in inputs.read_rows(InputSpec([str(path)])) for t in b.text] == want, name


def test_a_damaged_header_names_its_file(tmp_path):
    packed = _compress(_PLAIN["csv"] * 1000, "xz")
    for name, data in [
        ("cut.csv.xz", packed[:100]),
        ("flipped.csv.xz", packed[:60] + b"\xff" * 40 + packed[100:]),
    ]:
        with pytest.raises(InputError, match=rf"cannot read .*{name}: |{name}: cannot read as csv"):
            inputs.check_inputs(InputSpec([str(_write(tmp_path / name, data))], id_col="id"))


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_concatenated_streams_read_whole(tmp_path):
    """``cat a.gz b.gz > all.gz`` is a valid gzip file of several members (bzip2, xz and zstd alike);
    stopping after the first would drop the rest of the reviews without a word."""
    for kind, suffix in (("gzip", ".gz"), ("bz2", ".bz2"), ("zstd", ".zst"), ("xz", ".xz")):
        path = tmp_path / f"all.txt{suffix}"
        path.write_bytes(_compress(b"one\ntwo\n", kind) + _compress(b"three\n", kind))
        assert [t for b in inputs.read_rows(InputSpec([str(path)])) for t in b.text] == [
            "one",
            "two",
            "three",
        ], kind


def test_a_folder_reads_its_compressed_review_files_in_name_order(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(_PLAIN["jsonl"])
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(_PLAIN["jsonl"]))
    (tmp_path / "c.jsonl.zst").write_bytes(_compress(_PLAIN["jsonl"], "zstd"))
    sources = inputs.check_inputs(InputSpec([str(tmp_path)], id_col="id"))
    assert [(s.path.name, s.format) for s in sources] == [
        ("a.jsonl", "jsonl"),
        ("b.jsonl.gz", "jsonl"),
        ("c.jsonl.zst", "jsonl"),
    ]
    rows = _rows(tmp_path, "jsonl")
    assert [r[0] for r in rows] == list(range(9)) and [r[1] for r in rows[:3]] == ["a", "b", "c"]


def test_a_stream_cut_short_stops_the_job_with_its_file(tmp_path):
    """Rows before the cut are read; the cut itself is an error, not a quiet end of the file."""
    rng = random.Random(0)
    data = b"".join(b'{"text": "review %d"}\n' % rng.getrandbits(64) for _ in range(100_000))
    for kind, suffix in (("gzip", ".gz"), ("xz", ".xz"), ("zstd", ".zst")):
        packed = _compress(data, kind)
        path = tmp_path / f"cut.jsonl{suffix}"
        path.write_bytes(packed[: len(packed) // 2])
        rows = inputs.read_rows(InputSpec([str(path)]))
        read_before = 0
        with pytest.raises(InputError) as e:
            for b in rows:
                read_before += len(b)
        assert f"{path}: cannot read as jsonl" in str(e.value) and read_before > 10_000


def test_a_gzip_padded_with_zeros_reads_and_a_damaged_one_is_named(tmp_path):
    """Tapes and dd pad a gzip file with zeros, which gzip -dc reads past; so do the readers."""
    data = b"".join(b'{"text": "review %d"}\n' % i for i in range(200))
    padded = tmp_path / "padded.jsonl.gz"
    padded.write_bytes(gzip.compress(data) + b"\0" * 100)
    assert [r[2] for r in _rows(padded, "txt")] == [f"review {i}" for i in range(200)]
    damaged = bytearray(gzip.compress(data))
    damaged[30:40] = b"\xff" * 10  # inside the deflate stream
    path = tmp_path / "damaged.jsonl.gz"
    path.write_bytes(bytes(damaged))
    with pytest.raises(InputError, match=f"cannot read {path}: Error -3 while decompressing data"):
        list(inputs.read_rows(InputSpec([str(path)])))


def test_archives_and_compressed_parquet_are_refused_with_what_to_do(tmp_path):
    (tmp_path / "r.jsonl").write_bytes(_PLAIN["jsonl"])
    with zipfile.ZipFile(tmp_path / "r.jsonl.zip", "w") as z:
        z.write(tmp_path / "r.jsonl", "r.jsonl")
    with tarfile.open(tmp_path / "r.tar.gz", "w:gz") as t:
        t.add(tmp_path / "r.jsonl", "r.jsonl")
    pq.write_table(pa.table({"text": ["x"]}), tmp_path / "r.parquet")
    (tmp_path / "r.parquet.gz").write_bytes(gzip.compress((tmp_path / "r.parquet").read_bytes()))
    for name, message in [
        ("r.jsonl.zip", "is a zip archive; extract its files first"),
        ("r.tar.gz", "is a tar archive; extract its files first"),
    ]:
        with pytest.raises(InputError, match=message):
            inputs.check_inputs(InputSpec([str(tmp_path / name)], format="jsonl"))
        with pytest.raises(InputError, match=r"is an archive \(\.(zip|tar)\); extract its files first"):
            inputs.check_inputs(
                InputSpec([str(tmp_path / name)])
            )  # said at once, not "cannot tell the format"
    with pytest.raises(InputError, match="is gzip-compressed; decompress it first"):
        inputs.check_inputs(InputSpec([str(tmp_path / "r.parquet.gz")]))
    for fmt, name in (("csv", "CSV"), ("jsonl", "JSON lines"), ("text", "plain text")):
        with pytest.raises(InputError, match=f"is a Parquet file, not {name}; pass --input-format parquet"):
            inputs.check_inputs(InputSpec([str(tmp_path / "r.parquet")], format=fmt))
    (tmp_path / "par1.txt").write_text("PAR1 headphones broke after a week\n")  # a review, not Parquet
    assert inputs.check_inputs(InputSpec([str(tmp_path / "par1.txt")], format="text"))


# -- string columns that hold bytes that are not UTF-8 ------------------------------------------------
def _not_utf8(values: list[bytes], kind: pa.DataType = pa.string()) -> pa.Array:
    """A string column as another writer may leave it: Arrow does not check UTF-8 when it reads one."""
    return pa.array(values, pa.binary()).view(pa.string()).cast(kind)


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string(), pa.dictionary(pa.int32(), pa.string())])
def test_a_parquet_string_that_is_not_utf8_is_that_rows_status(tmp_path, kind):
    texts = [b"good", b"bad \xff text", b"fine", b"also fine"]
    ids = [b"a", b"b", b"c\xfe", b"d"]
    path = tmp_path / "written-elsewhere.parquet"
    pq.write_table(pa.table({"id": _not_utf8(ids, kind), "text": _not_utf8(texts, kind)}), path)
    (batch,) = inputs.read_rows(InputSpec([str(path)], id_col="id"))
    assert batch.status == ["ok", "invalid_utf8", "ok", "ok"]
    assert batch.doc_id == ["a", "b", "c\\xfe", "d"]  # as a JSON line's id with that byte is spelt
    assert batch.text == ["good", None, "fine", "also fine"]


def test_a_nested_value_that_is_not_utf8_is_missing_and_a_saved_dataset_reads_alike(tmp_path):
    import datasets

    bad = pa.array([[b"x"], [b"\xff"], [b"y"]], pa.list_(pa.binary())).view(pa.list_(pa.string()))
    texts = _not_utf8([b"one", b"two", b"thr\xe9e"])
    pq.write_table(pa.table({"id": bad, "text": texts}), tmp_path / "nested.parquet")
    (batch,) = inputs.read_rows(InputSpec([str(tmp_path / "nested.parquet")], id_col="id"))
    assert batch.status == ["ok", "null_id", "invalid_utf8"]  # a null id wins, as for any missing id
    assert batch.doc_id == ['["x"]', "1", '["y"]']

    datasets.Dataset(pa.table({"text": texts})).save_to_disk(str(tmp_path / "ds"))
    (batch,) = inputs.read_rows(InputSpec([str(tmp_path / "ds")]))
    assert batch.status == ["ok", "ok", "invalid_utf8"]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
@pytest.mark.parametrize("name", ["r.txt", "r.csv", "r.jsonl", "r.csv.gz"])
def test_a_file_in_another_unicode_encoding_is_refused_with_what_to_do(tmp_path, encoding, name):
    """Notepad's and Excel's "Unicode text" is UTF-16 with a byte-order mark: read as UTF-8 every review
    would be NUL-interleaved bytes."""
    bom = codecs.BOM_UTF16_BE if encoding == "utf-16-be" else b""  # the others write their own
    data = bom + ('{"text": "one"}\n' if "jsonl" in name else "text\none\n").encode(encoding)
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    label = encoding[:6].upper()
    with pytest.raises(InputError, match=rf"is {label} text .* convert it first, e.g. iconv -f {label}"):
        inputs.check_inputs(InputSpec([str(path)]))


def test_narrow_floats_are_spelt_as_they_print(tmp_path):
    """A float32 id 0.1 is "0.1" as in JSON or CSV, not the double it widens to (0.10000000149011612)."""
    ids = pa.array([0.1, 2.5, None, 3.0], pa.float32())
    labels = pa.array([2.7, None, 1.0, 0.5], pa.float32()).cast(pa.float16())
    pq.write_table(pa.table({"id": ids, "text": list("abcd"), "label": labels}), tmp_path / "f.parquet")
    (batch,) = inputs.read_rows(InputSpec([str(tmp_path / "f.parquet")], id_col="id", label_col="label"))
    assert batch.doc_id == ["0.1", "2.5", "2", "3"] and batch.status == ["ok", "ok", "null_id", "ok"]
    assert batch.label == ["2.7", None, "1", "0.5"]


@pytest.mark.parametrize("delimiter", [",", "\t"])
def test_csv_rows_with_the_wrong_number_of_fields_keep_their_place(tmp_path, caplog, monkeypatch, delimiter):
    """An unquoted delimiter in one review of a million-row export is one row with a status, not the end
    of the job: every other row keeps its id, and the ragged row its row number, as Python's csv module
    (the oracle) numbers the rows, across Arrow's blocks (the file is dozens of them) and ours."""
    monkeypatch.setattr(formats, "CSV_BLOCK_BYTES", 1 << 14)
    rng = random.Random(1)
    d = delimiter
    lines = [f"id{d}text"]
    for i in range(6_000):
        text = "".join(rng.choice("abcdefgh ") for _ in range(rng.randrange(40, 120)))
        kind = rng.random()
        if kind < 0.01:
            lines.append(f"r{i}{d}{text}{d}more")  # a field too many
        elif kind < 0.02:
            lines.append(f"r{i}")  # a field too few
        elif kind < 0.03:
            lines.append(f'r{i}{d}"{text}\nover{d} two lines"')
        elif kind < 0.04:
            lines.extend(["", f"r{i}{d}{text}"])  # an empty line is no row
        else:
            lines.append(f"r{i}{d}{text}")
    lines.append(f"last{d}a{d}b")  # ragged rows at the very end
    lines.append("also-last")
    path = tmp_path / ("f.csv" if d == "," else "f.tsv")
    path.write_text("\r\n".join(lines) + "\r\n")
    assert path.stat().st_size > 30 * formats.CSV_BLOCK_BYTES

    rows = [r for r in csv.reader(path.open(newline=""), delimiter=d) if r][1:]
    want = [(r[0], "ok") if len(r) == 2 else (str(n), "wrong_field_count") for n, r in enumerate(rows)]
    got = [
        pair
        for batch in inputs.read_rows(InputSpec([str(path)], id_col="id"), block_rows=100)
        for pair in zip(batch.doc_id, batch.status, strict=True)
    ]
    assert got == want
    ragged = [n for n, (_, status) in enumerate(want) if status != "ok"]
    assert 100 < len(ragged) < 150 and ragged[-2:] == [len(rows) - 2, len(rows) - 1]
    shown = ", ".join(map(str, ragged[:5]))
    assert (
        f"{len(ragged)} rows have another number of fields than the header (rows {shown}, ...)" in caplog.text
    )


def test_a_csv_of_ragged_rows_comes_in_blocks_and_is_named_by_doc_id(tmp_path, caplog):
    """A wrong delimiter makes every row ragged, and Arrow returns no rows at all: the rows still come
    in blocks of the window's size. The warning names rows by their doc ids, which count on across
    files, and is given even where a limit stops the reading."""
    first = tmp_path / "a.csv"
    first.write_text("id,text\nx,fine\ny,fine\n")
    path = tmp_path / "b.csv"
    path.write_text("id,text\n" + "".join(f"r{i},text,\n" for i in range(1_000)) + "ok,fine\n")
    batches = list(inputs.read_rows(InputSpec([str(first), str(path)], id_col="id"), block_rows=64))
    assert max(len(b) for b in batches) == 64
    doc_ids = [d for b in batches for d in b.doc_id]
    assert doc_ids == ["x", "y", *map(str, range(2, 1_002)), "ok"]
    assert (
        "b.csv: 1000 rows have another number of fields than the header (rows 2, 3, 4, 5, 6, ...)"
        in caplog.text
    )

    caplog.clear()
    assert sum(len(b) for b in inputs.read_rows(InputSpec([str(path)], limit=3))) == 3
    assert "b.csv: 3 rows have another number of fields than the header (rows 0, 1, 2)" in caplog.text


def test_a_model_folder_inside_an_input_folder_is_no_input(tmp_path):
    """``finetune reviews/ --out reviews/model``: the model's config.json is no JSON lines file."""
    (tmp_path / "a.jsonl").write_text('{"text": "good"}\n')
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{\n  "model_type": "bert"\n}\n')
    (model / "model.safetensors").write_bytes(b"")
    assert [s.path.name for s in inputs.expand_inputs(InputSpec([str(tmp_path)]))] == ["a.jsonl"]


def test_csv_values_are_kept_byte_for_byte_across_arrows_blocks(tmp_path, monkeypatch):
    """Line breaks inside quoted reviews, rows longer than a block (read again in larger ones) and
    ragged rows among them: every review as Python's csv module (the oracle) reads it, with tiny blocks
    so that block ends fall everywhere, also between the two bytes of a quoted "\\r\\n"."""
    monkeypatch.setattr(formats, "CSV_BLOCK_BYTES", 64)
    rng = random.Random(7)
    pieces = ["a", "b ", "\r\n", "\r", "\n", '""', "é", "，"]
    lines = ["id,text"]
    for i in range(400):
        if rng.random() < 0.03:
            lines.append(f"r{i},x,too many")
            continue
        size = rng.choice([3, 12, 40, 400])  # some rows far longer than a block
        text = "a" + "".join(rng.choice(pieces) for _ in range(rng.randrange(1, size)))
        lines.append(f'r{i},"{text}"')
    path = tmp_path / "f.csv"
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode())

    rows = list(csv.reader(path.open(newline="", encoding="utf-8")))[1:]
    want = [
        (r[0], r[1], "ok") if len(r) == 2 else (str(n), None, "wrong_field_count") for n, r in enumerate(rows)
    ]
    got = [
        (d, t if s == "ok" else None, s)
        for batch in inputs.read_rows(InputSpec([str(path)], id_col="id"), block_rows=50)
        for d, t, s in zip(batch.doc_id, batch.text, batch.status, strict=True)
    ]
    assert got == want
    assert sum("\r\n" in t for _, t, _ in want if t) > 100


@pytest.mark.parametrize("d", [",", "\t"])
def test_a_stray_quote_that_would_swallow_the_rows_after_it_is_refused_with_its_line(tmp_path, d):
    """A review opening with a ``"`` that never closes took the rest of the file into its field (2,000
    lines read as 11 rows); one closed lines later with more after its quote merged the rows between.
    A quote closed on its own line with more after it loses no row, and is read as before."""
    lines = [f"id{d}text", *(f"r{i}{d}review {i}" for i in range(2_000))]
    path = tmp_path / ("f.csv" if d == "," else "f.tsv")
    for stray in [{11: f'r10{d}"never closed'}, {11: f'r10{d}"opens here', 15: f'r14{d}a "quote" in it'}]:
        path.write_text("\n".join({**dict(enumerate(lines)), **stray}.values()) + "\n")
        with pytest.raises(
            InputError, match=f"{path.name}, line 12: a quoted field opens there that runs on"
        ):
            list(inputs.read_rows(InputSpec([str(path)], id_col="id")))
    path.write_text("\n".join({**dict(enumerate(lines)), 11: f'r10{d}"Best" phone'}.values()) + "\n")
    assert sum(b.status.count("ok") for b in inputs.read_rows(InputSpec([str(path)], id_col="id"))) == 2_000


def test_ids_are_spelt_one_to_one(tmp_path):
    """A binary id that is not UTF-8 (``b'\\xff'``) and the four characters ``\\xff`` are spelt apart (else
    the second review would be a duplicate_id); a float id 1e300 is spelt as JSON spells it."""
    path = tmp_path / "ids.parquet"
    ids = [b"\xff", b"\\xff", b"a\\\xff", b"a\\\\xff", b"plain", b"back\\slash"]
    pq.write_table(pa.table({"id": pa.array(ids, pa.binary()), "text": ["x"] * len(ids)}), path)
    (batch,) = inputs.read_rows(InputSpec([str(path)], id_col="id"))
    assert batch.status == ["ok"] * len(ids)
    assert len(set(batch.doc_id)) == len(ids)
    assert batch.doc_id[0] == "\\xff" and batch.doc_id[4:] == [
        "plain",
        "back\\slash",
    ]  # plain ids as they are
    floats = tmp_path / "floats.jsonl"
    floats.write_text('{"id": 1e300, "text": "a"}\n{"id": 2.0, "text": "b"}\n{"id": 1e16, "text": "c"}\n')
    (batch,) = inputs.read_rows(InputSpec([str(floats)], id_col="id"))
    assert batch.doc_id == ["1e+300", "2", "1e+16"]
    # a lone surrogate in a JSON id and the bytes that surrogatepass would make of it
    lone = tmp_path / "lone.jsonl"
    lone.write_text('{"id": "\\ud800", "text": "a"}\n{"id": "\\\\ud800", "text": "b"}\n')
    raw = tmp_path / "raw.parquet"
    pq.write_table(pa.table({"id": pa.array([b"\xed\xa0\x80"], pa.binary()), "text": ["c"]}), raw)
    ids = [d for b in inputs.read_rows(InputSpec([str(lone), str(raw)], id_col="id")) for d in b.doc_id]
    assert ids == ["\\ud800", "\\\\ud800", "\\xed\\xa0\\x80"]


def test_a_jsonl_key_missing_from_the_first_object_is_a_missing_value(tmp_path):
    """Exporters drop null fields: a key an object leaves out, on the first line or a later one, is that
    row's null_id or null_text, not a missing column."""
    path = tmp_path / "sparse.jsonl"
    path.write_text('{"text": "no id here"}\n{"id": "b", "text": "good"}\n{"id": "c"}\n')
    (batch,) = inputs.read_rows(InputSpec([str(path)], id_col="id"))
    assert batch.status == ["null_id", "ok", "null_text"]
    assert batch.doc_id == ["0", "b", "c"]
    typo = tmp_path / "typo.jsonl"
    typo.write_text('{"txt": "a"}\n{"txt": "b"}\n')
    with pytest.raises(InputError, match=r"no column 'text'; columns there: txt"):
        inputs.check_inputs(InputSpec([str(typo)]))


def test_a_column_name_with_spaces_around_it_is_shown_quoted(tmp_path):
    path = tmp_path / "spaced.csv"
    path.write_text("id, text\n1, good\n")  # what a hand-written header often is
    with pytest.raises(
        InputError, match=r"columns there: id, ' text' \(give ' text' with its spaces, quoted\)"
    ):
        inputs.check_inputs(InputSpec([str(path)]))


def test_a_file_in_gb18030_is_named_with_the_command_that_converts_it(zh_rows, tmp_path):
    """What Chinese Excel saves: read as UTF-8, nearly every row would be invalid_utf8."""
    rows = zh_rows[::50][:300]
    path = tmp_path / "excel.csv"
    with open(path, "w", encoding="gb18030", newline="") as f:
        csv.writer(f).writerows([("text", "label"), *((r["text"], r["label"]) for r in rows)])
    with pytest.raises(
        InputError, match=r"not UTF-8 text .*iconv -f GB18030 -t UTF-8 .*or pass --encoding gb18030"
    ):
        inputs.check_inputs(InputSpec([str(path)]))
    read = [b for b in inputs.read_rows(InputSpec([str(path)], label_col="label", encoding="gb18030"))]
    assert [t for b in read for t in b.text] == [r["text"] for r in rows]
    assert {s for b in read for s in b.status} == {"ok"}


@pytest.mark.parametrize(
    ("encoding", "text"),
    [("big5", "這家店很好吃，服務態度很差"), ("shift_jis", "とても美味しいです。また来ます")],
)
def test_a_file_that_several_encodings_read_is_not_said_to_be_one_of_them(tmp_path, encoding, text):
    """GB18030 reads nearly any double-byte text: named alone, it would turn Big5 and Shift_JIS files
    into garbled reviews that all score ok."""
    path = tmp_path / "reviews.csv"
    path.write_bytes(("id,text\n" + "".join(f"{k},{text}\n" for k in range(6))).encode(encoding))
    with pytest.raises(InputError) as e:
        inputs.check_inputs(InputSpec([str(path)]))
    assert "pass the one it was saved in (--encoding gb18030" in str(e.value)
    assert encoding in str(e.value) and "garbled" in str(e.value)


def test_another_delimiter_is_named_and_can_be_given(tmp_path):
    path = tmp_path / "semi.csv"
    path.write_text("doc_id;text;label\na;good food;positive\nb;slow, cold;negative\n")
    with pytest.raises(
        InputError, match=r"columns there: doc_id;text;label \(the header looks ';'-separated"
    ):
        inputs.check_inputs(InputSpec([str(path)], id_col="doc_id"))
    (batch,) = inputs.read_rows(InputSpec([str(path)], id_col="doc_id", label_col="label", delimiter=";"))
    assert batch.text == ["good food", "slow, cold"] and batch.label == ["positive", "negative"]
    assert InputSpec(["x"], delimiter="\\t").delimiter == "\t"


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_a_text_file_has_a_review_a_line_whatever_its_line_endings(tmp_path, newline):
    """Old Mac files end lines in a lone \\r: each is a review, as a CSV reader finds in the same bytes."""
    lines = ["好评一", "", "差评二", "中评三 "]
    (tmp_path / "r.txt").write_bytes(newline.join(lines).encode() + newline.encode())
    (tmp_path / "r.csv").write_bytes(newline.join(["text", *(f'"{x}"' for x in lines)]).encode())
    read = [t for b in inputs.read_rows(InputSpec([str(tmp_path / "r.txt")]), block_rows=2) for t in b.text]
    assert read == lines
    assert read == [t for b in inputs.read_rows(InputSpec([str(tmp_path / "r.csv")])) for t in b.text]


def test_a_lone_carriage_return_inside_a_text_line_ends_it(tmp_path):
    for data, want in [
        (b"one\rtwo\r\n", ["one", "two"]),
        (b"one\r\r", ["one", ""]),
        (b"\n", [""]),
        (b"last", ["last"]),
    ]:
        path = _write(tmp_path / "r.txt", data)
        assert [t for b in inputs.read_rows(InputSpec([str(path)])) for t in b.text] == want, data


def test_a_saved_dataset_inside_an_input_folder_is_read_as_a_dataset(tmp_path, caplog):
    """Its dataset_info.json and state.json are no JSON lines files."""
    import datasets

    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.csv").write_text("id,text\na1,good\n")
    datasets.Dataset(pa.table({"id": ["d1", "d2"], "text": ["fine", "slow"]})).save_to_disk(str(folder / "b"))
    (folder / "c.jsonl").write_text('{"id": "c1", "text": "ok"}\n')
    assert [r[1] for r in _rows(folder, "csv")] == ["a1", "d1", "d2", "c1"]
    with caplog.at_level(logging.WARNING):
        sources = inputs.expand_inputs(InputSpec([str(folder)], format="csv"))
    assert [s.path.name for s in sources] == ["a.csv", "c.jsonl"]  # a format asked for: no dataset
    assert "passed over 1 file(s) that are not review files (b)" in caplog.text
    # the saved dataset itself, named with another format: its metadata read as csv said "columns there: {"
    with pytest.raises(
        InputError, match=r"b is a saved datasets folder, not csv: pass --input-format datasets"
    ):
        inputs.expand_inputs(InputSpec([str(folder / "b")], format="csv"))


def test_an_empty_line_after_a_lone_carriage_return_is_a_row(tmp_path):
    """``a\r\r\n`` is ``a`` and an empty line, as universal newlines read it: losing the empty line would
    give every later row the wrong row number (its id in a text file)."""
    path = tmp_path / "r.txt"
    path.write_bytes(b"a\r\r\nb\r\r\nc\r\n")
    assert [(r[0], r[2]) for r in _rows(path, "txt")] == [(0, "a"), (1, ""), (2, "b"), (3, ""), (4, "c")]
    (tmp_path / "bom.txt").write_bytes(codecs.BOM_UTF8)  # an editor's mark alone is an empty file
    assert _rows(tmp_path / "bom.txt", "txt") == []


def test_json_lines_that_python_cannot_read_keep_their_place(tmp_path):
    """A line with an integer of over 4,300 digits (in any field) is a not_json row, not the end of the
    job; a byte-order mark before a blank first line is no part of the file's values."""
    path = tmp_path / "big.jsonl"
    path.write_text(
        '{"id": "a", "text": "good"}\n{"id": ' + "9" * 5000 + ', "text": "big"}\n'
        '{"id": "c", "text": "fine", "n": ' + "1" * 5000 + '}\n{"id": "d", "text": "ok"}\n'
    )
    assert [(r[1], r[3]) for r in _rows(path, "jsonl")] == [
        ("a", "ok"), ("1", "not_json"), ("2", "not_json"), ("d", "ok")
    ]  # fmt: skip
    first = tmp_path / "first.jsonl"
    first.write_text('{"id": ' + "9" * 5000 + ', "text": "big"}\n{"id": "b", "text": "ok"}\n')
    assert inputs.check_inputs(InputSpec([str(first)], id_col="id"))
    assert [r[3] for r in _rows(first, "jsonl")] == ["not_json", "ok"]
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(codecs.BOM_UTF8 + b'\n{"id": "a", "text": "good"}\n')
    assert inputs.check_inputs(InputSpec([str(bom)], id_col="id"))
    assert [(r[1], r[3]) for r in _rows(bom, "jsonl")] == [("a", "ok")]


def test_a_review_that_spells_a_tar_magic_is_no_archive(tmp_path):
    """A tar header is told by its checksum too, not by "ustar" at byte 257 alone ("mustard")."""
    header = b"id,text\n"
    path = tmp_path / "mustard.csv"
    path.write_bytes(header + b"1," + b"x" * (257 - len(header) - 4) + b" mustard was great\n2,fine\n")
    assert path.read_bytes()[257:262] == b"ustar"
    assert [r[3] for r in _rows(path, "csv")] == ["ok", "ok"]


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
@pytest.mark.parametrize("name", ["r.txt", "r.csv", "r.csv.gz"])
def test_utf16_without_a_byte_order_mark_is_refused_with_what_to_do(tmp_path, encoding, name):
    """ASCII in UTF-16 without a mark is valid UTF-8, of NUL-interleaved text: without this check its
    header names columns 't e x t' and no review reads right."""
    data = "text\n好评 one\n差评 two\n".encode(encoding)
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    label = encoding.upper().replace("-LE", "LE").replace("-BE", "BE")
    with pytest.raises(InputError, match=rf"looks like {label} text without a byte-order mark.*--encoding"):
        inputs.check_inputs(InputSpec([str(path)]))
    # read as what it is, it is fine
    assert inputs.check_inputs(InputSpec([str(path)], encoding=encoding))
    (batch,) = inputs.read_rows(InputSpec([str(path)], encoding=encoding))
    assert batch.text[-2:] == ["好评 one", "差评 two"]  # a text file's first line, "text", is a review


def test_an_encoding_that_refuses_the_file_is_named(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("text\none\n", encoding="utf-8")
    with pytest.raises(
        InputError, match=r"r.csv cannot be read as utf-16 \(UTF-16 stream does not start with BOM"
    ):
        inputs.check_inputs(InputSpec([str(path)], encoding="utf-16"))


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="links and FIFOs are POSIX's")
def test_links_and_fifos_among_the_inputs(tmp_path, caplog):
    """A hard link to an input is read once; a linked subfolder of an input folder is read; a FIFO a
    glob matches is passed over (opening it would wait forever)."""
    import os

    data = tmp_path / "data"
    (data / "real").mkdir(parents=True)
    (data / "real" / "a.csv").write_text("text\nfine\n")
    os.link(data / "real" / "a.csv", tmp_path / "hard.csv")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "b.csv").write_text("text\nslow\n")
    (data / "linked").symlink_to(shared, target_is_directory=True)
    (data / "loop").symlink_to(data, target_is_directory=True)  # walked once, not forever
    found = inputs.expand_inputs(InputSpec([str(data), str(tmp_path / "hard.csv")]))
    assert sorted(Path(s.path).name for s in found) == ["a.csv", "b.csv"]
    assert "hard.csv is the same file as" in caplog.text
    os.mkfifo(tmp_path / "pipe.csv")
    (tmp_path / "c.csv").write_text("text\nok\n")
    (tmp_path / "empty.csv").mkdir()  # a folder a glob matches, holding nothing: passed over
    found = inputs.expand_inputs(InputSpec([str(tmp_path / "[cpe]*.csv")]))
    assert [Path(s.path).name for s in found] == ["c.csv"]
    assert "pipe.csv, which is not a regular file" in caplog.text
    with pytest.raises(InputError, match="matches no review files"):
        inputs.expand_inputs(InputSpec([str(tmp_path / "[pe]*.csv")]))
    (data / "real" / "gone.csv").symlink_to(tmp_path / "nowhere.csv")  # a link in a folder, to nothing
    with pytest.raises(InputError, match=r"gone.csv cannot be read: No such file"):
        inputs.expand_inputs(InputSpec([str(data)]))


@pytest.mark.parametrize("sep", [",", "\t"])
def test_only_an_empty_cell_is_missing_in_csv(tmp_path, sep):
    """Words that other tools take for missing values ("NA", "null", "NaN", "#N/A") are reviews and ids."""
    words = ["NA", "null", "NaN", "#N/A", "N/A", "nan"]
    sep = sep.encode().decode("unicode_escape")
    path = tmp_path / ("r.csv" if sep == "," else "r.tsv")
    path.write_text(
        f"id{sep}text\n" + "".join(f"{w}{sep}{w}\n" for w in words) + f"x{sep}\n", encoding="utf-8"
    )
    rows = _rows(path, "csv" if sep == "," else "tsv")
    assert [(d, t, s) for _, d, t, s in rows[:-1]] == [(w, w, "ok") for w in words]
    assert rows[-1][3] == "null_text"


def _array_rows(tmp_path, objects: list, **dump) -> list[tuple]:
    """The rows of ``objects`` written as one JSON array, and (the oracle) as JSON lines."""
    array, lines = tmp_path / "a.json", tmp_path / "a.jsonl"
    array.write_text(json.dumps(objects, **dump), encoding="utf-8")
    lines.write_text("".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objects), encoding="utf-8")
    got = _rows(array, "jsonl")
    assert got == _rows(lines, "jsonl")
    return got


@pytest.mark.parametrize("chunk", [7, 1 << 20])
@pytest.mark.parametrize("dump", [{}, {"indent": 2, "ensure_ascii": False}, {"separators": (",", ":")}])
def test_a_json_array_of_objects_reads_as_its_json_lines(tmp_path, monkeypatch, chunk, dump):
    """What many exports write (one array of objects, pretty or minified) reads as its JSON lines.
    Read element by element in a buffer of ``chunk`` bytes: elements, multi-byte characters and numbers
    cut by a buffer's end are read whole."""
    monkeypatch.setattr(formats, "ARRAY_CHUNK", chunk)
    objects = [
        {"id": f"r{i}", "text": t, "n": 1234567890123 * i}
        for i, t in enumerate(["好吃不贵 😀", 'say "hi"\n', "", "x" * 50, None, "ünï [bracket]"])
    ]
    rows = _array_rows(tmp_path, objects, **dump)
    assert [r[1] for r in rows] == [f"r{i}" for i in range(6)] and rows[0][2] == "好吃不贵 😀"
    assert _array_rows(tmp_path, []) == []


def test_a_json_arrays_elements_that_are_no_objects_keep_their_place(tmp_path, caplog):
    path = tmp_path / "a.json"
    path.write_bytes(codecs.BOM_UTF8 + b' \n [{"id": "a", "text": "good"}, 3, {"id": "c", "text": "ok"}]\n')
    with caplog.at_level(logging.WARNING):
        rows = _rows(path, "jsonl")
    assert [(r[1], r[3]) for r in rows] == [("a", "ok"), ("1", "not_json"), ("c", "ok")]
    assert "a.json: 1 element is not a JSON object (element 2); recorded with status not_json" in caplog.text
    path.write_text('["first", {"id": "b", "text": "ok"}]')
    with pytest.raises(
        InputError, match=r"a.json:1: expected a JSON object in each element of the array \(got str\)$"
    ):
        _rows(path, "jsonl")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            '[{"id": "a", "text": "good"}, {"id": "b", "te',
            r"the JSON array ends inside element 2 \(the file is",
        ),
        ('[{"id": "a", "text": "good"}, ', r"the JSON array ends without its closing \]"),
        ('[{"id": "a", "text": "good"} {"id": "b"}]', r"expected , or \] after element 1 of the JSON array"),
        (
            '[{"id": "a", "text": "good"}, {"id": b}]',
            r"element 2 of the JSON array is not JSON \(Expecting value\)",
        ),
        ('[{"id": "a", "text": "good"}]\n[{"id": "b"}]', r"text follows the JSON array's closing \]"),
    ],
)
def test_a_damaged_json_array_is_named(tmp_path, text, said):
    """An array cut short, or with an element that is not JSON, cannot be read past it: where the next
    element starts is not known. It stops the read with a message, never with rows lost silently."""
    path = tmp_path / "a.json"
    path.write_text(text)
    with pytest.raises(InputError, match=f"a.json: {said}"):
        _rows(path, "jsonl")


@pytest.mark.parametrize("chunk", range(1, 9))
def test_a_json_arrays_numbers_are_read_whole_across_the_buffers_end(tmp_path, monkeypatch, chunk, caplog):
    """``1.5e3`` cut by the buffer's end after ``1.`` is read whole, not as ``1`` and a missing comma."""
    monkeypatch.setattr(formats, "ARRAY_CHUNK", chunk)
    path = tmp_path / "a.json"
    path.write_text('[{"id": "a", "text": "x", "n": 1.5e3}, 1.5e3, 12345, {"id": "b", "text": "y"}]')
    assert [r[3] for r in _rows(path, "jsonl")] == ["ok", "not_json", "not_json", "ok"]


def test_a_json_array_with_an_element_that_is_no_json_stops_where_it_is(monkeypatch):
    """An element that is not JSON is named where it is, not taken for one cut by the buffer's end (the
    rest of a large export would be read into memory first)."""
    import io

    monkeypatch.setattr(formats, "ARRAY_CHUNK", 1024)
    f = io.BytesIO(b'[{"text": "a"}, {"text": nope}, ' + b'{"text": "b"}, ' * 100_000 + b"]")
    with pytest.raises(InputError, match=r"element 2 of the JSON array is not JSON \(Expecting value\)"):
        list(formats.json_values(f, "big.json")[1])
    assert f.tell() < 10_000


def test_blank_lines_before_the_first_value_keep_the_line_numbers(tmp_path, caplog):
    """They are counted, and read in blocks, whatever their length."""
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"\n" * 300_000 + b'{"id": "a", "text": "ok"}\n[1]\n')
    with caplog.at_level(logging.WARNING):
        assert [r[3] for r in _rows(path, "jsonl")] == ["ok", "not_json"]
    assert "1 line is not a JSON object (line 300002)" in caplog.text
