"""A CJK font for matplotlib figures and, as a subset, HTML pages: the first of ``$BERTATTN_CJK_FONT`` (a
file, or ``none``), a font a Python package ships, a CJK family matplotlib knows, one ``fc-list :lang=zh``
lists. Characters no font draws become ``U+XXXX`` codes, after a warning that says how to install one."""

from __future__ import annotations

import base64
import importlib.util
import io
import logging
import os
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger(__name__)

ENV_VAR = "BERTATTN_CJK_FONT"
INSTALL_HINT = (
    "pip install noto-cjk-sans-otc, or apt-get install fonts-noto-cjk, "
    f"or set {ENV_VAR}=/path/to/a/cjk-font.ttf"
)
#: (package, font file inside it): CJK fonts that PyPI packages ship, best first.
PACKAGED_FONTS = (
    ("noto_cjk_sans_otc", "NotoSansCJK-Regular.ttc"),
    ("mplfonts", "fonts/NotoSansCJKsc-Regular.otf"),
)
#: Font families with broad CJK coverage, best first; also which face of a collection to draw with.
SYSTEM_FAMILIES = (
    "Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans CJK TC", "Noto Sans SC", "Source Han Sans SC",
    "Source Han Sans CN", "WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "Droid Sans Fallback",
    "Microsoft YaHei", "PingFang SC", "SimHei", "AR PL UMing CN",
)  # fmt: skip
#: CJK radicals to ideographs and kana, Hangul, compatibility ideographs, full-width forms, extensions B+.
CJK_RANGES = ((0x2E80, 0x9FFF), (0xAC00, 0xD7AF), (0xF900, 0xFAFF), (0xFF00, 0xFFEF), (0x20000, 0x3FFFF))
#: The family name a page gives its embedded CJK subset.
WEB_FAMILY = "bertattn-cjk"


class CjkFont(NamedTuple):
    name: str  # family name, as matplotlib knows it
    path: Path
    index: int  # of its face in a font collection (.ttc); 0 in a single font's file


def is_cjk(char: str) -> bool:
    return any(lo <= ord(char) <= hi for lo, hi in CJK_RANGES)


@cache
def _charmap(path: str) -> frozenset[int]:
    """The code points a font file's (first) face draws; none where it is no font."""
    from matplotlib.ft2font import FT2Font

    try:
        return frozenset(FT2Font(path).get_charmap())
    except (OSError, RuntimeError, ValueError):
        return frozenset()


def _candidates() -> Iterator[Path]:
    """Font files that may draw CJK, best first (unchecked)."""
    from matplotlib import font_manager

    env = os.environ.get(ENV_VAR, "").strip()
    if env.lower() == "none":
        return
    if env:
        yield Path(env)  # asked for the next: the font there was not taken
        log.warning("%s=%s is no font file with CJK characters; looking further", ENV_VAR, env)
    for package, relpath in PACKAGED_FONTS:  # found without importing the package
        spec = importlib.util.find_spec(package)
        yield from (Path(folder) / relpath for folder in (spec and spec.submodule_search_locations) or [])
    by_name = {f.name: Path(f.fname) for f in font_manager.fontManager.ttflist}
    yield from (by_name[name] for name in SYSTEM_FAMILIES if name in by_name)
    try:
        command = ["fc-list", ":lang=zh", "file"]
        out = subprocess.run(command, capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):  # no fontconfig here
        return
    yield from sorted(Path(line.split(":")[0].strip()) for line in out.splitlines() if line.strip())


@cache
def cjk_font() -> CjkFont | None:
    """The first CJK font found, registered with matplotlib; None if none. Of a collection's faces, the
    simplified Chinese one: the first face (JP) draws characters such as 骨 and 直 in Japanese forms."""
    from matplotlib import font_manager

    rank = {name: k for k, name in enumerate(SYSTEM_FAMILIES)}
    for path in _candidates():
        if path.is_file() and ord("中") in _charmap(str(path)):
            try:
                font_manager.fontManager.addfont(str(path))
            except (OSError, RuntimeError, ValueError):
                continue
            faces = [f for f in font_manager.fontManager.ttflist if Path(f.fname) == path]
            best = min(faces, key=lambda f: rank.get(f.name, len(rank)))
            log.debug("CJK font: %s (%s)", best.name, path)
            return CjkFont(best.name, path, int(getattr(best, "index", 0)))  # index: matplotlib >= 3.10
    return None


@cache
def _base() -> tuple[str, str]:
    """The default font's family name and file."""
    from matplotlib import font_manager, rcParams

    name = (rcParams["font.sans-serif"][:1] or ["DejaVu Sans"])[0]
    return name, font_manager.findfont(font_manager.FontProperties(family=name), fallback_to_default=True)


def family(texts: str | list[str] = "") -> list[str]:
    """matplotlib's font family list for drawing ``texts``: the CJK font only where the default font
    lacks a character (a fallback font makes matplotlib's text layout several times slower)."""
    name, path = _base()
    chars = {ord(c) for t in ([texts] if isinstance(texts, str) else texts) for c in t}
    found = cjk_font()
    return [name] if (chars and chars <= _charmap(path)) or found is None else [name, found.name]


_warned: set[str] = set()


def label(text: str) -> str:
    """``text`` with each character no font here draws replaced by its ``U+XXXX`` code."""
    found = cjk_font()
    maps = [_charmap(_base()[1]), *([_charmap(str(found.path))] if found else [])]
    missing = {c for c in text if not c.isspace() and not any(ord(c) in m for m in maps)}
    if not missing:
        return text
    if not _warned:
        _warned.add("missing")
        c = min(missing, key=lambda c: (not is_cjk(c), text.index(c)))
        fix = f"for CJK: {INSTALL_HINT}" if is_cjk(c) else "install a font that has them (fc-list)"
        log.warning("no font here draws %r (U+%04X): it is shown as a U+XXXX code; %s", c, ord(c), fix)
    return "".join(f"U+{ord(c):04X}" if c in missing else c for c in text)


def reset() -> None:
    """Forget what was found (after installing a font, or in tests that change the environment)."""
    for cached in (cjk_font, _base, _charmap):
        cached.cache_clear()
    _warned.clear()


def font_face_css(text: str) -> str:
    """An ``@font-face`` rule embedding the CJK font cut down to the CJK characters of ``text``, so that
    a page reads right offline on a machine without CJK fonts; empty where there is nothing to embed."""
    found = cjk_font()
    chars = "".join(sorted({c for c in text if is_cjk(c)}))
    if not chars or found is None:
        return ""
    from fontTools import subset
    from fontTools.ttLib import TTFont

    try:
        font = TTFont(str(found.path), fontNumber=found.index, lazy=True)
        options = subset.Options(flavor="woff", notdef_outline=True)  # woff: zlib, no brotli needed
        subsetter = subset.Subsetter(options)
        subsetter.populate(text=chars)
        subsetter.subset(font)
        buf = io.BytesIO()
        font.save(buf)
    except Exception as e:  # a font fontTools cannot cut: the browser's fonts apply
        log.warning("could not embed the CJK font %s in the page: %s", found.path, e)
        return ""
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    ranges = ", ".join(f"U+{lo:X}-{hi:X}" for lo, hi in CJK_RANGES)  # the page's other text keeps its fonts
    return (
        f'@font-face {{ font-family: "{WEB_FAMILY}"; src: url(data:font/woff;base64,{data}) format("woff"); '
        f"unicode-range: {ranges}; }}\n"
    )
