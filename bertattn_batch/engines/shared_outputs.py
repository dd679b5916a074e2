"""The model's outputs handed to a host process through shared memory rather than its task pipe.

Usage::

    blocks = OutputBlocks()                  # in the model's process, one per host process
    sent = blocks.put(slot, outputs)         # copied into a shared block; what crosses the pipe instead
    outputs = take(sent)                     # in the host process: the same arrays, read in place
    blocks.close()                           # once no window of that process is left unfinished

Pickled into the pipe, a window's outputs (about 7 KB a bert-base review: the [CLS] rows and their
norm-based weights, 12 heads × its tokens, float32) were copied three times, and the model's process
spent 13 µs a review on it, half its share of a run (docs/performance.md): that process is the one
every host process waits on. Here they are copied once.

Each host process has two blocks, taken in turns (``slot``): the caller must not write a slot again
before the window that last used it is finished (engines/host_processes.py leaves at most ``n`` windows
finishing after each one it hands over, so window ``i`` of process ``i % n`` takes slot
``(i // n) % 2``). A block is replaced by a larger one when a window needs more. Where shared memory
is missing or short (a container's 64 MB ``/dev/shm``), the outputs go through the pipe as before:
``put`` hands them back unchanged.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

from ..model.outputs import Outputs

log = logging.getLogger(__name__)

#: Where POSIX shared memory lives on Linux; elsewhere the outputs go through the pipe.
SHM_DIR = "/dev/shm"
#: Each array starts at a multiple of this many bytes (a cache line).
_ALIGN = 64

#: An array's place in a block: (offset, shape, dtype), or None for an output not computed.
Place = tuple[int, tuple[int, ...], str] | None


@dataclass(frozen=True)
class SharedOutputs:
    """Where a window's outputs lie: what crosses the pipe instead of them."""

    name: str
    slot: int
    #: for each batch, for each of its pieces (the batch, or its halves), each Outputs field's place
    layout: list[list[tuple[Place, ...]]]


class OutputBlocks:
    """The two shared blocks of one host process, made and removed by the model's process."""

    def __init__(self) -> None:
        self._blocks: list[shared_memory.SharedMemory | None] = [None, None]
        self._refused = False  # a block could not be made: pipes from then on, said once

    def put(self, slot: int, outputs: list[list[Outputs]]) -> SharedOutputs | list[list[Outputs]]:
        """Copy a window's outputs into block ``slot``; returns where they lie, or the outputs
        themselves where no block can hold them."""
        layout: list[list[tuple[Place, ...]]] = []
        end = 0
        for pieces in outputs:
            layout.append([])
            for out in pieces:
                places = []
                for array in out:
                    if array is None:
                        places.append(None)
                        continue
                    places.append((end, array.shape, array.dtype.str))
                    end += -(-array.nbytes // _ALIGN) * _ALIGN
                layout[-1].append(tuple(places))
        block = self._block(slot, end)
        if block is None:
            return outputs
        for pieces, places in zip(outputs, layout, strict=True):
            for out, fields in zip(pieces, places, strict=True):
                for array, place in zip(out, fields, strict=True):
                    if place is not None:
                        np.copyto(_view(block, place), array, casting="no")
        return SharedOutputs(block.name, slot, layout)

    def _block(self, slot: int, size: int) -> shared_memory.SharedMemory | None:
        """Block ``slot``, replaced by one of at least ``size`` bytes where it is smaller; None where
        shared memory cannot hold that much."""
        block = self._blocks[slot]
        if block is not None and block.size >= size:
            return block
        if self._refused:
            return None
        size = max(size + size // 4, 1 << 20)  # room to grow: a block is remade rarely
        if not _room_for(size):  # a container's small /dev/shm: nothing wrong, only slower
            return self._refuse(logging.INFO, size, f"{SHM_DIR} has less than twice that free")
        try:
            new = shared_memory.SharedMemory(create=True, size=size)
        except OSError as e:
            return self._refuse(logging.WARNING, size, e)
        try:  # the pages now, while a full /dev/shm can still say so, not at a write that kills
            os.posix_fallocate(new._fd, 0, size)
        except (AttributeError, OSError) as e:  # no such call here, or no room after all
            _remove(new)
            return self._refuse(logging.WARNING, size, e)
        _LIVE[new.name] = new
        self._blocks[slot] = new  # before the old one goes: an interrupt between leaves no block unlisted
        if block is not None:
            _remove(block)
        return new

    def _refuse(self, level: int, size: int, why: object) -> None:
        log.log(level, "no shared memory for %d bytes (%s); the model's outputs go through pipes", size, why)
        self._refused = True

    def close(self) -> None:
        """Remove the blocks; one already gone (a cleaner of /dev/shm) is no error."""
        for k, block in enumerate(self._blocks):
            if block is not None:
                self._blocks[k] = None
                _remove(block)


def _room_for(size: int) -> bool:
    """Whether ``/dev/shm`` has ``size`` bytes free, twice over. Its pages are granted as they are
    written, and a write past its size kills the process (SIGBUS) where a pipe would only be slower: a
    new block's pages are also reserved at once (``posix_fallocate``), which fails cleanly."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize >= 2 * size


#: The blocks this process made and has not removed. Whatever a job cut short leaves here is removed
#: at exit: the resource tracker would warn of each ("leaked shared_memory objects") on the job's stderr.
_LIVE: dict[str, shared_memory.SharedMemory] = {}


@atexit.register
def _remove_live() -> None:
    for block in list(_LIVE.values()):
        with contextlib.suppress(OSError, BufferError):
            _remove(block)


def _remove(block: shared_memory.SharedMemory) -> None:
    """Unlink the block, then unmap it: unlinked first, it is gone even where a view of it is still
    alive here (its unmapping then fails with BufferError)."""
    _LIVE.pop(block.name, None)
    with contextlib.suppress(FileNotFoundError):  # removed by someone else: gone all the same
        block.unlink()
    block.close()


def _view(block: shared_memory.SharedMemory, place: tuple[int, tuple[int, ...], str]) -> np.ndarray:
    offset, shape, dtype = place
    return np.ndarray(shape, dtype=np.dtype(dtype), buffer=block.buf, offset=offset)


#: In a host process: the block it last read from each slot, kept open while the name stays the same.
_attached: dict[int, shared_memory.SharedMemory] = {}


def take(sent: SharedOutputs | list[list[Outputs]]) -> list[list[Outputs]]:
    """In a host process: a window's outputs, as views of the shared block they were put in (or as
    they came, through the pipe). The views are read before the window is finished, and the block's
    slot is not written again until then."""
    if not isinstance(sent, SharedOutputs):
        return sent
    block = _attached.get(sent.slot)
    if block is None or block.name != sent.name:
        if block is not None:
            with contextlib.suppress(BufferError):  # a view still alive somewhere: the mapping goes with it
                block.close()
        block = _attached[sent.slot] = shared_memory.SharedMemory(name=sent.name)
    return [
        [Outputs(*(None if p is None else _view(block, p) for p in fields)) for fields in pieces]
        for pieces in sent.layout
    ]
