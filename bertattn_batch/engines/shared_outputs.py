"""The model's outputs handed to a host process through shared memory instead of its task pipe.

    model's thread:  sent, block = blocks.put(outputs)   # copied once into a shared block
    host process:    outputs = take(sent)                # views of that block, mapped once a process
    model's thread:  blocks.release(block)               # once the window is finished: lent again

Pickled into a pipe, a window's outputs (the ``[CLS]`` rows and their norm-based weights, heads × tokens
float32 a review) are copied three times and land in memory freshly faulted in on both sides; a block
is lent window after window, so its pages are faulted in once (docs/performance.md, host processes).
A block is lent to one window at a time, from ``put`` until ``release``; a host process reads its views
before the window is finished, and keeps none. Where ``/dev/shm`` is missing or short (a container's
64 MB), the outputs go through the pipe as before: ``put`` hands them back unchanged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

from ..model.encode import Outputs  # no torch: a host process imports this module

log = logging.getLogger(__name__)

#: Where POSIX shared memory lives on Linux; elsewhere the outputs go through the pipe.
SHM_DIR = "/dev/shm"
#: Each array starts at a multiple of this many bytes (a cache line).
ALIGN = 64
#: Blocks a host process keeps mapped; the model's process lends about as many as windows in flight.
MAPPED = 64

#: An array's place in a block, (offset, shape, dtype), or None for an output not computed.
Place = tuple[int, tuple[int, ...], str] | None


@dataclass(frozen=True)
class SharedOutputs:
    """Where a window's outputs lie: what crosses the pipe in their place."""

    name: str
    #: for each batch, for each of its pieces (the batch, or its halves), each Outputs field's place
    layout: list[list[tuple[Place, ...]]]


class OutputBlocks:
    """The model's process's shared blocks, each lent to one window at a time; ``close`` removes them."""

    def __init__(self) -> None:
        self._free: list[shared_memory.SharedMemory] = []
        self._made: list[shared_memory.SharedMemory] = []
        self._lock = threading.Lock()
        self._warned = False

    def put(
        self, outputs: list[list[Outputs]]
    ) -> tuple[SharedOutputs | list[list[Outputs]], shared_memory.SharedMemory | None]:
        """A window's outputs copied into a block lent to it, and the block; or the outputs themselves
        and None, where shared memory cannot hold them."""
        layout: list[list[tuple[Place, ...]]] = []
        end = 0
        for pieces in outputs:
            layout.append([])
            for out in pieces:
                places: list[Place] = []
                for array in out:
                    places.append(None if array is None else (end, array.shape, array.dtype.str))
                    end += 0 if array is None else -(-array.nbytes // ALIGN) * ALIGN
                layout[-1].append(tuple(places))
        block = self._lend(end)
        if block is None:
            return outputs, None
        for pieces, fields in zip(outputs, layout, strict=True):
            for out, places in zip(pieces, fields, strict=True):
                for array, place in zip(out, places, strict=True):
                    if place is not None:
                        np.copyto(view(block, place), array, casting="no")
        return SharedOutputs(block.name, layout), block

    def release(self, block: shared_memory.SharedMemory | None) -> None:
        """Lend ``block`` again: the window it held is finished (or failed)."""
        if block is not None:
            with self._lock:
                self._free.append(block)

    def _lend(self, size: int) -> shared_memory.SharedMemory | None:
        with self._lock:
            fits = [b for b in self._free if b.size >= size]
            if fits:
                block = min(fits, key=lambda b: b.size)
                self._free.remove(block)
                return block
            if self._free:  # all too small: one goes, a larger one comes
                self._remove(self._free.pop())
        size = max(size + size // 4, 1 << 20)  # room to grow: a block is made rarely
        try:
            if not room_for(size):
                raise OSError(f"{SHM_DIR} has less than twice {size} bytes free")
            block = shared_memory.SharedMemory(create=True, size=size)
        except OSError as e:
            if not self._warned:
                log.warning("shared memory refused (%s); the model's outputs go through pipes", e)
                self._warned = True
            return None
        with self._lock:
            self._made.append(block)
        return block

    def _remove(self, block: shared_memory.SharedMemory) -> None:
        self._made.remove(block)
        block.close()
        with contextlib.suppress(FileNotFoundError):
            block.unlink()

    def close(self) -> None:
        """Remove every block; the host processes have ended."""
        with self._lock:
            for block in list(self._made):
                self._remove(block)
            self._free.clear()


def room_for(size: int) -> bool:
    """Whether ``/dev/shm`` has ``size`` bytes free, twice over: its pages are granted as they are
    written, and a write past its size kills the process (SIGBUS) where a pipe would only be slower."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize >= 2 * size


def view(block: shared_memory.SharedMemory, place: tuple[int, tuple[int, ...], str]) -> np.ndarray:
    offset, shape, dtype = place
    return np.ndarray(shape, dtype=np.dtype(dtype), buffer=block.buf, offset=offset)


#: In a host process: the blocks it has mapped, by name, the least recently read first.
_mapped: OrderedDict[str, shared_memory.SharedMemory] = OrderedDict()


def take(sent: SharedOutputs | list[list[Outputs]]) -> list[list[Outputs]]:
    """In a host process: a window's outputs, as views of the block they were put in (or as they came
    through the pipe)."""
    if not isinstance(sent, SharedOutputs):
        return sent
    block = _mapped.pop(sent.name, None) or shared_memory.SharedMemory(name=sent.name)
    _mapped[sent.name] = block
    while len(_mapped) > MAPPED:
        _, old = _mapped.popitem(last=False)
        with contextlib.suppress(BufferError):  # a view still alive: the mapping goes with it
            old.close()
    return [
        [Outputs(*(None if p is None else view(block, p) for p in places)) for places in fields]
        for fields in sent.layout
    ]
