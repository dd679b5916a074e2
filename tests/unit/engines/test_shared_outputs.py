"""The model's outputs through shared memory (engines/shared_outputs.py): the same arrays come out as
went in, blocks grow and are removed, and where /dev/shm is short the outputs take the pipe."""

from __future__ import annotations

from multiprocessing import shared_memory

import numpy as np
import pytest

from bertattn_batch.engines import shared_outputs
from bertattn_batch.engines.shared_outputs import OutputBlocks, SharedOutputs, take
from bertattn_batch.model import Outputs

pytestmark = pytest.mark.skipif(not shared_outputs._room_for(1 << 24), reason="no /dev/shm to speak of")


def _outputs(rng: np.random.Generator, batches: int, reviews: int, zeroing: bool) -> list[list[Outputs]]:
    """Batches of padded outputs, the second cut in halves (as after running out of memory); the rows
    are strided views, as cut from a larger buffer."""
    out = []
    for k in range(batches):
        pieces = []
        for b in [reviews // 2, reviews - reviews // 2] if k == 1 else [reviews]:
            wide = rng.random((b, 1, 12, 80), dtype=np.float32)
            rows = wide[:, :, :, : 37 + k]
            vz = rng.random((b, 1, 37 + k), dtype=np.float32) if zeroing else None
            pieces.append(Outputs(rng.random((b, 3), dtype=np.float32), rows, rows * 2, vz))
        out.append(pieces)
    return out


def _same(a: list[list[Outputs]], b: list[list[Outputs]]) -> None:
    assert [len(p) for p in a] == [len(p) for p in b]
    for pa, pb in zip(a, b, strict=True):
        for oa, ob in zip(pa, pb, strict=True):
            for x, y in zip(oa, ob, strict=True):
                if x is None:
                    assert y is None
                else:
                    assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)


@pytest.mark.parametrize("zeroing", [False, True])
def test_what_goes_in_comes_out(zeroing):
    rng = np.random.default_rng(0)
    blocks = OutputBlocks()
    try:
        for window in range(4):  # both slots, each used twice
            outputs = _outputs(rng, batches=3, reviews=16, zeroing=zeroing)
            sent = blocks.put(window % 2, outputs)
            assert isinstance(sent, SharedOutputs)
            _same(take(sent), outputs)
    finally:
        blocks.close()


def test_a_block_grows_and_the_old_one_is_removed():
    rng = np.random.default_rng(1)
    blocks = OutputBlocks()
    try:
        small = blocks.put(0, _outputs(rng, batches=1, reviews=4, zeroing=False))
        assert take(small)  # attached here as a host process would
        big_outputs = _outputs(rng, batches=4, reviews=4096, zeroing=False)  # past the first block's size
        big = blocks.put(0, big_outputs)
        assert isinstance(big, SharedOutputs) and big.name != small.name
        with pytest.raises(FileNotFoundError):
            shared_memory.SharedMemory(name=small.name)
        _same(take(big), big_outputs)
    finally:
        blocks.close()
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=big.name)


def test_short_shared_memory_sends_through_the_pipe(monkeypatch, caplog):
    """A container's small /dev/shm: the block is not made (a write past it would kill the process);
    put hands the outputs back for the pipe, and take passes them through."""
    monkeypatch.setattr(shared_outputs, "_room_for", lambda size: False)
    outputs = _outputs(np.random.default_rng(2), batches=2, reviews=8, zeroing=False)
    blocks = OutputBlocks()
    with caplog.at_level("INFO"):
        sent = blocks.put(0, outputs)
    assert sent is outputs and take(sent) is outputs
    assert "has less than twice that free" in caplog.text
    blocks.close()


def test_a_block_whose_pages_cannot_be_had_is_not_used(monkeypatch, caplog):
    """/dev/shm filled by someone else between the look at its free space and the block: reserving the
    pages fails, the block is removed, and the outputs take the pipe."""
    made = []
    real = shared_memory.SharedMemory

    def recording(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    def full(fd, offset, size):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shared_outputs.shared_memory, "SharedMemory", recording)
    monkeypatch.setattr(shared_outputs.os, "posix_fallocate", full)
    outputs = _outputs(np.random.default_rng(3), batches=1, reviews=4, zeroing=False)
    blocks = OutputBlocks()
    assert blocks.put(0, outputs) is outputs
    assert blocks.put(1, outputs) is outputs  # not tried again: one warning
    assert caplog.text.count("no shared memory for") == 1 and "No space left" in caplog.text
    with pytest.raises(FileNotFoundError):
        real(name=made[0].name)
    blocks.close()


def test_a_block_removed_by_someone_else_is_no_error_on_close():
    """A cleaner of /dev/shm (systemd's RemoveIPC, a tmp reaper) took one block: closing removes the
    others and raises nothing, or a finished run would end in an error."""
    rng = np.random.default_rng(4)
    blocks = OutputBlocks()
    first = blocks.put(0, _outputs(rng, batches=1, reviews=4, zeroing=False))
    second = blocks.put(1, _outputs(rng, batches=1, reviews=4, zeroing=False))
    shared_memory.SharedMemory(name=first.name).unlink()
    blocks.close()
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=second.name)


def test_blocks_a_job_left_open_are_removed_at_exit_without_a_warning():
    """A closed terminal's SIGHUP right after the last part cut the close short: the resource tracker
    then warned of "leaked shared_memory objects" on the job's stderr (a cron log)."""
    from helpers import python_probe

    done = python_probe(
        "import numpy as np, sys",
        "from bertattn_batch.engines.shared_outputs import OutputBlocks",
        "from bertattn_batch.model import Outputs",
        "rows = np.ones((2, 1, 4, 8), dtype=np.float32)",
        "sent = OutputBlocks().put(0, [[Outputs(np.ones((2, 3), dtype=np.float32), rows, rows, None)]])",
        "print(sent.name, flush=True)",
        "sys.exit(0)  # never closed",
    )
    assert done.returncode == 0, done.stderr
    assert "leaked" not in done.stderr, done.stderr
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=done.stdout.strip())


def test_a_block_with_a_view_still_alive_is_unlinked_all_the_same():
    """It was unmapped first: with a view of it alive that raised BufferError, and the block was left
    behind, no longer listed for removal at exit."""
    rows = np.ones((2, 1, 4, 8), dtype=np.float32)
    blocks = OutputBlocks()
    sent = blocks.put(0, [[Outputs(np.ones((2, 3), dtype=np.float32), rows, rows, None)]])
    block = blocks._blocks[0]
    view = block.buf[:4]  # a view of it the job still holds
    with pytest.raises(BufferError):
        blocks.close()
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=sent.name)
    view.release()
    block.close()
