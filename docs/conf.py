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

from tpu_course import REPOSITORY  # noqa: E402

project = "tpu-course"
author = "the tpu-course authors"
copyright = "the tpu-course authors, Apache-2.0"
root_doc = "docs/index"
include_patterns = ["docs/**", "notebooks/*.ipynb", "labs/*.ipynb", "solutions/*.ipynb"]
exclude_patterns = ["build", "**/.ipynb_checkpoints", "docs/conf.py"]

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx-mathjax-offline",  # MathJax 3 copied into _static: no CDN
]

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
napoleon_use_ivar = True  # dataclass "Attributes:" sections as fields, not duplicate entries
# Optional heavy dependencies of a few modules are mocked when absent (torch: parity).
autodoc_mock_imports = ["torch"]

# --- theme ----------------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_title = "tpu-course"
html_static_path: list[str] = []
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
    return f"https://kaggle.com/kernels/welcome?src=https://github.com/{REPOSITORY}/blob/main/{path}"


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


def write_chapter_table() -> None:
    """The home page's chapter table (README's, with site links instead of badges, which
    are images from the network): ``build/site-gen/chapters.md``, included by index.md."""
    import json

    rows = ["| chapter | read | lab | solution |", "| --- | --- | --- | --- |"]
    for ipynb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(ipynb.read_text(encoding="utf-8"))["cells"]
        title = next(("".join(c["source"]).split("\n")[0].lstrip("# ") for c in cells
                      if c["cell_type"] == "markdown"), ipynb.stem)
        title = title.replace("|", "\\|")
        row = [f"[{title}](/notebooks/{ipynb.name})"]
        row.append(f"[Colab]({colab_url(f'notebooks/{ipynb.name}')}), "
                   f"[Kaggle]({kaggle_url(f'notebooks/{ipynb.name}')})")
        for folder in ("labs", "solutions"):
            if (ROOT / folder / ipynb.name).exists():
                path = f"{folder}/{ipynb.name}"
                row.append(f"[page](/{path}), [Colab]({colab_url(path)}), "
                           f"[Kaggle]({kaggle_url(path)})")
            else:
                row.append("")
        rows.append("| " + " | ".join(row) + " |")
    out = ROOT / "build" / "site-gen" / "chapters.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(rows) + "\n"
    if not out.exists() or out.read_text(encoding="utf-8") != text:
        out.write_text(text, encoding="utf-8")


def colab_url(path: str) -> str:
    return f"https://colab.research.google.com/github/{REPOSITORY}/blob/main/{path}"


write_chapter_table()


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
    app.connect("html-page-context", _add_kaggle_button, priority=502)
