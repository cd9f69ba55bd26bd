"""A run's progress as a small PNG: the fastest speedup so far and the best share of the ceiling over candidates.

Why no plotting library: one chart of two step lines does not justify matplotlib (tens of MB with its fonts and
backends) as a dependency, even an optional one, and a chart that appears only where an extra is installed is a
chart most users never see. NumPy (already a dependency) draws into an RGB array, `zlib` compresses it, and a PNG
is three chunks around it; labels use a 5x7 bitmap font kept below. Nothing here reads the store.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from kernelforge_tui.engine.takeaway import ProgressPoint

Image = npt.NDArray[np.uint8]
Color = tuple[int, int, int]

WIDTH, HEIGHT = 800, 450
LEFT, RIGHT, TOP, BOTTOM = 80, 80, 60, 60
"""Margins around the plot area, in pixels (axis labels live in them)."""
SCALE = 2
"""Each font pixel is SCALE x SCALE image pixels."""

BACKGROUND: Color = (255, 255, 255)
INK: Color = (40, 40, 40)
GRID: Color = (225, 225, 225)
SPEEDUP: Color = (31, 98, 180)
"""Blue, the left axis; with CEILING below it reads apart for the common colour blindnesses."""
CEILING: Color = (214, 110, 0)
"""Orange, the right axis."""

# A 5x7 bitmap font, one row per number, the leftmost column the highest bit (0x10). Lowercase only: text is
# lowercased before it is drawn; a character not here is drawn as a space.
FONT: dict[str, tuple[int, ...]] = {
    " ": (0, 0, 0, 0, 0, 0, 0),
    "0": (0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E),
    "1": (0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E),
    "2": (0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F),
    "3": (0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E),
    "4": (0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02),
    "5": (0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E),
    "6": (0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E),
    "7": (0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08),
    "8": (0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E),
    "9": (0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C),
    "a": (0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F),
    "b": (0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1E),
    "c": (0x00, 0x00, 0x0E, 0x10, 0x10, 0x11, 0x0E),
    "d": (0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F),
    "e": (0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E),
    "f": (0x06, 0x09, 0x08, 0x1C, 0x08, 0x08, 0x08),
    "g": (0x00, 0x0F, 0x11, 0x11, 0x0F, 0x01, 0x0E),
    "h": (0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11),
    "i": (0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E),
    "j": (0x02, 0x00, 0x06, 0x02, 0x02, 0x12, 0x0C),
    "k": (0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12),
    "l": (0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E),
    "m": (0x00, 0x00, 0x1A, 0x15, 0x15, 0x11, 0x11),
    "n": (0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11),
    "o": (0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E),
    "p": (0x00, 0x00, 0x1E, 0x11, 0x1E, 0x10, 0x10),
    "q": (0x00, 0x00, 0x0D, 0x13, 0x0F, 0x01, 0x01),
    "r": (0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10),
    "s": (0x00, 0x00, 0x0E, 0x10, 0x0E, 0x01, 0x1E),
    "t": (0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06),
    "u": (0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D),
    "v": (0x00, 0x00, 0x11, 0x11, 0x11, 0x0A, 0x04),
    "w": (0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0A),
    "x": (0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11),
    "y": (0x00, 0x00, 0x11, 0x11, 0x0F, 0x01, 0x0E),
    "z": (0x00, 0x00, 0x1F, 0x02, 0x04, 0x08, 0x1F),
    ".": (0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C),
    ",": (0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08),
    ":": (0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00),
    "%": (0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03),
    "-": (0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00),
    "+": (0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00),
    "=": (0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00),
    "(": (0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02),
    ")": (0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08),
    "/": (0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00),
    "_": (0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F),
    "'": (0x0C, 0x04, 0x08, 0x00, 0x00, 0x00, 0x00),
    "#": (0x0A, 0x0A, 0x1F, 0x0A, 0x1F, 0x0A, 0x0A),
}
GLYPH_W, GLYPH_H, ADVANCE = 5 * SCALE, 7 * SCALE, 6 * SCALE


def text_width(text: str) -> int:
    return len(text) * ADVANCE - SCALE if text else 0


def draw_text(image: Image, x: int, y: int, text: str, color: Color) -> None:
    """`text` with its top-left corner at (x, y); pixels outside the image are dropped."""
    height, width = image.shape[:2]
    for i, char in enumerate(text.lower()):
        rows = FONT.get(char, FONT[" "])
        for r, bits in enumerate(rows):
            for c in range(5):
                if bits & (0x10 >> c):
                    x0, y0 = x + i * ADVANCE + c * SCALE, y + r * SCALE
                    if 0 <= x0 <= width - SCALE and 0 <= y0 <= height - SCALE:
                        image[y0 : y0 + SCALE, x0 : x0 + SCALE] = color


def _fill(image: Image, x0: int, x1: int, y0: int, y1: int, color: Color) -> None:
    """The rectangle of columns x0..x1 and rows y0..y1, inclusive, in either order."""
    image[min(y0, y1) : max(y0, y1) + 1, min(x0, x1) : max(x0, x1) + 1] = color


def _step_line(image: Image, ys: Sequence[int | None], x0: int, color: Color) -> None:
    """A step line two pixels thick: ys[i] is the row at column x0 + i (None: nothing yet)."""
    previous: int | None = None
    for i, y in enumerate(ys):
        if y is None:
            continue
        x = x0 + i
        _fill(image, x, x + 1, previous if previous is not None else y, y, color)
        _fill(image, x, x + 1, y, y + 1, color)
        previous = y


def _nice_max(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above `value`."""
    if value <= 0:
        return 1.0
    power = 10.0 ** np.floor(np.log10(value))
    return float(next(m * power for m in (1, 2, 5, 10) if m * power >= value))


def _number(value: float) -> str:
    return f"{value:g}"


def render(points: Sequence[ProgressPoint], title: str) -> Image:
    """The chart as an RGB array: candidates along x, the fastest so far on the left axis (x over the card's
    baseline), the best share of the ceiling on the right (0-100%)."""
    image = np.empty((HEIGHT, WIDTH, 3), dtype=np.uint8)
    image[:] = BACKGROUND
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    bottom, right = TOP + plot_h, LEFT + plot_w
    n = max(len(points), 1)
    top_speedup = _nice_max(max((p.best_speedup or 0.0 for p in points), default=1.0))

    for k in range(5):  # grid lines and tick labels, both axes at quarters
        y = bottom - round(plot_h * k / 4)
        _fill(image, LEFT, right, y, y, GRID)
        label = _number(top_speedup * k / 4) + "x"
        draw_text(image, LEFT - 8 - text_width(label), y - GLYPH_H // 2, label, SPEEDUP)
        draw_text(image, right + 8, y - GLYPH_H // 2, f"{25 * k}%", CEILING)
    _fill(image, LEFT, LEFT, TOP, bottom, INK)
    _fill(image, right, right, TOP, bottom, INK)
    _fill(image, LEFT, right, bottom, bottom, INK)
    for k in range(5):
        x = LEFT + round(plot_w * k / 4)
        _fill(image, x, x, bottom, bottom + 4, INK)
        label = str(round(n * k / 4))
        draw_text(image, x - text_width(label) // 2, bottom + 8, label, INK)
    axis = "candidates evaluated"
    draw_text(image, LEFT + (plot_w - text_width(axis)) // 2, bottom + 12 + GLYPH_H, axis, INK)
    fits = (WIDTH - 20) // ADVANCE
    draw_text(image, 10, 10, title if len(title) <= fits else title[: fits - 3] + "...", INK)
    legend = [("fastest so far (left)", SPEEDUP), ("best share of the ceiling (right)", CEILING)]
    x = 10
    for label, color in legend:
        _fill(image, x, x + GLYPH_H - 1, 34, 34 + GLYPH_H - 1, color)
        draw_text(image, x + GLYPH_H + 6, 34, label, INK)
        x += GLYPH_H + 6 + text_width(label) + 24

    def row(value: float | None, top: float) -> int | None:
        return None if value is None else bottom - round(plot_h * min(value / top, 1.0))

    columns = [points[min(len(points) - 1, c * len(points) // plot_w)] for c in range(plot_w)] if points else []
    _step_line(image, [row(p.best_ceiling_share, 1.0) for p in columns], LEFT, CEILING)
    _step_line(image, [row(p.best_speedup, top_speedup) for p in columns], LEFT, SPEEDUP)
    return image


def png_bytes(image: Image) -> bytes:
    """An RGB array as a PNG file: IHDR, one zlib-compressed IDAT (each row with filter 0), IEND."""
    height, width = image.shape[:2]

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = np.concatenate([np.zeros((height, 1), dtype=np.uint8), image.reshape(height, width * 3)], axis=1)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8 bits, RGB, no interlace
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows.tobytes(), 9))
        + chunk(b"IEND", b"")
    )


def write_chart(points: Sequence[ProgressPoint], title: str, path: Path) -> Path:
    path.write_bytes(png_bytes(render(points, title)))
    return path
