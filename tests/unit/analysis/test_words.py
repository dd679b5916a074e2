"""Words of Chinese reviews: the word rows equal jieba's own segmentation (``jieba.tokenize`` spans) applied
to the tokens table by hand, on reviews the tokenizer was not built from; a user dictionary adds words."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import jieba
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SEED_TEXT
from helpers import read_table

import bertattn_batch.analysis.aggregate as agg
from bertattn_batch.analysis.words import run_words
from bertattn_batch.config import InputSpec, JobSpec
from bertattn_batch.engines import run_job
from bertattn_batch.errors import SpecError
from bertattn_batch.run import read_manifest

MIXED = "这台ThinkPad才1999元，质量不错！"


@pytest.fixture(scope="module")
def zh_run(tiny_zh_dir, zh_rows, tmp_path_factory) -> Path:
    """Held-out reviews (the tiny tokenizer saw the first 3000), the seed's review and a mixed one."""
    base = tmp_path_factory.mktemp("words")
    rows = [dict(r) for r in zh_rows[-40:]]
    rows += [{"doc_id": "seed", "text": SEED_TEXT, "label": "negative"}]
    rows += [{"doc_id": "mixed", "text": MIXED, "label": "positive"}]
    pq.write_table(pa.Table.from_pylist(rows), base / "reviews.parquet")
    spec = JobSpec(
        inputs=InputSpec([str(base / "reviews.parquet")], id_col="doc_id", label_col="label"),
        model=str(tiny_zh_dir),
        out=str(base / "run"),
        window=16,
        progress=False,
    )
    run_job(spec)
    return base / "run"


def oracle_words(run: Path, user_dict: str | None = None) -> dict[tuple, list]:
    """(doc_id, layer, head) -> [(word, raw, norm, scaled)] in word order: jieba's spans, each token in the
    span holding its first character, weights summed, scaled min-max over the review's words."""
    seg = jieba.Tokenizer()
    if user_dict:
        seg.load_userdict(user_dict)
    texts = {
        p["doc_id"]: p["text"] for p in read_table(run, "predictions").to_pylist() if p["status"] == "ok"
    }
    spans = {d: list(seg.tokenize(t)) for d, t in texts.items()}
    starts = {(t["doc_id"], t["position"]): t["start"] for t in read_table(run, "tokens").to_pylist()}
    acc: dict[tuple, dict] = defaultdict(dict)
    for a in read_table(run, "cls_attention").to_pylist():
        at = starts[(a["doc_id"], a["position"])]
        i = next(i for i, (_, s, e) in enumerate(spans[a["doc_id"]]) if s <= at < e)
        word = acc[(a["doc_id"], a["layer"], a["head"])].setdefault(
            i, [spans[a["doc_id"]][i][0].lower(), 0, 0]
        )
        word[1] += a["weight"]
        word[2] += a["weight_norm"]
    out = {}
    for key, words in acc.items():
        raw = np.array([w[1] for _, w in sorted(words.items())])
        lo, hi = raw.min(), raw.max()
        scaled = (raw - lo) / (hi - lo) if hi > lo else np.zeros_like(raw)
        out[key] = [(w[0], w[1], w[2], s) for (_, w), s in zip(sorted(words.items()), scaled, strict=True)]
    return out


def word_rows_of(run: Path, user_dict: str | None = None, stored: bool = True) -> dict[tuple, list]:
    """The same, from the code under test: every part's word rows by doc_id; ``stored``: whether they
    are the words extraction stored in the tokens table (else segmented again)."""
    words = run_words(read_manifest(run), "jieba", user_dict)
    assert words.stored is stored
    out: dict[tuple, list] = {}
    for part in agg.committed_parts(run):
        rows = agg.review_rows(part, words=words)
        unit_rows, texts = rows.units("word", words)
        found = unit_rows.join(texts, on="term").join(
            rows.reviews.lazy().select("review", "doc_id"), on="review"
        )
        for (doc, layer, head), g in (
            found.collect().sort("position").group_by(["doc_id", "layer", "head"], maintain_order=True)
        ):
            out[(doc, layer, head)] = list(
                zip(g["token"], g["weight"], g["weight_norm"], g["weight_scaled"], strict=True)
            )
    return out


def _same(got: dict[tuple, list], want: dict[tuple, list]) -> None:
    assert got.keys() == want.keys() and len(want) > 100
    for key, rows in want.items():
        assert [w for w, *_ in got[key]] == [w for w, *_ in rows], key
        np.testing.assert_allclose([r[1:] for r in got[key]], [r[1:] for r in rows], rtol=1e-6, atol=1e-9)


def test_word_rows_equal_jiebas_segmentation_of_the_tokens(zh_run):
    assert json.loads((zh_run / "manifest.json").read_text())["model"]["words"] == "jieba"
    want = oracle_words(zh_run)
    _same(word_rows_of(zh_run), want)
    mixed = [w for w, *_ in want[("mixed", 0, 0)]]
    assert {"thinkpad", "1999", "不错", "质量"} <= set(mixed)
    seed = [w for w, *_ in want[("seed", 0, 0)]]
    assert {"服务态度", "差评"} <= set(seed)


def test_the_tokens_table_holds_each_tokens_jieba_word(zh_run):
    """Extraction stores each token's word: the position of the first token of the jieba word that holds
    the token's first character, and the word lower-cased; the fingerprint names the rule."""
    assert json.loads((zh_run / "manifest.json").read_text())["fingerprint"]["words"] == "jieba"
    seg = jieba.Tokenizer()
    texts = {p["doc_id"]: p["text"] for p in read_table(zh_run, "predictions").to_pylist()}
    tokens = read_table(zh_run, "tokens").to_pylist()
    first: dict[tuple, int] = {}
    for t in sorted(tokens, key=lambda t: (t["doc_id"], t["position"])):
        span = next(w for w in seg.tokenize(texts[t["doc_id"]]) if w[1] <= t["start"] < w[2])
        first.setdefault((t["doc_id"], span[1]), t["position"])
        assert t["word"] == first[(t["doc_id"], span[1])] and t["word_text"] == span[0].lower(), t


def test_words_need_no_stored_text(tiny_zh_dir, zh_run, tmp_path):
    """A run that keeps no texts still has its words: extraction segmented them."""
    spec = JobSpec(
        inputs=InputSpec([str(zh_run.parent / "reviews.parquet")], id_col="doc_id", label_col="label"),
        model=str(tiny_zh_dir), out=str(tmp_path / "lean"), window=16, store_text=False, progress=False,
    )  # fmt: skip
    run_job(spec)
    assert read_table(tmp_path / "lean", "predictions")["text"].null_count > 0
    lean = agg.aggregate(tmp_path / "lean", min_reviews=1).table.filter(pl.col("unit") == "word")
    full = agg.aggregate(zh_run, min_reviews=1, into=tmp_path / "full").table.filter(pl.col("unit") == "word")
    key = ["layer", "head", "split", "class_label", "token"]
    assert lean.height > 100 and lean.sort(key)["token"].to_list() == full.sort(key)["token"].to_list()
    from bertattn_batch.render.plot import review_for_plot

    review = review_for_plot(tmp_path / "lean", "seed", unit="word")
    assert review.text is None and review.tokens == review_for_plot(zh_run, "seed", unit="word").tokens
    user = tmp_path / "user.txt"
    user.write_text("超级差评 100 n\n", encoding="utf-8")
    with pytest.raises(SpecError, match="jieba words need the reviews' texts, which this run did not"):
        agg.check_word_unit(read_manifest(tmp_path / "lean"), "jieba", str(user))  # words made again


USER_DICT = "超级差评 100 n\n服务态度超级差 50\n"


def test_a_user_dictionary_jieba_cannot_read_stops_the_job_first(tiny_zh_dir, zh_run, tmp_path):
    user = tmp_path / "user.txt"
    inputs = InputSpec([str(zh_run.parent / "reviews.parquet")], id_col="doc_id", label_col="label")
    with pytest.raises(SpecError, match="is not a file"):
        JobSpec(inputs=inputs, model=str(tiny_zh_dir), out=str(tmp_path / "run"), user_dict=str(user))
    user.write_bytes(b"\xff\xfe not utf-8\n")
    spec = JobSpec(inputs=inputs, model=str(tiny_zh_dir), out=str(tmp_path / "run"), user_dict=str(user),
                   progress=False)  # fmt: skip
    with pytest.raises(SpecError, match="not one jieba reads"):
        run_job(spec)
    assert not list((tmp_path / "run").glob("*/part-*.parquet"))


@pytest.mark.parametrize("own_dictionary", [False, True], ids=["stored", "made-again"])
def test_aggregate_counts_jieba_words(zh_run, tmp_path, own_dictionary):
    """The table's word rows (split 'all') equal the oracle's rows counted and averaged by word: the words
    extraction stored, and those made again with a user dictionary."""
    user = None
    if own_dictionary:
        user = tmp_path / "user.txt"
        user.write_text(USER_DICT, encoding="utf-8")
    result = agg.aggregate(zh_run, min_reviews=1, user_dict=user and str(user), into=tmp_path / "agg")
    table = result.table.filter((pl.col("unit") == "word") & (pl.col("split") == "all"))
    acc: dict[tuple, list] = defaultdict(lambda: [0, 0.0, 0.0, set()])
    for (doc, layer, head), rows in oracle_words(zh_run, user and str(user)).items():
        for word, raw, _, scaled in rows:
            a = acc[(layer, head, word)]
            a[0], a[1], a[2] = a[0] + 1, a[1] + raw, a[2] + scaled
            a[3].add(doc)
    got = {(r["layer"], r["head"], r["token"]): r for r in table.iter_rows(named=True)}
    assert got.keys() == acc.keys()
    for key, (n, raw, scaled, docs) in acc.items():
        assert got[key]["n_occurrences"] == n and got[key]["n_reviews"] == len(docs)
        assert got[key]["mean_weight"] == pytest.approx(raw / n, rel=1e-9)
        assert got[key]["mean_scaled"] == pytest.approx(scaled / n, rel=1e-9, abs=1e-12)


def test_a_dictionary_given_again_reads_the_stored_words(tiny_zh_dir, zh_run, tmp_path, monkeypatch):
    """A run's user dictionary named by another path, with the same words, reads the stored words; one with
    other words makes them again."""
    user = tmp_path / "user.txt"
    user.write_text(USER_DICT, encoding="utf-8")
    spec = JobSpec(
        inputs=InputSpec([str(zh_run.parent / "reviews.parquet")], id_col="doc_id", label_col="label",
                         limit=8),
        model=str(tiny_zh_dir), out=str(tmp_path / "run"), window=16, user_dict=str(user), progress=False,
    )  # fmt: skip
    run_job(spec)
    manifest = read_manifest(tmp_path / "run")
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "user.txt").write_text(USER_DICT, encoding="utf-8")
    monkeypatch.chdir(tmp_path / "copy")
    assert run_words(manifest).stored and run_words(manifest, user_dict="user.txt").stored
    (tmp_path / "copy" / "user.txt").write_text("质量不错\n", encoding="utf-8")
    assert not run_words(manifest, user_dict="user.txt").stored


def test_a_user_dictionary_adds_its_words(zh_run, tmp_path):
    user = tmp_path / "user.txt"
    user.write_text(USER_DICT, encoding="utf-8")
    want = oracle_words(zh_run, str(user))
    _same(word_rows_of(zh_run, str(user), stored=False), want)
    assert "超级差评" in [w for w, *_ in want[("seed", 0, 0)]]
    result = agg.aggregate(zh_run, min_reviews=1, words="jieba", user_dict=str(user), into=tmp_path / "agg")
    assert "超级差评" in result.table.filter(pl.col("unit") == "word")["token"].to_list()


def test_words_none_and_wordpiece_are_chosen_per_aggregate(zh_run, tmp_path):
    none = agg.aggregate(zh_run, min_reviews=1, words="none", into=tmp_path / "none")
    assert set(none.table["unit"]) == {"token"} and none.options["words"] is None
    pieces = agg.aggregate(zh_run, min_reviews=1, words="wordpiece", into=tmp_path / "wp")
    words = pieces.table.filter(pl.col("unit") == "word")["token"].to_list()
    assert "thinkpad" in words and "不错" not in words  # ## pieces join Latin letters, never characters


def test_plot_by_words_sums_a_words_tokens(zh_run):
    """Heads x words equals the oracle's rows; in the token x token maps a word pays its tokens' mean
    attention and receives their sum (computed here cell by cell)."""
    from bertattn_batch.render.plot import by_words, load_review

    review = load_review(zh_run, "seed")
    rng = np.random.default_rng(0)
    n = len(review.tokens)
    review.pairs = rng.random((review.num_heads, n + 2, n + 2))  # (H, S, S)
    review.pair_tokens = ["[CLS]", *review.tokens, "[SEP]"]
    words = by_words(review, "jieba")
    for head in range(review.num_heads):
        want = oracle_words(zh_run)[("seed", review.layer, head)]
        assert words.tokens == [w for w, *_ in want]
        np.testing.assert_allclose(words.weight[head], [w[1] for w in want], rtol=1e-6)
        np.testing.assert_allclose(words.scaled[head], [w[3] for w in want], rtol=1e-6, atol=1e-9)
    member = [[]] + [[] for _ in words.tokens] + [[]]  # each word's token indices in the maps
    member[0], member[-1] = [0], [n + 1]
    ids = {p: i for i, p in enumerate(words.positions)}
    word = 0
    for i, p in enumerate(review.positions):
        word = ids.get(p, word)
        member[word + 1].append(i + 1)
    for a, b in [(0, 1), (1, 2), (3, 3), (len(member) - 2, len(member) - 1)]:
        cell = np.mean([sum(review.pairs[2, q, k] for k in member[b]) for q in member[a]])
        assert words.pairs[2, a, b] == pytest.approx(cell, rel=1e-9)
    assert words.pair_tokens == ["[CLS]", *words.tokens, "[SEP]"] and "words (jieba)" in words.title()
    stored = by_words(review, "jieba", stored=True)  # the words the run's tokens table holds
    assert stored.tokens == words.tokens and np.array_equal(stored.pairs, words.pairs)
    np.testing.assert_array_equal(stored.weight, words.weight)


def test_reviews_are_ranked_by_raw_weight(zh_run, tmp_path):
    """Against polars over the run's tables: each review's largest weight on the token at the head."""
    from bertattn_batch.analysis.aggregate import top_reviews

    attention = pl.from_arrow(read_table(zh_run, "cls_attention"))
    tokens = pl.from_arrow(read_table(zh_run, "tokens"))
    rows = attention.join(tokens, on=["doc_id", "position"]).filter(
        (pl.col("layer") == 0) & (pl.col("head") == 1)
    )
    term = rows.group_by("token").agg(pl.col("doc_id").n_unique()).sort("doc_id", descending=True)["token"][0]
    want = (
        rows.filter(pl.col("token") == term)
        .group_by("doc_id")
        .agg(pl.col("weight").max())
        .sort(["weight", "doc_id"], descending=[True, False])
        .head(5)
    )
    got = top_reviews(zh_run, term, head=1, n=5)
    assert got["doc_id"].to_list() == want["doc_id"].to_list()
    np.testing.assert_allclose(got["weight"].to_numpy(), want["weight"].to_numpy(), rtol=1e-6)
    assert got["rank"].to_list() == [1, 2, 3, 4, 5] and got["text"].null_count() == 0
    # a word: the oracle's largest word weight of each review that holds it
    oracle = {
        d: max(w[1] for w in ws if w[0] == "差评")
        for (d, lay, h), ws in oracle_words(zh_run).items()
        if lay == 0 and h == 1 and any(w[0] == "差评" for w in ws)
    }
    user = tmp_path / "user.txt"  # words made again: a dictionary that leaves 差评 a word
    user.write_text("质量不错 5\n", encoding="utf-8")
    got = top_reviews(zh_run, "差评", head=1, unit="word")
    assert dict(zip(got["doc_id"], got["weight"], strict=True)) == pytest.approx(oracle, rel=1e-6)
    made = top_reviews(zh_run, "差评", head=1, unit="word", words="jieba", user_dict=str(user))
    assert dict(zip(made["doc_id"], made["weight"], strict=True)) == pytest.approx(
        {d: w for d, w in oracle.items() if d in set(made["doc_id"])}, rel=1e-6
    )


def test_the_cli_answers_without_code(zh_run, tmp_path):
    """reviews prints each review's text, prediction and plot command; aggregate writes the rows asked
    for as CSV and XLSX, rounded, equal to the table's."""
    import openpyxl
    from typer.testing import CliRunner

    from bertattn_batch.cli import app

    r = CliRunner().invoke(app, ["reviews", str(zh_run), "--head", "1", "--word", "差评", "--top", "3"])
    assert r.exit_code == 0, r.output
    assert SEED_TEXT[:20] in r.output and "predicted " in r.output
    assert f"bertattn plot {zh_run} --doc-id seed --layer 0 --unit word --out seed.png" in r.output
    run = str(zh_run)
    for suffix in ("csv", "xlsx"):
        out = tmp_path / f"head1.{suffix}"
        args = ["aggregate", run, "--min-reviews", "1", "--unit", "word", "--layer", "-2", "--head", "1"]
        r = CliRunner().invoke(app, [*args, "--out", str(out)])
        assert r.exit_code == 0, r.output
        table = agg.read_aggregates(zh_run)[0]
        want = agg.view(table, "word", "pred_label", [0], "log_odds_z", [1]).with_columns(
            pl.col(pl.Float64).round_sig_figs(4)
        )
        if suffix == "csv":
            got = pl.read_csv(out, schema=want.schema)
            assert got.equals(want)
        else:
            sheet = list(openpyxl.load_workbook(out).active.values)
            assert list(sheet[0]) == want.columns and len(sheet) == want.height + 1
            assert list(sheet[1])[:6] == list(want.row(0))[:6]
    bad = CliRunner().invoke(app, ["aggregate", run, "--layer", "5"])
    assert bad.exit_code != 0 and "layer 5 is not in this run" in bad.output
    part = next((zh_run / "predictions").glob("*.parquet"))
    before = part.read_bytes()
    for command in (["aggregate", run], ["reviews", run, "--head", "1", "--token", "差"]):
        bad = CliRunner().invoke(app, [*command, "--out", str(part)])  # a part of the run it reads
        assert bad.exit_code == 1 and "inside a folder of the run" in bad.output, bad.output
    assert part.read_bytes() == before


def test_a_suggested_plot_writes_into_the_current_folder_alone():
    from bertattn_batch.analysis.aggregate import file_name

    for doc_id in ("../../etc", "a/b\nc", ".hidden", "/", "评论-1.x"):
        name = file_name(doc_id)
        assert name and "/" not in name and "\n" not in name and not name.startswith("."), name
    assert file_name("评论-1.x") == "评论-1.x" and file_name("a/b") != file_name("a_b") == "a_b"


def test_wordpiece_words_follow_the_tokenizers_own_mark():
    """A WordPiece tokenizer marks continued words with its own prefix (BERT's ``##``; another may use
    ``@@``): extraction, and commands that make words again, read the mark the run recorded."""
    from types import SimpleNamespace

    from bertattn_batch.extract.tables import TableOptions
    from bertattn_batch.extract.words import KEY, first_positions, word_map
    from bertattn_batch.run import Manifest

    tokens = pl.DataFrame(
        {
            KEY: [0] * 4,
            "position": [1, 2, 3, 4],
            "token": ["un", "@@believ", "@@able", "##x"],
            "start": [0, 2, 8, 12],
        }
    )
    words = first_positions(word_map(tokens, None, "wordpiece", continuation="@@")).collect().sort("position")
    assert words["word"].to_list() == [1, 1, 1, 4]
    assert words["word_text"].to_list() == ["unbelievable"] * 3 + ["##x"]
    clf = SimpleNamespace(words="wordpiece", word_continuation="@@")
    spec = JobSpec(inputs=["r.parquet"], model="m", out="o")
    assert TableOptions.of(spec, clf).continuation == "@@"
    manifest = Manifest(
        spec={"words": "auto"}, fingerprint={"words": "wordpiece"},
        model={"words": "wordpiece", "word_continuation": "@@"},
    )  # fmt: skip
    assert run_words(manifest) == ("wordpiece", None, True, "@@")


def test_reviews_finds_a_term_as_the_printouts_spell_it():
    """`reviews --token` takes a byte-level token as aggregate prints it ('Ġa' and 'a' both print 'a',
    or '␣a' where they meet), or as stored; a word in any case (a cased WordPiece word keeps its case)."""
    from bertattn_batch.analysis.aggregate import named

    texts = pl.LazyFrame({"term": [0, 1, 2, 3], "token": ["Ġa", "a", "Ġgood", "ab"]})

    def found(term: str, unit: str = "token", byte_level: bool | None = True) -> list[str]:
        return sorted(named(texts, term, unit, byte_level).collect()["token"])

    assert found("a") == found("␣a") == ["a", "Ġa"]
    assert found("Ġa") == ["Ġa"] and found("good") == ["Ġgood"]
    assert found("a", byte_level=False) == ["a"] and found("good", byte_level=False) == []
    words = pl.LazyFrame({"term": [0, 1], "token": ["Good", "goods"]})
    assert named(words, "good", "word", False).collect()["token"].to_list() == ["Good"]


def test_a_byte_level_tokenizers_words_are_the_texts_words():
    """Pieces of a byte-level BPE tokenizer join into the words of the text, whatever their spaces and
    line breaks (a trailing one makes no empty word), and print as the text spells them (no byte
    decoding of 'café'); under jieba the Chinese reviews' words are jieba's."""
    from helpers import byte_level_bpe

    from bertattn_batch.analysis.spelling import readable
    from bertattn_batch.extract.words import KEY, token_words
    from bertattn_batch.render.plot import ReviewAttention, by_words

    texts = ["good movie \n", "naïve  café\r\n\r\n", "the 好吃 food was great!! ok", "x" * 50 + " end"]
    tok = byte_level_bpe(texts * 5, vocab_size=300)
    columns = {KEY: [], "position": [], "token": [], "start": [], "end": []}
    for i, text in enumerate(texts):
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        for p, (piece, (start, end)) in enumerate(zip(enc.tokens(), enc["offset_mapping"], strict=True), 1):
            for key, value in zip(columns, (i, p, piece, start, end), strict=True):
                columns[key].append(value)
    for mode, chinese, marks in (("wordpiece", ["好", "吃"], "!!"), ("jieba", ["好吃"], "!")):
        word, text = token_words(columns, texts, mode, continuation=None)
        frame = pl.DataFrame({"review": columns[KEY], "word": word, "text": text})
        words = frame.unique(["review", "word"], maintain_order=True)["text"].to_list()
        assert words == [
            *("good", "movie", "naïve", "café", "the", *chinese, "food", "was", "great", marks, "ok"),
            *("x" * 50, "end"),
        ], mode
    first = [i for i, r in enumerate(columns[KEY]) if r == 1]
    review = ReviewAttention(
        "d", 0, [columns["token"][i] for i in first], list(range(len(first))),
        [columns["position"][i] for i in first], np.ones((1, len(first))), np.ones((1, len(first))),
        text=texts[1], starts=[columns["start"][i] for i in first], ends=[columns["end"][i] for i in first],
        byte_level=True, continuation=None,
    )  # fmt: skip
    shown = by_words(review, "wordpiece")
    assert readable(shown.tokens, shown.byte_level) == ["naïve", "café"]


def test_printed_words_are_never_byte_decoded():
    """A word is its review's text: 'café' prints 'café' in a byte-level run (and where the run does not
    say), while that run's tokens are decoded ('Ġgood' reads 'good', 'cafÃ©' reads 'café')."""
    words = pl.DataFrame({"unit": ["word", "word"], "token": ["café", "naïve"]})
    for byte_level in (True, None):
        assert agg.shown_terms(words, byte_level) == {"café": "café", "naïve": "naïve"}
    tokens = pl.DataFrame({"unit": ["token", "token"], "token": ["Ġgood", "cafÃ©"]})
    assert agg.shown_terms(tokens, True) == {"Ġgood": "good", "cafÃ©": "café"}
