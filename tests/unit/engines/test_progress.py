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
