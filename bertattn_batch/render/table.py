"""The seed's own output: one review's heads x tokens table, for a spreadsheet (``plot --out r.csv``,
``.xlsx``): a row per head and measure (the raw [CLS] weight, the per-head min-max scaled one), a
column per token, as the seed post read it in Excel. The header is the first row, so that polars and
pandas read the table as it is; the review's title is the xlsx file's third sheet."""

from __future__ import annotations

import csv
from pathlib import Path

from ..analysis.spelling import readable
from ..errors import SpecError
from .review import ReviewAttention


def table_rows(review: ReviewAttention) -> tuple[list[str], list[list[object]]]:
    """(header, rows): ``head``, ``measure``, then one column per content token (``position token``)."""
    tokens = readable(review.tokens, review.byte_level)
    header = ["head", "measure", *(f"{p} {t}" for p, t in zip(review.positions, tokens, strict=True))]
    rows: list[list[object]] = []
    for measure, values in (("scaled", review.scaled), ("raw", review.weight)):
        rows += [[h, measure, *(float(v) for v in values[h])] for h in range(review.num_heads)]
    return header, rows


def write_table(review: ReviewAttention, path: Path) -> Path:
    header, rows = table_rows(review)
    if path.suffix.lower() == ".csv":
        with open(path, "w", newline="", encoding="utf-8-sig") as f:  # the mark tells Excel it is UTF-8
            csv.writer(f).writerows([header, *rows])
        return path
    try:
        import xlsxwriter
    except ImportError:
        raise SpecError("an .xlsx table needs xlsxwriter: pip install xlsxwriter (or write .csv)") from None
    book = xlsxwriter.Workbook(str(path))
    try:
        for measure in ("scaled", "raw"):
            sheet = book.add_worksheet(measure)
            sheet.write_row(0, 0, header)
            for i, row in enumerate(r for r in rows if r[1] == measure):
                sheet.write_row(1 + i, 0, row)
            sheet.conditional_format(1, 2, review.num_heads, len(header) - 1, {"type": "2_color_scale"})
        book.add_worksheet("review").write(0, 0, review.title())
    finally:
        book.close()
    return path
