"""Slide decks from the chapters: one self-contained reveal.js deck per chapter.

Which cells a deck shows, and where slides begin, is cell metadata
(``slideshow.slide_type``: ``slide``, ``subslide``, ``fragment``, ``-`` for "on the
previous slide", ``skip``, ``notes``), the standard Jupyter convention that nbconvert's
slides exporter reads. Authors set it in the ``.py`` twin's cell header, so it survives
rebuilds::

    # %% [markdown] slideshow={"slide_type": "slide"}
    # %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}

then ``python -m tools.notebooks sync`` copies it into the ``.ipynb`` without
re-executing (``check`` flags drift). A code cell tagged ``slide-output-only`` shows its
output without its code; the setup cell (tagged ``course-setup``) is left out, and a
progress bar shows its last state, as on the website (``docs/_ext/course_site.py``).

Speaker notes come from the chapter's prose (:func:`add_speaker_notes`): the markdown
cells a deck skips become the notes of a slide, those just before a code slide that
slide's (the prose that introduces the code), the others the notes of the slide they
follow. Presenting: "next" (the right arrow, space, the on-screen ">") visits every
slide in order, vertical ones included (reveal.js's linear navigation); ``s`` opens the
speaker view with the notes. A slide whose content is taller or wider than the slide is
scaled down to fit when it is shown (the deck's script; code is never wrapped), so
nothing on a slide scrolls or is cut. ``mark`` writes a first marking into a twin that has none
(titles and section headings start slides, figures and tables get their own, the rest
is skipped), to be edited by hand.

Command line (from the repository root)::

    python -m tools.slides build [--out build/slides]     # every chapter's deck
    python -m tools.slides mark notebooks/07_x.py         # a first marking, then edit

reveal.js comes from the ``sphinx-revealjs`` package and MathJax from
``sphinx-mathjax-offline`` (both in the ``docs`` extra): they are copied beside the
decks into ``_assets/``, so the folder opens from a USB stick with no network.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import re
import shutil
import sys
from typing import Any

from tools import SETUP_TAG  # the setup cell: never on a slide
from tpu_course.checks.worker import skip_uri_grammar

ROOT = pathlib.Path(__file__).resolve().parent.parent
TEMPLATE_DIR = pathlib.Path(__file__).resolve().parent / "slides_template"
OUTPUT_ONLY_TAG = "slide-output-only"
MIN_SLIDES, MAX_SLIDES = 15, 30
HOW_TO_MARK = (
    "mark its cells in the .py twin's headers, e.g. `# %% [markdown] "
    "slideshow={{\"slide_type\": \"slide\"}}` (a first marking: `python -m tools.slides mark "
    "{py}`), then `python -m tools.notebooks sync` (see CONTRIBUTING.md, Slides)")


def _package_dir(name: str, sub: str) -> pathlib.Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"the slides need the {name!r} package (reveal.js / MathJax files): "
                         "run `make setup` (the `docs` extra)")
    return pathlib.Path(list(spec.submodule_search_locations)[0]) / sub


def _course_site():
    """docs/_ext/course_site.py: the notebook preparations the website and decks share."""
    ext = ROOT / "docs" / "_ext"
    if str(ext) not in sys.path:
        sys.path.insert(0, str(ext))
    import course_site

    return course_site


def vendor_assets(target: pathlib.Path) -> None:
    """Copy reveal.js and MathJax from their Python packages into ``target``."""
    reveal = _package_dir("sphinx_revealjs", "_static/revealjs")
    mathjax = _package_dir("sphinx-mathjax-offline", "static/mathjax")
    for src, name in ((reveal, "reveal.js"), (mathjax, "mathjax")):
        dest = target / name
        if not dest.exists():
            shutil.copytree(src, dest, ignore=shutil.ignore_patterns("*.map", "*.esm.js"))


def slide_count(nb: Any) -> int:
    """How many slides (horizontal and vertical) the deck of ``nb`` has."""
    return sum(1 for c in nb.cells
               if c.get("metadata", {}).get("slideshow", {}).get("slide_type") in ("slide", "subslide"))


def is_marked(nb: Any) -> bool:
    return any("slideshow" in c.get("metadata", {}) for c in nb.cells)


def _slide_type(cell: Any) -> str:
    return cell.get("metadata", {}).get("slideshow", {}).get("slide_type", "-")


def add_speaker_notes(nb: Any) -> int:
    """Turn the prose a deck skips into speaker notes, in place; returns how many slides
    got notes. Each run of skipped markdown cells goes to the next slide when that slide
    starts with a code cell (the prose introducing the code), otherwise to the slide it
    follows; a code slide with no skipped prose before it gets the markdown cell above
    it, without its heading. Headings in notes become bold text (the speaker view is not an outline)."""
    import nbformat

    def notes_cell(texts: list[str]) -> Any:
        text = "\n\n".join(re.sub(r"^#{1,6}\s+(.*)$", r"**\1**", t, flags=re.MULTILINE)
                            for t in texts)
        return nbformat.v4.new_markdown_cell(text, metadata={"slideshow": {"slide_type": "notes"}})

    slides: list[list[Any]] = []  # each slide's cells (the first: its start), plus notes
    notes: list[list[str]] = []
    before: list[Any] = []        # cells before the first slide
    pending: list[str] = []
    last_prose = ""               # the last markdown cell, shown or not
    nb.cells = [c for c in nb.cells if SETUP_TAG not in c.get("metadata", {}).get("tags", [])]
    for cell in nb.cells:
        kind = _slide_type(cell)
        if cell.cell_type == "markdown" and cell.source.strip():
            last_prose = cell.source.strip()
        if kind == "skip" and cell.cell_type == "markdown":
            if cell.source.strip():
                pending.append(cell.source.strip())
            continue
        if kind in ("slide", "subslide"):
            if pending and slides and cell.cell_type != "code":
                notes[-1] += pending
                pending = []
            if cell.cell_type == "code" and not pending and last_prose:
                # a code slide right under the prose that sets it up (shown on the
                # slide before): that prose, without its heading, is what to say here
                body = re.sub(r"^#{1,6}\s+.*$", "", last_prose, flags=re.MULTILINE).strip()
                pending = [body] if body else []
            slides.append([cell])
            notes.append(pending)
            pending = []
        elif slides:
            slides[-1].append(cell)
        else:
            before.append(cell)
    if pending and slides:
        notes[-1] += pending
    cells = list(before)
    for group, texts in zip(slides, notes):
        cells += group
        if texts:
            cells.append(notes_cell(texts))
    nb.cells = cells
    return sum(1 for t in notes if t)


def build_deck(ipynb: pathlib.Path, out: pathlib.Path, assets: str = "_assets") -> pathlib.Path:
    """Write ``out/<stem>.slides.html`` from a marked notebook (outputs as committed);
    reveal.js and MathJax are loaded from ``assets`` (relative to the deck)."""
    import nbformat
    from nbconvert import SlidesExporter
    from nbconvert.preprocessors import TagRemovePreprocessor
    from traitlets.config import Config

    nb = nbformat.read(ipynb, as_version=4)
    site = _course_site()
    site.replace_widgets(nb)
    add_speaker_notes(nb)
    config = Config()
    # A widget cannot run without a kernel: show its static representation instead.
    config.NbConvertBase.display_data_priority = [
        "text/html", "text/markdown", "image/svg+xml", "text/latex", "image/png",
        "image/jpeg", "text/plain"]
    # reveal.js from _assets/ beside the deck; the "white" theme's fonts come with it
    # (nbconvert's default theme, "simple", imports its fonts from Google).
    config.SlidesExporter.reveal_url_prefix = f"{assets}/reveal.js"
    config.SlidesExporter.reveal_theme = "white"
    exporter = SlidesExporter(config=config, template_name="course_reveal",
                              extra_template_basedirs=[str(TEMPLATE_DIR)])
    exporter.register_preprocessor(
        TagRemovePreprocessor(remove_input_tags={OUTPUT_ONLY_TAG},
                              remove_cell_tags={SETUP_TAG}, enabled=True), enabled=True)
    exporter.exclude_input_prompt = True
    exporter.exclude_output_prompt = True
    body, _ = exporter.from_notebook_node(
        nb, resources={"metadata": {"name": ipynb.stem}, "course_assets": assets})
    deck = out / f"{ipynb.stem}.slides.html"
    deck.write_text(body, encoding="utf-8")
    return deck


def build_all(out: pathlib.Path, notebooks: list[pathlib.Path] | None = None,
              assets: str = "_assets", static: pathlib.Path | None = None) -> list[str]:
    """Every chapter's deck into ``out``; returns the problems (unmarked chapters).
    reveal.js and MathJax go to ``static`` (default ``out/_assets``), which the decks
    reach as ``assets`` (the website passes its own ``_static``, which has MathJax)."""
    import nbformat

    out.mkdir(parents=True, exist_ok=True)
    vendor_assets(static if static is not None else out / assets)
    problems = []
    for ipynb in notebooks or sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(ipynb, as_version=4)
        rel = ipynb.relative_to(ROOT) if ipynb.is_absolute() else ipynb
        if not is_marked(nb):
            problems.append(f"{rel} has no slide metadata, so no deck: "
                            + HOW_TO_MARK.format(py=rel.with_suffix('.py')))
            continue
        deck = build_deck(ipynb, out, assets)
        print(f"{deck.relative_to(ROOT) if deck.is_relative_to(ROOT) else deck}: "
              f"{slide_count(nb)} slides", flush=True)
    return problems


def first_marking(nb: Any) -> list[str]:
    """A first slide type for each cell: the title and section headings start slides,
    cells whose output is a figure or a table get their own, the first short code cell of
    each section a vertical one, the closing markdown cell (the takeaways) is kept,
    printed results fill a short deck up to ``MIN_SLIDES + 1``, everything else is
    skipped. Edit the result by hand."""
    kinds = []
    for i, cell in enumerate(nb.cells):
        src = cell.source.lstrip()
        data = {k for o in cell.get("outputs", []) for k in o.get("data", {})}
        if cell.cell_type == "markdown" and (i == 0 or re.match(r"#{1,3} ", src)):
            kinds.append("slide")
        elif cell.cell_type == "code" and data & {"image/png", "image/svg+xml", "text/html"}:
            kinds.append("slide")
        else:
            kinds.append("skip")
    last_md = max((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"), default=None)
    if last_md is not None and kinds[last_md] == "skip":
        kinds[last_md] = "slide"
    # Code where it teaches: under each section heading, its first short code cell (with
    # what it printed) as a vertical slide, while the deck stays within MAX_SLIDES.
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    heads = [i for i in range(len(kinds)) if kinds[i] == "slide"
             and nb.cells[i].cell_type == "markdown" and i > 0]
    for h in heads:
        if kinds.count("slide") + kinds.count("subslide") >= MAX_SLIDES:
            break
        nxt = next((i for i in code[1:] if i > h), None)
        if (nxt is not None and kinds[nxt] == "skip" and not any(kinds[j] == "slide" for j in range(h + 1, nxt))
                and len(nb.cells[nxt].source.splitlines()) <= 15):
            kinds[nxt] = "subslide"
    # Too few: code cells with printed results get slides too, spread over the chapter
    # (the first code cell, the setup cell, never).
    spare = [i for i in code[1:] if kinds[i] == "skip" and nb.cells[i].get("outputs")]
    missing = min(len(spare), MIN_SLIDES + 1 - kinds.count("slide") - kinds.count("subslide"))
    for k in range(max(0, missing)):
        kinds[spare[round(k * (len(spare) - 1) / max(1, missing - 1))]] = "slide"
    return kinds


def mark(py: pathlib.Path) -> int:
    """Write :func:`first_marking` into the headers of a ``.py`` twin without slide metadata."""
    import jupytext
    import nbformat

    from tools import notebooks

    ipynb = py.with_suffix(".ipynb")
    twin = jupytext.read(py)
    if is_marked(twin):
        raise SystemExit(f"{py} already has slide metadata: edit its cell headers instead")
    nb = twin
    if ipynb.exists():
        differs = notebooks.twin_in_sync(ipynb)
        if differs:
            raise SystemExit(f"{differs}: rebuild the notebook first")
        nb = nbformat.read(ipynb, as_version=4)
    for cell, kind in zip(twin.cells, first_marking(nb)):
        cell.metadata["slideshow"] = {"slide_type": kind}
    jupytext.write(twin, py, fmt="py:percent")
    count = slide_count(twin)
    print(f"{py}: {count} slides marked; aim for 15-30 (edit the headers), then "
          "`python -m tools.notebooks sync`")
    return count


def main(argv: list[str] | None = None) -> int:
    skip_uri_grammar()
    parser = argparse.ArgumentParser(prog="python -m tools.slides")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="one reveal.js deck per chapter")
    b.add_argument("--out", type=pathlib.Path, default=ROOT / "build" / "slides")
    b.add_argument("paths", nargs="*", type=pathlib.Path)
    m = sub.add_parser("mark", help="a first slide marking for a twin that has none")
    m.add_argument("paths", nargs="+", type=pathlib.Path)
    args = parser.parse_args(argv)
    if args.cmd == "mark":
        for p in args.paths:
            mark(p.with_suffix(".py"))
        return 0
    problems = build_all(args.out.resolve(), [p.with_suffix(".ipynb").resolve() for p in args.paths])
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
