"""The package's shape: no private names across modules, nothing done on import."""

from __future__ import annotations

import ast
import subprocess
import sys

from helpers import REPO

PACKAGE = REPO / "bertattn_batch"


def test_no_module_imports_another_modules_private_names():
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (
                node.level or (node.module or "").startswith("bertattn")
            ):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{path.relative_to(REPO)}: {alias.name} from {node.module}")
    assert not found, found


def test_importing_the_package_imports_no_heavy_library_and_sets_nothing():
    code = (
        "import os, sys\n"
        "before = dict(os.environ)\n"
        "import bertattn_batch\n"
        "assert dict(os.environ) == before\n"
        "heavy = {'torch', 'transformers', 'polars', 'pyarrow'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
        "print(bertattn_batch.__version__, sorted(bertattn_batch.__all__)[:3])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
