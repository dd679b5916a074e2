"""docs/recipes.md reads runs through the manifest: a stray part file in every table (as a killed upload
to a store leaves) changes what a glob over the folders reads, and none of the recipes' answers."""

from __future__ import annotations

import re
import shutil
import sys
import types
from pathlib import Path
from typing import ClassVar

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from bertattn_batch import part_paths, scan_run, schema
from bertattn_batch.config import InputSpec, JobSpec
from bertattn_batch.engines import run_job
from bertattn_batch.run import read_manifest

duckdb = pytest.importorskip("duckdb")
REPO = Path(__file__).resolve().parents[3]
RECIPES = re.compile(r"<!-- recipe: (\w+) -->\n```\w+\n(.*?)```", re.S)
STRAY = "part-000000000000-0badf00d.parquet"


@pytest.fixture(scope="module")
def runs(tiny_en_dir, drug_rows, tmp_path_factory) -> tuple[Path, Path, str]:
    """A run in several parts, a copy of it with a stray file in every table, and the label to ask of."""
    base = tmp_path_factory.mktemp("recipes")
    pq.write_table(pa.Table.from_pylist(drug_rows[:30]), base / "reviews.parquet")
    clean, stray = base / "clean", base / "stray"
    spec = JobSpec(inputs=InputSpec([str(base / "reviews.parquet")], id_col="doc_id"), model=str(tiny_en_dir),
                   out=str(clean), window=10, progress=False)  # fmt: skip
    run_job(spec)
    shutil.copytree(clean, stray)
    first = read_manifest(stray).parts[0]
    for table in schema.TABLES:
        t = pq.read_table(stray / first.files[table])
        for column in ("weight", "weight_scaled"):  # the stray's weights top every head
            if column in t.column_names:
                t = t.set_column(t.column_names.index(column), column, pa.array(np.ones(len(t), np.float32)))
        pq.write_table(t, stray / table / STRAY)
    preds = pl.read_parquet(part_paths(clean, "predictions")).filter(pl.col("status") == "ok")
    return clean, stray, preds["pred_label"].mode().sort()[0]


def recipe(name: str, run: Path, label: str) -> str:
    """A recipe of docs/recipes.md, asked of ``run`` and ``label``, of tokens seen in 2 reviews (not 5)."""
    found = dict(RECIPES.findall((REPO / "docs" / "recipes.md").read_text(encoding="utf-8")))
    text = found[name].replace("runs/en-drug-reviews", str(run)).replace(">= 5", ">= 2")
    return text.replace("'positive'", f"'{label}'").replace('"positive"', repr(label))


def _exec(code: str, **scope) -> dict:
    exec(code, scope)
    return scope


def answers(run: Path, label: str) -> dict[str, pl.DataFrame]:
    """Every recipe's answer on ``run``: polars, DuckDB SQL, and Spark's recipe (Spark stood in for by
    DuckDB over the files Spark is handed)."""
    keys = ["doc_id", "layer", "head", "position"]
    con = _exec(recipe("duckdb_views", run, label))["con"]
    con.execute(recipe("long_sql", run, label))
    spark = _exec(recipe("spark", run, label), TOP_SQL=recipe("top_sql", run, label))["top"]
    return {
        "long_polars": _exec(recipe("long_polars", run, label))["attention"].collect().sort(keys),
        "long_sql": con.sql("SELECT * FROM attention").pl().sort(keys),
        "top_polars": _exec(recipe("top_polars", run, label))["top"],
        "top_sql": con.sql(recipe("top_sql", run, label)).pl(),
        "n_top_sql": con.sql(recipe("n_top_sql", run, label)).pl(),
        "spark": spark,
    }


class _Spark:
    """As much of a SparkSession as the recipe uses, its reads and SQL run by DuckDB."""

    read_paths: ClassVar[list[str]] = []

    def __init__(self) -> None:
        self.con = duckdb.connect()
        self.read = self

    def parquet(self, *paths: str) -> _Spark:
        _Spark.read_paths.extend(paths)
        self.frame = self.con.read_parquet(list(paths))
        return self

    def createOrReplaceTempView(self, name: str) -> None:
        self.frame.create_view(name)

    def sql(self, query: str) -> pl.DataFrame:
        return self.con.sql(query).pl()


@pytest.fixture(autouse=True)
def _pyspark(monkeypatch):
    session = types.SimpleNamespace(builder=types.SimpleNamespace(getOrCreate=_Spark))
    monkeypatch.setitem(sys.modules, "pyspark", types.ModuleType("pyspark"))
    monkeypatch.setitem(sys.modules, "pyspark.sql", types.SimpleNamespace(SparkSession=session))


def test_a_stray_part_in_every_table_changes_no_recipes_answer(runs):
    clean, stray, label = runs
    want, got = answers(clean, label), answers(stray, label)
    assert want["top_sql"].height > 0 and want["long_polars"].height > 0
    for name, frame in want.items():
        assert_frame_equal(got[name], frame, check_exact=False)
    assert_frame_equal(want["spark"], want["top_sql"], check_exact=False)
    # read by a glob, the stray counts
    glob = pl.scan_parquet(stray / "cls_attention" / "*.parquet").collect()
    assert glob.height > want["long_polars"].height


def test_part_paths_lists_the_committed_files_only(runs):
    _, stray, _ = runs
    parts = read_manifest(stray).parts
    for table in schema.TABLES:
        paths = part_paths(stray, table)
        assert paths == [str(stray / p.files[table]) for p in sorted(parts, key=lambda p: p.name)]
        assert STRAY not in {Path(p).name for p in paths} and (stray / table / STRAY).is_file()
    _Spark.read_paths.clear()
    answers(stray, "positive")
    assert sorted(_Spark.read_paths) == sorted(p for t in ("predictions", "cls_attention", "tokens")
                                               for p in part_paths(stray, t))  # fmt: skip


def test_scan_run_gives_every_table_and_empty_ones_for_an_empty_run(runs, tiny_en_dir, tmp_path):
    clean, _, _ = runs
    frames = scan_run(clean)
    for table in schema.TABLES:
        rows = sum(pq.read_metadata(p).num_rows for p in part_paths(clean, table))
        assert getattr(frames, table).collect().height == rows > 0
    (tmp_path / "empty.csv").write_text("text\n")
    run_job(JobSpec(inputs=[str(tmp_path / "empty.csv")], model=str(tiny_en_dir), out=str(tmp_path / "run"),
                    progress=False))  # fmt: skip
    empty = scan_run(tmp_path / "run")
    assert empty.attention.collect().height == 0 and "token" in empty.attention.collect_schema().names()
