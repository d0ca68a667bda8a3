"""The authoring side of the website and the slides: slide metadata travels from the
``.py`` twin into the ``.ipynb`` without re-executing, drift is reported, an unmarked
chapter is named with how to mark it, and the offline link check finds a broken link.
(The built site and decks themselves are tested in a browser: tests/test_site.py.)"""

from __future__ import annotations

import re
import shutil

import nbformat
import pytest

from tools import linkcheck, notebooks, slides

pytestmark = pytest.mark.stack_independent  # not rerun on the Colab line (pyproject.toml)

CHAPTER = "02_first_program"


@pytest.fixture
def course(tmp_path, monkeypatch):
    """A copy of one chapter (twin and notebook) in a throw-away repository root."""
    (tmp_path / "notebooks").mkdir()
    for suffix in (".ipynb", ".py"):
        shutil.copy(notebooks.ROOT / "notebooks" / f"{CHAPTER}{suffix}",
                    tmp_path / "notebooks" / f"{CHAPTER}{suffix}")
    monkeypatch.setattr(notebooks, "ROOT", tmp_path)
    monkeypatch.setattr(slides, "ROOT", tmp_path)
    return tmp_path / "notebooks"


def _set_header(py, index: int, slide_type: str) -> None:
    """Change the slide type of cell ``index`` in a twin, as an author edits its header."""
    import jupytext

    nb = jupytext.read(py)
    nb.cells[index].metadata["slideshow"] = {"slide_type": slide_type}
    jupytext.write(nb, py, fmt="py:percent")


def test_sync_copies_slide_metadata_without_touching_outputs(course):
    ipynb, py = course / f"{CHAPTER}.ipynb", course / f"{CHAPTER}.py"
    before = nbformat.read(ipynb, as_version=4)
    code = next(i for i, c in enumerate(before.cells) if c.cell_type == "code" and c.outputs)
    new = "fragment" if before.cells[code].metadata.get("slideshow", {}).get("slide_type") != "fragment" else "slide"
    _set_header(py, code, new)
    drift = notebooks.metadata_drift(ipynb)
    assert len(drift) == 1 and f"cell {code}" in drift[0] and "sync" in drift[0]
    assert notebooks.sync_cell_metadata() == []
    after = nbformat.read(ipynb, as_version=4)
    assert after.cells[code].metadata["slideshow"] == {"slide_type": new}
    assert after.cells[code].outputs == before.cells[code].outputs  # not re-executed
    assert notebooks.metadata_drift(ipynb) == []


def test_sync_skips_a_notebook_whose_cells_differ(course):
    py = course / f"{CHAPTER}.py"
    py.write_text(py.read_text() + "\n# %%\nprint('edited, not rebuilt')\n")
    skipped = notebooks.sync_cell_metadata()
    assert len(skipped) == 1 and "rebuild" in skipped[0]


def test_an_unmarked_chapter_is_named_with_how_to_mark_it(course, tmp_path):
    pytest.importorskip("sphinx_revealjs")
    ipynb = course / f"{CHAPTER}.ipynb"
    nb = nbformat.read(ipynb, as_version=4)
    for cell in nb.cells:
        cell.metadata.pop("slideshow", None)
    nbformat.write(nb, ipynb)
    problems = slides.build_all(tmp_path / "out", [ipynb])
    assert len(problems) == 1
    assert f"notebooks/{CHAPTER}.ipynb has no slide metadata" in problems[0]
    assert f"python -m tools.slides mark notebooks/{CHAPTER}.py" in problems[0]
    assert not list((tmp_path / "out").glob("*.slides.html"))


def test_first_marking_gives_a_deck_of_the_right_size(course):
    nb = nbformat.read(course / f"{CHAPTER}.ipynb", as_version=4)
    kinds = slides.first_marking(nb)
    assert kinds[0] == "slide"  # the title
    assert slides.MIN_SLIDES <= kinds.count("slide") + kinds.count("subslide") <= slides.MAX_SLIDES
    setup = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    assert kinds[setup] == "skip"


def test_every_chapter_is_marked_within_bounds():
    for ipynb in sorted((notebooks.ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(ipynb, as_version=4)
        if slides.is_marked(nb):
            assert slides.MIN_SLIDES <= slides.slide_count(nb) <= slides.MAX_SLIDES, ipynb.name


def test_linkcheck_finds_a_missing_page(tmp_path):
    (tmp_path / "a.html").write_text('<a href="b.html#x">b</a> <img src="img/c.png">'
                                     '<a href="https://example.org/">out</a><a href="#top">t</a>')
    (tmp_path / "b.html").write_text("<p>b</p>")
    assert linkcheck.broken_links(tmp_path) == ["a.html: img/c.png"]
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "c.png").write_bytes(b"\x89PNG")
    assert linkcheck.broken_links(tmp_path) == []


def _tiny_notebook(path):
    """A three-cell notebook: a title, a setup cell tagged course-setup, a progress bar."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {
        "box": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_a", "IPY_MODEL_b", "IPY_MODEL_c"]}},
        "a": {"model_name": "HTMLModel", "state": {"value": "epoch 1: 100%"}},
        "b": {"model_name": "FloatProgressModel", "state": {"value": 4.0, "min": 0.0, "max": 4.0}},
        "c": {"model_name": "HTMLModel", "state": {"value": " 4/4 [00:01&lt;00:00]"}}}}}
    setup = nbformat.v4.new_code_cell("print('SETUP CELL SOURCE')", metadata={"tags": ["course-setup"]})
    bar = nbformat.v4.new_code_cell("train()", outputs=[nbformat.v4.new_output(
        "display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "box"},
                              "text/plain": "epoch 1:   0%|          | 0/4"})])
    nb.cells = [nbformat.v4.new_markdown_cell("# A tiny chapter\n\nProse."), setup, bar]
    nbformat.write(nb, path)


def test_the_site_hides_the_setup_cell_and_shows_a_bars_last_state(tmp_path):
    """A tiny Sphinx build with the course's extension (docs/_ext/course_site.py)."""
    pytest.importorskip("myst_nb")
    from sphinx.application import Sphinx

    src = tmp_path / "src"
    (src / "notebooks").mkdir(parents=True)
    _tiny_notebook(src / "notebooks" / "01_tiny.ipynb")
    (src / "conf.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(notebooks.ROOT / 'docs' / '_ext')!r})\n"
        "extensions = ['myst_nb', 'course_site']\nnb_execution_mode = 'off'\n"
        "root_doc = 'notebooks/01_tiny'\nsuppress_warnings = ['mystnb.unknown_mime_type']\n")
    app = Sphinx(str(src), str(src), str(tmp_path / "out"), str(tmp_path / "doctrees"), "html",
                 status=None, warning=None, freshenv=True)
    app.build()
    page = (tmp_path / "out" / "notebooks" / "01_tiny.html").read_text()
    assert "A tiny chapter" in page and "train()" in page  # the other cells are there
    assert "SETUP CELL SOURCE" not in page
    assert "epoch 1: 100%|" + "\u2588" * 10 + "| 4/4 [00:01&lt;00:00]" in page
    assert "0/4" not in page
    assert "Open in Colab" in page and "Open in Kaggle" in page


def test_the_decks_hide_the_setup_cell_and_carry_notes(tmp_path):
    pytest.importorskip("sphinx_revealjs")
    ipynb = tmp_path / "01_tiny.ipynb"
    _tiny_notebook(ipynb)
    nb = nbformat.read(ipynb, as_version=4)
    nb.cells.insert(2, nbformat.v4.new_markdown_cell("Now we TRAIN the model, watch the bar."))
    for cell, kind in zip(nb.cells, ["slide", "skip", "skip", "slide"]):
        cell.metadata["slideshow"] = {"slide_type": kind}
    nb.cells[1].metadata["slideshow"] = {"slide_type": "slide"}  # even when marked, hidden
    nbformat.write(nb, ipynb)
    deck = slides.build_deck(ipynb, tmp_path).read_text()
    assert "SETUP CELL SOURCE" not in deck
    notes = re.findall(r'<aside class="notes">(.*?)</aside>', deck, re.S)
    assert any("Now we TRAIN the model" in n for n in notes), notes
    assert "navigationMode" in deck and '"linear"' in deck


def test_notes_go_to_the_code_slide_they_introduce():
    nb = nbformat.v4.new_notebook()
    kinds = [("markdown", "# Title", "slide"), ("markdown", "Intro prose.", "skip"),
             ("code", "x = 1", "subslide"), ("markdown", "After the code.", "skip"),
             ("markdown", "## Next", "slide")]
    for cell_type, source, kind in kinds:
        make = nbformat.v4.new_markdown_cell if cell_type == "markdown" else nbformat.v4.new_code_cell
        nb.cells.append(make(source, metadata={"slideshow": {"slide_type": kind}}))
    assert slides.add_speaker_notes(nb) == 1  # the code slide: before it, and after it
    notes = [(i, c.source) for i, c in enumerate(nb.cells)
             if c.metadata["slideshow"]["slide_type"] == "notes"]
    types = [c.metadata["slideshow"]["slide_type"] for c in nb.cells]
    assert types == ["slide", "subslide", "notes", "slide"]
    assert notes[0][1] == "Intro prose.\n\nAfter the code."
