"""A tiny PNG line plot (no plotting library needed): loss curves for the demo."""

from __future__ import annotations

import struct
import zlib

_COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]
COLOR_NAMES = ["blue", "orange", "green", "red"]

# 3x5 bitmaps for the characters of tick labels, rows top to bottom.
_GLYPHS = {
    "0": ("111", "101", "101", "101", "111"), "1": ("010", "110", "010", "010", "111"),
    "2": ("111", "001", "111", "100", "111"), "3": ("111", "001", "111", "001", "111"),
    "4": ("101", "101", "111", "001", "001"), "5": ("111", "100", "111", "001", "111"),
    "6": ("111", "100", "111", "101", "111"), "7": ("111", "001", "010", "010", "010"),
    "8": ("111", "101", "111", "101", "111"), "9": ("111", "101", "111", "001", "111"),
    ".": ("000", "000", "000", "000", "010"), "-": ("000", "000", "111", "000", "000"),
}


def _text(px, w, h, x, y, s, scale=2):
    """Draw `s` (digits, '.', '-') with its top-left corner at (x, y)."""
    for ch in s:
        for r, row in enumerate(_GLYPHS.get(ch, ("000",) * 5)):
            for c, bit in enumerate(row):
                if bit == "1":
                    for dy in range(scale):
                        for dx in range(scale):
                            yy, xx = y + r * scale + dy, x + c * scale + dx
                            if 0 <= xx < w and 0 <= yy < h:
                                px[yy][xx] = (60, 60, 60)
        x += 4 * scale


def _chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


def _line(px, w, h, x0, y0, x1, y1, color):
    steps = max(abs(x1 - x0), abs(y1 - y0), 1)
    for i in range(steps + 1):
        x = round(x0 + (x1 - x0) * i / steps)
        y = round(y0 + (y1 - y0) * i / steps)
        for dx in (0, 1):
            if 0 <= x + dx < w and 0 <= y < h:
                px[y][x + dx] = color


def line_plot(path: str, series: dict[str, list[float]], width: int = 640,
              height: int = 400) -> None:
    """Write the series (name -> y values over steps) as a PNG with axes and a color key."""
    w, h, m = width, height, 50
    px = [[(255, 255, 255)] * w for _ in range(h)]
    values = [v for ys in series.values() for v in ys]
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    n = max(len(ys) for ys in series.values())
    _line(px, w, h, m, h - m, w - m, h - m, (0, 0, 0))
    _line(px, w, h, m, m, m, h - m, (0, 0, 0))
    for k in range(5):  # horizontal grid lines, labelled with their values
        y = m + (h - 2 * m) * k // 4
        _line(px, w, h, m, y, w - m, y, (225, 225, 225))
        _text(px, w, h, 4, y - 5, f"{hi - span * k / 4:.2f}")
    for k in range(5):  # step labels under the x axis
        x = m + (w - 2 * m) * k // 4
        _text(px, w, h, x - 6, h - m + 8, str(1 + (n - 1) * k // 4))
    for idx, ys in enumerate(series.values()):
        color = _COLORS[idx % len(_COLORS)]
        pts = [(m + (w - 2 * m) * i / max(n - 1, 1), m + (h - 2 * m) * (hi - v) / span)
               for i, v in enumerate(ys)]
        for (xa, ya), (xb, yb) in zip(pts, pts[1:]):
            _line(px, w, h, round(xa), round(ya), round(xb), round(yb), color)
        for dy in range(8):  # a color key in the top right corner
            _line(px, w, h, w - m - 60, m + 12 * idx + dy // 2, w - m - 40, m + 12 * idx + dy // 2,
                  color)
    raw = b"".join(b"\x00" + bytes(c for p in row for c in p) for row in px)
    png = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + _chunk(b"IDAT", zlib.compress(raw, 6)) + _chunk(b"IEND", b""))
    with open(path, "wb") as f:
        f.write(png)
