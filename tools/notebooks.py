"""Authoring tools for the course's notebooks: one source for every derived file.

The text twin (``.py``, jupytext percent format) is what authors edit. This module

* builds the ``.ipynb`` from it and executes it on a fresh kernel, so committed outputs
  are exactly what "Restart and run all" produced (``build``);
* writes each lab from its solution, replacing every ``### BEGIN SOLUTION`` ...
  ``### END SOLUTION`` block by a stub that raises ``NotImplementedError`` naming the
  exercise, and dropping cells tagged ``solution`` (``labs``);
* checks that nothing has drifted: twins in sync, labs current, every notebook's first
  code cell the canonical setup cell, README's Colab links current (``check``).

Command line (from the repository root)::

    python -m tools.notebooks build notebooks/02_first_program.py   # one notebook
    python -m tools.notebooks build --all                           # everything
    python -m tools.notebooks labs           # rewrite labs/ from solutions/
    python -m tools.notebooks check          # exit 1 and say what drifted
    python -m tools.notebooks sync           # setup cells, README table, cell metadata
    python -m tools.notebooks sync notebooks/*.py   # those notebooks' setup cells only
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import json
import pathlib
import re
import sys
import time
from typing import Any

import tpu_course
from tools import SETUP_TAG
from tpu_course import REPOSITORY
from tpu_course.checks.worker import skip_uri_grammar

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDERS = ("notebooks", "solutions", "labs")
BEGIN = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION:?\s*(?P<name>.*)$")
END = re.compile(r"^[ \t]*### END SOLUTION\s*$")

#: The oldest jax the course runs on: Colab's own, read from pyproject.toml's `jax>=`
#: (``tpu_course.jax_floor``; a test holds ci/colab.txt's pin equal to it). A runtime
#: below it is upgraded to exactly this version.
JAX_FLOOR = tpu_course.jax_floor()

# The first code cell of every notebook, lab and solution (``make sync`` writes it): it
# installs the course where it is missing (Colab, Kaggle), alone (``--no-deps``: nothing
# else moves yet), and hands the rest to ``tpu_course.setup.finish`` (the version floors,
# a jax older than its floor upgraded with its runtime and one restart asked for, pip's
# failures explained; tests/test_setup.py). Where pip cannot fetch the course, pip's own
# words and the usual fixes end the run (``sys.exit``: no traceback).
# ``TPU_COURSE_SPEC`` replaces the pip requirement for the course (a fork, a tag, a wheel).
#
# How it shows: on Colab a folded form (``# @title``, ``cellView: form``), in JupyterLab
# collapsed (``jupyter.source_hidden``), on the website and the decks not at all (the
# ``course-setup`` tag, which both builds honour). ``SETUP_METADATA`` is that metadata.
SETUP_CELL = ('''# @title Install the course where it is missing { display-mode: "form" }
import importlib.util, os, shlex, subprocess, sys
if importlib.util.find_spec("tpu_course") is None:  # Colab, Kaggle: the course alone
    course = os.environ.get("TPU_COURSE_SPEC",
                            "tpu-course @ git+https://github.com/@REPO@")
    status, said = subprocess.getstatusoutput(shlex.join(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", course]))
    if status:  # pip's own words, then the usual fixes
        sys.exit(f"{said}\\nSetup failed: pip could not install {course}. Fix: turn on "
                 "the internet (Kaggle: Settings > Internet on) or set TPU_COURSE_SPEC")
import tpu_course.setup  # the rest: tpu_course/setup.py
tpu_course.setup.finish()'''
              .replace("@REPO@", REPOSITORY))
#: The most lines the setup cell may have (issue 39: a few lines, the rest in the package).
SETUP_CELL_MAX_LINES = 12


#: The setup cell's metadata: a folded form on Colab, collapsed input in JupyterLab, and
#: the tag the website and the decks leave out (:data:`tools.SETUP_TAG`).
SETUP_METADATA = {"cellView": "form", "jupyter": {"source_hidden": True},
                  "tags": [SETUP_TAG]}
#: The same, as jupytext writes it on the twin's ``# %%`` line.
SETUP_HEADER_ATTRIBUTES = " ".join(f"{key}={json.dumps(value)}"
                                   for key, value in SETUP_METADATA.items())


def has_setup_metadata(metadata: Any) -> bool:
    """Whether a cell's metadata folds, collapses and tags it as the setup cell."""
    return (metadata.get("cellView") == SETUP_METADATA["cellView"]
            and metadata.get("jupyter", {}).get("source_hidden") is True
            and SETUP_TAG in metadata.get("tags", []))


def colab_url(path: str) -> str:
    """The "Open in Colab" address of a notebook path inside the repository."""
    return f"https://colab.research.google.com/github/{REPOSITORY}/blob/main/{path}"


def _jupytext() -> Any:
    try:
        import jupytext
    except ImportError as err:  # pragma: no cover - dev dependency
        raise ImportError("the notebook tools need jupytext: run `make setup`") from err
    return jupytext


def read_twin(py_path: pathlib.Path) -> Any:
    """The notebook (nbformat node) that a jupytext ``.py`` twin describes."""
    return _jupytext().read(py_path)


def _sources(nb: Any) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


def twin_in_sync(ipynb: pathlib.Path) -> str | None:
    """None when ``ipynb`` and its ``.py`` twin have the same cells, else what differs."""
    import nbformat

    py = ipynb.with_suffix(".py")
    if not py.exists():
        return f"{ipynb} has no jupytext twin {py.name}"
    a = _sources(nbformat.read(ipynb, as_version=4))
    b = _sources(read_twin(py))
    if a == b:
        return None
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"{ipynb.name} and {py.name} differ at cell {i}: {x[1][:60]!r} vs {y[1][:60]!r}"
    return f"{ipynb.name} has {len(a)} cells, {py.name} has {len(b)}"


#: Cell metadata the ``.py`` twin owns (set in its cell headers): ``sync`` copies it into
#: the ``.ipynb`` without re-executing, ``check`` reports drift. ``slideshow`` is where the
#: slide decks begin slides (tools/slides.py); ``tags`` drive nbval and the labs.
TWIN_METADATA = ("slideshow", "tags", "workshop")


def _owned(cell: Any) -> dict:
    return {k: cell.metadata[k] for k in TWIN_METADATA if cell.get("metadata", {}).get(k)}


def metadata_drift(ipynb: pathlib.Path) -> list[str]:
    """Cells whose slide metadata, tags or workshop data differ between ``ipynb`` and its
    ``.py`` twin."""
    import nbformat

    py = ipynb.with_suffix(".py")
    if not py.exists():
        return []
    nb, twin = nbformat.read(ipynb, as_version=4), read_twin(py)
    if _sources(nb) != _sources(twin):
        return []  # twin_in_sync reports that
    return [f"{ipynb.parent.name}/{ipynb.name} cell {i}: metadata {_owned(a)} differs from "
            f"{py.name}'s {_owned(b)}; run `python -m tools.notebooks sync`"
            for i, (a, b) in enumerate(zip(nb.cells, twin.cells)) if _owned(a) != _owned(b)]


def sync_cell_metadata(twins: list[pathlib.Path] | None = None) -> list[str]:
    """Copy each twin's slide metadata, tags and workshop data into its ``.ipynb`` (outputs
    untouched); ``twins``: these ``.py`` twins only (default: :func:`all_twins`).

    Only where the cell sources match; returns the notebooks skipped because they do not
    (those need a rebuild).
    """
    import nbformat

    skipped = []
    for py in all_twins() if twins is None else twins:
        ipynb = py.with_suffix(".ipynb")
        if not ipynb.exists():
            continue
        nb, twin = nbformat.read(ipynb, as_version=4), read_twin(py)
        if _sources(nb) != _sources(twin):
            skipped.append(f"{ipynb.relative_to(ROOT)}: cells differ from its twin; rebuild it")
            continue
        changed = False
        for a, b in zip(nb.cells, twin.cells):
            if _owned(a) != _owned(b):
                for k in TWIN_METADATA:
                    a.metadata.pop(k, None)
                a.metadata.update(copy.deepcopy(_owned(b)))
                changed = True
        if changed:
            nbformat.write(nb, ipynb)
    return skipped


def _raise_not_written(indent: str, label: str) -> str:
    """The stub's ``raise`` line, split in two string pieces when wider than 88."""
    line = f'{indent}raise NotImplementedError("{label}: write your code here")'
    if len(line) <= 88:  # CONTRIBUTING: notebook lines fit the site's code column
        return line
    return (f'{indent}raise NotImplementedError(\n{indent}    "{label}: "\n'
            f'{indent}    "write your code here")')


def _stub(name: str, indent: str, block: list[str]) -> str:
    """What a lab shows in place of a solution block.

    Inside a function (an indented block) the stub raises ``NotImplementedError``: the
    function can be defined and passed to its checker, which reports "not written yet".
    At the top level of a cell nothing may raise (an unsolved lab runs to its
    scorecard), so each name the block assigns becomes ``NotWritten("<exercise>")``
    (``tpu_course.checks.NotWritten``, which the lab must import) and each function it
    defines a stub with the same signature.
    """
    label = name or "this exercise"
    if indent:
        return _raise_not_written(indent, label)
    import ast

    lines = [f"# {label}: write your code here"]
    for node in ast.parse("\n".join(block)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
            lines += [f"def {node.name}({ast.unparse(node.args)}){returns}:",
                      _raise_not_written("    ", label)]
        else:
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name) and isinstance(leaf.ctx, ast.Store):
                        stub = f'{leaf.id} = NotWritten("{label}")'
                        if len(stub) > 88:  # CONTRIBUTING: lines fit the code column
                            stub = f'{leaf.id} = NotWritten(\n    "{label}")'
                        lines.append(stub)
    return "\n".join(dict.fromkeys(lines))  # a name assigned twice gets one stub


def strip_solutions(source: str) -> str:
    """Replace each marked solution block by a stub (see :func:`_stub`).

    >>> print(strip_solutions("def f(x):\\n    ### BEGIN SOLUTION Exercise 1\\n"
    ...                       "    return x + 1\\n    ### END SOLUTION\\n"))
    def f(x):
        raise NotImplementedError("Exercise 1: write your code here")
    <BLANKLINE>
    >>> print(strip_solutions("### BEGIN SOLUTION Exercise 2\\nflops = 2 * 8**3\\n"
    ...                       "### END SOLUTION"))
    # Exercise 2: write your code here
    flops = NotWritten("Exercise 2")
    """
    out: list[str] = []
    block: list[str] | None = None
    begin = None
    for line in source.split("\n"):
        start = BEGIN.match(line)
        if start:
            if block is not None:
                raise ValueError("nested ### BEGIN SOLUTION markers")
            block, begin = [], start
        elif END.match(line):
            if block is None:
                raise ValueError("### END SOLUTION without a BEGIN")
            out.append(_stub(begin.group("name").strip(), begin.group("indent"), block))
            block = None
        elif block is not None:
            block.append(line)
        else:
            out.append(line)
    if block is not None:
        raise ValueError("### BEGIN SOLUTION without an END")
    return "\n".join(out)


def lab_from_solution(solution: Any) -> Any:
    """The lab notebook for a solution notebook (both nbformat nodes)."""
    lab = copy.deepcopy(solution)
    cells = []
    for cell in lab.cells:
        if "solution" in cell.get("metadata", {}).get("tags", []):
            continue
        if cell.cell_type == "code":
            cell.source = strip_solutions(cell.source)
            cell.outputs = []
            cell.execution_count = None
        elif cell.cell_type == "markdown":
            cell.source = cell.source.replace(" (solution)", "").replace(" (solutions)", "")
        cells.append(cell)
    lab.cells = cells
    code = "\n".join(c.source for c in cells if c.cell_type == "code")
    if "NotWritten(" in code and not re.search(r"import[^\n]*\bNotWritten\b", code):
        raise ValueError("the lab has top-level exercise stubs (NotWritten) but does not "
                         "import it: add `from tpu_course.checks import NotWritten` to the "
                         "solution's import cell")
    return lab


#: The package's modules: its own registry (tests/test_registries.py checks it against
#: the files), not a second list here.
_PACKAGE_MODULES = tpu_course._SUBMODULES
SAME_CODE = re.compile(r"^# Same code as (?P<names>tpu_course\.[\w.]+(?:, tpu_course\.[\w.]+)*)")


def _normalise_code(text: str) -> str:
    lines = [line.rstrip() for line in text.strip().split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines))


PRIVATE = re.compile(r"\b(?:tpu_course|" + "|".join(_PACKAGE_MODULES) + r"|ch0\d)"
                     r"(?:\.\w+)*\.(_[a-zA-Z]\w*)\b")


def private_name_problems(ipynb: pathlib.Path) -> list[str]:
    """Code cells that reach into the package's private (``_``-prefixed) names.

    >>> bool(PRIVATE.search("parallel._shard_map(f)")), bool(PRIVATE.search("x._value"))
    (True, False)
    """
    import nbformat

    nb = nbformat.read(ipynb, as_version=4)
    return [f"{ipynb.parent.name}/{ipynb.name} cell {i} calls the private "
            f"{m.group(0)}: notebooks use the package's public names only"
            for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
            for m in PRIVATE.finditer(cell.source)]


def same_code_problems(ipynb: pathlib.Path) -> list[str]:
    """Cells that show package code and have drifted from it.

    The one-source rule: code a chapter teaches and the package reuses (chapter 5's model
    and train step, chapter 6's shardings) lives in ``tpu_course``, and the chapter shows
    it as an ordinary, editable code cell whose first line says
    ``# Same code as tpu_course.models.CNN`` (several names: comma-separated). The rest
    of that cell must be exactly ``inspect.getsource`` of each object, in order.
    """
    import importlib
    import inspect

    import nbformat

    problems = []
    nb = nbformat.read(ipynb, as_version=4)
    for i, cell in enumerate(nb.cells):
        match = SAME_CODE.match(cell.source) if cell.cell_type == "code" else None
        if not match:
            continue
        sources = []
        for dotted in match.group("names").split(", "):
            module, _, attr = dotted.rpartition(".")
            try:
                obj = getattr(importlib.import_module(module), attr)
                sources.append(inspect.getsource(obj))
            except (ImportError, AttributeError, TypeError, OSError) as err:
                problems.append(f"{ipynb.name} cell {i}: cannot read {dotted}: {err}")
                break
        else:
            shown = _normalise_code(cell.source.split("\n", 1)[1] if "\n" in cell.source else "")
            want = _normalise_code("\n\n".join(sources))
            if shown != want:
                first = next((a, b) for a, b in zip(shown.split("\n") + [""] * 999,
                                                     want.split("\n") + [""] * 999) if a != b)
                problems.append(f"{ipynb.parent.name}/{ipynb.name} cell {i} differs from "
                                f"{match.group('names')}: {first[0]!r} vs {first[1]!r} "
                                "(change both: the chapter shows the package's code)")
    return problems


def _write_pair(nb: Any, ipynb: pathlib.Path) -> None:
    import nbformat

    jupytext = _jupytext()
    nb.metadata.setdefault("jupytext", {})["formats"] = "ipynb,py:percent"
    for i, cell in enumerate(nb.cells):  # stable ids: a rebuild changes only what changed
        cell["id"] = f"cell-{i:03d}"
    nbformat.write(nb, ipynb)
    jupytext.write(nb, ipynb.with_suffix(".py"), fmt="py:percent")


def write_labs(check_only: bool = False) -> list[str]:
    """Write ``labs/`` from ``solutions/``; with ``check_only`` just list what differs."""
    import nbformat

    problems = []
    for sol in sorted((ROOT / "solutions").glob("*.ipynb")):
        stale = twin_in_sync(sol)  # the author edits the .py; a lab from a stale .ipynb is wrong
        if stale:
            problems.append(f"{stale}: rebuild the solution first "
                            f"(`python -m tools.notebooks build solutions/{sol.stem}.py`)")
            continue
        lab = lab_from_solution(nbformat.read(sol, as_version=4))
        target = ROOT / "labs" / sol.name
        if check_only:
            if not target.exists():
                problems.append(f"labs/{sol.name} is missing: run `make labs`")
            elif _sources(nbformat.read(target, as_version=4)) != _sources(lab):
                problems.append(f"labs/{sol.name} differs from what `make labs` writes")
        else:
            _write_pair(lab, target)
    return problems


def build(py_path: pathlib.Path, timeout_s: int = 600) -> float:
    """Make ``.ipynb`` from the ``.py`` twin, execute it on a fresh kernel, save outputs.

    Returns the execution time in seconds. A solution also rewrites its lab.
    """
    from nbclient import NotebookClient

    py_path = py_path.resolve()
    nb = read_twin(py_path)
    start = time.perf_counter()
    client = NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                            resources={"metadata": {"path": str(py_path.parent)}})
    client.execute()
    elapsed = time.perf_counter() - start
    _write_pair(nb, py_path.with_suffix(".ipynb"))
    if py_path.parent.name == "solutions":
        write_labs()
    return elapsed


SCORE = re.compile(r"Lab (?P<lab>\d+): (?P<passed>\d+) of (?P<gradable>\d+) passed"
                   r"(?:, (?P<skipped>\d+) skipped)?")


def run_unsolved_lab(ipynb: pathlib.Path, timeout_s: int = 600) -> tuple[list[str], float]:
    """Execute an unsolved lab on a fresh kernel, as "Restart and run all" would.

    Returns the problems (cells that raised, no scorecard, a scorecard that is not
    "0 of M") and the seconds it took. The notebook file is not changed.
    """
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(ipynb, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout_s, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(ipynb.parent)}}).execute()
    elapsed = time.perf_counter() - start
    problems, scores = [], []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                problems.append(f"{ipynb.name} cell {i} raised {out.ename}: {out.evalue[:200]}")
            text = out.get("text", "") or out.get("data", {}).get("text/plain", "")
            scores += [m for m in SCORE.finditer(text if isinstance(text, str) else "".join(text))]
    if not scores:
        problems.append(f"{ipynb.name}: no scorecard line ('Lab N: k of M passed') in the outputs")
    elif int(scores[-1].group("passed")) != 0:
        problems.append(f"{ipynb.name}: the unsolved lab scores {scores[-1].group(0)!r}, not 0")
    return problems, elapsed


def all_twins() -> list[pathlib.Path]:
    """Every ``.py`` twin in ``notebooks/`` and ``solutions/`` (labs are generated)."""
    return sorted(p for f in ("notebooks", "solutions") for p in (ROOT / f).glob("*.py"))


def check() -> list[str]:
    """Everything that has drifted: unpaired notebooks, stale labs, setup cells, links."""
    import nbformat

    problems = []
    for folder in FOLDERS:
        for ipynb in sorted((ROOT / folder).glob("*.ipynb")):
            diff = twin_in_sync(ipynb)
            if diff:
                problems.append(diff)
            nb = nbformat.read(ipynb, as_version=4)
            code = [c for c in nb.cells if c.cell_type == "code"]
            if not code or code[0].source.strip() != SETUP_CELL.strip():
                problems.append(
                    f"{folder}/{ipynb.name}: the first code cell is not the canonical setup "
                    "cell (tools.notebooks.SETUP_CELL); run `make sync`"
                )
            elif not has_setup_metadata(code[0].metadata):
                problems.append(
                    f"{folder}/{ipynb.name}: the setup cell lacks its metadata (folded on "
                    "Colab, collapsed in JupyterLab, hidden on the site); run `make sync`")
    for folder in ("notebooks", "solutions"):
        for ipynb in sorted((ROOT / folder).glob("*.ipynb")):
            problems += same_code_problems(ipynb)
            problems += private_name_problems(ipynb)
            problems += metadata_drift(ipynb)
    problems += write_labs(check_only=True)
    readme = (ROOT / "README.md").read_text() if (ROOT / "README.md").exists() else ""
    for ipynb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        url = colab_url(f"notebooks/{ipynb.name}")
        if url not in readme:
            problems.append(f"README.md has no Colab link {url}; run `make sync`")
    if readme and chapter_table() not in readme:
        problems.append("README.md's chapter table is stale; run `make sync`")
    from tools import workshop

    problems += workshop.problems(ROOT)
    return problems


def sync_setup_cells(twins: list[pathlib.Path] | None = None) -> None:
    """Put the canonical setup cell first in every ``.py`` twin (after the title cell);
    ``twins``: these twins only (default: :func:`all_twins`).

    The ``.ipynb`` beside each twin gets the same source in its first code cell (its
    outputs stay: where the course is installed the cell prints nothing), so changing
    the setup cell needs no re-execution; labs are rewritten from their solutions.
    """
    import nbformat

    twins = all_twins() if twins is None else twins
    for ipynb in (p.with_suffix(".ipynb") for p in twins):
        if ipynb.exists():
            nb = nbformat.read(ipynb, as_version=4)
            first = next((c for c in nb.cells if c.cell_type == "code"), None)
            if first is not None and (first.source.strip() != SETUP_CELL.strip()
                                      or not has_setup_metadata(first.metadata)):
                first.source = SETUP_CELL
                first.metadata.update(json.loads(json.dumps(SETUP_METADATA)))
                nbformat.write(nb, ipynb)
    for py in twins:
        text = py.read_text()
        parts = re.split(r"(?m)^(?=# %%)", text)
        for i, part in enumerate(parts):
            if part.startswith("# %%") and not part.startswith("# %% [markdown]"):
                header = part.split("\n", 1)[0]
                kept = [a for a in re.findall(r'\w+=(?:"[^"]*"|\{[^}]*\}|\[[^\]]*\])', header)
                        if a.split("=", 1)[0] not in SETUP_METADATA]
                parts[i] = f"{' '.join(['# %%', *kept, SETUP_HEADER_ATTRIBUTES])}\n{SETUP_CELL}\n\n"
                break
        py.write_text("".join(parts))


def chapter_table() -> str:
    """The README's chapter table: title and Colab links of each notebook, lab, solution."""
    import nbformat

    rows = ["| chapter | notebook | lab | solution |", "| --- | --- | --- | --- |"]
    for ipynb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(ipynb, as_version=4)
        title = next((c.source.split("\n")[0].lstrip("# ") for c in nb.cells
                      if c.cell_type == "markdown"), ipynb.stem)
        links = []
        for folder in FOLDERS[:1] + ("labs", "solutions"):
            path = f"{folder}/{ipynb.name}"
            links.append(f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
                         f"({colab_url(path)})" if (ROOT / path).exists() else "")
        rows.append(f"| {title} | " + " | ".join(links) + " |")
    return "\n".join(rows)


def sync_readme() -> None:
    """Rewrite the chapter table between the README's ``chapters`` markers."""
    readme = ROOT / "README.md"
    text = readme.read_text()
    block = f"<!-- chapters:start -->\n{chapter_table()}\n<!-- chapters:end -->"
    readme.write_text(re.sub(r"<!-- chapters:start -->.*<!-- chapters:end -->", lambda _: block,
                             text, flags=re.S))


def _jobs(text: str) -> int:
    """``--jobs``: a whole number of at least 1, or ``auto`` (one per core).

    >>> _jobs("3"), _jobs("auto") >= 1
    (3, True)
    """
    import os

    if text.strip().lower() == "auto":
        return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                   else os.cpu_count() or 1)
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"--jobs must be 1 or more, or auto; got {text!r}")
    return jobs


def main(argv: list[str] | None = None) -> int:
    skip_uri_grammar()
    parser = argparse.ArgumentParser(prog="python -m tools.notebooks")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="execute .py twins into .ipynb with outputs")
    b.add_argument("paths", nargs="*", type=pathlib.Path)
    b.add_argument("--all", action="store_true")
    sub.add_parser("labs", help="write labs/ from solutions/")
    sub.add_parser("check", help="report drift and exit 1 when there is any")
    y = sub.add_parser("sync", help="rewrite every setup cell and the README chapter table; "
                       "copy slide metadata and tags from each .py twin into its .ipynb")
    y.add_argument("paths", nargs="*", type=pathlib.Path,
                   help="only these notebooks (.py or .ipynb, in notebooks/ or solutions/): "
                        "their setup cells and metadata; labs, README and the agenda stay")
    r = sub.add_parser("run-labs", help="run each unsolved lab to its scorecard (0 of M)")
    r.add_argument("paths", nargs="*", type=pathlib.Path)
    r.add_argument("--jobs", type=_jobs, default=1,
                   help="labs run at once, each on its own kernel ('auto': one per core)")
    args = parser.parse_args(argv)
    if args.cmd == "build":
        paths = all_twins() if args.all else [p.with_suffix(".py") for p in args.paths]
        for p in paths:
            print(f"{p.relative_to(ROOT) if p.is_absolute() else p}: {build(p):.1f} s", flush=True)
    elif args.cmd == "labs":
        problems = write_labs()
        print("\n".join(problems) or "labs/ written from solutions/")
        return 1 if problems else 0
    elif args.cmd == "sync":
        from tools import workshop

        if args.paths:
            twins = sorted({p.resolve().with_suffix(".py") for p in args.paths})
            unknown = [p for p in twins if p not in all_twins()]
            if unknown:
                parser.error(f"not a notebook or solution twin: {', '.join(map(str, unknown))}")
            sync_setup_cells(twins)
            for line in sync_cell_metadata(twins):
                print(line)
            return 0
        sync_setup_cells()
        for line in sync_cell_metadata():
            print(line)
        write_labs()
        sync_readme()
        workshop.sync(ROOT)
    elif args.cmd == "run-labs":
        labs = [p.with_suffix(".ipynb") for p in args.paths or sorted((ROOT / "labs").glob("*.ipynb"))]
        problems = []
        with concurrent.futures.ProcessPoolExecutor(max_workers=args.jobs) as pool:
            for lab, (found, seconds) in zip(labs, pool.map(run_unsolved_lab, labs)):
                print(f"{lab.name}: {seconds:.1f} s, "
                      f"{'ok' if not found else f'{len(found)} problem(s)'}", flush=True)
                problems += found
        for p in problems:
            print(p)
        return 1 if problems else 0
    elif args.cmd == "check":
        problems = check()
        for p in problems:
            print(p)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
