"""Rows as text and as HTML: the one table helper behind the results' ``__str__`` and
``_repr_html_`` (a benchmark, an HLO report and its diff, the hardware table and a chip's
row, a plan of collectives, a parity report, a systolic run).

A row is a sequence of cells; a cell is shown as ``str(cell)``, escaped in HTML unless it
is :class:`Html` (a cell that is markup already, such as a coloured verdict).

>>> rows = [("FLOPs", "2,048"), ("device", "cpu")]
>>> print(text(rows))
FLOPs   2,048
device  cpu
>>> html(rows[:1], labels=True, align_left=True)
"<table><tr><th style='text-align:left'>FLOPs</th><td style='text-align:left'>2,048</td></tr></table>"
>>> print(text([("a", "1"), ("bb", "22")], header=("", "x"), right=True))
     x
a    1
bb  22
"""

from __future__ import annotations

import html as _html
from typing import Any, Sequence


class Html(str):
    """A cell (or a caption) that is HTML already: :func:`html` does not escape it."""


def text(rows: Sequence[Sequence[Any]], header: Sequence[Any] | None = None, *,
         right: bool = False, min_width: int = 0) -> str:
    """Aligned columns two spaces apart, one line per row (``header`` first).

    The first column is left-aligned; the others too, or right-aligned (numbers) with
    ``right=True``, each at least ``min_width`` wide. Trailing spaces are dropped.
    """
    table = [[str(c) for c in r] for r in ([header] if header is not None else []) + list(rows)]
    if not table:
        return ""
    widths = [max(len(r[i]) for r in table if i < len(r)) for i in range(max(map(len, table)))]
    widths = [w if i == 0 else max(w, min_width) for i, w in enumerate(widths)]
    return "\n".join(
        "  ".join(c.ljust(w) if i == 0 or not right else c.rjust(w)
                  for i, (c, w) in enumerate(zip(r, widths))).rstrip()
        for r in table)


def _cell(cell: Any) -> str:
    return cell if isinstance(cell, Html) else _html.escape(str(cell))


def html(rows: Sequence[Sequence[Any]], header: Sequence[Any] | None = None, *,
         labels: bool = False, align_left: bool = False) -> str:
    """An HTML ``<table>``: a ``header`` row of ``<th>`` if given, then one row per row.

    ``labels=True`` makes each row's first cell its label (a left-aligned ``<th>``);
    ``align_left=True`` left-aligns the other cells (text rather than numbers).
    """
    td = "<td style='text-align:left'>" if align_left else "<td>"
    head = ("<tr>" + "".join(f"<th>{_cell(c)}</th>" for c in header) + "</tr>"
            if header is not None else "")
    body = []
    for row in rows:
        cells = [f"<th style='text-align:left'>{_cell(row[0])}</th>" if labels
                 else f"{td}{_cell(row[0])}</td>"] if row else []
        cells += [f"{td}{_cell(c)}</td>" for c in row[1:]]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table>{head}{''.join(body)}</table>"
