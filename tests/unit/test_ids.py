"""IdSet answers as a Python set of the same ids would, before and after its merges."""

from __future__ import annotations

import random

from bertattn_batch import ids as ids_module
from bertattn_batch.ids import IdSet, _digest


def test_an_id_set_answers_as_a_python_set(monkeypatch):
    monkeypatch.setattr(ids_module, "_MIN_RECENT", 8)  # merge often
    rng = random.Random(7)
    pool = ["", " ", "0", "00", "r-1", "r-01", "好评", "e\u0301", "e\u00e9", "\ud800", "x" * 300]
    pool += [str(rng.randrange(2000)) for _ in range(400)]
    # ids whose digests end in zero bytes, which a read-back of the array would strip
    pool += [s for s in (f"z{i}" for i in range(4000)) if _digest(s).endswith(b"\x00")][:5]
    assert len(pool) > 400 and any(_digest(s).endswith(b"\x00") for s in pool)
    seen, oracle = IdSet(), set()
    for s in rng.choices(pool, k=3000):
        assert (s in seen) == (s in oracle), s
        seen.add(s)
        oracle.add(s)
        assert len(seen) == len(oracle)
    assert all(s in seen for s in oracle)
    assert not any(s in seen for s in ("r-2", "1" * 9, "\ud801", "e"))

    other = IdSet(["r-1", "new", "好评"])
    both = seen | other
    assert len(both) == len(oracle | {"r-1", "new", "好评"})
    assert "new" in both and "r-01" in both and "new" not in seen  # the operands stay as they were
    assert len(IdSet() | IdSet()) == 0 and "" not in IdSet()


def test_block_calls_match_one_at_a_time():
    """add_each and contains_each agree with add and ``in`` called id by id, across merges into the
    sorted array, with repeats inside a block and against earlier blocks."""
    import random

    rng = random.Random(3)
    ids = [f"r{rng.randrange(30_000)}" for _ in range(120_000)]
    one, block = IdSet(), IdSet()
    for k in range(0, len(ids), 5_000):
        chunk = ids[k : k + 5_000]
        probe = [f"r{rng.randrange(40_000)}" for _ in range(200)]
        assert block.contains_each(probe) == [p in one for p in probe]
        assert block.add_each(chunk) == [one.add(i) for i in chunk]
    assert len(block) == len(one) == len(set(ids))
