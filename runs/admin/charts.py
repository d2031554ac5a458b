"""Server-rendered SVG charts for the operations dashboard: no JavaScript, no CDN.

Each function returns a complete <svg> (safe HTML) with `data-chart` naming it and a
<title> on every mark, so a hover shows the exact number. Labels are escaped here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT = 560, 190
LEFT, RIGHT, TOP, BOTTOM = 44, 10, 10, 40
AXIS = "#8a949e"
# Distinct colours for partition owners (colour-blind friendly order), cycled.
NODE_COLORS = ("#1f6feb", "#2da44e", "#d29922", "#8250df", "#bf3989", "#0a7ea4", "#9a6700", "#57606a")


def _svg(
    chart: str, body: list[str], *, height: int = HEIGHT, width: int = WIDTH, extra: str = ""
) -> SafeString:
    return mark_safe(
        f'<svg class="cy-chart" data-chart="{chart}" {extra} viewBox="0 0 {width} {height}" '
        f'width="100%" role="img" xmlns="http://www.w3.org/2000/svg">{"".join(body)}</svg>'
    )


def _legend(items: Sequence[tuple[str, str]], *, y: float) -> list[str]:
    out, x = [], LEFT
    for name, color in items:
        out.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{x + 14}" y="{y}" font-size="11" fill="currentColor">{escape(name)}</text>')
        x += 24 + 7 * len(name)
    return out


def _frame(
    top_value: float,
    unit: str,
    labels: Sequence[tuple[float, str]],
    *,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> list[str]:
    plot_bottom = height - BOTTOM
    out = [
        f'<line x1="{LEFT}" y1="{plot_bottom}" x2="{width - RIGHT}" y2="{plot_bottom}" stroke="{AXIS}"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{plot_bottom}" stroke="{AXIS}"/>',
        f'<text x="{LEFT - 4}" y="{TOP + 9}" font-size="10" text-anchor="end" fill="currentColor">'
        f"{_short(top_value)}{unit}</text>",
        f'<text x="{LEFT - 4}" y="{plot_bottom}" font-size="10" text-anchor="end" '
        'fill="currentColor">0</text>',
    ]
    for x, text in labels:
        out.append(
            f'<text x="{x:.1f}" y="{plot_bottom + 13}" font-size="10" text-anchor="middle" '
            f'fill="currentColor">{escape(text)}</text>'
        )
    return out


def _short(value: float) -> str:
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def _time_labels(buckets: Sequence[datetime], slot: float) -> list[tuple[float, str]]:
    step = max(1, len(buckets) // 6)
    return [(LEFT + (i + 0.5) * slot, b.strftime("%H:%M")) for i, b in enumerate(buckets) if i % step == 0]


def stacked_bars(
    *, chart: str, buckets: Sequence[datetime], series: Sequence[tuple[str, str, Sequence[int]]]
) -> SafeString:
    """One bar per bucket, stacked by series (name, colour, values per bucket)."""
    totals = [sum(values[i] for _, _, values in series) for i in range(len(buckets))]
    top = max(totals, default=0) or 1
    slot = (WIDTH - LEFT - RIGHT) / max(1, len(buckets))
    scale = (HEIGHT - TOP - BOTTOM) / top
    body = _frame(top, "", _time_labels(buckets, slot))
    for i, bucket in enumerate(buckets):
        y = HEIGHT - BOTTOM
        for name, color, values in series:
            n = values[i]
            if not n:
                continue
            h = n * scale
            y -= h
            body.append(
                f'<rect x="{LEFT + i * slot + 0.5:.1f}" y="{y:.1f}" width="{max(1.0, slot - 1):.1f}" '
                f'height="{h:.1f}" fill="{color}" data-series="{escape(name)}" data-value="{n}">'
                f"<title>{bucket:%H:%M} UTC: {n} {escape(name)}</title></rect>"
            )
    body += _legend([(name, color) for name, color, _ in series], y=HEIGHT - 6)
    return _svg(chart, body, extra=f'data-total="{sum(totals)}"')


def lines(
    *,
    chart: str,
    buckets: Sequence[datetime],
    series: Sequence[tuple[str, str, Sequence[float | None]]],
    unit: str = "s",
) -> SafeString:
    """One polyline per series; a None value breaks the line (no data in that bucket)."""
    values = [v for _, _, vs in series for v in vs if v is not None]
    top = max(values, default=0) or 1
    slot = (WIDTH - LEFT - RIGHT) / max(1, len(buckets))
    scale = (HEIGHT - TOP - BOTTOM) / top
    body = _frame(top, unit, _time_labels(buckets, slot))
    for name, color, vs in series:
        points = []
        for i, v in enumerate(vs):
            if v is None:
                continue
            x, y = LEFT + (i + 0.5) * slot, HEIGHT - BOTTOM - v * scale
            points.append(f"{x:.1f},{y:.1f}")
            body.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{color}" data-series="{escape(name)}" '
                f'data-value="{v:.3f}"><title>{buckets[i]:%H:%M} UTC: {escape(name)} {v:.2f}{unit}'
                "</title></circle>"
            )
        if len(points) > 1:
            body.append(
                f'<polyline points="{" ".join(points)}" fill="none" stroke="{color}" stroke-width="1.5"/>'
            )
    body += _legend([(name, color) for name, color, _ in series], y=HEIGHT - 6)
    return _svg(chart, body, extra=f'data-points="{len(values)}"')


def horizontal_stacks(
    *, chart: str, rows: Sequence[tuple[str, Sequence[tuple[str, str, int]]]]
) -> SafeString:
    """One horizontal stacked bar per row (label, [(series, colour, value)])."""
    bar, gap = 18, 6
    height = TOP + len(rows) * (bar + gap) + 30
    top = max((sum(v for _, _, v in parts) for _, parts in rows), default=0) or 1
    scale = (WIDTH - LEFT - RIGHT - 40) / top
    body = []
    for r, (label, parts) in enumerate(rows):
        y = TOP + r * (bar + gap)
        body.append(
            f'<text x="{LEFT - 6}" y="{y + 13}" font-size="11" text-anchor="end" fill="currentColor">'
            f"{escape(label)}</text>"
        )
        x = float(LEFT)
        for name, color, n in parts:
            if not n:
                continue
            w = n * scale
            body.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar}" fill="{color}" '
                f'data-series="{escape(name)}" data-value="{n}"><title>{escape(label)}: {n} {escape(name)}'
                "</title></rect>"
            )
            x += w
        total = sum(v for _, _, v in parts)
        body.append(f'<text x="{x + 4:.1f}" y="{y + 13}" font-size="11" fill="currentColor">{total}</text>')
    seen = {name: color for _, parts in rows for name, color, _ in parts}
    body += _legend(list(seen.items()), y=height - 6)
    return _svg(chart, body, height=height)


def gauge(*, chart: str, value: float, warn: float, unit: str = "s") -> SafeString:
    """A bar from 0 to max(2 x warn, value), red past `warn`, with the warn mark drawn."""
    height = 46
    top = max(2 * warn, value) or 1
    span = WIDTH - LEFT - RIGHT
    w = span * value / top
    color = "#cf222e" if value > warn else "#2da44e"
    mark = LEFT + span * warn / top
    body = [
        f'<rect x="{LEFT}" y="8" width="{span}" height="16" fill="none" stroke="{AXIS}"/>',
        f'<rect x="{LEFT}" y="8" width="{w:.1f}" height="16" fill="{color}" data-value="{value:.1f}">'
        f"<title>oldest due job: {value:.1f}{unit} late</title></rect>",
        f'<line x1="{mark:.1f}" y1="4" x2="{mark:.1f}" y2="28" stroke="currentColor" '
        'stroke-dasharray="3,2"/>',
        f'<text x="{mark:.1f}" y="40" font-size="10" text-anchor="middle" fill="currentColor">'
        f"alert {_short(warn)}{unit}</text>",
        f'<text x="{LEFT - 4}" y="20" font-size="10" text-anchor="end" fill="currentColor">0</text>',
    ]
    return _svg(chart, body, height=height)


def partition_map(*, owners: Sequence[str | None], colors: dict[str, str]) -> SafeString:
    """Every partition as a cell coloured by the live node holding it; grey = unowned."""
    cols = 32
    cell = (WIDTH - LEFT - RIGHT) / cols
    rows = (len(owners) + cols - 1) // cols
    height = int(TOP + rows * cell + 26)
    body = []
    for p, owner in enumerate(owners):
        x, y = LEFT + (p % cols) * cell, TOP + (p // cols) * cell
        fill = colors.get(owner, "#d0d7de") if owner else "#d0d7de"
        body.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{cell - 1:.1f}" height="{cell - 1:.1f}" fill="{fill}" '
            f'data-partition="{p}" data-owner="{escape(owner or "")}"><title>partition {p}: '
            f"{escape(owner or 'unowned')}</title></rect>"
        )
    body += _legend([*colors.items(), ("unowned", "#d0d7de")], y=height - 6)
    return _svg("partitions", body, height=height)


# The forecast spans the dashboard's width: a day of minutes needs it.
FORECAST_WIDTH, FORECAST_HEIGHT = 1120, 210
BAR, SPIKE = "#1f6feb", "#cf222e"


def forecast_bars(
    *,
    chart: str,
    start: datetime,
    step_seconds: int,
    counts: Sequence[int],
    spikes: Sequence[tuple[int, int, str]],
) -> SafeString:
    """Due runs per step (a day of minutes: 1,440 bars, drawn as two paths) with every
    step holding a spike's count in red, and each spike (index of its first step, count,
    label) ranked above that step with the label on hover."""
    width, height = FORECAST_WIDTH, FORECAST_HEIGHT
    top = max(counts, default=0) or 1
    slot = (width - LEFT - RIGHT) / max(1, len(counts))
    bottom = height - BOTTOM
    scale = (height - TOP - BOTTOM - 14) / top  # room above the tallest bar for its rank
    step = timedelta(seconds=step_seconds)
    buckets = [start + i * step for i in range(len(counts))]
    body = _frame(top, "", _time_labels(buckets, slot), width=width, height=height)
    red = {n for _, n, _ in spikes}
    for color, wanted in ((BAR, False), (SPIKE, True)):
        path = "".join(
            f"M{LEFT + (i + 0.5) * slot:.1f} {bottom}V{bottom - n * scale:.1f}"
            for i, n in enumerate(counts)
            if n and (n in red) == wanted
        )
        if path:
            body.append(
                f'<path d="{path}" stroke="{color}" stroke-width="{max(1.0, slot * 0.8):.2f}" fill="none"/>'
            )
    for rank, (index, n, label) in enumerate(spikes, 1):
        x, y = LEFT + index * slot, bottom - n * scale
        w = max(2.0, slot)
        body.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{n * scale:.1f}" fill="{SPIKE}" '
            f'data-spike="{rank}" data-index="{index}" data-value="{n}"><title>{escape(label)}</title></rect>'
            f'<text x="{x + w / 2:.1f}" y="{y - 3:.1f}" font-size="10" text-anchor="middle" fill="{SPIKE}">'
            f"{rank}</text>"
        )
    body += _legend(
        [("due runs per minute", BAR), ("a spike's count (rank at its first minute)", SPIKE)], y=height - 6
    )
    return _svg(
        chart,
        body,
        width=width,
        height=height,
        extra=f'data-total="{sum(counts)}" data-steps="{len(counts)}"',
    )
