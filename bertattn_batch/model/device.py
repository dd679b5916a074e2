"""Which device and dtype a model runs on, and the device-wide switches its batches need.

Kept apart from the classifier so that a caller can check a ``--device`` before anything loads
(the engines do), and so that every clear message about a missing or too small device is in one place.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

from ..errors import ModelError, SpecError, first_line

_cudnn_lock = threading.Lock()
_cudnn_users = 0
_cudnn_was = True


@contextlib.contextmanager
def no_cudnn_attention() -> Iterator[None]:
    """SDPA without cuDNN's kernel while any thread is inside (the flag is process-wide, so the last one
    out puts it back). torch 2.11 tries cuDNN first on Hopper and newer GPUs for a padded batch, and
    cuDNN builds an execution plan for every new (batch, length) shape, which took longer than the batch
    itself on an H200; length-bucketed batches come in hundreds of shapes (docs/performance.md, GPU)."""
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


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecError(f"device {device!r} asked for, but no CUDA device is available; use --device cpu")
    if device.startswith("mps") and not torch.backends.mps.is_available():
        raise SpecError(
            f"device {device!r} asked for, but no Apple MPS device is available; use --device cpu"
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
    """auto: bfloat16 on CUDA devices that support it, float16 on older ones, float32 on CPU."""
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if cuda_bf16(device) else torch.float16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def cuda_bf16(device: torch.device) -> bool:
    """Whether CUDA ``device`` (not the current one) has bfloat16 tensor cores: compute capability 8.0
    (Ampere) or later. ``torch.cuda.is_bf16_supported()`` also says yes where bfloat16 is only emulated
    (a V100 or T4), far slower there than float16."""
    return torch.cuda.get_device_capability(device) >= (8, 0)


def out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` says the device ran out of memory: torch's own error, or the RuntimeError of an
    allocation outside its caching allocator (pinned host memory, a cuBLAS handle, Apple's MPS)."""
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(e, RuntimeError) and any(s in str(e) for s in ("out of memory", "ALLOC_FAILED"))


def does_not_fit(source: str, dev: torch.device, dtype: torch.dtype) -> ModelError:
    """The error for a model too big for its device, said once what it took there is given back."""
    free = ""
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        left, total = torch.cuda.mem_get_info(dev)
        free = f" ({left / 2**30:.1f} of {total / 2**30:.1f} GiB free)"
    half = ", or load it in half the memory (--dtype bfloat16)" if dtype == torch.float32 else ""
    return ModelError(
        f"{source} does not fit on {dev}{free}: free the device or choose another (--device){half}"
    )
