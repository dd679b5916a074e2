"""The readers stream: what one block costs does not grow with the file's row groups."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.parquet as pq

from bertattn_batch import read


def test_a_large_parquet_row_group_is_read_a_block_at_a_time(tmp_path):
    # 16 MB of text that does not compress, in one row group: by default Arrow reads (pre-buffers) a
    # row group's whole column chunk, so the first block alone would hold all of it.
    rng = random.Random(0)
    texts = ["".join(chr(rng.randrange(0x4E00, 0x9FA5)) for _ in range(340)) for _ in range(16_000)]
    path = tmp_path / "one-row-group.parquet"
    pq.write_table(pa.table({"text": texts}), path, compression="none", use_dictionary=False)
    assert pq.ParquetFile(path).metadata.num_row_groups == 1

    rows = read.read_rows([str(path)], block_rows=256)
    before = pa.total_allocated_bytes()
    first = next(rows)
    held = pa.total_allocated_bytes() - before
    assert first.text == texts[:256]
    assert held < 4 * 2**20, f"the first block holds {held / 2**20:.1f} MB of Arrow memory"
    assert sum(len(b.text) for b in rows) == len(texts) - 256
