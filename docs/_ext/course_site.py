"""The course's own Sphinx extension: what the website does to a notebook before myst-nb
renders it, and the site's small fixes (loaded by ``docs/conf.py``).

Every change is made to the notebook as the build reads it (Sphinx's ``source-read``
event); the committed ``.ipynb`` files are never touched. :func:`prepare_notebook`:

* hides the setup cell: a cell tagged ``course-setup`` gets myst-nb's ``remove-cell``
  tag (the decks drop it too: ``tools/slides.py`` calls :func:`hide_setup_cells`);
* shows a progress bar's last state: a widget has no script on the site (its manager
  comes from a CDN), so myst-nb would show its ``text/plain`` stand-in, which tqdm writes
  when the bar starts ("0%"); :func:`final_widget_text` rebuilds the text from the
  widget's saved state (the notebook's ``widgets`` metadata), as tqdm prints it;
* gives each figure a description for its ``alt`` text (:func:`figure_description`):
  the producing cell's first comment line, else the section heading above it;
* puts visible launch badges (Colab, Kaggle) under the title, and links a chapter, its
  lab and its solution to one another in the page body (:func:`launch_block`).

Page scripts and styles are ``docs/_static/course.js`` and ``course.css`` (the sidebar
toggle fix, search from ``file://``, code and signature widths).
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

from tools import SETUP_TAG  # the setup cell's tag (tools.notebooks writes it)

REMOVE_TAG = "remove-cell"       # myst-nb's tag for "leave this cell out of the page"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
NOTEBOOK_FOLDERS = ("notebooks", "labs", "solutions")
BAR_WIDTH = 10                   # tqdm's default bar, in characters


def hide_setup_cells(nb: dict[str, Any], tag: str = REMOVE_TAG) -> int:
    """Add ``tag`` to every cell tagged :data:`SETUP_TAG`; returns how many were tagged."""
    count = 0
    for cell in nb.get("cells", []):
        tags = cell.setdefault("metadata", {}).setdefault("tags", [])
        if SETUP_TAG in tags:
            count += 1
            if tag not in tags:
                tags.append(tag)
    return count


def _html_text(value: Any) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", str(value or "")))


def final_widget_text(view: dict[str, Any], state: dict[str, Any]) -> str | None:
    """The text of a widget in its saved (last) state, or None when it is not a progress
    bar the state describes. A tqdm bar is an HBox of an HTML prefix ("epoch 1: 99%"), a
    progress bar and an HTML suffix ("155/156 [00:04<00:00, 30.59it/s]")."""
    model = state.get(view.get("model_id", ""), {})
    if model.get("model_name") == "FloatProgressModel" or model.get("model_name") == "IntProgressModel":
        children = [model]
    else:
        children = [state.get(str(c).replace("IPY_MODEL_", ""), {})
                    for c in model.get("state", {}).get("children", [])]
    parts, has_bar = [], False
    for child in children:
        name, values = child.get("model_name", ""), child.get("state", {})
        if name in ("FloatProgressModel", "IntProgressModel"):
            low, high = float(values.get("min") or 0), float(values.get("max") or 0)
            done = (float(values.get("value") or 0) - low) / (high - low) if high > low else 0
            filled = round(BAR_WIDTH * min(max(done, 0.0), 1.0))
            parts.append("|" + "\u2588" * filled + " " * (BAR_WIDTH - filled) + "|")
            has_bar = True
        elif name in ("HTMLModel", "LabelModel"):
            parts.append(_html_text(values.get("value")))
    return "".join(parts) if has_bar else None


def replace_widgets(nb: dict[str, Any]) -> int:
    """Swap each widget output for the text of its saved state; returns how many."""
    state = (nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {}))
    count = 0
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET_VIEW not in data:
                continue
            text = final_widget_text(data[WIDGET_VIEW], state)
            if text is not None:
                data.pop(WIDGET_VIEW)
                data["text/plain"] = text
                count += 1
    return count


def _source(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def figure_description(cells: list[dict[str, Any]], index: int) -> str:
    """A description of the figure cell ``index`` draws: its first comment line (not the
    "Same code as" marker), else the nearest heading above it."""
    for line in _source(cells[index]).splitlines():
        line = line.strip()
        if line.startswith("#") and not line.startswith(("#!", "# %%", "# Same code as")):
            text = line.lstrip("#").strip()
            if text:
                return text.rstrip(":")
        elif line:
            break
    for cell in reversed(cells[:index]):
        if cell.get("cell_type") == "markdown":
            heads = re.findall(r"^#{1,4}\s+(.+)$", _source(cell), flags=re.MULTILINE)
            if heads:
                return "Figure for the section: " + re.sub(r"[`*]", "", heads[-1]).strip()
    return "Figure"


def describe_figures(nb: dict[str, Any]) -> list[tuple[int, str]]:
    """Set myst-nb's per-cell image ``alt`` for every cell with an image output that has
    none; returns ``(cell index, description)`` for each."""
    cells, done = nb.get("cells", []), []
    for i, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        if not any(k.startswith("image/") for o in cell.get("outputs", []) for k in o.get("data", {})):
            continue
        image = cell.setdefault("metadata", {}).setdefault("mystnb", {}).setdefault("image", {})
        if "alt" not in image:
            image["alt"] = figure_description(cells, i)
            done.append((i, image["alt"]))
    return done


def launch_block(folder: str, stem: str, exists, colab_url, kaggle_url) -> str:
    """The HTML under a notebook's title: Colab and Kaggle badges, then links to the
    chapter, lab and solution of the same number that exist (``exists(path)``)."""
    path = f"{folder}/{stem}.ipynb"
    names = {"notebooks": "chapter", "labs": "lab", "solutions": "solution"}
    badges = (
        f'<a class="course-badge course-badge-colab" href="{html.escape(colab_url(path))}">'
        '<img src="../_static/images/logo_colab.png" alt="" width="20" height="20">'
        'Open in Colab</a>'
        f'<a class="course-badge course-badge-kaggle" href="{html.escape(kaggle_url(path))}">'
        '<span class="course-kaggle-k" aria-hidden="true">k</span>Open in Kaggle</a>')
    others = [f'<a href="../{f}/{stem}.html">this {names[f]}</a>' for f in NOTEBOOK_FOLDERS
              if f != folder and exists(f"{f}/{stem}.ipynb")]
    links = ""
    if others:
        links = ('<p class="course-related">Goes with: ' + " · ".join(others) + "</p>")
    return (f'<div class="course-launch" role="navigation" aria-label="launch this {names[folder]}">'
            f"<p>{badges}</p>{links}</div>")


def add_launch_block(nb: dict[str, Any], block: str) -> bool:
    """Insert ``block`` (raw HTML) after the title line of the first markdown cell."""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "markdown":
            continue
        lines = _source(cell).split("\n")
        for i, line in enumerate(lines):
            if re.match(r"#\s", line):
                lines[i + 1:i + 1] = ["", block, ""]
                cell["source"] = "\n".join(lines)
                return True
        return False
    return False


def prepare_notebook(nb: dict[str, Any], folder: str | None = None, stem: str | None = None,
                     exists=None, colab_url=None, kaggle_url=None) -> dict[str, Any]:
    """Everything above, in place; the launch block only when ``folder`` is given."""
    hide_setup_cells(nb)
    replace_widgets(nb)
    describe_figures(nb)
    if folder in NOTEBOOK_FOLDERS and stem and exists and colab_url and kaggle_url:
        add_launch_block(nb, launch_block(folder, stem, exists, colab_url, kaggle_url))
    return nb


def colab_url(repository: str, path: str) -> str:
    """Colab's "open a notebook from GitHub" address of a repository path."""
    return f"https://colab.research.google.com/github/{repository}/blob/main/{path}"


def kaggle_url(repository: str, path: str) -> str:
    """Kaggle's "open a notebook from GitHub" address of a repository path."""
    return f"https://kaggle.com/kernels/welcome?src=https://github.com/{repository}/blob/main/{path}"


# --- Sphinx hooks -----------------------------------------------------------------------

def _source_read(app, docname: str, source: list[str]) -> None:
    if not app.env.doc2path(docname).suffix == ".ipynb":
        return
    nb = json.loads(source[0])
    parts = docname.split("/")
    folder, stem = (parts[0], parts[-1]) if len(parts) == 2 else (None, None)
    repo, root = app.config.course_repository, app.srcdir
    prepare_notebook(nb, folder, stem, exists=lambda p: (root / p).exists(),
                     colab_url=lambda p: colab_url(repo, p),
                     kaggle_url=lambda p: kaggle_url(repo, p))
    source[0] = json.dumps(nb)


def setup(app):
    app.add_config_value("course_repository", "tpu-course/tpu-course", "env", str)
    app.connect("source-read", _source_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
