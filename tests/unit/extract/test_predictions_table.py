"""The predictions table answers questions alone: each review's text, the probability of the predicted
label, and the id of the run that wrote it."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
from helpers import read_table

from bertattn_batch.config import JobSpec
from bertattn_batch.engines import run_job


def test_predictions_carry_text_run_id_and_the_predicted_probability(tiny_en_dir, tmp_path):
    src = tmp_path / "in.parquet"
    texts = ["great food", None, "slow   service\xa0at night", "  "]
    pq.write_table(pa.table({"text": pa.array(texts, pa.string())}), src)
    out = tmp_path / "run"
    run_job(JobSpec(inputs=[str(src)], model=str(tiny_en_dir), out=str(out), progress=False))
    preds = read_table(out, "predictions").to_pylist()
    run_id = json.loads((out / "manifest.json").read_text())["run_id"]
    assert run_id and {p["run_id"] for p in preds} == {run_id}
    assert [p["text"] for p in preds] == texts  # as read, byte for byte; null where there was none
    for p in preds:
        if p["status"] == "ok":
            assert abs(p["pred_prob"] - max(p["probs"])) < 1e-7
        else:
            assert p["pred_prob"] is None
    lean = tmp_path / "lean"
    run_job(
        JobSpec(inputs=[str(src)], model=str(tiny_en_dir), out=str(lean), store_text=False, progress=False)
    )
    assert read_table(lean, "predictions").column("text").null_count == len(texts)
