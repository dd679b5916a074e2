"""Small helpers the tests share: read a run back, and the independent eager oracle."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import torch
import transformers as tf


def tiny_bert_config(vocab_size: int, **kwargs):
    """A BertConfig small enough to build and run in milliseconds: 2 layers, 2 heads, 16 wide."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        **kwargs,
    )


ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
ROBERTA_TOKENS = dict(
    bos_token="<s>", eos_token="</s>", cls_token="<s>", sep_token="</s>", pad_token="<pad>",
    unk_token="<unk>", mask_token="<mask>",
)  # fmt: skip


def byte_level_bpe(texts: list[str], vocab_size: int = 400):
    """A tokenizer of RoBERTa's kind trained on ``texts``: byte-level BPE, ``<s> ... </s>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=ROBERTA_SPECIALS, initial_alphabet=alphabet
    )
    backend.train_from_iterator(texts, trainer)
    backend.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **ROBERTA_TOKENS)


def read_table(run_dir: Path, table: str) -> pa.Table:
    return ds.dataset(Path(run_dir) / table, format="parquet").to_table()


def read_attention(run_dir: Path) -> pa.Table:
    """cls_attention with each row's token_id, token, start and end looked up in the tokens table by
    (doc_id, position), in the attention rows' order: the long form, built without the package's join."""
    attn = read_table(run_dir, "cls_attention")
    tokens = read_table(run_dir, "tokens").to_pydict()
    at = {(d, p): i for i, (d, p) in enumerate(zip(tokens["doc_id"], tokens["position"], strict=True))}
    assert len(at) == len(tokens["doc_id"]), "a (doc_id, position) has two tokens rows"
    rows = [at[(d, p)] for d, p in zip(attn["doc_id"].to_pylist(), attn["position"].to_pylist(), strict=True)]
    for name in ("token_id", "token", "start", "end"):
        attn = attn.append_column(name, pa.array([tokens[name][i] for i in rows]))
    return attn


def eager_oracle(model_dir: Path, texts: list[str], layer: int, max_length: int = 512) -> list[np.ndarray]:
    """transformers' own eager attention in one padded batch: attentions[layer][i, :, 0, 1:len_i-1]."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, attn_implementation="eager").eval()
    enc = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        out = model(**enc, output_attentions=True)
    lengths = enc["attention_mask"].sum(1).tolist()
    att = out.attentions[layer]  # (B, H, S, S)
    return [att[i, :, 0, 1 : n - 1].numpy() for i, n in enumerate(lengths)]  # (H, n-2) each


def plain_probs(model_dir: Path, texts: list[str], max_length: int = 512) -> np.ndarray:
    """transformers' own forward, one review at a time (no padding): softmax of the logits, (N, C)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    out = []
    with torch.no_grad():
        for text in texts:
            enc = tok(text, truncation=True, max_length=max_length, return_tensors="pt")
            out.append(torch.softmax(model(**enc).logits[0], dim=-1).numpy())
    return np.stack(out)


def minmax(x: np.ndarray) -> np.ndarray:
    """Per-row min-max scaling written out plainly (MinMaxScaler on the transposed matrix)."""
    out = np.zeros_like(x)
    for h in range(x.shape[0]):
        lo, hi = x[h].min(), x[h].max()
        out[h] = (x[h] - lo) / (hi - lo) if hi > lo else 0.0
    return out


def manifest_json(run_dir: Path) -> dict:
    """A run's manifest as its JSON says it (tests read what was written, not the library's view)."""
    import json

    return json.loads((Path(run_dir) / "manifest.json").read_text(encoding="utf-8"))


def parquet_with_a_flipped_byte(texts: list[str]) -> bytes:
    """A Parquet file with page checksums, one byte of its last text flipped inside its data page."""
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    plain = {"compression": "none", "use_dictionary": False, "write_statistics": False}  # values once
    pq.write_table(pa.table({"text": texts}), sink, write_page_checksum=True, **plain)
    data = bytearray(sink.getvalue().to_pybytes())
    data[data.index(texts[-1].encode())] ^= 1
    return bytes(data)


def python_probe(*lines: str, timeout: float = 120):
    """Run ``lines`` as a fresh Python process (what a process does from its start: signal masks, exit
    hooks); its completed process, output as text."""
    import subprocess
    import sys

    code = "\n".join(lines) + "\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


#: The repository's root (tests read its job files and bench script; they never write there).
REPO = Path(__file__).resolve().parent.parent


def load_bench(script: str = "bench"):
    """bench/<script>.py as a module (the bench is scripts, not part of the package)."""
    import importlib.util
    import sys

    if str(REPO / "bench") not in sys.path:  # the scripts import bench/harness.py
        sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location(f"bertattn_{script}", REPO / "bench" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


#: Columns that name the run that wrote a row: they differ between two runs of the same job by design.
RUN_COLUMNS = ("run_id",)
#: The order two runs of one job write each table's rows in alike, whatever their parts.
SORT_KEYS = {
    "predictions": ["row_index"],
    "cls_attention": ["doc_id", "layer", "head", "position"],
    "tokens": ["doc_id", "position"],
    "head_summary": ["doc_id", "layer", "head"],
}


def same_job_table(table: pa.Table) -> pa.Table:
    """A table as two runs of the same job must write it alike: without the columns naming the run."""
    return table.drop_columns([c for c in RUN_COLUMNS if c in table.column_names])


def padded_share(lengths, batches) -> tuple[int, int]:
    """(real tokens, padded slots) that ``batches`` (index arrays into ``lengths``) feed the model."""
    lens = np.asarray(lengths)
    real = int(sum(lens[b].sum() for b in batches))
    slots = int(sum(len(b) * lens[b].max() for b in batches))
    return real, slots


#: The smallest header a RunDir opens with: the fingerprint keys a reopened run compares.
RUN_HEADER = {
    "spec": {},
    "fingerprint": {"inputs": ["/x"], "input_format": "auto", "encoding": "utf-8", "delimiter": None,
                    "store_text": True},
    "model": {},
    "versions": {},
}  # fmt: skip


def _attention_parts(model, layer: int):
    """(value, output dense, LayerNorm, heads, head size) of one layer's attention block, named as each
    architecture names them (BERT, DistilBERT, ALBERT's one shared layer)."""
    kind = model.config.model_type
    if kind == "distilbert":
        block = model.distilbert.transformer.layer[layer]
        sa = block.attention
        return sa.v_lin, sa.out_lin, block.sa_layer_norm, sa.n_heads, sa.dim // sa.n_heads
    if kind == "albert":
        sa = model.albert.encoder.albert_layer_groups[0].albert_layers[0].attention
        return sa.value, sa.dense, sa.LayerNorm, sa.num_attention_heads, sa.attention_head_size
    sa, so = (
        model.base_model.encoder.layer[layer].attention.self,
        model.base_model.encoder.layer[layer].attention.output,
    )
    return sa.value, so.dense, so.LayerNorm, sa.num_attention_heads, sa.attention_head_size


def alti_reference(model, ids: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """R[0, :] for one unpadded review, from eager ``attentions`` and ``hidden_states``, with full C
    matrices; also each layer's largest gap between the decomposition and the block's real output
    (the LayerNorm applied to the eager heads' output plus the residual)."""
    out = model(ids, output_attentions=True, output_hidden_states=True)
    n = ids.shape[1]
    rollout = torch.eye(n, dtype=torch.float64)
    gaps = []
    for layer in range(model.config.num_hidden_layers):
        value, dense, ln, heads, size = _attention_parts(model, layer)
        x = out.hidden_states[layer][0].double()  # (n, hidden)
        a = out.attentions[layer][0].double()  # (H, n, n)
        v = (x @ value.weight.double().T + value.bias.double()).view(n, heads, size)  # (n, H, D)
        w, bias = dense.weight.double(), dense.bias.double()  # (hidden, H*D)
        terms = torch.zeros(n, n, x.shape[1], dtype=torch.float64)  # (i, j, hidden)
        for h in range(heads):
            fh = v[:, h] @ w[:, h * size : (h + 1) * size].T  # (n, hidden): W_O^h v^h_j
            terms += a[h][:, :, None] * fh[None, :, :]
        terms[range(n), range(n)] += x
        z = terms.sum(dim=1) + bias  # the LayerNorm's input
        scale = 1 / torch.sqrt(z.var(dim=-1, unbiased=False, keepdim=True) + ln.eps)  # (n, 1)
        gamma = ln.weight.double()
        t = scale[:, None] * gamma * (terms - terms.mean(dim=-1, keepdim=True))  # (i, j, hidden)
        y_decomposed = t.sum(dim=1) + scale * gamma * (bias - bias.mean()) + ln.bias.double()
        ctx = (a @ v.transpose(0, 1)).transpose(0, 1).reshape(n, heads * size)  # (n, H*D)
        y = ln(dense(ctx.float()) + x.float()).double()  # the block's real output
        gaps.append(float((y_decomposed - y).abs().max()))
        d = (y[:, None, :] - t).abs().sum(dim=-1)  # (i, j)
        c = (y.abs().sum(dim=-1, keepdim=True) - d).clamp_min(0)
        c = c / c.sum(dim=-1, keepdim=True)
        rollout = c @ rollout
    return rollout[0], gaps


#: A tiny encoder's geometry.
TINY = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64)
#: model type -> (config class, model class, extra config, trimmed?)
ARCHITECTURES = {
    "bert": (tf.BertConfig, tf.BertForSequenceClassification, TINY, True),
    "roberta": (tf.RobertaConfig, tf.RobertaForSequenceClassification, TINY | {"pad_token_id": 0}, True),
    "xlm-roberta": (
        tf.XLMRobertaConfig,
        tf.XLMRobertaForSequenceClassification,
        TINY | {"pad_token_id": 0},
        True,
    ),
    "electra": (tf.ElectraConfig, tf.ElectraForSequenceClassification, TINY, True),
    "ernie": (tf.ErnieConfig, tf.ErnieForSequenceClassification, TINY, True),
    "megatron-bert": (tf.MegatronBertConfig, tf.MegatronBertForSequenceClassification, TINY, True),
    # layouts the trim does not fit run untrimmed
    "distilbert": (
        tf.DistilBertConfig,
        tf.DistilBertForSequenceClassification,
        dict(dim=32, n_layers=3, n_heads=4, hidden_dim=64),
        False,
    ),
    "albert": (tf.AlbertConfig, tf.AlbertForSequenceClassification, TINY | {"embedding_size": 16}, False),
}


def save_tiny_classifier(arch: str, tokenizer, folder: Path) -> None:
    """A seeded random two-label classifier of architecture ``arch``, with ``tokenizer``, in ``folder``."""
    config_cls, model_cls, extra, _ = ARCHITECTURES[arch]
    torch.manual_seed(0)
    labels = {0: "negative", 1: "positive"}
    config = config_cls(
        vocab_size=len(tokenizer), id2label=labels, label2id={v: k for k, v in labels.items()}, **extra
    )
    model_cls(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
