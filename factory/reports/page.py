"""The page shell and the SVG pieces the reports share: one stylesheet, escaped text, axes with
round ticks, and a legend. Everything is inline, so a page is one file."""

from __future__ import annotations

import html
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

# One palette for every report (colour-blind safe: Okabe-Ito).
COLORS = {
    "built": "#009e73", "missing": "#e69f00", "cannot": "#999999", "absent": "#f2f2f2",
    "object": "#0072b2", "long": "#d55e00", "rss": "#0072b2", "anon": "#cc79a7",
    "predicted": "#e69f00", "cap": "#d55e00", "oom": "#d55e00", "grid": "#e6e6e6",
}

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5rem;color:#222;
max-width:1400px}
h1{font-size:1.4rem;margin:0 0 .3rem}h2{font-size:1.1rem;margin:1.6rem 0 .4rem}
p.sub{color:#555;margin:.2rem 0 1rem}
table.facts{border-collapse:collapse;margin:.5rem 0}
table.facts td,table.facts th{padding:3px 10px;text-align:left;border-bottom:1px solid #eee}
table.facts td.n{text-align:right;font-variant-numeric:tabular-nums}
svg{display:block;max-width:100%;height:auto;font-size:11px}
svg text{fill:#333}svg .axis line,svg .axis path{stroke:#999}
.legend{display:flex;flex-wrap:wrap;gap:.4rem 1.2rem;font-size:.85rem;margin:.3rem 0}
.legend span::before{content:"";display:inline-block;width:.9em;height:.9em;
margin-right:.35em;vertical-align:-.1em;background:var(--c);border-radius:2px}
.scroll{overflow-x:auto}
code{font-size:90%}
"""


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def page(title: str, body: Iterable[str], *, style: str = "") -> str:
    """A whole HTML5 page around ``body``."""
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title>", f"<style>{STYLE}{style}</style>", "</head>", "<body>",
        *body, "</body>", "</html>", "",
    ])


def legend(items: Sequence[tuple[str, str]]) -> str:
    """``(label, colour)`` pairs as one line of swatches."""
    spans = "".join(f'<span style="--c:{esc(color)}">{esc(label)}</span>'
                    for label, color in items)
    return f'<div class="legend">{spans}</div>'


def nice_ticks(high: float, count: int = 6) -> list[float]:
    """Round tick values from 0 to at least ``high`` (1, 2 or 5 times a power of ten)."""
    if high <= 0:
        return [0.0, 1.0]
    raw = high / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    ticks = [0.0]
    while ticks[-1] < high - 1e-9:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def time_ticks(seconds: float) -> tuple[list[float], str]:
    """Ticks for a time axis and their unit: seconds, minutes or hours, whichever reads."""
    if seconds <= 300:
        return nice_ticks(seconds), "s"
    if seconds <= 3 * 3600:
        return [t * 60 for t in nice_ticks(seconds / 60)], "min"
    return [t * 3600 for t in nice_ticks(seconds / 3600)], "h"


def time_label(t: float, unit: str) -> str:
    value = t / {"s": 1, "min": 60, "h": 3600}[unit]
    return f"{value:g}"


class Frame:
    """An SVG plot area: ``width`` x ``height`` pixels inside margins, x from 0 to ``x_max``,
    y from 0 to ``y_max`` (upwards) - or rows (``y_max`` as a row count, downwards)."""

    def __init__(self, *, width: int, height: int, x_max: float, y_max: float,
                 left: int = 60, right: int = 16, top: int = 12, bottom: int = 34) -> None:
        self.width, self.height = width, height
        self.left, self.right, self.top, self.bottom = left, right, top, bottom
        self.x_max = x_max if x_max > 0 else 1.0
        self.y_max = y_max if y_max > 0 else 1.0
        self.parts: list[str] = []

    @property
    def inner_w(self) -> float:
        return self.width - self.left - self.right

    @property
    def inner_h(self) -> float:
        return self.height - self.top - self.bottom

    def x(self, value: float) -> float:
        return self.left + self.inner_w * value / self.x_max

    def y(self, value: float) -> float:
        return self.top + self.inner_h * (1 - value / self.y_max)

    def row_y(self, row: float) -> float:
        return self.top + self.inner_h * row / self.y_max

    def add(self, part: str) -> None:
        self.parts.append(part)

    def time_axis(self, label: str = "time") -> None:
        ticks, unit = time_ticks(self.x_max)
        base = self.top + self.inner_h
        out = [f'<g class="axis"><line x1="{self.left}" y1="{base:.1f}" '
               f'x2="{self.left + self.inner_w:.1f}" y2="{base:.1f}"/>']
        for t in ticks:
            if t > self.x_max * 1.0001:
                continue
            x = self.x(t)
            out.append(f'<line x1="{x:.1f}" y1="{self.top}" x2="{x:.1f}" y2="{base:.1f}" '
                       f'stroke="{COLORS["grid"]}"/>')
            out.append(f'<text x="{x:.1f}" y="{base + 14:.1f}" text-anchor="middle">'
                       f'{time_label(t, unit)}</text>')
        out.append(f'<text x="{self.left + self.inner_w / 2:.1f}" y="{self.height - 4}" '
                   f'text-anchor="middle">{esc(label)} ({unit})</text></g>')
        self.parts.insert(0, "".join(out))

    def value_axis(self, ticks: Sequence[float], fmt: str, label: str) -> None:
        out = ['<g class="axis">']
        for v in ticks:
            y = self.y(v)
            out.append(f'<line x1="{self.left}" y1="{y:.1f}" x2="{self.left + self.inner_w:.1f}" '
                       f'y2="{y:.1f}" stroke="{COLORS["grid"]}"/>')
            out.append(f'<text x="{self.left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                       f'{fmt.format(v)}</text>')
        out.append(f'<text transform="translate(12 {self.top + self.inner_h / 2:.1f}) '
                   f'rotate(-90)" text-anchor="middle">{esc(label)}</text></g>')
        self.parts.insert(0, "".join(out))

    def svg(self, label: str) -> str:
        return (f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{esc(label)}" '
                f'viewBox="0 0 {self.width} {self.height}" width="{self.width}" '
                f'height="{self.height}">{"".join(self.parts)}</svg>')


def write_page(path: Path, text: str) -> Path:
    """Atomically (a half-written page is never what a browser opens)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
