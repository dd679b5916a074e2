"""What the commands show a person: progress bars sized to the terminal, byte counts in decimal units."""

from __future__ import annotations

import os
import sys
from typing import Any


def bar_size() -> dict[str, Any]:
    """tqdm's size options for a bar on standard error: the terminal's width as it changes, or a fixed
    size where the terminal reports 0 columns or rows (``script``, ``docker run -t``), on which tqdm
    would draw nothing."""
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):  # not a terminal: no bar is shown there anyway
        return {"dynamic_ncols": True}
    if size.columns and size.lines:
        return {"dynamic_ncols": True}
    return {"ncols": size.columns or 100, "nrows": size.lines or 24}


def human_bytes(n: float) -> str:
    """Bytes in decimal units (1 MB = 1,000,000 bytes), as the docs and object stores count them."""
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("KB", "MB"):
        n /= 1000
        if round(n, 1) < 1000:  # 999,999 bytes: 1.0 MB, not 1000.0 KB
            return f"{n:.1f} {unit}"
    return f"{n / 1000:.1f} GB"
