"""The progress line's figures: tokens a second, and the share of the time the model kept its device(s)
busy, which says on a GPU whether the host side feeds it."""

from __future__ import annotations

from collections import Counter

from bertattn_batch.engines.base import RunSummary, _postfix
from bertattn_batch.extract import PartStats


def _summary(tokens: int, model_s: float) -> RunSummary:
    return RunSummary(run_dir="r", stats=PartStats(tokens=tokens, seconds=Counter(model=model_s)))


def test_the_line_gives_tokens_a_second_and_the_models_busy_share():
    assert _postfix(_summary(10_000, 3.0), elapsed=4.0, workers=1) == "2,500 tok/s, model busy 75%"
    # on Ray each worker's model seconds add up: the share is of every worker's time
    assert _postfix(_summary(10_000, 3.0), elapsed=4.0, workers=2).endswith("model busy 38%")
    assert _postfix(_summary(0, 5.0), elapsed=4.0, workers=1).endswith("model busy 100%")  # never above


def test_the_manifest_and_the_summary_line_give_the_same_figures():
    """The report read a padding share a tenth of a percent above the line's: the manifest's figures were
    rounded once and the report rounded them again. They are stored unrounded."""
    s = RunSummary(
        run_dir="r",
        stats=PartStats(tokens=90_051, padded_slots=100_000, scored=1413),  # padding 9.949%
        seconds={"wall": 11.0},  # 128.4545 reviews/s
    )
    stored = s.as_dict()
    assert "padding 9.9%, 128.5 reviews/s" in s.line()
    assert f"{stored['padding_share']:.1%}, {stored['reviews_per_s']:.1f}" == "9.9%, 128.5"


def test_the_bar_moves_per_batch_to_its_total_and_keeps_loading_bars_out(
    tiny_en_dir, drug_sample, tmp_path, capsys, monkeypatch
):
    """A 979-review job sat at 0/979 for 35 s: the bar moved once per window. It moves per batch, is
    labelled with the run, reaches the input's row count, and transformers' own loading bars (which the
    commands turn off) do not mix into it."""
    import pyarrow.parquet as pq
    import tqdm.auto

    from bertattn_batch.cli.base import setup
    from bertattn_batch.config import InputSpec, JobSpec
    from bertattn_batch.engines import run_job

    seen: list[tuple[str, int, int | None]] = []

    class Recorded(tqdm.auto.tqdm):
        def update(self, n=1):
            out = super().update(n)
            seen.append((self.desc, self.n, self.total))
            return out

    monkeypatch.setattr(tqdm.auto, "tqdm", Recorded)
    setup(False)  # what every command does first
    rows = pq.read_metadata(drug_sample).num_rows
    window = 16
    spec = JobSpec(
        inputs=InputSpec([str(drug_sample)], id_col="doc_id"),
        model=str(tiny_en_dir),
        out=str(tmp_path / "run"),
        window=window,
        batch_tokens=256,
    )
    run_job(spec, progress=True)
    moved = [n for _, n, _ in seen]
    assert {d for d, _, _ in seen} == {"extract run"} and {t for _, _, t in seen} == {rows}
    assert moved == sorted(moved) and moved[-1] == rows
    assert len(set(moved)) > -(-rows // window)  # more steps than windows: per batch
    err = capsys.readouterr().err
    assert "extract run" in err and "model busy" in err and "Loading" not in err
