"""A font for CJK characters in matplotlib figures, from a Python package or the system's fonts.

Usage::

    from bertattn_batch.render import fonts
    with matplotlib.rc_context({"font.family": fonts.family(tokens)}):   # ["DejaVu Sans", "Noto Sans CJK SC"]
        ax.set_xticklabels([fonts.label(t) for t in tokens])

Why: matplotlib's default font has no CJK glyphs and draws Chinese as empty boxes. We look, in order,
at ``$BERTATTN_CJK_FONT`` (a font file, or ``none`` to look no further), fonts that Python packages
ship (``pip install noto-cjk-sans-otc``), the fonts matplotlib knows, and ``fc-list :lang=zh``
(``apt-get install fonts-noto-cjk``). With none found, characters no font covers are written as
``U+XXXX`` codes, and one warning says how to install a font: never boxes.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger(__name__)

ENV_VAR = "BERTATTN_CJK_FONT"
#: (package, font file inside it): CJK fonts that PyPI packages ship, best first.
PACKAGED_FONTS = (
    ("noto_cjk_sans_otc", "NotoSansCJK-Regular.ttc"),
    ("mplfonts", "fonts/NotoSansCJKsc-Regular.otf"),
)
#: System font families with broad CJK coverage, best first.
SYSTEM_FAMILIES = (
    "Noto Sans CJK SC",
    "Noto Sans CJK JP",
    "Noto Sans CJK TC",
    "Noto Sans SC",
    "Source Han Sans SC",
    "Source Han Sans CN",
    "WenQuanYi Micro Hei",
    "WenQuanYi Zen Hei",
    "Droid Sans Fallback",
    "Microsoft YaHei",
    "PingFang SC",
    "SimHei",
    "AR PL UMing CN",
)
_RANK = {name: k for k, name in enumerate(SYSTEM_FAMILIES)}
#: Radicals to ideographs and kana, Hangul, compatibility ideographs, full-width forms, extensions B+.
_CJK_RANGES = ((0x2E80, 0x9FFF), (0xAC00, 0xD7AF), (0xF900, 0xFAFF), (0xFF00, 0xFFEF), (0x20000, 0x3FFFF))
#: A character every CJK font has: how a candidate found by name is checked.
_PROBE = ord("中")
INSTALL_HINT = (
    "pip install noto-cjk-sans-otc, or apt-get install fonts-noto-cjk, "
    f"or set {ENV_VAR}=/path/to/a/cjk-font.ttf"
)


def _package_font(package: str, relpath: str) -> Path | None:
    """A package's font file, found without importing the package."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / relpath
        if path.is_file():
            return path
    return None


def _fc_list() -> list[Path]:
    """Font files fontconfig says cover Chinese (empty when fontconfig is absent)."""
    if not shutil.which("fc-list"):
        return []
    try:
        out = subprocess.run(
            ["fc-list", ":lang=zh", "file"], capture_output=True, text=True, timeout=20, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted(Path(line.split(":")[0].strip()) for line in out.splitlines() if line.strip())


def _covers_probe(path: Path) -> bool:
    from matplotlib.ft2font import FT2Font

    try:
        return _PROBE in FT2Font(str(path)).get_charmap()
    except (OSError, RuntimeError, ValueError):
        return False


def candidates() -> list[Path]:
    """Font files that may hold CJK glyphs, best first (not yet checked)."""
    from matplotlib import font_manager

    env = os.environ.get(ENV_VAR, "").strip()
    if env.lower() == "none":
        return []
    found: list[Path] = [Path(env)] if env else []
    found += [p for pkg, rel in PACKAGED_FONTS if (p := _package_font(pkg, rel))]
    by_name = {f.name: Path(f.fname) for f in font_manager.fontManager.ttflist}
    found += [by_name[name] for name in SYSTEM_FAMILIES if name in by_name]
    found += _fc_list()
    return found


class CjkFont(NamedTuple):
    name: str  # its family name, as matplotlib knows it
    path: Path
    index: int  # of its face in a font collection (.ttc); 0 in a single font's file


@cache
def cjk_font() -> CjkFont | None:
    """The first usable CJK font, registered with matplotlib; None if none. Of a collection's faces (the
    packaged Noto file holds JP, KR, SC, TC and HK), the simplified Chinese one: the first face, JP,
    draws characters such as 骨 and 直 in their Japanese forms."""
    from matplotlib import font_manager

    env = os.environ.get(ENV_VAR, "").strip()
    for path in candidates():
        if path.is_file() and _covers_probe(path):
            try:
                font_manager.fontManager.addfont(str(path))
            except (OSError, RuntimeError, ValueError):
                continue
            # matplotlib 3.10 and later register each face of a collection, earlier ones the first alone
            faces = [f for f in font_manager.fontManager.ttflist if Path(f.fname) == path]
            best = min(faces, key=lambda f: _RANK.get(f.name, len(_RANK)))
            log.debug("CJK font: %s (%s)", best.name, path)
            return CjkFont(best.name, path, int(getattr(best, "index", 0)))
        if env and path == Path(env):  # what the user named, passed over: say so once
            log.warning("%s=%s is no font file with CJK characters; looking further", ENV_VAR, env)
    return None


@cache
def _base() -> list[str]:
    from matplotlib import rcParams

    return list(rcParams["font.sans-serif"][:1]) or ["DejaVu Sans"]


@cache
def _full() -> list[str]:
    """The default font, then the CJK font for what it lacks."""
    found = cjk_font()
    return [*_base(), found.name] if found else _base()


def family(texts: str | list[str] = "") -> list[str]:
    """matplotlib's font family list for drawing ``texts``: the CJK font is added only when needed
    (a fallback font makes matplotlib's text layout several times slower)."""
    chars = {ord(c) for t in ([texts] if isinstance(texts, str) else texts) for c in t}
    if chars and chars <= _charmap(_base()[0]):
        return _base()
    return _full()


@cache
def _charmap(name: str) -> frozenset[int]:
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    path = font_manager.findfont(font_manager.FontProperties(family=name), fallback_to_default=True)
    return frozenset(FT2Font(path).get_charmap())


def _charmaps() -> tuple[frozenset[int], ...]:
    return tuple(_charmap(name) for name in _full())


_warned: set[str] = set()


def label(text: str) -> str:
    """``text`` with every character no font we have draws replaced by its ``U+XXXX`` code."""
    maps = _charmaps()
    missing = [c for c in text if not c.isspace() and not any(ord(c) in m for m in maps)]
    if not missing:
        return text
    if "missing" not in _warned:
        _warned.add("missing")
        cjk = [c for c in missing if any(lo <= ord(c) <= hi for lo, hi in _CJK_RANGES)]
        shown = (cjk or missing)[0]
        log.warning(
            "no font here draws %r (U+%04X): such characters are shown as U+XXXX codes; %s",
            shown,
            ord(shown),
            f"for CJK: {INSTALL_HINT}"
            if cjk
            else "install a font that has them (fc-list shows the fonts here)",
        )
    return "".join(f"U+{ord(c):04X}" if c in missing else c for c in text)


def reset() -> None:
    """Forget what was found (after installing a font, or in tests that change the environment)."""
    for cached in (cjk_font, _base, _full, _charmap):
        cached.cache_clear()
    _warned.clear()


#: The family name an HTML page gives its embedded CJK subset.
WEB_FAMILY = "bertattn-cjk"
#: Characters from here up (CJK radicals, kana, ideographs, Hangul, full-width forms) are embedded.
_CJK_START = 0x2E80


def font_face_css(text: str) -> str:
    """An ``@font-face`` rule embedding the CJK font, cut down to the CJK characters of ``text``.

    Why: a page must read right offline on a machine without CJK fonts (a server, a CI runner). Empty
    when ``text`` has no CJK characters or no CJK font is found (the browser's own fonts then apply).
    """
    found = cjk_font()
    chars = sorted({c for c in text if ord(c) >= _CJK_START})
    if not chars or found is None:
        return ""
    import base64
    import io

    from fontTools import subset
    from fontTools.ttLib import TTFont

    try:
        font = TTFont(str(found.path), fontNumber=found.index, lazy=True)
        options = subset.Options()
        options.flavor = "woff"  # zlib: needs no brotli
        options.notdef_outline = True
        subsetter = subset.Subsetter(options)
        subsetter.populate(text="".join(chars))
        subsetter.subset(font)
        buf = io.BytesIO()
        font.save(buf)
    except Exception as e:  # a font fontTools cannot cut: fall back to the browser's fonts
        log.warning("could not embed the CJK font %s in the page: %s", found.path, e)
        return ""
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return (
        f'@font-face {{ font-family: "{WEB_FAMILY}"; src: url(data:font/woff;base64,{data}) format("woff"); '
        "unicode-range: U+2E80-FFFF, U+20000-3FFFF; }\n"  # CJK only: the page's other text keeps its fonts
    )
