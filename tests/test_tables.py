"""``tpu_course.tables``: rows as aligned text and as escaped HTML."""

from __future__ import annotations

from tpu_course import tables


def test_text_aligns_columns_and_right_aligns_numbers():
    rows = [("matmul", "2,048"), ("relu", "64")]
    assert tables.text(rows).split("\n") == ["matmul  2,048", "relu    64"]
    right = tables.text(rows, header=("op", "FLOPs"), right=True).split("\n")
    assert right == ["op      FLOPs", "matmul  2,048", "relu       64"]
    assert tables.text([]) == ""


def test_html_escapes_cells_unless_they_are_markup():
    out = tables.html([("<b>", tables.Html("<i>ok</i>"))], header=("a & b", "c"))
    assert "<th>a &amp; b</th>" in out and "<td>&lt;b&gt;</td>" in out
    assert "<td><i>ok</i></td>" in out
    labelled = tables.html([("x", "1")], labels=True)
    assert labelled.startswith("<table><tr><th") and "<td>1</td>" in labelled
