"""The incident report's charts as inline SVG: drawn here, so the HTML needs no script and fetches nothing."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import pandas as pd

# The dashboard's palette order (ui/charts.py), repeated here: the core imports nothing from ui/.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#56B4E9", "#CC79A7", "#F0E442", "#7F7F7F", "#000000")
ALARM = "#D62728"
GOOD = "#4C78A8"
_FONT = 'font-family="system-ui,sans-serif" font-size="11"'


def _e(text: Any) -> str:
    return html.escape(str(text))


def _frame(width: int, height: int, title: str, body: list[str]) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(title)}">'
            f'<text x="4" y="14" {_FONT} font-weight="bold">{_e(title)}</text>' + "".join(body) + "</svg>")


def bars_svg(frame: pd.DataFrame, title: str, span: tuple[Any, Any] | None = None, width: int = 620,
             height: int = 260) -> str:
    """Stacked bars of `wrong` per `bucket`, one colour per `consumer`, placed in time across `span` (the log's
    first and last request), so the quiet stretch after the fix shows as what it is."""
    if frame.empty:
        return _frame(width, 40, title, [f'<text x="4" y="32" {_FONT}>No wrong output received.</text>'])
    pivot = frame.pivot_table(index="bucket", columns="consumer", values="wrong", aggfunc="sum", fill_value=0)
    pivot = pivot.sort_index()
    consumers = list(pivot.columns)
    stamps = [pd.Timestamp(b) for b in pivot.index]
    gaps = [b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True)]
    bucket = min(gaps) if gaps else pd.Timedelta(minutes=1)
    first = min(stamps[0], pd.Timestamp(span[0])) if span and span[0] is not None else stamps[0]
    last = max(stamps[-1] + bucket, pd.Timestamp(span[1])) if span and span[1] is not None else stamps[-1] + bucket
    left, top, bottom, legend_w = 40, 24, 36, 140
    plot_w, plot_h = width - left - legend_w - 10, height - top - bottom
    total = (last - first) / pd.Timedelta(seconds=1) or 1.0

    def x_of(ts: pd.Timestamp) -> float:
        return left + (ts - first) / pd.Timedelta(seconds=1) / total * plot_w

    peak = max(int(pivot.sum(axis=1).max()), 1)
    bar_w = max(bucket / pd.Timedelta(seconds=1) / total * plot_w - 0.5, 1.0)
    body = [f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#888"/>',
            f'<text x="{left - 4}" y="{top + 8}" text-anchor="end" {_FONT}>{peak}</text>',
            f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end" {_FONT}>0</text>']
    for stamp, (_, row) in zip(stamps, pivot.iterrows(), strict=True):
        y = top + plot_h
        for j, consumer in enumerate(consumers):
            h = row[consumer] / peak * plot_h
            if h > 0:
                y -= h
                body.append(f'<rect x="{x_of(stamp):.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                            f'fill="{PALETTE[j % len(PALETTE)]}"><title>{_e(consumer or "(none)")} '
                            f'{_e(stamp.strftime("%H:%M"))}: {int(row[consumer])}</title></rect>')
    for tick in (first, first + (last - first) / 2, last):
        body.append(f'<text x="{x_of(tick):.1f}" y="{top + plot_h + 14}" text-anchor="middle" {_FONT}>'
                    f'{_e(tick.strftime("%m-%d %H:%M"))}</text>')
    body.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 4}" text-anchor="middle" {_FONT}>time (UTC)</text>')
    for j, consumer in enumerate(consumers):
        y = top + 6 + j * 16
        body.append(f'<rect x="{width - legend_w}" y="{y}" width="10" height="10" fill="{PALETTE[j % len(PALETTE)]}"/>'
                    f'<text x="{width - legend_w + 14}" y="{y + 9}" {_FONT}>{_e(consumer or "(none)")}</text>')
    return _frame(width, height, title, body)


def heatmap_svg(cells: Sequence[Any], title: str, size: int = 56) -> str:
    """A grid of hits per (arm, served_from): rows the receiving arm, columns the arm whose output it was."""
    if not cells:
        return _frame(360, 40, title, [f'<text x="4" y="32" {_FONT}>No arm received another\'s output.</text>'])
    rows = sorted({c.arm for c in cells}, key=lambda a: (a == "", a))
    cols = sorted({c.served_from for c in cells}, key=lambda a: (a == "", a))
    hits = {(c.arm, c.served_from): c.hits for c in cells}
    peak = max(hits.values())
    left, top = 90, 44
    width, height = max(left + size * len(cols) + 20, 360), top + size * len(rows) + 34
    body = [f'<text x="{left + size * len(cols) / 2:.0f}" y="{top - 18}" text-anchor="middle" {_FONT}>served from</text>']
    for j, col in enumerate(cols):
        body.append(f'<text x="{left + j * size + size / 2:.0f}" y="{top - 4}" text-anchor="middle" {_FONT}>'
                    f'{_e(col or "(none)")}</text>')
    for i, row in enumerate(rows):
        body.append(f'<text x="{left - 6}" y="{top + i * size + size / 2 + 4:.0f}" text-anchor="end" {_FONT}>'
                    f'{_e(row or "(none)")}</text>')
        for j, col in enumerate(cols):
            n = hits.get((row, col), 0)
            shade = n / peak if peak else 0
            fill = f"rgba(192,57,43,{0.08 + 0.85 * shade:.2f})" if n else "#f6f8fa"
            ink = "#fff" if shade > 0.55 else "#1f2328"
            body.append(f'<rect x="{left + j * size}" y="{top + i * size}" width="{size - 2}" height="{size - 2}" '
                        f'fill="{fill}"/><text x="{left + j * size + size / 2 - 1:.0f}" '
                        f'y="{top + i * size + size / 2 + 4:.0f}" text-anchor="middle" fill="{ink}" {_FONT}>{n}</text>')
    body.append(f'<text x="4" y="{height - 8}" {_FONT}>rows: the arm that requested</text>')
    return _frame(width, height, title, body)


def paired_bars_svg(arms: Sequence[Any], title: str, width: int = 620) -> str:
    """Each arm's mean latency over all rows beside its clean rows' (without its contaminated hits)."""
    shown = [a for a in arms if a.mean_latency_ms.all is not None]
    if not shown:
        return _frame(width, 40, title, [f'<text x="4" y="32" {_FONT}>No latency logged.</text>'])
    peak = max(max(a.mean_latency_ms.all or 0, a.mean_latency_ms.clean or 0) for a in shown) or 1
    left, top, bar_h = 90, 28, 14
    body = []
    for i, a in enumerate(shown):
        y = top + i * (2 * bar_h + 14)
        body.append(f'<text x="{left - 6}" y="{y + bar_h + 4}" text-anchor="end" {_FONT}>{_e(a.arm or "(none)")}</text>')
        for k, (label, value, colour) in enumerate((("all", a.mean_latency_ms.all, ALARM),
                                                    ("clean", a.mean_latency_ms.clean, GOOD))):
            if value is None:
                continue
            w = value / peak * (width - left - 140)
            body.append(f'<rect x="{left}" y="{y + k * bar_h}" width="{w:.1f}" height="{bar_h - 2}" fill="{colour}"/>'
                        f'<text x="{left + w + 4:.1f}" y="{y + k * bar_h + bar_h - 4}" {_FONT}>{label} {value:,.1f}</text>')
    return _frame(width, top + len(shown) * (2 * bar_h + 14) + 6, title, body)
