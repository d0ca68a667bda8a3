"""Labs come from solutions, twins stay in sync, every notebook starts the same way."""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest

from tpu_course import notebooks


def _nb(*cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    return nb


def test_strip_solutions_keeps_indent_and_names_the_exercise():
    src = ("def tile(a, b):\n"
           "    ### BEGIN SOLUTION Exercise 2 (tiling)\n"
           "    out = a @ b\n"
           "    return out\n"
           "    ### END SOLUTION\n"
           "check(tile)")
    lab = notebooks.strip_solutions(src)
    assert "a @ b" not in lab
    assert '    raise NotImplementedError("Exercise 2 (tiling): write your code here")' in lab
    assert lab.endswith("check(tile)")


@pytest.mark.parametrize("src,msg", [
    ("### BEGIN SOLUTION\nx = 1\n", "without an END"),
    ("x = 1\n### END SOLUTION\n", "without a BEGIN"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n", "nested"),
])
def test_unbalanced_markers_are_errors(src, msg):
    with pytest.raises(ValueError, match=msg):
        notebooks.strip_solutions(src)


def test_lab_from_solution_drops_solution_cells_and_outputs():
    code = nbformat.v4.new_code_cell("### BEGIN SOLUTION Ex 1\ny = 2\n### END SOLUTION")
    code.outputs = [nbformat.v4.new_output("stream", text="2")]
    code.execution_count = 3
    hidden = nbformat.v4.new_markdown_cell("The answer is 2 because ...")
    hidden.metadata["tags"] = ["solution"]
    title = nbformat.v4.new_markdown_cell("# Lab 1 (solution): systolic arrays")
    lab = notebooks.lab_from_solution(_nb(title, code, hidden))
    assert [c.cell_type for c in lab.cells] == ["markdown", "code"]
    assert lab.cells[0].source == "# Lab 1: systolic arrays"
    assert lab.cells[1].outputs == [] and lab.cells[1].execution_count is None
    assert "y = 2" not in lab.cells[1].source


def test_setup_cell_installs_nothing_and_starts_no_jax_when_the_package_is_present():
    code = notebooks.SETUP_CELL + "\nprint('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    assert notebooks.REPOSITORY in notebooks.SETUP_CELL


def test_repository_is_consistent_everywhere():
    """The Colab links, the setup cell and pyproject's URL come from one setting."""
    pyproject = (notebooks.ROOT / "pyproject.toml").read_text()
    assert f"https://github.com/{notebooks.REPOSITORY}" in pyproject


def test_course_has_no_drift():
    """Twins in sync, labs equal to what `make labs` writes, setup cells, README links."""
    problems = notebooks.check()
    assert problems == [], "\n".join(problems)


def test_every_lab_has_stubs_and_no_solution_markers():
    labs = sorted((notebooks.ROOT / "labs").glob("*.ipynb"))
    for lab in labs:
        text = lab.read_text()
        assert "### BEGIN SOLUTION" not in text, lab.name
        assert "NotImplementedError" in text, f"{lab.name} has no exercise"
