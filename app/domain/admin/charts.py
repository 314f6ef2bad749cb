"""Server-rendered SVG charts for the admin console: no chart library, no script.

Every piece of text that goes into the SVG is escaped, and the numbers are formatted by us, so the
result can be inlined in a page as markup without letting any data inject HTML.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from html import escape

WIDTH, HEIGHT = 640, 240
MARGIN_LEFT, MARGIN_BOTTOM, MARGIN_TOP, MARGIN_RIGHT = 48, 40, 16, 16

STATUS_COLOURS = {
    "completed": "#2e7d32",
    "length": "#f9a825",
    "cancelled": "#1565c0",
    "disconnected": "#6d4c41",
    "failed": "#c62828",
    "interrupted": "#8e24aa",
    "streaming": "#9e9e9e",
}
# Histograms are of timings, not of end states: a colour no end state uses.
HISTOGRAM_COLOUR = "#00838f"


def _svg(body: str, title: str, width: int = WIDTH) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {HEIGHT}" '
        f'role="img" aria-label="{escape(title)}" class="chart">'
        f"<title>{escape(title)}</title>"  # styled by static/css/admin.css (no inline style: CSP)
        f'<text x="{MARGIN_LEFT}" y="12" class="chart-title">{escape(title)}</text>{body}</svg>'
    )


def _empty(title: str, width: int = WIDTH) -> str:
    return _svg(
        f'<text x="{width / 2}" y="{HEIGHT / 2}" text-anchor="middle" class="chart-empty">'
        "no data yet</text>",
        title,
        width,
    )


def log_buckets(low_ms: float = 1.0, high_ms: float = 10_000.0, per_decade: int = 4) -> list[float]:
    """Bucket edges spaced evenly on a log scale: latencies span orders of magnitude."""
    decades = math.log10(high_ms / low_ms)
    count = int(decades * per_decade)
    return [low_ms * 10 ** (i / per_decade) for i in range(count + 1)]


def _time_ends(first: str, last: str, width: int) -> str:
    """The first and last time under a chart's x axis."""
    return (
        f'<text x="{MARGIN_LEFT}" y="{HEIGHT - 22}" class="tick">{escape(first)}</text>'
        f'<text x="{width - MARGIN_RIGHT}" y="{HEIGHT - 22}" text-anchor="end" class="tick">'
        f"{escape(last)}</text>"
    )


def _legend(entries: list[tuple[str, str]], spacing: int) -> str:
    """A swatch and a label per (label, colour), left to right under the chart."""
    parts = []
    for i, (label, colour) in enumerate(entries):
        x = MARGIN_LEFT + i * spacing
        parts.append(
            f'<rect x="{x}" y="{HEIGHT - 12}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{x + 14}" y="{HEIGHT - 3}" class="legend">{escape(label)}</text>'
        )
    return "".join(parts)


def _label_ms(value: float) -> str:
    """A duration as the pages write it (static/js/format.js `formatDuration`): "850 ms",
    "9.8 s", "2 min 5 s"."""
    if round(value) < 1000:
        return f"{round(value)} ms"
    tenths = round(value / 100)
    if tenths < 600:
        return f"{tenths / 10:.1f} s"
    seconds = round(value / 1000)
    return f"{seconds // 60} min {seconds % 60} s"


def histogram_svg(values_ms: Sequence[float], title: str, width: int = 420) -> str:
    """A histogram over log-spaced buckets, with the median and p99 marked."""
    values = sorted(v for v in values_ms if v is not None and v >= 0)
    if not values:
        return _empty(title, width)
    edges = log_buckets()
    counts = [0] * (len(edges) - 1)
    for v in values:
        i = max(0, min(len(counts) - 1, int(math.log10(max(v, edges[0]) / edges[0]) * 4)))
        counts[i] += 1
    peak = max(counts)
    plot_w = width - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
    bar_w = plot_w / len(counts)
    parts = []
    for i, count in enumerate(counts):
        if not count:
            continue
        h = plot_h * count / peak
        x = MARGIN_LEFT + i * bar_w
        y = MARGIN_TOP + plot_h - h
        label = f"{_label_ms(edges[i])}–{_label_ms(edges[i + 1])}: {count}"
        parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w - 1:.1f}" height="{h:.1f}" '
            f'fill="{HISTOGRAM_COLOUR}"><title>{escape(label)}</title></rect>'
        )
    for i in range(0, len(edges), 4):  # one tick per decade
        x = MARGIN_LEFT + i * bar_w
        parts.append(
            f'<text x="{x:.1f}" y="{HEIGHT - 22}" text-anchor="middle" class="tick">'
            f"{escape(_label_ms(edges[i]))}</text>"
        )
    p50 = values[len(values) // 2]
    p99 = values[min(len(values) - 1, int(0.99 * len(values)))]
    parts.append(
        f'<text x="{MARGIN_LEFT}" y="{HEIGHT - 4}" class="legend">'
        f"n={len(values)}  p50={escape(_label_ms(round(p50, 1)))}  "
        f"p99={escape(_label_ms(round(p99, 1)))}</text>"
    )
    parts.append(
        f'<line x1="{MARGIN_LEFT}" y1="{MARGIN_TOP + plot_h}" x2="{width - MARGIN_RIGHT}" '
        f'y2="{MARGIN_TOP + plot_h}" stroke="#555"/>'
    )
    return _svg("".join(parts), title, width)


def states_over_time_svg(
    counts: Sequence[tuple[datetime, str, int]], title: str, buckets: Sequence[datetime]
) -> str:
    """Stacked bars: replies per time bucket (every bucket shown, empty or not), by end state."""
    if not counts or not buckets:
        return _empty(title)
    by_bucket: dict[datetime, dict[str, int]] = {b: {} for b in buckets}
    for start, status, n in counts:
        if start in by_bucket:
            by_bucket[start][status] = by_bucket[start].get(status, 0) + n
    peak = max(1, max(sum(v.values()) for v in by_bucket.values()))
    width = WIDTH + 320
    plot_w = width - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
    bar_w = plot_w / len(buckets)
    parts = []
    for i, bucket in enumerate(buckets):
        x = MARGIN_LEFT + i * bar_w
        y = MARGIN_TOP + plot_h
        for status in STATUS_COLOURS:
            n = by_bucket[bucket].get(status, 0)
            if not n:
                continue
            h = plot_h * n / peak
            y -= h
            label = f"{bucket:%Y-%m-%d %H:%M} {status}: {n}"
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(1.0, bar_w - 2):.1f}" '
                f'height="{h:.1f}" fill="{STATUS_COLOURS[status]}"><title>{escape(label)}</title></rect>'
            )
    parts.append(_time_ends(f"{buckets[0]:%m-%d %H:%M}", f"{buckets[-1]:%m-%d %H:%M}", width))
    parts.append(_legend([(status, colour) for status, colour in STATUS_COLOURS.items()], 105))
    parts.append(
        f'<text x="{MARGIN_LEFT - 6}" y="{MARGIN_TOP + 10}" text-anchor="end" class="tick">{peak}</text>'
    )
    return _svg("".join(parts), title, width)


RATING_COLOURS = {"up": "#2e7d32", "down": "#c62828"}
RATING_LABELS = {"up": "thumbs up", "down": "thumbs down"}


def ratings_per_day_svg(
    counts: Sequence[tuple[datetime, str, int]], title: str, days: Sequence[datetime]
) -> str:
    """Paired bars per day: thumbs up and thumbs down given that day (every day shown)."""
    if not counts or not days:
        return _empty(title, 420)
    by_day: dict[datetime, dict[str, int]] = {d: {} for d in days}
    for day, rating, n in counts:
        if day in by_day:
            by_day[day][rating] = by_day[day].get(rating, 0) + n
    peak = max(1, max(max(v.values(), default=0) for v in by_day.values()))
    width = 420
    plot_w = width - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
    slot = plot_w / len(days)
    bar_w = max(1.0, slot / 2 - 1)
    parts = []
    for i, day in enumerate(days):
        for j, rating in enumerate(RATING_COLOURS):
            n = by_day[day].get(rating, 0)
            if not n:
                continue
            h = plot_h * n / peak
            x = MARGIN_LEFT + i * slot + j * (bar_w + 1)
            label = f"{day:%Y-%m-%d} {rating}: {n}"
            parts.append(
                f'<rect x="{x:.1f}" y="{MARGIN_TOP + plot_h - h:.1f}" width="{bar_w:.1f}" '
                f'height="{h:.1f}" fill="{RATING_COLOURS[rating]}"><title>{escape(label)}</title></rect>'
            )
    parts.append(_time_ends(f"{days[0]:%m-%d}", f"{days[-1]:%m-%d}", width))
    parts.append(
        f'<text x="{MARGIN_LEFT - 6}" y="{MARGIN_TOP + 10}" text-anchor="end" class="tick">{peak}</text>'
    )
    parts.append(_legend([(RATING_LABELS[r], colour) for r, colour in RATING_COLOURS.items()], 90))
    return _svg("".join(parts), title, width)
