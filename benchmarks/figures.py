"""What the benchmark scripts share: percentiles and the markdown tables they print for the README."""

from __future__ import annotations


def pct(values, p: float) -> float:
    """The p-th percentile by nearest rank (NaN for no values)."""
    values = sorted(values)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def markdown_table(header: tuple[str, ...], rows) -> list[str]:
    """Rows of cells as markdown table lines."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
