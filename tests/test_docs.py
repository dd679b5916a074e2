"""The README stays true: its set-up commands, and every column of every table in schemas/."""

from __future__ import annotations

from pathlib import Path

from bertattn_batch import schema

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def test_readme_opens_with_the_two_commands():
    head = README[:600]
    assert "make extract" in head and "make test" in head


def test_readme_documents_every_column():
    for table in schema.TABLES:
        for column in schema.spec(table)["columns"]:
            assert f"| `{column['name']}` |" in README, (table, column["name"])
            assert column["description"] in README, (table, column["name"])
