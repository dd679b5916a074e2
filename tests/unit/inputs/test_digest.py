from types import SimpleNamespace

from bertattn_batch.inputs import RowBatch, RowDigests, rows_digest


def _part(name: str, start_row: int, end_row: int, digest: str) -> SimpleNamespace:
    """A committed part as a manifest lists it, with the attributes RowDigests reads."""
    return SimpleNamespace(name=name, start_row=start_row, end_row=end_row, rows_digest=digest)


def _batch(texts: list[str | None], first: int = 0) -> RowBatch:
    batch = RowBatch()
    for i, text in enumerate(texts):
        batch.append(first + i, f"d{first + i}", text, None, "ok")
    return batch


def _blocks(batch: RowBatch, size: int) -> list[RowBatch]:
    return [batch.slice(i, min(len(batch), i + size)) for i in range(0, len(batch), size)]


def test_rows_read_again_in_other_blocks_give_the_digests_their_parts_recorded():
    texts = [f"review {i}" for i in range(12)]
    whole = _batch(texts)
    parts = [_part("p2", 2, 5, rows_digest(whole, 2, 5)), _part("p5", 5, 9, rows_digest(whole, 5, 9))]
    for size in (1, 2, 3, 12):
        check = RowDigests(parts)
        assert [c for block in _blocks(whole, size) for c in check.feed(block)] == []
        assert check.done
    texts[6] = "review 6, edited"
    check = RowDigests(parts)
    assert [c for block in _blocks(_batch(texts), 4) for c in check.feed(block)] == [("p5", 5, 9)]


def test_the_digest_is_of_each_fields_length_and_text_in_any_python():
    """A digest of repr() changed with the Python: 3.11 escapes an emoji that 3.12 prints as it is, so a
    run resumed after an upgrade was refused as edited."""
    import hashlib

    batch = RowBatch()
    batch.append(7, "r7", "love it \U0001fa77", None, "ok")
    want = "r1:" + hashlib.blake2b("1:72:r79:love it \U0001fa77-".encode(), digest_size=16).hexdigest()
    assert rows_digest(batch) == want


def test_a_digest_of_another_form_is_not_compared():
    """A later version may write rows into the digest otherwise: its parts are not taken for edits."""
    batch = _batch(["a", "b"])
    check = RowDigests([_part("p0", 0, 2, "r0:" + "0" * 32)])
    assert check.done and check.feed(batch) == []


def test_a_null_id_is_told_from_an_id_equal_to_its_row_number():
    """A null id's doc id is its row number: "null" edited to "300" in place read the same."""
    null, given = RowBatch(), RowBatch()
    null.append(300, "300", "good", None, "null_id")
    given.append(300, "300", "good", None, "ok")
    assert rows_digest(null) != rows_digest(given)


def test_a_digest_tells_a_text_from_a_null_and_a_shifted_separator():
    a, b = _batch(["x\n1", None]), _batch(["x", "1"])
    assert rows_digest(a) != rows_digest(b)
    assert rows_digest(_batch(["ab", "c"])) != rows_digest(_batch(["a", "bc"]))
    assert rows_digest(_batch(["\ud800 lone surrogate"]))  # what UTF-8 cannot encode still hashes
