"""extract --contributions alti: the contributions table holds, per content token of every scored review,
the value an independent per-review eager computation gives (padded batches, several parts), and a run
records the setting so that a resume with another one is refused."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import alti_reference, read_table
from transformers import AutoModelForSequenceClassification

from bertattn_batch.config import JobSpec
from bertattn_batch.engines import run_job
from bertattn_batch.errors import RunDirError, SpecError
from bertattn_batch.run import scan_run


def _job(src, model, out, **kw) -> JobSpec:
    return JobSpec(inputs=[str(src)], model=str(model), out=str(out), progress=False, **kw)


@pytest.fixture(scope="module")
def alti_run(drug_sample, tiny_en_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "alti"
    # small batches of mixed lengths (padding in most), two parts
    run_job(_job(drug_sample, tiny_en_dir, out, contributions="alti", batch_tokens=96, window=16))
    return out


def test_contributions_equal_an_eager_reference(alti_run, tiny_en_dir):
    eager = AutoModelForSequenceClassification.from_pretrained(
        tiny_en_dir, attn_implementation="eager"
    ).eval()
    tokens = read_table(alti_run, "tokens").to_pandas()
    contributions = read_table(alti_run, "contributions").to_pandas()
    assert contributions["alti"].dtype == np.float32
    assert len(contributions) == len(tokens)
    merged = tokens.merge(contributions, on=["doc_id", "position"], how="outer", validate="one_to_one")
    assert merged["alti"].notna().all() and merged["token_id"].notna().all()
    cls_id, sep_id = 101, 102  # MiniLM's WordPiece vocabulary
    checked = 0
    for _, group in merged.sort_values(["doc_id", "position"]).groupby("doc_id"):
        ids = torch.tensor([[cls_id, *group["token_id"].astype(int), sep_id]])
        with torch.inference_mode():
            expected, _ = alti_reference(eager, ids)
        np.testing.assert_allclose(
            group["alti"].to_numpy(np.float64), expected[1:-1].numpy(), atol=1e-5, rtol=0
        )
        checked += 1
    preds = read_table(alti_run, "predictions")
    assert checked == sum(s == "ok" for s in preds.column("status").to_pylist()) > 0


def test_contributions_are_parts_beside_the_other_tables(alti_run):
    files = sorted(p.name for p in (alti_run / "contributions").iterdir())
    assert files == sorted(p.name for p in (alti_run / "tokens").iterdir()) and len(files) == 2
    written = pq.read_schema(alti_run / "contributions" / files[0])
    assert written.names == ["doc_id", "position", "alti"]
    frame = scan_run(alti_run).contributions.collect()
    assert frame.height == read_table(alti_run, "tokens").num_rows


def test_a_resume_with_another_setting_is_refused(alti_run, drug_sample, tiny_en_dir):
    with pytest.raises(RunDirError):
        run_job(_job(drug_sample, tiny_en_dir, alti_run, batch_tokens=96, window=16))


def test_without_the_option_there_is_no_table(drug_sample, tiny_en_dir, tmp_path):
    out = tmp_path / "plain"
    run_job(_job(drug_sample, tiny_en_dir, out, window=16))
    assert not (out / "contributions").exists()
    assert scan_run(out).contributions.collect().height == 0


def test_an_unknown_method_is_refused(drug_sample, tiny_en_dir, tmp_path):
    with pytest.raises(SpecError, match="contributions"):
        _job(drug_sample, tiny_en_dir, tmp_path / "x", contributions="rollout")


def test_empty_window_has_an_empty_table(tmp_path, tiny_en_dir):
    src = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"text": pa.array([None, ""], pa.string())}), src)
    out = tmp_path / "run"
    run_job(_job(src, tiny_en_dir, out, contributions="alti"))
    assert read_table(out, "contributions").num_rows == 0
