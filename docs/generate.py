"""Regenerate the parts of docs/ that are made from the code: ``python docs/generate.py`` (``--check``:
exit 1 if a file is out of date, which ``tests/unit/test_docs.py`` runs).

Each generated part sits between ``<!-- generated: NAME -->`` and ``<!-- end generated -->`` in its file:

- ``commands`` (docs/commands.md): every command's ``--help``;
- ``tables`` (docs/run-directory.md): every column of every table, from ``schemas/``;
- ``layout`` (docs/development.md): every module of the package with the first line of its docstring.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
MARK = re.compile(r"(<!-- generated: (\w+) -->\n)(.*?)(<!-- end generated -->)", re.S)
#: Columns of the help text in docs/commands.md (wide enough that no option's help is cut).
HELP_COLUMNS = 100


def commands() -> str:
    """``bertattn --help`` and every command's, as a terminal of ``HELP_COLUMNS`` columns prints them."""
    from typer.testing import CliRunner

    from bertattn_batch.cli import app

    env = {
        "COLUMNS": str(HELP_COLUMNS),
        "TERM": "dumb",
        "NO_COLOR": "1",
        "_TYPER_FORCE_DISABLE_TERMINAL": "1",
    }
    runner = CliRunner()
    names = [c.name or c.callback.__name__ for c in app.registered_commands]
    out = []
    for args in ([], *([name] for name in names)):
        text = runner.invoke(app, [*args, "--help"], env=env, prog_name="bertattn").output
        text = "\n".join(line.rstrip() for line in text.strip("\n").splitlines())
        title = f"bertattn {args[0]}" if args else "bertattn"
        out.append(f"## `{title}`\n\n```\n{text}\n```\n")
    return "\n".join(out)


def tables() -> str:
    """One section per table of ``schemas/``: its description and every column."""
    from bertattn_batch import schema

    out = []
    for table in (*schema.TABLES, "token_influence", "head_faithfulness"):
        spec = schema.spec(table)
        lines = [
            f"### `{table}` (schema version {spec['version']})",
            "",
            spec["description"],
            "",
            "| column | type | description |",
            "|---|---|---|",
        ]
        for c in spec["columns"]:
            kind = c["type"] + ("" if c["nullable"] else ", not null")
            if "range" in c:  # what validate checks of every value
                low, high = (f"`{b}`" if isinstance(b, str) else b for b in c["range"])
                kind += f", in [{'−∞' if low is None else low}, {'∞' if high is None else high}]"
            lines.append(f"| `{c['name']}` | {kind} | {c['description']} |")
        out.append("\n".join(lines) + "\n")
    return "\n".join(out)


def layout() -> str:
    """The package as a tree: every module, and the first sentence of its docstring."""
    import ast

    package = REPO / "bertattn_batch"
    lines = ["```"]
    for path in sorted(package.rglob("*.py"), key=lambda p: (p.parent != package, str(p.parent), p.name)):
        rel = path.relative_to(package)
        text = path.read_text(encoding="utf-8")
        doc = (ast.get_docstring(ast.parse(text)) or "").strip()
        first = " ".join(doc.split("\n\n")[0].split())
        first = first.split(". ")[0].rstrip(".")
        if len(first) > 76:
            first = first[:75] + "…"
        if rel.name == "__init__.py":  # a package: its folder, one level out from its modules
            name = "  " * (len(rel.parts) - 1) + f"{(package / rel).parent.name}/"
        else:
            name = "  " * len(rel.parts) + rel.name
        lines.append(f"{name:<24} {first}")
    lines.append("```")
    return "\n".join(lines)


GENERATORS = {"commands": commands, "tables": tables, "layout": layout}


def render(path: Path) -> str:
    """The file's text with each of its generated parts made anew."""
    return MARK.sub(
        lambda m: f"{m.group(1)}\n{GENERATORS[m.group(2)]().strip()}\n\n{m.group(4)}", path.read_text()
    )


def stale() -> list[Path]:
    return [p for p in sorted(DOCS.glob("*.md")) if render(p) != p.read_text()]


def main(argv: list[str]) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(REPO))
    if "--check" in argv:
        out_of_date = stale()
        for p in out_of_date:
            print(f"{p.relative_to(REPO)} is out of date: run python docs/generate.py", file=sys.stderr)
        return 1 if out_of_date else 0
    for p in sorted(DOCS.glob("*.md")):
        text = render(p)
        if text != p.read_text():
            p.write_text(text)
            print(f"wrote {p.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
