"""WCAG 2 contrast: the ratio of two colours' relative luminances, and a colour nudged until it is readable.

The TUI draws code in a syntax theme's colours on backgrounds of its own (a pane, an added or removed line), so a
colour that reads well on one can vanish on another; `readable` moves a foreground toward white or black just
enough to reach a ratio on the background it is drawn on. Terminal palette colours (the `ansi` theme) have no
known value: they are left as they are, since the user's palette decides how they look.
"""

from __future__ import annotations

from functools import lru_cache

from rich.color import Color as RichColor
from rich.style import Style
from textual.color import Color

AA = 4.5
"""WCAG AA for body text."""
AA_LARGE = 3.0
"""WCAG AA for large text and for the parts of a control a person must see (1.4.11)."""
WHITE = Color(255, 255, 255)
BLACK = Color(0, 0, 0)


def _channel(value: int) -> float:
    c = value / 255
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def luminance(color: Color) -> float:
    """WCAG relative luminance, 0 (black) to 1 (white)."""
    return 0.2126 * _channel(color.r) + 0.7152 * _channel(color.g) + 0.0722 * _channel(color.b)


def contrast(a: Color, b: Color) -> float:
    """WCAG contrast ratio, 1 (the same) to 21 (black on white)."""
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


@lru_cache(maxsize=4096)
def readable(fg: Color, bg: Color, ratio: float = AA) -> Color:
    """`fg`, or the least change of it toward white or black (the side of `bg` with more room) that reaches
    `ratio` on `bg`; the extreme itself when even that falls short."""
    if contrast(fg, bg) >= ratio:
        return fg
    target = WHITE if contrast(WHITE, bg) >= contrast(BLACK, bg) else BLACK
    low, high = 0.0, 1.0
    for _ in range(16):
        middle = (low + high) / 2
        if contrast(fg.blend(target, middle), bg) >= ratio:
            high = middle
        else:
            low = middle
    return fg.blend(target, high)


def _truecolor(color: RichColor | None) -> Color | None:
    """A colour with a known value, or None for none, the default colour or a palette colour."""
    if color is None or color.is_default or color.is_system_defined or color.triplet is None:
        return None
    return Color.from_rich_color(color)


def readable_style(style: Style, background: RichColor | None, ratio: float = AA) -> Style:
    """`style` with its colour made `readable` on `background` (unchanged where either colour is the
    terminal's own)."""
    fg, bg = _truecolor(style.color), _truecolor(background)
    if fg is None or bg is None:
        return style
    fixed = readable(fg, bg, ratio)
    return style if fixed == fg else style + Style(color=fixed.rich_color)
