"""The docs stay true: the README's two commands and size, the generated parts of docs/ (commands,
tables, the package's layout), and every column of every table."""

from __future__ import annotations

import importlib.util

from helpers import REPO

from bertattn_batch import schema

README = (REPO / "README.md").read_text(encoding="utf-8")


def _generate():
    spec = importlib.util.spec_from_file_location("bertattn_docs", REPO / "docs" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_opens_with_the_two_commands_and_stays_short():
    head = README[:600]
    assert "make extract" in head and "make test" in head
    assert "source .venv/bin/activate" in README[:1000]
    assert len(README.encode()) < 10_000


def test_the_generated_parts_of_the_docs_are_current():
    stale = _generate().stale()
    assert not stale, f"{[p.name for p in stale]} out of date: run python docs/generate.py"


def test_docs_document_every_column():
    tables = (REPO / "docs" / "run-directory.md").read_text(encoding="utf-8")
    for table in schema.TABLES:
        for column in schema.spec(table)["columns"]:
            assert f"| `{column['name']}` |" in tables, (table, column["name"])
            assert column["description"] in tables, (table, column["name"])


def test_every_link_between_the_docs_leads_somewhere():
    import re

    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).is_file(), (page.name, target)
