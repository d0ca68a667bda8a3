"""Sphinx configuration of the course website (``make site``).

Sources are the committed notebooks (``notebooks/``, ``labs/``, ``solutions/``) with their
outputs, never executed here (nbval checks those outputs), plus the pages in ``docs/``.
Built with ``sphinx-build -c docs . build/site`` from the repository root. Nothing on a
page loads from the network: MathJax comes from the ``sphinx-mathjax-offline`` package,
the theme's fonts and icons are its own static files, widget managers and require.js are
switched off (widgets show their static fallback).
"""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import course_site  # noqa: E402  (docs/_ext/course_site.py)

from tpu_course import REPOSITORY  # noqa: E402
from tpu_course.checks.worker import skip_uri_grammar  # noqa: E402

skip_uri_grammar()  # before myst-nb imports nbformat

project = "tpu-course"
author = "the tpu-course authors"
copyright = "the tpu-course authors, Apache-2.0"
root_doc = "docs/index"
include_patterns = ["docs/**", "notebooks/*.ipynb", "labs/*.ipynb", "solutions/*.ipynb"]
exclude_patterns = ["build", "**/.ipynb_checkpoints", "docs/conf.py", "docs/_ext/**"]

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx-mathjax-offline",  # MathJax 3 copied into _static: no CDN
    "course_site",  # docs/_ext: setup cell hidden, widgets' last state, alt text, badges
]
course_repository = REPOSITORY

# --- notebooks: shown as committed, never executed -------------------------------------
nb_execution_mode = "off"
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3
# No widget manager (it and require.js come from a CDN): a widget shows its static
# fallback (its text/html or text/plain representation).
nb_ipywidgets_js = {}
nb_mime_priority_overrides = [
    ("html", "application/vnd.jupyter.widget-view+json", None),
    ("html", "application/vnd.jupyter.widget-state+json", None),
]

# --- API reference --------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": False}
autodoc_typehints = "description"
# A signature longer than a code line (88 characters, CONTRIBUTING) is written one
# parameter per line instead of running past the column (and widening a phone's page).
maximum_signature_line_length = 88
napoleon_use_ivar = True  # dataclass "Attributes:" sections as fields, not duplicate entries
# Optional heavy dependencies of a few modules are mocked when absent (torch: parity).
autodoc_mock_imports = ["torch"]

# --- theme ----------------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_title = "tpu-course"
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_js_files = ["course.js"]  # the sidebar toggles, search from file://
html_favicon = "_static/favicon.svg"  # without one the browser asks for /favicon.ico (a 404)
html_theme_options = {
    "repository_url": f"https://github.com/{REPOSITORY}",
    "repository_branch": "main",
    "path_to_docs": "",
    "use_repository_button": True,
    "launch_buttons": {"colab_url": "https://colab.research.google.com"},
    "show_toc_level": 2,
}
html_last_updated_fmt = None
html_context = {"default_mode": "light"}  # with none the theme logs a console error
html_copy_source = True
# A type hint ``bytes`` matches the standard type and a few ``.bytes`` attributes.
suppress_warnings = ["mystnb.unknown_mime_type", "ref.python"]


def kaggle_url(path: str) -> str:
    """Kaggle's "open a notebook from GitHub" address of a repository path."""
    return course_site.kaggle_url(REPOSITORY, path)


def colab_url(path: str) -> str:
    """Colab's "open a notebook from GitHub" address of a repository path."""
    return course_site.colab_url(REPOSITORY, path)


def _add_kaggle_button(app, pagename, templatename, context, doctree):
    """sphinx-book-theme launches Colab but has no Kaggle button: add a link beside it."""
    source = ROOT / f"{pagename}.ipynb"
    if not source.exists():
        return
    for group in context.get("header_buttons", []):
        if group.get("label") == "launch-buttons":
            group["buttons"].append({"type": "link", "text": "Kaggle",
                                     "tooltip": "Open in Kaggle", "icon": "fab fa-kaggle",
                                     "url": kaggle_url(f"{pagename}.ipynb")})


# One line per chapter for the landing page (what a learner comes away with).
CHAPTER_LINES = {
    1: "Build the matrix unit of a TPU in software and watch it multiply, cycle by cycle.",
    2: "Get a TPU (Colab, Kaggle, Cloud) and time a first JAX program against the chip's peak.",
    3: "JAX's ideas as a PyTorch user meets them: jit, grad, vmap, random keys, pytrees, parity.",
    4: "Read what jit produces (jaxpr, HLO), count FLOPs and bytes, and place it on a roofline.",
    5: "Train MNIST with Flax NNX and Optax, with an input pipeline that keeps the chip fed.",
    6: "Shard a model over a mesh of devices, and check XLA's collectives against a cost model.",
    7: "Write Pallas kernels for the MXU: grids, blocks, VMEM, a tiled matmul, a fused softmax.",
    8: "Train a byte-level transformer across 8 devices, profile it, survive a kill, serve it.",
}
NEEDS = {"accelerator": "a GPU or TPU", "tpu-chip": "a TPU chip",
         "tpu-compiler": "the TPU compiler (installed with the course; not on Colab's own stack)"}


def _minutes(total: int) -> str:
    return f"{total} min" if total < 90 else f"{total / 60:.1f} h"


def write_chapter_list() -> None:
    """The landing page's chapters (``build/site-gen/chapters.md``, included by
    docs/index.md): title, one line, time with the lab (the workshop data the
    instructors' agendas use), and links to the page, Colab, Kaggle, lab, solution and
    slides (the decks are built into the site, ``slides/``)."""
    import collections
    import json

    from tools import workshop

    blocks, _ = workshop.blocks_in_order(ROOT)
    minutes = collections.Counter()
    needs = collections.Counter()
    for b in blocks:
        minutes[(b.chapter, b.kind)] += b.minutes
        if b.kind == "exercise" and b.needs != "cpu":
            needs[b.needs] += 1
    lines = []
    for ipynb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        number = int(ipynb.name[:2])
        if number not in CHAPTER_LINES:
            raise RuntimeError(f"docs/conf.py: CHAPTER_LINES has no line for {ipynb.name}")
        cells = json.loads(ipynb.read_text(encoding="utf-8"))["cells"]
        title = next(("".join(c["source"]).split("\n")[0].lstrip("# ") for c in cells
                      if c["cell_type"] == "markdown"), ipynb.stem)
        path = f"notebooks/{ipynb.name}"
        links = [f"[Colab]({colab_url(path)})", f"[Kaggle]({kaggle_url(path)})"]
        for folder, name in (("labs", "lab"), ("solutions", "solution")):
            if (ROOT / folder / ipynb.name).exists():
                links.append(f"[{name}](/{folder}/{ipynb.name})")
        links.append(f'<a href="../slides/{ipynb.stem}.slides.html">slides</a>')
        chapter, lab = minutes[(number, "section")], minutes[(number, "exercise")]
        lines += [f"{number}. **[{title}](/{path})**  ",
                  f"   {CHAPTER_LINES[number]}  ",
                  f"   *About {_minutes(chapter + lab)}: chapter {chapter} min, lab {lab} min.* "
                  + " · ".join(links), ""]
    decks = ["The chapters' slide decks (open in the browser; `s` opens the speaker view "
             "with notes from the chapter's prose, the right arrow visits every slide):", ""]
    decks += [f'- <a href="../slides/{p.stem}.slides.html">{p.stem}.slides.html</a>'
              for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))]
    _write(ROOT / "build" / "site-gen" / "decks.md", "\n".join(decks) + "\n")
    total = sum(minutes.values())
    exercises = sum(1 for b in blocks if b.kind == "exercise")
    need_text = "; ".join(f"{n} need {NEEDS.get(k, k)}" for k, n in sorted(needs.items()))
    lines += [f"All seven, labs included: about {total / 60:.0f} hours ({total} min, from the "
              "minutes each section and exercise carries, the same data as the "
              "[workshop agendas](instructors.md)). "
              f"Of the {exercises} lab exercises, {need_text}; on other runtimes those are "
              "listed as skipped, the rest are graded anywhere, a CPU included.", ""]
    _write(ROOT / "build" / "site-gen" / "chapters.md", "\n".join(lines) + "\n")


def _write(out: pathlib.Path, text: str) -> None:
    """Write a generated page part, leaving it untouched (no rebuild) when unchanged."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists() or out.read_text(encoding="utf-8") != text:
        out.write_text(text, encoding="utf-8")


write_chapter_list()


def _build_decks(app, exception):
    """The chapters' slide decks, into the site's ``slides/`` (reveal.js and MathJax from
    the site's ``_static``), so the landing page and the instructors' page link them."""
    if exception is None and app.builder.format == "html":
        from tools import slides

        out = pathlib.Path(app.outdir)
        problems = slides.build_all(out / "slides", assets="../_static", static=out / "_static")
        if problems:
            raise RuntimeError("; ".join(problems))


def _root_redirect(app, exception):
    """The home page is docs/index.html; index.html at the site root points there."""
    if exception is None and app.builder.format == "html":
        (pathlib.Path(app.outdir) / "index.html").write_text(
            '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>tpu-course</title>'
            '<meta http-equiv="refresh" content="0; url=docs/index.html"></head>'
            '<body><a href="docs/index.html">tpu-course</a></body></html>\n', encoding="utf-8")


def _site_links(app, relative_path, parent_docname, content):
    """README's links to files that are pages here (INSTRUCTORS.md is docs/instructors)
    point at those pages when README is included into the home page."""
    if pathlib.Path(relative_path).name == "README.md":
        content[0] = content[0].replace("](INSTRUCTORS.md)", "](instructors.md)")


def setup(app):
    app.connect("include-read", _site_links)
    app.connect("build-finished", _root_redirect)
    app.connect("build-finished", _build_decks)
    app.connect("html-page-context", _add_kaggle_button, priority=502)
    # the handlers above keep no state between documents (sphinx-mathjax-offline does
    # not say whether it is parallel-safe, so make site builds serially)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
