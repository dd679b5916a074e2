"""Load a BERT-family sequence classifier onto its device once; run padded batches under ``inference_mode``:
token ids in, probabilities and [CLS] attention rows out (no schemas). Weights load as safetensors unless
pickle is allowed; remote code runs only where asked for.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import threading
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError

from ..config import MIN_TOKENS
from ..errors import ModelError, SpecError, first_line
from . import checks
from .alti import AltiCapture
from .capture import ClsRowCapture, eager_rows
from .encode import Outputs
from .trim import LastLayerTrim, tolerance, use_cls_sdpa, verified

log = logging.getLogger(__name__)


@dataclass
class Classifier:
    """A loaded tokenizer + classifier, and what the job needs to know about them."""

    tokenizer: object
    model: torch.nn.Module
    device: torch.device
    dtype: torch.dtype
    layers: list[int]  # 0-based encoder layer indices
    max_length: int
    attention: str  # "sdpa": rows captured from queries and keys; "eager": transformers' output_attentions
    source: str
    weights_sha256: str
    num_layers: int
    num_heads: int
    capture: ClsRowCapture = field(repr=False)
    id2label: dict[int, str] = field(default_factory=dict)
    config_sha256: str = "unknown"
    trim: LastLayerTrim | None = field(default=None, repr=False)  # sdpa mode: last layer for [CLS] only
    value_zeroing: bool = False  # also compute value zeroing (one more pass through the layer's tail)
    alti: AltiCapture | None = field(default=None, repr=False)  # whole-model contributions (ALTI), asked for
    compiled: torch.nn.Module | None = field(default=None, repr=False)  # torch.compile'd model (--compile)
    oom_tokens: int | None = None  # the fewest padded tokens of a batch that ran out of device memory

    @classmethod
    def load(cls, source: str, layers: list[int] | tuple[int, ...] = (-2,), device: str = "auto",
             dtype: str = "auto", attention: str = "sdpa", max_length: int | None = None,
             trust_remote_code: bool = False,
             allow_pickle: bool = False, trim_last_layer: bool = True, value_zeroing: bool = False,
             contributions: str | None = None, compile: bool = False) -> Classifier:  # fmt: skip
        path = checks.resolve_source(source)
        dev = resolve_device(device)
        torch_dtype = resolve_dtype(dtype, dev)
        config = checks.load_config(path, trust_remote_code=trust_remote_code, allow_pickle=allow_pickle)
        id2label = checks.label_names(config, source)
        tokenizer = checks.load_tokenizer(path, trust_remote_code)
        checks.check_tokenizer(tokenizer, config, source)

        # eager mode asks for attentions per call, and SDPA cannot return them
        options = dict(trust_remote_code=trust_remote_code, return_dict=True, output_attentions=False)
        model, _ = load_weights(
            path, source, torch_dtype, allow_pickle, attn_implementation=attention, **options
        )
        try:
            model.eval().to(dev)  # eval: dropout off
        except RuntimeError as e:  # torch's OutOfMemoryError is one
            if not out_of_memory(e):
                raise
            model = None  # raised below, out of this block, whose traceback holds the weights moved already
        if model is None:  # what it took on the device given back first
            free = half = ""
            if dev.type == "cuda":
                torch.cuda.empty_cache()
                left, total = torch.cuda.mem_get_info(dev)
                free = f" ({left / 2**30:.1f} of {total / 2**30:.1f} GiB free)"
            if torch_dtype == torch.float32:
                half = ", or load it in half the memory (--dtype bfloat16)"
            raise ModelError(
                f"{source} does not fit on {dev}{free}: free the device or choose another (--device){half}"
            )
        num_layers = layer_count(config)
        resolved = resolve_layers(layers, num_layers)
        capture = ClsRowCapture(model, resolved)
        if not capture.attentions:
            raise ModelError(f"{source}: no self-attention query/key projections found")
        if value_zeroing and not capture.supports_value_zeroing():
            raise ModelError(
                f"{source}: value zeroing does not know the layout of this {config.model_type} model's "
                "encoder layers (it knows BERT and its post-LayerNorm kin, DistilBERT and ALBERT); run "
                "without --value-zeroing"
            )
        try:
            alti = AltiCapture(model) if contributions == "alti" else None
        except ValueError as e:
            raise ModelError(f"{source}: {e}; run without --contributions") from None
        if all(v.startswith("LABEL_") for v in id2label.values()):
            log.warning("%s: labels are named LABEL_n; is the classification head trained?", source)
        limit = _max_length(max_length, tokenizer, config, source)
        trim = LastLayerTrim.find(model) if trim_last_layer and attention != "eager" else None
        if trim is not None:
            with no_cudnn_attention():  # the kernels the batches run
                trim = trim if verified(model, trim, len(tokenizer), dev, limit) else None
        clf = cls(
            tokenizer=tokenizer, model=model, device=dev, dtype=torch_dtype, layers=resolved,
            max_length=limit, attention=attention, source=source, weights_sha256=checks.weights_hash(path),
            config_sha256=checks.config_hash(path), num_layers=num_layers,
            num_heads=int(getattr(config, "num_attention_heads", None) or config.n_heads),
            capture=capture, id2label=id2label, trim=trim, value_zeroing=value_zeroing, alti=alti,
        )  # fmt: skip
        if compile:
            clf.compiled = compiled_model(clf)
        return clf

    @property
    def labels(self) -> list[str]:
        return [self.id2label[i] for i in range(len(self.id2label))]

    @property
    def byte_level(self) -> bool:
        """Whether tokens spell bytes (byte-level BPE: 'Ġgood'), which a reader needs decoded."""
        backend = self.tokenizer.backend_tokenizer
        parts = (backend.pre_tokenizer, backend.decoder)
        return any(b'"ByteLevel"' in part.__getstate__() for part in parts if part is not None)

    @property
    def word_continuation(self) -> str | None:
        """WordPiece's mark of a piece that continues a word ("##"); None where word starts are marked."""
        model = self.tokenizer.backend_tokenizer.model
        return model.continuing_subword_prefix if type(model).__name__ == "WordPiece" else None

    @property
    def words(self) -> str:
        """How ``auto`` words are made: ``jieba`` where Chinese splits into characters, else ``wordpiece``
        (the tokenizer's own pieces joined)."""
        sample = "我们喜欢中文"
        spans = self.tokenizer(sample, add_special_tokens=False, return_offsets_mapping=True).offset_mapping
        if [e - s for s, e in spans] == [1] * len(sample):
            return "jieba"
        return "wordpiece"

    @property
    def contributions(self) -> str | None:
        return "alti" if self.alti is not None else None

    @property
    def device_type(self) -> str:
        return self.device.type

    def pad(self, ids: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-pad a batch: (B, S) input ids and attention mask on the model's device."""
        t_ids, t_mask = pad_batch(ids, self.tokenizer.pad_token_id or 0)
        if self.device.type == "cuda":
            t_ids, t_mask = t_ids.pin_memory(), t_mask.pin_memory()
        return t_ids.to(self.device, non_blocking=True), t_mask.to(self.device, non_blocking=True)

    def forward(self, ids: list[np.ndarray]) -> Outputs:
        return self.launch(ids).result()

    @torch.inference_mode()
    def launch(self, ids: list[np.ndarray]) -> PendingOutputs:
        """Queue one padded batch on the device and return at once, so the next is queued while the host
        copies this one's outputs."""
        input_ids, mask = self.pad(ids)  # (B, S) each
        model = self.model if self.compiled is None else self.compiled
        alti = self.alti.forward(mask, list(map(len, ids))) if self.alti else contextlib.nullcontext()
        if self.attention == "eager":
            with self.capture as capture, alti:  # the values, for the norms; the rows are transformers' own
                out = model(input_ids=input_ids, attention_mask=mask, output_attentions=True)
            rows = eager_rows(out.attentions, self.layers)  # (B, L, H, S)
        else:
            # no mask for a batch without padding: none is read back, and SDPA may take its fastest kernel
            padded = min(map(len, ids)) < input_ids.shape[1]
            trim = self.trim or contextlib.nullcontext()
            with self.capture as capture, alti, trim, no_cudnn_attention():
                out = model(input_ids=input_ids, attention_mask=mask if padded else None)
            rows = capture.rows(mask)  # (B, L, H, S)
        norms = capture.norms(rows)  # (B, L, H, S)
        zeroing = capture.value_zeroing(rows) if self.value_zeroing else None  # (B, L, S)
        capture.release()
        contributions = self.alti.cls_contributions() if self.alti is not None else None  # (B, S)
        probs = torch.softmax(out.logits.float(), dim=-1)  # (B, C)
        outputs = [probs, rows, norms, zeroing, contributions]  # Outputs' fields, None where not asked for
        finite = torch.stack([torch.isfinite(t).all() for t in outputs if t is not None]).all()  # no wait
        cuda = self.device.type == "cuda"  # elsewhere (mps) a copy is waited for here: no event to wait on
        host = [None if t is None else t.to("cpu", non_blocking=cuda) for t in [finite, *outputs]]
        return PendingOutputs(self, len(ids), host)

    @torch.inference_mode()
    def probabilities(self, ids: list[np.ndarray]) -> np.ndarray:
        """Probabilities (B, C) float32 of one padded batch, no attention captured."""
        input_ids, mask = self.pad(ids)
        with self.trim or contextlib.nullcontext(), no_cudnn_attention():
            logits = self.model(input_ids=input_ids, attention_mask=mask).logits
        return torch.softmax(logits.float(), dim=-1).cpu().numpy()

    def gradient_x_input(self, ids: list[np.ndarray], classes: np.ndarray) -> np.ndarray:
        """Gradient × input (B, S) float32: each token's embedding · the gradient of p(``classes[b]``); 0 on
        padding."""
        input_ids, mask = self.pad(ids)
        with torch.enable_grad(), no_cudnn_attention():
            embeds = self.model.get_input_embeddings()(input_ids).detach().requires_grad_(True)  # (B, S, E)
            logits = self.model(inputs_embeds=embeds, attention_mask=mask).logits
            chosen = torch.as_tensor(classes, device=logits.device)[:, None]  # (B, 1)
            p = torch.softmax(logits.float(), dim=-1).gather(1, chosen).sum()
            (grad,) = torch.autograd.grad(p, embeds)
        return ((grad * embeds).float().sum(-1) * mask).detach().cpu().numpy()


class PendingOutputs:
    """One batch's outputs on their way to the host, and an event that says when the copies are done."""

    def __init__(self, clf: Classifier, size: int, host: list[torch.Tensor | None]) -> None:
        self._clf, self._size, self._host = clf, size, host
        # blocking: the waiting thread sleeps rather than spinning on a core that the host side needs
        self._done = torch.cuda.Event(blocking=True) if clf.device.type == "cuda" else None
        if self._done is not None:
            self._done.record(torch.cuda.current_stream(clf.device))

    def result(self) -> Outputs:
        """The batch's outputs as float32 numpy arrays."""
        if self._done is not None:
            self._done.synchronize()
        finite, *outputs = self._host
        if not bool(finite):
            clf = self._clf
            raise ModelError(
                f"{clf.source} gives non-finite outputs (NaN or infinity) for this batch of {self._size} "
                "reviews: its weights are damaged or its training diverged"
                + ("; in float16, try --dtype bfloat16 or float32" if clf.dtype == torch.float16 else "")
            )
        # on CUDA, copies: the pinned buffers go back to torch's cache while a caller keeps the outputs
        copy = np.array if self._done is not None else np.asarray
        return Outputs(*(None if t is None else copy(t.numpy()) for t in outputs))


def pad_batch(ids: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token ids: (B, S) input ids and attention mask, in one scatter."""
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    keep = np.arange(lengths.max()) < lengths[:, None]  # (B, S)
    input_ids = np.full(keep.shape, pad_id, dtype=np.int64)
    input_ids[keep] = np.concatenate(ids)
    return torch.from_numpy(input_ids), torch.from_numpy(keep.astype(np.int64))


def layer_count(config) -> int:
    """The encoder's layers (DistilBERT's ``n_layers``)."""
    return int(getattr(config, "num_hidden_layers", None) or config.n_layers)


def resolve_layers(layers: list[int] | tuple[int, ...], num_layers: int) -> list[int]:
    """Negative indices count from the end (-2 of 6 layers is 4)."""
    out = [layer + num_layers if layer < 0 else layer for layer in layers]
    if bad := [layer for layer, idx in zip(layers, out, strict=True) if not 0 <= idx < num_layers]:
        raise SpecError(
            f"layer {bad[0]} is out of range for a model with {num_layers} layer(s): give one of "
            f"{-num_layers} to {num_layers - 1} (--layers)"
        )
    if len(set(out)) != len(out):
        raise SpecError(f"layers {list(layers)} name the same layer twice")
    return out


def load_weights(path: str, source: str, dtype: torch.dtype, allow_pickle: bool = False,
                 for_training: bool = False, **options: Any) -> tuple[torch.nn.Module, dict]:  # fmt: skip
    """The sequence classifier at ``path`` (``options``: from_pretrained's), every weight loaded, and its
    load report; asked for SDPA, one without it runs its own eager attention (rows captured alike). Any
    failure is one error."""
    from transformers import AutoModelForSequenceClassification

    sdpa = options.get("attn_implementation") == "sdpa"

    def from_pretrained(**more: Any):
        # quiet: check_loaded_weights says what its load report says, as one error; mismatched sizes are
        # refused there
        with warnings.catch_warnings(), checks.transformers_log_level("error"):
            warnings.simplefilter("ignore")
            return AutoModelForSequenceClassification.from_pretrained(
                path, dtype=dtype, output_loading_info=True, use_safetensors=None if allow_pickle else True,
                ignore_mismatched_sizes=True, **(options | more),
            )  # fmt: skip

    try:
        try:
            model, info = from_pretrained()
            if sdpa:
                use_cls_sdpa(model)
        except ValueError as e:
            if not sdpa or "scaled_dot_product_attention" not in str(e):
                raise
            log.info("%s has no SDPA attention; running its eager attention", source)  # Megatron-BERT
            model, info = from_pretrained(attn_implementation="eager")
    except pickle.UnpicklingError as e:
        raise ModelError(
            f"cannot load model weights from {source!r} "
            f"(pickle refused by torch.load(weights_only=True): {checks.pickle_reason(e)})"
        ) from None
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:
        raise ModelError(f"cannot load model weights from {source!r}: {first_line(e)}") from None
    checks.check_loaded_weights(model, info, source, for_training)
    return model, info


def _max_length(asked: int | None, tokenizer, config, source: str) -> int:
    """The tokens a review keeps: the tokenizer's ``model_max_length`` unless asked, at most the positions."""
    positions = checks.position_limit(config)
    few = "too few for [CLS], one token and [SEP]"
    if positions < MIN_TOKENS:
        raise ModelError(f"{source} has positions for {positions} tokens: {few}")
    if asked is None:
        if (limit := min(positions, checks.tokenizer_limit(tokenizer) or positions)) < MIN_TOKENS:
            raise ModelError(
                f"{source}'s tokenizer keeps {limit} tokens (its model_max_length): {few}; pass "
                f"--max-length (its model has positions for {positions})"
            )
        return limit
    if asked > positions:
        raise SpecError(f"max_length {asked} exceeds the {positions} tokens {source} has positions for")
    warn_above_tokenizer(asked, tokenizer, positions, source)
    return asked


def warn_above_tokenizer(length: int, tokenizer, positions: int, source: str) -> None:
    """Warn above the tokenizer's ``model_max_length``: the model may not have been trained that long."""
    tok_limit = checks.tokenizer_limit(tokenizer)
    if tok_limit is not None and length > tok_limit:
        log.warning(
            "max_length %d is above the %d tokens %s's tokenizer is set for (model_max_length); its "
            "model has positions for %d, so reviews keep up to %d",
            length, tok_limit, source, positions, length,
        )  # fmt: skip


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for kind, name, available in (("cuda", "CUDA", torch.cuda.is_available),
                                  ("mps", "Apple MPS", torch.backends.mps.is_available)):  # fmt: skip
        if device.startswith(kind) and not available():
            raise SpecError(
                f"device {device!r} asked for, but no {name} device is available; use --device cpu"
            )
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise SpecError(f"device {device!r} is not one torch knows: {first_line(e)}") from None
    if dev.type == "cuda" and dev.index is not None and dev.index >= (count := torch.cuda.device_count()):
        raise SpecError(
            f"device {device!r} asked for, but this machine has {count} CUDA device(s) "
            f"(cuda:0 to cuda:{count - 1}); see nvidia-smi, or CUDA_VISIBLE_DEVICES"
        )
    return dev


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on CUDA from compute capability 8.0 (``is_bf16_supported`` also says yes where it is
    emulated, and slow), float16 before, float32 elsewhere."""
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.get_device_capability(device) >= (8, 0) else torch.float16
        return torch.float32
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ModelError(f"dtype {dtype!r}: choose auto, float32, bfloat16 or float16")
    return getattr(torch, dtype)


def out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` says the device ran out of memory, in torch's caching allocator or outside it."""
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(e, RuntimeError) and any(s in str(e) for s in ("out of memory", "ALLOC_FAILED"))


_cudnn_lock = threading.Lock()
_cudnn_users = 0
_cudnn_was = True


@contextlib.contextmanager
def no_cudnn_attention() -> Iterator[None]:
    """SDPA without cuDNN, which plans each new (batch, length) shape anew, while any thread is inside."""
    global _cudnn_users, _cudnn_was
    with _cudnn_lock:
        if _cudnn_users == 0:
            _cudnn_was = torch.backends.cuda.cudnn_sdp_enabled()
            torch.backends.cuda.enable_cudnn_sdp(False)
        _cudnn_users += 1
    try:
        yield
    finally:
        with _cudnn_lock:
            _cudnn_users -= 1
            if _cudnn_users == 0:
                torch.backends.cuda.enable_cudnn_sdp(_cudnn_was)


def compiled_model(clf: Classifier) -> torch.nn.Module:
    """``clf.model`` under ``torch.compile``, once probe batches of each graph a job runs give eager's
    outputs."""
    rng = np.random.default_rng(0)
    probes = [
        [rng.integers(0, len(clf.tokenizer), min(n, clf.max_length)) for n in lengths]
        for lengths in ((12, 7), (9, 9), (5,))
    ]
    expected = [clf.forward(probe) for probe in probes]
    compiled = torch.compile(clf.model, dynamic=True)
    clf.compiled = compiled
    try:
        got = [clf.forward(probe) for probe in probes]
    except Exception as e:  # what torch raises varies: no C++ compiler, an op inductor cannot lower
        raise ModelError(f"--compile: torch.compile fails for {clf.source} here ({first_line(e)}); "
                         "run without --compile") from None  # fmt: skip
    finally:
        clf.compiled = None
    tol = tolerance(clf.dtype)
    worst = max(
        float(np.abs(a - b).max())
        for want, have in zip(expected, got, strict=True)
        for a, b in zip(want, have, strict=True)
        if a is not None
    )
    if worst > tol:
        raise ModelError(f"--compile: {clf.source} compiled gives outputs {worst:.2g} away from its eager "
                         "ones on probe batches; run without --compile")  # fmt: skip
    log.info("%s compiled (probes within %.1g of eager)", clf.source, worst)
    return compiled
